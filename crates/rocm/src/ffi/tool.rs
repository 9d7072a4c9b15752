//! The process-wide tool the SDK's callbacks reach: what it resolved, how it registers
//! (`force_configure`, or the SDK calling [`tool_configure`]), and its `configure`, `initialize` and
//! `finalize`.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use kinetrace_rocprofiler_sdk_sys::{
    self as sys, v0, v1, Abi, BufferId, ContextId, RocprofilerSdk, ToolConfigureResult,
};

use super::callbacks::{
    api_callback_v0, api_callback_v1, buffer_callback, code_object_callback_v0,
    code_object_callback_v1, marker_callback_v0, marker_callback_v1,
};
use super::calls::{check, flush_buffer, is_initialized, start_context, SdkError};
use crate::external::ExternalIds;
use crate::queue::Queue;

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
    /// Callback-tracing `MARKER_CORE_API` and its range push/pop operations, if the SDK has them.
    pub markers: Option<Markers>,
}

/// The roctx operations the marker hooks follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Markers {
    /// Callback-tracing `MARKER_CORE_API`.
    pub kind: i32,
    /// Its `roctxRangePushA`.
    pub push: i32,
    /// Its `roctxRangePop`.
    pub pop: i32,
}

/// Where roctx ranges go (see [`on_marker`]).
pub(crate) struct MarkerHooks {
    pub push: fn(&CStr),
    pub pop: fn(),
}

static MARKER_HOOKS: OnceLock<MarkerHooks> = OnceLock::new();

/// Sets where roctx ranges pushed and popped on any thread go: PyTorch on ROCm routes its
/// profiler ranges (what `emit_nvtx` turns on) to roctx, as it does to NVTX on CUDA, so the preload
/// shim hands them to the same place as its NVTX injection. Set before the tool is initialised
/// (the shim does it in its constructor); without it the SDK is not asked for marker callbacks.
/// The first one set wins. The functions run on the calling thread, inside the roctx call.
pub fn on_marker(push: fn(&CStr), pop: fn()) {
    let _ = MARKER_HOOKS.set(MarkerHooks { push, pop });
}

pub(crate) fn marker_hooks() -> Option<&'static MarkerHooks> {
    MARKER_HOOKS.get()
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
    /// Why roctx ranges are not followed although a hook asked for them.
    pub markers_off: Option<SdkError>,
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
    /// The [`ArgLayout`](crate::record::ArgLayout) of each HIP operation number (0: none), so the
    /// API callback finds it with one index.
    pub arg_layouts: Box<[u8]>,
    /// `drop_count`s the SDK reported to the buffer callback.
    pub sdk_dropped: AtomicU64,
    /// Buffer records of a kind or size kinetrace does not read.
    pub skipped: AtomicU64,
    /// Our `rocprofiler_configure` ran.
    pub configured: AtomicBool,
    /// The SDK called the tool's `finalize` (it is finalizing, or finalized): that call took what
    /// the buffer held, and the SDK refuses every later flush (`ROCPROFILER_STATUS_ERROR_FINALIZED`),
    /// so nothing asks it for one after this (see [`Tool::finalized`]).
    pub finalized: AtomicBool,
    pub kernel_names: Mutex<HashMap<u64, String>>,
    pub setup: Mutex<Setup>,
}

impl Tool {
    /// Whether the SDK has started finalizing: the tool's `finalize` has run (or is running) and
    /// took the buffer's last records, so a source only drains the queue from now on.
    pub(crate) fn finalized(&self) -> bool {
        // Acquire: pairs with the Release store in `finalize_tool`.
        self.finalized.load(Ordering::Acquire)
    }
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
                let t = crate::install::install_for_sdk()?;
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
    // roctx ranges (PyTorch's op ranges on ROCm), on the utility context: like NVTX on CUDA they
    // are followed outside windows too (they can mark steps).
    if let (Some(m), Some(_)) = (tool.kinds.markers, marker_hooks()) {
        let marker_cb: sys::CallbackTracingFn = match tool.abi {
            Abi::V0 => marker_callback_v0 as _,
            Abi::V1 => marker_callback_v1 as _,
        };
        let ops = [m.push, m.pop];
        // SAFETY: `marker_cb` is this ABI's callback-tracing trampoline; `ops` outlives the call.
        let s = unsafe {
            (sdk.rocprofiler_configure_callback_tracing_service)(
                utility,
                m.kind,
                ops.as_ptr(),
                ops.len(),
                marker_cb,
                std::ptr::null_mut(),
            )
        };
        // Markers are extra: without them everything else still records.
        if let Err(e) = check(sdk, "rocprofiler_configure_callback_tracing_service", s) {
            tool.setup
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .markers_off = Some(e);
        }
    }
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
/// itself, §8.6), the last moment a flush is allowed: the SDK has stopped every context by now and
/// answers `ROCPROFILER_STATUS_ERROR_FINALIZED` to any flush once its tools' `finalize` have run.
/// At a normal exit this runs before kinetrace's own exit handler saves the capture (the SDK
/// registers its handler after the tools' `initialize`): the records go to the queue, which the
/// save drains, and the sources ask the SDK for nothing more.
unsafe extern "C" fn finalize_tool(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(tool) = tool() {
            // Set before the flush: a source flushing on another thread meanwhile drains the queue
            // instead of racing the SDK's finalization (the records this flush hands over reach
            // the queue, which the capture's save drains). Release: pairs with `Tool::finalized`.
            tool.finalized.store(true, Ordering::Release);
            let buffer = tool.setup.try_lock().ok().and_then(|s| s.buffer);
            if let Some(b) = buffer {
                let _ = flush_buffer(tool.sdk, b);
            }
        }
    }));
}
