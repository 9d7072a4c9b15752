//! A small JSON writer for traces: objects and arrays are closed by construction, strings are
//! escaped on the way in, and nothing is allocated per value.
//!
//! Containers are written inside closures ([`Object::object`], [`Array::object`]...), the way
//! samply's `writer.rs` and ripgrep's `jsont.rs` keep output balanced: the closing bracket is
//! written when the closure returns, so no call site closes anything by hand. The two containers a
//! streamed trace keeps open between calls (the document and its `traceEvents` array) are
//! [`OpenObject`] and [`OpenArray`]: typestates that can only be ended innermost first.
//!
//! Whitespace is a [`Layout`] type parameter, so a compact event costs no more than hand-written
//! bytes once inlined.

use std::marker::PhantomData;

/// Whitespace around the members of one container.
pub(crate) trait Layout {
    /// Before the first member.
    const FIRST: &'static [u8];
    /// Between members.
    const NEXT: &'static [u8];
    /// After the last member (an empty container is `{}` / `[]`).
    const LAST: &'static [u8];
    /// Between a key and its value.
    const COLON: &'static [u8];

    /// Writes the separator and the key; `rendered` is the key as [`key!`] renders it, `,"k":`.
    #[inline(always)]
    fn key(out: &mut Vec<u8>, first: bool, rendered: &'static str) {
        out.extend_from_slice(if first { Self::FIRST } else { Self::NEXT });
        out.extend_from_slice(&rendered.as_bytes()[1..rendered.len() - 1]);
        out.extend_from_slice(Self::COLON);
    }
}

/// `{"a":1,"b":2}`: events.
pub(crate) struct Compact;
impl Layout for Compact {
    const FIRST: &'static [u8] = b"";
    const NEXT: &'static [u8] = b",";
    const LAST: &'static [u8] = b"";
    const COLON: &'static [u8] = b":";

    /// The rendered key is exactly the compact separator, key and colon: one copy, without the
    /// comma for the first member.
    #[inline(always)]
    fn key(out: &mut Vec<u8>, first: bool, rendered: &'static str) {
        out.extend_from_slice(&rendered.as_bytes()[usize::from(first)..]);
    }
}

/// `{"a": 1, "b": 2}`: small header objects. `distributedInfo` must be written this way: HTA finds
/// the rank with the regex `"rank":\s+(\d+)`.
pub(crate) struct Inline;
impl Layout for Inline {
    const FIRST: &'static [u8] = b"";
    const NEXT: &'static [u8] = b", ";
    const LAST: &'static [u8] = b"";
    const COLON: &'static [u8] = b": ";
}

/// One member per line, indented two spaces: the document.
pub(crate) struct Lines;
impl Layout for Lines {
    const FIRST: &'static [u8] = b"\n  ";
    const NEXT: &'static [u8] = b",\n  ";
    const LAST: &'static [u8] = b"\n";
    const COLON: &'static [u8] = b": ";
}

/// One element per line at the document's indentation, as Kineto lays out `traceEvents`.
pub(crate) struct Rows;
impl Layout for Rows {
    const FIRST: &'static [u8] = b"\n  ";
    const NEXT: &'static [u8] = b",\n  ";
    const LAST: &'static [u8] = b"\n  ";
    const COLON: &'static [u8] = b": ";
}

/// One element per line, one level deeper (`deviceProperties`).
pub(crate) struct NestedRows;
impl Layout for NestedRows {
    const FIRST: &'static [u8] = b"\n    ";
    const NEXT: &'static [u8] = b",\n    ";
    const LAST: &'static [u8] = b"\n  ";
    const COLON: &'static [u8] = b": ";
}

/// An object key: a literal made by [`key!`] (checked at compile time, rendered once), or a key
/// from data (metadata, source names), escaped when written ([`Key::escaped`]).
#[derive(Clone, Copy)]
pub(crate) struct Key<'k>(KeyText<'k>);

#[derive(Clone, Copy)]
enum KeyText<'k> {
    /// `,"k":`, the key in compact form with the separator before it.
    Rendered(&'static str),
    Escape(&'k str),
}

impl<'k> Key<'k> {
    /// Use [`key!`], which checks the literal.
    #[doc(hidden)]
    pub(crate) const fn rendered(s: &'static str) -> Self {
        Key(KeyText::Rendered(s))
    }

    /// A key from data, escaped when written.
    pub(crate) fn escaped(k: &'k str) -> Self {
        Key(KeyText::Escape(k))
    }
}

/// A whole member of a compact object with a literal string value, `"k":"v"`, made by
/// [`member!`] (checked at compile time, rendered once): the constant parts of events.
#[derive(Clone, Copy)]
pub(crate) struct Member(&'static str);

impl Member {
    /// Use [`member!`], which checks the literals.
    #[doc(hidden)]
    pub(crate) const fn rendered(s: &'static str) -> Self {
        Member(s)
    }
}

/// Whether `s` can be written between quotes as is (printable ASCII, no `"` or `\`). `const`, so
/// that [`key!`] and [`member!`] check their literals at compile time.
pub(crate) const fn plain(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c < 0x20 || c >= 0x7f || c == b'"' || c == b'\\' {
            return false;
        }
        i += 1;
    }
    true
}

/// A literal object key, checked at compile time to need no escaping.
macro_rules! key {
    ($k:literal) => {{
        const _: () = assert!(
            $crate::json::plain($k),
            "key literals must need no escaping"
        );
        $crate::json::Key::rendered(concat!(",\"", $k, "\":"))
    }};
}

/// A literal `"key":"value"` member of a compact object, checked at compile time.
macro_rules! member {
    ($k:literal, $v:literal) => {{
        const _: () = assert!(
            $crate::json::plain($k) && $crate::json::plain($v),
            "member literals must need no escaping"
        );
        $crate::json::Member::rendered(concat!(",\"", $k, "\":\"", $v, "\""))
    }};
}

pub(crate) use {key, member};

/// A string already in JSON form (quoted and escaped): names written many times are escaped once.
/// The only way to make one is [`JsonStr::new`], which escapes.
pub(crate) struct JsonStr(pub(crate) Box<[u8]>);

impl JsonStr {
    /// `s` as a JSON string literal.
    pub(crate) fn new(s: &str) -> Self {
        let mut v = Vec::with_capacity(s.len() + 2);
        push_str_literal(&mut v, s);
        JsonStr(v.into_boxed_slice())
    }
}

/// The members of one JSON object being written. Made by the functions that open an object, which
/// close it when the closure they run returns.
pub(crate) struct Object<'a, L> {
    out: &'a mut Vec<u8>,
    empty: bool,
    layout: PhantomData<L>,
}

/// The elements of one JSON array being written; closed like [`Object`].
pub(crate) struct Array<'a, L> {
    out: &'a mut Vec<u8>,
    empty: bool,
    layout: PhantomData<L>,
}

#[inline(always)]
fn write_object<L: Layout>(out: &mut Vec<u8>, f: impl FnOnce(&mut Object<'_, L>)) {
    out.push(b'{');
    let mut o = Object {
        out,
        empty: true,
        layout: PhantomData,
    };
    f(&mut o);
    o.close();
}

#[inline(always)]
fn write_array<L: Layout>(out: &mut Vec<u8>, f: impl FnOnce(&mut Array<'_, L>)) {
    out.push(b'[');
    let mut a = Array {
        out,
        empty: true,
        layout: PhantomData,
    };
    f(&mut a);
    a.close();
}

impl<L: Layout> Object<'_, L> {
    #[inline(always)]
    fn key(&mut self, k: Key<'_>) {
        let first = std::mem::replace(&mut self.empty, false);
        match k.0 {
            KeyText::Rendered(r) => L::key(self.out, first, r),
            KeyText::Escape(k) => {
                self.out
                    .extend_from_slice(if first { L::FIRST } else { L::NEXT });
                push_str_literal(self.out, k);
                self.out.extend_from_slice(L::COLON);
            }
        }
    }

    #[inline(always)]
    fn close(self) {
        if !self.empty {
            self.out.extend_from_slice(L::LAST);
        }
        self.out.push(b'}');
    }

    /// `"k": {…}`, the members written by `f`.
    #[inline(always)]
    pub(crate) fn object<M: Layout>(&mut self, k: Key<'_>, f: impl FnOnce(&mut Object<'_, M>)) {
        self.key(k);
        write_object(self.out, f);
    }

    /// `"k": {…}` if `f` writes a member; nothing at all if it writes none (Kineto omits empty
    /// `args`).
    #[inline(always)]
    pub(crate) fn object_if_any<M: Layout>(
        &mut self,
        k: Key<'_>,
        f: impl FnOnce(&mut Object<'_, M>),
    ) {
        let mark = self.out.len();
        let was_empty = self.empty;
        self.key(k);
        self.out.push(b'{');
        let mut inner = Object::<M> {
            out: &mut *self.out,
            empty: true,
            layout: PhantomData,
        };
        f(&mut inner);
        if inner.empty {
            self.out.truncate(mark);
            self.empty = was_empty;
        } else {
            inner.close();
        }
    }

    /// `"k": […]`, the elements written by `f`.
    #[inline(always)]
    pub(crate) fn array<M: Layout>(&mut self, k: Key<'_>, f: impl FnOnce(&mut Array<'_, M>)) {
        self.key(k);
        write_array(self.out, f);
    }
}

impl<L: Layout> Array<'_, L> {
    #[inline(always)]
    fn element(&mut self) {
        self.out
            .extend_from_slice(if self.empty { L::FIRST } else { L::NEXT });
        self.empty = false;
    }

    #[inline(always)]
    fn close(self) {
        if !self.empty {
            self.out.extend_from_slice(L::LAST);
        }
        self.out.push(b']');
    }

    /// An object element, its members written by `f`.
    #[inline(always)]
    pub(crate) fn object<M: Layout>(&mut self, f: impl FnOnce(&mut Object<'_, M>)) {
        self.element();
        write_object(self.out, f);
    }
}

/// Scalar members and elements: one method per value kind, on both containers (an object's take a
/// key first).
macro_rules! scalars {
    ($(#[$doc:meta] $name:ident($v:ident: $t:ty) => $write:expr;)*) => {
        impl<L: Layout> Object<'_, L> {
            $(
                #[$doc]
                #[inline(always)]
                pub(crate) fn $name(&mut self, k: Key<'_>, $v: $t) {
                    self.key(k);
                    let out: &mut Vec<u8> = self.out;
                    $write(out);
                }
            )*
        }
        impl<L: Layout> Array<'_, L> {
            $(
                #[$doc]
                #[inline(always)]
                #[allow(dead_code)]
                pub(crate) fn $name(&mut self, $v: $t) {
                    self.element();
                    let out: &mut Vec<u8> = self.out;
                    $write(out);
                }
            )*
        }
    };
}

scalars! {
    /// An unsigned integer.
    u64(v: u64) => |out| push_u64(out, v);
    /// A signed integer.
    i64(v: i64) => |out| push_i64(out, v);
    /// Nanoseconds as microseconds with three decimals (Kineto's `ts`/`dur`).
    us3(ns: u64) => |out| push_us3(out, ns);
    /// A float (non-finite as 0).
    f64(v: f64) => |out| push_f64(out, v);
    /// A string, escaped.
    str(s: &str) => |out| push_str_literal(out, s);
    /// An address as a `"0x…"` string.
    hex_str(v: u64) => |out| push_hex_str(out, v);
    /// An unsigned integer as a string.
    u64_str(v: u64) => |out| push_u64_str(out, v);
    /// A string made of `parts`, each escaped.
    str_parts(parts: &[&str]) => |out: &mut Vec<u8>| {
        out.push(b'"');
        for p in parts {
            push_escaped(out, p);
        }
        out.push(b'"');
    };
    /// A string already in JSON form.
    json_str(s: &JsonStr) => |out: &mut Vec<u8>| out.extend_from_slice(&s.0);
}

impl Object<'_, Compact> {
    /// Members already in JSON form (`"a":1,"b":[2]`, no braces), written as they are after the
    /// ones before: the caller guarantees they are valid JSON members.
    #[inline(always)]
    pub(crate) fn raw_members(&mut self, members: &[u8]) {
        if members.is_empty() {
            return;
        }
        let first = std::mem::replace(&mut self.empty, false);
        if !first {
            self.out.push(b',');
        }
        self.out.extend_from_slice(members);
    }

    /// A literal member made by [`member!`].
    #[inline(always)]
    pub(crate) fn member(&mut self, m: Member) {
        let first = std::mem::replace(&mut self.empty, false);
        self.out
            .extend_from_slice(&m.0.as_bytes()[usize::from(first)..]);
    }
}

/// An object left open between calls: the trace document, which stays open while events stream
/// in. Ending it is the only way to finish the document; dropping it leaves the output unfinished
/// (and the sink removes an unfinished file).
#[must_use = "an open object must be ended"]
pub(crate) struct OpenObject<L> {
    empty: bool,
    layout: PhantomData<L>,
}

impl<L: Layout> OpenObject<L> {
    /// Writes `{`.
    pub(crate) fn begin(out: &mut Vec<u8>) -> Self {
        out.push(b'{');
        OpenObject {
            empty: true,
            layout: PhantomData,
        }
    }

    /// Writes more members.
    pub(crate) fn members(&mut self, out: &mut Vec<u8>, f: impl FnOnce(&mut Object<'_, L>)) {
        let mut o = Object {
            out,
            empty: self.empty,
            layout: PhantomData,
        };
        f(&mut o);
        self.empty = o.empty;
    }

    /// Writes `"k": [` and returns the array, which hands this object back when ended.
    pub(crate) fn begin_array<M: Layout>(
        mut self,
        out: &mut Vec<u8>,
        k: Key<'_>,
    ) -> OpenArray<M, Self> {
        self.members(out, |o| o.key(k));
        out.push(b'[');
        OpenArray {
            empty: true,
            parent: self,
            layout: PhantomData,
        }
    }

    /// Writes `}`.
    pub(crate) fn end(self, out: &mut Vec<u8>) {
        Object::<L> {
            out,
            empty: self.empty,
            layout: PhantomData,
        }
        .close();
    }
}

/// An array left open between calls inside an open container `P` (`traceEvents`).
#[must_use = "an open array must be ended"]
pub(crate) struct OpenArray<L, P> {
    empty: bool,
    parent: P,
    layout: PhantomData<L>,
}

impl<L: Layout, P> OpenArray<L, P> {
    /// Writes more elements.
    #[inline(always)]
    pub(crate) fn elements(&mut self, out: &mut Vec<u8>, f: impl FnOnce(&mut Array<'_, L>)) {
        let mut a = Array {
            out,
            empty: self.empty,
            layout: PhantomData,
        };
        f(&mut a);
        self.empty = a.empty;
    }

    /// Writes `]` and hands back the container around it.
    pub(crate) fn end(self, out: &mut Vec<u8>) -> P {
        Array::<L> {
            out,
            empty: self.empty,
            layout: PhantomData,
        }
        .close();
        self.parent
    }
}

/// Appends `s` as a JSON string literal (with quotes), escaping quotes, backslashes and control bytes.
pub(crate) fn push_str_literal(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_escaped(out, s);
    out.push(b'"');
}

/// Appends the escaped content of `s` (without quotes).
pub(crate) fn push_escaped(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// `"00" "01" … "99"`: two digits per lookup.
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes the decimal digits of `v` at the start of `buf` and returns how many there are (at most
/// 20, the digits of `u64::MAX`).
#[inline(always)]
fn digits(mut v: u64, buf: &mut [u8; 24]) -> usize {
    const POW10: [u64; 20] = {
        let mut p = [1u64; 20];
        let mut i = 1;
        while i < 20 {
            p[i] = p[i - 1] * 10;
            i += 1;
        }
        p
    };
    // floor(log10 v) is floor(log2 v) * log10(2) (1233 / 4096), or one more: one comparison tells.
    let log2 = 63 - (v | 1).leading_zeros() as usize;
    let approx = (log2 * 1233) >> 12;
    let n = approx + 1 + usize::from(v >= POW10[approx + 1]);
    let mut i = n;
    while v >= 100 {
        let r = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[r..r + 2]);
    }
    if v >= 10 {
        let r = v as usize * 2;
        buf[..2].copy_from_slice(&PAIRS[r..r + 2]);
    } else {
        buf[0] = b'0' + v as u8;
    }
    n
}

/// Appends the first `n` bytes of `buf`. The whole buffer is copied (a fixed-size copy is a few
/// moves, where a variable one is a call) and the excess cut off again.
#[inline(always)]
fn push_prefix(out: &mut Vec<u8>, buf: &[u8; 24], n: usize) {
    let len = out.len();
    out.extend_from_slice(buf);
    out.truncate(len + n);
}

/// Values below this are rendered in registers ([`digits_in_register`]).
const REGISTER_LIMIT: u64 = 10_000_000_000_000_000;

/// The decimal digits of `v` (below [`REGISTER_LIMIT`]) as ASCII bytes in a `u128`, first digit in
/// the lowest byte, and how many there are. Built in registers and stored once: writing digits one
/// by one into a stack buffer and then copying the buffer wholesale makes the copy's load wait for
/// those small stores (a store-forwarding stall), which dominated encoding.
#[inline(always)]
fn digits_in_register(mut v: u64) -> (u128, usize) {
    const POW10: [u64; 20] = {
        let mut p = [1u64; 20];
        let mut i = 1;
        while i < 20 {
            p[i] = p[i - 1] * 10;
            i += 1;
        }
        p
    };
    let log2 = 63 - (v | 1).leading_zeros() as usize;
    let approx = (log2 * 1233) >> 12;
    let n = approx + 1 + usize::from(v >= POW10[approx + 1]);
    let mut acc: u128 = 0;
    let mut i = n;
    while v >= 100 {
        let r = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        let pair = u16::from_le_bytes([PAIRS[r], PAIRS[r + 1]]);
        acc |= (pair as u128) << (8 * i);
    }
    if v >= 10 {
        let r = v as usize * 2;
        acc |= u16::from_le_bytes([PAIRS[r], PAIRS[r + 1]]) as u128;
    } else {
        acc |= (b'0' + v as u8) as u128;
    }
    (acc, n)
}

/// Appends the first `n` bytes of `bytes` (one 16-byte store, then the excess cut off).
#[inline(always)]
fn push_register(out: &mut Vec<u8>, bytes: u128, n: usize) {
    let len = out.len();
    out.extend_from_slice(&bytes.to_le_bytes());
    out.truncate(len + n);
}

/// Appends an unsigned integer.
#[inline(always)]
pub(crate) fn push_u64(out: &mut Vec<u8>, v: u64) {
    // Most argument values (devices, streams, block sizes) are one digit.
    if v < 10 {
        out.push(b'0' + v as u8);
        return;
    }
    if v < REGISTER_LIMIT {
        let (digits, n) = digits_in_register(v);
        push_register(out, digits, n);
        return;
    }
    let mut buf = [0; 24];
    let n = digits(v, &mut buf);
    push_prefix(out, &buf, n);
}

/// Appends `"0x…"`: an address or handle as C's `%p` prints it (Kineto's `"0x0"` for null).
pub(crate) fn push_hex_str(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(b"\"0x");
    let n = (64 - v.leading_zeros()).div_ceil(4).max(1);
    for i in (0..n).rev() {
        out.push(b"0123456789abcdef"[(v >> (4 * i)) as usize & 0xf]);
    }
    out.push(b'"');
}

/// Appends an unsigned integer as a JSON string (Kineto writes some sizes that way).
pub(crate) fn push_u64_str(out: &mut Vec<u8>, v: u64) {
    out.push(b'"');
    push_u64(out, v);
    out.push(b'"');
}

/// Appends a signed integer.
#[inline(always)]
pub(crate) fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Appends nanoseconds as microseconds with exactly three decimals (`1234.005`).
#[inline(always)]
pub(crate) fn push_us3(out: &mut Vec<u8>, ns: u64) {
    let us = ns / 1000;
    if us < 1_000_000_000_000 {
        // Up to 12 digits, the point and 3 decimals: 16 bytes, in registers.
        let (mut acc, n) = digits_in_register(us);
        let frac = (ns % 1000) as usize;
        let r = frac % 100 * 2;
        let tail = u32::from_le_bytes([b'.', b'0' + (frac / 100) as u8, PAIRS[r], PAIRS[r + 1]]);
        acc |= (tail as u128) << (8 * n);
        push_register(out, acc, n + 4);
        return;
    }
    let mut buf = [0; 24];
    let n = digits(ns / 1000, &mut buf);
    let frac = (ns % 1000) as usize;
    buf[n] = b'.';
    buf[n + 1] = b'0' + (frac / 100) as u8;
    let r = frac % 100 * 2;
    buf[n + 2..n + 4].copy_from_slice(&PAIRS[r..r + 2]);
    push_prefix(out, &buf, n + 4);
}

/// Appends a finite float in a form JSON accepts (shortest round trip); non-finite values as 0.
pub(crate) fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        use std::io::Write;
        let _ = write!(out, "{v}");
        if v.fract() == 0.0 && v.abs() < 1e15 {
            out.extend_from_slice(b".0");
        }
    } else {
        out.push(b'0');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> String {
        let mut v = Vec::new();
        push_str_literal(&mut v, s);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn addresses_and_string_numbers() {
        let hex = |v: u64| {
            let mut o = Vec::new();
            push_hex_str(&mut o, v);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(hex(0), "\"0x0\"");
        assert_eq!(hex(0x55674ecd4180), "\"0x55674ecd4180\"");
        assert_eq!(hex(u64::MAX), "\"0xffffffffffffffff\"");
        assert_eq!(hex(0x10), "\"0x10\"");
        let mut o = Vec::new();
        push_u64_str(&mut o, 2560);
        assert_eq!(o, b"\"2560\"");
    }

    #[test]
    fn escapes_round_trip_through_serde() {
        for s in [
            "plain",
            "q\"uote",
            "back\\slash",
            "new\nline\ttab\r",
            "\u{1}\u{1f}\u{7f}",
            "void k<float>(float*, int) [with T=\"x\"]",
            "ünïcødé ✓ 🚀",
        ] {
            let json = lit(s);
            let back: String = serde_json::from_str(&json).unwrap();
            assert_eq!(back, s, "{json}");
        }
    }

    #[test]
    fn three_decimals() {
        let mut v = Vec::new();
        push_us3(&mut v, 1_234_005);
        v.push(b' ');
        push_us3(&mut v, 7);
        v.push(b' ');
        push_us3(&mut v, 4_458_676_983_543_183);
        assert_eq!(
            String::from_utf8(v).unwrap(),
            "1234.005 0.007 4458676983543.183"
        );
    }

    /// Every digit count and both rendering paths, against the standard formatting.
    #[test]
    fn random_integers_and_times_match_the_standard_formatting() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut v = Vec::new();
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Spread over every length: shift the value down by a varying amount.
            let n = x >> (i % 64);
            v.clear();
            push_u64(&mut v, n);
            assert_eq!(String::from_utf8_lossy(&v), n.to_string());
            v.clear();
            push_us3(&mut v, n);
            assert_eq!(
                String::from_utf8_lossy(&v),
                format!("{}.{:03}", n / 1000, n % 1000)
            );
        }
    }

    #[test]
    fn integers_match_the_standard_formatting() {
        let mut edges = vec![
            0,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            u64::MAX,
            u64::MAX - 1,
        ];
        for p in 1..20 {
            let t = 10u64.pow(p);
            edges.extend([t - 1, t, t + 1]);
        }
        let mut v = Vec::new();
        for &n in &edges {
            v.clear();
            push_u64(&mut v, n);
            assert_eq!(String::from_utf8_lossy(&v), n.to_string());
            for i in [n as i64, (n as i64).wrapping_neg(), i64::MIN, i64::MAX] {
                v.clear();
                push_i64(&mut v, i);
                assert_eq!(String::from_utf8_lossy(&v), i.to_string());
            }
            v.clear();
            push_us3(&mut v, n);
            assert_eq!(
                String::from_utf8_lossy(&v),
                format!("{}.{:03}", n / 1000, n % 1000)
            );
        }
    }

    #[test]
    fn floats_are_json() {
        let mut v = Vec::new();
        push_f64(&mut v, 2.0);
        v.push(b' ');
        push_f64(&mut v, 0.125);
        v.push(b' ');
        push_f64(&mut v, f64::INFINITY);
        assert_eq!(String::from_utf8(v).unwrap(), "2.0 0.125 0");
    }

    #[test]
    fn containers_close_themselves_in_each_layout() {
        let mut out = Vec::new();
        let mut doc = OpenObject::<Lines>::begin(&mut out);
        doc.members(&mut out, |d| {
            d.u64(key!("n"), 1);
            d.object::<Inline>(key!("info"), |i| {
                i.u64(key!("rank"), 2);
                i.str(Key::escaped("we\"ird"), "v\n");
            });
            d.object::<Compact>(key!("empty"), |_| {});
            d.object_if_any::<Compact>(key!("omitted"), |_| {});
            d.object_if_any::<Compact>(key!("kept"), |o| o.i64(key!("x"), -1));
        });
        let mut rows = doc.begin_array::<Rows>(&mut out, key!("rows"));
        for i in 0..2 {
            rows.elements(&mut out, |a| {
                a.object::<Compact>(|e| {
                    e.member(member!("ph", "X"));
                    e.us3(key!("ts"), 1500 + i);
                    e.array::<Compact>(key!("grid"), |g| {
                        g.u64(1);
                        g.u64(2);
                    });
                    e.str_parts(key!("name"), &["a\"", "b"]);
                    e.json_str(key!("s"), &JsonStr::new("q\\"));
                    e.f64(key!("f"), 0.5);
                })
            });
        }
        let mut doc = rows.end(&mut out);
        doc.members(&mut out, |d| {
            d.array::<NestedRows>(key!("none"), |_| {});
            d.array::<NestedRows>(key!("one"), |a| {
                a.object::<Inline>(|o| o.u64(key!("id"), 0))
            });
        });
        doc.end(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "{\n  \"n\": 1,\n  \"info\": {\"rank\": 2, \"we\\\"ird\": \"v\\n\"},\n  \"empty\": {},\n  \
             \"kept\": {\"x\":-1},\n  \"rows\": [\n  \
             {\"ph\":\"X\",\"ts\":1.500,\"grid\":[1,2],\"name\":\"a\\\"b\",\"s\":\"q\\\\\",\"f\":0.5},\n  \
             {\"ph\":\"X\",\"ts\":1.501,\"grid\":[1,2],\"name\":\"a\\\"b\",\"s\":\"q\\\\\",\"f\":0.5}\n  ],\n  \
             \"none\": [],\n  \"one\": [\n    {\"id\": 0}\n  ]\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["info"]["we\"ird"], "v\n");
        assert!(v.get("omitted").is_none());
    }
}
