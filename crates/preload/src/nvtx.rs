//! The NVTX injection entry point: NVTX ranges whose message matches `KINETRACE_STEP_NVTX` mark
//! steps, and pushed ranges become spans inside windows (PyTorch's ops, when the `sitecustomize`
//! turned its NVTX profiler state on; see the agent's `ops.rs`).
//!
//! NVTX v3 is header-only: every library built with it holds its own NVTX instance, which at its
//! first NVTX call `dlopen`s the file `NVTX_INJECTION64_PATH` names and calls its
//! `InitializeInjectionNvtx2(getExportTable)`. The tool asks the export table for the callbacks
//! table (`NVTX_ETID_CALLBACKS`), gets each module's function table (an array of pointers to the
//! instance's function-pointer slots, indexed by callback id) and stores its own functions in the
//! slots it wants; NVTX turns every slot left empty into a no-op. So this runs once per NVTX
//! instance, and kinetrace only attaches the range push/pop/start entry points (plain, `Ex`, and
//! the domain variants) plus string registration (so registered messages can be read back).
//! Push/pop/start answer as NVTX does without a tool: no push/pop tracking, range id 0.
//!
//! Layouts and ids below are those of the public NVTX v3 headers (`nvtxDetail/nvtxTypes.h`,
//! `nvToolsExt.h`), which are ABI-stable.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::catch_unwind;

use kinetrace_agent as agent;

/// `NVTX_ETID_CALLBACKS`.
const ETID_CALLBACKS: u32 = 1;
/// `NVTX_CB_MODULE_CORE`, `NVTX_CB_MODULE_CORE2`.
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;
/// `NvtxCallbackIdCore`.
const CORE_RANGE_START_EX: usize = 4;
const CORE_RANGE_START_A: usize = 5;
const CORE_RANGE_START_W: usize = 6;
const CORE_RANGE_PUSH_EX: usize = 8;
const CORE_RANGE_PUSH_A: usize = 9;
const CORE_RANGE_PUSH_W: usize = 10;
const CORE_RANGE_POP: usize = 11;
/// `NvtxCallbackIdCore2`.
const CORE2_DOMAIN_RANGE_START_EX: usize = 2;
const CORE2_DOMAIN_RANGE_PUSH_EX: usize = 4;
const CORE2_DOMAIN_RANGE_POP: usize = 5;
const CORE2_DOMAIN_REGISTER_STRING_A: usize = 10;
const CORE2_DOMAIN_REGISTER_STRING_W: usize = 11;
/// `nvtxMessageType_t`.
const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;
/// `NVTX_NO_PUSH_POP_TRACKING`: what a push returns when no tool tracks the nesting.
const NO_PUSH_POP_TRACKING: c_int = -2;
/// Longest message read from a wide string (NVTX messages are short labels).
const MAX_WIDE: usize = 4096;

/// `NvtxGetExportTableFunc_t`.
pub type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type FunctionPointer = *const c_void;
type GetModuleFunctionTable =
    unsafe extern "C" fn(c_int, *mut *mut *mut FunctionPointer, *mut c_uint) -> c_int;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

/// `nvtxEventAttributes_t` (v2 and v3 share this layout: 48 bytes on 64-bit targets).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

/// The NVTX injection entry point. Always reports success (an NVTX instance whose tool fails only
/// turns its calls into no-ops, but there is no reason to); attaches nothing unless
/// `KINETRACE_STEP_NVTX` is set.
///
/// # Safety
/// Called by an NVTX instance with its own `nvtxGetExportTable`, once, before the instance's
/// functions are used (its initialisation holds the other callers back).
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(
    get_export_table: Option<GetExportTable>,
) -> c_int {
    let _ = catch_unwind(|| {
        if !agent::nvtx_attach() {
            return;
        }
        let Some(get) = get_export_table else { return };
        // SAFETY: the instance's own export-table function, called with a defined table id.
        let table = unsafe { get(ETID_CALLBACKS) } as *const ExportTableCallbacks;
        if table.is_null() {
            return;
        }
        // SAFETY: a non-null NVTX_ETID_CALLBACKS table starts with its size; the function pointer
        // is read only if the size covers it.
        let callbacks = unsafe { &*table };
        if callbacks.struct_size < std::mem::size_of::<ExportTableCallbacks>() {
            return;
        }
        let Some(get_table) = callbacks.get_module_function_table else {
            return;
        };
        let core: [(usize, FunctionPointer); 7] = [
            (CORE_RANGE_START_EX, range_start_ex as FunctionPointer),
            (CORE_RANGE_START_A, range_start_a as FunctionPointer),
            (CORE_RANGE_START_W, range_start_w as FunctionPointer),
            (CORE_RANGE_PUSH_EX, range_push_ex as FunctionPointer),
            (CORE_RANGE_PUSH_A, range_push_a as FunctionPointer),
            (CORE_RANGE_PUSH_W, range_push_w as FunctionPointer),
            (CORE_RANGE_POP, range_pop as FunctionPointer),
        ];
        let core2: [(usize, FunctionPointer); 5] = [
            (
                CORE2_DOMAIN_RANGE_START_EX,
                domain_range_start_ex as FunctionPointer,
            ),
            (
                CORE2_DOMAIN_RANGE_PUSH_EX,
                domain_range_push_ex as FunctionPointer,
            ),
            (CORE2_DOMAIN_RANGE_POP, domain_range_pop as FunctionPointer),
            (
                CORE2_DOMAIN_REGISTER_STRING_A,
                register_string_a as FunctionPointer,
            ),
            (
                CORE2_DOMAIN_REGISTER_STRING_W,
                register_string_w as FunctionPointer,
            ),
        ];
        // SAFETY: `get_table` is the instance's GetModuleFunctionTable.
        unsafe {
            attach(get_table, MODULE_CORE, &core);
            attach(get_table, MODULE_CORE2, &core2);
        }
    });
    1
}

/// Stores `entries` into the module's slots (those the instance has: ids below its table size).
///
/// # Safety
/// `get_table` is an NVTX instance's `GetModuleFunctionTable`.
unsafe fn attach(
    get_table: GetModuleFunctionTable,
    module: c_int,
    entries: &[(usize, FunctionPointer)],
) {
    let mut table: *mut *mut FunctionPointer = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: valid out-pointers.
    if unsafe { get_table(module, &mut table, &mut size) } == 0 || table.is_null() {
        return;
    }
    for &(id, f) in entries {
        if id >= size as usize {
            continue;
        }
        // SAFETY: ids below `size` index the instance's table of slot pointers.
        let slot = unsafe { *table.add(id) };
        if !slot.is_null() {
            // SAFETY: a slot of the instance, written before its initialisation completes (NVTX
            // publishes the slots with a barrier afterwards).
            unsafe { *slot = f };
        }
    }
}

/// How a range came: pushed (nested, popped on the same thread) or started (ended by id, maybe on
/// another thread: these only mark steps).
#[derive(Clone, Copy)]
enum Kind {
    Push,
    Start,
}

fn on_message(kind: Kind, message: &str) {
    let install = crate::shim::starting(|| match kind {
        Kind::Push => agent::nvtx_push(message),
        Kind::Start => agent::nvtx_range(message),
    });
    crate::shim::install_after(install);
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn on_ascii(kind: Kind, s: *const c_char) {
    if s.is_null() {
        // A push still opens a range its pop will close.
        on_message(kind, "");
        return;
    }
    // SAFETY: per the caller.
    let bytes = unsafe { CStr::from_ptr(s) }.to_bytes();
    on_message(kind, &String::from_utf8_lossy(bytes));
}

/// # Safety
/// `s` is null or a NUL-terminated `wchar_t` (UTF-32 on Linux) string.
unsafe fn on_wide(kind: Kind, s: *const i32) {
    if s.is_null() {
        on_message(kind, "");
        return;
    }
    // SAFETY: per the caller.
    on_message(kind, &unsafe { wide_to_string(s) });
}

/// # Safety
/// `s` is a NUL-terminated `wchar_t` string.
unsafe fn wide_to_string(s: *const i32) -> String {
    let mut out = String::new();
    for i in 0..MAX_WIDE {
        // SAFETY: reading up to and including the terminating NUL.
        let c = unsafe { *s.add(i) };
        if c == 0 {
            break;
        }
        out.push(char::from_u32(c as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    out
}

/// # Safety
/// `attr` is null or a valid `nvtxEventAttributes_t`; registered messages are handles from
/// [`register_string_a`] / [`register_string_w`].
unsafe fn on_attributes(kind: Kind, attr: *const EventAttributes) {
    // SAFETY: per the caller; fields past `size` are not read.
    let a = (!attr.is_null()).then(|| unsafe { &*attr });
    let Some(a) = a.filter(|a| {
        (a.size as usize) >= std::mem::size_of::<EventAttributes>() && !a.message.is_null()
    }) else {
        on_message(kind, "");
        return;
    };
    match a.message_type {
        // SAFETY: the message union holds what its type says; registered handles point at the
        // NUL-terminated copies this module made.
        MESSAGE_ASCII | MESSAGE_REGISTERED => unsafe { on_ascii(kind, a.message as *const c_char) },
        // SAFETY: as above.
        MESSAGE_UNICODE => unsafe { on_wide(kind, a.message as *const i32) },
        _ => on_message(kind, ""),
    }
}

unsafe extern "C" fn range_push_a(message: *const c_char) -> c_int {
    // SAFETY: NVTX passes the caller's string.
    let _ = catch_unwind(|| unsafe { on_ascii(Kind::Push, message) });
    NO_PUSH_POP_TRACKING
}

unsafe extern "C" fn range_push_w(message: *const i32) -> c_int {
    // SAFETY: NVTX passes the caller's string.
    let _ = catch_unwind(|| unsafe { on_wide(Kind::Push, message) });
    NO_PUSH_POP_TRACKING
}

unsafe extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    // SAFETY: NVTX passes the caller's attributes.
    let _ = catch_unwind(|| unsafe { on_attributes(Kind::Push, attr) });
    NO_PUSH_POP_TRACKING
}

extern "C" fn range_pop() -> c_int {
    let _ = catch_unwind(agent::nvtx_pop);
    NO_PUSH_POP_TRACKING
}

extern "C" fn domain_range_pop(_domain: *const c_void) -> c_int {
    let _ = catch_unwind(agent::nvtx_pop);
    NO_PUSH_POP_TRACKING
}

unsafe extern "C" fn range_start_a(message: *const c_char) -> u64 {
    // SAFETY: NVTX passes the caller's string.
    let _ = catch_unwind(|| unsafe { on_ascii(Kind::Start, message) });
    0
}

unsafe extern "C" fn range_start_w(message: *const i32) -> u64 {
    // SAFETY: NVTX passes the caller's string.
    let _ = catch_unwind(|| unsafe { on_wide(Kind::Start, message) });
    0
}

unsafe extern "C" fn range_start_ex(attr: *const EventAttributes) -> u64 {
    // SAFETY: NVTX passes the caller's attributes.
    let _ = catch_unwind(|| unsafe { on_attributes(Kind::Start, attr) });
    0
}

unsafe extern "C" fn domain_range_push_ex(
    _domain: *const c_void,
    attr: *const EventAttributes,
) -> c_int {
    // SAFETY: NVTX passes the caller's attributes.
    let _ = catch_unwind(|| unsafe { on_attributes(Kind::Push, attr) });
    NO_PUSH_POP_TRACKING
}

unsafe extern "C" fn domain_range_start_ex(
    _domain: *const c_void,
    attr: *const EventAttributes,
) -> u64 {
    // SAFETY: NVTX passes the caller's attributes.
    let _ = catch_unwind(|| unsafe { on_attributes(Kind::Start, attr) });
    0
}

/// A registered string's handle: a NUL-terminated UTF-8 copy that lives as long as the process
/// (NVTX has no unregister; programs register a fixed set of names).
fn register(text: String) -> *const c_void {
    match std::ffi::CString::new(text) {
        Ok(c) => c.into_raw() as *const c_void,
        Err(_) => std::ptr::null(),
    }
}

unsafe extern "C" fn register_string_a(_domain: *const c_void, s: *const c_char) -> *const c_void {
    if s.is_null() {
        return std::ptr::null();
    }
    // SAFETY: NVTX passes the caller's NUL-terminated string.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    catch_unwind(|| register(text)).unwrap_or(std::ptr::null())
}

unsafe extern "C" fn register_string_w(_domain: *const c_void, s: *const i32) -> *const c_void {
    if s.is_null() {
        return std::ptr::null();
    }
    // SAFETY: NVTX passes the caller's NUL-terminated wide string.
    let text = unsafe { wide_to_string(s) };
    catch_unwind(|| register(text)).unwrap_or(std::ptr::null())
}
