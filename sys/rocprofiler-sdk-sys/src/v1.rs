//! SDK 1.x (ROCm 7.0 and later, `librocprofiler-sdk.so.1`): the types whose layout differs from
//! 0.x. The correlation id gained `ancestor` (24 bytes), the client id starts with `size`, copy
//! records gained the two addresses, and the agent struct grew in 1.1 (`uuid` 8 → 16 bytes).

use core::ffi::{c_char, c_void};
use core::mem::{offset_of, size_of};

use crate::{AgentId, AgentPrefix, ContextId, UserData};

/// `rocprofiler_correlation_id_t` in 1.x: `{internal, external, ancestor}`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CorrelationId {
    /// The SDK's id.
    pub internal: u64,
    /// The tool's external value.
    pub external: UserData,
    /// The enclosing traced call's internal id.
    pub ancestor: u64,
}

/// `rocprofiler_client_id_t` in 1.x: `{size_t size; const char* name; const uint32_t handle}`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ClientId {
    /// `sizeof` this struct.
    pub size: usize,
    /// The tool writes its name here in `rocprofiler_configure`.
    pub name: *const c_char,
    /// Assigned by the SDK.
    pub handle: u32,
}

/// `rocprofiler_callback_tracing_record_t` in 1.x (64 bytes), passed **by value** to callbacks.
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

/// `rocprofiler_buffer_tracing_memory_copy_record_t` in 1.x (96 bytes; 16-byte async correlation
/// id, so the 0.x prefix is unchanged).
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
    pub correlation_id: crate::AsyncCorrelationId,
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
    /// Destination address.
    pub dst_address: u64,
    /// Source address.
    pub src_address: u64,
}

/// `rocprofiler_buffer_tracing_hip_api_record_t` in 1.x (64 bytes).
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

/// `rocprofiler_buffer_tracing_memory_allocation_record_t` in 1.x (88 bytes; the full 24-byte
/// correlation id). The 0.5/0.6 record (16-byte id) was not checked against a header, so kinetrace
/// reads allocations on 1.x only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemoryAllocationRecord {
    /// `sizeof` the record as written.
    pub size: u64,
    /// The buffer-tracing kind.
    pub kind: u32,
    /// ALLOCATE / VMEM_ALLOCATE / FREE / VMEM_FREE.
    pub operation: u32,
    /// The allocating call's id.
    pub correlation_id: CorrelationId,
    /// The allocating thread.
    pub thread_id: u64,
    /// Start (CLOCK_BOOTTIME ns).
    pub start_timestamp: u64,
    /// End.
    pub end_timestamp: u64,
    /// The agent whose memory it is.
    pub agent_id: AgentId,
    /// The block's address.
    pub address: u64,
    /// The block's size in bytes.
    pub allocation_size: u64,
}

/// `rocprofiler_agent_v0_t` of SDK 1.0 (304 bytes: an 8-byte `uuid`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Agent1_0 {
    /// The fields kinetrace reads.
    pub prefix: AgentPrefix,
    /// `rocprofiler_uuid_t`, 8 bytes in 1.0.
    pub uuid: u64,
}

/// `rocprofiler_agent_v0_t` of SDK 1.1 and later 1.x (312 bytes: a 16-byte `uuid`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Agent1_1 {
    /// The fields kinetrace reads.
    pub prefix: AgentPrefix,
    /// `rocprofiler_uuid_t`, 16 bytes from 1.1.
    pub uuid: [u64; 2],
}

/// The `agent_size` to pass to `rocprofiler_query_available_agents` for SDK `1.minor`: the SDK
/// rejects a size larger than its own struct.
pub fn agent_size(minor: u32) -> usize {
    if minor == 0 {
        size_of::<Agent1_0>()
    } else {
        size_of::<Agent1_1>()
    }
}

const _: () = {
    assert!(size_of::<CorrelationId>() == 24);
    assert!(size_of::<ClientId>() == 24);
    assert!(offset_of!(ClientId, name) == 8 && offset_of!(ClientId, handle) == 16);
    assert!(size_of::<CallbackRecord>() == 64);
    assert!(offset_of!(CallbackRecord, thread_id) == 8);
    assert!(offset_of!(CallbackRecord, correlation_id) == 16);
    assert!(offset_of!(CallbackRecord, kind) == 40);
    assert!(offset_of!(CallbackRecord, operation) == 44);
    assert!(offset_of!(CallbackRecord, phase) == 48);
    assert!(offset_of!(CallbackRecord, payload) == 56);
    assert!(size_of::<MemoryCopyRecord>() == 96);
    assert!(offset_of!(MemoryCopyRecord, operation) == 12);
    assert!(offset_of!(MemoryCopyRecord, correlation_id) == 16);
    assert!(offset_of!(MemoryCopyRecord, thread_id) == 32);
    assert!(offset_of!(MemoryCopyRecord, start_timestamp) == 40);
    assert!(offset_of!(MemoryCopyRecord, end_timestamp) == 48);
    assert!(offset_of!(MemoryCopyRecord, dst_agent_id) == 56);
    assert!(offset_of!(MemoryCopyRecord, src_agent_id) == 64);
    assert!(offset_of!(MemoryCopyRecord, bytes) == 72);
    assert!(offset_of!(MemoryCopyRecord, dst_address) == 80);
    assert!(offset_of!(MemoryCopyRecord, src_address) == 88);
    assert!(size_of::<HipApiRecord>() == 64);
    assert!(offset_of!(HipApiRecord, correlation_id) == 16);
    assert!(offset_of!(HipApiRecord, start_timestamp) == 40);
    assert!(offset_of!(HipApiRecord, end_timestamp) == 48);
    assert!(offset_of!(HipApiRecord, thread_id) == 56);
    assert!(size_of::<MemoryAllocationRecord>() == 88);
    assert!(offset_of!(MemoryAllocationRecord, operation) == 12);
    assert!(offset_of!(MemoryAllocationRecord, correlation_id) == 16);
    assert!(offset_of!(MemoryAllocationRecord, thread_id) == 40);
    assert!(offset_of!(MemoryAllocationRecord, start_timestamp) == 48);
    assert!(offset_of!(MemoryAllocationRecord, end_timestamp) == 56);
    assert!(offset_of!(MemoryAllocationRecord, agent_id) == 64);
    assert!(offset_of!(MemoryAllocationRecord, address) == 72);
    assert!(offset_of!(MemoryAllocationRecord, allocation_size) == 80);
    assert!(offset_of!(Agent1_0, uuid) == 296 && size_of::<Agent1_0>() == 304);
    assert!(offset_of!(Agent1_1, uuid) == 296 && size_of::<Agent1_1>() == 312);
};
