//! Runs the example binary under the profiler and reads the trace it writes: the requested
//! `ProfilerStep#N`, the user's ranges in each, candle's own `mlp`/`linear` spans as annotations
//! inside `forward`, one range (and one External id) per enter.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A debug build on a loaded 2-core machine runs the few steps in about a second; the deadline is
/// for a hang.
const DEADLINE: Duration = Duration::from_secs(120);
const LINEARS_PER_FORWARD: usize = 3;

/// Runs the example with `args` writing into `out`; returns its stdout. Fails with what it printed
/// when it fails or outlives the deadline.
fn run_example(out: &Path, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kinetrace-candle-example"))
        .arg("--out")
        .arg(out)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example binary starts");
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    match status {
        Some(s) if s.success() => stdout,
        Some(s) => panic!("example failed ({s}):\nstdout: {stdout}\nstderr: {stderr}"),
        None => {
            panic!("example still running after {DEADLINE:?}:\nstdout: {stdout}\nstderr: {stderr}")
        }
    }
}

fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .collect();
    v.sort();
    v
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A complete event: name, thread, [start, end] in µs, External id.
#[derive(Debug, Clone)]
struct Range {
    name: String,
    tid: Value,
    start: f64,
    end: f64,
    external: Option<u64>,
}

impl Range {
    fn contains(&self, other: &Range) -> bool {
        self.tid == other.tid && self.start <= other.start + 1e-3 && other.end <= self.end + 1e-3
    }
}

fn annotations(trace: &Value) -> Vec<Range> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "user_annotation")
        .map(|e| {
            let start = e["ts"].as_f64().expect("ts");
            Range {
                name: e["name"].as_str().unwrap().to_string(),
                tid: e["tid"].clone(),
                start,
                end: start + e["dur"].as_f64().expect("dur"),
                external: e["args"]["External id"].as_u64(),
            }
        })
        .collect()
}

fn named<'a>(ranges: &'a [Range], name: &str) -> Vec<&'a Range> {
    ranges.iter().filter(|r| r.name == name).collect()
}

fn inside<'a>(outer: &Range, ranges: &'a [Range], name: &str) -> Vec<&'a Range> {
    ranges
        .iter()
        .filter(|r| r.name == name && outer.contains(r))
        .collect()
}

#[test]
fn the_trace_holds_the_steps_the_ranges_and_candles_spans() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_example(
        dir.path(),
        &["--active", "3", "--batch", "16", "--hidden", "32"],
    );
    let traces = traces_in(dir.path());
    assert_eq!(
        traces.len(),
        1,
        "one schedule cycle, one trace: {traces:?}\n{stdout}"
    );
    let ranges = annotations(&load(&traces[0]));

    // wait 1, warm-up 1, active 3: steps 2, 3 and 4 are recorded, no others.
    let mut steps: Vec<&str> = ranges
        .iter()
        .filter(|r| r.name.starts_with("ProfilerStep#"))
        .map(|r| r.name.as_str())
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    );

    let mut linear_ids = Vec::new();
    for step in ranges
        .iter()
        .filter(|r| r.name.starts_with("ProfilerStep#"))
    {
        for name in ["data", "forward", "backward", "optimizer"] {
            assert_eq!(
                inside(step, &ranges, name).len(),
                1,
                "{} holds one {name}: {ranges:#?}",
                step.name
            );
        }
        let forward = inside(step, &ranges, "forward")[0];
        let mlp = inside(forward, &ranges, "mlp");
        assert_eq!(mlp.len(), 1, "one mlp enter per forward");
        let linear = inside(mlp[0], &ranges, "linear");
        assert_eq!(
            linear.len(),
            LINEARS_PER_FORWARD,
            "one range per linear enter, inside mlp: {ranges:#?}"
        );
        // The three enters follow each other (fc1, fc2, fc3), none inside another.
        for w in linear.windows(2) {
            assert!(w[0].end <= w[1].start + 1e-3, "{w:?}");
        }
        linear_ids.extend(linear.iter().map(|l| l.external.expect("External id")));
        // Backward and the optimizer are not spanned by candle: no linear there.
        for name in ["backward", "optimizer"] {
            assert!(inside(inside(step, &ranges, name)[0], &ranges, "linear").is_empty());
        }
    }
    // Every linear range is inside a recorded step's forward, and each enter has its own id.
    assert_eq!(named(&ranges, "linear").len(), 3 * LINEARS_PER_FORWARD);
    let mut unique = linear_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), linear_ids.len(), "{linear_ids:?}");

    // The summary line: CPU, and the loss went down over the run.
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["device"], "cpu");
    assert_eq!(summary["traces"], 1);
    assert_eq!(summary["linears_per_forward"], LINEARS_PER_FORWARD);
    let (first, last) = (
        summary["first_loss"].as_f64().unwrap(),
        summary["last_loss"].as_f64().unwrap(),
    );
    assert!(first.is_finite() && last.is_finite(), "{summary}");
}

#[test]
fn a_subscriber_installed_after_the_model_sees_no_candle_span() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_example(
        dir.path(),
        &[
            "--active",
            "2",
            "--batch",
            "16",
            "--hidden",
            "32",
            "--subscriber-after-model",
        ],
    );
    let traces = traces_in(dir.path());
    assert_eq!(traces.len(), 1, "{traces:?}\n{stdout}");
    let ranges = annotations(&load(&traces[0]));
    // The user's own ranges are there...
    assert_eq!(named(&ranges, "forward").len(), 2, "{ranges:#?}");
    // ...but candle's spans were created before any subscriber existed, and stay disabled.
    assert!(named(&ranges, "linear").is_empty(), "{ranges:#?}");
    assert!(named(&ranges, "mlp").is_empty(), "{ranges:#?}");
}
