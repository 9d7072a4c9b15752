//! The args that describe what an op computed, kept as text: an op's inputs (`Input Dims`,
//! `Input type`, `Input Strides`, `Concrete Inputs`) and a collective's parameters
//! (`record_param_comms`' and NCCL kernels' `Collective name`, `In msg nelems`, ...).
//!
//! They are kept as one compact JSON object per event, the members in file order, interned like
//! names ([`TraceEvent::op_args`]): calls with the same inputs share one string, so a trace with
//! shapes on every op adds one string per distinct shape, not per event. Per-call values that
//! would make every string distinct (`Seq`, tensor addresses) are not kept.
//!
//! Both event paths write the same canonical text: no whitespace, strings as serde_json writes
//! them, integers as written, other numbers as serde_json writes an `f64`. The fast path writes
//! from the bytes it scans and falls back wherever it could differ (an escape in a string); the
//! serde path writes from the values serde_json hands it.

use super::*;

/// The kept keys, as torch (and kinetrace) write them.
pub(super) const KEPT_ARGS: &[&str] = &[
    "Input Dims",
    "Input type",
    "Input Strides",
    "Concrete Inputs",
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "In split size",
    "Out split size",
    "Group size",
    "dtype",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
    "Process Group ID",
    "Global rank start",
    "Global rank stride",
];

/// The index of `key` in [`KEPT_ARGS`].
#[inline]
pub(super) fn kept_index(key: &[u8]) -> Option<u8> {
    // Every kept key starts with an upper-case letter or `d`; most args (`stream`, `correlation`,
    // `External id`, `grid`, ...) are ruled out by their first byte or length.
    match key.first() {
        Some(b'I' | b'C' | b'O' | b'G' | b'P' | b'd') => KEPT_ARGS
            .iter()
            .position(|k| k.as_bytes() == key)
            .map(|i| i as u8),
        _ => None,
    }
}

/// Starts the member `"key":` of the object being built in `out`.
pub(super) fn open_member(out: &mut Vec<u8>, index: u8) {
    out.push(if out.is_empty() { b'{' } else { b',' });
    out.push(b'"');
    out.extend_from_slice(KEPT_ARGS[index as usize].as_bytes());
    out.extend_from_slice(b"\":");
}

/// Closes the object in `out` and interns it; `None` when nothing was kept.
#[inline]
pub(super) fn finish(out: &mut Vec<u8>, strings: &mut Interner) -> Option<StrId> {
    if out.is_empty() {
        return None;
    }
    out.push(b'}');
    // Canonical JSON text holds no control character and only UTF-8 strings.
    let id = strings.intern_bytes(out);
    out.clear();
    id
}

/// Writes an `f64` as serde_json does (both paths format numbers with a fraction this way).
pub(super) fn write_f64(out: &mut Vec<u8>, v: f64) {
    // Writing into a Vec cannot fail, and the fast path passes only finite values.
    let _ = serde_json::to_writer(&mut *out, &v);
}

/// Writes a string as serde_json does.
fn write_str(out: &mut Vec<u8>, v: &str) {
    let _ = serde_json::to_writer(&mut *out, v);
}

/// The serde path: writes the canonical text of any value.
pub(super) struct CanonSeed<'a>(pub(super) &'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for CanonSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CanonSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        write_f64(self.0, v);
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        write_str(self.0, v);
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        out.push(b'[');
        let mut first = true;
        loop {
            let mark = out.len();
            if !first {
                out.push(b',');
            }
            if seq.next_element_seed(CanonSeed(&mut *out))?.is_none() {
                out.truncate(mark);
                break;
            }
            first = false;
        }
        out.push(b']');
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        out.push(b'{');
        let mut first = true;
        loop {
            let mark = out.len();
            if !first {
                out.push(b',');
            }
            if map.next_key_seed(KeySeed(&mut *out))?.is_none() {
                out.truncate(mark);
                break;
            }
            out.push(b':');
            map.next_value_seed(CanonSeed(&mut *out))?;
            first = false;
        }
        out.push(b'}');
        Ok(())
    }
}

/// An object key inside a kept value.
struct KeySeed<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        write_str(self.0, v);
        Ok(())
    }
}
