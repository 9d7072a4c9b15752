//! The simulated SDK: contexts, buffers and their delivery, callback services, one HIP call, the
//! agents.

use super::*;

#[derive(Default)]
pub(crate) struct Context {
    pub(crate) active: bool,
    /// (buffer-tracing kind, buffer index).
    pub(crate) buffer_services: Vec<(i32, usize)>,
    /// (callback kind, callback, data).
    pub(crate) callback_services: Vec<(i32, usize, usize)>,
}

pub(crate) struct Buffer {
    pub(crate) context: usize,
    pub(crate) size: usize,
    pub(crate) watermark: usize,
    pub(crate) discard: bool,
    pub(crate) callback: BufferCallback,
    pub(crate) data: usize,
    /// (buffer-tracing kind, record bytes as words).
    pub(crate) records: Vec<(u32, Box<[u64]>)>,
    pub(crate) bytes: usize,
    pub(crate) dropped: u64,
    /// Records of work still running (`FAKE_ROCP_COMPLETE_AT_STOP`): written into the buffer when
    /// the context stops.
    pub(crate) in_flight: Vec<(u32, Box<[u64]>)>,
}

#[derive(Default)]
pub(crate) struct State {
    /// 0 not initialised, -1 initialising (inside `initialize`), 1 done.
    pub(crate) init: i32,
    /// 0 running, -1 finalizing (the tools' `finalize` run), 1 finalized (see [`finalize_sdk`]).
    pub(crate) fini: i32,
    pub(crate) contexts: Vec<Context>,
    pub(crate) buffers: Vec<Buffer>,
    /// Every registered tool's `finalize` and its data, in registration order.
    pub(crate) finalize: Vec<(sys::FinalizeFn, usize)>,
    /// The SDK's own `atexit` handler is registered (once, after the first tool initialised).
    pub(crate) atexit_registered: bool,
    pub(crate) client_name: Option<String>,
    pub(crate) configure_calls: u64,
    pub(crate) async_seen: u64,
    pub(crate) other_tool_ready: bool,
    /// The other tool's context, once made.
    pub(crate) other_tool_context: Option<usize>,
}

pub(crate) static STATE: Mutex<State> = Mutex::new(State {
    init: 0,
    fini: 0,
    contexts: Vec::new(),
    buffers: Vec::new(),
    finalize: Vec::new(),
    atexit_registered: false,
    client_name: None,
    configure_calls: 0,
    async_seen: 0,
    other_tool_ready: false,
    other_tool_context: None,
});

pub(crate) fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) static NEXT_CORRELATION: AtomicU64 = AtomicU64::new(1);
pub(crate) static DELIVERED: AtomicU64 = AtomicU64::new(0);
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);
pub(crate) static OTHER_TOOL_RECORDS: AtomicU64 = AtomicU64::new(0);
pub(crate) static CALLBACKS: AtomicU64 = AtomicU64::new(0);

/// A one-shot start for the next GPU record (0: none), set by `fake_rocp_next_gpu_start`.
pub(crate) static NEXT_GPU_START: AtomicU64 = AtomicU64::new(0);

/// When the next GPU record starts: the time a test set for it, else 1 µs from now.
pub(crate) fn gpu_start() -> u64 {
    match NEXT_GPU_START.swap(0, std::sync::atomic::Ordering::Relaxed) {
        0 => boottime_ns() + 1_000,
        t => t,
    }
}

pub(crate) fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_BOOTTIME exists on every Linux this runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// Handles are index + 1 (0 is "not created" for contexts).
pub(crate) fn index(handle: u64) -> Option<usize> {
    handle.checked_sub(1).map(|i| i as usize)
}

/// The other tool's buffer callback: counts what it gets.
pub(crate) unsafe extern "C" fn other_tool_buffer(
    _c: ContextId,
    _b: BufferId,
    _h: *mut *mut RecordHeader,
    n: usize,
    _d: *mut c_void,
    _drops: u64,
) {
    OTHER_TOOL_RECORDS.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn ensure_other_tool(s: &mut State) {
    if !faults().other_tool || s.other_tool_ready {
        return;
    }
    s.other_tool_ready = true;
    let ctx = s.contexts.len();
    s.other_tool_context = Some(ctx);
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
        in_flight: Vec::new(),
    });
    s.contexts[ctx]
        .buffer_services
        .push((buffer_kind("KERNEL_DISPATCH"), buf));
}

// ---- record delivery --------------------------------------------------------------------------

pub(crate) fn words_of<T: Copy>(value: &T, size: usize) -> Box<[u64]> {
    let mut words = vec![0u64; size.div_ceil(8)].into_boxed_slice();
    debug_assert!(std::mem::size_of::<T>() <= words.len() * 8);
    // SAFETY: `words` holds at least size_of::<T>() bytes and is 8-aligned, enough for every
    // record type (their alignment is 8).
    unsafe { std::ptr::write(words.as_mut_ptr() as *mut T, *value) };
    words
}

/// Takes what buffer `b` holds and hands it to its callback, outside the lock.
pub(crate) fn deliver(b: usize) {
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
pub(crate) fn emit_async(kind_name: &str, words: impl Fn() -> Box<[u64]>) {
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
        let other_tool = s.other_tool_context;
        for b in targets {
            let record = words();
            let len = record.len() * 8;
            let buf = &mut s.buffers[b];
            if faults().complete_at_stop && Some(buf.context) != other_tool {
                // Still running on the GPU: its record is written when the context stops.
                buf.in_flight.push((kind as u32, record));
                continue;
            }
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

/// Context `ctx` stops: the work still in flight on it completes first, its records written into
/// the context's buffers (handed over at their watermark or the next flush, as any record).
pub(crate) fn complete_in_flight(s: &mut State, ctx: usize) {
    for buf in s.buffers.iter_mut().filter(|b| b.context == ctx) {
        for (kind, record) in std::mem::take(&mut buf.in_flight) {
            buf.bytes += record.len() * 8;
            buf.records.push((kind, record));
        }
    }
}

/// Callback services of active contexts for callback kind `kind_name`: (context, callback, data).
pub(crate) fn callback_targets(kind_name: &str) -> Vec<(usize, usize, usize)> {
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
pub(crate) fn invoke(
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

/// A HIP API callback payload, `rocprofiler_callback_tracing_hip_api_data_t`, as the SDK writes
/// it: `size` (120), then the call's member of the `args` union (`sys::hip_args`), then the
/// return value.
pub(crate) struct HipPayload {
    words: [u64; sys::hip_args::HIP_API_DATA_SIZE / 8],
}

impl HipPayload {
    /// The payload of a call whose arguments are `args` (one of the `sys::hip_args` structs).
    pub(crate) fn of<T: Copy>(args: &T) -> HipPayload {
        let mut p = HipPayload::empty();
        assert!(
            sys::hip_args::HIP_API_ARGS_OFFSET + std::mem::size_of::<T>()
                <= sys::hip_args::HIP_API_DATA_SIZE
        );
        // SAFETY: `T` fits after the offset (checked); the words are 8-aligned, as `T` needs.
        unsafe {
            std::ptr::write(
                (p.words.as_mut_ptr() as *mut u8).add(sys::hip_args::HIP_API_ARGS_OFFSET) as *mut T,
                *args,
            )
        };
        p
    }

    /// The payload of a call with no argument the fake models.
    pub(crate) fn empty() -> HipPayload {
        let mut words = [0u64; sys::hip_args::HIP_API_DATA_SIZE / 8];
        words[0] = sys::hip_args::HIP_API_DATA_SIZE as u64;
        HipPayload { words }
    }

    fn ptr(&mut self) -> *mut c_void {
        self.words.as_mut_ptr() as *mut c_void
    }
}

/// One HIP call on the calling thread: ENTER, the call's asynchronous work, EXIT, each callback
/// given `payload`. Returns its correlation id.
pub(crate) fn hip_call(name: &str, mut payload: HipPayload, work: impl FnOnce(u64)) -> u64 {
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
            payload.ptr(),
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
            payload.ptr(),
            u,
        );
    }
    correlation
}

// ---- the machine's agents ----------------------------------------------------------------------

pub(crate) const CPU_AGENT: u64 = 0x100;
/// GPU agent handles: GPU i is `0x200 + 0x100 * i`.
pub(crate) const GPU_AGENT_BASE: u64 = 0x200;

pub(crate) fn gpu_agent(i: u32) -> AgentId {
    AgentId {
        handle: GPU_AGENT_BASE + 0x100 * u64::from(i),
    }
}

pub(crate) fn agents() -> Vec<v1::Agent1_1> {
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

// ---- finalization -------------------------------------------------------------------------------

/// The SDK finalizes (its `atexit` handler, or `fake_rocp_finalize`), once: every active context
/// is stopped (work in flight completes into its buffers), then each tool's `finalize` runs while
/// the SDK is finalizing (a flush then still hands records over), then the SDK is finalized: from
/// then on `rocprofiler_flush_buffer` answers FINALIZED and `rocprofiler_start_context`
/// CONFIGURATION_LOCKED, and what a buffer still holds is never delivered (the SDK does not flush
/// by itself, research §8.6).
pub(crate) fn finalize_sdk() {
    let tools = {
        let mut s = state();
        if s.fini != 0 {
            return;
        }
        s.fini = -1;
        for i in 0..s.contexts.len() {
            if std::mem::take(&mut s.contexts[i].active) {
                complete_in_flight(&mut s, i);
            }
        }
        std::mem::take(&mut s.finalize)
    };
    for (f, data) in tools {
        // SAFETY: a tool's finalize with its own data, as the SDK calls it.
        unsafe { f(data as *mut c_void) };
    }
    state().fini = 1;
}

extern "C" fn finalize_at_exit() {
    finalize_sdk();
}

/// Registers the SDK's `atexit` handler once, when a tool with a `finalize` has been initialised
/// (as the real SDK does right after the tools' `initialize`: a handler a tool registered inside
/// its `initialize` runs after this one).
pub(crate) fn register_atexit() {
    let register = {
        let mut s = state();
        let due = !s.atexit_registered && !s.finalize.is_empty();
        s.atexit_registered |= due;
        due
    };
    if register {
        // SAFETY: a plain `extern "C"` function of this library that never unwinds; glibc runs it
        // at exit, or when this library is unloaded.
        unsafe { libc::atexit(finalize_at_exit) };
    }
}

/// Whether the SDK has finalized (not while finalizing).
pub(crate) fn finalized() -> bool {
    state().fini > 0
}
