//! A bounded multi-producer, single-consumer queue of fixed-size records, from the SDK's callbacks
//! (any thread) to the collector. Vyukov's bounded MPMC queue
//! (<https://www.1024cores.net/home/lock-free-algorithms/queues/bounded-mpmc-queue>), with one
//! consumer, built from atomics only: a record is [`WORDS`] `AtomicU64`s, so no `unsafe` is
//! needed to move it through a slot.
//!
//! Invariant: slot `i`'s `seq` equals the position `p` (with `p % capacity == i`) when the slot is
//! free for the producer that claimed `p`, and `p + 1` once that producer has written it; the
//! consumer, after reading, sets it to `p + capacity`, freeing it for the next lap. A producer claims
//! a position with one compare-exchange on `tail`; a full queue (the slot of `tail` still holds the
//! previous lap's record) refuses the push, which the caller counts: nothing ever waits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Words per record.
pub const WORDS: usize = 12;

/// One record's words.
pub type Words = [u64; WORDS];

struct Slot {
    seq: AtomicUsize,
    words: [AtomicU64; WORDS],
}

/// The queue. Producers call [`push`](Self::push) from any thread; one consumer calls
/// [`pop`](Self::pop).
pub struct Queue {
    slots: Box<[Slot]>,
    mask: usize,
    tail: AtomicUsize,
    head: AtomicUsize,
    refused: AtomicU64,
}

impl Queue {
    /// A queue of `capacity` records, rounded up to a power of two (at least 2).
    pub fn new(capacity: usize) -> Queue {
        let capacity = capacity.max(2).next_power_of_two();
        let slots = (0..capacity)
            .map(|i| Slot {
                seq: AtomicUsize::new(i),
                words: Default::default(),
            })
            .collect();
        Queue {
            slots,
            mask: capacity - 1,
            tail: AtomicUsize::new(0),
            head: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Records the queue can hold.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Bytes the queue holds on to.
    pub fn bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<Slot>()
    }

    /// Appends a record, or refuses (counted in [`refused`](Self::refused)) when full. Lock-free,
    /// allocation-free.
    #[inline]
    pub fn push(&self, record: &Words) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            // Acquire: pairs with the consumer's Release that freed the slot, so our writes below
            // come after its reads.
            let seq = slot.seq.load(Ordering::Acquire);
            let diff = seq as isize - pos as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        for (w, v) in slot.words.iter().zip(record) {
                            w.store(*v, Ordering::Relaxed);
                        }
                        // Release: publishes the words to the consumer's Acquire of `seq`.
                        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The slot still holds last lap's record: full.
                self.refused.fetch_add(1, Ordering::Relaxed);
                return false;
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest record, if one is complete. Single consumer only (the collector holds the
    /// source mutably when it calls this).
    #[inline]
    pub fn pop(&self) -> Option<Words> {
        let pos = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[pos & self.mask];
        // Acquire: pairs with the producer's Release; the words are complete.
        if slot.seq.load(Ordering::Acquire) != pos.wrapping_add(1) {
            return None;
        }
        let mut out = [0u64; WORDS];
        for (o, w) in out.iter_mut().zip(&slot.words) {
            *o = w.load(Ordering::Relaxed);
        }
        // Release: our reads happen before a producer of the next lap writes.
        slot.seq
            .store(pos.wrapping_add(self.capacity()), Ordering::Release);
        self.head.store(pos.wrapping_add(1), Ordering::Relaxed);
        Some(out)
    }

    /// Whether a complete record waits for [`pop`](Self::pop) (single consumer only).
    pub fn has_ready(&self) -> bool {
        let pos = self.head.load(Ordering::Relaxed);
        self.slots[pos & self.mask].seq.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    /// Pushes accepted since the queue was created: every position a producer claimed is written,
    /// so this is the tail (no counter of its own, which would cost every push a second atomic
    /// read-modify-write).
    pub fn accepted(&self) -> u64 {
        self.tail.load(Ordering::Relaxed) as u64
    }

    /// Records taken by the consumer since the queue was created.
    pub fn taken(&self) -> u64 {
        self.head.load(Ordering::Relaxed) as u64
    }

    /// Pushes refused because the queue was full, since it was created.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_default_queue_holds_6_5_mib() {
        // docs/rocm-support.md states this footprint.
        assert_eq!(Queue::new(1 << 16).bytes(), 6_815_744);
    }

    #[test]
    fn fifo_and_bounded() {
        let q = Queue::new(4);
        for i in 0..4u64 {
            assert!(q.push(&[i; WORDS]));
        }
        assert!(!q.push(&[9; WORDS]));
        assert_eq!(q.refused(), 1);
        for i in 0..4u64 {
            assert_eq!(q.pop(), Some([i; WORDS]));
        }
        assert_eq!(q.pop(), None);
        // The next lap reuses the slots.
        assert!(q.push(&[5; WORDS]));
        assert_eq!(q.pop(), Some([5; WORDS]));
    }

    #[test]
    fn many_producers_lose_nothing_they_were_told_was_kept() {
        const PER: u64 = 20_000;
        let q = Arc::new(Queue::new(1024));
        let producers: Vec<_> = (0..4u64)
            .map(|p| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut kept = 0u64;
                    for i in 0..PER {
                        let mut r = [p; WORDS];
                        r[1] = i;
                        r[WORDS - 1] = p ^ i;
                        kept += u64::from(q.push(&r));
                    }
                    kept
                })
            })
            .collect();
        let mut got = 0u64;
        let mut last = [None::<u64>; 4];
        loop {
            let done = producers.iter().all(|h| h.is_finished());
            while let Some(r) = q.pop() {
                got += 1;
                // Whole records, and each producer's in order.
                assert_eq!(r[WORDS - 1], r[0] ^ r[1]);
                let p = r[0] as usize;
                assert!(last[p].is_none_or(|l| l < r[1]));
                last[p] = Some(r[1]);
            }
            if done {
                break;
            }
            std::thread::yield_now();
        }
        let kept: u64 = producers.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(got, kept);
        assert_eq!(kept + q.refused(), 4 * PER);
    }
}
