//! The exact JSON for a small session, pinned by a golden file, and escaping of hostile names.

use kinetrace::activity::*;
use kinetrace::export::{render_trace, TraceEncoder};
use kinetrace::{intern, TraceMeta, UnixNanos, WindowInfo};
use kinetrace_test_support::trace::{key_position, top_level_keys};

const BASE: u64 = 1_790_857_026_000_000_000;

fn t(us: u64) -> UnixNanos {
    UnixNanos(BASE + us * 1000 + 123)
}

fn cpu(name: &str) -> CpuSpan {
    CpuSpan {
        name: intern(name),
        pid: 4242,
        tid: 4243,
        args: Default::default(),
    }
}

fn session() -> (TraceMeta, Vec<Activity>) {
    let meta = TraceMeta {
        trace_id: "0123456789ABCDEF0123456789ABCDEF".into(),
        host_name: "golden-host".into(),
        pid: 4242,
        process_name: "python3".into(),
        rank: Some(1),
        world_size: Some(2),
        devices: vec![DeviceProperties {
            id: 0,
            name: "Test GPU".into(),
            total_global_mem: 1 << 34,
            num_sms: 8,
            warp_size: 32,
            ..Default::default()
        }],
        metadata: vec![("cupti_version".into(), "130100".into())],
        dropped: vec![("cpu_ring".into(), 0), ("cupti".into(), 2)],
        thread_names: vec![(4243, "MainThread".into())],
        window_start: t(0),
        window_end: t(100),
        cycle: 0,
    };
    let kernel = Kernel {
        name: intern("void gemm<float>(float const*, float*)"),
        device: 0,
        context: Some(1),
        stream: 7,
        grid: Some([128, 1, 1]),
        block: Some([256, 1, 1]),
        registers_per_thread: Some(64),
        shared_memory: Some(4096),
        queued: None,
        graph_id: Some(3),
        kind_arg: false,
        graph_node_id: Some(17),
    };
    let acts = vec![
        Activity {
            start: t(1),
            end: t(90),
            correlation: None,
            external_id: Some(1),
            detail: Detail::UserAnnotation(cpu("ProfilerStep#0")),
        },
        Activity {
            start: t(2),
            end: t(20),
            correlation: None,
            external_id: Some(2),
            detail: Detail::CpuOp(cpu("aten::mm")),
        },
        Activity {
            start: t(3),
            end: t(8),
            correlation: Some(11),
            external_id: Some(2),
            detail: Detail::Runtime(ApiCall {
                name: intern("cudaLaunchKernel"),
                cbid: Some(211),
                pid: 4242,
                tid: 4243,
                launches_work: true,
                args: Default::default(),
            }),
        },
        Activity {
            start: t(10),
            end: t(30),
            correlation: Some(11),
            external_id: Some(2),
            detail: Detail::Kernel(kernel),
        },
        Activity {
            start: t(31),
            end: t(33),
            correlation: Some(12),
            external_id: None,
            detail: Detail::Memcpy(Memcpy {
                kind: MemcpyKind::HtoD,
                src_kind: MemoryKind::Pinned,
                dst_kind: MemoryKind::Device,
                bytes: 2_000_000,
                device: 0,
                context: Some(1),
                stream: 7,
                kind_arg: false,
                peer: None,
            }),
        },
        Activity {
            start: t(34),
            end: t(35),
            correlation: Some(13),
            external_id: None,
            detail: Detail::Memcpy(Memcpy {
                kind: MemcpyKind::PtoP,
                src_kind: MemoryKind::Device,
                dst_kind: MemoryKind::Device,
                bytes: 1000,
                device: 0,
                context: Some(1),
                stream: 8,
                kind_arg: false,
                peer: Some(PeerCopy {
                    src_device: 0,
                    dst_device: 1,
                    src_context: Some(1),
                    dst_context: Some(2),
                }),
            }),
        },
        Activity {
            start: t(36),
            end: t(36),
            correlation: Some(14),
            external_id: None,
            detail: Detail::Memset(Memset {
                memory_kind: MemoryKind::Device,
                bytes: 64,
                device: 0,
                context: Some(1),
                stream: 7,
            }),
        },
        Activity {
            start: t(40),
            end: t(50),
            correlation: Some(15),
            external_id: None,
            detail: Detail::Sync(Sync {
                kind: SyncKind::StreamWaitEvent,
                device: Some(0),
                context: Some(1),
                stream: Some(7),
                event_id: Some(5),
                wait_on_stream: Some(8),
                wait_on_event_record_correlation: Some(9),
            }),
        },
        Activity {
            start: t(51),
            end: t(52),
            correlation: Some(16),
            external_id: None,
            detail: Detail::Sync(Sync {
                kind: SyncKind::ContextSync,
                device: Some(0),
                context: Some(1),
                stream: None,
                event_id: None,
                wait_on_stream: None,
                wait_on_event_record_correlation: None,
            }),
        },
        Activity {
            start: t(53),
            end: t(54),
            correlation: Some(17),
            external_id: None,
            detail: Detail::Driver(ApiCall {
                name: intern("cuMemAlloc"),
                cbid: Some(2),
                pid: 4242,
                tid: 4243,
                launches_work: false,
                args: Default::default(),
            }),
        },
        Activity {
            start: t(55),
            end: t(55),
            correlation: None,
            external_id: None,
            detail: Detail::Memory(Memory {
                op: MemoryOp::Alloc,
                device: Some(0),
                address: 0x7f00_0000,
                bytes: 512,
                total_allocated: Some(1024),
                total_reserved: Some(2 << 20),
                pid: 4242,
                tid: 4243,
            }),
        },
        Activity {
            start: t(56),
            end: t(56),
            correlation: None,
            external_id: None,
            detail: Detail::Memory(Memory {
                op: MemoryOp::Free,
                device: None,
                address: 0x1000,
                bytes: 512,
                total_allocated: Some(0),
                total_reserved: Some(0),
                pid: 4242,
                tid: 4243,
            }),
        },
        Activity {
            start: t(57),
            end: t(60),
            correlation: None,
            external_id: None,
            detail: Detail::Marker(Marker {
                name: intern("nvtx range"),
                domain: Some(intern("my_domain")),
                pid: 4242,
                tid: 4243,
            }),
        },
        Activity {
            start: t(61),
            end: t(61),
            correlation: None,
            external_id: None,
            detail: Detail::Marker(Marker {
                name: intern("nvtx mark"),
                domain: None,
                pid: 4242,
                tid: 4243,
            }),
        },
        Activity {
            start: t(62),
            end: t(63),
            correlation: None,
            external_id: None,
            detail: Detail::Overhead(Overhead {
                kind: OverheadKind::BufferFlush,
            }),
        },
    ];
    (meta, acts)
}

#[test]
fn small_session_matches_the_golden_file() {
    let (meta, acts) = session();
    let got = String::from_utf8(render_trace(&meta, &acts, BASE, "golden.pt.trace.json")).unwrap();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/small_session.json");
    if std::env::var_os("KINETRACE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .expect("golden file (regenerate with KINETRACE_UPDATE_GOLDEN=1)");
    assert_eq!(got, want, "trace differs from {}; if the change is intended, rerun with KINETRACE_UPDATE_GOLDEN=1 and review the diff", path.display());
    // And it is valid JSON, written in one pass: what is known when the window opens before
    // `traceEvents` (the devices too, as Kineto writes them), what is known only at its end after.
    let v: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        v["traceEvents"].as_array().unwrap().last().unwrap()["name"],
        "Record Window End"
    );
    let keys = top_level_keys(&got);
    let order = [
        "schemaVersion",
        "deviceProperties",
        "distributedInfo",
        "displayTimeUnit",
        "baseTimeNanoseconds",
        "traceEvents",
        "trace_id",
        "dropped_events",
        "traceName",
    ];
    let pos: Vec<usize> = order.iter().map(|k| key_position(&keys, k)).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    assert_eq!(pos[..2], [0, 1], "{keys:?}");
    // HTA reads the file line by line and takes the first `"rank":\s+(\d+)`: it is on line 4,
    // after the one device (one per line).
    let rank_line = got.lines().position(|l| l.contains("\"rank\": ")).unwrap();
    assert_eq!(rank_line, 5);
    assert!(got.contains("\n  \"distributedInfo\": {\"rank\": 1, \"world_size\": 2},\n"));
    // Times are relative to baseTimeNanoseconds with exactly three decimals.
    assert!(got.contains("\"ts\":1.123,\"dur\":89.000"));
}

#[test]
fn hostile_names_are_escaped_into_valid_json() {
    let (meta, _) = session();
    let names = [
        intern("quote\" back\\slash"),
        intern("ctl\u{1}\u{7}\n\r\ttab"),
        kinetrace::export::writer::intern_lossy(b"bad \xff\xfe utf8 \xe2\x82"),
        intern("ünïcødé ✓ 🚀"),
    ];
    let acts: Vec<Activity> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Activity {
            start: t(i as u64),
            end: t(i as u64 + 1),
            correlation: None,
            external_id: None,
            detail: Detail::CpuOp(CpuSpan {
                name: *n,
                pid: 1,
                tid: 1,
                args: Default::default(),
            }),
        })
        .collect();
    let out = render_trace(&meta, &acts, BASE, "weird \"name\".json");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
    let got: Vec<&str> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "cpu_op")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        got,
        vec![
            "quote\" back\\slash",
            "ctl\u{1}\u{7}\n\r\ttab",
            "bad \u{fffd}\u{fffd} utf8 \u{fffd}",
            "ünïcødé ✓ 🚀"
        ]
    );
    assert_eq!(v["traceName"], "weird \"name\".json");
}

fn gpu(id: u32) -> DeviceProperties {
    DeviceProperties {
        id,
        name: format!("GPU {id}"),
        num_sms: 8,
        warp_size: 32,
        ..Default::default()
    }
}

/// A trace whose window opened knowing `at_open` and ended knowing `at_end`.
fn devices_trace(at_open: &[u32], at_end: &[u32]) -> String {
    let window = WindowInfo {
        devices: at_open.iter().map(|&d| gpu(d)).collect(),
        ..Default::default()
    };
    let meta = TraceMeta {
        devices: at_end.iter().map(|&d| gpu(d)).collect(),
        ..Default::default()
    };
    let mut out = Vec::new();
    let enc = TraceEncoder::begin(&window, BASE, &mut out);
    enc.finish(&meta, "t.json", &mut out);
    String::from_utf8(out).unwrap()
}

fn device_ids(v: &serde_json::Value) -> Vec<u64> {
    v["deviceProperties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect()
}

/// `deviceProperties` goes in the head when the devices are known as the window opens (Kineto
/// writes it there, and streaming readers read it there), after `traceEvents` only when they were
/// first seen later; a device first seen after the head listed others makes the tail list them
/// all again, so a reader keeping the last value of a key (serde_json, Python's `json`) has every
/// device and a streaming reader the head's.
#[test]
fn device_properties_go_in_the_head_when_known_as_the_window_opens() {
    let keys_of = |t: &str| {
        let keys = top_level_keys(t);
        let at = |k: &str| -> Vec<usize> {
            keys.iter()
                .enumerate()
                .filter(|(_, x)| *x == k)
                .map(|(i, _)| i)
                .collect()
        };
        (at("deviceProperties"), key_position(&keys, "traceEvents"))
    };
    // Known at the open: head only.
    let t = devices_trace(&[0, 1], &[0, 1]);
    let (devices, events) = keys_of(&t);
    assert!(devices == [1] && events > 1, "{t}");
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_eq!(device_ids(&v), [0, 1]);
    // First seen during the window (CUDA initialised inside it): tail only.
    let t = devices_trace(&[], &[0, 1]);
    let (devices, events) = keys_of(&t);
    assert!(devices.len() == 1 && devices[0] > events, "{t}");
    assert_eq!(device_ids(&serde_json::from_str(&t).unwrap()), [0, 1]);
    // No GPU: `[]` at the end, as Kineto writes for CPU-only runs.
    let t = devices_trace(&[], &[]);
    let (devices, events) = keys_of(&t);
    assert!(devices.len() == 1 && devices[0] > events, "{t}");
    assert!(device_ids(&serde_json::from_str(&t).unwrap()).is_empty());
    // One more device appeared after the head was written: the whole list again at the end.
    let t = devices_trace(&[0], &[0, 1]);
    let (devices, events) = keys_of(&t);
    assert_eq!(devices.len(), 2, "{t}");
    assert!(devices[0] < events && devices[1] > events, "{t}");
    assert_eq!(device_ids(&serde_json::from_str(&t).unwrap()), [0, 1]);
    // kinetrace's own reader takes the trace too.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("late.pt.trace.json");
    std::fs::write(&p, &t).unwrap();
    kinetrace::export::read_trace(&p).unwrap();
}
