//! `kinetrace analyze` as a process: outputs, files written, messages and exit codes.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

fn kinetrace(args: &[&str]) -> Output {
    common::output(
        Command::new(env!("CARGO_BIN_EXE_kinetrace")).args(args),
        common::RUN,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Two steps with one gemm each (stream 7) plus a third, last step that HTA drops.
fn trace(rank: i64) -> Value {
    let mut ev = Vec::new();
    for step in 0..3i64 {
        let s = 1_000_000 + step * 1000;
        ev.push(json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{}", step + 1), "pid": 1, "tid": 1, "ts": s, "dur": 1000}));
        ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s + 10, "dur": 5, "args": {"correlation": step}}));
        ev.push(json!({"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7, "ts": s + 100, "dur": 400, "args": {"stream": 7, "correlation": step}}));
        ev.push(json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": s + 50,
            "args": {"Total Reserved": 1 << 20, "Total Allocated": (step + 1) << 18, "Bytes": 1, "Device Id": 0}}));
    }
    json!({"distributedInfo": {"rank": rank}, "traceEvents": ev})
}

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_vec(v).unwrap()).unwrap();
}

#[test]
fn tables_by_default_and_partial_failures_reported() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rank0.json", &trace(0));
    write(dir.path(), "rank1.json", &trace(1));
    std::fs::write(dir.path().join("broken.json"), b"{\"traceEvents\": [").unwrap();
    let out = kinetrace(&["analyze", dir.path().to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("2 ranks analysed (0, 1)"), "{stdout}");
    assert!(stdout.contains("GPU time per rank"), "{stdout}");
    // Kernel span 100 -> 1500 over the two kept steps: 1.40 ms, 800 µs compute, 600 µs idle.
    assert!(stdout.contains("1.40 ms"), "{stdout}");
    assert!(stdout.contains("42.86%"), "{stdout}");
    let skipped: Vec<&str> = stderr.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(skipped.len(), 1, "{stderr}");
    assert!(
        skipped[0].contains("broken.json") && skipped[0].contains("at byte 17"),
        "{stderr}"
    );
}

#[test]
fn json_only_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rank0.json", &trace(0));
    let out = kinetrace(&[
        "analyze",
        "--json",
        "--only",
        "temporal,memory",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["temporal_breakdown"][0]["kernel_time_us"], 1400);
    assert_eq!(v["temporal_breakdown"][0]["compute_time_us"], 800);
    assert_eq!(v["memory"][0]["peak_allocated_bytes"], 3 << 18);
    assert!(v.get("kernel_breakdown").is_none() && v.get("ops").is_none());
    assert!(v["ranks"].is_array() && v["problems"].is_array());
}

#[test]
fn nothing_analysable_exits_1_with_one_message_per_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.json"), b"not json").unwrap();
    std::fs::write(dir.path().join("b.json.gz"), b"\x1f\x8b\x08\x00trunc").unwrap();
    let out = kinetrace(&["analyze", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr.lines().filter(|l| l.contains("a.json")).count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.contains("b.json.gz")).count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("nothing could be analysed"), "{stderr}");
    assert!(out.stdout.is_empty());

    let empty = tempfile::tempdir().unwrap();
    let out = kinetrace(&["analyze", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no trace files"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn csv_and_svg_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rank0.json", &trace(0));
    let out_dir = tempfile::tempdir().unwrap();
    let csv = out_dir.path().join("csv");
    let svg = out_dir.path().join("report.svg");
    let out = kinetrace(&[
        "analyze",
        "--quiet",
        dir.path().to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let temporal = std::fs::read_to_string(csv.join("temporal.csv")).unwrap();
    let lines: Vec<&str> = temporal.lines().collect();
    assert_eq!(lines[0], "rank,idle_time_us,compute_time_us,non_compute_time_us,kernel_time_us,idle_time_pctg,compute_time_pctg,non_compute_time_pctg");
    assert!(lines[1].starts_with("0,600,800,0,1400,"), "{temporal}");
    for f in [
        "overlap.csv",
        "idle.csv",
        "kernel_types.csv",
        "kernels.csv",
        "ops.csv",
        "steps.csv",
        "memory.csv",
        "memory_timeline.csv",
    ] {
        assert!(csv.join(f).is_file(), "{f} missing");
    }
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("rank 0") && svg.contains("<polyline"), "{svg}");
}

#[test]
fn usage_errors_exit_2() {
    let out = kinetrace(&["analyze", "x", "--plot", "out.png"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(".svg"));
    let out = kinetrace(&["analyze", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for a in [
        "temporal", "overlap", "idle", "kernels", "ops", "steps", "memory",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(a)),
            "{a} not in help:\n{help}"
        );
    }
}

#[test]
fn convert_writes_a_pftrace_and_refuses_other_outputs_and_non_traces() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.json", &trace(0));
    let input = dir.path().join("t.json");
    let out = dir.path().join("t.pftrace");
    let o = kinetrace(&["convert", input.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr)
            .ends_with(": 9 slices (0 overlap lanes), 3 instants, 0 counter values, 0 flows\n"),
        "{}",
        text(&o.stderr)
    );
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes[0], 0x0a);
    assert!(String::from_utf8_lossy(&bytes).contains("sm80_gemm"));
    let o = kinetrace(&["convert", input.to_str().unwrap(), "x.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("must end in .pftrace"),
        "{}",
        text(&o.stderr)
    );
    std::fs::write(
        dir.path().join("bad.json"),
        br#"{"traceEvents": [{"ph": "X""#,
    )
    .unwrap();
    let bad = dir.path().join("bad.json");
    let o = kinetrace(&["convert", bad.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        text(&o.stderr),
        format!(
            "kinetrace: {}: not a Kineto trace: EOF while parsing an object at line 1 column 27\n",
            bad.display()
        )
    );
    // The earlier file is untouched by the failed conversion.
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
}
