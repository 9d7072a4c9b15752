/*!
Raw roctracer 4.1 bindings for kinetrace (`libroctracer64.so.4`, ROCm 5.x – 7.2): the 64-byte
activity record, the pool properties, the prefix of the HIP API callback data, the constants, and
a [`libloading`] function table.

Like `kinetrace-rocprofiler-sdk-sys`, nothing is tied to a ROCm found at build time: the types are
hand-written from the research's layout table (`../shared/research/rocm.md` §1.3, offsets compiled
against the real `ext/prof_protocol.h` on x86-64) and every offset kinetrace relies on is a
compile-time assertion. roctracer 4.1 has one record ABI for its whole life, so there is one
definition. The library is opened at run time by [`Roctracer::load`]: a missing optional entry
point is `None`, a missing required one is an error naming the library and the symbol.

Used by `kinetrace-rocm`'s roctracer fallback (see `docs/rocm-support.md`).
*/
#![deny(missing_docs)]

use core::ffi::{c_char, c_void};
use core::mem::{offset_of, size_of};

pub mod hip_args;
mod table;

pub use table::{LoadError, Roctracer, OPTIONAL_SYMBOLS, REQUIRED_SYMBOLS};

/// `roctracer_status_t` (`int`).
pub type Status = i32;
/// `ROCTRACER_STATUS_SUCCESS`.
pub const STATUS_SUCCESS: Status = 0;
/// `ROCTRACER_STATUS_ERROR_MISMATCHED_EXTERNAL_CORRELATION_ID` (an unbalanced pop).
pub const STATUS_ERROR_MISMATCHED_EXTERNAL_CORRELATION_ID: Status = -7;

/// `ACTIVITY_DOMAIN_HIP_OPS` (alias `HCC_OPS`): GPU operations.
pub const DOMAIN_HIP_OPS: u32 = 2;
/// `ACTIVITY_DOMAIN_HIP_API`: HIP runtime calls.
pub const DOMAIN_HIP_API: u32 = 3;
/// `ACTIVITY_DOMAIN_EXT_API`: external correlation records.
pub const DOMAIN_EXT_API: u32 = 5;
/// `ACTIVITY_API_PHASE_ENTER`.
pub const PHASE_ENTER: u32 = 0;
/// `ACTIVITY_API_PHASE_EXIT`.
pub const PHASE_EXIT: u32 = 1;
/// `HIP_OP_ID_DISPATCH`.
pub const HIP_OP_DISPATCH: u32 = 0;
/// `HIP_OP_ID_COPY` (copies and fills).
pub const HIP_OP_COPY: u32 = 1;
/// `HIP_OP_ID_BARRIER` (markers; Kineto drops them).
pub const HIP_OP_BARRIER: u32 = 2;
/// ROCclr command kind of a fill (`FILL_BUFFER`): a memset.
pub const KIND_FILL_BUFFER: u32 = 0x1207;

/// `roctracer_record_t` (= `activity_record_t`, 64 bytes, align 8). Unions are flattened into
/// words with accessors for each view.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// `activity_domain_t`.
    pub domain: u32,
    /// For HIP_OPS: the ROCclr/OpenCL command kind (`0x11F0` kernel … `0x1207` fill).
    pub kind: u32,
    /// For HIP_OPS: `HIP_OP_ID_*`.
    pub op: u32,
    /// Padding.
    pub _pad: u32,
    /// The id the enqueuing HIP call's callback received.
    pub correlation_id: u64,
    /// Start, host clock ns.
    pub begin_ns: u64,
    /// End.
    pub end_ns: u64,
    /// Union B, first word: `int device_id` (HIP_OPS: the KFD node id), or `process_id` /
    /// `thread_id` (API records), or the low half of `external_id` (EXT_API).
    pub b: [u32; 2],
    /// Union B, second part: `queue_id` (HIP_OPS: the HIP stream's queue index).
    pub queue_id: u64,
    /// Union C: `bytes` (copies, fills) or `const char* kernel_name` (dispatches, valid only
    /// during the buffer callback).
    pub c: u64,
}

impl Record {
    /// HIP_OPS: the device's KFD node id.
    pub fn device_id(&self) -> i32 {
        self.b[0] as i32
    }
    /// API records: the process id.
    pub fn process_id(&self) -> u32 {
        self.b[0]
    }
    /// API records: the thread id.
    pub fn thread_id(&self) -> u32 {
        self.b[1]
    }
    /// EXT_API records: the external id.
    pub fn external_id(&self) -> u64 {
        u64::from(self.b[0]) | (u64::from(self.b[1]) << 32)
    }
    /// Copies and fills: bytes.
    pub fn bytes(&self) -> u64 {
        self.c
    }
    /// Dispatches: the kernel name (null on old HIP; valid only during the buffer callback).
    pub fn kernel_name(&self) -> *const c_char {
        self.c as usize as *const c_char
    }
}

/// `void (*)(char** ptr, size_t size, void* arg)`: a tool-supplied allocator for the pool.
pub type AllocFn = unsafe extern "C" fn(ptr: *mut *mut c_char, size: usize, arg: *mut c_void);
/// `void (*)(const char* begin, const char* end, void* arg)`: runs on roctracer's consumer thread.
pub type BufferCallback =
    unsafe extern "C" fn(begin: *const c_char, end: *const c_char, arg: *mut c_void);
/// `void (*)(uint32_t domain, uint32_t cid, const void* data, void* arg)`, at ENTER and EXIT.
pub type ApiCallback =
    unsafe extern "C" fn(domain: u32, cid: u32, data: *const c_void, arg: *mut c_void);

/// `roctracer_properties_t` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Properties {
    /// Unused.
    pub mode: u32,
    /// Bytes of each half of the pool's double buffer.
    pub buffer_size: usize,
    /// Optional allocator.
    pub alloc_fun: Option<AllocFn>,
    /// Its argument.
    pub alloc_arg: *mut c_void,
    /// Called with each filled or flushed half.
    pub buffer_callback_fun: Option<BufferCallback>,
    /// Its argument.
    pub buffer_callback_arg: *mut c_void,
}

/// The stable prefix of `hip_api_data_t` (HIP's `hip_prof_str.h`): the union of arguments after
/// it grows with every HIP release, so only these offsets are read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipApiDataPrefix {
    /// roctracer's id for the call, stamped on the operations it enqueues.
    pub correlation_id: u64,
    /// ENTER / EXIT.
    pub phase: u32,
    /// Padding before the union at 16.
    pub _pad: u32,
}

/// The offset of `hip_api_data_t.args`.
pub const HIP_API_DATA_ARGS_OFFSET: usize = 16;

const _: () = {
    assert!(size_of::<Record>() == 64);
    assert!(offset_of!(Record, kind) == 4);
    assert!(offset_of!(Record, op) == 8);
    assert!(offset_of!(Record, correlation_id) == 16);
    assert!(offset_of!(Record, begin_ns) == 24);
    assert!(offset_of!(Record, end_ns) == 32);
    assert!(offset_of!(Record, b) == 40);
    assert!(offset_of!(Record, queue_id) == 48);
    assert!(offset_of!(Record, c) == 56);
    assert!(size_of::<Properties>() == 48);
    assert!(offset_of!(Properties, buffer_size) == 8);
    assert!(offset_of!(Properties, alloc_fun) == 16);
    assert!(offset_of!(Properties, alloc_arg) == 24);
    assert!(offset_of!(Properties, buffer_callback_fun) == 32);
    assert!(offset_of!(Properties, buffer_callback_arg) == 40);
    assert!(offset_of!(HipApiDataPrefix, phase) == 8);
    assert!(size_of::<HipApiDataPrefix>() == HIP_API_DATA_ARGS_OFFSET);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_views() {
        let r = Record {
            domain: DOMAIN_HIP_OPS,
            kind: KIND_FILL_BUFFER,
            op: HIP_OP_COPY,
            _pad: 0,
            correlation_id: 9,
            begin_ns: 1,
            end_ns: 2,
            b: [0xffff_fffe, 7],
            queue_id: 3,
            c: 4096,
        };
        assert_eq!(r.device_id(), -2);
        assert_eq!((r.process_id(), r.thread_id()), (0xffff_fffe, 7));
        assert_eq!(r.external_id(), 0x7_ffff_fffe);
        assert_eq!(r.bytes(), 4096);
    }

    #[test]
    fn a_library_without_the_symbols_is_refused_by_name() {
        // SAFETY: libm's initialisers are harmless; it lacks every roctracer symbol.
        match unsafe { Roctracer::load(std::path::Path::new("libm.so.6")) } {
            Err(e) => assert!(
                e.to_string()
                    .contains("lacks the required symbol roctracer_version_major"),
                "{e}"
            ),
            Ok(_) => panic!("libm is not roctracer"),
        }
    }
}
