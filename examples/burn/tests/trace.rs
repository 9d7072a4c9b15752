//! The example's trace: the requested steps, and inside each of them burn's own spans and the
//! training step's forward / backward / optimizer ranges, all on the training thread.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A hung example fails the test instead of hanging CI (a debug build on a loaded 2-core machine
/// takes a few seconds).
const DEADLINE: Duration = Duration::from_secs(300);

fn run_example(out: &Path) -> String {
    run_example_with(out, &[])
}

fn run_example_with(out: &Path, extra: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kinetrace-burn-example"))
        .arg(out)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("example starts");
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(status.success(), "example failed ({status}):\n{text}");
            return text;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "example still running after {DEADLINE:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .collect();
    v.sort();
    v
}

/// (name, tid, start, end) of the complete events whose name satisfies `f`.
fn ranges(trace: &Value, f: impl Fn(&str) -> bool) -> Vec<(String, u64, f64, f64)> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"].as_str().is_some_and(&f))
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (
                e["name"].as_str().unwrap().to_string(),
                e["tid"].as_u64().unwrap_or(0),
                ts,
                ts + e["dur"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn steps_hold_burn_spans_and_the_training_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let text = run_example(dir.path());
    let files = trace_files(dir.path());
    assert_eq!(
        files.len(),
        1,
        "one trace (one active cycle): {files:?}\n{text}"
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();

    let steps = ranges(&trace, |n| n.starts_with("ProfilerStep#"));
    let mut names: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"],
        "the schedule's active steps, nothing else"
    );
    let training_thread = steps[0].1;
    assert!(steps.iter().all(|s| s.1 == training_thread));

    for step in &steps {
        let inside = |name: &str| -> Vec<(String, u64, f64, f64)> {
            ranges(&trace, |n| n == name)
                .into_iter()
                .filter(|r| r.2 >= step.2 && r.3 <= step.3)
                .collect()
        };
        for name in ["forward", "backward", "optimizer"] {
            let r = inside(name);
            assert_eq!(r.len(), 1, "{} holds one {name}: {r:?}", step.0);
            assert_eq!(r[0].1, training_thread, "{name} on the training thread");
        }
        // burn's autodiff span (`tracing` feature): the batch's two tensors are made from data.
        let burn = inside("float_from_data");
        assert!(
            burn.len() >= 2,
            "{} holds burn-autodiff's float_from_data spans: {burn:?}",
            step.0
        );
        // forward, then backward, then the optimizer.
        let (f, b, o) = (
            &inside("forward")[0],
            &inside("backward")[0],
            &inside("optimizer")[0],
        );
        assert!(f.3 <= b.2 && b.3 <= o.2, "order: {f:?} {b:?} {o:?}");
    }
    // Recorded as annotations, like torch.profiler.record_function.
    let cats: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "float_from_data" || e["name"] == "forward")
        .filter_map(|e| e["cat"].as_str())
        .collect();
    assert!(
        !cats.is_empty() && cats.iter().all(|c| *c == "user_annotation"),
        "{cats:?}"
    );
}

/// The last line of output: the JSON the GPU check reads (gpu/check/gpu_check.py, `cmd_burn`).
fn summary(text: &str) -> Value {
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in:\n{text}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn summary_line_with_and_without_the_profiler() {
    let dir = tempfile::tempdir().unwrap();
    let on = summary(&run_example(dir.path()));
    assert_eq!(on["profiled"], true);
    assert_eq!(on["recorded_steps"], serde_json::json!([3, 4, 5]));
    let traces = on["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 1, "{on}");
    assert!(Path::new(traces[0].as_str().unwrap()).exists(), "{on}");
    // 12 training batches: steps 0..=11, each timed.
    let steps = on["step_ms"].as_array().unwrap();
    assert_eq!(steps.len(), 12, "{on}");
    assert!(steps.iter().all(|t| t.as_f64().unwrap() > 0.0), "{on}");

    let off_dir = tempfile::tempdir().unwrap();
    let off = summary(&run_example_with(off_dir.path(), &["--off"]));
    assert_eq!(off["profiled"], false);
    assert_eq!(off["traces"], serde_json::json!([]));
    assert_eq!(off["step_ms"].as_array().unwrap().len(), 12, "{off}");
    assert!(
        trace_files(off_dir.path()).is_empty(),
        "no profiler, no trace"
    );
}
