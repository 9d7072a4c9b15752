//! Record bytes in the layout of the impersonated release: for each kind, the struct
//! `kinetrace-cupti-sys`'s release → struct table ([`with_record_struct!`]) names, filled from
//! `Default` (all zero) and the given fields.

use std::ffi::{c_char, CStr};
use std::mem::size_of;

use kinetrace_cupti_sys::layouts::{record_size as table_size, Family};
use kinetrace_cupti_sys::{v12, v13, with_record_struct};

use crate::faults::config;

/// A kind no kinetrace build reads (GREEN_CONTEXT, 13.2+), written to check that the reader steps
/// over unknown records with `cuptiActivityGetNextRecord`.
pub(crate) const UNKNOWN_KIND: u32 = 59;
const UNKNOWN_KIND_SIZE: usize = 40;

/// The bytes of a record struct.
pub(crate) fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: any initialised value can be viewed as bytes for its size; the record structs are
    // plain data (integers, pointers, unions of integers) created from Default (all zero) and filled.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }
}

/// The size of the records of `kind` the impersonated release writes.
pub(crate) fn record_size(kind: u32) -> Option<usize> {
    if kind == UNKNOWN_KIND {
        return Some(UNKNOWN_KIND_SIZE);
    }
    Some(table_size(Family::of_kind(kind)?, config().release))
}

/// A record of a kind no kinetrace build reads.
pub(crate) fn unknown() -> [u8; UNKNOWN_KIND_SIZE] {
    let mut r = [0u8; UNKNOWN_KIND_SIZE];
    r[..4].copy_from_slice(&UNKNOWN_KIND.to_le_bytes());
    r
}

/// A CONCURRENT_KERNEL record in device 0, context 1.
pub(crate) fn kernel(
    corr: u32,
    name: *const c_char,
    stream: u32,
    (start, end): (u64, u64),
    graph: u32,
    node: u64,
) -> Vec<u8> {
    macro_rules! kernel {
        ($t:ty) => {{
            let mut k: $t = Default::default();
            k.kind = v13::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
            k.registersPerThread = 32;
            k.start = start;
            k.end = end;
            k.completed = end;
            k.deviceId = 0;
            k.contextId = 1;
            k.streamId = stream;
            k.gridX = 64;
            k.gridY = 2;
            k.gridZ = 1;
            k.blockX = 128;
            k.blockY = 1;
            k.blockZ = 1;
            k.staticSharedMemory = 1024;
            k.dynamicSharedMemory = 512;
            k.correlationId = corr;
            k.name = name;
            k.graphNodeId = node;
            k.graphId = graph;
            bytes_of(&k).to_vec()
        }};
    }
    with_record_struct!(kernel, config().release, kernel)
}

/// What a copy record says.
pub(crate) struct Copy {
    pub(crate) copy_kind: u8,
    pub(crate) src_kind: u8,
    pub(crate) dst_kind: u8,
    pub(crate) bytes: u64,
    pub(crate) stream: u32,
    pub(crate) corr: u32,
    pub(crate) time: (u64, u64),
}

/// A MEMCPY record in device 0, context 1.
pub(crate) fn memcpy(c: &Copy) -> Vec<u8> {
    macro_rules! copy {
        ($t:ty) => {{
            let mut m: $t = Default::default();
            m.kind = v13::CUPTI_ACTIVITY_KIND_MEMCPY;
            m.copyKind = c.copy_kind;
            m.srcKind = c.src_kind;
            m.dstKind = c.dst_kind;
            m.flags = 1;
            m.bytes = c.bytes;
            m.start = c.time.0;
            m.end = c.time.1;
            m.deviceId = 0;
            m.contextId = 1;
            m.streamId = c.stream;
            m.correlationId = c.corr;
            bytes_of(&m).to_vec()
        }};
    }
    with_record_struct!(memcpy, config().release, copy)
}

/// A MEMCPY2 (peer-to-peer) record from device 0 / context 1 to device 1 / context 2.
pub(crate) fn memcpy_p2p(c: &Copy) -> Vec<u8> {
    let mut m = v12::CUpti_ActivityMemcpyPtoP4 {
        kind: v13::CUPTI_ACTIVITY_KIND_MEMCPY2,
        copyKind: c.copy_kind,
        srcKind: c.src_kind,
        dstKind: c.dst_kind,
        bytes: c.bytes,
        start: c.time.0,
        end: c.time.1,
        deviceId: 0,
        contextId: 1,
        streamId: c.stream,
        srcDeviceId: 0,
        srcContextId: 1,
        dstDeviceId: 1,
        dstContextId: 2,
        correlationId: c.corr,
        ..Default::default()
    };
    m.flags = 1;
    bytes_of(&m).to_vec()
}

/// A MEMSET record of device memory in device 0, context 1.
pub(crate) fn memset(corr: u32, bytes: u64, stream: u32, (start, end): (u64, u64)) -> Vec<u8> {
    macro_rules! set {
        ($t:ty) => {{
            let mut m: $t = Default::default();
            m.kind = v13::CUPTI_ACTIVITY_KIND_MEMSET;
            m.value = 0;
            m.bytes = bytes;
            m.start = start;
            m.end = end;
            m.deviceId = 0;
            m.contextId = 1;
            m.streamId = stream;
            m.correlationId = corr;
            m.memoryKind = 3;
            bytes_of(&m).to_vec()
        }};
    }
    with_record_struct!(memset, config().release, set)
}

/// What a synchronization record says.
pub(crate) struct SyncRec {
    pub(crate) sync_type: u32,
    pub(crate) stream: u32,
    pub(crate) event: u32,
    pub(crate) context: u32,
    pub(crate) corr: u32,
    pub(crate) time: (u64, u64),
}

/// A SYNCHRONIZATION record. Fields that do not apply to the type are `u32::MAX`, as CUPTI writes.
pub(crate) fn sync(r: &SyncRec) -> Vec<u8> {
    macro_rules! sync {
        ($t:ty) => {{
            let mut m: $t = Default::default();
            m.kind = v13::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
            m.type_ = r.sync_type;
            m.start = r.time.0;
            m.end = r.time.1;
            m.correlationId = r.corr;
            m.contextId = r.context;
            m.streamId = if r.sync_type == 4 { u32::MAX } else { r.stream };
            m.cudaEventId = if r.sync_type <= 2 { r.event } else { u32::MAX };
            bytes_of(&m).to_vec()
        }};
    }
    with_record_struct!(sync, config().release, sync)
}

/// A CUDA_EVENT record: `cudaEventRecord(event, stream)` in context 1.
pub(crate) fn cuda_event(corr: u32, event: u32, stream: u32) -> Vec<u8> {
    macro_rules! ev {
        ($t:ty) => {{
            let mut e: $t = Default::default();
            e.kind = v13::CUPTI_ACTIVITY_KIND_CUDA_EVENT;
            e.correlationId = corr;
            e.contextId = 1;
            e.streamId = stream;
            e.eventId = event;
            bytes_of(&e).to_vec()
        }};
    }
    with_record_struct!(cuda_event, config().release, ev)
}

/// A MEMORY_POOL record of a local pool on device 0: operation `op`, the pool's size after it.
pub(crate) fn memory_pool(corr: u32, op: u32, address: u64, size: u64, timestamp: u64) -> Vec<u8> {
    macro_rules! pool {
        ($t:ty) => {{
            let mut p: $t = Default::default();
            p.kind = v13::CUPTI_ACTIVITY_KIND_MEMORY_POOL;
            p.memoryPoolOperationType = op;
            p.memoryPoolType = 1; // LOCAL
            p.correlationId = corr;
            p.processId = std::process::id();
            p.deviceId = 0;
            p.address = address;
            p.size = size;
            p.releaseThreshold = 0;
            p.timestamp = timestamp;
            bytes_of(&p).to_vec()
        }};
    }
    with_record_struct!(memory_pool, config().release, pool)
}

/// A MEMORY2 record of device memory in device 0, context 1 (`op` 1 allocation, 2 release).
pub(crate) fn memory(corr: u32, op: u32, address: u64, bytes: u64, timestamp: u64) -> Vec<u8> {
    macro_rules! mem {
        ($t:ty) => {{
            let mut m: $t = Default::default();
            m.kind = v13::CUPTI_ACTIVITY_KIND_MEMORY2;
            m.memoryOperationType = op;
            m.memoryKind = 3;
            m.correlationId = corr;
            m.address = address;
            m.bytes = bytes;
            m.timestamp = timestamp;
            m.processId = std::process::id();
            m.deviceId = 0;
            m.contextId = 1;
            bytes_of(&m).to_vec()
        }};
    }
    with_record_struct!(memory, config().release, mem)
}

/// A simulated device: (id, name, compute capability, SMs, global memory).
pub(crate) type FakeDevice = (u32, &'static CStr, (u32, u32), u32, u64);

/// A DEVICE record.
pub(crate) fn device(&(id, name, (major, minor), sms, mem): &FakeDevice) -> Vec<u8> {
    macro_rules! dev {
        ($t:ty) => {{
            let mut d: $t = Default::default();
            d.kind = v13::CUPTI_ACTIVITY_KIND_DEVICE;
            d.globalMemorySize = mem;
            d.numThreadsPerWarp = 32;
            d.numMultiprocessors = sms;
            d.maxWarpsPerMultiprocessor = 64;
            d.maxBlocksPerMultiprocessor = 32;
            d.maxSharedMemoryPerMultiprocessor = 233_472;
            d.maxRegistersPerMultiprocessor = 65_536;
            d.maxRegistersPerBlock = 65_536;
            d.maxSharedMemoryPerBlock = 49_152;
            d.maxThreadsPerBlock = 1024;
            d.computeCapabilityMajor = major;
            d.computeCapabilityMinor = minor;
            d.id = id;
            d.name = name.as_ptr();
            d.isCudaVisible = 1;
            bytes_of(&d).to_vec()
        }};
    }
    with_record_struct!(device, config().release, dev)
}

/// A CONTEXT record: `context` lives on `device`.
pub(crate) fn context(context: u32, device: u32) -> Vec<u8> {
    macro_rules! ctx {
        ($t:ty) => {{
            let mut c: $t = Default::default();
            c.kind = v13::CUPTI_ACTIVITY_KIND_CONTEXT;
            c.contextId = context;
            c.deviceId = device;
            c.computeApiKind = 1; // CUDA
            c.nullStreamId = 7;
            bytes_of(&c).to_vec()
        }};
    }
    with_record_struct!(context, config().release, ctx)
}

/// A lazy-function-loading OVERHEAD record from `start` to `end`.
pub(crate) fn lazy_loading_overhead(start: u64, end: u64) -> Vec<u8> {
    macro_rules! overhead {
        ($t:ty) => {{
            let mut o: $t = Default::default();
            o.kind = v13::CUPTI_ACTIVITY_KIND_OVERHEAD;
            o.overheadKind = v13::CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING;
            o.objectKind = v13::CUPTI_ACTIVITY_OBJECT_THREAD;
            o.start = start;
            o.end = end;
            bytes_of(&o).to_vec()
        }};
    }
    with_record_struct!(overhead, config().release, overhead)
}

/// An EXTERNAL_CORRELATION record: `corr` belongs to external id `id` of `kind`.
pub(crate) fn external_correlation(kind: u32, id: u64, corr: u32) -> Vec<u8> {
    let r = v12::CUpti_ActivityExternalCorrelation {
        kind: v13::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
        externalKind: kind,
        externalId: id,
        correlationId: corr,
        ..Default::default()
    };
    bytes_of(&r).to_vec()
}

/// A RUNTIME or DRIVER record.
pub(crate) fn api(
    driver: bool,
    cbid: u32,
    (start, end): (u64, u64),
    thread: u32,
    corr: u32,
) -> Vec<u8> {
    let r = v12::CUpti_ActivityAPI {
        kind: if driver {
            v13::CUPTI_ACTIVITY_KIND_DRIVER
        } else {
            v13::CUPTI_ACTIVITY_KIND_RUNTIME
        },
        cbid,
        start,
        end,
        processId: std::process::id(),
        threadId: thread,
        correlationId: corr,
        returnValue: 0,
    };
    bytes_of(&r).to_vec()
}
