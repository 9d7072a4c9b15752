//! The checked layer between the function table ([`Cupti`], in `kinetrace-cupti-sys`) and the
//! source: one function per CUPTI entry point, each returning `Result<_, CuptiError>` (the cudarc
//! `result` layer). Vendor names become short snake_case names: `cuptiSubscribe` →
//! [`subscribe`], `cuptiActivityEnable` → [`activity::enable`].
//!
//! Entry points an older library may lack return [`Optional`]: `None` when the library does not
//! export the symbol, so a caller decides what a missing entry point means. A wrapper whose
//! arguments are plain values is a safe `fn`; one that takes raw pointers or handles the caller must
//! keep valid is an `unsafe fn` whose `# Safety` section states the exact invariant.
//!
//! Nothing here keeps state, logs or allocates: callers record what they ignore.

use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;

use kinetrace_cupti_sys::v13 as sys;
use kinetrace_cupti_sys::Cupti;

pub mod activity;
mod error;

pub use error::{
    CuptiError, IntoResult, INVALID_KIND, MAX_LIMIT_REACHED, MULTIPLE_SUBSCRIBERS, NOT_INITIALIZED,
    NOT_SUPPORTED, UNKNOWN,
};

/// The result of an entry point the library may lack: `None` when it does not export it.
pub type Optional<T> = Option<Result<T, CuptiError>>;

/// The handle of a callback-API subscriber, as [`subscribe`] returned it. Only [`subscribe`] makes
/// one, and [`unsubscribe`] consumes it, so a `Subscriber` in hand is always a live subscription
/// of the library it came from.
#[derive(Debug, PartialEq, Eq)]
pub struct Subscriber(sys::CUpti_SubscriberHandle);

// SAFETY: the handle is an opaque token CUPTI accepts from any thread; kinetrace never
// dereferences it.
unsafe impl Send for Subscriber {}

/// The version of the CUPTI API the library implements (`CUPTI_API_VERSION` of its headers).
///
/// See [`cuptiGetVersion`](https://docs.nvidia.com/cupti/api/group__CUPTI__VERSION__API.html).
pub fn get_version(cupti: &Cupti) -> Result<u32, CuptiError> {
    let mut version = MaybeUninit::<u32>::uninit();
    // SAFETY: `version` is a valid out-pointer for the duration of the call.
    unsafe { (cupti.cuptiGetVersion)(version.as_mut_ptr()) }.result()?;
    // SAFETY: CUPTI_SUCCESS means the version was written.
    Ok(unsafe { version.assume_init() })
}

/// The vendor's description of `code` (on 13.3+ without a driver, every code answers
/// `CUPTI_ERROR_UNKNOWN`; [`CuptiError`]'s own names do not depend on this).
///
/// See [`cuptiGetResultString`](https://docs.nvidia.com/cupti/api/group__CUPTI__RESULT__API.html).
pub fn get_result_string(cupti: &Cupti, code: u32) -> Optional<&'static CStr> {
    let f = cupti.cuptiGetResultString?;
    let mut s = MaybeUninit::<*const std::ffi::c_char>::uninit();
    // SAFETY: `s` is a valid out-pointer; `code` is a plain value.
    if let Err(e) = unsafe { f(code, s.as_mut_ptr()) }.result() {
        return Some(Err(e));
    }
    // SAFETY: CUPTI_SUCCESS means the pointer was written.
    let ptr = unsafe { s.assume_init() };
    if ptr.is_null() {
        return Some(Err(UNKNOWN));
    }
    // SAFETY: CUPTI returns a NUL-terminated string in its own read-only data; the library is never
    // unloaded (`Cupti` keeps it mapped), so the string lives as long as the process.
    Some(Ok(unsafe { CStr::from_ptr(ptr) }))
}

/// Detaches CUPTI from the process: every callback and activity kind is released.
///
/// See [`cuptiFinalize`](https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html).
pub fn finalize(cupti: &Cupti) -> Result<(), CuptiError> {
    // SAFETY: no arguments.
    unsafe { (cupti.cuptiFinalize)() }.result()
}

/// Registers `callback` as the process's callback-API subscriber, called with `userdata`.
///
/// See [`cuptiSubscribe`](https://docs.nvidia.com/cupti/api/group__CUPTI__CALLBACK__API.html).
///
/// # Safety
/// `callback` must be sound to call from any thread, at any time until the subscription ends
/// ([`unsubscribe`] returned, or [`finalize`]), with `userdata` and the callback data CUPTI passes
/// for the domains enabled on it; it must not unwind. `userdata` must stay valid for that long.
pub unsafe fn subscribe(
    cupti: &Cupti,
    callback: sys::CUpti_CallbackFunc,
    userdata: *mut c_void,
) -> Optional<Subscriber> {
    let f = cupti.cuptiSubscribe?;
    let mut handle = MaybeUninit::<sys::CUpti_SubscriberHandle>::uninit();
    // SAFETY: `handle` is a valid out-pointer; the caller vouches for `callback` and `userdata`.
    if let Err(e) = unsafe { f(handle.as_mut_ptr(), callback, userdata) }.result() {
        return Some(Err(e));
    }
    // SAFETY: CUPTI_SUCCESS means the handle was written.
    let handle = unsafe { handle.assume_init() };
    if handle.is_null() {
        return Some(Err(UNKNOWN));
    }
    Some(Ok(Subscriber(handle)))
}

/// Ends a subscription. On failure the handle is gone as well: there is nothing to retry with.
///
/// See [`cuptiUnsubscribe`](https://docs.nvidia.com/cupti/api/group__CUPTI__CALLBACK__API.html).
pub fn unsubscribe(cupti: &Cupti, subscriber: Subscriber) -> Optional<()> {
    let f = cupti.cuptiUnsubscribe?;
    // SAFETY: a `Subscriber` is a live handle from `subscribe` (it is consumed here, so it is
    // unsubscribed at most once).
    Some(unsafe { f(subscriber.0) }.result())
}

/// Turns every callback of `domain` on or off for `subscriber`.
///
/// See [`cuptiEnableDomain`](https://docs.nvidia.com/cupti/api/group__CUPTI__CALLBACK__API.html).
pub fn enable_domain(
    cupti: &Cupti,
    enable: bool,
    subscriber: &Subscriber,
    domain: sys::CUpti_CallbackDomain,
) -> Optional<()> {
    let f = cupti.cuptiEnableDomain?;
    // SAFETY: a `Subscriber` is a live handle from `subscribe`; the rest are plain values.
    Some(unsafe { f(enable as u32, subscriber.0, domain) }.result())
}

/// Turns one callback (`cbid` of `domain`) on or off for `subscriber`.
///
/// See [`cuptiEnableCallback`](https://docs.nvidia.com/cupti/api/group__CUPTI__CALLBACK__API.html).
pub fn enable_callback(
    cupti: &Cupti,
    enable: bool,
    subscriber: &Subscriber,
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
) -> Optional<()> {
    let f = cupti.cuptiEnableCallback?;
    // SAFETY: a `Subscriber` is a live handle from `subscribe`; the rest are plain values.
    Some(unsafe { f(enable as u32, subscriber.0, domain, cbid) }.result())
}
