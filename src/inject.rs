//! The process-wide profiler that the preload shim (`libkinetrace.so`) drives in jobs nobody edited.
//!
//! The shim only forwards its C entry points here. The life of a process:
//!
//! - **Dormant** from load until CUDA initialises ([`cuda_initializing`], from the driver's call of
//!   `InitializeInjection`) or the job reports a step ([`step`], from the optimizer hook or an
//!   explicit call). A process that does neither (a shell, a launcher, a compiler) never reads the
//!   configuration, starts no thread and writes nothing.
//! - **Running**: the configuration ([`crate::config`]) is read, ranks not selected go **Off**
//!   quietly, a malformed configuration goes Off with one message. Otherwise a [`Session`] starts
//!   (with the CUPTI source once CUDA is up), the configured window is applied, and the control socket
//!   listens for `kinetrace trigger`.
//! - **Forked**: a child forked from a running (or starting) process keeps nothing: no capture, no
//!   flush, no file (its copy of the parent's locks may be held), even if it initialises CUDA. A
//!   child of a dormant process (a launcher, a worker pool made before CUDA) never starts at a step
//!   (multiprocessing workers report none of their own, and may leave with `os._exit`): only
//!   initialising CUDA itself ([`cuda_initializing`]) starts it, and then rank selection applies
//!   as usual. Exec'd children start afresh.
//! - At exit ([`at_exit`]) a capture in progress is saved within [`EXIT_BUDGET`]; past it the
//!   unfinished files are removed and the process exits anyway, leaving no partial trace.
//! - Starting a session also removes, on a helper thread, what processes of the same user on this
//!   host left when they were killed or left with `_exit` (spools, temporary traces, control
//!   sockets).
//! - If another CUPTI client takes over ([`foreign_cupti_client`]) or another tool is injected,
//!   kinetrace steps aside with one message.
//!
//! Nothing here may change the job's behaviour: every log line goes through one writer that ignores
//! write errors (the shim's also keeps a closed stderr pipe from raising SIGPIPE), and a panic in
//! kinetrace code is reported as one log line by the shim's panic hook ([`panicked`]), never on the
//! job's stderr; a panic while starting turns profiling off for good.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kinetrace_core::recorder;
use kinetrace_core::schedule::{Schedule, TimeWindow};
use kinetrace_core::session::{
    CaptureLength, CapturePlan, CaptureRequest, CaptureStart, LogFn, SessionConfig, Trigger,
};
use kinetrace_core::{ActivitySource, Session, TraceOutput};
use kinetrace_export::TraceDir;

use crate::config::{Config, LogTarget, Window};
use crate::control::{self, ControlServer, PeerUid, Reply, Request};

/// `O_NONBLOCK` on Linux (every architecture kinetrace builds for: x86-64, AArch64, POWER, RISC-V).
const O_NONBLOCK: i32 = 0o4000;

/// How long exit may spend saving a capture in progress.
pub const EXIT_BUDGET: Duration = Duration::from_secs(2);

const DORMANT: u8 = 0;
const RUNNING: u8 = 1;
const OFF: u8 = 2;
/// Forked from a running or starting process: never profiles.
const FORKED: u8 = 3;
/// Forked from a dormant process: only initialising CUDA starts profiling.
const CHILD: u8 = 4;
/// `start` is running (under `START`).
const STARTING: u8 = 5;

// Orderings: STATE is written under START (or in the single-threaded fork child) and read without
// it; Acquire/Release pairs make AUTO's contents visible to whoever sees RUNNING.
static STATE: AtomicU8 = AtomicU8::new(DORMANT);
/// Steps reported before the session started (Relaxed: a counter).
static STEPS: AtomicU64 = AtomicU64::new(0);
/// Set by the SIGUSR2 handler, taken by the control thread (Relaxed: a flag, no data attached).
static SIGNALLED: AtomicBool = AtomicBool::new(false);
/// Another CUPTI client registered callbacks (Relaxed: a flag).
static FOREIGN: AtomicBool = AtomicBool::new(false);
/// The control socket's descriptor, for the fork child to close (-1: none).
static LISTENER_FD: AtomicI32 = AtomicI32::new(-1);
static START: Mutex<()> = Mutex::new(());
static AUTO: OnceLock<Auto> = OnceLock::new();
static SELF_PATH: OnceLock<PathBuf> = OnceLock::new();
static PEER_UID: OnceLock<PeerUid> = OnceLock::new();
static STDERR: OnceLock<StderrWriter> = OnceLock::new();
/// `KINETRACE_STEP_NVTX`, read when the first NVTX instance attaches (`None`: NVTX marks nothing).
static NVTX_PATTERN: OnceLock<Option<String>> = OnceLock::new();
/// A range matching the pattern was seen (Relaxed: a flag).
static NVTX_SEEN: AtomicBool = AtomicBool::new(false);
/// Test hook `_KINETRACE_TEST_PANIC=step`: panic once, at the next step (Relaxed: a flag).
static TEST_PANIC_AT_STEP: AtomicBool = AtomicBool::new(false);

/// The end of the line a panic is reported with, by what the panicking code was doing.
const CONTINUES: &str = "profiling continues";
const STOPS: &str = "profiling stops in this process";

thread_local! {
    /// What a panic on this thread means for profiling (see [`panicked`]).
    static ON_PANIC: Cell<&'static str> = const { Cell::new(CONTINUES) };
}

/// Writes bytes to the process's stderr: never panics, ignores errors.
pub type StderrWriter = fn(&[u8]);

struct Auto {
    session: Session,
    config: Config,
    log: LogFn,
    root: PathBuf,
    worker: String,
    cuda_added: AtomicBool,
    stop: Arc<AtomicBool>,
    control_path: Mutex<Option<PathBuf>>,
}

/// What the shim must install after a call that started the profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Install {
    /// Register the exit handler (once per process).
    pub atexit: bool,
    /// Install the SIGUSR2 handler (`KINETRACE_SIGNAL` is on).
    pub sigusr2: bool,
}

/// The shim's own file (found with `dladdr`), so `CUDA_INJECTION64_PATH` naming it is recognised.
pub fn set_library_path(path: PathBuf) {
    let _ = SELF_PATH.set(path);
}

/// How the control socket reads a peer's user id (the shim supplies `SO_PEERCRED`).
pub fn set_peer_uid(f: PeerUid) {
    let _ = PEER_UID.set(f);
}

/// How log lines reach stderr (the shim supplies one that keeps a closed pipe from raising
/// SIGPIPE, which would kill a C job that left it at its default).
pub fn set_stderr_writer(f: StderrWriter) {
    let _ = STDERR.set(f);
}

/// The shim's panic hook: a panic in kinetrace code (the shim's copy of the standard library only
/// sees those) becomes one log line, `internal error: MESSAGE at FILE:LINE; WHAT NOW`, and nothing
/// on the job's stderr besides what the log target says. Must not panic (a panic in a panic hook
/// aborts the process): the log path only formats and writes, ignoring errors.
pub fn panicked(message: &str, location: Option<(&str, u32)>) {
    let at = location
        .map(|(file, line)| format!(" at {file}:{line}"))
        .unwrap_or_default();
    let then = ON_PANIC.try_with(Cell::get).unwrap_or(CONTINUES);
    log(&format!("internal error: {message}{at}; {then}"));
}

/// Runs `f` with `what` as the meaning of a panic on this thread (see [`panicked`]).
fn on_panic<T>(what: &'static str, f: impl FnOnce() -> T) -> T {
    let before = ON_PANIC.with(|c| c.replace(what));
    let out = f();
    ON_PANIC.with(|c| c.set(before));
    out
}

/// The driver is initialising CUDA (`InitializeInjection`): start profiling with the CUPTI source,
/// or add it to a session a step call started.
pub fn cuda_initializing() -> Install {
    ensure_started(true)
}

/// A step boundary (the end of an optimizer step / training iteration).
pub fn step() -> Install {
    match STATE.load(Ordering::Acquire) {
        FORKED | OFF => return Install::default(),
        CHILD => {
            // Counted, so that numbering stays right if the child initialises CUDA later.
            STEPS.fetch_add(1, Ordering::Relaxed);
            return Install::default();
        }
        RUNNING => {
            if let Some(a) = AUTO.get() {
                a.session.step();
            }
            if TEST_PANIC_AT_STEP.load(Ordering::Relaxed)
                && TEST_PANIC_AT_STEP.swap(false, Ordering::Relaxed)
            {
                panic!("test hook: _KINETRACE_TEST_PANIC=step");
            }
            return Install::default();
        }
        _ => {}
    }
    let install = ensure_started(false);
    match AUTO.get() {
        Some(a) if STATE.load(Ordering::Acquire) == RUNNING => a.session.step(),
        _ => {
            STEPS.fetch_add(1, Ordering::Relaxed);
        }
    }
    install
}

/// An NVTX instance is initialising its injection (`InitializeInjectionNvtx2`): whether NVTX ranges
/// mark steps here (`KINETRACE_STEP_NVTX`), so the shim attaches its range callbacks. Reads the
/// configuration once per process; a malformed one is reported now (one message, profiling off).
pub fn nvtx_attach() -> bool {
    let pattern = NVTX_PATTERN.get_or_init(|| {
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        match Config::from_vars(&vars, |p| std::fs::read_to_string(p)) {
            Ok(c) => c.step_nvtx,
            Err(_) => {
                // start() fails the same way and says why, once.
                let _ = ensure_started(false);
                None
            }
        }
    });
    pattern.is_some() && !matches!(STATE.load(Ordering::Acquire), FORKED | OFF)
}

/// An NVTX range was pushed or started with this message. If it matches `KINETRACE_STEP_NVTX` it
/// marks a step boundary: the first match begins step 0 (starting profiling if nothing has), each
/// later one ends the current step and begins the next, so `ProfilerStep#N` is the N-th matching
/// range, 0-based, the numbering the optimizer hook gives iterations.
pub fn nvtx_range(message: &str) -> Install {
    let Some(Some(pattern)) = NVTX_PATTERN.get() else {
        return Install::default();
    };
    if !crate::config::glob_matches(pattern, message) {
        return Install::default();
    }
    if NVTX_SEEN.swap(true, Ordering::Relaxed) {
        step()
    } else {
        ensure_started(false)
    }
}

/// Whether this process is profiling (running, not forked off or stepped aside).
pub fn is_running() -> bool {
    STATE.load(Ordering::Acquire) == RUNNING
}

/// The atfork child handler: a child of a running (or starting) process profiles nothing; a child
/// of a dormant one only if it initialises CUDA itself. Returns the control socket's descriptor for
/// the shim to close. Only atomics are touched (async-signal-safe).
pub fn after_fork_child() -> Option<i32> {
    match STATE.load(Ordering::Acquire) {
        DORMANT => {
            STATE.store(CHILD, Ordering::Release);
            None
        }
        RUNNING | STARTING => {
            STATE.store(FORKED, Ordering::Release);
            recorder::set_active(false);
            let fd = LISTENER_FD.swap(-1, Ordering::Relaxed);
            (fd >= 0).then_some(fd)
        }
        _ => None,
    }
}

/// The SIGUSR2 handler: only sets a flag the control thread polls (async-signal-safe).
pub fn signal_received() {
    SIGNALLED.store(true, Ordering::Relaxed);
}

/// Another CUPTI client (torch.profiler's Kineto, another tool) registered activity callbacks: end
/// any capture now and never enable CUPTI again in this process, with one message.
pub fn foreign_cupti_client() {
    if FOREIGN.swap(true, Ordering::Relaxed) {
        return;
    }
    if STATE.load(Ordering::Acquire) != RUNNING {
        return;
    }
    if let Some(a) = AUTO.get() {
        let why = "another CUPTI client (torch.profiler or another tool) took over CUPTI";
        (a.log)(&format!("{why}; kinetrace steps aside in this process"));
        a.session.step_aside(why);
    }
}

/// Process exit: save a capture in progress within [`EXIT_BUDGET`], remove the control socket.
pub fn at_exit() {
    if STATE.load(Ordering::Acquire) != RUNNING {
        return;
    }
    let Some(a) = AUTO.get() else { return };
    a.stop.store(true, Ordering::Relaxed);
    if let Some(p) = a
        .control_path
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        let _ = std::fs::remove_file(p);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("kinetrace-exit".into())
        .spawn(move || {
            on_panic("the capture in progress is not saved", || {
                // Test hook (outside the KINETRACE_ key space on purpose): a slow save, so the exit
                // budget can be tested without depending on how fast this machine writes.
                if let Some(ms) = std::env::var("_KINETRACE_TEST_EXIT_DELAY_MS")
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let written = a.session.close();
                let _ = tx.send(written);
            })
        });
    let gave_up = match spawned {
        Err(_) => Some("could not start saving the capture in progress at exit".to_string()),
        Ok(_) => match rx.recv_timeout(EXIT_BUDGET) {
            Ok(_) => None,
            Err(RecvTimeoutError::Timeout) => Some(format!(
                "gave up saving the capture in progress after {} s at exit",
                EXIT_BUDGET.as_secs()
            )),
            // The save panicked (the panic hook said where).
            Err(RecvTimeoutError::Disconnected) => {
                Some("saving the capture in progress failed at exit".to_string())
            }
        },
    };
    if let Some(why) = gave_up {
        // The save may still be writing: its spool and temporary trace go now, and nothing is
        // renamed into place after this, so what the line says stays true.
        kinetrace_export::writer::abandon_unfinished();
        (a.log)(&format!(
            "{why}; its unfinished files were removed and no trace file was left"
        ));
    }
    STATE.store(OFF, Ordering::Release);
}

fn ensure_started(with_cuda: bool) -> Install {
    let state = STATE.load(Ordering::Acquire);
    if state == FORKED || state == OFF || (state == CHILD && !with_cuda) {
        return Install::default();
    }
    let _guard = START.lock().unwrap_or_else(|e| e.into_inner());
    match STATE.load(Ordering::Acquire) {
        RUNNING => {
            if let Some(a) = AUTO.get() {
                if with_cuda && !a.cuda_added.swap(true, Ordering::AcqRel) {
                    a.session.add_source(cuda_source(&a.config));
                }
            }
            return Install::default();
        }
        DORMANT => {}
        CHILD if with_cuda => {}
        _ => return Install::default(),
    }
    // STARTING tells the atfork handler that a child forked now must not profile (its copy of
    // START is held by a thread it does not have).
    STATE.store(STARTING, Ordering::Release);
    // A panic here (reported by the panic hook) turns profiling off for good: starting again at
    // every step would start and drop a session each time.
    let started = on_panic(STOPS, || {
        catch_unwind(AssertUnwindSafe(|| start(with_cuda)))
    });
    match started {
        Ok(Ok(Some(auto))) => {
            let sigusr2 = auto.config.signal.is_some();
            let listen = auto.config.control || sigusr2;
            let _ = AUTO.set(auto);
            STATE.store(RUNNING, Ordering::Release);
            if let Some(a) = AUTO.get() {
                if listen {
                    start_control(a);
                }
                start_cleanup(a);
            }
            Install {
                atexit: true,
                sigusr2,
            }
        }
        Ok(Ok(None)) | Err(_) => {
            STATE.store(OFF, Ordering::Release);
            Install::default()
        }
        Ok(Err(message)) => {
            STATE.store(OFF, Ordering::Release);
            fallback_log(&message);
            Install::default()
        }
    }
}

/// Logs to `KINETRACE_LOG` if that alone is usable, else stderr.
fn fallback_log(message: &str) {
    let target = std::env::var_os("KINETRACE_LOG")
        .filter(|v| !v.is_empty() && v != "stderr")
        .map(|p| LogTarget::File(PathBuf::from(p)))
        .unwrap_or(LogTarget::Stderr);
    make_log(&target)(message);
}

/// The one way a line reaches stderr: never panics, never raises SIGPIPE (with the shim's writer),
/// errors ignored.
fn write_stderr(line: &str) {
    match STDERR.get() {
        Some(write) => write(line.as_bytes()),
        None => {
            use std::io::Write;
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

fn make_log(target: &LogTarget) -> LogFn {
    match target {
        LogTarget::Stderr => Arc::new(|m: &str| write_stderr(&format!("kinetrace: {m}\n"))),
        LogTarget::File(path) => {
            let path = path.clone();
            Arc::new(move |m: &str| {
                use std::io::Write;
                let line = format!("kinetrace[{}]: {m}\n", std::process::id());
                use std::os::unix::fs::OpenOptionsExt;
                // O_NONBLOCK: a FIFO nobody reads fails at once instead of blocking the job (it
                // changes nothing for regular files).
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .custom_flags(O_NONBLOCK)
                    .open(&path)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
                if let Err(e) = written {
                    write_stderr(&format!(
                        "kinetrace: {m} (cannot write {}: {e})\n",
                        path.display()
                    ));
                }
            })
        }
    }
}

/// Starts the session: `Ok(None)` when this process is not to profile (quietly), `Err` with the one
/// message to print when it cannot.
fn start(with_cuda: bool) -> Result<Option<Auto>, String> {
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let off = "; profiling is off in this process (the job runs normally)";
    let config = Config::from_vars(&vars, |p| std::fs::read_to_string(p))
        .map_err(|e| format!("{e}{off}"))?;
    let rank = Config::process_rank(&vars).map_err(|e| format!("{e}{off}"))?;
    if config.ranks.as_ref().is_some_and(|r| !r.contains(rank)) {
        return Ok(None);
    }
    let log = make_log(&config.log);
    if !with_cuda {
        if let Some(other) = foreign_injection(&vars) {
            log(&format!(
                "CUDA_INJECTION64_PATH names another tool ({other}); kinetrace steps aside in this process"
            ));
            return Ok(None);
        }
    }
    if FOREIGN.load(Ordering::Relaxed) {
        log("another CUPTI client (torch.profiler or another tool) holds CUPTI; kinetrace steps aside in this process");
        return Ok(None);
    }
    let first_step = STEPS.load(Ordering::Relaxed);
    let (trigger, request) = match config.window {
        Window::OnDemand => (Trigger::OnDemand, None),
        Window::WholeRun => (Trigger::Always, None),
        Window::Iterations { start, count } => {
            let at = if start <= first_step {
                CaptureStart::Now
            } else {
                CaptureStart::AtStep(start)
            };
            (
                Trigger::OnDemand,
                Some(CaptureRequest::new(at, CaptureLength::Steps(count))),
            )
        }
        Window::Steps { first, last } => (
            Trigger::Schedule(
                Schedule::step_range(first, last)
                    .map_err(|e| format!("KINETRACE_STEPS: {e}{off}"))?,
            ),
            None,
        ),
        Window::Time {
            delay,
            warmup,
            duration,
        } => (
            Trigger::TimeWindow(
                TimeWindow::new(delay, duration)
                    .map_err(|e| format!("KINETRACE_DURATION: {e}{off}"))?
                    .with_warmup(warmup),
            ),
            None,
        ),
        Window::Schedule(s) => (Trigger::Schedule(s), None),
    };
    let root = control::confine(&config.output_dir, None)?;
    let worker = match &config.worker_prefix {
        Some(p) => format!("{p}_{}", std::process::id()),
        None => kinetrace_export::writer::default_worker_name(),
    };
    let world_size = vars
        .iter()
        .find(|(k, _)| k == "WORLD_SIZE")
        .and_then(|(_, v)| v.trim().parse().ok());
    let session_config = SessionConfig {
        activities: config.activities,
        trigger,
        rank: Some(rank),
        world_size,
        metadata: vec![
            ("kinetrace_build".into(), crate::BUILD_INFO.into()),
            ("kinetrace_mode".into(), "preload".into()),
        ],
        log: log.clone(),
        first_step,
        ..SessionConfig::default()
    };
    let mut sources: Vec<Box<dyn ActivitySource>> = Vec::new();
    if with_cuda {
        sources.push(cuda_source(&config));
    }
    let sinks = trace_dir(&root, &worker, config.gzip);
    let session = Session::start(session_config, sources, Box::new(sinks), None)
        .map_err(|e| format!("{e}{off}"))?;
    // Test hook (outside the KINETRACE_ key space on purpose): a panic inside kinetrace at a chosen
    // point, `start` (here, where a failing log line once struck) or `step` (the next step).
    match std::env::var("_KINETRACE_TEST_PANIC").as_deref() {
        Ok("start") => panic!("test hook: _KINETRACE_TEST_PANIC=start"),
        Ok("step") => TEST_PANIC_AT_STEP.store(true, Ordering::Relaxed),
        _ => {}
    }
    if !with_cuda {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        log(no_cuda_message(&maps));
    }
    if let Some(r) = request {
        if let Err(e) = session.request_capture(r) {
            log(&format!("the configured window cannot start: {e}"));
        }
    }
    Ok(Some(Auto {
        session,
        config,
        log,
        root,
        worker,
        cuda_added: AtomicBool::new(with_cuda),
        stop: Arc::new(AtomicBool::new(false)),
        control_path: Mutex::new(None),
    }))
}

fn trace_dir(dir: &Path, worker: &str, gzip: bool) -> TraceDir {
    let mut t = TraceDir::new(dir);
    t.worker = worker.to_string();
    t.gzip = gzip;
    t
}

/// The other library `CUDA_INJECTION64_PATH` names, if it is not this shim.
fn foreign_injection(vars: &[(String, String)]) -> Option<String> {
    let (_, v) = vars.iter().find(|(k, _)| k == "CUDA_INJECTION64_PATH")?;
    if v.is_empty() {
        return None;
    }
    let me = SELF_PATH.get()?;
    let same = match (Path::new(v).canonicalize(), me.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => Path::new(v) == me,
    };
    (!same).then(|| v.clone())
}

#[cfg(feature = "cupti")]
fn cuda_source(config: &Config) -> Box<dyn ActivitySource> {
    let c = kinetrace_cupti::CuptiConfig {
        library: config.cupti_path.clone(),
        max_buffer_bytes: (config.max_gpu_buffer_mb as usize) << 20,
        // The session lives until exit; finalizing CUPTI while CUDA tears down is not safe.
        finalize_on_drop: false,
        ..kinetrace_cupti::CuptiConfig::default()
    };
    Box::new(kinetrace_cupti::CuptiSource::new(c))
}

#[cfg(not(feature = "cupti"))]
fn cuda_source(_config: &Config) -> Box<dyn ActivitySource> {
    struct Off;
    impl ActivitySource for Off {
        fn name(&self) -> &str {
            "cupti"
        }
        fn enable(
            &mut self,
            _: kinetrace_core::ActivitySet,
        ) -> Result<(), kinetrace_core::SourceError> {
            Err(kinetrace_core::SourceError {
                source: "cupti".into(),
                message: "this build has no CUDA backend (feature `cupti`)".into(),
            })
        }
    }
    Box::new(Off)
}

/// Removes, on a helper thread, what processes of this user on this host left when they were
/// killed or left with `_exit`: unfinished trace files under the trace root (their names say which
/// host and pid made them) and control sockets nobody listens on. One line says what went.
fn start_cleanup(a: &'static Auto) {
    let Some(uid) = control::effective_uid() else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        // Which processes are gone cannot be told.
        return;
    }
    let control_dir = a.config.control.then(|| a.config.control_dir_or_default());
    let spawned = std::thread::Builder::new()
        .name("kinetrace-clean".into())
        .spawn(move || {
            let gone = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();
            let mut removed = kinetrace_export::writer::remove_abandoned(&a.root, uid, &gone);
            if let Some(dir) = control_dir {
                removed.extend(remove_dead_sockets(&dir, uid, &gone));
            }
            if !removed.is_empty() {
                const SHOWN: usize = 3;
                let mut shown: Vec<String> = removed
                    .iter()
                    .take(SHOWN)
                    .map(|p| p.display().to_string())
                    .collect();
                if removed.len() > SHOWN {
                    shown.push("...".into());
                }
                (a.log)(&format!(
                    "removed {} file(s) that killed processes (or ones that left with _exit) \
                     left behind: {}",
                    removed.len(),
                    shown.join(", ")
                ));
            }
        });
    drop(spawned);
}

/// The control sockets in `dir` whose process is gone and on which nobody listens (a socket is
/// reachable only on its own host, so a refused connection and a missing pid say the same thing
/// twice), removed.
fn remove_dead_sockets(dir: &Path, uid: u32, gone: &dyn Fn(u32) -> bool) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
        return Vec::new();
    }
    control::list_sockets(dir)
        .into_iter()
        .filter(|(pid, path)| {
            *pid != std::process::id()
                && gone(*pid)
                && std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == uid)
                && matches!(
                    std::os::unix::net::UnixStream::connect(path),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
                )
                && std::fs::remove_file(path).is_ok()
        })
        .map(|(_, path)| path)
        .collect()
}

fn start_control(a: &'static Auto) {
    let server = if a.config.control {
        let dir = a.config.control_dir_or_default();
        match ControlServer::bind(&dir, std::process::id(), PEER_UID.get().copied()) {
            Ok(s) => {
                LISTENER_FD.store(s.raw_fd(), Ordering::Relaxed);
                *a.control_path.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(s.path().to_path_buf());
                Some(s)
            }
            Err(e) => {
                (a.log)(&format!("on-demand control is off: {e}"));
                None
            }
        }
    } else {
        None
    };
    let stop = a.stop.clone();
    let spawned = std::thread::Builder::new()
        .name("kinetrace-control".into())
        .spawn(move || {
            ON_PANIC.with(|c| c.set("on-demand capture stops in this process"));
            let handler = |r: Request| handle(a, r);
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = &server {
                    s.poll(&handler);
                }
                if SIGNALLED.swap(false, Ordering::Relaxed) {
                    if let Some(length) = a.config.signal {
                        let r = submit(a, length, None, None, None, None);
                        match r {
                            Ok((plan, dir)) => (a.log)(&format!(
                                "SIGUSR2: capturing {} into {}",
                                describe(&plan),
                                dir.display()
                            )),
                            Err(e) => (a.log)(&format!("SIGUSR2: capture refused: {e}")),
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            // Removes the socket.
            drop(server);
        });
    if spawned.is_err() {
        (a.log)("cannot start the control thread; on-demand capture is off");
    }
}

fn describe(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps {first}..={last}"),
        CapturePlan::Time { delay, duration } if delay.is_zero() => {
            format!("{} ms", duration.as_millis())
        }
        CapturePlan::Time { delay, duration } => format!(
            "{} ms starting in {} ms",
            duration.as_millis(),
            delay.as_millis()
        ),
    }
}

fn plan_field(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps:{first}-{last}"),
        CapturePlan::Time { delay, duration } => {
            format!("time:{}+{}ms", delay.as_millis(), duration.as_millis())
        }
    }
}

type Done = std::sync::mpsc::Sender<Result<TraceOutput, String>>;

fn submit(
    a: &Auto,
    length: CaptureLength,
    start_step: Option<u64>,
    delay: Option<Duration>,
    out: Option<&Path>,
    done: Option<Done>,
) -> Result<(CapturePlan, PathBuf), String> {
    let dir = control::confine(&a.root, out)?;
    // Nothing is created here, so a refused request leaves nothing behind: the trace's sink creates
    // the directory when the capture starts. A symlink on the way must not point out of the root:
    // check the deepest part that exists now (the rest will be made as real directories).
    if let Some(existing) = dir
        .ancestors()
        .take_while(|p| p.starts_with(&a.root))
        .find(|p| p.exists())
    {
        control::check_inside(&a.root, existing)?;
    }
    let start = match (start_step, delay) {
        (Some(s), _) => CaptureStart::AtStep(s),
        (None, Some(d)) => CaptureStart::After(d),
        (None, None) => CaptureStart::NextStep,
    };
    let mut req = CaptureRequest::new(start, length);
    req.sinks = Some(Box::new(trace_dir(&dir, &a.worker, a.config.gzip)));
    if let Some(tx) = done {
        req.on_done = Some(Box::new(move |r| {
            let _ = tx.send(r);
        }));
    }
    let plan = a.session.request_capture(req).map_err(|e| e.to_string())?;
    Ok((plan, dir))
}

fn handle(a: &Auto, request: Request) -> (Reply, Option<std::sync::mpsc::Receiver<Reply>>) {
    let pid = std::process::id().to_string();
    match request {
        Request::Status => {
            let s = a.session.status();
            let capture = s
                .capture
                .as_ref()
                .map(plan_field)
                .unwrap_or_else(|| "none".into());
            let mut fields = vec![
                ("pid", pid.clone()),
                ("step", s.step_num.to_string()),
                ("action", s.action.as_str().to_string()),
                ("capture", capture),
                ("traces", s.traces.to_string()),
                ("root", a.root.display().to_string()),
            ];
            if let Some(why) = s.stepped_aside {
                fields.push(("off", why));
            }
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            (Reply::new("status", &fields), None)
        }
        Request::Capture(spec) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let done = spec.wait.then_some(tx);
            match submit(
                a,
                spec.length,
                spec.start_step,
                spec.delay,
                spec.out.as_deref(),
                done,
            ) {
                Ok((plan, dir)) => {
                    (a.log)(&format!(
                        "on-demand capture of {} into {}",
                        describe(&plan),
                        dir.display()
                    ));
                    let first = Reply::new(
                        "accepted",
                        &[
                            ("pid", &pid),
                            ("dir", &dir.display().to_string()),
                            ("plan", &plan_field(&plan)),
                        ],
                    );
                    if !spec.wait {
                        return (first, None);
                    }
                    let (reply_tx, reply_rx) = std::sync::mpsc::channel();
                    let pid2 = pid.clone();
                    let _ = std::thread::Builder::new()
                        .name("kinetrace-wait".into())
                        .spawn(move || {
                            let reply = match rx.recv() {
                                Ok(Ok(out)) => Reply::new(
                                    "done",
                                    &[
                                        ("pid", &pid2),
                                        (
                                            "path",
                                            &out.path
                                                .map(|p| p.display().to_string())
                                                .unwrap_or_default(),
                                        ),
                                        ("events", &out.events.to_string()),
                                    ],
                                ),
                                Ok(Err(e)) => {
                                    Reply::new("failed", &[("pid", &pid2), ("reason", &e)])
                                }
                                Err(_) => Reply::new(
                                    "failed",
                                    &[("pid", &pid2), ("reason", "the process ended the capture")],
                                ),
                            };
                            let _ = reply_tx.send(reply);
                        });
                    (first, Some(reply_rx))
                }
                Err(reason) => (
                    Reply::new("refused", &[("pid", &pid), ("reason", &reason)]),
                    None,
                ),
            }
        }
    }
}

/// Logs one line through this process's configured log (stderr before profiling started).
pub fn log(message: &str) {
    match AUTO.get() {
        Some(a) => (a.log)(message),
        None => fallback_log(message),
    }
}

/// The one line logged when profiling starts at a step before CUDA initialised: no driver loaded
/// (a CPU-only run, or a machine without NVIDIA's driver), or CUDA loaded but not yet initialised.
/// Either way the process is profiled, CPU activity only until CUDA initialises.
pub fn no_cuda_message(maps: &str) -> &'static str {
    let driver_loaded = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .any(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("libcuda.so"))
        });
    if driver_loaded {
        "profiling started at a step before CUDA initialised: the trace holds CPU activity until it \
         does"
    } else {
        "no CUDA driver in this process: profiling CPU activity only (steps, annotations); GPU \
         activity is added if CUDA initialises later"
    }
}

/// The libcupti files mapped into this process (per `/proc/self/maps` text).
pub fn loaded_cupti_paths(maps: &str) -> Vec<PathBuf> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("libcupti.so"))
        })
        .fold(Vec::new(), |mut v, p| {
            if !v.iter().any(|q: &PathBuf| q == Path::new(p)) {
                v.push(PathBuf::from(p));
            }
            v
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_no_cuda_line_says_whether_the_driver_is_loaded() {
        let cpu = "7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n\
                   7f0000002000-7f0000003000 r-xp 00000000 08:01 43 /opt/nvidia/cu13/lib/libcupti.so.13\n";
        assert!(no_cuda_message(cpu).starts_with("no CUDA driver in this process"));
        let gpu = format!(
            "{cpu}7f0000004000-7f0000005000 r-xp 00000000 08:01 44 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n"
        );
        assert!(no_cuda_message(&gpu).starts_with("profiling started at a step before CUDA"));
        assert_eq!(
            loaded_cupti_paths(cpu),
            vec![PathBuf::from("/opt/nvidia/cu13/lib/libcupti.so.13")]
        );
    }
}
