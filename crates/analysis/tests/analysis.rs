//! The analyses on constructed traces whose HTA numbers are worked out by hand (and were checked
//! against HTA 0.5.0 itself), on bad input, and on the real traces in `../shared/traces`.

use std::io::Write;
use std::path::{Path, PathBuf};

use kinetrace_analysis::hta::IdleCategory;
use kinetrace_analysis::{analyze, analyze_sources, discover, Options, Report, TraceSource};
use serde_json::{json, Value};

fn x(cat: &str, name: &str, pid: i64, tid: i64, ts: Value, dur: Value, args: Value) -> Value {
    json!({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
}

/// One rank of the constructed workload: three steps of 1000 µs; per step (offset S) a gemm on
/// stream 7 [S+100, S+300), an NCCL kernel on stream 13 [S+200, S+400) and a memcpy on stream 7
/// [S+310, S+330), launched at S+10 (inside `aten::mm` [S+5, S+17)), S+20 and S+30.
fn constructed_rank(rank: i64) -> Value {
    let mut ev = vec![
        json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "python"}}),
    ];
    for step in 0..3i64 {
        let s = 1_000_000 + step * 1000;
        let c = 100 + step * 10;
        ev.push(x(
            "user_annotation",
            &format!("ProfilerStep#{}", step + 1),
            1,
            1,
            json!(s),
            json!(1000),
            json!({"External id": c}),
        ));
        ev.push(x(
            "cpu_op",
            "aten::mm",
            1,
            1,
            json!(s + 5),
            json!(12),
            json!({"External id": c + 1}),
        ));
        ev.push(x(
            "cuda_runtime",
            "cudaLaunchKernel",
            1,
            1,
            json!(s + 10),
            json!(5),
            json!({"External id": c + 1, "correlation": c + 1}),
        ));
        ev.push(x(
            "cuda_runtime",
            "cudaLaunchKernel",
            1,
            1,
            json!(s + 20),
            json!(5),
            json!({"correlation": c + 2}),
        ));
        ev.push(x(
            "cuda_runtime",
            "cudaMemcpyAsync",
            1,
            1,
            json!(s + 30),
            json!(5),
            json!({"correlation": c + 3}),
        ));
        ev.push(x(
            "kernel",
            "sm80_gemm",
            0,
            7,
            json!(s + 100),
            json!(200),
            json!({"External id": c + 1, "stream": 7, "correlation": c + 1}),
        ));
        ev.push(x(
            "kernel",
            "ncclKernel_AllReduce_RING_LL_Sum_float",
            0,
            13,
            json!(s + 200),
            json!(200),
            json!({"stream": 13, "correlation": c + 2}),
        ));
        ev.push(x(
            "gpu_memcpy",
            "Memcpy HtoD (Pinned -> Device)",
            0,
            7,
            json!(s + 310),
            json!(20),
            json!({"stream": 7, "correlation": c + 3}),
        ));
        ev.push(json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": s + 40,
            "args": {"Total Reserved": 4096, "Total Allocated": 1000 * (step + 1), "Bytes": 1000, "Device Id": 0, "Device Type": 1}}));
    }
    json!({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": ev})
}

fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    p
}

fn run(dir: &Path) -> Report {
    let (files, problems) = discover(&[dir.to_owned()]);
    analyze(&files, problems, &Options::default(), &|_| {})
}

#[test]
fn constructed_two_ranks_give_the_worked_out_numbers() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rank0.json", &constructed_rank(0));
    write(dir.path(), "rank1.json", &constructed_rank(1));
    let r = run(dir.path());
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.step_filter_applied);
    assert_eq!(r.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);

    // Steps 1 and 2 count (HTA drops the last): kernel span 100 -> 1400.
    for t in &r.temporal_breakdown {
        assert_eq!(t.kernel_time_us.0, 1300.0);
        assert_eq!(t.idle_time_us.0, 700.0);
        assert_eq!(t.compute_time_us.0, 400.0);
        assert_eq!(t.non_compute_time_us.0, 200.0);
        assert!((t.idle_time_pctg.0 - 100.0 * 700.0 / 1300.0).abs() < 1e-9);
    }
    for o in &r.comm_comp_overlap {
        assert_eq!(o.comp_comm_overlap_pctg.get(), Some(50.0));
    }
    let types: Vec<(&str, i64)> = r
        .kernel_type_breakdown
        .iter()
        .map(|k| (k.kernel_type.as_str(), k.sum_us))
        .collect();
    assert_eq!(
        types,
        [
            ("COMPUTATION", 400),
            ("COMPUTATION overlapping COMMUNICATION", 400),
            ("COMMUNICATION", 320),
            ("COMMUNICATION overlapping MEMORY", 80),
        ]
    );

    let idle = |rank, stream, cat| {
        r.idle_time_breakdown
            .iter()
            .find(|i| (i.rank, i.stream, i.idle_category) == (rank, stream, cat))
            .unwrap_or_else(|| panic!("no idle row {rank} {stream} {cat:?}"))
    };
    for rank in [0, 1] {
        let host = idle(rank, 7, IdleCategory::HostWait);
        assert_eq!((host.idle_time_us.0, host.interval_stats.count), (770.0, 1));
        let kw = idle(rank, 7, IdleCategory::KernelWait);
        assert_eq!((kw.idle_time_us.0, kw.interval_stats.count), (20.0, 2));
        assert!((kw.idle_time_ratio.0 - 20.0 / 790.0).abs() < 1e-12);
        let other = idle(rank, 7, IdleCategory::Other);
        assert_eq!((other.idle_time_us.0, other.interval_stats.count), (0.0, 0));
        assert_eq!(idle(rank, 13, IdleCategory::HostWait).idle_time_us.0, 800.0);
    }
    let gemm = r
        .kernel_breakdown
        .iter()
        .find(|k| k.name == "sm80_gemm" && k.rank == 1)
        .unwrap();
    assert_eq!(
        (gemm.sum_us.0, gemm.count, gemm.mean_us.0, gemm.stddev),
        (400.0, 2, 200.0, 0.0)
    );
    assert_eq!(r.kernel_breakdown.len(), 6);

    // Op table: the gemm launched inside aten::mm (all three steps: the op table keeps them all).
    let mm = r.ops.iter().find(|o| o.name == "aten::mm").unwrap();
    assert_eq!(
        (mm.count, mm.cpu_total_us.0, mm.cpu_self_us.0),
        (6, 72.0, 42.0)
    );
    assert_eq!((mm.gpu_self_us.0, mm.gpu_total_us.0), (1200.0, 1200.0));
    let step1 = r.ops.iter().find(|o| o.name == "ProfilerStep#1").unwrap();
    assert_eq!(step1.gpu_total_us.0, 2.0 * (200 + 200 + 20) as f64);

    // Steps: all three, with their GPU time; two ranks with equal work.
    assert_eq!(r.steps.len(), 6);
    let s = &r.steps[0];
    assert_eq!(
        (
            s.step,
            s.step_time_us.0,
            s.gpu_busy_us.0,
            s.compute_us.0,
            s.comm_us.0
        ),
        (1, 1000.0, 300.0, 200.0, 200.0)
    );
    // Two identical ranks: no straggler is named (it once was, from equal numbers).
    assert!(r.straggler.is_none());
    assert!(
        matches!(
            r.no_straggler,
            Some(kinetrace_analysis::steps::StragglerVerdict::Even { .. })
        ),
        "{:?}",
        r.no_straggler
    );

    // Memory: device 0 grows by 1000 bytes a step.
    let m = r.memory.iter().find(|m| m.rank == 0).unwrap();
    assert_eq!(
        (m.peak_allocated_bytes, m.peak_step, m.samples),
        (3000, Some(3), 3)
    );
    assert_eq!(m.later_minus_first_bytes, Some(2000));
}

#[test]
fn float_timestamps_are_rounded_like_hta() {
    // ceil(ts), floor(ts + dur): (11, 15), (21, 20) — a -1 µs row — and (31, 32).
    let ev = vec![
        x(
            "kernel",
            "k1",
            0,
            7,
            json!(10.2),
            json!(5.0),
            json!({"stream": 7, "correlation": 1}),
        ),
        x(
            "kernel",
            "k2",
            0,
            7,
            json!(20.9),
            json!(0.05),
            json!({"stream": 7, "correlation": 2}),
        ),
        x(
            "kernel",
            "k3",
            0,
            7,
            json!(30.5),
            json!(2.0),
            json!({"stream": 7, "correlation": 3}),
        ),
    ];
    let trace = json!({"traceEvents": ev, "distributedInfo": {"rank": 0}, "baseTimeNanoseconds": 1_700_000_000_000_000_000i64});
    let src = TraceSource::Memory {
        name: "float.json".into(),
        bytes: serde_json::to_vec(&trace).unwrap(),
    };
    let r = analyze_sources(&[src], Vec::new(), &Options::default(), &|_| {});
    assert!(r.ranks[0].rounded_timestamps);
    let t = &r.temporal_breakdown[0];
    // Merged: [11,15] [21,20] [31,32]: span 21, busy 4 - 1 + 1 = 4.
    assert_eq!(
        (
            t.kernel_time_us.0,
            t.idle_time_us.0,
            t.compute_time_us.0,
            t.non_compute_time_us.0
        ),
        (21.0, 17.0, 4.0, 0.0)
    );
    let kw = r
        .idle_time_breakdown
        .iter()
        .find(|i| i.idle_category == IdleCategory::KernelWait)
        .unwrap();
    assert_eq!((kw.idle_time_us.0, kw.interval_stats.count), (17.0, 2));
    // The kernel-type sweep over those groups runs 11→15 and 31→32 (the inverted group takes the
    // running count to -1 and back), so 5 µs, as HTA reports, not the 4 of the merge.
    assert_eq!(r.kernel_type_breakdown[0].sum_us, 5);
    let k2 = r.kernel_breakdown.iter().find(|k| k.name == "k2").unwrap();
    assert_eq!(k2.sum_us.0, -1.0);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("fewer than two ProfilerStep")),
        "{:?}",
        r.notes
    );
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn bad_files_are_reported_one_by_one_and_the_rest_analysed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "a_good.json", &constructed_rank(0));
    let full = gzip(&serde_json::to_vec(&constructed_rank(1)).unwrap());
    std::fs::write(d.join("b_truncated.json.gz"), &full[..full.len() / 2]).unwrap();
    std::fs::write(
        d.join("c_invalid.json"),
        b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": oops}]}",
    )
    .unwrap();
    std::fs::write(d.join("d_not_a_trace.json"), b"{\"hello\": \"world\"}").unwrap();
    std::fs::write(
        d.join("e_missing_fields.json"),
        b"{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 1}]}",
    )
    .unwrap();
    write(d, "f_duplicate.json", &constructed_rank(0));
    std::fs::write(d.join("g_empty.json"), b"").unwrap();
    std::fs::write(d.join("notes.txt"), b"not a trace and not picked up").unwrap();

    let r = run(d);
    assert_eq!(r.ranks.len(), 1);
    assert_eq!(r.ranks[0].file.file_name().unwrap(), "a_good.json");
    assert_eq!(r.temporal_breakdown.len(), 1);
    let names: Vec<String> = r
        .problems
        .iter()
        .map(|p| p.file.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "b_truncated.json.gz",
            "c_invalid.json",
            "d_not_a_trace.json",
            "e_missing_fields.json",
            "f_duplicate.json",
            "g_empty.json"
        ]
    );
    let msg = |i: usize| r.problems[i].to_string();
    assert!(
        msg(0).contains("gzip") || msg(0).contains("truncated"),
        "{}",
        msg(0)
    );
    assert!(r.problems[0].offset.is_some());
    assert_eq!(r.problems[1].offset, Some(37), "{}", msg(1)); // the `o` of `oops`
    assert!(msg(2).contains("traceEvents"), "{}", msg(2));
    assert!(
        msg(3).contains("name") && msg(3).contains("traceEvents[0]"),
        "{}",
        msg(3)
    );
    assert!(
        msg(4).contains("duplicate rank 0") && msg(4).contains("a_good.json"),
        "{}",
        msg(4)
    );
    assert!(msg(5).contains("empty"), "{}", msg(5));
    for p in &r.problems {
        assert!(p.to_string().starts_with(&p.file.display().to_string()));
    }
}

#[test]
fn empty_directory_and_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    let (files, problems) = discover(&[dir.path().to_owned(), dir.path().join("nope")]);
    assert!(files.is_empty());
    assert_eq!(problems.len(), 2);
    assert!(
        problems[0].message.contains("no trace files"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].message.contains("cannot read"),
        "{}",
        problems[1]
    );
    let r = analyze(&files, problems, &Options::default(), &|_| {});
    assert!(!r.analysed_any());
    assert_eq!(r.problems.len(), 2);
}

#[test]
fn cpu_only_trace_says_what_is_missing() {
    let ev = vec![x(
        "cpu_op",
        "aten::add",
        1,
        1,
        json!(5),
        json!(3),
        json!({}),
    )];
    let src = TraceSource::Memory {
        name: "cpu.json".into(),
        bytes: serde_json::to_vec(&json!({"traceEvents": ev})).unwrap(),
    };
    let r = analyze_sources(&[src], Vec::new(), &Options::default(), &|_| {});
    assert!(r.analysed_any());
    assert!(r.temporal_breakdown.is_empty() && r.idle_time_breakdown.is_empty());
    assert!(
        r.notes.iter().any(|n| n.contains("no GPU rows")),
        "{:?}",
        r.notes
    );
    assert!(
        r.notes.iter().any(|n| n.contains("taken as rank 0")),
        "{:?}",
        r.notes
    );
    assert_eq!(r.ops.len(), 1);
}

#[test]
fn parallel_and_serial_agree() {
    let dir = tempfile::tempdir().unwrap();
    for rank in 0..6 {
        write(
            dir.path(),
            &format!("r{rank}.json"),
            &constructed_rank(rank),
        );
    }
    let (files, _) = discover(&[dir.path().to_owned()]);
    let serial = Options {
        jobs: 1,
        ..Options::default()
    };
    let parallel = Options {
        jobs: 4,
        ..Options::default()
    };
    let a = serde_json::to_value(analyze(&files, Vec::new(), &serial, &|_| {})).unwrap();
    let b = serde_json::to_value(analyze(&files, Vec::new(), &parallel, &|_| {})).unwrap();
    assert_eq!(a, b);
    assert_eq!(a["ranks"].as_array().unwrap().len(), 6);
}

// ---------------------------------------------------------------------------------------------
// Real traces: the numbers HTA 0.5.0 gives on them (tests/compat/test_analyze_vs_hta.py checks all
// of them against HTA itself; these pin a few so `cargo test` alone catches a regression).

fn shared_traces() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    assert!(
        p.is_dir(),
        "the reference traces are missing: expected ../shared/traces next to the project root ({})",
        p.display()
    );
    p
}

#[test]
fn real_traces_match_hta() {
    let base = shared_traces();
    let r = run(&base.join("trace_filter"));
    let t: Vec<(i64, f64, f64, f64, f64)> = r
        .temporal_breakdown
        .iter()
        .map(|t| {
            (
                t.rank,
                t.idle_time_us.0,
                t.compute_time_us.0,
                t.non_compute_time_us.0,
                t.kernel_time_us.0,
            )
        })
        .collect();
    assert_eq!(
        t,
        [
            (0, 321378.0, 106252.0, 172428.0, 600058.0),
            (1, 328671.0, 135548.0, 136455.0, 600674.0)
        ]
    );
    let o: Vec<f64> = r
        .comm_comp_overlap
        .iter()
        .map(|o| (o.comp_comm_overlap_pctg.0 * 100.0).round() / 100.0)
        .collect();
    assert_eq!(o, [11.81, 20.05]);
    let kt: Vec<(&str, i64)> = r
        .kernel_type_breakdown
        .iter()
        .map(|k| (k.kernel_type.as_str(), k.sum_us))
        .collect();
    assert_eq!(
        &kt[..3],
        &[
            ("COMMUNICATION", 305584),
            ("COMPUTATION", 185023),
            ("COMPUTATION overlapping COMMUNICATION", 56747)
        ]
    );

    // Float µs relative to baseTimeNanoseconds (HTA rounds them).
    let r = run(&base.join("nccl_parser_config"));
    assert!(r.ranks[0].rounded_timestamps);
    let t = &r.temporal_breakdown[0];
    assert_eq!(
        (
            t.idle_time_us.0,
            t.compute_time_us.0,
            t.non_compute_time_us.0,
            t.kernel_time_us.0
        ),
        (338781.0, 75169.0, 21636.0, 435586.0)
    );
    let host7 = r
        .idle_time_breakdown
        .iter()
        .find(|i| i.stream == 7 && i.idle_category == IdleCategory::HostWait)
        .unwrap();
    assert_eq!(
        (host7.idle_time_us.0, host7.interval_stats.count),
        (357247.0, 1742)
    );

    // ROCm: string streams on runtime rows, no rank.
    let r = run(&base.join("amd_trace"));
    let t = &r.temporal_breakdown[0];
    assert_eq!(
        (
            t.idle_time_us.0,
            t.compute_time_us.0,
            t.non_compute_time_us.0,
            t.kernel_time_us.0
        ),
        (8780.0, 96.0, 35.0, 8911.0)
    );

    // CPU only: HTA raises; we say so.
    let r = run(&base.join("cpu_only"));
    assert_eq!(r.ranks[0].rank, 34);
    assert!(r.temporal_breakdown.is_empty());
    assert!(r.notes.iter().any(|n| n.contains("no GPU rows")));
}

// ---------------------------------------------------------------------------------------------
// `doctor` on every real trace: which rules fire, on which ranks, with what evidence counts.

/// Per directory: (rank, steps) of each file, then per finding: rule, ranks, and the
/// (rank, what, count) of its evidence. Times are left out on purpose (they are checked on
/// constructed traces, where they are worked out by hand).
type Pin = (&'static str, Vec<(i64, usize)>, Vec<PinnedFinding<'static>>);

/// Rule, ranks, and (rank, what, count) of each evidence line.
type PinnedFinding<'a> = (&'a str, Vec<i64>, Vec<(i64, &'a str, u64)>);

fn doctor_pins() -> Vec<Pin> {
    vec![
        (
            "amd_trace",
            vec![(0, 2)],
            vec![
                ("sync-in-step", vec![0], vec![(0, "aten::to → hipMemcpyWithStream", 2)]),
                ("warmup-in-window", vec![0], vec![]),
            ],
        ),
        // The step is 210 ms with nothing recorded on the process's own threads; gloo's all_reduce
        // annotations (other threads) cover 18–197 ms of it, which is waiting, not a stall: the
        // two ends are left.
        (
            "cpu_only",
            vec![(34, 1)],
            vec![(
                "host-stall",
                vec![34],
                vec![(34, "(nothing recorded)", 2)],
            )],
        ),
        (
            "critical_path_alexnet",
            vec![(0, 0)],
            vec![(
                "sync-in-step",
                vec![0],
                vec![
                    (
                        0,
                        "[param|pytorch.model.alex_net|0|0|0|warmup|forward] → cudaDeviceSynchronize",
                        2,
                    ),
                    (
                        0,
                        "[param|pytorch.model.alex_net|0|0|0|measure|forward] → cudaDeviceSynchronize",
                        2,
                    ),
                    (0, "aten::to → cudaStreamSynchronize", 16),
                    (0, "(no enclosing op) → cudaDeviceSynchronize", 1),
                ],
            )],
        ),
        (
            "nccl_parser_config",
            vec![(0, 3)],
            vec![(
                "sync-in-step",
                vec![0],
                vec![(0, "DistributedDataParallel.forward → cudaEventSynchronize", 24)],
            )],
        ),
        ("ns_resolution_trace", vec![(0, 5)], vec![]),
        ("torch_2_15_cpu", vec![(0, 2), (0, 2)], vec![]),
        (
            "trace_filter",
            vec![(0, 2), (1, 2)],
            vec![
                (
                    "host-stall",
                    vec![0, 1],
                    vec![
                        (0, "## backward ##", 32),
                        (0, "(nothing recorded)", 9),
                        (0, "Optimizer.step#Shampoo.step", 2),
                        (0, "## sdd_preprocess_splits ##", 2),
                        (0, "## optimizer ##", 2),
                        (0, "## recmetrics_update ##", 2),
                        (0, "Optimizer.step#EMAOptimizer.step", 1),
                        (1, "## backward ##", 35),
                        (1, "(nothing recorded)", 8),
                        (1, "Optimizer.step#Shampoo.step", 3),
                        (1, "## sdd_preprocess_splits ##", 2),
                        (1, "## optimizer ##", 2),
                    ],
                ),
                (
                    "exposed-communication",
                    vec![0, 1],
                    vec![
                        (
                            0,
                            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                            10,
                        ),
                        (
                            1,
                            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                            10,
                        ),
                        // The collectives matched across the two ranks (efficiency.rs pins
                        // the waits).
                        (
                            0,
                            "waiting in collectives for rank 1 (this rank arrived last in 3 of 10)",
                            10,
                        ),
                        (
                            1,
                            "waiting in collectives for rank 0 (this rank arrived last in 7 of 10)",
                            10,
                        ),
                    ],
                ),
                (
                    "straggler-rank",
                    vec![1],
                    vec![
                        (
                            0,
                            "waiting in collectives for rank 1 (this rank arrived last in 3 of 10)",
                            10,
                        ),
                        (
                            1,
                            "waiting in collectives for rank 0 (this rank arrived last in 7 of 10)",
                            10,
                        ),
                    ],
                ),
            ],
        ),
        (
            "triton_example",
            vec![(0, 1)],
            vec![
                (
                    "compiled-regions",
                    vec![0],
                    vec![(0, "triton_poi_fused_add_cos_sin_0", 1)],
                ),
                ("warmup-in-window", vec![0], vec![]),
            ],
        ),
    ]
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

#[test]
fn doctor_findings_on_every_real_trace() {
    use kinetrace_analysis::{doctor, DoctorOptions};
    let base = shared_traces();
    let mut dirs: Vec<String> = std::fs::read_dir(&base)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let pins = doctor_pins();
    let pinned: Vec<&str> = pins.iter().map(|p| p.0).collect();
    assert_eq!(
        dirs, pinned,
        "every trace directory has its doctor findings pinned here"
    );
    for (dir, ranks, findings) in pins {
        let (files, problems) = discover(&[base.join(dir)]);
        let r = doctor(&files, problems, &DoctorOptions::default(), &|_| {});
        assert!(r.problems.is_empty(), "{dir}: {:?}", r.problems);
        let got_ranks: Vec<(i64, usize)> = r.ranks.iter().map(|x| (x.rank, x.steps)).collect();
        assert_eq!(got_ranks, ranks, "{dir}");
        // Evidence order follows times; compare it as a set so that only counts are pinned.
        let got: Vec<PinnedFinding<'_>> = r
            .findings
            .iter()
            .map(|f| {
                (
                    f.rule,
                    f.ranks.clone(),
                    sorted(
                        f.evidence
                            .iter()
                            .map(|e| (e.rank, e.what.as_str(), e.count))
                            .collect(),
                    ),
                )
            })
            .collect();
        let want: Vec<PinnedFinding<'_>> = findings
            .into_iter()
            .map(|(rule, ranks, ev)| (rule, ranks, sorted(ev)))
            .collect();
        assert_eq!(got, want, "{dir}");
        for f in &r.findings {
            assert!(f.examples.len() <= 3, "{dir}: {}", f.rule);
            if let Some(c) = f.cost_per_step_us {
                assert!(c.0 > 0.0, "{dir}: {} has a cost of {}", f.rule, c.0);
            }
        }
    }
}

#[test]
fn doctor_reads_kinetraces_own_drop_counts() {
    use kinetrace_analysis::{doctor, DoctorOptions};
    // The golden trace kinetrace's writer produces, with `"dropped_events": {"cpu_ring": 0, "cupti": 2}`.
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/small_session.json");
    let r = doctor(&[golden], Vec::new(), &DoctorOptions::default(), &|_| {});
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let f = r
        .findings
        .iter()
        .find(|f| f.rule == "trace-drops")
        .expect("trace-drops");
    let ev: Vec<(&str, u64)> = f
        .evidence
        .iter()
        .map(|e| (e.what.as_str(), e.count))
        .collect();
    assert_eq!(ev, [("kinetrace dropped_events.cupti", 2)]);
    assert_eq!(
        f.summary,
        "records were lost while capturing: kinetrace dropped 2 cupti records"
    );
}

// ---------------------------------------------------------------------------------------------
// A folder is ranks × cycles: what every command reads in it.

/// One trace of a rank-less process `pid` on host `vm`, with steps `first..first+2` from `t0` µs.
fn cycle_trace(pid: i64, t0: i64, first: i64) -> Value {
    let mut ev = Vec::new();
    for k in 0..2 {
        let s = t0 + k * 1000;
        ev.push(x(
            "user_annotation",
            &format!("ProfilerStep#{}", first + k),
            pid,
            pid,
            json!(s),
            json!(1000),
            json!({}),
        ));
        ev.push(x(
            "cpu_op",
            "aten::mm",
            pid,
            pid,
            json!(s + 10),
            json!(500),
            json!({}),
        ));
    }
    json!({"schemaVersion": 1, "host_name": "vm", "traceEvents": ev})
}

#[test]
fn the_cycles_of_one_process_are_one_rank_in_every_command() {
    use kinetrace_analysis::{diff, doctor, DiffOptions, DoctorOptions};
    // torch.profiler's tensorboard_trace_handler: two cycles of one worker, no rank.
    let dir = shared_traces().join("torch_2_15_cpu");
    let r = run(&dir);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let placed: Vec<(i64, u32, u32)> = r
        .ranks
        .iter()
        .map(|x| (x.rank, x.cycle, x.cycles))
        .collect();
    assert_eq!(placed, [(0, 0, 2), (0, 1, 2)]);
    let steps: Vec<(u32, i64)> = r.steps.iter().map(|s| (s.cycle, s.step)).collect();
    assert_eq!(steps, [(0, 3), (0, 4), (1, 7), (1, 8)]);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("2 traces of one process")),
        "{:?}",
        r.notes
    );
    // The ops of both cycles: two steps each, so `my_user_scope` four times.
    let scope = r.ops.iter().find(|o| o.name == "my_user_scope").unwrap();
    assert_eq!(scope.count, 4);

    let (files, problems) = discover(std::slice::from_ref(&dir));
    let d = doctor(&files, problems, &DoctorOptions::default(), &|_| {});
    assert!(d.problems.is_empty(), "{:?}", d.problems);
    let mut read: Vec<(i64, u32, u32)> = d
        .ranks
        .iter()
        .map(|x| (x.rank, x.cycle, x.cycles))
        .collect();
    read.sort();
    assert_eq!(read, [(0, 0, 2), (0, 1, 2)]);

    let (files, problems) = discover(&[dir]);
    let c = diff(&files, &files, problems, &DiffOptions::default(), &|_| {});
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!(c.comparisons.len(), 1);
    let c = &c.comparisons[0];
    assert_eq!((c.base_traces, c.new_traces, c.base_steps), (2, 2, 4));
    assert!(kinetrace_analysis::diff::scope(c).contains("merged: 2 base cycles, 2 new cycles"));
}

#[test]
fn another_process_or_a_copy_claiming_a_rank_is_a_duplicate_in_every_command() {
    use kinetrace_analysis::{diff, doctor, DiffOptions, DoctorOptions};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Cycles of pid 7 given out of time order, another process (pid 8) and a copy of a cycle.
    write(d, "a_later.json", &cycle_trace(7, 5_000_000, 10));
    write(d, "b_earlier.json", &cycle_trace(7, 1_000_000, 2));
    write(d, "c_other_process.json", &cycle_trace(8, 9_000_000, 0));
    write(d, "d_copy.json", &cycle_trace(7, 5_000_000, 10));
    let r = run(d);
    let placed: Vec<(String, u32)> = r
        .ranks
        .iter()
        .map(|x| {
            (
                x.file.file_name().unwrap().to_string_lossy().into_owned(),
                x.cycle,
            )
        })
        .collect();
    assert_eq!(
        placed,
        [("b_earlier.json".into(), 0), ("a_later.json".into(), 1)]
    );
    let problems: Vec<String> = r.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("c_other_process.json: duplicate rank 0")
            && problems[0].contains("another process (pid 8 on vm; that one by pid 7 on vm)")
            && problems[0].contains("no rank in either file"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].contains("d_copy.json: duplicate rank 0")
            && problems[1]
                .contains("a_later.json already has it (the same process over the same time"),
        "{}",
        problems[1]
    );

    // doctor and diff skip the same files.
    let (files, problems) = discover(&[d.to_owned()]);
    let doc = doctor(&files, problems, &DoctorOptions::default(), &|_| {});
    let skipped = |p: &[kinetrace_analysis::FileProblem]| -> Vec<String> {
        p.iter()
            .map(|p| p.file.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        skipped(&doc.problems),
        ["c_other_process.json", "d_copy.json"]
    );
    assert_eq!(doc.ranks.len(), 2);
    let (files, problems) = discover(&[d.to_owned()]);
    let c = diff(&files, &files, problems, &DiffOptions::default(), &|_| {});
    assert_eq!(
        skipped(&c.problems),
        [
            "c_other_process.json",
            "c_other_process.json",
            "d_copy.json",
            "d_copy.json"
        ]
    );
    assert_eq!(c.comparisons[0].base_steps, 4);
}
