//! Kineto JSON → the compact records the converter keeps.
//!
//! The input goes through `kinetrace-export`'s reader ([`ReadOptions::for_each_raw_event`]): gzip
//! by magic bytes, concatenated gzip members, inflating on a second thread, and its limits (a
//! value longer than the limit is an error naming the file and offset, never a window that grows
//! with it). Each event's text is parsed on its own and reduced at once to what the converter
//! writes: times read exactly from their text, names and categories interned, `args` already
//! encoded as debug annotations; the event's JSON tree is dropped before the next one is read. So
//! memory is the records (a few dozen bytes per event plus its encoded args), not the document.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::path::Path;

use kinetrace_export::reader::ReadOptions;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::proto::{annotation, event, Msg};

/// A row (`pid`, `tid`), as Kineto writes them: numbers, or strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Id {
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

    pub(crate) fn num32(&self) -> Option<i64> {
        match self {
            Id::Num(n) if i32::try_from(*n).is_ok() => Some(*n),
            _ => None,
        }
    }

    pub(crate) fn text(&self) -> String {
        match self {
            Id::Num(n) => n.to_string(),
            Id::Text(s) => s.clone(),
        }
    }
}

/// Categories of GPU rows: their `pid` is a GPU's.
const GPU_CATEGORIES: [&str; 5] = [
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "gpu_memory",
];

/// Index into [`Doc::rows`].
pub(crate) type RowIx = u32;
/// Index into [`Doc::strings`].
pub(crate) type StrIx = u32;

/// An `X` event.
pub(crate) struct SliceRec {
    pub row: RowIx,
    /// Start in ns, without the base time (which may come after `traceEvents`).
    pub start: i128,
    pub dur: u64,
    pub name: Option<StrIx>,
    pub cat: Option<StrIx>,
    /// Its `args` as encoded debug annotations, in [`Doc::annotations`].
    pub args: Range<usize>,
}

/// An `i`/`I` event (other than a memory sample).
pub(crate) struct InstantRec {
    pub row: RowIx,
    pub ts: i128,
    pub name: Option<StrIx>,
    pub cat: Option<StrIx>,
    pub args: Range<usize>,
}

/// One numeric arg of a `C` event: a value on the counter track `label` of process `pid`.
pub(crate) struct CounterRec {
    pub pid: Id,
    pub ts: i128,
    pub label: StrIx,
    pub value: f64,
}

/// A flow end (`s`, `f`, `t`).
pub(crate) struct FlowRec {
    pub row: RowIx,
    pub ts: i128,
    /// `cat` and the JSON text of `id`: the pair that matches a start with its end.
    pub cat: StrIx,
    pub id: StrIx,
    pub start: bool,
}

/// A `[memory]` instant: PyTorch's allocator totals after an allocation or a free.
pub(crate) struct MemRec {
    pub pid: Id,
    pub ts: i128,
    /// The device, as a track label: `CPU`, `GPU 0`, …
    pub device: StrIx,
    pub allocated: Option<i64>,
    pub reserved: Option<i64>,
}

/// Interned strings.
#[derive(Default)]
pub(crate) struct Strings {
    map: HashMap<Box<str>, StrIx>,
    list: Vec<Box<str>>,
}

impl Strings {
    pub(crate) fn id(&mut self, s: &str) -> StrIx {
        if let Some(&i) = self.map.get(s) {
            return i;
        }
        let i = self.list.len() as StrIx;
        self.list.push(s.into());
        self.map.insert(s.into(), i);
        i
    }

    pub(crate) fn get(&self, i: StrIx) -> &str {
        &self.list[i as usize]
    }
}

/// What the converter keeps of a trace.
#[derive(Default)]
pub(crate) struct Doc {
    pub strings: Strings,
    /// Encoded debug annotations of every slice and instant, back to back.
    pub annotations: Vec<u8>,
    /// Distinct rows, in order of first appearance.
    pub rows: Vec<(Id, Id)>,
    row_ix: HashMap<(Id, Id), RowIx>,
    pub slices: Vec<SliceRec>,
    pub instants: Vec<InstantRec>,
    /// Rows that have instants (in the order their first instant came).
    pub instant_rows: Vec<RowIx>,
    pub counters: Vec<CounterRec>,
    pub flows: Vec<FlowRec>,
    pub memory: Vec<MemRec>,
    pub process_names: HashMap<Id, String>,
    pub thread_names: HashMap<(Id, Id), String>,
    /// Pids of GPU rows (and of processes named `GPU…`).
    pub gpu_pids: Vec<Id>,
    /// Events not converted, by phase (or reason).
    pub skipped: HashMap<String, usize>,
    /// `baseTimeNanoseconds` (0 when absent).
    pub base_ns: i128,
}

impl Doc {
    fn row(&mut self, pid: Id, tid: Id) -> RowIx {
        let key = (pid, tid);
        if let Some(&i) = self.row_ix.get(&key) {
            return i;
        }
        let i = self.rows.len() as RowIx;
        self.rows.push(key.clone());
        self.row_ix.insert(key, i);
        i
    }

    fn annotate(&mut self, args: Option<&Value>) -> Range<usize> {
        let mut m = Msg::new();
        annotations(&mut m, args);
        let start = self.annotations.len();
        self.annotations.extend_from_slice(m.as_bytes());
        start..self.annotations.len()
    }

    /// An absolute time in ns since the Unix epoch (clamped to `u64`).
    pub(crate) fn at(&self, rel: i128) -> u64 {
        (self.base_ns + rel).clamp(0, i128::from(u64::MAX)) as u64
    }

    /// One event's JSON.
    fn add(&mut self, text: &[u8]) -> Result<(), serde_json::Error> {
        #[derive(serde::Deserialize)]
        struct Times<'a> {
            #[serde(borrow, default)]
            ts: Option<&'a RawValue>,
            #[serde(borrow, default)]
            dur: Option<&'a RawValue>,
        }
        let ev: Value = serde_json::from_slice(text)?;
        let t: Times<'_> = serde_json::from_slice(text).unwrap_or(Times {
            ts: None,
            dur: None,
        });
        let ts = t.ts.and_then(|x| us_text_to_ns(x.get()));
        let dur = t
            .dur
            .and_then(|x| us_text_to_ns(x.get()))
            .map(|d| d.clamp(0, i128::from(u64::MAX)) as u64);
        let ph = ev.get("ph").and_then(Value::as_str).unwrap_or("");
        let pid = Id::of(ev.get("pid").unwrap_or(&Value::Null));
        let tid = Id::of(ev.get("tid").unwrap_or(&Value::Null));
        let name = ev.get("name").and_then(Value::as_str);
        let cat = ev.get("cat").and_then(Value::as_str);
        match ph {
            "M" => {
                let n = ev
                    .pointer("/args/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                match name.unwrap_or("") {
                    "process_name" => {
                        self.process_names.insert(pid, n);
                    }
                    "thread_name" => {
                        self.thread_names.insert((pid, tid), n);
                    }
                    _ => {}
                }
            }
            "X" => {
                let Some(start) = ts else {
                    *self.skipped.entry("X without ts".into()).or_default() += 1;
                    return Ok(());
                };
                if cat.is_some_and(|c| GPU_CATEGORIES.contains(&c)) && !self.gpu_pids.contains(&pid)
                {
                    self.gpu_pids.push(pid.clone());
                }
                let row = self.row(pid, tid);
                let args = self.annotate(ev.get("args"));
                let rec = SliceRec {
                    row,
                    start,
                    dur: dur.unwrap_or(0),
                    name: name.map(|n| self.strings.id(n)),
                    cat: cat.map(|c| self.strings.id(c)),
                    args,
                };
                self.slices.push(rec);
            }
            "i" | "I" => {
                if let Some(mem) = memory_sample(&ev) {
                    // A memory sample without a time cannot be drawn; it is dropped as an
                    // instant without one is.
                    if let Some(ts) = ts {
                        let device = self.strings.id(&mem.device);
                        self.memory.push(MemRec {
                            pid,
                            ts,
                            device,
                            allocated: mem.allocated,
                            reserved: mem.reserved,
                        });
                    }
                    return Ok(());
                }
                let row = self.row(pid, tid);
                if !self.instant_rows.contains(&row) {
                    self.instant_rows.push(row);
                }
                if let Some(ts) = ts {
                    let args = self.annotate(ev.get("args"));
                    let rec = InstantRec {
                        row,
                        ts,
                        name: name.map(|n| self.strings.id(n)),
                        cat: cat.map(|c| self.strings.id(c)),
                        args,
                    };
                    self.instants.push(rec);
                }
            }
            "C" => {
                let (Some(ts), Some(Value::Object(args))) = (ts, ev.get("args")) else {
                    return Ok(());
                };
                let name = name.unwrap_or("counter");
                for (k, v) in args {
                    let Some(value) = v.as_f64() else { continue };
                    let label = if args.len() == 1 {
                        name.to_string()
                    } else {
                        format!("{name}: {k}")
                    };
                    let label = self.strings.id(&label);
                    self.counters.push(CounterRec {
                        pid: pid.clone(),
                        ts,
                        label,
                        value,
                    });
                }
            }
            "s" | "f" | "t" => {
                let Some(ts) = ts else { return Ok(()) };
                let row = self.row(pid, tid);
                let cat = self.strings.id(cat.unwrap_or(""));
                let id = ev.get("id").map(Value::to_string).unwrap_or_default();
                let id = self.strings.id(&id);
                self.flows.push(FlowRec {
                    row,
                    ts,
                    cat,
                    id,
                    start: ph == "s",
                });
            }
            other => *self.skipped.entry(other.to_string()).or_default() += 1,
        }
        Ok(())
    }
}

/// The totals of a `[memory]` event and its device.
struct MemorySample {
    device: String,
    allocated: Option<i64>,
    reserved: Option<i64>,
}

/// PyTorch's `[memory]` instants (`profile_memory=True`; kinetrace's `--memory` writes the same):
/// `args` holds `Total Allocated` and `Total Reserved` (bytes, after this allocation or free),
/// `Device Type` (c10's: 0 CPU, 1 CUDA, which ROCm builds use too) and `Device Id` (-1 for the
/// CPU). `None` for anything else, or one without either total.
fn memory_sample(ev: &Value) -> Option<MemorySample> {
    if ev.get("name").and_then(Value::as_str) != Some("[memory]") {
        return None;
    }
    let args = ev.get("args")?;
    let int = |k: &str| {
        let v = args.get(k)?;
        v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))
    };
    let (allocated, reserved) = (int("Total Allocated"), int("Total Reserved"));
    if allocated.is_none() && reserved.is_none() {
        return None;
    }
    let id = int("Device Id").unwrap_or(-1);
    let device = match int("Device Type") {
        Some(0) => "CPU".to_string(),
        Some(1) | Some(6) => format!("GPU {id}"),
        None if id < 0 => "CPU".to_string(),
        None => format!("GPU {id}"),
        Some(t) => format!("device type {t} id {id}"),
    };
    Some(MemorySample {
        device,
        allocated,
        reserved,
    })
}

/// Encodes `args` as debug annotations (fields of a `TrackEvent`).
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

/// A time in µs, as written (`123`, `123.456789`, `"123.4"`, `1.5e3`), in ns: exact for decimal
/// forms (rounded half up past the third decimal), through `f64` for exponent forms. An `f64`
/// cannot hold an absolute µs time to the ns: Kineto's 2024 traces write `1712195495519689.047`.
pub(crate) fn us_text_to_ns(text: &str) -> Option<i128> {
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

/// Reads a Kineto trace (plain or gzip) from `input` into a [`Doc`]; `name` names it in errors,
/// which are the reader's (`name: at byte N: …`).
pub(crate) fn read_doc<R: Read + Send>(
    name: &Path,
    input: R,
    read: &ReadOptions,
) -> Result<Doc, kinetrace_export::ReadError> {
    let mut doc = Doc::default();
    let trace = read.for_each_raw_event(name, input, |text| doc.add(text))?;
    doc.base_ns = i128::from(trace.base_time_ns.unwrap_or(0));
    let gpu_named: Vec<Id> = doc
        .process_names
        .iter()
        .filter(|(pid, name)| name.starts_with("GPU") && !doc.gpu_pids.contains(pid))
        .map(|(pid, _)| pid.clone())
        .collect();
    doc.gpu_pids.extend(gpu_named);
    Ok(doc)
}
