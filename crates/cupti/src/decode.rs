//! Decoders: CUPTI record bytes → [`Activity`].
//!
//! Each decoder takes one record as `&[u8]` (its real length, as measured between two records the
//! library handed out), checks the length, and reads fields at offsets taken from the bindgen structs
//! of the **oldest** layout that has them (`offset_of!`), which every newer layout shares (the layout
//! test in `kinetrace-cupti-sys` checks this against every supported wheel). Enum-typed fields are
//! read as integers; unknown values map to `Unknown`, never to undefined behaviour. No field newer
//! than 11.8 is needed for the Kineto record model, so no tail field is read.

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
    /// (kernel `name`, marker `name`/`domain`), either null or a pointer to a NUL-terminated string
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
    stats: DecodeStats,
}

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
            stats: DecodeStats::default(),
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
                device: context.and_then(|c| self.context_device.get(&c).copied()),
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
        emit(a);
    }
}
