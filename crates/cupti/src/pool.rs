//! The activity-buffer pool: 8-byte-aligned buffers reused across CUPTI's requests, bounded in total
//! bytes, and a lock-free hand-over from CUPTI's completion callback to the decoder.
//!
//! Each slot has a state word; every transition is one atomic compare-exchange, so neither callback
//! ever blocks or allocates on the completion path:
//!
//! ```text
//! EMPTY --request (allocates, within the bound)--> OUT --complete--> READY --take--> TAKEN --release--> FREE
//!                                          FREE --request--> OUT
//! ```
//!
//! The completion callback only stores `valid`/`seq` and publishes `READY` with `Release`; the decoder
//! takes `READY` slots with `Acquire`, so it sees every byte CUPTI wrote. Releasing with `Release` and
//! re-requesting with `Acquire` orders the decoder's reads before CUPTI's next writes.
//!
//! When the bound is hit: CUPTI ≥ 12.9 (API 27) gets a null buffer and counts the records it drops;
//! older CUPTI crashes on null, so it gets a reserve buffer whose records are counted and discarded.

use std::alloc::{alloc_zeroed, Layout};
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

use kinetrace_cupti_sys::v13::CUpti_Activity;
use kinetrace_cupti_sys::Cupti;

use crate::result::{activity, CuptiError, MAX_LIMIT_REACHED};

const EMPTY: u8 = 0;
const ALLOCATING: u8 = 1;
const FREE: u8 = 2;
const OUT: u8 = 3;
const READY: u8 = 4;
const TAKEN: u8 = 5;

/// Most buffers the pool can track (bound / buffer size is clamped to this).
pub const MAX_SLOTS: usize = 256;
/// Buffers outside the bound, handed out (and their records counted and discarded) when CUPTI must
/// not get null. They are recycled inside the completion callback, so two are normally enough.
pub const RESERVE_SLOTS: usize = 4;

/// Default bytes per buffer (Kineto uses 4 MiB).
pub const DEFAULT_BUFFER_SIZE: usize = 4 << 20;
/// Default bound on buffer memory (Kineto's default, 128 MB).
pub const DEFAULT_MAX_BYTES: usize = 128 << 20;

struct Slot {
    state: AtomicU8,
    ptr: AtomicPtr<u8>,
    size: AtomicUsize,
    valid: AtomicUsize,
    seq: AtomicU64,
    generation: AtomicU64,
    discard: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(EMPTY),
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            size: AtomicUsize::new(0),
            valid: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            discard: AtomicBool::new(false),
        }
    }
}

/// A completed buffer taken by the decoder. Only [`BufferPool::take_ready`] makes one and
/// [`BufferPool::release`] consumes it, so while it exists its slot is TAKEN: CUPTI is done with
/// the bytes and nobody writes them. (Buffers are never freed, see the end of this file.)
#[derive(Debug)]
pub struct Completed {
    slot: usize,
    ptr: usize,
    valid: usize,
    discard: bool,
    generation: u64,
    seq: u64,
}

impl Completed {
    /// Slot index.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Start of the buffer (an address).
    pub fn address(&self) -> usize {
        self.ptr
    }

    /// Bytes CUPTI filled.
    pub fn valid(&self) -> usize {
        self.valid
    }

    /// Whether its records must be counted as dropped instead of decoded.
    pub fn discard(&self) -> bool {
        self.discard
    }

    /// Which hand-out of the slot this buffer was (see [`BufferPool::outstanding`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The bytes CUPTI filled.
    pub fn bytes(&self) -> &[u8] {
        if self.ptr == 0 || self.valid == 0 {
            return &[];
        }
        // SAFETY: the slot is TAKEN for as long as `self` exists (see the type's documentation):
        // CUPTI completed it and published `valid` bytes with Release, `take_ready` Acquired them,
        // and nothing writes the buffer until `release` consumes `self`. The allocation (at least
        // `valid` bytes) is never freed.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.valid) }
    }

    /// Offsets of every record in the buffer, found with the library's own iterator (never by
    /// `sizeof`), so records of kinds and sizes this build does not know are stepped over
    /// correctly. Appends to `out`; `Err` when the walk stopped other than at the end of the data
    /// (the offsets found until then are kept).
    pub fn record_offsets(&self, cupti: &Cupti, out: &mut Vec<usize>) -> Result<(), CuptiError> {
        if self.ptr == 0 {
            return Ok(());
        }
        // SAFETY: the buffer is a TAKEN slot CUPTI completed with `valid` bytes (see `bytes`).
        unsafe { walk_records(cupti, self.ptr as *mut u8, self.valid, |off| out.push(off)) }
    }
}

/// Calls `each` with the offset of every record in a completed buffer, using
/// `cuptiActivityGetNextRecord`. Stops at the end of the data (`Ok`), at an error (`Err`), or at an
/// offset that does not advance (`Ok`: a library that misbehaves must not make us loop).
///
/// # Safety
/// `buf` must point at a buffer CUPTI completed with `valid` bytes, not handed back to CUPTI for the
/// duration of the call.
unsafe fn walk_records(
    cupti: &Cupti,
    buf: *mut u8,
    valid: usize,
    mut each: impl FnMut(usize),
) -> Result<(), CuptiError> {
    let mut rec: *mut CUpti_Activity = std::ptr::null_mut();
    let mut last: Option<usize> = None;
    loop {
        // SAFETY: the caller's contract for `buf`/`valid`; `rec` is null or the previous record
        // CUPTI returned from this buffer.
        match unsafe { activity::get_next_record(cupti, buf, valid, &mut rec) } {
            Ok(()) => {}
            Err(e) if e == MAX_LIMIT_REACHED => return Ok(()),
            Err(e) => return Err(e),
        }
        if rec.is_null() {
            return Ok(());
        }
        let off = (rec as usize).wrapping_sub(buf as usize);
        if off >= valid || last.is_some_and(|l| off <= l) {
            return Ok(());
        }
        last = Some(off);
        each(off);
    }
}

/// Counters of the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes currently allocated for buffers (reserve included).
    pub allocated_bytes: usize,
    /// Requests answered with a null buffer (CUPTI ≥ 12.9 only).
    pub refused: u64,
    /// Requests answered with a reserve buffer whose records are discarded.
    pub reserve_handed_out: u64,
    /// Requests answered with an allocation beyond the bound (reserve exhausted, CUPTI < 12.9).
    pub over_bound: u64,
    /// Completed buffers that were not ours (another client's registration raced ours).
    pub foreign: u64,
    /// Buffers completed so far.
    pub completed: u64,
    /// Records in reserve buffers, counted and discarded.
    pub discarded_records: u64,
    /// Walks of reserve buffers that `cuptiActivityGetNextRecord` ended with an error (their
    /// records after it are not counted), and the last such error.
    pub count_errors: (u64, Option<CuptiError>),
}

/// The process-wide pool (CUPTI's buffer callbacks are process-global).
pub struct BufferPool {
    slots: [Slot; MAX_SLOTS + RESERVE_SLOTS],
    buffer_size: AtomicUsize,
    max_bytes: AtomicUsize,
    allocated: AtomicUsize,
    null_ok: AtomicBool,
    seq: AtomicU64,
    refused: AtomicU64,
    reserve_handed_out: AtomicU64,
    over_bound: AtomicU64,
    foreign: AtomicU64,
    completed: AtomicU64,
    discarded_records: AtomicU64,
    count_errors: AtomicU64,
    last_count_error: AtomicU32,
    /// The library whose `cuptiActivityGetNextRecord` counts the records of reserve buffers.
    library: AtomicPtr<Cupti>,
}

impl BufferPool {
    /// An empty pool with the defaults.
    pub const fn new() -> BufferPool {
        BufferPool {
            slots: [const { Slot::new() }; MAX_SLOTS + RESERVE_SLOTS],
            buffer_size: AtomicUsize::new(DEFAULT_BUFFER_SIZE),
            max_bytes: AtomicUsize::new(DEFAULT_MAX_BYTES),
            allocated: AtomicUsize::new(0),
            null_ok: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reserve_handed_out: AtomicU64::new(0),
            over_bound: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            discarded_records: AtomicU64::new(0),
            count_errors: AtomicU64::new(0),
            last_count_error: AtomicU32::new(0),
            library: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Sets the library used to count the records of discarded (reserve) buffers.
    pub fn set_library(&self, cupti: &'static Cupti) {
        self.library
            .store(cupti as *const Cupti as *mut Cupti, Ordering::Release);
    }

    /// Counts the records in a completed buffer with the library's own iterator. Allocation-free:
    /// runs in CUPTI's completion callback.
    fn count_records(&self, ptr: *mut u8, valid: usize) -> u64 {
        let lib = self.library.load(Ordering::Acquire);
        if lib.is_null() {
            return 0;
        }
        // SAFETY: `lib` was stored from a `&'static Cupti` by `set_library`.
        let cupti = unsafe { &*lib };
        let mut n = 0;
        // SAFETY: CUPTI just completed `ptr` with `valid` bytes and the slot is still OUT: nothing
        // else reads or writes it until this callback marks it FREE.
        if let Err(e) = unsafe { walk_records(cupti, ptr, valid, |_| n += 1) } {
            self.count_errors.fetch_add(1, Ordering::Relaxed);
            self.last_count_error.store(e.0, Ordering::Relaxed);
        }
        n
    }

    /// Sets the size of buffers allocated from now on, the bound on their total, and whether the
    /// running CUPTI accepts a null buffer (API version ≥ 27). Relaxed: read by the next request.
    pub fn configure(&self, buffer_size: usize, max_bytes: usize, null_ok: bool) {
        let buffer_size = buffer_size.max(4096).next_multiple_of(8);
        self.buffer_size.store(buffer_size, Ordering::Relaxed);
        self.max_bytes.store(
            max_bytes.clamp(buffer_size, buffer_size * MAX_SLOTS),
            Ordering::Relaxed,
        );
        self.null_ok.store(null_ok, Ordering::Relaxed);
    }

    /// Allocates up to `n` buffers now, so early requests do not allocate.
    pub fn prefill(&self, n: usize) {
        for _ in 0..n {
            match self.allocate_into(0..MAX_SLOTS, FREE, true) {
                Some(_) => {}
                None => break,
            }
        }
    }

    /// Tries to allocate a buffer into an EMPTY slot in `range`, leaving it in `state`.
    fn allocate_into(
        &self,
        range: std::ops::Range<usize>,
        state: u8,
        bounded: bool,
    ) -> Option<usize> {
        let size = self.buffer_size.load(Ordering::Relaxed);
        if bounded {
            let max = self.max_bytes.load(Ordering::Relaxed);
            // Reserve the bytes first so concurrent requests cannot overshoot the bound.
            let prev = self.allocated.fetch_add(size, Ordering::Relaxed);
            if prev + size > max {
                self.allocated.fetch_sub(size, Ordering::Relaxed);
                return None;
            }
        } else {
            self.allocated.fetch_add(size, Ordering::Relaxed);
        }
        for i in range {
            let s = &self.slots[i];
            if s.state
                .compare_exchange(EMPTY, ALLOCATING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                let Ok(layout) = Layout::from_size_align(size, 8) else {
                    break;
                };
                // SAFETY: `layout` has a non-zero size (at least 4096, see `configure`).
                let ptr = unsafe { alloc_zeroed(layout) };
                if ptr.is_null() {
                    s.state.store(EMPTY, Ordering::Release);
                    break;
                }
                s.ptr.store(ptr, Ordering::Relaxed);
                s.size.store(size, Ordering::Relaxed);
                s.state.store(state, Ordering::Release);
                return Some(i);
            }
        }
        self.allocated.fetch_sub(size, Ordering::Relaxed);
        None
    }

    fn hand_out(&self, i: usize, discard: bool) -> (*mut u8, usize) {
        let s = &self.slots[i];
        s.discard.store(discard, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Relaxed);
        (
            s.ptr.load(Ordering::Relaxed),
            s.size.load(Ordering::Relaxed),
        )
    }

    /// Answers CUPTI's buffer request: a free buffer, a new one within the bound, or (bound hit) a
    /// null buffer on CUPTI ≥ 12.9 / a reserve buffer before. Returns `(ptr, size)`.
    pub fn request(&self) -> (*mut u8, usize) {
        for i in 0..MAX_SLOTS {
            let s = &self.slots[i];
            if s.state.load(Ordering::Relaxed) == FREE
                && s.state
                    .compare_exchange(FREE, OUT, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return self.hand_out(i, false);
            }
        }
        if let Some(i) = self.allocate_into(0..MAX_SLOTS, OUT, true) {
            return self.hand_out(i, false);
        }
        if self.null_ok.load(Ordering::Relaxed) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return (std::ptr::null_mut(), 0);
        }
        // CUPTI before 12.9 crashes on a null buffer: give it a reserve buffer and discard its records.
        for i in MAX_SLOTS..MAX_SLOTS + RESERVE_SLOTS {
            let s = &self.slots[i];
            if s.state
                .compare_exchange(FREE, OUT, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.reserve_handed_out.fetch_add(1, Ordering::Relaxed);
                return self.hand_out(i, true);
            }
        }
        if let Some(i) = self.allocate_into(MAX_SLOTS..MAX_SLOTS + RESERVE_SLOTS, OUT, false) {
            self.reserve_handed_out.fetch_add(1, Ordering::Relaxed);
            return self.hand_out(i, true);
        }
        // Every reserve buffer is out: allocate beyond the bound rather than crash the host.
        self.over_bound.fetch_add(1, Ordering::Relaxed);
        let size = self.buffer_size.load(Ordering::Relaxed);
        match Layout::from_size_align(size, 8) {
            // SAFETY: non-zero size. This buffer is never returned to the pool; its completion is
            // counted as foreign and it is leaked (a last resort that a bounded pool should not reach).
            Ok(layout) => (unsafe { alloc_zeroed(layout) }, size),
            Err(_) => (std::ptr::null_mut(), 0),
        }
    }

    /// Takes back a buffer CUPTI completed. Allocation-free, lock-free. (The context and stream
    /// CUPTI passes with it are not kept: every buffer has been global since CUDA 6.0, and they are
    /// always null and 0.)
    pub fn complete(&self, ptr: *mut u8, valid: usize) {
        if ptr.is_null() {
            return;
        }
        for s in self.slots.iter() {
            if s.ptr.load(Ordering::Relaxed) == ptr && s.state.load(Ordering::Relaxed) == OUT {
                self.completed.fetch_add(1, Ordering::Relaxed);
                if s.discard.load(Ordering::Relaxed) {
                    // A reserve buffer: count what was lost and recycle it at once (no decoding, no
                    // allocation), so CUPTI before 12.9 always finds one.
                    let n = self.count_records(ptr, valid);
                    self.discarded_records.fetch_add(n, Ordering::Relaxed);
                    s.state.store(FREE, Ordering::Release);
                    return;
                }
                if valid == 0 {
                    s.state.store(FREE, Ordering::Release);
                    return;
                }
                s.valid.store(valid, Ordering::Relaxed);
                s.seq
                    .store(self.seq.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
                // Release: publishes CUPTI's bytes and the fields above to the decoder.
                s.state.store(READY, Ordering::Release);
                return;
            }
        }
        self.foreign.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes every completed buffer, oldest completion first.
    pub fn take_ready(&self, out: &mut Vec<Completed>) {
        out.clear();
        for (i, s) in self.slots.iter().enumerate() {
            if s.state.load(Ordering::Relaxed) == READY
                && s.state
                    .compare_exchange(READY, TAKEN, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                out.push(Completed {
                    slot: i,
                    ptr: s.ptr.load(Ordering::Relaxed) as usize,
                    valid: s.valid.load(Ordering::Relaxed),
                    discard: s.discard.load(Ordering::Relaxed),
                    generation: s.generation.load(Ordering::Relaxed),
                    seq: s.seq.load(Ordering::Relaxed),
                });
            }
        }
        out.sort_by_key(|c| c.seq);
    }

    /// Returns a taken buffer to the free list.
    pub fn release(&self, buffer: Completed) {
        if let Some(s) = self.slots.get(buffer.slot) {
            // Release: our reads of the buffer happen before CUPTI's next writes into it.
            let _ = s
                .state
                .compare_exchange(TAKEN, FREE, Ordering::Release, Ordering::Relaxed);
        }
    }

    /// Buffers now held by CUPTI, as (slot, generation): a flush waits until these come back.
    pub fn outstanding(&self) -> Vec<(usize, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state.load(Ordering::Acquire) == OUT)
            .map(|(i, s)| (i, s.generation.load(Ordering::Relaxed)))
            .collect()
    }

    /// Whether the buffer handed out as `(slot, generation)` is still with CUPTI.
    pub fn still_out(&self, slot: usize, generation: u64) -> bool {
        self.slots.get(slot).is_some_and(|s| {
            s.state.load(Ordering::Acquire) == OUT
                && s.generation.load(Ordering::Relaxed) == generation
        })
    }

    /// Whether the buffer handed out as `(slot, generation)` has not reached the decoder yet: CUPTI
    /// still holds it, or completed it and it was not taken yet.
    pub fn not_taken(&self, slot: usize, generation: u64) -> bool {
        self.slots.get(slot).is_some_and(|s| {
            matches!(s.state.load(Ordering::Acquire), OUT | READY)
                && s.generation.load(Ordering::Relaxed) == generation
        })
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            allocated_bytes: self.allocated.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            reserve_handed_out: self.reserve_handed_out.load(Ordering::Relaxed),
            over_bound: self.over_bound.load(Ordering::Relaxed),
            foreign: self.foreign.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            discarded_records: self.discarded_records.load(Ordering::Relaxed),
            count_errors: (
                self.count_errors.load(Ordering::Relaxed),
                match self.last_count_error.load(Ordering::Relaxed) {
                    0 => None,
                    code => Some(CuptiError(code)),
                },
            ),
        }
    }
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

// Buffers are leaked on purpose when a pool is dropped in tests; the process-wide pool is a static
// and never dropped (CUPTI may still hold buffers).

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(size: usize, max: usize, null_ok: bool) -> &'static BufferPool {
        let p = Box::leak(Box::new(BufferPool::new()));
        p.configure(size, max, null_ok);
        p
    }

    #[test]
    fn buffers_are_aligned_reused_and_bounded() {
        let p = pool(4096, 3 * 4096, true);
        let (a, sa) = p.request();
        assert_eq!(sa, 4096);
        assert_eq!(a as usize % 8, 0);
        let (b, _) = p.request();
        let (c, _) = p.request();
        assert!(!b.is_null() && !c.is_null());
        // Bound hit: CUPTI >= 12.9 gets null.
        assert!(p.request().0.is_null());
        assert_eq!(p.stats().refused, 1);
        assert_eq!(p.stats().allocated_bytes, 3 * 4096);
        p.complete(a, 100);
        let mut done = Vec::new();
        p.take_ready(&mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].address(), done[0].valid(), done[0].discard()),
            (a as usize, 100, false)
        );
        assert_eq!(done[0].bytes().len(), 100);
        p.release(done.remove(0));
        // Reused, not reallocated.
        assert_eq!(p.request().0, a);
        assert_eq!(p.stats().allocated_bytes, 3 * 4096);
    }

    #[test]
    fn old_cupti_never_gets_null() {
        let p = pool(4096, 4096, false);
        assert!(!p.request().0.is_null());
        let (r1, _) = p.request();
        let (r2, _) = p.request();
        let (r3, _) = p.request();
        assert!(!r1.is_null() && !r2.is_null() && !r3.is_null());
        let more: Vec<_> = (0..RESERVE_SLOTS - 3).map(|_| p.request().0).collect();
        assert!(more.iter().all(|b| !b.is_null()));
        assert_eq!(p.stats().reserve_handed_out, RESERVE_SLOTS as u64);
        assert!(!p.request().0.is_null());
        assert_eq!(p.stats().over_bound, 1);
        // Reserve buffers are recycled by the completion itself (nothing to decode).
        p.complete(r1, 64);
        let mut done = Vec::new();
        p.take_ready(&mut done);
        assert!(done.is_empty());
        assert_eq!(p.request().0, r1);
    }

    #[test]
    fn completion_order_is_kept_and_foreign_buffers_ignored() {
        let p = pool(4096, 8 * 4096, true);
        let bufs: Vec<_> = (0..4).map(|_| p.request().0).collect();
        for b in bufs.iter().rev() {
            p.complete(*b, 8);
        }
        let mut x = 0u64;
        p.complete(&mut x as *mut u64 as *mut u8, 8);
        assert_eq!(p.stats().foreign, 1);
        let mut done = Vec::new();
        p.take_ready(&mut done);
        let order: Vec<_> = done.iter().map(|c| c.address()).collect();
        let expected: Vec<_> = bufs.iter().rev().map(|p| *p as usize).collect();
        assert_eq!(order, expected);
    }

    #[test]
    fn outstanding_tracks_generations() {
        let p = pool(4096, 2 * 4096, true);
        let (a, _) = p.request();
        let out = p.outstanding();
        assert_eq!(out.len(), 1);
        assert!(p.still_out(out[0].0, out[0].1));
        p.complete(a, 0);
        assert!(!p.still_out(out[0].0, out[0].1));
    }

    #[test]
    fn a_buffer_is_not_taken_until_the_decoder_takes_it() {
        let p = pool(4096, 2 * 4096, true);
        let (a, _) = p.request();
        let (slot, generation) = p.outstanding()[0];
        assert!(p.not_taken(slot, generation));
        p.complete(a, 64);
        assert!(p.not_taken(slot, generation), "completed but not taken yet");
        let mut done = Vec::new();
        p.take_ready(&mut done);
        assert_eq!((done[0].slot(), done[0].generation()), (slot, generation));
        assert!(!p.not_taken(slot, generation));
        p.release(done.remove(0));
        // Handed out again: a new generation, so the old hand-out stays taken.
        assert_eq!(p.request().0, a);
        assert!(!p.not_taken(slot, generation));
        assert!(p.not_taken(slot, generation + 1));
    }
}
