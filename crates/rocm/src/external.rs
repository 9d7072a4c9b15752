//! The `External id` of each HIP call, by correlation id: written by the API callback at ENTER on
//! the calling thread (before the call enqueues anything), read by the collector when it maps a
//! kernel or copy record of that call. A fixed table indexed by `correlation % capacity`, from
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

/// The table.
pub struct ExternalIds {
    tags: Box<[AtomicU64]>,
    values: Box<[AtomicU64]>,
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
            tags: (0..CAPACITY).map(|_| AtomicU64::new(0)).collect(),
            values: (0..CAPACITY).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(correlation: u64) -> usize {
        correlation as usize & (CAPACITY - 1)
    }

    /// Remembers `external` for `correlation` (ids are never 0).
    pub fn set(&self, correlation: u64, external: u64) {
        let i = Self::slot(correlation);
        self.tags[i].store(0, Ordering::Relaxed);
        // The cleared tag is visible before the new value.
        fence(Ordering::Release);
        self.values[i].store(external, Ordering::Relaxed);
        // Release: a reader that sees the tag sees the value.
        self.tags[i].store(correlation, Ordering::Release);
    }

    /// The `External id` of `correlation`, if its slot still holds it.
    pub fn get(&self, correlation: u64) -> Option<u64> {
        if correlation == 0 {
            return None;
        }
        let i = Self::slot(correlation);
        if self.tags[i].load(Ordering::Acquire) != correlation {
            return None;
        }
        let v = self.values[i].load(Ordering::Relaxed);
        // The value was read before the second tag load.
        fence(Ordering::Acquire);
        (self.tags[i].load(Ordering::Relaxed) == correlation && v != 0).then_some(v)
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
    }
}
