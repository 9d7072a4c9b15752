//! The activity API: record kinds, buffers, flushing, external correlation.
//!
//! Every function links to the vendor's
//! [Activity API](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html) reference.

use std::mem::MaybeUninit;

use kinetrace_cupti_sys::v13 as sys;
use kinetrace_cupti_sys::Cupti;

use super::{CuptiError, IntoResult, Optional};

/// Registers the functions CUPTI calls to get an empty activity buffer and to return a full one.
///
/// See [`cuptiActivityRegisterCallbacks`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
///
/// # Safety
/// Both functions must be sound to call from any CUPTI thread at any time until the process ends
/// (CUPTI keeps them after the kinds are disabled), with the arguments CUPTI passes: `request`
/// with three valid out-pointers, `complete` with a buffer `request` handed out and its valid
/// length. Neither may unwind.
pub unsafe fn register_callbacks(
    cupti: &Cupti,
    request: sys::CUpti_BuffersCallbackRequestFunc,
    complete: sys::CUpti_BuffersCallbackCompleteFunc,
) -> Result<(), CuptiError> {
    // SAFETY: the caller vouches for both callbacks.
    unsafe { (cupti.cuptiActivityRegisterCallbacks)(request, complete) }.result()
}

/// Starts collecting records of `kind` (a `CUPTI_ACTIVITY_KIND_*` value).
///
/// See [`cuptiActivityEnable`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn enable(cupti: &Cupti, kind: sys::CUpti_ActivityKind) -> Result<(), CuptiError> {
    // SAFETY: a plain value; CUPTI rejects kinds it does not know.
    unsafe { (cupti.cuptiActivityEnable)(kind) }.result()
}

/// Starts collecting `kind` and writes records for the resources (devices, contexts, streams)
/// that already exist.
///
/// See [`cuptiActivityEnableAndDump`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn enable_and_dump(cupti: &Cupti, kind: sys::CUpti_ActivityKind) -> Optional<()> {
    let f = cupti.cuptiActivityEnableAndDump?;
    // SAFETY: a plain value.
    Some(unsafe { f(kind) }.result())
}

/// Stops collecting records of `kind`.
///
/// See [`cuptiActivityDisable`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn disable(cupti: &Cupti, kind: sys::CUpti_ActivityKind) -> Result<(), CuptiError> {
    // SAFETY: a plain value.
    unsafe { (cupti.cuptiActivityDisable)(kind) }.result()
}

/// Hands back every buffer CUPTI holds through the completion callback; with
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`, incomplete ones too. Blocks until they are delivered, so it
/// must not be called from a buffer callback.
///
/// See [`cuptiActivityFlushAll`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn flush_all(cupti: &Cupti, flag: u32) -> Result<(), CuptiError> {
    // SAFETY: a plain value.
    unsafe { (cupti.cuptiActivityFlushAll)(flag) }.result()
}

/// Sets how often (ms) CUPTI hands back full buffers on its own; 0 turns periodic flushing off.
///
/// See [`cuptiActivityFlushPeriod`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn flush_period(cupti: &Cupti, ms: u32) -> Optional<()> {
    let f = cupti.cuptiActivityFlushPeriod?;
    // SAFETY: a plain value.
    Some(unsafe { f(ms) }.result())
}

/// Advances `*record` to the next record of a completed buffer: from null to the first record,
/// else past the record it points at. `Err(MAX_LIMIT_REACHED)` at the end of the valid data;
/// `Err(INVALID_KIND)` at an incomplete record.
///
/// See [`cuptiActivityGetNextRecord`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
///
/// # Safety
/// `buffer` must point at a buffer CUPTI completed with `valid` bytes of records, readable for the
/// whole call (not released back to CUPTI meanwhile); `*record` must be null or a pointer this
/// function returned for the same buffer.
pub unsafe fn get_next_record(
    cupti: &Cupti,
    buffer: *mut u8,
    valid: usize,
    record: &mut *mut sys::CUpti_Activity,
) -> Result<(), CuptiError> {
    // SAFETY: the caller vouches for `buffer`, `valid` and `*record`; `record` is a valid in/out
    // pointer (a `&mut`).
    unsafe { (cupti.cuptiActivityGetNextRecord)(buffer, valid, record) }.result()
}

/// Records CUPTI dropped since the last call, from the global queue (null context, stream 0):
/// every buffer has been global since CUDA 6.0, and the per-thread buffers of 13.x are turned off
/// by the source.
///
/// See [`cuptiActivityGetNumDroppedRecords`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn get_num_dropped_records(cupti: &Cupti) -> Result<usize, CuptiError> {
    let mut dropped = MaybeUninit::<usize>::uninit();
    // SAFETY: a null context names the global queue; `dropped` is a valid out-pointer.
    unsafe {
        (cupti.cuptiActivityGetNumDroppedRecords)(std::ptr::null_mut(), 0, dropped.as_mut_ptr())
    }
    .result()?;
    // SAFETY: CUPTI_SUCCESS means the count was written.
    Ok(unsafe { dropped.assume_init() })
}

/// Pushes `id` on the calling thread's stack of external ids of `kind`: records of the CUDA calls
/// the thread makes until the matching pop get an external-correlation record with it.
///
/// See [`cuptiActivityPushExternalCorrelationId`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
#[inline]
pub fn push_external_correlation_id(
    cupti: &Cupti,
    kind: sys::CUpti_ExternalCorrelationKind,
    id: u64,
) -> Optional<()> {
    let f = cupti.cuptiActivityPushExternalCorrelationId?;
    // SAFETY: plain values.
    Some(unsafe { f(kind, id) }.result())
}

/// Pops the top of the calling thread's stack of external ids of `kind`, returning it.
///
/// See [`cuptiActivityPopExternalCorrelationId`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
#[inline]
pub fn pop_external_correlation_id(
    cupti: &Cupti,
    kind: sys::CUpti_ExternalCorrelationKind,
) -> Optional<u64> {
    let f = cupti.cuptiActivityPopExternalCorrelationId?;
    let mut last = MaybeUninit::<u64>::uninit();
    // SAFETY: `last` is a valid out-pointer.
    if let Err(e) = unsafe { f(kind, last.as_mut_ptr()) }.result() {
        return Some(Err(e));
    }
    // SAFETY: CUPTI_SUCCESS means the id was written.
    Some(Ok(unsafe { last.assume_init() }))
}

/// Chooses which thread ids API records carry (`CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM`: the
/// kernel's tid, as the CPU side of the trace uses).
///
/// See [`cuptiSetThreadIdType`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn set_thread_id_type(cupti: &Cupti, kind: sys::CUpti_ActivityThreadIdType) -> Optional<()> {
    let f = cupti.cuptiSetThreadIdType?;
    // SAFETY: a plain value.
    Some(unsafe { f(kind) }.result())
}

/// Sets an activity attribute to `value` (its bytes, sized as the attribute's type: `uint8_t`,
/// `size_t`...). CUPTI answers `CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT` for a wrong size.
///
/// See [`cuptiActivitySetAttribute`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn set_attribute(
    cupti: &Cupti,
    attribute: sys::CUpti_ActivityAttribute,
    value: &mut [u8],
) -> Optional<()> {
    let f = cupti.cuptiActivitySetAttribute?;
    let mut size = value.len();
    // SAFETY: `size` is a valid in/out pointer and `value` is valid for `size` bytes; every activity
    // attribute is a plain value read (not kept) by CUPTI.
    Some(unsafe { f(attribute, &mut size, value.as_mut_ptr().cast()) }.result())
}

/// Turns API records of one runtime call (`cbid`) on or off (12.5+).
///
/// See [`cuptiActivityEnableRuntimeApi`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn enable_runtime_api(
    cupti: &Cupti,
    cbid: sys::CUpti_CallbackId,
    enable: bool,
) -> Optional<()> {
    let f = cupti.cuptiActivityEnableRuntimeApi?;
    // SAFETY: plain values; CUPTI rejects ids it does not know.
    Some(unsafe { f(cbid, enable as u8) }.result())
}

/// Turns API records of one driver call (`cbid`) on or off (12.5+).
///
/// See [`cuptiActivityEnableDriverApi`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn enable_driver_api(cupti: &Cupti, cbid: sys::CUpti_CallbackId, enable: bool) -> Optional<()> {
    let f = cupti.cuptiActivityEnableDriverApi?;
    // SAFETY: plain values; CUPTI rejects ids it does not know.
    Some(unsafe { f(cbid, enable as u8) }.result())
}

/// The size of the records of `kind` this library writes (`version` 0) (13.2+).
///
/// See [`cuptiActivityGetStructSize`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn get_struct_size(
    cupti: &Cupti,
    kind: sys::CUpti_ActivityKind,
    version: u32,
) -> Optional<usize> {
    let f = cupti.cuptiActivityGetStructSize?;
    let mut size = MaybeUninit::<usize>::uninit();
    // SAFETY: `size` is a valid out-pointer; the rest are plain values.
    if let Err(e) = unsafe { f(kind, version, size.as_mut_ptr()) }.result() {
        return Some(Err(e));
    }
    // SAFETY: CUPTI_SUCCESS means the size was written.
    Some(Ok(unsafe { size.assume_init() }))
}

/// CUPTI's current timestamp, in the clock its records use (ns).
///
/// See [`cuptiGetTimestamp`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn get_timestamp(cupti: &Cupti) -> Optional<u64> {
    let f = cupti.cuptiGetTimestamp?;
    let mut ts = MaybeUninit::<u64>::uninit();
    // SAFETY: `ts` is a valid out-pointer.
    if let Err(e) = unsafe { f(ts.as_mut_ptr()) }.result() {
        return Some(Err(e));
    }
    // SAFETY: CUPTI_SUCCESS means the timestamp was written.
    Some(Ok(unsafe { ts.assume_init() }))
}
