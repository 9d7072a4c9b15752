//! The HIP runtime API callback payload, `rocprofiler_callback_tracing_hip_api_data_t`
//! (`rocprofiler-sdk/hip/api_args.h`): `{uint64_t size; rocprofiler_hip_api_args_t args;
//! rocprofiler_hip_api_retval_t retval}`, 120 bytes in the SDK releases the research checked
//! (§8.7). `args` is a union with one struct per HIP function, each member in the order of the
//! function's parameters, so its layout follows HIP's signatures, not the SDK's ABI: the same in
//! 0.x and 1.x. The union is as large as its largest member and grows with HIP, so kinetrace
//! reads only the structs below, at [`HIP_API_ARGS_OFFSET`], and only when the payload's `size`
//! covers the one it reads ([`HipApiData::covers`]).
//!
//! Only the calls Kineto writes arguments for are defined: the kernel launches, the copies with a
//! plain `(dst, src, sizeBytes, kind[, stream])` list, `hipMalloc` and `hipFree`; and the memsets
//! (`(dst, value, count[, stream])`), whose size names the bytes of the ROCclr fill kernels they
//! dispatch.

use core::ffi::c_void;
use core::mem::{offset_of, size_of};

use crate::Dim3;

/// The payload's leading `size`, the one field before the union.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipApiData {
    /// `sizeof` the payload as the SDK wrote it.
    pub size: u64,
}

/// Where `args` starts in the payload.
pub const HIP_API_ARGS_OFFSET: usize = 8;

/// The payload size the research measured (`size` of SDK 0.6 / 1.x builds against HIP 6.x/7.x).
pub const HIP_API_DATA_SIZE: usize = 120;

impl HipApiData {
    /// Whether a payload of this `size` holds an argument struct `T` in full.
    pub fn covers<T>(&self) -> bool {
        self.size as usize >= HIP_API_ARGS_OFFSET + size_of::<T>()
    }
}

/// `args.hipLaunchKernel` (and the prefix of `args.hipExtLaunchKernel`, whose extra members
/// follow `stream`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LaunchKernelArgs {
    /// The host-side function (`const void*`).
    pub function_address: *const c_void,
    /// `numBlocks` (grid in work-groups).
    pub num_blocks: Dim3,
    /// `dimBlocks` (work-items per work-group).
    pub dim_blocks: Dim3,
    /// `void** args`.
    pub args: *mut *mut c_void,
    /// `size_t sharedMemBytes`.
    pub shared_mem_bytes: usize,
    /// `hipStream_t`.
    pub stream: *mut c_void,
}

/// `args.hipModuleLaunchKernel` (`hipModuleLaunchCooperativeKernel` has the same prefix).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleLaunchKernelArgs {
    /// `hipFunction_t`.
    pub func: *mut c_void,
    /// `gridDimX/Y/Z` (work-groups).
    pub grid_dim: [u32; 3],
    /// `blockDimX/Y/Z`.
    pub block_dim: [u32; 3],
    /// `unsigned int sharedMemBytes`.
    pub shared_mem_bytes: u32,
    /// `hipStream_t`.
    pub stream: *mut c_void,
    /// `void** kernelParams`.
    pub kernel_params: *mut *mut c_void,
    /// `void** extra`.
    pub extra: *mut *mut c_void,
}

/// `args.hipExtModuleLaunchKernel` (and the prefix of `args.hipHccModuleLaunchKernel`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExtModuleLaunchKernelArgs {
    /// `hipFunction_t`.
    pub func: *mut c_void,
    /// `globalWorkSizeX/Y/Z` (work-items: Kineto writes them as the grid unchanged).
    pub global_work_size: [u32; 3],
    /// `localWorkSizeX/Y/Z`.
    pub local_work_size: [u32; 3],
    /// `size_t sharedMemBytes`.
    pub shared_mem_bytes: usize,
    /// `hipStream_t`.
    pub stream: *mut c_void,
}

/// `args.hipMemcpy`: `(dst, src, sizeBytes, kind)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemcpyArgs {
    /// `void* dst`.
    pub dst: *mut c_void,
    /// `const void* src`.
    pub src: *const c_void,
    /// `size_t sizeBytes`.
    pub size_bytes: usize,
    /// `hipMemcpyKind` (a C enum).
    pub kind: i32,
}

/// `args.hipMemcpyAsync` and `args.hipMemcpyWithStream`: `(dst, src, sizeBytes, kind, stream)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemcpyStreamArgs {
    /// `void* dst`.
    pub dst: *mut c_void,
    /// `const void* src`.
    pub src: *const c_void,
    /// `size_t sizeBytes`.
    pub size_bytes: usize,
    /// `hipMemcpyKind`.
    pub kind: i32,
    /// `hipStream_t`.
    pub stream: *mut c_void,
}

/// `args.hipMalloc`: `(void** ptr, size_t size)`; `*ptr` holds the block at EXIT.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MallocArgs {
    /// The caller's out-pointer.
    pub ptr: *mut *mut c_void,
    /// `size_t size`.
    pub size: usize,
}

/// `args.hipFree`: `(void* ptr)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FreeArgs {
    /// The block freed.
    pub ptr: *mut c_void,
}

/// `args.hipMemset`, `args.hipMemsetD8`, `args.hipMemsetD16`, `args.hipMemsetD32`:
/// `(dst, value, count)`; `count` is bytes for `hipMemset`/`D8`, elements of 2 or 4 bytes for
/// `D16`/`D32`. The value is an `int`, `unsigned short` or `unsigned char`: each is padded to the
/// `size_t` that follows, so `count` is at 16 in all four.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemsetArgs {
    /// `void* dst` / `hipDeviceptr_t dest`.
    pub dst: *mut c_void,
    /// The value (only its low bytes are meaningful for `D8`/`D16`).
    pub value: i32,
    /// `size_t sizeBytes` / `size_t count`.
    pub count: usize,
}

/// `args.hipMemsetAsync` and `args.hipMemsetD{8,16,32}Async`: `(dst, value, count, stream)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemsetStreamArgs {
    /// `void* dst` / `hipDeviceptr_t dest`.
    pub dst: *mut c_void,
    /// The value.
    pub value: i32,
    /// `size_t sizeBytes` / `size_t count`.
    pub count: usize,
    /// `hipStream_t`.
    pub stream: *mut c_void,
}

// The offsets of `api_args.h` on x86-64 (each struct's members in parameter order, natural
// alignment), and that every struct fits in the union of the measured payload.
const _: () = {
    assert!(offset_of!(LaunchKernelArgs, num_blocks) == 8);
    assert!(offset_of!(LaunchKernelArgs, dim_blocks) == 20);
    assert!(offset_of!(LaunchKernelArgs, args) == 32);
    assert!(offset_of!(LaunchKernelArgs, shared_mem_bytes) == 40);
    assert!(offset_of!(LaunchKernelArgs, stream) == 48);
    assert!(size_of::<LaunchKernelArgs>() == 56);
    assert!(offset_of!(ModuleLaunchKernelArgs, grid_dim) == 8);
    assert!(offset_of!(ModuleLaunchKernelArgs, block_dim) == 20);
    assert!(offset_of!(ModuleLaunchKernelArgs, shared_mem_bytes) == 32);
    assert!(offset_of!(ModuleLaunchKernelArgs, stream) == 40);
    assert!(offset_of!(ModuleLaunchKernelArgs, extra) == 56);
    assert!(size_of::<ModuleLaunchKernelArgs>() == 64);
    assert!(offset_of!(ExtModuleLaunchKernelArgs, global_work_size) == 8);
    assert!(offset_of!(ExtModuleLaunchKernelArgs, local_work_size) == 20);
    assert!(offset_of!(ExtModuleLaunchKernelArgs, shared_mem_bytes) == 32);
    assert!(offset_of!(ExtModuleLaunchKernelArgs, stream) == 40);
    assert!(size_of::<ExtModuleLaunchKernelArgs>() == 48);
    assert!(offset_of!(MemcpyArgs, src) == 8);
    assert!(offset_of!(MemcpyArgs, size_bytes) == 16);
    assert!(offset_of!(MemcpyArgs, kind) == 24);
    assert!(size_of::<MemcpyArgs>() == 32);
    assert!(offset_of!(MemcpyStreamArgs, kind) == 24);
    assert!(offset_of!(MemcpyStreamArgs, stream) == 32);
    assert!(size_of::<MemcpyStreamArgs>() == 40);
    assert!(offset_of!(MallocArgs, size) == 8);
    assert!(size_of::<MallocArgs>() == 16);
    assert!(size_of::<FreeArgs>() == 8);
    assert!(offset_of!(MemsetArgs, value) == 8);
    assert!(offset_of!(MemsetArgs, count) == 16);
    assert!(size_of::<MemsetArgs>() == 24);
    assert!(offset_of!(MemsetStreamArgs, count) == 16);
    assert!(offset_of!(MemsetStreamArgs, stream) == 24);
    assert!(size_of::<MemsetStreamArgs>() == 32);
    assert!(HIP_API_ARGS_OFFSET + size_of::<ModuleLaunchKernelArgs>() <= HIP_API_DATA_SIZE);
};
