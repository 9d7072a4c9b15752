//! Blocking device waits in progress, per thread: a CUDA synchronize call (or a synchronous copy to
//! the host) entered and not yet returned. The flight recorder's hang check looks at these beside
//! the ops open in the rings: a job whose collective never completes on the GPU usually sits in
//! such a call (`.item()`, `torch.cuda.synchronize()`), which no framework op names, and whose
//! API record CUPTI writes only once it returns.
//!
//! A fixed table of slots, one claimed by each thread on its first wait and given back when the
//! thread exits: beginning and ending a wait are a few relaxed stores, nothing is allocated, and
//! a thread that finds the table full records no waits.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::clock::Ticks;
use crate::intern::NameId;

/// Threads that can be in a wait at once (more are not seen by the hang check).
const SLOTS: usize = 256;

struct Slot {
    /// The OS thread id of the thread holding the slot; 0: free.
    tid: AtomicU32,
    /// The wait's name ([`NameId`]'s raw value).
    name: AtomicU32,
    /// When the wait began ([`Ticks`]); 0: not in a wait.
    since: AtomicU64,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        tid: AtomicU32::new(0),
        name: AtomicU32::new(0),
        since: AtomicU64::new(0),
    }
}; SLOTS];

/// This thread's slot (gives it back when the thread exits) and how many waits it is inside
/// (a runtime call reaching the driver's: the outermost counts).
struct Held {
    slot: Cell<Option<usize>>,
    depth: Cell<u32>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(i) = self.slot.get() {
            TABLE[i].since.store(0, Ordering::Relaxed);
            // Release: the cleared wait is seen before the slot is free for another thread.
            TABLE[i].tid.store(0, Ordering::Release);
        }
    }
}

thread_local! {
    static HELD: Held = const {
        Held {
            slot: Cell::new(None),
            depth: Cell::new(0),
        }
    };
}

fn claim() -> Option<usize> {
    let tid = crate::recorder::current_tid().max(1);
    TABLE.iter().position(|s| {
        s.tid
            .compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    })
}

/// The calling thread enters a blocking wait named `name`. Pairs with [`end`].
#[inline]
pub fn begin(name: NameId) {
    let _ = HELD.try_with(|h| {
        let depth = h.depth.get();
        h.depth.set(depth + 1);
        if depth > 0 {
            return;
        }
        let slot = match h.slot.get() {
            Some(i) => i,
            None => match claim() {
                Some(i) => {
                    h.slot.set(Some(i));
                    i
                }
                None => return,
            },
        };
        let s = &TABLE[slot];
        s.name.store(name.0, Ordering::Relaxed);
        // Release: the name is seen with the start.
        s.since.store(Ticks::now().0.max(1), Ordering::Release);
    });
}

/// The calling thread's wait begun with [`begin`] returned.
#[inline]
pub fn end() {
    let _ = HELD.try_with(|h| {
        let depth = h.depth.get().saturating_sub(1);
        h.depth.set(depth);
        if depth == 0 {
            if let Some(i) = h.slot.get() {
                TABLE[i].since.store(0, Ordering::Relaxed);
            }
        }
    });
}

/// Forgets the calling thread's wait, if any: its end will never be reported (the callbacks that
/// report waits were unsubscribed while it ran).
pub fn reset() {
    let _ = HELD.try_with(|h| {
        h.depth.set(0);
        if let Some(i) = h.slot.get() {
            TABLE[i].since.store(0, Ordering::Relaxed);
        }
    });
}

/// The waits in progress now: (thread id, name, when it began).
pub fn open() -> impl Iterator<Item = (u32, NameId, Ticks)> {
    TABLE.iter().filter_map(|s| {
        // Acquire: pairs with `begin`'s Release store, so the name read is this wait's.
        let since = s.since.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let tid = s.tid.load(Ordering::Relaxed);
        let name = NameId(s.name.load(Ordering::Relaxed));
        (tid != 0).then_some((tid, name, Ticks(since)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mine() -> Vec<(NameId, Ticks)> {
        let tid = crate::recorder::current_tid().max(1);
        open()
            .filter(|&(t, _, _)| t == tid)
            .map(|(_, n, s)| (n, s))
            .collect()
    }

    #[test]
    fn a_wait_is_open_from_its_begin_to_its_end_and_the_outermost_counts() {
        let outer = crate::intern::intern("cudaStreamSynchronize");
        let inner = crate::intern::intern("cuStreamSynchronize");
        assert!(mine().is_empty());
        begin(outer);
        let first = mine();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, outer);
        begin(inner);
        assert_eq!(mine(), first, "the runtime call's wait stays the one seen");
        end();
        assert_eq!(mine(), first);
        end();
        assert!(mine().is_empty());
        // An end without a begin changes nothing.
        end();
        assert!(mine().is_empty());
        // A wait whose end never comes is forgotten by a reset, and the next one counts.
        begin(outer);
        reset();
        assert!(mine().is_empty());
        begin(inner);
        assert_eq!(mine().len(), 1);
        assert_eq!(mine()[0].0, inner);
        end();
        assert!(mine().is_empty());
    }

    #[test]
    fn a_thread_gives_its_slot_back_when_it_exits() {
        let name = crate::intern::intern("cudaDeviceSynchronize");
        let tid = std::thread::spawn(move || {
            begin(name);
            crate::recorder::current_tid().max(1)
        })
        .join()
        .unwrap();
        assert!(
            open().all(|(t, _, _)| t != tid),
            "an exited thread's wait is gone"
        );
        assert!(TABLE.iter().all(|s| s.tid.load(Ordering::Acquire) != tid));
    }
}
