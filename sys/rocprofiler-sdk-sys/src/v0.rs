//! SDK 0.4 – 0.6 (ROCm 6.2 – 6.4, `librocprofiler-sdk.so.0`): the types whose layout differs from
//! 1.x. The correlation id is 16 bytes (no `ancestor`), and the client id has no `size` field.

use core::ffi::{c_char, c_void};
use core::mem::{offset_of, size_of};

use crate::{AgentId, ContextId, UserData};

/// `rocprofiler_correlation_id_t` in 0.x: `{internal, external}`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CorrelationId {
    /// The SDK's id.
    pub internal: u64,
    /// The tool's external value.
    pub external: UserData,
}

/// `rocprofiler_client_id_t` in 0.x: `{const char* name; const uint32_t handle}`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ClientId {
    /// The tool writes its name here in `rocprofiler_configure`.
    pub name: *const c_char,
    /// Assigned by the SDK.
    pub handle: u32,
}

/// `rocprofiler_callback_tracing_record_t` in 0.x (56 bytes), passed **by value** to callbacks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallbackRecord {
    /// The context the service was configured on.
    pub context_id: ContextId,
    /// The calling thread.
    pub thread_id: u64,
    /// The call's id.
    pub correlation_id: CorrelationId,
    /// The callback-tracing kind.
    pub kind: u32,
    /// The operation (API id) within the kind.
    pub operation: u32,
    /// ENTER / EXIT (LOAD / UNLOAD for code objects).
    pub phase: u32,
    /// The kind's payload.
    pub payload: *mut c_void,
}

/// `rocprofiler_buffer_tracing_memory_copy_record_t` in 0.x (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemoryCopyRecord {
    /// `sizeof` the record as written.
    pub size: u64,
    /// The buffer-tracing kind.
    pub kind: u32,
    /// The copy direction.
    pub operation: u32,
    /// The enqueuing call's id.
    pub correlation_id: CorrelationId,
    /// The enqueuing thread.
    pub thread_id: u64,
    /// Start (CLOCK_BOOTTIME ns).
    pub start_timestamp: u64,
    /// End.
    pub end_timestamp: u64,
    /// Destination agent.
    pub dst_agent_id: AgentId,
    /// Source agent.
    pub src_agent_id: AgentId,
    /// Bytes copied.
    pub bytes: u64,
}

/// `rocprofiler_buffer_tracing_hip_api_record_t` in 0.x (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipApiRecord {
    /// `sizeof` the record as written.
    pub size: u64,
    /// The buffer-tracing kind.
    pub kind: u32,
    /// The HIP runtime API id (the SDK's numbering, not `HIP_API_ID_*`).
    pub operation: u32,
    /// The call's id.
    pub correlation_id: CorrelationId,
    /// Start.
    pub start_timestamp: u64,
    /// End.
    pub end_timestamp: u64,
    /// The calling thread.
    pub thread_id: u64,
}

const _: () = {
    assert!(size_of::<CorrelationId>() == 16);
    assert!(size_of::<ClientId>() == 16);
    assert!(offset_of!(ClientId, name) == 0 && offset_of!(ClientId, handle) == 8);
    assert!(size_of::<CallbackRecord>() == 56);
    assert!(offset_of!(CallbackRecord, thread_id) == 8);
    assert!(offset_of!(CallbackRecord, correlation_id) == 16);
    assert!(offset_of!(CallbackRecord, kind) == 32);
    assert!(offset_of!(CallbackRecord, operation) == 36);
    assert!(offset_of!(CallbackRecord, phase) == 40);
    assert!(offset_of!(CallbackRecord, payload) == 48);
    assert!(size_of::<MemoryCopyRecord>() == 80);
    assert!(offset_of!(MemoryCopyRecord, operation) == 12);
    assert!(offset_of!(MemoryCopyRecord, correlation_id) == 16);
    assert!(offset_of!(MemoryCopyRecord, thread_id) == 32);
    assert!(offset_of!(MemoryCopyRecord, start_timestamp) == 40);
    assert!(offset_of!(MemoryCopyRecord, end_timestamp) == 48);
    assert!(offset_of!(MemoryCopyRecord, dst_agent_id) == 56);
    assert!(offset_of!(MemoryCopyRecord, src_agent_id) == 64);
    assert!(offset_of!(MemoryCopyRecord, bytes) == 72);
    assert!(size_of::<HipApiRecord>() == 56);
    assert!(offset_of!(HipApiRecord, start_timestamp) == 32);
    assert!(offset_of!(HipApiRecord, end_timestamp) == 40);
    assert!(offset_of!(HipApiRecord, thread_id) == 48);
};
