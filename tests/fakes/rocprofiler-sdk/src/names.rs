//! Kind and operation numbers and names per ABI (shifted under `FAKE_ROCP_RENUMBER`).

use super::*;

pub(crate) fn kind_shift() -> i32 {
    if faults().renumber {
        40
    } else {
        0
    }
}

pub(crate) fn op_shift() -> i32 {
    if faults().renumber {
        7
    } else {
        0
    }
}

/// Buffer-tracing kinds of this ABI: (number, name), ascending, NONE included (as the SDK's
/// iterator does).
pub(crate) fn buffer_kinds() -> Vec<(i32, &'static str)> {
    let s = kind_shift();
    let (scratch, alloc) = match abi() {
        Abi::V0 => (13, 17),
        Abi::V1 => (12, 16),
    };
    vec![
        (0, "NONE"),
        (5 + s, "HIP_RUNTIME_API"),
        (10 + s, "MEMORY_COPY"),
        (11 + s, "KERNEL_DISPATCH"),
        (scratch + s, "SCRATCH_MEMORY"),
        (alloc + s, "MEMORY_ALLOCATION"),
    ]
}

/// Callback-tracing kinds (stable across ABIs).
pub(crate) fn callback_kinds() -> Vec<(i32, &'static str)> {
    let s = kind_shift();
    vec![
        (0, "NONE"),
        (5 + s, "HIP_RUNTIME_API"),
        (7 + s, "MARKER_CORE_API"),
        (10 + s, "CODE_OBJECT"),
        (12 + s, "KERNEL_DISPATCH"),
        (13 + s, "MEMORY_COPY"),
    ]
}

pub(crate) fn kind_number(table: &[(i32, &'static str)], name: &str) -> i32 {
    table
        .iter()
        .find(|(_, n)| *n == name)
        .map_or(-1, |(k, _)| *k)
}

pub(crate) fn buffer_kind(name: &str) -> i32 {
    kind_number(&buffer_kinds(), name)
}

pub(crate) fn callback_kind(name: &str) -> i32 {
    kind_number(&callback_kinds(), name)
}

/// HIP runtime API operations: (1.x id, name). 0.x ids are the fake's own (1.x minus 3).
pub(crate) const HIP_API: &[(i32, &str)] = &[
    (48, "hipDeviceSynchronize"),
    (84, "hipExtLaunchKernel"),
    (90, "hipFree"),
    (120, "hipGetDevice"),
    (166, "hipGraphLaunch"),
    (214, "hipLaunchKernel"),
    (215, "hipMalloc"),
    (259, "hipMemcpy"),
    (268, "hipMemcpyAsync"),
    (287, "hipMemcpyWithStream"),
    (293, "hipMemsetAsync"),
    (308, "hipModuleLaunchKernel"),
    (330, "hipStreamSynchronize"),
];

pub(crate) fn hip_ops() -> Vec<(i32, &'static str)> {
    let base = match abi() {
        Abi::V0 => -3,
        Abi::V1 => 0,
    };
    HIP_API
        .iter()
        .map(|&(id, n)| (id + base + op_shift(), n))
        .collect()
}

pub(crate) fn memcpy_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "MEMORY_COPY_NONE"),
        (1 + s, "MEMORY_COPY_HOST_TO_HOST"),
        (2 + s, "MEMORY_COPY_HOST_TO_DEVICE"),
        (3 + s, "MEMORY_COPY_DEVICE_TO_HOST"),
        (4 + s, "MEMORY_COPY_DEVICE_TO_DEVICE"),
    ]
}

pub(crate) fn dispatch_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "KERNEL_DISPATCH_NONE"),
        (1 + s, "KERNEL_DISPATCH_ENQUEUE"),
        (2 + s, "KERNEL_DISPATCH_COMPLETE"),
    ]
}

pub(crate) fn code_object_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "CODE_OBJECT_NONE"),
        (1 + s, "CODE_OBJECT_LOAD"),
        (2 + s, "CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER"),
    ]
}

/// roctx's core API (`ROCPROFILER_MARKER_CORE_API_ID_*`).
pub(crate) fn marker_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (s, "roctxMarkA"),
        (1 + s, "roctxRangePushA"),
        (2 + s, "roctxRangePop"),
        (3 + s, "roctxRangeStartA"),
        (4 + s, "roctxRangeStop"),
    ]
}

pub(crate) fn allocation_ops() -> Vec<(i32, &'static str)> {
    let s = op_shift();
    vec![
        (0, "MEMORY_ALLOCATION_NONE"),
        (1 + s, "MEMORY_ALLOCATION_ALLOCATE"),
        (2 + s, "MEMORY_ALLOCATION_VMEM_ALLOCATE"),
        (3 + s, "MEMORY_ALLOCATION_FREE"),
        (4 + s, "MEMORY_ALLOCATION_VMEM_FREE"),
    ]
}

pub(crate) fn buffer_ops(kind: i32) -> Option<Vec<(i32, &'static str)>> {
    let name = buffer_kinds().into_iter().find(|(k, _)| *k == kind)?.1;
    Some(match name {
        "MEMORY_COPY" => memcpy_ops(),
        "KERNEL_DISPATCH" => dispatch_ops(),
        "HIP_RUNTIME_API" => hip_ops(),
        "MEMORY_ALLOCATION" => allocation_ops(),
        _ => Vec::new(),
    })
}

pub(crate) fn callback_ops(kind: i32) -> Option<Vec<(i32, &'static str)>> {
    let name = callback_kinds().into_iter().find(|(k, _)| *k == kind)?.1;
    Some(match name {
        "HIP_RUNTIME_API" => hip_ops(),
        "CODE_OBJECT" => code_object_ops(),
        "MARKER_CORE_API" => marker_ops(),
        "MEMORY_COPY" => memcpy_ops(),
        "KERNEL_DISPATCH" => dispatch_ops(),
        _ => Vec::new(),
    })
}
