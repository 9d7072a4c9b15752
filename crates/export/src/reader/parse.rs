//! The top level of a trace: string interning, the key scan, metadata and `distributedInfo`.

use super::*;

/// FxHash-style hasher: a few cycles per 8 bytes, fine for trusted-ish keys like event names.
#[derive(Default, Clone, Copy)]
pub(super) struct FxHasher {
    pub(super) hash: u64,
}

pub(super) const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    pub(super) fn add(&mut self, word: u64) {
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

/// The distinct `cat`/`name` strings of a trace, numbered in order of first appearance.
///
/// Each string is at most one value long (the reader's limit); every allocation is made with
/// `try_reserve`, so running out of memory is an error of the read ([`Interner::no_room`]),
/// not an abort.
#[derive(Default)]
pub(super) struct Interner {
    /// Keyed by bytes so that the fast path can look a name up before validating it.
    pub(super) map: HashMap<Box<[u8]>, u32, BuildHasherDefault<FxHasher>>,
    pub(super) strings: Vec<Box<str>>,
    /// Ids (+1; 0 is empty) of recently interned strings by [`quick_hash`]: a trace repeats a
    /// few hundred names, and this finds most of them without hashing a long kernel name whole.
    pub(super) recent: Vec<u32>,
    /// Set when the last string to intern could not be kept: the bytes that were asked for.
    pub(super) no_room: Option<usize>,
}

/// Memory that could not be had for something the reader keeps.
#[derive(Clone, Copy, Debug)]
pub(super) struct NoRoom {
    /// Bytes asked for.
    pub(super) bytes: usize,
    /// What they were for.
    pub(super) what: &'static str,
}

/// A copy of `bytes` made with `try_reserve` (`None` when the allocation fails).
fn try_boxed(bytes: &[u8]) -> Option<Box<[u8]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes.len()).ok()?;
    v.extend_from_slice(bytes);
    Some(v.into_boxed_slice())
}

/// Slots in [`Interner::recent`] (a power of two).
const RECENT: usize = 1024;

/// A cheap hash of a string's length and its first and last eight bytes.
#[inline]
fn quick_hash(b: &[u8]) -> usize {
    let word = |s: &[u8]| {
        let mut w = [0u8; 8];
        w[..s.len()].copy_from_slice(s);
        u64::from_le_bytes(w)
    };
    let n = b.len();
    let (head, tail) = if n >= 8 {
        (word(&b[..8]), word(&b[n - 8..]))
    } else {
        (word(b), 0)
    };
    ((head ^ tail.rotate_left(29) ^ n as u64).wrapping_mul(FX_SEED) >> 40) as usize
}

impl Interner {
    /// The id of `s`, interning it when new; `Err` when it could not be kept (out of memory).
    #[inline]
    pub(super) fn intern(&mut self, s: &str) -> Result<StrId, NoRoom> {
        if let Some(&id) = self.map.get(s.as_bytes()) {
            return Ok(StrId(id));
        }
        self.insert(s)
    }

    /// Interns the text of `bytes`; `None` when they are not UTF-8 or hold a control character
    /// (which a JSON string cannot), or could not be kept (then the serde path, which interns it
    /// again, reports it). Strings already interned were checked, so only a new one is.
    // Always inlined: every `cat` and `name` comes through here (the kept args rarely do).
    #[inline(always)]
    pub(super) fn intern_bytes(&mut self, bytes: &[u8]) -> Option<StrId> {
        let slot = quick_hash(bytes) & (RECENT - 1);
        if let Some(&id) = self.recent.get(slot) {
            if id != 0 && self.strings[(id - 1) as usize].as_bytes() == bytes {
                return Some(StrId(id - 1));
            }
        }
        let id = match self.map.get(bytes) {
            Some(&id) => StrId(id),
            None => {
                if bytes.iter().any(|&b| b < 0x20) {
                    return None;
                }
                self.insert(std::str::from_utf8(bytes).ok()?).ok()?
            }
        };
        if self.recent.is_empty() {
            let mut recent = Vec::new();
            recent.try_reserve_exact(RECENT).ok()?;
            recent.resize(RECENT, 0);
            self.recent = recent;
        }
        self.recent[slot] = id.0 + 1;
        Some(id)
    }

    #[cold]
    fn insert(&mut self, s: &str) -> Result<StrId, NoRoom> {
        let no_room = |bytes| NoRoom {
            bytes,
            what: "an interned name",
        };
        let id = u32::try_from(self.strings.len()).map_err(|_| no_room(s.len()))?;
        let kept = (|| {
            self.strings.try_reserve(1).ok()?;
            self.map.try_reserve(1).ok()?;
            let mut text = String::new();
            text.try_reserve_exact(s.len()).ok()?;
            text.push_str(s);
            let key = try_boxed(s.as_bytes())?;
            Some((text.into_boxed_str(), key))
        })();
        let Some((text, key)) = kept else {
            self.no_room = Some(s.len());
            return Err(no_room(s.len()));
        };
        // A failure the fast path met and the serde path then overcame is no longer the story.
        self.no_room = None;
        self.strings.push(text);
        self.map.insert(key, id);
        Ok(StrId(id))
    }
}

// ---------------------------------------------------------------------------------------------
// Top level

/// Bytes the fast path asks for when an event runs past the buffered data.
const FAST_REFILL: usize = 16 * 1024;

/// What the parser does with each element of `traceEvents`.
pub(super) trait Events {
    /// Reads the event at `input.buf[input.pos]` (not whitespace) and moves past it.
    fn next<R: Read>(&mut self, input: &mut Input<R>, strings: &mut Interner) -> Result<(), Fail>;
}

/// Each event decoded into a [`TraceEvent`] and handed to the callback with the strings so far;
/// the callback answers `Err` when it cannot keep the event (out of memory). The `Vec` is the fast
/// path's buffer for an event's kept args (`kept.rs`), reused so that nothing is allocated per
/// event.
pub(super) struct Decoded<F>(pub(super) F, pub(super) Vec<u8>);

impl<F> Events for Decoded<F>
where
    F: FnMut(TraceEvent, &[Box<str>]) -> Result<(), NoRoom>,
{
    #[inline(always)]
    fn next<R: Read>(&mut self, input: &mut Input<R>, strings: &mut Interner) -> Result<(), Fail> {
        let at = input.offset();
        let event = decode_event(input, strings, &mut self.1)?;
        (self.0)(event, &strings.strings).map_err(|NoRoom { bytes, what }| Fail::NoMemory {
            at,
            bytes,
            what,
        })
    }
}

/// Each event handed to the callback as its JSON text (a complete value, only its structure
/// checked); a serde_json error the callback returns becomes the read's error, at its offset.
pub(super) struct Raw<F>(pub(super) F);

impl<F> Events for Raw<F>
where
    F: FnMut(&[u8]) -> Result<(), serde_json::Error>,
{
    fn next<R: Read>(&mut self, input: &mut Input<R>, _: &mut Interner) -> Result<(), Fail> {
        let Some(len) = input.value_len()? else {
            return Err(Fail::Truncated);
        };
        let slice = &input.buf[input.pos..input.pos + len];
        (self.0)(slice).map_err(|e| Fail::json(slice, input.offset(), e))?;
        input.pos += len;
        Ok(())
    }
}

/// The event at `buf[pos]`: the fast path when it can, else serde_json on the slice.
#[inline(always)]
fn decode_event<R: Read>(
    input: &mut Input<R>,
    strings: &mut Interner,
    kept: &mut Vec<u8>,
) -> Result<TraceEvent, Fail> {
    loop {
        match parse_event(&input.buf[input.pos..input.end], strings, kept) {
            Fast::Done(event, len) => {
                input.check_len(len)?;
                input.pos += len;
                return Ok(event);
            }
            // Asking for at least as much again as is buffered keeps a huge event linear.
            // At the end of the input serde_json reports the truncation.
            Fast::More if input.fill_some(FAST_REFILL.max(input.end - input.pos))? => {}
            Fast::More | Fast::Fallback => break,
        }
    }
    input.parse_value(EventSeed { strings })
}

/// The top-level object: keys, the `traceEvents` array and the other values.
pub(super) struct Parser<R, E> {
    pub(super) input: Input<R>,
    pub(super) strings: Interner,
    pub(super) events: E,
    /// Index of the event being parsed.
    pub(super) index: u64,
    /// Whether the parser is inside the `traceEvents` array.
    pub(super) in_events: bool,
}

#[derive(Default)]
pub(super) struct Header {
    pub(super) rank: Option<i64>,
    pub(super) world_size: Option<i64>,
    pub(super) base_time_ns: Option<i64>,
    pub(super) metadata: Vec<(String, String)>,
}

impl<R: Read, E: Events> Parser<R, E> {
    pub(super) fn run(&mut self) -> Result<Header, Fail> {
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
    pub(super) fn events(&mut self) -> Result<(), Fail> {
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
            self.events.next(&mut self.input, &mut self.strings)?;
            self.index += 1;
        }
    }

    /// The next non-whitespace byte, which must exist.
    #[inline]
    pub(super) fn more(&mut self) -> Result<u8, Fail> {
        self.input.skip_ws()?.ok_or(Fail::Truncated)
    }

    pub(super) fn unexpected(&self, expected: &str) -> Fail {
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

    pub(super) fn error(&self, path: &Path, fail: Fail, gzip: bool) -> ReadError {
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
            // A string the interner could not keep fails inside serde_json, which words it as
            // bad data: say what it was.
            Fail::Syntax { at, .. } if self.strings.no_room.is_some() => (
                at,
                no_memory_message(self.strings.no_room.unwrap_or(0), "an interned name"),
            ),
            Fail::Syntax { at, message } => (at, message),
            Fail::TooLarge { at, limit } => (
                at,
                format!(
                    "a single JSON value (one trace event, or a top-level value) here is longer \
                     than the reader's limit of {}: refused rather than read into memory; if \
                     the trace is genuine, raise the limit (kinetrace: --max-value-size)",
                    size_text(limit)
                ),
            ),
            Fail::NoMemory { at, bytes, what } => (at, no_memory_message(bytes, what)),
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

fn no_memory_message(bytes: usize, what: &str) -> String {
    format!(
        "out of memory: {} for {what} could not be allocated while reading the value here",
        size_text(bytes)
    )
}

/// `n` bytes in words: `64 MiB`, `1 KiB`, else `1000 bytes`.
pub(super) fn size_text(n: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;
    match n {
        0 => "0 bytes".into(),
        n if n % GIB == 0 => format!("{} GiB", n / GIB),
        n if n % MIB == 0 => format!("{} MiB", n / MIB),
        n if n % KIB == 0 => format!("{} KiB", n / KIB),
        n => format!("{n} bytes"),
    }
}

pub(super) enum TopKey {
    TraceEvents,
    Other(String),
}

pub(super) struct TopKeySeed;

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
pub(super) fn parse_distributed_info(text: &str) -> (Option<i64>, Option<i64>) {
    let Ok(serde_json::Value::Object(obj)) = serde_json::from_str::<serde_json::Value>(text) else {
        return (None, None);
    };
    let get = |k: &str| obj.get(k).and_then(value_as_i64);
    (get("rank"), get("world_size"))
}

pub(super) fn value_as_i64(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => {
            n.as_i64().or_else(|| n.as_f64().and_then(f64_to_i64_trunc))
        }
        serde_json::Value::String(s) => parse_int_text(s, false),
        _ => None,
    }
}

pub(super) fn parse_base_time(text: &str) -> Result<Option<i64>, String> {
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
pub(super) struct RawJson<'o> {
    pub(super) out: &'o mut String,
}

impl<'de> DeserializeSeed<'de> for RawJson<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

pub(super) fn push_json_str(out: &mut String, s: &str) {
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

pub(super) struct RawJsonKey<'o> {
    pub(super) out: &'o mut String,
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
