//! A stand-in for an unmodified CUDA training job, for the preload tests. It knows nothing of
//! kinetrace: it "initialises CUDA" the way the driver does with an injection library (dlopen the
//! file `CUDA_INJECTION64_PATH` names and call its `InitializeInjection`), launches kernels through the
//! fake libcupti (named `step<N>_kernel<K>`, so a trace shows which step they came from), and reports
//! step boundaries the way the Python optimizer hook does: by calling `kinetrace_step` if the process
//! has one in its global scope.
//!
//! ```text
//! fake_train STEPS [--cuda] [--sleep-ms MS] [--takeover-at N] [--exit-code C]
//!            [--ready-file PATH] [--wait-file PATH] [--stop-file PATH] [--default-sigpipe]
//!            [--fork-at N|start [--child-cuda] [--child-exit exit|_exit]]
//!            [--progress] [--on-sigint-exit C]
//! ```
//! Prints `fake_train: done N steps` (N = STEPS, or fewer with `--stop-file`: the job stops at the
//! first step boundary where that file exists, so a test that talks to it while it runs does not
//! race its end on a loaded machine) and exits with `--exit-code` (default 0).
//!
//! `--fork-at N` forks after the step call of step N, `--fork-at start` before anything (CUDA, the
//! first step): the child reports three steps (first initialising CUDA itself and launching
//! `child_step<N>_kernel<K>` kernels with `--child-cuda`), prints `fake_train: child PID done` and
//! leaves with `exit` (atexit handlers run) or `_exit` (they do not, as Python's `os._exit` in
//! multiprocessing workers); the parent waits for it and prints `fake_train: child status S`.
//! `--default-sigpipe` restores SIGPIPE's default action (Rust programs ignore it; C programs do
//! not), so a write to a closed pipe kills the process as it would kill a C job.
//! `--slow-step N --slow-ms MS` makes step N sleep MS instead of `--sleep-ms`.
//! `--progress` prints `fake_train: step N` after each step call. `--on-sigint-exit C` handles
//! SIGINT itself, as a job with a Ctrl-C handler does (installed before anything else): the handler
//! sets a flag, and the job stops at the next step boundary, prints `fake_train: interrupted` and
//! exits with code C.

use std::ffi::{c_char, c_int, c_void, CString};
use std::time::Duration;

type Launch = unsafe extern "C" fn(*const c_char, u32, u64) -> u32;

fn arg_after(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

extern "C" fn dummy_request(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let buf = Box::leak(vec![0u64; 8192].into_boxed_slice());
    // SAFETY: CUPTI (the fake) passes valid out-pointers.
    unsafe {
        *buffer = buf.as_mut_ptr() as *mut u8;
        *size = 8192 * 8;
        *max = 0;
    }
}

extern "C" fn dummy_complete(
    _ctx: *mut c_void,
    _stream: u32,
    _buf: *mut u8,
    _size: usize,
    _valid: usize,
) {
}

/// What the driver does in `cuInit` with an injection library (load it, call `InitializeInjection`),
/// then the fake libcupti's launch entry point.
fn init_cuda(keep: &mut Vec<libloading::Library>) -> Launch {
    if let Some(path) = std::env::var_os("CUDA_INJECTION64_PATH") {
        // SAFETY: (test program) the injection library's initialisers are the shim's constructor.
        if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
            type Init = unsafe extern "C" fn() -> c_int;
            // SAFETY: (test program) `int InitializeInjection(void)`.
            let init = unsafe { lib.get::<Init>(b"InitializeInjection\0") };
            if let Ok(f) = init {
                // SAFETY: (test program) the documented signature.
                unsafe { f() };
            }
            keep.push(lib);
        }
    }
    let cupti = std::env::var_os("KINETRACE_CUPTI_PATH").unwrap_or_else(|| "libcupti.so.12".into());
    // SAFETY: (test program) the fake libcupti.
    let lib = unsafe { libloading::Library::new(&cupti) }.expect("the fake libcupti loads");
    // SAFETY: (test program) the fake's launch entry point.
    let launch = *unsafe { lib.get::<Launch>(b"fake_cupti_launch_kernel\0") }.unwrap();
    keep.push(lib);
    launch
}

fn launch_two(launch: Option<Launch>, prefix: &str, step: u64) {
    if let Some(f) = launch {
        for k in 0..2 {
            let name = CString::new(format!("{prefix}step{step}_kernel{k}")).unwrap();
            // SAFETY: (test program) a NUL-terminated name, plain values.
            unsafe { f(name.as_ptr(), 7, 1_000) };
        }
    }
}

struct Fork {
    child_cuda: bool,
    underscore_exit: bool,
    sleep: Duration,
    /// Print `fake_train: child PID started` first (with `--progress`).
    progress: bool,
}

/// Forks; the child reports three steps and leaves, the parent waits for it.
fn fork_here(fork: &Fork, step_fn: Option<unsafe extern "C" fn()>) {
    use std::io::Write;
    // Nothing buffered may be written twice.
    let _ = std::io::stdout().flush();
    // SAFETY: (test program) fork; the child only steps, maybe loads the libraries, and leaves.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        if fork.progress {
            println!("fake_train: child {} started", std::process::id());
            let _ = std::io::stdout().flush();
        }
        let mut keep = Vec::new();
        let launch = fork.child_cuda.then(|| init_cuda(&mut keep));
        for step in 0..3 {
            launch_two(launch, "child_", step);
            std::thread::sleep(fork.sleep);
            if let Some(f) = step_fn {
                // SAFETY: (test program) `void kinetrace_step(void)`.
                unsafe { f() };
            }
        }
        println!("fake_train: child {} done", std::process::id());
        let _ = std::io::stdout().flush();
        if fork.underscore_exit {
            // SAFETY: (test program) leaving without atexit handlers, as os._exit does.
            unsafe { libc::_exit(0) };
        }
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: (test program) waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    println!("fake_train: child status {status}");
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_sigint(_: c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let on_sigint_exit: Option<i32> =
        arg_after(&args, "--on-sigint-exit").and_then(|s| s.parse().ok());
    if on_sigint_exit.is_some() {
        // SAFETY: (test program) a handler that only stores an atomic.
        unsafe { libc::signal(libc::SIGINT, on_sigint as extern "C" fn(c_int) as usize) };
    }
    let progress = args.iter().any(|a| a == "--progress");
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let cuda = args.iter().any(|a| a == "--cuda");
    let sleep = Duration::from_millis(
        arg_after(&args, "--sleep-ms")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    );
    let fork_at = arg_after(&args, "--fork-at");
    let fork = Fork {
        child_cuda: args.iter().any(|a| a == "--child-cuda"),
        underscore_exit: arg_after(&args, "--child-exit").as_deref() == Some("_exit"),
        sleep,
        progress,
    };
    let takeover_at: Option<u64> = arg_after(&args, "--takeover-at").and_then(|s| s.parse().ok());
    let exit_code: i32 = arg_after(&args, "--exit-code")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if args.iter().any(|a| a == "--default-sigpipe") {
        // SAFETY: (test program) setting a signal's disposition to its default.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }

    // SAFETY: (test program) opening the process's own global scope.
    let this = libloading::os::unix::Library::this();
    // SAFETY: (test program) the shim exports `void kinetrace_step(void)`.
    let step_fn: Option<unsafe extern "C" fn()> =
        unsafe { this.get::<unsafe extern "C" fn()>(b"kinetrace_step\0") }
            .ok()
            .map(|s| *s);

    if fork_at.as_deref() == Some("start") {
        fork_here(&fork, step_fn);
    }
    let mut _keep = Vec::new();
    let launch = cuda.then(|| init_cuda(&mut _keep));
    if let Some(p) = arg_after(&args, "--ready-file") {
        std::fs::write(p, std::process::id().to_string()).unwrap();
    }
    if let Some(p) = arg_after(&args, "--wait-file") {
        while !std::path::Path::new(&p).exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let stop_file = arg_after(&args, "--stop-file");
    // `--slow-step N --slow-ms MS`: step N sleeps MS instead (a flight recorder's slow step).
    let slow_step: Option<u64> = arg_after(&args, "--slow-step").and_then(|s| s.parse().ok());
    let slow = Duration::from_millis(
        arg_after(&args, "--slow-ms")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    );
    let mut done = 0;
    for step in 0..steps {
        if stop_file
            .as_deref()
            .is_some_and(|p| std::path::Path::new(p).exists())
        {
            break;
        }
        done += 1;
        launch_two(launch, "", step);
        if takeover_at == Some(step) {
            // What torch.profiler's Kineto does when it starts: resolve through the global scope.
            // SAFETY: (test program) CUPTI's signature.
            let register = unsafe {
                this.get::<unsafe extern "C" fn(
                    extern "C" fn(*mut *mut u8, *mut usize, *mut usize),
                    extern "C" fn(*mut c_void, u32, *mut u8, usize, usize),
                ) -> u32>(b"cuptiActivityRegisterCallbacks\0")
            };
            if let Ok(register) = register {
                // SAFETY: (test program) callbacks with CUPTI's signatures.
                let rc = unsafe { register(dummy_request, dummy_complete) };
                println!("fake_train: takeover rc={rc}");
            }
        }
        std::thread::sleep(if slow_step == Some(step) { slow } else { sleep });
        if let Some(f) = step_fn {
            // SAFETY: (test program) `void kinetrace_step(void)`.
            unsafe { f() };
        }
        if progress {
            use std::io::Write;
            println!("fake_train: step {step}");
            let _ = std::io::stdout().flush();
        }
        if let (Some(code), true) = (
            on_sigint_exit,
            INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed),
        ) {
            println!("fake_train: interrupted");
            std::process::exit(code);
        }
        if fork_at.as_deref() == Some(step.to_string().as_str()) {
            fork_here(&fork, step_fn);
        }
    }
    println!("fake_train: done {done} steps");
    std::process::exit(exit_code);
}
