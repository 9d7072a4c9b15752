//! Reads Kineto trace files (ours and PyTorch's, plain or gzip) into a compact in-memory form.
//!
//! # How it reads
//!
//! - The input is gzip when it starts with the gzip magic bytes `1f 8b`, whatever its name;
//!   otherwise it is plain JSON. Concatenated gzip members are read as one stream.
//! - The JSON is parsed in one streaming pass. A small structural scanner walks the top-level
//!   object and the `traceEvents` array and finds where each value ends; serde_json then
//!   parses exactly that slice with custom `DeserializeSeed`/`Visitor`s (its slice parser is
//!   about twice as fast as its `io::Read` one). No `serde_json::Value` is built per event:
//!   each event becomes a [`TraceEvent`] directly; `args` keys other than the few named by
//!   [`TraceEvent`] are skipped with `IgnoredAny`. `cat` and `name` are interned, so the only
//!   per-event allocations are new distinct strings and string pids/tids (span rows).
//! - Memory is the event vector plus the interned strings and a 256 KiB read window (grown
//!   only for a single value bigger than that), not the file or a DOM. [`for_each_event`]
//!   does not even keep the events.
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

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

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
    /// Interned strings for `cat` and `name`.
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

/// Reads one trace file, plain or gzip (by magic bytes, not extension).
pub fn read_trace(path: &Path) -> Result<Trace, ReadError> {
    let file = open(path)?;
    read_trace_from_reader(path, file)
}

/// Reads a trace from any byte stream, plain or gzip (by magic bytes); `path` is only used in
/// [`Trace::path`] and error messages.
pub fn read_trace_from_reader<R: Read>(path: &Path, reader: R) -> Result<Trace, ReadError> {
    let mut events = Vec::new();
    let mut trace = for_each_event_from_reader(path, reader, |event, _| events.push(event))?;
    trace.events = events;
    Ok(trace)
}

/// Streams the events of a trace file to `on_event` in file order, without keeping them.
///
/// `on_event` gets each event and the interned strings so far (index them with
/// [`StrId`]`.0`; every id in the event is already there). Returns the rest of the trace
/// (rank, base time, metadata, all interned strings) with [`Trace::events`] empty.
/// `distributedInfo` may come after `traceEvents`, so the rank is only known at the end.
pub fn for_each_event<F>(path: &Path, on_event: F) -> Result<Trace, ReadError>
where
    F: FnMut(TraceEvent, &[Box<str>]),
{
    let file = open(path)?;
    for_each_event_from_reader(path, file, on_event)
}

/// [`for_each_event`] over any byte stream, plain or gzip (by magic bytes); `path` is only
/// used in [`Trace::path`] and error messages.
pub fn for_each_event_from_reader<R, F>(
    path: &Path,
    reader: R,
    on_event: F,
) -> Result<Trace, ReadError>
where
    R: Read,
    F: FnMut(TraceEvent, &[Box<str>]),
{
    let (source, gzip) = match decoded_stream(reader) {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(ReadError {
                path: path.to_owned(),
                offset: Some(0),
                message: "the file is empty (0 bytes); expected a Kineto trace JSON object".into(),
            })
        }
        Err(e) => {
            return Err(ReadError {
                path: path.to_owned(),
                offset: None,
                message: format!("cannot read: {e}"),
            })
        }
    };
    let mut parser = Parser {
        input: Input::new(source),
        strings: Interner::default(),
        on_event,
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

// ---------------------------------------------------------------------------------------------
// Input plumbing

/// Size of the buffer the JSON parser reads from (and of the gzip input buffer).
const BUF_SIZE: usize = 256 * 1024;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

type Source<'a> = Box<dyn Read + 'a>;

/// The decompressed byte stream and whether it was gzip; `None` for an empty input.
fn decoded_stream<'a, R: Read + 'a>(mut reader: R) -> io::Result<Option<(Source<'a>, bool)>> {
    let mut magic = [0u8; 2];
    let mut n = 0;
    while n < magic.len() {
        match reader.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if n == 0 {
        return Ok(None);
    }
    let gzip = magic[..n] == GZIP_MAGIC;
    let src = io::Cursor::new(magic).take(n as u64).chain(reader);
    if gzip {
        let decoder = MultiGzDecoder::new(BufReader::with_capacity(BUF_SIZE, src));
        Ok(Some((Box::new(decoder), true)))
    } else {
        Ok(Some((Box::new(src), false)))
    }
}

/// The decompressed JSON in a window that always holds the value being parsed whole.
///
/// The parser finds where each JSON value ends with a cheap structural scan (strings, escapes
/// and bracket depth) and then hands exactly that slice to serde_json, whose slice parser is
/// about twice as fast as its `io::Read` one. A value longer than the window grows it; nothing
/// else is kept. A UTF-8 byte-order mark at the very start is skipped (and counted in offsets).
struct Input<R> {
    inner: R,
    buf: Vec<u8>,
    /// Next unparsed byte.
    pos: usize,
    /// End of the valid data in `buf`.
    end: usize,
    /// Offset of `buf[0]` in the decompressed stream.
    base: u64,
    eof: bool,
    started: bool,
}

impl<R: Read> Input<R> {
    fn new(inner: R) -> Self {
        Input {
            inner,
            buf: vec![0; BUF_SIZE],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            started: false,
        }
    }

    /// Offset of `buf[pos]`.
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Offset just past the data read so far.
    fn offset_end(&self) -> u64 {
        self.base + self.end as u64
    }

    /// Reads more, keeping `buf[pos..end]` (moved to the front). `false` at the end of input.
    #[cold]
    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.end == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        // The first fill takes at least 3 bytes (or all there is) to see a BOM.
        let want = if self.started { self.end + 1 } else { 3 };
        let before = self.end;
        while self.end < want {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if !self.started && self.end > 0 {
            self.started = true;
            if self.buf[..self.end].starts_with(b"\xEF\xBB\xBF") {
                self.pos = 3;
            }
        }
        Ok(self.end > before)
    }

    /// Skips JSON whitespace; the next byte, or `None` at the end of input.
    #[inline]
    fn skip_ws(&mut self) -> io::Result<Option<u8>> {
        loop {
            while self.pos < self.end {
                let b = self.buf[self.pos];
                if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// The length of the JSON value starting at `buf[pos]` (not whitespace), reading more as
    /// needed; `None` when the input ends inside it. Only structure is checked here.
    #[inline]
    fn value_len(&mut self) -> io::Result<Option<usize>> {
        let mut scan = Scan::new(self.buf[self.pos]);
        loop {
            if let Some(len) = scan.advance(&self.buf[self.pos..self.end]) {
                return Ok(Some(len));
            }
            if !self.fill()? {
                return Ok(scan.ends_at_eof().then_some(self.end - self.pos));
            }
        }
    }

    /// Parses the value at `buf[pos]` with `seed` and moves past it.
    #[inline]
    fn parse_value<T, S>(&mut self, seed: S) -> Result<T, Fail>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let Some(len) = self.value_len()? else {
            return Err(Fail::Truncated);
        };
        let slice = &self.buf[self.pos..self.pos + len];
        let mut de = serde_json::Deserializer::from_slice(slice);
        match seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v)) {
            Ok(v) => {
                self.pos += len;
                Ok(v)
            }
            Err(e) => Err(Fail::json(slice, self.offset(), e)),
        }
    }

    /// Lets serde_json describe the value at `buf[pos]` that has the wrong type (or is not
    /// JSON), using `expected` as what should have been there; the offset is the value's.
    fn wrong_value(&mut self, expected: &'static str) -> Fail {
        // serde_json rejects it at its first byte, so what is buffered is enough.
        if self.end - self.pos < 64 {
            let _ = self.fill();
        }
        let at = self.offset();
        let slice = &self.buf[self.pos..self.end];
        let mut de = serde_json::Deserializer::from_slice(slice);
        let message = match (&mut de).deserialize_any(Expect(expected)) {
            Ok(()) => format!("invalid JSON: expected {expected}"),
            Err(e) => match Fail::json(slice, at, e) {
                Fail::Syntax { message, .. } => message,
                other => return other,
            },
        };
        Fail::Syntax { at, message }
    }
}

/// Where a JSON value ends: a resumable scan over bytes that tracks strings (with escapes) and
/// bracket depth. It does not validate; serde_json does that on the slice.
struct Scan {
    /// Bytes of the value scanned so far.
    len: usize,
    depth: u32,
    in_string: bool,
    kind: ScanKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ScanKind {
    Container,
    String,
    Scalar,
}

/// Byte classes outside strings.
const QUOTE: u8 = 1;
const OPEN: u8 = 2;
const CLOSE: u8 = 3;
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'"' as usize] = QUOTE;
    t[b'{' as usize] = OPEN;
    t[b'[' as usize] = OPEN;
    t[b'}' as usize] = CLOSE;
    t[b']' as usize] = CLOSE;
    t
};

impl Scan {
    fn new(first: u8) -> Scan {
        let kind = match first {
            b'{' | b'[' => ScanKind::Container,
            b'"' => ScanKind::String,
            _ => ScanKind::Scalar,
        };
        Scan {
            len: 1,
            depth: u32::from(kind == ScanKind::Container),
            in_string: kind == ScanKind::String,
            kind,
        }
    }

    /// Whether a value cut off by the end of input is complete (a bare scalar).
    fn ends_at_eof(&self) -> bool {
        self.kind == ScanKind::Scalar
    }

    /// Continues over `data` (the value from its first byte, as far as it is buffered);
    /// `Some(length)` once the value ends.
    #[inline]
    fn advance(&mut self, data: &[u8]) -> Option<usize> {
        if self.kind == ScanKind::Scalar {
            while self.len < data.len() {
                if matches!(
                    data[self.len],
                    b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'
                ) {
                    return Some(self.len);
                }
                self.len += 1;
            }
            return None;
        }
        loop {
            if self.in_string {
                let k = find_quote_or_backslash(&data[self.len..])?;
                let i = self.len + k;
                if data[i] == b'\\' {
                    if i + 1 >= data.len() {
                        self.len = i; // resume at the backslash
                        return None;
                    }
                    self.len = i + 2;
                } else {
                    self.len = i + 1;
                    self.in_string = false;
                    if self.kind == ScanKind::String {
                        return Some(self.len);
                    }
                }
            } else {
                loop {
                    let b = *data.get(self.len)?;
                    self.len += 1;
                    match CLASS[b as usize] {
                        QUOTE => {
                            self.in_string = true;
                            break;
                        }
                        OPEN => self.depth += 1,
                        CLOSE => {
                            self.depth -= 1;
                            if self.depth == 0 {
                                return Some(self.len);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Index of the first `"` or `\` in `s`, eight bytes at a time.
#[inline]
fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut chunks = s.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let w = u64::from_le_bytes(w);
        let m = has_zero(w ^ (ONES * u64::from(b'"'))) | has_zero(w ^ (ONES * u64::from(b'\\')));
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|k| i + k)
}

/// A visitor that accepts nothing, so serde_json reports what it found instead.
struct Expect(&'static str);

impl Visitor<'_> for Expect {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A parse failure, turned into a [`ReadError`] by [`Parser::error`].
enum Fail {
    /// Reading or decompressing failed.
    Io(io::Error),
    /// The input ended inside the JSON.
    Truncated,
    /// The input is empty or whitespace.
    NoJson,
    /// Anything else, at an offset.
    Syntax { at: u64, message: String },
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        Fail::Io(e)
    }
}

impl Fail {
    /// A serde_json error on `slice`, which starts at offset `start`.
    fn json(slice: &[u8], start: u64, err: serde_json::Error) -> Fail {
        use serde_json::error::Category;
        let (line, column) = (err.line(), err.column());
        let text = err.to_string();
        let position = format!(" at line {line} column {column}");
        let what = text.strip_suffix(&position).unwrap_or(&text);
        let message = match err.classify() {
            Category::Data => format!("not a valid Kineto trace: {what}"),
            _ => format!("invalid JSON: {what}"),
        };
        Fail::Syntax {
            at: start + offset_in(slice, line, column) as u64,
            message,
        }
    }
}

/// The index in `slice` of serde_json's 1-based `line` and `column` (which points at the
/// offending byte).
fn offset_in(slice: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    if line > 1 {
        let mut newlines = 0;
        for (i, &b) in slice.iter().enumerate() {
            if b == b'\n' {
                newlines += 1;
                if newlines == line - 1 {
                    start = i + 1;
                    break;
                }
            }
        }
    }
    (start + column.saturating_sub(1)).min(slice.len())
}

// ---------------------------------------------------------------------------------------------
// String interning

/// FxHash-style hasher: a few cycles per 8 bytes, fine for trusted-ish keys like event names.
#[derive(Default, Clone, Copy)]
struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits down: hashbrown uses both ends.
        self.hash ^ (self.hash >> 32)
    }
}

#[derive(Default)]
struct Interner {
    map: HashMap<Box<str>, u32, BuildHasherDefault<FxHasher>>,
    strings: Vec<Box<str>>,
}

impl Interner {
    #[inline]
    fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.map.get(s) {
            return StrId(id);
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.into());
        self.map.insert(s.into(), id);
        StrId(id)
    }
}

// ---------------------------------------------------------------------------------------------
// Top level

/// The top-level object: keys, the `traceEvents` array and the other values.
struct Parser<R, F> {
    input: Input<R>,
    strings: Interner,
    on_event: F,
    /// Index of the event being parsed.
    index: u64,
    /// Whether the parser is inside the `traceEvents` array.
    in_events: bool,
}

#[derive(Default)]
struct Header {
    rank: Option<i64>,
    world_size: Option<i64>,
    base_time_ns: Option<i64>,
    metadata: Vec<(String, String)>,
}

impl<R: Read, F: FnMut(TraceEvent, &[Box<str>])> Parser<R, F> {
    fn run(&mut self) -> Result<Header, Fail> {
        match self.input.skip_ws()? {
            None => return Err(Fail::NoJson),
            Some(b'{') => self.input.pos += 1,
            Some(_) => {
                return Err(self
                    .input
                    .wrong_value("a Kineto trace (a JSON object with a `traceEvents` array)"))
            }
        }
        let mut header = Header::default();
        let mut saw_events = false;
        let mut first = true;
        loop {
            let mut b = self.more()?;
            if b == b'}' && first {
                self.input.pos += 1;
                break;
            }
            if !first {
                match b {
                    b'}' => {
                        self.input.pos += 1;
                        break;
                    }
                    b',' => {
                        self.input.pos += 1;
                        b = self.more()?;
                    }
                    _ => return Err(self.unexpected("`,` or `}` after a top-level value")),
                }
            }
            first = false;
            if b != b'"' {
                return Err(self.unexpected("a string key in the top-level object"));
            }
            let key = self.input.parse_value(TopKeySeed)?;
            if self.more()? != b':' {
                return Err(self.unexpected("`:` after a key"));
            }
            self.input.pos += 1;
            let b = self.more()?;
            match key {
                TopKey::TraceEvents => {
                    if saw_events {
                        return Err(Fail::Syntax {
                            at: self.input.offset(),
                            message: "duplicate `traceEvents` key".into(),
                        });
                    }
                    saw_events = true;
                    if b != b'[' {
                        return Err(self.input.wrong_value("an array of trace events"));
                    }
                    self.input.pos += 1;
                    self.in_events = true;
                    self.events()?;
                    self.in_events = false;
                }
                TopKey::Other(name) => {
                    let mut text = String::new();
                    self.input.parse_value(RawJson { out: &mut text })?;
                    match name.as_str() {
                        "distributedInfo" => {
                            let (rank, world) = parse_distributed_info(&text);
                            header.rank = rank;
                            header.world_size = world;
                        }
                        "baseTimeNanoseconds" => {
                            header.base_time_ns =
                                parse_base_time(&text).map_err(|message| Fail::Syntax {
                                    at: self.input.offset(),
                                    message,
                                })?;
                        }
                        _ => {}
                    }
                    header.metadata.push((name, text));
                }
            }
        }
        if !saw_events {
            return Err(Fail::Syntax {
                at: self.input.offset() - 1,
                message: "the top-level object has no `traceEvents` array (not a Kineto trace?)"
                    .into(),
            });
        }
        // Read to the end, which also makes the gzip decoder check its trailer.
        if self.input.skip_ws()?.is_some() {
            return Err(self.unexpected("nothing after the top-level object (trailing data)"));
        }
        Ok(header)
    }

    /// The elements of `traceEvents`, after its `[`.
    fn events(&mut self) -> Result<(), Fail> {
        let mut first = true;
        loop {
            let mut b = self.more()?;
            if b == b']' && first {
                self.input.pos += 1;
                return Ok(());
            }
            if !first {
                match b {
                    b']' => {
                        self.input.pos += 1;
                        return Ok(());
                    }
                    b',' => {
                        self.input.pos += 1;
                        b = self.more()?;
                        if b == b']' {
                            return Err(self.unexpected("another event after `,` (trailing comma)"));
                        }
                    }
                    _ => return Err(self.unexpected("`,` or `]` after an event")),
                }
            }
            first = false;
            let event = self.input.parse_value(EventSeed {
                strings: &mut self.strings,
            })?;
            (self.on_event)(event, &self.strings.strings);
            self.index += 1;
        }
    }

    /// The next non-whitespace byte, which must exist.
    #[inline]
    fn more(&mut self) -> Result<u8, Fail> {
        self.input.skip_ws()?.ok_or(Fail::Truncated)
    }

    fn unexpected(&self, expected: &str) -> Fail {
        let found = self.input.buf[self.input.pos];
        let found = if found.is_ascii_graphic() {
            format!("`{}`", char::from(found))
        } else {
            format!("byte 0x{found:02x}")
        };
        Fail::Syntax {
            at: self.input.offset(),
            message: format!("invalid JSON: expected {expected}, found {found}"),
        }
    }

    fn error(&self, path: &Path, fail: Fail, gzip: bool) -> ReadError {
        let (offset, mut message) = match fail {
            Fail::Io(e) => {
                let what = if gzip {
                    "gzip data is corrupt or truncated"
                } else {
                    "read error"
                };
                (self.input.offset_end(), format!("{what}: {e}"))
            }
            Fail::Truncated => (
                self.input.offset_end(),
                "unexpected end of data: the JSON is truncated".to_owned(),
            ),
            Fail::NoJson => (
                self.input.offset_end(),
                "no JSON data: the (decompressed) input is empty or only whitespace".to_owned(),
            ),
            Fail::Syntax { at, message } => (at, message),
        };
        if self.in_events {
            message.push_str(&format!(" (in traceEvents[{}])", self.index));
        }
        ReadError {
            path: path.to_owned(),
            offset: Some(offset),
            message,
        }
    }
}

enum TopKey {
    TraceEvents,
    Other(String),
}

struct TopKeySeed;

impl<'de> DeserializeSeed<'de> for TopKeySeed {
    type Value = TopKey;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<TopKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for TopKeySeed {
    type Value = TopKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<TopKey, E> {
        Ok(if v == "traceEvents" {
            TopKey::TraceEvents
        } else {
            TopKey::Other(v.to_owned())
        })
    }
}

/// `rank` and `world_size` from the JSON text of `distributedInfo`.
fn parse_distributed_info(text: &str) -> (Option<i64>, Option<i64>) {
    let Ok(serde_json::Value::Object(obj)) = serde_json::from_str::<serde_json::Value>(text) else {
        return (None, None);
    };
    let get = |k: &str| obj.get(k).and_then(value_as_i64);
    (get("rank"), get("world_size"))
}

fn value_as_i64(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => {
            n.as_i64().or_else(|| n.as_f64().and_then(f64_to_i64_trunc))
        }
        serde_json::Value::String(s) => parse_int_text(s, false),
        _ => None,
    }
}

fn parse_base_time(text: &str) -> Result<Option<i64>, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Null) => Ok(None),
        Ok(v) => match value_as_i64(&v) {
            Some(ns) => Ok(Some(ns)),
            None => Err(format!("`baseTimeNanoseconds` is not an integer: {text}")),
        },
        Err(e) => Err(format!("`baseTimeNanoseconds`: {e}")),
    }
}

/// Re-serialises any JSON value compactly into `out`, keeping key order.
struct RawJson<'o> {
    out: &'o mut String,
}

impl<'de> DeserializeSeed<'de> for RawJson<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

fn push_json_str(out: &mut String, s: &str) {
    // Serialising a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

impl<'de> Visitor<'de> for RawJson<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        match serde_json::Number::from_f64(v) {
            Some(n) => self.out.push_str(&n.to_string()),
            None => self.out.push_str("null"),
        }
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        push_json_str(self.out, v);
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.out.push_str("null");
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.out.push('[');
        let mut first = true;
        loop {
            let mark = self.out.len();
            if !first {
                self.out.push(',');
            }
            if seq
                .next_element_seed(RawJson {
                    out: &mut *self.out,
                })?
                .is_none()
            {
                self.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.out.push(']');
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.out.push('{');
        let mut first = true;
        loop {
            let mark = self.out.len();
            if !first {
                self.out.push(',');
            }
            if map
                .next_key_seed(RawJsonKey {
                    out: &mut *self.out,
                })?
                .is_none()
            {
                self.out.truncate(mark);
                break;
            }
            self.out.push(':');
            map.next_value_seed(RawJson {
                out: &mut *self.out,
            })?;
            first = false;
        }
        self.out.push('}');
        Ok(())
    }
}

struct RawJsonKey<'o> {
    out: &'o mut String,
}

impl<'de> DeserializeSeed<'de> for RawJsonKey<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for RawJsonKey<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        push_json_str(self.out, v);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// traceEvents

struct EventSeed<'s> {
    strings: &'s mut Interner,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = TraceEvent;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<TraceEvent, D::Error> {
        d.deserialize_map(self)
    }
}

#[derive(Clone, Copy)]
enum EventKey {
    Ph,
    Cat,
    Name,
    Pid,
    Tid,
    Ts,
    Dur,
    Id,
    Args,
    Other,
}

struct EventKeySeed;

impl<'de> DeserializeSeed<'de> for EventKeySeed {
    type Value = EventKey;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<EventKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for EventKeySeed {
    type Value = EventKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<EventKey, E> {
        Ok(match v {
            "ph" => EventKey::Ph,
            "cat" => EventKey::Cat,
            "name" => EventKey::Name,
            "pid" => EventKey::Pid,
            "tid" => EventKey::Tid,
            "ts" => EventKey::Ts,
            "dur" => EventKey::Dur,
            "id" => EventKey::Id,
            "args" => EventKey::Args,
            _ => EventKey::Other,
        })
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = TraceEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TraceEvent, A::Error> {
        let mut ph = None;
        let mut cat = None;
        let mut name = None;
        let mut pid = None;
        let mut tid = None;
        let mut ts = None;
        let mut dur = None;
        let mut flow_id = None;
        let mut args = ArgFields::default();
        while let Some(key) = map.next_key_seed(EventKeySeed)? {
            match key {
                EventKey::Ph => ph = Some(map.next_value_seed(PhaseSeed)?),
                EventKey::Cat => cat = map.next_value_seed(InternSeed(&mut *self.strings))?,
                EventKey::Name => name = map.next_value_seed(InternSeed(&mut *self.strings))?,
                EventKey::Pid => pid = map.next_value_seed(RowIdSeed)?,
                EventKey::Tid => tid = map.next_value_seed(RowIdSeed)?,
                EventKey::Ts => ts = map.next_value_seed(NumSeed("ts"))?,
                EventKey::Dur => dur = map.next_value_seed(NumSeed("dur"))?,
                EventKey::Id => flow_id = map.next_value_seed(LenientInt { id: true })?,
                EventKey::Args => map.next_value_seed(ArgsSeed(&mut args))?,
                EventKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let ph = ph.ok_or_else(|| de::Error::custom("event has no `ph`"))?;
        let name = name.ok_or_else(|| de::Error::custom("event has no `name`"))?;
        let ts = match ts {
            Some(ts) => ts,
            None if ph == Phase::Metadata => RawNum::Int(0),
            None => return Err(de::Error::custom("event has no `ts`")),
        };
        Ok(TraceEvent {
            ph,
            cat,
            name,
            pid: pid.unwrap_or(RowId::Int(0)),
            tid: tid.unwrap_or(RowId::Int(0)),
            ts,
            dur,
            stream: args.stream,
            correlation: args.correlation,
            external_id: args.external_id,
            device: args.device,
            bytes: args.bytes,
            wait_on_stream: args.wait_on_stream,
            total_allocated: args.total_allocated,
            total_reserved: args.total_reserved,
            mem_bytes: args.mem_bytes,
            mem_device: args.mem_device,
            flow_id,
        })
    }
}

struct PhaseSeed;

impl<'de> DeserializeSeed<'de> for PhaseSeed {
    type Value = Phase;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Phase, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for PhaseSeed {
    type Value = Phase;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a phase string (`ph`)")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Phase, E> {
        Ok(Phase::from_ph(v))
    }
}

/// Interns a `cat`/`name` string; numbers are interned as their text; `null` is `None`.
struct InternSeed<'s>(&'s mut Interner);

impl<'de> DeserializeSeed<'de> for InternSeed<'_> {
    type Value = Option<StrId>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<StrId>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for InternSeed<'_> {
    type Value = Option<StrId>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<StrId>, E> {
        Ok(Some(self.0.intern(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<StrId>, E> {
        Ok(Some(self.0.intern(itoa::Buffer::new().format(v))))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<StrId>, E> {
        Ok(Some(self.0.intern(itoa::Buffer::new().format(v))))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<StrId>, E> {
        Ok(Some(self.0.intern(&v.to_string())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<StrId>, E> {
        Ok(None)
    }
}

/// A pid/tid: integer, string, or `null` (`None`).
struct RowIdSeed;

impl<'de> DeserializeSeed<'de> for RowIdSeed {
    type Value = Option<RowId>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<RowId>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for RowIdSeed {
    type Value = Option<RowId>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer or string pid/tid")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<RowId>, E> {
        Ok(Some(RowId::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<RowId>, E> {
        Ok(Some(match i64::try_from(v) {
            Ok(v) => RowId::Int(v),
            Err(_) => RowId::Str(itoa::Buffer::new().format(v).into()),
        }))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<RowId>, E> {
        Ok(Some(match f64_to_i64_exact(v) {
            Some(i) => RowId::Int(i),
            None => RowId::Str(v.to_string().into()),
        }))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<RowId>, E> {
        Ok(Some(RowId::Str(v.into())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<RowId>, E> {
        Ok(None)
    }
}

/// `ts`/`dur`: a number kept as written; a numeric string is accepted; `null` is `None`.
struct NumSeed(&'static str);

impl<'de> DeserializeSeed<'de> for NumSeed {
    type Value = Option<RawNum>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<RawNum>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for NumSeed {
    type Value = Option<RawNum>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a number of µs for `{}`", self.0)
    }
    #[inline]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<RawNum>, E> {
        Ok(Some(RawNum::Int(v)))
    }
    #[inline]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<RawNum>, E> {
        Ok(Some(match i64::try_from(v) {
            Ok(v) => RawNum::Int(v),
            Err(_) => RawNum::Float(v as f64),
        }))
    }
    #[inline]
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<RawNum>, E> {
        Ok(Some(RawNum::Float(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<RawNum>, E> {
        let t = v.trim();
        if let Ok(i) = t.parse::<i64>() {
            return Ok(Some(RawNum::Int(i)));
        }
        match t.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Some(RawNum::Float(f))),
            _ => Err(E::custom(format_args!(
                "`{}` is not a number: {v:?}",
                self.0
            ))),
        }
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<RawNum>, E> {
        Ok(None)
    }
}

fn f64_to_i64_exact(v: f64) -> Option<i64> {
    // 2^63 is exactly representable; every f64 below it in magnitude converts without overflow.
    if v.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v)
    {
        Some(v as i64)
    } else {
        None
    }
}

fn f64_to_i64_trunc(v: f64) -> Option<i64> {
    if v.is_finite() {
        f64_to_i64_exact(v.trunc())
    } else {
        None
    }
}

/// An integer from text the way pandas' `to_numeric` + `astype(int)` would take it: decimal
/// integers, or decimal floats truncated toward zero. With `hex`, `0x…` is accepted too (flow
/// ids, read as 64-bit two's complement).
fn parse_int_text(s: &str, hex: bool) -> Option<i64> {
    let t = s.trim();
    if let Ok(i) = t.parse::<i64>() {
        return Some(i);
    }
    if hex {
        if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            return u64::from_str_radix(h, 16).ok().map(|u| u as i64);
        }
    }
    t.parse::<f64>().ok().and_then(f64_to_i64_trunc)
}

/// A numeric field that HTA coerces to int: ints, floats (truncated), numeric strings;
/// anything else (`"0x0"`, `null`, arrays, objects, booleans) is `None`.
struct LenientInt {
    /// For flow `id`s: u64 values wrap instead of being dropped, and hex strings count.
    id: bool,
}

impl<'de> DeserializeSeed<'de> for LenientInt {
    type Value = Option<i64>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LenientInt {
    type Value = Option<i64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number")
    }
    #[inline]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<i64>, E> {
        Ok(Some(v))
    }
    #[inline]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<i64>, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Some(i),
            Err(_) if self.id => Some(v as i64),
            Err(_) => None,
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<i64>, E> {
        Ok(f64_to_i64_trunc(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<i64>, E> {
        Ok(parse_int_text(v, self.id))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<i64>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<i64>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<i64>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

#[derive(Default)]
struct ArgFields {
    stream: Option<i64>,
    correlation: Option<i64>,
    external_id: Option<i64>,
    device: Option<i64>,
    bytes: Option<i64>,
    wait_on_stream: Option<i64>,
    total_allocated: Option<i64>,
    total_reserved: Option<i64>,
    mem_bytes: Option<i64>,
    mem_device: Option<i64>,
}

#[derive(Clone, Copy)]
enum ArgKey {
    Stream,
    Correlation,
    ExternalId,
    Device,
    Bytes,
    WaitOnStream,
    TotalAllocated,
    TotalReserved,
    MemBytes,
    MemDevice,
    Other,
}

struct ArgKeySeed;

impl<'de> DeserializeSeed<'de> for ArgKeySeed {
    type Value = ArgKey;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<ArgKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for ArgKeySeed {
    type Value = ArgKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgKey, E> {
        Ok(match v {
            "stream" => ArgKey::Stream,
            "correlation" => ArgKey::Correlation,
            "External id" => ArgKey::ExternalId,
            "device" => ArgKey::Device,
            "bytes" => ArgKey::Bytes,
            "wait_on_stream" => ArgKey::WaitOnStream,
            "Total Allocated" => ArgKey::TotalAllocated,
            "Total Reserved" => ArgKey::TotalReserved,
            "Bytes" => ArgKey::MemBytes,
            "Device Id" => ArgKey::MemDevice,
            _ => ArgKey::Other,
        })
    }
}

/// `args`: an object whose known keys are pulled out; anything else is skipped (HTA ignores
/// an `args` that is not a dict).
struct ArgsSeed<'a>(&'a mut ArgFields);

impl<'de> DeserializeSeed<'de> for ArgsSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ArgsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an `args` object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let a = self.0;
        while let Some(key) = map.next_key_seed(ArgKeySeed)? {
            let slot = match key {
                ArgKey::Stream => &mut a.stream,
                ArgKey::Correlation => &mut a.correlation,
                ArgKey::ExternalId => &mut a.external_id,
                ArgKey::Device => &mut a.device,
                ArgKey::Bytes => &mut a.bytes,
                ArgKey::WaitOnStream => &mut a.wait_on_stream,
                ArgKey::TotalAllocated => &mut a.total_allocated,
                ArgKey::TotalReserved => &mut a.total_reserved,
                ArgKey::MemBytes => &mut a.mem_bytes,
                ArgKey::MemDevice => &mut a.mem_device,
                ArgKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value_seed(LenientInt { id: false })?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// HTA's rank discovery

/// The rank HolisticTraceAnalysis would assign to this file, or `None` where HTA falls back to
/// rank 0 (with a warning).
///
/// HTA (`create_rank_to_trace_dict`) reads the file line by line and takes the first match of
/// the regex `"rank":\s+(\d+)`: there must be at least one whitespace character after the colon,
/// so compact `"rank":1` is not found, and a negative rank does not match. This copies it:
/// gzip input (detected by magic bytes here; HTA goes by the `.gz` name) is split into lines at
/// `\n` only, plain input at `\n`, `\r` and `\r\n` (Python's text mode); `\s` is Python's
/// Unicode whitespace. Differences: only ASCII digits count as `\d`, a rank that does not fit in
/// an `i64` and an unreadable file give `None` (HTA would raise), and invalid UTF-8 does not
/// stop the search.
pub fn rank_like_hta(path: &Path) -> Option<i64> {
    rank_like_hta_from_reader(File::open(path).ok()?)
}

/// [`rank_like_hta`] over any byte stream, plain or gzip (by magic bytes).
pub fn rank_like_hta_from_reader<R: Read>(reader: R) -> Option<i64> {
    let (source, gzip) = decoded_stream(reader).ok()??;
    let mut lines = BufReader::with_capacity(64 * 1024, source);
    let mut line = Vec::new();
    loop {
        line.clear();
        // A read error part-way (truncated gzip) ends the search, as HTA's exception would.
        match lines.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if gzip {
            if let Some(rank) = find_rank(&line) {
                return rank;
            }
        } else {
            for segment in line.split(|&b| b == b'\r') {
                if let Some(rank) = find_rank(segment) {
                    return rank;
                }
            }
        }
    }
}

/// The first match of `"rank":\s+(\d+)` in one line: `Some(parsed)` on a match (`Some(None)`
/// when the digits overflow an `i64`), `None` when there is no match.
fn find_rank(line: &[u8]) -> Option<Option<i64>> {
    const KEY: &[u8] = b"\"rank\":";
    let mut from = 0;
    while let Some(i) = find_bytes(&line[from..], KEY) {
        let mut j = from + i + KEY.len();
        let mut spaces = 0;
        while let Some((c, len)) = decode_char(&line[j..]) {
            if !python_isspace(c) {
                break;
            }
            j += len;
            spaces += 1;
        }
        let digits = line[j..].iter().take_while(|b| b.is_ascii_digit()).count();
        if spaces > 0 && digits > 0 {
            let text = std::str::from_utf8(&line[j..j + digits]).ok()?;
            return Some(text.parse::<i64>().ok());
        }
        from += i + 1;
    }
    None
}

fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        let k = hay[i..=hay.len() - needle.len()]
            .iter()
            .position(|&b| b == first)?;
        i += k;
        if hay[i..].starts_with(needle) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The UTF-8 character at the start of `bytes` and its length; `None` at the end or on an
/// invalid sequence.
fn decode_char(bytes: &[u8]) -> Option<(char, usize)> {
    let b0 = *bytes.first()?;
    let len = match b0 {
        0x00..=0x7f => return Some((char::from(b0), 1)),
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return None,
    };
    let s = std::str::from_utf8(bytes.get(..len)?).ok()?;
    s.chars().next().map(|c| (c, len))
}

/// Python's `str.isspace` (what `\s` matches in a `str` regex).
fn python_isspace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\x1c'..='\x20'
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_us_rounds_to_nearest_ns() {
        assert_eq!(
            RawNum::Float(4458676983543.183).us_to_ns(),
            4_458_676_983_543_183
        );
        assert_eq!(RawNum::Float(1.0005).us_to_ns(), 1_000); // the f64 is just below 1.0005
        assert_eq!(RawNum::Float(1.0015).us_to_ns(), 1_002); // the f64 is just above 1.0015
        assert_eq!(RawNum::Float(-2.5).us_to_ns(), -2_500);
        assert_eq!(RawNum::Float(0.0004).us_to_ns(), 0);
        assert_eq!(
            RawNum::Int(1_682_725_898_236_567).us_to_ns(),
            1_682_725_898_236_567_000
        );
        assert_eq!(RawNum::Float(f64::NAN).us_to_ns(), 0);
        assert_eq!(RawNum::Float(1e300).us_to_ns(), i64::MAX);
        assert_eq!(RawNum::Int(i64::MIN).us_to_ns(), i64::MIN);
    }

    #[test]
    fn rank_regex() {
        assert_eq!(find_rank(br#"{"rank": 3,"#), Some(Some(3)));
        assert_eq!(find_rank(br#"{"rank":3,"#), None);
        assert_eq!(find_rank(br#"{"rank": -3,"#), None);
        assert_eq!(
            find_rank(br#"{"rank":3, "x": {"rank":  17}"#),
            Some(Some(17))
        );
        assert_eq!(find_rank("\"rank\":\u{a0}\t 42".as_bytes()), Some(Some(42)));
        assert_eq!(find_rank(b"\"rank\":\x1f5"), Some(Some(5)));
        assert_eq!(find_rank(b"\"rank\": 99999999999999999999"), Some(None));
        assert_eq!(find_rank(b"\"rank\": \n"), None);
    }

    #[test]
    fn find_bytes_works() {
        assert_eq!(find_bytes(b"aab", b"ab"), Some(1));
        assert_eq!(find_bytes(b"a", b"ab"), None);
        assert_eq!(find_bytes(b"", b"ab"), None);
        assert_eq!(find_bytes(b"xxab", b"ab"), Some(2));
    }
}
