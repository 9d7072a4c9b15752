//! The process-wide state and the entry points the shim forwards to.
//!
//! Everything the process holds is in one place, [`PROCESS`]: the phase (see [`crate::state`]),
//! the running profiler once started, and the few flags and values the shim's handlers need
//! without taking a lock (signal handlers and the atfork child handler may only touch atomics).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kinetrace::Profiler;
use kinetrace_core::recorder;
use kinetrace_core::session::LogFn;

use crate::config::{glob_matches, Config};
use crate::control::PeerUid;
use crate::exit::Ending;
use crate::log::{fallback_log, on_panic, StderrWriter, STOPS};
use crate::start::{env_vars, start};
use crate::state::{Event, Outcome, Phase, PhaseCell};

/// How long exit may spend saving a capture in progress.
pub const EXIT_BUDGET: Duration = Duration::from_secs(2);

/// The running profiler and what serving it needs.
pub(crate) struct Running {
    /// Never dropped (it lives in a static): the GPU backend is not finalized while CUDA tears down
    /// at exit, which is not safe; [`at_exit`] closes it instead.
    pub profiler: Profiler,
    pub config: Config,
    pub log: LogFn,
    /// The trace root (absolute).
    pub root: PathBuf,
    pub worker: String,
    /// Tells the control thread to end (Relaxed: a flag).
    pub stop: Arc<AtomicBool>,
    /// The control socket, removed at exit.
    pub control_path: Mutex<Option<PathBuf>>,
    /// The removal of what killed processes left, which exit waits for (bounded).
    pub cleanup: OnceLock<Arc<crate::cleanup::Cleanup>>,
}

/// What the embedding (the shim) supplies, once, from its constructor.
pub(crate) struct Embedding {
    /// The shim's own file, so `CUDA_INJECTION64_PATH` naming it is recognised.
    pub self_path: OnceLock<PathBuf>,
    /// How to read a control peer's user id (`SO_PEERCRED`).
    pub peer_uid: OnceLock<PeerUid>,
    /// How to write to stderr without SIGPIPE.
    pub stderr: OnceLock<StderrWriter>,
}

/// The process's state. Orderings: the phase uses Acquire/Release (see [`PhaseCell`]) so that
/// whoever sees Running sees `running`; every other atomic is a counter or a flag with no data
/// attached (Relaxed).
pub(crate) struct Process {
    pub phase: PhaseCell,
    /// Serialises starting (and adding the GPU backend to a running profiler).
    pub start_lock: Mutex<()>,
    pub running: OnceLock<Running>,
    /// Steps reported before the profiler started.
    pub steps_before_start: AtomicU64,
    /// Set by the SIGUSR2 handler, taken by the control thread.
    pub sigusr2: AtomicBool,
    /// Another CUPTI client registered callbacks.
    pub foreign_client: AtomicBool,
    /// The control socket's descriptor, for the fork child to close (-1: none).
    pub listener_fd: AtomicI32,
    /// What NVTX ranges do, read when the first NVTX instance attaches (`None`: a malformed
    /// configuration, so nothing).
    pub nvtx: OnceLock<Option<NvtxSetup>>,
    /// A range matching the pattern was seen.
    pub nvtx_seen: AtomicBool,
    /// Test hook `_KINETRACE_TEST_PANIC=step`: panic once, at the next step.
    pub test_panic_at_step: AtomicBool,
    /// The HIP probe of a running profiler without its GPU backend: (steps until the next look at
    /// `/proc/self/maps`, the gap after it), doubling up to 4096 steps (see [`probe_hip`]).
    pub hip_probe: Mutex<(u32, u32)>,
    pub embedding: Embedding,
}

pub(crate) static PROCESS: Process = Process {
    phase: PhaseCell::new(),
    start_lock: Mutex::new(()),
    running: OnceLock::new(),
    steps_before_start: AtomicU64::new(0),
    sigusr2: AtomicBool::new(false),
    foreign_client: AtomicBool::new(false),
    listener_fd: AtomicI32::new(-1),
    nvtx: OnceLock::new(),
    nvtx_seen: AtomicBool::new(false),
    test_panic_at_step: AtomicBool::new(false),
    hip_probe: Mutex::new((0, 1)),
    embedding: Embedding {
        self_path: OnceLock::new(),
        peer_uid: OnceLock::new(),
        stderr: OnceLock::new(),
    },
};

/// What the shim must install after a call that started the profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Install {
    /// Register the exit handlers (once per process): the `atexit` handler, and the handlers that
    /// save the capture when SIGINT, SIGTERM or SIGHUP ends the process (see `exit.rs`).
    pub atexit: bool,
    /// Install the SIGUSR2 handler (`KINETRACE_SIGNAL` is on).
    pub sigusr2: bool,
}

/// The shim's own file (found with `dladdr`), so `CUDA_INJECTION64_PATH` naming it is recognised.
pub fn set_library_path(path: PathBuf) {
    let _ = PROCESS.embedding.self_path.set(path);
}

/// How the control socket reads a peer's user id (the shim supplies `SO_PEERCRED`).
pub fn set_peer_uid(f: PeerUid) {
    let _ = PROCESS.embedding.peer_uid.set(f);
}

/// How log lines reach stderr (the shim supplies one that keeps a closed pipe from raising
/// SIGPIPE, which would kill a C job that left it at its default).
pub fn set_stderr_writer(f: StderrWriter) {
    let _ = PROCESS.embedding.stderr.set(f);
}

fn running() -> Option<&'static Running> {
    PROCESS.running.get()
}

/// The driver is initialising CUDA (`InitializeInjection`): start profiling with the GPU backend,
/// or add it to a profiler a step started.
pub fn cuda_initializing() -> Install {
    ensure_started(Event::CudaInitializing)
}

/// A step boundary (the end of an optimizer step / training iteration), reported by the job
/// (`kinetrace_step`: the optimizer hook or an explicit call). Called while recorded ranges are
/// open on this thread (the optimizer hook runs inside PyTorch's `Optimizer.step` range), the
/// boundary moves to where the outermost of them ends, so that ranges nest in steps as they do in
/// torch.profiler's traces.
pub fn step() -> Install {
    if crate::embed::is_running() {
        crate::embed::step();
        return Install::default();
    }
    if crate::ops::defer_step() {
        return Install::default();
    }
    step_now()
}

/// A step boundary, now.
pub(crate) fn step_now() -> Install {
    // Python frame ranges do not cross step boundaries (see `ops::cut_python`).
    crate::ops::cut_python();
    if crate::embed::step_now() {
        return Install::default();
    }
    match PROCESS.phase.get() {
        Phase::Forked | Phase::Off => return Install::default(),
        Phase::Child => {
            // Counted, so that numbering stays right if the child initialises CUDA later.
            PROCESS.steps_before_start.fetch_add(1, Ordering::Relaxed);
            return Install::default();
        }
        Phase::Running => {
            if let Some(r) = running() {
                probe_hip(r);
                r.profiler.step();
            }
            if PROCESS.test_panic_at_step.load(Ordering::Relaxed)
                && PROCESS.test_panic_at_step.swap(false, Ordering::Relaxed)
            {
                panic!("test hook: _KINETRACE_TEST_PANIC=step");
            }
            return Install::default();
        }
        Phase::Dormant | Phase::Starting => {}
    }
    let install = ensure_started(Event::Step);
    match running() {
        Some(r) if PROCESS.phase.get() == Phase::Running => r.profiler.step(),
        _ => {
            PROCESS.steps_before_start.fetch_add(1, Ordering::Relaxed);
        }
    }
    install
}

/// A HIP job on a node where nothing tells kinetrace that HIP started (no rocprofiler-sdk to call
/// the shim's `rocprofiler_configure`: roctracer-only ROCm releases, or an SDK that was set up
/// before the shim was loaded): once HIP's library is mapped, the next step adds the GPU backend,
/// which then records through roctracer. Looks at `/proc/self/maps` at the 1st, 2nd, 4th, 8th ...
/// step (at most every 4096 steps) while the profiler has no GPU backend, so a CPU-only job pays
/// almost nothing.
fn probe_hip(r: &Running) {
    if r.profiler.has_gpu() {
        return;
    }
    {
        let Ok(mut p) = PROCESS.hip_probe.try_lock() else {
            return;
        };
        if p.0 > 0 {
            p.0 -= 1;
            return;
        }
        *p = (p.1, (p.1 * 2).min(4096));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    if crate::start::hip_mapped(&maps) {
        let _guard = PROCESS.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        r.profiler.add_gpu();
    }
}

/// What NVTX ranges do in this process, read from the configuration when the first NVTX instance
/// attaches.
pub(crate) struct NvtxSetup {
    /// `KINETRACE_STEP_NVTX`: ranges matching it mark steps.
    pattern: Option<String>,
    /// `KINETRACE_TORCH_OPS`: ranges become spans inside windows (see `ops.rs`).
    ops: bool,
}

/// An NVTX instance is initialising its injection (`InitializeInjectionNvtx2`): whether NVTX ranges
/// mark steps here (`KINETRACE_STEP_NVTX`) or become spans (`KINETRACE_TORCH_OPS`, when NVTX was
/// pointed at the shim: the `sitecustomize` does that in PyTorch processes), so the shim attaches
/// its range callbacks. Reads the configuration once per process; a malformed one is reported now
/// (one message, profiling off).
pub fn nvtx_attach() -> bool {
    let setup = PROCESS.nvtx.get_or_init(|| {
        match Config::from_vars(&env_vars(), |p| std::fs::read_to_string(p)) {
            Ok(c) => Some(NvtxSetup {
                pattern: c.step_nvtx,
                ops: c.torch.ops,
            }),
            Err(_) => {
                // Starting fails the same way and says why, once.
                let _ = ensure_started(Event::Step);
                None
            }
        }
    });
    setup.as_ref().is_some_and(|s| s.pattern.is_some() || s.ops)
        && !matches!(PROCESS.phase.get(), Phase::Forked | Phase::Off)
}

/// An NVTX range was pushed with this message on this thread: inside a window it begins a span
/// (PyTorch's ops, see `ops.rs`), and if it matches `KINETRACE_STEP_NVTX` it marks a step boundary
/// (see [`nvtx_range`]).
pub fn nvtx_push(message: &str) -> Install {
    let Some(Some(setup)) = PROCESS.nvtx.get() else {
        return Install::default();
    };
    let install = nvtx_range(message);
    if setup.ops && is_running() {
        crate::ops::push(message);
    }
    install
}

/// The innermost NVTX range on this thread was popped.
pub fn nvtx_pop() {
    if let Some(Some(setup)) = PROCESS.nvtx.get() {
        if setup.ops {
            crate::ops::pop();
        }
    }
}

/// An NVTX range was pushed or started with this message. If it matches `KINETRACE_STEP_NVTX` it
/// marks a step boundary: the first match begins step 0 (starting profiling if nothing has), each
/// later one ends the current step and begins the next, so `ProfilerStep#N` is the N-th matching
/// range, 0-based, the numbering the optimizer hook gives iterations.
pub fn nvtx_range(message: &str) -> Install {
    let Some(Some(NvtxSetup {
        pattern: Some(pattern),
        ..
    })) = PROCESS.nvtx.get()
    else {
        return Install::default();
    };
    if !glob_matches(pattern, message) {
        return Install::default();
    }
    if PROCESS.nvtx_seen.swap(true, Ordering::Relaxed) {
        step_now()
    } else {
        ensure_started(Event::Step)
    }
}

/// A range the PyTorch side opens itself (an `nn.Module` forward) on this thread: a
/// `user_annotation` span inside a window. Closed by [`range_pop`] on the same thread.
pub fn range_push(name: &str) {
    if is_running() {
        crate::ops::push(name);
    }
}

/// Closes the innermost range opened by [`range_push`] or an NVTX push on this thread.
pub fn range_pop() {
    crate::ops::pop();
}

/// What the PyTorch side (the `sitecustomize` hook) should have on now, as bits: 1 = a window is
/// open (warming up or recording) and PyTorch's ops are wanted, so its NVTX profiler state should be
/// on; 2 = with input shapes; 4 = with `nn.Module` ranges; 8 = with the Python frames around the
/// ops (`with_stack`); 16 = with PyTorch's allocator events (`profile_memory`); 32 = the flight
/// recorder is on (an exception leaving the training loop writes a dump: [`flight_exception`]).
/// 0 when this process is not profiling.
pub fn torch_state() -> u32 {
    if let Some(state) = crate::embed::torch_state() {
        return state;
    }
    if PROCESS.phase.get() != Phase::Running {
        return 0;
    }
    let Some(r) = running() else { return 0 };
    let t = r.config.torch;
    // The flight recorder's bit stands whether or not PyTorch's ops are recorded.
    let flight = u32::from(r.config.flight.span.is_some()) << 5;
    if !t.ops || !kinetrace_core::recorder::is_active() {
        return flight;
    }
    // The window's own options: a capture request may ask for more or less than the process's.
    let f = r.profiler.framework_options();
    1 | (u32::from(f.record_shapes) << 1)
        | (u32::from(t.modules) << 2)
        | (u32::from(f.with_stack) << 3)
        | (u32::from(f.profile_memory) << 4)
        | flight
}

/// An exception is leaving the Python training loop (the `sitecustomize`'s `sys.excepthook`, with
/// the flight recorder on, bit 32 of [`torch_state`]): a flight dump whose trigger names it. The
/// dump is queued; the exit that follows waits for it within the exit budget. `thread`: the
/// thread it left when not the main one (`threading.excepthook`). Whether one was queued.
pub fn flight_exception(type_name: &str, message: &str, thread: Option<&str>) -> bool {
    if PROCESS.phase.get() != Phase::Running {
        return false;
    }
    let Some(r) = running() else { return false };
    let message: String = message.chars().take(200).collect();
    let trigger = kinetrace::FlightTrigger::Exception {
        type_name: type_name.to_string(),
        message,
        thread: thread.map(|t| t.chars().take(100).collect()),
    };
    r.profiler.flight_dump(trigger).is_ok()
}

/// What the job says of its distributed setup, as the JSON object torch.profiler writes as
/// `distributedInfo` (the Python side builds it from `torch.distributed` when that is initialised
/// or its groups change): the traces of windows that open from now on write it. A malformed one
/// is said once in the log and changes nothing. Whether it was taken: `None` when this process
/// is not profiling (yet), `Some(false)` when malformed.
pub fn set_distributed_info(json: &str) -> Option<bool> {
    if PROCESS.phase.get() != Phase::Running {
        return None;
    }
    let r = running()?;
    match kinetrace::export::parse_distributed_info(json) {
        Ok(info) => {
            r.profiler.set_distributed_info(Some(info));
            Some(true)
        }
        Err(e) => {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                (r.log)(&format!(
                    "python: distributedInfo not used (traces keep the rank and world size from \
                     the environment): {e}"
                ));
            }
            Some(false)
        }
    }
}

/// Whether this process is profiling (running, not forked off), through the preloaded shim or
/// `kinetrace.profile`.
pub fn is_running() -> bool {
    PROCESS.phase.get() == Phase::Running || crate::embed::is_running()
}

/// Whether the preloaded shim started (or is starting) profiling this process.
pub(crate) fn claimed() -> bool {
    matches!(PROCESS.phase.get(), Phase::Starting | Phase::Running)
}

/// The atfork child handler: a child of a running (or starting) process profiles nothing; a child
/// of a dormant one only if it initialises CUDA itself. Returns the control socket's descriptor for
/// the shim to close. Only atomics are touched (async-signal-safe).
pub fn after_fork_child() -> Option<i32> {
    crate::embed::after_fork_child();
    match PROCESS.phase.apply(Event::ForkChild) {
        (Phase::Running | Phase::Starting, Phase::Forked) => {
            recorder::set_active(false);
            let fd = PROCESS.listener_fd.swap(-1, Ordering::Relaxed);
            (fd >= 0).then_some(fd)
        }
        _ => None,
    }
}

/// The SIGUSR2 handler: only sets a flag the control thread polls (async-signal-safe).
pub fn signal_received() {
    PROCESS.sigusr2.store(true, Ordering::Relaxed);
}

/// Another CUPTI client (torch.profiler's Kineto, another tool) registered activity callbacks: end
/// any capture now and never enable CUPTI again in this process, with one message.
pub fn foreign_cupti_client() {
    if PROCESS.foreign_client.swap(true, Ordering::Relaxed) {
        return;
    }
    let (_, now) = PROCESS.phase.apply(Event::StepAside);
    if now != Phase::Running {
        // A later start sees the flag and does not profile.
        return;
    }
    if let Some(r) = running() {
        let why = "another CUPTI client (torch.profiler or another tool) took over CUPTI";
        (r.log)(&format!("{why}; kinetrace steps aside in this process"));
        r.profiler.step_aside(why);
    }
}

/// Process exit (the C `atexit` handler, or a Python interpreter finalising): save a capture in
/// progress within [`EXIT_BUDGET`], remove the control socket, let the removal of what killed
/// processes left finish (within what is left of the budget).
pub fn at_exit() {
    end(Ending::Exit)
}

/// A signal whose default action ends the process (SIGINT, SIGTERM, SIGHUP) arrived: the same
/// ending as [`at_exit`], called by the shim's signal thread before the signal takes its default
/// action (see `exit.rs`).
pub fn at_fatal_signal(signal: i32) {
    end(Ending::Signal(signal))
}

/// The one way the process ends, within one [`EXIT_BUDGET`] from here: an embedded profiler's
/// capture or the preloaded shim's is saved (a caller that comes while another's save runs waits
/// for it), then the cleanup gets what is left of the budget.
fn end(ending: Ending) {
    let deadline = Instant::now() + EXIT_BUDGET;
    crate::embed::at_exit(ending, deadline);
    if PROCESS.phase.get() != Phase::Running {
        // A save another caller started (Python's exit, when a signal comes) ends first.
        crate::exit::wait_for_save(deadline, ending);
        return;
    }
    let Some(r) = running() else { return };
    r.stop.store(true, Ordering::Relaxed);
    // try_lock: the thread a signal interrupted may hold it; the next process removes the socket.
    if let Ok(mut path) = r.control_path.try_lock() {
        if let Some(p) = path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
    if let (Ending::Signal(s), Some(_)) = (ending, r.config.flight.span) {
        // Queued before the close, so the collector writes it before it ends (within the budget).
        let trigger = kinetrace::FlightTrigger::Exit(crate::exit::signal_name(s));
        let _ = r.profiler.flight_dump(trigger);
    }
    crate::exit::save_within_budget(&r.log, deadline, ending, || {
        r.profiler.close();
    });
    if let Some(c) = r.cleanup.get() {
        let until = deadline.min(Instant::now() + crate::cleanup::CLEANUP_EXIT_WAIT);
        if !c.wait_until(until) {
            (r.log)(&format!(
                "the removal of files killed processes left was not over {ending}; the next \
                 kinetrace process of this user tries again"
            ));
        }
    }
    PROCESS.phase.apply(Event::Exit);
}

/// Starts profiling if `event` (CUDA initialising, or a step) starts it in this phase; adds the GPU
/// backend to a running profiler when CUDA initialises.
fn ensure_started(event: Event) -> Install {
    let with_cuda = event == Event::CudaInitializing;
    if !matches!(
        crate::state::next(PROCESS.phase.get(), event),
        Phase::Starting | Phase::Running
    ) {
        return Install::default();
    }
    let _guard = PROCESS.start_lock.lock().unwrap_or_else(|e| e.into_inner());
    // Under the lock the phase is not Starting (only a holder of the lock sets it and leaves it).
    let (before, after) = PROCESS.phase.apply(event);
    match (before, after) {
        (Phase::Running, _) => {
            if let Some(r) = running() {
                if with_cuda {
                    r.profiler.add_gpu();
                }
            }
            return Install::default();
        }
        (Phase::Dormant | Phase::Child, Phase::Starting) => {}
        _ => return Install::default(),
    }
    // A panic here (reported by the panic hook) turns profiling off for good: starting again at
    // every step would start and drop a profiler each time.
    let started = on_panic(STOPS, || {
        catch_unwind(AssertUnwindSafe(|| start(with_cuda)))
    });
    let (outcome, install) = match started {
        Ok(Ok(Some(r))) => {
            let sigusr2 = r.config.signal.is_some()
                || (r.config.flight.span.is_some() && r.config.flight.signal);
            let listen = r.config.control || sigusr2;
            let _ = PROCESS.running.set(r);
            if let Some(r) = running() {
                if listen {
                    crate::serve::start_control(r);
                }
                if let Some(c) = crate::cleanup::start_cleanup(r) {
                    let _ = r.cleanup.set(c);
                }
            }
            let install = Install {
                atexit: true,
                sigusr2,
            };
            (Outcome::Started, install)
        }
        Ok(Ok(None)) => (Outcome::NotProfiling, Install::default()),
        Err(_) => (Outcome::Panicked, Install::default()),
        Ok(Err(e)) => {
            fallback_log(&e.to_string());
            (Outcome::Failed, Install::default())
        }
    };
    PROCESS.phase.apply(Event::StartFinished(outcome));
    install
}
