//! The config text a dynolog reply carries, read as libkineto reads it (`AbstractConfig::parse`,
//! `Config::handleOption`, `Config::validate`): one `KEY=VALUE` per line, `#` starting a comment,
//! blank lines and surrounding spaces ignored. A pure function from text (and the process's clock and
//! step) to a [`Request`], so every rule is tested without a daemon.
//!
//! A request may come from someone else than the operator (see `endpoint.rs`), so what it may
//! name is narrower than Kineto's text check: the log file lies below the on-demand directory,
//! its path made of plain names (no `..`, no empty component) of [`SAFE`] characters, and its name
//! ends in `.json` or `.json.gz` (the directories themselves are checked when opened: no symlink,
//! no directory of another user or open to others). Every value that reaches the trace (trace ids,
//! the settings not applied) is of [`SAFE`] characters too, or the request is refused.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kinetrace_core::session::CaptureLength;
use kinetrace_core::FrameworkOverrides;

/// A request older than this (its `PROFILE_START_TIME` in the past) is refused, as Kineto does.
pub const MAX_REQUEST_AGE: Duration = Duration::from_secs(10);
/// Kineto's warm-up before a timed capture when the request names none.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(5);
/// Added to the warm-up when `PROFILE_START_TIME` is 0: twice Kineto's 1 s controller period.
pub const START_MARGIN: Duration = Duration::from_secs(2);
/// Kineto's capture length when a timed request names none.
pub const DEFAULT_DURATION: Duration = Duration::from_millis(500);
/// The characters a request's values and paths may hold besides ASCII letters and digits: no
/// spaces, quotes, `$`, backquotes or control characters.
pub const SAFE: &str = "._-:+@/,=";
/// The longest value accepted.
pub const MAX_VALUE: usize = 256;

/// What the process knows when a request arrives.
#[derive(Clone, Debug)]
pub struct Context {
    /// Now, in milliseconds since the Unix epoch (`PROFILE_START_TIME`'s clock).
    pub now_ms: u64,
    /// The step the process is in.
    pub step_num: u64,
    /// This process's id (the log file's `_<pid>` suffix).
    pub pid: u32,
    /// The directory on-demand log files must be under (`KINETO_ONDEMAND_TRACE_DIR`, else `/tmp/`),
    /// ending in `/`.
    pub trace_dir: String,
}

impl Context {
    /// The directory on-demand traces may go to: `$KINETO_ONDEMAND_TRACE_DIR` if set and non-empty,
    /// else `/tmp/`, with a trailing `/` (Kineto's `allowedOnDemandTraceDir`).
    pub fn trace_dir_from(var: Option<&str>) -> String {
        let mut d = match var {
            Some(v) if !v.is_empty() => v.to_string(),
            _ => "/tmp/".to_string(),
        };
        if !d.ends_with('/') {
            d.push('/');
        }
        d
    }
}

/// When a requested capture starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// This long from now (timed requests).
    After(Duration),
    /// At this step (iteration requests).
    AtStep(u64),
}

/// A request, ready to become a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// When recording starts.
    pub start: Start,
    /// How long it records.
    pub length: CaptureLength,
    /// The trace file, with Kineto's `_<pid>` suffix.
    pub log_file: PathBuf,
    /// Its directory relative to the on-demand directory (plain names; empty: that directory).
    pub dir: PathBuf,
    /// Its file name (ending in `.json` or `.json.gz`).
    pub file_name: String,
    /// `REQUEST_TRACE_ID` (and `REQUEST_GROUP_TRACE_ID`), for the trace's metadata.
    pub trace_ids: Vec<(String, String)>,
    /// `KEY=VALUE` settings accepted and not applied (flags kinetrace does not record per request,
    /// keys it does not know), for the trace's metadata.
    pub ignored: Vec<String>,
    /// What the framework recorders turn on for this capture (`PROFILE_REPORT_INPUT_SHAPES`);
    /// `None` where the request does not say.
    pub framework: FrameworkOverrides,
}

/// Why a request is refused: the key, what it held, and the accepted form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// The key (or `line` for a line that is not `KEY=VALUE`).
    pub key: String,
    /// What it held.
    pub value: String,
    /// What was wrong and the accepted form.
    pub expected: String,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}` {}", self.key, self.value, self.expected)
    }
}

impl std::error::Error for RequestError {}

fn error(key: &str, value: &str, expected: impl Into<String>) -> RequestError {
    RequestError {
        key: key.to_string(),
        value: value.to_string(),
        expected: expected.into(),
    }
}

/// Reads a request's config text (what a reply carries; never empty here).
pub fn parse(text: &str, ctx: &Context) -> Result<Request, RequestError> {
    let mut log_file = None;
    let mut start_time_ms = None;
    let mut warmup = None;
    let mut duration = None;
    let mut start_iteration = None;
    let mut roundup = None;
    let mut iterations = None;
    let mut trace_ids = Vec::new();
    let mut ignored = Vec::new();
    let mut framework = FrameworkOverrides::default();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(error("line", line, "is not KEY=VALUE"));
        };
        let (key, value) = (key.trim(), value.trim());
        // Keys and values reach the trace's metadata (the settings not applied, the trace ids).
        check_safe(key, key)?;
        check_safe(key, value)?;
        let int = |min: u64, form: &str| -> Result<u64, RequestError> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n >= min)
                .ok_or_else(|| error(key, value, format!("is not {form}")))
        };
        match key {
            "ACTIVITIES_LOG_FILE" => log_file = Some(value.to_string()),
            "PROFILE_START_TIME" => {
                start_time_ms = Some(int(
                    0,
                    "a time in milliseconds since the Unix epoch (an integer >= 0; 0 = now + \
                     warm-up + 2 s)",
                )?)
            }
            "ACTIVITIES_WARMUP_PERIOD_SECS" => {
                warmup = Some(Duration::from_secs(int(
                    0,
                    "an integer number of seconds >= 0, such as 5",
                )?))
            }
            "ACTIVITIES_DURATION_MSECS" => {
                duration = Some(Duration::from_millis(int(
                    1,
                    "an integer number of milliseconds >= 1, such as 500",
                )?))
            }
            "ACTIVITIES_DURATION_SECS" => {
                duration = Some(Duration::from_secs(int(
                    1,
                    "an integer number of seconds >= 1, such as 2",
                )?))
            }
            "PROFILE_START_ITERATION" => {
                start_iteration = Some(int(0, "an integer >= 0, such as 0")?)
            }
            "PROFILE_START_ITERATION_ROUNDUP" => {
                roundup = Some(int(1, "an integer >= 1, such as 100")?)
            }
            "ACTIVITIES_ITERATIONS" => {
                let n = int(1, "an integer >= 1, such as 3")?;
                let n = u32::try_from(n)
                    .map_err(|_| error(key, value, "is not an integer from 1 to 4294967295"))?;
                iterations = Some(n)
            }
            "REQUEST_TRACE_ID" | "REQUEST_GROUP_TRACE_ID" => {
                trace_ids.push((key.to_string(), value.to_string()))
            }
            "PROFILE_REPORT_INPUT_SHAPES" => framework.record_shapes = Some(boolean(key, value)?),
            "PROFILE_WITH_STACK" => framework.with_stack = Some(boolean(key, value)?),
            "PROFILE_PROFILE_MEMORY" => framework.profile_memory = Some(boolean(key, value)?),
            _ => ignored.push(format!("{key}={value}")),
        }
    }
    let (log_file, dir, file_name) = output_path(log_file.as_deref(), ctx)?;
    let (start, length) = if start_iteration.is_some() || roundup.is_some() {
        let Some(n) = iterations else {
            return Err(error(
                "ACTIVITIES_ITERATIONS",
                "",
                "is missing: an iteration request (PROFILE_START_ITERATION or \
                 PROFILE_START_ITERATION_ROUNDUP) needs an integer >= 1, such as 3",
            ));
        };
        // Kineto: a start already past moves to the current iteration, then rounds up to the next
        // multiple. The step in progress cannot be recorded whole, so the earliest is the next.
        let mut first = start_iteration.unwrap_or(0).max(ctx.step_num + 1);
        if let Some(r) = roundup {
            first = first.div_ceil(r).saturating_mul(r);
        }
        (Start::AtStep(first), CaptureLength::Steps(n))
    } else {
        let warmup = warmup.unwrap_or(DEFAULT_WARMUP);
        let delay = match start_time_ms {
            None | Some(0) => warmup + START_MARGIN,
            Some(t) if t < ctx.now_ms => {
                let age = Duration::from_millis(ctx.now_ms - t);
                if age > MAX_REQUEST_AGE {
                    return Err(error(
                        "PROFILE_START_TIME",
                        &t.to_string(),
                        format!(
                            "is {:.1} s in the past; expected a time in milliseconds since the \
                             Unix epoch at most {} s ago, or 0 (now + warm-up + 2 s)",
                            age.as_secs_f64(),
                            MAX_REQUEST_AGE.as_secs()
                        ),
                    ));
                }
                Duration::ZERO
            }
            Some(t) => Duration::from_millis(t - ctx.now_ms),
        };
        (
            Start::After(delay),
            CaptureLength::Duration(duration.unwrap_or(DEFAULT_DURATION)),
        )
    };
    Ok(Request {
        start,
        length,
        log_file,
        dir,
        file_name,
        trace_ids,
        ignored,
        framework,
    })
}

/// A flag's value, as Kineto's config reads it (`true`/`false`, `1`/`0`, `yes`/`no`, any case).
fn boolean(key: &str, value: &str) -> Result<bool, RequestError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(error(key, value, "is not a boolean (true or false)")),
    }
}

/// Whether `c` may appear in a value or a path of a request.
fn safe_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || SAFE.contains(c)
}

/// A value (or key) of [`SAFE`] characters and at most [`MAX_VALUE`] bytes, else an error naming
/// the key.
fn check_safe(key: &str, value: &str) -> Result<(), RequestError> {
    if value.len() > MAX_VALUE {
        return Err(error(
            key,
            &value[..value.floor_char_boundary_compat(40)],
            format!("… is longer than {MAX_VALUE} bytes; the request is refused"),
        ));
    }
    if let Some(c) = value.chars().find(|c| !safe_char(*c)) {
        return Err(error(
            key,
            &value.escape_debug().to_string(),
            format!(
                "holds {:?}: request values may hold only ASCII letters, digits and {SAFE} \
                 (they reach the trace); the request is refused",
                c
            ),
        ));
    }
    Ok(())
}

/// `str::floor_char_boundary` for the MSRV.
trait FloorBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        i = i.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

/// The trace file for `ACTIVITIES_LOG_FILE`: (the path, its directory relative to the on-demand
/// directory, its name). Only below the on-demand directory (Kineto's
/// `isAllowedOnDemandTraceFile`), through plain names of [`SAFE`] characters, to a name ending in
/// `.json` or `.json.gz`; `x.pt.trace.json` becomes `x_<pid>.pt.trace.json` and else `x.json`
/// becomes `x_<pid>.json` (Kineto's naming, which `dyno` prints). None given: Kineto's default
/// `libkineto_activities_<pid>.json` in that directory.
fn output_path(
    value: Option<&str>,
    ctx: &Context,
) -> Result<(PathBuf, PathBuf, String), RequestError> {
    let pid = ctx.pid;
    let Some(v) = value else {
        let name = format!("libkineto_activities_{pid}.json");
        return Ok((
            PathBuf::from(format!("{}{name}", ctx.trace_dir)),
            PathBuf::new(),
            name,
        ));
    };
    let expected = |why: &str| {
        format!(
            "is not allowed ({why}); expected a path under {} (the directory \
             KINETO_ONDEMAND_TRACE_DIR names, else /tmp/) through plain names (no `..`), ending in \
             .json or .json.gz, such as {}trace.json",
            ctx.trace_dir, ctx.trace_dir
        )
    };
    let refuse = |why: &str| Err(error("ACTIVITIES_LOG_FILE", v, expected(why)));
    let Some(rest) = v.strip_prefix(&ctx.trace_dir) else {
        return refuse("outside the on-demand directory");
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return refuse("an empty, `.` or `..` component");
    }
    if let Some(c) = rest.chars().find(|c| !safe_char(*c)) {
        return refuse(&format!("the character {c:?}"));
    }
    let (file, dirs) = parts.split_last().unwrap_or((&"", &[]));
    let named = if let Some(i) = file.find(".pt.trace.json") {
        format!("{}_{pid}{}", &file[..i], &file[i..])
    } else if let Some(i) = file.find(".json") {
        format!("{}_{pid}{}", &file[..i], &file[i..])
    } else {
        file.to_string()
    };
    if !(named.ends_with(".json") || named.ends_with(".json.gz")) || named.starts_with('.') {
        return refuse("the file name must end in .json or .json.gz and not start with `.`");
    }
    let dir: PathBuf = dirs.iter().collect();
    let log_file = Path::new(&ctx.trace_dir).join(&dir).join(&named);
    Ok((log_file, dir, named))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context {
            now_ms: 1_800_000_000_000,
            step_num: 12,
            pid: 4242,
            trace_dir: "/tmp/".into(),
        }
    }

    /// What dynolog 0.6.0 sends for `dyno gputrace --duration-ms 123 --log-file /tmp/x/trace.json`
    /// (observed on the wire; see the research notes).
    const DURATION_REQUEST: &str = "\n    ACTIVITIES_LOG_FILE=/tmp/x/trace.json\nPROFILE_START_TIME=0\n\
        ACTIVITIES_DURATION_MSECS=123\nPROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_WITH_STACK=false\n\
        PROFILE_WITH_FLOPS=false\nPROFILE_WITH_MODULES=false\n    REQUEST_TRACE_ID=abc123\n";

    #[test]
    fn a_duration_request_starts_after_warm_up_and_names_its_file_for_the_pid() {
        let r = parse(DURATION_REQUEST, &ctx()).unwrap();
        assert_eq!(r.start, Start::After(Duration::from_secs(7)));
        assert_eq!(
            r.length,
            CaptureLength::Duration(Duration::from_millis(123))
        );
        assert_eq!(r.log_file, PathBuf::from("/tmp/x/trace_4242.json"));
        assert_eq!(
            r.trace_ids,
            vec![("REQUEST_TRACE_ID".to_string(), "abc123".to_string())]
        );
        assert_eq!(
            r.ignored,
            ["PROFILE_WITH_FLOPS=false", "PROFILE_WITH_MODULES=false"]
        );
        // `dyno gputrace` without --record-shapes asks for none, and the capture gets none.
        assert_eq!(r.framework.record_shapes, Some(false));
        assert_eq!(r.framework.with_stack, Some(false));
        assert_eq!(r.framework.profile_memory, None);
    }

    #[test]
    fn stacks_and_allocator_memory_are_honoured_per_request() {
        let c = ctx();
        let r = parse("PROFILE_WITH_STACK=true\nPROFILE_PROFILE_MEMORY=1\n", &c).unwrap();
        assert_eq!(r.framework.with_stack, Some(true));
        assert_eq!(r.framework.profile_memory, Some(true));
        assert_eq!(r.framework.record_shapes, None);
        assert!(r.ignored.is_empty(), "{:?}", r.ignored);
        let r = parse("PROFILE_PROFILE_MEMORY=false\n", &c).unwrap();
        assert_eq!(r.framework.profile_memory, Some(false));
        let e = parse("PROFILE_WITH_STACK=often\n", &c).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PROFILE_WITH_STACK: `often` is not a boolean (true or false)"
        );
    }

    #[test]
    fn input_shapes_are_honoured_per_request() {
        let c = ctx();
        let with = |v: &str| {
            parse(
                &format!(
                    "PROFILE_REPORT_INPUT_SHAPES={v}
"
                ),
                &c,
            )
        };
        for (v, want) in [("true", true), ("1", true), ("False", false), ("0", false)] {
            let r = with(v).unwrap();
            assert_eq!(r.framework.record_shapes, Some(want), "{v}");
            assert!(r.ignored.is_empty());
        }
        assert_eq!(
            parse("ACTIVITIES_DURATION_MSECS=5", &c)
                .unwrap()
                .framework
                .record_shapes,
            None
        );
        let e = with("maybe").unwrap_err();
        assert_eq!(
            e.to_string(),
            "PROFILE_REPORT_INPUT_SHAPES: `maybe` is not a boolean (true or false)"
        );
    }

    #[test]
    fn start_times_in_the_future_delay_and_old_ones_are_refused() {
        let c = ctx();
        let at = |t: u64| format!("PROFILE_START_TIME={t}\nACTIVITIES_DURATION_MSECS=50\n");
        let r = parse(&at(c.now_ms + 2500), &c).unwrap();
        assert_eq!(r.start, Start::After(Duration::from_millis(2500)));
        let r = parse(&at(c.now_ms - 3000), &c).unwrap();
        assert_eq!(r.start, Start::After(Duration::ZERO));
        let e = parse(&at(c.now_ms - 10_500), &c).unwrap_err();
        assert_eq!(e.key, "PROFILE_START_TIME");
        assert!(e.to_string().contains("10.5 s in the past"), "{e}");
        let r = parse("ACTIVITIES_WARMUP_PERIOD_SECS=1\nPROFILE_START_TIME=0", &c).unwrap();
        assert_eq!(r.start, Start::After(Duration::from_secs(3)));
        assert_eq!(r.length, CaptureLength::Duration(DEFAULT_DURATION));
    }

    #[test]
    fn iteration_requests_round_up_from_the_next_step() {
        let c = ctx();
        let req = |s: u64, r: u64| {
            format!("PROFILE_START_ITERATION={s}\nPROFILE_START_ITERATION_ROUNDUP={r}\nACTIVITIES_ITERATIONS=3")
        };
        // dyno sends start 0 and a round-up (default 1): the next step.
        let r = parse(&req(0, 1), &c).unwrap();
        assert_eq!(
            (r.start, r.length),
            (Start::AtStep(13), CaptureLength::Steps(3))
        );
        assert_eq!(parse(&req(0, 10), &c).unwrap().start, Start::AtStep(20));
        assert_eq!(parse(&req(40, 1), &c).unwrap().start, Start::AtStep(40));
        assert_eq!(parse(&req(41, 20), &c).unwrap().start, Start::AtStep(60));
        let e = parse("PROFILE_START_ITERATION=0", &c).unwrap_err();
        assert_eq!(e.key, "ACTIVITIES_ITERATIONS");
        let e = parse(&req(0, 0), &c).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PROFILE_START_ITERATION_ROUNDUP: `0` is not an integer >= 1, such as 100"
        );
    }

    #[test]
    fn log_files_stay_in_the_on_demand_directory() {
        let mut c = ctx();
        let file = |f: &str, c: &Context| parse(&format!("ACTIVITIES_LOG_FILE={f}"), c);
        assert_eq!(
            file("/tmp/a.pt.trace.json", &c).unwrap().log_file,
            PathBuf::from("/tmp/a_4242.pt.trace.json")
        );
        let r = file("/tmp/run/x/t.json.gz", &c).unwrap();
        assert_eq!(r.log_file, PathBuf::from("/tmp/run/x/t_4242.json.gz"));
        assert_eq!(
            (r.dir, r.file_name),
            (PathBuf::from("run/x"), "t_4242.json.gz".into())
        );
        // Only the file name gets the pid, whatever the directories are called.
        assert_eq!(
            file("/tmp/a.json.d/t.json", &c).unwrap().log_file,
            PathBuf::from("/tmp/a.json.d/t_4242.json")
        );
        for bad in [
            "/etc/passwd.json",
            "/tmp/../etc/x.json",
            "/tmpx/a.json",
            "/tmp/",
            "/tmp/plain",
            "/tmp/x/.bashrc",
            "/tmp/a//b.json",
            "/tmp/./b.json",
            "/tmp/x/",
            "/tmp/a b.json",
            "/tmp/$(id).json",
        ] {
            let e = file(bad, &c).unwrap_err();
            assert_eq!(e.key, "ACTIVITIES_LOG_FILE", "{bad}");
            let e = e.to_string();
            assert!(
                e.contains("expected a path under /tmp/") || e.contains("the request is refused"),
                "{e}"
            );
        }
        assert_eq!(
            parse("ACTIVITIES_DURATION_MSECS=5", &c).unwrap().log_file,
            PathBuf::from("/tmp/libkineto_activities_4242.json")
        );
        c.trace_dir = Context::trace_dir_from(Some("/data/traces"));
        assert_eq!(c.trace_dir, "/data/traces/");
        assert!(file("/tmp/a.json", &c).is_err());
        assert_eq!(
            file("/data/traces/a.json", &c).unwrap().log_file,
            PathBuf::from("/data/traces/a_4242.json")
        );
    }

    #[test]
    fn values_that_reach_the_trace_hold_only_safe_characters() {
        let c = ctx();
        for bad in [
            "REQUEST_TRACE_ID=$(id>/tmp/x)",
            "REQUEST_GROUP_TRACE_ID=a b",
            "PROFILE_WITH_STACK=`touch x`",
            "NEW_KEY=x;y",
            "BAD\"KEY=1",
        ] {
            let e = parse(bad, &c).unwrap_err();
            assert!(
                e.to_string().contains("the request is refused"),
                "{bad}: {e}"
            );
        }
        let e = parse(&format!("REQUEST_TRACE_ID={}", "a".repeat(300)), &c).unwrap_err();
        assert!(e.to_string().contains("longer than 256 bytes"), "{e}");
        let r = parse("REQUEST_TRACE_ID=4f2a-9:b", &c).unwrap();
        assert_eq!(r.trace_ids[0].1, "4f2a-9:b");
    }

    #[test]
    fn malformed_lines_and_values_name_the_key_and_the_form() {
        let c = ctx();
        let e = parse("ACTIVITIES_DURATION_MSECS=soon", &c).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ACTIVITIES_DURATION_MSECS: `soon` is not an integer number of milliseconds >= 1, \
             such as 500"
        );
        let e = parse("# a comment\n  \nnot a setting\n", &c).unwrap_err();
        assert_eq!(e.to_string(), "line: `not a setting` is not KEY=VALUE");
        let r = parse(
            "ACTIVITIES_DURATION_MSECS = 20 # trailing comment\nNEW_KEY=x",
            &c,
        )
        .unwrap();
        assert_eq!(r.length, CaptureLength::Duration(Duration::from_millis(20)));
        assert_eq!(r.ignored, ["NEW_KEY=x"]);
    }
}
