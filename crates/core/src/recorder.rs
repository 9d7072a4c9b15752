//! The recording hot path: a process-wide on/off word and one ring per recording thread.
//!
//! "Profiler inactive" costs one `Relaxed` load of [`STATE`]. When active, a thread's first event
//! creates its ring (one allocation per thread, never per event) and registers the reading end with
//! the process-wide [`registry`], which the collector drains.
//!
//! A burst larger than a ring is absorbed without allocating on the recording thread: when its ring
//! is full, the thread takes a spare ring the collector allocated ahead of time ([`replenish`]) and
//! goes on in it; the collector drains a thread's rings oldest first. Spares, and so the memory
//! rings may use, are bounded by [`set_ring_memory_cap`] ([`DEFAULT_RING_MEMORY_CAP`]); past it a
//! full ring drops and counts, as a single ring does. Passing half of a ring also wakes the
//! collector, so it drains before the ring fills.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::Ticks;
use crate::intern::{intern, NameId};
use crate::ring::{ring, RingReader, RingWriter};

/// Whether recording is on (the session is in WARMUP or RECORD). Relaxed everywhere: a thread that
/// sees the change a little late records or skips a few events at the window edge, which the collector
/// filters by timestamp anyway.
static STATE: AtomicBool = AtomicBool::new(false);

/// Slots in each thread's ring (set by the session before it turns recording on).
static RING_CAPACITY: AtomicUsize = AtomicUsize::new(DEFAULT_RING_CAPACITY);

/// Default slots per thread ring (each slot is one [`CpuRecord`], 40 bytes).
pub const DEFAULT_RING_CAPACITY: usize = 1 << 14;

/// Default bound on the memory of all rings together (every thread's first ring counts, spares and
/// the rings threads moved on to): 256 MiB, about 6.7 M buffered spans.
pub const DEFAULT_RING_MEMORY_CAP: usize = 256 << 20;

/// The bound (bytes) and what the rings use now. Relaxed: an estimate a few blocks either way is
/// fine; the collector is the only one that adds spares.
static RING_MEMORY_CAP: AtomicUsize = AtomicUsize::new(DEFAULT_RING_MEMORY_CAP);
static RING_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Spare rings a full thread takes over. The collector keeps at least [`SPARE_RINGS`] ready, and
/// twice as many as threads took since it last looked (a burst asks for more, quickly).
type Spare = (RingWriter<CpuRecord>, RingReader<CpuRecord>);
static SPARES: Mutex<Vec<Spare>> = Mutex::new(Vec::new());
const SPARE_RINGS: usize = 16;
const MAX_SPARE_RINGS: usize = 512;
/// Spares taken since the collector last replenished (Relaxed: a statistic for sizing).
static TAKEN: AtomicUsize = AtomicUsize::new(0);

fn ring_bytes(slots: usize) -> usize {
    slots * std::mem::size_of::<CpuRecord>()
}

/// Sets the bound on the memory of all rings together (see the module docs).
pub fn set_ring_memory_cap(bytes: usize) {
    RING_MEMORY_CAP.store(bytes, Ordering::Relaxed);
}

/// Bytes the rings use now (every thread's rings and the spares).
pub fn ring_memory() -> usize {
    RING_BYTES.load(Ordering::Relaxed)
}

/// Keeps [`SPARE_RINGS`] spare rings ready within the memory bound. Called by the collector
/// (allocation happens here, never on a recording thread).
pub fn replenish() {
    let slots = RING_CAPACITY.load(Ordering::Relaxed);
    let bytes = ring_bytes(slots.max(2).next_power_of_two());
    let taken = TAKEN.swap(0, Ordering::Relaxed);
    let target = (2 * taken).clamp(SPARE_RINGS, MAX_SPARE_RINGS);
    loop {
        let have = SPARES.lock().unwrap_or_else(|e| e.into_inner()).len();
        if have >= target
            || RING_BYTES.load(Ordering::Relaxed) + bytes > RING_MEMORY_CAP.load(Ordering::Relaxed)
        {
            return;
        }
        // Allocated here, so the recording thread that takes it does not allocate.
        let spare = ring(slots);
        RING_BYTES.fetch_add(bytes, Ordering::Relaxed);
        SPARES.lock().unwrap_or_else(|e| e.into_inner()).push(spare);
    }
}

/// Spare rings ready now.
pub fn spare_rings() -> usize {
    SPARES.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// Frees the spare rings (when a session ends).
pub fn release_spares() {
    let spares = std::mem::take(&mut *SPARES.lock().unwrap_or_else(|e| e.into_inner()));
    for (_, r) in &spares {
        RING_BYTES.fetch_sub(ring_bytes(r.capacity()), Ordering::Relaxed);
    }
}

/// The collector thread, woken when a ring passes its fill mark so that a burst is drained before it
/// fills the ring. Locked only on that rare path and when a session starts or stops.
static COLLECTOR: Mutex<Option<std::thread::Thread>> = Mutex::new(None);
/// A wake-up is on its way; the collector clears it when it starts a round (Relaxed: a hint, a
/// spurious or late wake-up costs one round).
static WAKE_PENDING: AtomicBool = AtomicBool::new(false);

/// Sets (or clears) the thread [`wake_collector`] wakes.
pub fn set_collector(thread: Option<std::thread::Thread>) {
    *COLLECTOR.lock().unwrap_or_else(|e| e.into_inner()) = thread;
    // A wake-up still marked pending belongs to the previous collector: the next fill mark must
    // reach this one.
    WAKE_PENDING.store(false, Ordering::Relaxed);
}

/// Wakes the collector thread now (a command is queued, or a ring is filling).
pub fn wake_collector() {
    if let Some(t) = COLLECTOR.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        t.unpark();
    }
}

/// Called by the collector as it starts a round: fill marks passed from now on wake it again.
pub fn collector_woke() {
    WAKE_PENDING.store(false, Ordering::Relaxed);
}

#[cold]
fn ring_filling() {
    if !WAKE_PENDING.swap(true, Ordering::Relaxed) {
        wake_collector();
    }
}

/// Records refused without reaching a ring: a push re-entered on a thread already pushing (a signal
/// handler interrupting a push), or one made while the thread's storage is torn down. Relaxed: a
/// statistic.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Every record lost on the way into a ring (a full ring, or refused as above), since the process
/// started: one counter, so a window's count is the difference of two loads taken at its bounds.
/// Relaxed: only the totals matter; the bounds' loads happen on the thread that ends the window.
static LOST: AtomicU64 = AtomicU64::new(0);

/// Records refused before reaching any ring, since the process started (see [`push`]).
pub fn refused_pushes() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Records lost on the way into the rings (full or refused), since the process started.
pub fn lost_records() -> u64 {
    LOST.load(Ordering::Relaxed)
}

#[cold]
fn refuse() -> bool {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    LOST.fetch_add(1, Ordering::Relaxed);
    false
}

#[cold]
fn ring_full() -> bool {
    LOST.fetch_add(1, Ordering::Relaxed);
    false
}

/// Source of span ids (`External id`s). Starts at 1 so 0 never appears.
static NEXT_SPAN_ID: AtomicU64 = AtomicU64::new(1);

/// Whether recording is on.
#[inline(always)]
pub fn is_active() -> bool {
    STATE.load(Ordering::Relaxed)
}

/// Turns recording on or off. Called by the session.
pub fn set_active(on: bool) {
    let was = STATE.swap(on, Ordering::Relaxed);
    if on && !was {
        // Relaxed: a tag compared for equality (launch.rs drops entries of earlier epochs).
        EPOCH.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts the times recording was switched on (0 before the first).
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Which stretch of recording this is: bumped each time recording goes from off to on, so state
/// kept across windows (the launch queues of `launch.rs`) can tell an old window's leftovers.
#[inline]
pub fn recording_epoch() -> u64 {
    EPOCH.load(Ordering::Relaxed)
}

/// Sets the capacity of rings created from now on.
pub fn set_ring_capacity(slots: usize) {
    RING_CAPACITY.store(slots.max(2), Ordering::Relaxed);
}

/// Span ids are handed to threads in blocks of this many, so taking one is a thread-local increment
/// rather than a contended atomic; ids stay small (JSON viewers read numbers as doubles).
const SPAN_ID_BLOCK: u64 = 4096;

/// A fresh span id, unique in this process.
#[inline]
pub fn next_span_id() -> u64 {
    TLS.try_with(Tls::next_span_id)
        // Relaxed: only uniqueness matters, which the RMW gives regardless of ordering.
        .unwrap_or_else(|_| NEXT_SPAN_ID.fetch_add(1, Ordering::Relaxed))
}

/// One entry in a thread's ring.
#[derive(Clone, Copy, Debug)]
pub enum CpuRecord {
    /// A finished span on the ring's own thread (the compact form `record_function` writes).
    Span {
        /// Span name.
        name: NameId,
        /// `true` for `user_annotation`, `false` for `cpu_op`.
        annotation: bool,
        /// Start, on the recording clock (converted when drained).
        start: Ticks,
        /// End, on the recording clock.
        end: Ticks,
        /// Span id (its `External id`).
        id: u64,
    },
    /// The start of a span whose end comes later as [`CpuRecord::End`] with the same id (the
    /// `tracing` layer records enter and exit separately).
    Begin {
        /// Span name.
        name: NameId,
        /// `true` for `user_annotation`, `false` for `cpu_op`.
        annotation: bool,
        /// A `python_function` range (a Python frame): `annotation` is then ignored, the span id
        /// is its `Python id`, and `args` holds its `CallFrom` text.
        python: bool,
        /// Start, on the recording clock.
        start: Ticks,
        /// Span id (its `External id`).
        id: u64,
        /// What an op says beyond its name.
        args: crate::activity::OpArgs,
    },
    /// The end of a span begun with [`CpuRecord::Begin`].
    End {
        /// End, on the recording clock.
        end: Ticks,
        /// Span id.
        id: u64,
    },
    /// A framework allocator's allocation (`bytes > 0`) or free (`bytes < 0`): PyTorch's
    /// `[memory]` event. Its totals follow as the next record on the same ring
    /// ([`CpuRecord::MemoryTotals`]): one record this size keeps every slot at 32 bytes.
    Memory {
        /// When, on the recording clock.
        at: Ticks,
        /// The block's address.
        address: u64,
        /// Its size, negative for a free.
        bytes: i64,
        /// The device index, -1 for host memory.
        device: i16,
    },
    /// The totals after the [`CpuRecord::Memory`] just before it on this ring.
    MemoryTotals {
        /// Bytes allocated on the device after it.
        allocated: u64,
        /// Bytes the allocator holds on the device after it.
        reserved: u64,
    },
    /// A host allocation or free with its total in one slot (made by [`CpuRecord::host_memory`]):
    /// most of a PyTorch job's allocator events are on the CPU, where c10 reports nothing
    /// reserved, so the total allocated fits the slot's spare bytes and the event takes one slot
    /// and one ring write instead of two.
    HostMemory {
        /// When, on the recording clock.
        at: Ticks,
        /// The block's address.
        address: u64,
        /// Its size, negative for a free.
        bytes: i64,
        /// Bits 32..48 of the bytes allocated on the host after it.
        allocated_hi: u16,
        /// Bits 0..32 of the same.
        allocated_lo: u32,
    },
}

/// The most host bytes allocated a [`CpuRecord::HostMemory`] holds (256 TiB).
const HOST_ALLOCATED_LIMIT: u64 = 1 << 48;

impl CpuRecord {
    /// A host allocator event as one [`CpuRecord::HostMemory`] slot; `None` (write
    /// [`CpuRecord::Memory`] and its totals instead) when `allocated` does not fit its 48 bits.
    #[inline]
    pub fn host_memory(at: Ticks, address: u64, bytes: i64, allocated: u64) -> Option<CpuRecord> {
        (allocated < HOST_ALLOCATED_LIMIT).then_some(CpuRecord::HostMemory {
            at,
            address,
            bytes,
            allocated_hi: (allocated >> 32) as u16,
            allocated_lo: allocated as u32,
        })
    }

    /// The latest time this record carries.
    pub fn last_tick(&self) -> Ticks {
        match *self {
            CpuRecord::Span { end, .. } | CpuRecord::End { end, .. } => end,
            CpuRecord::Begin { start, .. } => start,
            CpuRecord::Memory { at, .. } | CpuRecord::HostMemory { at, .. } => at,
            CpuRecord::MemoryTotals { .. } => Ticks(0),
        }
    }
}

/// A thread's rings, oldest first: the reading ends of the full ones it moved on from and of the
/// one it writes now. The thread appends (with `try_lock`: it never waits) when it takes a spare;
/// the collector takes from the front.
type Chain = Arc<Mutex<VecDeque<RingReader<CpuRecord>>>>;

/// The reading end of one thread's rings, as the collector sees it.
pub struct ThreadRing {
    /// OS process id of the recording thread.
    pub pid: u32,
    /// OS thread id of the recording thread.
    pub tid: u32,
    /// The thread's name, if it had one.
    pub thread_name: Option<String>,
    chain: Chain,
}

impl ThreadRing {
    /// Hands up to `max` records present now to `f`, oldest first, and says how many there were
    /// and whether the thread is finished (it exited and everything it pushed has been drained; the
    /// entry can be dropped). Rings the thread moved on from are freed once drained.
    pub fn drain(&self, max: usize, mut f: impl FnMut(CpuRecord)) -> (usize, bool) {
        let mut total = 0;
        loop {
            let front = self
                .chain
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let Some(mut reader) = front else {
                return (total, true);
            };
            // Drained without the lock, so the thread can append meanwhile.
            let (n, finished) = reader.drain_final_up_to(max - total, &mut f);
            total += n;
            if finished {
                RING_BYTES.fetch_sub(ring_bytes(reader.capacity()), Ordering::Relaxed);
                if total < max {
                    continue;
                }
                // Out of budget; the next ring (if any) waits in the chain.
                return (total, false);
            }
            self.chain
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_front(reader);
            return (total, false);
        }
    }
}

/// Every thread ring created so far that the collector has not retired. Only the collector locks
/// it (for a whole drain); new threads register through [`NEW_RINGS`], so a thread's first event
/// never waits for a drain.
pub fn registry() -> MutexGuard<'static, Vec<ThreadRing>> {
    static REGISTRY: Mutex<Vec<ThreadRing>> = Mutex::new(Vec::new());
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.append(&mut NEW_RINGS.lock().unwrap_or_else(|e| e.into_inner()));
    reg
}

/// Rings of threads that started recording since the collector last looked.
static NEW_RINGS: Mutex<Vec<ThreadRing>> = Mutex::new(Vec::new());

struct Local {
    writer: RingWriter<CpuRecord>,
    chain: Chain,
    pid: u32,
    tid: u32,
}

/// Takes `m` if it comes free within a few hundred spins: the collector holds these locks for
/// nanoseconds (a push or a pop), and a recording thread must never block on it.
fn lock_briefly<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    for _ in 0..256 {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    None
}

impl Local {
    /// The thread's ring is full: goes on in a spare ring, if the collector has one ready and the
    /// thread can append it to its chain without waiting; else the record is dropped and counted.
    #[cold]
    fn grow(&mut self, record: CpuRecord) -> bool {
        let spare = lock_briefly(&SPARES).and_then(|mut s| s.pop());
        TAKEN.fetch_add(1, Ordering::Relaxed);
        let Some((writer, reader)) = spare else {
            ring_filling();
            return ring_full();
        };
        match lock_briefly(&self.chain) {
            Some(mut chain) => chain.push_back(reader),
            None => {
                // The collector held this thread's chain all along: give the spare back.
                if let Some(mut s) = lock_briefly(&SPARES) {
                    s.push((writer, reader));
                } else {
                    RING_BYTES.fetch_sub(ring_bytes(reader.capacity()), Ordering::Relaxed);
                }
                return ring_full();
            }
        }
        // The old writer goes: its ring is finished once drained.
        self.writer = writer;
        // A spare was used: the collector makes another.
        ring_filling();
        self.writer.try_push(record).is_ok() || ring_full()
    }
}

/// Everything the hot path needs from thread-local storage, in one place so a span costs one TLS
/// lookup at enter and one at exit.
struct Tls {
    /// This thread's ring, created on first use.
    ring: RefCell<Option<Local>>,
    /// The innermost open span on this thread, which API calls and GPU work launched now link to.
    external_id: Cell<u64>,
    /// The thread's current block of span ids: (next, end).
    ids: Cell<(u64, u64)>,
    /// Names of `'static` strings seen on this thread, by address: (address, length, id). A
    /// `'static` string's bytes never change, so its address and length identify it and a repeated
    /// span costs a compare instead of a hash.
    names: [Cell<(usize, usize, NameId)>; NAME_CACHE],
}

/// Entries in each thread's cache of `'static` names (direct-mapped).
const NAME_CACHE: usize = 64;

impl Tls {
    #[inline]
    fn next_span_id(&self) -> u64 {
        let (next, end) = self.ids.get();
        if next < end {
            self.ids.set((next + 1, end));
            next
        } else {
            // Relaxed: only uniqueness matters, which the RMW gives regardless of ordering.
            let base = NEXT_SPAN_ID.fetch_add(SPAN_ID_BLOCK, Ordering::Relaxed);
            self.ids.set((base + 1, base + SPAN_ID_BLOCK));
            base
        }
    }

    /// The id of a `'static` name, interning it only the first time this thread sees it.
    #[inline]
    fn static_name(&self, name: &'static str) -> NameId {
        let key = (name.as_ptr() as usize, name.len());
        // Literals are at least byte-aligned and spread over the binary's read-only data: the low
        // address bits past the first few, mixed with the length, pick the slot.
        let slot = &self.names[((key.0 >> 3) ^ key.1) % NAME_CACHE];
        let (addr, len, id) = slot.get();
        if (addr, len) == key {
            return id;
        }
        let id = intern(name);
        slot.set((key.0, key.1, id));
        id
    }

    #[inline]
    fn push_with(&self, make: impl FnOnce(u32, u32) -> CpuRecord) -> bool {
        let mut ring = match self.ring.try_borrow_mut() {
            Ok(r) => r,
            // Re-entered from inside a push (a signal handler, say): drop and count rather than
            // deadlock.
            Err(_) => return refuse(),
        };
        let l = ring.get_or_insert_with(register_this_thread);
        let record = make(l.pid, l.tid);
        match l.writer.push_checked(record) {
            Ok(false) => true,
            Ok(true) => {
                ring_filling();
                true
            }
            Err(record) => l.grow(record),
        }
    }
}

thread_local! {
    static TLS: Tls = const {
        Tls {
            ring: RefCell::new(None),
            external_id: Cell::new(0),
            ids: Cell::new((0, 0)),
            names: [const { Cell::new((0, 0, NameId::OVERFLOW)) }; NAME_CACHE],
        }
    };
}

/// The OS thread id of the calling thread.
pub fn current_tid() -> u32 {
    thread_local! {
        static TID: u32 = os_tid();
    }
    TID.with(|t| *t)
}

#[cfg(target_os = "linux")]
fn os_tid() -> u32 {
    // /proc/thread-self resolves to /proc/<pid>/task/<tid> without any unsafe syscall wrapper.
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id)
}

#[cfg(not(target_os = "linux"))]
fn os_tid() -> u32 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    std::process::id().wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) as u32)
}

/// Pushes a record into the calling thread's ring, creating the ring on first use. Returns `false`
/// (and counts a drop) when the ring is full, when the push re-entered one in progress on this thread,
/// or when the thread is exiting.
#[inline]
pub fn push(record: CpuRecord) -> bool {
    push_with(|_, _| record)
}

/// Pushes two records that go together (an allocator event and its totals) with one look-up of
/// the thread's ring: `false` if the first was refused (the second is then not pushed).
#[inline]
pub fn push_pair(first: CpuRecord, second: CpuRecord) -> bool {
    TLS.try_with(|t| t.push_with(|_, _| first) && t.push_with(|_, _| second))
        .unwrap_or_else(|_| refuse())
}

/// Like [`push`], for records that need this thread's (pid, tid): `make` receives them.
#[inline]
pub fn push_with(make: impl FnOnce(u32, u32) -> CpuRecord) -> bool {
    // Err: the thread is being torn down and its ring is gone.
    TLS.try_with(|t| t.push_with(make))
        .unwrap_or_else(|_| refuse())
}

#[cold]
fn register_this_thread() -> Local {
    let (writer, reader) = ring(RING_CAPACITY.load(Ordering::Relaxed));
    RING_BYTES.fetch_add(ring_bytes(reader.capacity()), Ordering::Relaxed);
    let pid = std::process::id();
    let tid = current_tid();
    let chain: Chain = Arc::new(Mutex::new(VecDeque::from([reader])));
    NEW_RINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(ThreadRing {
            pid,
            tid,
            thread_name: std::thread::current().name().map(str::to_owned),
            chain: chain.clone(),
        });
    Local {
        writer,
        chain,
        pid,
        tid,
    }
}

/// The `External id` API calls made now on this thread link to, if any.
#[inline]
pub fn current_external_id() -> Option<u64> {
    let id = TLS.try_with(|t| t.external_id.get()).unwrap_or(0);
    (id != 0).then_some(id)
}

/// Makes `id` the current external id and returns the previous one (to pass to
/// [`restore_external_id`]).
#[inline]
pub fn push_external_id(id: u64) -> u64 {
    TLS.try_with(|t| t.external_id.replace(id)).unwrap_or(0)
}

/// Restores the external id saved by [`push_external_id`].
#[inline]
pub fn restore_external_id(previous: u64) {
    let _ = TLS.try_with(|t| t.external_id.set(previous));
}

/// A call site's span name, interned on first use and then read with one relaxed load (the way
/// `tracing`'s macros cache their callsite). Made by the facade's `span!` macro.
pub struct Callsite {
    name: &'static str,
    /// The interned id, or `u32::MAX` before the first use. Relaxed: every thread that races the
    /// first use interns the same name and stores the same id.
    id: AtomicU32,
}

impl Callsite {
    /// A call site for `name`.
    pub const fn new(name: &'static str) -> Callsite {
        Callsite {
            name,
            id: AtomicU32::new(u32::MAX),
        }
    }

    /// The interned name.
    #[inline(always)]
    pub fn name_id(&self) -> NameId {
        match self.id.load(Ordering::Relaxed) {
            u32::MAX => self.register(),
            id => NameId(id),
        }
    }

    #[cold]
    fn register(&self) -> NameId {
        let id = intern(self.name);
        self.id.store(id.0, Ordering::Relaxed);
        id
    }
}

/// An open CPU span; records one `user_annotation` (or `cpu_op`) when dropped.
///
/// Created inactive (costing one load) when the profiler is off.
#[must_use = "the span ends when this guard is dropped"]
pub struct SpanGuard {
    open: Option<OpenSpan>,
}

struct OpenSpan {
    name: NameId,
    annotation: bool,
    start: Ticks,
    id: u64,
    previous_external_id: u64,
}

impl SpanGuard {
    /// A guard that records nothing.
    #[inline(always)]
    pub const fn inactive() -> SpanGuard {
        SpanGuard { open: None }
    }

    /// Opens a span named `name`: a `user_annotation` if `annotation`, else a `cpu_op`.
    #[inline(always)]
    pub fn enter(name: NameId, annotation: bool) -> SpanGuard {
        if !is_active() {
            return SpanGuard::inactive();
        }
        Self::enter_active(|_| name, annotation)
    }

    /// Like [`enter`](Self::enter) with a `'static` name, which is interned once per thread and
    /// then found by its address: no hashing per span.
    #[inline(always)]
    pub fn enter_static(name: &'static str, annotation: bool) -> SpanGuard {
        if !is_active() {
            return SpanGuard::inactive();
        }
        Self::enter_active(|t| t.static_name(name), annotation)
    }

    #[inline]
    fn enter_active(name: impl FnOnce(&Tls) -> NameId, annotation: bool) -> SpanGuard {
        // One TLS access for the name, the id and the external-id stack.
        let ids = TLS.try_with(|t| {
            let name = name(t);
            let id = t.next_span_id();
            (name, id, t.external_id.replace(id))
        });
        let Ok((name, id, previous_external_id)) = ids else {
            return SpanGuard::inactive();
        };
        SpanGuard {
            open: Some(OpenSpan {
                name,
                annotation,
                start: Ticks::now(),
                id,
                previous_external_id,
            }),
        }
    }

    /// The span's id (`External id`), if it is recording.
    pub fn id(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.id)
    }
}

impl Drop for SpanGuard {
    #[inline]
    fn drop(&mut self) {
        if let Some(o) = self.open.take() {
            let end = Ticks::now();
            let pushed = TLS.try_with(|t| {
                t.external_id.set(o.previous_external_id);
                t.push_with(|_, _| CpuRecord::Span {
                    name: o.name,
                    annotation: o.annotation,
                    start: o.start,
                    end,
                    id: o.id,
                })
            });
            if pushed.is_err() {
                refuse();
            }
        }
    }
}
