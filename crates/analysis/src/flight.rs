//! Flight dumps (traces a flight recorder wrote when a trigger fired, `flight_trigger` in the
//! head): what `doctor` says first about them, starting from why they were written.
//!
//! - A slow step: the step against the steps before it in the same dump, through the `diff`
//!   machinery ([`crate::diff::step_against_earlier`]): which names took the extra time.
//! - A hang: the collective or sync the rank was stuck in (from the head) and the last one it
//!   finished, per rank, so the rank that never reached the collective stands out.
//! - Any other trigger: why it was written and the steps it covers.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::diff::{step_against_earlier, Comparison, DiffOptions};
use crate::load::FileProblem;

/// What a flight dump says of itself, and what doctor found from its trigger.
#[derive(Clone, Debug, Serialize)]
pub struct FlightDump {
    /// The file.
    pub file: PathBuf,
    /// Its rank (`distributedInfo.rank`), when it has one.
    pub rank: Option<i64>,
    /// `flight_trigger`: `slow_step`, `hang`, `exception`, `exit`, `signal`, `request`.
    pub trigger: String,
    /// `flight_reason`: why, in one sentence.
    pub reason: String,
    /// The span the dump covers, Unix ns (`flight_start_ns`, `flight_end_ns`).
    pub span_start_ns: Option<i64>,
    /// Its end (after the after-period, when the dump had one).
    pub span_end_ns: Option<i64>,
    /// When the trigger fired, Unix ns (`flight_trigger_ns`; dumps before it had none).
    pub trigger_ns: Option<i64>,
    /// The after-period, ns (`flight_after_ns`).
    pub after_ns: Option<i64>,
    /// What cut the after-period short (`flight_after_cut_by`).
    pub after_cut_by: Option<String>,
    /// The steps the dump covers (`flight_first_step`..`flight_last_step`).
    pub steps: Option<(i64, i64)>,
    /// The step running when the dump ended (`kinetrace_partial_step`).
    pub partial_step: Option<i64>,
    /// A slow step's number, time and the median of the steps before it.
    pub slow: Option<SlowStep>,
    /// A slow step against the steps before it.
    pub slow_step: Option<Comparison>,
    /// The op a hang was stuck in (`flight_hang_op`).
    pub hang_op: Option<String>,
    /// How long no step had come when the hang dumped, ns (`flight_hang_stalled_ns`).
    pub hang_stalled_ns: Option<i64>,
    /// The last collective or sync this rank finished in the dump.
    pub last_collective: Option<LastCollective>,
    /// The exception's type (`flight_exception`).
    pub exception: Option<String>,
    /// The thread it left, when not the main one (`flight_exception_thread`).
    pub exception_thread: Option<String>,
}

/// A slow step against the median (the head's `flight_slow_*` keys).
#[derive(Clone, Debug, Serialize)]
pub struct SlowStep {
    /// Its number.
    pub step: i64,
    /// Its time, ns.
    pub dur_ns: i64,
    /// The median of the steps before it, ns.
    pub median_ns: i64,
    /// `dur_ns / median_ns`.
    pub ratio: f64,
    /// The threshold k it passed.
    pub factor: Option<f64>,
    /// How many steps the median is over.
    pub window: Option<i64>,
}

/// A collective (or sync) call in a dump.
#[derive(Clone, Debug, Serialize)]
pub struct LastCollective {
    /// Its name.
    pub name: String,
    /// When it ended, µs before the dump's end.
    pub ended_us_before_dump: f64,
    /// How long it took, µs.
    pub dur_us: f64,
}

/// Reads `path`: `Ok(None)` when it is not a flight dump.
pub fn read_flight_dump(
    path: &Path,
    opts: &DiffOptions,
) -> Result<Option<FlightDump>, FileProblem> {
    let trace = opts.read.read_trace(path)?;
    let text = |k: &str| {
        trace
            .metadata_value(k)
            .and_then(|v| serde_json::from_str::<String>(v).ok())
    };
    let Some(trigger) = text("flight_trigger") else {
        return Ok(None);
    };
    let num = |k: &str| text(k).and_then(|v| v.parse::<i64>().ok());
    let end_ns = num("flight_end_ns").unwrap_or(i64::MAX);
    let last_collective = trace
        .events
        .iter()
        .filter(|e| e.dur.is_some())
        .filter(|e| kinetrace_core::flight::is_collective_or_sync(trace.str(e.name)))
        .max_by_key(|e| e.end_unix_ns(trace.base_time_ns))
        .map(|e| LastCollective {
            name: trace.str(e.name).to_string(),
            ended_us_before_dump: end_ns.saturating_sub(e.end_unix_ns(trace.base_time_ns)) as f64
                / 1e3,
            dur_us: e.dur_ns() as f64 / 1e3,
        });
    let slow_step = match (trigger.as_str(), num("flight_slow_step")) {
        ("slow_step", Some(step)) => Some(step_against_earlier(path, step, opts)?),
        _ => None,
    };
    let slow = match (num("flight_slow_step"), num("flight_slow_step_ns")) {
        (Some(step), Some(dur_ns)) => {
            let median_ns = num("flight_median_step_ns").unwrap_or(0);
            Some(SlowStep {
                step,
                dur_ns,
                median_ns,
                ratio: dur_ns as f64 / median_ns.max(1) as f64,
                factor: text("flight_slow_factor").and_then(|v| v.parse().ok()),
                window: num("flight_median_window"),
            })
        }
        _ => None,
    };
    Ok(Some(FlightDump {
        file: path.to_path_buf(),
        rank: trace.rank,
        reason: text("flight_reason").unwrap_or_default(),
        span_start_ns: num("flight_start_ns"),
        span_end_ns: num("flight_end_ns"),
        trigger_ns: num("flight_trigger_ns"),
        after_ns: num("flight_after_ns"),
        after_cut_by: text("flight_after_cut_by"),
        steps: num("flight_first_step").zip(num("flight_last_step")),
        partial_step: num(kinetrace_core::source::PARTIAL_STEP_KEY),
        slow,
        slow_step,
        hang_op: text("flight_hang_op"),
        hang_stalled_ns: num("flight_hang_stalled_ns"),
        last_collective,
        exception: text("flight_exception"),
        exception_thread: text("flight_exception_thread"),
        trigger,
    }))
}

/// The flight dumps among `files` (others are left to the rest of doctor), by rank then file.
pub fn flight_dumps(files: &[PathBuf], opts: &DiffOptions) -> (Vec<FlightDump>, Vec<FileProblem>) {
    let mut dumps = Vec::new();
    let mut problems = Vec::new();
    for f in files {
        match read_flight_dump(f, opts) {
            Ok(Some(d)) => dumps.push(d),
            Ok(None) => {}
            Err(p) => problems.push(p),
        }
    }
    dumps.sort_by(|a, b| (a.rank, &a.file).cmp(&(b.rank, &b.file)));
    (dumps, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::Change;

    /// A dump of steps 1..=5 of `rank` (1 ms each with one `aten::mm`), whose step 5 also ran a
    /// 30 ms `aten::cat`, with the head `extra`; plus a finished `c10d::allreduce_` in step 3.
    fn dump(dir: &Path, rank: i64, extra: &str) -> PathBuf {
        let mut ev = Vec::new();
        let mut t = 0u64;
        for step in 1..=5u64 {
            let len = if step == 5 { 32_000 } else { 1_000 };
            ev.push(format!(
                r#"{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step}","pid":1,"tid":1,"ts":{t},"dur":{len}}}"#
            ));
            ev.push(format!(
                r#"{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":{},"dur":500}}"#,
                t + 100
            ));
            if step == 3 {
                ev.push(format!(
                    r#"{{"ph":"X","cat":"cpu_op","name":"c10d::allreduce_","pid":1,"tid":1,"ts":{},"dur":200}}"#,
                    t + 700
                ));
            }
            if step == 5 {
                ev.push(format!(
                    r#"{{"ph":"X","cat":"cpu_op","name":"aten::cat","pid":1,"tid":1,"ts":{},"dur":30000}}"#,
                    t + 700
                ));
            }
            t += len;
        }
        let end_ns = 1_000_000_000_000u64 + t * 1000;
        let text = format!(
            r#"{{"schemaVersion":1,"baseTimeNanoseconds":1000000000000,"distributedInfo":{{"rank":{rank},"world_size":2}},"flight_first_step":"1","flight_last_step":"5","flight_end_ns":"{end_ns}",{extra}"traceEvents":[{}]}}"#,
            ev.join(",")
        );
        let path = dir.join(format!("rank{rank}.pt.trace.json"));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_slow_step_is_compared_with_the_steps_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dump(
            dir.path(),
            0,
            r#""flight_trigger":"slow_step","flight_reason":"step 5 took 32 ms","flight_slow_step":"5","#,
        );
        let d = read_flight_dump(&p, &DiffOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            (d.trigger.as_str(), d.rank, d.steps),
            ("slow_step", Some(0), Some((1, 5)))
        );
        let c = d.slow_step.expect("compared");
        assert_eq!((c.base_steps, c.new_steps), (4, 1));
        // The slow step's extra op is what it added; the op every step ran is unchanged.
        let cat = c.rows.iter().find(|r| r.name == "aten::cat").unwrap();
        assert_eq!(cat.category, Change::Added);
        let mm = c.rows.iter().find(|r| r.name == "aten::mm").unwrap();
        assert_eq!(mm.time_category, Change::Unchanged);
        // The largest time change comes first (after the steps themselves).
        let first_op = c.rows.iter().find(|r| r.kind != "annotation").unwrap();
        assert_eq!(first_op.name, "aten::cat", "{:?}", c.rows);
        assert!(c.step_time_diff_us.unwrap().0 > 30_000.0);
    }

    #[test]
    fn a_hang_names_the_op_and_the_last_collective_of_each_rank() {
        let dir = tempfile::tempdir().unwrap();
        let hang = r#""flight_trigger":"hang","flight_reason":"no step for 5 s","flight_hang_op":"c10d::allreduce_","#;
        let a = dump(dir.path(), 0, hang);
        let b = dump(dir.path(), 1, hang);
        let plain = dir.path().join("plain.pt.trace.json");
        std::fs::write(&plain, r#"{"schemaVersion":1,"traceEvents":[]}"#).unwrap();
        let (dumps, problems) = flight_dumps(&[b, plain, a], &DiffOptions::default());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(dumps.len(), 2, "a trace that is no flight dump is left out");
        assert_eq!(
            dumps.iter().map(|d| d.rank).collect::<Vec<_>>(),
            [Some(0), Some(1)]
        );
        for d in &dumps {
            assert_eq!(d.hang_op.as_deref(), Some("c10d::allreduce_"));
            let l = d.last_collective.as_ref().unwrap();
            assert_eq!(l.name, "c10d::allreduce_");
            assert_eq!(l.dur_us, 200.0);
            // It ended in step 3 (at 2.9 ms); the dump ends at 36 ms.
            assert_eq!(l.ended_us_before_dump, 36_000.0 - 2_900.0);
            assert!(d.slow_step.is_none());
        }
    }
}
