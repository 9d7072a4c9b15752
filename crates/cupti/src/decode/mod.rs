//! Decoders: CUPTI record bytes → [`Activity`].
//!
//! Each decoder takes one record as `&[u8]` (its real length, as measured between two records the
//! library handed out), checks the length, and reads fields at offsets taken from the bindgen structs
//! of the **oldest** layout that has them (`offset_of!`), which every newer layout shares (the layout
//! test in `kinetrace-cupti-sys` checks this against every supported wheel). Enum-typed fields are
//! read as integers; unknown values map to `Unknown`, never to undefined behaviour. No field newer
//! than 11.8 is needed for the Kineto record model, so no tail field is read.
//!
//! Besides the records that become [`Activity`]s, the decoder keeps what later records and the trace
//! header need: DEVICE records (→ [`Decoder::device_properties`]), CONTEXT records (context id →
//! device id, for `cuda_sync` rows, as Kineto does), CUDA_EVENT records (which stream and which
//! `cudaEventRecord` correlation id last recorded each event, for the `wait_on_*` args of event
//! syncs, as Kineto does), and MEMORY_POOL records (counted; the record model has no place for pool
//! life cycles, see [`PoolStats`]).

use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::intern::{intern, intern_bytes, NameId};
use kinetrace_core::UnixNanos;
use kinetrace_cupti_sys::v12 as base;

use crate::kinds;
use crate::names::ApiNames;
use crate::version::Layout;

/// The external-correlation kind kinetrace pushes: `CUSTOM2`, which PyTorch does not use (it pushes
/// `CUSTOM0` for ops and `CUSTOM1` for user annotations).
pub const KINETRACE_EXTERNAL_KIND: u32 =
    kinetrace_cupti_sys::v13::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

/// A multiply-shift hasher for integer keys (correlation ids, pointers, context ids): the decoder does
/// several map operations per record, and SipHash would dominate its cost.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ *b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64)
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

macro_rules! off {
    ($t:ident . $f:ident) => {
        offset_of!(base::$t, $f)
    };
}

/// A record view with bounds-checked little-endian reads (out of range reads give 0; the decoders
/// check the length first, so that never happens for accepted records).
#[derive(Clone, Copy)]
struct Rec<'a>(&'a [u8]);

impl Rec<'_> {
    #[inline(always)]
    fn u8(self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }
    #[inline(always)]
    fn u16(self, off: usize) -> u16 {
        match self.0.get(off..off + 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => 0,
        }
    }
    #[inline(always)]
    fn u32(self, off: usize) -> u32 {
        match self.0.get(off..off + 4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => 0,
        }
    }
    #[inline(always)]
    fn u64(self, off: usize) -> u64 {
        match self.0.get(off..off + 8) {
            Some(b) => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => 0,
        }
    }
}

/// What one record decoded to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decoded {
    /// A record for the trace (external id not yet linked).
    Activity(Activity),
    /// A CUDA_EVENT record: `cudaEventRecord` (correlation `correlation`) recorded event `event` of
    /// context `context` on `stream`. Remembered for the `wait_on_*` fields of later event syncs.
    EventRecord {
        /// Context id.
        context: u32,
        /// CUPTI's event id.
        event: u32,
        /// The stream the event was recorded on.
        stream: u32,
        /// The correlation id of the `cudaEventRecord` call.
        correlation: u32,
    },
    /// A DEVICE record for the device with this id (its properties are kept by the decoder).
    Device(u32),
    /// A CONTEXT record: `context` lives on `device`.
    Context {
        /// Context id.
        context: u32,
        /// Device id.
        device: u32,
    },
    /// A MEMORY_POOL record (counted in [`PoolStats`]).
    MemoryPool {
        /// `CUpti_ActivityMemoryPoolOperationType`: 1 created, 2 destroyed, 3 trimmed.
        op: u32,
        /// Device id.
        device: u32,
        /// Pool size after the operation, in bytes.
        size: u64,
    },
    /// An external-correlation record: `correlation` belongs to external id `id` of kind `kind`.
    External {
        /// The external correlation kind.
        kind: u32,
        /// The external id.
        id: u64,
        /// The CUPTI correlation id it applies to.
        correlation: u32,
    },
    /// A record with nothing for the trace: a blocklisted API call, a marker start waiting for its
    /// end, a kind kinetrace does not read.
    Skipped,
    /// Shorter than its kind's base layout: the library is not what it claimed to be.
    TooShort,
}

/// Counters a decoder keeps (for trace metadata and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Records seen.
    pub records: u64,
    /// Records of kinds kinetrace does not read.
    pub unknown_kind: u64,
    /// Records shorter than their base layout.
    pub too_short: u64,
    /// Kernels with `start == end == 0` (the device buffer overflowed; CUPTI documents this).
    pub kernels_without_timestamps: u64,
    /// API records dropped by the noise blocklist.
    pub blocklisted: u64,
    /// Records whose measured length differs from the layout table (a newer library than we know).
    pub size_mismatch: u64,
    /// DEVICE records read.
    pub devices: u64,
    /// CONTEXT records read.
    pub contexts: u64,
    /// CUDA_EVENT records read.
    pub cuda_events: u64,
    /// Event syncs whose awaited `cudaEventRecord` was found (their `wait_on_*` fields are filled).
    pub event_waits_linked: u64,
}

/// What MEMORY_POOL records said. kinetrace's record model has no event for a pool being created,
/// trimmed or destroyed (its `Memory` events are allocations and frees of blocks, which MEMORY2
/// reports), so pool records are summarised in the trace metadata instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// MEMORY_POOL records read.
    pub records: u64,
    /// Pools created.
    pub created: u64,
    /// Pools destroyed.
    pub destroyed: u64,
    /// Pools trimmed.
    pub trimmed: u64,
    /// Pools alive after the last record (created and not destroyed), as far as records show.
    pub live: u64,
    /// Their size in bytes after the last record.
    pub live_bytes: u64,
    /// The largest `live_bytes` seen.
    pub peak_bytes: u64,
}

/// Turns C-string pointers inside records into [`NameId`]s, caching by pointer (CUPTI keeps kernel
/// names alive for the life of the process, and the same kernel always has the same pointer).
pub struct CStrNames {
    last: (usize, NameId),
    cache: IntMap<usize, NameId>,
}

/// Most pointers the name cache holds before it starts over.
const NAME_CACHE_MAX: usize = 1 << 16;

impl CStrNames {
    /// A cache that dereferences name pointers found in records.
    ///
    /// # Safety
    /// Every record later passed to a [`Decoder`] owning this cache must hold, in its name fields
    /// (kernel `name`, marker `name`/`domain`, device `name`), either null or a pointer to a
    /// NUL-terminated string
    /// that stays valid and unchanged for as long as the same pointer value can appear again. CUPTI
    /// guarantees this for its records; synthetic buffers must point at `'static` strings.
    pub unsafe fn new() -> CStrNames {
        CStrNames {
            last: (0, NameId::OVERFLOW),
            cache: IntMap::default(),
        }
    }

    #[inline]
    fn get(&mut self, ptr: usize) -> Option<NameId> {
        if ptr == 0 {
            return None;
        }
        if self.last.0 == ptr {
            return Some(self.last.1);
        }
        let id = match self.cache.get(&ptr) {
            Some(id) => *id,
            None => {
                if self.cache.len() >= NAME_CACHE_MAX {
                    self.cache.clear();
                }
                // SAFETY: `new`'s contract: non-null name pointers in records are valid C strings.
                let bytes = unsafe { CStr::from_ptr(ptr as *const core::ffi::c_char) }.to_bytes();
                let id = intern_bytes(bytes);
                self.cache.insert(ptr, id);
                id
            }
        };
        self.last = (ptr, id);
        Some(id)
    }

    /// The string at `ptr` (uncached: DEVICE records are rare).
    fn string(&self, ptr: usize) -> Option<String> {
        if ptr == 0 {
            return None;
        }
        // SAFETY: `new`'s contract: non-null name pointers in records are valid C strings.
        let c = unsafe { CStr::from_ptr(ptr as *const core::ffi::c_char) };
        Some(c.to_string_lossy().into_owned())
    }
}

/// Decodes records of one library (one [`Layout`]).
pub struct Decoder {
    layout: Layout,
    names: CStrNames,
    api: ApiNames,
    unknown_name: NameId,
    /// contextId → deviceId, learned from GPU records, to give sync records a device.
    context_device: IntMap<u32, u32>,
    last_context: (u32, u32),
    /// Open marker ranges: id → (start, name, domain, pid, tid).
    open_markers: IntMap<u32, (u64, NameId, Option<NameId>, u32, u32)>,
    /// Devices from DEVICE records, by id.
    devices: Vec<DeviceProperties>,
    /// (contextId << 32 | eventId) → (stream, correlation) of the last `cudaEventRecord` of it.
    event_records: IntMap<u64, (u32, u32)>,
    /// Live memory pools by address: (device, size).
    pools: IntMap<u64, (u32, u64)>,
    pool_stats: PoolStats,
    stats: DecodeStats,
}

/// Most contexts, events and pools the decoder remembers before it starts over (bounded memory).
const MAP_MAX: usize = 1 << 16;
/// Most devices kept.
const DEVICES_MAX: usize = 256;

fn memcpy_kind(v: u8) -> MemcpyKind {
    match v {
        1 => MemcpyKind::HtoD,
        2 => MemcpyKind::DtoH,
        3 => MemcpyKind::HtoA,
        4 => MemcpyKind::AtoH,
        5 => MemcpyKind::AtoA,
        6 => MemcpyKind::AtoD,
        7 => MemcpyKind::DtoA,
        8 => MemcpyKind::DtoD,
        9 => MemcpyKind::HtoH,
        10 => MemcpyKind::PtoP,
        _ => MemcpyKind::Unknown,
    }
}

fn memory_kind(v: u32) -> MemoryKind {
    match v {
        1 => MemoryKind::Pageable,
        2 => MemoryKind::Pinned,
        3 => MemoryKind::Device,
        4 => MemoryKind::Array,
        5 => MemoryKind::Managed,
        6 => MemoryKind::DeviceStatic,
        7 => MemoryKind::ManagedStatic,
        _ => MemoryKind::Unknown,
    }
}

fn sync_kind(v: u32) -> SyncKind {
    match v {
        1 => SyncKind::EventSync,
        2 => SyncKind::StreamWaitEvent,
        3 => SyncKind::StreamSync,
        4 => SyncKind::ContextSync,
        _ => SyncKind::Unknown,
    }
}

fn overhead_kind(v: u32) -> OverheadKind {
    match v {
        1 => OverheadKind::DriverCompiler,
        0x10000 => OverheadKind::BufferFlush,
        0x20000 => OverheadKind::Instrumentation,
        0x30000 => OverheadKind::Resource,
        0x40000 => OverheadKind::RuntimeTriggeredModuleLoading,
        0x50000 => OverheadKind::LazyFunctionLoading,
        0x60000 => OverheadKind::CommandBufferFull,
        0x70000 => OverheadKind::ActivityBufferRequest,
        _ => OverheadKind::Unknown,
    }
}

#[inline]
fn nonzero_u32(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

impl Decoder {
    /// A decoder for records of `layout`. `keep_noise` keeps API calls Kineto drops (cudaGetDevice…).
    pub fn new(layout: Layout, names: CStrNames, keep_noise: bool) -> Decoder {
        Decoder {
            layout,
            names,
            api: ApiNames::new(keep_noise),
            unknown_name: intern("<unnamed>"),
            context_device: IntMap::default(),
            last_context: (u32::MAX, u32::MAX),
            open_markers: IntMap::default(),
            devices: Vec::new(),
            event_records: IntMap::default(),
            pools: IntMap::default(),
            pool_stats: PoolStats::default(),
            stats: DecodeStats::default(),
        }
    }

    /// Properties of the devices DEVICE records described, by id.
    pub fn device_properties(&self) -> &[DeviceProperties] {
        &self.devices
    }

    /// The device a context lives on, from CONTEXT records (or GPU records of that context).
    pub fn device_of_context(&self, context: u32) -> Option<u32> {
        self.context_device.get(&context).copied()
    }

    /// What MEMORY_POOL records said so far.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool_stats
    }

    /// The stream and `cudaEventRecord` correlation id that last recorded `event` in `context`.
    pub fn event_record(&self, context: u32, event: u32) -> Option<(u32, u32)> {
        self.event_records
            .get(&((context as u64) << 32 | event as u64))
            .copied()
    }

    /// Fills what a record could not know when it was decoded because the record that tells came
    /// later in the batch: a sync's device (from CONTEXT records) and an event sync's `wait_on_*`
    /// (from CUDA_EVENT records; the last recording of the event wins, as in Kineto).
    pub fn link(&mut self, a: &mut Activity) {
        let Detail::Sync(s) = &mut a.detail else {
            return;
        };
        if s.device.is_none() {
            s.device = s.context.and_then(|c| self.device_of_context(c));
        }
        if matches!(s.kind, SyncKind::EventSync | SyncKind::StreamWaitEvent)
            && s.wait_on_stream.is_none()
        {
            if let (Some(c), Some(e)) = (s.context, s.event_id) {
                if let Some((stream, corr)) = self.event_record(c, e) {
                    s.wait_on_stream = Some(stream);
                    s.wait_on_event_record_correlation = Some(corr as u64);
                    self.stats.event_waits_linked += 1;
                }
            }
        }
    }

    /// The layout this decoder reads.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Counters so far.
    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Decodes one record. `rec` is the record's bytes (from its first byte to the next record, or the
    /// end of the valid data).
    pub fn decode(&mut self, rec: &[u8]) -> Decoded {
        self.stats.records += 1;
        let r = Rec(rec);
        let kind = r.u32(0);
        if let Some(expected) = self.layout.size_of_kind(kind) {
            // The last record in a buffer can be followed by padding, so only "shorter" is suspicious
            // in general; an exact mismatch is counted for the metadata.
            if rec.len() != expected {
                self.stats.size_mismatch += 1;
            }
        }
        let decoded = match kind {
            kinds::CONCURRENT_KERNEL | kinds::KERNEL => self.kernel(r),
            kinds::MEMCPY => self.memcpy(r),
            kinds::MEMCPY2 => self.memcpy_p2p(r),
            kinds::MEMSET => self.memset(r),
            kinds::RUNTIME | kinds::DRIVER => self.api(r, kind == kinds::RUNTIME),
            kinds::SYNCHRONIZATION => self.sync(r),
            kinds::MEMORY2 => self.memory(r),
            kinds::EXTERNAL_CORRELATION => self.external(r),
            kinds::OVERHEAD => self.overhead(r),
            kinds::MARKER => self.marker(r),
            kinds::MEMORY_POOL => self.memory_pool(r),
            kinds::DEVICE => self.device(r),
            kinds::CONTEXT => self.context(r),
            kinds::CUDA_EVENT => self.cuda_event(r),
            _ => {
                self.stats.unknown_kind += 1;
                Decoded::Skipped
            }
        };
        if decoded == Decoded::TooShort {
            self.stats.too_short += 1;
        }
        decoded
    }

    fn kernel(&mut self, r: Rec<'_>) -> Decoded {
        type K = base::CUpti_ActivityKernel8;
        if r.0.len() < size_of::<K>() {
            return Decoded::TooShort;
        }
        let start = r.u64(off!(CUpti_ActivityKernel8.start));
        let end = r.u64(off!(CUpti_ActivityKernel8.end));
        if start == 0 && end == 0 {
            self.stats.kernels_without_timestamps += 1;
        }
        let device = r.u32(off!(CUpti_ActivityKernel8.deviceId));
        let context = r.u32(off!(CUpti_ActivityKernel8.contextId));
        self.learn_context(context, device);
        let name = self
            .names
            .get(r.u64(off!(CUpti_ActivityKernel8.name)) as usize)
            .unwrap_or(self.unknown_name);
        let dim = |o: usize| r.u32(o);
        let queued = r.u64(off!(CUpti_ActivityKernel8.queued));
        let shared = r.u32(off!(CUpti_ActivityKernel8.staticSharedMemory)) as i32 as i64
            + r.u32(off!(CUpti_ActivityKernel8.dynamicSharedMemory)) as i32 as i64;
        Decoded::Activity(Activity {
            start: UnixNanos(start),
            end: UnixNanos(end),
            correlation: Some(r.u32(off!(CUpti_ActivityKernel8.correlationId)) as u64),
            external_id: None,
            detail: Detail::Kernel(Kernel {
                name,
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityKernel8.streamId)),
                grid: Some([
                    dim(off!(CUpti_ActivityKernel8.gridX)),
                    dim(off!(CUpti_ActivityKernel8.gridY)),
                    dim(off!(CUpti_ActivityKernel8.gridZ)),
                ]),
                block: Some([
                    dim(off!(CUpti_ActivityKernel8.blockX)),
                    dim(off!(CUpti_ActivityKernel8.blockY)),
                    dim(off!(CUpti_ActivityKernel8.blockZ)),
                ]),
                registers_per_thread: Some(
                    r.u16(off!(CUpti_ActivityKernel8.registersPerThread)) as u32
                ),
                shared_memory: Some(shared.max(0) as u64),
                // CUPTI_TIMESTAMP_UNKNOWN (0) unless latency timestamps are on.
                queued: (queued != 0).then_some(UnixNanos(queued)),
                graph_id: nonzero_u32(r.u32(off!(CUpti_ActivityKernel8.graphId))),
                graph_node_id: {
                    let n = r.u64(off!(CUpti_ActivityKernel8.graphNodeId));
                    (n != 0).then_some(n)
                },
            }),
        })
    }

    fn memcpy(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemcpy5>() {
            return Decoded::TooShort;
        }
        let device = r.u32(off!(CUpti_ActivityMemcpy5.deviceId));
        let context = r.u32(off!(CUpti_ActivityMemcpy5.contextId));
        self.learn_context(context, device);
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityMemcpy5.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityMemcpy5.end))),
            correlation: Some(r.u32(off!(CUpti_ActivityMemcpy5.correlationId)) as u64),
            external_id: None,
            detail: Detail::Memcpy(Memcpy {
                kind: memcpy_kind(r.u8(off!(CUpti_ActivityMemcpy5.copyKind))),
                src_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpy5.srcKind)) as u32),
                dst_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpy5.dstKind)) as u32),
                bytes: r.u64(off!(CUpti_ActivityMemcpy5.bytes)),
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityMemcpy5.streamId)),
                peer: None,
            }),
        })
    }

    fn memcpy_p2p(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemcpyPtoP4>() {
            return Decoded::TooShort;
        }
        let device = r.u32(off!(CUpti_ActivityMemcpyPtoP4.deviceId));
        let context = r.u32(off!(CUpti_ActivityMemcpyPtoP4.contextId));
        self.learn_context(context, device);
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityMemcpyPtoP4.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityMemcpyPtoP4.end))),
            // Note: correlationId is at 60 here, not 44 as in Memcpy.
            correlation: Some(r.u32(off!(CUpti_ActivityMemcpyPtoP4.correlationId)) as u64),
            external_id: None,
            detail: Detail::Memcpy(Memcpy {
                kind: memcpy_kind(r.u8(off!(CUpti_ActivityMemcpyPtoP4.copyKind))),
                src_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpyPtoP4.srcKind)) as u32),
                dst_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpyPtoP4.dstKind)) as u32),
                bytes: r.u64(off!(CUpti_ActivityMemcpyPtoP4.bytes)),
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityMemcpyPtoP4.streamId)),
                peer: Some(PeerCopy {
                    src_device: r.u32(off!(CUpti_ActivityMemcpyPtoP4.srcDeviceId)),
                    dst_device: r.u32(off!(CUpti_ActivityMemcpyPtoP4.dstDeviceId)),
                    src_context: Some(r.u32(off!(CUpti_ActivityMemcpyPtoP4.srcContextId))),
                    dst_context: Some(r.u32(off!(CUpti_ActivityMemcpyPtoP4.dstContextId))),
                }),
            }),
        })
    }

    fn memset(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemset4>() {
            return Decoded::TooShort;
        }
        let device = r.u32(off!(CUpti_ActivityMemset4.deviceId));
        let context = r.u32(off!(CUpti_ActivityMemset4.contextId));
        self.learn_context(context, device);
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityMemset4.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityMemset4.end))),
            correlation: Some(r.u32(off!(CUpti_ActivityMemset4.correlationId)) as u64),
            external_id: None,
            detail: Detail::Memset(Memset {
                memory_kind: memory_kind(r.u16(off!(CUpti_ActivityMemset4.memoryKind)) as u32),
                bytes: r.u64(off!(CUpti_ActivityMemset4.bytes)),
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityMemset4.streamId)),
            }),
        })
    }

    fn api(&mut self, r: Rec<'_>, runtime: bool) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityAPI>() {
            return Decoded::TooShort;
        }
        let cbid = r.u32(off!(CUpti_ActivityAPI.cbid));
        let Some(info) = self.api.get(runtime, cbid) else {
            self.stats.blocklisted += 1;
            return Decoded::Skipped;
        };
        let call = ApiCall {
            name: info.name,
            cbid: Some(cbid),
            pid: r.u32(off!(CUpti_ActivityAPI.processId)),
            tid: r.u32(off!(CUpti_ActivityAPI.threadId)),
            launches_work: info.launches_work,
        };
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityAPI.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityAPI.end))),
            correlation: Some(r.u32(off!(CUpti_ActivityAPI.correlationId)) as u64),
            external_id: None,
            detail: if runtime {
                Detail::Runtime(call)
            } else {
                Detail::Driver(call)
            },
        })
    }

    fn sync(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivitySynchronization>() {
            return Decoded::TooShort;
        }
        // CUPTI writes CUPTI_SYNCHRONIZATION_INVALID_VALUE (u32::MAX) for fields that do not apply.
        let valid = |v: u32| (v != u32::MAX).then_some(v);
        let context = valid(r.u32(off!(CUpti_ActivitySynchronization.contextId)));
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivitySynchronization.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivitySynchronization.end))),
            correlation: Some(r.u32(off!(CUpti_ActivitySynchronization.correlationId)) as u64),
            external_id: None,
            detail: Detail::Sync(Sync {
                kind: sync_kind(r.u32(off!(CUpti_ActivitySynchronization.type_))),
                // Looked up from CONTEXT records (and GPU records) now, and again in `link`.
                device: context.and_then(|c| self.device_of_context(c)),
                context,
                stream: valid(r.u32(off!(CUpti_ActivitySynchronization.streamId))),
                event_id: valid(r.u32(off!(CUpti_ActivitySynchronization.cudaEventId))),
                wait_on_stream: None,
                wait_on_event_record_correlation: None,
            }),
        })
    }

    fn memory(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemory3>() {
            return Decoded::TooShort;
        }
        let op = match r.u32(off!(CUpti_ActivityMemory3.memoryOperationType)) {
            1 => MemoryOp::Alloc,
            2 => MemoryOp::Free,
            _ => return Decoded::Skipped,
        };
        let kind = memory_kind(r.u32(off!(CUpti_ActivityMemory3.memoryKind)));
        let on_device = matches!(
            kind,
            MemoryKind::Device | MemoryKind::DeviceStatic | MemoryKind::Array
        );
        let ts = UnixNanos(r.u64(off!(CUpti_ActivityMemory3.timestamp)));
        let pid = r.u32(off!(CUpti_ActivityMemory3.processId));
        Decoded::Activity(Activity {
            start: ts,
            end: ts,
            correlation: nonzero_u32(r.u32(off!(CUpti_ActivityMemory3.correlationId)))
                .map(u64::from),
            external_id: None,
            detail: Detail::Memory(Memory {
                op,
                device: on_device.then(|| r.u32(off!(CUpti_ActivityMemory3.deviceId))),
                address: r.u64(off!(CUpti_ActivityMemory3.address)),
                bytes: r.u64(off!(CUpti_ActivityMemory3.bytes)),
                total_allocated: None,
                total_reserved: None,
                pid,
                // CUPTI does not say which thread allocated.
                tid: 0,
            }),
        })
    }

    fn external(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityExternalCorrelation>() {
            return Decoded::TooShort;
        }
        Decoded::External {
            kind: r.u32(off!(CUpti_ActivityExternalCorrelation.externalKind)),
            id: r.u64(off!(CUpti_ActivityExternalCorrelation.externalId)),
            correlation: r.u32(off!(CUpti_ActivityExternalCorrelation.correlationId)),
        }
    }

    fn overhead(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityOverhead>() {
            return Decoded::TooShort;
        }
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityOverhead.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityOverhead.end))),
            correlation: None,
            external_id: None,
            detail: Detail::Overhead(Overhead {
                kind: overhead_kind(r.u32(off!(CUpti_ActivityOverhead.overheadKind))),
            }),
        })
    }

    fn marker(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMarker2>() {
            return Decoded::TooShort;
        }
        let flags = r.u32(off!(CUpti_ActivityMarker2.flags));
        let ts = r.u64(off!(CUpti_ActivityMarker2.timestamp));
        let id = r.u32(off!(CUpti_ActivityMarker2.id));
        let object = off!(CUpti_ActivityMarker2.objectId);
        let (pid, tid) = (r.u32(object), r.u32(object + 4));
        let name = self
            .names
            .get(r.u64(off!(CUpti_ActivityMarker2.name)) as usize);
        let domain = self
            .names
            .get(r.u64(off!(CUpti_ActivityMarker2.domain)) as usize);
        let make = |start: u64, end: u64, name: NameId, domain, pid, tid| {
            Decoded::Activity(Activity {
                start: UnixNanos(start),
                end: UnixNanos(end),
                correlation: None,
                external_id: None,
                detail: Detail::Marker(Marker {
                    name,
                    domain,
                    pid,
                    tid,
                }),
            })
        };
        if flags & 1 != 0 {
            make(ts, ts, name.unwrap_or(self.unknown_name), domain, pid, tid)
        } else if flags & 2 != 0 {
            if self.open_markers.len() >= 65_536 {
                self.open_markers.clear();
            }
            self.open_markers.insert(
                id,
                (ts, name.unwrap_or(self.unknown_name), domain, pid, tid),
            );
            Decoded::Skipped
        } else if flags & 4 != 0 {
            match self.open_markers.remove(&id) {
                Some((start, name, domain, pid, tid)) => make(start, ts, name, domain, pid, tid),
                None => Decoded::Skipped,
            }
        } else {
            Decoded::Skipped
        }
    }

    fn memory_pool(&mut self, r: Rec<'_>) -> Decoded {
        type P = base::CUpti_ActivityMemoryPool2;
        if r.0.len() < size_of::<P>() {
            return Decoded::TooShort;
        }
        let op = r.u32(off!(CUpti_ActivityMemoryPool2.memoryPoolOperationType));
        let device = r.u32(off!(CUpti_ActivityMemoryPool2.deviceId));
        let address = r.u64(off!(CUpti_ActivityMemoryPool2.address));
        let size = r.u64(off!(CUpti_ActivityMemoryPool2.size));
        let p = &mut self.pool_stats;
        p.records += 1;
        match op {
            1 => p.created += 1,
            2 => p.destroyed += 1,
            3 => p.trimmed += 1,
            _ => {}
        }
        match op {
            1 | 3 => {
                if self.pools.len() >= MAP_MAX && !self.pools.contains_key(&address) {
                    self.pools.clear();
                }
                self.pools.insert(address, (device, size));
            }
            2 => {
                self.pools.remove(&address);
            }
            _ => {}
        }
        p.live = self.pools.len() as u64;
        p.live_bytes = self.pools.values().map(|(_, s)| *s).sum();
        p.peak_bytes = p.peak_bytes.max(p.live_bytes);
        Decoded::MemoryPool { op, device, size }
    }

    fn device(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityDevice4>() {
            return Decoded::TooShort;
        }
        macro_rules! f {
            ($f:ident) => {
                r.u32(off!(CUpti_ActivityDevice4.$f))
            };
        }
        let id = f!(id);
        let warp = f!(numThreadsPerWarp);
        let props = DeviceProperties {
            id,
            name: self
                .names
                .string(r.u64(off!(CUpti_ActivityDevice4.name)) as usize)
                .unwrap_or_default(),
            total_global_mem: r.u64(off!(CUpti_ActivityDevice4.globalMemorySize)),
            compute_major: f!(computeCapabilityMajor),
            compute_minor: f!(computeCapabilityMinor),
            max_threads_per_block: f!(maxThreadsPerBlock),
            max_threads_per_multiprocessor: f!(maxWarpsPerMultiprocessor).saturating_mul(warp),
            regs_per_block: f!(maxRegistersPerBlock),
            warp_size: warp,
            shared_mem_per_block: f!(maxSharedMemoryPerBlock) as u64,
            num_sms: f!(numMultiprocessors),
            regs_per_multiprocessor: Some(f!(maxRegistersPerMultiprocessor)),
            // Not in any DEVICE record layout (11.8 – 13.5).
            shared_mem_per_block_optin: None,
            shared_mem_per_multiprocessor: Some(f!(maxSharedMemoryPerMultiprocessor) as u64),
        };
        self.stats.devices += 1;
        if let Some(d) = self.devices.iter_mut().find(|d| d.id == id) {
            *d = props;
        } else if self.devices.len() < DEVICES_MAX {
            self.devices.push(props);
            self.devices.sort_by_key(|d| d.id);
        }
        Decoded::Device(id)
    }

    fn context(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityContext>() {
            return Decoded::TooShort;
        }
        let context = r.u32(off!(CUpti_ActivityContext.contextId));
        let device = r.u32(off!(CUpti_ActivityContext.deviceId));
        self.stats.contexts += 1;
        // Authoritative: overrides what GPU records suggested.
        if self.context_device.len() >= MAP_MAX && !self.context_device.contains_key(&context) {
            self.context_device.clear();
        }
        self.context_device.insert(context, device);
        self.last_context = (context, device);
        Decoded::Context { context, device }
    }

    fn cuda_event(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityCudaEvent>() {
            return Decoded::TooShort;
        }
        let context = r.u32(off!(CUpti_ActivityCudaEvent.contextId));
        let event = r.u32(off!(CUpti_ActivityCudaEvent.eventId));
        let stream = r.u32(off!(CUpti_ActivityCudaEvent.streamId));
        let correlation = r.u32(off!(CUpti_ActivityCudaEvent.correlationId));
        self.stats.cuda_events += 1;
        let key = (context as u64) << 32 | event as u64;
        if self.event_records.len() >= MAP_MAX && !self.event_records.contains_key(&key) {
            self.event_records.clear();
        }
        self.event_records.insert(key, (stream, correlation));
        Decoded::EventRecord {
            context,
            event,
            stream,
            correlation,
        }
    }

    #[inline]
    fn learn_context(&mut self, context: u32, device: u32) {
        if self.last_context == (context, device) {
            return;
        }
        self.last_context = (context, device);
        if self.context_device.len() < 4096 {
            self.context_device.entry(context).or_insert(device);
        }
    }
}

/// correlation id → external id, for kinetrace's external-correlation kind. Two generations of at
/// most [`ExternalIds::GENERATION`] entries each, so memory stays bounded while a GPU record that
/// arrives a little after its launch still finds its id.
#[derive(Default)]
pub struct ExternalIds {
    current: IntMap<u32, u64>,
    previous: IntMap<u32, u64>,
}

impl ExternalIds {
    /// Entries per generation.
    pub const GENERATION: usize = 1 << 18;

    /// Remembers that `correlation` belongs to external id `id`.
    pub fn insert(&mut self, correlation: u32, id: u64) {
        if self.current.len() >= Self::GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(correlation, id);
    }

    /// The external id of `correlation`, if known.
    #[inline]
    pub fn get(&self, correlation: u32) -> Option<u64> {
        if self.current.is_empty() && self.previous.is_empty() {
            return None;
        }
        self.current
            .get(&correlation)
            .or_else(|| self.previous.get(&correlation))
            .copied()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Walks a buffer of records by the sizes of `layout` (what `cuptiActivityGetNextRecord` does inside
/// CUPTI), yielding each record's bytes. Stops at a kind whose size the layout does not know. For
/// synthetic buffers (tests, benchmarks); the live pipeline advances with the library's own function.
pub struct RecordIter<'a> {
    buf: &'a [u8],
    layout: Layout,
}

impl<'a> RecordIter<'a> {
    /// Iterates `buf` (the valid bytes of one buffer).
    pub fn new(buf: &'a [u8], layout: Layout) -> Self {
        RecordIter { buf, layout }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let kind = Rec(self.buf).u32(0);
        let size = self.layout.size_of_kind(kind)?;
        if self.buf.len() < size {
            return None;
        }
        let (rec, rest) = self.buf.split_at(size);
        self.buf = rest;
        Some(rec)
    }
}

/// Decodes a whole batch of record slices: external-correlation records fill `ids` first, then every
/// activity is linked to its external id and handed to `emit`. Linking after the batch lets a GPU
/// record whose external-correlation record comes later in the batch still find it.
pub fn decode_batch<'a>(
    decoder: &mut Decoder,
    ids: &mut ExternalIds,
    records: impl IntoIterator<Item = &'a [u8]>,
    pending: &mut Vec<Activity>,
    emit: &mut dyn FnMut(&Activity),
) {
    pending.clear();
    for rec in records {
        match decoder.decode(rec) {
            Decoded::Activity(a) => pending.push(a),
            Decoded::External {
                kind,
                id,
                correlation,
            } if kind == KINETRACE_EXTERNAL_KIND => ids.insert(correlation, id),
            _ => {}
        }
    }
    for a in pending.iter_mut() {
        if let Some(c) = a.correlation {
            a.external_id = ids.get(c as u32);
        }
        decoder.link(a);
        emit(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::Release;
    use kinetrace_cupti_sys::{v12, v13};

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: (test) plain-data record structs, fully initialised from Default.
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
    }

    fn decoder(release: Release) -> Decoder {
        // SAFETY: (test) every name pointer in these records is a 'static C string literal.
        Decoder::new(release.layout(), unsafe { CStrNames::new() }, false)
    }

    macro_rules! device {
        ($t:ty, $id:expr) => {{
            let mut d: $t = Default::default();
            d.kind = kinds::DEVICE;
            d.id = $id;
            d.name = c"Test GPU".as_ptr();
            d.globalMemorySize = 1 << 34;
            d.numThreadsPerWarp = 32;
            d.numMultiprocessors = 80;
            d.maxWarpsPerMultiprocessor = 48;
            d.maxSharedMemoryPerMultiprocessor = 102_400;
            d.maxRegistersPerMultiprocessor = 65_536;
            d.maxRegistersPerBlock = 32_768;
            d.maxSharedMemoryPerBlock = 49_152;
            d.maxThreadsPerBlock = 1024;
            d.computeCapabilityMajor = 8;
            d.computeCapabilityMinor = 6;
            bytes(&d)
        }};
    }

    #[test]
    fn device_records_of_every_layout_become_device_properties() {
        let cases = [
            (Release::V11_8, device!(v12::CUpti_ActivityDevice4, 1)),
            (Release::V12_9, device!(v12::CUpti_ActivityDevice5, 1)),
            (Release::V13_5, device!(v13::CUpti_ActivityDevice6, 1)),
        ];
        for (release, rec) in cases {
            assert_eq!(
                Some(rec.len()),
                release.layout().size_of_kind(kinds::DEVICE)
            );
            let mut d = decoder(release);
            assert_eq!(
                d.decode(&device!(v12::CUpti_ActivityDevice4, 3)),
                Decoded::Device(3)
            );
            assert_eq!(d.decode(&rec), Decoded::Device(1));
            let p = d.device_properties();
            assert_eq!(
                p.iter().map(|p| p.id).collect::<Vec<_>>(),
                [1, 3],
                "sorted by id"
            );
            assert_eq!(
                p[0],
                DeviceProperties {
                    id: 1,
                    name: "Test GPU".into(),
                    total_global_mem: 1 << 34,
                    compute_major: 8,
                    compute_minor: 6,
                    max_threads_per_block: 1024,
                    max_threads_per_multiprocessor: 1536,
                    regs_per_block: 32_768,
                    warp_size: 32,
                    shared_mem_per_block: 49_152,
                    num_sms: 80,
                    regs_per_multiprocessor: Some(65_536),
                    shared_mem_per_block_optin: None,
                    shared_mem_per_multiprocessor: Some(102_400),
                },
                "{release}"
            );
            // The same device again replaces, never duplicates.
            d.decode(&rec);
            assert_eq!(d.device_properties().len(), 2);
            // Only the Device4 record (id 3) is off-size, and only for releases past 12.1.
            assert_eq!(
                d.stats().size_mismatch,
                u64::from(release != Release::V11_8),
                "{release}"
            );
            assert_eq!(d.decode(&rec[..100]), Decoded::TooShort);
        }
    }

    fn sync(kind: u32, context: u32, stream: u32, event: u32, corr: u32) -> Vec<u8> {
        bytes(&v12::CUpti_ActivitySynchronization2 {
            kind: kinds::SYNCHRONIZATION,
            type_: kind,
            start: 10,
            end: 20,
            correlationId: corr,
            contextId: context,
            streamId: stream,
            cudaEventId: event,
            ..Default::default()
        })
    }

    fn sync_detail(a: &Activity) -> Sync {
        match a.detail {
            Detail::Sync(s) => s,
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn event_syncs_find_the_event_record_and_the_device_even_later_in_the_batch() {
        let mut d = decoder(Release::V12_9);
        let mut ids = ExternalIds::default();
        let ctx = bytes(&v12::CUpti_ActivityContext3 {
            kind: kinds::CONTEXT,
            contextId: 5,
            deviceId: 2,
            ..Default::default()
        });
        let event = |event: u32, stream: u32, corr: u32| {
            bytes(&v12::CUpti_ActivityCudaEvent2 {
                kind: kinds::CUDA_EVENT,
                correlationId: corr,
                contextId: 5,
                streamId: stream,
                eventId: event,
                ..Default::default()
            })
        };
        // Waits come first in the buffer; the records that explain them after.
        let recs = [
            sync(2, 5, 3, 9, 100),
            sync(1, 5, u32::MAX, 9, 101),
            sync(2, 5, 3, 77, 102), // an event never recorded
            sync(3, 5, 3, u32::MAX, 103),
            event(9, 4, 50),
            ctx,
        ];
        let mut out = Vec::new();
        let mut pending = Vec::new();
        decode_batch(
            &mut d,
            &mut ids,
            recs.iter().map(Vec::as_slice),
            &mut pending,
            &mut |a| out.push(sync_detail(a)),
        );
        assert_eq!(out.len(), 4);
        for s in &out[..2] {
            assert_eq!(
                (
                    s.wait_on_stream,
                    s.wait_on_event_record_correlation,
                    s.event_id
                ),
                (Some(4), Some(50), Some(9))
            );
            assert_eq!(s.device, Some(2));
        }
        assert_eq!(out[0].kind, SyncKind::StreamWaitEvent);
        assert_eq!(out[1].stream, None);
        assert_eq!((out[2].wait_on_stream, out[2].event_id), (None, Some(77)));
        assert_eq!((out[3].wait_on_stream, out[3].event_id), (None, None));
        assert_eq!(out[3].device, Some(2));
        assert_eq!(d.stats().event_waits_linked, 2);
        assert_eq!(d.stats().size_mismatch, 0);

        // A later recording of the same event wins for later waits; the old 24-byte CudaEvent
        // layout (11.8 – 12.6) is read too.
        let mut old = decoder(Release::V11_8);
        let v1 = bytes(&v12::CUpti_ActivityCudaEvent {
            kind: kinds::CUDA_EVENT,
            correlationId: 60,
            contextId: 5,
            streamId: 8,
            eventId: 9,
            ..Default::default()
        });
        assert_eq!(
            old.decode(&v1),
            Decoded::EventRecord {
                context: 5,
                event: 9,
                stream: 8,
                correlation: 60
            }
        );
        assert_eq!(old.event_record(5, 9), Some((8, 60)));
        assert_eq!(
            old.event_record(6, 9),
            None,
            "keyed by context, as in Kineto"
        );
        assert_eq!(old.decode(&v1[..20]), Decoded::TooShort);
        assert_eq!(
            d.decode(&event(9, 6, 70)),
            Decoded::EventRecord {
                context: 5,
                event: 9,
                stream: 6,
                correlation: 70
            }
        );
        assert_eq!(d.event_record(5, 9), Some((6, 70)));
    }

    #[test]
    fn context_records_override_what_gpu_records_suggested() {
        let mut d = decoder(Release::V13_5);
        let k = bytes(&v13::CUpti_ActivityKernel13 {
            kind: kinds::CONCURRENT_KERNEL,
            deviceId: 0,
            contextId: 4,
            ..Default::default()
        });
        d.decode(&k);
        assert_eq!(d.device_of_context(4), Some(0));
        let c = bytes(&v13::CUpti_ActivityContext4 {
            kind: kinds::CONTEXT,
            contextId: 4,
            deviceId: 1,
            ..Default::default()
        });
        assert_eq!(
            d.decode(&c),
            Decoded::Context {
                context: 4,
                device: 1
            }
        );
        assert_eq!(d.device_of_context(4), Some(1));
        assert_eq!(d.decode(&c[..12]), Decoded::TooShort);
        let old = bytes(&v12::CUpti_ActivityContext {
            kind: kinds::CONTEXT,
            contextId: 8,
            deviceId: 3,
            ..Default::default()
        });
        assert_eq!(old.len(), 16);
        assert_eq!(
            d.decode(&old),
            Decoded::Context {
                context: 8,
                device: 3
            }
        );
    }

    #[test]
    fn memory_pool_records_are_counted_in_both_layouts() {
        macro_rules! pool {
            ($t:ty, $op:expr, $addr:expr, $size:expr) => {{
                let mut p: $t = Default::default();
                p.kind = kinds::MEMORY_POOL;
                p.memoryPoolOperationType = $op;
                p.deviceId = 1;
                p.address = $addr;
                p.size = $size;
                bytes(&p)
            }};
        }
        for release in [Release::V12_9, Release::V13_0] {
            let mut d = decoder(release);
            let recs = if release < Release::V13_0 {
                vec![
                    pool!(v12::CUpti_ActivityMemoryPool2, 1, 0x1000, 4096),
                    pool!(v12::CUpti_ActivityMemoryPool2, 1, 0x9000, 8192),
                    pool!(v12::CUpti_ActivityMemoryPool2, 3, 0x9000, 1024),
                    pool!(v12::CUpti_ActivityMemoryPool2, 2, 0x1000, 0),
                ]
            } else {
                vec![
                    pool!(v13::CUpti_ActivityMemoryPool3, 1, 0x1000, 4096),
                    pool!(v13::CUpti_ActivityMemoryPool3, 1, 0x9000, 8192),
                    pool!(v13::CUpti_ActivityMemoryPool3, 3, 0x9000, 1024),
                    pool!(v13::CUpti_ActivityMemoryPool3, 2, 0x1000, 0),
                ]
            };
            assert_eq!(
                d.decode(&recs[0]),
                Decoded::MemoryPool {
                    op: 1,
                    device: 1,
                    size: 4096
                }
            );
            for r in &recs[1..] {
                assert!(matches!(d.decode(r), Decoded::MemoryPool { .. }));
            }
            assert_eq!(
                d.pool_stats(),
                PoolStats {
                    records: 4,
                    created: 2,
                    destroyed: 1,
                    trimmed: 1,
                    live: 1,
                    live_bytes: 1024,
                    peak_bytes: 12288,
                },
                "{release}"
            );
            assert_eq!(d.stats().size_mismatch, 0, "{release}");
            assert_eq!(d.stats().unknown_kind, 0);
            assert_eq!(d.decode(&recs[0][..64]), Decoded::TooShort);
        }
    }

    #[test]
    fn struct_size_cross_check() {
        use crate::source::struct_size_mismatches;
        let r = Release::V13_5;
        let l = r.layout();
        let wanted = [kinds::CONCURRENT_KERNEL, kinds::DEVICE, kinds::NAME];
        // Agreement, or a library that cannot say: nothing refused.
        assert!(struct_size_mismatches(r, &wanted, |k| l.size_of_kind(k)).is_empty());
        assert!(struct_size_mismatches(r, &wanted, |_| None).is_empty());
        // A known release reporting another size: refused.
        assert_eq!(
            struct_size_mismatches(r, &wanted, |k| l.size_of_kind(k).map(|s| s + 8)),
            vec![
                (kinds::CONCURRENT_KERNEL, 256, 248),
                (kinds::DEVICE, 200, 192)
            ]
        );
        // A release newer than this build may have grown a kind, but not below the base layout.
        let newer = Release {
            major: 13,
            minor: 9,
        };
        assert!(struct_size_mismatches(newer, &wanted, |_| Some(400)).is_empty());
        assert_eq!(
            struct_size_mismatches(newer, &[kinds::CONCURRENT_KERNEL], |_| Some(100)),
            vec![(kinds::CONCURRENT_KERNEL, 100, 248)]
        );
    }
}
