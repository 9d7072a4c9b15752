//! `kinetrace.profile`: a profiler the job starts and stops itself, in process, as
//! `torch.profiler.profile` runs Kineto.
//!
//! The Python side loads the shim with ctypes and hands its configuration over as text, one
//! `KINETRACE_KEY=value` line per setting (the keys of docs/config.md), so nothing is read from the
//! environment and nothing is preloaded. The GPU backend attaches at run time, as Kineto attaches
//! CUPTI: at [`start`] if the CUDA driver (or HIP's runtime) is already in the process, else at
//! the first step after it appears (looked for at the 1st, 2nd, 4th ... step, at most every 4096).
//!
//! While one runs, the process-wide entry points act on it: a step (`kinetrace.step()`, the
//! optimizer hook), what PyTorch should record (`torch_state`), log lines. The preload path stays
//! out of the way: an embedded start is refused while the preloaded shim profiles this process,
//! and the preloaded shim does not start while an embedded profiler runs. Unlike the preload path,
//! an embedded profiler can be stopped and another started later in the same process.
//!
//! A forked child (a DataLoader worker) records nothing and writes nothing: the atfork child
//! handler turns recording off and marks the copy inherited from the parent as not ours (its lock
//! may be held by a thread that does not exist in the child, so nothing here takes it there).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use kinetrace::env::Distributed;
use kinetrace::{CaptureLength, CaptureRequest, CaptureStart, Profiler};
use kinetrace_core::activity::{ActivitySet, ActivityType};
use kinetrace_core::recorder;
use kinetrace_core::session::LogFn;

use crate::config::{Config, TorchCapture};
use crate::exit::Ending;
use crate::log::make_log;
use crate::start::{build, cuda_mapped, env_vars, hip_mapped, Mode};

/// The running embedded profiler and what serving it needs.
struct Embedded {
    profiler: Profiler,
    torch: TorchCapture,
    log: LogFn,
    /// Whether GPU activity was asked for (else the GPU backend is never added).
    wants_gpu: bool,
    /// The GPU probe: steps until the next look at `/proc/self/maps`, and the gap after it.
    probe: (u32, u32),
}

static EMBEDDED: Mutex<Option<Embedded>> = Mutex::new(None);
/// An embedded profiler runs (set under the lock; Relaxed readers only decide whether to take it).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// This process is a fork child of one that ran an embedded profiler: the copy is not ours.
/// Relaxed: set once by the atfork child handler before any other thread exists in the child.
static FORKED: AtomicBool = AtomicBool::new(false);
/// The traces the last stopped embedded profiler wrote.
static LAST_OUTPUTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether an embedded profiler runs in this process (not a fork child's inherited copy).
pub fn is_running() -> bool {
    ACTIVE.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed)
}

/// Whether a configuration key (an environment spelling such as `KINETRACE_RECORD_SHAPES`) is
/// known to this runtime, so the Python side can say once which of its arguments a runtime built
/// before that key existed cannot honour, instead of failing the start.
pub fn key_known(name: &str) -> bool {
    crate::config::KEYS.iter().any(|k| k.env == Some(name))
}

/// The configuration lines, as (key, value) pairs. Empty lines are skipped.
fn parse_lines(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut vars = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "configuration line {}: `{line}` is not a KEY=VALUE line",
                i + 1
            ));
        };
        let k = k.trim();
        if !k.starts_with("KINETRACE_") {
            return Err(format!(
                "configuration line {}: `{k}` is not a KINETRACE_ key (docs/config.md lists them)",
                i + 1
            ));
        }
        vars.push((k.to_string(), v.to_string()));
    }
    Ok(vars)
}

/// Starts an embedded profiler configured by `text` (see the module docs). Refused, with the one
/// line that says why, when one already runs, when the preloaded shim profiles this process, in a
/// fork child of a profiled process, or when the configuration is malformed (naming the key and
/// the accepted form).
pub fn start(text: &str) -> Result<(), String> {
    if FORKED.load(Ordering::Relaxed) {
        return Err("this process is a fork child of a profiled one; it records nothing".into());
    }
    if crate::process::claimed() {
        return Err("this process is profiled through the preloaded shim (kinetrace record, \
                    LD_PRELOAD or CUDA_INJECTION64_PATH); kinetrace.profile records nothing of its own"
            .into());
    }
    let mut slot = lock(&EMBEDDED);
    if slot.is_some() {
        return Err("a kinetrace.profile already runs in this process; stop it first".into());
    }
    let vars = parse_lines(text)?;
    let config = Config::from_vars(&vars, |_| {
        Err(std::io::Error::other(
            "kinetrace.profile does not read Kineto files",
        ))
    })
    .map_err(|e| e.to_string())?;
    // RANK, LOCAL_RANK and WORLD_SIZE are the launcher's: read where torchrun puts them.
    let distributed = Distributed::from_vars(&env_vars()).map_err(|e| e.to_string())?;
    let log = make_log(&config.log);
    let wants_gpu = ActivityType::ALL
        .iter()
        .any(|&t| config.activities.contains(t) && ActivitySet::gpu().contains(t));
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let gpu_now = wants_gpu && (cuda_mapped(&maps) || hip_mapped(&maps));
    let profiler =
        build(&config, &distributed, 0, Mode::Api, &log, gpu_now).map_err(|e| e.to_string())?;
    if wants_gpu && !gpu_now {
        log(
            "no GPU runtime in this process yet: profiling CPU activity; GPU activity is added at \
             the first step after CUDA (or HIP) initialises",
        );
    }
    *slot = Some(Embedded {
        profiler,
        torch: config.torch,
        log,
        wants_gpu,
        probe: (0, 1),
    });
    ACTIVE.store(true, Ordering::Relaxed);
    Ok(())
}

/// A step boundary of the embedded profiler (if one runs). Like the preload path's, it waits for
/// recorded ranges open on this thread to end (see `ops::defer_step`).
pub fn step() {
    if !is_running() || crate::ops::defer_step() {
        return;
    }
    step_now();
}

/// A step boundary, now. Whether an embedded profiler took it.
pub(crate) fn step_now() -> bool {
    if !is_running() {
        return false;
    }
    // Python frame ranges do not cross step boundaries (see `ops::cut_python`); here, where the
    // boundary happens (after any deferral), as in `process::step_now`.
    crate::ops::cut_python();
    let mut slot = lock(&EMBEDDED);
    let Some(e) = slot.as_mut() else {
        return false;
    };
    probe_gpu(e);
    e.profiler.step();
    true
}

/// Adds the GPU backend once the GPU runtime is in the process (see the module docs).
fn probe_gpu(e: &mut Embedded) {
    if !e.wants_gpu || e.profiler.has_gpu() {
        return;
    }
    if e.probe.0 > 0 {
        e.probe.0 -= 1;
        return;
    }
    e.probe = (e.probe.1, (e.probe.1 * 2).min(4096));
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    if cuda_mapped(&maps) || hip_mapped(&maps) {
        (e.log)("a GPU runtime initialised: recording its activity from now on");
        e.profiler.add_gpu();
    }
}

/// Asks the embedded profiler for a capture of `steps` steps from now (a schedule the Python side
/// drives step by step).
pub fn request(steps: u32) -> Result<(), String> {
    if !is_running() {
        return Err("no kinetrace.profile runs".into());
    }
    let slot = lock(&EMBEDDED);
    let Some(e) = slot.as_ref() else {
        return Err("no kinetrace.profile runs".into());
    };
    let length = CaptureLength::Steps(steps.max(1));
    e.profiler
        .request_capture(CaptureRequest::new(CaptureStart::Now, length))
        .map(|_| ())
        .map_err(|r| r.to_string())
}

/// What the PyTorch side should record now, as `process::torch_state` says it (`None`: no
/// embedded profiler runs).
pub(crate) fn torch_state() -> Option<u32> {
    if !is_running() {
        return None;
    }
    let slot = lock(&EMBEDDED);
    let e = slot.as_ref()?;
    let t = e.torch;
    if !t.ops || !recorder::is_active() {
        return Some(0);
    }
    Some(
        1 | (u32::from(t.shapes) << 1)
            | (u32::from(t.modules) << 2)
            | (u32::from(t.stack) << 3)
            | (u32::from(t.memory) << 4),
    )
}

/// The embedded profiler's log, while one runs.
pub(crate) fn log_fn() -> Option<LogFn> {
    if !is_running() {
        return None;
    }
    lock(&EMBEDDED).as_ref().map(|e| e.log.clone())
}

/// The traces written so far by the running embedded profiler, else by the last one stopped.
pub fn outputs() -> Vec<PathBuf> {
    if FORKED.load(Ordering::Relaxed) {
        return Vec::new();
    }
    if let Some(e) = lock(&EMBEDDED).as_ref() {
        return e
            .profiler
            .outputs()
            .into_iter()
            .filter_map(|o| o.path)
            .collect();
    }
    lock(&LAST_OUTPUTS).clone()
}

/// Stops the embedded profiler: a capture in progress is saved, the collector finishes. Returns
/// every trace it wrote (also [`outputs`] from now on).
pub fn stop() -> Result<Vec<PathBuf>, String> {
    if FORKED.load(Ordering::Relaxed) {
        return Ok(Vec::new());
    }
    let taken = {
        let mut slot = lock(&EMBEDDED);
        let taken = slot.take();
        ACTIVE.store(false, Ordering::Relaxed);
        taken
    };
    let Some(e) = taken else {
        return Err("no kinetrace.profile runs".into());
    };
    let written: Vec<PathBuf> = e
        .profiler
        .stop()
        .into_iter()
        .filter_map(|o| o.path)
        .collect();
    *lock(&LAST_OUTPUTS) = written.clone();
    Ok(written)
}

/// The process ends (see `exit.rs`) with an embedded profiler still running (the job never stopped
/// it): its capture is saved by `deadline` (the one exit budget), as the preload path saves one.
pub(crate) fn at_exit(ending: Ending, deadline: Instant) {
    if !is_running() {
        return;
    }
    // Polled, not waited for: the thread a signal interrupted may hold the lock (a step in
    // progress), and it does not run again before the save is over.
    let taken = loop {
        match EMBEDDED.try_lock() {
            Ok(mut slot) => break slot.take(),
            Err(TryLockError::Poisoned(p)) => break p.into_inner().take(),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => {
                crate::log::fallback_log(&format!(
                    "could not save the capture in progress of kinetrace.profile {ending}: the                      thread the signal interrupted holds the profiler"
                ));
                return;
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    ACTIVE.store(false, Ordering::Relaxed);
    if let Some(e) = taken {
        let log = e.log.clone();
        crate::exit::save_within_budget(&log, deadline, ending, move || {
            let _ = e.profiler.stop();
        });
    }
}

/// The atfork child handler's part: a child of a process running an embedded profiler records
/// nothing (only atomics are touched).
pub(crate) fn after_fork_child() {
    if ACTIVE.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
        recorder::set_active(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_lines_are_key_value_pairs_of_kinetrace_keys() {
        assert_eq!(
            parse_lines("KINETRACE_SCHEDULE=wait=1,warmup=1,active=2\n\nKINETRACE_GZIP=1\n")
                .unwrap(),
            vec![
                (
                    "KINETRACE_SCHEDULE".to_string(),
                    "wait=1,warmup=1,active=2".to_string()
                ),
                ("KINETRACE_GZIP".to_string(), "1".to_string()),
            ]
        );
        assert_eq!(
            parse_lines("KINETRACE_GZIP=1\nnonsense").unwrap_err(),
            "configuration line 2: `nonsense` is not a KEY=VALUE line"
        );
        assert!(parse_lines("PATH=/bin")
            .unwrap_err()
            .contains("`PATH` is not a KINETRACE_ key"));
    }

    #[test]
    fn known_keys_are_the_tables_environment_spellings() {
        assert!(key_known("KINETRACE_RECORD_SHAPES"));
        assert!(key_known("KINETRACE_SCHEDULE"));
        assert!(!key_known("KINETRACE_NO_SUCH_KEY"));
        // A Kineto file spelling is not an environment key.
        assert!(!key_known("PROFILE_REPORT_INPUT_SHAPES"));
    }
}
