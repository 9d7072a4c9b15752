//! The rocprofiler-sdk C ABI the fake implements.

use super::*;

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
    register_atexit();
    sys::STATUS_SUCCESS
}

/// One tool's registration: its `configure`, then its `initialize` (configuration is open).
///
/// # Safety
/// `configure` must have the configure function's signature.
pub(crate) unsafe fn run_tool(configure: ConfigureFn, priority: u32) {
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
            state().finalize.push((fini, r.tool_data as usize));
        }
    }
}

pub(crate) fn locked() -> bool {
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
    if index(ctx.handle).is_some_and(|i| i < s.contexts.len()) && s.fini != 0 {
        // Finalizing or finalized: no context starts again.
        return CONFIGURATION_LOCKED;
    }
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
    let finalized = s.fini > 0;
    match index(ctx.handle).and_then(|i| s.contexts.get_mut(i)) {
        // Finalized: every context is stopped already.
        Some(_) if finalized => sys::STATUS_SUCCESS,
        Some(c) if c.active => {
            c.active = false;
            if let Some(i) = index(ctx.handle) {
                complete_in_flight(&mut s, i);
            }
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
        in_flight: Vec::new(),
    });
    // SAFETY: caller's out-pointer, checked non-null.
    unsafe {
        (*out).handle = s.buffers.len() as u64;
    }
    sys::STATUS_SUCCESS
}

/// `rocprofiler_flush_buffer`: hands what the buffer holds to its callback before returning;
/// FINALIZED once the SDK has finalized (a tool flushes in its `finalize`, never after).
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_flush_buffer(buffer: BufferId) -> Status {
    if fails("rocprofiler_flush_buffer") {
        return ERROR;
    }
    if finalized() {
        return FINALIZED;
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

pub(crate) fn write_name(
    name: Option<&'static str>,
    out: *mut *const c_char,
    len: *mut u64,
) -> Status {
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

pub(crate) fn lookup(table: Option<Vec<(i32, &'static str)>>, n: i32) -> Option<&'static str> {
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

pub(crate) fn iterate_kinds(
    table: Vec<(i32, &'static str)>,
    cb: KindCallback,
    data: *mut c_void,
) -> Status {
    for (k, _) in table {
        // SAFETY: the tool's iterator callback.
        if unsafe { cb(k, data) } != 0 {
            break;
        }
    }
    sys::STATUS_SUCCESS
}

pub(crate) fn iterate_ops(
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
        FINALIZED => c"Invalid request because rocprofiler has finalized",
        _ => c"Unknown status",
    };
    s.as_ptr()
}
