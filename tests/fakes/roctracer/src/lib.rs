/*!
A fake `libroctracer64` (roctracer 4.1) for tests (never shipped). It implements the part of the C
ABI kinetrace uses (`kinetrace-roctracer-sys`'s function table): the version, pools
(`roctracer_open_pool_expl` with the tool's buffer callback), HIP API domain callbacks at ENTER and
EXIT with `hip_api_data_t` (`correlation_id` @0, `phase` @8, the arguments union from @16), HIP_OPS
activity into a pool, flushing, `roctracer_next_record`, `roctracer_op_string`,
`roctracer_get_timestamp` (`CLOCK_BOOTTIME`, as the HSA clock) and `roctracer_start`/`stop`.

Records are the **real 64-byte `roctracer_record_t`** (`kinetrace_roctracer_sys::Record`, offsets
asserted there against the research's table): written from the front of the pool's half-buffer,
with the kernel name copied to the back of the same half and `kernel_name` pointing at it, so the
name is valid only during the buffer callback, as in roctracer's `memory_pool.h`. A half is handed
to the callback when the next record does not fit and at `roctracer_flush_activity_expl`; the real
library does that on its own consumer thread, the fake on the calling thread (the callback must
not care).

Workloads are driven by the test through `fake_roct_*` entry points that behave like HIP calls on
the calling thread: the HIP API callback at ENTER, the call's GPU operation appended to the pool
(stamped with the call's correlation id, its device's KFD node id and its stream's queue index),
then the callback at EXIT. HIP API ids are the real `HIP_API_ID_*` values for the launch, copy,
allocation, memset and synchronisation calls, the fake's own otherwise.

Fault injection (environment, read once):
- `FAKE_ROCT_FAIL=roctracer_open_pool_expl,...` — those entry points fail with -1 (ERROR).
- `FAKE_ROCT_VERSION=M.m` — the version reported (default `4.1`).
*/
#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use kinetrace_roctracer_sys::{
    self as sys, ApiCallback, BufferCallback, Properties, Record, Status,
};

const ERROR: Status = -1;
const INVALID_DOMAIN: Status = -2;
const INVALID_ARGUMENT: Status = -3;

/// The HIP API calls the fake knows: (`HIP_API_ID_*`, name).
const HIP_API: &[(u32, &CStr)] = &[
    (48, c"hipDeviceSynchronize"),
    (62, c"hipExtLaunchKernel"),
    (69, c"hipFree"),
    (91, c"hipGetDevice"),
    (107, c"hipLaunchKernel"),
    (108, c"hipMalloc"),
    (125, c"hipMemcpy"),
    (134, c"hipMemcpyAsync"),
    (153, c"hipMemcpyWithStream"),
    (154, c"hipMemset"),
    (159, c"hipMemsetAsync"),
    (169, c"hipModuleLaunchKernel"),
    (199, c"hipStreamSynchronize"),
    (215, c"hipGraphLaunch"),
];

/// ROCclr command kinds and `hipGetCmdName`'s names (research §1.4).
const COMMANDS: &[(u32, &CStr)] = &[
    (0x11F0, c"KernelExecution"),
    (0x11F3, c"CopyDeviceToHost"),
    (0x11F4, c"CopyHostToDevice"),
    (0x11F5, c"CopyDeviceToDevice"),
    (0x11FE, c"Marker"),
    (0x1207, c"FillBuffer"),
];

struct Faults {
    fail: Vec<String>,
    version: (u32, u32),
}

fn faults() -> &'static Faults {
    static F: OnceLock<Faults> = OnceLock::new();
    F.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let version = var("FAKE_ROCT_VERSION")
            .and_then(|v| {
                let (a, b) = v.split_once('.')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .unwrap_or((4, 1));
        Faults {
            fail: var("FAKE_ROCT_FAIL")
                .map(|v| v.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
            version,
        }
    })
}

fn fails(symbol: &str) -> bool {
    faults().fail.iter().any(|f| f == symbol || f == "*")
}

/// One pool: the tool's properties and the half-buffer being filled (as words, 8-aligned).
struct Pool {
    callback: Option<BufferCallback>,
    arg: usize,
    half: Vec<u64>,
    /// Bytes of records written from the front.
    front: usize,
    /// Where the names written from the back start.
    back: usize,
}

impl Pool {
    fn fresh(bytes: usize) -> Vec<u64> {
        vec![0u64; bytes.div_ceil(8).max(16)]
    }
}

#[derive(Default)]
struct State {
    api: Option<(ApiCallback, usize)>,
    disabled_ops: Vec<u32>,
    activity_pool: Option<usize>,
    pools: Vec<Option<Pool>>,
    stopped: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    api: None,
    disabled_ops: Vec::new(),
    activity_pool: None,
    pools: Vec::new(),
    stopped: false,
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

static NEXT_CORRELATION: AtomicU64 = AtomicU64::new(1);
static DELIVERED: AtomicU64 = AtomicU64::new(0);
static CALLBACKS: AtomicU64 = AtomicU64::new(0);
static BUFFERS: AtomicU64 = AtomicU64::new(0);

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_BOOTTIME exists on every Linux this runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pool_index(pool: *mut c_void) -> Option<usize> {
    (pool as usize).checked_sub(1)
}

// ---- the C ABI ---------------------------------------------------------------------------------

/// `roctracer_version_major`.
#[no_mangle]
pub extern "C" fn roctracer_version_major() -> u32 {
    faults().version.0
}

/// `roctracer_version_minor`.
#[no_mangle]
pub extern "C" fn roctracer_version_minor() -> u32 {
    faults().version.1
}

/// `roctracer_error_string`: the last error (the fake has one message).
#[no_mangle]
pub extern "C" fn roctracer_error_string() -> *const c_char {
    c"fake roctracer: injected failure".as_ptr()
}

/// `roctracer_open_pool_expl`: a pool whose halves are `buffer_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn roctracer_open_pool_expl(
    props: *const Properties,
    out: *mut *mut c_void,
) -> Status {
    if fails("roctracer_open_pool_expl") {
        return ERROR;
    }
    if props.is_null() || out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller's properties, checked non-null.
    let p = unsafe { &*props };
    let bytes = p.buffer_size.max(2 * std::mem::size_of::<Record>());
    let mut s = state();
    s.pools.push(Some(Pool {
        callback: p.buffer_callback_fun,
        arg: p.buffer_callback_arg as usize,
        half: Pool::fresh(bytes),
        front: 0,
        back: bytes.div_ceil(8).max(16) * 8,
    }));
    // SAFETY: the caller's out-pointer, checked non-null.
    unsafe { *out = s.pools.len() as *mut c_void };
    sys::STATUS_SUCCESS
}

/// `roctracer_close_pool_expl`.
#[no_mangle]
pub unsafe extern "C" fn roctracer_close_pool_expl(pool: *mut c_void) -> Status {
    let mut s = state();
    match pool_index(pool).and_then(|i| s.pools.get_mut(i)) {
        Some(p) => {
            *p = None;
            sys::STATUS_SUCCESS
        }
        None => INVALID_ARGUMENT,
    }
}

/// `roctracer_enable_domain_callback`: HIP API only.
#[no_mangle]
pub unsafe extern "C" fn roctracer_enable_domain_callback(
    domain: u32,
    callback: ApiCallback,
    arg: *mut c_void,
) -> Status {
    if fails("roctracer_enable_domain_callback") {
        return ERROR;
    }
    if domain != sys::DOMAIN_HIP_API {
        return INVALID_DOMAIN;
    }
    state().api = Some((callback, arg as usize));
    sys::STATUS_SUCCESS
}

/// `roctracer_disable_domain_callback`.
#[no_mangle]
pub unsafe extern "C" fn roctracer_disable_domain_callback(domain: u32) -> Status {
    if domain != sys::DOMAIN_HIP_API {
        return INVALID_DOMAIN;
    }
    let mut s = state();
    s.api = None;
    s.disabled_ops.clear();
    sys::STATUS_SUCCESS
}

/// `roctracer_enable_op_callback`: one op of the HIP API (re-enables one disabled before).
#[no_mangle]
pub unsafe extern "C" fn roctracer_enable_op_callback(
    domain: u32,
    op: u32,
    callback: ApiCallback,
    arg: *mut c_void,
) -> Status {
    if domain != sys::DOMAIN_HIP_API {
        return INVALID_DOMAIN;
    }
    let mut s = state();
    s.disabled_ops.retain(|o| *o != op);
    s.api.get_or_insert((callback, arg as usize));
    sys::STATUS_SUCCESS
}

/// `roctracer_disable_op_callback`: that op's calls no longer call back.
#[no_mangle]
pub unsafe extern "C" fn roctracer_disable_op_callback(domain: u32, op: u32) -> Status {
    if domain != sys::DOMAIN_HIP_API {
        return INVALID_DOMAIN;
    }
    state().disabled_ops.push(op);
    sys::STATUS_SUCCESS
}

/// `roctracer_enable_domain_activity_expl`: HIP_OPS records into `pool`.
#[no_mangle]
pub unsafe extern "C" fn roctracer_enable_domain_activity_expl(
    domain: u32,
    pool: *mut c_void,
) -> Status {
    if fails("roctracer_enable_domain_activity_expl") {
        return ERROR;
    }
    if domain != sys::DOMAIN_HIP_OPS {
        return INVALID_DOMAIN;
    }
    let mut s = state();
    match pool_index(pool).filter(|i| s.pools.get(*i).is_some_and(Option::is_some)) {
        Some(i) => {
            s.activity_pool = Some(i);
            sys::STATUS_SUCCESS
        }
        None => INVALID_ARGUMENT,
    }
}

/// `roctracer_disable_domain_activity`.
#[no_mangle]
pub unsafe extern "C" fn roctracer_disable_domain_activity(domain: u32) -> Status {
    if domain != sys::DOMAIN_HIP_OPS {
        return INVALID_DOMAIN;
    }
    state().activity_pool = None;
    sys::STATUS_SUCCESS
}

/// `roctracer_flush_activity_expl`: hands the half being filled to the callback and returns once it
/// has returned.
#[no_mangle]
pub unsafe extern "C" fn roctracer_flush_activity_expl(pool: *mut c_void) -> Status {
    if fails("roctracer_flush_activity_expl") {
        return ERROR;
    }
    match pool_index(pool) {
        Some(i) if state().pools.get(i).is_some_and(Option::is_some) => {
            deliver(i);
            sys::STATUS_SUCCESS
        }
        _ => INVALID_ARGUMENT,
    }
}

/// `roctracer_next_record`: records have a fixed 64-byte stride.
#[no_mangle]
pub unsafe extern "C" fn roctracer_next_record(
    record: *const Record,
    next: *mut *const Record,
) -> Status {
    if record.is_null() || next.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller's out-pointer; the next record's address (not dereferenced here).
    unsafe { *next = record.wrapping_add(1) };
    sys::STATUS_SUCCESS
}

/// `roctracer_op_string`: HIP API names by id; for HIP_OPS `hipGetCmdName(kind)`. Null for
/// anything else.
#[no_mangle]
pub extern "C" fn roctracer_op_string(domain: u32, op: u32, kind: u32) -> *const c_char {
    let table: &[(u32, &CStr)] = match domain {
        sys::DOMAIN_HIP_API => HIP_API,
        sys::DOMAIN_HIP_OPS => COMMANDS,
        _ => return std::ptr::null(),
    };
    let key = if domain == sys::DOMAIN_HIP_OPS {
        kind
    } else {
        op
    };
    table
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(std::ptr::null(), |(_, n)| n.as_ptr())
}

/// `roctracer_get_timestamp`: `CLOCK_BOOTTIME` ns, the HSA system clock's domain.
#[no_mangle]
pub unsafe extern "C" fn roctracer_get_timestamp(out: *mut u64) -> Status {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller's out-pointer, checked non-null.
    unsafe { *out = boottime_ns() };
    sys::STATUS_SUCCESS
}

/// `roctracer_start`: resumes callbacks and activity.
#[no_mangle]
pub extern "C" fn roctracer_start() {
    state().stopped = false;
}

/// `roctracer_stop`: pauses callbacks and activity.
#[no_mangle]
pub extern "C" fn roctracer_stop() {
    state().stopped = true;
}

/// `roctracer_set_properties`: a no-op for the HIP domains in 4.1.
#[no_mangle]
pub extern "C" fn roctracer_set_properties(_domain: u32, _props: *mut c_void) -> Status {
    sys::STATUS_SUCCESS
}

// ---- the pool ----------------------------------------------------------------------------------

/// Hands pool `i`'s half to its callback (outside the lock) and starts a fresh one.
fn deliver(i: usize) {
    let (callback, arg, half, front) = {
        let mut s = state();
        let Some(Some(p)) = s.pools.get_mut(i) else {
            return;
        };
        if p.front == 0 {
            return;
        }
        let bytes = p.half.len() * 8;
        let half = std::mem::replace(&mut p.half, Pool::fresh(bytes));
        let front = std::mem::take(&mut p.front);
        p.back = bytes;
        (p.callback, p.arg, half, front)
    };
    DELIVERED.fetch_add(
        (front / std::mem::size_of::<Record>()) as u64,
        Ordering::Relaxed,
    );
    BUFFERS.fetch_add(1, Ordering::Relaxed);
    if let Some(cb) = callback {
        let begin = half.as_ptr() as *const c_char;
        // SAFETY: the callback's signature; `begin..begin + front` holds whole records, and the
        // names they point at lie in the same half, alive until the callback returns.
        unsafe { cb(begin, begin.add(front), arg as *mut c_void) };
    }
}

/// What a GPU operation's last record word holds.
enum Tail<'a> {
    Name(&'a [u8]),
    Bytes(u64),
}

/// Appends one HIP_OPS record to the activity pool, if one is enabled and tracing is not stopped.
fn emit_op(op: u32, kind: u32, correlation: u64, device: i32, queue: u64, dur_ns: u64, tail: Tail) {
    let record_bytes = std::mem::size_of::<Record>();
    let name_len = match tail {
        Tail::Name(n) => n.len() + 1,
        Tail::Bytes(_) => 0,
    };
    let index = {
        let s = state();
        match s.activity_pool {
            Some(i) if !s.stopped => i,
            _ => return,
        }
    };
    // Full: hand the half over first (the real library switches halves and wakes its consumer).
    let full = {
        let s = state();
        matches!(s.pools.get(index), Some(Some(p)) if p.front + record_bytes + name_len.next_multiple_of(8) > p.back)
    };
    if full {
        deliver(index);
    }
    let mut s = state();
    let Some(Some(p)) = s.pools.get_mut(index) else {
        return;
    };
    if p.front + record_bytes + name_len.next_multiple_of(8) > p.back {
        // One record larger than a half: dropped, as roctracer cannot place it.
        return;
    }
    let base = p.half.as_mut_ptr() as *mut u8;
    let c = match tail {
        Tail::Name(n) => {
            p.back -= name_len.next_multiple_of(8);
            // SAFETY: `back..back + name_len` lies inside the half (checked above), past every
            // record written from the front.
            unsafe {
                std::ptr::copy_nonoverlapping(n.as_ptr(), base.add(p.back), n.len());
                *base.add(p.back + n.len()) = 0;
                base.add(p.back) as u64
            }
        }
        Tail::Bytes(b) => b,
    };
    let start = boottime_ns() + 1_000;
    let record = Record {
        domain: sys::DOMAIN_HIP_OPS,
        kind,
        op,
        _pad: 0,
        correlation_id: correlation,
        begin_ns: start,
        end_ns: start + dur_ns,
        b: [device as u32, 0],
        queue_id: queue,
        c,
    };
    // SAFETY: `front..front + 64` lies inside the half (checked above) and is 8-aligned.
    unsafe { std::ptr::write(base.add(p.front) as *mut Record, record) };
    p.front += record_bytes;
}

/// One HIP call on the calling thread: ENTER, its GPU work, EXIT. Returns its correlation id.
fn hip_call(id: u32, work: impl FnOnce(u64)) -> u64 {
    hip_call_with(id, &[], work)
}

/// [`hip_call`] whose `hip_api_data_t.args` starts with `args` (the words of the call's argument
/// struct in `hip_prof_str.h`'s layout).
fn hip_call_with(id: u32, args: &[u64], work: impl FnOnce(u64)) -> u64 {
    let correlation = NEXT_CORRELATION.fetch_add(1, Ordering::Relaxed);
    let api = {
        let s = state();
        s.api
            .filter(|_| !s.stopped && !s.disabled_ops.contains(&id))
    };
    // `hip_api_data_t`: correlation_id @0, phase @8, the args union from @16.
    let mut data = [0u64; 16];
    data[0] = correlation;
    data[2..2 + args.len().min(14)].copy_from_slice(&args[..args.len().min(14)]);
    let mut call = |phase: u32| {
        if let Some((cb, arg)) = api {
            data[1] = u64::from(phase);
            CALLBACKS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the callback's signature; `data` outlives the call.
            unsafe {
                cb(
                    sys::DOMAIN_HIP_API,
                    id,
                    data.as_ptr() as *const c_void,
                    arg as *mut c_void,
                )
            };
        }
    };
    call(sys::PHASE_ENTER);
    work(correlation);
    call(sys::PHASE_EXIT);
    correlation
}

fn id_of(name: &str) -> u32 {
    HIP_API
        .iter()
        .find(|(_, n)| n.to_bytes() == name.as_bytes())
        .map_or(9_999, |(id, _)| *id)
}

/// The host address of a kernel's function (what `hipLaunchKernel` receives): one per name.
pub fn function_address(name: &[u8]) -> u64 {
    // FNV-1a: distinct, stable addresses for the few names a test uses.
    let h = name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    0x7e00_0000_0000 | (h & 0xffff_fff0)
}

/// The `hipStream_t` whose HSA queue is `queue` (queue 0: the null stream).
pub fn stream_of(queue: u64) -> u64 {
    if queue == 0 {
        0
    } else {
        0x5a5a_0000 + queue
    }
}

// ---- the test's side ---------------------------------------------------------------------------

/// `hipLaunchKernel` of kernel `name` (mangled, NUL-terminated) on the device with KFD node id
/// `device`, stream queue `queue`, running `dur_ns`. Returns the correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_roct_launch_kernel(
    name: *const c_char,
    device: i32,
    queue: u64,
    dur_ns: u64,
) -> u64 {
    let name = if name.is_null() {
        &[][..]
    } else {
        // SAFETY: the test passes a NUL-terminated string.
        unsafe { CStr::from_ptr(name) }.to_bytes()
    };
    // `args.hipLaunchKernel` (with `args__val`): the function's host address (from its name),
    // 16 blocks of 256, no dynamic LDS, the stream of `queue` (0: the null stream).
    let pair = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    let args = [
        function_address(name),
        pair(16, 1),
        pair(1, 256),
        pair(1, 1),
        0x7ffc_0000_0100,
        0,
        0,
        stream_of(queue),
    ];
    hip_call_with(id_of("hipLaunchKernel"), &args, |corr| {
        emit_op(
            sys::HIP_OP_DISPATCH,
            0x11F0,
            corr,
            device,
            queue,
            dur_ns,
            Tail::Name(name),
        )
    })
}

/// `hipMemcpyAsync` of `bytes` with ROCclr command `kind` (`0x11F3` DtoH, `0x11F4` HtoD, `0x11F5`
/// DtoD). Returns the correlation id.
#[no_mangle]
pub extern "C" fn fake_roct_memcpy(bytes: u64, kind: u32, device: i32, queue: u64) -> u64 {
    // `args.hipMemcpyAsync`: dst, src, sizeBytes, hipMemcpyKind (HtoH 0, HtoD 1, DtoH 2, DtoD
    // 3), stream.
    let (host, dev) = (0x5567_4ecd_4180u64, 0x7fda_0e81_0200u64);
    let (src, dst, hip_kind) = match kind {
        0x11F3 => (dev, host, 2),
        0x11F4 => (host, dev, 1),
        _ => (dev, dev + 0x1000, 3),
    };
    let args = [dst, src, bytes, hip_kind, stream_of(queue)];
    hip_call_with(id_of("hipMemcpyAsync"), &args, |corr| {
        emit_op(
            sys::HIP_OP_COPY,
            kind,
            corr,
            device,
            queue,
            2_000,
            Tail::Bytes(bytes),
        )
    })
}

/// `hipMemsetAsync` of `bytes` (a FILL_BUFFER copy operation). Returns the correlation id.
#[no_mangle]
pub extern "C" fn fake_roct_memset(bytes: u64, device: i32, queue: u64) -> u64 {
    hip_call(id_of("hipMemsetAsync"), |corr| {
        emit_op(
            sys::HIP_OP_COPY,
            sys::KIND_FILL_BUFFER,
            corr,
            device,
            queue,
            1_000,
            Tail::Bytes(bytes),
        )
    })
}

/// `hipStreamSynchronize`, which enqueues a marker (a BARRIER record). Returns the correlation id.
#[no_mangle]
pub extern "C" fn fake_roct_barrier(device: i32, queue: u64) -> u64 {
    hip_call(id_of("hipStreamSynchronize"), |corr| {
        emit_op(
            sys::HIP_OP_BARRIER,
            0x11FE,
            corr,
            device,
            queue,
            100,
            Tail::Bytes(0),
        )
    })
}

/// A HIP call with no GPU work (`hipDeviceSynchronize`, `hipGetDevice`...). Returns its
/// correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_roct_api(name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: the test passes a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    hip_call(id_of(&name), |_| {})
}

/// Counters for tests.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeStats {
    /// Records handed to buffer callbacks.
    pub records_delivered: u64,
    /// Half-buffers handed over.
    pub buffers_delivered: u64,
    /// HIP API callbacks made.
    pub callbacks: u64,
    /// 1 while a HIP API callback is enabled.
    pub api_enabled: u32,
    /// 1 while HIP_OPS activity goes to a pool.
    pub activity_enabled: u32,
    /// Pools open.
    pub pools: u32,
}

/// Fills `out` with the counters.
#[no_mangle]
pub unsafe extern "C" fn fake_roct_stats(out: *mut FakeStats) {
    if out.is_null() {
        return;
    }
    let s = state();
    let stats = FakeStats {
        records_delivered: DELIVERED.load(Ordering::Relaxed),
        buffers_delivered: BUFFERS.load(Ordering::Relaxed),
        callbacks: CALLBACKS.load(Ordering::Relaxed),
        api_enabled: u32::from(s.api.is_some()),
        activity_enabled: u32::from(s.activity_pool.is_some()),
        pools: s.pools.iter().filter(|p| p.is_some()).count() as u32,
    };
    // SAFETY: the caller's out-pointer, checked non-null.
    unsafe { *out = stats };
}
