//! The entry points of kinetrace's compiled PyTorch extension (`python/kinetrace/_ops_ext.cpp`):
//! its RecordFunction callbacks call [`kinetrace_op_begin`] and [`kinetrace_op_end`] for every op
//! inside a window. They run once per op per thread, so nothing here allocates once a name has
//! been seen: names are interned through a small per-thread cache keyed by the name's address.
//!
//! An address alone does not identify a name: operators' names live in their schema for the
//! process, but autograd functions' names live in their RecordFunction, and the next one may put
//! another name at the same address. So a cached entry keeps the name's bytes, and a hit compares
//! them with the string at the address (stopping at the first difference, so never past its end).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::catch_unwind;

use kinetrace_agent::ops::{self, NameId};

/// Entries in the per-thread name cache (a power of two): direct-mapped by address.
const SLOTS: usize = 256;

/// `kinetrace_op_begin`'s flag: a `record_function` range (a `user_annotation`), not an op.
const ANNOTATION: u32 = 1;

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
/// its autograd sequence number (negative: none); `flags` bit 1 marks a `record_function` range;
/// `dims` (`dims_len` bytes, not NUL-terminated; null without shapes) is its `Input Dims` JSON.
///
/// # Safety
/// `name` is null or a NUL-terminated string; `dims` is null or points to `dims_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_op_begin(
    key: *const c_void,
    name: *const c_char,
    sequence: i64,
    flags: u32,
    dims: *const c_char,
    dims_len: usize,
) {
    let _ = catch_unwind(|| {
        if name.is_null() {
            return;
        }
        // SAFETY: per the contract, a NUL-terminated string.
        let id = unsafe { name_id(name) };
        let dims = (!dims.is_null())
            // SAFETY: per the contract, `dims_len` readable bytes.
            .then(|| unsafe { std::slice::from_raw_parts(dims.cast::<u8>(), dims_len) })
            .and_then(|d| std::str::from_utf8(d).ok());
        ops::begin(key as usize, id, sequence, flags & ANNOTATION != 0, dims);
    });
}

/// The RecordFunction begun with `key` on this thread ended.
#[no_mangle]
pub extern "C" fn kinetrace_op_end(key: *const c_void) {
    let _ = catch_unwind(|| ops::end(key as usize));
}
