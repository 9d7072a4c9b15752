//! roctracer 4.1 (`libroctracer64.so.4`), the fallback when rocprofiler-sdk is absent or was
//! initialised without kinetrace: the process-wide tracer its callbacks reach, the checked calls,
//! and the two `extern "C"` trampolines.
//!
//! The HIP API domain callback reads only the stable prefix of `hip_api_data_t` (`correlation_id`,
//! `phase`; the arguments union after it changes with every HIP release): ENTER stamps the time on
//! a fixed per-thread stack and stores the `External id` by correlation id, EXIT queues the call.
//! The pool's buffer callback runs on roctracer's consumer thread (not the job's) and copies each
//! 64-byte HIP_OPS record into the lock-free queue; a kernel name, valid only during the callback,
//! is interned there (the interner allocates once per distinct name).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use kinetrace_core::recorder;
use kinetrace_roctracer_sys::{self as rt, LoadError, Properties, Record, Roctracer, Status};

use super::calls::SdkError;
use crate::external::{CallInfo, ExternalIds};
use crate::queue::Queue;
use crate::queue::Words;
use crate::record::{ApiRec, ArgLayout, OpRec, RawArgs};
use crate::roctracer::HIP_API_IDS;
use std::sync::atomic::AtomicU8;

/// The process-wide tracer.
pub(crate) struct Tracer {
    pub rt: &'static Roctracer,
    pub path: PathBuf,
    pub queue: Queue,
    pub external: ExternalIds,
    /// The pool (`roctracer_pool_t*`), 0 before it is opened.
    pub pool: AtomicUsize,
    /// Records of a domain or operation kinetrace does not read (barriers...).
    pub skipped: AtomicU64,
    /// HIP API id → the [`ArgLayout`] of its arguments (0: none read), set once the names are
    /// known (HIP must be running to name its ids).
    pub arg_layouts: Box<[AtomicU8]>,
}

impl Tracer {
    /// Which calls' arguments the callback reads, from the HIP API names: the launches and plain
    /// copies (what Kineto's roctracer path writes; the other layouts are rocprofiler-sdk's).
    pub(crate) fn set_arg_layouts(&self, names: &[(i32, String)]) {
        for (op, name) in names {
            let layout = ArgLayout::of_name(name).filter(|l| {
                matches!(
                    l,
                    ArgLayout::LaunchKernel
                        | ArgLayout::ModuleLaunchKernel
                        | ArgLayout::ExtModuleLaunchKernel
                        | ArgLayout::Memcpy
                        | ArgLayout::MemcpyStream
                )
            });
            if let (Some(slot), Some(l)) = (self.arg_layouts.get(*op as usize), layout) {
                slot.store(l as u8, Ordering::Relaxed);
            }
        }
    }

    /// Whether [`Tracer::set_arg_layouts`] has found any call to read.
    pub(crate) fn has_arg_layouts(&self) -> bool {
        self.arg_layouts
            .iter()
            .any(|l| l.load(Ordering::Relaxed) != 0)
    }
}

/// What the trace shows of the arguments of HIP call `cid`, from its `hip_api_data_t`.
fn hip_args(t: &Tracer, cid: u32, data: *const c_void) -> RawArgs {
    use rt::hip_args::{LaunchKernelArgs, MemcpyArgs, MemcpyStreamArgs, ModuleLaunchKernelPrefix};
    let layout = t
        .arg_layouts
        .get(cid as usize)
        .and_then(|l| ArgLayout::from_u8(l.load(Ordering::Relaxed)));
    let Some(layout) = layout else {
        return RawArgs::None;
    };
    // SAFETY: `data` is roctracer's `hip_api_data_t` of call `cid`, valid during the callback;
    // its args union starts at the offset asserted in the sys crate.
    let p = unsafe { (data as *const u8).add(rt::HIP_API_DATA_ARGS_OFFSET) };
    // SAFETY: the union is larger than any struct read here (each the one the call's name
    // picked), read unaligned.
    unsafe {
        match layout {
            ArgLayout::LaunchKernel => {
                let a = std::ptr::read_unaligned(p as *const LaunchKernelArgs);
                RawArgs::Launch {
                    function: a.function_address as u64,
                    stream: a.stream as u64,
                    grid: a.num_blocks,
                    block: a.dim_blocks,
                    shared: a.shared_mem_bytes as u32,
                }
            }
            ArgLayout::ModuleLaunchKernel | ArgLayout::ExtModuleLaunchKernel => {
                let a = std::ptr::read_unaligned(p as *const ModuleLaunchKernelPrefix);
                RawArgs::Launch {
                    function: a.function as u64,
                    stream: a.stream as u64,
                    grid: a.grid,
                    block: a.block,
                    shared: a.shared_mem_bytes,
                }
            }
            ArgLayout::Memcpy => {
                let a = std::ptr::read_unaligned(p as *const MemcpyArgs);
                RawArgs::Copy {
                    stream: None,
                    src: a.src as u64,
                    dst: a.dst as u64,
                    size: a.size_bytes as u64,
                    kind: a.kind as u32,
                }
            }
            ArgLayout::MemcpyStream => {
                let a = std::ptr::read_unaligned(p as *const MemcpyStreamArgs);
                RawArgs::Copy {
                    stream: Some(a.stream as u64),
                    src: a.src as u64,
                    dst: a.dst as u64,
                    size: a.size_bytes as u64,
                    kind: a.kind as u32,
                }
            }
            _ => RawArgs::None,
        }
    }
}

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// The tracer, once installed.
pub(crate) fn tracer() -> Option<&'static Tracer> {
    TRACER.get()
}

/// Opens the library at `path` (a file, or a SONAME for the loader).
pub(crate) fn load(path: &Path) -> Result<Roctracer, LoadError> {
    // SAFETY: the search only hands over files named as roctracer; the table checks every
    // required symbol before any is called.
    unsafe { Roctracer::load(path) }
}

/// Installs the tracer; the one installed already wins (a process has one roctracer).
pub(crate) fn install(rt: Roctracer, queue_records: usize) -> &'static Tracer {
    TRACER.get_or_init(move || {
        let path = rt.path().to_path_buf();
        Tracer {
            // Leaked: roctracer keeps our callbacks, which reach the table, for the process's life.
            rt: Box::leak(Box::new(rt)),
            path,
            queue: Queue::new(queue_records),
            external: ExternalIds::new(),
            pool: AtomicUsize::new(0),
            skipped: AtomicU64::new(0),
            arg_layouts: (0..HIP_API_IDS).map(|_| AtomicU8::new(0)).collect(),
        }
    })
}

fn check(t: &Tracer, call: &'static str, status: Status) -> Result<(), SdkError> {
    if status == rt::STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: takes no argument; returns the last error's text (or null).
    let text = unsafe { (t.rt.roctracer_error_string)() };
    let text = (!text.is_null()).then(|| {
        // SAFETY: a NUL-terminated string from the library.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    });
    Err(SdkError { call, status, text })
}

/// `roctracer_version_major/minor`.
pub(crate) fn version(t: &Roctracer) -> (u32, u32) {
    // SAFETY: no arguments.
    unsafe { ((t.roctracer_version_major)(), (t.roctracer_version_minor)()) }
}

/// `roctracer_get_timestamp`.
pub(crate) fn timestamp(t: &Tracer) -> Result<u64, SdkError> {
    let mut ns = 0;
    // SAFETY: a valid out-pointer.
    let s = unsafe { (t.rt.roctracer_get_timestamp)(&mut ns) };
    check(t, "roctracer_get_timestamp", s).map(|()| ns)
}

/// The HIP API names: `roctracer_op_string` of every id below `limit` that has one.
pub(crate) fn hip_api_names(t: &Tracer, limit: u32) -> Vec<(i32, String)> {
    (0..limit)
        .filter_map(|op| {
            // SAFETY: plain values; returns a static string or null.
            let p = unsafe { (t.rt.roctracer_op_string)(rt::DOMAIN_HIP_API, op, 0) };
            if p.is_null() {
                return None;
            }
            // SAFETY: a NUL-terminated string from the library.
            let name = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            // HIP answers "unknown" (or an empty name) past its last id.
            (name.starts_with("hip") || name.starts_with("__hip")).then_some((op as i32, name))
        })
        .collect()
}

/// Opens the pool (`bytes` per half) whose buffer callback queues the records.
pub(crate) fn open_pool(t: &Tracer, bytes: usize) -> Result<(), SdkError> {
    if t.pool.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    let props = Properties {
        mode: 0,
        buffer_size: bytes,
        alloc_fun: None,
        alloc_arg: std::ptr::null_mut(),
        buffer_callback_fun: Some(buffer_callback),
        buffer_callback_arg: std::ptr::null_mut(),
    };
    let mut pool: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid properties and out-pointer; the callback has the buffer callback's signature.
    let s = unsafe { (t.rt.roctracer_open_pool_expl)(&props, &mut pool) };
    check(t, "roctracer_open_pool_expl", s)?;
    t.pool.store(pool as usize, Ordering::Release);
    Ok(())
}

/// Turns recording on: HIP API callbacks (but `noise`, Kineto's skip list) and HIP_OPS activity.
pub(crate) fn enable(t: &Tracer, noise: &[i32]) -> Result<(), SdkError> {
    let pool = t.pool.load(Ordering::Acquire) as *mut c_void;
    // SAFETY: the domain and a pool roctracer opened.
    let s = unsafe { (t.rt.roctracer_enable_domain_activity_expl)(rt::DOMAIN_HIP_OPS, pool) };
    check(t, "roctracer_enable_domain_activity_expl", s)?;
    // SAFETY: `api_callback` has the API callback's signature and never unwinds.
    let s = unsafe {
        (t.rt.roctracer_enable_domain_callback)(
            rt::DOMAIN_HIP_API,
            api_callback,
            std::ptr::null_mut(),
        )
    };
    if let Err(e) = check(t, "roctracer_enable_domain_callback", s) {
        // SAFETY: the domain enabled above.
        unsafe { (t.rt.roctracer_disable_domain_activity)(rt::DOMAIN_HIP_OPS) };
        return Err(e);
    }
    if let Some(off) = t.rt.roctracer_disable_op_callback {
        for op in noise {
            // SAFETY: plain values; a failure only leaves the call traced (the decoder drops it).
            unsafe { off(rt::DOMAIN_HIP_API, *op as u32) };
        }
    }
    Ok(())
}

/// Turns recording off (the records already made stay in the pool for [`flush`]).
pub(crate) fn disable(t: &Tracer) {
    // SAFETY: plain values; failures leave nothing to undo.
    unsafe {
        (t.rt.roctracer_disable_domain_callback)(rt::DOMAIN_HIP_API);
        (t.rt.roctracer_disable_domain_activity)(rt::DOMAIN_HIP_OPS);
    }
}

/// Hands what the pool holds to the buffer callback; returns once it has run.
pub(crate) fn flush(t: &Tracer) -> Result<(), SdkError> {
    let pool = t.pool.load(Ordering::Acquire) as *mut c_void;
    if pool.is_null() {
        return Ok(());
    }
    // SAFETY: a pool roctracer opened.
    let s = unsafe { (t.rt.roctracer_flush_activity_expl)(pool) };
    check(t, "roctracer_flush_activity_expl", s)
}

/// ENTER times of the calls open on this thread (HIP calls nest when the runtime calls itself):
/// (correlation id, ns), fixed size, no allocation.
const STACK: usize = 16;

thread_local! {
    static OPEN: RefCell<([(u64, u64); STACK], usize)> = const { RefCell::new(([(0, 0); STACK], 0)) };
}

fn now(t: &Tracer) -> u64 {
    let mut ns = 0;
    // SAFETY: a valid out-pointer.
    unsafe { (t.rt.roctracer_get_timestamp)(&mut ns) };
    ns
}

/// The HIP API domain callback: ENTER remembers the time and the span; EXIT queues the call.
unsafe extern "C" fn api_callback(domain: u32, cid: u32, data: *const c_void, _arg: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(t) = tracer() else {
            return;
        };
        if domain != rt::DOMAIN_HIP_API || data.is_null() {
            return;
        }
        // SAFETY: roctracer passes a `hip_api_data_t`, whose prefix layout is asserted in the sys
        // crate, valid during the callback.
        let d = unsafe { *(data as *const rt::HipApiDataPrefix) };
        let ns = now(t);
        if d.phase == rt::PHASE_ENTER {
            let args = hip_args(t, cid, data);
            t.external.set_call(
                d.correlation_id,
                CallInfo {
                    external: recorder::current_external_id().unwrap_or(0),
                    stream: args.stream(),
                    function: args.function(),
                    bytes: None,
                },
            );
            let _ = OPEN.try_with(|o| {
                let Ok(mut o) = o.try_borrow_mut() else {
                    return;
                };
                let (stack, n) = &mut *o;
                if *n == STACK {
                    // Full: the oldest entries are calls whose EXIT never came (recording turned
                    // off between ENTER and EXIT); they go first.
                    stack.copy_within(1.., 0);
                    *n -= 1;
                }
                stack[*n] = (d.correlation_id, ns);
                *n += 1;
            });
        } else if d.phase == rt::PHASE_EXIT {
            let start = OPEN
                .try_with(|o| {
                    let mut o = o.try_borrow_mut().ok()?;
                    let (stack, n) = &mut *o;
                    // The innermost open call with this id (normally the top).
                    let i = stack[..*n]
                        .iter()
                        .rposition(|(c, _)| *c == d.correlation_id)?;
                    let start = stack[i].1;
                    stack.copy_within(i + 1..*n, i);
                    *n -= 1;
                    Some(start)
                })
                .ok()
                .flatten();
            // A call entered before recording started has no start: not recorded.
            let Some(start) = start else {
                return;
            };
            let call = ApiRec {
                operation: cid,
                correlation: d.correlation_id,
                tid: recorder::current_tid(),
                start,
                end: ns.max(start),
                external: recorder::current_external_id().unwrap_or(0),
                args: hip_args(t, cid, data),
            };
            t.queue.push(&call.to_words());
        }
    }));
}

/// The pool's buffer callback (roctracer's consumer thread): each HIP_OPS dispatch, copy and fill
/// record into the queue; barriers and other domains are skipped.
unsafe extern "C" fn buffer_callback(begin: *const c_char, end: *const c_char, _arg: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(t) = tracer() else {
            return;
        };
        if begin.is_null() || end <= begin {
            return;
        }
        let mut r = begin as *const Record;
        while (r as usize) + std::mem::size_of::<Record>() <= end as usize {
            // SAFETY: a whole record between `begin` and `end` (checked), valid during the callback.
            let rec = unsafe { *r };
            match copy_op(&rec) {
                Some(words) => {
                    t.queue.push(&words);
                }
                None => {
                    t.skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut next: *const Record = std::ptr::null();
            // SAFETY: a record of this buffer and a valid out-pointer (it only adds the stride).
            let s = unsafe { (t.rt.roctracer_next_record)(r, &mut next) };
            if s != rt::STATUS_SUCCESS || next <= r {
                break;
            }
            r = next;
        }
    }));
}

/// What kinetrace keeps of one HIP_OPS record.
fn copy_op(rec: &Record) -> Option<Words> {
    if rec.domain != rt::DOMAIN_HIP_OPS {
        return None;
    }
    let value = match rec.op {
        rt::HIP_OP_DISPATCH => {
            let p = rec.kernel_name();
            if p.is_null() {
                u64::from(kinetrace_core::intern(crate::decode::UNKNOWN_KERNEL).0)
            } else {
                // SAFETY: the name lies in the pool's buffer, valid during the callback; copied
                // (interned) here.
                let name = unsafe { CStr::from_ptr(p) }.to_string_lossy();
                u64::from(kinetrace_core::intern(&name).0)
            }
        }
        rt::HIP_OP_COPY => rec.bytes(),
        _ => return None,
    };
    Some(
        OpRec {
            correlation: rec.correlation_id,
            start: rec.begin_ns,
            end: rec.end_ns,
            device: rec.device_id(),
            queue: rec.queue_id,
            op: rec.op,
            kind: rec.kind,
            value,
        }
        .to_words(),
    )
}
