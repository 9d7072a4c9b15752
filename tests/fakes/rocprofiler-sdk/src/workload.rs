//! The test's side: scripted HIP calls, code-object loads, runtime initialisation, counters.

use super::exports::run_tool;
use super::*;

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
    register_atexit();
    tools.len() as u32
}

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

/// The host address of kernel `kernel_id`'s function (what `hipLaunchKernel` receives).
pub fn function_address(kernel_id: u64) -> u64 {
    0x7e00_0000 + kernel_id * 0x40
}

/// `hipLaunchKernel` of `kernel_id` on GPU `gpu`, HSA queue `queue`, the null stream: `grid`
/// work-items per dimension and `block` per work-group (AQL semantics), running `dur_ns`. Returns
/// the correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_launch_kernel(
    kernel_id: u64,
    gpu: u32,
    queue: u64,
    grid_x: u32,
    block_x: u32,
    dur_ns: u64,
) -> u64 {
    // SAFETY: plain values.
    unsafe { fake_rocp_launch_kernel_on(kernel_id, gpu, queue, grid_x, block_x, dur_ns, 0) }
}

/// [`fake_rocp_launch_kernel`] on HIP stream `stream` (a `hipStream_t` value; 0 is the null
/// stream). The API callbacks get the `hipLaunchKernel` payload in the real layout: the kernel's
/// [`function_address`], `numBlocks` = grid / block work-groups, `dimBlocks` = block, 0 dynamic
/// LDS, the stream.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_launch_kernel_on(
    kernel_id: u64,
    gpu: u32,
    queue: u64,
    grid_x: u32,
    block_x: u32,
    dur_ns: u64,
    stream: u64,
) -> u64 {
    let tid = gettid();
    let args = sys::hip_args::LaunchKernelArgs {
        function_address: function_address(kernel_id) as *const c_void,
        num_blocks: Dim3 {
            x: grid_x.div_ceil(block_x.max(1)),
            y: 1,
            z: 1,
        },
        dim_blocks: Dim3 {
            x: block_x,
            y: 1,
            z: 1,
        },
        args: std::ptr::null_mut(),
        shared_mem_bytes: 0,
        stream: stream as *mut c_void,
    };
    hip_call("hipLaunchKernel", HipPayload::of(&args), |correlation| {
        emit_dispatch(
            correlation,
            tid,
            kernel_id,
            gpu,
            queue,
            grid_x,
            block_x,
            dur_ns,
        );
    })
}

/// One KERNEL_DISPATCH record of `kernel_id` for call `correlation`, starting 1 µs from now.
#[allow(clippy::too_many_arguments)]
fn emit_dispatch(
    correlation: u64,
    tid: u64,
    kernel_id: u64,
    gpu: u32,
    queue: u64,
    grid_x: u32,
    block_x: u32,
    dur_ns: u64,
) {
    let start = gpu_start();
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
}

/// The SDK's clock now (CLOCK_BOOTTIME ns), for [`fake_rocp_next_gpu_start`].
#[no_mangle]
pub extern "C" fn fake_rocp_now() -> u64 {
    boottime_ns()
}

/// The next GPU record (dispatch or copy) starts at `ns` on the SDK's clock instead of 1 µs after
/// its call: a test lays out an exact GPU timeline (overlaps, gaps) this way.
#[no_mangle]
pub extern "C" fn fake_rocp_next_gpu_start(ns: u64) {
    NEXT_GPU_START.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// `hipMemsetAsync` of `bytes` on HIP stream `stream` of GPU `gpu`, carried out as ROCclr does:
/// `dispatches` dispatches of the fill kernel `kernel_id` (load it first with a
/// `__amd_rocclr_fillBuffer…` name), each running `dur_ns`. Returns the correlation id.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_memset(
    kernel_id: u64,
    bytes: u64,
    gpu: u32,
    queue: u64,
    stream: u64,
    dispatches: u32,
    dur_ns: u64,
) -> u64 {
    let tid = gettid();
    let args = sys::hip_args::MemsetStreamArgs {
        dst: 0x7fda_0e82_0000 as *mut c_void,
        value: 0,
        count: bytes as usize,
        stream: stream as *mut c_void,
    };
    hip_call("hipMemsetAsync", HipPayload::of(&args), |correlation| {
        for _ in 0..dispatches {
            emit_dispatch(correlation, tid, kernel_id, gpu, queue, 256, 256, dur_ns);
        }
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
    let host = 0x5567_4ecd_4180u64;
    let device = 0x7fda_0e81_0200u64;
    let (src, dst) = match direction {
        2 => (host, device),
        3 => (device, host),
        4 => (device, device + 0x1000),
        _ => (host, host + 0x1000),
    };
    // hipMemcpyKind: HostToHost 0, HostToDevice 1, DeviceToHost 2, DeviceToDevice 3.
    let args = sys::hip_args::MemcpyStreamArgs {
        dst: dst as *mut c_void,
        src: src as *const c_void,
        size_bytes: bytes as usize,
        kind: direction.clamp(1, 4) as i32 - 1,
        stream: std::ptr::null_mut(),
    };
    hip_call("hipMemcpyAsync", HipPayload::of(&args), |correlation| {
        let start = gpu_start();
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
    // hipMalloc's out-pointer, written by the call before EXIT.
    let mut block: *mut c_void = std::ptr::null_mut();
    let out: *mut *mut c_void = &mut block;
    let payload = if free != 0 {
        HipPayload::of(&sys::hip_args::FreeArgs {
            ptr: address as *mut c_void,
        })
    } else {
        HipPayload::of(&sys::hip_args::MallocArgs {
            ptr: out,
            size: bytes as usize,
        })
    };
    hip_call(name, payload, |correlation| {
        // SAFETY: `out` points at `block`, alive for the whole call.
        unsafe { *out = address as *mut c_void };
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
    hip_call(&name, HipPayload::empty(), |_| {})
}

/// The SDK finalizes now, as it does at exit (see `finalize_sdk`): contexts stop, the tools'
/// `finalize` run, then every flush answers FINALIZED.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_finalize() {
    finalize_sdk();
}

/// `rocprofiler_callback_tracing_marker_api_data_t` as the SDK passes it for `roctxRangePushA`:
/// `size`, the args union (the message), the return value.
#[repr(C)]
struct MarkerPayload {
    size: u64,
    message: *const c_char,
    retval: i64,
}

fn roctx_call(op: &str, message: *const c_char) {
    let mut payload = MarkerPayload {
        size: std::mem::size_of::<MarkerPayload>() as u64,
        message,
        retval: 0,
    };
    let op = kind_number(&marker_ops(), op);
    for t in callback_targets("MARKER_CORE_API") {
        for phase in [sys::PHASE_ENTER, sys::PHASE_EXIT] {
            let mut user = UserData::default();
            invoke(
                t,
                "MARKER_CORE_API",
                op,
                phase,
                0,
                &mut payload as *mut MarkerPayload as *mut c_void,
                &mut user,
            );
        }
    }
}

/// `roctxRangePushA(message)` on the calling thread: the MARKER_CORE_API callbacks of every
/// active context, ENTER and EXIT.
///
/// # Safety
/// `message` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fake_rocp_roctx_push(message: *const c_char) {
    roctx_call("roctxRangePushA", message);
}

/// `roctxRangePop()` on the calling thread.
#[no_mangle]
pub extern "C" fn fake_rocp_roctx_pop() {
    roctx_call("roctxRangePop", std::ptr::null());
}
