//! The `External id` of each HIP call, and the stream and function it launched on, by correlation
//! id: written by the API callback at ENTER on the calling thread (before the call enqueues
//! anything), read by the collector when it maps a kernel or copy record of that call (the SDK's
//! records name the HSA queue, not the HIP stream; Kineto takes the stream from the launch). A fixed table indexed by `correlation % capacity`, from
//! atomics only: no lock, no allocation, bounded memory.
//!
//! A slot is a seqlock of one writer at a time per correlation id: `(tag, value)` where `tag` is
//! the correlation id. The writer stores 0 into `tag`, the value, then the id (Release); the
//! reader loads the id (Acquire), the value, and the id again, and trusts the value only when both
//! loads saw the id it asked for. A slot overwritten by a call `capacity` ids later answers `None`:
//! the record then has no `External id` rather than a wrong one.
//!
//! A slot is four words in one 32-byte block, so a lookup touches one cache line: the tag (with the
//! flags of which values are present in its top bits), the `External id`, the stream, and the
//! function or the memset's bytes (a call is a launch or a memset, never both).

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Calls remembered (a GPU record decoded more than this many calls after its launch gets no
/// `External id`).
pub const CAPACITY: usize = 1 << 16;

/// What the collector needs of a call for its GPU records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallInfo {
    /// The kinetrace span open on the calling thread, 0 for none.
    pub external: u64,
    /// The `hipStream_t` the call named (launches, copies that take one).
    pub stream: Option<u64>,
    /// The launched function (launches).
    pub function: Option<u64>,
    /// The bytes a memset sets (memsets): its ROCclr fill kernels become `gpu_memset`s of them.
    pub bytes: Option<u64>,
}

const HAS_STREAM: u64 = 1 << 61;
const HAS_FUNCTION: u64 = 1 << 62;
const HAS_BYTES: u64 = 1 << 63;
/// Correlation ids at or past this (never reached: the SDK counts from 1) are not remembered.
const ID_MASK: u64 = HAS_STREAM - 1;

#[derive(Default)]
#[repr(C, align(32))]
struct Slot {
    tag: AtomicU64,
    external: AtomicU64,
    stream: AtomicU64,
    /// The function of a launch, or the bytes of a memset.
    aux: AtomicU64,
}

/// The table.
pub struct ExternalIds {
    slots: Box<[Slot]>,
}

impl Default for ExternalIds {
    fn default() -> Self {
        ExternalIds::new()
    }
}

impl ExternalIds {
    /// An empty table of [`CAPACITY`] slots.
    pub fn new() -> ExternalIds {
        ExternalIds {
            slots: (0..CAPACITY).map(|_| Slot::default()).collect(),
        }
    }

    /// Bytes the table holds on to.
    pub fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }

    fn slot(&self, correlation: u64) -> &Slot {
        &self.slots[correlation as usize & (CAPACITY - 1)]
    }

    /// Remembers `external` for `correlation` (ids are never 0).
    pub fn set(&self, correlation: u64, external: u64) {
        self.set_call(
            correlation,
            CallInfo {
                external,
                ..CallInfo::default()
            },
        );
    }

    /// Remembers what `correlation`'s GPU records need of the call.
    #[inline]
    pub fn set_call(&self, correlation: u64, call: CallInfo) {
        let s = self.slot(correlation);
        s.tag.store(0, Ordering::Relaxed);
        // The cleared tag is visible before the new values.
        fence(Ordering::Release);
        s.external.store(call.external, Ordering::Relaxed);
        s.stream.store(call.stream.unwrap_or(0), Ordering::Relaxed);
        // A launch names a function, a memset its bytes; a call with both keeps the function.
        let aux = call.function.or(call.bytes).unwrap_or(0);
        s.aux.store(aux, Ordering::Relaxed);
        let flag = |present: bool, bit: u64| if present { bit } else { 0 };
        let flags = flag(call.stream.is_some(), HAS_STREAM)
            | flag(call.function.is_some(), HAS_FUNCTION)
            | flag(call.function.is_none() && call.bytes.is_some(), HAS_BYTES);
        // An id too large for the tag is left out: its slot stays cleared and answers `None`.
        if correlation & !ID_MASK != 0 {
            return;
        }
        // Release: a reader that sees the tag sees the values.
        s.tag.store(correlation | flags, Ordering::Release);
    }

    /// The `External id` of `correlation`, if its slot still holds it.
    pub fn get(&self, correlation: u64) -> Option<u64> {
        self.call(correlation)
            .and_then(|c| (c.external != 0).then_some(c.external))
    }

    /// What was remembered of `correlation`'s call, if its slot still holds it.
    #[inline]
    pub fn call(&self, correlation: u64) -> Option<CallInfo> {
        if correlation == 0 {
            return None;
        }
        let s = self.slot(correlation);
        let tag = s.tag.load(Ordering::Acquire);
        if tag & ID_MASK != correlation {
            return None;
        }
        let external = s.external.load(Ordering::Relaxed);
        let stream = s.stream.load(Ordering::Relaxed);
        let aux = s.aux.load(Ordering::Relaxed);
        // The values were read before the second tag load.
        fence(Ordering::Acquire);
        (s.tag.load(Ordering::Relaxed) == tag).then_some(CallInfo {
            external,
            stream: (tag & HAS_STREAM != 0).then_some(stream),
            function: (tag & HAS_FUNCTION != 0).then_some(aux),
            bytes: (tag & HAS_BYTES != 0).then_some(aux),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_overwritten() {
        let t = ExternalIds::new();
        assert_eq!(t.get(5), None);
        t.set(5, 42);
        assert_eq!(t.get(5), Some(42));
        t.set(5 + CAPACITY as u64, 43);
        assert_eq!(t.get(5), None);
        assert_eq!(t.get(5 + CAPACITY as u64), Some(43));
        t.set(6, 0);
        assert_eq!(t.get(6), None);
        // A reused id without a span forgets the old call's.
        t.set(7, 42);
        t.set(7, 0);
        assert_eq!(t.get(7), None);
        // A launch's stream and function; a copy's stream alone.
        let launch = CallInfo {
            external: 9,
            stream: Some(0),
            function: Some(0x7e00_0001),
            bytes: None,
        };
        t.set_call(8, launch);
        assert_eq!(t.call(8), Some(launch));
        let fill = CallInfo {
            external: 0,
            stream: Some(0x5555),
            function: None,
            bytes: Some(1 << 33),
        };
        t.set_call(8, fill);
        assert_eq!(t.call(8), Some(fill));
        t.set_call(8, CallInfo::default());
        assert_eq!(t.call(8), Some(CallInfo::default()));
        assert_eq!(t.call(8 + CAPACITY as u64), None);
        // A memset's bytes share the function's word; the flags say which it is.
        let set = CallInfo {
            external: 1,
            stream: None,
            function: None,
            bytes: Some(u64::MAX),
        };
        t.set_call(9, set);
        assert_eq!(t.call(9), Some(set));
    }

    #[test]
    fn a_lookup_reads_one_32_byte_slot() {
        // docs/rocm-support.md states this footprint.
        let t = ExternalIds::new();
        assert_eq!(std::mem::size_of::<Slot>(), 32);
        assert_eq!(std::mem::align_of::<Slot>(), 32);
        assert_eq!(t.bytes(), 2 << 20);
    }

    #[test]
    fn ids_too_large_for_the_tag_are_not_remembered() {
        let t = ExternalIds::new();
        let big = ID_MASK + 1;
        t.set(big, 5);
        assert_eq!(t.call(big), None);
        // Its slot (that of id 0 .. CAPACITY) answers nothing for the small id either.
        assert_eq!(t.call(CAPACITY as u64), None);
        t.set(ID_MASK, 6);
        assert_eq!(t.get(ID_MASK), Some(6));
        // An id whose low bits match a flagged tag is not mistaken for it.
        t.set_call(
            3,
            CallInfo {
                external: 7,
                stream: Some(1),
                function: Some(2),
                bytes: None,
            },
        );
        assert_eq!(t.get(3 | HAS_STREAM), None);
        assert_eq!(t.get(3), Some(7));
    }
}
