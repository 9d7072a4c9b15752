//! Launch attribution for runtimes that issue a kernel on one thread and launch it later on another.
//!
//! The CUDA backend labels a kernel with the External id that is current on the thread calling
//! `cuLaunchKernel`. Runtimes with a device server thread (cubecl, hence burn's CUDA backend) call
//! the driver from that thread, where no range of the user's is open, so the kernel would carry
//! nothing. Such a runtime's adapter does two things:
//!
//! - on the issuing thread, when a launch is queued, [`LaunchQueues::push`] records
//!   `(current External id, kernel name)` under the runtime's stream of that thread;
//! - it registers a [`LaunchProvider`] ([`set_launch_provider`]) that the CUDA backend's driver
//!   enter callback asks for every kernel launch: the provider finds the stream the server is
//!   launching for and [`LaunchQueues::pop`]s the entry whose name matches the launched symbol.
//!
//! Pairing is by order per stream (each stream's launches reach the driver in the order they were
//! issued), checked by name, so a launch that was queued but never reached the driver (a dry run,
//! a failed compile) is skipped at the next launch of another kernel instead of shifting every
//! later attribution. Memory is bounded: a fixed number of streams, each with a fixed-capacity
//! FIFO allocated once, when the stream is first seen. The hot path takes one uncontended mutex
//! per push and pop (the issuing thread and the server thread are the only users of a stream's
//! FIFO) and allocates nothing.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::recorder;

/// Answers the External id of the range that issued the kernel being launched on this thread, or
/// `None`. `symbol` is the launched function's name where the driver reports it. Called from a
/// CUDA driver callback: it must not panic, block for long or launch anything.
pub type LaunchProvider = fn(symbol: Option<&CStr>) -> Option<u64>;

static PROVIDER: OnceLock<LaunchProvider> = OnceLock::new();
/// Whether the registered provider is asked. Relaxed: a launch racing the switch is attributed by
/// whichever state it reads; nothing else is published through it.
static PROVIDER_ON: AtomicBool = AtomicBool::new(false);

/// Registers `provider` for the process and switches it on. One provider per process (like a
/// global `tracing` subscriber): registering the same function again switches it back on and
/// returns `true`; a different function is refused (`false`).
pub fn set_launch_provider(provider: LaunchProvider) -> bool {
    let registered = *PROVIDER.get_or_init(|| provider);
    // Compared by address: the same function registered twice is the same provider.
    let same = registered as usize == provider as usize;
    if same {
        PROVIDER_ON.store(true, Ordering::Relaxed);
    }
    same
}

/// Stops asking the registered provider (it stays registered; [`set_launch_provider`] with the same
/// function switches it on again).
pub fn disable_launch_provider() {
    PROVIDER_ON.store(false, Ordering::Relaxed);
}

/// The External id the registered provider gives this launch, if a provider is on. One relaxed
/// load when none is.
#[inline]
pub fn provided_external_id(symbol: Option<&CStr>) -> Option<u64> {
    if !PROVIDER_ON.load(Ordering::Relaxed) {
        return None;
    }
    PROVIDER.get().and_then(|p| p(symbol))
}

/// Whether a kernel name recorded at issue matches the symbol the driver launches
/// (runtime-specific: the runtime's adapter knows how it names its kernels).
pub type NameMatch = fn(kernel: &'static str, symbol: &[u8]) -> bool;

/// One issued launch: the External id current on the issuing thread (0: none) and the kernel name.
#[derive(Clone, Copy, Debug)]
struct Entry {
    external_id: u64,
    name: &'static str,
    epoch: u64,
}

/// One stream's FIFO: `key` is the stream id + 1 (0: free), claimed once and never released.
struct Slot {
    key: AtomicU64,
    fifo: Mutex<VecDeque<Entry>>,
}

/// What the queues saw since they were made (all counts, relaxed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchQueueStats {
    /// Launches queued by issuing threads.
    pub pushed: u64,
    /// Driver launches paired with a queued entry.
    pub paired: u64,
    /// Queued entries dropped because a later one matched first (queued, never launched).
    pub skipped: u64,
    /// Driver launches with no matching entry (nothing queued for that stream, or no name match).
    pub unpaired: u64,
    /// Oldest entries dropped because a stream's FIFO was full.
    pub overflowed: u64,
    /// Entries dropped because they were queued in an earlier recording window.
    pub stale: u64,
    /// Pushes refused because every stream slot was taken by other streams.
    pub untracked: u64,
}

#[derive(Default)]
struct Counters {
    pushed: AtomicU64,
    paired: AtomicU64,
    skipped: AtomicU64,
    unpaired: AtomicU64,
    overflowed: AtomicU64,
    stale: AtomicU64,
    untracked: AtomicU64,
}

#[inline]
fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        // Relaxed: statistics, read after the fact.
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Per-stream FIFOs of issued launches (see the module docs).
pub struct LaunchQueues {
    slots: Box<[Slot]>,
    capacity: usize,
    counters: Counters,
    epoch: fn() -> u64,
}

impl LaunchQueues {
    /// Queues for up to `streams` streams of `capacity` launches each (both at least 1). Memory:
    /// `streams` slots now, and `capacity` × 32 bytes per stream when it is first used. Streams
    /// are keyed by id + 1 (0 marks a free slot), so id `u64::MAX` shares id 0's FIFO.
    pub fn new(streams: usize, capacity: usize) -> LaunchQueues {
        let slots = (0..streams.max(1))
            .map(|_| Slot {
                key: AtomicU64::new(0),
                fifo: Mutex::new(VecDeque::new()),
            })
            .collect();
        LaunchQueues {
            slots,
            capacity: capacity.max(1),
            counters: Counters::default(),
            epoch: recorder::recording_epoch,
        }
    }

    /// The same queues with `epoch` in place of [`recorder::recording_epoch`] (tests: the
    /// recorder's epoch is process-wide).
    pub fn with_epoch(mut self, epoch: fn() -> u64) -> LaunchQueues {
        self.epoch = epoch;
        self
    }

    fn find(&self, stream: u64) -> Option<&Slot> {
        let key = stream.wrapping_add(1).max(1);
        // Acquire: pairs with the claiming CAS, so the slot's key is read after it was set.
        self.slots
            .iter()
            .take_while(|s| s.key.load(Ordering::Acquire) != 0)
            .find(|s| s.key.load(Ordering::Acquire) == key)
    }

    fn find_or_claim(&self, stream: u64) -> Option<&Slot> {
        let key = stream.wrapping_add(1).max(1);
        for slot in self.slots.iter() {
            match slot.key.load(Ordering::Acquire) {
                k if k == key => return Some(slot),
                0 => {
                    // Slots are claimed in order and never freed, so the first free one ends the
                    // search; another thread may claim it first (for its own stream or this one).
                    match slot
                        .key
                        .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(_) => return Some(slot),
                        Err(k) if k == key => return Some(slot),
                        Err(_) => continue,
                    }
                }
                _ => continue,
            }
        }
        None
    }

    /// Records, on the issuing thread, that `name` was issued on `stream` while `external_id` (0:
    /// none) was current. `false` when the stream could not be tracked (every slot taken).
    pub fn push(&self, stream: u64, external_id: u64, name: &'static str) -> bool {
        let Some(slot) = self.find_or_claim(stream) else {
            add(&self.counters.untracked, 1);
            return false;
        };
        let entry = Entry {
            external_id,
            name,
            epoch: (self.epoch)(),
        };
        let mut fifo = slot.fifo.lock().unwrap_or_else(|e| e.into_inner());
        if fifo.capacity() == 0 {
            // Once per stream: the only allocation.
            fifo.reserve_exact(self.capacity);
        }
        if fifo.len() >= self.capacity {
            fifo.pop_front();
            add(&self.counters.overflowed, 1);
        }
        fifo.push_back(entry);
        drop(fifo);
        add(&self.counters.pushed, 1);
        true
    }

    /// On the launching thread: the External id of the oldest launch queued on `stream` whose
    /// name matches `symbol` (any name when `symbol` is `None`). Entries queued before it were
    /// never launched and are dropped; entries of an earlier recording window are dropped first.
    /// `None` when nothing matches (the queue is left as it was) or the entry had no id.
    pub fn pop(&self, stream: u64, symbol: Option<&[u8]>, matches: NameMatch) -> Option<u64> {
        let Some(slot) = self.find(stream) else {
            add(&self.counters.unpaired, 1);
            return None;
        };
        let epoch = (self.epoch)();
        let mut fifo = slot.fifo.lock().unwrap_or_else(|e| e.into_inner());
        let mut stale = 0;
        while fifo.front().is_some_and(|e| e.epoch != epoch) {
            fifo.pop_front();
            stale += 1;
        }
        let at = match symbol {
            None => (!fifo.is_empty()).then_some(0),
            Some(symbol) => fifo.iter().position(|e| matches(e.name, symbol)),
        };
        let found = at.map(|at| {
            let skipped = at as u64;
            fifo.drain(..at);
            (fifo.pop_front(), skipped)
        });
        drop(fifo);
        add(&self.counters.stale, stale);
        match found {
            Some((Some(entry), skipped)) => {
                add(&self.counters.skipped, skipped);
                add(&self.counters.paired, 1);
                (entry.external_id != 0).then_some(entry.external_id)
            }
            _ => {
                add(&self.counters.unpaired, 1);
                None
            }
        }
    }

    /// Entries waiting on `stream`.
    pub fn pending(&self, stream: u64) -> usize {
        self.find(stream)
            .map(|s| s.fifo.lock().unwrap_or_else(|e| e.into_inner()).len())
            .unwrap_or(0)
    }

    /// The counts so far.
    pub fn stats(&self) -> LaunchQueueStats {
        let c = &self.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LaunchQueueStats {
            pushed: r(&c.pushed),
            paired: r(&c.paired),
            skipped: r(&c.skipped),
            unpaired: r(&c.unpaired),
            overflowed: r(&c.overflowed),
            stale: r(&c.stale),
            untracked: r(&c.untracked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    fn exact(kernel: &'static str, symbol: &[u8]) -> bool {
        kernel.as_bytes() == symbol
    }

    /// A simulated runtime: issuing threads push, then send the launch to one server thread,
    /// which pops for the stream the launch came from (as cubecl's server does under the
    /// issuer's stream id).
    #[test]
    fn several_issuers_one_server_every_launch_paired() {
        let q = Arc::new(LaunchQueues::new(8, 256).with_epoch(|| 0));
        let (tx, rx) = mpsc::channel::<(u64, &'static str, u64)>();
        let names: [&'static str; 3] = ["matmul", "add", "relu"];
        let issuers: Vec<_> = (0..4u64)
            .map(|stream| {
                let (q, tx) = (q.clone(), tx.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let name = names[(i % 3) as usize];
                        let id = stream * 1000 + i + 1;
                        assert!(q.push(stream, id, name));
                        tx.send((stream, name, id)).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let server = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut wrong = Vec::new();
                for (stream, name, id) in rx {
                    let got = q.pop(stream, Some(name.as_bytes()), exact);
                    if got != Some(id) {
                        wrong.push((stream, name, id, got));
                    }
                }
                wrong
            })
        };
        for t in issuers {
            t.join().unwrap();
        }
        let wrong = server.join().unwrap();
        assert!(
            wrong.is_empty(),
            "misattributed: {:?}",
            &wrong[..wrong.len().min(5)]
        );
        let s = q.stats();
        assert_eq!(
            (s.pushed, s.paired, s.skipped, s.unpaired),
            (800, 800, 0, 0)
        );
    }

    /// The server runs streams in a different order than they were issued across streams (it may
    /// drain one stream's work before another's): per-stream order is all pairing relies on.
    #[test]
    fn server_reordering_streams_still_pairs() {
        let q = LaunchQueues::new(4, 16).with_epoch(|| 0);
        for i in 0..5 {
            q.push(1, 10 + i, "a");
            q.push(2, 20 + i, "b");
        }
        // Stream 2 first, then stream 1.
        let two: Vec<_> = (0..5).map(|_| q.pop(2, Some(b"b"), exact)).collect();
        let one: Vec<_> = (0..5).map(|_| q.pop(1, Some(b"a"), exact)).collect();
        assert_eq!(two, (20..25).map(Some).collect::<Vec<_>>());
        assert_eq!(one, (10..15).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn launch_without_entry_is_unpaired_and_leaves_the_queue() {
        let q = LaunchQueues::new(4, 16).with_epoch(|| 0);
        assert_eq!(q.pop(7, Some(b"k"), exact), None, "stream never seen");
        q.push(7, 5, "k");
        assert_eq!(q.pop(7, Some(b"other"), exact), None, "no name matches");
        assert_eq!(
            q.pending(7),
            1,
            "an unmatched launch leaves the entry for its own launch"
        );
        assert_eq!(q.pop(7, Some(b"k"), exact), Some(5));
        assert_eq!(q.pop(7, None, exact), None, "empty");
        let s = q.stats();
        assert_eq!((s.paired, s.unpaired), (1, 3));
    }

    #[test]
    fn entry_queued_but_never_launched_is_skipped_by_name() {
        let q = LaunchQueues::new(4, 16).with_epoch(|| 0);
        q.push(3, 1, "never_launched");
        q.push(3, 2, "k");
        assert_eq!(q.pop(3, Some(b"k"), exact), Some(2));
        assert_eq!(q.pending(3), 0);
        assert_eq!(q.stats().skipped, 1);
        // Without a symbol the oldest entry is taken.
        q.push(3, 8, "x");
        q.push(3, 9, "y");
        assert_eq!(q.pop(3, None, exact), Some(8));
    }

    #[test]
    fn entry_without_id_is_consumed_but_gives_none() {
        let q = LaunchQueues::new(4, 16).with_epoch(|| 0);
        q.push(1, 0, "k");
        q.push(1, 4, "k");
        assert_eq!(q.pop(1, Some(b"k"), exact), None);
        assert_eq!(q.pop(1, Some(b"k"), exact), Some(4));
    }

    #[test]
    fn overflow_drops_the_oldest_and_memory_stays_bounded() {
        let q = LaunchQueues::new(2, 4).with_epoch(|| 0);
        for i in 1..=10 {
            q.push(0, i, "k");
        }
        assert_eq!(q.pending(0), 4);
        assert_eq!(q.stats().overflowed, 6);
        assert_eq!(q.pop(0, Some(b"k"), exact), Some(7));
        // Two slots: a third stream is refused, counted, and its launches stay unpaired.
        assert!(q.push(1, 1, "k"));
        assert!(!q.push(2, 1, "k"));
        assert_eq!(q.stats().untracked, 1);
        assert_eq!(q.pop(2, Some(b"k"), exact), None);
    }

    static TEST_EPOCH: AtomicU64 = AtomicU64::new(1);
    fn test_epoch() -> u64 {
        TEST_EPOCH.load(Ordering::Relaxed)
    }

    /// Entries queued in an earlier recording window (launched after CUPTI stopped listening)
    /// never label a later window's kernels.
    #[test]
    fn leftovers_of_an_earlier_window_are_dropped() {
        let q = LaunchQueues::new(2, 8).with_epoch(test_epoch);
        q.push(0, 1, "k");
        q.push(0, 2, "k");
        TEST_EPOCH.fetch_add(1, Ordering::Relaxed);
        q.push(0, 3, "k");
        assert_eq!(q.pop(0, Some(b"k"), exact), Some(3));
        assert_eq!(q.stats().stale, 2);
    }

    /// The provider hook (process-wide, so one test covers it): off by default, one function per
    /// process, and switched off and on again.
    #[test]
    fn provider_registration() {
        fn p(symbol: Option<&CStr>) -> Option<u64> {
            symbol.map(|s| s.to_bytes().len() as u64)
        }
        fn other(_: Option<&CStr>) -> Option<u64> {
            Some(1)
        }
        assert_eq!(
            provided_external_id(Some(c"abc")),
            None,
            "nothing registered"
        );
        assert!(set_launch_provider(p));
        assert_eq!(provided_external_id(Some(c"abc")), Some(3));
        assert!(!set_launch_provider(other), "a second provider is refused");
        assert_eq!(provided_external_id(Some(c"abcd")), Some(4));
        disable_launch_provider();
        assert_eq!(provided_external_id(Some(c"abc")), None);
        assert!(set_launch_provider(p));
        assert_eq!(provided_external_id(None), None);
        disable_launch_provider();
    }
}
