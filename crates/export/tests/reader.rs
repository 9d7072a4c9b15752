//! Integration tests of the Kineto trace reader: every real trace under `<repo>/../shared/traces`
//! (facts checked independently with Python's `json` module), synthetic traces for each timestamp
//! variant and leniency rule, malformed input, HTA's rank discovery, and no-panic property tests.
//!
//! The real traces are required: without them the tests fail, unless
//! `KINETRACE_ALLOW_MISSING_TRACES=1` is set (then they print a skip line and pass).
//!
//! Throughput on the largest trace (ignored by default):
//! `cargo test -p kinetrace-export --release --test reader -- --ignored --nocapture throughput`

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use kinetrace_export::reader::{
    for_each_event, for_each_event_from_reader, for_each_event_pipelined, rank_like_hta,
    rank_like_hta_from_reader, read_trace, read_trace_from_reader, Phase, RawNum, ReadError, RowId,
    Trace, TraceEvent,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Real traces

/// Facts about one reference trace, computed with Python's `json` module
/// (`json.loads(gzip.open(f).read())`), HTA's regex for `hta_rank`, and `decimal.Decimal` for the
/// ns sums (float µs × 1000 rounded half away from zero, plus `baseTimeNanoseconds`).
struct Expected {
    path: &'static str,
    events: usize,
    complete: usize,
    metadata_events: usize,
    instant: usize,
    flow_start: usize,
    flow_end: usize,
    rank: Option<i64>,
    world_size: Option<i64>,
    hta_rank: Option<i64>,
    base_time_ns: Option<i64>,
    float_ts: usize,
    float_dur: usize,
    /// Events whose `args.stream` pandas' `to_numeric` accepts.
    with_stream: usize,
    correlation_sum: i64,
    external_id_sum: i64,
    flow_id_sum: i64,
    /// `len(set(names) | set(cats))`.
    distinct_strings: usize,
    /// Events whose `args` hold a kept key (`Input Dims`, `Collective name`, ...), and the distinct
    /// `json.dumps({k: v for kept k}, separators=(",", ":"), ensure_ascii=False)` among them.
    op_args: (usize, usize),
    string_pids: usize,
    memory_events: usize,
    ts_unix_ns_sum: i128,
    dur_ns_sum: i128,
    metadata_keys: &'static [&'static str],
}

const EXPECTED: &[Expected] = &[
    Expected {
        path: "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        events: 220,
        complete: 113,
        metadata_events: 60,
        instant: 2,
        flow_start: 20,
        flow_end: 25,
        rank: None,
        world_size: None,
        hta_rank: None,
        base_time_ns: Some(1735632360000000000),
        float_ts: 220,
        float_dur: 113,
        with_stream: 16,
        correlation_sum: 4697,
        external_id_sum: 27868,
        flow_id_sum: 4717,
        distinct_strings: 80,
        op_args: (64, 46),
        string_pids: 4,
        memory_events: 0,
        ts_unix_ns_sum: 382763926513102838824,
        dur_ns_sum: 52276266,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "record_shapes",
            "traceName",
            "displayTimeUnit",
            "baseTimeNanoseconds",
        ],
    },
    Expected {
        path: "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        events: 30,
        complete: 16,
        metadata_events: 12,
        instant: 2,
        flow_start: 0,
        flow_end: 0,
        rank: Some(34),
        world_size: Some(300),
        hta_rank: Some(34),
        base_time_ns: Some(1719853884000000000),
        float_ts: 30,
        float_dur: 16,
        with_stream: 0,
        correlation_sum: 0,
        external_id_sum: 46797,
        flow_id_sum: 0,
        distinct_strings: 14,
        op_args: (14, 3),
        string_pids: 4,
        memory_events: 0,
        ts_unix_ns_sum: 51631978797676235338,
        dur_ns_sum: 3635095146,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "distributedInfo",
            "username",
            "INFO",
            "traceName",
            "displayTimeUnit",
            "baseTimeNanoseconds",
        ],
    },
    Expected {
        path: "critical_path_alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
        events: 1408,
        complete: 868,
        metadata_events: 38,
        instant: 2,
        flow_start: 155,
        flow_end: 345,
        rank: Some(0),
        world_size: None,
        hta_rank: Some(0),
        base_time_ns: None,
        float_ts: 0,
        float_dur: 0,
        with_stream: 139,
        correlation_sum: 2064963,
        external_id_sum: 2132491,
        flow_id_sum: 2064963,
        distinct_strings: 102,
        op_args: (0, 0),
        string_pids: 4,
        memory_events: 0,
        ts_unix_ns_sum: 2387736495059830914000,
        dur_ns_sum: 307784449000,
        metadata_keys: &[
            "schemaVersion",
            "distributedInfo",
            "deviceProperties",
            "traceName",
        ],
    },
    Expected {
        path: "nccl_parser_config/nccl_data.json.gz",
        events: 40573,
        complete: 26933,
        metadata_events: 38,
        instant: 2,
        flow_start: 4405,
        flow_end: 9195,
        rank: Some(0),
        world_size: Some(2),
        hta_rank: Some(0),
        base_time_ns: Some(1711964646000000000),
        float_ts: 40573,
        float_dur: 26933,
        with_stream: 3774,
        correlation_sum: 529795300,
        external_id_sum: 198485162,
        flow_id_sum: 530090692,
        distinct_strings: 207,
        op_args: (48, 15),
        string_pids: 4,
        memory_events: 0,
        ts_unix_ns_sum: 69640443474189706811988,
        dur_ns_sum: 4383359174,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "distributedInfo",
            "INFO",
            "traceName",
            "displayTimeUnit",
            "baseTimeNanoseconds",
        ],
    },
    Expected {
        path: "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        events: 68692,
        complete: 45420,
        metadata_events: 36,
        instant: 2,
        flow_start: 7306,
        flow_end: 15928,
        rank: Some(0),
        world_size: Some(1),
        hta_rank: Some(0),
        base_time_ns: None,
        float_ts: 68692,
        float_dur: 45420,
        with_stream: 6095,
        correlation_sum: 3718698167,
        external_id_sum: 566123104,
        flow_id_sum: 3719518097,
        distinct_strings: 210,
        op_args: (45, 8),
        string_pids: 4,
        memory_events: 0,
        ts_unix_ns_sum: 117614132989768022579500,
        dur_ns_sum: 3437226132,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "distributedInfo",
            "trace_id",
            "tw_job",
            "mast_job_environment",
            "tw_user",
            "tw_task_id",
            "tw_cluster",
            "ai_rm_attribution",
            "mast_job_attempt",
            "mast_job_name",
            "mast_job_version",
            "username",
            "logical_server_subtype",
            "mast_task_group",
            "host_name",
            "INFO",
            "traceName",
            "displayTimeUnit",
        ],
    },
    Expected {
        path: "torch_2_15_cpu/worker0.1796038671206015387.pt.trace.json.gz",
        events: 796,
        complete: 703,
        metadata_events: 8,
        instant: 57,
        flow_start: 14,
        flow_end: 14,
        rank: None,
        world_size: None,
        hta_rank: None,
        base_time_ns: Some(1790857026000000000),
        float_ts: 796,
        float_dur: 703,
        with_stream: 0,
        correlation_sum: 0,
        external_id_sum: 25200,
        flow_id_sum: 210,
        distinct_strings: 178,
        op_args: (194, 57),
        string_pids: 4,
        memory_events: 55,
        ts_unix_ns_sum: 1429646782275909586088,
        dur_ns_sum: 28607491,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "trace_id",
            "with_stack",
            "profile_memory",
            "record_shapes",
            "host_name",
            "displayTimeUnit",
            "baseTimeNanoseconds",
            "traceName",
        ],
    },
    Expected {
        path: "torch_2_15_cpu/worker0.1796038671255952836.pt.trace.json.gz",
        events: 796,
        complete: 703,
        metadata_events: 8,
        instant: 57,
        flow_start: 14,
        flow_end: 14,
        rank: None,
        world_size: None,
        hta_rank: None,
        base_time_ns: Some(1790857026000000000),
        float_ts: 796,
        float_dur: 703,
        with_stream: 0,
        correlation_sum: 0,
        external_id_sum: 139888,
        flow_id_sum: 210,
        distinct_strings: 178,
        op_args: (194, 57),
        string_pids: 4,
        memory_events: 55,
        ts_unix_ns_sum: 1429646782316262070920,
        dur_ns_sum: 28350389,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "trace_id",
            "with_stack",
            "profile_memory",
            "record_shapes",
            "host_name",
            "displayTimeUnit",
            "baseTimeNanoseconds",
            "traceName",
        ],
    },
    Expected {
        path: "trace_filter/sampled_rank-0.json.gz",
        events: 4855,
        complete: 4811,
        metadata_events: 44,
        instant: 0,
        flow_start: 0,
        flow_end: 0,
        rank: Some(0),
        world_size: Some(128),
        hta_rank: Some(0),
        base_time_ns: None,
        float_ts: 0,
        float_dur: 4811,
        with_stream: 1204,
        correlation_sum: 16995026930,
        external_id_sum: 17293746865,
        flow_id_sum: 0,
        distinct_strings: 411,
        op_args: (2021, 729),
        string_pids: 2,
        memory_events: 0,
        ts_unix_ns_sum: 8169634237670690098000,
        dur_ns_sum: 7917027000,
        metadata_keys: &["schemaVersion", "record_shapes", "distributedInfo"],
    },
    Expected {
        path: "trace_filter/sampled_rank-1.json.gz",
        events: 4720,
        complete: 4676,
        metadata_events: 44,
        instant: 0,
        flow_start: 0,
        flow_end: 0,
        rank: Some(1),
        world_size: Some(128),
        hta_rank: Some(1),
        base_time_ns: None,
        float_ts: 0,
        float_dur: 4676,
        with_stream: 1154,
        correlation_sum: 16212241422,
        external_id_sum: 16511115078,
        flow_id_sum: 0,
        distinct_strings: 388,
        op_args: (1991, 720),
        string_pids: 2,
        memory_events: 0,
        ts_unix_ns_sum: 7942466241347347903000,
        dur_ns_sum: 8020966000,
        metadata_keys: &["schemaVersion", "record_shapes", "distributedInfo"],
    },
    Expected {
        path: "triton_example/triton_example.json.gz",
        events: 71,
        complete: 8,
        metadata_events: 58,
        instant: 2,
        flow_start: 2,
        flow_end: 1,
        rank: None,
        world_size: None,
        hta_rank: None,
        base_time_ns: Some(1727743122000000000),
        float_ts: 71,
        float_dur: 8,
        with_stream: 2,
        correlation_sum: 109,
        external_id_sum: 17,
        flow_id_sum: 109,
        distinct_strings: 21,
        op_args: (1, 1),
        string_pids: 4,
        memory_events: 0,
        ts_unix_ns_sum: 122841132166753775452,
        dur_ns_sum: 13693360730,
        metadata_keys: &[
            "schemaVersion",
            "deviceProperties",
            "cupti_version",
            "cuda_runtime_version",
            "cuda_driver_version",
            "record_shapes",
            "INFO",
            "traceName",
            "displayTimeUnit",
            "baseTimeNanoseconds",
        ],
    },
];

/// `<repo>/../shared/traces`, or `None` (after a skip line) when it is absent and
/// `KINETRACE_ALLOW_MISSING_TRACES=1`; panics when it is absent otherwise.
fn traces_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("KINETRACE_ALLOW_MISSING_TRACES").as_deref() == Ok("1") {
        // Straight to stderr, which the test harness does not capture.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED real-trace test: {} is absent and KINETRACE_ALLOW_MISSING_TRACES=1",
            dir.display()
        );
        return None;
    }
    panic!(
        "the reference traces are missing: expected the folder {} (<repo>/../shared/traces). \
         Set KINETRACE_ALLOW_MISSING_TRACES=1 to skip the tests that need them.",
        dir.display()
    );
}

/// Every `*.json` and `*.json.gz` under `dir`, sorted.
fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                stack.push(p);
            } else if name.ends_with(".json") || name.ends_with(".json.gz") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn rel(dir: &Path, p: &Path) -> String {
    p.strip_prefix(dir)
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

fn lookup<'a>(e: &'a TraceEvent, t: &'a Trace) -> (&'a str, Option<&'a str>) {
    (t.str(e.name), e.cat.map(|c| t.str(c)))
}

fn check_facts(t: &Trace, x: &Expected) {
    let p = x.path;
    let count = |ph: Phase| t.events.iter().filter(|e| e.ph == ph).count();
    assert_eq!(t.events.len(), x.events, "{p}: events");
    assert_eq!(count(Phase::Complete), x.complete, "{p}: X events");
    assert_eq!(count(Phase::Metadata), x.metadata_events, "{p}: M events");
    assert_eq!(count(Phase::Instant), x.instant, "{p}: i events");
    assert_eq!(count(Phase::FlowStart), x.flow_start, "{p}: s events");
    assert_eq!(count(Phase::FlowEnd), x.flow_end, "{p}: f events");
    assert_eq!(t.rank, x.rank, "{p}: rank");
    assert_eq!(t.world_size, x.world_size, "{p}: world_size");
    assert_eq!(t.base_time_ns, x.base_time_ns, "{p}: baseTimeNanoseconds");
    let float_ts = t.events.iter().filter(|e| e.ts.is_float()).count();
    assert_eq!(float_ts, x.float_ts, "{p}: float ts");
    let float_dur = t
        .events
        .iter()
        .filter(|e| e.dur.is_some_and(RawNum::is_float))
        .count();
    assert_eq!(float_dur, x.float_dur, "{p}: float dur");
    let with_stream = t.events.iter().filter(|e| e.stream.is_some()).count();
    assert_eq!(
        with_stream, x.with_stream,
        "{p}: events with an integer stream"
    );
    let sum = |f: fn(&TraceEvent) -> Option<i64>| t.events.iter().filter_map(f).sum::<i64>();
    assert_eq!(
        sum(|e| e.correlation),
        x.correlation_sum,
        "{p}: correlation sum"
    );
    assert_eq!(
        sum(|e| e.external_id),
        x.external_id_sum,
        "{p}: External id sum"
    );
    assert_eq!(sum(|e| e.flow_id), x.flow_id_sum, "{p}: flow id sum");
    let mut names: Vec<u32> = t
        .events
        .iter()
        .flat_map(|e| [Some(e.name.0), e.cat.map(|c| c.0)])
        .flatten()
        .collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), x.distinct_strings, "{p}: interned names");
    let mut args: Vec<u32> = t
        .events
        .iter()
        .filter_map(|e| e.op_args.map(|a| a.0))
        .collect();
    let with_args = args.len();
    args.sort_unstable();
    args.dedup();
    assert_eq!((with_args, args.len()), x.op_args, "{p}: op args");
    for &a in &args {
        let v: serde_json::Value = serde_json::from_str(&t.strings[a as usize]).unwrap();
        assert!(v.is_object(), "{p}: op args {v}");
    }
    assert_eq!(
        t.strings.len(),
        x.distinct_strings + args.len(),
        "{p}: interned strings are names and op args"
    );
    let string_pids = t
        .events
        .iter()
        .filter(|e| matches!(e.pid, RowId::Str(_)))
        .count();
    assert_eq!(string_pids, x.string_pids, "{p}: string pids");
    let mem = t
        .events
        .iter()
        .filter(|e| e.total_allocated.is_some())
        .count();
    assert_eq!(mem, x.memory_events, "{p}: memory events");
    let ts_sum: i128 = t.events.iter().map(|e| i128::from(t.ts_unix_ns(e))).sum();
    let dur_sum: i128 = t
        .events
        .iter()
        .filter_map(|e| e.dur_ns_opt())
        .map(i128::from)
        .sum();
    assert_eq!(dur_sum, x.dur_ns_sum, "{p}: sum of dur_ns");
    // Exact: the crate enables serde_json's `float_roundtrip`, without which literals with more
    // than 15 significant digits (absolute float µs) come out one ulp (0.25 µs) off.
    assert!(
        serde_json_floats_exact(),
        "serde_json's float_roundtrip feature is off"
    );
    assert_eq!(ts_sum, x.ts_unix_ns_sum, "{p}: sum of ts_unix_ns");
    let keys: Vec<&str> = t.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, x.metadata_keys, "{p}: top-level keys");
    for (k, v) in &t.metadata {
        serde_json::from_str::<serde_json::Value>(v)
            .unwrap_or_else(|e| panic!("{p}: metadata {k} is not JSON ({e}): {v}"));
    }
    // Every id resolves.
    for e in &t.events {
        assert!((e.name.0 as usize) < t.strings.len());
        assert!(e.cat.is_none_or(|c| (c.0 as usize) < t.strings.len()));
    }
}

/// Whether serde_json parses floats correctly rounded (its `float_roundtrip` feature): this
/// literal from `ns_resolution_trace` is one ulp off otherwise.
fn serde_json_floats_exact() -> bool {
    const LITERAL: &str = "1712195495519866.736";
    serde_json::from_str::<f64>(LITERAL).unwrap() == LITERAL.parse::<f64>().unwrap()
}

#[test]
fn every_shared_trace_parses_and_matches_python() {
    let Some(dir) = traces_dir() else { return };
    let files = trace_files(&dir);
    let mut checked = Vec::new();
    for path in &files {
        let name = rel(&dir, path);
        let t = read_trace(path).unwrap_or_else(|e| panic!("{name} must parse: {e}"));
        assert!(!t.events.is_empty(), "{name}: no events");
        assert_eq!(t.path, *path);
        let x = EXPECTED.iter().find(|x| x.path == name);
        if let Some(x) = x {
            check_facts(&t, x);
            assert_eq!(rank_like_hta(path), x.hta_rank, "{name}: HTA rank");
            checked.push(x.path);
        } else {
            eprintln!(
                "note: {name} parsed ({} events) but has no recorded facts",
                t.events.len()
            );
        }
    }
    let missing: Vec<_> = EXPECTED
        .iter()
        .map(|x| x.path)
        .filter(|p| !checked.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "reference traces not found under {}: {missing:?}",
        dir.display()
    );
}

#[test]
fn shared_trace_timestamp_variants() {
    let Some(dir) = traces_dir() else { return };
    // Integer absolute µs ts, float dur ("dur": 68.0), ranks 0 and 1.
    for (file, rank) in [("sampled_rank-0.json.gz", 0), ("sampled_rank-1.json.gz", 1)] {
        let t = read_trace(&dir.join("trace_filter").join(file)).unwrap();
        assert_eq!(t.rank, Some(rank));
        assert_eq!(t.world_size, Some(128));
        assert_eq!(t.base_time_ns, None);
        let first = &t.events[0];
        assert!(matches!(first.ts, RawNum::Int(_)), "{file}: {:?}", first.ts);
        assert!(
            matches!(first.dur, Some(RawNum::Float(_))),
            "{file}: {:?}",
            first.dur
        );
        if rank == 0 {
            // {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MeanBackward0",
            //  "pid": 4037, "tid": 23695, "ts": 1682725898236567, "dur": 68.0, ...}
            assert_eq!(first.ts, RawNum::Int(1_682_725_898_236_567));
            assert_eq!(first.ts_unix_ns(t.base_time_ns), 1_682_725_898_236_567_000);
            assert_eq!(first.dur_ns(), 68_000);
            assert_eq!(
                lookup(first, &t),
                (
                    "autograd::engine::evaluate_function: MeanBackward0",
                    Some("cpu_op")
                )
            );
            assert_eq!(
                (first.pid.clone(), first.tid.clone()),
                (RowId::Int(4037), RowId::Int(23695))
            );
            assert_eq!(first.external_id, Some(41506));
        }
    }
    // Float µs relative to baseTimeNanoseconds.
    let t = read_trace(&dir.join("nccl_parser_config/nccl_data.json.gz")).unwrap();
    assert_eq!(t.base_time_ns, Some(1_711_964_646_000_000_000));
    assert!(t.events.iter().all(|e| e.ts.is_float()));
    // Float µs absolute with an ns fraction, no base.
    let t =
        read_trace(&dir.join("ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
            .unwrap();
    assert_eq!(t.base_time_ns, None);
    assert_eq!(t.events.len(), 68_692);
    assert!(t.events.iter().all(|e| e.ts.is_float()));
    let e = t
        .events
        .iter()
        .find(|e| t.str(e.name) == "LogSoftmaxBackward0")
        .unwrap();
    // Written "ts": 1712195495519837.659; the nearest f64 is ...837.75 (0.25 µs steps).
    assert_eq!(e.ts, RawNum::Float("1712195495519837.659".parse().unwrap()));
    assert_eq!(e.ts_unix_ns(None), 1_712_195_495_519_837_750);
    assert_eq!(e.dur_ns(), 22_147);
    // ROCm: "stream": "0x0" becomes None; integer streams stay.
    let t = read_trace(&dir.join("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")).unwrap();
    let hip = t
        .events
        .iter()
        .find(|e| t.str(e.name) == "hipMemcpyWithStream")
        .unwrap();
    assert_eq!(hip.stream, None);
    assert_eq!(hip.correlation, Some(117));
    assert_eq!(hip.external_id, Some(8));
    assert_eq!(t.rank, None);
    // Memory events and flows (torch 2.15).
    let t = read_trace(&dir.join("torch_2_15_cpu/worker0.1796038671206015387.pt.trace.json.gz"))
        .unwrap();
    let mem = t
        .events
        .iter()
        .find(|e| t.str(e.name) == "[memory]")
        .unwrap();
    assert_eq!(mem.ph, Phase::Instant);
    assert_eq!(mem.dur, None);
    assert!(mem.total_allocated.is_some() && mem.mem_bytes.is_some());
    assert_eq!(mem.mem_device, Some(-1));
    let last = t.events.last().unwrap();
    assert_eq!(t.str(last.name), "Record Window End");
    assert_eq!(
        (last.pid.clone(), last.tid.clone()),
        (RowId::Str("".into()), RowId::Str("".into()))
    );
    assert!(t.metadata_value("trace_id").unwrap().starts_with('"'));
}

#[test]
fn for_each_event_matches_read_trace() {
    let Some(dir) = traces_dir() else { return };
    let path = dir.join("nccl_parser_config/nccl_data.json.gz");
    let full = read_trace(&path).unwrap();
    let mut n = 0;
    let header = for_each_event(&path, |e, strings| {
        assert_eq!(e, full.events[n]);
        assert_eq!(strings[e.name.0 as usize], full.strings[e.name.0 as usize]);
        n += 1;
    })
    .unwrap();
    assert_eq!(n, full.events.len());
    assert!(header.events.is_empty());
    assert_eq!(header.strings, full.strings);
    assert_eq!(header.metadata, full.metadata);
    assert_eq!(header.rank, full.rank);
}

// ---------------------------------------------------------------------------------------------
// Synthetic traces

const SMALL: &str = r#"{
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "GPU \"0\"", "totalGlobalMem": 85e9}],
  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
  "baseTimeNanoseconds": 1790857026000000000,
  "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 11, "ts": 5181645199208.886, "dur": 1823.317, "args": {"External id": 1, "Input Dims": [[2, 3], []], "stream": "0x0"}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 5181645199300, "dur": 2, "args": {"stream": 7, "correlation": 42, "device": 0, "bytes": "4096", "wait_on_stream": 3.0}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 5181645199250.5, "dur": 3.0},
    {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 10, "tid": 11, "ts": 5181645199445.781, "args": {"Total Reserved": 0, "Total Allocated": 16384, "Bytes": 16384, "Device Id": -1, "Addr": 93988384100224}},
    {"ph": "s", "id": 7, "pid": 10, "tid": 11, "ts": 5181645199385.741, "cat": "fwdbwd", "name": "fwdbwd"},
    {"ph": "f", "id": "0x1f", "pid": 10, "tid": 11, "ts": 5181645199385.741, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"},
    {"ph": "M", "name": "process_name", "pid": 10, "tid": 0, "args": {"name": "python"}},
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 5181645198777.601, "dur": 3547.854, "args": {"Op count": 0}, "extra": {"nested": [1, 2.5, {"x": null, "y": true}]}},
    {"ph": "C", "cat": "hardware_counters", "name": "sm_util", "pid": 0, "tid": 7, "ts": "5181645199300.25", "args": {"value": 12}},
    {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 5181645203697.321}
  ],
  "traceName": "/tmp/x.json"
}
"#;

const BASE: i64 = 1_790_857_026_000_000_000;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn parse(bytes: &[u8]) -> Result<Trace, ReadError> {
    read_trace_from_reader(Path::new("mem.json"), Cursor::new(bytes))
}

fn parse_err(bytes: &[u8]) -> ReadError {
    match parse(bytes) {
        Ok(t) => panic!("expected an error, parsed {} events", t.events.len()),
        Err(e) => e,
    }
}

/// Writes `bytes` to `<tempdir>/<name>`.
fn temp_file(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn check_small(t: &Trace) {
    assert_eq!(t.rank, Some(3));
    assert_eq!(t.world_size, Some(8));
    assert_eq!(t.base_time_ns, Some(BASE));
    assert_eq!(t.events.len(), 10);
    let e = &t.events;

    assert_eq!(e[0].ph, Phase::Complete);
    assert_eq!(lookup(&e[0], t), ("aten::mm", Some("cpu_op")));
    assert_eq!(e[0].ts, RawNum::Float(5181645199208.886));
    assert_eq!(
        e[0].ts_unix_ns(t.base_time_ns),
        BASE + 5_181_645_199_208_886
    );
    assert_eq!(e[0].dur_ns(), 1_823_317);
    assert_eq!(
        e[0].end_unix_ns(t.base_time_ns),
        BASE + 5_181_645_199_208_886 + 1_823_317
    );
    assert_eq!(e[0].stream, None, "\"0x0\" is not an integer stream");
    assert_eq!(e[0].external_id, Some(1));

    assert_eq!(e[1].ts, RawNum::Int(5_181_645_199_300));
    assert_eq!(e[1].dur, Some(RawNum::Int(2)));
    assert_eq!(
        e[1].ts_unix_ns(t.base_time_ns),
        BASE + 5_181_645_199_300_000
    );
    assert_eq!(e[1].stream, Some(7));
    assert_eq!(e[1].correlation, Some(42));
    assert_eq!(e[1].device, Some(0));
    assert_eq!(e[1].bytes, Some(4096), "numeric string");
    assert_eq!(e[1].wait_on_stream, Some(3), "integral float");

    // X without args.
    assert_eq!(e[2].dur, Some(RawNum::Float(3.0)));
    assert_eq!(e[2].dur_ns(), 3_000);
    assert_eq!(
        e[2].ts_unix_ns(t.base_time_ns),
        BASE + 5_181_645_199_250_500
    );
    assert_eq!(
        (e[2].stream, e[2].correlation, e[2].external_id),
        (None, None, None)
    );

    // i without dur; memory args.
    assert_eq!(e[3].ph, Phase::Instant);
    assert_eq!(e[3].dur, None);
    assert_eq!(e[3].dur_ns(), 0);
    assert_eq!(e[3].dur_ns_opt(), None);
    assert_eq!(
        (
            e[3].total_reserved,
            e[3].total_allocated,
            e[3].mem_bytes,
            e[3].mem_device
        ),
        (Some(0), Some(16384), Some(16384), Some(-1))
    );

    // Flows; hex string id.
    assert_eq!((e[4].ph, e[4].flow_id), (Phase::FlowStart, Some(7)));
    assert_eq!((e[5].ph, e[5].flow_id), (Phase::FlowEnd, Some(31)));
    assert_eq!(e[4].cat, e[5].cat);
    assert_eq!(
        e[4].name,
        e[4].cat.unwrap(),
        "cat and name share one interned string"
    );

    // M without ts.
    assert_eq!(e[6].ph, Phase::Metadata);
    assert_eq!((e[6].cat, e[6].ts), (None, RawNum::Int(0)));
    assert_eq!(t.str(e[6].name), "process_name");

    // String pid/tid, unknown nested keys.
    assert_eq!(e[7].pid, RowId::Str("Spans".into()));
    assert_eq!(e[7].tid, RowId::Str("PyTorch Profiler".into()));

    // Counter with a string ts.
    assert_eq!(e[8].ph, Phase::Counter);
    assert_eq!(e[8].ts, RawNum::Float(5181645199300.25));

    assert_eq!(e[9].pid, RowId::Str("".into()));
    assert_eq!(e[9].cat, None);

    let keys: Vec<&str> = t.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "schemaVersion",
            "deviceProperties",
            "distributedInfo",
            "baseTimeNanoseconds",
            "traceName"
        ]
    );
    assert_eq!(t.metadata_value("schemaVersion"), Some("1"));
    assert_eq!(
        t.metadata_value("deviceProperties"),
        Some(r#"[{"id":0,"name":"GPU \"0\"","totalGlobalMem":85000000000.0}]"#)
    );
    assert_eq!(
        t.metadata_value("distributedInfo"),
        Some(r#"{"backend":"nccl","rank":3,"world_size":8}"#)
    );
    assert_eq!(t.metadata_value("traceName"), Some(r#""/tmp/x.json""#));
    assert_eq!(t.find_str("gemm"), Some(e[1].name));
    assert_eq!(t.find_str("nope"), None);
}

#[test]
fn small_trace_plain_and_gzip_by_magic_not_name() {
    check_small(&parse(SMALL.as_bytes()).unwrap());
    check_small(&parse(&gzip(SMALL.as_bytes())).unwrap());
    // gzip content named .json, plain content named .gz.
    let (_d1, p1) = temp_file("trace.json", &gzip(SMALL.as_bytes()));
    check_small(&read_trace(&p1).unwrap());
    let (_d2, p2) = temp_file("trace.json.gz", SMALL.as_bytes());
    check_small(&read_trace(&p2).unwrap());
    // Concatenated gzip members, as `cat a.gz b.gz` makes.
    let (a, b) = SMALL.as_bytes().split_at(SMALL.len() / 2);
    let mut two = gzip(a);
    two.extend(gzip(b));
    check_small(&parse(&two).unwrap());
    // A UTF-8 BOM is skipped.
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(SMALL.as_bytes());
    check_small(&parse(&bom).unwrap());
}

#[test]
fn reader_that_returns_one_byte_at_a_time() {
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }
    check_small(&read_trace_from_reader(Path::new("t"), Trickle(SMALL.as_bytes())).unwrap());
    let gz = gzip(SMALL.as_bytes());
    check_small(&read_trace_from_reader(Path::new("t"), Trickle(&gz)).unwrap());
}

#[test]
fn values_bigger_than_the_read_window_and_escapes() {
    // A 600 KB name and a 1 MB top-level array: more than the 256 KiB window.
    let long = "k".repeat(600_000);
    let info: Vec<String> = (0..50_000).map(|i| format!("\"line {i}\"")).collect();
    let text = format!(
        r#"{{"INFO": [{}], "traceEvents": [
            {{"ph": "X", "cat": "kernel", "name": "{long}", "pid": 0, "tid": 7, "ts": 1, "dur": 2}},
            {{"ph": "X", "cat": "cpu_op", "name": "a\"b\\c\u00e9\/", "pid": 1, "tid": 1, "ts": 3, "dur": 4}}
        ]}}"#,
        info.join(", ")
    );
    for bytes in [text.clone().into_bytes(), gzip(text.as_bytes())] {
        let t = parse(&bytes).unwrap();
        assert_eq!(t.events.len(), 2);
        assert_eq!(t.str(t.events[0].name), long);
        assert_eq!(t.str(t.events[1].name), "a\"b\\c\u{e9}/");
        let info_text = t.metadata_value("INFO").unwrap();
        assert!(
            info_text.starts_with(r#"["line 0","line 1","#),
            "{}",
            &info_text[..40]
        );
        assert!(info_text.ends_with(r#""line 49999"]"#));
    }
}

#[test]
fn distributed_info_after_trace_events_and_compact_rank() {
    let text = r#"{"traceEvents":[{"ph":"X","cat":"c","name":"n","pid":1,"tid":1,"ts":1,"dur":1}],"distributedInfo":{"rank":5,"world_size":"6"}}"#;
    let t = parse(text.as_bytes()).unwrap();
    assert_eq!((t.rank, t.world_size), (Some(5), Some(6)));
    assert_eq!(t.events.len(), 1);
    // HTA's regex needs a space after the colon: this compact rank is invisible to it.
    assert_eq!(rank_like_hta_from_reader(text.as_bytes()), None);
    let mut n = 0;
    let header =
        for_each_event_from_reader(Path::new("t"), text.as_bytes(), |_, _| n += 1).unwrap();
    assert_eq!((n, header.rank), (1, Some(5)));
}

#[test]
fn timestamp_conversions() {
    let text = r#"{"baseTimeNanoseconds": 1000000000000000000, "traceEvents":[
        {"ph":"X","name":"a","ts":1682725897226747,"dur":5},
        {"ph":"X","name":"b","ts":1712195495406752.8,"dur":0.0004},
        {"ph":"X","name":"c","ts":4458676983543.183,"dur":1.0005},
        {"ph":"X","name":"d","ts":-1.5,"dur":1e3},
        {"ph":"X","name":"e","ts":0.0,"dur":0}
    ]}"#;
    let t = parse(text.as_bytes()).unwrap();
    let b = t.base_time_ns;
    let e = &t.events;
    assert_eq!(e[0].ts_unix_ns(None), 1_682_725_897_226_747_000);
    assert_eq!(
        e[0].ts_unix_ns(b),
        1_682_725_897_226_747_000 + 1_000_000_000_000_000_000
    );
    assert_eq!(e[1].ts_unix_ns(None), 1_712_195_495_406_752_750); // nearest f64 is ...752.75
    assert_eq!(e[1].dur_ns(), 0);
    assert_eq!(e[2].ts_unix_ns(None), 4_458_676_983_543_183);
    assert_eq!(
        e[2].dur_ns(),
        1_000,
        "the f64 nearest 1.0005 is just below it"
    );
    assert_eq!(e[3].ts_unix_ns(None), -1_500);
    assert_eq!(e[3].dur, Some(RawNum::Float(1000.0)));
    assert_eq!(e[3].dur_ns(), 1_000_000);
    assert_eq!(e[4].ts_unix_ns(b), 1_000_000_000_000_000_000);
    assert_eq!(e[4].dur, Some(RawNum::Int(0)));
}

#[test]
fn numeric_arg_coercion_like_hta() {
    let text = r#"{"traceEvents":[
        {"ph":"X","name":"a","ts":1,"dur":1,"args":{"stream":"7","correlation":" 12 ","External id":3.9,"device":null,"bytes":true,"wait_on_stream":[1]}},
        {"ph":"X","name":"b","ts":1,"dur":1,"args":{"stream":"0x0","correlation":"abc","External id":{"a":1},"device":18446744073709551615,"bytes":-5,"wait_on_stream":"-1"}},
        {"ph":"X","name":"c","ts":1,"dur":1,"args":[1,2]},
        {"ph":"X","name":"d","ts":1,"dur":1,"args":null},
        {"ph":"s","name":"e","ts":1,"id":18446744073709551615}
    ]}"#;
    let t = parse(text.as_bytes()).unwrap();
    let e = &t.events;
    assert_eq!(
        (
            e[0].stream,
            e[0].correlation,
            e[0].external_id,
            e[0].device,
            e[0].bytes,
            e[0].wait_on_stream
        ),
        (Some(7), Some(12), Some(3), None, None, None)
    );
    assert_eq!(
        (
            e[1].stream,
            e[1].correlation,
            e[1].external_id,
            e[1].device,
            e[1].bytes,
            e[1].wait_on_stream
        ),
        (None, None, None, None, Some(-5), Some(-1))
    );
    assert_eq!(e[2].stream, None);
    assert_eq!(e[3].stream, None);
    assert_eq!(e[4].flow_id, Some(-1), "u64 ids wrap");
    // Missing pid/tid read as 0.
    assert_eq!(
        (e[0].pid.clone(), e[0].tid.clone()),
        (RowId::Int(0), RowId::Int(0))
    );
}

// ---------------------------------------------------------------------------------------------
// Malformed input

fn assert_names_file(err: &ReadError, name: &str) {
    let text = err.to_string();
    assert!(text.contains(name), "error does not name {name}: {text}");
}

#[test]
fn truncated_gzip() {
    // Enough events that the compressed stream is well over one block.
    let mut big = String::from("{\"traceEvents\":[");
    for i in 0..20_000 {
        if i > 0 {
            big.push(',');
        }
        big.push_str(&format!(
            r#"{{"ph":"X","cat":"kernel","name":"k{}","pid":0,"tid":7,"ts":{},"dur":1.5,"args":{{"stream":7,"correlation":{i}}}}}"#,
            i % 97,
            1000 + i
        ));
    }
    big.push_str("]}");
    let gz = gzip(big.as_bytes());
    assert_eq!(parse(&gz).unwrap().events.len(), 20_000);
    for cut in [gz.len() / 2, gz.len() - 4, 5] {
        let (_d, path) = temp_file("cut.json.gz", &gz[..cut]);
        let err = read_trace(&path).unwrap_err();
        assert_names_file(&err, "cut.json.gz");
        assert!(err.message.contains("gzip"), "{err}");
        let off = err.offset.expect("an offset");
        assert!(off <= big.len() as u64, "{err}");
    }
    // Only the CRC/length trailer missing: the JSON is complete but the stream is not.
    let (_d, path) = temp_file("trailer.json.gz", &gz[..gz.len() - 1]);
    let err = read_trace(&path).unwrap_err();
    assert!(err.message.contains("gzip"), "{err}");
}

/// `n` kernel events as a trace, with a syntax error after event `bad` when given.
fn many_events(n: usize, bad: Option<usize>) -> String {
    let mut big = String::from("{\"traceEvents\":[");
    for i in 0..n {
        if i > 0 {
            big.push(',');
        }
        big.push_str(&format!(
            r#"{{"ph":"X","cat":"kernel","name":"k{}","pid":0,"tid":7,"ts":{},"dur":1.5,"args":{{"stream":7,"correlation":{i}}}}}"#,
            i % 97,
            1000 + i
        ));
        if bad == Some(i) {
            big.push_str("!oops");
        }
    }
    big.push_str("]}");
    big
}

/// The pipelined reader (inflating on a second thread through a few recycled buffers) gives the
/// same events, strings and errors as the single-threaded one, on streams many buffers long.
#[test]
fn pipelined_gzip_matches_inline() {
    // ~3.4 MB of JSON: 13 of the 256 KiB buffers through the pipe (4 are in flight at most).
    let big = many_events(30_000, None);
    let gz = gzip(big.as_bytes());
    let collect = |pipelined: bool, bytes: &[u8]| {
        let mut names = Vec::new();
        let mut on = |e: TraceEvent, strings: &[Box<str>]| {
            names.push((strings[e.name.0 as usize].to_string(), e.ts, e.correlation));
        };
        let t = if pipelined {
            for_each_event_pipelined(Path::new("p.json.gz"), Cursor::new(bytes), &mut on)
        } else {
            for_each_event_from_reader(Path::new("p.json.gz"), Cursor::new(bytes), &mut on)
        };
        (t.map(|t| t.strings), names)
    };
    let (inline_strings, inline) = collect(false, &gz);
    let (piped_strings, piped) = collect(true, &gz);
    assert_eq!(inline.len(), 30_000);
    assert_eq!(piped, inline);
    assert_eq!(piped_strings.unwrap(), inline_strings.unwrap());
    // Plain JSON goes through the same entry point on one thread.
    assert_eq!(collect(true, big.as_bytes()).1, inline);

    // The parser stops early (a syntax error 1 MB in) while the inflating thread is still
    // mid-stream: it must notice and stop, and the error must be the inline one.
    let bad = gzip(many_events(30_000, Some(9_000)).as_bytes());
    let started = std::time::Instant::now();
    let (piped_err, _) = collect(true, &bad);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let (inline_err, _) = collect(false, &bad);
    let (p, i) = (piped_err.unwrap_err(), inline_err.unwrap_err());
    assert_eq!((p.offset, &p.message), (i.offset, &i.message));
    assert!(p.offset.unwrap() > 2 * 256 * 1024, "{p}");

    // A stream cut short: the decoder's error crosses the thread and reads as inline.
    let cut = &gz[..gz.len() / 2];
    let (p, i) = (
        collect(true, cut).0.unwrap_err(),
        collect(false, cut).0.unwrap_err(),
    );
    assert_eq!((p.offset, &p.message), (i.offset, &i.message));
    assert!(p.message.contains("gzip"), "{p}");
}

/// The pipe's buffers become the parser's window with the unparsed rest moved into their head;
/// a rest longer than the head (values of 100 KB and 700 KB, crossing several buffers, some
/// with `},{` and `]` in them), a byte-order mark and errors after long values read exactly as
/// on one thread, with the same offsets.
#[test]
fn pipelined_long_values_and_errors_match_inline() {
    let long_event = |i: usize, len: usize| {
        let filler = "x},{\\\"]".repeat(len / 7);
        format!(
            r#"{{"ph":"X","cat":"cpu_op","name":"long{i}","pid":1,"tid":1,"ts":{i},"dur":1,"args":{{"note":"{filler}","n":[{{"a":"]"}}]}}}}"#
        )
    };
    let mut events = Vec::new();
    for i in 0..6_000 {
        events.push(match i {
            1_000 => long_event(i, 100_000),
            2_500 => long_event(i, 700_000),
            2_501 => long_event(i, 70_000),
            _ => format!(
                r#"{{"ph":"X","cat":"kernel","name":"k{}","pid":0,"tid":7,"ts":{i},"dur":2,"args":{{"stream":7,"correlation":{i}}}}}"#,
                i % 97
            ),
        });
    }
    let body = format!(r#"{{"traceEvents":[{}]}}"#, events.join(","));
    let collect = |pipelined: bool, bytes: &[u8]| {
        let mut seen = Vec::new();
        let mut on = |e: TraceEvent, strings: &[Box<str>]| {
            seen.push((strings[e.name.0 as usize].to_string(), e.ts, e.correlation));
        };
        let t = if pipelined {
            for_each_event_pipelined(Path::new("p.json.gz"), Cursor::new(bytes), &mut on)
        } else {
            for_each_event_from_reader(Path::new("p.json.gz"), Cursor::new(bytes), &mut on)
        };
        (
            t.map(|t| t.strings).map_err(|e| (e.offset, e.message)),
            seen,
        )
    };
    let with_bom = [b"\xEF\xBB\xBF".as_slice(), body.as_bytes()].concat();
    for text in [body.as_bytes(), &with_bom] {
        let gz = gzip(text);
        let (inline_strings, inline) = collect(false, &gz);
        let (piped_strings, piped) = collect(true, &gz);
        assert_eq!(inline.len(), 6_000);
        assert_eq!(piped, inline);
        assert_eq!(piped_strings.unwrap(), inline_strings.unwrap());
    }
    // Errors right after the long values, inside the longest, and at the very end: a `!` in
    // place of a `{` or `[` that starts a value.
    let after = |needle: &str, then: &str| {
        let from = body.find(needle).unwrap();
        from + body[from..].find(then).unwrap()
    };
    let cuts = [
        after("long1000", r#"{"ph""#),
        after("long2500", r#""n":["#) + 5,
        after("long2501", r#"{"ph""#),
        body.len() - 1,
    ];
    for cut in cuts {
        let mut bad = body.clone().into_bytes();
        bad[cut] = b'!';
        let gz = gzip(&bad);
        let (inline, _) = collect(false, &gz);
        let (piped, _) = collect(true, &gz);
        let inline = inline.unwrap_err();
        assert_eq!(piped.unwrap_err(), inline, "cut at {cut}");
        assert!(
            inline.0.unwrap() >= cut as u64 - 2,
            "{inline:?} for a cut at {cut}"
        );
    }
}

/// A reader that hands out `chunk` bytes at a time, so the read window's edge falls everywhere.
struct Chunks<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Events the fast path takes and ones it leaves to serde_json (escapes in names, strings as
/// numbers, arrays where a number goes), with `},{`, `]`, escapes and nested objects inside
/// strings and args: wherever a read ends, every event reads the same, and as an independent
/// `serde_json::Value` parse of the same text says.
#[test]
fn events_read_the_same_wherever_the_window_ends() {
    let shapes = [
        r#"{"ph":"X","cat":"kernel","name":"k},{[@]","pid":0,"tid":7,"ts":1000.125,"dur":1.5,"args":{"stream":7,"correlation":@,"grid":[1,{"x":"]}"}],"note":"a\"},{\"b"}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 2000, "dur": 3, "args": {"External id": @, "Input Dims": [[2, 3], [3, 4]], "Call stack": "f.py(1): g\n\u00e9"}}"#,
        r#"{"ph":"X","cat":"kernel","name":"esc\"aped @","pid":0,"tid":7,"ts":3000,"dur":1,"args":{"stream":"0x0","correlation":"@"}}"#,
        r#"{"ph":"i","cat":"cpu_instant_event","name":"[memory]","pid":1,"tid":1,"ts":4000.5,"args":{"Total Allocated":@,"Total Reserved":4096,"Device Id":0,"Bytes":[1]}}"#,
        r#"{"ph":"f","id":@,"pid":"Spans","tid":"","ts":5000,"cat":"ac2g","name":"ac2g","bp":"e"}"#,
    ];
    let mut text = String::from("{\"schemaVersion\": 1, \"traceEvents\": [\n");
    let n = 4_000;
    for i in 0..n {
        if i > 0 {
            text.push_str(",\n");
        }
        text.push_str(&shapes[i % shapes.len()].replace('@', &i.to_string()));
    }
    text.push_str("\n]}\n");
    assert!(text.len() > 2 * 256 * 1024, "{}", text.len());

    // The reference: each event as a serde_json::Value.
    let whole: serde_json::Value = serde_json::from_str(&text).unwrap();
    let reference = whole["traceEvents"].as_array().unwrap();
    let read = |r: &mut dyn Read| {
        let mut events = Vec::new();
        let t = for_each_event_from_reader(Path::new("w.json"), r, |e, strings| {
            events.push((format!("{e:?}"), strings[e.name.0 as usize].to_string()));
        })
        .unwrap();
        (events, t.strings)
    };
    let (events, strings) = read(&mut Cursor::new(text.as_bytes()));
    assert_eq!(events.len(), n);
    for (i, ((_, name), want)) in events.iter().zip(reference).enumerate() {
        assert_eq!(name, want["name"].as_str().unwrap(), "event {i}");
    }
    let t = parse(text.as_bytes()).unwrap();
    for (i, (e, want)) in t.events.iter().zip(reference).enumerate() {
        let args = &want["args"];
        let int = |v: &serde_json::Value| v.as_i64().or_else(|| v.as_str()?.parse().ok());
        assert_eq!(e.correlation, int(&args["correlation"]), "event {i}");
        assert_eq!(e.external_id, int(&args["External id"]), "event {i}");
        assert_eq!(
            e.total_allocated,
            int(&args["Total Allocated"]),
            "event {i}"
        );
        assert_eq!(e.mem_bytes, None, "event {i}");
        assert_eq!(e.flow_id, want["id"].as_i64(), "event {i}");
        assert_eq!(e.stream, args["stream"].as_i64(), "event {i}");
        assert_eq!(e.ts.as_f64(), want["ts"].as_f64().unwrap(), "event {i}");
    }
    for chunk in [1, 7, 4093, 100_000] {
        let (e, s) = read(&mut Chunks {
            data: text.as_bytes(),
            chunk,
        });
        assert!(e == events, "chunks of {chunk}");
        assert_eq!(s, strings, "chunks of {chunk}");
    }
    let gz = gzip(text.as_bytes());
    let (e, s) = read(&mut Chunks {
        data: &gz,
        chunk: 5,
    });
    assert!(e == events && s == strings);

    // A syntax error inside an event the fast path would take is reported at its byte.
    let at = text.find(r#""dur": 3,"#).unwrap();
    let mut bad = text.clone().into_bytes();
    bad[at + 7] = b'}';
    for chunk in [1, 4093] {
        let err = read_trace_from_reader(Path::new("bad.json"), Chunks { data: &bad, chunk })
            .unwrap_err();
        assert_eq!(err.offset, Some(at as u64 + 7), "{err}");
        assert!(err.to_string().starts_with("bad.json: at byte "), "{err}");
        assert!(err.message.contains("traceEvents[1]"), "{err}");
    }
}

#[test]
fn truncated_json_reports_offset_at_the_cut() {
    for cut in [1, 10, SMALL.len() / 3, SMALL.len() / 2, SMALL.len() - 3] {
        let (_d, path) = temp_file("trunc.json", &SMALL.as_bytes()[..cut]);
        let err = read_trace(&path).unwrap_err();
        assert_names_file(&err, "trunc.json");
        assert_eq!(err.offset, Some(cut as u64), "{err}");
        assert!(err.message.contains("truncated"), "{err}");
    }
    // The same through gzip: the offset is in the decompressed stream.
    let cut = SMALL.len() / 2;
    let err = parse_err(&gzip(&SMALL.as_bytes()[..cut]));
    assert_eq!(err.offset, Some(cut as u64), "{err}");
}

#[test]
fn syntax_error_offset_is_the_offending_byte() {
    let text = r#"{"traceEvents": [{"ph": "X",, "name": "a"}]}"#;
    let at = text.find(",,").unwrap() + 1;
    let err = parse_err(text.as_bytes());
    assert_eq!(err.offset, Some(at as u64), "{err}");
    assert!(err.message.contains("invalid JSON"), "{err}");
    assert!(err.message.contains("traceEvents[0]"), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("mem.json: at byte {at}: ")),
        "{err}"
    );
}

#[test]
fn not_a_trace() {
    let cases: &[(&str, &[u8], &str)] = &[
        ("array.json", b"[{\"ph\": \"X\"}]", "traceEvents"),
        ("number.json", b"42", "traceEvents"),
        ("no_events.json", b"{\"schemaVersion\": 1}", "no `traceEvents`"),
        ("events_object.json", b"{\"traceEvents\": {}}", "array of trace events"),
        ("event_number.json", b"{\"traceEvents\": [1]}", "trace event object"),
        ("dup.json", b"{\"traceEvents\": [], \"traceEvents\": []}", "duplicate"),
        ("garbage.json", b"\x00\x9f\x92\x96garbage\xff", "invalid JSON"),
        ("text.json", b"hello world", "invalid JSON"),
        ("trailing.json", b"{\"traceEvents\": []} x", "trailing"),
        ("empty.json", b"", "empty"),
        ("blank.json", b"  \n ", "empty"),
        ("emptygz.json.gz", &[], "empty"),
        ("bad_base.json", b"{\"baseTimeNanoseconds\": \"soon\", \"traceEvents\": []}", "baseTimeNanoseconds"),
        ("no_ph.json", b"{\"traceEvents\": [{\"name\": \"a\", \"ts\": 1}]}", "no `ph`"),
        ("no_name.json", b"{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 1}]}", "no `name`"),
        ("no_ts.json", b"{\"traceEvents\": [{\"ph\": \"M\", \"name\": \"a\"}, {\"ph\": \"i\", \"name\": \"b\"}]}", "no `ts`"),
        ("bad_ts.json", b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\", \"ts\": \"x\"}]}", "`ts` is not a number"),
        ("bool_ts.json", b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\", \"ts\": true}]}", "`ts`"),
        ("ph_number.json", b"{\"traceEvents\": [{\"ph\": 1, \"name\": \"a\", \"ts\": 1}]}", "ph"),
        ("bad_utf8.json", b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"\xff\", \"ts\": 1}]}", "invalid JSON"),
        ("nan.json", b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\", \"ts\": NaN}]}", "invalid JSON"),
    ];
    for (name, bytes, needle) in cases {
        let (_d, path) = temp_file(name, bytes);
        let err = read_trace(&path).unwrap_err();
        assert_names_file(&err, name);
        assert!(err.to_string().contains(needle), "{name}: {err}");
        assert!(err.offset.is_some(), "{name}: {err}");
    }
    // The index of the offending event is named.
    let (_d, path) = temp_file("no_ts.json", cases[15].1);
    let err = read_trace(&path).unwrap_err();
    assert!(err.message.contains("traceEvents[1]"), "{err}");
    // A missing file.
    let err = read_trace(Path::new("/nonexistent/dir/x.json")).unwrap_err();
    assert_names_file(&err, "/nonexistent/dir/x.json");
    assert!(err.message.contains("cannot open"), "{err}");
    assert_eq!(err.offset, None);
    assert_eq!(rank_like_hta(Path::new("/nonexistent/dir/x.json")), None);
}

#[test]
fn gzip_of_garbage_and_corrupt_gzip() {
    let err = parse_err(&gzip(b"\x00\x01garbage"));
    assert!(err.message.contains("invalid JSON"), "{err}");
    let mut gz = gzip(SMALL.as_bytes());
    let n = gz.len();
    gz[n / 2] ^= 0x55;
    gz[n / 2 + 1] ^= 0xaa;
    let err = parse_err(&gz);
    assert!(err.offset.is_some(), "{err}");
    // Only the magic.
    let err = parse_err(b"\x1f\x8b");
    assert!(err.message.contains("gzip"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// HTA rank discovery

#[test]
fn rank_like_hta_regex_semantics() {
    let r = |s: &str| rank_like_hta_from_reader(s.as_bytes());
    assert_eq!(
        r(r#"{"distributedInfo": {"backend": "nccl", "rank": 7, "world_size": 8}}"#),
        Some(7)
    );
    assert_eq!(r(r#"{"distributedInfo":{"rank":7}}"#), None);
    assert_eq!(r("{\"rank\":\t12}"), Some(12));
    assert_eq!(r(r#"{"rank": -1}"#), None);
    assert_eq!(
        r("{\n\"rank\":1,\n\"x\": {\"rank\": 4}\n, \"rank\": 5}"),
        Some(4),
        "first match wins"
    );
    assert_eq!(
        r("{\"rank\":\n 4}"),
        None,
        "the digits must be on the same line"
    );
    assert_eq!(r("{\"Rank\": 4, \"ranks\": 5}"), None);
    assert_eq!(r(""), None);
    // Plain text is read in universal-newline mode, gzip as bytes split at \n only.
    assert_eq!(r("{\"rank\":\r 4}"), None);
    assert_eq!(
        rank_like_hta_from_reader(&gzip(b"{\"rank\":\r 4}")[..]),
        Some(4)
    );
    assert_eq!(
        rank_like_hta_from_reader(&gzip(SMALL.as_bytes())[..]),
        Some(3)
    );
    // On files.
    let (_d, p) = temp_file(
        "r.json.gz",
        &gzip(b"{\"distributedInfo\": {\"rank\": 11}, \"traceEvents\": []}"),
    );
    assert_eq!(rank_like_hta(&p), Some(11));
}

// ---------------------------------------------------------------------------------------------
// No panics on arbitrary input

fn check_no_panic(bytes: &[u8]) {
    match read_trace_from_reader(Path::new("fuzz.json"), bytes) {
        Ok(t) => {
            for e in &t.events {
                assert!((e.name.0 as usize) < t.strings.len());
                let _ = (e.ts_unix_ns(t.base_time_ns), e.dur_ns());
            }
        }
        Err(e) => {
            assert!(e.to_string().contains("fuzz.json"));
            assert!(!e.message.is_empty());
        }
    }
    let _ = rank_like_hta_from_reader(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_no_panic(&bytes);
        check_no_panic(&gzip(&bytes));
    }

    #[test]
    fn mutated_small_trace_never_panics(
        cut in 0..=SMALL.len(),
        edits in proptest::collection::vec((0..SMALL.len(), any::<u8>()), 0..6),
        compress in any::<bool>(),
    ) {
        let mut bytes = SMALL.as_bytes().to_vec();
        for (at, b) in edits {
            bytes[at] = b;
        }
        bytes.truncate(cut);
        if compress {
            bytes = gzip(&bytes);
        }
        check_no_panic(&bytes);
    }

    #[test]
    fn mutated_gzip_never_panics(
        cut in 0..400usize,
        edits in proptest::collection::vec((0..400usize, any::<u8>()), 0..4),
    ) {
        let mut gz = gzip(SMALL.as_bytes());
        let n = gz.len();
        for (at, b) in edits {
            gz[at % n] = b;
        }
        gz.truncate(cut.min(n));
        check_no_panic(&gz);
    }
}

// ---------------------------------------------------------------------------------------------
// Throughput
