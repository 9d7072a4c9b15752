//! The simulated machine: the activity buffers the client lends, the devices and contexts, the
//! subscriber, the per-thread External id stacks, and one CUDA API call with its callbacks and
//! records ([`api_call`]). Everything the workload and the CUPTI entry points share.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use kinetrace_cupti_sys::v13;

use crate::faults::config;
use crate::records::{self, FakeDevice, UNKNOWN_KIND};
use crate::{INVALID_PARAMETER, MULTIPLE_SUBSCRIBERS, SUCCESS};

pub(crate) type Request = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub(crate) type Complete = unsafe extern "C" fn(v13::CUcontext, u32, *mut u8, usize, usize);
pub(crate) type ApiCallback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

#[derive(Default)]
pub(crate) struct State {
    pub(crate) request: Option<Request>,
    pub(crate) complete: Option<Complete>,
    pub(crate) enabled: Vec<u32>,
    /// The subscriber: its callback, user data and handle.
    pub(crate) subscriber: Option<(ApiCallback, usize, usize)>,
    pub(crate) domains: Vec<u32>,
    pub(crate) buffer: Option<(usize, usize, usize)>, // ptr, size, used
    pub(crate) next_correlation: u32,
    pub(crate) dropped_pending: u64,
    pub(crate) gpu_records: u64,
    pub(crate) stream_free: HashMap<u32, u64>,
    pub(crate) names: HashMap<String, &'static CStr>,
    pub(crate) thread_id_type: u32,
    /// The driver initialised (first CUDA call).
    pub(crate) driver_initialized: bool,
    /// Contexts created so far.
    pub(crate) contexts: Vec<u32>,
    /// Kernel names launched so far (the first launch of each loads the function lazily).
    pub(crate) loaded_functions: HashSet<String>,
}

pub(crate) fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| {
        Mutex::new(State {
            next_correlation: 1,
            ..State::default()
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

pub(crate) static RECORDS_WRITTEN: AtomicU64 = AtomicU64::new(0);
pub(crate) static RECORDS_DROPPED: AtomicU64 = AtomicU64::new(0);
pub(crate) static BUFFERS_COMPLETED: AtomicU64 = AtomicU64::new(0);
pub(crate) static FINALIZED: AtomicU32 = AtomicU32::new(0);
pub(crate) static NULL_BEFORE_V27: AtomicU64 = AtomicU64::new(0);
pub(crate) static SUBSCRIBES: AtomicU64 = AtomicU64::new(0);
pub(crate) static UNSUBSCRIBES: AtomicU64 = AtomicU64::new(0);
/// Successful `cuptiActivityPushExternalCorrelationId` calls (a client pushing once per outermost
/// API call, not once per nested one, shows here).
pub(crate) static EXTERNAL_PUSHES: AtomicU64 = AtomicU64::new(0);
/// Records written into client buffers, by kind (every kind the fake writes is below 64).
pub(crate) static WRITTEN_BY_KIND: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// The handle the fake gives a subscriber (kinetrace's, or anyone's but the foreign client's).
pub(crate) const CLIENT_HANDLE: usize = 0x5;
/// The handle of the foreign client (`fake_cupti_foreign_subscribe`).
pub(crate) const FOREIGN_HANDLE: usize = 0x6;

thread_local! {
    pub(crate) static EXTERNAL: RefCell<Vec<(u32, u64)>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(crate) fn tid() -> u32 {
    thread_local! {
        static TID: u32 = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(0);
    }
    TID.with(|t| *t)
}

/// Completed buffers waiting for their completion callback (collected under the lock, called without).
pub(crate) type Done = Vec<(usize, usize, usize)>;

/// Appends one record, rolling over to a new buffer when the current one is full. Returns buffers to
/// complete (outside the lock).
pub(crate) fn write_record(s: &mut State, rec: &[u8], gpu: bool, done: &mut Done) -> bool {
    let kind = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
    if !s.enabled.contains(&kind) && kind != UNKNOWN_KIND {
        return false;
    }
    if gpu {
        s.gpu_records += 1;
        let every = config().drop_every;
        if every > 0 && s.gpu_records % every == 0 {
            s.dropped_pending += 1;
            RECORDS_DROPPED.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    }
    for _ in 0..2 {
        if let Some((ptr, size, used)) = s.buffer {
            if used + rec.len() <= size {
                // SAFETY: the buffer came from the client's request callback with `size` bytes, and
                // [used, used + len) is inside it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        rec.as_ptr(),
                        (ptr as *mut u8).add(used),
                        rec.len(),
                    )
                };
                s.buffer = Some((ptr, size, used + rec.len()));
                RECORDS_WRITTEN.fetch_add(1, Ordering::Relaxed);
                if let Some(n) = WRITTEN_BY_KIND.get(kind as usize) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                return true;
            }
            done.push((ptr, size, used));
            s.buffer = None;
        }
        let Some(request) = s.request else { break };
        let (mut ptr, mut size, mut max) = (std::ptr::null_mut::<u8>(), 0usize, 0usize);
        // SAFETY: the client's request callback, with valid out-pointers. (Called under our lock:
        // kinetrace's request callback never calls back into CUPTI.)
        unsafe { request(&mut ptr, &mut size, &mut max) };
        if ptr.is_null() && config().version < 27 {
            // Real CUPTI before 12.9 crashes here; the fake counts it so tests can assert it never happens.
            NULL_BEFORE_V27.fetch_add(1, Ordering::Relaxed);
        }
        if ptr.is_null() || size < rec.len() || (ptr as usize) % 8 != 0 {
            break;
        }
        s.buffer = Some((ptr as usize, size, 0));
    }
    // No buffer: CUPTI drops the record and counts it.
    s.dropped_pending += 1;
    RECORDS_DROPPED.fetch_add(1, Ordering::Relaxed);
    false
}

/// Completed buffers held back under `FAKE_CUPTI_HOLD=1`.
pub(crate) fn held() -> MutexGuard<'static, Done> {
    static H: Mutex<Done> = Mutex::new(Vec::new());
    H.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn complete_all(done: Done) {
    if done.is_empty() {
        return;
    }
    if config().hold {
        held().extend(done);
        return;
    }
    deliver(done);
}

pub(crate) fn deliver(done: Done) {
    if done.is_empty() {
        return;
    }
    let Some(complete) = state().complete else {
        return;
    };
    let run = move || {
        for (ptr, size, used) in done {
            BUFFERS_COMPLETED.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the client's completion callback with a buffer it gave us.
            unsafe { complete(std::ptr::null_mut(), 0, ptr as *mut u8, size, used) };
        }
    };
    match config().late {
        Some(delay) => {
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                run();
            });
        }
        None => run(),
    }
}

pub(crate) fn intern_name(s: &mut State, name: &str) -> *const c_char {
    if let Some(c) = s.names.get(name) {
        return c.as_ptr();
    }
    let c: &'static CStr = Box::leak(CString::new(name).unwrap_or_default().into_boxed_c_str());
    s.names.insert(name.to_string(), c);
    c.as_ptr()
}

/// Runs one API call: enter callback, external-correlation records, `body` (GPU records), the API
/// record, exit callback. Returns the correlation id.
pub(crate) fn api_call(
    domain: u32,
    cbid: u32,
    name: &'static CStr,
    body: impl FnOnce(&mut State, u32, u64, &mut Done),
) -> u32 {
    api_call_around(domain, cbid, name, || {}, body)
}

/// [`api_call`] with `during` run after the enter callback, before the call's records are written
/// (the client doing something, e.g. ending its window, while this thread is inside a CUDA call).
pub(crate) fn api_call_around(
    domain: u32,
    cbid: u32,
    name: &'static CStr,
    during: impl FnOnce(),
    body: impl FnOnce(&mut State, u32, u64, &mut Done),
) -> u32 {
    api_call_full(domain, cbid, name, std::ptr::null(), during, body)
}

/// [`api_call_around`] whose callbacks carry `symbol` (a kernel launch's `symbolName`: null or a
/// string interned for the life of the process).
pub(crate) fn api_call_full(
    domain: u32,
    cbid: u32,
    name: &'static CStr,
    symbol: *const c_char,
    during: impl FnOnce(),
    body: impl FnOnce(&mut State, u32, u64, &mut Done),
) -> u32 {
    let corr = {
        let mut s = state();
        let c = s.next_correlation;
        s.next_correlation += 1;
        c
    };
    let start = now_ns();
    let mut scratch: u64 = 0;
    // Each site goes to whoever is subscribed (with the domain enabled) at that moment.
    let callback = |site: u32, scratch: &mut u64| {
        let subscriber = {
            let s = state();
            s.subscriber
                .filter(|_| s.domains.contains(&domain))
                .map(|(f, userdata, _)| (f, userdata))
        };
        if let Some((f, userdata)) = subscriber {
            let data = v13::CUpti_CallbackData {
                callbackSite: site,
                functionName: name.as_ptr(),
                symbolName: symbol,
                correlationId: corr,
                correlationData: scratch as *mut u64,
                ..Default::default()
            };
            // SAFETY: the subscriber's callback with the userdata it registered and a valid record.
            unsafe {
                f(
                    userdata as *mut c_void,
                    domain,
                    cbid,
                    &data as *const _ as *const c_void,
                )
            };
        }
    };
    callback(v13::CUPTI_API_ENTER, &mut scratch);
    during();
    let mut done = Vec::new();
    {
        let mut s = state();
        init_driver(&mut s, &mut done);
        ensure_context(&mut s, 1, &mut done);
        // One external-correlation record per kind with a pushed id on this thread (top of stack).
        let tops: Vec<(u32, u64)> = EXTERNAL.with(|e| {
            let e = e.borrow();
            let mut tops: Vec<(u32, u64)> = Vec::new();
            for (k, id) in e.iter().rev() {
                if !tops.iter().any(|(tk, _)| tk == k) {
                    tops.push((*k, *id));
                }
            }
            tops
        });
        for (kind, id) in tops {
            let r = records::external_correlation(kind, id, corr);
            write_record(&mut s, &r, false, &mut done);
        }
        body(&mut s, corr, start, &mut done);
        let thread = if s.thread_id_type == v13::CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM {
            tid()
        } else {
            1
        };
        let r = records::api(
            domain == v13::CUPTI_CB_DOMAIN_DRIVER_API,
            cbid,
            (start, now_ns().max(start + 1)),
            thread,
            corr,
        );
        write_record(&mut s, &r, false, &mut done);
    }
    complete_all(done);
    callback(v13::CUPTI_API_EXIT, &mut scratch);
    corr
}

/// GPU time for `dur` on `stream`: after the launch and after the stream's previous work.
pub(crate) fn gpu_slot(s: &mut State, stream: u32, launch: u64, dur: u64) -> (u64, u64) {
    let free = s.stream_free.get(&stream).copied().unwrap_or(0);
    let start = (launch + 1_000).max(free);
    let end = start + dur.max(1);
    s.stream_free.insert(stream, end);
    (start, end)
}

/// The simulated devices.
pub(crate) const DEVICES: [FakeDevice; 2] = [
    (0, c"Fake H100 80GB HBM3", (9, 0), 132, 80 << 30),
    (1, c"Fake A100-SXM4-40GB", (8, 0), 108, 40 << 30),
];

/// Contexts: (context id, device id).
pub(crate) const CONTEXTS: [(u32, u32); 2] = [(1, 0), (2, 1)];

pub(crate) fn write_devices(s: &mut State, done: &mut Done) {
    for d in &DEVICES {
        write_record(s, &records::device(d), false, done);
    }
}

pub(crate) fn write_context(s: &mut State, context: u32, done: &mut Done) {
    let device = CONTEXTS
        .iter()
        .find(|(c, _)| *c == context)
        .map_or(0, |(_, d)| *d);
    write_record(s, &records::context(context, device), false, done);
}

/// The driver initialises at the first CUDA call: DEVICE records if DEVICE is enabled by then.
fn init_driver(s: &mut State, done: &mut Done) {
    if !s.driver_initialized {
        s.driver_initialized = true;
        write_devices(s, done);
    }
}

/// A context is created at its first use: a CONTEXT record if CONTEXT is enabled by then.
pub(crate) fn ensure_context(s: &mut State, context: u32, done: &mut Done) {
    if !s.contexts.contains(&context) {
        s.contexts.push(context);
        write_context(s, context, done);
    }
}

/// The first launch of a kernel loads its function lazily: an OVERHEAD record.
pub(crate) fn load_function(s: &mut State, name: &str, launch: u64, done: &mut Done) {
    // A set: jobs with many distinct kernels (one per step in the preload tests) must stay linear.
    if !s.loaded_functions.insert(name.to_string()) {
        return;
    }
    write_record(
        s,
        &records::lazy_loading_overhead(launch, launch + 200),
        false,
        done,
    );
}

/// One subscriber per process, as CUPTI before 13.3.
pub(crate) fn subscribe(cb: ApiCallback, userdata: usize, handle: usize) -> u32 {
    let mut s = state();
    if s.subscriber.is_some() {
        return MULTIPLE_SUBSCRIBERS;
    }
    s.subscriber = Some((cb, userdata, handle));
    SUBSCRIBES.fetch_add(1, Ordering::Relaxed);
    SUCCESS
}

pub(crate) fn unsubscribe(handle: usize) -> u32 {
    let mut s = state();
    if s.subscriber.is_none_or(|(_, _, h)| h != handle) {
        return INVALID_PARAMETER;
    }
    s.subscriber = None;
    s.domains.clear();
    UNSUBSCRIBES.fetch_add(1, Ordering::Relaxed);
    SUCCESS
}
