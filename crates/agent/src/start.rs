//! Starting the profiler in an injected process: read the configuration, select the rank, build
//! the profiler through the public `ProfilerBuilder`, apply the configured window.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kinetrace::env::{Distributed, EnvError};
use kinetrace::{CaptureLength, CaptureRequest, CaptureStart, Profiler};
use kinetrace_core::session::LogFn;

use crate::config::{Config, ConfigError, Window};
use crate::control::confine::absolute;
use crate::log::make_log;
use crate::process::{Running, PROCESS};

/// Why profiling cannot start in this process (said in one line; the job runs on).
#[derive(Debug)]
pub enum StartError {
    /// The `KINETRACE_*` / Kineto configuration is malformed.
    Config(ConfigError),
    /// `RANK`, `LOCAL_RANK` or `WORLD_SIZE` is malformed.
    Env(EnvError),
    /// The profiler would not start.
    Profiler(kinetrace::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f)?,
            StartError::Env(e) => e.fmt(f)?,
            StartError::Profiler(e) => e.fmt(f)?,
        }
        f.write_str("; profiling is off in this process (the job runs normally)")
    }
}

impl std::error::Error for StartError {}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> Self {
        StartError::Config(e)
    }
}

impl From<EnvError> for StartError {
    fn from(e: EnvError) -> Self {
        StartError::Env(e)
    }
}

/// This process's environment as UTF-8 pairs (others cannot be kinetrace's).
pub(crate) fn env_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Starts the profiler: `Ok(None)` when this process is not to profile (quietly, or after saying
/// why in one line), `Err` with the one line to say when it cannot.
pub(crate) fn start(with_cuda: bool) -> Result<Option<Running>, StartError> {
    let vars = env_vars();
    let config = Config::from_vars(&vars, |p| std::fs::read_to_string(p))?;
    let distributed = Distributed::from_vars(&vars)?;
    // A single process is rank 0.
    let rank = distributed.rank.unwrap_or(0);
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
    if PROCESS.foreign_client.load(Ordering::Relaxed) {
        log("another CUPTI client (torch.profiler or another tool) holds CUPTI; kinetrace steps aside in this process");
        return Ok(None);
    }
    if crate::embed::is_running() {
        log("kinetrace.profile runs in this process; the preloaded shim steps aside");
        return Ok(None);
    }
    let first_step = PROCESS.steps_before_start.load(Ordering::Relaxed);
    let root = absolute(&config.output_dir);
    let worker = worker_name(&config);
    let profiler = build(
        &config,
        &distributed,
        first_step,
        Mode::Preload,
        &log,
        with_cuda,
    )?;
    // Test hook (outside the KINETRACE_ key space on purpose): a panic inside kinetrace at a chosen
    // point, `start` (here, where a failing log line once struck) or `step` (the next step).
    match std::env::var("_KINETRACE_TEST_PANIC").as_deref() {
        Ok("start") => panic!("test hook: _KINETRACE_TEST_PANIC=start"),
        Ok("step") => PROCESS.test_panic_at_step.store(true, Ordering::Relaxed),
        _ => {}
    }
    if !with_cuda {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        if hip_mapped(&maps) {
            // HIP is here: its backend says in one line what it records through (see
            // `process::probe_hip`).
            profiler.add_gpu();
        } else {
            log(no_cuda_message(&maps));
            if config.activities.contains(kinetrace::ActivityType::Memory) {
                log(MEMORY_WITHOUT_CUDA);
            }
        }
    }
    Ok(Some(Running {
        profiler,
        config,
        log,
        root,
        worker,
        stop: Arc::new(AtomicBool::new(false)),
        control_path: Mutex::new(None),
        cleanup: std::sync::OnceLock::new(),
    }))
}

/// How the profiler was started, written into the trace's metadata (`kinetrace_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// By the preloaded / injected shim, configured from the environment.
    Preload,
    /// By the job itself (`kinetrace.profile`), configured by the text it handed over.
    Api,
}

/// The trace file name prefix: `ACTIVITIES_LOG_FILE`'s stem with the pid, else `{host}_{pid}`.
pub(crate) fn worker_name(config: &Config) -> String {
    match &config.worker_prefix {
        Some(p) => format!("{p}_{}", std::process::id()),
        None => kinetrace::export::default_worker_name(),
    }
}

/// Builds and starts the profiler `config` describes (through the public `ProfilerBuilder`) and
/// applies its window; the GPU backend at once when `with_gpu`, else CPU only (the caller adds it
/// when the GPU runtime initialises).
pub(crate) fn build(
    config: &Config,
    distributed: &Distributed,
    first_step: u64,
    mode: Mode,
    log: &LogFn,
    with_gpu: bool,
) -> Result<Profiler, StartError> {
    let session_log = log.clone();
    let mut builder = Profiler::builder()
        .activities(config.activities)
        .output_dir(absolute(&config.output_dir))
        .worker_name(worker_name(config))
        .gzip(config.gzip)
        // A single process is rank 0.
        .rank(distributed.rank.unwrap_or(0))
        .first_step(first_step)
        .metadata(
            "kinetrace_mode",
            match mode {
                Mode::Preload => "preload",
                Mode::Api => "api",
            },
        )
        .log(move |m| session_log(m))
        .max_gpu_buffer_mb(config.max_gpu_buffer_mb)
        .dynolog(config.dynolog)
        .dynolog_interval(config.dynolog_interval)
        .dynolog_uid(config.dynolog_uid)
        .ring_memory_cap((config.max_cpu_buffer_mb as usize) << 20)
        .framework(config.torch.framework());
    if let Some(w) = distributed.world_size {
        builder = builder.world_size(w);
    }
    if let Some(p) = &config.cupti_path {
        builder = builder.gpu_library(p);
    }
    if let Some(n) = config.rocm_max_events {
        builder = builder.rocm_max_events(n);
    }
    if let Some(f) = config.flight.config() {
        builder = builder
            .flight_recorder(f.span)
            .flight_memory(f.memory_cap)
            .flight_slow_step(f.slow_step)
            .flight_hang_after(f.hang_after)
            .flight_after(f.after);
    }
    if !with_gpu {
        // The GPU backend is added when the GPU runtime initialises (`Profiler::add_gpu`).
        builder = builder.cpu_only();
    }
    let mut request = None;
    builder = match config.window {
        Window::OnDemand => builder.on_demand(),
        Window::WholeRun => builder,
        Window::Iterations { start, count } => {
            let at = if start <= first_step {
                CaptureStart::Now
            } else {
                CaptureStart::AtStep(start)
            };
            request = Some(CaptureRequest::new(at, CaptureLength::Steps(count)));
            builder.on_demand()
        }
        Window::Steps { first, last } => builder.step_range(first, last),
        Window::Time {
            delay,
            warmup,
            duration,
        } => builder.time_window_with_warmup(delay, warmup, duration),
        Window::Schedule(s) => builder.schedule(s),
    };
    let profiler = builder.start().map_err(StartError::Profiler)?;
    if let Some(r) = request {
        if let Err(e) = profiler.request_capture(r) {
            log(&format!("the configured window cannot start: {e}"));
        }
    }
    Ok(profiler)
}

/// The other library `CUDA_INJECTION64_PATH` names, if it is not this shim.
fn foreign_injection(vars: &[(String, String)]) -> Option<String> {
    let (_, v) = vars.iter().find(|(k, _)| k == "CUDA_INJECTION64_PATH")?;
    if v.is_empty() {
        return None;
    }
    let me = PROCESS.embedding.self_path.get()?;
    let same = match (Path::new(v).canonicalize(), me.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => Path::new(v) == me,
    };
    (!same).then(|| v.clone())
}

/// What `--memory` (`KINETRACE_MEMORY`) gives a process without CUDA, said when it starts so.
pub const MEMORY_WITHOUT_CUDA: &str = "--memory (KINETRACE_MEMORY) records the CUDA driver's \
     allocations, and this process has no CUDA yet: no [memory] events are recorded until it \
     initialises CUDA; PyTorch's allocator (CPU and GPU tensors, what torch.profiler's \
     profile_memory=True records) is kinetrace record --profile-memory";

/// The one line logged when profiling starts at a step before CUDA initialised: no driver loaded
/// (a CPU-only run, or a machine without NVIDIA's driver), or CUDA loaded but not yet initialised.
/// Either way the process is profiled, CPU activity only until CUDA initialises.
pub fn no_cuda_message(maps: &str) -> &'static str {
    if cuda_mapped(maps) {
        "profiling started at a step before CUDA initialised: the trace holds CPU activity until it \
         does"
    } else {
        "no CUDA driver in this process: profiling CPU activity only (steps, annotations); GPU \
         activity is added if CUDA initialises later"
    }
}

/// Whether the CUDA driver (`libcuda`) is mapped into this process (per `/proc/self/maps` text).
pub(crate) fn cuda_mapped(maps: &str) -> bool {
    mapped_files(maps).any(|f| file_name_starts(f, "libcuda.so"))
}

/// Whether HIP's runtime (`libamdhip64`) is mapped into this process (per `/proc/self/maps`
/// text).
pub(crate) fn hip_mapped(maps: &str) -> bool {
    mapped_files(maps).any(|f| file_name_starts(f, "libamdhip64.so"))
}

/// The libcupti files mapped into this process (per `/proc/self/maps` text).
pub fn loaded_cupti_paths(maps: &str) -> Vec<PathBuf> {
    mapped_files(maps)
        .filter(|p| file_name_starts(p, "libcupti.so"))
        .fold(Vec::new(), |mut v, p| {
            if !v.iter().any(|q: &PathBuf| q == Path::new(p)) {
                v.push(PathBuf::from(p));
            }
            v
        })
}

fn mapped_files(maps: &str) -> impl Iterator<Item = &str> {
    maps.lines().filter_map(|l| l.split_whitespace().nth(5))
}

fn file_name_starts(path: &str, prefix: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with(prefix))
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
        assert!(!hip_mapped(&gpu));
        assert!(hip_mapped(&format!(
            "{cpu}7f0000006000-7f0000007000 r-xp 00000000 08:01 45 /opt/rocm-6.2.2/lib/libamdhip64.so.6.2.60202\n"
        )));
        assert_eq!(
            loaded_cupti_paths(cpu),
            vec![PathBuf::from("/opt/nvidia/cu13/lib/libcupti.so.13")]
        );
    }

    #[test]
    fn a_start_error_is_one_line_saying_the_job_runs_on() {
        let e = StartError::Env(EnvError {
            key: "WORLD_SIZE",
            value: "eight".into(),
        });
        assert_eq!(
            e.to_string(),
            "WORLD_SIZE: `eight` is not a world size; expected an integer >= 1 such as 8; \
             profiling is off in this process (the job runs normally)"
        );
    }
}
