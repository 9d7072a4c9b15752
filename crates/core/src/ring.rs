//! A bounded single-producer single-consumer ring, the buffer every recording thread writes into.
//!
//! Algorithm: the classic Lamport SPSC queue with unbounded (wrapping) indices, as described in
//! Lamport, "Specifying Concurrent Program Modules" (1983) and used by e.g. `rtrb`. The producer owns
//! `tail`, the consumer owns `head`; each only reads the other's index.
//!
//! Invariants:
//! - `head <= tail <= head + capacity` (in wrapping arithmetic).
//! - Slots `head .. tail` (mod capacity) are initialised and belong to the consumer; all others belong
//!   to the producer.
//! - Only the [`RingWriter`] advances `tail`; only the [`RingReader`] advances `head`. Neither handle is
//!   `Clone` or `Sync`, which is what makes the single-producer / single-consumer claim hold.
//!
//! Overflow policy: [`RingWriter::try_push`] never blocks or allocates; when the ring is full it hands
//! the value back and counts the drop, and the reader reports the count.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Pads and aligns a value to 128 bytes so the producer's and consumer's indices never share a cache
/// line (false sharing would make every push stall on the consumer's reads).
#[repr(align(128))]
struct CachePadded<T>(T);

struct Shared<T> {
    /// Next slot the consumer reads. Written only by the reader.
    head: CachePadded<AtomicUsize>,
    /// Next slot the producer writes. Written only by the writer.
    tail: CachePadded<AtomicUsize>,
    /// Values refused because the ring was full.
    dropped: AtomicU64,
    mask: usize,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

// SAFETY: a slot is accessed either by the one writer (when outside head..tail) or the one reader
// (when inside), never both; the index hand-off below uses Release/Acquire so the slot contents are
// visible to the side that receives it. Values move between threads, hence `T: Send`.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above; the shared state owns `T`s and may be dropped on either thread.
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        if !std::mem::needs_drop::<T>() {
            return;
        }
        let head = *self.head.0.get_mut();
        let tail = *self.tail.0.get_mut();
        let mut i = head;
        while i != tail {
            let slot = &mut self.slots[i & self.mask];
            // SAFETY: slots in head..tail are initialised (invariant) and we have `&mut self`, so no
            // handle can touch them any more.
            unsafe { slot.get_mut().assume_init_drop() };
            i = i.wrapping_add(1);
        }
    }
}

/// Creates a ring holding at least `capacity` values (rounded up to a power of two, at least 2).
pub fn ring<T: Send>(capacity: usize) -> (RingWriter<T>, RingReader<T>) {
    let cap = capacity.max(2).next_power_of_two();
    let slots = (0..cap)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let shared = Arc::new(Shared {
        head: CachePadded(AtomicUsize::new(0)),
        tail: CachePadded(AtomicUsize::new(0)),
        dropped: AtomicU64::new(0),
        mask: cap - 1,
        slots,
    });
    (
        RingWriter {
            shared: shared.clone(),
            cached_head: 0,
        },
        RingReader { shared },
    )
}

/// The producing end. Lives on the recording thread.
pub struct RingWriter<T> {
    shared: Arc<Shared<T>>,
    /// The last `head` seen; refreshed only when the ring looks full, which saves a cross-core load on
    /// most pushes.
    cached_head: usize,
}

impl<T: Send> RingWriter<T> {
    /// Appends `value`, or hands it back (and counts a drop) when the ring is full.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        let s = &*self.shared;
        // Relaxed: only this writer stores `tail`.
        let tail = s.tail.0.load(Ordering::Relaxed);
        if tail.wrapping_sub(self.cached_head) > s.mask {
            // Acquire: pairs with the reader's Release store of `head`, so its reads of the slots it
            // freed happen before we overwrite them.
            self.cached_head = s.head.0.load(Ordering::Acquire);
            if tail.wrapping_sub(self.cached_head) > s.mask {
                // Relaxed: a statistic, read after the fact.
                s.dropped.fetch_add(1, Ordering::Relaxed);
                return Err(value);
            }
        }
        let idx = tail & s.mask;
        debug_assert!(idx < s.slots.len());
        // SAFETY: `tail` is outside head..tail, so the slot belongs to the writer (invariant), and only
        // this writer exists.
        unsafe { (*s.slots.get_unchecked(idx).get()).write(value) };
        // Release: publishes the slot write to the reader's Acquire load of `tail`.
        s.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Counts values the caller chose not to push (e.g. a span whose begin was refused).
    pub fn count_drop(&self) {
        self.shared.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }
}

/// The consuming end. Lives with the collector.
pub struct RingReader<T> {
    shared: Arc<Shared<T>>,
}

impl<T: Send> RingReader<T> {
    /// Removes the oldest value.
    pub fn pop(&mut self) -> Option<T> {
        let mut out = None;
        self.drain_up_to(1, |v| out = Some(v));
        out
    }

    /// Hands every value present now to `f`, oldest first, and returns how many there were.
    pub fn drain(&mut self, f: impl FnMut(T)) -> usize {
        self.drain_up_to(usize::MAX, f)
    }

    /// Like [`drain`](Self::drain), but stops after `max` values.
    pub fn drain_up_to(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let s = &*self.shared;
        // Relaxed: only this reader stores `head`.
        let head = s.head.0.load(Ordering::Relaxed);
        // Acquire: pairs with the writer's Release store, so the slots up to `tail` are initialised.
        let tail = s.tail.0.load(Ordering::Acquire);
        let n = tail.wrapping_sub(head).min(max);
        for i in 0..n {
            let idx = head.wrapping_add(i) & s.mask;
            debug_assert!(idx < s.slots.len());
            // SAFETY: idx is in head..tail, so the slot is initialised and belongs to the reader; reading
            // it moves the value out, and advancing `head` below hands the slot back uninitialised.
            let v = unsafe { (*s.slots.get_unchecked(idx).get()).assume_init_read() };
            f(v);
        }
        // Release: our reads of the slots happen before the writer reuses them.
        s.head.0.store(head.wrapping_add(n), Ordering::Release);
        n
    }

    /// Values refused because the ring was full, since creation.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Whether the writer has gone away (its thread exited).
    pub fn writer_gone(&self) -> bool {
        Arc::strong_count(&self.shared) == 1
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const COUNT: usize = if cfg!(miri) { 500 } else { 1_000_000 };

    #[test]
    fn fifo_and_full() {
        let (mut w, mut r) = ring::<u32>(4);
        assert_eq!(w.capacity(), 4);
        for i in 0..4 {
            w.try_push(i).unwrap();
        }
        assert_eq!(w.try_push(99), Err(99));
        assert_eq!(r.dropped(), 1);
        assert_eq!(r.pop(), Some(0));
        w.try_push(4).unwrap();
        let mut got = vec![];
        assert_eq!(r.drain(|v| got.push(v)), 4);
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert_eq!(r.pop(), None);
    }

    #[test]
    fn spsc_stress_keeps_order_and_counts_drops() {
        let (mut w, mut r) = ring::<usize>(64);
        let producer = std::thread::spawn(move || {
            let mut pushed = 0usize;
            for i in 0..COUNT {
                if w.try_push(i).is_ok() {
                    pushed += 1;
                }
            }
            pushed
        });
        let mut last = None;
        let mut received = 0usize;
        loop {
            let done = producer.is_finished();
            r.drain(|v| {
                if let Some(l) = last {
                    assert!(v > l, "out of order: {v} after {l}");
                }
                last = Some(v);
                received += 1;
            });
            if done && r.drain(|_| received += 1) == 0 {
                break;
            }
        }
        let pushed = producer.join().unwrap();
        assert_eq!(received, pushed);
        assert_eq!(pushed as u64 + r.dropped(), COUNT as u64);
    }

    static LIVE: AtomicUsize = AtomicUsize::new(0);
    struct Counted;
    impl Counted {
        fn new() -> Self {
            LIVE.fetch_add(1, Ordering::SeqCst);
            Counted
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn drops_every_value_exactly_once() {
        {
            let (mut w, mut r) = ring::<Counted>(8);
            for _ in 0..20 {
                let _ = w.try_push(Counted::new()); // refused values drop here
            }
            assert_eq!(LIVE.load(Ordering::SeqCst), 8);
            r.drain_up_to(3, drop);
            assert_eq!(LIVE.load(Ordering::SeqCst), 5);
            drop(w);
            assert!(r.writer_gone());
        }
        assert_eq!(LIVE.load(Ordering::SeqCst), 0);
    }
}
