//! Everything that touches the SDK's C ABI: checked wrappers over the function table (each failure
//! an [`SdkError`] naming the call and the SDK's own status text), the process-wide tool state the
//! SDK's callbacks reach, and the `extern "C"` trampolines the SDK calls. This is the only module
//! of the crate with `unsafe`.
//!
//! Every trampoline catches panics. The hot ones (the buffer callback and the HIP API callback)
//! allocate nothing and take no lock: they copy into the lock-free [`Queue`] and the
//! [`ExternalIds`] table. The code-object callback (once per kernel symbol, at module load) takes a
//! mutex to remember the kernel's name.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use kinetrace_core::recorder;
use kinetrace_rocprofiler_sdk_sys::{
    self as sys, v0, v1, Abi, AgentPrefix, BufferId, ContextId, KernelDispatchRecord,
    KernelSymbolRegisterData, LoadError, RecordHeader, RocprofilerSdk, Status, ToolConfigureResult,
    UserData,
};

use crate::external::ExternalIds;
use crate::queue::Queue;
use crate::record::Raw;

/// Opens the library at `path` and resolves the table.
pub(crate) fn load(path: &Path) -> Result<RocprofilerSdk, LoadError> {
    // SAFETY: `path` is a rocprofiler-sdk candidate from the search (or named by the user); its
    // initialisers are the vendor's, and the symbols are cast to the SDK's documented signatures.
    unsafe { RocprofilerSdk::load(path) }
}

/// An SDK call that did not answer SUCCESS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdkError {
    /// The entry point.
    pub call: &'static str,
    /// Its status.
    pub status: Status,
    /// The SDK's text for it (`rocprofiler_get_status_string`), if it has one.
    pub text: Option<String>,
}

impl fmt::Display for SdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with status {}", self.call, self.status)?;
        if let Some(t) = &self.text {
            write!(f, " ({t})")?;
        }
        Ok(())
    }
}

impl std::error::Error for SdkError {}

fn check(sdk: &RocprofilerSdk, call: &'static str, status: Status) -> Result<(), SdkError> {
    if status == sys::STATUS_SUCCESS {
        return Ok(());
    }
    let text = sdk.rocprofiler_get_status_string.and_then(|f| {
        // SAFETY: takes a status by value, returns a static string or null.
        let p = unsafe { f(status) };
        // SAFETY: non-null results are NUL-terminated strings the SDK keeps.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    });
    Err(SdkError { call, status, text })
}

/// `rocprofiler_get_version`.
pub(crate) fn get_version(sdk: &RocprofilerSdk) -> Result<(u32, u32, u32), SdkError> {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    let s = unsafe { (sdk.rocprofiler_get_version)(&mut a, &mut b, &mut c) };
    check(sdk, "rocprofiler_get_version", s).map(|()| (a, b, c))
}

/// `rocprofiler_get_timestamp` (CLOCK_BOOTTIME ns).
pub(crate) fn timestamp(sdk: &RocprofilerSdk) -> Result<u64, SdkError> {
    let mut t = 0;
    // SAFETY: a valid out-pointer.
    let s = unsafe { (sdk.rocprofiler_get_timestamp)(&mut t) };
    check(sdk, "rocprofiler_get_timestamp", s).map(|()| t)
}

/// `rocprofiler_get_timestamp` for the callbacks: 0 on failure, nothing allocated.
fn now(sdk: &RocprofilerSdk) -> u64 {
    let mut t = 0;
    // SAFETY: a valid out-pointer.
    let s = unsafe { (sdk.rocprofiler_get_timestamp)(&mut t) };
    if s == sys::STATUS_SUCCESS {
        t
    } else {
        0
    }
}

/// `rocprofiler_is_initialized`: `None` when the library lacks it.
pub(crate) fn is_initialized(sdk: &RocprofilerSdk) -> Option<i32> {
    let f = sdk.rocprofiler_is_initialized?;
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    let s = unsafe { f(&mut v) };
    (s == sys::STATUS_SUCCESS).then_some(v)
}

/// `rocprofiler_start_context`.
pub(crate) fn start_context(sdk: &RocprofilerSdk, ctx: ContextId) -> Result<(), SdkError> {
    // SAFETY: a context id by value.
    let s = unsafe { (sdk.rocprofiler_start_context)(ctx) };
    check(sdk, "rocprofiler_start_context", s)
}

/// `rocprofiler_stop_context`.
pub(crate) fn stop_context(sdk: &RocprofilerSdk, ctx: ContextId) -> Result<(), SdkError> {
    // SAFETY: a context id by value.
    let s = unsafe { (sdk.rocprofiler_stop_context)(ctx) };
    check(sdk, "rocprofiler_stop_context", s)
}

/// `rocprofiler_flush_buffer`: the buffer callback has run for everything the buffer held when it
/// returns.
pub(crate) fn flush_buffer(sdk: &RocprofilerSdk, buffer: BufferId) -> Result<(), SdkError> {
    // SAFETY: a buffer id by value.
    let s = unsafe { (sdk.rocprofiler_flush_buffer)(buffer) };
    check(sdk, "rocprofiler_flush_buffer", s)
}

// ---- names, by the SDK's query functions ------------------------------------------------------

unsafe extern "C" fn collect_kind(kind: i32, data: *mut c_void) -> i32 {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `data` is the `Vec<i32>` passed by `kinds` below, alive for the call.
        let v = unsafe { &mut *(data as *mut Vec<i32>) };
        v.push(kind);
    }));
    0
}

unsafe extern "C" fn collect_op(_kind: i32, op: i32, data: *mut c_void) -> i32 {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `data` is the `Vec<i32>` passed by `operations` below, alive for the call.
        let v = unsafe { &mut *(data as *mut Vec<i32>) };
        v.push(op);
    }));
    0
}

fn name_of(
    sdk: &RocprofilerSdk,
    call: &'static str,
    query: impl FnOnce(*mut *const c_char, *mut u64) -> Status,
) -> Result<Option<String>, SdkError> {
    let mut p: *const c_char = std::ptr::null();
    let mut len = 0u64;
    let s = query(&mut p, &mut len);
    check(sdk, call, s)?;
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the SDK returns a NUL-terminated static string.
    Ok(Some(
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
    ))
}

/// Which table of kinds: buffer tracing or callback tracing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tracing {
    Buffer,
    Callback,
}

/// Every kind of `t` with its name, as the SDK lists them.
pub(crate) fn kinds(sdk: &RocprofilerSdk, t: Tracing) -> Result<Vec<(i32, String)>, SdkError> {
    let mut ks: Vec<i32> = Vec::new();
    let (call, s) = match t {
        Tracing::Buffer => (
            "rocprofiler_iterate_buffer_tracing_kinds",
            // SAFETY: `collect_kind` matches the iterator's callback; `ks` outlives the call.
            unsafe {
                (sdk.rocprofiler_iterate_buffer_tracing_kinds)(
                    collect_kind,
                    &mut ks as *mut Vec<i32> as *mut c_void,
                )
            },
        ),
        Tracing::Callback => (
            "rocprofiler_iterate_callback_tracing_kinds",
            // SAFETY: as above.
            unsafe {
                (sdk.rocprofiler_iterate_callback_tracing_kinds)(
                    collect_kind,
                    &mut ks as *mut Vec<i32> as *mut c_void,
                )
            },
        ),
    };
    check(sdk, call, s)?;
    let mut out = Vec::new();
    for k in ks {
        let name = match t {
            Tracing::Buffer => {
                name_of(sdk, "rocprofiler_query_buffer_tracing_kind_name", |p, l| {
                    // SAFETY: valid out-pointers.
                    unsafe { (sdk.rocprofiler_query_buffer_tracing_kind_name)(k, p, l) }
                })
            }
            Tracing::Callback => {
                name_of(
                    sdk,
                    "rocprofiler_query_callback_tracing_kind_name",
                    |p, l| {
                        // SAFETY: valid out-pointers.
                        unsafe { (sdk.rocprofiler_query_callback_tracing_kind_name)(k, p, l) }
                    },
                )
            }
        };
        // A kind without a name (NONE on some releases) is not one kinetrace looks for.
        if let Ok(Some(n)) = name {
            out.push((k, n));
        }
    }
    Ok(out)
}

/// Every operation of kind `kind` of `t` with its name.
pub(crate) fn operations(
    sdk: &RocprofilerSdk,
    t: Tracing,
    kind: i32,
) -> Result<Vec<(i32, String)>, SdkError> {
    let mut ops: Vec<i32> = Vec::new();
    let data = &mut ops as *mut Vec<i32> as *mut c_void;
    let (call, s) = match t {
        Tracing::Buffer => (
            "rocprofiler_iterate_buffer_tracing_kind_operations",
            // SAFETY: `collect_op` matches the iterator's callback; `ops` outlives the call.
            unsafe {
                (sdk.rocprofiler_iterate_buffer_tracing_kind_operations)(kind, collect_op, data)
            },
        ),
        Tracing::Callback => (
            "rocprofiler_iterate_callback_tracing_kind_operations",
            // SAFETY: as above.
            unsafe {
                (sdk.rocprofiler_iterate_callback_tracing_kind_operations)(kind, collect_op, data)
            },
        ),
    };
    check(sdk, call, s)?;
    let mut out = Vec::new();
    for op in ops {
        let name = match t {
            Tracing::Buffer => name_of(
                sdk,
                "rocprofiler_query_buffer_tracing_kind_operation_name",
                |p, l| {
                    // SAFETY: valid out-pointers.
                    unsafe {
                        (sdk.rocprofiler_query_buffer_tracing_kind_operation_name)(kind, op, p, l)
                    }
                },
            ),
            Tracing::Callback => name_of(
                sdk,
                "rocprofiler_query_callback_tracing_kind_operation_name",
                |p, l| {
                    // SAFETY: valid out-pointers.
                    unsafe {
                        (sdk.rocprofiler_query_callback_tracing_kind_operation_name)(kind, op, p, l)
                    }
                },
            ),
        }?;
        if let Some(n) = name {
            out.push((op, n));
        }
    }
    Ok(out)
}

/// A GPU or CPU agent, as far as kinetrace reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent {
    /// The handle records carry.
    pub handle: u64,
    /// GPU (else CPU or other).
    pub gpu: bool,
    /// Index among agents of its type: the device number Kineto writes.
    pub logical_type_index: i32,
    /// `gfx90a`.
    pub name: String,
    /// Marketing name.
    pub product_name: String,
    /// Compute units.
    pub cu_count: u32,
    /// Wavefront width.
    pub wave_front_size: u32,
    /// `major * 10000 + minor * 100 + patch`.
    pub gfx_target_version: u32,
    /// Local memory in bytes.
    pub local_mem_size: u64,
    /// Largest work-group (x).
    pub workgroup_max: u32,
}

unsafe extern "C" fn collect_agents(
    _version: i32,
    agents: *mut *const c_void,
    n: usize,
    data: *mut c_void,
) -> Status {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if agents.is_null() || data.is_null() {
            return;
        }
        // SAFETY: `data` is the `Vec<Agent>` passed by `query_agents`, alive for the call.
        let out = unsafe { &mut *(data as *mut Vec<Agent>) };
        for i in 0..n {
            // SAFETY: the SDK passes `n` agent pointers.
            let p = unsafe { *agents.add(i) } as *const AgentPrefix;
            if p.is_null() {
                continue;
            }
            // SAFETY: each points to an agent struct of at least the size asked for, which starts
            // with the prefix (asserted in the sys crate).
            let a = unsafe { &*p };
            let text = |s: *const c_char| {
                if s.is_null() {
                    return String::new();
                }
                // SAFETY: the agent's strings are NUL-terminated and live until finalisation.
                unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
            };
            out.push(Agent {
                handle: a.id.handle,
                gpu: a.agent_type == sys::AGENT_TYPE_GPU,
                logical_type_index: a.logical_node_type_id,
                name: text(a.name),
                product_name: text(a.product_name),
                cu_count: a.cu_count,
                wave_front_size: a.wave_front_size,
                gfx_target_version: a.gfx_target_version,
                local_mem_size: a.local_mem_size,
                workgroup_max: a.workgroup_max_dim.x,
            });
        }
    }));
    sys::STATUS_SUCCESS
}

/// The agents, for SDK 1.`minor` (the struct's size depends on it). `Ok(None)` when the library
/// cannot say (no query entry point, or 0.x whose agent layout kinetrace does not read).
pub(crate) fn query_agents(
    sdk: &RocprofilerSdk,
    abi: Abi,
    minor: u32,
) -> Result<Option<Vec<Agent>>, SdkError> {
    let (Some(f), Abi::V1) = (sdk.rocprofiler_query_available_agents, abi) else {
        return Ok(None);
    };
    let mut out: Vec<Agent> = Vec::new();
    // SAFETY: `collect_agents` matches the callback type; `out` outlives the call; the size is the
    // library's own struct size for its version.
    let s = unsafe {
        f(
            sys::AGENT_INFO_VERSION_0,
            collect_agents,
            v1::agent_size(minor),
            &mut out as *mut Vec<Agent> as *mut c_void,
        )
    };
    check(sdk, "rocprofiler_query_available_agents", s).map(|()| Some(out))
}

// ---- the tool ---------------------------------------------------------------------------------

/// Kind and operation numbers, resolved by name from the loaded library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kinds {
    /// Buffer-tracing `KERNEL_DISPATCH`.
    pub kernel_dispatch: i32,
    /// Buffer-tracing `MEMORY_COPY`.
    pub memory_copy: i32,
    /// Callback-tracing `HIP_RUNTIME_API`.
    pub hip_runtime_api: i32,
    /// Callback-tracing `CODE_OBJECT`.
    pub code_object: i32,
    /// Its `CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER` operation.
    pub kernel_symbol_register: i32,
    /// Buffer-tracing `MEMORY_ALLOCATION` (SDK 1.x only: the 0.x record is unverified).
    pub memory_allocation: Option<i32>,
}

/// What the library calls things, resolved once when the tool is made.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub version: (u32, u32, u32),
    pub origin: crate::loader::Origin,
    pub hip_ops: Vec<(i32, String)>,
    pub copy_ops: Vec<(i32, String)>,
    pub allocation_ops: Vec<(i32, String)>,
}

/// How the tool sets itself up in `initialize`.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub buffer_bytes: usize,
    pub watermark: usize,
    /// HIP API operations to trace (empty: all).
    pub hip_operations: Vec<i32>,
}

/// What `initialize` made, or why it failed.
#[derive(Debug, Default)]
pub(crate) struct Setup {
    pub ran: bool,
    pub main: Option<ContextId>,
    pub utility: Option<ContextId>,
    pub buffer: Option<BufferId>,
    pub error: Option<SdkError>,
    /// Why memory-allocation tracing could not be configured.
    pub allocations_off: Option<SdkError>,
}

/// The process-wide tool: what the SDK's callbacks reach.
pub(crate) struct Tool {
    pub sdk: &'static RocprofilerSdk,
    pub path: PathBuf,
    pub abi: Abi,
    pub kinds: Kinds,
    pub names: Names,
    pub plan: Plan,
    pub queue: Queue,
    pub external: ExternalIds,
    /// `drop_count`s the SDK reported to the buffer callback.
    pub sdk_dropped: AtomicU64,
    /// Buffer records of a kind or size kinetrace does not read.
    pub skipped: AtomicU64,
    /// Our `rocprofiler_configure` ran.
    pub configured: AtomicBool,
    pub kernel_names: Mutex<HashMap<u64, String>>,
    pub setup: Mutex<Setup>,
}

static TOOL: OnceLock<Tool> = OnceLock::new();

/// The tool, once installed.
pub(crate) fn tool() -> Option<&'static Tool> {
    TOOL.get()
}

/// Installs the tool; the one already installed wins (a process registers one tool).
pub(crate) fn install(tool: Tool) -> &'static Tool {
    TOOL.get_or_init(move || tool)
}

/// Outcome of [`register`].
#[derive(Debug)]
pub(crate) enum Registration {
    /// `initialize` ran (its errors, if any, are in `Setup`).
    Done,
    /// The SDK was already initialised without us.
    TooLate,
    /// The library lacks `rocprofiler_force_configure`.
    NoForceConfigure,
    /// `force_configure` failed otherwise.
    Failed(SdkError),
}

/// Registers the tool with `rocprofiler_force_configure` (configure and initialize run inside it).
pub(crate) fn register(tool: &'static Tool) -> Registration {
    if tool.configured.load(Ordering::Acquire) {
        return Registration::Done;
    }
    if is_initialized(tool.sdk) == Some(1) {
        return Registration::TooLate;
    }
    let Some(force) = tool.sdk.rocprofiler_force_configure else {
        return Registration::NoForceConfigure;
    };
    // SAFETY: `configure_tool` has the configure function's signature and never unwinds.
    let s = unsafe { force(configure_tool) };
    if tool.configured.load(Ordering::Acquire) {
        return Registration::Done;
    }
    match check(tool.sdk, "rocprofiler_force_configure", s) {
        Ok(()) => Registration::Failed(SdkError {
            call: "rocprofiler_force_configure",
            status: s,
            text: Some("returned without calling the tool's configure".into()),
        }),
        // Locked and our configure never ran: the SDK was configured before we asked.
        Err(_) if is_initialized(tool.sdk) == Some(1) => Registration::TooLate,
        Err(e) => Registration::Failed(e),
    }
}

static CLIENT_NAME: &CStr = c"kinetrace";

/// Called once kinetrace's tool is initialised after the SDK registered it by itself (through
/// [`tool_configure`]): the moment a ROCm runtime starts, which the preload shim treats as CUDA's
/// `InitializeInjection` (start profiling with the GPU, or add the GPU to a running profiler).
static ON_INITIALIZED: OnceLock<fn()> = OnceLock::new();

/// Registered through [`tool_configure`] rather than by a source's `force_configure`.
static SELF_REGISTERED: AtomicBool = AtomicBool::new(false);

/// Sets the function run when the SDK has registered and initialised kinetrace by itself (see
/// [`tool_configure`]). It runs inside the SDK's call to the tool's `initialize`, where no HIP or
/// HSA call may be made; a `RocmSource` made in it uses the registration. The first one set wins.
pub fn on_tool_initialized(f: fn()) {
    let _ = ON_INITIALIZED.set(f);
}

/// `rocprofiler_configure`, for the library that exports it under that name (the preload shim):
/// the SDK calls it when a ROCm runtime initialises, found through `RTLD_DEFAULT` or
/// `ROCP_TOOL_LIBRARIES`. It makes kinetrace's tool for the calling SDK and returns its
/// `initialize`/`finalize`; a `RocmSource` made later uses that registration.
///
/// # Safety
/// Only the SDK calls it, with the configure function's arguments.
pub unsafe extern "C" fn tool_configure(
    version: u32,
    runtime_version: *const c_char,
    priority: u32,
    client_id: *mut c_void,
) -> *mut ToolConfigureResult {
    // SAFETY: the same contract.
    unsafe { configure_tool(version, runtime_version, priority, client_id) }
}

/// The tool's `rocprofiler_configure`: names the client, returns `initialize` / `finalize`.
unsafe extern "C" fn configure_tool(
    version: u32,
    _runtime_version: *const c_char,
    _priority: u32,
    client_id: *mut c_void,
) -> *mut ToolConfigureResult {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // Called by the SDK itself (a library exporting `rocprofiler_configure`, found when a ROCm
        // runtime initialised): make the tool for it now.
        let tool = match tool() {
            Some(t) => t,
            None => {
                let t = crate::source::install_for_sdk()?;
                SELF_REGISTERED.store(true, Ordering::Release);
                t
            }
        };
        if tool.configured.load(Ordering::Acquire) {
            // Registered once per process.
            return None;
        }
        if !client_id.is_null() {
            // The client id's layout follows the version the SDK passes (§2.2).
            if version / 10_000 == 0 {
                // SAFETY: a 0.x SDK passes a 0.x client id.
                unsafe { (*(client_id as *mut v0::ClientId)).name = CLIENT_NAME.as_ptr() };
            } else {
                // SAFETY: a 1.x SDK passes a 1.x client id.
                unsafe { (*(client_id as *mut v1::ClientId)).name = CLIENT_NAME.as_ptr() };
            }
        }
        tool.configured.store(true, Ordering::Release);
        // Leaked once: the SDK keeps the pointer for the life of the process.
        Some(Box::into_raw(Box::new(ToolConfigureResult {
            size: std::mem::size_of::<ToolConfigureResult>(),
            initialize: Some(initialize_tool),
            finalize: Some(finalize_tool),
            tool_data: std::ptr::null_mut(),
        })))
    }));
    r.ok().flatten().unwrap_or(std::ptr::null_mut())
}

/// The tool's `initialize`: the contexts, buffer and services (only allowed in here). The main
/// context is left stopped: windows start it.
unsafe extern "C" fn initialize_tool(_fini: *const c_void, _data: *mut c_void) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let Some(tool) = tool() else {
            return -1;
        };
        let result = set_up(tool);
        let ok = {
            let mut setup = tool.setup.lock().unwrap_or_else(|e| e.into_inner());
            setup.ran = true;
            match result {
                Ok((main, utility, buffer)) => {
                    setup.main = Some(main);
                    setup.utility = Some(utility);
                    setup.buffer = Some(buffer);
                    true
                }
                Err(e) => {
                    setup.error = Some(e);
                    false
                }
            }
        };
        // A source's own registration needs no news; one the SDK made by itself is the runtime
        // starting (the hook then makes the source, which finds this setup).
        if SELF_REGISTERED.load(Ordering::Acquire) {
            if let Some(f) = ON_INITIALIZED.get() {
                f();
            }
        }
        if ok {
            0
        } else {
            -1
        }
    }));
    r.unwrap_or(-1)
}

fn set_up(tool: &Tool) -> Result<(ContextId, ContextId, BufferId), SdkError> {
    let sdk = tool.sdk;
    let (api_cb, code_cb): (sys::CallbackTracingFn, sys::CallbackTracingFn) = match tool.abi {
        Abi::V0 => (api_callback_v0 as _, code_object_callback_v0 as _),
        Abi::V1 => (api_callback_v1 as _, code_object_callback_v1 as _),
    };
    let create = |call| {
        let mut ctx = ContextId { handle: 0 };
        // SAFETY: a valid out-pointer holding 0, as the SDK requires.
        let s = unsafe { (sdk.rocprofiler_create_context)(&mut ctx) };
        check(sdk, call, s).map(|()| ctx)
    };
    // Kernel names: a utility context, started now and never stopped.
    let utility = create("rocprofiler_create_context")?;
    let op = [tool.kinds.kernel_symbol_register];
    // SAFETY: `code_cb` is this ABI's callback-tracing trampoline; the op array outlives the call.
    let s = unsafe {
        (sdk.rocprofiler_configure_callback_tracing_service)(
            utility,
            tool.kinds.code_object,
            op.as_ptr(),
            op.len(),
            code_cb,
            std::ptr::null_mut(),
        )
    };
    check(sdk, "rocprofiler_configure_callback_tracing_service", s)?;
    start_context(sdk, utility)?;
    // The main context: dispatches and copies into one LOSSLESS buffer, HIP API callbacks.
    let main = create("rocprofiler_create_context")?;
    let mut buffer = BufferId { handle: 0 };
    // SAFETY: `buffer_callback` has the buffer callback's signature; a valid out-pointer.
    let s = unsafe {
        (sdk.rocprofiler_create_buffer)(
            main,
            tool.plan.buffer_bytes,
            tool.plan.watermark,
            sys::BUFFER_POLICY_LOSSLESS,
            buffer_callback,
            std::ptr::null_mut(),
            &mut buffer,
        )
    };
    check(sdk, "rocprofiler_create_buffer", s)?;
    for kind in [tool.kinds.kernel_dispatch, tool.kinds.memory_copy] {
        // SAFETY: ids by value; null/0 operations means all.
        let s = unsafe {
            (sdk.rocprofiler_configure_buffer_tracing_service)(
                main,
                kind,
                std::ptr::null(),
                0,
                buffer,
            )
        };
        check(sdk, "rocprofiler_configure_buffer_tracing_service", s)?;
    }
    if let Some(kind) = tool.kinds.memory_allocation {
        // SAFETY: ids by value; null/0 operations means all.
        let s = unsafe {
            (sdk.rocprofiler_configure_buffer_tracing_service)(
                main,
                kind,
                std::ptr::null(),
                0,
                buffer,
            )
        };
        // Allocations are extra: without them the rest still records (the source says why).
        if let Err(e) = check(sdk, "rocprofiler_configure_buffer_tracing_service", s) {
            tool.setup
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .allocations_off = Some(e);
        }
    }
    let ops = &tool.plan.hip_operations;
    // SAFETY: `api_cb` is this ABI's callback-tracing trampoline; `ops` outlives the call.
    let s = unsafe {
        (sdk.rocprofiler_configure_callback_tracing_service)(
            main,
            tool.kinds.hip_runtime_api,
            if ops.is_empty() {
                std::ptr::null()
            } else {
                ops.as_ptr()
            },
            ops.len(),
            api_cb,
            std::ptr::null_mut(),
        )
    };
    check(sdk, "rocprofiler_configure_callback_tracing_service", s)?;
    Ok((main, utility, buffer))
}

/// The tool's `finalize`: hands over what the buffer still holds (the SDK never flushes by
/// itself, §8.6).
unsafe extern "C" fn finalize_tool(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(tool) = tool() {
            let buffer = tool.setup.try_lock().ok().and_then(|s| s.buffer);
            if let Some(b) = buffer {
                let _ = flush_buffer(tool.sdk, b);
            }
        }
    }));
}

/// The buffer callback: copies each dispatch and copy record into the queue. No lock, no
/// allocation, never blocks (a full queue refuses and counts).
unsafe extern "C" fn buffer_callback(
    _ctx: ContextId,
    _buffer: BufferId,
    headers: *mut *mut RecordHeader,
    n: usize,
    _data: *mut c_void,
    drop_count: u64,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(tool) = tool() else {
            return;
        };
        if drop_count > 0 {
            tool.sdk_dropped.fetch_add(drop_count, Ordering::Relaxed);
        }
        if headers.is_null() {
            return;
        }
        for i in 0..n {
            // SAFETY: the SDK passes `n` header pointers, valid during the callback.
            let h = unsafe { *headers.add(i) };
            if h.is_null() {
                continue;
            }
            // SAFETY: a valid header (above).
            let h = unsafe { &*h };
            match copy_record(tool, h) {
                Some(raw) => {
                    tool.queue.push(&raw.to_words());
                }
                None => {
                    tool.skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }));
}

/// The record behind `h`, if it is a dispatch or a copy whose `size` covers what is read.
fn copy_record(tool: &Tool, h: &RecordHeader) -> Option<Raw> {
    if h.category != sys::BUFFER_CATEGORY_TRACING || h.payload.is_null() {
        return None;
    }
    let kind = h.kind as i32;
    // SAFETY: every tracing record starts with its `size` (u64); the payload is valid during the
    // callback.
    let size = unsafe { *(h.payload as *const u64) } as usize;
    if kind == tool.kinds.kernel_dispatch {
        if size < std::mem::size_of::<KernelDispatchRecord>() {
            return None;
        }
        // SAFETY: a kernel-dispatch record of at least its size (checked), 8-aligned as the SDK
        // allocates it.
        let r = unsafe { &*(h.payload as *const KernelDispatchRecord) };
        Some(Raw::of_dispatch(r))
    } else if kind == tool.kinds.memory_copy {
        // Read as the 0.x record, the prefix of the 1.x one (`Raw::of_copy`).
        if size < std::mem::size_of::<v0::MemoryCopyRecord>() {
            return None;
        }
        // SAFETY: a memory-copy record of at least the 0.x size (checked).
        let r = unsafe { &*(h.payload as *const v0::MemoryCopyRecord) };
        Some(Raw::of_copy(r))
    } else if Some(kind) == tool.kinds.memory_allocation {
        if size < std::mem::size_of::<v1::MemoryAllocationRecord>() {
            return None;
        }
        // SAFETY: a 1.x memory-allocation record of at least its size (checked; the kind is only
        // configured on 1.x).
        let r = unsafe { &*(h.payload as *const v1::MemoryAllocationRecord) };
        Some(Raw::of_allocation(r))
    } else {
        None
    }
}

/// One HIP API callback, ABI-independent: ENTER stamps the time into the call's user data and
/// remembers the enclosing span for the call's GPU records; EXIT queues the call.
fn api_phase(
    kind: u32,
    operation: u32,
    phase: u32,
    correlation: u64,
    thread: u64,
    user: *mut UserData,
) {
    let Some(tool) = tool() else {
        return;
    };
    if kind as i32 != tool.kinds.hip_runtime_api || user.is_null() {
        return;
    }
    let now = now(tool.sdk);
    if phase == sys::PHASE_ENTER {
        // SAFETY: the SDK's per-call user data, valid from ENTER to EXIT of this call.
        unsafe { (*user).value = now };
        // Written even without a span (0 reads as none): the SDK may reuse a retired id, whose
        // slot must not keep the old call's span.
        tool.external
            .set(correlation, recorder::current_external_id().unwrap_or(0));
    } else if phase == sys::PHASE_EXIT {
        // SAFETY: as above.
        let start = unsafe { (*user).value };
        // A call entered before the context started has no start: not recorded.
        if start == 0 {
            return;
        }
        let raw = Raw::Api {
            operation,
            correlation,
            tid: thread as u32,
            start,
            end: now.max(start),
            external: recorder::current_external_id().unwrap_or(0),
        };
        tool.queue.push(&raw.to_words());
    }
}

unsafe extern "C" fn api_callback_v0(
    rec: v0::CallbackRecord,
    user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        api_phase(
            rec.kind,
            rec.operation,
            rec.phase,
            rec.correlation_id.internal,
            rec.thread_id,
            user,
        )
    }));
}

unsafe extern "C" fn api_callback_v1(
    rec: v1::CallbackRecord,
    user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        api_phase(
            rec.kind,
            rec.operation,
            rec.phase,
            rec.correlation_id.internal,
            rec.thread_id,
            user,
        )
    }));
}

/// A kernel symbol was registered: remember `kernel_id → name` (without the `.kd` suffix).
fn code_object_phase(kind: u32, operation: u32, phase: u32, payload: *mut c_void) {
    let Some(tool) = tool() else {
        return;
    };
    if kind as i32 != tool.kinds.code_object
        || operation as i32 != tool.kinds.kernel_symbol_register
        || phase != sys::PHASE_ENTER
        || payload.is_null()
    {
        return;
    }
    // SAFETY: the kernel-symbol payload, valid during the callback; its prefix is stable across
    // ABIs (asserted in the sys crate) and its `size` is checked before the prefix is read.
    let size = unsafe { *(payload as *const u64) } as usize;
    if size < std::mem::offset_of!(KernelSymbolRegisterData, kernel_object) {
        return;
    }
    // SAFETY: as above.
    let data = unsafe { &*(payload as *const KernelSymbolRegisterData) };
    if data.kernel_name.is_null() {
        return;
    }
    // SAFETY: a NUL-terminated string valid during the callback; copied out.
    let name = unsafe { CStr::from_ptr(data.kernel_name) }.to_string_lossy();
    let name = name.strip_suffix(".kd").unwrap_or(&name).to_owned();
    tool.kernel_names
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(data.kernel_id, name);
}

unsafe extern "C" fn code_object_callback_v0(
    rec: v0::CallbackRecord,
    _user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        code_object_phase(rec.kind, rec.operation, rec.phase, rec.payload)
    }));
}

unsafe extern "C" fn code_object_callback_v1(
    rec: v1::CallbackRecord,
    _user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        code_object_phase(rec.kind, rec.operation, rec.phase, rec.payload)
    }));
}
