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

#[derive(Default)]
pub(super) struct Interner {
    /// Keyed by bytes so that the fast path can look a name up before validating it.
    pub(super) map: HashMap<Box<[u8]>, u32, BuildHasherDefault<FxHasher>>,
    pub(super) strings: Vec<Box<str>>,
    /// Ids (+1; 0 is empty) of recently interned strings by [`quick_hash`]: a trace repeats a
    /// few hundred names, and this finds most of them without hashing a long kernel name whole.
    pub(super) recent: Vec<u32>,
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
    #[inline]
    pub(super) fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.map.get(s.as_bytes()) {
            return StrId(id);
        }
        self.insert(s)
    }

    /// Interns the text of `bytes`; `None` when they are not UTF-8 or hold a control character
    /// (which a JSON string cannot). Strings already interned were checked, so only a new one is.
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
                self.insert(std::str::from_utf8(bytes).ok()?)
            }
        };
        if self.recent.is_empty() {
            self.recent = vec![0; RECENT];
        }
        self.recent[slot] = id.0 + 1;
        Some(id)
    }

    #[cold]
    fn insert(&mut self, s: &str) -> StrId {
        let id = self.strings.len() as u32;
        self.strings.push(s.into());
        self.map.insert(s.as_bytes().into(), id);
        StrId(id)
    }
}

// ---------------------------------------------------------------------------------------------
// Top level

/// Bytes the fast path asks for when an event runs past the buffered data.
const FAST_REFILL: usize = 16 * 1024;

/// The top-level object: keys, the `traceEvents` array and the other values.
pub(super) struct Parser<R, F> {
    pub(super) input: Input<R>,
    pub(super) strings: Interner,
    pub(super) on_event: F,
    /// Index of the event being parsed.
    pub(super) index: u64,
    /// Whether the parser is inside the `traceEvents` array.
    pub(super) in_events: bool,
    /// The fast path's buffer for an event's kept args (`kept.rs`), reused so that nothing is
    /// allocated per event.
    pub(super) kept: Vec<u8>,
}

#[derive(Default)]
pub(super) struct Header {
    pub(super) rank: Option<i64>,
    pub(super) world_size: Option<i64>,
    pub(super) base_time_ns: Option<i64>,
    pub(super) metadata: Vec<(String, String)>,
}

impl<R: Read, F: FnMut(TraceEvent, &[Box<str>])> Parser<R, F> {
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
            let event = self.event()?;
            (self.on_event)(event, &self.strings.strings);
            self.index += 1;
        }
    }

    /// The event at `buf[pos]`: the fast path when it can, else serde_json on the slice.
    #[inline]
    fn event(&mut self) -> Result<TraceEvent, Fail> {
        loop {
            let input = &mut self.input;
            match parse_event(
                &input.buf[input.pos..input.end],
                &mut self.strings,
                &mut self.kept,
            ) {
                Fast::Done(event, len) => {
                    input.pos += len;
                    return Ok(event);
                }
                // Asking for at least as much again as is buffered keeps a huge event linear.
                // At the end of the input serde_json reports the truncation.
                Fast::More if input.fill_some(FAST_REFILL.max(input.end - input.pos))? => {}
                Fast::More | Fast::Fallback => break,
            }
        }
        self.input.parse_value(EventSeed {
            strings: &mut self.strings,
        })
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
