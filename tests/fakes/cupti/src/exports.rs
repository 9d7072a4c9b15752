//! The CUPTI C ABI: every entry point kinetrace calls, with CUPTI's names and signatures, answering
//! from the simulated machine and honouring the injected faults. Also `cuDriverGetVersion`, so this
//! file can stand in for the driver in kinetrace's driver check.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use kinetrace_cupti_sys::v13;

use crate::faults::{at_least, config, fails, slow_reader};
use crate::machine::{
    complete_all, now_ns, state, subscribe, unsubscribe, write_context, write_devices, ApiCallback,
    Complete, Done, Request, CLIENT_HANDLE, EXTERNAL, EXTERNAL_PUSHES, FINALIZED,
};
use crate::records::{record_size, UNKNOWN_KIND};
use crate::{INVALID_PARAMETER, MAX_LIMIT_REACHED, MULTIPLE_SUBSCRIBERS, SUCCESS};

/// `cuptiGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetVersion(version: *mut u32) -> u32 {
    if version.is_null() {
        return INVALID_PARAMETER;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *version = config().version };
    SUCCESS
}

/// `cuptiGetTimestamp`: CLOCK_REALTIME ns, as CUPTI's default.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetTimestamp(ts: *mut u64) -> u32 {
    if let Some(c) = fails("cuptiGetTimestamp") {
        return c;
    }
    if ts.is_null() {
        return INVALID_PARAMETER;
    }
    // SAFETY: non-null out-pointer.
    unsafe { *ts = now_ns() };
    SUCCESS
}

/// `cuptiActivityRegisterCallbacks`.
#[no_mangle]
pub extern "C" fn cuptiActivityRegisterCallbacks(
    request: Option<Request>,
    complete: Option<Complete>,
) -> u32 {
    if let Some(c) = fails("cuptiActivityRegisterCallbacks") {
        return c;
    }
    let (Some(r), Some(c)) = (request, complete) else {
        return INVALID_PARAMETER;
    };
    let mut s = state();
    s.request = Some(r);
    s.complete = Some(c);
    SUCCESS
}

/// `cuptiActivityEnable`.
#[no_mangle]
pub extern "C" fn cuptiActivityEnable(kind: u32) -> u32 {
    if let Some(c) = fails("cuptiActivityEnable") {
        return c;
    }
    let mut s = state();
    if !s.enabled.contains(&kind) {
        s.enabled.push(kind);
    }
    SUCCESS
}

/// `cuptiActivityEnableAndDump`: enables `kind` and writes records for the devices / contexts that
/// already exist.
#[no_mangle]
pub extern "C" fn cuptiActivityEnableAndDump(kind: u32) -> u32 {
    if let Some(c) = fails("cuptiActivityEnableAndDump") {
        return c;
    }
    let mut done = Vec::new();
    {
        let mut s = state();
        if !s.enabled.contains(&kind) {
            s.enabled.push(kind);
        }
        if kind == v13::CUPTI_ACTIVITY_KIND_DEVICE && s.driver_initialized {
            write_devices(&mut s, &mut done);
        }
        if kind == v13::CUPTI_ACTIVITY_KIND_CONTEXT {
            for c in s.contexts.clone() {
                write_context(&mut s, c, &mut done);
            }
        }
    }
    complete_all(done);
    SUCCESS
}

/// `cuptiActivityGetStructSize(kind, version, &size)`: the size of the records this release writes
/// (version 0 only). Real libraries export it from 13.2; before that the fake answers
/// `CUPTI_ERROR_NOT_SUPPORTED`.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetStructSize(
    kind: u32,
    version: u32,
    size: *mut usize,
) -> u32 {
    if let Some(c) = fails("cuptiActivityGetStructSize") {
        return c;
    }
    if size.is_null() {
        return INVALID_PARAMETER;
    }
    if !at_least(13, 2) || version != 0 {
        return v13::CUPTI_ERROR_NOT_SUPPORTED;
    }
    let Some(mut n) = record_size(kind).filter(|_| kind != UNKNOWN_KIND) else {
        return v13::CUPTI_ERROR_INVALID_KIND;
    };
    if config().wrong_struct_size == Some(kind) {
        n += 8;
    }
    // SAFETY: non-null out-pointer.
    unsafe { *size = n };
    SUCCESS
}

/// `cuptiActivityDisable`.
#[no_mangle]
pub extern "C" fn cuptiActivityDisable(kind: u32) -> u32 {
    if let Some(c) = fails("cuptiActivityDisable") {
        return c;
    }
    state().enabled.retain(|k| *k != kind);
    SUCCESS
}

/// `cuptiActivityFlushAll`: completes the current buffer.
#[no_mangle]
pub extern "C" fn cuptiActivityFlushAll(_flag: u32) -> u32 {
    if let Some(c) = fails("cuptiActivityFlushAll") {
        return c;
    }
    let done: Done = state().buffer.take().into_iter().collect();
    complete_all(done);
    SUCCESS
}

/// `cuptiActivityGetNextRecord`: steps by this release's record sizes.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNextRecord(
    buffer: *mut u8,
    valid: usize,
    record: *mut *mut v13::CUpti_Activity,
) -> u32 {
    if let Some(c) = fails("cuptiActivityGetNextRecord") {
        return c;
    }
    if buffer.is_null() || record.is_null() {
        return INVALID_PARAMETER;
    }
    // SAFETY: out-pointer checked non-null; it holds null or a record we returned from `buffer`.
    let current = unsafe { *record } as *mut u8;
    let next = if current.is_null() {
        0
    } else {
        let off = current as usize - buffer as usize;
        if off + 4 > valid {
            return MAX_LIMIT_REACHED;
        }
        // SAFETY: `off + 4 <= valid`, inside the buffer.
        let kind = unsafe { std::ptr::read_unaligned(buffer.add(off) as *const u32) };
        match record_size(kind) {
            Some(size) => off + size,
            None => return v13::CUPTI_ERROR_INVALID_KIND,
        }
    };
    if next + 4 > valid {
        return MAX_LIMIT_REACHED;
    }
    // SAFETY: `next < valid`, inside the buffer; `record` is a valid out-pointer.
    unsafe { *record = buffer.add(next) as *mut v13::CUpti_Activity };
    SUCCESS
}

/// `cuptiActivityGetNumDroppedRecords`: records dropped since the last call, from the global queue
/// (`ctx` null); other contexts have no queue of their own since CUDA 6.0, so they answer 0.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNumDroppedRecords(
    ctx: v13::CUcontext,
    _stream: u32,
    dropped: *mut usize,
) -> u32 {
    if let Some(c) = fails("cuptiActivityGetNumDroppedRecords") {
        return c;
    }
    if dropped.is_null() {
        return INVALID_PARAMETER;
    }
    let n = if ctx.is_null() {
        std::mem::take(&mut state().dropped_pending)
    } else {
        0
    };
    slow_reader();
    // SAFETY: non-null out-pointer.
    unsafe { *dropped = n as usize };
    SUCCESS
}

/// `cuptiFinalize`.
#[no_mangle]
pub extern "C" fn cuptiFinalize() -> u32 {
    if let Some(c) = fails("cuptiFinalize") {
        return c;
    }
    FINALIZED.fetch_add(1, Ordering::Relaxed);
    let mut s = state();
    s.enabled.clear();
    s.subscriber = None;
    s.request = None;
    s.complete = None;
    SUCCESS
}

/// `cuptiSubscribe`.
#[no_mangle]
pub unsafe extern "C" fn cuptiSubscribe(
    handle: *mut v13::CUpti_SubscriberHandle,
    callback: Option<ApiCallback>,
    userdata: *mut c_void,
) -> u32 {
    if let Some(c) = fails("cuptiSubscribe") {
        return c;
    }
    if config().subscribe_refused {
        return MULTIPLE_SUBSCRIBERS;
    }
    let (Some(cb), false) = (callback, handle.is_null()) else {
        return INVALID_PARAMETER;
    };
    let rc = subscribe(cb, userdata as usize, CLIENT_HANDLE);
    if rc == SUCCESS {
        // SAFETY: non-null out-pointer; the handle value is opaque to the client.
        unsafe { *handle = CLIENT_HANDLE as *mut v13::CUpti_Subscriber_st };
    }
    rc
}

/// `cuptiUnsubscribe`: only the current subscriber's handle is accepted.
#[no_mangle]
pub extern "C" fn cuptiUnsubscribe(handle: v13::CUpti_SubscriberHandle) -> u32 {
    if let Some(c) = fails("cuptiUnsubscribe") {
        return c;
    }
    unsubscribe(handle as usize)
}

/// `cuptiEnableDomain`.
#[no_mangle]
pub extern "C" fn cuptiEnableDomain(
    enable: u32,
    _handle: v13::CUpti_SubscriberHandle,
    domain: u32,
) -> u32 {
    if let Some(c) = fails("cuptiEnableDomain") {
        return c;
    }
    let mut s = state();
    s.domains.retain(|d| *d != domain);
    if enable != 0 {
        s.domains.push(domain);
    }
    SUCCESS
}

/// `cuptiActivityPushExternalCorrelationId` (per thread, per kind).
#[no_mangle]
pub extern "C" fn cuptiActivityPushExternalCorrelationId(kind: u32, id: u64) -> u32 {
    if let Some(c) = fails("cuptiActivityPushExternalCorrelationId") {
        return c;
    }
    EXTERNAL.with(|e| e.borrow_mut().push((kind, id)));
    EXTERNAL_PUSHES.fetch_add(1, Ordering::Relaxed);
    SUCCESS
}

/// `cuptiActivityPopExternalCorrelationId`.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityPopExternalCorrelationId(kind: u32, last: *mut u64) -> u32 {
    if let Some(c) = fails("cuptiActivityPopExternalCorrelationId") {
        return c;
    }
    let popped = EXTERNAL.with(|e| {
        let mut e = e.borrow_mut();
        let pos = e.iter().rposition(|(k, _)| *k == kind)?;
        Some(e.remove(pos).1)
    });
    match popped {
        Some(id) => {
            if !last.is_null() {
                // SAFETY: non-null out-pointer.
                unsafe { *last = id };
            }
            SUCCESS
        }
        None => 18, // CUPTI_ERROR_QUEUE_EMPTY
    }
}

/// `cuptiSetThreadIdType`.
#[no_mangle]
pub extern "C" fn cuptiSetThreadIdType(kind: u32) -> u32 {
    if let Some(c) = fails("cuptiSetThreadIdType") {
        return c;
    }
    state().thread_id_type = kind;
    SUCCESS
}

/// `cuptiActivitySetAttribute` (accepted and ignored).
#[no_mangle]
pub extern "C" fn cuptiActivitySetAttribute(
    _attr: u32,
    _size: *mut usize,
    _value: *mut c_void,
) -> u32 {
    fails("cuptiActivitySetAttribute").unwrap_or(SUCCESS)
}

/// `cuptiActivityEnableRuntimeApi` (12.5+; accepted, records still written so the decoder's own
/// blocklist is exercised).
#[no_mangle]
pub extern "C" fn cuptiActivityEnableRuntimeApi(_cbid: u32, _enable: u8) -> u32 {
    fails("cuptiActivityEnableRuntimeApi").unwrap_or(SUCCESS)
}

/// `cuDriverGetVersion`, so this file can stand in for `libcuda.so.1` in the driver check.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> c_int {
    if version.is_null() {
        return 1;
    }
    // SAFETY: non-null out-pointer.
    unsafe {
        *version = if config().version >= 130000 {
            13050
        } else {
            12090
        }
    };
    0
}
