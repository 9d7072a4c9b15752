//! The fast path for one event: a hand-written scanner over the buffered bytes that handles the
//! shapes Kineto writers produce and gives up on anything else.
//!
//! Parsing every event with serde_json cost a structural pre-scan (to find the slice) plus
//! serde's own pass, with a visitor call per key. This reads the event once, straight from the
//! read window, matches keys as bytes, interns `cat`/`name` without re-validating a string it
//! has seen, and skips values no analysis reads without building anything.
//!
//! It is only ever an optimisation. Its values go through the same visitors as the serde path
//! (`NumSeed`, `LenientInt`, `RowIdSeed`, `InternSeed`, `PhaseSeed`), so they are converted the
//! same way, and whenever it meets something it does not handle exactly like serde_json would
//! (an escape in a string it keeps, a control character, a number with more than 19 digits or
//! out of the `f64` range, nesting deeper than [`MAX_DEPTH`], a container where a number is
//! expected, any syntax error, a missing `ph`/`name`/`ts`), it answers [`Fast::Fallback`] and the
//! caller parses the same bytes with serde_json, which accepts or reports exactly as before.
//! It never accepts what serde_json would reject: every skipped value is checked against the
//! JSON grammar as serde_json's `IgnoredAny` checks it.

use super::*;

/// What the fast path made of the bytes at the start of an event.
// Returned by value once per event and never stored: boxing the event would allocate per event.
#[allow(clippy::large_enum_variant)]
pub(super) enum Fast {
    /// The event and its length in bytes.
    Done(TraceEvent, usize),
    /// The buffered bytes end inside the event: read more and try again.
    More,
    /// Not handled here: parse it with serde_json.
    Fallback,
}

#[derive(Clone, Copy)]
enum Stop {
    More,
    Fallback,
}

type R<T> = Result<T, Stop>;

/// Nesting the skipper follows before giving up (serde_json's own limit is 128 levels).
const MAX_DEPTH: u32 = 64;

/// Parses the event object at the start of `data` (which must start at its `{`, or the answer
/// is [`Fast::Fallback`]). Names are interned into `strings` as they are met, in the same order
/// serde would intern them, so a fallback after some were interned changes nothing.
/// `kept` is the buffer for the event's kept args (`kept.rs`), reused from event to event.
pub(super) fn parse_event(data: &[u8], strings: &mut Interner, kept: &mut Vec<u8>) -> Fast {
    let mut c = Cur { s: data, i: 0 };
    if !kept.is_empty() {
        // What an event that fell back or was cut off left.
        kept.clear();
    }
    match c.event(strings, kept) {
        Ok(ev) => Fast::Done(ev, c.i),
        Err(Stop::More) => Fast::More,
        Err(Stop::Fallback) => Fast::Fallback,
    }
}

/// A JSON scalar as serde_json's `deserialize_any` would hand it to a visitor.
enum Scalar<'a> {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    /// A string without escapes, valid UTF-8.
    Str(&'a str),
}

impl Scalar<'_> {
    /// Feeds the scalar to `v` the way serde_json's `deserialize_any` does; a visitor error
    /// (a type the visitor rejects) falls back so that serde_json words the error.
    #[inline]
    fn feed<'de, V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        let r: Result<V::Value, de::value::Error> = match self {
            Scalar::Null => v.visit_unit(),
            Scalar::Bool(b) => v.visit_bool(b),
            Scalar::U64(n) => v.visit_u64(n),
            Scalar::I64(n) => v.visit_i64(n),
            Scalar::F64(n) => v.visit_f64(n),
            Scalar::Str(s) => v.visit_str(s),
        };
        r.map_err(|_| Stop::Fallback)
    }
}

struct Cur<'a> {
    s: &'a [u8],
    i: usize,
}

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl<'a> Cur<'a> {
    #[inline]
    fn peek(&self) -> R<u8> {
        self.s.get(self.i).copied().ok_or(Stop::More)
    }

    /// Skips whitespace; the next byte.
    #[inline]
    fn ws(&mut self) -> R<u8> {
        loop {
            let b = self.peek()?;
            if !is_ws(b) {
                return Ok(b);
            }
            self.i += 1;
        }
    }

    #[inline]
    fn expect(&mut self, want: u8) -> R<()> {
        if self.ws()? == want {
            self.i += 1;
            Ok(())
        } else {
            Err(Stop::Fallback)
        }
    }

    /// The bytes of a string without escapes, after its opening quote (which `self.i` is past);
    /// leaves `self.i` after the closing quote. An escape or control character falls back.
    #[inline]
    fn plain_str(&mut self) -> R<&'a [u8]> {
        let start = self.i;
        let k = find_special(&self.s[start..]).ok_or(Stop::More)?;
        let end = start + k;
        if self.s[end] != b'"' {
            return Err(Stop::Fallback);
        }
        self.i = end + 1;
        Ok(&self.s[start..end])
    }

    /// Skips a string after its opening quote, checking escapes as serde_json's `ignore_str`
    /// does (no UTF-8 check: serde_json does none on strings it ignores).
    fn skip_str(&mut self) -> R<()> {
        loop {
            let k = find_special(&self.s[self.i..]).ok_or(Stop::More)?;
            let j = self.i + k;
            match self.s[j] {
                b'"' => {
                    self.i = j + 1;
                    return Ok(());
                }
                b'\\' => {
                    let e = *self.s.get(j + 1).ok_or(Stop::More)?;
                    match e {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i = j + 2,
                        b'u' => {
                            let hex = self.s.get(j + 2..j + 6).ok_or(Stop::More)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(Stop::Fallback);
                            }
                            self.i = j + 6;
                        }
                        _ => return Err(Stop::Fallback),
                    }
                }
                _ => return Err(Stop::Fallback), // a control character
            }
        }
    }

    /// A number at `self.i` (a `-` or a digit), converted as serde_json converts it.
    // Always inlined: `scalar` is the hot caller (every ts, dur, id and numeric arg), and a call
    // there costs more than the copy `canon` gets.
    #[inline(always)]
    fn number(&mut self) -> R<Scalar<'a>> {
        let s = self.s;
        let start = self.i;
        let neg = s[start] == b'-';
        let int_start = start + usize::from(neg);
        // Integer part: `0` or [1-9][0-9]*.
        let (int_end, int_value) = digits(s, int_start)?;
        let n_int = int_end - int_start;
        if n_int == 0 || (n_int > 1 && s[int_start] == b'0') {
            return Err(Stop::Fallback);
        }
        let mut i = int_end;
        if !matches!(s[i], b'.' | b'e' | b'E') {
            self.i = i;
            // serde_json goes on in f64 past u64::MAX.
            let mant = if n_int < 20 {
                int_value
            } else {
                s[int_start..int_end]
                    .iter()
                    .try_fold(0u64, |m, &d| {
                        m.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                    })
                    .ok_or(Stop::Fallback)?
            };
            return Ok(if neg {
                // serde_json: `-0` and magnitudes past i64 become floats.
                let n = (mant as i64).wrapping_neg();
                if n >= 0 {
                    Scalar::F64(-(mant as f64))
                } else {
                    Scalar::I64(n)
                }
            } else {
                Scalar::U64(mant)
            });
        }
        let (frac_start, frac_end, frac_value) = if s[i] == b'.' {
            let (end, value) = digits(s, i + 1)?;
            if end == i + 1 {
                return Err(Stop::Fallback);
            }
            let f = (i + 1, end, value);
            i = end;
            f
        } else {
            (i, i, 0)
        };
        let mut exp10: i32 = 0;
        if matches!(s[i], b'e' | b'E') {
            i += 1;
            let eneg = match *s.get(i).ok_or(Stop::More)? {
                b'+' => {
                    i += 1;
                    false
                }
                b'-' => {
                    i += 1;
                    true
                }
                _ => false,
            };
            let end = digits_end(s, i)?;
            if end == i || end - i > 5 {
                return Err(Stop::Fallback);
            }
            let e = digits_value(&s[i..end]) as i32;
            exp10 = if eneg { -e } else { e };
            i = end;
        }
        self.i = i;
        let n_frac = frac_end - frac_start;
        // Exact when the mantissa and the power of ten are both exact f64s (one rounding).
        const POW10: [f64; 23] = [
            1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
            1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
        ];
        let mut v = None;
        if n_int + n_frac < 20 {
            let mant = int_value * POW10_U64[n_frac] + frac_value;
            let e = exp10 - n_frac as i32;
            if mant <= 1 << 53 && (-22..=22).contains(&e) {
                let m = mant as f64;
                v = Some(if e < 0 {
                    m / POW10[(-e) as usize]
                } else {
                    m * POW10[e as usize]
                });
            }
        }
        let v = match v {
            Some(v) => v,
            // The text is a checked JSON number, which Rust parses correctly rounded.
            None => std::str::from_utf8(&s[int_start..i])
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .ok_or(Stop::Fallback)?,
        };
        if !v.is_finite() {
            return Err(Stop::Fallback); // serde_json: "number out of range"
        }
        Ok(Scalar::F64(if neg { -v } else { v }))
    }

    /// A scalar value; containers fall back.
    #[inline]
    fn scalar(&mut self) -> R<Scalar<'a>> {
        match self.ws()? {
            b'"' => {
                self.i += 1;
                let bytes = self.plain_str()?;
                let s = std::str::from_utf8(bytes).map_err(|_| Stop::Fallback)?;
                Ok(Scalar::Str(s))
            }
            b'-' | b'0'..=b'9' => self.number(),
            b'n' => self.literal(b"null").map(|()| Scalar::Null),
            b't' => self.literal(b"true").map(|()| Scalar::Bool(true)),
            b'f' => self.literal(b"false").map(|()| Scalar::Bool(false)),
            _ => Err(Stop::Fallback),
        }
    }

    #[inline]
    fn literal(&mut self, word: &[u8]) -> R<()> {
        let have = &self.s[self.i..];
        let n = have.len().min(word.len());
        if have[..n] != word[..n] {
            return Err(Stop::Fallback);
        }
        if n < word.len() {
            return Err(Stop::More);
        }
        self.i += word.len();
        Ok(())
    }

    /// Skips any value, checking it as serde_json's `IgnoredAny` does.
    fn skip_value(&mut self, depth: u32) -> R<()> {
        match self.ws()? {
            b'"' => {
                self.i += 1;
                self.skip_str()
            }
            b'-' | b'0'..=b'9' => self.skip_number(),
            b'n' => self.literal(b"null"),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(Stop::Fallback);
                }
                self.i += 1;
                if self.ws()? == b'}' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.expect(b'"')?;
                    self.skip_str()?;
                    self.expect(b':')?;
                    self.skip_value(depth + 1)?;
                    match self.ws()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return Err(Stop::Fallback),
                    }
                }
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return Err(Stop::Fallback);
                }
                self.i += 1;
                if self.ws()? == b']' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.skip_value(depth + 1)?;
                    match self.ws()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return Err(Stop::Fallback),
                    }
                }
            }
            _ => Err(Stop::Fallback),
        }
    }

    /// Skips a number, checking its grammar only (as serde_json's `ignore_number`: no range).
    fn skip_number(&mut self) -> R<()> {
        let s = self.s;
        let mut i = self.i;
        if s[i] == b'-' {
            i += 1;
        }
        let at = |i: usize| s.get(i).copied().ok_or(Stop::More);
        let digits = |mut i: usize| -> R<(usize, bool)> {
            let from = i;
            while at(i)?.is_ascii_digit() {
                i += 1;
            }
            Ok((i, i > from))
        };
        match at(i)? {
            b'0' => {
                i += 1;
                if at(i)?.is_ascii_digit() {
                    return Err(Stop::Fallback);
                }
            }
            b'1'..=b'9' => i = digits(i)?.0,
            _ => return Err(Stop::Fallback),
        }
        if at(i)? == b'.' {
            let (j, any) = digits(i + 1)?;
            if !any {
                return Err(Stop::Fallback);
            }
            i = j;
        }
        if matches!(at(i)?, b'e' | b'E') {
            i += 1;
            if matches!(at(i)?, b'+' | b'-') {
                i += 1;
            }
            let (j, any) = digits(i)?;
            if !any {
                return Err(Stop::Fallback);
            }
            i = j;
        }
        self.i = i;
        Ok(())
    }

    /// A key (after `,` or `{` and whitespace, at its quote) and the `:` after it.
    #[inline]
    fn key(&mut self) -> R<&'a [u8]> {
        if self.peek()? != b'"' {
            return Err(Stop::Fallback);
        }
        self.i += 1;
        let k = self.plain_str()?;
        self.expect(b':')?;
        Ok(k)
    }

    /// An unknown key must still be a valid string for serde_json (it parses keys as `str`).
    #[inline]
    fn check_other_key(k: &[u8]) -> R<()> {
        if k.is_ascii() || std::str::from_utf8(k).is_ok() {
            Ok(())
        } else {
            Err(Stop::Fallback)
        }
    }

    /// Walks an object's members after its `{`: `f` gets each key with the cursor at its value
    /// and must consume the value.
    #[inline]
    fn members(&mut self, mut f: impl FnMut(&mut Self, &'a [u8]) -> R<()>) -> R<()> {
        if self.ws()? == b'}' {
            self.i += 1;
            return Ok(());
        }
        loop {
            let k = self.key()?;
            f(self, k)?;
            match self.ws()? {
                b',' => {
                    self.i += 1;
                    self.ws()?;
                }
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Stop::Fallback),
            }
        }
    }

    /// A kept arg's value as canonical text (`kept.rs`): what serde's `CanonSeed` writes for
    /// the same bytes, or a fallback (an escape or a non-UTF-8 byte in a string, deep nesting).
    fn canon(&mut self, depth: u32, out: &mut Vec<u8>) -> R<()> {
        match self.ws()? {
            b'"' => {
                self.i += 1;
                let bytes = self.plain_str()?;
                std::str::from_utf8(bytes).map_err(|_| Stop::Fallback)?;
                out.push(b'"');
                out.extend_from_slice(bytes);
                out.push(b'"');
            }
            b'-' | b'0'..=b'9' => match self.number()? {
                Scalar::U64(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
                Scalar::I64(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
                Scalar::F64(v) => write_f64(out, v),
                _ => return Err(Stop::Fallback),
            },
            b'n' => {
                self.literal(b"null")?;
                out.extend_from_slice(b"null");
            }
            b't' => {
                self.literal(b"true")?;
                out.extend_from_slice(b"true");
            }
            b'f' => {
                self.literal(b"false")?;
                out.extend_from_slice(b"false");
            }
            open @ (b'[' | b'{') => {
                if depth >= MAX_DEPTH {
                    return Err(Stop::Fallback);
                }
                let close = if open == b'[' { b']' } else { b'}' };
                self.i += 1;
                out.push(open);
                if self.ws()? == close {
                    self.i += 1;
                    out.push(close);
                    return Ok(());
                }
                loop {
                    if open == b'{' {
                        self.ws()?;
                        let k = self.key()?;
                        std::str::from_utf8(k).map_err(|_| Stop::Fallback)?;
                        out.push(b'"');
                        out.extend_from_slice(k);
                        out.extend_from_slice(b"\":");
                    }
                    self.canon(depth + 1, out)?;
                    match self.ws()? {
                        b',' => {
                            self.i += 1;
                            out.push(b',');
                        }
                        b if b == close => {
                            self.i += 1;
                            out.push(close);
                            return Ok(());
                        }
                        _ => return Err(Stop::Fallback),
                    }
                }
            }
            _ => return Err(Stop::Fallback),
        }
        Ok(())
    }

    fn event(&mut self, strings: &mut Interner, kept: &mut Vec<u8>) -> R<TraceEvent> {
        if self.peek()? != b'{' {
            return Err(Stop::Fallback);
        }
        self.i += 1;
        let mut ph = None;
        let mut cat = None;
        let mut name = None;
        let mut pid = None;
        let mut tid = None;
        let mut ts = None;
        let mut dur = None;
        let mut flow_id = None;
        let mut args = ArgFields::default();
        self.members(|c, k| {
            match k {
                b"ph" => {
                    let Scalar::Str(s) = c.scalar()? else {
                        return Err(Stop::Fallback);
                    };
                    ph = Some(Phase::from_ph(s));
                }
                b"cat" => cat = c.interned(strings)?,
                b"name" => name = c.interned(strings)?,
                b"pid" => pid = c.scalar()?.feed(RowIdSeed)?,
                b"tid" => tid = c.scalar()?.feed(RowIdSeed)?,
                b"ts" => ts = c.scalar()?.feed(NumSeed("ts"))?,
                b"dur" => dur = c.scalar()?.feed(NumSeed("dur"))?,
                b"id" => flow_id = c.scalar()?.feed(LenientInt { id: true })?,
                b"args" => c.args(&mut args, kept)?,
                _ => {
                    Self::check_other_key(k)?;
                    c.skip_value(1)?;
                }
            }
            Ok(())
        })?;
        let (Some(ph), Some(name)) = (ph, name) else {
            return Err(Stop::Fallback); // serde_json words the error
        };
        let ts = match ts {
            Some(ts) => ts,
            None if ph == Phase::Metadata => RawNum::Int(0),
            None => return Err(Stop::Fallback),
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
            op_args: if kept.is_empty() {
                None
            } else {
                finish(kept, strings)
            },
        })
    }

    /// `cat`/`name`: a string is interned from its bytes (validated only when new); other
    /// scalars go through `InternSeed`.
    #[inline]
    fn interned(&mut self, strings: &mut Interner) -> R<Option<StrId>> {
        if self.ws()? == b'"' {
            // Only `"` and `\` end the scan; `intern_bytes` checks a new string for control
            // characters (one seen before was checked then).
            let start = self.i + 1;
            let k = memchr::memchr2(b'"', b'\\', &self.s[start..]).ok_or(Stop::More)?;
            let end = start + k;
            if self.s[end] != b'"' {
                return Err(Stop::Fallback);
            }
            self.i = end + 1;
            return strings
                .intern_bytes(&self.s[start..end])
                .map(Some)
                .ok_or(Stop::Fallback);
        }
        self.scalar()?.feed(InternSeed(strings))
    }

    /// `args`: an object's known keys are read, everything else skipped; a non-object is
    /// ignored (after checking it), as `ArgsSeed` does.
    fn args(&mut self, a: &mut ArgFields, kept: &mut Vec<u8>) -> R<()> {
        if self.ws()? != b'{' {
            return self.skip_value(1);
        }
        self.i += 1;
        self.members(|c, k| {
            let slot = match k {
                b"stream" => &mut a.stream,
                b"correlation" => &mut a.correlation,
                b"External id" => &mut a.external_id,
                b"device" => &mut a.device,
                b"bytes" => &mut a.bytes,
                b"wait_on_stream" => &mut a.wait_on_stream,
                b"Total Allocated" => &mut a.total_allocated,
                b"Total Reserved" => &mut a.total_reserved,
                b"Bytes" => &mut a.mem_bytes,
                b"Device Id" => &mut a.mem_device,
                _ => {
                    if let Some(index) = kept_index(k) {
                        open_member(kept, index);
                        return c.canon(2, kept);
                    }
                    Self::check_other_key(k)?;
                    return c.skip_value(2);
                }
            };
            *slot = c.scalar()?.feed(LenientInt { id: false })?;
            Ok(())
        })
    }
}

/// Powers of ten up to 10¹⁹.
const POW10_U64: [u64; 20] = {
    let mut t = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// The end of the run of ASCII digits starting at `i`; the run must end inside `s`.
#[inline]
fn digits_end(s: &[u8], mut i: usize) -> R<usize> {
    while let Some(b) = s.get(i) {
        if !b.is_ascii_digit() {
            return Ok(i);
        }
        i += 1;
    }
    Err(Stop::More)
}

/// The end of the run of ASCII digits starting at `i` (which must end inside `s`) and, when the
/// run has at most 19 digits, their value (else a meaningless number). Eight bytes at a time:
/// the lengths of numbers vary too much for a byte loop's exit to be predicted.
#[inline(always)]
fn digits(s: &[u8], mut i: usize) -> R<(usize, u64)> {
    let mut value = 0u64;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w);
        let n = leading_digits(w);
        if n > 0 {
            value = value
                .wrapping_mul(POW10_U64[n])
                .wrapping_add(digits_word_value(w, n));
        }
        i += n;
        if n < 8 {
            return Ok((i, value));
        }
    }
    while let Some(&b) = s.get(i) {
        if !b.is_ascii_digit() {
            return Ok((i, value));
        }
        value = value.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
        i += 1;
    }
    Err(Stop::More)
}

/// How many of the eight bytes of `w` (first byte lowest) are ASCII digits before the first
/// byte that is not.
#[inline]
fn leading_digits(w: u64) -> usize {
    const LO: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const HI: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    // Non-zero in a byte that is not `0x30..=0x39`: a high nibble other than 3, or a low
    // nibble above 9 (no carries cross bytes: a nibble plus 6 fits in the byte).
    let bad = ((w & HI) ^ 0x3030_3030_3030_3030) | (((w & LO) + 0x0606_0606_0606_0606) & HI);
    // The high bit of each non-zero byte.
    let flags =
        (((bad & 0x7F7F_7F7F_7F7F_7F7F) + 0x7F7F_7F7F_7F7F_7F7F) | bad) & 0x8080_8080_8080_8080;
    (flags.trailing_zeros() / 8) as usize
}

/// The value of the first `n` (1..=8) bytes of `w`, which are ASCII digits, first byte most
/// significant.
#[inline]
fn digits_word_value(w: u64, n: usize) -> u64 {
    // Digits to values; borrows only reach the bytes after the digits, which the shift drops,
    // leaving leading zeros in front.
    let v = w.wrapping_sub(0x3030_3030_3030_3030) << (8 * (8 - n));
    // Pairs, then quads, then the eight (10·2⁸+1, 100·2¹⁶+1, 10000·2³²+1).
    let v = (v & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(2561) >> 8;
    let v = (v & 0x00FF_00FF_00FF_00FF).wrapping_mul(6_553_601) >> 16;
    (v & 0x0000_FFFF_0000_FFFF).wrapping_mul(42_949_672_960_001) >> 32
}

/// The value of at most 19 ASCII digits.
#[inline]
fn digits_value(d: &[u8]) -> u64 {
    d.iter().fold(0, |m, &b| m * 10 + u64::from(b - b'0'))
}

/// Index of the first `"`, `\` or control character (< 0x20) in `s`, eight bytes at a time.
#[inline]
fn find_special(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut chunks = s.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let w = u64::from_le_bytes(w);
        let ctrl = w.wrapping_sub(ONES * 0x20) & !w;
        let q = w ^ (ONES * u64::from(b'"'));
        let q = q.wrapping_sub(ONES) & !q;
        let b = w ^ (ONES * u64::from(b'\\'));
        let b = b.wrapping_sub(ONES) & !b;
        let m = (ctrl | q | b) & HIGHS;
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|k| i + k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digit_words() {
        for text in [
            "0", "7", "12", "123", "99999999", "12345678", "1234567,", "00000001", "9.5", "x",
            "1e5", "42\"}", "/0123:9", "87654321",
        ] {
            let mut w = [b' '; 8];
            let n = text.len().min(8);
            w[..n].copy_from_slice(&text.as_bytes()[..n]);
            let word = u64::from_le_bytes(w);
            let want = w.iter().take_while(|b| b.is_ascii_digit()).count();
            assert_eq!(leading_digits(word), want, "{text}");
            if want > 0 {
                let value: u64 = std::str::from_utf8(&w[..want]).unwrap().parse().unwrap();
                assert_eq!(digits_word_value(word, want), value, "{text}");
            }
        }
        // Every byte value next to digits.
        for b in 0..=255u8 {
            let word = u64::from_le_bytes([b'1', b'2', b, b'3', b'4', b'5', b'6', b'7']);
            let want = if b.is_ascii_digit() { 8 } else { 2 };
            assert_eq!(leading_digits(word), want, "byte {b:#x}");
        }
        let s = b"12345678901234567890123,";
        assert_eq!(digits(s, 0).ok().map(|d| d.0), Some(23));
        assert_eq!(digits(s, 5).ok(), Some((23, 678_901_234_567_890_123)));
        assert!(matches!(digits(b"123", 0), Err(Stop::More)));
    }
}
