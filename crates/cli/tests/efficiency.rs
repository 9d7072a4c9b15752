//! `kinetrace analyze --only efficiency,collectives` and `doctor --peak-*` as processes, on the real
//! traces in `../shared/traces`: tables, JSON, CSV and bad flags.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn kinetrace(args: &[&str]) -> Output {
    common::output(
        Command::new(env!("CARGO_BIN_EXE_kinetrace")).args(args),
        common::RUN,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn traces(dir: &str) -> String {
    let p: PathBuf = [env!("CARGO_MANIFEST_DIR"), "../../../shared/traces", dir]
        .iter()
        .collect();
    assert!(
        p.is_dir(),
        "the reference traces are missing: expected {}",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

#[test]
fn efficiency_tables_json_and_csv() {
    let amd = traces("amd_trace");
    let out = kinetrace(&["analyze", "--only", "efficiency", &amd]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for want in [
        "GPU time by category",
        "memcpy       38.2 µs",
        "aten::addmm",
        "M=5 N=128 K=128",
        "device: AMD Radeon Graphics → AMD MI250 (one GCD)",
        "modelled ops hold",
    ] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("GPU time per rank"), "{stdout}");

    let out = kinetrace(&["analyze", "--json", "--only", "efficiency", &amd]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("temporal_breakdown").is_none() && v.get("collectives").is_none());
    let addmm = v["efficiency"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == "aten::addmm")
        .unwrap();
    assert_eq!(addmm["flops"], 164_480.0);
    assert_eq!(addmm["bound"], "memory");

    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().to_str().unwrap();
    let out = kinetrace(&[
        "analyze",
        "--only",
        "efficiency,collectives",
        "--csv",
        csv,
        &amd,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ops = std::fs::read_to_string(dir.path().join("efficiency_ops.csv")).unwrap();
    assert!(ops.starts_with("op,shapes,dtypes,params,category"), "{ops}");
    assert!(
        ops.lines()
            .any(|l| l.starts_with("aten::addmm,") && l.contains(",164480,71168,")),
        "{ops}"
    );
    let cats = std::fs::read_to_string(dir.path().join("efficiency_categories.csv")).unwrap();
    assert!(cats.contains("memcpy,38.161,"), "{cats}");
    for f in [
        "efficiency_devices.csv",
        "efficiency_unmodelled.csv",
        "collectives.csv",
        "collective_waits.csv",
    ] {
        assert!(dir.path().join(f).is_file(), "{f}");
    }
}

#[test]
fn collectives_across_ranks_and_peak_flags() {
    let tf = traces("trace_filter");
    let out = kinetrace(&["analyze", "--only", "collectives", &tf]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("rank 1 arrives last in 7 of its 10 matched collectives"),
        "{stdout}"
    );
    // Peaks for a trace without deviceProperties.
    let out = kinetrace(&[
        "analyze",
        "--only",
        "efficiency",
        "--peak-tflops",
        "19.5",
        "--peak-bandwidth",
        "1.555",
        &tf,
    ]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("peaks from the command line: 19.5 TFLOP/s for every op, 1.55 TB/s"),
        "{stdout}"
    );
    assert!(!stdout.contains("no deviceProperties"), "{stdout}");
    for bad in ["--peak-tflops=0", "--peak-bandwidth=-2", "--peak-tflops=x"] {
        let out = kinetrace(&["analyze", bad, &tf]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = text(&out.stderr);
        assert!(err.contains("--peak-"), "{bad}: {err}");
        let out = kinetrace(&["doctor", bad, &tf]);
        assert_eq!(out.status.code(), Some(2), "doctor {bad}");
    }
}
