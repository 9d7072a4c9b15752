/*!
A fake `libcupti` for tests (never shipped). It implements the CUPTI entry points kinetrace calls,
reports the version chosen by `FAKE_CUPTI_VERSION` (18 = 11.8, 20 = 12.2, 21 = 12.3, 22 = 12.4,
23 = 12.5, 24 = 12.6, 26 = 12.8, 27/28 = 12.9, `xxyyzz` = 13.yy from 130000; default 28), and
writes records with the **real struct layouts of that release** (the bindgen structs of
`kinetrace-cupti-sys`, chosen per kind by the research table of which struct each release writes)
into buffers obtained through the registered request callback, completing them through the
completion callback when full (rollover) or flushed.

The simulated machine has two devices (0 and 1) with one context each (1 on device 0, 2 on device
1). The driver initialises at the first CUDA call: DEVICE records are written then if DEVICE is
enabled, and CONTEXT records when a context is first used if CONTEXT is enabled; later,
`cuptiActivityEnableAndDump` writes records for the devices and contexts that exist (as CUPTI does).
The first launch of each kernel name writes a lazy-function-loading OVERHEAD record.
`cuptiActivityGetStructSize` answers from the same table for 13.2+ (`CUPTI_ERROR_NOT_SUPPORTED`
before: real libraries before 13.2 do not export it).

Workloads are driven by the test through `fake_cupti_*` entry points that behave like CUDA calls made
on the calling thread: API enter/exit callbacks to the subscriber, external-correlation records for
the calling thread's pushed ids, the API record, and the GPU records.

Fault injection (environment, read once):
- `FAKE_CUPTI_FAIL=cuptiActivityEnable,cuptiActivityFlushAll,...` — those entry points fail with
  `FAKE_CUPTI_FAIL_CODE` (default 15, NOT_INITIALIZED); `*` fails every entry point but
  `cuptiGetVersion`.
- `FAKE_CUPTI_DROP_EVERY=N` — every Nth GPU record is dropped and reported by
  `cuptiActivityGetNumDroppedRecords`.
- `FAKE_CUPTI_SUBSCRIBE_REFUSED=1` — `cuptiSubscribe` always answers 39 (another tool, such as
  Nsight Systems, holds CUPTI for the whole run).
- `FAKE_CUPTI_LATE_MS=N` — completed buffers are handed back from another thread N ms later.
- `FAKE_CUPTI_SLOW_READER_NS=N` — `cuptiActivityGetNumDroppedRecords` spins N ns after reading the
  count: a collector that falls behind right after it (preempted on a loaded machine), so CUPTI runs
  out of buffers and drops records while the collector holds them all.
- `FAKE_CUPTI_HOLD=1` — completed buffers are held back until the test calls
  `fake_cupti_release_held()` (a buffer CUPTI returns as late as the test decides).
- `FAKE_CUPTI_WRONG_STRUCT_SIZE=KIND` — `cuptiActivityGetStructSize` reports 8 bytes more than the
  real size for that kind (records are still written in the real layout).

CUPTI before 13.3 allows one subscriber per process, and so does the fake: a second `cuptiSubscribe`
answers 39 (`CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`) until the first unsubscribes, and
`cuptiUnsubscribe` only accepts the handle of the current subscriber. `fake_cupti_foreign_subscribe`
/ `fake_cupti_foreign_unsubscribe` subscribe and unsubscribe another client the way PyTorch's Kineto
does (`TEARDOWN_CUPTI=1`, or older Kineto). The exit callback of a call goes to whoever is subscribed
when the call returns, so a client that unsubscribed during a call gets no exit callback for it.

`cuptiActivityGetNumDroppedRecords` answers the global queue's count for a null context (all buffers
have been global since CUDA 6.0) and 0 for any other context.

It also exports `cuDriverGetVersion`, so tests can point kinetrace's driver check at this file.
*/
#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kinetrace_cupti_sys::v12;
use kinetrace_cupti_sys::v13;

const SUCCESS: u32 = 0;
const INVALID_PARAMETER: u32 = 1;
const MAX_LIMIT_REACHED: u32 = 12;
const MULTIPLE_SUBSCRIBERS: u32 = 39;

/// A kind no kinetrace build reads (GREEN_CONTEXT, 13.2+), written to check that the reader steps
/// over unknown records with `cuptiActivityGetNextRecord`.
const UNKNOWN_KIND: u32 = 59;
const UNKNOWN_KIND_SIZE: usize = 40;

/// The release the fake impersonates: (CUDA major, minor).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Rel(u32, u32);

fn release_of(version: u32) -> Rel {
    match version {
        18 => Rel(11, 8),
        20 => Rel(12, 2),
        21 => Rel(12, 3),
        22 => Rel(12, 4),
        23 => Rel(12, 5),
        24 => Rel(12, 6),
        26 => Rel(12, 8),
        v if v >= 130000 => Rel(v / 10_000, (v / 100) % 100),
        _ => Rel(12, 9),
    }
}

/// Whether the impersonated release is `major.minor` or newer.
fn at_least(major: u32, minor: u32) -> bool {
    config().rel >= Rel(major, minor)
}

struct Config {
    version: u32,
    rel: Rel,
    fail: Vec<String>,
    fail_code: u32,
    drop_every: u64,
    subscribe_refused: bool,
    late: Option<Duration>,
    hold: bool,
    slow_reader: Option<Duration>,
    wrong_struct_size: Option<u32>,
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let env = |k: &str| std::env::var(k).ok();
        let version = env("FAKE_CUPTI_VERSION")
            .and_then(|v| v.parse().ok())
            .unwrap_or(28);
        Config {
            version,
            rel: release_of(version),
            fail: env("FAKE_CUPTI_FAIL")
                .map(|s| s.split(',').map(|x| x.trim().to_string()).collect())
                .unwrap_or_default(),
            fail_code: env("FAKE_CUPTI_FAIL_CODE")
                .and_then(|v| v.parse().ok())
                .unwrap_or(15),
            drop_every: env("FAKE_CUPTI_DROP_EVERY")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            subscribe_refused: env("FAKE_CUPTI_SUBSCRIBE_REFUSED").is_some_and(|v| v == "1"),
            hold: env("FAKE_CUPTI_HOLD").is_some_and(|v| v == "1"),
            slow_reader: env("FAKE_CUPTI_SLOW_READER_NS")
                .and_then(|v| v.parse().ok())
                .map(Duration::from_nanos),
            late: env("FAKE_CUPTI_LATE_MS")
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
            wrong_struct_size: env("FAKE_CUPTI_WRONG_STRUCT_SIZE").and_then(|v| v.parse().ok()),
        }
    })
}

/// Whether `name` is set to fail; returns the code to answer.
fn fails(name: &str) -> Option<u32> {
    let c = config();
    (c.fail
        .iter()
        .any(|f| f == name || (f == "*" && name != "cuptiGetVersion")))
    .then_some(c.fail_code)
}

type Request = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type Complete = unsafe extern "C" fn(v13::CUcontext, u32, *mut u8, usize, usize);
type ApiCallback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

#[derive(Default)]
struct State {
    request: Option<Request>,
    complete: Option<Complete>,
    enabled: Vec<u32>,
    /// The subscriber: its callback, user data and handle.
    subscriber: Option<(ApiCallback, usize, usize)>,
    domains: Vec<u32>,
    buffer: Option<(usize, usize, usize)>, // ptr, size, used
    next_correlation: u32,
    dropped_pending: u64,
    gpu_records: u64,
    stream_free: HashMap<u32, u64>,
    names: HashMap<String, &'static CStr>,
    thread_id_type: u32,
    /// The driver initialised (first CUDA call).
    driver_initialized: bool,
    /// Contexts created so far.
    contexts: Vec<u32>,
    /// Kernel names launched so far (the first launch of each loads the function lazily).
    loaded_functions: std::collections::HashSet<String>,
}

fn state() -> MutexGuard<'static, State> {
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

static RECORDS_WRITTEN: AtomicU64 = AtomicU64::new(0);
static RECORDS_DROPPED: AtomicU64 = AtomicU64::new(0);
static BUFFERS_COMPLETED: AtomicU64 = AtomicU64::new(0);
static FINALIZED: AtomicU32 = AtomicU32::new(0);
static NULL_BEFORE_V27: AtomicU64 = AtomicU64::new(0);
static SUBSCRIBES: AtomicU64 = AtomicU64::new(0);
static UNSUBSCRIBES: AtomicU64 = AtomicU64::new(0);
/// Records written into client buffers, by kind (every kind the fake writes is below 64).
static WRITTEN_BY_KIND: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// The handle the fake gives a subscriber (kinetrace's, or anyone's but the foreign client's).
const CLIENT_HANDLE: usize = 0x5;
/// The handle of the foreign client (`fake_cupti_foreign_subscribe`).
const FOREIGN_HANDLE: usize = 0x6;

thread_local! {
    static EXTERNAL: RefCell<Vec<(u32, u64)>> = const { RefCell::new(Vec::new()) };
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn tid() -> u32 {
    thread_local! {
        static TID: u32 = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(0);
    }
    TID.with(|t| *t)
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: any initialised value can be viewed as bytes for its size; the record structs are
    // plain data (integers, pointers, unions of integers) created from Default (all zero) and filled.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }
}

/// Completed buffers waiting for their completion callback (collected under the lock, called without).
type Done = Vec<(usize, usize, usize)>;

/// Appends one record, rolling over to a new buffer when the current one is full. Returns buffers to
/// complete (outside the lock).
fn write_record(s: &mut State, rec: &[u8], gpu: bool, done: &mut Done) -> bool {
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
fn held() -> MutexGuard<'static, Done> {
    static H: Mutex<Done> = Mutex::new(Vec::new());
    H.lock().unwrap_or_else(|e| e.into_inner())
}

/// Hands back every buffer held under `FAKE_CUPTI_HOLD=1` (on the calling thread). Returns how many.
#[no_mangle]
pub extern "C" fn fake_cupti_release_held() -> u64 {
    let done = std::mem::take(&mut *held());
    let n = done.len() as u64;
    deliver(done);
    n
}

fn complete_all(done: Done) {
    if done.is_empty() {
        return;
    }
    if config().hold {
        held().extend(done);
        return;
    }
    deliver(done);
}

fn deliver(done: Done) {
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

fn intern_name(s: &mut State, name: &str) -> *const c_char {
    if let Some(c) = s.names.get(name) {
        return c.as_ptr();
    }
    let c: &'static CStr = Box::leak(CString::new(name).unwrap_or_default().into_boxed_c_str());
    s.names.insert(name.to_string(), c);
    c.as_ptr()
}

/// Runs one API call: enter callback, external-correlation records, `body` (GPU records), the API
/// record, exit callback. Returns the correlation id.
fn api_call(
    domain: u32,
    cbid: u32,
    name: &'static CStr,
    body: impl FnOnce(&mut State, u32, u64, &mut Done),
) -> u32 {
    api_call_around(domain, cbid, name, || {}, body)
}

/// [`api_call`] with `during` run after the enter callback, before the call's records are written
/// (the client doing something, e.g. ending its window, while this thread is inside a CUDA call).
fn api_call_around(
    domain: u32,
    cbid: u32,
    name: &'static CStr,
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
            let r = v12::CUpti_ActivityExternalCorrelation {
                kind: v13::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                externalKind: kind,
                externalId: id,
                correlationId: corr,
                ..Default::default()
            };
            write_record(&mut s, bytes_of(&r), false, &mut done);
        }
        body(&mut s, corr, start, &mut done);
        let r = v12::CUpti_ActivityAPI {
            kind: if domain == v13::CUPTI_CB_DOMAIN_DRIVER_API {
                v13::CUPTI_ACTIVITY_KIND_DRIVER
            } else {
                v13::CUPTI_ACTIVITY_KIND_RUNTIME
            },
            cbid,
            start,
            end: now_ns().max(start + 1),
            processId: std::process::id(),
            threadId: if s.thread_id_type == v13::CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM {
                tid()
            } else {
                1
            },
            correlationId: corr,
            returnValue: 0,
        };
        write_record(&mut s, bytes_of(&r), false, &mut done);
    }
    complete_all(done);
    callback(v13::CUPTI_API_EXIT, &mut scratch);
    corr
}

/// GPU time for `dur` on `stream`: after the launch and after the stream's previous work.
fn gpu_slot(s: &mut State, stream: u32, launch: u64, dur: u64) -> (u64, u64) {
    let free = s.stream_free.get(&stream).copied().unwrap_or(0);
    let start = (launch + 1_000).max(free);
    let end = start + dur.max(1);
    s.stream_free.insert(stream, end);
    (start, end)
}

/// Expands `$m!(Struct)` with the record struct the impersonated release writes for a kind
/// (the research table: CUPTI always writes its newest struct for each kind).
macro_rules! by_release {
    (kernel, $m:ident) => {
        if at_least(13, 4) {
            $m!(v13::CUpti_ActivityKernel13)
        } else if at_least(13, 3) {
            $m!(v13::CUpti_ActivityKernel12)
        } else if at_least(13, 1) {
            $m!(v13::CUpti_ActivityKernel11)
        } else if at_least(13, 0) {
            $m!(v13::CUpti_ActivityKernel10)
        } else if at_least(12, 0) {
            $m!(v12::CUpti_ActivityKernel9)
        } else {
            $m!(v12::CUpti_ActivityKernel8)
        }
    };
    (memcpy, $m:ident) => {
        if at_least(13, 4) {
            $m!(v13::CUpti_ActivityMemcpy7)
        } else if at_least(12, 8) {
            $m!(v12::CUpti_ActivityMemcpy6)
        } else {
            $m!(v12::CUpti_ActivityMemcpy5)
        }
    };
    (memset, $m:ident) => {
        if at_least(13, 4) {
            $m!(v13::CUpti_ActivityMemset5)
        } else {
            $m!(v12::CUpti_ActivityMemset4)
        }
    };
    (sync, $m:ident) => {
        if at_least(12, 8) {
            $m!(v12::CUpti_ActivitySynchronization2)
        } else {
            $m!(v12::CUpti_ActivitySynchronization)
        }
    };
    (memory, $m:ident) => {
        if at_least(12, 6) {
            $m!(v12::CUpti_ActivityMemory4)
        } else {
            $m!(v12::CUpti_ActivityMemory3)
        }
    };
    (memory_pool, $m:ident) => {
        if at_least(13, 0) {
            $m!(v13::CUpti_ActivityMemoryPool3)
        } else {
            $m!(v12::CUpti_ActivityMemoryPool2)
        }
    };
    (overhead, $m:ident) => {
        if at_least(12, 4) {
            $m!(v12::CUpti_ActivityOverhead3)
        } else if at_least(12, 3) {
            $m!(v12::CUpti_ActivityOverhead2)
        } else {
            $m!(v12::CUpti_ActivityOverhead)
        }
    };
    (device, $m:ident) => {
        if at_least(13, 2) {
            $m!(v13::CUpti_ActivityDevice6)
        } else if at_least(12, 2) {
            $m!(v12::CUpti_ActivityDevice5)
        } else {
            $m!(v12::CUpti_ActivityDevice4)
        }
    };
    (context, $m:ident) => {
        if at_least(13, 1) {
            $m!(v13::CUpti_ActivityContext4)
        } else if at_least(12, 5) {
            $m!(v12::CUpti_ActivityContext3)
        } else if at_least(12, 4) {
            $m!(v12::CUpti_ActivityContext2)
        } else {
            $m!(v12::CUpti_ActivityContext)
        }
    };
    (cuda_event, $m:ident) => {
        if at_least(13, 5) {
            $m!(v13::CUpti_ActivityCudaEvent3)
        } else if at_least(12, 8) {
            $m!(v12::CUpti_ActivityCudaEvent2)
        } else {
            $m!(v12::CUpti_ActivityCudaEvent)
        }
    };
}

fn kernel_bytes(
    corr: u32,
    name: *const c_char,
    stream: u32,
    start: u64,
    end: u64,
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
    by_release!(kernel, kernel)
}

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
            let (start, end) = gpu_slot(s, stream, launch, dur_ns);
            write_record(
                s,
                &kernel_bytes(corr, n, stream, start, end, 0, 0),
                true,
                done,
            );
            // CUPTI 13.x writes kinds older builds do not know; the reader must step over them.
            if at_least(13, 0) {
                let mut unknown = [0u8; UNKNOWN_KIND_SIZE];
                unknown[..4].copy_from_slice(&UNKNOWN_KIND.to_le_bytes());
                write_record(s, &unknown, false, done);
            }
        },
    )
}

/// `cuLaunchKernel` (driver API) of `name` on `stream`.
#[no_mangle]
pub extern "C" fn fake_cupti_driver_launch(name: *const c_char, stream: u32, dur_ns: u64) -> u32 {
    let name = with_cstr(name, "kernel");
    api_call(
        v13::CUPTI_CB_DOMAIN_DRIVER_API,
        307,
        c"cuLaunchKernel",
        |s, corr, launch, done| {
            load_function(s, &name, launch, done);
            let n = intern_name(s, &name);
            let (start, end) = gpu_slot(s, stream, launch, dur_ns);
            write_record(
                s,
                &kernel_bytes(corr, n, stream, start, end, 0, 0),
                true,
                done,
            );
        },
    )
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
                let (start, end) = gpu_slot(s, stream, launch, 2_000);
                write_record(
                    s,
                    &kernel_bytes(corr, n, stream, start, end, graph_id, node),
                    true,
                    done,
                );
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
            let (start, end) = gpu_slot(s, stream, launch, 1_000 + bytes / 10);
            let rec = if copy_kind == 10 {
                ensure_context(s, 2, done);
                let mut m = v12::CUpti_ActivityMemcpyPtoP4 {
                    kind: v13::CUPTI_ACTIVITY_KIND_MEMCPY2,
                    copyKind: 10,
                    srcKind: src_kind,
                    dstKind: dst_kind,
                    bytes,
                    start,
                    end,
                    deviceId: 0,
                    contextId: 1,
                    streamId: stream,
                    srcDeviceId: 0,
                    srcContextId: 1,
                    dstDeviceId: 1,
                    dstContextId: 2,
                    correlationId: corr,
                    ..Default::default()
                };
                m.flags = 1;
                bytes_of(&m).to_vec()
            } else {
                macro_rules! copy {
                    ($t:ty) => {{
                        let mut m: $t = Default::default();
                        m.kind = v13::CUPTI_ACTIVITY_KIND_MEMCPY;
                        m.copyKind = copy_kind;
                        m.srcKind = src_kind;
                        m.dstKind = dst_kind;
                        m.flags = 1;
                        m.bytes = bytes;
                        m.start = start;
                        m.end = end;
                        m.deviceId = 0;
                        m.contextId = 1;
                        m.streamId = stream;
                        m.correlationId = corr;
                        bytes_of(&m).to_vec()
                    }};
                }
                by_release!(memcpy, copy)
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
            let (start, end) = gpu_slot(s, stream, launch, 500);
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
            let rec = by_release!(memset, set);
            write_record(s, &rec, true, done);
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
    let (cbid, name) = match sync_type {
        1 => (137, c"cudaEventSynchronize"),
        2 => (147, c"cudaStreamWaitEvent"),
        3 => (131, c"cudaStreamSynchronize"),
        _ => (165, c"cudaDeviceSynchronize"),
    };
    api_call(
        v13::CUPTI_CB_DOMAIN_RUNTIME_API,
        cbid,
        name,
        |s, corr, launch, done| {
            ensure_context(s, context, done);
            let end = s
                .stream_free
                .get(&stream)
                .copied()
                .unwrap_or(0)
                .max(launch + 100);
            macro_rules! sync {
                ($t:ty) => {{
                    let mut m: $t = Default::default();
                    m.kind = v13::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
                    m.type_ = sync_type;
                    m.start = launch;
                    m.end = end;
                    m.correlationId = corr;
                    m.contextId = context;
                    m.streamId = if sync_type == 4 { u32::MAX } else { stream };
                    m.cudaEventId = if sync_type <= 2 { event } else { u32::MAX };
                    bytes_of(&m).to_vec()
                }};
            }
            let rec = by_release!(sync, sync);
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
            let rec = by_release!(cuda_event, ev);
            write_record(s, &rec, false, done);
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
                    p.timestamp = launch + 10;
                    bytes_of(&p).to_vec()
                }};
            }
            let rec = by_release!(memory_pool, pool);
            write_record(s, &rec, true, done);
        },
    )
}

/// A simulated device: (id, name, compute capability, SMs, global memory).
type FakeDevice = (u32, &'static CStr, (u32, u32), u32, u64);

/// The simulated devices.
const DEVICES: [FakeDevice; 2] = [
    (0, c"Fake H100 80GB HBM3", (9, 0), 132, 80 << 30),
    (1, c"Fake A100-SXM4-40GB", (8, 0), 108, 40 << 30),
];

/// Contexts: (context id, device id).
const CONTEXTS: [(u32, u32); 2] = [(1, 0), (2, 1)];

fn write_devices(s: &mut State, done: &mut Done) {
    for (id, name, (major, minor), sms, mem) in DEVICES {
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
        let rec = by_release!(device, dev);
        write_record(s, &rec, false, done);
    }
}

fn write_context(s: &mut State, context: u32, done: &mut Done) {
    let device = CONTEXTS
        .iter()
        .find(|(c, _)| *c == context)
        .map_or(0, |(_, d)| *d);
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
    let rec = by_release!(context, ctx);
    write_record(s, &rec, false, done);
}

/// The driver initialises at the first CUDA call: DEVICE records if DEVICE is enabled by then.
fn init_driver(s: &mut State, done: &mut Done) {
    if !s.driver_initialized {
        s.driver_initialized = true;
        write_devices(s, done);
    }
}

/// A context is created at its first use: a CONTEXT record if CONTEXT is enabled by then.
fn ensure_context(s: &mut State, context: u32, done: &mut Done) {
    if !s.contexts.contains(&context) {
        s.contexts.push(context);
        write_context(s, context, done);
    }
}

/// The first launch of a kernel loads its function lazily: an OVERHEAD record.
fn load_function(s: &mut State, name: &str, launch: u64, done: &mut Done) {
    // A set: jobs with many distinct kernels (one per step in the preload tests) must stay linear.
    if !s.loaded_functions.insert(name.to_string()) {
        return;
    }
    macro_rules! overhead {
        ($t:ty) => {{
            let mut o: $t = Default::default();
            o.kind = v13::CUPTI_ACTIVITY_KIND_OVERHEAD;
            o.overheadKind = v13::CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING;
            o.objectKind = v13::CUPTI_ACTIVITY_OBJECT_THREAD;
            o.start = launch;
            o.end = launch + 200;
            bytes_of(&o).to_vec()
        }};
    }
    let rec = by_release!(overhead, overhead);
    write_record(s, &rec, false, done);
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
            macro_rules! mem {
                ($t:ty) => {{
                    let mut m: $t = Default::default();
                    m.kind = v13::CUPTI_ACTIVITY_KIND_MEMORY2;
                    m.memoryOperationType = op;
                    m.memoryKind = 3;
                    m.correlationId = corr;
                    m.address = address;
                    m.bytes = bytes;
                    m.timestamp = launch + 10;
                    m.processId = std::process::id();
                    m.deviceId = 0;
                    m.contextId = 1;
                    bytes_of(&m).to_vec()
                }};
            }
            let rec = by_release!(memory, mem);
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

// ---- the CUPTI entry points -------------------------------------------------------------------

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

/// The size of the records of `kind` the impersonated release writes.
fn record_size(kind: u32) -> Option<usize> {
    macro_rules! size {
        ($t:ty) => {
            size_of::<$t>()
        };
    }
    Some(match kind {
        v13::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => by_release!(kernel, size),
        v13::CUPTI_ACTIVITY_KIND_MEMCPY => by_release!(memcpy, size),
        v13::CUPTI_ACTIVITY_KIND_MEMCPY2 => size_of::<v12::CUpti_ActivityMemcpyPtoP4>(),
        v13::CUPTI_ACTIVITY_KIND_MEMSET => by_release!(memset, size),
        v13::CUPTI_ACTIVITY_KIND_DRIVER | v13::CUPTI_ACTIVITY_KIND_RUNTIME => {
            size_of::<v12::CUpti_ActivityAPI>()
        }
        v13::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => by_release!(sync, size),
        v13::CUPTI_ACTIVITY_KIND_MEMORY2 => by_release!(memory, size),
        v13::CUPTI_ACTIVITY_KIND_MEMORY_POOL => by_release!(memory_pool, size),
        v13::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => {
            size_of::<v12::CUpti_ActivityExternalCorrelation>()
        }
        v13::CUPTI_ACTIVITY_KIND_OVERHEAD => by_release!(overhead, size),
        v13::CUPTI_ACTIVITY_KIND_MARKER => size_of::<v12::CUpti_ActivityMarker2>(),
        v13::CUPTI_ACTIVITY_KIND_DEVICE => by_release!(device, size),
        v13::CUPTI_ACTIVITY_KIND_CONTEXT => by_release!(context, size),
        v13::CUPTI_ACTIVITY_KIND_CUDA_EVENT => by_release!(cuda_event, size),
        UNKNOWN_KIND => UNKNOWN_KIND_SIZE,
        _ => return None,
    })
}

/// `FAKE_CUPTI_SLOW_READER_NS`: keeps the calling (collector) thread busy for that long. A spin, not
/// a sleep: the reader stays busy, as a preempted collector would.
fn slow_reader() {
    if let Some(d) = config().slow_reader {
        let end = std::time::Instant::now() + d;
        while std::time::Instant::now() < end {
            std::hint::spin_loop();
        }
    }
}

/// `cuptiActivityGetNextRecord`: steps by this release's record sizes.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNextRecord(
    buffer: *mut u8,
    valid: usize,
    record: *mut *mut v13::CUpti_Activity,
) -> u32 {
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
            None => return 21,
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

/// One subscriber per process, as CUPTI before 13.3.
fn subscribe(cb: ApiCallback, userdata: usize, handle: usize) -> u32 {
    let mut s = state();
    if s.subscriber.is_some() {
        return MULTIPLE_SUBSCRIBERS;
    }
    s.subscriber = Some((cb, userdata, handle));
    SUBSCRIBES.fetch_add(1, Ordering::Relaxed);
    SUCCESS
}

fn unsubscribe(handle: usize) -> u32 {
    let mut s = state();
    if s.subscriber.is_none_or(|(_, _, h)| h != handle) {
        return INVALID_PARAMETER;
    }
    s.subscriber = None;
    s.domains.clear();
    UNSUBSCRIBES.fetch_add(1, Ordering::Relaxed);
    SUCCESS
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
