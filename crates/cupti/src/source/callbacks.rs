//! The `extern "C"` functions CUPTI calls (the buffer callbacks and the API callback), the two
//! registrations that hand them to CUPTI, and the name cache for the records those buffers carry.
//! This is the only part of the source with `unsafe`: what CUPTI passes in is raw pointers, and
//! registering a callback is a promise about it.
//!
//! Every trampoline catches panics, allocates nothing and takes no lock. Results of the CUPTI
//! calls made in here cannot be logged or stored in the source (no allocation, any thread), so
//! failures are counted in process-wide atomics that [`callback_errors`] reads for the trace
//! metadata.

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use kinetrace_core::intern::NameId;
use kinetrace_core::{launch, recorder, waits};
use kinetrace_cupti_sys::v13 as sys;
use kinetrace_cupti_sys::Cupti;

use super::POOL;
use crate::decode::{CStrNames, KINETRACE_EXTERNAL_KIND};
use crate::result::{self, activity, CuptiError, Optional, Subscriber};

/// Counts subscriptions (starts at 1). An External id pushed in an enter callback of one
/// subscription whose exit callback never came (the window closed, and we unsubscribed, while the
/// call ran) is popped at the thread's next enter callback of a later subscription.
static SUBSCRIPTION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (subscription, External ids this thread pushed in it and has not popped yet, the id on top
    /// of CUPTI's stack if the last change was our push, else 0). No destructor and a const initialiser: free to use from CUPTI callbacks on any
    /// thread.
    static PUSHED: Cell<(u64, u32, u64)> = const { Cell::new((0, 0, 0)) };
}

/// Failures of one CUPTI call made inside a callback: how many, and the last code.
struct CallErrors {
    count: AtomicU64,
    last: AtomicU32,
}

impl CallErrors {
    const fn new() -> CallErrors {
        CallErrors {
            count: AtomicU64::new(0),
            last: AtomicU32::new(0),
        }
    }

    #[inline]
    fn note<T>(&self, r: &Result<T, CuptiError>) {
        if let Err(e) = r {
            self.count.fetch_add(1, Ordering::Relaxed);
            self.last.store(e.0, Ordering::Relaxed);
        }
    }

    fn read(&self) -> Option<(u64, CuptiError)> {
        let n = self.count.load(Ordering::Relaxed);
        (n > 0).then(|| (n, CuptiError(self.last.load(Ordering::Relaxed))))
    }
}

static PUSH_ERRORS: CallErrors = CallErrors::new();
static POP_ERRORS: CallErrors = CallErrors::new();

/// Failures of the CUPTI calls made inside the API callback since the process started:
/// `(call, times, last error)`.
pub(super) fn callback_errors() -> Vec<(&'static str, u64, CuptiError)> {
    let mut v = Vec::new();
    for (call, errors) in [
        ("cuptiActivityPushExternalCorrelationId", &PUSH_ERRORS),
        ("cuptiActivityPopExternalCorrelationId", &POP_ERRORS),
    ] {
        if let Some((n, e)) = errors.read() {
            v.push((call, n, e));
        }
    }
    v
}

/// The name cache for the records CUPTI writes into the buffers [`buffer_completed`] hands over:
/// the only records the source decodes.
pub(super) fn names_of_completed_records() -> CStrNames {
    // SAFETY: the name fields of CUPTI's records are null or NUL-terminated strings CUPTI keeps
    // alive and unchanged for the life of the process (CStrNames' contract).
    unsafe { CStrNames::new() }
}

/// Driver-API callback ids of the calls that launch a kernel (from CUPTI's `cupti_driver_cbid.h`;
/// checked against the generated name table in the tests below).
const DRIVER_LAUNCHES: [u32; 6] = [
    307, // cuLaunchKernel
    442, // cuLaunchKernel_ptsz
    477, // cuLaunchCooperativeKernel
    478, // cuLaunchCooperativeKernel_ptsz
    652, // cuLaunchKernelEx
    653, // cuLaunchKernelEx_ptsz
];

/// Whether this API callback is a driver-API kernel launch.
#[inline]
fn is_kernel_launch(domain: u32, cbid: u32) -> bool {
    domain == sys::CUPTI_CB_DOMAIN_DRIVER_API && DRIVER_LAUNCHES.contains(&cbid)
}

/// The CUDA calls a thread blocks in until the device is done: every synchronize call (device,
/// stream, event, context) and the synchronous copies to the host (`.item()`, `.cpu()`), by
/// domain (runtime, driver) and cbid. The hang check of the flight recorder looks at these
/// ([`kinetrace_core::waits`]): a collective that never completes on the GPU leaves the host in
/// one of them. Built before the first subscription (interning allocates); the callback only reads.
static WAIT_NAMES: OnceLock<[Vec<Option<NameId>>; 2]> = OnceLock::new();

/// Whether a runtime or driver API call (its name as Kineto writes it) blocks until the device is
/// done.
pub(crate) fn is_blocking_wait(name: &str) -> bool {
    name.contains("ynchronize")
        || matches!(
            name,
            "cudaMemcpy"
                | "cudaMemcpy2D"
                | "cudaMemcpyFromSymbol"
                | "cuMemcpyDtoH"
                | "cuMemcpyDtoH_v2"
                | "cuMemcpy"
        )
}

fn init_wait_names() {
    use kinetrace_cupti_sys::cbid::{DRIVER_CBID_NAMES, RUNTIME_CBID_NAMES};
    WAIT_NAMES.get_or_init(|| {
        let table = |names: &[&str]| {
            names
                .iter()
                .map(|raw| {
                    let name = kinetrace_core::intern::api_name(raw);
                    is_blocking_wait(name).then(|| kinetrace_core::intern::intern(name))
                })
                .collect()
        };
        [
            table(&RUNTIME_CBID_NAMES[..]),
            table(&DRIVER_CBID_NAMES[..]),
        ]
    });
}

/// The name of the call if it is a blocking wait (none before the table is built).
#[inline]
fn wait_name(domain: u32, cbid: u32) -> Option<NameId> {
    let tables = WAIT_NAMES.get()?;
    let table = match domain {
        sys::CUPTI_CB_DOMAIN_RUNTIME_API => &tables[0],
        sys::CUPTI_CB_DOMAIN_DRIVER_API => &tables[1],
        _ => return None,
    };
    table.get(cbid as usize).copied().flatten()
}

/// Registers [`buffer_requested`] and [`buffer_completed`] with `cupti`.
pub(super) fn register_buffer_callbacks(cupti: &Cupti) -> Result<(), CuptiError> {
    // SAFETY: both are `extern "C"` functions with CUPTI's signatures that check their pointers,
    // never unwind (catch_unwind) and stay valid for the life of the process.
    unsafe { activity::register_callbacks(cupti, Some(buffer_requested), Some(buffer_completed)) }
}

/// Subscribes [`api_callback`] for the External ids, with `cupti` (which the callback pushes and
/// pops through) as its user data. `None` when the library cannot link (no subscribe, push or pop
/// entry point): there is nothing to hold then.
pub(super) fn subscribe_api_callback(cupti: &'static Cupti) -> Optional<Subscriber> {
    if cupti.cuptiActivityPushExternalCorrelationId.is_none()
        || cupti.cuptiActivityPopExternalCorrelationId.is_none()
    {
        return None;
    }
    init_wait_names();
    // SAFETY: `api_callback` has CUPTI's callback signature, is sound on any thread, checks its
    // pointers and never unwinds; its user data is a `&'static Cupti`, valid forever.
    let r = unsafe {
        result::subscribe(
            cupti,
            Some(api_callback),
            cupti as *const Cupti as *mut c_void,
        )
    };
    if let Some(Ok(_)) = &r {
        // Before any callback of this subscription: the domains are enabled after this. Relaxed:
        // the value is only a tag compared for equality; a thread that still reads the old one
        // keeps its stale ids until its next call, and pops them then.
        SUBSCRIPTION.fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// CUPTI's buffer request callback: a pooled buffer, never a panic.
extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let r = catch_unwind(|| POOL.request());
    let (ptr, len) = r.unwrap_or((std::ptr::null_mut(), 0));
    if buffer.is_null() || size.is_null() {
        return;
    }
    // SAFETY: CUPTI passes valid out-pointers (checked non-null above).
    unsafe {
        *buffer = ptr;
        *size = len;
        if !max_records.is_null() {
            *max_records = 0;
        }
    }
}

/// CUPTI's buffer completion callback: hands the buffer to the decoder; no decoding, allocation or
/// locking here.
extern "C" fn buffer_completed(
    context: sys::CUcontext,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    // Context and stream are deprecated (always null and 0): every buffer is global.
    let _ = (context, stream);
    let _ = catch_unwind(AssertUnwindSafe(|| POOL.complete(buffer, valid)));
}

/// API enter/exit callback: pushes the enclosing kinetrace span's id as a CUSTOM2 external
/// correlation id around each CUDA call, so the records of that call carry it. Allocation-free and
/// lock-free.
///
/// A call that is running when the window closes gets no exit callback from us (we unsubscribed),
/// so its id stays on CUPTI's per-thread stack. Each push is tagged with the subscription it was
/// made in (in the thread's `PUSHED` and in the call's scratch word); the thread's first enter
/// callback in a later subscription pops what is left, so old ids never label a later window's
/// calls.
///
/// Runtime and driver domains share this callback. A call made while an enclosing call of this
/// thread already pushed the same id (`cudaLaunchKernel` reaching `cuLaunchKernel`) pushes nothing:
/// that id is still the top of CUPTI's stack, so the inner call's records carry it anyway, and the
/// pair costs one push and one pop. Driver-API launches made directly (cudarc, as candle does;
/// cuBLAS) are outermost calls and push like runtime ones.
extern "C" fn api_callback(userdata: *mut c_void, domain: u32, cbid: u32, cbdata: *const c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if userdata.is_null() || cbdata.is_null() {
            return;
        }
        // SAFETY: `userdata` is the `&'static Cupti` passed to cuptiSubscribe; `cbdata` is the
        // CUpti_CallbackData CUPTI passes for the runtime/driver API domains (the only ones
        // enabled).
        let (cupti, data) = unsafe {
            (
                &*(userdata as *const Cupti),
                &*(cbdata as *const sys::CUpti_CallbackData),
            )
        };
        let scratch = data.correlationData;
        let wait = wait_name(domain, cbid);
        let pop = || {
            if let Some(r) = activity::pop_external_correlation_id(cupti, KINETRACE_EXTERNAL_KIND) {
                POP_ERRORS.note(&r);
            }
        };
        let Ok((tag, depth, last)) = PUSHED.try_with(Cell::get) else {
            return;
        };
        if data.callbackSite == sys::CUPTI_API_ENTER {
            // Relaxed: a tag compared for equality (see `subscribe_api_callback`).
            let now = SUBSCRIPTION.load(Ordering::Relaxed);
            let mut depth = depth;
            if tag != now {
                // Pushed in an earlier subscription and never popped: not ours to keep.
                for _ in 0..depth {
                    pop();
                }
                depth = 0;
                // Likewise a wait whose exit callback never came.
                waits::reset();
            }
            if let Some(name) = wait {
                waits::begin(name);
            }
            // A kernel launch first asks the registered launch provider (runtimes that launch on
            // a server thread, such as cubecl: the provider pairs this launch with the range that
            // issued it). Asked for every launch, not only when the thread has no range open, so
            // the provider's per-stream queue stays in step with the launches.
            let provided = if is_kernel_launch(domain, cbid) {
                let symbol = if data.symbolName.is_null() {
                    None
                } else {
                    // SAFETY: CUPTI's symbol name for this launch, a NUL-terminated string valid
                    // for the duration of the callback (checked non-null).
                    Some(unsafe { std::ffi::CStr::from_ptr(data.symbolName) })
                };
                launch::provided_external_id(symbol)
            } else {
                None
            };
            let current = provided.or_else(recorder::current_external_id);
            let pushed = match current {
                // Nested in a call of ours that pushed this very id: already on top.
                Some(id) if depth > 0 && id == last => false,
                Some(id) => {
                    match activity::push_external_correlation_id(cupti, KINETRACE_EXTERNAL_KIND, id)
                    {
                        Some(r) => {
                            PUSH_ERRORS.note(&r);
                            r.is_ok()
                        }
                        None => false,
                    }
                }
                None => false,
            };
            let last = match (pushed, current) {
                (true, Some(id)) => id,
                _ => last,
            };
            let _ = PUSHED.try_with(|p| p.set((now, depth + pushed as u32, last)));
            if !scratch.is_null() {
                // SAFETY: CUPTI's per-call scratch word, valid from enter to exit of this call.
                unsafe { *scratch = if pushed { now } else { 0 } };
            }
        } else {
            if wait.is_some() {
                waits::end();
            }
            if scratch.is_null() {
                return;
            }
            // SAFETY: as above.
            let pushed_in = unsafe { *scratch };
            // Only a push of the thread's current subscription is still on the stack.
            if pushed_in != 0 && pushed_in == tag && depth > 0 {
                pop();
                // The new top is not tracked (ids are never 0): an inner call pushes again.
                let _ = PUSHED.try_with(|p| p.set((tag, depth - 1, 0)));
            }
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinetrace_cupti_sys::cbid::DRIVER_CBID_NAMES;

    #[test]
    fn blocking_waits_are_the_synchronize_calls_and_synchronous_copies_to_the_host() {
        for name in [
            "cudaDeviceSynchronize",
            "cudaStreamSynchronize",
            "cudaEventSynchronize",
            "cuCtxSynchronize",
            "cuStreamSynchronize",
            "cudaMemcpy",
            "cuMemcpyDtoH",
        ] {
            assert!(is_blocking_wait(name), "{name}");
        }
        for name in [
            "cudaMemcpyAsync",
            "cuMemcpyDtoHAsync",
            "cudaStreamWaitEvent",
            "cudaLaunchKernel",
            "cudaEventRecord",
        ] {
            assert!(!is_blocking_wait(name), "{name}");
        }
        init_wait_names();
        let named = |domain, cbid: usize, want: &str| {
            let id = wait_name(domain, cbid as u32).map(kinetrace_core::intern::resolve);
            assert_eq!(id.as_deref(), Some(want), "cbid {cbid}");
        };
        use kinetrace_cupti_sys::cbid::{DRIVER_CBID_NAMES, RUNTIME_CBID_NAMES};
        let cbid = |table: &[&str], name: &str| {
            table
                .iter()
                .position(|raw| kinetrace_core::intern::api_name(raw) == name)
                .unwrap()
        };
        let sync = cbid(&RUNTIME_CBID_NAMES[..], "cudaStreamSynchronize");
        named(
            sys::CUPTI_CB_DOMAIN_RUNTIME_API,
            sync,
            "cudaStreamSynchronize",
        );
        let ctx = cbid(&DRIVER_CBID_NAMES[..], "cuCtxSynchronize");
        named(sys::CUPTI_CB_DOMAIN_DRIVER_API, ctx, "cuCtxSynchronize");
        let launch = cbid(&RUNTIME_CBID_NAMES[..], "cudaLaunchKernel");
        assert_eq!(
            wait_name(sys::CUPTI_CB_DOMAIN_RUNTIME_API, launch as u32),
            None
        );
    }

    #[test]
    fn launch_cbids_name_the_launch_calls() {
        let names: Vec<&str> = DRIVER_LAUNCHES
            .iter()
            .map(|&c| DRIVER_CBID_NAMES[c as usize])
            .collect();
        assert_eq!(
            names,
            [
                "cuLaunchKernel",
                "cuLaunchKernel_ptsz",
                "cuLaunchCooperativeKernel",
                "cuLaunchCooperativeKernel_ptsz",
                "cuLaunchKernelEx",
                "cuLaunchKernelEx_ptsz"
            ]
        );
        assert!(is_kernel_launch(sys::CUPTI_CB_DOMAIN_DRIVER_API, 307));
        assert!(!is_kernel_launch(sys::CUPTI_CB_DOMAIN_RUNTIME_API, 307));
    }
}
