//! The `extern "C"` functions the SDK calls with records: the buffer callback, the HIP API
//! callback and the code-object callback, one per ABI where the record arrives by value. The hot
//! ones allocate nothing and take no lock.

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use kinetrace_core::recorder;
use kinetrace_rocprofiler_sdk_sys::hip_args::{
    ExtModuleLaunchKernelArgs, FreeArgs, HipApiData, LaunchKernelArgs, MallocArgs, MemcpyArgs,
    MemcpyStreamArgs, MemsetArgs, MemsetStreamArgs, ModuleLaunchKernelArgs, HIP_API_ARGS_OFFSET,
};
use kinetrace_rocprofiler_sdk_sys::{
    self as sys, v0, v1, BufferId, ContextId, KernelDispatchRecord, KernelSymbolRegisterData,
    RecordHeader, UserData,
};

use super::calls::now;
use super::tool::{marker_hooks, tool, Kinds, Tool};
use crate::external::CallInfo;
use crate::queue::Queue;
use crate::queue::Words;
use crate::record::{ApiRec, ArgLayout, CopyRec, KernelRec, MemoryRec, RawArgs};

/// The buffer callback: copies each dispatch and copy record into the queue. No lock, no
/// allocation, never blocks (a full queue refuses and counts).
pub(super) unsafe extern "C" fn buffer_callback(
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
        // SAFETY: the SDK's `n` header pointers, valid during this callback.
        let skipped = unsafe { queue_records(&tool.kinds, headers, n, &tool.queue) };
        if skipped > 0 {
            tool.skipped.fetch_add(skipped, Ordering::Relaxed);
        }
    }));
}

/// What the buffer callback does with the SDK's records: each dispatch, copy and (1.x) allocation
/// record of `kinds` is copied into `queue` (refused and counted there when full); returns how many
/// records were of a kind or size kinetrace does not read. Public so the decode bench measures
/// this very path.
///
/// # Safety
/// `headers` is null or points to `n` header pointers, each null or pointing to a record header
/// whose payload (if not null) is a record of the size its leading `size` says, 8-aligned, all
/// valid for the duration of the call: what the SDK passes its buffer callback.
pub unsafe fn queue_records(
    kinds: &Kinds,
    headers: *const *mut RecordHeader,
    n: usize,
    queue: &Queue,
) -> u64 {
    if headers.is_null() {
        return 0;
    }
    let mut skipped = 0;
    for i in 0..n {
        // SAFETY: `n` header pointers (the contract above).
        let h = unsafe { *headers.add(i) };
        if h.is_null() {
            continue;
        }
        // SAFETY: a valid header (the contract above).
        let h = unsafe { &*h };
        match copy_record(kinds, h) {
            Some(words) => {
                queue.push(&words);
            }
            None => skipped += 1,
        }
    }
    skipped
}

/// The queue words of the record behind `h`, if it is a dispatch, copy or allocation whose `size`
/// covers what is read.
#[inline]
fn copy_record(kinds: &Kinds, h: &RecordHeader) -> Option<Words> {
    if h.category != sys::BUFFER_CATEGORY_TRACING || h.payload.is_null() {
        return None;
    }
    let kind = h.kind as i32;
    // SAFETY: every tracing record starts with its `size` (u64); the payload is valid during the
    // callback.
    let size = unsafe { *(h.payload as *const u64) } as usize;
    if kind == kinds.kernel_dispatch {
        if size < std::mem::size_of::<KernelDispatchRecord>() {
            return None;
        }
        // SAFETY: a kernel-dispatch record of at least its size (checked), 8-aligned as the SDK
        // allocates it.
        let r = unsafe { &*(h.payload as *const KernelDispatchRecord) };
        Some(KernelRec::of(r).to_words())
    } else if kind == kinds.memory_copy {
        // Read as the 0.x record, the prefix of the 1.x one (`CopyRec::of`).
        if size < std::mem::size_of::<v0::MemoryCopyRecord>() {
            return None;
        }
        // SAFETY: a memory-copy record of at least the 0.x size (checked).
        let r = unsafe { &*(h.payload as *const v0::MemoryCopyRecord) };
        Some(CopyRec::of(r).to_words())
    } else if Some(kind) == kinds.memory_allocation {
        if size < std::mem::size_of::<v1::MemoryAllocationRecord>() {
            return None;
        }
        // SAFETY: a 1.x memory-allocation record of at least its size (checked; the kind is only
        // configured on 1.x).
        let r = unsafe { &*(h.payload as *const v1::MemoryAllocationRecord) };
        Some(MemoryRec::of(r).to_words())
    } else {
        None
    }
}

/// A HIP API callback payload, checked non-null; its argument structs are read by value.
#[derive(Clone, Copy)]
struct Payload(*const std::ffi::c_void);

impl Payload {
    /// # Safety
    /// `payload` is the SDK's `rocprofiler_callback_tracing_hip_api_data_t` of the current
    /// callback, valid while the returned value is used (during the callback).
    unsafe fn new(payload: *const std::ffi::c_void) -> Option<Payload> {
        (!payload.is_null()).then_some(Payload(payload))
    }

    /// The argument struct `T`, when the payload's `size` covers it.
    fn args<T: Copy>(self) -> Option<T> {
        // SAFETY: a payload (`new`), which starts with its `size`.
        let data = unsafe { &*(self.0 as *const HipApiData) };
        if !data.covers::<T>() {
            return None;
        }
        // SAFETY: the payload holds `T` in full at the args offset (checked against its `size`);
        // read unaligned, whatever the SDK's allocation.
        Some(unsafe {
            std::ptr::read_unaligned((self.0 as *const u8).add(HIP_API_ARGS_OFFSET) as *const T)
        })
    }
}

/// What the trace shows of the arguments of operation `operation`, read from its payload. At EXIT
/// a `hipMalloc`'s block is read through its out-pointer (the call has written it).
fn hip_args(tool: &Tool, operation: u32, payload: *const std::ffi::c_void, exit: bool) -> RawArgs {
    let layout = tool
        .arg_layouts
        .get(operation as usize)
        .and_then(|l| ArgLayout::from_u8(*l));
    // SAFETY: the SDK's HIP API payload of this callback, used only during it.
    let (Some(layout), Some(p)) = (layout, unsafe { Payload::new(payload) }) else {
        return RawArgs::None;
    };
    let dim = |d: sys::Dim3| [d.x, d.y, d.z];
    // The layout was picked by the operation's name.
    match layout {
        ArgLayout::LaunchKernel => p.args::<LaunchKernelArgs>().map(|a| RawArgs::Launch {
            function: a.function_address as u64,
            stream: a.stream as u64,
            grid: dim(a.num_blocks),
            block: dim(a.dim_blocks),
            shared: a.shared_mem_bytes as u32,
        }),
        ArgLayout::ModuleLaunchKernel => {
            p.args::<ModuleLaunchKernelArgs>().map(|a| RawArgs::Launch {
                function: a.func as u64,
                stream: a.stream as u64,
                grid: a.grid_dim,
                block: a.block_dim,
                shared: a.shared_mem_bytes,
            })
        }
        ArgLayout::ExtModuleLaunchKernel => {
            p.args::<ExtModuleLaunchKernelArgs>()
                .map(|a| RawArgs::Launch {
                    function: a.func as u64,
                    stream: a.stream as u64,
                    grid: a.global_work_size,
                    block: a.local_work_size,
                    shared: a.shared_mem_bytes as u32,
                })
        }
        ArgLayout::Memcpy => p.args::<MemcpyArgs>().map(|a| RawArgs::Copy {
            stream: None,
            src: a.src as u64,
            dst: a.dst as u64,
            size: a.size_bytes as u64,
            kind: a.kind as u32,
        }),
        ArgLayout::MemcpyStream => p.args::<MemcpyStreamArgs>().map(|a| RawArgs::Copy {
            stream: Some(a.stream as u64),
            src: a.src as u64,
            dst: a.dst as u64,
            size: a.size_bytes as u64,
            kind: a.kind as u32,
        }),
        ArgLayout::Malloc => p.args::<MallocArgs>().map(|a| {
            let ptr = if exit && !a.ptr.is_null() {
                // SAFETY: hipMalloc's out-pointer, which the call has written by EXIT (still
                // inside the call).
                unsafe { *a.ptr as u64 }
            } else {
                0
            };
            RawArgs::Malloc {
                ptr,
                size: Some(a.size as u64),
            }
        }),
        ArgLayout::Free => p.args::<FreeArgs>().map(|a| RawArgs::Malloc {
            ptr: a.ptr as u64,
            size: None,
        }),
        ArgLayout::Memset | ArgLayout::MemsetD16 | ArgLayout::MemsetD32 => {
            let elem = match layout {
                ArgLayout::MemsetD16 => 2,
                ArgLayout::MemsetD32 => 4,
                _ => 1,
            };
            p.args::<MemsetArgs>().map(|a| RawArgs::Fill {
                stream: None,
                dst: a.dst as u64,
                bytes: (a.count as u64).saturating_mul(elem),
            })
        }
        ArgLayout::MemsetAsync | ArgLayout::MemsetD16Async | ArgLayout::MemsetD32Async => {
            let elem = match layout {
                ArgLayout::MemsetD16Async => 2,
                ArgLayout::MemsetD32Async => 4,
                _ => 1,
            };
            p.args::<MemsetStreamArgs>().map(|a| RawArgs::Fill {
                stream: Some(a.stream as u64),
                dst: a.dst as u64,
                bytes: (a.count as u64).saturating_mul(elem),
            })
        }
    }
    .unwrap_or(RawArgs::None)
}

/// One HIP API callback, ABI-independent: ENTER stamps the time into the call's user data and
/// remembers the enclosing span (and the stream and function it launches on) for the call's GPU
/// records; EXIT queues the call with its arguments.
fn api_phase(
    kind: u32,
    operation: u32,
    phase: u32,
    correlation: u64,
    thread: u64,
    user: *mut UserData,
    payload: *const std::ffi::c_void,
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
        let args = hip_args(tool, operation, payload, false);
        // Written even without a span (0 reads as none): the SDK may reuse a retired id, whose
        // slot must not keep the old call's span.
        tool.external.set_call(
            correlation,
            CallInfo {
                external: recorder::current_external_id().unwrap_or(0),
                stream: args.stream(),
                function: args.function(),
                bytes: args.fill_bytes(),
            },
        );
    } else if phase == sys::PHASE_EXIT {
        // SAFETY: as above.
        let start = unsafe { (*user).value };
        // A call entered before the context started has no start: not recorded.
        if start == 0 {
            return;
        }
        let call = ApiRec {
            operation,
            correlation,
            tid: thread as u32,
            start,
            end: now.max(start),
            external: recorder::current_external_id().unwrap_or(0),
            args: hip_args(tool, operation, payload, true),
        };
        tool.queue.push(&call.to_words());
    }
}

pub(super) unsafe extern "C" fn api_callback_v0(
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
            rec.payload,
        )
    }));
}

pub(super) unsafe extern "C" fn api_callback_v1(
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
            rec.payload,
        )
    }));
}

/// A roctx range was pushed (`roctxRangePushA`, whose payload is `{uint64_t size; const char*
/// message; …}`) or popped: handed to the marker hooks at ENTER, on the calling thread.
fn marker_phase(kind: u32, operation: u32, phase: u32, payload: *mut c_void) {
    let (Some(tool), Some(hooks)) = (tool(), marker_hooks()) else {
        return;
    };
    let Some(m) = tool.kinds.markers else {
        return;
    };
    if kind as i32 != m.kind || phase != sys::PHASE_ENTER {
        return;
    }
    if operation as i32 == m.pop {
        (hooks.pop)();
        return;
    }
    if operation as i32 != m.push || payload.is_null() {
        return;
    }
    // SAFETY: the marker API payload, valid during the callback: its leading `size` is read
    // first, and the message pointer only if the payload covers it.
    let size = unsafe { *(payload as *const u64) } as usize;
    let message = if size >= 16 {
        // SAFETY: as above (the args union starts at 8 with the `const char*` message).
        unsafe { *((payload as *const u8).add(8) as *const *const std::ffi::c_char) }
    } else {
        std::ptr::null()
    };
    if message.is_null() {
        // A push still opens a range its pop will close.
        (hooks.push)(c"");
    } else {
        // SAFETY: roctx's caller passes a NUL-terminated message, alive during the call.
        (hooks.push)(unsafe { CStr::from_ptr(message) });
    }
}

pub(super) unsafe extern "C" fn marker_callback_v0(
    rec: v0::CallbackRecord,
    _user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        marker_phase(rec.kind, rec.operation, rec.phase, rec.payload)
    }));
}

pub(super) unsafe extern "C" fn marker_callback_v1(
    rec: v1::CallbackRecord,
    _user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        marker_phase(rec.kind, rec.operation, rec.phase, rec.payload)
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

pub(super) unsafe extern "C" fn code_object_callback_v0(
    rec: v0::CallbackRecord,
    _user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        code_object_phase(rec.kind, rec.operation, rec.phase, rec.payload)
    }));
}

pub(super) unsafe extern "C" fn code_object_callback_v1(
    rec: v1::CallbackRecord,
    _user: *mut UserData,
    _d: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        code_object_phase(rec.kind, rec.operation, rec.phase, rec.payload)
    }));
}
