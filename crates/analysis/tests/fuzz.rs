//! Property tests: arbitrary bytes, damaged traces and random well-formed traces go through the
//! reader and every analysis without a panic (a panic would show as an "internal error" problem,
//! since the loader catches them per file), and the temporal breakdown always adds up.

use kinetrace_analysis::{
    analyze_sources, doctor_sources, DoctorOptions, DoctorReport, Options, Report, TraceSource,
};
use proptest::prelude::*;
use serde_json::{json, Value};

fn analyze_bytes(bytes: Vec<u8>) -> Report {
    let src = TraceSource::Memory {
        name: "fuzz.json".into(),
        bytes,
    };
    analyze_sources(
        &[src],
        Vec::new(),
        &Options {
            jobs: 1,
            ..Options::default()
        },
        &|_| {},
    )
}

fn doctor_bytes(bytes: Vec<u8>) -> DoctorReport {
    let src = TraceSource::Memory {
        name: "fuzz.json".into(),
        bytes,
    };
    doctor_sources(
        &[src],
        Vec::new(),
        &DoctorOptions {
            jobs: 1,
            ..DoctorOptions::default()
        },
        &|_| {},
    )
}

fn assert_no_internal_error(r: &Report) {
    for p in &r.problems {
        assert!(
            !p.message.contains("internal error"),
            "panic inside the analysis: {p}"
        );
        assert_eq!(p.file.to_str(), Some("fuzz.json"));
    }
    assert_eq!(r.ranks.len() + r.problems.len(), 1, "one outcome per file");
}

const NAMES: [&str; 13] = [
    "ProfilerStep#1",
    "cudaStreamSynchronize",
    "aten::to",
    "Optimizer.step#SGD.step",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "ProfilerStep#2",
    "ProfilerStep#3",
    "sm80_gemm",
    "ncclKernel_AllReduce",
    "Memcpy HtoD (Pinned -> Device)",
    "Event Sync",
    "cudaLaunchKernel",
    "aten::mm",
];
const CATS: [&str; 7] = [
    "kernel",
    "gpu_memcpy",
    "cuda_runtime",
    "cpu_op",
    "user_annotation",
    "cuda_sync",
    "Trace",
];

fn num() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0i64..5000).prop_map(|v| json!(v)),
        (0.0f64..5000.0).prop_map(|v| json!(v)),
        (-3i64..3).prop_map(|v| json!(v)),
    ]
}

fn event() -> impl Strategy<Value = Value> {
    (
        0..NAMES.len(),
        0..CATS.len(),
        num(),
        prop::option::of(num()),
        prop::option::of(-2i64..4),
        prop::option::of(-2i64..12),
        prop::option::of(-1i64..12),
        prop::bool::ANY,
    )
        .prop_map(|(n, c, ts, dur, stream, corr, ext, instant)| {
            let mut args = serde_json::Map::new();
            if let Some(s) = stream {
                args.insert("stream".into(), json!(s));
            }
            if let Some(c) = corr {
                args.insert("correlation".into(), json!(c));
            }
            if let Some(e) = ext {
                args.insert("External id".into(), json!(e));
            }
            if instant {
                json!({"ph": "i", "s": "t", "name": "[memory]", "cat": "cpu_instant_event", "pid": 1, "tid": 1, "ts": ts,
                       "args": {"Total Allocated": corr.unwrap_or(0) * 100, "Total Reserved": 4096, "Device Id": stream.unwrap_or(0)}})
            } else {
                let mut e = json!({"ph": "X", "name": NAMES[n], "cat": CATS[c], "pid": 1, "tid": stream.unwrap_or(1), "ts": ts, "args": args});
                if let Some(d) = dur {
                    e["dur"] = d;
                }
                e
            }
        })
}

fn valid_trace() -> Vec<u8> {
    let mut ev = Vec::new();
    for step in 0..3i64 {
        let s = 1000 * step;
        ev.push(json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{step}"), "pid": 1, "tid": 1, "ts": s, "dur": 1000}));
        ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s + 10, "dur": 5, "args": {"correlation": step}}));
        ev.push(json!({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": s as f64 + 100.5, "dur": 200.25, "args": {"stream": 7, "correlation": step}}));
    }
    serde_json::to_vec(&json!({"distributedInfo": {"rank": 3}, "traceEvents": ev})).unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let d = doctor_bytes(bytes.clone());
        prop_assert_eq!(d.ranks.len() + d.problems.len(), 1);
        assert_no_internal_error(&analyze_bytes(bytes));
    }

    #[test]
    fn damaged_traces_never_panic(
        gz in any::<bool>(),
        cut in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
    ) {
        let mut bytes = valid_trace();
        if gz {
            bytes = gzip(&bytes);
        }
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep.max(bytes.len() * 3 / 4));
        assert_no_internal_error(&analyze_bytes(bytes));
    }

    #[test]
    fn random_traces_hold_invariants(events in prop::collection::vec(event(), 0..60), rank in 0i64..4) {
        // Without float timestamps or negative durations, HTA's own assertions hold:
        // 0 <= idle, compute <= kernel time, non-compute >= 0; overlap within 0..=100 %; a
        // stream's idle shares sum to 1.
        let clean = events.iter().all(|e| {
            e["ts"].is_i64() && e.get("dur").is_none_or(|d| d.as_i64().is_some_and(|d| d >= 0))
        });
        let trace = json!({"distributedInfo": {"rank": rank}, "traceEvents": events});
        let bytes = serde_json::to_vec(&trace).unwrap();
        // The doctor on the same trace: no panic, one outcome, sane costs.
        let d = doctor_bytes(bytes.clone());
        for p in &d.problems {
            prop_assert!(!p.message.contains("internal error"), "panic inside the doctor: {}", p);
        }
        prop_assert_eq!(d.ranks.len() + d.problems.len(), 1);
        for f in &d.findings {
            if let Some(c) = f.cost_per_step_us {
                prop_assert!(c.0.is_finite() && c.0 >= 0.0, "{:?}", f);
            }
            prop_assert!(f.examples.len() <= 3);
        }
        let r = analyze_bytes(bytes);
        assert_no_internal_error(&r);
        prop_assert_eq!(r.ranks.len(), 1);
        prop_assert_eq!(r.ranks[0].rank, rank);
        if clean {
            for t in &r.temporal_breakdown {
                prop_assert!(t.idle_time_us.0 >= 0.0, "{:?}", t);
                prop_assert!(t.compute_time_us.0 <= t.kernel_time_us.0, "{:?}", t);
                prop_assert!(t.non_compute_time_us.0 >= 0.0, "{:?}", t);
            }
            for o in &r.comm_comp_overlap {
                if let Some(p) = o.comp_comm_overlap_pctg.get() {
                    prop_assert!((0.0..=100.0).contains(&p), "{:?}", o);
                }
            }
            let mut shares: std::collections::HashMap<(i64, i64), f64> = Default::default();
            for i in &r.idle_time_breakdown {
                if let Some(v) = i.idle_time_ratio.get() {
                    *shares.entry((i.rank, i.stream)).or_default() += v;
                }
            }
            for (k, v) in shares {
                prop_assert!((v - 1.0).abs() < 1e-9, "{:?} {}", k, v);
            }
        }
        for i in &r.idle_time_breakdown {
            prop_assert!(i.interval_stats.count == 0 || i.interval_stats.min <= i.interval_stats.max);
        }
    }
}
