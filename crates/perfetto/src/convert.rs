//! Kineto JSON → Perfetto `TracePacket`s.
//!
//! Tracks: a process track per CPU process (a `ProcessDescriptor`) with a thread track per thread
//! (`ThreadDescriptor`); a track group per GPU (`GPU N`) with a track per stream. Slices on one
//! track must nest strictly in Perfetto (its JSON importer mis-nests or drops those that overlap),
//! so each row's `X` events are dealt into lanes: an event goes to the first lane where it nests in
//! (or follows) what is open, and lanes past the first are child tracks of the row's track named
//! `… (overlap N)`. Flows (`ac2g`, `fwdbwd`) become `flow_ids` on the slice they start from and
//! `terminating_flow_ids` on the slice they end at; `args` become debug annotations; names and
//! categories are interned; counters (`C`) become counter tracks, and PyTorch's `[memory]` instants
//! the counter tracks `Total Allocated (DEVICE)` and `Total Reserved (DEVICE)` of their process, in
//! bytes, so Perfetto draws the memory curve instead of a marker per allocation.
//!
//! The input is read by [`crate::read`] into compact records (the document is never held).

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

use kinetrace_export::reader::ReadOptions;

use crate::proto::{event, interned, packet, track, Msg, TRACE_PACKET};
use crate::read::{read_doc, Doc, Id, RowIx, SliceRec, StrIx};

/// The trusted sequence every packet is written on.
const SEQUENCE: u64 = 1;

/// What a conversion wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `X` events written as slices.
    pub slices: usize,
    /// Instant events.
    pub instants: usize,
    /// Counter values (those of `C` events and of `[memory]` events).
    pub counter_values: usize,
    /// `[memory]` events written as values of the memory counter tracks.
    pub memory_events: usize,
    /// Flows whose both ends were found.
    pub flows: usize,
    /// Tracks added for overlapping slices.
    pub overlap_lanes: usize,
    /// Events not converted, by phase (`B`/`E` pairs, async events...).
    pub skipped: Vec<(String, usize)>,
}

/// Why a document cannot be converted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertError(pub String);

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConvertError {}

/// One `X` event, placed.
struct Slice {
    start: u64,
    end: u64,
    /// Index into [`Doc::slices`].
    rec: usize,
    flow_out: Vec<u64>,
    flow_in: Vec<u64>,
}

/// Interned names and categories on the one sequence.
#[derive(Default)]
struct Interner {
    names: HashMap<String, u64>,
    cats: HashMap<String, u64>,
}

impl Interner {
    /// The iid of `s`, adding its definition to `defs` under `field` when new.
    fn iid(map: &mut HashMap<String, u64>, s: &str, defs: &mut Msg, field: u32) -> u64 {
        if let Some(&i) = map.get(s) {
            return i;
        }
        let i = map.len() as u64 + 1;
        map.insert(s.to_string(), i);
        let mut entry = Msg::new();
        entry.uint(interned::IID, i).str(interned::NAME, s);
        defs.msg(field, &entry);
        i
    }
}

/// The converter's output buffer: packets on one sequence.
struct Writer {
    out: Vec<u8>,
    interner: Interner,
    first: bool,
}

impl Writer {
    fn packet(&mut self, p: &Msg) {
        let mut t = Msg::new();
        t.msg(TRACE_PACKET, p);
        self.out.extend_from_slice(t.as_bytes());
    }

    fn track(&mut self, desc: &Msg) {
        let mut p = Msg::new();
        p.msg(packet::TRACK_DESCRIPTOR, desc);
        self.packet(&p);
    }

    /// A track event at `ts` (its name and category interned here).
    fn event(&mut self, ts: u64, name: Option<&str>, cat: Option<&str>, mut te: Msg) {
        let mut defs = Msg::new();
        if let Some(c) = cat {
            let i = Interner::iid(
                &mut self.interner.cats,
                c,
                &mut defs,
                interned::EVENT_CATEGORIES,
            );
            te.uint(event::CATEGORY_IIDS, i);
        }
        if let Some(n) = name {
            let i = Interner::iid(
                &mut self.interner.names,
                n,
                &mut defs,
                interned::EVENT_NAMES,
            );
            te.uint(event::NAME_IID, i);
        }
        let mut p = Msg::new();
        p.uint(packet::TIMESTAMP, ts)
            .uint(packet::SEQUENCE_ID, SEQUENCE)
            .msg(packet::TRACK_EVENT, &te);
        if !defs.as_bytes().is_empty() {
            p.msg(packet::INTERNED_DATA, &defs);
        }
        let mut flags = packet::SEQ_NEEDS_INCREMENTAL_STATE;
        if self.first {
            flags |= packet::SEQ_INCREMENTAL_STATE_CLEARED;
            self.first = false;
        }
        p.uint(packet::SEQUENCE_FLAGS, flags);
        self.packet(&p);
    }
}

/// Converts a Kineto document held in memory (its JSON text, plain or gzip). Timestamps are
/// written in nanoseconds since the Unix epoch (`baseTimeNanoseconds` plus `ts`), exactly as the
/// text gives them.
pub fn convert(json: &[u8]) -> Result<(Vec<u8>, Stats), ConvertError> {
    convert_reader(Path::new("(in memory)"), json, &ReadOptions::default())
}

/// Converts the Kineto trace `input` streams (plain or gzip, by magic bytes; gzip members may be
/// concatenated), read within the reader's limits `read`; `name` names it in errors.
pub fn convert_reader<R: Read + Send>(
    name: &Path,
    input: R,
    read: &ReadOptions,
) -> Result<(Vec<u8>, Stats), ConvertError> {
    let doc = read_doc(name, input, read).map_err(|e| ConvertError(e.to_string()))?;
    Ok(convert_doc(&doc))
}

fn convert_doc(doc: &Doc) -> (Vec<u8>, Stats) {
    let mut stats = Stats::default();
    let name_of = |i: Option<StrIx>| i.map(|i| doc.strings.get(i));
    // Each row's slices, by row.
    let mut rows: HashMap<RowIx, Vec<Slice>> = HashMap::new();
    for (i, rec) in doc.slices.iter().enumerate() {
        let start = doc.at(rec.start);
        rows.entry(rec.row).or_default().push(Slice {
            start,
            end: start.saturating_add(rec.dur),
            rec: i,
            flow_out: Vec::new(),
            flow_in: Vec::new(),
        });
    }
    for row in rows.values_mut() {
        // Outer slices first at equal starts, so that inner ones nest in them.
        row.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    }
    stats.flows = bind_flows(doc, &mut rows);

    let mut w = Writer {
        out: Vec::new(),
        interner: Interner::default(),
        first: true,
    };
    // Tracks: processes, then rows, then lanes. uuids are assigned in order.
    let mut next_uuid = 1u64;
    let mut uuid = || {
        next_uuid += 1;
        next_uuid
    };
    let row_key = |r: RowIx| &doc.rows[r as usize];
    let mut pids: Vec<Id> = rows
        .keys()
        .map(|&r| row_key(r).0.clone())
        .chain(doc.counters.iter().map(|c| c.pid.clone()))
        .chain(doc.instant_rows.iter().map(|&r| row_key(r).0.clone()))
        .chain(doc.memory.iter().map(|m| m.pid.clone()))
        .collect();
    pids.sort();
    pids.dedup();
    let mut process_uuid: HashMap<Id, u64> = HashMap::new();
    for pid in &pids {
        let u = uuid();
        process_uuid.insert(pid.clone(), u);
        let mut d = Msg::new();
        d.uint(track::UUID, u);
        let gpu = doc.gpu_pids.contains(pid);
        let name = doc.process_names.get(pid).cloned().unwrap_or_else(|| {
            if gpu {
                format!("GPU {}", pid.text())
            } else {
                format!("process {}", pid.text())
            }
        });
        match pid.num32() {
            Some(n) if !gpu => {
                let mut p = Msg::new();
                p.int(track::PROCESS_PID, n).str(track::PROCESS_NAME, &name);
                d.msg(track::PROCESS, &p);
            }
            _ => {
                d.str(track::NAME, &name);
            }
        }
        w.track(&d);
    }
    let mut keys: Vec<RowIx> = rows.keys().copied().collect();
    keys.extend(doc.instant_rows.iter().copied());
    keys.sort_by(|a, b| row_key(*a).cmp(row_key(*b)));
    keys.dedup();
    let mut row_uuid: HashMap<RowIx, u64> = HashMap::new();
    let mut row_names: HashMap<RowIx, String> = HashMap::new();
    for &key in &keys {
        let (pid, tid) = row_key(key);
        let u = uuid();
        row_uuid.insert(key, u);
        let gpu = doc.gpu_pids.contains(pid);
        let name = doc
            .thread_names
            .get(row_key(key))
            .cloned()
            .unwrap_or_else(|| {
                if gpu {
                    format!("stream {}", tid.text())
                } else {
                    format!("thread {}", tid.text())
                }
            });
        row_names.insert(key, name.clone());
        let mut d = Msg::new();
        d.uint(track::UUID, u)
            .uint(track::PARENT_UUID, process_uuid[pid]);
        match (pid.num32(), tid.num32()) {
            (Some(p), Some(t)) if !gpu => {
                let mut th = Msg::new();
                th.int(track::THREAD_PID, p)
                    .int(track::THREAD_TID, t)
                    .str(track::THREAD_NAME, &name);
                d.msg(track::THREAD, &th);
            }
            _ => {
                d.str(track::NAME, &name);
            }
        }
        w.track(&d);
    }
    // Instants go on their row's first lane, in time order with its slices.
    let mut row_instants: HashMap<RowIx, Vec<(u64, usize)>> = HashMap::new();
    for (i, rec) in doc.instants.iter().enumerate() {
        row_instants
            .entry(rec.row)
            .or_default()
            .push((doc.at(rec.ts), i));
    }
    for v in row_instants.values_mut() {
        v.sort_by_key(|(ts, _)| *ts);
    }
    // Slices, row by row, lane by lane, each lane's begins and ends in nesting order.
    let no_slices = Vec::new();
    for key in &keys {
        let row = rows.get(key).unwrap_or(&no_slices);
        let mut lanes = deal_into_lanes(row);
        if lanes.is_empty() {
            lanes.push(Vec::new());
        }
        let base_uuid = row_uuid[key];
        let row_name = &row_names[key];
        let mut pending: &[(u64, usize)] = row_instants.get(key).map_or(&[], |v| v.as_slice());
        for (lane, members) in lanes.iter().enumerate() {
            let track_uuid = if lane == 0 {
                base_uuid
            } else {
                let u = uuid();
                stats.overlap_lanes += 1;
                let mut d = Msg::new();
                d.uint(track::UUID, u)
                    .uint(track::PARENT_UUID, base_uuid)
                    .str(track::NAME, &format!("{row_name} (overlap {lane})"));
                w.track(&d);
                u
            };
            // Instants before `t` (first lane only).
            let mut instants_before = |w: &mut Writer, t: u64, stats: &mut Stats| {
                if lane != 0 {
                    return;
                }
                while let Some(((ts, i), rest)) = pending.split_first() {
                    if *ts >= t {
                        break;
                    }
                    let rec = &doc.instants[*i];
                    let mut te = Msg::new();
                    te.uint(event::TYPE, event::INSTANT)
                        .uint(event::TRACK_UUID, track_uuid)
                        .raw(&doc.annotations[rec.args.clone()]);
                    w.event(*ts, name_of(rec.name), name_of(rec.cat), te);
                    stats.instants += 1;
                    pending = rest;
                }
            };
            let mut open: Vec<u64> = Vec::new();
            for &i in members {
                let s = &row[i];
                while open.last().is_some_and(|&e| e <= s.start) {
                    let e = open.pop().unwrap_or(0);
                    instants_before(&mut w, e, &mut stats);
                    end_slice(&mut w, track_uuid, e);
                }
                instants_before(&mut w, s.start, &mut stats);
                let rec: &SliceRec = &doc.slices[s.rec];
                let mut te = Msg::new();
                te.uint(event::TYPE, event::SLICE_BEGIN)
                    .uint(event::TRACK_UUID, track_uuid)
                    .raw(&doc.annotations[rec.args.clone()]);
                for f in &s.flow_out {
                    te.fixed64(event::FLOW_IDS, *f);
                }
                for f in &s.flow_in {
                    te.fixed64(event::TERMINATING_FLOW_IDS, *f);
                }
                w.event(s.start, name_of(rec.name), name_of(rec.cat), te);
                stats.slices += 1;
                open.push(s.end);
            }
            while let Some(e) = open.pop() {
                instants_before(&mut w, e, &mut stats);
                end_slice(&mut w, track_uuid, e);
            }
            instants_before(&mut w, u64::MAX, &mut stats);
        }
    }
    let mut counter_uuid: HashMap<(Id, StrIx), u64> = HashMap::new();
    for c in &doc.counters {
        let u = match counter_uuid.get(&(c.pid.clone(), c.label)) {
            Some(u) => *u,
            None => {
                let u = uuid();
                let mut d = Msg::new();
                d.uint(track::UUID, u)
                    .uint(track::PARENT_UUID, process_uuid[&c.pid])
                    .str(track::NAME, doc.strings.get(c.label))
                    .msg(COUNTER_DESCRIPTOR, &Msg::new());
                w.track(&d);
                counter_uuid.insert((c.pid.clone(), c.label), u);
                u
            }
        };
        let mut te = Msg::new();
        te.uint(event::TYPE, COUNTER_TYPE)
            .uint(event::TRACK_UUID, u)
            .double(DOUBLE_COUNTER_VALUE, c.value);
        w.event(doc.at(c.ts), None, None, te);
        stats.counter_values += 1;
    }
    let values = memory_counters(doc, &mut w, &process_uuid, &mut uuid);
    stats.counter_values += values;
    stats.memory_events = doc.memory.len();
    let mut skipped: Vec<(String, usize)> =
        doc.skipped.iter().map(|(k, v)| (k.clone(), *v)).collect();
    skipped.sort();
    stats.skipped = skipped;
    (w.out, stats)
}

/// Writes the `[memory]` samples as counter tracks of their process, two per device (`Total
/// Allocated (CPU)`, `Total Reserved (CPU)`, `… (GPU 0)`), in bytes, each in time order; returns
/// how many values it wrote.
fn memory_counters(
    doc: &Doc,
    w: &mut Writer,
    process_uuid: &HashMap<Id, u64>,
    uuid: &mut impl FnMut() -> u64,
) -> usize {
    // (pid, device, which total) → values (time, bytes); tracks in order of first appearance.
    type Key = (Id, StrIx, &'static str);
    let mut tracks: Vec<(Key, Vec<(u64, i64)>)> = Vec::new();
    let mut index: HashMap<Key, usize> = HashMap::new();
    for m in &doc.memory {
        for (which, value) in [
            ("Total Allocated", m.allocated),
            ("Total Reserved", m.reserved),
        ] {
            let Some(value) = value else { continue };
            let key = (m.pid.clone(), m.device, which);
            let i = *index.entry(key.clone()).or_insert_with(|| {
                tracks.push((key, Vec::new()));
                tracks.len() - 1
            });
            tracks[i].1.push((doc.at(m.ts), value));
        }
    }
    let mut n = 0;
    for ((pid, device, which), mut values) in tracks {
        values.sort_by_key(|(ts, _)| *ts);
        let u = uuid();
        let mut counter = Msg::new();
        counter.uint(COUNTER_UNIT, UNIT_SIZE_BYTES);
        let mut d = Msg::new();
        d.uint(track::UUID, u)
            .uint(track::PARENT_UUID, process_uuid[&pid])
            .str(
                track::NAME,
                &format!("{which} ({})", doc.strings.get(device)),
            )
            .msg(COUNTER_DESCRIPTOR, &counter);
        w.track(&d);
        for (ts, bytes) in values {
            let mut te = Msg::new();
            te.uint(event::TYPE, COUNTER_TYPE)
                .uint(event::TRACK_UUID, u)
                .int(COUNTER_VALUE, bytes);
            w.event(ts, None, None, te);
            n += 1;
        }
    }
    n
}

/// `TrackDescriptor.counter` (a `CounterDescriptor`).
const COUNTER_DESCRIPTOR: u32 = 8;
/// `CounterDescriptor.unit`.
const COUNTER_UNIT: u32 = 3;
/// `CounterDescriptor.Unit.UNIT_SIZE_BYTES`.
const UNIT_SIZE_BYTES: u64 = 3;
/// `TrackEvent.TYPE_COUNTER`.
const COUNTER_TYPE: u64 = 4;
/// `TrackEvent.counter_value` (int64).
const COUNTER_VALUE: u32 = 30;
/// `TrackEvent.double_counter_value`.
const DOUBLE_COUNTER_VALUE: u32 = 44;

fn end_slice(w: &mut Writer, track_uuid: u64, ts: u64) {
    let mut te = Msg::new();
    te.uint(event::TYPE, event::SLICE_END)
        .uint(event::TRACK_UUID, track_uuid);
    w.event(ts, None, None, te);
}

/// Deals a row's slices (sorted by start, outer first) into lanes where each nests strictly:
/// returns each lane's slice indices in order.
fn deal_into_lanes(row: &[Slice]) -> Vec<Vec<usize>> {
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    // Per lane, the ends of the slices open at the current start (innermost last).
    let mut open: Vec<Vec<u64>> = Vec::new();
    for (i, s) in row.iter().enumerate() {
        let mut placed = false;
        for (lane, stack) in open.iter_mut().enumerate() {
            while stack.last().is_some_and(|&e| e <= s.start) {
                stack.pop();
            }
            if stack.last().is_none_or(|&e| s.end <= e) {
                stack.push(s.end);
                lanes[lane].push(i);
                placed = true;
                break;
            }
        }
        if !placed {
            open.push(vec![s.end]);
            lanes.push(vec![i]);
        }
    }
    lanes
}

/// Attaches each flow (`s` → `f`, matched by category and id) to the slice enclosing its end on
/// its row: `flow_ids` where it starts, `terminating_flow_ids` where it ends. Returns how many
/// flows got both ends.
fn bind_flows(doc: &Doc, rows: &mut HashMap<RowIx, Vec<Slice>>) -> usize {
    // (category, id) → (start slice, end slice).
    type End = (RowIx, usize);
    let mut pairs: HashMap<(StrIx, StrIx), (Option<End>, Option<End>)> = HashMap::new();
    for f in &doc.flows {
        let ts = doc.at(f.ts);
        let Some(row) = rows.get(&f.row) else {
            continue;
        };
        // The innermost slice containing ts: the last one starting at or before it that ends after.
        let upto = row.partition_point(|s| s.start <= ts);
        let Some(i) = (0..upto).rev().find(|&i| row[i].end >= ts) else {
            continue;
        };
        let e = pairs.entry((f.cat, f.id)).or_default();
        if f.start {
            e.0 = Some((f.row, i));
        } else {
            e.1 = Some((f.row, i));
        }
    }
    let mut n = 0;
    let mut keys: Vec<(StrIx, StrIx)> = pairs.keys().copied().collect();
    keys.sort_by(|a, b| {
        let text = |k: &(StrIx, StrIx)| (doc.strings.get(k.0), doc.strings.get(k.1));
        text(a).cmp(&text(b))
    });
    for k in keys {
        if let (Some((ra, a)), Some((rb, b))) = pairs[&k] {
            n += 1;
            let id = n as u64;
            if let Some(row) = rows.get_mut(&ra) {
                row[a].flow_out.push(id);
            }
            if let Some(row) = rows.get_mut(&rb) {
                row[b].flow_in.push(id);
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::us_text_to_ns;
    use serde_json::json;

    fn slice(start: u64, end: u64) -> Slice {
        Slice {
            start,
            end,
            rec: 0,
            flow_out: Vec::new(),
            flow_in: Vec::new(),
        }
    }

    #[test]
    fn times_are_read_exactly_from_the_text() {
        assert_eq!(
            us_text_to_ns("1712195495519689.047"),
            Some(1_712_195_495_519_689_047)
        );
        assert_eq!(us_text_to_ns("5.5"), Some(5500));
        assert_eq!(us_text_to_ns("7"), Some(7000));
        assert_eq!(us_text_to_ns("0.0004"), Some(0));
        assert_eq!(us_text_to_ns("0.0005"), Some(1));
        assert_eq!(us_text_to_ns("\"12.25\""), Some(12_250));
        assert_eq!(us_text_to_ns("-1.5"), Some(-1500));
        assert_eq!(us_text_to_ns("1.5e3"), Some(1_500_000));
        assert_eq!(us_text_to_ns("x"), None);
        let doc = br#"{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1712195495519689.047, "dur": 63.81}]}"#;
        let (bytes, _) = convert(doc).unwrap();
        // The begin's timestamp varint: 1712195495519689047 exactly.
        let mut want = Vec::new();
        let mut v: u64 = 1_712_195_495_519_689_047;
        while v >= 0x80 {
            want.push((v as u8) | 0x80);
            v >>= 7;
        }
        want.push(v as u8);
        let at = bytes
            .windows(want.len() + 1)
            .any(|w| w[0] == 0x40 && w[1..] == want[..]);
        assert!(at, "exact timestamp not found");
    }

    #[test]
    fn overlapping_slices_go_to_lanes_and_nested_ones_stay() {
        // 0..10 holds 1..4 and 5..9; 8..12 overlaps 5..9 and 0..10; 12..13 follows.
        let row = [
            slice(0, 10),
            slice(1, 4),
            slice(5, 9),
            slice(8, 12),
            slice(12, 13),
        ];
        assert_eq!(deal_into_lanes(&row), vec![vec![0, 1, 2, 4], vec![3]]);
        assert!(deal_into_lanes(&[]).is_empty());
    }

    #[test]
    fn a_small_trace_converts_with_lanes_flows_instants_and_counters() {
        let doc = json!({
            "baseTimeNanoseconds": 1_000_000_000u64,
            "traceEvents": [
                {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
                {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 7, "tid": 7, "ts": 0.0, "dur": 100.0},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": 10.0, "dur": 5.0, "args": {"correlation": 3, "note": "x", "ratio": 0.5, "ok": true}},
                {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 20.0, "dur": 30.0, "args": {"correlation": 3}},
                {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 40.0, "dur": 30.0},
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 7, "tid": 7, "ts": 10.0},
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 0, "tid": 7, "ts": 20.0, "bp": "e"},
                {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 7, "tid": 7, "ts": 50.0, "s": "t"},
                {"ph": "C", "name": "memory", "pid": 7, "tid": 7, "ts": 60.0, "args": {"bytes": 1024}},
                {"ph": "b", "name": "async", "pid": 7, "tid": 7, "ts": 1.0}
            ]
        });
        let (bytes, stats) = convert(&serde_json::to_vec(&doc).unwrap()).unwrap();
        assert_eq!(
            bytes[0], 0x0a,
            "a Trace's packets are field 1, length-delimited"
        );
        assert_eq!(stats.slices, 4);
        assert_eq!(stats.overlap_lanes, 1, "k2 overlaps k1 on the stream");
        assert_eq!(stats.flows, 1);
        assert_eq!(stats.instants, 1);
        assert_eq!(stats.counter_values, 1);
        assert_eq!(stats.skipped, vec![("b".to_string(), 1)]);
        let text = String::from_utf8_lossy(&bytes);
        for name in [
            "python",
            "GPU 0",
            "stream 7",
            "stream 7 (overlap 1)",
            "cudaLaunchKernel",
            "note",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(convert(br#"{"x": 1}"#).is_err());
        assert!(convert(b"[1, 2").is_err());
    }
}
