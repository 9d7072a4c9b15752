//! Kineto JSON → Perfetto `TracePacket`s.
//!
//! Tracks: a process track per CPU process (a `ProcessDescriptor`) with a thread track per thread
//! (`ThreadDescriptor`); a track group per GPU (`GPU N`) with a track per stream. Slices on one
//! track must nest strictly in Perfetto (its JSON importer mis-nests or drops those that overlap),
//! so each row's `X` events are dealt into lanes: an event goes to the first lane where it nests in
//! (or follows) what is open, and lanes past the first are child tracks of the row's track named
//! `… (overlap N)`. Flows (`ac2g`, `fwdbwd`) become `flow_ids` on the slice they start from and
//! `terminating_flow_ids` on the slice they end at; `args` become debug annotations; names and
//! categories are interned; counters (`C`) become counter tracks.

use std::collections::HashMap;
use std::fmt;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::proto::{annotation, event, interned, packet, track, Msg, TRACE_PACKET};

/// The trusted sequence every packet is written on.
const SEQUENCE: u64 = 1;

/// What a conversion wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `X` events written as slices.
    pub slices: usize,
    /// Instant events.
    pub instants: usize,
    /// Counter values.
    pub counter_values: usize,
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

/// A row (`pid`, `tid`), as Kineto writes them: numbers, or strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Id {
    Num(i64),
    Text(String),
}

impl Id {
    fn of(v: &Value) -> Id {
        match v {
            Value::Number(n) => n
                .as_i64()
                .map(Id::Num)
                .unwrap_or_else(|| Id::Text(n.to_string())),
            Value::String(s) => s
                .parse()
                .map(Id::Num)
                .unwrap_or_else(|_| Id::Text(s.clone())),
            other => Id::Text(other.to_string()),
        }
    }

    fn num32(&self) -> Option<i64> {
        match self {
            Id::Num(n) if i32::try_from(*n).is_ok() => Some(*n),
            _ => None,
        }
    }

    fn text(&self) -> String {
        match self {
            Id::Num(n) => n.to_string(),
            Id::Text(s) => s.clone(),
        }
    }
}

const GPU_CATEGORIES: [&str; 5] = [
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "gpu_memory",
];

/// One `X` event.
struct Slice<'a> {
    start: u64,
    end: u64,
    ev: &'a Value,
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

fn annotations(te: &mut Msg, args: Option<&Value>) {
    let Some(Value::Object(map)) = args else {
        return;
    };
    for (k, v) in map {
        let mut a = Msg::new();
        a.str(annotation::NAME, k);
        match v {
            Value::Bool(b) => a.uint(annotation::BOOL, u64::from(*b)),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => a.int(annotation::INT, i),
                (None, Some(u), _) => a.uint(annotation::UINT, u),
                (_, _, Some(f)) => a.double(annotation::DOUBLE, f),
                _ => a.str(annotation::STRING, &n.to_string()),
            },
            Value::String(s) => a.str(annotation::STRING, s),
            other => a.str(annotation::STRING, &other.to_string()),
        };
        te.msg(event::DEBUG_ANNOTATIONS, &a);
    }
}

/// Hidden keys the parser adds to each event: its start and length in exact nanoseconds (Unix
/// epoch), read from the number's text (an `f64` cannot hold an absolute µs time to the ns: Kineto's
/// 2024 traces write `1712195495519689.047`).
const TS_NS: &str = "\u{0}ts_ns";
const DUR_NS: &str = "\u{0}dur_ns";

/// A time in µs, as written (`123`, `123.456789`, `"123.4"`, `1.5e3`), in ns: exact for decimal
/// forms (rounded half up past the third decimal), through `f64` for exponent forms.
fn us_text_to_ns(text: &str) -> Option<i128> {
    let t = text.trim().trim_matches('"');
    if t.contains(['e', 'E']) {
        let us: f64 = t.parse().ok()?;
        return Some((us * 1000.0).round() as i128);
    }
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || !digits(frac) {
        return None;
    }
    let mut ns: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    ns = ns.checked_mul(1000)?;
    let f = frac.as_bytes();
    let mut sub = 0i128;
    for k in 0..3 {
        sub = sub * 10 + f.get(k).map_or(0, |b| i128::from(b - b'0'));
    }
    if f.get(3).is_some_and(|b| *b >= b'5') {
        sub += 1;
    }
    ns += sub;
    Some(if neg { -ns } else { ns })
}

/// Converts a Kineto document (its JSON text). Timestamps are written in nanoseconds since the Unix
/// epoch (`baseTimeNanoseconds` plus `ts`), exactly as the text gives them.
pub fn convert(json: &[u8]) -> Result<(Vec<u8>, Stats), ConvertError> {
    #[derive(serde::Deserialize)]
    struct Top<'a> {
        #[serde(rename = "traceEvents", borrow, default)]
        events: Option<Vec<&'a RawValue>>,
        #[serde(rename = "baseTimeNanoseconds", default)]
        base: Option<Value>,
    }
    #[derive(serde::Deserialize)]
    struct Times<'a> {
        #[serde(borrow, default)]
        ts: Option<&'a RawValue>,
        #[serde(borrow, default)]
        dur: Option<&'a RawValue>,
    }
    let bad = |e: serde_json::Error| ConvertError(format!("not a Kineto trace: {e}"));
    let top: Top<'_> = serde_json::from_slice(json).map_err(bad)?;
    let raw = top
        .events
        .ok_or_else(|| ConvertError("no `traceEvents` array: not a Kineto trace".into()))?;
    let base = top
        .base
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
        .unwrap_or(0);
    let mut events = Vec::with_capacity(raw.len());
    for r in raw {
        let mut v: Value = serde_json::from_str(r.get()).map_err(bad)?;
        let t: Times<'_> = serde_json::from_str(r.get()).unwrap_or(Times {
            ts: None,
            dur: None,
        });
        if let Value::Object(m) = &mut v {
            if let Some(ts) = t.ts.and_then(|x| us_text_to_ns(x.get())) {
                let at = (i128::from(base) + ts).clamp(0, i128::from(u64::MAX)) as u64;
                m.insert(TS_NS.into(), Value::from(at));
            }
            if let Some(d) = t.dur.and_then(|x| us_text_to_ns(x.get())) {
                m.insert(
                    DUR_NS.into(),
                    Value::from(d.clamp(0, i128::from(u64::MAX)) as u64),
                );
            }
        }
        events.push(v);
    }
    convert_events(&events)
}

/// The exact start of an event (see [`TS_NS`]).
fn ts_of(ev: &Value) -> Option<u64> {
    ev.get(TS_NS).and_then(Value::as_u64)
}

fn convert_events(events: &[Value]) -> Result<(Vec<u8>, Stats), ConvertError> {
    let mut stats = Stats::default();
    let mut skipped: HashMap<String, usize> = HashMap::new();
    let mut process_names: HashMap<Id, String> = HashMap::new();
    let mut thread_names: HashMap<(Id, Id), String> = HashMap::new();
    let mut rows: HashMap<(Id, Id), Vec<Slice<'_>>> = HashMap::new();
    let mut instants = Vec::new();
    let mut counters = Vec::new();
    let mut flow_ends = Vec::new();
    let mut gpu_pids: Vec<Id> = Vec::new();
    for ev in events {
        let ph = ev.get("ph").and_then(Value::as_str).unwrap_or("");
        let pid = Id::of(ev.get("pid").unwrap_or(&Value::Null));
        let tid = Id::of(ev.get("tid").unwrap_or(&Value::Null));
        let name = ev.get("name").and_then(Value::as_str).unwrap_or("");
        match ph {
            "M" => {
                let n = ev
                    .pointer("/args/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                match name {
                    "process_name" => {
                        process_names.insert(pid, n);
                    }
                    "thread_name" => {
                        thread_names.insert((pid, tid), n);
                    }
                    _ => {}
                }
            }
            "X" => {
                let Some(start) = ts_of(ev) else {
                    *skipped.entry("X without ts".into()).or_default() += 1;
                    continue;
                };
                let dur_ns = ev.get(DUR_NS).and_then(Value::as_u64).unwrap_or(0);
                if ev
                    .get("cat")
                    .and_then(Value::as_str)
                    .is_some_and(|c| GPU_CATEGORIES.contains(&c))
                    && !gpu_pids.contains(&pid)
                {
                    gpu_pids.push(pid.clone());
                }
                rows.entry((pid, tid)).or_default().push(Slice {
                    start,
                    end: start + dur_ns,
                    ev,
                    flow_out: Vec::new(),
                    flow_in: Vec::new(),
                });
            }
            "i" | "I" => instants.push(((pid, tid), ev)),
            "C" => counters.push((pid, ev)),
            "s" | "f" | "t" => flow_ends.push(((pid, tid), ev)),
            other => *skipped.entry(other.to_string()).or_default() += 1,
        }
    }
    for (pid, name) in &process_names {
        if name.starts_with("GPU") && !gpu_pids.contains(pid) {
            gpu_pids.push(pid.clone());
        }
    }
    for row in rows.values_mut() {
        // Outer slices first at equal starts, so that inner ones nest in them.
        row.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    }
    stats.flows = bind_flows(&flow_ends, &mut rows);

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
    let mut pids: Vec<Id> = rows
        .keys()
        .map(|(p, _)| p.clone())
        .chain(counters.iter().map(|(p, _)| p.clone()))
        .chain(instants.iter().map(|((p, _), _)| p.clone()))
        .collect();
    pids.sort();
    pids.dedup();
    let mut process_uuid: HashMap<Id, u64> = HashMap::new();
    for pid in &pids {
        let u = uuid();
        process_uuid.insert(pid.clone(), u);
        let mut d = Msg::new();
        d.uint(track::UUID, u);
        let gpu = gpu_pids.contains(pid);
        let name = process_names.get(pid).cloned().unwrap_or_else(|| {
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
    let mut keys: Vec<(Id, Id)> = rows.keys().cloned().collect();
    keys.extend(instants.iter().map(|(k, _)| k.clone()));
    keys.sort();
    keys.dedup();
    let mut row_uuid: HashMap<(Id, Id), u64> = HashMap::new();
    let mut row_names: HashMap<(Id, Id), String> = HashMap::new();
    for key in &keys {
        let (pid, tid) = key;
        let u = uuid();
        row_uuid.insert(key.clone(), u);
        let gpu = gpu_pids.contains(pid);
        let name = thread_names.get(key).cloned().unwrap_or_else(|| {
            if gpu {
                format!("stream {}", tid.text())
            } else {
                format!("thread {}", tid.text())
            }
        });
        row_names.insert(key.clone(), name.clone());
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
    let mut row_instants: HashMap<(Id, Id), Vec<(u64, &Value)>> = HashMap::new();
    for (key, ev) in &instants {
        if let Some(ts) = ts_of(ev) {
            row_instants.entry(key.clone()).or_default().push((ts, *ev));
        }
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
        let mut pending: &[(u64, &Value)] = row_instants.get(key).map_or(&[], |v| v.as_slice());
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
                while let Some(((ts, ev), rest)) = pending.split_first() {
                    if *ts >= t {
                        break;
                    }
                    instant(w, track_uuid, *ts, ev);
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
                let mut te = Msg::new();
                te.uint(event::TYPE, event::SLICE_BEGIN)
                    .uint(event::TRACK_UUID, track_uuid);
                annotations(&mut te, s.ev.get("args"));
                for f in &s.flow_out {
                    te.fixed64(event::FLOW_IDS, *f);
                }
                for f in &s.flow_in {
                    te.fixed64(event::TERMINATING_FLOW_IDS, *f);
                }
                w.event(
                    s.start,
                    s.ev.get("name").and_then(Value::as_str),
                    s.ev.get("cat").and_then(Value::as_str),
                    te,
                );
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
    let mut counter_uuid: HashMap<(Id, String), u64> = HashMap::new();
    for (pid, ev) in &counters {
        let Some(ts) = ts_of(ev) else { continue };
        let name = ev.get("name").and_then(Value::as_str).unwrap_or("counter");
        let Some(Value::Object(args)) = ev.get("args") else {
            continue;
        };
        for (k, v) in args {
            let Some(x) = v.as_f64() else { continue };
            let label = if args.len() == 1 {
                name.to_string()
            } else {
                format!("{name}: {k}")
            };
            let u = match counter_uuid.get(&(pid.clone(), label.clone())) {
                Some(u) => *u,
                None => {
                    let u = uuid();
                    let mut d = Msg::new();
                    d.uint(track::UUID, u)
                        .uint(track::PARENT_UUID, process_uuid[pid])
                        .str(track::NAME, &label)
                        .msg(COUNTER_DESCRIPTOR, &Msg::new());
                    w.track(&d);
                    counter_uuid.insert((pid.clone(), label), u);
                    u
                }
            };
            let mut te = Msg::new();
            te.uint(event::TYPE, COUNTER_TYPE)
                .uint(event::TRACK_UUID, u)
                .double(DOUBLE_COUNTER_VALUE, x);
            w.event(ts, None, None, te);
            stats.counter_values += 1;
        }
    }
    let mut skipped: Vec<(String, usize)> = skipped.into_iter().collect();
    skipped.sort();
    stats.skipped = skipped;
    Ok((w.out, stats))
}

/// `TrackDescriptor.counter` (a `CounterDescriptor`).
const COUNTER_DESCRIPTOR: u32 = 8;
/// `TrackEvent.TYPE_COUNTER`.
const COUNTER_TYPE: u64 = 4;
/// `TrackEvent.double_counter_value`.
const DOUBLE_COUNTER_VALUE: u32 = 44;

fn instant(w: &mut Writer, track_uuid: u64, ts: u64, ev: &Value) {
    let mut te = Msg::new();
    te.uint(event::TYPE, event::INSTANT)
        .uint(event::TRACK_UUID, track_uuid);
    annotations(&mut te, ev.get("args"));
    w.event(
        ts,
        ev.get("name").and_then(Value::as_str),
        ev.get("cat").and_then(Value::as_str),
        te,
    );
}

fn end_slice(w: &mut Writer, track_uuid: u64, ts: u64) {
    let mut te = Msg::new();
    te.uint(event::TYPE, event::SLICE_END)
        .uint(event::TRACK_UUID, track_uuid);
    w.event(ts, None, None, te);
}

/// Deals a row's slices (sorted by start, outer first) into lanes where each nests strictly:
/// returns each lane's slice indices in order.
fn deal_into_lanes(row: &[Slice<'_>]) -> Vec<Vec<usize>> {
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
fn bind_flows(ends: &[((Id, Id), &Value)], rows: &mut HashMap<(Id, Id), Vec<Slice<'_>>>) -> usize {
    // (category, id) → (start slice, end slice).
    type End = ((Id, Id), usize);
    let mut pairs: HashMap<(String, String), (Option<End>, Option<End>)> = HashMap::new();
    for (key, ev) in ends {
        let Some(ts) = ts_of(ev) else { continue };
        let Some(row) = rows.get(key) else { continue };
        // The innermost slice containing ts: the last one starting at or before it that ends after.
        let upto = row.partition_point(|s| s.start <= ts);
        let Some(i) = (0..upto).rev().find(|&i| row[i].end >= ts) else {
            continue;
        };
        let cat = ev
            .get("cat")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let id = ev.get("id").map(Value::to_string).unwrap_or_default();
        let e = pairs.entry((cat, id)).or_default();
        match ev.get("ph").and_then(Value::as_str) {
            Some("s") => e.0 = Some((key.clone(), i)),
            _ => e.1 = Some((key.clone(), i)),
        }
    }
    let mut n = 0;
    let mut keys: Vec<_> = pairs.keys().cloned().collect();
    keys.sort();
    for k in keys {
        if let (Some((ra, a)), Some((rb, b))) = pairs[&k].clone() {
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
    use serde_json::json;

    fn slice(start: u64, end: u64) -> Slice<'static> {
        static NULL: Value = Value::Null;
        Slice {
            start,
            end,
            ev: &NULL,
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
