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

const HAS_STREAM: u64 = 1;
const HAS_FUNCTION: u64 = 2;
const HAS_BYTES: u64 = 4;

/// The table.
pub struct ExternalIds {
    tags: Box<[AtomicU64]>,
    values: Box<[AtomicU64]>,
    streams: Box<[AtomicU64]>,
    functions: Box<[AtomicU64]>,
    bytes: Box<[AtomicU64]>,
    flags: Box<[AtomicU64]>,
}

impl Default for ExternalIds {
    fn default() -> Self {
        ExternalIds::new()
    }
}

impl ExternalIds {
    /// An empty table of [`CAPACITY`] slots.
    pub fn new() -> ExternalIds {
        let slots = || (0..CAPACITY).map(|_| AtomicU64::new(0)).collect();
        ExternalIds {
            tags: slots(),
            values: slots(),
            streams: slots(),
            functions: slots(),
            bytes: slots(),
            flags: slots(),
        }
    }

    fn slot(correlation: u64) -> usize {
        correlation as usize & (CAPACITY - 1)
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
    pub fn set_call(&self, correlation: u64, call: CallInfo) {
        let i = Self::slot(correlation);
        self.tags[i].store(0, Ordering::Relaxed);
        // The cleared tag is visible before the new values.
        fence(Ordering::Release);
        self.values[i].store(call.external, Ordering::Relaxed);
        self.streams[i].store(call.stream.unwrap_or(0), Ordering::Relaxed);
        self.functions[i].store(call.function.unwrap_or(0), Ordering::Relaxed);
        self.bytes[i].store(call.bytes.unwrap_or(0), Ordering::Relaxed);
        let flag = |present: bool, bit: u64| if present { bit } else { 0 };
        let flags = flag(call.stream.is_some(), HAS_STREAM)
            | flag(call.function.is_some(), HAS_FUNCTION)
            | flag(call.bytes.is_some(), HAS_BYTES);
        self.flags[i].store(flags, Ordering::Relaxed);
        // Release: a reader that sees the tag sees the values.
        self.tags[i].store(correlation, Ordering::Release);
    }

    /// The `External id` of `correlation`, if its slot still holds it.
    pub fn get(&self, correlation: u64) -> Option<u64> {
        self.call(correlation)
            .and_then(|c| (c.external != 0).then_some(c.external))
    }

    /// What was remembered of `correlation`'s call, if its slot still holds it.
    pub fn call(&self, correlation: u64) -> Option<CallInfo> {
        if correlation == 0 {
            return None;
        }
        let i = Self::slot(correlation);
        if self.tags[i].load(Ordering::Acquire) != correlation {
            return None;
        }
        let external = self.values[i].load(Ordering::Relaxed);
        let stream = self.streams[i].load(Ordering::Relaxed);
        let function = self.functions[i].load(Ordering::Relaxed);
        let bytes = self.bytes[i].load(Ordering::Relaxed);
        let flags = self.flags[i].load(Ordering::Relaxed);
        // The values were read before the second tag load.
        fence(Ordering::Acquire);
        (self.tags[i].load(Ordering::Relaxed) == correlation).then_some(CallInfo {
            external,
            stream: (flags & HAS_STREAM != 0).then_some(stream),
            function: (flags & HAS_FUNCTION != 0).then_some(function),
            bytes: (flags & HAS_BYTES != 0).then_some(bytes),
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
    }
}
