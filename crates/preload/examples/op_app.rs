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
//! `ReluBackward0`), each inside autograd's `evaluate_function: …` range (flagged, no sequence
//! number of its own), a `record_function` range (`my_block`, the annotation flag) whose inner op
//! ends after it (out of order), and `aten::add` with its args (an id from `kinetrace_op_args`,
//! asked for once per step as the recorder asks once per generation; a malformed text is refused
//! with 0). Around them, as the recorder does with `with_stack`: a Python frame `train.py(10):
//! train` opened again whenever `kinetrace_py_epoch` moved (a step boundary ended it) and left
//! open across `kinetrace_step()`, and `model.py(5): forward` around `aten::linear`; and, as its
//! `profile_memory` reporter does, a 4096-byte allocation and its free (`kinetrace_memory`).

use std::ffi::{c_char, c_void, CStr};

type Begin = unsafe extern "C" fn(*const c_void, *const c_char, i64, u32, u32);
type End = unsafe extern "C" fn(*const c_void);
type Args = unsafe extern "C" fn(*const c_char, usize) -> u32;
type Memory = unsafe extern "C" fn(u64, i64, u64, u64, i16);
type Epoch = unsafe extern "C" fn() -> *const std::sync::atomic::AtomicU32;

/// `kinetrace_op_begin`'s flags.
const ANNOTATION: u32 = 1;
const EVALUATE_FUNCTION: u32 = 2;
const BACKWARD_FUNCTION: u32 = 4;
const PYTHON_FUNCTION: u32 = 8;

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
    let op_args: Args = find(c"kinetrace_op_args");
    let step: unsafe extern "C" fn() = find(c"kinetrace_step");
    let memory: Memory = find(c"kinetrace_memory");
    let epoch_of: Epoch = find(c"kinetrace_py_epoch");
    // SAFETY: the shim's counter lives for the process.
    let epoch = unsafe { &*epoch_of() };
    let mut seen_epoch = u32::MAX;
    let (outer, frame) = (8u8, 9u8);
    // RecordFunctions live on the stack: their addresses are the keys.
    let (linear, addmm, bwd, block, inner, add, eval) = (1u8, 2u8, 3u8, 4u8, 5u8, 6u8, 7u8);
    let key = |k: &u8| k as *const u8 as *const c_void;
    let mut buffer = [0u8; 32];
    let mut eval_name = [0u8; 64];
    let text: &[u8] = br#""Input Dims":[[1], [1], []],"Input type":["float", "float", "Scalar"],"Input Strides":[[1], [1], []],"Concrete Inputs":["", "", "1"]"#;
    let bad: &[u8] = br#""Input Dims":[[1]"#;
    // SAFETY: every call below passes NUL-terminated names, texts with their lengths, and keys as
    // above, as the entry points require.
    unsafe {
        assert_eq!(
            op_args(bad.as_ptr().cast(), bad.len()),
            0,
            "a malformed text is refused"
        );
        for s in 0..steps {
            step();
            let args = op_args(text.as_ptr().cast(), text.len());
            let call_from: &[u8] = br#""CallFrom":"train.py:12""#;
            let call_from = op_args(call_from.as_ptr().cast(), call_from.len());
            let now = epoch.load(std::sync::atomic::Ordering::Relaxed);
            if now != seen_epoch {
                // A boundary ended the frame: the recorder forgets it and opens it again.
                seen_epoch = now;
                end(key(&outer));
                begin(
                    key(&outer),
                    c"train.py(10): train".as_ptr(),
                    -1,
                    PYTHON_FUNCTION,
                    call_from,
                );
            }
            begin(
                key(&frame),
                c"model.py(5): forward".as_ptr(),
                -1,
                PYTHON_FUNCTION,
                call_from,
            );
            begin(key(&linear), c"aten::linear".as_ptr(), -1, 0, 0);
            begin(key(&addmm), c"aten::addmm".as_ptr(), s as i64, 0, 0);
            end(key(&addmm));
            end(key(&linear));
            end(key(&frame));
            memory(0x5000, 4096, 4096 * (s + 2), 0, -1);
            memory(0x5000, -4096, 4096 * (s + 1), 0, -1);
            for name in [&b"AddmmBackward0\0"[..], &b"ReluBackward0\0"[..]] {
                let prefix = b"autograd::engine::evaluate_function: ";
                eval_name[..prefix.len()].copy_from_slice(prefix);
                eval_name[prefix.len()..prefix.len() + name.len()].copy_from_slice(name);
                begin(
                    key(&eval),
                    eval_name.as_ptr().cast(),
                    -1,
                    EVALUATE_FUNCTION,
                    0,
                );
                buffer[..name.len()].copy_from_slice(name);
                begin(
                    key(&bwd),
                    buffer.as_ptr().cast(),
                    s as i64,
                    BACKWARD_FUNCTION,
                    0,
                );
                end(key(&bwd));
                end(key(&eval));
            }
            begin(key(&block), c"my_block".as_ptr(), -1, ANNOTATION, 0);
            begin(key(&inner), c"aten::mul".as_ptr(), -1, 0, 0);
            end(key(&block));
            end(key(&inner));
            begin(key(&add), c"aten::add".as_ptr(), -1, 0, args);
            end(key(&add));
        }
        step();
    }
    println!("op_app: done {steps} steps");
}
