/*!
A fake `librocprofiler-sdk` for tests (never shipped). It implements the part of the SDK's C ABI
kinetrace uses: the version query, the registration dance (`rocprofiler_force_configure` → the
tool's `rocprofiler_configure` → its `initialize`, after which configuration is locked), contexts,
buffers, buffer and callback tracing services, the kind/operation name queries and iterators,
agents and flushing. Records are written in the **real layouts of the ABI the reported version
implies** (the `#[repr(C)]` types of `kinetrace-rocprofiler-sdk-sys`, whose offsets are asserted
there against the research table): 0.x (16-byte correlation id, 56-byte callback record, 80-byte
copy record, client id without `size`) or 1.x (24-byte correlation id, 64-byte callback record,
96-byte copy record).

Workloads are driven by the test through `fake_rocp_*` entry points that behave like HIP calls on
the calling thread: the HIP API callback at ENTER and EXIT (one `rocprofiler_user_data_t` per call
and service, shared by both phases, as the SDK does) on every active context that traces
`HIP_RUNTIME_API`, and the asynchronous records (kernel dispatch, memory copy) of the call appended
to the buffer of every active context that traces their kind, carrying the call's correlation id.
Code-object loads call the `CODE_OBJECT` callback. `fake_rocp_runtime_init` is HIP initialising:
the tools in `ROCP_TOOL_LIBRARIES` and the `rocprofiler_configure` visible through `RTLD_DEFAULT`
(a preloaded library's) are registered then, as rocprofiler-register and the SDK do. A buffer is handed to its callback when it
reaches its watermark and at `rocprofiler_flush_buffer`, on the calling thread (the real SDK uses a
background thread; the callback must not care).

The machine: one CPU agent and two GPU agents (`gfx90a`, 104 CUs, wavefront 64).

Numbers: kind and operation numbers follow the real ones of each ABI (buffer-tracing kinds were
renumbered in 1.0), except the HIP API operation ids, which are the real 7.0 ones for the launch,
copy and allocation calls and the fake's own otherwise (a tool must resolve them by name anyway).
Error statuses are 1.x's.

Fault injection (environment, read once):
- `FAKE_ROCP_VERSION=M.m.p` — the version reported (default `1.1.0`); `0.x` switches the layouts.
- `FAKE_ROCP_FAIL=rocprofiler_start_context,...` — those entry points fail with status 1 (ERROR).
- `FAKE_ROCP_DROP_EVERY=N` — every Nth asynchronous record is dropped and reported in the next
  buffer callback's `drop_count`.
- `FAKE_ROCP_ALREADY_INITIALIZED=1` — the SDK was initialised before the tool asked: `is_initialized`
  answers 1 and `force_configure` answers CONFIGURATION_LOCKED (a tool registered too late).
- `FAKE_ROCP_RENUMBER=1` — every kind and operation number is shifted (by 40 and 7): a tool that
  hard-codes numbers reads the wrong records.
- `FAKE_ROCP_OTHER_TOOL=1` — another tool (as PyTorch's Kineto is) registered first: it has its own
  started context tracing kernel dispatches into its own buffer, whose records the fake counts
  (`other_tool_records`), and the configure call gets priority 1.
*/
#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use kinetrace_rocprofiler_sdk_sys::{
    self as sys, v0, v1, Abi, AgentId, AgentPrefix, AgentsCallback, AsyncCorrelationId,
    BufferCallback, BufferId, CallbackTracingFn, ConfigureFn, ContextId, Dim3, KernelDispatchInfo,
    KernelDispatchRecord, KernelSymbolRegisterData, KindCallback, OperationCallback, QueueId,
    RecordHeader, Status, UserData,
};

const ERROR: Status = 1;
const CONTEXT_NOT_FOUND: Status = 2;
const BUFFER_NOT_FOUND: Status = 3;
const KIND_NOT_FOUND: Status = 4;
const OPERATION_NOT_FOUND: Status = 5;
const CONTEXT_ID_NOT_ZERO: Status = 13;
const CONFIGURATION_LOCKED: Status = 16;
const NOT_IMPLEMENTED: Status = 17;
const INCOMPATIBLE_ABI: Status = 18;
const INVALID_ARGUMENT: Status = 19;

/// The environment, read once.
struct Faults {
    version: (u32, u32, u32),
    fail: Vec<String>,
    drop_every: u64,
    already_initialized: bool,
    renumber: bool,
    other_tool: bool,
}

fn faults() -> &'static Faults {
    static F: OnceLock<Faults> = OnceLock::new();
    F.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let version = var("FAKE_ROCP_VERSION")
            .and_then(|v| {
                let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
                Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
            })
            .unwrap_or((1, 1, 0));
        Faults {
            version,
            fail: var("FAKE_ROCP_FAIL")
                .map(|v| v.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
            drop_every: var("FAKE_ROCP_DROP_EVERY")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            already_initialized: var("FAKE_ROCP_ALREADY_INITIALIZED").is_some(),
            renumber: var("FAKE_ROCP_RENUMBER").is_some(),
            other_tool: var("FAKE_ROCP_OTHER_TOOL").is_some(),
        }
    })
}

fn fails(symbol: &str) -> bool {
    faults().fail.iter().any(|f| f == symbol || f == "*")
}

fn abi() -> Abi {
    let (major, minor, _) = faults().version;
    Abi::of_version(major, minor).unwrap_or(Abi::V1)
}

// ---- names and numbers ------------------------------------------------------------------------

fn kind_shift() -> i32 {
    if faults().renumber {
        40
    } else {
        0
    }
}

fn op_shift() -> i32 {
    if faults().renumber {
        7
    } else {
        0
    }
}

/// Buffer-tracing kinds of this ABI: (number, name), ascending, NONE included (as the SDK's
/// iterator does).
fn buffer_kinds() -> Vec<(i32, &'static str)> {
    let s = kind_shift();
    let (scratch, alloc) = match abi() {
        Abi::V0 => (13, 17),
        Abi::V1 => (12, 16),
    };
    vec![
        (0, "NONE"),
        (5 + s, "HIP_RUNTIME_API"),
        (10 + s, "MEMORY_COPY"),
        (11 + s, "KERNEL_DISPATCH"),
        (scratch + s, "SCRATCH_MEMORY"),
        (alloc + s, "MEMORY_ALLOCATION"),
    ]
}

/// Callback-tracing kinds (stable across ABIs).
fn callback_kinds() -> Vec<(i32, &'static str)> {
    let s = kind_shift();
    vec![
        (0, "NONE"),
        (5 + s, "HIP_RUNTIME_API"),
        (10 + s, "CODE_OBJECT"),
        (12 + s, "KERNEL_DISPATCH"),
        (13 + s, "MEMORY_COPY"),
    ]
}

fn kind_number(table: &[(i32, &'static str)], name: &str) -> i32 {
    table
        .iter()
        .find(|(_, n)| *n == name)
        .map_or(-1, |(k, _)| *k)
}

fn buffer_kind(name: &str) -> i32 {
    kind_number(&buffer_kinds(), name)
}

fn callback_kind(name: &str) -> i32 {
    kind_number(&callback_kinds(), name)
}

/// HIP runtime API operations: (1.x id, name). 0.x ids are the fake's own (1.x minus 3).
const HIP_API: &[(i32, &str)] = &[
    (48, "hipDeviceSynchronize"),
    (84, "hipExtLaunchKernel"),
    (90, "hipFree"),
    (120, "hipGetDevice"),
    (166, "hipGraphLaunch"),
    (214, "hipLaunchKernel"),
    (215, "hipMalloc"),
    (259, "hipMemcpy"),
    (268, "hipMemcpyAsync"),
    (287, "hipMemcpyWithStream"),
    (293, "hipMemsetAsync"),
    (308, "hipModuleLaunchKernel"),
    (330, "hipStreamSynchronize"),
];

fn hip_ops() -> Vec<(i32, &'static str)> {
    let base = match abi() {
        Abi::V0 => -3,
        Abi::V1 => 0,
    };
    HIP_API
        .iter()
        .map(|&(id, n)| (id + base + op_shift(), n))
        .collect()
}

fn memcpy_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "MEMORY_COPY_NONE"),
        (1 + s, "MEMORY_COPY_HOST_TO_HOST"),
        (2 + s, "MEMORY_COPY_HOST_TO_DEVICE"),
        (3 + s, "MEMORY_COPY_DEVICE_TO_HOST"),
        (4 + s, "MEMORY_COPY_DEVICE_TO_DEVICE"),
    ]
}

fn dispatch_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "KERNEL_DISPATCH_NONE"),
        (1 + s, "KERNEL_DISPATCH_ENQUEUE"),
        (2 + s, "KERNEL_DISPATCH_COMPLETE"),
    ]
}

fn code_object_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "CODE_OBJECT_NONE"),
        (1 + s, "CODE_OBJECT_LOAD"),
        (2 + s, "CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER"),
    ]
}

fn allocation_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "MEMORY_ALLOCATION_NONE"),
        (1 + s, "MEMORY_ALLOCATION_ALLOCATE"),
        (2 + s, "MEMORY_ALLOCATION_VMEM_ALLOCATE"),
        (3 + s, "MEMORY_ALLOCATION_FREE"),
        (4 + s, "MEMORY_ALLOCATION_VMEM_FREE"),
    ]
}

fn buffer_ops(kind: i32) -> Option<Vec<(i32, &'static str)>> {
    let name = buffer_kinds().into_iter().find(|(k, _)| *k == kind)?.1;
    Some(match name {
        "MEMORY_COPY" => memcpy_ops(),
        "KERNEL_DISPATCH" => dispatch_ops(),
        "HIP_RUNTIME_API" => hip_ops(),
        "MEMORY_ALLOCATION" => allocation_ops(),
        _ => Vec::new(),
    })
}

fn callback_ops(kind: i32) -> Option<Vec<(i32, &'static str)>> {
    let name = callback_kinds().into_iter().find(|(k, _)| *k == kind)?.1;
    Some(match name {
        "HIP_RUNTIME_API" => hip_ops(),
        "CODE_OBJECT" => code_object_ops(),
        "MEMORY_COPY" => memcpy_ops(),
        "KERNEL_DISPATCH" => dispatch_ops(),
        _ => Vec::new(),
    })
}

// ---- state ------------------------------------------------------------------------------------

#[derive(Default)]
struct Context {
    active: bool,
    /// (buffer-tracing kind, buffer index).
    buffer_services: Vec<(i32, usize)>,
    /// (callback kind, callback, data).
    callback_services: Vec<(i32, usize, usize)>,
}

struct Buffer {
    context: usize,
    size: usize,
    watermark: usize,
    discard: bool,
    callback: BufferCallback,
    data: usize,
    /// (buffer-tracing kind, record bytes as words).
    records: Vec<(u32, Box<[u64]>)>,
    bytes: usize,
    dropped: u64,
}

#[derive(Default)]
struct State {
    /// 0 not initialised, -1 initialising (inside `initialize`), 1 done.
    init: i32,
    contexts: Vec<Context>,
    buffers: Vec<Buffer>,
    finalize: Option<(sys::FinalizeFn, usize)>,
    client_name: Option<String>,
    configure_calls: u64,
    async_seen: u64,
    other_tool_ready: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    init: 0,
    contexts: Vec::new(),
    buffers: Vec::new(),
    finalize: None,
    client_name: None,
    configure_calls: 0,
    async_seen: 0,
    other_tool_ready: false,
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

static NEXT_CORRELATION: AtomicU64 = AtomicU64::new(1);
static DELIVERED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static OTHER_TOOL_RECORDS: AtomicU64 = AtomicU64::new(0);
static CALLBACKS: AtomicU64 = AtomicU64::new(0);

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_BOOTTIME exists on every Linux this runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// Handles are index + 1 (0 is "not created" for contexts).
fn index(handle: u64) -> Option<usize> {
    handle.checked_sub(1).map(|i| i as usize)
}

/// The other tool's buffer callback: counts what it gets.
unsafe extern "C" fn other_tool_buffer(
    _c: ContextId,
    _b: BufferId,
    _h: *mut *mut RecordHeader,
    n: usize,
    _d: *mut c_void,
    _drops: u64,
) {
    OTHER_TOOL_RECORDS.fetch_add(n as u64, Ordering::Relaxed);
}

fn ensure_other_tool(s: &mut State) {
    if !faults().other_tool || s.other_tool_ready {
        return;
    }
    s.other_tool_ready = true;
    let ctx = s.contexts.len();
    s.contexts.push(Context {
        active: true,
        ..Default::default()
    });
    let buf = s.buffers.len();
    s.buffers.push(Buffer {
        context: ctx,
        size: 1 << 20,
        // Handed over at every record, so the test sees the other tool's stream at once.
        watermark: 1,
        discard: false,
        callback: other_tool_buffer,
        data: 0,
        records: Vec::new(),
        bytes: 0,
        dropped: 0,
    });
    s.contexts[ctx]
        .buffer_services
        .push((buffer_kind("KERNEL_DISPATCH"), buf));
}

// ---- record delivery --------------------------------------------------------------------------

fn words_of<T: Copy>(value: &T, size: usize) -> Box<[u64]> {
    let mut words = vec![0u64; size.div_ceil(8)].into_boxed_slice();
    debug_assert!(std::mem::size_of::<T>() <= words.len() * 8);
    // SAFETY: `words` holds at least size_of::<T>() bytes and is 8-aligned, enough for every
    // record type (their alignment is 8).
    unsafe { std::ptr::write(words.as_mut_ptr() as *mut T, *value) };
    words
}

/// Takes what buffer `b` holds and hands it to its callback, outside the lock.
fn deliver(b: usize) {
    let (callback, data, ctx, records, dropped) = {
        let mut s = state();
        let Some(buf) = s.buffers.get_mut(b) else {
            return;
        };
        let records = std::mem::take(&mut buf.records);
        let dropped = std::mem::take(&mut buf.dropped);
        buf.bytes = 0;
        (buf.callback, buf.data, buf.context, records, dropped)
    };
    if records.is_empty() && dropped == 0 {
        return;
    }
    let mut headers: Vec<RecordHeader> = records
        .iter()
        .map(|(kind, words)| RecordHeader {
            category: sys::BUFFER_CATEGORY_TRACING,
            kind: *kind,
            payload: words.as_ptr() as *mut c_void,
        })
        .collect();
    let mut pointers: Vec<*mut RecordHeader> =
        headers.iter_mut().map(|h| h as *mut RecordHeader).collect();
    DELIVERED.fetch_add(records.len() as u64, Ordering::Relaxed);
    // SAFETY: the callback was registered with this signature; the headers and payloads live until
    // it returns.
    unsafe {
        callback(
            ContextId {
                handle: ctx as u64 + 1,
            },
            BufferId {
                handle: b as u64 + 1,
            },
            pointers.as_mut_ptr(),
            pointers.len(),
            data as *mut c_void,
            dropped,
        )
    };
}

/// Appends an asynchronous record of buffer kind `kind_name` to every active context tracing it.
fn emit_async(kind_name: &str, words: impl Fn() -> Box<[u64]>) {
    let kind = buffer_kind(kind_name);
    let mut due = Vec::new();
    {
        let mut s = state();
        ensure_other_tool(&mut s);
        s.async_seen += 1;
        let drop_this = faults().drop_every > 0 && s.async_seen % faults().drop_every == 0;
        let targets: Vec<usize> = s
            .contexts
            .iter()
            .enumerate()
            .filter(|(_, c)| c.active)
            .flat_map(|(ci, c)| {
                c.buffer_services
                    .iter()
                    .filter(move |(k, _)| *k == kind)
                    .map(move |(_, b)| (ci, *b))
            })
            // Records go only to a buffer of the service's own context (§8.6).
            .filter(|(ci, b)| s.buffers.get(*b).is_some_and(|buf| buf.context == *ci))
            .map(|(_, b)| b)
            .collect();
        for b in targets {
            let record = words();
            let len = record.len() * 8;
            let buf = &mut s.buffers[b];
            if drop_this {
                buf.dropped += 1;
                DROPPED.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if buf.bytes + len > buf.size {
                if buf.discard {
                    buf.dropped += 1;
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // LOSSLESS: the producer waits for the buffer to be handed over.
                drop(s);
                deliver(b);
                s = state();
            }
            let buf = &mut s.buffers[b];
            buf.records.push((kind as u32, record));
            buf.bytes += len;
            if buf.bytes >= buf.watermark && !due.contains(&b) {
                due.push(b);
            }
        }
    }
    for b in due {
        deliver(b);
    }
}

/// Callback services of active contexts for callback kind `kind_name`: (context, callback, data).
fn callback_targets(kind_name: &str) -> Vec<(usize, usize, usize)> {
    let kind = callback_kind(kind_name);
    let s = state();
    s.contexts
        .iter()
        .enumerate()
        .filter(|(_, c)| c.active)
        .flat_map(|(ci, c)| {
            c.callback_services
                .iter()
                .filter(move |(k, _, _)| *k == kind)
                .map(move |(_, f, d)| (ci, *f, *d))
        })
        .collect()
}

/// Calls one callback-tracing callback with the ABI's record by value.
fn invoke(
    target: (usize, usize, usize),
    kind_name: &str,
    operation: i32,
    phase: u32,
    correlation: u64,
    payload: *mut c_void,
    user_data: &mut UserData,
) {
    let (ctx, f, data) = target;
    CALLBACKS.fetch_add(1, Ordering::Relaxed);
    let context_id = ContextId {
        handle: ctx as u64 + 1,
    };
    let kind = callback_kind(kind_name) as u32;
    match abi() {
        Abi::V0 => {
            let record = v0::CallbackRecord {
                context_id,
                thread_id: gettid(),
                correlation_id: v0::CorrelationId {
                    internal: correlation,
                    external: UserData::default(),
                },
                kind,
                operation: operation as u32,
                phase,
                payload,
            };
            // SAFETY: registered as a callback-tracing callback of this ABI.
            let f: unsafe extern "C" fn(v0::CallbackRecord, *mut UserData, *mut c_void) =
                unsafe { std::mem::transmute(f) };
            // SAFETY: the record is passed by value; `user_data` outlives the call.
            unsafe { f(record, user_data, data as *mut c_void) };
        }
        Abi::V1 => {
            let record = v1::CallbackRecord {
                context_id,
                thread_id: gettid(),
                correlation_id: v1::CorrelationId {
                    internal: correlation,
                    external: UserData::default(),
                    ancestor: 0,
                },
                kind,
                operation: operation as u32,
                phase,
                payload,
            };
            // SAFETY: registered as a callback-tracing callback of this ABI.
            let f: unsafe extern "C" fn(v1::CallbackRecord, *mut UserData, *mut c_void) =
                unsafe { std::mem::transmute(f) };
            // SAFETY: the record is passed by value; `user_data` outlives the call.
            unsafe { f(record, user_data, data as *mut c_void) };
        }
    }
}

/// One HIP call on the calling thread: ENTER, the call's asynchronous work, EXIT. Returns its
/// correlation id.
fn hip_call(name: &str, work: impl FnOnce(u64)) -> u64 {
    let op = hip_ops()
        .into_iter()
        .find(|(_, n)| *n == name)
        .map_or(-1, |(o, _)| o);
    let correlation = NEXT_CORRELATION.fetch_add(1, Ordering::Relaxed);
    let targets = callback_targets("HIP_RUNTIME_API");
    let mut user = vec![UserData::default(); targets.len()];
    for (t, u) in targets.iter().zip(user.iter_mut()) {
        invoke(
            *t,
            "HIP_RUNTIME_API",
            op,
            sys::PHASE_ENTER,
            correlation,
            std::ptr::null_mut(),
            u,
        );
    }
    work(correlation);
    for (t, u) in targets.iter().zip(user.iter_mut()) {
        invoke(
            *t,
            "HIP_RUNTIME_API",
            op,
            sys::PHASE_EXIT,
            correlation,
            std::ptr::null_mut(),
            u,
        );
    }
    correlation
}

// ---- the machine's agents ----------------------------------------------------------------------

const CPU_AGENT: u64 = 0x100;
/// GPU agent handles: GPU i is `0x200 + 0x100 * i`.
const GPU_AGENT_BASE: u64 = 0x200;

fn gpu_agent(i: u32) -> AgentId {
    AgentId {
        handle: GPU_AGENT_BASE + 0x100 * u64::from(i),
    }
}

fn agents() -> Vec<v1::Agent1_1> {
    {
        let make = |id: u64, gpu: Option<i32>, logical: i32| {
            let (name, product): (&'static CStr, &'static CStr) = match gpu {
                Some(_) => (c"gfx90a", c"AMD Instinct MI250X"),
                None => (c"AMD EPYC 7763", c"AMD EPYC 7763"),
            };
            v1::Agent1_1 {
                prefix: AgentPrefix {
                    size: 0, // set per query (the library's own struct size)
                    id: AgentId { handle: id },
                    agent_type: if gpu.is_some() {
                        sys::AGENT_TYPE_GPU
                    } else {
                        sys::AGENT_TYPE_CPU
                    },
                    _a: [0; 11],
                    wave_front_size: if gpu.is_some() { 64 } else { 0 },
                    num_xcc: 1,
                    cu_count: if gpu.is_some() { 104 } else { 0 },
                    _b: [0; 6],
                    gfx_target_version: if gpu.is_some() { 90010 } else { 0 },
                    _c: [0; 18],
                    local_mem_size: if gpu.is_some() { 64 << 30 } else { 0 },
                    hive_id: 0,
                    gpu_id: id,
                    workgroup_max_dim: Dim3 {
                        x: 1024,
                        y: 1024,
                        z: 1024,
                    },
                    grid_max_dim: Dim3::default(),
                    mem_banks: std::ptr::null(),
                    caches: std::ptr::null(),
                    io_links: std::ptr::null(),
                    name: name.as_ptr(),
                    vendor_name: c"AMD".as_ptr(),
                    product_name: product.as_ptr(),
                    model_name: c"mi200".as_ptr(),
                    node_id: logical as u32,
                    logical_node_id: logical,
                    logical_node_type_id: gpu.unwrap_or(0),
                    runtime_visibility: 0xf,
                },
                uuid: [id, 0],
            }
        };
        vec![
            make(CPU_AGENT, None, 0),
            make(gpu_agent(0).handle, Some(0), 1),
            make(gpu_agent(1).handle, Some(1), 2),
        ]
    }
}

// ---- the C ABI -----------------------------------------------------------------------------------

/// `rocprofiler_get_version`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_get_version(
    major: *mut u32,
    minor: *mut u32,
    patch: *mut u32,
) -> Status {
    if fails("rocprofiler_get_version") {
        return ERROR;
    }
    let (a, b, c) = faults().version;
    for (p, v) in [(major, a), (minor, b), (patch, c)] {
        if !p.is_null() {
            // SAFETY: caller's out-pointer, checked non-null.
            unsafe { *p = v };
        }
    }
    sys::STATUS_SUCCESS
}

/// `rocprofiler_get_timestamp`: CLOCK_BOOTTIME.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_get_timestamp(ns: *mut u64) -> Status {
    if ns.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: caller's out-pointer, checked non-null.
    unsafe { *ns = boottime_ns() };
    sys::STATUS_SUCCESS
}

/// `rocprofiler_is_initialized`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_is_initialized(status: *mut i32) -> Status {
    if status.is_null() {
        return INVALID_ARGUMENT;
    }
    let v = if faults().already_initialized {
        1
    } else {
        state().init
    };
    // SAFETY: caller's out-pointer, checked non-null.
    unsafe { *status = v };
    sys::STATUS_SUCCESS
}

/// `rocprofiler_force_configure`: runs `configure` → `initialize` now, then locks configuration.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_force_configure(configure: ConfigureFn) -> Status {
    if fails("rocprofiler_force_configure") {
        return ERROR;
    }
    {
        let mut s = state();
        if faults().already_initialized || s.init != 0 {
            return CONFIGURATION_LOCKED;
        }
        s.init = -1;
        ensure_other_tool(&mut s);
    }
    // SAFETY: the caller passes a configure function with the SDK's signature.
    unsafe { run_tool(configure, u32::from(faults().other_tool)) };
    state().init = 1;
    sys::STATUS_SUCCESS
}

/// One tool's registration: its `configure`, then its `initialize` (configuration is open).
///
/// # Safety
/// `configure` must have the configure function's signature.
unsafe fn run_tool(configure: ConfigureFn, priority: u32) {
    state().configure_calls += 1;
    let (major, minor, patch) = faults().version;
    let version = Abi::encode_version(major, minor, patch);
    let runtime = c"7.1.0";
    let mut id0 = v0::ClientId {
        name: std::ptr::null(),
        handle: 7,
    };
    let mut id1 = v1::ClientId {
        size: std::mem::size_of::<v1::ClientId>(),
        name: std::ptr::null(),
        handle: 7,
    };
    let id_ptr = match abi() {
        Abi::V0 => &mut id0 as *mut v0::ClientId as *mut c_void,
        Abi::V1 => &mut id1 as *mut v1::ClientId as *mut c_void,
    };
    // SAFETY: the tool's configure function, called as the SDK calls it.
    let result = unsafe { configure(version, runtime.as_ptr(), priority, id_ptr) };
    let name = match abi() {
        Abi::V0 => id0.name,
        Abi::V1 => id1.name,
    };
    if !name.is_null() {
        // SAFETY: the tool wrote a NUL-terminated string it keeps alive.
        state().client_name = Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into());
    }
    if !result.is_null() {
        // SAFETY: the tool returns a valid result struct that outlives the process.
        let r = unsafe { *result };
        if let Some(init) = r.initialize {
            // SAFETY: the tool's initialize; the SDK's return value is ignored (§8.5).
            unsafe { init(std::ptr::null(), r.tool_data) };
        }
        if let Some(fini) = r.finalize {
            state().finalize = Some((fini, r.tool_data as usize));
        }
    }
}

/// A ROCm runtime (HIP) initialises: the SDK collects the tools as rocprofiler-register and the
/// SDK do — every library in `ROCP_TOOL_LIBRARIES` (split on `:`, dlopened `RTLD_LOCAL`), then
/// `rocprofiler_configure` found through `RTLD_DEFAULT` (a preloaded library's), then `extra` if
/// not null (a test's stand-in for a tool the link-map scan would find) — and registers each once,
/// then locks configuration. Nothing happens when the SDK is already initialised. Returns the
/// number of tools registered.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_runtime_init(extra: Option<ConfigureFn>) -> u32 {
    {
        let mut s = state();
        if faults().already_initialized || s.init != 0 {
            return 0;
        }
        s.init = -1;
        ensure_other_tool(&mut s);
    }
    let mut tools: Vec<ConfigureFn> = Vec::new();
    let lookup = |handle: *mut c_void| {
        // SAFETY: a handle from dlopen (or RTLD_DEFAULT) and a NUL-terminated name.
        let f = unsafe { libc::dlsym(handle, c"rocprofiler_configure".as_ptr()) };
        // SAFETY: a library's `rocprofiler_configure` has the configure signature.
        (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, ConfigureFn>(f) })
    };
    if let Ok(list) = std::env::var("ROCP_TOOL_LIBRARIES") {
        for lib in list.split(':').filter(|l| !l.is_empty()) {
            let Ok(c) = std::ffi::CString::new(lib) else {
                continue;
            };
            // SAFETY: loading a tool library the user named, as the SDK does.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !h.is_null() {
                tools.extend(lookup(h));
            }
        }
    }
    tools.extend(lookup(libc::RTLD_DEFAULT));
    tools.extend(extra);
    let mut seen: Vec<usize> = Vec::new();
    tools.retain(|f| {
        let at = *f as usize;
        let new = !seen.contains(&at);
        seen.push(at);
        new
    });
    let first = u32::from(faults().other_tool);
    for (i, f) in tools.iter().enumerate() {
        // SAFETY: each is a `rocprofiler_configure` (checked by name above) or the test's.
        unsafe { run_tool(*f, first + i as u32) };
    }
    state().init = 1;
    tools.len() as u32
}

fn locked() -> bool {
    state().init == 1
}

/// `rocprofiler_create_context`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_create_context(id: *mut ContextId) -> Status {
    if fails("rocprofiler_create_context") {
        return ERROR;
    }
    if id.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: caller's pointer, checked non-null.
    if unsafe { (*id).handle } != 0 {
        return CONTEXT_ID_NOT_ZERO;
    }
    if locked() {
        return CONFIGURATION_LOCKED;
    }
    let mut s = state();
    s.contexts.push(Context::default());
    let handle = s.contexts.len() as u64;
    // SAFETY: as above.
    unsafe { (*id).handle = handle };
    sys::STATUS_SUCCESS
}

/// `rocprofiler_start_context`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_start_context(ctx: ContextId) -> Status {
    if fails("rocprofiler_start_context") {
        return ERROR;
    }
    let mut s = state();
    match index(ctx.handle).and_then(|i| s.contexts.get_mut(i)) {
        Some(c) => {
            c.active = true;
            sys::STATUS_SUCCESS
        }
        None => CONTEXT_NOT_FOUND,
    }
}

/// `rocprofiler_stop_context`: CONTEXT_NOT_FOUND for a context that is not active (§8.6).
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_stop_context(ctx: ContextId) -> Status {
    if fails("rocprofiler_stop_context") {
        return ERROR;
    }
    let mut s = state();
    match index(ctx.handle).and_then(|i| s.contexts.get_mut(i)) {
        Some(c) if c.active => {
            c.active = false;
            sys::STATUS_SUCCESS
        }
        _ => CONTEXT_NOT_FOUND,
    }
}

/// `rocprofiler_create_buffer`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_create_buffer(
    ctx: ContextId,
    size: usize,
    watermark: usize,
    policy: i32,
    callback: BufferCallback,
    data: *mut c_void,
    out: *mut BufferId,
) -> Status {
    if fails("rocprofiler_create_buffer") {
        return ERROR;
    }
    if out.is_null() || size == 0 {
        return INVALID_ARGUMENT;
    }
    if locked() {
        return CONFIGURATION_LOCKED;
    }
    let mut s = state();
    let Some(c) = index(ctx.handle).filter(|i| *i < s.contexts.len()) else {
        return CONTEXT_NOT_FOUND;
    };
    s.buffers.push(Buffer {
        context: c,
        size,
        watermark: watermark.max(1),
        discard: policy == sys::BUFFER_POLICY_DISCARD,
        callback,
        data: data as usize,
        records: Vec::new(),
        bytes: 0,
        dropped: 0,
    });
    // SAFETY: caller's out-pointer, checked non-null.
    unsafe {
        (*out).handle = s.buffers.len() as u64;
    }
    sys::STATUS_SUCCESS
}

/// `rocprofiler_flush_buffer`: hands what the buffer holds to its callback before returning.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_flush_buffer(buffer: BufferId) -> Status {
    if fails("rocprofiler_flush_buffer") {
        return ERROR;
    }
    let Some(b) = index(buffer.handle).filter(|b| *b < state().buffers.len()) else {
        return BUFFER_NOT_FOUND;
    };
    deliver(b);
    sys::STATUS_SUCCESS
}

/// `rocprofiler_configure_buffer_tracing_service`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_configure_buffer_tracing_service(
    ctx: ContextId,
    kind: i32,
    _operations: *const i32,
    _n: usize,
    buffer: BufferId,
) -> Status {
    if fails("rocprofiler_configure_buffer_tracing_service") {
        return ERROR;
    }
    if locked() {
        return CONFIGURATION_LOCKED;
    }
    if kind <= 0 || !buffer_kinds().iter().any(|(k, _)| *k == kind) {
        return KIND_NOT_FOUND;
    }
    let mut s = state();
    let Some(b) = index(buffer.handle).filter(|b| *b < s.buffers.len()) else {
        return BUFFER_NOT_FOUND;
    };
    match index(ctx.handle).and_then(|i| s.contexts.get_mut(i)) {
        Some(c) => {
            c.buffer_services.push((kind, b));
            sys::STATUS_SUCCESS
        }
        None => CONTEXT_NOT_FOUND,
    }
}

/// `rocprofiler_configure_callback_tracing_service`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_configure_callback_tracing_service(
    ctx: ContextId,
    kind: i32,
    _operations: *const i32,
    _n: usize,
    callback: CallbackTracingFn,
    data: *mut c_void,
) -> Status {
    if fails("rocprofiler_configure_callback_tracing_service") {
        return ERROR;
    }
    if locked() {
        return CONFIGURATION_LOCKED;
    }
    if callback.is_null() {
        return INVALID_ARGUMENT;
    }
    if kind <= 0 || !callback_kinds().iter().any(|(k, _)| *k == kind) {
        return KIND_NOT_FOUND;
    }
    let mut s = state();
    match index(ctx.handle).and_then(|i| s.contexts.get_mut(i)) {
        Some(c) => {
            c.callback_services
                .push((kind, callback as usize, data as usize));
            sys::STATUS_SUCCESS
        }
        None => CONTEXT_NOT_FOUND,
    }
}

fn write_name(name: Option<&'static str>, out: *mut *const c_char, len: *mut u64) -> Status {
    // Names are 'static and NUL-terminated: leaked once per distinct name.
    static INTERNED: Mutex<Vec<(&'static str, &'static CStr)>> = Mutex::new(Vec::new());
    let Some(name) = name else {
        return OPERATION_NOT_FOUND;
    };
    let c = {
        let mut v = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        match v.iter().find(|(n, _)| *n == name) {
            Some((_, c)) => *c,
            None => {
                let c: &'static CStr = Box::leak(
                    std::ffi::CString::new(name)
                        .unwrap_or_default()
                        .into_boxed_c_str(),
                );
                v.push((name, c));
                c
            }
        }
    };
    if !out.is_null() {
        // SAFETY: caller's out-pointer, checked non-null.
        unsafe { *out = c.as_ptr() };
    }
    if !len.is_null() {
        // SAFETY: as above.
        unsafe { *len = name.len() as u64 };
    }
    sys::STATUS_SUCCESS
}

fn lookup(table: Option<Vec<(i32, &'static str)>>, n: i32) -> Option<&'static str> {
    table?.into_iter().find(|(k, _)| *k == n).map(|(_, s)| s)
}

/// `rocprofiler_query_buffer_tracing_kind_name`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_query_buffer_tracing_kind_name(
    kind: i32,
    name: *mut *const c_char,
    len: *mut u64,
) -> Status {
    match lookup(Some(buffer_kinds()), kind) {
        Some(n) => write_name(Some(n), name, len),
        None => KIND_NOT_FOUND,
    }
}

/// `rocprofiler_query_callback_tracing_kind_name`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_query_callback_tracing_kind_name(
    kind: i32,
    name: *mut *const c_char,
    len: *mut u64,
) -> Status {
    match lookup(Some(callback_kinds()), kind) {
        Some(n) => write_name(Some(n), name, len),
        None => KIND_NOT_FOUND,
    }
}

/// `rocprofiler_query_buffer_tracing_kind_operation_name`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_query_buffer_tracing_kind_operation_name(
    kind: i32,
    op: i32,
    name: *mut *const c_char,
    len: *mut u64,
) -> Status {
    if fails("rocprofiler_query_buffer_tracing_kind_operation_name") {
        return ERROR;
    }
    match buffer_ops(kind) {
        None => KIND_NOT_FOUND,
        ops => write_name(lookup(ops, op), name, len),
    }
}

/// `rocprofiler_query_callback_tracing_kind_operation_name`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_query_callback_tracing_kind_operation_name(
    kind: i32,
    op: i32,
    name: *mut *const c_char,
    len: *mut u64,
) -> Status {
    if fails("rocprofiler_query_callback_tracing_kind_operation_name") {
        return ERROR;
    }
    match callback_ops(kind) {
        None => KIND_NOT_FOUND,
        ops => write_name(lookup(ops, op), name, len),
    }
}

fn iterate_kinds(table: Vec<(i32, &'static str)>, cb: KindCallback, data: *mut c_void) -> Status {
    for (k, _) in table {
        // SAFETY: the tool's iterator callback.
        if unsafe { cb(k, data) } != 0 {
            break;
        }
    }
    sys::STATUS_SUCCESS
}

fn iterate_ops(
    kind: i32,
    table: Option<Vec<(i32, &'static str)>>,
    cb: OperationCallback,
    data: *mut c_void,
) -> Status {
    let Some(table) = table else {
        return KIND_NOT_FOUND;
    };
    for (op, _) in table {
        // SAFETY: the tool's iterator callback.
        if unsafe { cb(kind, op, data) } != 0 {
            break;
        }
    }
    sys::STATUS_SUCCESS
}

/// `rocprofiler_iterate_buffer_tracing_kinds` (NONE included, as the real one does).
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_iterate_buffer_tracing_kinds(
    cb: KindCallback,
    data: *mut c_void,
) -> Status {
    if fails("rocprofiler_iterate_buffer_tracing_kinds") {
        return ERROR;
    }
    iterate_kinds(buffer_kinds(), cb, data)
}

/// `rocprofiler_iterate_callback_tracing_kinds`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_iterate_callback_tracing_kinds(
    cb: KindCallback,
    data: *mut c_void,
) -> Status {
    if fails("rocprofiler_iterate_callback_tracing_kinds") {
        return ERROR;
    }
    iterate_kinds(callback_kinds(), cb, data)
}

/// `rocprofiler_iterate_buffer_tracing_kind_operations`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_iterate_buffer_tracing_kind_operations(
    kind: i32,
    cb: OperationCallback,
    data: *mut c_void,
) -> Status {
    iterate_ops(kind, buffer_ops(kind), cb, data)
}

/// `rocprofiler_iterate_callback_tracing_kind_operations`.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_iterate_callback_tracing_kind_operations(
    kind: i32,
    cb: OperationCallback,
    data: *mut c_void,
) -> Status {
    iterate_ops(kind, callback_ops(kind), cb, data)
}

/// `rocprofiler_query_available_agents`: INCOMPATIBLE_ABI for a size above the library's own.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_query_available_agents(
    version: i32,
    cb: AgentsCallback,
    agent_size: usize,
    data: *mut c_void,
) -> Status {
    if fails("rocprofiler_query_available_agents") {
        return ERROR;
    }
    if version != sys::AGENT_INFO_VERSION_0 {
        return INVALID_ARGUMENT;
    }
    let (major, minor, _) = faults().version;
    if major == 0 {
        return NOT_IMPLEMENTED;
    }
    let own = v1::agent_size(minor);
    if agent_size > own {
        return INCOMPATIBLE_ABI;
    }
    let mut copies = agents();
    for a in &mut copies {
        a.prefix.size = own as u64;
    }
    let mut pointers: Vec<*const c_void> = copies
        .iter()
        .map(|a| a as *const v1::Agent1_1 as *const c_void)
        .collect();
    // SAFETY: the tool's callback; the agents live until it returns.
    unsafe { cb(version, pointers.as_mut_ptr(), pointers.len(), data) }
}

/// `rocprofiler_get_status_string`.
#[no_mangle]
pub extern "C" fn rocprofiler_get_status_string(status: Status) -> *const c_char {
    let s: &'static CStr = match status {
        0 => c"Success",
        ERROR => c"General error",
        CONTEXT_NOT_FOUND => c"Context ID not found",
        BUFFER_NOT_FOUND => c"Buffer ID not found",
        KIND_NOT_FOUND => c"Kind not found",
        OPERATION_NOT_FOUND => c"Operation not found",
        CONTEXT_ID_NOT_ZERO => c"Context ID should be initialized to zero",
        CONFIGURATION_LOCKED => {
            c"Configuration request occurred outside of valid rocprofiler configuration period"
        }
        NOT_IMPLEMENTED => c"API function is defined but not implemented",
        INCOMPATIBLE_ABI => c"Data structure provided by user has a incompatible binary interface with this version of rocprofiler",
        INVALID_ARGUMENT => c"Function invoked with one or more invalid arguments",
        _ => c"Unknown status",
    };
    s.as_ptr()
}

// ---- the test's side ---------------------------------------------------------------------------

/// Counters for tests.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeStats {
    /// Asynchronous records handed to buffer callbacks.
    pub records_delivered: u64,
    /// Asynchronous records dropped (reported through `drop_count`).
    pub records_dropped: u64,
    /// Callback-tracing callbacks made.
    pub callbacks: u64,
    /// Contexts created (the other tool's included).
    pub contexts: u32,
    /// Contexts active now.
    pub active_contexts: u32,
    /// Times a tool's configure ran through `force_configure`.
    pub configure_calls: u64,
    /// Records the other tool's buffer received.
    pub other_tool_records: u64,
    /// 1 when the tool wrote its name into the client id.
    pub client_named: u32,
}

/// Fills `out` with the counters.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_stats(out: *mut FakeStats) {
    if out.is_null() {
        return;
    }
    let s = state();
    let stats = FakeStats {
        records_delivered: DELIVERED.load(Ordering::Relaxed),
        records_dropped: DROPPED.load(Ordering::Relaxed),
        callbacks: CALLBACKS.load(Ordering::Relaxed),
        contexts: s.contexts.len() as u32,
        active_contexts: s.contexts.iter().filter(|c| c.active).count() as u32,
        configure_calls: s.configure_calls,
        other_tool_records: OTHER_TOOL_RECORDS.load(Ordering::Relaxed),
        client_named: u32::from(s.client_name.is_some()),
    };
    // SAFETY: caller's out-pointer, checked non-null.
    unsafe { *out = stats };
}

/// A code object with kernel `name` (mangled, with the `.kd` suffix the real SDK reports) as
/// `kernel_id` was loaded: the CODE_OBJECT kernel-symbol callback on every active context.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_load_kernel(kernel_id: u64, name: *const c_char) {
    let size = match abi() {
        Abi::V0 => sys::KERNEL_SYMBOL_REGISTER_DATA_SIZE_V0,
        Abi::V1 => sys::KERNEL_SYMBOL_REGISTER_DATA_SIZE_V1,
    };
    let data = KernelSymbolRegisterData {
        size: size as u64,
        kernel_id,
        code_object_id: 1,
        kernel_name: name,
        kernel_object: 0x7000_0000 + kernel_id,
        segments_and_registers: [0; 7],
        _pad: 0,
    };
    let mut words = words_of(&data, size);
    let op = kind_number(
        &code_object_ops(),
        "CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER",
    );
    for t in callback_targets("CODE_OBJECT") {
        let mut user = UserData::default();
        invoke(
            t,
            "CODE_OBJECT",
            op,
            sys::PHASE_ENTER,
            0,
            words.as_mut_ptr() as *mut c_void,
            &mut user,
        );
    }
}

/// `hipLaunchKernel` of `kernel_id` on GPU `gpu`, HSA queue `queue`: `grid` work-items per
/// dimension and `block` per work-group (AQL semantics), running `dur_ns`. Returns the correlation
/// id.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_launch_kernel(
    kernel_id: u64,
    gpu: u32,
    queue: u64,
    grid_x: u32,
    block_x: u32,
    dur_ns: u64,
) -> u64 {
    let tid = gettid();
    hip_call("hipLaunchKernel", |correlation| {
        let start = boottime_ns() + 1_000;
        let op = kind_number(&dispatch_ops(), "KERNEL_DISPATCH_COMPLETE") as u32;
        let record = KernelDispatchRecord {
            size: std::mem::size_of::<KernelDispatchRecord>() as u64,
            kind: buffer_kind("KERNEL_DISPATCH") as u32,
            operation: op,
            correlation_id: AsyncCorrelationId {
                internal: correlation,
                external: UserData::default(),
            },
            thread_id: tid,
            start_timestamp: start,
            end_timestamp: start + dur_ns,
            dispatch_info: KernelDispatchInfo {
                size: 72,
                agent_id: gpu_agent(gpu),
                queue_id: QueueId { handle: queue },
                kernel_id,
                dispatch_id: correlation,
                private_segment_size: 0,
                group_segment_size: 0,
                workgroup_size: Dim3 {
                    x: block_x,
                    y: 1,
                    z: 1,
                },
                grid_size: Dim3 {
                    x: grid_x,
                    y: 1,
                    z: 1,
                },
                reserved_padding: [0; 56],
            },
        };
        emit_async("KERNEL_DISPATCH", || {
            words_of(&record, std::mem::size_of::<KernelDispatchRecord>())
        });
    })
}

/// `hipMemcpyAsync` of `bytes` in direction `direction` (1 HtoH, 2 HtoD, 3 DtoH, 4 DtoD) on GPU
/// `gpu`, running `dur_ns`. Returns the correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_memcpy(
    bytes: u64,
    direction: u32,
    gpu: u32,
    dur_ns: u64,
) -> u64 {
    let tid = gettid();
    hip_call("hipMemcpyAsync", |correlation| {
        let start = boottime_ns() + 1_000;
        let names = [
            "MEMORY_COPY_HOST_TO_HOST",
            "MEMORY_COPY_HOST_TO_DEVICE",
            "MEMORY_COPY_DEVICE_TO_HOST",
            "MEMORY_COPY_DEVICE_TO_DEVICE",
        ];
        let name = names[(direction.clamp(1, 4) - 1) as usize];
        let op = kind_number(&memcpy_ops(), name) as u32;
        let cpu = AgentId { handle: CPU_AGENT };
        let (src, dst) = match direction {
            2 => (cpu, gpu_agent(gpu)),
            3 => (gpu_agent(gpu), cpu),
            4 => (gpu_agent(gpu), gpu_agent(gpu)),
            _ => (cpu, cpu),
        };
        let kind = buffer_kind("MEMORY_COPY") as u32;
        match abi() {
            Abi::V0 => {
                let r = v0::MemoryCopyRecord {
                    size: std::mem::size_of::<v0::MemoryCopyRecord>() as u64,
                    kind,
                    operation: op,
                    correlation_id: v0::CorrelationId {
                        internal: correlation,
                        external: UserData::default(),
                    },
                    thread_id: tid,
                    start_timestamp: start,
                    end_timestamp: start + dur_ns,
                    dst_agent_id: dst,
                    src_agent_id: src,
                    bytes,
                };
                emit_async("MEMORY_COPY", || words_of(&r, r.size as usize));
            }
            Abi::V1 => {
                let r = v1::MemoryCopyRecord {
                    size: std::mem::size_of::<v1::MemoryCopyRecord>() as u64,
                    kind,
                    operation: op,
                    correlation_id: AsyncCorrelationId {
                        internal: correlation,
                        external: UserData::default(),
                    },
                    thread_id: tid,
                    start_timestamp: start,
                    end_timestamp: start + dur_ns,
                    dst_agent_id: dst,
                    src_agent_id: src,
                    bytes,
                    dst_address: 0x7f00_0000_0000,
                    src_address: 0x5500_0000_0000,
                };
                emit_async("MEMORY_COPY", || words_of(&r, r.size as usize));
            }
        }
    })
}

/// `hipMalloc` (`free` = 0) or `hipFree` (`free` = 1) of `bytes` at `address` on GPU `gpu`: a
/// MEMORY_ALLOCATION record (1.x only; the fake writes none on 0.x, whose layout is unverified).
/// Returns the correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_memory(free: u32, address: u64, bytes: u64, gpu: u32) -> u64 {
    let tid = gettid();
    let name = if free != 0 { "hipFree" } else { "hipMalloc" };
    hip_call(name, |correlation| {
        if abi() != Abi::V1 {
            return;
        }
        let start = boottime_ns();
        let op_name = if free != 0 {
            "MEMORY_ALLOCATION_FREE"
        } else {
            "MEMORY_ALLOCATION_ALLOCATE"
        };
        let r = v1::MemoryAllocationRecord {
            size: std::mem::size_of::<v1::MemoryAllocationRecord>() as u64,
            kind: buffer_kind("MEMORY_ALLOCATION") as u32,
            operation: kind_number(&allocation_ops(), op_name) as u32,
            correlation_id: v1::CorrelationId {
                internal: correlation,
                external: UserData::default(),
                ancestor: 0,
            },
            thread_id: tid,
            start_timestamp: start,
            end_timestamp: start + 500,
            agent_id: gpu_agent(gpu),
            address,
            allocation_size: bytes,
        };
        emit_async("MEMORY_ALLOCATION", || words_of(&r, r.size as usize));
    })
}

/// A HIP call with no GPU work (`hipDeviceSynchronize`, `hipGetDevice`...). Returns its
/// correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_api(name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: the test passes a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    hip_call(&name, |_| {})
}

/// Runs the tool's `finalize` (the SDK does at exit).
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_finalize() {
    let fini = state().finalize.take();
    if let Some((f, data)) = fini {
        // SAFETY: the tool's finalize with its own data.
        unsafe { f(data as *mut c_void) };
    }
}
