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
fn a_cpu_only_trace_gets_one_line_for_the_gpu_sections() {
    let dir = tempfile::tempdir().unwrap();
    let mut cpu = trace(0);
    let events = cpu["traceEvents"].as_array_mut().unwrap();
    events.retain(|e| e["cat"] == "user_annotation");
    events.push(json!({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 1_000_100, "dur": 300}));
    write(dir.path(), "rank0.json", &cpu);
    let out = kinetrace(&["analyze", dir.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let before_ops = &stdout[..stdout.find("Ops and annotations").unwrap()];
    assert_eq!(before_ops.matches("(no rows)").count(), 0, "{stdout}");
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("GPU sections"))
        .collect();
    assert_eq!(
        said,
        ["GPU sections (temporal, overlap, idle, kernels, collectives): no GPU rows in any trace \
          (a CPU-only job), nothing to show"],
        "{stdout}"
    );
    assert!(!stdout.contains("GPU time per rank"), "{stdout}");
    assert!(stdout.contains("aten::addmm"), "{stdout}");
    // Asked for one GPU analysis only: the same line, naming it.
    let out = kinetrace(&["analyze", "--only", "idle", dir.path().to_str().unwrap()]);
    assert!(
        text(&out.stdout).contains("GPU sections (idle): no GPU rows"),
        "{}",
        text(&out.stdout)
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
    assert_eq!(lines[0], "rank,idle_time_us,compute_time_us,non_compute_time_us,kernel_time_us,idle_time_pctg,compute_time_pctg,non_compute_time_pctg,cycle");
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
    assert!(
        svg.contains("rank 0") && svg.contains(r#"<path class="alloc""#),
        "{svg}"
    );
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

/// Three 10 ms steps; in each, `aten::item` blocks until the first kernel ends at 4 ms and the
/// next launch comes at 6 ms, so the GPU idles 1.98 ms per step after the sync.
fn trace_with_sync(rank: i64) -> Value {
    let mut ev = Vec::new();
    for step in 0..3i64 {
        let s = 1_000_000 + step * 10_000;
        let c = step * 10;
        ev.push(json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{}", step + 10), "pid": 1, "tid": 1, "ts": s, "dur": 10_000}));
        ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s + 20, "dur": 5, "args": {"correlation": c}}));
        ev.push(json!({"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7, "ts": s + 50, "dur": 3_950, "args": {"stream": 7, "correlation": c}}));
        ev.push(json!({"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 1, "ts": s + 300, "dur": 3_800}));
        ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": s + 320, "dur": 3_700, "args": {"correlation": c + 1}}));
        ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s + 4_200, "dur": 5, "args": {"correlation": c + 2}}));
        ev.push(json!({"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7, "ts": s + 6_000, "dur": 3_950, "args": {"stream": 7, "correlation": c + 2}}));
        ev.push(json!({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": s + 4_200, "dur": 1_790}));
    }
    json!({"distributedInfo": {"rank": rank}, "traceEvents": ev})
}

#[test]
fn doctor_reports_findings_with_exit_code_0() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rank0.json", &trace_with_sync(0));
    write(dir.path(), "rank1.json", &trace_with_sync(1));
    std::fs::write(dir.path().join("broken.json"), b"{\"traceEvents\": [").unwrap();
    let out = kinetrace(&["doctor", dir.path().to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("2 traces read (ranks 0, 1), 6 steps: 1 finding"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning[sync-in-step]: Host syncs in the training step"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "cost: 1.98 ms per step (19.8% of the step) on rank 0, the worst of ranks 0, 1"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("aten::item → cudaStreamSynchronize"),
        "{stdout}"
    );
    assert!(
        stdout.contains("rank 0 at 0.320 ms: cudaStreamSynchronize (3.70 ms), ts 1000320.000"),
        "{stdout}"
    );
    assert!(stdout.contains("  fix: Keep values on the GPU"), "{stdout}");
    let skipped: Vec<&str> = stderr.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(skipped.len(), 1, "{stderr}");
    assert!(
        skipped[0].contains("broken.json") && skipped[0].contains("at byte 17"),
        "{stderr}"
    );

    let out = kinetrace(&[
        "doctor",
        "--json",
        dir.path().join("rank1.json").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["ranks"][0]["steps"], 3);
    let f = &v["findings"][0];
    assert_eq!(f["rule"], "sync-in-step");
    assert_eq!(f["severity"], "warning");
    assert_eq!(f["ranks"], json!([1]));
    assert_eq!(f["cost_per_step_us"], 1980);
    assert_eq!(f["evidence"][0]["count"], 3);
    assert_eq!(f["examples"][0]["ts_us"], 1000320.0);
    assert_eq!(f["per_step"], true);
}

/// A flight dump of steps 1..=5 of `rank` (1 ms each with one `aten::mm`, a finished
/// `c10d::allreduce_` in step 3), whose step 5 also ran a 30 ms `aten::cat`; `head` adds its
/// `flight_*` keys.
fn flight_dump(rank: i64, head: Value) -> Value {
    let mut ev = Vec::new();
    let mut t = 1_000_000.0;
    for step in 1..=5 {
        let len = if step == 5 { 32_000.0 } else { 1_000.0 };
        ev.push(
            json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{step}"),
                       "pid": 1, "tid": 1, "ts": t, "dur": len}),
        );
        ev.push(
            json!({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                       "ts": t + 100.0, "dur": 500.0}),
        );
        if step == 3 {
            ev.push(
                json!({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1,
                           "tid": 1, "ts": t + 700.0, "dur": 200.0}),
            );
        }
        if step == 5 {
            ev.push(
                json!({"ph": "X", "cat": "cpu_op", "name": "aten::cat", "pid": 1, "tid": 1,
                           "ts": t + 700.0, "dur": 30_000.0}),
            );
        }
        t += len;
    }
    // The dump's span: from the first step to the end of the last (Unix ns; base time 0).
    let mut v = json!({
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": 2},
        "flight_start_ns": "1000000000",
        "flight_end_ns": format!("{}", (t * 1000.0) as u64),
        "flight_first_step": "1",
        "flight_last_step": "5",
        "traceEvents": ev,
    });
    for (k, val) in head.as_object().unwrap() {
        v[k] = val.clone();
    }
    v
}

/// `doctor --json` on flight dumps: a `flight` array, one object per dump starting from its
/// trigger (why, the span, the steps), with what the text prints for it: a slow step against the
/// median and the diff of it against the steps before; a hang's op and each rank's last
/// collective. Without dumps the array is empty.
#[test]
fn doctor_json_starts_from_each_flight_dumps_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let slow = json!({
        "flight_trigger": "slow_step",
        "flight_reason": "step 5 took 32.000 ms, 32.0x the median 1.000 ms of the 4 steps before it (threshold 3x)",
        "flight_slow_step": "5",
        "flight_slow_step_ns": "32000000",
        "flight_median_step_ns": "1000000",
        "flight_slow_factor": "3",
        "flight_median_window": "4",
        "flight_trigger_ns": "1036000000",
        "flight_after_ns": "2000000000",
    });
    write(dir.path(), "slow.json", &flight_dump(0, slow));
    let hang = json!({
        "flight_trigger": "hang",
        "flight_reason": "no step for 5.0 s (step 5 in progress) while c10d::allreduce_ has been open for 5.0 s on thread 1",
        "flight_hang_op": "c10d::allreduce_",
        "flight_hang_stalled_ns": "5000000000",
        "kinetrace_partial_step": "5",
    });
    let hangs = tempfile::tempdir().unwrap();
    write(hangs.path(), "rank1.json", &flight_dump(1, hang.clone()));
    write(hangs.path(), "rank0.json", &flight_dump(0, hang));

    let out = kinetrace(&["doctor", "--json", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    let flight = v["flight"].as_array().unwrap();
    assert_eq!(flight.len(), 1, "{v:#}");
    let d = &flight[0];
    assert_eq!(d["trigger"], "slow_step");
    assert!(d["reason"]
        .as_str()
        .unwrap()
        .starts_with("step 5 took 32.000 ms"));
    assert_eq!(d["rank"], 0);
    assert_eq!(d["span_start_ns"], 1_000_000_000i64);
    assert_eq!(d["span_end_ns"], 1_036_000_000i64);
    assert_eq!(d["trigger_ns"], 1_036_000_000i64);
    assert_eq!(d["after_ns"], 2_000_000_000i64);
    assert_eq!(d["steps"], json!([1, 5]));
    assert!(d["partial_step"].is_null(), "{d:#}");
    // The slow step against the median, as the head says.
    let s = &d["slow"];
    assert_eq!(
        (s["step"].as_i64(), s["dur_ns"].as_i64()),
        (Some(5), Some(32_000_000))
    );
    assert_eq!(
        (s["median_ns"].as_i64(), s["ratio"].as_f64()),
        (Some(1_000_000), Some(32.0))
    );
    assert_eq!(
        (s["factor"].as_f64(), s["window"].as_i64()),
        (Some(3.0), Some(4))
    );
    // ... and the diff lines the text prints: step 5 against steps 1..=4 of the same dump, the
    // op it added first.
    let c = &d["slow_step"];
    assert_eq!(
        (c["base_steps"].as_i64(), c["new_steps"].as_i64()),
        (Some(4), Some(1))
    );
    let rows = c["rows"].as_array().unwrap();
    let first_op = rows.iter().find(|r| r["kind"] != "annotation").unwrap();
    assert_eq!(first_op["name"], "aten::cat", "{rows:#?}");
    assert_eq!(first_op["category"], "added");
    assert!(c["step_time_diff_us"].as_f64().unwrap() > 30_000.0);
    // Same text out of the same dump (the text and the JSON come from one reading).
    let txt = text(&kinetrace(&["doctor", dir.path().to_str().unwrap()]).stdout);
    assert!(
        txt.starts_with("Flight dump, rank 0 (slow_step): step 5 took 32.000 ms"),
        "{txt}"
    );
    assert!(txt.contains("aten::cat"), "{txt}");

    // Two ranks' hang dumps: each names the op and its last finished collective.
    let out = kinetrace(&["doctor", "--json", hangs.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let flight = v["flight"].as_array().unwrap();
    let ranks: Vec<_> = flight.iter().map(|d| d["rank"].as_i64()).collect();
    assert_eq!(ranks, [Some(0), Some(1)]);
    for d in flight {
        assert_eq!(d["trigger"], "hang");
        assert_eq!(d["hang_op"], "c10d::allreduce_");
        assert_eq!(d["hang_stalled_ns"], 5_000_000_000i64);
        assert_eq!(d["partial_step"], 5);
        assert!(d["slow"].is_null() && d["slow_step"].is_null(), "{d:#}");
        let l = &d["last_collective"];
        assert_eq!(l["name"], "c10d::allreduce_");
        assert_eq!(l["dur_us"], 200.0);
        // It ended 2.9 ms into the 36 ms dump.
        assert_eq!(l["ended_us_before_dump"], 36_000.0 - 2_900.0);
    }

    // No dumps: an empty array.
    let plain = tempfile::tempdir().unwrap();
    write(plain.path(), "rank0.json", &trace_with_sync(0));
    let out = kinetrace(&["doctor", "--json", plain.path().to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["flight"], json!([]));
}

#[test]
fn doctor_without_findings_and_with_nothing_readable() {
    let dir = tempfile::tempdir().unwrap();
    // `trace`'s steps, numbered as steady-state steps (#11..#13): nothing to report.
    let mut v = trace(0);
    for e in v["traceEvents"].as_array_mut().unwrap() {
        if let Some(n) = e["name"]
            .as_str()
            .and_then(|n| n.strip_prefix("ProfilerStep#"))
        {
            e["name"] = json!(format!("ProfilerStep#{}", 10 + n.parse::<i64>().unwrap()));
        }
    }
    write(dir.path(), "rank0.json", &v);
    let out = kinetrace(&["doctor", "-q", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("no findings: none of the 17 rules fired"),
        "{stdout}"
    );
    // As numbered (#1..#3), the window holds the process's first steps: one info finding.
    write(dir.path(), "rank0.json", &trace(0));
    let out = kinetrace(&["doctor", "-q", dir.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("1 trace read (rank 0), 3 steps: 1 finding"),
        "{stdout}"
    );
    assert!(stdout.contains("info[warmup-in-window]"), "{stdout}");

    let bad = dir.path().join("bad.json.gz");
    std::fs::write(&bad, [0x1f, 0x8b, 8, 0, 0, 0]).unwrap();
    let out = kinetrace(&["doctor", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad.json.gz"), "{stderr}");
    assert!(stderr.contains("no trace could be read"), "{stderr}");
}

/// Per step: `big_gemm` launched 5 times (100 µs each) and ten other kernels once (10 µs), so one
/// type has 11 kernels and HTA's re-aggregation over totals applies.
fn trace_with_many_kernels() -> Value {
    let mut ev = Vec::new();
    let mut corr = 0;
    for step in 0..3i64 {
        let s = 1_000_000 + step * 10_000;
        ev.push(json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{}", step + 1), "pid": 1, "tid": 1, "ts": s, "dur": 10_000}));
        let names: Vec<String> = std::iter::repeat_n("big_gemm".to_string(), 5)
            .chain((0..10).map(|k| format!("small_kernel_{k}")))
            .collect();
        for (j, name) in names.iter().enumerate() {
            corr += 1;
            let j = j as i64;
            let dur = if name == "big_gemm" { 100 } else { 10 };
            ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s + 10 + j * 10, "dur": 5, "args": {"correlation": corr}}));
            ev.push(json!({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": s + 1_000 + j * 200, "dur": dur, "args": {"stream": 7, "correlation": corr}}));
        }
    }
    json!({"distributedInfo": {"rank": 0}, "traceEvents": ev})
}

#[test]
fn kernel_table_shows_per_launch_statistics_json_keeps_htas() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rank0.json", &trace_with_many_kernels());
    let d = dir.path().to_str().unwrap();
    let out = kinetrace(&["analyze", d, "--only", "kernels", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let big = v["kernel_breakdown"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "big_gemm")
        .unwrap();
    // Two steps count (HTA drops the last): 10 launches, 1000 µs. HTA's fields hold the total.
    assert_eq!(
        (
            &big["sum_us"],
            &big["mean_us"],
            &big["min_us"],
            &big["max_us"]
        ),
        (&json!(1000), &json!(1000), &json!(1000), &json!(1000))
    );
    assert_eq!(big["count"], 10);
    assert_eq!(
        (
            &big["launch_mean_us"],
            &big["launch_min_us"],
            &big["launch_max_us"],
            &big["launch_stddev_us"]
        ),
        (&json!(100), &json!(100), &json!(100), &json!(0))
    );

    let out = kinetrace(&["analyze", d, "--only", "kernels", "-q"]);
    let stdout = text(&out.stdout);
    let row = stdout
        .lines()
        .find(|l| l.contains("big_gemm"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "0",
            "computation",
            "big_gemm",
            "1.00 ms",
            "10",
            "100 µs",
            "100 µs",
            "100 µs"
        ],
        "{stdout}"
    );
}

#[test]
fn diff_compares_two_runs_and_exits_1_when_nothing_matches() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    write(&a, "rank0.json", &trace(0));
    write(&b, "rank0.json", &trace_with_sync(0));
    let out = kinetrace(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "-q"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("rank 0: step time 1.00 ms → 10.00 ms (+9.00 ms, +900.0%)"),
        "{stdout}"
    );
    assert!(stdout.contains("cudaStreamSynchronize"), "{stdout}");

    let out = kinetrace(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 2);
    let c = &v["comparisons"][0];
    let row = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "sm80_gemm")
        .unwrap();
    // Base: 3 × 400 µs; new: 6 × 3950 µs.
    assert_eq!(
        (
            &row["control_counts"],
            &row["test_counts"],
            &row["diff_counts"]
        ),
        (&json!(3), &json!(6), &json!(3))
    );
    assert_eq!(row["diff_duration"], json!(6 * 3950 - 1200));
    assert_eq!(row["counts_change_categories"], "+");
    assert_eq!(row["category"], "increased");
    assert_eq!(
        c["ops_diff"],
        json!({
            "added": ["ProfilerStep#10", "ProfilerStep#11", "ProfilerStep#12", "aten::add",
                      "aten::item", "cudaStreamSynchronize"],
            "deleted": ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"],
            "increased": ["cudaLaunchKernel", "sm80_gemm"],
            "decreased": [],
            "unchanged": []
        })
    );

    // Different ranks on each side of a directory comparison: nothing in common.
    write(&b, "rank0.json", &trace_with_sync(3));
    write(&b, "rank4.json", &trace_with_sync(4));
    let out = kinetrace(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("rank 0 is only on the base side"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing to compare"), "{stderr}");
    // Pooled, they compare.
    let out = kinetrace(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--pool",
        "-q",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("all ranks pooled"));
}

/// `steps` steps of 9 ms, each with one gemm of 3.6 ms (stream 7).
fn slow_trace(steps: i64) -> Value {
    let mut ev = Vec::new();
    for step in 0..steps {
        let s = 2_000_000 + step * 9_000;
        ev.push(json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{}", step + 1), "pid": 1, "tid": 1, "ts": s, "dur": 9_000}));
        ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s + 10, "dur": 5, "args": {"correlation": step + 1}}));
        ev.push(json!({"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7, "ts": s + 100, "dur": 3_600, "args": {"stream": 7, "correlation": step + 1}}));
    }
    json!({"distributedInfo": {"rank": 0}, "traceEvents": ev})
}

/// The cells of the table line starting with `name`.
fn cells<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no {name} line in\n{stdout}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn diff_gives_time_categories_and_per_step_means_in_text_json_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, csv) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("csv"),
    );
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    write(&a, "rank0.json", &trace(0));
    write(&b, "rank0.json", &slow_trace(6));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = kinetrace(&["diff", a, b, "-q", "--csv", csv.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // 3 steps against 6: per-step means, and every step 9× slower is "increased" by time while
    // its count is unchanged.
    assert!(
        stdout.contains("compared: per-step means (base 3 steps, new 6 steps)"),
        "{stdout}"
    );
    assert_eq!(
        cells(&stdout, "sm80_gemm"),
        [
            "sm80_gemm",
            "kernel",
            "1",
            "1",
            "0",
            "400 µs",
            "3.60 ms",
            "+3.20 ms",
            "+800.0%",
            "unchanged",
            "increased"
        ],
        "{stdout}"
    );
    assert_eq!(
        cells(&stdout, "ProfilerStep#*")[2..],
        [
            "1",
            "1",
            "0",
            "1.00 ms",
            "9.00 ms",
            "+8.00 ms",
            "+800.0%",
            "unchanged",
            "increased"
        ],
        "{stdout}"
    );
    assert!(
        stdout.contains("names by time (unchanged within ±5% or 1 µs): 0 added, 0 deleted, 2 increased, 0 decreased, 1 unchanged"),
        "{stdout}"
    );
    let names = std::fs::read_to_string(csv.join("diff_names.csv")).unwrap();
    let header: Vec<&str> = names.lines().next().unwrap().split(',').collect();
    let gemm: Vec<&str> = names
        .lines()
        .find(|l| l.starts_with("0,0,sm80_gemm,"))
        .unwrap_or_else(|| panic!("{names}"))
        .split(',')
        .collect();
    let field = |k: &str| gemm[header.iter().position(|h| *h == k).unwrap()];
    assert_eq!(
        [
            "control_counts",
            "test_counts",
            "category",
            "control_duration_per_step",
            "test_duration_per_step",
            "time_change_share",
            "time_category"
        ]
        .map(field),
        ["3", "6", "unchanged", "400", "3600", "8", "increased"]
    );
    let comparisons = std::fs::read_to_string(csv.join("diff_comparisons.csv")).unwrap();
    assert!(
        comparisons
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("0,0,all_steps,per_step_mean,,,3,6,0,0,1000,9000,8000,8,increased,0.05"),
        "{comparisons}"
    );

    // JSON: the same; HTA's first step of each side with --step first.
    let out = kinetrace(&["diff", a, b, "--json", "--step", "first"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["comparisons"][0];
    assert_eq!(
        (
            &c["selection"],
            &c["basis"],
            &c["base_step"],
            &c["new_step"]
        ),
        (&json!("first_step"), &json!("totals"), &json!(1), &json!(1))
    );
    let row = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "ProfilerStep#1")
        .unwrap();
    assert_eq!(
        (&row["category"], &row["time_category"]),
        (&json!("unchanged"), &json!("increased"))
    );

    // Usage errors: exit 2, naming the flag.
    let out = kinetrace(&["diff", a, b, "--step", "last"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("expected `all`, `first` or a ProfilerStep number"),
        "{}",
        text(&out.stderr)
    );
    let out = kinetrace(&["diff", a, b, "--time-threshold", "-3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--time-threshold"));
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
            .ends_with(": 9 slices (0 overlap lanes), 0 instants, 6 counter values (3 [memory] events as allocated/reserved curves), 0 flows\n"),
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
            "kinetrace: {}: at byte 27: unexpected end of data: the JSON is truncated (in traceEvents[0])\n",
            bad.display()
        )
    );
    // The earlier file is untouched by the failed conversion.
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
}

/// Another local user plants symlinks in a shared output directory (mode 0777, not sticky) at a
/// directory component and at the final names a root `kinetrace` writes (`convert`, `analyze
/// --csv`, `--plot`): nothing is written through them, nothing planted is replaced, and each command
/// fails naming what it found.
#[test]
fn symlinks_planted_in_a_shared_output_dir_are_never_written_through() {
    let test = "symlinks_planted_in_a_shared_output_dir_are_never_written_through";
    let Some(other) = kinetrace_test_support::users::other_user(test) else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let shared = other.world_dir();
    let victim = tempfile::tempdir().unwrap();
    let secret = victim.path().join("secret");
    std::fs::write(&secret, "secret").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let input_dir = tempfile::tempdir().unwrap();
    write(input_dir.path(), "t.json", &trace(0));
    let input = input_dir.path().join("t.json");
    let input = input.to_str().unwrap();
    let as_other = |args: &[&str]| {
        let mut c = other.command(args[0]);
        c.args(&args[1..]).current_dir(shared.path());
        let o = common::output(&mut c, common::RUN);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    };
    let at = |p: &str| shared.path().join(p).to_str().unwrap().to_string();
    let (victim_dir, secret_s) = (victim.path().to_str().unwrap(), secret.to_str().unwrap());
    as_other(&["ln", "-s", victim_dir, &at("sub")]);
    as_other(&["ln", "-s", secret_s, &at("out.pftrace")]);
    as_other(&["mkdir", &at("csv")]);
    for name in [
        "idle.csv",
        "kernel_types.csv",
        "kernels.csv",
        "memory.csv",
        "memory_timeline.csv",
        "ops.csv",
        "overlap.csv",
        "steps.csv",
        "temporal.csv",
    ] {
        as_other(&["ln", "-s", secret_s, &at(&format!("csv/{name}"))]);
    }
    as_other(&["ln", "-s", secret_s, &at("csv/plot.svg")]);
    let runs: [&[&str]; 5] = [
        &["convert", input, &at("sub/out.pftrace")],
        &["convert", input, &at("out.pftrace")],
        &["analyze", input, "--csv", &at("csv")],
        &["analyze", input, "--csv", &at("sub")],
        &["analyze", input, "--plot", &at("csv/plot.svg")],
    ];
    for args in runs {
        let o = kinetrace(args);
        let err = text(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{args:?} succeeded: {err}");
        assert!(
            err.contains("symlink") && err.contains(shared.path().to_str().unwrap()),
            "{args:?}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "secret",
            "{args:?}"
        );
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{args:?}");
        let in_victim: Vec<_> = std::fs::read_dir(victim.path()).unwrap().collect();
        assert_eq!(
            in_victim.len(),
            1,
            "{args:?}: written into the victim's directory"
        );
    }
    // The planted links are still links: nothing was replaced either.
    for p in ["out.pftrace", "csv/temporal.csv", "csv/plot.svg", "sub"] {
        let m = std::fs::symlink_metadata(shared.path().join(p)).unwrap();
        assert!(m.file_type().is_symlink(), "{p}");
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// The shared reference traces (`../shared/traces` next to the project root): required.
fn shared_traces() -> std::path::PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    assert!(
        p.is_dir(),
        "the reference traces are missing: expected ../shared/traces next to the project root ({})",
        p.display()
    );
    p
}

/// `convert` reads its input with the trace reader's own input layer: every member of a
/// concatenated gzip (it used to read the first only and call the file "not a Kineto trace"),
/// whatever the file's name, and within `--max-value-size` (an error naming the file and the
/// byte offset).
#[test]
fn convert_reads_every_gzip_member_and_keeps_the_readers_limits() {
    let dir = tempfile::tempdir().unwrap();
    let doc = serde_json::to_vec(&trace(0)).unwrap();
    let mut two = gzip(&doc[..doc.len() / 3]);
    two.extend_from_slice(&gzip(&doc[doc.len() / 3..]));
    // Named .json.gz, and .json (the magic bytes decide).
    for name in ["two.json.gz", "two.json"] {
        let input = dir.path().join(name);
        std::fs::write(&input, &two).unwrap();
        let out = dir.path().join("two.pftrace");
        let o = kinetrace(&["convert", input.to_str().unwrap(), out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).ends_with(
                ": 9 slices (0 overlap lanes), 0 instants, 6 counter values (3 [memory] events as allocated/reserved curves), 0 flows\n"
            ),
            "{name}: {}",
            text(&o.stderr)
        );
    }
    // One event longer than 1 KiB.
    let mut v = trace(0);
    v["traceEvents"][2]["args"]["note"] = json!("n".repeat(2000));
    write(dir.path(), "long.json", &v);
    let long = dir.path().join("long.json");
    // The event's own text, as it is in the file (compact, same key order).
    let event = serde_json::to_string(&v["traceEvents"][2]).unwrap();
    let at = text(&std::fs::read(&long).unwrap()).find(&event).unwrap();
    let o = kinetrace(&["convert", long.to_str().unwrap(), "--max-value-size", "1K"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("{}: at byte ", long.display()))
            && err.contains("longer than the reader's limit of 1 KiB")
            && err.contains("--max-value-size"),
        "{err}"
    );
    assert!(err.contains(&format!("at byte {at}: ")), "{err}");
    let o = kinetrace(&["convert", long.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        dir.path().join("long.pftrace").is_file(),
        "beside the input by default"
    );
}

/// `convert DIR [OUT]` converts each trace of a directory (the torch 2.15 CPU traces, with a
/// broken one among them): a line per file, the broken one reported and in the exit code, the
/// others still converted under the documented names, their `[memory]` events as counters.
#[test]
fn convert_converts_each_trace_of_a_folder_and_reports_the_ones_that_fail() {
    let src = shared_traces().join("torch_2_15_cpu");
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces).unwrap();
    let mut names = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, traces.join(p.file_name().unwrap())).unwrap();
        names.push(p.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    std::fs::write(
        traces.join("a_broken.json"),
        br#"{"traceEvents": [{"ph": "X""#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = kinetrace(&["convert", traces.to_str().unwrap(), out.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 4, "{err}");
    assert!(
        lines[0].starts_with("kinetrace: [1/3] ")
            && lines[0].contains("a_broken.json: at byte 27:"),
        "{err}"
    );
    for (i, name) in names.iter().enumerate() {
        let pf = name.replace(".json.gz", ".pftrace");
        let line = lines[i + 1];
        assert!(
            line.starts_with(&format!(
                "kinetrace: [{}/3] wrote {}",
                i + 2,
                out.join(&pf).display()
            )),
            "{err}"
        );
        assert!(
            line.contains("(55 [memory] events as allocated/reserved curves)"),
            "{err}"
        );
        let bytes = std::fs::read(out.join(&pf)).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("Total Allocated (CPU)") && text.contains("Total Reserved (CPU)"),
            "{pf}: no memory counter tracks"
        );
    }
    assert_eq!(
        lines[3],
        format!(
            "kinetrace: converted 2 of 3 traces in {}; 1 failed (above)",
            traces.display()
        )
    );
    // Without OUT: beside each trace. A file as OUT for a directory is refused.
    let o = kinetrace(&["convert", traces.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    for name in &names {
        assert!(traces.join(name.replace(".json.gz", ".pftrace")).is_file());
    }
    let o = kinetrace(&["convert", traces.to_str().unwrap(), "x.pftrace"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("a directory converts into a directory"),
        "{}",
        text(&o.stderr)
    );
    // Two traces that would share an output: the second is reported, not written over the first.
    let pair = dir.path().join("pair");
    std::fs::create_dir(&pair).unwrap();
    write(&pair, "r.json", &trace(0));
    std::fs::write(
        pair.join("r.json.gz"),
        gzip(&serde_json::to_vec(&trace(1)).unwrap()),
    )
    .unwrap();
    let o = kinetrace(&["convert", pair.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("not converted: its output"),
        "{}",
        text(&o.stderr)
    );
}

/// `analyze`, `doctor` and `diff` take `--max-value-size`: a trace with an event over it is a
/// problem naming the file, the byte offset and the limit (the run goes on with the other files);
/// the default (64M) reads it. Sizes take K, M, G.
#[test]
fn analyze_doctor_and_diff_read_within_max_value_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = trace(1);
    v["traceEvents"][0]["args"] = json!({"note": "n".repeat(3000)});
    write(dir.path(), "long.json", &v);
    write(dir.path(), "ok.json", &trace(0));
    let long = dir.path().join("long.json");
    let ok = dir.path().join("ok.json");
    let (l, k) = (long.to_str().unwrap(), ok.to_str().unwrap());
    for args in [
        vec!["analyze", l, k, "--max-value-size", "2K"],
        vec!["doctor", l, k, "--max-value-size", "2K"],
        vec!["diff", l, k, "--max-value-size", "2K"],
    ] {
        let o = kinetrace(&args);
        let err = text(&o.stderr);
        assert!(
            err.contains(&format!("{l}: at byte ")) && err.contains("limit of 2 KiB"),
            "{args:?}: {err}"
        );
        let o = kinetrace(&args[..3]);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        assert!(
            !text(&o.stderr).contains("limit of"),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
    let o = kinetrace(&["analyze", k, "--max-value-size", "lots"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("like 64M or 1G"),
        "{}",
        text(&o.stderr)
    );
}
