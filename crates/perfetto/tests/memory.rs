//! PyTorch's `[memory]` instants become counter tracks (`Total Allocated (DEVICE)`, `Total Reserved
//! (DEVICE)`, in bytes) that Perfetto draws as the memory curve, instead of a marker per allocation:
//! checked on the torch 2.15 CPU traces in `../shared/traces/torch_2_15_cpu` (required) by decoding
//! the `.pftrace` with a small protobuf reader, and on a synthetic GPU trace.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use kinetrace_perfetto::{convert, convert_reader, ReadOptions};
use serde_json::{json, Value};

/// A protobuf field's value.
#[derive(Clone, Copy, Debug)]
enum Field<'a> {
    Varint(u64),
    Fixed(u64),
    Bytes(&'a [u8]),
}

fn varint(b: &[u8], i: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let byte = b[*i];
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// The fields of one message, in order.
fn fields(b: &[u8]) -> Vec<(u32, Field<'_>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i);
        let (field, wire) = ((key >> 3) as u32, key & 7);
        let v = match wire {
            0 => Field::Varint(varint(b, &mut i)),
            1 => {
                let v = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
                i += 8;
                Field::Fixed(v)
            }
            2 => {
                let n = varint(b, &mut i) as usize;
                i += n;
                Field::Bytes(&b[i - n..i])
            }
            5 => {
                i += 4;
                Field::Fixed(0)
            }
            w => panic!("wire type {w}"),
        };
        out.push((field, v));
    }
    out
}

fn get<'a>(f: &[(u32, Field<'a>)], n: u32) -> Option<Field<'a>> {
    f.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
}

fn uint(f: &[(u32, Field<'_>)], n: u32) -> Option<u64> {
    match get(f, n)? {
        Field::Varint(v) | Field::Fixed(v) => Some(v),
        Field::Bytes(_) => None,
    }
}

fn bytes<'a>(f: &[(u32, Field<'a>)], n: u32) -> Option<&'a [u8]> {
    match get(f, n)? {
        Field::Bytes(b) => Some(b),
        _ => None,
    }
}

/// A counter track as the `.pftrace` describes it.
#[derive(Debug, Default)]
struct Counter {
    name: String,
    unit: Option<u64>,
    parent: u64,
    /// (timestamp, integer value) in file order.
    values: Vec<(u64, i64)>,
}

/// The counter tracks of a `.pftrace` by uuid, the uuids of process tracks, and the interned
/// event names.
fn decode(pftrace: &[u8]) -> (HashMap<u64, Counter>, Vec<u64>, Vec<String>) {
    let mut counters: HashMap<u64, Counter> = HashMap::new();
    let mut processes = Vec::new();
    let mut names = Vec::new();
    for (n, p) in fields(pftrace) {
        assert_eq!(n, 1, "a Trace holds packets only");
        let Field::Bytes(p) = p else { panic!() };
        let p = fields(p);
        if let Some(d) = bytes(&p, 60) {
            let d = fields(d);
            let uuid = uint(&d, 1).unwrap();
            if get(&d, 3).is_some() {
                processes.push(uuid);
            }
            if let Some(c) = bytes(&d, 8) {
                let c = fields(c);
                let name = String::from_utf8(bytes(&d, 2).unwrap().to_vec()).unwrap();
                let e = counters.entry(uuid).or_default();
                e.name = name;
                e.unit = uint(&c, 3);
                e.parent = uint(&d, 5).unwrap_or(0);
            }
        }
        if let Some(i) = bytes(&p, 12) {
            for (k, v) in fields(i) {
                if let (2, Field::Bytes(entry)) = (k, v) {
                    let entry = fields(entry);
                    names.push(String::from_utf8(bytes(&entry, 2).unwrap().to_vec()).unwrap());
                }
            }
        }
        if let Some(te) = bytes(&p, 11) {
            let te = fields(te);
            if uint(&te, 9) == Some(4) {
                let track = uint(&te, 11).unwrap();
                let ts = uint(&p, 8).unwrap();
                if let Some(v) = uint(&te, 30) {
                    counters
                        .entry(track)
                        .or_default()
                        .values
                        .push((ts, v as i64));
                }
            }
        }
    }
    (counters, processes, names)
}

fn torch_traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/torch_2_15_cpu");
    assert!(
        dir.is_dir(),
        "the reference traces are missing: expected ../shared/traces next to the project root ({})",
        dir.display()
    );
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    found.sort();
    assert!(!found.is_empty());
    found
}

/// The `[memory]` events of a trace: (ts in µs, allocated, reserved), stable-sorted by time.
fn memory_events(path: &Path) -> Vec<(f64, i64, i64)> {
    let mut text = Vec::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut text)
        .unwrap();
    let doc: Value = serde_json::from_slice(&text).unwrap();
    let mut out: Vec<(f64, i64, i64)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "[memory]")
        .map(|e| {
            assert_eq!(e["args"]["Device Type"], 0, "a CPU trace");
            (
                e["ts"].as_f64().unwrap(),
                e["args"]["Total Allocated"].as_i64().unwrap(),
                e["args"]["Total Reserved"].as_i64().unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

#[test]
fn memory_events_of_a_torch_trace_are_allocated_and_reserved_counter_tracks() {
    for path in torch_traces() {
        let want = memory_events(&path);
        assert!(
            want.len() > 10,
            "{}: {} [memory] events",
            path.display(),
            want.len()
        );
        let file = std::fs::File::open(&path).unwrap();
        let (out, stats) = convert_reader(&path, file, &ReadOptions::default()).unwrap();
        assert_eq!(stats.memory_events, want.len());
        let (counters, processes, names) = decode(&out);
        assert!(
            !names.iter().any(|n| n == "[memory]"),
            "{}: [memory] still written as instants",
            path.display()
        );
        let track = |name: &str| {
            let mut found = counters.values().filter(|c| c.name == name);
            let c = found
                .next()
                .unwrap_or_else(|| panic!("{}: no counter track {name}", path.display()));
            assert!(found.next().is_none(), "two tracks named {name}");
            c
        };
        for (name, pick) in [
            ("Total Allocated (CPU)", 1usize),
            ("Total Reserved (CPU)", 2),
        ] {
            let c = track(name);
            assert_eq!(c.unit, Some(3), "{name}: unit is bytes (UNIT_SIZE_BYTES)");
            assert!(processes.contains(&c.parent), "{name}: under its process");
            let values: Vec<i64> = c.values.iter().map(|v| v.1).collect();
            let expected: Vec<i64> = want
                .iter()
                .map(|w| if pick == 1 { w.1 } else { w.2 })
                .collect();
            assert_eq!(values, expected, "{name}");
            assert!(
                c.values.windows(2).all(|w| w[0].0 <= w[1].0),
                "{name}: in time order"
            );
            // Times are the events' (within float rounding of the µs text).
            let base = 1_790_857_026_000_000_000u64;
            for ((ts, _), w) in c.values.iter().zip(&want) {
                let us = (*ts - base) as f64 / 1000.0;
                assert!((us - w.0).abs() < 0.002, "{name}: {us} vs {}", w.0);
            }
        }
        assert!(
            want.iter().any(|w| w.1 != want[0].1),
            "the curve moves (a trace of allocations and frees)"
        );
    }
}

/// Per device: a GPU's samples go to its own tracks; an event without either total stays an
/// instant.
#[test]
fn each_device_gets_its_own_memory_tracks() {
    let mem = |ts: u64, dev_type: i64, dev: i64, alloc: i64, reserved: i64| {
        json!({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 7, "tid": 7, "ts": ts,
               "args": {"Total Allocated": alloc, "Total Reserved": reserved, "Bytes": 1, "Device Type": dev_type, "Device Id": dev}})
    };
    let doc = json!({"traceEvents": [
        mem(10, 1, 0, 512, 2048),
        mem(20, 0, -1, 64, 0),
        mem(15, 1, 0, 1024, 2048),
        mem(30, 1, 1, 8, 16),
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 7, "ts": 40, "args": {"Bytes": 3}},
        {"ph": "X", "name": "step", "pid": 7, "tid": 7, "ts": 0, "dur": 100},
    ]});
    let (out, stats) = convert(&serde_json::to_vec(&doc).unwrap()).unwrap();
    assert_eq!((stats.memory_events, stats.instants), (4, 1));
    assert_eq!(stats.counter_values, 8);
    let (counters, _, _) = decode(&out);
    let by_name: HashMap<&str, Vec<(u64, i64)>> = counters
        .values()
        .map(|c| (c.name.as_str(), c.values.clone()))
        .collect();
    assert_eq!(
        by_name["Total Allocated (GPU 0)"],
        vec![(10_000, 512), (15_000, 1024)]
    );
    assert_eq!(
        by_name["Total Reserved (GPU 0)"],
        vec![(10_000, 2048), (15_000, 2048)]
    );
    assert_eq!(by_name["Total Allocated (GPU 1)"], vec![(30_000, 8)]);
    assert_eq!(by_name["Total Allocated (CPU)"], vec![(20_000, 64)]);
    assert_eq!(by_name.len(), 6);
}
