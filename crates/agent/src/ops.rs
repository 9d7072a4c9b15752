//! PyTorch's ops, modules and `record_function` ranges, as NVTX ranges: the framework view.
//!
//! With the NVTX profiler state on (what `torch.autograd.profiler.emit_nvtx` enables; the
//! `sitecustomize` turns it on at a window's first step boundary and off after its last), every
//! RecordFunction pushes an NVTX range whose message is the op's name with what PyTorch knows of
//! it, and pops it when the op returns:
//!
//! ```text
//! aten::addmm, seq = 1, op_id = 5, sizes = [[16], [4, 8], [8, 16], [], []], input_op_ids = [(0,-1), ...]
//! ```
//!
//! (`seq` only for ops that autograd records, `sizes` only with shapes on). Each range becomes a span
//! in the recording thread's ring, begun at the push and ended at the pop, and is the thread's
//! current external id while open, so runtime calls (and through them kernels) link to the
//! innermost op that launched them, as Kineto links them. Ranges that are not PyTorch's (the job's
//! own `nvtxRangePush`) become `user_annotation` spans.
//!
//! Pushes and pops pair by nesting, per thread: a stack of what each open range did. Ranges pushed
//! outside a window are on it too (as nothing recorded), so a pop always ends the range it closes.
//!
//! The cheaper route ([`begin`] / [`end`]): a compiled PyTorch extension (`python/kinetrace/
//! _ops_ext.cpp`) registers a RecordFunction callback inside windows and hands each op over as it
//! is: the name already interned (the shim caches it by pointer), the sequence number, its part in
//! autograd's backward pass, its args (shapes, types, strides, scalars, a collective's sizes) as
//! an id the recorder got once per distinct text ([`crate::args`]), and the RecordFunction's
//! address as the key its end comes back with. The same stack holds both routes' ranges and the
//! module ranges, so steps wait for them alike.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

use kinetrace_core::clock::Ticks;
use kinetrace_core::recorder::{self, CpuRecord};
use kinetrace_core::{intern, op_args, OpArgs};

pub use kinetrace_core::{ArgsId, AutogradRole, NameId};

/// Deepest nesting tracked per thread; deeper ranges are counted, not recorded.
const MAX_DEPTH: usize = 512;

/// One open range on this thread.
#[derive(Clone, Copy)]
struct Open {
    /// The span's id (0: nothing was recorded for it).
    id: u64,
    /// What its end is matched by: a RecordFunction's address ([`begin`]), or 0 (NVTX and module
    /// ranges, ended by nesting).
    key: usize,
    /// The external id before this range made itself current.
    previous_external_id: u64,
    /// A Python frame's range ([`begin_python`]): it does not hold step boundaries back, and a
    /// step boundary ends it ([`cut_python`]).
    python: bool,
}

#[derive(Default)]
struct Stack {
    open: Vec<Open>,
    /// Ranges pushed past [`MAX_DEPTH`], still open.
    beyond: usize,
    /// A step boundary waits for the range open at this depth (and those inside it) to end.
    deferred_step: Option<usize>,
}

thread_local! {
    static STACK: RefCell<Stack> = RefCell::new(Stack::default());
    /// The NVTX route's args text, built here (reused: no allocation per op once grown).
    static ARGS_TEXT: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Step boundaries that ended this process's Python frame ranges ([`cut_python`]): the compiled
/// recorder reads it before each op and, when it moved, drops the frames it had open and opens
/// them afresh, so frames never cross a step boundary.
pub static PYTHON_EPOCH: AtomicU32 = AtomicU32::new(0);

/// The name prefix of autograd's per-function ranges (see [`AutogradRole::EvaluateFunction`]).
pub const EVALUATE_FUNCTION: &str = "autograd::engine::evaluate_function: ";

/// A range message, taken apart.
#[derive(Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// The op or range name.
    pub name: &'a str,
    /// Whether it came from PyTorch's NVTX observer (it carries `seq`, `op_id` or `sizes`).
    pub torch: bool,
    /// The autograd sequence number.
    pub sequence: Option<u64>,
    /// The input shapes, as JSON text (`[[4, 8], [8, 16], []]`), when present and well formed.
    pub input_dims: Option<&'a str>,
}

const SEQ: &[u8] = b", seq = ";
const OP_ID: &[u8] = b", op_id = ";
const SIZES: &[u8] = b", sizes = ";
const INPUT_OP_IDS: &[u8] = b", input_op_ids = ";

/// Takes a range message apart (PyTorch's format above, or anything else as a plain name). One
/// pass over the message's commas, no searcher set up per call: this runs twice per op.
pub fn parse(message: &str) -> Message<'_> {
    let b = message.as_bytes();
    let mut name_end = None;
    let mut sequence = None;
    let mut sizes: Option<(usize, usize)> = None;
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|&c| c == b',') {
        let at = i + p;
        let rest = &b[at..];
        if rest.starts_with(SEQ) {
            name_end.get_or_insert(at);
            let digits = &rest[SEQ.len()..];
            let n = digits.iter().take_while(|c| c.is_ascii_digit()).count();
            sequence = std::str::from_utf8(&digits[..n])
                .ok()
                .and_then(|d| d.parse().ok());
        } else if rest.starts_with(OP_ID) {
            name_end.get_or_insert(at);
        } else if rest.starts_with(SIZES) {
            name_end.get_or_insert(at);
            sizes = Some((at + SIZES.len(), b.len()));
        } else if rest.starts_with(INPUT_OP_IDS) {
            if let Some((from, _)) = sizes {
                sizes = Some((from, at));
            }
            break;
        }
        i = at + 1;
    }
    let Some(cut) = name_end else {
        return Message {
            name: message,
            torch: false,
            sequence: None,
            input_dims: None,
        };
    };
    // The cuts are at ASCII bytes, so they are character boundaries.
    let input_dims = sizes
        .map(|(from, to)| &message[from..to])
        .filter(|text| well_formed_dims(text));
    Message {
        name: &message[..cut],
        torch: true,
        sequence,
        input_dims,
    }
}

/// Whether `text` is a JSON array of arrays of integers (what the trace writes without quoting).
fn well_formed_dims(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() < 2 || b[0] != b'[' || b[b.len() - 1] != b']' {
        return false;
    }
    let mut depth = 0i32;
    let mut prev = b' ';
    for &c in b {
        match c {
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth < 0 || prev == b',' {
                    return false;
                }
            }
            b'0'..=b'9' | b'-' | b' ' => {}
            b',' if prev != b',' && prev != b'[' => {}
            _ => return false,
        }
        if depth > 2 {
            return false;
        }
        if c != b' ' {
            prev = c;
        }
    }
    depth == 0
}

/// An NVTX range was pushed with this message on this thread: inside a window, a span begins.
pub fn push(message: &str) {
    open(0, false, || {
        let m = parse(message);
        // `record_function` scopes PyTorch itself opens (`Optimizer.step#SGD.step`) are user
        // annotations in torch.profiler's traces; ops and autograd functions are `cpu_op`s.
        let annotation = !m.torch || m.name.contains('#');
        // The message has no scope: autograd's ranges are told by name, backward functions as
        // the numbered ops outside ATen (`AddmmBackward0, seq = 4`).
        let role = if m.name.starts_with(EVALUATE_FUNCTION) {
            AutogradRole::EvaluateFunction
        } else if m.sequence.is_some() && !m.name.starts_with("aten::") {
            AutogradRole::BackwardFunction
        } else {
            AutogradRole::None
        };
        let args = m.input_dims.and_then(dims_args);
        (
            intern(m.name),
            annotation,
            OpArgs::new(args, m.sequence).with_role(role),
        )
    });
}

/// `"Input Dims":…` for shapes the NVTX message carried (already checked to be well formed).
fn dims_args(dims: &str) -> Option<ArgsId> {
    ARGS_TEXT
        .try_with(|t| {
            let mut t = t.try_borrow_mut().ok()?;
            t.clear();
            t.push_str("\"Input Dims\":");
            t.push_str(dims);
            op_args::intern(&t)
        })
        .ok()
        .flatten()
}

/// Interns an op name (the shim's cache of names by pointer calls this on a miss).
pub fn intern_name(name: &str) -> NameId {
    intern(name)
}

/// What the compiled extension says of a RecordFunction beside its name and sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begun {
    /// A `record_function` range (`USER_SCOPE`): a `user_annotation`, not a `cpu_op`.
    pub annotation: bool,
    /// Its part in autograd's backward pass.
    pub role: AutogradRole,
    /// Its args text, interned ([`crate::args::intern`]).
    pub args: Option<ArgsId>,
}

/// A RecordFunction began on this thread (the compiled extension's start callback): inside a
/// window a span begins. `key` (the RecordFunction's address) is what [`end`] is called with; a
/// negative `sequence` is none.
pub fn begin(key: usize, name: NameId, sequence: i64, what: Begun) {
    open(key, false, || {
        let sequence = u64::try_from(sequence).ok();
        let args = OpArgs::new(what.args, sequence).with_role(what.role);
        (name, what.annotation, args)
    });
}

/// A Python frame the compiled recorder saw around an op began on this thread (its `with_stack`
/// view): inside a window a `python_function` span begins, ended by [`end`] with the same `key`.
/// `args` holds its `CallFrom` (and `Python module id`) text. It is not the thread's current
/// external id: runtime calls link to ops, never to frames.
pub fn begin_python(key: usize, name: NameId, args: Option<ArgsId>) {
    open(key, true, || (name, false, OpArgs::new(args, None)));
}

/// A step boundary on this thread: the Python frame ranges open here end now (the recorder opens
/// them again at the next op, inside the next step), so frames nest in steps. Frames open on
/// other threads end at their next op ([`PYTHON_EPOCH`]).
pub fn cut_python() {
    // Relaxed: the recorder only needs to see a change eventually (at its next op).
    PYTHON_EPOCH.fetch_add(1, Ordering::Relaxed);
    let _ = STACK.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        let end = Ticks::now();
        // Innermost first, as they would have ended.
        for open in s.open.iter_mut().rev().filter(|o| o.python && o.id != 0) {
            recorder::push(CpuRecord::End { end, id: open.id });
            open.id = 0;
        }
    });
}

/// Opens a range on this thread's stack; `what` says what it is, asked only inside a window.
fn open(key: usize, python: bool, what: impl FnOnce() -> (NameId, bool, OpArgs)) {
    let _ = STACK.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        if s.open.len() >= MAX_DEPTH {
            s.beyond += 1;
            return;
        }
        let mut open = Open {
            id: 0,
            key,
            previous_external_id: 0,
            python,
        };
        if recorder::is_active() {
            let (name, annotation, args) = what();
            let id = recorder::next_span_id();
            let recorded = recorder::push(CpuRecord::Begin {
                name,
                annotation,
                python,
                start: Ticks::now(),
                id,
                args,
            });
            if recorded {
                open.id = id;
                if !python {
                    open.previous_external_id = recorder::push_external_id(id);
                }
            }
        }
        s.open.push(open);
    });
}

/// The innermost NVTX range on this thread was popped: the span it began (if any) ends, and a step
/// boundary waiting for it happens now.
pub fn pop() {
    // Python frame ranges pushed after it are the recorder's, ended by key: not this one.
    close(|s| {
        let at = s.open.iter().rposition(|o| !o.python)?;
        Some(s.open.remove(at))
    });
}

/// The framework allocator allocated (`bytes > 0`) or freed (`bytes < 0`) the block at `address`
/// on this thread (PyTorch's `reportMemoryUsage`, which the compiled recorder receives only inside
/// windows that asked for `profile_memory`): a `[memory]` event, with the device's totals after
/// it. `device` is the device index, -1 for host memory.
pub fn memory(address: u64, bytes: i64, allocated: u64, reserved: u64, device: i16) {
    if !recorder::is_active() {
        return;
    }
    let at = Ticks::now();
    if device < 0 && reserved == 0 {
        if let Some(record) = CpuRecord::host_memory(at, address, bytes, allocated) {
            recorder::push(record);
            return;
        }
    }
    recorder::push_pair(
        CpuRecord::Memory {
            at,
            address,
            bytes,
            device,
        },
        CpuRecord::MemoryTotals {
            allocated,
            reserved,
        },
    );
}

/// The RecordFunction begun with `key` on this thread ended: its span ends. Ranges that do not
/// nest (an end on another thread, or one PyTorch never sent) leave the others as they are.
pub fn end(key: usize) {
    close(|s| match s.open.last() {
        Some(top) if top.key == key => s.open.pop(),
        _ => {
            let at = s.open.iter().rposition(|o| o.key == key)?;
            Some(s.open.remove(at))
        }
    });
}

/// Ends the range `take` removes from the stack (none: one past [`MAX_DEPTH`] ends instead).
fn close(take: impl FnOnce(&mut Stack) -> Option<Open>) {
    let step_now = STACK
        .try_with(|s| {
            let Ok(mut s) = s.try_borrow_mut() else {
                return false;
            };
            if s.beyond > 0 {
                s.beyond -= 1;
                return false;
            }
            let Some(open) = take(&mut s) else {
                return false;
            };
            if open.id != 0 {
                let end = Ticks::now();
                // Only if this range is still the current one (ranges that do not nest, such as
                // a step boundary inside one, may have moved it on).
                if !open.python && recorder::current_external_id() == Some(open.id) {
                    recorder::restore_external_id(open.previous_external_id);
                }
                recorder::push(CpuRecord::End { end, id: open.id });
            }
            let depth = s.open.len();
            s.deferred_step.take_if(|d| depth < *d).is_some()
        })
        .unwrap_or(false);
    if step_now {
        let _ = crate::process::step_now();
    }
}

/// A step boundary is reported on this thread. If ranges recorded in the trace are open here (the
/// optimizer hook runs inside PyTorch's `Optimizer.step` range), it waits until the outermost of
/// them ends, and this returns `true`: a boundary inside a range would cut it across two steps, and
/// the trace's ranges would no longer nest. At most one boundary waits: another one reported
/// meanwhile first lets the waiting one happen, so no step is lost or merged.
pub fn defer_step() -> bool {
    let (earlier, defer) = STACK
        .try_with(|s| {
            let Ok(mut s) = s.try_borrow_mut() else {
                return (false, false);
            };
            let earlier = s.deferred_step.take().is_some();
            // Python frames do not count: the outermost of them stays open for the whole step.
            let outermost = s.open.iter().position(|o| o.id != 0 && !o.python);
            if let Some(depth) = outermost {
                s.deferred_step = Some(depth + 1);
            }
            (earlier, outermost.is_some())
        })
        .unwrap_or((false, false));
    if earlier {
        let _ = crate::process::step_now();
    }
    defer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_messages_come_apart() {
        let m = parse("aten::addmm, seq = 1, op_id = 5, sizes = [[16], [4, 8], [8, 16], [], []], input_op_ids = [(0,-1), (0,-1), (2,0), (0,-1), (0,-1)]");
        assert_eq!(
            m,
            Message {
                name: "aten::addmm",
                torch: true,
                sequence: Some(1),
                input_dims: Some("[[16], [4, 8], [8, 16], [], []]"),
            }
        );
        let m = parse("autograd::engine::evaluate_function: AddmmBackward0, op_id = 35");
        assert_eq!(
            m.name,
            "autograd::engine::evaluate_function: AddmmBackward0"
        );
        assert!(m.torch);
        assert_eq!((m.sequence, m.input_dims), (None, None));
        let m = parse("AddmmBackward0, seq = 4, op_id = 36");
        assert_eq!((m.name, m.sequence), ("AddmmBackward0", Some(4)));
        // Shapes without input ids (older PyTorch), and no op id.
        let m = parse("aten::mm, seq = 7, sizes = [[2, 3], [3, 4]]");
        assert_eq!(m.name, "aten::mm");
        assert_eq!(m.sequence, Some(7));
        assert_eq!(m.input_dims, Some("[[2, 3], [3, 4]]"));
    }

    #[test]
    fn other_messages_are_plain_names() {
        for text in ["train_step", "forward, backward", "seq = 3", ""] {
            let m = parse(text);
            assert_eq!(m.name, text);
            assert!(!m.torch);
        }
    }

    #[test]
    fn only_well_formed_shapes_are_kept() {
        for good in ["[]", "[[]]", "[[4, 8], [], [1]]", "[[-1, 3]]"] {
            assert!(well_formed_dims(good), "{good}");
        }
        for bad in [
            "",
            "[",
            "[[4, 8]",
            "[[4,, 8]]",
            "[[4, 8],]",
            "[[\"x\"]]",
            "[[[1]]]",
            "]",
            "[[1]] x",
            "[,1]",
        ] {
            assert!(!well_formed_dims(bad), "{bad}");
        }
        let m = parse("aten::mm, op_id = 2, sizes = [[2, \"oops\"]]");
        assert_eq!(m.input_dims, None);
    }
}
