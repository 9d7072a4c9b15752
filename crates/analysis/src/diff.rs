//! `kinetrace diff`: what changed between two runs, name by name, in HolisticTraceAnalysis'
//! `TraceDiff` terms.
//!
//! Each side is one or more trace files. Every row HTA keeps (events with `dur` and `cat`) is
//! grouped by its `name` (across `cat`s, as `TraceDiff.compare_traces` groups by name), with its
//! count and total duration on HTA's clock (float timestamps rounded inward to whole µs, as HTA
//! does), so the numbers can be checked against HTA. A name's category is `TraceDiff.ops_diff`'s:
//! added, deleted, increased, decreased or unchanged in count.
//!
//! Ranks are compared rank by rank (the ranks both sides have), or pooled into one comparison.
//! Unlike HTA's default (the first rank and its first iteration), every step of the traces counts
//! unless one step is chosen.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Serialize;

use crate::doctor::context::Ctx;
use crate::load::{map_sources, read_rank, FileProblem, Progress, TraceSource};
use crate::units::{fmt_us, Num, Us};

/// Version of the `--json` layout.
pub const SCHEMA_VERSION: u32 = 1;

/// Options of a diff.
#[derive(Clone, Debug, Default)]
pub struct DiffOptions {
    /// Worker threads (0: one per CPU).
    pub jobs: usize,
    /// Pool all ranks of each side into one comparison.
    pub pool: bool,
    /// Only rows of this `ProfilerStep` number (kernels by the step of their launch).
    pub step: Option<i64>,
}

/// HTA `ops_diff`'s category of a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Only in the new trace.
    Added,
    /// Only in the base trace.
    Deleted,
    /// In both, more often in the new one.
    Increased,
    /// In both, less often in the new one.
    Decreased,
    /// In both, as often.
    Unchanged,
}

impl Change {
    /// The name HTA's `ops_diff` uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Deleted => "deleted",
            Change::Increased => "increased",
            Change::Decreased => "decreased",
            Change::Unchanged => "unchanged",
        }
    }

    fn of(base: u64, new: u64) -> Change {
        match (base, new) {
            (0, _) => Change::Added,
            (_, 0) => Change::Deleted,
            (b, n) if n > b => Change::Increased,
            (b, n) if n < b => Change::Decreased,
            _ => Change::Unchanged,
        }
    }
}

/// One name in both traces. The `control_*`/`test_*`/`diff_*`/`counts_change_categories` fields
/// are HTA `compare_traces`' columns (base = control, new = test).
#[derive(Clone, Debug, Serialize)]
pub struct DiffRow {
    /// The event name.
    pub name: String,
    /// What it is, from its `cat` (`kernel`, `memcpy`, `memset`, `op`, `annotation`, `runtime`,
    /// `python`, `other`; the first `cat` seen when a name has several).
    pub kind: &'static str,
    /// Count in the base trace.
    pub control_counts: u64,
    /// Count in the new trace.
    pub test_counts: u64,
    /// Total duration in the base trace (µs, HTA's rounding).
    pub control_total_duration: Us,
    /// Total duration in the new trace.
    pub test_total_duration: Us,
    /// `test_counts − control_counts`.
    pub diff_counts: i64,
    /// `test_total_duration − control_total_duration`.
    pub diff_duration: Us,
    /// `+`, `-` or `=` by count, as HTA.
    pub counts_change_categories: &'static str,
    /// HTA `ops_diff`'s category.
    pub category: Change,
}

/// The duration change of one kind of event.
#[derive(Clone, Debug, Serialize)]
pub struct KindChange {
    /// Kind (see [`DiffRow::kind`]).
    pub kind: &'static str,
    /// Total duration in the base trace.
    pub base_us: Us,
    /// Total duration in the new trace.
    pub new_us: Us,
    /// The difference.
    pub diff_us: Us,
}

/// One comparison: a rank against the same rank, or all ranks pooled.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The base side's rank (`null` when pooled).
    pub base_rank: Option<i64>,
    /// The new side's rank (`null` when pooled).
    pub new_rank: Option<i64>,
    /// `ProfilerStep`s counted on the base side.
    pub base_steps: usize,
    /// `ProfilerStep`s counted on the new side.
    pub new_steps: usize,
    /// Mean step time on the base side (`null` without steps).
    pub base_mean_step_us: Option<Us>,
    /// Mean step time on the new side.
    pub new_mean_step_us: Option<Us>,
    /// `new − base` mean step time.
    pub step_time_diff_us: Option<Us>,
    /// Its share of the base step time.
    pub step_time_diff_share: Option<Num>,
    /// Duration change per kind, largest absolute change first. Kernels, copies and sets add up
    /// GPU time; ops and annotations nest, so their totals count nested time more than once.
    pub by_kind: Vec<KindChange>,
    /// Every name, largest absolute duration change first.
    pub rows: Vec<DiffRow>,
    /// Names per category, as HTA `ops_diff` returns them (sorted by name).
    pub ops_diff: BTreeMap<Change, Vec<String>>,
}

/// Everything `kinetrace diff` reports.
#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Files read on the base side.
    pub base_files: Vec<PathBuf>,
    /// Files read on the new side.
    pub new_files: Vec<PathBuf>,
    /// The comparisons.
    pub comparisons: Vec<Comparison>,
    /// Files that could not be read, and ranks only one side has.
    pub problems: Vec<FileProblem>,
}

impl DiffReport {
    /// Whether there is anything to show.
    pub fn compared_any(&self) -> bool {
        !self.comparisons.is_empty()
    }
}

#[derive(Clone, Default)]
struct NameAcc {
    kind: &'static str,
    count: u64,
    dur_ns: i64,
}

/// One rank (or several, pooled) reduced to per-name totals.
#[derive(Clone, Default)]
struct Side {
    names: HashMap<String, NameAcc>,
    steps: usize,
    step_ns: i64,
}

impl Side {
    fn add(&mut self, other: Side) {
        for (k, v) in other.names {
            let e = self.names.entry(k).or_insert_with(|| NameAcc {
                kind: v.kind,
                ..NameAcc::default()
            });
            e.count += v.count;
            e.dur_ns += v.dur_ns;
        }
        self.steps += other.steps;
        self.step_ns += other.step_ns;
    }

    fn mean_step_ns(&self) -> Option<f64> {
        (self.steps > 0).then(|| self.step_ns as f64 / self.steps as f64)
    }
}

fn kind_of(cat: &str) -> &'static str {
    match cat {
        "kernel" | "Kernel" => "kernel",
        "gpu_memcpy" | "Memcpy" => "memcpy",
        "gpu_memset" | "Memset" => "memset",
        "cpu_op" | "Operator" => "op",
        "user_annotation" | "gpu_user_annotation" => "annotation",
        "cuda_runtime" | "cuda_driver" | "Runtime" => "runtime",
        "python_function" => "python",
        _ => "other",
    }
}

fn summarize_side(source: &TraceSource, step: Option<i64>) -> Result<(i64, Side), FileProblem> {
    let (rows, rank, _) = read_rank(source)?;
    let ctx = Ctx::new(&rows, rank);
    let wanted = |i: usize| -> bool {
        match step {
            None => true,
            Some(n) => ctx
                .window_of(i)
                .is_some_and(|w| ctx.has_steps && ctx.windows[w].number == n),
        }
    };
    let mut by_id: HashMap<u32, NameAcc> = HashMap::new();
    for (i, r) in rows.rows.iter().enumerate() {
        if !wanted(i) {
            continue;
        }
        let e = by_id.entry(r.name).or_insert_with(|| NameAcc {
            kind: kind_of(rows.str(r.cat)),
            ..NameAcc::default()
        });
        e.count += 1;
        e.dur_ns += r.hdur;
    }
    let mut side = Side::default();
    for (id, acc) in by_id {
        side.names.insert(rows.str(id).to_owned(), acc);
    }
    if ctx.has_steps {
        for w in ctx
            .windows
            .iter()
            .filter(|w| step.is_none_or(|n| w.number == n))
        {
            side.steps += 1;
            side.step_ns += w.len();
        }
    }
    Ok((rank, side))
}

fn compare(base: &Side, new: &Side, base_rank: Option<i64>, new_rank: Option<i64>) -> Comparison {
    let mut names: Vec<&String> = base.names.keys().chain(new.names.keys()).collect();
    names.sort();
    names.dedup();
    let empty = NameAcc::default();
    let mut rows: Vec<DiffRow> = names
        .into_iter()
        .map(|name| {
            let b = base.names.get(name).unwrap_or(&empty);
            let n = new.names.get(name).unwrap_or(&empty);
            let diff_counts = n.count as i64 - b.count as i64;
            DiffRow {
                name: name.clone(),
                kind: if b.count > 0 { b.kind } else { n.kind },
                control_counts: b.count,
                test_counts: n.count,
                control_total_duration: Us::from_ns(b.dur_ns),
                test_total_duration: Us::from_ns(n.dur_ns),
                diff_counts,
                diff_duration: Us::from_ns(n.dur_ns - b.dur_ns),
                counts_change_categories: match diff_counts {
                    d if d > 0 => "+",
                    d if d < 0 => "-",
                    _ => "=",
                },
                category: Change::of(b.count, n.count),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.diff_duration
            .0
            .abs()
            .total_cmp(&a.diff_duration.0.abs())
            .then_with(|| a.name.cmp(&b.name))
    });
    // Every category is present, empty or not, as in HTA's `ops_diff`.
    let mut ops_diff: BTreeMap<Change, Vec<String>> = [
        Change::Added,
        Change::Deleted,
        Change::Increased,
        Change::Decreased,
        Change::Unchanged,
    ]
    .into_iter()
    .map(|c| (c, Vec::new()))
    .collect();
    for r in &rows {
        ops_diff.entry(r.category).or_default().push(r.name.clone());
    }
    for v in ops_diff.values_mut() {
        v.sort();
    }
    let mut kinds: BTreeMap<&'static str, (f64, f64)> = BTreeMap::new();
    for r in &rows {
        let k = kinds.entry(r.kind).or_default();
        k.0 += r.control_total_duration.0;
        k.1 += r.test_total_duration.0;
    }
    let mut by_kind: Vec<KindChange> = kinds
        .into_iter()
        .map(|(kind, (b, n))| KindChange {
            kind,
            base_us: Us(b),
            new_us: Us(n),
            diff_us: Us(n - b),
        })
        .collect();
    by_kind.sort_by(|a, b| b.diff_us.0.abs().total_cmp(&a.diff_us.0.abs()));
    let (bm, nm) = (base.mean_step_ns(), new.mean_step_ns());
    let diff = bm.zip(nm).map(|(b, n)| n - b);
    Comparison {
        base_rank,
        new_rank,
        base_steps: base.steps,
        new_steps: new.steps,
        base_mean_step_us: bm.map(|v| Us(v.round() / 1000.0)),
        new_mean_step_us: nm.map(|v| Us(v.round() / 1000.0)),
        step_time_diff_us: diff.map(|d| Us(d.round() / 1000.0)),
        step_time_diff_share: diff.zip(bm).map(|(d, b)| Num::ratio(d, b)),
        by_kind,
        rows,
        ops_diff,
    }
}

/// Compares `base` with `new` (files, one rank each). `problems` from [`crate::discover`] on
/// either side are carried into the report.
pub fn diff(
    base: &[PathBuf],
    new: &[PathBuf],
    problems: Vec<FileProblem>,
    opts: &DiffOptions,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> DiffReport {
    let sources: Vec<TraceSource> = base
        .iter()
        .chain(new)
        .cloned()
        .map(TraceSource::File)
        .collect();
    diff_sources(&sources, base.len(), problems, opts, progress)
}

/// [`diff`] over files or in-memory traces: the first `n_base` sources are the base side.
pub fn diff_sources(
    sources: &[TraceSource],
    n_base: usize,
    mut problems: Vec<FileProblem>,
    opts: &DiffOptions,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> DiffReport {
    let results = map_sources(sources, opts.jobs, progress, &|s| {
        summarize_side(s, opts.step)
    });
    let mut sides: [BTreeMap<i64, Side>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut files: [Vec<PathBuf>; 2] = [Vec::new(), Vec::new()];
    for (i, (r, s)) in results.into_iter().zip(sources).enumerate() {
        let which = usize::from(i >= n_base);
        match r {
            Ok((rank, side)) => {
                files[which].push(s.path().to_owned());
                sides[which].entry(rank).or_default().add(side);
            }
            Err(p) => problems.push(p),
        }
    }
    let mut comparisons = Vec::new();
    let [base, new] = &sides;
    if base.is_empty() || new.is_empty() {
        // Nothing to compare; the problems say why.
    } else if opts.pool {
        let pool = |m: &BTreeMap<i64, Side>| {
            let mut all = Side::default();
            for s in m.values() {
                all.add(s.clone());
            }
            all
        };
        comparisons.push(compare(&pool(base), &pool(new), None, None));
    } else if base.len() == 1 && new.len() == 1 {
        // One rank each: compare them whatever their numbers.
        let (br, bs) = base.iter().next().expect("one rank");
        let (nr, ns) = new.iter().next().expect("one rank");
        comparisons.push(compare(bs, ns, Some(*br), Some(*nr)));
    } else {
        for (rank, bs) in base {
            match new.get(rank) {
                Some(ns) => comparisons.push(compare(bs, ns, Some(*rank), Some(*rank))),
                None => problems.push(only_one_side(*rank, "base", &files[0])),
            }
        }
        for rank in new.keys().filter(|r| !base.contains_key(r)) {
            problems.push(only_one_side(*rank, "new", &files[1]));
        }
    }
    problems.sort_by(|a, b| a.file.cmp(&b.file));
    let [base_files, new_files] = files;
    DiffReport {
        schema_version: SCHEMA_VERSION,
        base_files,
        new_files,
        comparisons,
        problems,
    }
}

fn only_one_side(rank: i64, side: &str, files: &[PathBuf]) -> FileProblem {
    FileProblem {
        file: files.first().cloned().unwrap_or_default(),
        offset: None,
        message: format!(
            "rank {rank} is only on the {side} side, so it is not compared (use --pool to compare \
             all ranks together)"
        ),
    }
}

/// One line saying where the time went in a comparison: the step time change and the largest
/// changes by kind and by name.
pub fn summary(c: &Comparison) -> String {
    let mut parts = Vec::new();
    if let (Some(b), Some(n), Some(d)) =
        (c.base_mean_step_us, c.new_mean_step_us, c.step_time_diff_us)
    {
        let share = c
            .step_time_diff_share
            .and_then(|s| s.get())
            .map_or_else(String::new, |s| format!(", {:+.1}%", 100.0 * s));
        parts.push(format!(
            "step time {} → {} ({}{}{share})",
            fmt_us(b.0),
            fmt_us(n.0),
            if d.0 >= 0.0 { "+" } else { "" },
            fmt_us(d.0)
        ));
    }
    let gpu: Vec<String> = c
        .by_kind
        .iter()
        .filter(|k| matches!(k.kind, "kernel" | "memcpy" | "memset") && k.diff_us.0 != 0.0)
        .map(|k| {
            format!(
                "{} {}{}",
                k.kind,
                sign(k.diff_us.0),
                fmt_us(k.diff_us.0.abs())
            )
        })
        .collect();
    if !gpu.is_empty() {
        parts.push(format!("GPU time: {}", gpu.join(", ")));
    }
    let top: Vec<String> = c
        .rows
        .iter()
        .filter(|r| r.kind != "annotation" && r.diff_duration.0 != 0.0)
        .take(3)
        .map(|r| {
            format!(
                "{} {}{}",
                short(&r.name),
                sign(r.diff_duration.0),
                fmt_us(r.diff_duration.0.abs())
            )
        })
        .collect();
    if !top.is_empty() {
        parts.push(format!("most changed: {}", top.join(", ")));
    }
    if parts.is_empty() {
        "no change".into()
    } else {
        parts.join("; ")
    }
}

fn sign(v: f64) -> &'static str {
    if v < 0.0 {
        "−"
    } else {
        "+"
    }
}

fn short(name: &str) -> String {
    if name.chars().count() <= 50 {
        name.to_owned()
    } else {
        let mut s: String = name.chars().take(49).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn x(cat: &str, name: &str, ts: i64, dur: i64, args: Value) -> Value {
        json!({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args})
    }

    /// Two steps of `step_us`; per step `n_mm` aten::mm launching a gemm of `gemm_us`, and, when
    /// `relu`, one aten::relu.
    fn trace(rank: i64, step_us: i64, n_mm: i64, gemm_us: i64, relu: bool) -> TraceSource {
        let mut ev = Vec::new();
        let mut corr = 0;
        for s in 0..2 {
            let ts = 1_000_000 + s * 100_000;
            ev.push(x(
                "user_annotation",
                &format!("ProfilerStep#{}", s + 5),
                ts,
                step_us,
                json!({}),
            ));
            for k in 0..n_mm {
                corr += 1;
                let t = ts + 10 + k * 100;
                ev.push(x("cpu_op", "aten::mm", t, 20, json!({})));
                ev.push(x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    t + 5,
                    5,
                    json!({"correlation": corr}),
                ));
                ev.push(
                    json!({"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7,
                    "ts": t + 50, "dur": gemm_us, "args": {"stream": 7, "correlation": corr}}),
                );
            }
            if relu {
                ev.push(x("cpu_op", "aten::relu", ts + 5_000, 7, json!({})));
            }
        }
        let doc = json!({"distributedInfo": {"rank": rank}, "traceEvents": ev});
        TraceSource::Memory {
            name: format!("r{rank}.json").into(),
            bytes: serde_json::to_vec(&doc).unwrap(),
        }
    }

    fn run(base: Vec<TraceSource>, new: Vec<TraceSource>, opts: &DiffOptions) -> DiffReport {
        let n = base.len();
        let all: Vec<TraceSource> = base.into_iter().chain(new).collect();
        diff_sources(&all, n, Vec::new(), opts, &|_| {})
    }

    #[test]
    fn names_counts_durations_and_categories() {
        let r = run(
            vec![trace(0, 10_000, 2, 100, true)],
            vec![trace(0, 12_000, 3, 150, false)],
            &DiffOptions::default(),
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let c = &r.comparisons[0];
        let row = |n: &str| c.rows.iter().find(|r| r.name == n).unwrap();
        let gemm = row("sm80_gemm");
        assert_eq!(
            (gemm.control_counts, gemm.test_counts, gemm.diff_counts),
            (4, 6, 2)
        );
        assert_eq!(
            (
                gemm.control_total_duration.0,
                gemm.test_total_duration.0,
                gemm.diff_duration.0
            ),
            (400.0, 900.0, 500.0)
        );
        assert_eq!(
            (gemm.kind, gemm.category, gemm.counts_change_categories),
            ("kernel", Change::Increased, "+")
        );
        let relu = row("aten::relu");
        assert_eq!(
            (relu.category, relu.test_counts, relu.diff_duration.0),
            (Change::Deleted, 0, -14.0)
        );
        // Sorted by absolute duration change: the steps (+2000 µs each) first.
        assert_eq!(c.rows[0].name, "ProfilerStep#5");
        assert_eq!(c.ops_diff[&Change::Deleted], ["aten::relu"]);
        assert_eq!(
            c.ops_diff[&Change::Unchanged],
            ["ProfilerStep#5", "ProfilerStep#6"]
        );
        assert_eq!((c.base_steps, c.new_steps), (2, 2));
        assert_eq!(c.step_time_diff_us, Some(Us(2000.0)));
        let k = c.by_kind.iter().find(|k| k.kind == "kernel").unwrap();
        assert_eq!(k.diff_us.0, 500.0);
        let s = summary(c);
        assert!(
            s.starts_with("step time 10.00 ms → 12.00 ms (+2.00 ms, +20.0%)"),
            "{s}"
        );
        assert!(s.contains("GPU time: kernel +500 µs"), "{s}");
        assert!(s.contains("most changed: sm80_gemm +500 µs"), "{s}");

        // Identical traces: everything unchanged, no difference.
        let r = run(
            vec![trace(0, 10_000, 2, 100, true)],
            vec![trace(0, 10_000, 2, 100, true)],
            &DiffOptions::default(),
        );
        let c = &r.comparisons[0];
        assert!(c
            .rows
            .iter()
            .all(|r| r.category == Change::Unchanged && r.diff_duration.0 == 0.0));
        assert_eq!(c.step_time_diff_us, Some(Us(0.0)));
    }

    #[test]
    fn ranks_are_matched_or_pooled_and_steps_chosen() {
        let base = || {
            vec![
                trace(0, 10_000, 1, 100, false),
                trace(1, 10_000, 1, 100, false),
            ]
        };
        let new = || {
            vec![
                trace(0, 10_000, 1, 200, false),
                trace(2, 10_000, 1, 100, false),
            ]
        };
        let r = run(base(), new(), &DiffOptions::default());
        assert_eq!(r.comparisons.len(), 1);
        assert_eq!(r.comparisons[0].base_rank, Some(0));
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(
            r.problems[0].message.contains("only on the"),
            "{:?}",
            r.problems
        );

        let r = run(
            base(),
            new(),
            &DiffOptions {
                pool: true,
                ..DiffOptions::default()
            },
        );
        let c = &r.comparisons[0];
        assert_eq!(c.base_rank, None);
        let gemm = c.rows.iter().find(|r| r.name == "sm80_gemm").unwrap();
        assert_eq!((gemm.control_counts, gemm.diff_duration.0), (4, 200.0));

        // One step: only its rows (kernels by the step of their launch).
        let r = run(
            base(),
            new(),
            &DiffOptions {
                step: Some(6),
                ..DiffOptions::default()
            },
        );
        let c = &r.comparisons[0];
        let gemm = c.rows.iter().find(|r| r.name == "sm80_gemm").unwrap();
        assert_eq!(
            (gemm.control_counts, gemm.test_counts, gemm.diff_duration.0),
            (1, 1, 100.0)
        );
        assert_eq!(c.base_steps, 1);
        assert!(c.rows.iter().all(|r| r.name != "ProfilerStep#5"));
    }
}
