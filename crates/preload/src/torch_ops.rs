//! The entry points of kinetrace's compiled PyTorch extension (`python/kinetrace/_ops_ext.cpp`):
//! its RecordFunction callbacks call [`kinetrace_op_begin`] and [`kinetrace_op_end`] for every op
//! inside a window. They run once per op per thread, so nothing here allocates once a name has
//! been seen: names are interned through a small per-thread cache keyed by the name's address.
//! An op's args (shapes, types, strides, scalars, a collective's sizes) come as an id the
//! extension got from [`kinetrace_op_args`] once per distinct text and per
//! [`kinetrace_op_args_generation`].
//!
//! An address alone does not identify a name: operators' names live in their schema for the
//! process, but autograd functions' names live in their RecordFunction, and the next one may put
//! another name at the same address. So a cached entry keeps the name's bytes, and a hit compares
//! them with the string at the address (stopping at the first difference, so never past its end).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::catch_unwind;
use std::sync::atomic::AtomicU32;

use kinetrace_agent::ops::{self, ArgsId, AutogradRole, Begun, NameId};

/// Entries in the per-thread name cache (a power of two): direct-mapped by address.
const SLOTS: usize = 256;

/// `kinetrace_op_begin`'s flags: a `record_function` range (a `user_annotation`, not an op)...
const ANNOTATION: u32 = 1;
/// ... autograd's `evaluate_function: …` range ...
const EVALUATE_FUNCTION: u32 = 2;
/// ... a backward function (PyTorch's `BACKWARD_FUNCTION` scope) ...
const BACKWARD_FUNCTION: u32 = 4;
/// ... a Python frame around ops (`with_stack`): a `python_function` range whose `args` is its
/// `CallFrom` text.
const PYTHON_FUNCTION: u32 = 8;

struct Slot {
    address: usize,
    bytes: Box<[u8]>,
    id: NameId,
}

thread_local! {
    static NAMES: RefCell<Vec<Option<Slot>>> = RefCell::new((0..SLOTS).map(|_| None).collect());
}

/// Whether the NUL-terminated string at `name` is `bytes`.
///
/// # Safety
/// `name` points to a NUL-terminated string.
unsafe fn same(name: *const c_char, bytes: &[u8]) -> bool {
    for (i, &b) in bytes.iter().enumerate() {
        // SAFETY: every byte before index i matched a byte of `bytes`, none of which is NUL
        // (interned names come from `CStr::to_bytes`), so index i is within the string or its NUL.
        if unsafe { *name.add(i) } as u8 != b {
            return false;
        }
    }
    // SAFETY: as above, index bytes.len() is at most the terminator's.
    unsafe { *name.add(bytes.len()) == 0 }
}

/// The interned id of the name at `name`.
///
/// # Safety
/// `name` points to a NUL-terminated string.
unsafe fn name_id(name: *const c_char) -> NameId {
    let address = name as usize;
    let slot = ((address >> 3) ^ (address >> 11)) & (SLOTS - 1);
    let cached = NAMES.try_with(|t| {
        let t = t.try_borrow().ok()?;
        let s = t[slot].as_ref()?;
        // SAFETY: per the contract.
        (s.address == address && unsafe { same(name, &s.bytes) }).then_some(s.id)
    });
    if let Ok(Some(id)) = cached {
        return id;
    }
    // SAFETY: per the contract.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    let id = ops::intern_name(&String::from_utf8_lossy(bytes));
    let _ = NAMES.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            t[slot] = Some(Slot {
                address,
                bytes: bytes.into(),
                id,
            });
        }
    });
    id
}

/// A RecordFunction began on this thread: inside a window its span begins (see
/// `kinetrace_agent::ops::begin`). `key` identifies it for [`kinetrace_op_end`]; `sequence` is
/// its autograd sequence number (negative: none); `flags`: 1 a `record_function` range, 2
/// autograd's `evaluate_function` range, 4 a backward function, 8 a Python frame (a
/// `python_function` range, ended by [`kinetrace_op_end`] with its key like an op); `args` is an
/// id from [`kinetrace_op_args`] (0: none).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_op_begin(
    key: *const c_void,
    name: *const c_char,
    sequence: i64,
    flags: u32,
    args: u32,
) {
    let _ = catch_unwind(|| {
        if name.is_null() {
            return;
        }
        // SAFETY: per the contract, a NUL-terminated string.
        let id = unsafe { name_id(name) };
        if flags & PYTHON_FUNCTION != 0 {
            ops::begin_python(key as usize, id, (args != 0).then_some(ArgsId(args)));
            return;
        }
        let role = if flags & EVALUATE_FUNCTION != 0 {
            AutogradRole::EvaluateFunction
        } else if flags & BACKWARD_FUNCTION != 0 {
            AutogradRole::BackwardFunction
        } else {
            AutogradRole::None
        };
        let what = Begun {
            annotation: flags & ANNOTATION != 0,
            role,
            args: (args != 0).then_some(ArgsId(args)),
        };
        ops::begin(key as usize, id, sequence, what);
    });
}

/// The RecordFunction begun with `key` on this thread ended.
#[no_mangle]
pub extern "C" fn kinetrace_op_end(key: *const c_void) {
    let _ = catch_unwind(|| ops::end(key as usize));
}

/// The id of an op's args text (`len` bytes at `text`, not NUL-terminated): JSON members with
/// torch.profiler's keys (`"Input Dims":[[4, 8]],"Input type":["float"]`), checked here (see
/// `kinetrace_agent::args`). 0 when the text is refused or the table is full. An id is good until
/// [`kinetrace_op_args_generation`] changes; the same text gives the same id until then.
///
/// # Safety
/// `text` is null or points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_op_args(text: *const c_char, len: usize) -> u32 {
    if text.is_null() {
        return 0;
    }
    // SAFETY: per the contract, `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
    catch_unwind(|| kinetrace_agent::args::intern(bytes))
        .ok()
        .flatten()
        .map_or(0, |id| id.0)
}

/// The args table's generation: ids from [`kinetrace_op_args`] are good while it stays the same
/// (the table is emptied when profiling goes idle between windows). Cheap: one atomic load.
#[no_mangle]
pub extern "C" fn kinetrace_op_args_generation() -> u32 {
    kinetrace_agent::args::generation()
}

/// The counter of step boundaries that ended the Python frame ranges (see
/// `kinetrace_agent::ops::cut_python`): the recorder keeps this address and reads it (relaxed)
/// before each op; when it moved, the frames it had open are over and it opens them afresh.
#[no_mangle]
pub extern "C" fn kinetrace_py_epoch() -> *const AtomicU32 {
    &ops::PYTHON_EPOCH
}

/// PyTorch's allocator allocated (`bytes > 0`) or freed (`bytes < 0`) the block at `address` on
/// this thread; `allocated` and `reserved` are the device's totals after it, `device` its index
/// (-1: host memory). Inside a window, a `[memory]` event. Called from the recorder's
/// `reportMemoryUsage`, which PyTorch calls only while the recorder is installed (inside windows
/// with `profile_memory`).
#[no_mangle]
pub extern "C" fn kinetrace_memory(
    address: u64,
    bytes: i64,
    allocated: u64,
    reserved: u64,
    device: i16,
) {
    let _ = catch_unwind(|| ops::memory(address, bytes, allocated, reserved, device));
}
