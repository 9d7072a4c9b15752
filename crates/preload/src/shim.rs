//! The C entry points (see the crate docs).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::catch_unwind;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kinetrace_agent as agent;

use crate::exit_signals::blocked;

/// Runs when the library is loaded (`LD_PRELOAD`, the driver's `dlopen`, or `ctypes`).
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = on_load;

extern "C" fn on_load() {
    let _ = catch_unwind(|| {
        let me = own_path();
        if let Some(me) = &me {
            agent::set_library_path(me.clone());
        }
        agent::set_peer_uid(peer_uid);
        crate::report::install();
        let unset = |name: &str| std::env::var_os(name).is_none_or(|v| v.is_empty());
        // Only a preloaded copy points the driver and NVTX at itself: one loaded by ctypes
        // (`kinetrace.profile`) or by the driver changes nothing in the environment.
        let preloaded = me.as_deref().is_some_and(|p| {
            std::env::var_os("LD_PRELOAD").is_some_and(|v| names(&v.to_string_lossy(), p))
        });
        let me = me
            .filter(|_| preloaded)
            .and_then(|p| CString::new(p.into_os_string().into_encoded_bytes()).ok());
        if let Some(c) = &me {
            if unset("CUDA_INJECTION64_PATH") {
                // SAFETY: both arguments are NUL-terminated strings that outlive the call. Constructors
                // run while the loader holds its lock, before `main` and before any thread of ours;
                // a job thread reading the environment concurrently is the only hazard, and glibc's
                // setenv takes its own lock.
                unsafe { libc::setenv(c"CUDA_INJECTION64_PATH".as_ptr(), c.as_ptr(), 0) };
            }
            // NVTX ranges as steps: NVTX reads this at its first call, so it must be set now.
            if !unset("KINETRACE_STEP_NVTX") && unset("NVTX_INJECTION64_PATH") {
                // SAFETY: as above.
                unsafe { libc::setenv(c"NVTX_INJECTION64_PATH".as_ptr(), c.as_ptr(), 0) };
            }
        }
        // SAFETY: registers a plain `extern "C"` function; no handler runs before or in the parent.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
        agent::rocm_tool::on_tool_initialized(rocm_initialized);
        agent::rocm_tool::on_marker(roctx_push, roctx_pop);
    });
}

/// Whether the `LD_PRELOAD` list `list` (entries separated by `:` or white space) names the
/// library at `me`: the same path, the same file, or its bare name (which the loader searches).
fn names(list: &str, me: &std::path::Path) -> bool {
    let real = me.canonicalize().ok();
    list.split([':', ' ', '\t'])
        .filter(|e| !e.is_empty())
        .any(|e| {
            let e = std::path::Path::new(e);
            if e.components().count() == 1 {
                return me.file_name() == Some(e.as_os_str());
            }
            e == me || (real.is_some() && e.canonicalize().ok() == real)
        })
}

/// A roctx range pushed on this thread (through rocprofiler-sdk's marker tracing): PyTorch on
/// ROCm sends the ranges it sends to NVTX on CUDA here, so they go where NVTX ranges go (steps by
/// `KINETRACE_STEP_NVTX`, PyTorch's ops inside windows).
fn roctx_push(message: &CStr) {
    if agent::nvtx_attach() {
        install(starting(|| agent::nvtx_push(&message.to_string_lossy())));
    }
}

/// The innermost roctx range on this thread was popped.
fn roctx_pop() {
    agent::nvtx_pop();
}

/// rocprofiler-sdk's tool entry point: the SDK calls it when a ROCm runtime (HIP) initialises,
/// found through `RTLD_DEFAULT` (this library preloaded) or `ROCP_TOOL_LIBRARIES`. kinetrace
/// registers as a tool beside any other (PyTorch's Kineto); once the SDK has initialised it,
/// [`rocm_initialized`] runs. Returns null (kinetrace opts out) when anything goes wrong.
///
/// # Safety
/// Only the SDK calls it, with its `rocprofiler_configure` arguments.
#[no_mangle]
pub unsafe extern "C" fn rocprofiler_configure(
    version: u32,
    runtime_version: *const c_char,
    priority: u32,
    client_id: *mut c_void,
) -> *mut c_void {
    catch_unwind(|| {
        // SAFETY: the SDK's own call, forwarded with its arguments.
        let r = unsafe {
            agent::rocm_tool::tool_configure(version, runtime_version, priority, client_id)
        };
        r as *mut c_void
    })
    .unwrap_or(std::ptr::null_mut())
}

/// The SDK initialised kinetrace's tool by itself: a ROCm runtime is starting, which is to ROCm
/// what `InitializeInjection` is to CUDA.
fn rocm_initialized() {
    let _ = catch_unwind(|| install(blocked(agent::cuda_initializing)));
}

/// This library's file, found with `dladdr` on one of its own functions.
fn own_path() -> Option<PathBuf> {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `info` is a valid out-pointer; the address is a function of this library.
    let found = unsafe { libc::dladdr(on_load as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the loader for the library's lifetime.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

/// `SO_PEERCRED`: the user id of the process at the other end of a control connection.
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the descriptor is a connected Unix socket owned by `stream`; `cred`/`len` are valid
    // out-pointers sized for `struct ucred`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

static ATEXIT_DONE: AtomicBool = AtomicBool::new(false);

/// Installs what a call that started profiling asked for.
pub(crate) fn install_after(what: agent::Install) {
    install(what)
}

/// Runs an entry point that may start profiling: until this process profiles, with SIGINT,
/// SIGTERM and SIGHUP blocked, so the threads starting creates never take them from the job (see
/// `exit_signals.rs`); once it does, as it is (no cost on the per-op paths).
pub(crate) fn starting<R>(f: impl FnOnce() -> R) -> R {
    if agent::is_running() {
        f()
    } else {
        blocked(f)
    }
}

fn install(what: agent::Install) {
    if what.atexit && !ATEXIT_DONE.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain `extern "C"` function that never unwinds.
        unsafe { libc::atexit(on_exit) };
        crate::exit_signals::install();
    }
    if what.sigusr2 {
        // SAFETY: a zeroed sigaction is a valid "query" argument; `old` is a valid out-pointer.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the current disposition (null new action).
        unsafe { libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut old) };
        if old.sa_sigaction != libc::SIG_DFL {
            agent::log("KINETRACE_SIGNAL is on but the job handles SIGUSR2 itself; the signal trigger is off");
            return;
        }
        // SAFETY: as above, zeroed is valid; the handler only stores an atomic (async-signal-safe).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_sigusr2 as extern "C" fn(c_int) as usize;
        act.sa_flags = libc::SA_RESTART;
        // SAFETY: `act` is initialised; SIGUSR2 is a catchable signal.
        unsafe { libc::sigaction(libc::SIGUSR2, &act, std::ptr::null_mut()) };
    }
}

extern "C" fn on_exit() {
    // Blocked: the exit thread it starts inherits the mask, and a signal arriving meanwhile waits
    // for the save (then takes its default action).
    let _ = catch_unwind(|| blocked(agent::at_exit));
}

extern "C" fn atfork_child() {
    let _ = catch_unwind(|| {
        crate::exit_signals::after_fork_child();
        if let Some(fd) = agent::after_fork_child() {
            // SAFETY: the descriptor is the control socket this process opened; the child never uses
            // its copy (the listening thread does not exist here) and nothing else owns it.
            unsafe { libc::close(fd) };
        }
    });
}

extern "C" fn on_sigusr2(_signal: c_int) {
    let _ = catch_unwind(agent::signal_received);
}

/// The CUDA driver's injection entry point, called once during the first `cuInit` when
/// `CUDA_INJECTION64_PATH` names this library. Always reports success: profiling problems must not
/// fail CUDA initialisation.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    let _ = catch_unwind(|| install(blocked(agent::cuda_initializing)));
    1
}

/// Marks a step (iteration) boundary: ends `ProfilerStep#N` and begins `N+1`. Starts profiling in
/// this process on first use if CUDA has not already. Cheap when the process is not profiling.
#[no_mangle]
pub extern "C" fn kinetrace_step() {
    let _ = catch_unwind(|| install(starting(agent::step)));
}

/// The job is ending: saves a capture in progress now, within the exit budget, as the process's
/// exit handler would. The `sitecustomize` calls it from Python's `atexit`: Python ends an
/// unhandled KeyboardInterrupt (Ctrl-C) by killing itself with SIGINT after finalising, so C exit
/// handlers never run there. Does nothing when the process is not profiling or already saved.
#[no_mangle]
pub extern "C" fn kinetrace_save_at_exit() {
    let _ = catch_unwind(|| blocked(agent::at_exit));
}

/// 1 while this process profiles, else 0.
#[no_mangle]
pub extern "C" fn kinetrace_is_active() -> c_int {
    catch_unwind(agent::is_running).unwrap_or(false) as c_int
}

/// What the PyTorch side should have on now (see `kinetrace_agent::torch_state`): bit 1 PyTorch's
/// NVTX profiler state (a window is open), bit 2 input shapes, bit 4 module ranges; 0 when this
/// process is not profiling. Called by the `sitecustomize` hook at each step boundary.
#[no_mangle]
pub extern "C" fn kinetrace_torch_state() -> u32 {
    catch_unwind(agent::torch_state).unwrap_or(0)
}

/// The text of a C string from the Python side (empty for null; invalid UTF-8 replaced).
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives the result.
unsafe fn c_text<'a>(p: *const c_char) -> std::borrow::Cow<'a, str> {
    if p.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: per the contract, a NUL-terminated string.
        String::from_utf8_lossy(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// An exception is leaving the Python training loop (the `sitecustomize`'s `sys.excepthook`, when
/// bit 32 of [`kinetrace_torch_state`] says the flight recorder is on): queues a flight dump whose
/// trigger names the exception's type. 1 if a dump was queued, 0 if not (the flight recorder is
/// off, or a dump is already being written).
///
/// # Safety
/// `type_name` and `message` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_flight_exception(
    type_name: *const c_char,
    message: *const c_char,
) -> c_int {
    // SAFETY: per the contract, null or NUL-terminated strings.
    let (t, m) = unsafe { (c_text(type_name), c_text(message)) };
    catch_unwind(|| c_int::from(agent::flight_exception(&t, &m, None))).unwrap_or(0)
}

/// [`kinetrace_flight_exception`] for an exception that left a thread other than the main one
/// (the `sitecustomize`'s `threading.excepthook`): the dump's head also names the thread
/// (`flight_exception_thread`).
///
/// # Safety
/// `type_name`, `message` and `thread` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_flight_thread_exception(
    type_name: *const c_char,
    message: *const c_char,
    thread: *const c_char,
) -> c_int {
    // SAFETY: per the contract, null or NUL-terminated strings.
    let (t, m, th) = unsafe { (c_text(type_name), c_text(message), c_text(thread)) };
    catch_unwind(|| c_int::from(agent::flight_exception(&t, &m, Some(&th)))).unwrap_or(0)
}

/// Opens a named range on this thread (an `nn.Module` forward, from the Python side): a
/// `user_annotation` span inside a window. Every call is matched by one [`kinetrace_range_pop`].
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_range_push(name: *const c_char) {
    let name = if name.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: per the contract, a NUL-terminated string.
        String::from_utf8_lossy(unsafe { CStr::from_ptr(name) }.to_bytes())
    };
    let _ = catch_unwind(|| agent::range_push(&name));
}

/// Closes the innermost range this thread opened.
#[no_mangle]
pub extern "C" fn kinetrace_range_pop() {
    let _ = catch_unwind(agent::range_pop);
}

/// One line for kinetrace's log (where the shim's own messages go), from the Python side.
///
/// # Safety
/// `message` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_log(message: *const c_char) {
    if message.is_null() {
        return;
    }
    // SAFETY: per the contract, a NUL-terminated string.
    let text = String::from_utf8_lossy(unsafe { CStr::from_ptr(message) }.to_bytes());
    let _ = catch_unwind(|| agent::log(&text));
}

/// What the Python side says of `torch.distributed` (a JSON object, as torch.profiler writes
/// `distributedInfo`): traces of windows that open from now on write it. 1 when taken, 0 when
/// this process is not profiling (yet), -1 when malformed (said once in the log).
///
/// # Safety
/// `json` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_set_distributed_info(json: *const c_char) -> c_int {
    if json.is_null() {
        return -1;
    }
    // SAFETY: per the contract, a NUL-terminated string.
    let text = String::from_utf8_lossy(unsafe { CStr::from_ptr(json) }.to_bytes());
    match catch_unwind(|| agent::set_distributed_info(&text)) {
        Ok(Some(true)) => 1,
        Ok(None) => 0,
        _ => -1,
    }
}

type RegisterCallbacks = unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32;

/// CUPTI_ERROR_NOT_INITIALIZED, answered if the real function cannot be found.
const CUPTI_ERROR_NOT_INITIALIZED: u32 = 15;

static REAL_REGISTER: AtomicUsize = AtomicUsize::new(0);

/// Interposes `cuptiActivityRegisterCallbacks` for callers that resolve it through the global scope
/// (libkineto inside libtorch does): another CUPTI client is taking CUPTI over, so kinetrace ends its
/// capture and steps aside first, then the call goes to the real libcupti. kinetrace's own CUPTI calls
/// go straight to libcupti and never come here.
///
/// # Safety
/// As the real function: the arguments are CUPTI buffer callbacks (or null).
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityRegisterCallbacks(
    request: *mut c_void,
    completed: *mut c_void,
) -> u32 {
    let _ = catch_unwind(agent::foreign_cupti_client);
    let real = catch_unwind(real_register).ok().flatten();
    match real {
        // SAFETY: `f` is libcupti's own cuptiActivityRegisterCallbacks, called with the caller's
        // arguments unchanged.
        Some(f) => unsafe { f(request, completed) },
        None => CUPTI_ERROR_NOT_INITIALIZED,
    }
}

fn real_register() -> Option<RegisterCallbacks> {
    let cached = REAL_REGISTER.load(Ordering::Acquire);
    if cached != 0 {
        // SAFETY: only non-null results of dlsym for this symbol are stored.
        return Some(unsafe { std::mem::transmute::<usize, RegisterCallbacks>(cached) });
    }
    let name = c"cuptiActivityRegisterCallbacks";
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; the result is checked for null.
    let mut f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if f.is_null() {
        // libcupti loaded with RTLD_LOCAL (as a Python extension's dependency): find it by the name
        // it was loaded under (explicit path, mapped file, or SONAME).
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let mut names: Vec<PathBuf> = std::env::var_os("KINETRACE_CUPTI_PATH")
            .map(PathBuf::from)
            .into_iter()
            .collect();
        names.extend(agent::loaded_cupti_paths(&maps));
        names.extend(["libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8"].map(PathBuf::from));
        for path in names {
            let Ok(c) = CString::new(path.into_os_string().into_encoded_bytes()) else {
                continue;
            };
            // SAFETY: RTLD_NOLOAD only returns a handle to an already-loaded object (no initialisers
            // run); the handle is deliberately kept open.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if h.is_null() {
                continue;
            }
            // SAFETY: valid handle and NUL-terminated name.
            f = unsafe { libc::dlsym(h, name.as_ptr()) };
            if !f.is_null() {
                break;
            }
        }
    }
    if f.is_null() || std::ptr::eq(f as *const (), cuptiActivityRegisterCallbacks as *const ()) {
        return None;
    }
    REAL_REGISTER.store(f as usize, Ordering::Release);
    // SAFETY: `f` is libcupti's cuptiActivityRegisterCallbacks, whose C signature matches.
    Some(unsafe { std::mem::transmute::<*mut c_void, RegisterCallbacks>(f) })
}
