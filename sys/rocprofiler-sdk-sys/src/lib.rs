/*!
Raw rocprofiler-sdk bindings for kinetrace: the `#[repr(C)]` types of the records, callback
payloads and registration structs kinetrace reads or writes, and a [`libloading`] function table.

The one design decision: **nothing here is tied to a ROCm found at build time.** The SDK's headers
need HIP ≥ 6.1 and HSA headers that cannot be installed here, so the types are written by hand from
the research's layout table (offsets verified there against the real headers with gcc on x86-64), and
every offset and size kinetrace relies on is a compile-time assertion in this crate. Enum values
are plain integers: kind and operation numbers differ between ABIs (the buffer-tracing kinds were
renumbered in 1.0), so kinetrace resolves them by name through the SDK's query functions and this
crate declares none of them. The library is opened at run time by [`RocprofilerSdk::load`]: a missing
optional entry point is `None`, a missing required one is an error naming the library and the
symbol. Loading never panics.

Two ABIs, chosen by `rocprofiler_get_version()`'s major:

| ABI | SDK | ROCm | differs |
|---|---|---|---|
| [`v0`] | 0.4 – 0.6 (`librocprofiler-sdk.so.0`) | 6.2 – 6.4 | 16-byte correlation id; client id without `size` |
| [`v1`] | 1.x (`librocprofiler-sdk.so.1`) | 7.0 and later | 24-byte correlation id (`ancestor`); client id starts with `size`; copy records gain addresses |

Types whose layout is the same in both ABIs (ids, record header, kernel-dispatch record, the
prefix of the kernel-symbol payload) live at the crate root.
*/
#![deny(missing_docs)]

use core::ffi::{c_char, c_void};
use core::mem::{offset_of, size_of};

pub mod hip_args;
mod table;
pub mod v0;
pub mod v1;

pub use table::{LoadError, RocprofilerSdk, OPTIONAL_SYMBOLS, REQUIRED_SYMBOLS};

/// `rocprofiler_status_t` (a C enum: `int`).
pub type Status = i32;
/// `ROCPROFILER_STATUS_SUCCESS`, the one status value that is the same in every ABI (the error
/// values moved when 0.5 inserted `CONTEXT_ID_NOT_ZERO`; read them through
/// `rocprofiler_get_status_string`).
pub const STATUS_SUCCESS: Status = 0;

/// `ROCPROFILER_BUFFER_CATEGORY_TRACING`: headers of buffer-tracing records.
pub const BUFFER_CATEGORY_TRACING: u32 = 1;
/// `ROCPROFILER_BUFFER_POLICY_DISCARD`.
pub const BUFFER_POLICY_DISCARD: i32 = 1;
/// `ROCPROFILER_BUFFER_POLICY_LOSSLESS`: the producer waits for space instead of dropping.
pub const BUFFER_POLICY_LOSSLESS: i32 = 2;
/// `ROCPROFILER_CALLBACK_PHASE_ENTER` (also `LOAD`).
pub const PHASE_ENTER: u32 = 1;
/// `ROCPROFILER_CALLBACK_PHASE_EXIT` (also `UNLOAD`).
pub const PHASE_EXIT: u32 = 2;
/// `ROCPROFILER_AGENT_TYPE_CPU`.
pub const AGENT_TYPE_CPU: u32 = 1;
/// `ROCPROFILER_AGENT_TYPE_GPU`.
pub const AGENT_TYPE_GPU: u32 = 2;
/// `ROCPROFILER_AGENT_INFO_VERSION_0`, the only agent-struct version.
pub const AGENT_INFO_VERSION_0: i32 = 1;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name {
            /// The opaque handle.
            pub handle: u64,
        }
    };
}

handle!(
    /// `rocprofiler_context_id_t`, passed by value.
    ContextId
);
handle!(
    /// `rocprofiler_buffer_id_t`, passed by value.
    BufferId
);
handle!(
    /// `rocprofiler_agent_id_t`.
    AgentId
);
handle!(
    /// `rocprofiler_queue_id_t` (an HSA queue).
    QueueId
);

/// `rocprofiler_user_data_t`: a union of `uint64_t value` and `void* ptr`; kinetrace only uses the
/// integer view, which covers the pointer on 64-bit targets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserData {
    /// The value (or the pointer's address).
    pub value: u64,
}

/// `rocprofiler_async_correlation_id_t` (1.x) and the 0.x `rocprofiler_correlation_id_t`: the id
/// asynchronous records carry in both ABIs, so their layout did not move.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsyncCorrelationId {
    /// The SDK's id, shared by an API call and the operations it enqueued.
    pub internal: u64,
    /// The tool's external value.
    pub external: UserData,
}

/// `rocprofiler_record_header_t`: one entry of the array a buffer callback receives. The first
/// eight bytes are a union with a `uint64_t hash`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RecordHeader {
    /// `rocprofiler_buffer_category_t`.
    pub category: u32,
    /// The buffer-tracing kind, for the tracing category.
    pub kind: u32,
    /// The record.
    pub payload: *mut c_void,
}

/// `rocprofiler_dim3_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dim3 {
    /// x.
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

/// `rocprofiler_kernel_dispatch_info_t` (128 bytes in 0.4 – 1.x; the SDK writes 72, the offset of
/// the padding, into `size`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelDispatchInfo {
    /// `offsetof(reserved_padding)`.
    pub size: u64,
    /// The GPU.
    pub agent_id: AgentId,
    /// The HSA queue.
    pub queue_id: QueueId,
    /// Key into the code-object kernel-symbol map.
    pub kernel_id: u64,
    /// Unique per dispatch.
    pub dispatch_id: u64,
    /// Scratch per work-item.
    pub private_segment_size: u32,
    /// LDS per work-group.
    pub group_segment_size: u32,
    /// Work-items per work-group.
    pub workgroup_size: Dim3,
    /// Total work-items per dimension (AQL semantics; blocks = grid / workgroup).
    pub grid_size: Dim3,
    /// Reserved.
    pub reserved_padding: [u8; 56],
}

/// `rocprofiler_buffer_tracing_kernel_dispatch_record_t` (184 bytes in both ABIs: it carries the
/// 16-byte async correlation id).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelDispatchRecord {
    /// `sizeof` the record as the library wrote it.
    pub size: u64,
    /// The buffer-tracing kind.
    pub kind: u32,
    /// `ENQUEUE` / `COMPLETE`.
    pub operation: u32,
    /// The launching API call's id.
    pub correlation_id: AsyncCorrelationId,
    /// The launching thread.
    pub thread_id: u64,
    /// GPU start (CLOCK_BOOTTIME ns).
    pub start_timestamp: u64,
    /// GPU end.
    pub end_timestamp: u64,
    /// What was dispatched.
    pub dispatch_info: KernelDispatchInfo,
}

/// The prefix of `rocprofiler_callback_tracing_code_object_kernel_symbol_register_data_t` kinetrace
/// reads (stable across ABIs; the payload is 72 bytes in 0.4/0.5 and 88 from 0.6/1.0, which
/// appended `kernel_code_entry_byte_offset` and `kernel_address`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelSymbolRegisterData {
    /// `sizeof` the payload as the library wrote it.
    pub size: u64,
    /// The id dispatch records carry.
    pub kernel_id: u64,
    /// The code object.
    pub code_object_id: u64,
    /// The mangled symbol with a trailing `.kd`.
    pub kernel_name: *const c_char,
    /// The kernel descriptor address.
    pub kernel_object: u64,
    /// Segment sizes and register counts (not read).
    pub segments_and_registers: [u32; 7],
    /// Padding to 8.
    pub _pad: u32,
}
/// The 0.4/0.5 payload size.
pub const KERNEL_SYMBOL_REGISTER_DATA_SIZE_V0: usize = 72;
/// The 0.6 / 1.x payload size (two `u64`s appended).
pub const KERNEL_SYMBOL_REGISTER_DATA_SIZE_V1: usize = 88;

/// `rocprofiler_tool_configure_result_t`, what the tool's `rocprofiler_configure` returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ToolConfigureResult {
    /// `sizeof` this struct.
    pub size: usize,
    /// Called once, inside which services may be configured.
    pub initialize: Option<InitializeFn>,
    /// Called at finalisation.
    pub finalize: Option<FinalizeFn>,
    /// Passed to both.
    pub tool_data: *mut c_void,
}

/// `int (*)(rocprofiler_client_finalize_t fini, void* tool_data)`. `fini` takes the ABI-specific
/// client id by value; kinetrace never calls it, so it is opaque here.
pub type InitializeFn = unsafe extern "C" fn(fini: *const c_void, tool_data: *mut c_void) -> i32;
/// `void (*)(void* tool_data)`.
pub type FinalizeFn = unsafe extern "C" fn(tool_data: *mut c_void);
/// `rocprofiler_configure_func_t`: `(version, runtime_version, priority, client_id*)`; the client id
/// is [`v0::ClientId`] or [`v1::ClientId`] by `version`.
pub type ConfigureFn = unsafe extern "C" fn(
    version: u32,
    runtime_version: *const c_char,
    priority: u32,
    client_id: *mut c_void,
) -> *mut ToolConfigureResult;
/// `rocprofiler_buffer_tracing_cb_t`.
pub type BufferCallback = unsafe extern "C" fn(
    context: ContextId,
    buffer: BufferId,
    headers: *mut *mut RecordHeader,
    num_headers: usize,
    data: *mut c_void,
    drop_count: u64,
);
/// A `rocprofiler_callback_tracing_cb_t`, type-erased: its first parameter is the ABI's callback
/// record **by value** ([`v0::CallbackRecord`] or [`v1::CallbackRecord`]), so a tool registers one
/// trampoline per ABI.
pub type CallbackTracingFn = *const c_void;
/// `int (*)(kind, void* data)` for the kind iterators (non-zero stops).
pub type KindCallback = unsafe extern "C" fn(kind: i32, data: *mut c_void) -> i32;
/// `int (*)(kind, operation, void* data)` for the operation iterators (non-zero stops).
pub type OperationCallback =
    unsafe extern "C" fn(kind: i32, operation: i32, data: *mut c_void) -> i32;
/// `rocprofiler_query_available_agents_cb_t`: `(version, const void** agents, n, data)`.
pub type AgentsCallback = unsafe extern "C" fn(
    version: i32,
    agents: *mut *const c_void,
    num_agents: usize,
    data: *mut c_void,
) -> Status;

/// The prefix of `rocprofiler_agent_v0_t` kinetrace reads. Its fields are at the same offsets in
/// every 1.x release; the struct's size is not (304 in 1.0, 312 from 1.1 where `uuid` became 16
/// bytes), and the SDK rejects an `agent_size` larger than its own with INCOMPATIBLE_ABI, so a tool
/// passes [`v1::agent_size`] of the library's version.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AgentPrefix {
    /// `sizeof` the struct as the library wrote it.
    pub size: u64,
    /// The handle records carry.
    pub id: AgentId,
    /// CPU = 1, GPU = 2.
    pub agent_type: u32,
    /// `cpu_cores_count` … `num_gws` (not read).
    pub _a: [u32; 11],
    /// Wavefront width.
    pub wave_front_size: u32,
    /// XCCs.
    pub num_xcc: u32,
    /// Compute units.
    pub cu_count: u32,
    /// `array_count` … `max_slots_scratch_cu` (not read).
    pub _b: [u32; 6],
    /// `major * 10000 + minor * 100 + patch` of the gfx target.
    pub gfx_target_version: u32,
    /// `vendor_id` … `grid_max_size` (not read).
    pub _c: [u32; 18],
    /// Local memory size in bytes.
    pub local_mem_size: u64,
    /// XGMI hive.
    pub hive_id: u64,
    /// KFD id.
    pub gpu_id: u64,
    /// Largest work-group.
    pub workgroup_max_dim: Dim3,
    /// Largest grid.
    pub grid_max_dim: Dim3,
    /// Memory banks (not read).
    pub mem_banks: *const c_void,
    /// Caches (not read).
    pub caches: *const c_void,
    /// IO links (not read).
    pub io_links: *const c_void,
    /// `gfx90a`.
    pub name: *const c_char,
    /// `AMD`.
    pub vendor_name: *const c_char,
    /// Marketing name.
    pub product_name: *const c_char,
    /// `mi200`.
    pub model_name: *const c_char,
    /// KFD topology node.
    pub node_id: u32,
    /// Index among all agents.
    pub logical_node_id: i32,
    /// Index among agents of this type: Kineto's device number.
    pub logical_node_type_id: i32,
    /// Bit field (not read).
    pub runtime_visibility: u32,
}

// The layout contract (research §2.5 and §8): every field kinetrace reads, at its offset.
const _: () = {
    assert!(size_of::<ContextId>() == 8 && size_of::<UserData>() == 8);
    assert!(size_of::<AsyncCorrelationId>() == 16);
    assert!(size_of::<RecordHeader>() == 16);
    assert!(offset_of!(RecordHeader, kind) == 4 && offset_of!(RecordHeader, payload) == 8);
    assert!(size_of::<Dim3>() == 12);
    assert!(size_of::<KernelDispatchInfo>() == 128);
    assert!(offset_of!(KernelDispatchInfo, agent_id) == 8);
    assert!(offset_of!(KernelDispatchInfo, queue_id) == 16);
    assert!(offset_of!(KernelDispatchInfo, kernel_id) == 24);
    assert!(offset_of!(KernelDispatchInfo, dispatch_id) == 32);
    assert!(offset_of!(KernelDispatchInfo, private_segment_size) == 40);
    assert!(offset_of!(KernelDispatchInfo, group_segment_size) == 44);
    assert!(offset_of!(KernelDispatchInfo, workgroup_size) == 48);
    assert!(offset_of!(KernelDispatchInfo, grid_size) == 60);
    assert!(offset_of!(KernelDispatchInfo, reserved_padding) == 72);
    assert!(size_of::<KernelDispatchRecord>() == 184);
    assert!(offset_of!(KernelDispatchRecord, kind) == 8);
    assert!(offset_of!(KernelDispatchRecord, operation) == 12);
    assert!(offset_of!(KernelDispatchRecord, correlation_id) == 16);
    assert!(offset_of!(KernelDispatchRecord, thread_id) == 32);
    assert!(offset_of!(KernelDispatchRecord, start_timestamp) == 40);
    assert!(offset_of!(KernelDispatchRecord, end_timestamp) == 48);
    assert!(offset_of!(KernelDispatchRecord, dispatch_info) == 56);
    assert!(offset_of!(KernelSymbolRegisterData, kernel_id) == 8);
    assert!(offset_of!(KernelSymbolRegisterData, code_object_id) == 16);
    assert!(offset_of!(KernelSymbolRegisterData, kernel_name) == 24);
    assert!(offset_of!(KernelSymbolRegisterData, kernel_object) == 32);
    assert!(size_of::<KernelSymbolRegisterData>() == KERNEL_SYMBOL_REGISTER_DATA_SIZE_V0);
    assert!(size_of::<ToolConfigureResult>() == 32);
    assert!(offset_of!(ToolConfigureResult, initialize) == 8);
    assert!(offset_of!(ToolConfigureResult, finalize) == 16);
    assert!(offset_of!(ToolConfigureResult, tool_data) == 24);
    assert!(offset_of!(AgentPrefix, id) == 8);
    assert!(offset_of!(AgentPrefix, agent_type) == 16);
    assert!(offset_of!(AgentPrefix, wave_front_size) == 64);
    assert!(offset_of!(AgentPrefix, cu_count) == 72);
    assert!(offset_of!(AgentPrefix, gfx_target_version) == 100);
    assert!(offset_of!(AgentPrefix, local_mem_size) == 176);
    assert!(offset_of!(AgentPrefix, gpu_id) == 192);
    assert!(offset_of!(AgentPrefix, workgroup_max_dim) == 200);
    assert!(offset_of!(AgentPrefix, name) == 248);
    assert!(offset_of!(AgentPrefix, product_name) == 264);
    assert!(offset_of!(AgentPrefix, node_id) == 280);
    assert!(offset_of!(AgentPrefix, logical_node_type_id) == 288);
    assert!(size_of::<AgentPrefix>() == 296);
};

/// The ABI of a library, from `rocprofiler_get_version`'s major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Abi {
    /// SDK 0.4 – 0.6 (ROCm 6.2 – 6.4).
    V0,
    /// SDK 1.x (ROCm 7.0 and later).
    V1,
}

impl Abi {
    /// The ABI of version `major.minor`, `None` for versions with no known layout (before 0.4, the
    /// first shipped beta, or 2.0 and later).
    pub fn of_version(major: u32, minor: u32) -> Option<Abi> {
        match (major, minor) {
            (0, m) if m >= 4 => Some(Abi::V0),
            (1, _) => Some(Abi::V1),
            _ => None,
        }
    }

    /// `rocprofiler_configure`'s `version` argument for `major.minor.patch`.
    pub fn encode_version(major: u32, minor: u32, patch: u32) -> u32 {
        major * 10_000 + minor * 100 + patch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_by_version() {
        assert_eq!(Abi::of_version(0, 3), None);
        assert_eq!(Abi::of_version(0, 4), Some(Abi::V0));
        assert_eq!(Abi::of_version(0, 6), Some(Abi::V0));
        assert_eq!(Abi::of_version(1, 0), Some(Abi::V1));
        assert_eq!(Abi::of_version(1, 1), Some(Abi::V1));
        assert_eq!(Abi::of_version(2, 0), None);
        assert_eq!(Abi::encode_version(1, 1, 0), 10100);
    }

    #[test]
    fn a_library_without_the_symbols_is_refused_by_name() {
        // SAFETY: libm's initialisers are harmless; it lacks every SDK symbol.
        match unsafe { RocprofilerSdk::load(std::path::Path::new("libm.so.6")) } {
            Err(e) => assert!(
                e.to_string()
                    .contains("lacks the required symbol rocprofiler_get_version"),
                "{e}"
            ),
            Ok(_) => panic!("libm is not rocprofiler-sdk"),
        }
        // SAFETY: nothing is opened.
        match unsafe { RocprofilerSdk::load(std::path::Path::new("/nonexistent/lib.so")) } {
            Err(LoadError::Open { path, .. }) => {
                assert_eq!(path, std::path::Path::new("/nonexistent/lib.so"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn per_abi_sizes_match_the_research_table() {
        assert_eq!(size_of::<v0::CallbackRecord>(), 56);
        assert_eq!(size_of::<v1::CallbackRecord>(), 64);
        assert_eq!(size_of::<v0::MemoryCopyRecord>(), 80);
        assert_eq!(size_of::<v1::MemoryCopyRecord>(), 96);
        assert_eq!(size_of::<v0::HipApiRecord>(), 56);
        assert_eq!(size_of::<v1::HipApiRecord>(), 64);
        assert_eq!(size_of::<v0::ClientId>(), 16);
        assert_eq!(size_of::<v1::ClientId>(), 24);
        assert_eq!(size_of::<v1::Agent1_0>(), 304);
        assert_eq!(size_of::<v1::Agent1_1>(), 312);
        assert_eq!(v1::agent_size(0), 304);
        assert_eq!(v1::agent_size(1), 312);
        assert_eq!(v1::agent_size(7), 312);
    }
}
