//! Reads Kineto trace files (ours and PyTorch's, plain or gzip) into a compact in-memory form.
//!
//! # How it reads
//!
//! - The input is gzip when it starts with the gzip magic bytes `1f 8b`, whatever its name;
//!   otherwise it is plain JSON. Concatenated gzip members are read as one stream.
//!   [`for_each_event`], [`read_trace`] and [`for_each_event_pipelined`] inflate on a second
//!   thread while the calling thread parses (four recycled 320 KiB buffers between them,
//!   each taken over as the read window, with the unparsed rest of the previous one moved
//!   into the 64 KiB its head leaves free, so inflated bytes are not copied again);
//!   the `_from_reader` functions, whose input need not be `Send`, inflate inline. Inflating
//!   uses zlib-rs (flate2's `zlib-rs` backend, with run-time CPU feature detection).
//! - The JSON is parsed in one streaming pass over a read window. Each event is first read by
//!   a hand-written scanner (`fast.rs`) straight from the window: keys are matched as bytes,
//!   numbers are read eight digits at a time, `cat`/`name` are interned without re-validating
//!   a name seen before, and values no field needs are skipped while being checked against
//!   the JSON grammar. Its values go through the same `Visitor`s as the serde path, and on
//!   anything it does not handle exactly as serde_json would (an escape in a kept string, a
//!   control character, an integer past `u64`, a float out of range, deep nesting, a type the
//!   field does not take, any syntax error, a missing `ph`/`name`/`ts`) it gives up and the
//!   event is parsed the older way: a small structural scanner finds where the value ends and
//!   serde_json parses exactly that slice with custom `DeserializeSeed`/`Visitor`s. So what is
//!   accepted, the values and the error messages are serde_json's. Top-level values other
//!   than `traceEvents` always take the serde path. No `serde_json::Value` is built per event;
//!   the only per-event allocations are new distinct strings and string pids/tids (span rows).
//! - Memory is the event vector plus the interned strings and a 256 KiB read window (320 KiB
//!   pipe buffers when inflating on a second thread; grown only for a single value bigger than
//!   that, and never past [`ReadOptions::max_value_bytes`]), not the file or a DOM.
//!   [`for_each_event`] does not even keep the events; [`ReadOptions::for_each_raw_event`] hands
//!   each event's text to a caller that needs more of it than [`TraceEvent`] holds.
//! - Top-level keys other than `traceEvents` are kept as compact JSON text in
//!   [`Trace::metadata`] (re-serialised in their original key order; these few use small
//!   allocations).
//!
//! # Timestamps
//!
//! `ts` and `dur` are kept as written ([`RawNum::Int`] or [`RawNum::Float`]), in µs, absolute
//! (epoch) or relative to `baseTimeNanoseconds`. [`TraceEvent::ts_unix_ns`] and
//! [`TraceEvent::dur_ns`] convert every variant to ns, rounding float µs to the nearest ns.
//! A float literal is held as an `f64`, as Python's `json` holds it. For base-relative values
//! (< 8·10¹² µs) that is exact to the ns. Absolute float µs (≈ 1.7·10¹⁵ µs, the 2024-04
//! format) only have 0.25 µs resolution in an `f64`, so their sub-µs digits are approximate,
//! as in HTA. Matching Python's value bit for bit also needs serde_json's `float_roundtrip`
//! feature: without it serde_json may round literals with more than 15 significant digits one
//! ulp (0.25 µs here) away from the nearest `f64`.
//!
//! # Leniency
//!
//! Real traces are accepted as they are: `X` events without `args`, `i`/`s`/`f` events without
//! `dur`, `M` events without `ts`, unknown keys, string pids/tids, and numeric args written as
//! ints, floats or strings. `args.stream` follows HTA: a value that is not a number
//! (ROCm's `"0x0"`) becomes `None`. What is rejected: input that is not JSON, a top level that
//! is not an object, a missing `traceEvents` array, an event that is not an object, and an
//! event without `ph`, without `name`, or (except `M`) without `ts`.
//!
//! Errors ([`ReadError`]) name the file and the byte offset in the decompressed JSON.
//!
//! # Limits (hostile input)
//!
//! A value longer than [`ReadOptions::max_value_bytes`] (64 MiB by default) is a [`ReadError`] at
//! the value's first byte, whichever path reads it (the fast scanner, serde_json, a top-level key
//! or value); whitespace between values is skipped without being kept; a long value is scanned
//! once however many reads it arrives in; the read window, the interned names and the events
//! [`read_trace`] keeps grow with `try_reserve`, so running out of memory is a [`ReadError`] too,
//! never an abort (a top-level value's kept text is at most about the limit). HTA's rank search
//! ([`rank_like_hta`]) streams and holds no line. So a gzip bomb costs at most about four times
//! the limit plus what is kept, and time linear in its inflated size.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use flate2::bufread::MultiGzDecoder;
use serde::de::{
    self, DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

/// A number as it appeared in the file: Kineto writers have used integer and float µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RawNum {
    /// An integer literal.
    Int(i64),
    /// A literal with a fraction or exponent.
    Float(f64),
}

impl RawNum {
    /// The value as an `f64` (µs).
    pub fn as_f64(self) -> f64 {
        match self {
            RawNum::Int(v) => v as f64,
            RawNum::Float(v) => v,
        }
    }

    /// Whether the literal had a fraction or exponent.
    pub fn is_float(self) -> bool {
        matches!(self, RawNum::Float(_))
    }

    /// Converts a µs value to ns: integers exactly (saturating), floats to the nearest ns of
    /// the `f64` value (halves away from zero; saturating; a NaN gives 0).
    pub fn us_to_ns(self) -> i64 {
        match self {
            RawNum::Int(us) => us.saturating_mul(1000),
            RawNum::Float(us) => float_us_to_ns(us),
        }
    }
}

/// Nearest ns of a float µs value. Splitting off the integral part first keeps the product
/// exact: `us * 1000.0` alone would round to 256 ns steps for epoch-scale values.
fn float_us_to_ns(us: f64) -> i64 {
    if !us.is_finite() {
        return if us.is_nan() {
            0
        } else if us > 0.0 {
            i64::MAX
        } else {
            i64::MIN
        };
    }
    let whole = us.trunc();
    // Exact (Sterbenz): `whole` and `us` share their exponent or `whole` is 0.
    let frac = us - whole;
    let frac_ns = (frac * 1000.0).round() as i64; // |frac_ns| <= 1000
    (whole as i64).saturating_mul(1000).saturating_add(frac_ns)
}

/// The event phase (`ph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Phase {
    Complete,
    Instant,
    Metadata,
    FlowStart,
    FlowEnd,
    Counter,
    Other,
}

impl Phase {
    /// The phase for a `ph` string: `X`, `i`/`I`, `M`, `s`, `f`, `C`; anything else is
    /// [`Phase::Other`].
    pub fn from_ph(ph: &str) -> Phase {
        match ph {
            "X" => Phase::Complete,
            "i" | "I" => Phase::Instant,
            "M" => Phase::Metadata,
            "s" => Phase::FlowStart,
            "f" => Phase::FlowEnd,
            "C" => Phase::Counter,
            _ => Phase::Other,
        }
    }
}

/// A pid or tid: Kineto writes integers, and strings for span rows.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RowId {
    /// An integer id.
    Int(i64),
    /// A string id (`"Spans"`, `""`).
    Str(Box<str>),
}

/// Index into [`Trace::strings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrId(pub u32);

/// One trace event with the fields analyses use pulled out of `args`.
///
/// A missing `pid`/`tid` reads as `RowId::Int(0)`; an `M` event without `ts` gets
/// `RawNum::Int(0)`. Numeric args accept integers, floats (truncated toward zero, like HTA's
/// `astype(int)`) and strings holding a decimal number; other values read as `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// Phase.
    pub ph: Phase,
    /// `cat`, interned; `None` when absent.
    pub cat: Option<StrId>,
    /// `name`, interned.
    pub name: StrId,
    /// `pid`.
    pub pid: RowId,
    /// `tid`.
    pub tid: RowId,
    /// `ts` exactly as written (µs; absolute or relative to `baseTimeNanoseconds`).
    pub ts: RawNum,
    /// `dur` exactly as written, when present.
    pub dur: Option<RawNum>,
    /// `args.stream` when it is an integer (HTA turns anything else into -1, so this is `None`).
    pub stream: Option<i64>,
    /// `args.correlation`.
    pub correlation: Option<i64>,
    /// `args["External id"]`.
    pub external_id: Option<i64>,
    /// `args.device`.
    pub device: Option<i64>,
    /// `args.bytes`.
    pub bytes: Option<i64>,
    /// `args.wait_on_stream`.
    pub wait_on_stream: Option<i64>,
    /// `args["Total Allocated"]` (memory events).
    pub total_allocated: Option<i64>,
    /// `args["Total Reserved"]` (memory events).
    pub total_reserved: Option<i64>,
    /// `args["Bytes"]` (memory events).
    pub mem_bytes: Option<i64>,
    /// `args["Device Id"]` (memory events).
    pub mem_device: Option<i64>,
    /// `id` of flow events.
    pub flow_id: Option<i64>,
    /// The args that say what an op computed, as one compact JSON object (members in file order),
    /// interned: an op's `Input Dims`, `Input type`, `Input Strides` and `Concrete Inputs`, and a
    /// collective's `Collective name`, `In msg nelems`, `Out msg nelems`, `In split size`,
    /// `Out split size`, `Group size`, `dtype`, `Process Group Name`, `Process Group
    /// Description`, `Process Group Ranks`, `Process Group ID`, `Global rank start` and `Global
    /// rank stride`. `None` when the event has none of them. Calls with equal inputs share one
    /// string. Whitespace is dropped; strings and numbers are written as serde_json writes them.
    pub op_args: Option<StrId>,
}

impl TraceEvent {
    /// Start time in ns since the Unix epoch: `base + ts·1000`, where `base` is the trace's
    /// `baseTimeNanoseconds` ([`Trace::base_time_ns`]; `None` when `ts` is absolute). Float µs
    /// are rounded to the nearest ns. Saturates instead of overflowing.
    pub fn ts_unix_ns(&self, base: Option<i64>) -> i64 {
        self.ts.us_to_ns().saturating_add(base.unwrap_or(0))
    }

    /// Duration in ns (float µs rounded to the nearest ns); 0 when the event has no `dur`.
    pub fn dur_ns(&self) -> i64 {
        self.dur.map_or(0, RawNum::us_to_ns)
    }

    /// Duration in ns, `None` when the event has no `dur`.
    pub fn dur_ns_opt(&self) -> Option<i64> {
        self.dur.map(RawNum::us_to_ns)
    }

    /// End time in ns since the Unix epoch: `ts_unix_ns(base) + dur_ns()`.
    pub fn end_unix_ns(&self, base: Option<i64>) -> i64 {
        self.ts_unix_ns(base).saturating_add(self.dur_ns())
    }
}

/// A parsed trace file.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The file it came from.
    pub path: PathBuf,
    /// `distributedInfo.rank`, when present.
    pub rank: Option<i64>,
    /// `distributedInfo.world_size`, when present.
    pub world_size: Option<i64>,
    /// `baseTimeNanoseconds`, when present (then `ts` values are relative to it).
    pub base_time_ns: Option<i64>,
    /// Interned strings: `cat`, `name` and [`TraceEvent::op_args`].
    pub strings: Vec<Box<str>>,
    /// Events in file order.
    pub events: Vec<TraceEvent>,
    /// Top-level keys other than `traceEvents`, as raw JSON text.
    pub metadata: Vec<(String, String)>,
}

impl Trace {
    /// The text of an interned string.
    pub fn str(&self, id: StrId) -> &str {
        &self.strings[id.0 as usize]
    }

    /// The id of an interned string, if some `cat` or `name` had exactly this text.
    pub fn find_str(&self, s: &str) -> Option<StrId> {
        self.strings
            .iter()
            .position(|t| &**t == s)
            .map(|i| StrId(i as u32))
    }

    /// The compact JSON text of a top-level key other than `traceEvents` (the last one if the
    /// key is repeated).
    pub fn metadata_value(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// An event's start in ns since the Unix epoch, using this trace's `baseTimeNanoseconds`.
    pub fn ts_unix_ns(&self, event: &TraceEvent) -> i64 {
        event.ts_unix_ns(self.base_time_ns)
    }
}

/// Why a trace could not be read.
#[derive(Debug)]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// Byte offset in the (decompressed) JSON, when the problem has a position.
    pub offset: Option<u64>,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(o) => write!(
                f,
                "{}: at byte {}: {}",
                self.path.display(),
                o,
                self.message
            ),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for ReadError {}

/// The default of [`ReadOptions::max_value_bytes`]: 64 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 64 << 20;

/// How traces are read: the reader's limits. The free functions ([`read_trace`],
/// [`for_each_event`], …) read with [`ReadOptions::default`].
///
/// Memory is bounded whatever the input: the read window holds one value at a time, so a value
/// longer than [`ReadOptions::max_value_bytes`] is a [`ReadError`] at the value's offset instead
/// of a window that grows with it (a gzip bomb holding a 4 GiB string, say). Whitespace between
/// values is skipped without being kept, however much of it there is. What grows with the input
/// is only what is kept: the events, the distinct names, the top-level values; the window, the
/// names and the kept events grow with `try_reserve`, so running out of memory is a [`ReadError`]
/// too, never an abort. Peak
/// memory is about four times the limit (the window, serde_json's scratch buffer for a string
/// with escapes, and a kept name's two copies) plus what is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// The longest single JSON value held whole, in bytes (of the decompressed JSON): one
    /// element of `traceEvents`, or one top-level key or value (`traceEvents` itself is never
    /// held whole). Default [`DEFAULT_MAX_VALUE_BYTES`]; the largest event of the real traces
    /// in the test suite is under 100 KB.
    pub max_value_bytes: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
        }
    }
}

impl ReadOptions {
    /// [`read_trace`] with these options.
    pub fn read_trace(&self, path: &Path) -> Result<Trace, ReadError> {
        let file = open(path)?;
        let mut events = Vec::new();
        let mut trace = self.pipelined(path, file, Decoded(keep_into(&mut events), Vec::new()))?;
        trace.events = events;
        Ok(trace)
    }

    /// [`read_trace_from_reader`] with these options.
    pub fn read_trace_from_reader<R: Read>(
        &self,
        path: &Path,
        reader: R,
    ) -> Result<Trace, ReadError> {
        let mut events = Vec::new();
        let mut trace = self.inline(path, reader, Decoded(keep_into(&mut events), Vec::new()))?;
        trace.events = events;
        Ok(trace)
    }

    /// [`for_each_event`] with these options.
    pub fn for_each_event<F>(&self, path: &Path, on_event: F) -> Result<Trace, ReadError>
    where
        F: FnMut(TraceEvent, &[Box<str>]),
    {
        let file = open(path)?;
        self.for_each_event_pipelined(path, file, on_event)
    }

    /// [`for_each_event_from_reader`] with these options.
    pub fn for_each_event_from_reader<R, F>(
        &self,
        path: &Path,
        reader: R,
        mut on_event: F,
    ) -> Result<Trace, ReadError>
    where
        R: Read,
        F: FnMut(TraceEvent, &[Box<str>]),
    {
        let events = Decoded(
            move |event, strings: &[Box<str>]| {
                on_event(event, strings);
                Ok(())
            },
            Vec::new(),
        );
        self.inline(path, reader, events)
    }

    /// [`for_each_event_pipelined`] with these options.
    pub fn for_each_event_pipelined<R, F>(
        &self,
        path: &Path,
        reader: R,
        mut on_event: F,
    ) -> Result<Trace, ReadError>
    where
        R: Read + Send,
        F: FnMut(TraceEvent, &[Box<str>]),
    {
        let events = Decoded(
            move |event, strings: &[Box<str>]| {
                on_event(event, strings);
                Ok(())
            },
            Vec::new(),
        );
        self.pipelined(path, reader, events)
    }

    /// Streams each element of `traceEvents` to `on_event` as its JSON text, for readers that
    /// need more of an event than [`TraceEvent`] holds (the Perfetto converter keeps every
    /// `arg`). The input is read as everywhere else (gzip by magic bytes, concatenated members,
    /// inflated on a second thread, this value limit); the text is a complete JSON value whose
    /// structure was checked, not its grammar: `on_event` parses it, and an error it returns
    /// ends the read as a [`ReadError`] at that position. Returns the rest of the trace, with
    /// [`Trace::events`] and [`Trace::strings`] empty.
    pub fn for_each_raw_event<R, F>(
        &self,
        path: &Path,
        reader: R,
        on_event: F,
    ) -> Result<Trace, ReadError>
    where
        R: Read + Send,
        F: FnMut(&[u8]) -> Result<(), serde_json::Error>,
    {
        self.pipelined(path, reader, Raw(on_event))
    }

    /// Parses on the calling thread only.
    fn inline<R: Read, E: Events>(
        &self,
        path: &Path,
        reader: R,
        events: E,
    ) -> Result<Trace, ReadError> {
        let (source, gzip) = match decoded_stream(reader) {
            Ok(Some(s)) => s,
            Ok(None) => return Err(empty(path)),
            Err(e) => return Err(unreadable(path, e)),
        };
        let input = Input::new(source, self.max_value_bytes);
        parse_source(path, input, gzip, events)
    }

    /// Inflates gzip on a second thread while this one parses (see [`for_each_event_pipelined`]).
    fn pipelined<R: Read + Send, E: Events>(
        &self,
        path: &Path,
        reader: R,
        events: E,
    ) -> Result<Trace, ReadError> {
        let (src, gzip) = match sniff(reader) {
            Ok(Some(s)) => s,
            Ok(None) => return Err(empty(path)),
            Err(e) => return Err(unreadable(path, e)),
        };
        let limit = self.max_value_bytes;
        if !gzip {
            return parse_source(path, Input::new(Box::new(src), limit), false, events);
        }
        let decoder = MultiGzDecoder::new(BufReader::with_capacity(BUF_SIZE, src));
        std::thread::scope(|scope| {
            // The decoder goes over a channel so that it is still here if the thread cannot
            // start.
            let (give, take) = sync_channel(1);
            let (piped, inflater) = pipeline();
            let started = std::thread::Builder::new()
                .name("kinetrace-inflate".into())
                .spawn_scoped(scope, move || {
                    if let Ok(decoder) = take.recv() {
                        inflater.run(decoder);
                    }
                });
            match started {
                Ok(_) => {
                    // The thread holds the receiver until it takes the decoder.
                    let _ = give.send(decoder);
                    // `piped` is dropped when parsing ends, which stops the thread; the scope
                    // then joins it.
                    let input = Input::piped(Box::new(io::empty()) as Source<'_>, piped, limit);
                    parse_source(path, input, true, events)
                }
                Err(_) => parse_source(path, Input::new(Box::new(decoder), limit), true, events),
            }
        })
    }
}

/// A callback that keeps the events in `events`, growing it with `try_reserve`.
fn keep_into(
    events: &mut Vec<TraceEvent>,
) -> impl FnMut(TraceEvent, &[Box<str>]) -> Result<(), NoRoom> + '_ {
    |event, _| {
        if events.len() == events.capacity() && events.try_reserve(1).is_err() {
            return Err(NoRoom {
                bytes: (events.len() + 1).saturating_mul(std::mem::size_of::<TraceEvent>()),
                what: "the events",
            });
        }
        events.push(event);
        Ok(())
    }
}

/// Reads one trace file, plain or gzip (by magic bytes, not extension). Gzip is inflated on a
/// second thread while this one parses. Limits: [`ReadOptions::default`].
pub fn read_trace(path: &Path) -> Result<Trace, ReadError> {
    ReadOptions::default().read_trace(path)
}

/// Reads a trace from any byte stream, plain or gzip (by magic bytes); `path` is only used in
/// [`Trace::path`] and error messages.
pub fn read_trace_from_reader<R: Read>(path: &Path, reader: R) -> Result<Trace, ReadError> {
    ReadOptions::default().read_trace_from_reader(path, reader)
}

/// Streams the events of a trace file to `on_event` in file order, without keeping them.
///
/// `on_event` gets each event and the interned strings so far (index them with
/// [`StrId`]`.0`; every id in the event is already there). Returns the rest of the trace
/// (rank, base time, metadata, all interned strings) with [`Trace::events`] empty.
/// `distributedInfo` may come after `traceEvents`, so the rank is only known at the end.
/// Gzip is inflated on a second thread while this one parses ([`for_each_event_pipelined`]).
pub fn for_each_event<F>(path: &Path, on_event: F) -> Result<Trace, ReadError>
where
    F: FnMut(TraceEvent, &[Box<str>]),
{
    ReadOptions::default().for_each_event(path, on_event)
}

/// [`for_each_event`] over any byte stream, plain or gzip (by magic bytes), on the calling
/// thread only; `path` is only used in [`Trace::path`] and error messages.
pub fn for_each_event_from_reader<R, F>(
    path: &Path,
    reader: R,
    on_event: F,
) -> Result<Trace, ReadError>
where
    R: Read,
    F: FnMut(TraceEvent, &[Box<str>]),
{
    ReadOptions::default().for_each_event_from_reader(path, reader, on_event)
}

/// [`for_each_event_from_reader`], but a gzip stream is inflated on a second (scoped) thread
/// while the calling thread parses: inflating is most of the time of reading a gzip trace, and
/// the two overlap. The threads pass a few fixed 320 KiB buffers back and forth (nothing is
/// allocated per event or per buffer). Plain JSON is parsed on the calling thread. If the
/// thread cannot be started, the stream is inflated inline.
pub fn for_each_event_pipelined<R, F>(
    path: &Path,
    reader: R,
    on_event: F,
) -> Result<Trace, ReadError>
where
    R: Read + Send,
    F: FnMut(TraceEvent, &[Box<str>]),
{
    ReadOptions::default().for_each_event_pipelined(path, reader, on_event)
}

fn empty(path: &Path) -> ReadError {
    ReadError {
        path: path.to_owned(),
        offset: Some(0),
        message: "the file is empty (0 bytes); expected a Kineto trace JSON object".into(),
    }
}

fn unreadable(path: &Path, e: io::Error) -> ReadError {
    ReadError {
        path: path.to_owned(),
        offset: None,
        message: format!("cannot read: {e}"),
    }
}

fn parse_source<E: Events>(
    path: &Path,
    input: Input<Source<'_>>,
    gzip: bool,
    events: E,
) -> Result<Trace, ReadError> {
    let mut parser = Parser {
        input,
        strings: Interner::default(),
        events,
        index: 0,
        in_events: false,
    };
    match parser.run() {
        Ok(header) => Ok(Trace {
            path: path.to_owned(),
            rank: header.rank,
            world_size: header.world_size,
            base_time_ns: header.base_time_ns,
            strings: parser.strings.strings,
            events: Vec::new(),
            metadata: header.metadata,
        }),
        Err(fail) => Err(parser.error(path, fail, gzip)),
    }
}

fn open(path: &Path) -> Result<File, ReadError> {
    File::open(path).map_err(|e| ReadError {
        path: path.to_owned(),
        offset: None,
        message: format!("cannot open: {e}"),
    })
}

mod event;
mod fast;
mod input;
mod kept;
mod parse;
mod rank;

use event::*;
use fast::*;
use input::*;
use kept::*;
use parse::*;
pub use rank::{rank_like_hta, rank_like_hta_from_reader};

#[cfg(test)]
mod tests;
