//! Checked wrappers over the function table: each failure an [`SdkError`] naming the call and the
//! SDK's own status text; the kind, operation and agent queries.

use std::ffi::{c_char, c_void, CStr};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use kinetrace_rocprofiler_sdk_sys::{
    self as sys, v1, Abi, AgentPrefix, BufferId, ContextId, LoadError, RocprofilerSdk, Status,
};

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

pub(super) fn check(
    sdk: &RocprofilerSdk,
    call: &'static str,
    status: Status,
) -> Result<(), SdkError> {
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
pub(super) fn now(sdk: &RocprofilerSdk) -> u64 {
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
