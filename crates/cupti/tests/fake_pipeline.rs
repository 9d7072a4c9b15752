//! The real pipeline (kinetrace facade → session → Kineto writer) with the CUPTI source pointed at
//! the fake libcupti, in every record layout, and under every injected fault. Each test runs in its
//! own child process (CUPTI, the fake and the session are process-wide).

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use common::*;
use kinetrace_core::ActivitySet;
use kinetrace_cupti::{CuptiConfig, CuptiSource};
use serde_json::Value;

const N: usize = 150;
const STREAMS: [u32; 2] = [7, 13];

fn config(lib: &Path) -> CuptiConfig {
    CuptiConfig {
        library: Some(lib.to_path_buf()),
        driver: Some(lib.to_path_buf()),
        // Small buffers: the scenario rolls over many times.
        buffer_size: 4096,
        late_buffer_wait: Duration::from_millis(500),
        ..CuptiConfig::default()
    }
}

struct Expected {
    kernels: usize,
    memcpy: usize,
    memset: usize,
    sync: usize,
    runtime: usize,
    driver: usize,
    memory: usize,
    overhead: usize,
}

/// Correlation ids the scenario's sync checks need.
struct SyncIds {
    /// The `cudaEventRecord` of event 7 (on stream 13).
    event_record: u32,
    /// The Stream Wait Event on stream 7 waiting for it.
    stream_wait: u32,
    /// The Event Sync on it.
    event_sync: u32,
    /// A Stream Sync in context 2 (device 1, known only from CONTEXT records).
    other_device: u32,
}

/// N kernels on each of 2 streams, a copy of each kind, sets, syncs, allocs, a graph, a driver
/// launch and blocklisted noise; the first half inside span "outer", the rest inside "inner" nested
/// in it; an event recorded on one stream and awaited on the other; a sync in a second context;
/// a memory pool's life. Returns the span-relevant and the sync-relevant correlation ids.
fn scenario(fake: &Fake) -> (Vec<u32>, Vec<u32>, SyncIds) {
    let mut outer_ids = Vec::new();
    let mut inner_ids = Vec::new();
    let _outer = annotation("outer");
    for i in 0..N {
        for s in STREAMS {
            let c = fake.kernel(&format!("gemm_{}", i % 3), s);
            if i < N / 2 {
                outer_ids.push(c);
            }
        }
    }
    {
        let _inner = annotation("inner");
        for i in N / 2..N {
            let _ = i;
        }
        // Copies of each kind: HtoD pageable→device, DtoH device→pinned, DtoD, HtoH, PtoP.
        inner_ids.push(fake.memcpy(1, 1, 3, 1 << 20, 7));
        inner_ids.push(fake.memcpy(2, 3, 2, 1 << 20, 13));
        inner_ids.push(fake.memcpy(8, 3, 3, 4096, 7));
        inner_ids.push(fake.memcpy(9, 2, 1, 512, 13));
        inner_ids.push(fake.memcpy(10, 3, 3, 8192, 7));
        inner_ids.push(fake.memset(4096, 7));
        inner_ids.push(fake.memset(8192, 13));
        inner_ids.push(fake.graph(42, 3, 13));
        inner_ids.push(fake.driver_kernel("driver_kernel", 7));
    }
    let event_record = fake.event_record(7, 13);
    let event_sync = fake.sync(1, 7);
    let stream_wait = fake.sync(2, 7);
    fake.sync(3, 7);
    fake.sync(4, 0);
    let other_device = fake.sync_on(3, 21, u32::MAX, 2);
    fake.mempool(1, 0x7000_0000, 2 << 20);
    fake.mempool(3, 0x7000_0000, 1 << 20);
    fake.mempool(2, 0x7000_0000, 0);
    fake.malloc(0x1000, 1 << 20);
    fake.malloc(0x200000, 4096);
    fake.free(0x1000, 1 << 20);
    fake.free(0x200000, 4096);
    for _ in 0..3 {
        fake.runtime_call(17); // cudaGetDevice: Kineto's noise, dropped.
    }
    (
        outer_ids,
        inner_ids,
        SyncIds {
            event_record,
            stream_wait,
            event_sync,
            other_device,
        },
    )
}

fn expected() -> Expected {
    Expected {
        kernels: 2 * N + 3 + 1,
        memcpy: 5,
        memset: 2,
        sync: 5,
        // launches, copies, sets, graph, event record, syncs, allocs/frees, pool calls
        runtime: 2 * N + 5 + 2 + 1 + 1 + 5 + 4 + 3,
        driver: 1,
        memory: 4,
        // One lazy-function-loading overhead per distinct kernel: gemm_0..2, graph_kernel_1..3,
        // driver_kernel.
        overhead: 7,
    }
}

fn run_scenario(file_name: &str, version: &str) {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_as(dir.path(), file_name);
    let fake = Fake::open(&lib);
    let source = CuptiSource::new(config(&lib));
    let info = source.library_info().expect("fake loads").clone();
    assert_eq!(info.api_version.to_string(), version);
    let out = dir.path().join("traces");
    let log = Log::default();
    let profiler = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
    let (outer_ids, inner_ids, sync_ids) = scenario(&fake);
    let written = profiler.stop();
    assert_eq!(written.len(), 1);
    assert!(
        log.lines().is_empty(),
        "unexpected messages: {:?}",
        log.lines()
    );
    let stats = fake.stats();
    assert!(
        stats.buffers_completed > 10,
        "the scenario must roll buffers over: {stats:?}"
    );
    assert_eq!(stats.finalized, 1, "dropping the profiler finalizes CUPTI");
    assert_eq!(
        stats.enabled_kinds, 0,
        "every kind disabled after the last window"
    );
    assert_eq!(stats.records_dropped, 0);

    let trace = load_trace(&out);
    let e = expected();
    let kernels = x(&trace, "kernel");
    assert_eq!(kernels.len(), e.kernels, "kernels");
    assert_eq!(x(&trace, "gpu_memcpy").len(), e.memcpy, "memcpy");
    assert_eq!(x(&trace, "gpu_memset").len(), e.memset, "memset");
    assert_eq!(x(&trace, "cuda_sync").len(), e.sync, "sync");
    let runtime = x(&trace, "cuda_runtime");
    assert_eq!(runtime.len(), e.runtime, "runtime");
    assert_eq!(x(&trace, "cuda_driver").len(), e.driver, "driver");
    let memory: Vec<&Value> = events(&trace)
        .iter()
        .filter(|ev| ev["ph"] == "i" && ev["name"] == "[memory]")
        .collect();
    assert_eq!(memory.len(), e.memory, "memory events");
    assert_eq!(x(&trace, "overhead").len(), e.overhead, "overhead");
    // Every record had the size the layout table gives this release (the fake writes the real
    // struct of each kind for it), and no kind was refused by the struct-size cross-check.
    assert!(
        trace.get("cupti_layout_warnings").is_none(),
        "{}",
        trace["cupti_layout_warnings"]
    );
    assert!(trace.get("cupti_kinds_refused").is_none());
    assert!(
        trace.get("cupti_kinds_failed").is_none(),
        "{}",
        trace["cupti_kinds_failed"]
    );

    // deviceProperties from the DEVICE records, in the record layout of this release. CUDA
    // initialised inside the window (the scenario's first call), so the devices were not known
    // when it opened: they are listed once, after the events.
    let keys = only_trace_keys(&out);
    assert!(
        key_position(&keys, "deviceProperties") > key_position(&keys, "traceEvents"),
        "{keys:?}"
    );
    let devices = trace["deviceProperties"]
        .as_array()
        .expect("deviceProperties");
    assert_eq!(devices.len(), 2, "{devices:?}");
    let d0 = &devices[0];
    assert_eq!(d0["id"], 0);
    assert_eq!(d0["name"], "Fake H100 80GB HBM3");
    assert_eq!(d0["totalGlobalMem"].as_u64(), Some(80 << 30));
    assert_eq!(
        (d0["computeMajor"].as_u64(), d0["computeMinor"].as_u64()),
        (Some(9), Some(0))
    );
    assert_eq!(d0["numSms"], 132);
    assert_eq!(d0["warpSize"], 32);
    assert_eq!(d0["maxThreadsPerBlock"], 1024);
    assert_eq!(d0["maxThreadsPerMultiprocessor"], 2048);
    assert_eq!(d0["regsPerBlock"], 65536);
    assert_eq!(d0["sharedMemPerBlock"], 49152);
    assert_eq!(d0["regsPerMultiprocessor"], 65536);
    assert_eq!(d0["sharedMemPerMultiprocessor"], 233472);
    assert!(
        d0.get("sharedMemPerBlockOptin").is_none(),
        "not in any layout"
    );
    assert_eq!(devices[1]["id"], 1);
    assert_eq!(devices[1]["name"], "Fake A100-SXM4-40GB");
    assert_eq!(devices[1]["computeMajor"], 8);

    // Syncs: the event waits name the stream and the cudaEventRecord that recorded the event
    // (from CUDA_EVENT records); the sync in context 2 is on device 1 (from CONTEXT records).
    let syncs = x(&trace, "cuda_sync");
    let sync = |c: u32| {
        *syncs
            .iter()
            .find(|s| s["args"]["correlation"].as_u64() == Some(c as u64))
            .unwrap_or_else(|| panic!("sync {c}"))
    };
    for (c, name) in [
        (sync_ids.stream_wait, "Stream Wait Event"),
        (sync_ids.event_sync, "Event Sync"),
    ] {
        let s = sync(c);
        assert_eq!(s["name"], name);
        assert_eq!(s["args"]["wait_on_stream"], 13, "{s}");
        assert_eq!(
            s["args"]["wait_on_cuda_event_record_corr_id"].as_u64(),
            Some(sync_ids.event_record as u64),
            "{s}"
        );
        assert_eq!(s["args"]["wait_on_cuda_event_id"], 7, "{s}");
        assert_eq!(s["args"]["device"], 0);
    }
    let s = sync(sync_ids.other_device);
    assert_eq!(s["args"]["context"], 2);
    assert_eq!(s["args"]["device"], 1, "{s}");
    assert_eq!(s["pid"], 1, "{s}");

    // MEMORY_POOL records have no event in the record model; they are summarised.
    assert_eq!(
        trace["cupti_memory_pools"].as_str(),
        Some("3 records: 1 created, 1 trimmed, 1 destroyed; 0 live pools, 0 bytes (peak 2097152)")
    );
    assert!(runtime.iter().all(|r| r["name"] != "cudaGetDevice"));
    assert!(runtime.iter().any(|r| r["name"] == "cudaLaunchKernel"));
    assert!(runtime.iter().any(|r| r["name"] == "cudaGraphLaunch"));

    // Every GPU record links to its API call: same correlation, and an ac2g flow pair.
    let api_corr: HashSet<u64> = runtime
        .iter()
        .chain(x(&trace, "cuda_driver").iter())
        .map(|r| r["args"]["correlation"].as_u64().unwrap())
        .collect();
    let flow_s: HashSet<u64> = events(&trace)
        .iter()
        .filter(|ev| ev["cat"] == "ac2g" && ev["ph"] == "s")
        .map(|ev| ev["id"].as_u64().unwrap())
        .collect();
    let flow_f: HashMap<u64, usize> = events(&trace)
        .iter()
        .filter(|ev| ev["cat"] == "ac2g" && ev["ph"] == "f")
        .fold(HashMap::new(), |mut m, ev| {
            *m.entry(ev["id"].as_u64().unwrap()).or_default() += 1;
            m
        });
    for cat in ["kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"] {
        for g in x(&trace, cat) {
            let c = g["args"]["correlation"].as_u64().unwrap();
            assert!(api_corr.contains(&c), "{cat} {c} has no API call");
            assert!(flow_f.contains_key(&c), "{cat} {c} has no ac2g f");
            if cat != "cuda_sync" {
                assert!(flow_s.contains(&c), "{cat} {c} has no ac2g s");
            }
        }
    }
    // And each kernel, copy and memset has exactly one flow: one start on its call, one end on it
    // (graph kernels share their launch's start).
    assert_eq!(
        assert_one_flow_per_gpu_record(&trace),
        e.kernels + e.memcpy + e.memset
    );
    // Graph kernels: one per node, graph/node ids, one shared correlation.
    let graph: Vec<&&Value> = kernels
        .iter()
        .filter(|k| k["args"]["graph id"] == 42)
        .collect();
    assert_eq!(graph.len(), 3);
    let nodes: HashSet<u64> = graph
        .iter()
        .map(|k| k["args"]["graph node id"].as_u64().unwrap())
        .collect();
    assert_eq!(nodes, HashSet::from([1, 2, 3]));
    assert_eq!(
        graph
            .iter()
            .map(|k| &k["args"]["correlation"])
            .collect::<HashSet<_>>()
            .len(),
        1
    );
    // Both streams, grid/block and peer copy args survive.
    let streams: HashSet<u64> = kernels
        .iter()
        .map(|k| k["args"]["stream"].as_u64().unwrap())
        .collect();
    assert_eq!(streams, HashSet::from([7, 13]));
    let k0 = kernels.iter().find(|k| k["name"] == "gemm_0").unwrap();
    assert_eq!(k0["args"]["grid"], serde_json::json!([64, 2, 1]));
    assert_eq!(k0["args"]["block"], serde_json::json!([128, 1, 1]));
    assert_eq!(k0["args"]["shared memory"], 1536);
    let memcpy_names: HashSet<&str> = x(&trace, "gpu_memcpy")
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(
        memcpy_names.contains("Memcpy HtoD (Pageable -> Device)"),
        "{memcpy_names:?}"
    );
    assert!(
        memcpy_names.contains("Memcpy PtoP (Device -> Device)"),
        "{memcpy_names:?}"
    );

    // External ids: the kernels launched in "outer" carry outer's id; those in "inner" inner's.
    let span_id = |name: &str| {
        x(&trace, "user_annotation")
            .into_iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["args"]["External id"].as_u64())
            .unwrap_or_else(|| panic!("span {name}"))
    };
    let (outer, inner) = (span_id("outer"), span_id("inner"));
    let by_corr: HashMap<u64, &Value> = events(&trace)
        .iter()
        .filter(|ev| {
            ev["ph"] == "X"
                && ["kernel", "gpu_memcpy", "gpu_memset"]
                    .contains(&ev["cat"].as_str().unwrap_or(""))
        })
        .map(|ev| (ev["args"]["correlation"].as_u64().unwrap(), ev))
        .collect();
    for c in outer_ids {
        assert_eq!(
            by_corr[&(c as u64)]["args"]["External id"].as_u64(),
            Some(outer),
            "corr {c}"
        );
    }
    for c in inner_ids {
        assert_eq!(
            by_corr[&(c as u64)]["args"]["External id"].as_u64(),
            Some(inner),
            "corr {c}"
        );
    }
    // API calls carry the span's id too, and the system thread id of the calling thread.
    let launch = runtime
        .iter()
        .find(|r| r["name"] == "cudaLaunchKernel")
        .unwrap();
    assert_eq!(launch["args"]["External id"].as_u64(), Some(outer));
    let span_tid = x(&trace, "user_annotation")
        .iter()
        .find(|s| s["name"] == "outer")
        .unwrap()["tid"]
        .clone();
    assert_eq!(launch["tid"], span_tid);
    // CPU and GPU times share one clock domain: each kernel starts after its launch call starts.
    let launch_ts: HashMap<u64, f64> = runtime
        .iter()
        .map(|r| {
            (
                r["args"]["correlation"].as_u64().unwrap(),
                r["ts"].as_f64().unwrap(),
            )
        })
        .collect();
    for k in &kernels {
        let c = k["args"]["correlation"].as_u64().unwrap();
        if let Some(ts) = launch_ts.get(&c) {
            assert!(k["ts"].as_f64().unwrap() >= *ts, "kernel before its launch");
        }
    }
    assert_eq!(
        trace["cupti_version"].as_str().map(str::to_owned),
        Some(version.to_string()),
        "metadata"
    );
}

#[test]
fn pipeline_cupti_11_8_layout() {
    in_child(
        "pipeline_cupti_11_8_layout",
        &[("FAKE_CUPTI_VERSION", "18"), NVTX_SET],
        || run_scenario("libcupti.so.11.8", "18"),
    );
}

#[test]
fn pipeline_cupti_12_9_layout() {
    in_child(
        "pipeline_cupti_12_9_layout",
        &[("FAKE_CUPTI_VERSION", "28"), NVTX_SET],
        || run_scenario("libcupti.so.12", "28"),
    );
}

/// The 12.x releases between 12.0 and 12.9 each changed some record layouts (Device5 in 12.2,
/// Overhead2 in 12.3, Overhead3 + Context2 in 12.4, Context3 in 12.5, Memory4 in 12.6, Memcpy6 +
/// Synchronization2 + CudaEvent2 in 12.8).
macro_rules! pipeline_12_x {
    ($($name:ident => $v:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                in_child(
                    stringify!($name),
                    &[("FAKE_CUPTI_VERSION", $v), NVTX_SET],
                    || run_scenario("libcupti.so.12", $v),
                );
            }
        )*
    };
}

pipeline_12_x! {
    pipeline_cupti_12_2_layout => "20",
    pipeline_cupti_12_3_layout => "21",
    pipeline_cupti_12_4_layout => "22",
    pipeline_cupti_12_5_layout => "23",
    pipeline_cupti_12_6_layout => "24",
    pipeline_cupti_12_8_layout => "26",
}

/// 13.1 (Kernel11, Context4), 13.2 (Device6; `cuptiActivityGetStructSize` answers, so every kind
/// is cross-checked), 13.3 (Kernel12).
macro_rules! pipeline_13_x {
    ($($name:ident => $v:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                in_child(
                    stringify!($name),
                    &[("FAKE_CUPTI_VERSION", $v), NVTX_SET],
                    || run_scenario("libcupti.so.13", $v),
                );
            }
        )*
    };
}

pipeline_13_x! {
    pipeline_cupti_13_1_layout => "130101",
    pipeline_cupti_13_2_layout => "130202",
    pipeline_cupti_13_3_layout => "130301",
}

#[test]
fn pipeline_cupti_13_0_layout() {
    in_child(
        "pipeline_cupti_13_0_layout",
        &[("FAKE_CUPTI_VERSION", "130001"), NVTX_SET],
        || run_scenario("libcupti.so.13", "130001"),
    );
}

#[test]
fn pipeline_cupti_13_5_layout() {
    in_child(
        "pipeline_cupti_13_5_layout",
        &[("FAKE_CUPTI_VERSION", "130500"), NVTX_SET],
        || run_scenario("libcupti.so.13", "130500"),
    );
}

/// Runs a small workload under a fault and checks the job went on and a trace was written.
fn survives(
    env_version: &str,
    tweak: impl FnOnce(&mut CuptiConfig),
) -> (Value, Vec<String>, FakeStats) {
    let _ = env_version;
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_as(dir.path(), "libcupti.so.12");
    let fake = Fake::open(&lib);
    let mut cfg = config(&lib);
    tweak(&mut cfg);
    let out = dir.path().join("traces");
    let log = Log::default();
    let profiler = trace_session(
        vec![Box::new(CuptiSource::new(cfg))],
        ActivitySet::all(),
        &out,
        &log,
    );
    {
        let _s = annotation("work");
        for i in 0..100 {
            fake.kernel("k", STREAMS[i % 2]);
        }
        fake.memcpy(1, 1, 3, 1024, 7);
        fake.sync(3, 7);
    }
    let written = profiler.stop();
    assert_eq!(written.len(), 1, "the trace is still written");
    let trace = load_trace(&out);
    assert_eq!(
        x(&trace, "user_annotation")
            .iter()
            .filter(|s| s["name"] == "work")
            .count(),
        1,
        "CPU side intact"
    );
    (trace, log.lines(), fake.stats())
}

#[test]
fn fault_enable_fails() {
    in_child(
        "fault_enable_fails",
        &[
            ("FAKE_CUPTI_FAIL", "cuptiActivityEnable"),
            ("FAKE_CUPTI_FAIL_CODE", "15"),
            NVTX_SET,
        ],
        || {
            let (trace, log, _) = survives("28", |_| {});
            assert_eq!(x(&trace, "kernel").len(), 0);
            assert_eq!(log.len(), 1, "{log:?}");
            assert!(
                log[0].contains("cupti") && log[0].contains("CUPTI_ERROR_NOT_INITIALIZED"),
                "{log:?}"
            );
        },
    );
}

#[test]
fn fault_every_call_fails() {
    in_child(
        "fault_every_call_fails",
        &[
            ("FAKE_CUPTI_FAIL", "*"),
            ("FAKE_CUPTI_FAIL_CODE", "999"),
            NVTX_SET,
        ],
        || {
            let (trace, log, _) = survives("28", |_| {});
            assert_eq!(x(&trace, "kernel").len(), 0);
            assert_eq!(log.len(), 1, "{log:?}");
            assert!(log[0].contains("CUPTI_ERROR_UNKNOWN"), "{log:?}");
        },
    );
}

#[test]
fn fault_flush_fails() {
    in_child(
        "fault_flush_fails",
        &[("FAKE_CUPTI_FAIL", "cuptiActivityFlushAll")],
        || {
            let (trace, _, stats) = survives("28", |_| {});
            // Only buffers that filled up arrive; the partial last one is lost, and the trace says so.
            let k = x(&trace, "kernel").len();
            assert!(k < 100 && stats.buffers_completed > 0, "{k} {stats:?}");
            assert!(
                trace["cupti_flush"]
                    .as_str()
                    .unwrap_or("")
                    .contains("failed"),
                "{}",
                trace["cupti_flush"]
            );
        },
    );
}

#[test]
fn fault_dropped_records_are_counted() {
    in_child(
        "fault_dropped_records_are_counted",
        &[("FAKE_CUPTI_DROP_EVERY", "7")],
        || {
            let (trace, log, stats) = survives("28", |_| {});
            let gpu = x(&trace, "kernel").len()
                + x(&trace, "gpu_memcpy").len()
                + x(&trace, "cuda_sync").len();
            assert_eq!(gpu as u64 + stats.records_dropped, 102);
            assert_eq!(
                trace["dropped_events"]["cupti"].as_u64(),
                Some(stats.records_dropped)
            );
            assert!(
                log.iter().any(|l| l.contains("dropped")),
                "one warning about the loss: {log:?}"
            );
        },
    );
}

/// Another tool holds CUPTI for the whole run (Nsight Systems, or a Kineto that subscribed first):
/// the window records CPU activity only, touches nothing of CUPTI's activity API (that would take the
/// other tool's records), and says so once.
#[test]
fn fault_subscribe_refused() {
    in_child(
        "fault_subscribe_refused",
        &[("FAKE_CUPTI_SUBSCRIBE_REFUSED", "1")],
        || {
            let (trace, log, stats) = survives("28", |_| {});
            assert_eq!(x(&trace, "kernel").len(), 0, "CPU only");
            assert_eq!(stats.records_written, 0, "no kind was enabled");
            assert_eq!(log.len(), 1, "{log:?}");
            assert!(
                log[0].contains("subscriber")
                    && log[0].contains("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"),
                "{log:?}"
            );
            assert!(trace["cupti_subscriber"]
                .as_str()
                .unwrap()
                .contains("another CUPTI client"));
        },
    );
}

/// `cuptiSubscribe` failing for another reason: GPU records still come through the activity API,
/// without External id links, and the metadata says why.
#[test]
fn fault_subscribe_fails() {
    in_child(
        "fault_subscribe_fails",
        &[
            ("FAKE_CUPTI_FAIL", "cuptiSubscribe"),
            ("FAKE_CUPTI_FAIL_CODE", "15"),
            NVTX_SET,
        ],
        || {
            let (trace, log, _) = survives("28", |_| {});
            let kernels = x(&trace, "kernel");
            assert_eq!(kernels.len(), 100);
            assert!(
                kernels
                    .iter()
                    .all(|k| k["args"].get("External id").is_none()),
                "no links without callbacks"
            );
            assert!(trace["cupti_subscribe"]
                .as_str()
                .unwrap()
                .contains("CUPTI_ERROR_NOT_INITIALIZED"));
            assert!(log.is_empty(), "{log:?}");
        },
    );
}

#[test]
fn fault_late_buffers() {
    in_child(
        "fault_late_buffers",
        &[("FAKE_CUPTI_LATE_MS", "30")],
        || {
            let (trace, _, _) = survives("28", |_| {});
            assert_eq!(
                x(&trace, "kernel").len(),
                100,
                "late buffers are waited for at flush"
            );
        },
    );
}

#[test]
fn fault_no_driver() {
    in_child("fault_no_driver", &[], || {
        let (trace, log, stats) = survives("28", |c| {
            c.driver = Some("/nonexistent/libcuda.so.1".into())
        });
        assert_eq!(x(&trace, "kernel").len(), 0);
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(log[0].contains("no CUDA driver"), "{log:?}");
        assert_eq!(stats.enabled_kinds, 0);
        assert!(trace["cupti_status"]
            .as_str()
            .unwrap()
            .starts_with("off: no CUDA driver"));
    });
}

/// A flood far beyond the buffer bound: memory stays within the bound and every lost record is
/// accounted for.
fn flood(file: &str) {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_as(dir.path(), file);
    let fake = Fake::open(&lib);
    let mut cfg = config(&lib);
    cfg.buffer_size = 4096;
    cfg.max_buffer_bytes = 16 * 4096;
    let out = dir.path().join("traces");
    let log = Log::default();
    let profiler = trace_session(
        vec![Box::new(CuptiSource::new(cfg))],
        ActivitySet::default_set(),
        &out,
        &log,
    );
    const FLOOD: usize = 20_000;
    for i in 0..FLOOD {
        fake.kernel("flood", STREAMS[i % 2]);
    }
    profiler.stop();
    let stats = fake.stats();
    let pool = kinetrace_cupti::pool_stats();
    assert!(
        pool.allocated_bytes <= 16 * 4096 + kinetrace_cupti::pool::RESERVE_SLOTS * 4096,
        "{pool:?}"
    );
    assert_eq!(
        stats.null_buffers_before_v27, 0,
        "CUPTI < 12.9 must never get a null buffer"
    );
    let trace = load_trace(&out);
    let kernels = x(&trace, "kernel").len() as u64;
    let runtime = x(&trace, "cuda_runtime").len() as u64;
    let dropped = trace["dropped_events"]["cupti"].as_u64().unwrap();
    assert!(kernels < FLOOD as u64, "the flood must overflow the bound");
    assert!(dropped > 0);
    // Every flood record (a kernel and its launch) is either in the trace or counted as dropped, and
    // nothing is counted twice. The few other records the fake writes (device, context, the lazy
    // function-loading overhead) may land on either side of the bound, so they only widen the range.
    let accounted = kernels + runtime + dropped;
    let produced = stats.records_written + stats.records_dropped;
    assert!(
        (2 * FLOOD as u64..=produced).contains(&accounted),
        "{accounted} accounted for, {produced} produced: {stats:?} {pool:?}"
    );
    let log = log.lines();
    assert!(log.iter().any(|l| l.contains("dropped")), "{log:?}");
}

#[test]
fn flood_is_bounded_12_9() {
    in_child(
        "flood_is_bounded_12_9",
        &[("FAKE_CUPTI_VERSION", "28")],
        || flood("libcupti.so.12"),
    );
}

#[test]
fn flood_is_bounded_11_8_without_null_buffers() {
    in_child(
        "flood_is_bounded_11_8_without_null_buffers",
        &[("FAKE_CUPTI_VERSION", "18")],
        || flood("libcupti.so.11.8"),
    );
}

/// `cuptiActivityGetStructSize` reporting a size the layout table does not have for this release:
/// the kind is not enabled, one line says why, everything else is recorded.
#[test]
fn struct_size_mismatch_refuses_the_kind() {
    in_child(
        "struct_size_mismatch_refuses_the_kind",
        &[
            ("FAKE_CUPTI_VERSION", "130500"),
            ("FAKE_CUPTI_WRONG_STRUCT_SIZE", "10"),
            // Markers are asked for: with NVTX injection set, the only line is the one tested.
            ("NVTX_INJECTION64_PATH", "libcupti.so.13"),
        ],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.13");
            let fake = Fake::open(&lib);
            let log = Log::default();
            let mut cfg = config(&lib);
            cfg.log = Some(std::sync::Arc::new(log.sink()));
            let out = dir.path().join("traces");
            let profiler = trace_session(
                vec![Box::new(CuptiSource::new(cfg))],
                ActivitySet::all(),
                &out,
                &log,
            );
            for i in 0..10 {
                fake.kernel("k", STREAMS[i % 2]);
            }
            fake.memcpy(1, 1, 3, 1024, 7);
            profiler.stop();
            let trace = load_trace(&out);
            let lines = log.lines();
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].contains("cuptiActivityGetStructSize")
                    && lines[0].contains("kind 10 is 256 B, expected 248 B"),
                "{lines:?}"
            );
            assert_eq!(x(&trace, "kernel").len(), 0, "the kind is refused");
            assert_eq!(
                x(&trace, "gpu_memcpy").len(),
                1,
                "other kinds still recorded"
            );
            assert_eq!(x(&trace, "cuda_runtime").len(), 11);
            assert_eq!(
                trace["cupti_kinds_refused"].as_str(),
                Some("kind 10: 256 B, expected 248 B")
            );
            assert_eq!(trace["deviceProperties"].as_array().map(Vec::len), Some(2));
        },
    );
}

/// CUDA initialised (devices and contexts created) before profiling starts: plain enabling would
/// never see their DEVICE/CONTEXT records; EnableAndDump makes CUPTI write them.
#[test]
fn devices_known_when_cuda_was_initialised_before_profiling() {
    in_child(
        "devices_known_when_cuda_was_initialised_before_profiling",
        &[("FAKE_CUPTI_VERSION", "24"), NVTX_SET],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            fake.kernel("before", 7);
            fake.memcpy(10, 3, 3, 4096, 7); // creates context 2 (device 1)
            let out = dir.path().join("traces");
            let log = Log::default();
            let profiler = trace_session(
                vec![Box::new(CuptiSource::new(config(&lib)))],
                ActivitySet::all(),
                &out,
                &log,
            );
            fake.kernel("k", 7);
            let c = fake.sync_on(3, 21, u32::MAX, 2);
            profiler.stop();
            assert!(log.lines().is_empty(), "{:?}", log.lines());
            let trace = load_trace(&out);
            let ids: Vec<u64> = trace["deviceProperties"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["id"].as_u64().unwrap())
                .collect();
            assert_eq!(ids, vec![0, 1]);
            // Known when the window opened: in the head, as Kineto writes them (streaming readers
            // look there), and only there.
            let keys = only_trace_keys(&out);
            assert_eq!(keys[0], "schemaVersion", "{keys:?}");
            assert_eq!(key_position(&keys, "deviceProperties"), 1, "{keys:?}");
            assert!(key_position(&keys, "traceEvents") > 1);
            let s = x(&trace, "cuda_sync")
                .into_iter()
                .find(|s| s["args"]["correlation"].as_u64() == Some(c as u64))
                .unwrap();
            assert_eq!(s["args"]["device"], 1, "{s}");
        },
    );
}

/// The harness itself: a child that hangs is killed at its deadline, and the test fails with what
/// the child printed (instead of waiting forever).
#[test]
fn a_hung_child_is_killed_at_its_deadline() {
    let name = "a_hung_child_is_killed_at_its_deadline";
    let run = || {
        in_child_within(name, &[], Duration::from_secs(3), || {
            println!("child started, now hanging");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let failure = std::panic::catch_unwind(run).expect_err("the hung child must fail the test");
    let message = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("still running after 3s; killed")
            && message.contains("child started, now hanging"),
        "{message}"
    );
}
