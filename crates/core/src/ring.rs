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
//! - `writer_alive` turns false exactly once, after the writer's last push: a reader that sees it false
//!   (Acquire) and then drains gets every value the writer ever pushed.
//!
//! Overflow policy: [`RingWriter::try_push`] never blocks or allocates; when the ring is full it hands
//! the value back and counts the drop, and the reader reports the count.
//!
//! Every atomic and cell comes from the private `sync` module, so `RUSTFLAGS="--cfg loom"` swaps in
//! loom's and the model tests at the bottom explore every interleaving (`scripts/loom.sh`).

use std::mem::MaybeUninit;

use sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use sync::{Arc, UnsafeCell};

/// std's primitives, or loom's under `cfg(loom)`; only this module differs between the two builds.
mod sync {
    #[cfg(loom)]
    pub(crate) use loom::cell::UnsafeCell;
    #[cfg(loom)]
    pub(crate) use loom::sync::{atomic, Arc};

    #[cfg(not(loom))]
    pub(crate) use std::sync::{atomic, Arc};

    /// `std::cell::UnsafeCell` with loom's access API, so the ring's code is the same in both builds.
    #[cfg(not(loom))]
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// Pads and aligns a value to 128 bytes so the producer's and consumer's indices never share a cache
/// line (false sharing would make every push stall on the consumer's reads).
#[repr(align(128))]
struct CachePadded<T>(T);

struct Shared<T> {
    /// Next slot the consumer reads. Written only by the reader.
    head: CachePadded<AtomicUsize>,
    /// Next slot the producer writes. Written only by the writer.
    tail: CachePadded<AtomicUsize>,
    /// Values refused because the ring was full, or counted by the writer's owner.
    dropped: AtomicU64,
    /// False once the writer is dropped (its thread exited).
    writer_alive: AtomicBool,
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
        // Relaxed: `&mut self` means both handles are gone, and dropping the last `Arc` synchronised
        // with their final stores.
        let head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Relaxed);
        let mut i = head;
        while i != tail {
            // SAFETY: slots in head..tail are initialised (invariant) and we have `&mut self`, so no
            // handle can touch them any more.
            self.slots[i & self.mask].with_mut(|p| unsafe { (*p).assume_init_drop() });
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
        writer_alive: AtomicBool::new(true),
        mask: cap - 1,
        slots,
    });
    (
        RingWriter {
            shared: shared.clone(),
            cached_head: 0,
            check_at: cap / 2,
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
    /// The `tail` at which to check whether the ring is past its fill mark (half full): one compare
    /// per push, a load of `head` only when it is reached.
    check_at: usize,
}

impl<T: Send> RingWriter<T> {
    /// Appends `value`, or hands it back (and counts a drop) when the ring is full.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        self.push_checked(value).map(|_| ())
    }

    /// Like [`try_push`](Self::try_push), and says `Ok(true)` when this push left the ring at or
    /// past half full, so the caller can wake the reader before it fills. Said again after every
    /// further eighth of the ring while it stays past the mark, never on every push.
    #[inline]
    pub fn push_checked(&mut self, value: T) -> Result<bool, T> {
        let s = &*self.shared;
        // Relaxed: only this writer stores `tail`.
        let tail = s.tail.0.load(Ordering::Relaxed);
        if tail.wrapping_sub(self.cached_head) > s.mask {
            // Acquire: pairs with the reader's Release store of `head`, so its reads of the slots it
            // freed happen before we overwrite them.
            self.cached_head = s.head.0.load(Ordering::Acquire);
            if tail.wrapping_sub(self.cached_head) > s.mask {
                self.count_drop();
                return Err(value);
            }
        }
        let idx = tail & s.mask;
        debug_assert!(idx < s.slots.len());
        // SAFETY: `tail` is outside head..tail, so the slot belongs to the writer (invariant), and only
        // this writer exists.
        s.slots[idx].with_mut(|p| unsafe { (*p).write(value) });
        let next = tail.wrapping_add(1);
        // Release: publishes the slot write to the reader's Acquire load of `tail`.
        s.tail.0.store(next, Ordering::Release);
        if next != self.check_at {
            return Ok(false);
        }
        // Acquire: as above.
        self.cached_head = s.head.0.load(Ordering::Acquire);
        let mark = (s.mask >> 1) + 1;
        if next.wrapping_sub(self.cached_head) >= mark {
            self.check_at = next.wrapping_add(((s.mask + 1) / 8).max(1));
            return Ok(true);
        }
        // Below the mark: check again when the tail could reach it.
        self.check_at = self.cached_head.wrapping_add(mark);
        Ok(false)
    }

    /// Counts a value that never reached the ring (refused by the caller, e.g. a push re-entered from
    /// a signal handler while this thread was already pushing); the reader reports it with the rest.
    #[inline]
    pub fn count_drop(&self) {
        // Relaxed: a statistic, read after the fact.
        self.shared.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }
}

impl<T> Drop for RingWriter<T> {
    fn drop(&mut self) {
        // Release: every push (its slot write and `tail` store) happens before a reader's Acquire load
        // that sees `false`, so the reader's next drain finds all of them.
        self.shared.writer_alive.store(false, Ordering::Release);
    }
}

/// The consuming end. Lives with the collector.
pub struct RingReader<T> {
    shared: Arc<Shared<T>>,
}

/// Moves `head` past the values handed out so far when it goes out of scope, so the values a drain
/// callback received are never read again, even when the callback panics.
struct Advance<'a> {
    head: &'a AtomicUsize,
    start: usize,
    taken: usize,
}

impl Drop for Advance<'_> {
    fn drop(&mut self) {
        // Release: our reads of the slots happen before the writer reuses them.
        self.head
            .store(self.start.wrapping_add(self.taken), Ordering::Release);
    }
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

    /// Like [`drain`](Self::drain), but stops after `max` values. If `f` panics, the values it was
    /// given are gone (it owned them) and the rest stay for the next drain.
    pub fn drain_up_to(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let s = &*self.shared;
        // Relaxed: only this reader stores `head`.
        let head = s.head.0.load(Ordering::Relaxed);
        // Acquire: pairs with the writer's Release store, so the slots up to `tail` are initialised.
        let tail = s.tail.0.load(Ordering::Acquire);
        let n = tail.wrapping_sub(head).min(max);
        let mut advance = Advance {
            head: &s.head.0,
            start: head,
            taken: 0,
        };
        for i in 0..n {
            let idx = head.wrapping_add(i) & s.mask;
            debug_assert!(idx < s.slots.len());
            // SAFETY: idx is in head..tail, so the slot is initialised and belongs to the reader; reading
            // it moves the value out, and `advance` (counted before `f` runs) hands the slot back
            // uninitialised, so it is never read twice.
            let v = s.slots[idx].with_mut(|p| unsafe { (*p).assume_init_read() });
            advance.taken = i + 1;
            f(v);
        }
        drop(advance);
        n
    }

    /// Drains like [`drain`](Self::drain) and says whether the ring is finished: `true` means the
    /// writer was already gone before this drain began, so this drain took everything it will ever
    /// push and the ring can be retired. (Checking after draining would race with a last push.)
    pub fn drain_final(&mut self, f: impl FnMut(T)) -> (usize, bool) {
        self.drain_final_up_to(usize::MAX, f)
    }

    /// [`drain_final`](Self::drain_final), taking at most `max` values: finished only if the
    /// writer was gone before and nothing is left.
    pub fn drain_final_up_to(&mut self, max: usize, f: impl FnMut(T)) -> (usize, bool) {
        let gone = self.writer_gone();
        let n = self.drain_up_to(max, f);
        (n, gone && self.is_empty())
    }

    /// Whether no value is waiting.
    pub fn is_empty(&self) -> bool {
        let s = &*self.shared;
        // Acquire: as in `drain_up_to`.
        s.tail.0.load(Ordering::Acquire) == s.head.0.load(Ordering::Relaxed)
    }

    /// Values refused because the ring was full (or counted by the writer), since creation.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Whether the writer has gone away (its thread exited). Once true, one more drain takes every
    /// value it pushed (see [`drain_final`](Self::drain_final)).
    pub fn writer_gone(&self) -> bool {
        // Acquire: pairs with the writer's Release in its `Drop`.
        !self.shared.writer_alive.load(Ordering::Acquire)
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }
}

#[cfg(all(test, not(loom)))]
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
    fn the_fill_mark_is_reported_once_per_eighth_past_half() {
        let (mut w, mut r) = ring::<u32>(16);
        let marks: Vec<bool> = (0..16).map(|i| w.push_checked(i).unwrap()).collect();
        // Half full at the 8th push, then again every 2 pushes (an eighth of 16) while past it.
        let at: Vec<usize> = marks
            .iter()
            .enumerate()
            .filter(|(_, m)| **m)
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(at, [8, 10, 12, 14, 16]);
        r.drain(drop);
        // Emptied: the next report comes when it is half full again.
        let marks: Vec<bool> = (16..32).map(|i| w.push_checked(i).unwrap()).collect();
        let at: Vec<usize> = marks
            .iter()
            .enumerate()
            .filter(|(_, m)| **m)
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(at[0], 8, "{at:?}");
    }

    /// A callback that panics mid-drain: the values already handed out belong to it and must never
    /// be read (and dropped) again; the rest stay in the ring for the next drain.
    #[test]
    fn a_panicking_drain_callback_drops_nothing_twice() {
        static DROPS: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];
        struct Tracked(usize);
        impl Drop for Tracked {
            fn drop(&mut self) {
                DROPS[self.0].fetch_add(1, Ordering::SeqCst);
            }
        }
        let (mut w, mut r) = ring::<Tracked>(8);
        for i in 0..6 {
            assert!(w.try_push(Tracked(i)).is_ok());
        }
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.drain(|v| {
                if v.0 == 2 {
                    panic!("callback fails on value 2");
                }
            })
        }));
        assert!(res.is_err());
        let dropped: Vec<usize> = DROPS.iter().map(|d| d.load(Ordering::SeqCst)).collect();
        assert_eq!(dropped, [1, 1, 1, 0, 0, 0], "values 0..=2 were handed out");
        let mut rest = Vec::new();
        r.drain(|v| rest.push(v.0));
        assert_eq!(rest, [3, 4, 5]);
        drop((w, r));
        let dropped: Vec<usize> = DROPS.iter().map(|d| d.load(Ordering::SeqCst)).collect();
        assert_eq!(dropped, [1; 6], "every value dropped exactly once");
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

/// Model checks of the ring under loom: `RUSTFLAGS="--cfg loom" cargo test -p kinetrace-core --lib
/// ring::loom` (scripts/loom.sh). Every interleaving of one writer and one reader is explored.
#[cfg(all(test, loom))]
mod loom {
    use super::*;
    use ::loom::thread;

    /// Concurrent pushes and drains keep FIFO order, and every value is received or counted.
    #[test]
    fn push_and_drain_keep_order_and_account_for_everything() {
        ::loom::model(|| {
            let (mut w, mut r) = ring::<usize>(2);
            let producer = thread::spawn(move || {
                let mut pushed = 0;
                for i in 0..3 {
                    if w.try_push(i).is_ok() {
                        pushed += 1;
                    }
                }
                pushed
            });
            let mut got = Vec::new();
            r.drain(|v| got.push(v));
            let pushed = producer.join().unwrap();
            r.drain(|v| got.push(v));
            assert!(got.windows(2).all(|p| p[0] < p[1]), "{got:?}");
            assert_eq!(got.len(), pushed);
            assert_eq!(pushed as u64 + r.dropped(), 3);
        });
    }

    /// The collector's retire protocol: values pushed just before the writer's thread exits are never
    /// lost, whenever the collector looks.
    #[test]
    fn a_ring_is_retired_only_after_its_last_value() {
        ::loom::model(|| {
            let (mut w, mut r) = ring::<usize>(4);
            let producer = thread::spawn(move || {
                w.try_push(1).unwrap();
                w.try_push(2).unwrap();
            });
            let mut got = 0;
            loop {
                let (n, finished) = r.drain_final(|_| {});
                got += n;
                if finished {
                    break;
                }
                thread::yield_now();
            }
            producer.join().unwrap();
            assert_eq!(got, 2);
        });
    }

    /// The same protocol one value at a time (a drain budget): finished only once the writer is
    /// gone and nothing is left.
    #[test]
    fn a_ring_drained_in_small_budgets_is_retired_only_after_its_last_value() {
        ::loom::model(|| {
            let (mut w, mut r) = ring::<usize>(4);
            let producer = thread::spawn(move || {
                w.try_push(1).unwrap();
                w.try_push(2).unwrap();
            });
            let mut got = 0;
            loop {
                let (n, finished) = r.drain_final_up_to(1, |_| {});
                got += n;
                if finished {
                    break;
                }
                thread::yield_now();
            }
            producer.join().unwrap();
            assert_eq!(got, 2);
        });
    }

    /// A value left in the ring when both ends are dropped (on either thread) is dropped once.
    #[test]
    fn leftovers_are_dropped_once_whichever_end_goes_last() {
        ::loom::model(|| {
            let live = Arc::new(AtomicUsize::new(0));
            struct Counted(Arc<AtomicUsize>);
            impl Drop for Counted {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let (mut w, r) = ring::<Counted>(2);
            let l = live.clone();
            let producer = thread::spawn(move || {
                l.fetch_add(1, Ordering::SeqCst);
                let _ = w.try_push(Counted(l.clone()));
            });
            drop(r);
            producer.join().unwrap();
            assert_eq!(live.load(Ordering::SeqCst), 0);
        });
    }
}
