//! The `CUPTI_ACTIVITY_KIND_*` values kinetrace reads (stable across 11.8 – 13.5).

#![allow(missing_docs)]

use kinetrace_cupti_sys::v13 as sys;

pub const MEMCPY: u32 = sys::CUPTI_ACTIVITY_KIND_MEMCPY;
pub const MEMSET: u32 = sys::CUPTI_ACTIVITY_KIND_MEMSET;
pub const KERNEL: u32 = sys::CUPTI_ACTIVITY_KIND_KERNEL;
pub const DRIVER: u32 = sys::CUPTI_ACTIVITY_KIND_DRIVER;
pub const RUNTIME: u32 = sys::CUPTI_ACTIVITY_KIND_RUNTIME;
pub const DEVICE: u32 = sys::CUPTI_ACTIVITY_KIND_DEVICE;
pub const CONTEXT: u32 = sys::CUPTI_ACTIVITY_KIND_CONTEXT;
pub const CONCURRENT_KERNEL: u32 = sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
pub const NAME: u32 = sys::CUPTI_ACTIVITY_KIND_NAME;
pub const MARKER: u32 = sys::CUPTI_ACTIVITY_KIND_MARKER;
pub const OVERHEAD: u32 = sys::CUPTI_ACTIVITY_KIND_OVERHEAD;
pub const MEMCPY2: u32 = sys::CUPTI_ACTIVITY_KIND_MEMCPY2;
pub const SYNCHRONIZATION: u32 = sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
pub const EXTERNAL_CORRELATION: u32 = sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
pub const MEMORY2: u32 = sys::CUPTI_ACTIVITY_KIND_MEMORY2;
pub const MEMORY_POOL: u32 = sys::CUPTI_ACTIVITY_KIND_MEMORY_POOL;
pub const GRAPH_TRACE: u32 = sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE;
pub const CUDA_EVENT: u32 = sys::CUPTI_ACTIVITY_KIND_CUDA_EVENT;

/// The vendor's name of a kind kinetrace reads, without the `CUPTI_ACTIVITY_KIND_` prefix.
pub fn name(kind: u32) -> Option<&'static str> {
    Some(match kind {
        MEMCPY => "MEMCPY",
        MEMSET => "MEMSET",
        KERNEL => "KERNEL",
        DRIVER => "DRIVER",
        RUNTIME => "RUNTIME",
        DEVICE => "DEVICE",
        CONTEXT => "CONTEXT",
        CONCURRENT_KERNEL => "CONCURRENT_KERNEL",
        NAME => "NAME",
        MARKER => "MARKER",
        OVERHEAD => "OVERHEAD",
        MEMCPY2 => "MEMCPY2",
        SYNCHRONIZATION => "SYNCHRONIZATION",
        EXTERNAL_CORRELATION => "EXTERNAL_CORRELATION",
        MEMORY2 => "MEMORY2",
        MEMORY_POOL => "MEMORY_POOL",
        GRAPH_TRACE => "GRAPH_TRACE",
        CUDA_EVENT => "CUDA_EVENT",
        _ => return None,
    })
}
