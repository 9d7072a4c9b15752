//! The workload: `fake_cupti_*` entry points a test calls as a job would call CUDA (each one API
//! call on the calling thread, with its callbacks and records), the foreign CUPTI client, and the
//! fake's counters.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering;

use kinetrace_cupti_sys::v13;

use crate::faults::at_least;
use crate::machine::{
    api_call, api_call_around, api_call_full, deliver, ensure_context, gpu_slot, held, intern_name,
    load_function, state, subscribe, unsubscribe, write_record, BUFFERS_COMPLETED, EXTERNAL,
    EXTERNAL_PUSHES, FINALIZED, FOREIGN_HANDLE, NULL_BEFORE_V27, RECORDS_DROPPED, RECORDS_WRITTEN,
    SUBSCRIBES, UNSUBSCRIBES, WRITTEN_BY_KIND,
};
use crate::records::{self, Copy, SyncRec};

fn with_cstr(name: *const c_char, default: &str) -> String {
    if name.is_null() {
        return default.to_string();
    }
    // SAFETY: the test passes a NUL-terminated string.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

const LAUNCH: &CStr = c"cudaLaunchKernel";

/// `cudaLaunchKernel` of kernel `name` on `stream` taking `dur_ns`; returns its correlation id.
#[no_mangle]
pub extern "C" fn fake_cupti_launch_kernel(name: *const c_char, stream: u32, dur_ns: u64) -> u32 {
    let name = with_cstr(name, "kernel");
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        211,
        LAUNCH,
        |s, corr, launch, done| {
            load_function(s, &name, launch, done);
            let n = intern_name(s, &name);
            let time = gpu_slot(s, stream, launch, dur_ns);
            write_record(s, &records::kernel(corr, n, stream, time, 0, 0), true, done);
            // CUPTI 13.x writes kinds older builds do not know; the reader must step over them.
            if at_least(13, 0) {
                write_record(s, &records::unknown(), false, done);
            }
        },
    )
}

/// `cuLaunchKernel` (driver API) of `name` on `stream`; its callbacks carry `name` as the
/// `symbolName`, as CUPTI's do for launches.
#[no_mangle]
pub extern "C" fn fake_cupti_driver_launch(name: *const c_char, stream: u32, dur_ns: u64) -> u32 {
    let name = with_cstr(name, "kernel");
    let symbol = intern_name(&mut state(), &name);
    api_call_full(
        v13::CUPTI_CB_DOMAIN_DRIVER_API,
        307,
        c"cuLaunchKernel",
        symbol,
        || {},
        |s, corr, launch, done| {
            load_function(s, &name, launch, done);
            let n = intern_name(s, &name);
            let time = gpu_slot(s, stream, launch, dur_ns);
            write_record(s, &records::kernel(corr, n, stream, time, 0, 0), true, done);
        },
    )
}

/// `cudaLaunchKernel` of `name` that reaches the driver's `cuLaunchKernel` inside it: the driver
/// call's enter/exit callbacks, external-correlation and DRIVER records nest inside the runtime
/// call's, and the kernel record carries the runtime call's correlation id. Returns the runtime
/// call's correlation id and writes the driver call's to `driver_corr` (if non-null).
#[no_mangle]
pub unsafe extern "C" fn fake_cupti_launch_kernel_nested(
    name: *const c_char,
    stream: u32,
    dur_ns: u64,
    driver_corr: *mut u32,
) -> u32 {
    let name = with_cstr(name, "kernel");
    let mut inner = 0;
    let corr = api_call_around(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        211,
        LAUNCH,
        || {
            inner = api_call(
                v13::CUPTI_CB_DOMAIN_DRIVER_API,
                307,
                c"cuLaunchKernel",
                |_, _, _, _| {},
            )
        },
        |s, corr, launch, done| {
            load_function(s, &name, launch, done);
            let n = intern_name(s, &name);
            let time = gpu_slot(s, stream, launch, dur_ns);
            write_record(s, &records::kernel(corr, n, stream, time, 0, 0), true, done);
        },
    );
    if !driver_corr.is_null() {
        // SAFETY: a valid out-pointer from the caller (checked non-null).
        unsafe { *driver_corr = inner };
    }
    corr
}

/// Successful external-correlation pushes so far, on any thread.
#[no_mangle]
pub extern "C" fn fake_cupti_external_pushes() -> u64 {
    EXTERNAL_PUSHES.load(Ordering::Relaxed)
}

/// External ids left on the calling thread's stack (any kind).
#[no_mangle]
pub extern "C" fn fake_cupti_external_depth() -> u32 {
    EXTERNAL.with(|e| e.borrow().len() as u32)
}

/// `cudaGraphLaunch` of a graph with `nodes` kernel nodes: one kernel record per node, all with the
/// launch's correlation id.
#[no_mangle]
pub extern "C" fn fake_cupti_graph_launch(graph_id: u32, nodes: u32, stream: u32) -> u32 {
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        311,
        c"cudaGraphLaunch",
        |s, corr, launch, done| {
            for node in 1..=nodes as u64 {
                let name = format!("graph_kernel_{node}");
                load_function(s, &name, launch, done);
                let n = intern_name(s, &name);
                let time = gpu_slot(s, stream, launch, 2_000);
                let rec = records::kernel(corr, n, stream, time, graph_id, node);
                write_record(s, &rec, true, done);
            }
        },
    )
}

/// `cudaMemcpyAsync` (or `cudaMemcpyPeerAsync` for `copy_kind` 10) of `bytes` on `stream`.
#[no_mangle]
pub extern "C" fn fake_cupti_memcpy(
    copy_kind: u8,
    src_kind: u8,
    dst_kind: u8,
    bytes: u64,
    stream: u32,
) -> u32 {
    let (cbid, name) = if copy_kind == 10 {
        (161, c"cudaMemcpyPeerAsync")
    } else {
        (41, c"cudaMemcpyAsync")
    };
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        cbid,
        name,
        |s, corr, launch, done| {
            let copy = Copy {
                copy_kind,
                src_kind,
                dst_kind,
                bytes,
                stream,
                corr,
                time: gpu_slot(s, stream, launch, 1_000 + bytes / 10),
            };
            let rec = if copy_kind == 10 {
                ensure_context(s, 2, done);
                records::memcpy_p2p(&copy)
            } else {
                records::memcpy(&copy)
            };
            write_record(s, &rec, true, done);
        },
    )
}

/// `cudaMemsetAsync` of `bytes` of device memory on `stream`.
#[no_mangle]
pub extern "C" fn fake_cupti_memset(bytes: u64, stream: u32) -> u32 {
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        51,
        c"cudaMemsetAsync",
        |s, corr, launch, done| {
            let time = gpu_slot(s, stream, launch, 500);
            write_record(s, &records::memset(corr, bytes, stream, time), true, done);
        },
    )
}

/// A synchronization of `sync_type` (1 event sync, 2 stream wait event, 3 stream sync, 4 context
/// sync) on `stream` in context 1; event syncs wait on event 7.
#[no_mangle]
pub extern "C" fn fake_cupti_sync(sync_type: u32, stream: u32) -> u32 {
    fake_cupti_sync_on(sync_type, stream, 7, 1)
}

/// A synchronization of `sync_type` on `stream` of `context`; event syncs (1, 2) wait on `event`.
#[no_mangle]
pub extern "C" fn fake_cupti_sync_on(sync_type: u32, stream: u32, event: u32, context: u32) -> u32 {
    sync_around(sync_type, stream, event, context, || {})
}

/// A synchronization of `sync_type` on stream 7 in context 1 that runs `during(arg)` after its
/// enter callback (while the caller is blocked in it) and before its exit callback and records.
#[no_mangle]
pub extern "C" fn fake_cupti_sync_around(
    sync_type: u32,
    during: extern "C" fn(*mut c_void),
    arg: *mut c_void,
) -> u32 {
    sync_around(sync_type, 7, 7, 1, || during(arg))
}

fn sync_around(
    sync_type: u32,
    stream: u32,
    event: u32,
    context: u32,
    during: impl FnOnce(),
) -> u32 {
    let (cbid, name) = match sync_type {
        1 => (137, c"cudaEventSynchronize"),
        2 => (147, c"cudaStreamWaitEvent"),
        3 => (131, c"cudaStreamSynchronize"),
        _ => (165, c"cudaDeviceSynchronize"),
    };
    api_call_around(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        cbid,
        name,
        during,
        |s, corr, launch, done| {
            ensure_context(s, context, done);
            let end = s
                .stream_free
                .get(&stream)
                .copied()
                .unwrap_or(0)
                .max(launch + 100);
            let rec = records::sync(&SyncRec {
                sync_type,
                stream,
                event,
                context,
                corr,
                time: (launch, end),
            });
            write_record(s, &rec, true, done);
        },
    )
}

/// `cudaEventRecord(event, stream)` in context 1: a CUDA_EVENT record. Returns its correlation id.
#[no_mangle]
pub extern "C" fn fake_cupti_event_record(event: u32, stream: u32) -> u32 {
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        135,
        c"cudaEventRecord",
        |s, corr, _launch, done| {
            write_record(s, &records::cuda_event(corr, event, stream), false, done);
        },
    )
}

/// A memory-pool operation (1 `cudaMemPoolCreate`, 2 `cudaMemPoolDestroy`, 3 `cudaMemPoolTrimTo`)
/// on device 0: a MEMORY_POOL record with the pool's size after it.
#[no_mangle]
pub extern "C" fn fake_cupti_mempool(op: u32, address: u64, size: u64) -> u32 {
    let (cbid, name) = match op {
        1 => (383, c"cudaMemPoolCreate"),
        2 => (384, c"cudaMemPoolDestroy"),
        _ => (377, c"cudaMemPoolTrimTo"),
    };
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        cbid,
        name,
        |s, corr, launch, done| {
            let rec = records::memory_pool(corr, op, address, size, launch + 10);
            write_record(s, &rec, true, done);
        },
    )
}

fn memory_op(op: u32, address: u64, bytes: u64) -> u32 {
    let (cbid, name) = if op == 1 {
        (20, c"cudaMalloc")
    } else {
        (22, c"cudaFree")
    };
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        cbid,
        name,
        |s, corr, launch, done| {
            let rec = records::memory(corr, op, address, bytes, launch + 10);
            write_record(s, &rec, true, done);
        },
    )
}

/// `cudaMalloc` of `bytes` at `address` (a MEMORY2 allocation record).
#[no_mangle]
pub extern "C" fn fake_cupti_malloc(address: u64, bytes: u64) -> u32 {
    memory_op(1, address, bytes)
}

/// `cudaFree` of the block at `address` (a MEMORY2 release record).
#[no_mangle]
pub extern "C" fn fake_cupti_free(address: u64, bytes: u64) -> u32 {
    memory_op(2, address, bytes)
}

/// A runtime call with no GPU work (e.g. cbid 17, `cudaGetDevice`, which Kineto blocklists).
#[no_mangle]
pub extern "C" fn fake_cupti_runtime_call(cbid: u32) -> u32 {
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        cbid,
        c"cudaRuntimeCall",
        |_, _, _, _| {},
    )
}

/// A runtime call (cbid 17) that runs `during(arg)` after its enter callback and before its records
/// are written, e.g. to end a profiling window while this thread is inside a CUDA call.
#[no_mangle]
pub extern "C" fn fake_cupti_call_around(
    during: extern "C" fn(*mut c_void),
    arg: *mut c_void,
) -> u32 {
    api_call_around(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        17,
        c"cudaGetDevice",
        || during(arg),
        |_, _, _, _| {},
    )
}

/// The foreign client's callback: it only needs to exist.
unsafe extern "C" fn foreign_callback(_: *mut c_void, _: u32, _: u32, _: *const c_void) {}

/// Subscribes another CUPTI client the way PyTorch's Kineto does (`cuptiSubscribe` with its own
/// callback). Returns the CUPTI code: 0, or 39 while someone else is subscribed.
#[no_mangle]
pub extern "C" fn fake_cupti_foreign_subscribe() -> u32 {
    subscribe(foreign_callback, 0, FOREIGN_HANDLE)
}

/// Unsubscribes the foreign client. Returns the CUPTI code (1, INVALID_PARAMETER, when it is not
/// the subscriber).
#[no_mangle]
pub extern "C" fn fake_cupti_foreign_unsubscribe() -> u32 {
    unsubscribe(FOREIGN_HANDLE)
}

/// Records of `kind` written into client buffers so far.
#[no_mangle]
pub extern "C" fn fake_cupti_written_of_kind(kind: u32) -> u64 {
    WRITTEN_BY_KIND
        .get(kind as usize)
        .map_or(0, |n| n.load(Ordering::Relaxed))
}

/// Counters: records written, records dropped, buffers completed, cuptiFinalize calls.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct FakeStats {
    /// Records written into client buffers.
    pub records_written: u64,
    /// Records dropped (no buffer, or injected drops).
    pub records_dropped: u64,
    /// Buffers handed back through the completion callback.
    pub buffers_completed: u64,
    /// Times `cuptiFinalize` was called.
    pub finalized: u32,
    /// Kinds currently enabled.
    pub enabled_kinds: u32,
    /// Whether a subscriber is registered.
    pub subscribed: u32,
    /// Null buffers received while reporting a version before 12.9 (where real CUPTI crashes).
    pub null_buffers_before_v27: u64,
    /// Successful `cuptiSubscribe` calls (the foreign client's included).
    pub subscribes: u64,
    /// Successful `cuptiUnsubscribe` calls (the foreign client's included).
    pub unsubscribes: u64,
    /// Whether the current subscriber is the foreign client.
    pub foreign_subscribed: u32,
}

/// Fills `out` with the fake's counters.
#[no_mangle]
pub unsafe extern "C" fn fake_cupti_stats(out: *mut FakeStats) {
    if out.is_null() {
        return;
    }
    let s = state();
    let stats = FakeStats {
        records_written: RECORDS_WRITTEN.load(Ordering::Relaxed),
        records_dropped: RECORDS_DROPPED.load(Ordering::Relaxed),
        buffers_completed: BUFFERS_COMPLETED.load(Ordering::Relaxed),
        finalized: FINALIZED.load(Ordering::Relaxed),
        enabled_kinds: s.enabled.len() as u32,
        subscribed: s.subscriber.is_some() as u32,
        null_buffers_before_v27: NULL_BEFORE_V27.load(Ordering::Relaxed),
        subscribes: SUBSCRIBES.load(Ordering::Relaxed),
        unsubscribes: UNSUBSCRIBES.load(Ordering::Relaxed),
        foreign_subscribed: s.subscriber.is_some_and(|(_, _, h)| h == FOREIGN_HANDLE) as u32,
    };
    // SAFETY: the caller passes a valid pointer (checked non-null).
    unsafe { *out = stats };
}

/// Hands back every buffer held under `FAKE_CUPTI_HOLD=1` (on the calling thread). Returns how many.
#[no_mangle]
pub extern "C" fn fake_cupti_release_held() -> u64 {
    let done = std::mem::take(&mut *held());
    let n = done.len() as u64;
    deliver(done);
    n
}
