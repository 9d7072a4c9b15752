//! A stand-in for kinetrace's compiled PyTorch recorder (`python/kinetrace/_ops_ext.cpp`), for the
//! op entry point tests: it finds `kinetrace_op_begin` / `kinetrace_op_end` in the process (the shim
//! is preloaded) as the recorder does, and calls them the way its RecordFunction callbacks would.
//!
//! ```text
//! op_app STEPS
//! ```
//! Each step: `kinetrace_step()`, then `aten::linear` > `aten::addmm` (names that live for the
//! process, seq = step), then two autograd functions whose names are written, one after the
//! other, into the same buffer (so the same address carries `AddmmBackward0`, then
//! `ReluBackward0`), a `record_function` range (`my_block`, the annotation flag) whose inner op
//! ends after it (out of order), and `aten::add` with shapes.

use std::ffi::{c_char, c_void, CStr};

type Begin = unsafe extern "C" fn(*const c_void, *const c_char, i64, u32, *const c_char, usize);
type End = unsafe extern "C" fn(*const c_void);

fn find<T>(name: &CStr) -> T {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    assert!(
        !f.is_null(),
        "{name:?} is not in the process (is the shim preloaded?)"
    );
    // SAFETY: a non-null function of the shim with the signature T names (checked by the caller).
    unsafe { std::mem::transmute_copy(&f) }
}

fn main() {
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let begin: Begin = find(c"kinetrace_op_begin");
    let end: End = find(c"kinetrace_op_end");
    let step: unsafe extern "C" fn() = find(c"kinetrace_step");
    // RecordFunctions live on the stack: their addresses are the keys.
    let (linear, addmm, bwd, block, inner, add) = (1u8, 2u8, 3u8, 4u8, 5u8, 6u8);
    let key = |k: &u8| k as *const u8 as *const c_void;
    let mut buffer = [0u8; 32];
    let dims = b"[[1], [1], []]";
    // SAFETY: every call below passes NUL-terminated names, `dims` with its length, and keys as
    // above, as the entry points require.
    unsafe {
        for s in 0..steps {
            step();
            begin(
                key(&linear),
                c"aten::linear".as_ptr(),
                -1,
                0,
                std::ptr::null(),
                0,
            );
            begin(
                key(&addmm),
                c"aten::addmm".as_ptr(),
                s as i64,
                0,
                std::ptr::null(),
                0,
            );
            end(key(&addmm));
            end(key(&linear));
            for name in [&b"AddmmBackward0\0"[..], &b"ReluBackward0\0"[..]] {
                buffer[..name.len()].copy_from_slice(name);
                begin(
                    key(&bwd),
                    buffer.as_ptr().cast(),
                    s as i64,
                    0,
                    std::ptr::null(),
                    0,
                );
                end(key(&bwd));
            }
            begin(
                key(&block),
                c"my_block".as_ptr(),
                -1,
                1,
                std::ptr::null(),
                0,
            );
            begin(
                key(&inner),
                c"aten::mul".as_ptr(),
                -1,
                0,
                std::ptr::null(),
                0,
            );
            end(key(&block));
            end(key(&inner));
            begin(
                key(&add),
                c"aten::add".as_ptr(),
                -1,
                0,
                dims.as_ptr().cast(),
                dims.len(),
            );
            end(key(&add));
        }
        step();
    }
    println!("op_app: done {steps} steps");
}
