//! Configuration for profiling a process from outside: environment variables `KINETRACE_*` and,
//! for people who already have one, a Kineto-style config file named by `KINETO_CONFIG`.
//!
//! One table, [`KEYS`], drives everything: the parser looks keys up in it, each row parses its own
//! value and states its accepted form (used verbatim in error messages), and `docs/config.md` is
//! generated from it ([`markdown_table`]; a test keeps the two equal). An unknown `KINETRACE_*`
//! variable or file key is an error with a suggestion; a malformed value is an error naming the key
//! and the accepted form. Values are never rewritten: what cannot be honoured is an error.
//!
//! Layers: the file is read first, then the environment; a key given in both takes the
//! environment's value, and if the environment chooses a capture window (any window key), it
//! replaces the file's window as a whole. Two window kinds in one layer are a conflict.
//!
//! Files: this one (the types), `keys.rs` (the table), `parse.rs` (value parsers, the step glob,
//! suggestions), `load.rs` (environment and file layers, [`Config::from_vars`]), `docs.rs` (the
//! Markdown table), `tests.rs`.

use std::path::PathBuf;
use std::time::Duration;

use kinetrace_core::activity::ActivitySet;
use kinetrace_core::schedule::Schedule;
use kinetrace_core::session::CaptureLength;

mod docs;
mod keys;
mod load;
mod parse;
#[cfg(test)]
mod tests;

pub use docs::markdown_table;
pub use keys::KEYS;
pub use parse::{glob_matches, parse_duration, suggest};

/// What a process records without being asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Nothing until `kinetrace trigger` (or the signal, if enabled) asks.
    OnDemand,
    /// From the start of profiling to process exit, as one trace.
    WholeRun,
    /// `count` iterations starting at iteration `start` (at once if the process is already past it).
    Iterations {
        /// The first iteration recorded.
        start: u64,
        /// How many.
        count: u32,
    },
    /// Steps `first..=last` exactly.
    Steps {
        /// The first step recorded.
        first: u64,
        /// The last step recorded.
        last: u64,
    },
    /// A span of wall time measured from when profiling starts in the process.
    Time {
        /// Until recording starts.
        delay: Duration,
        /// Sources on, events discarded, just before recording (Kineto's warm-up period).
        warmup: Duration,
        /// Recording.
        duration: Duration,
    },
    /// A `torch.profiler.schedule`.
    Schedule(Schedule),
}

/// Which processes of a job profile, by rank (`RANK`, else `LOCAL_RANK`, else 0; see
/// `kinetrace::env::Distributed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranks(pub Vec<(u32, u32)>);

impl Ranks {
    /// Whether `rank` is selected.
    pub fn contains(&self, rank: u32) -> bool {
        self.0.iter().any(|(a, b)| (*a..=*b).contains(&rank))
    }
}

/// Where kinetrace's one-line messages go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    /// Standard error, prefixed `kinetrace: `.
    Stderr,
    /// Appended to this file, prefixed `kinetrace[pid]: `.
    File(PathBuf),
}

/// The resolved configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The trace root: traces go here (on-demand requests may name subdirectories of it).
    pub output_dir: PathBuf,
    /// A prefix for trace file names (from `ACTIVITIES_LOG_FILE`); the default is `{host}_{pid}`.
    pub worker_prefix: Option<String>,
    /// What is recorded without being asked.
    pub window: Window,
    /// Which records to keep.
    pub activities: ActivitySet,
    /// Gzip the traces.
    pub gzip: bool,
    /// Which ranks profile (`None`: all).
    pub ranks: Option<Ranks>,
    /// Bound on CUPTI's activity buffers, in MiB.
    pub max_gpu_buffer_mb: u32,
    /// Bound on the span rings, in MiB.
    pub max_cpu_buffer_mb: u32,
    /// Where messages go.
    pub log: LogTarget,
    /// Listen for `kinetrace trigger` on a per-process Unix socket.
    pub control: bool,
    /// The directory holding the control sockets (`None`: `/tmp/kinetrace-<uid>`).
    pub control_dir: Option<PathBuf>,
    /// Capture this much on SIGUSR2 (`None`: the signal is left alone).
    pub signal: Option<CaptureLength>,
    /// Use this libcupti (read by the CUPTI backend itself).
    pub cupti_path: Option<PathBuf>,
    /// Bound on the ROCm backend's queue of records between its callbacks and the collector
    /// (`None`: the backend's default).
    pub rocm_max_events: Option<u32>,
    /// The Kineto-style file that was read, if any.
    pub kineto_config: Option<PathBuf>,
    /// NVTX ranges whose message matches this glob mark steps (`KINETRACE_STEP_NVTX`).
    pub step_nvtx: Option<String>,
    /// What PyTorch processes record of their framework side inside windows.
    pub torch: TorchCapture,
    /// Answer dynolog's `dyno gputrace` (`KINETRACE_DYNOLOG`).
    pub dynolog: bool,
    /// Between dynolog polls (`KINETRACE_DYNOLOG_INTERVAL`).
    pub dynolog_interval: Duration,
    /// A uid besides root and the job's own whose dynolog replies count (`KINETRACE_DYNOLOG_UID`).
    pub dynolog_uid: Option<u32>,
    /// The flight recorder (`KINETRACE_FLIGHT_*`).
    pub flight: FlightSettings,
}

/// The flight recorder's settings (`KINETRACE_FLIGHT_*`; see docs/flight.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlightSettings {
    /// What it keeps (`None`: the flight recorder is off).
    pub span: Option<kinetrace::FlightSpan>,
    /// Bound on the bytes of the records kept.
    pub memory: usize,
    /// SIGUSR2 writes a dump.
    pub signal: bool,
    /// The slow-step factor in hundredths (`None`: off).
    pub slow_factor: Option<u32>,
    /// Steps the slow-step median is over.
    pub slow_window: u32,
    /// Shortest time between slow-step dumps.
    pub slow_interval: Duration,
    /// The hang trigger's stall time (`None`: off).
    pub hang: Option<Duration>,
    /// How long a dump goes on recording after its trigger (zero: written at once).
    pub after: Duration,
}

impl Default for FlightSettings {
    fn default() -> Self {
        FlightSettings {
            span: None,
            memory: kinetrace::DEFAULT_FLIGHT_MEMORY,
            signal: false,
            slow_factor: Some(300),
            slow_window: 20,
            slow_interval: Duration::from_secs(60),
            hang: None,
            after: kinetrace::DEFAULT_FLIGHT_AFTER,
        }
    }
}

impl FlightSettings {
    /// The profiler's flight configuration, when the flight recorder is on.
    pub fn config(&self) -> Option<kinetrace::FlightConfig> {
        let span = self.span?;
        Some(kinetrace::FlightConfig {
            span,
            memory_cap: self.memory,
            slow_step: self.slow_factor.map(|f| kinetrace::SlowStepRule {
                factor: f64::from(f) / 100.0,
                window: self.slow_window,
                min_interval: self.slow_interval,
            }),
            hang_after: self.hang,
            after: self.after,
        })
    }
}

/// The framework view of a PyTorch process (the `sitecustomize` that `kinetrace record` installs
/// turns it on inside windows; see docs/record.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TorchCapture {
    /// ATen ops and autograd functions as `cpu_op` events (`KINETRACE_TORCH_OPS`).
    pub ops: bool,
    /// Their input shapes, as `Input Dims` (`KINETRACE_RECORD_SHAPES`).
    pub shapes: bool,
    /// `nn.Module` forward ranges (`KINETRACE_WITH_MODULES`).
    pub modules: bool,
    /// The Python frames around the ops (`KINETRACE_WITH_STACK`).
    pub stack: bool,
    /// PyTorch's allocator events (`KINETRACE_PROFILE_MEMORY`).
    pub memory: bool,
}

impl TorchCapture {
    /// What the framework side turns on in every window, as the trace head states it.
    pub fn framework(&self) -> kinetrace::FrameworkOptions {
        kinetrace::FrameworkOptions {
            record_shapes: self.ops && self.shapes,
            with_stack: self.ops && self.stack,
            profile_memory: self.ops && self.memory,
        }
    }
}

impl Default for TorchCapture {
    fn default() -> Self {
        TorchCapture {
            ops: true,
            shapes: false,
            modules: true,
            stack: false,
            memory: false,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            output_dir: PathBuf::from("kinetrace-traces"),
            worker_prefix: None,
            window: Window::OnDemand,
            activities: ActivitySet::default_set(),
            gzip: false,
            ranks: None,
            max_gpu_buffer_mb: 128,
            max_cpu_buffer_mb: 256,
            log: LogTarget::Stderr,
            control: true,
            control_dir: None,
            signal: None,
            cupti_path: None,
            rocm_max_events: None,
            kineto_config: None,
            step_nvtx: None,
            torch: TorchCapture::default(),
            dynolog: false,
            dynolog_interval: Duration::from_secs(5),
            dynolog_uid: None,
            flight: FlightSettings::default(),
        }
    }
}

/// Where a setting came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The environment.
    Env,
    /// A Kineto-style file, at this line (1-based).
    File(PathBuf, usize),
}

/// A configuration that cannot be used: profiling stays off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The key at fault.
    pub key: String,
    /// Where it was set.
    pub origin: Origin,
    /// What is wrong, including the accepted form.
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Origin::File(path, line) = &self.origin {
            write!(f, "{}:{line}: ", path.display())?;
        }
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// One configuration key: its spellings, accepted form, default and meaning, and its parser.
pub struct Key {
    /// The environment variable (`None`: file only).
    pub env: Option<&'static str>,
    /// The Kineto config file spelling (`None`: environment only; files also accept `env`).
    pub kineto: Option<&'static str>,
    /// The accepted form, as error messages and the docs state it.
    pub form: &'static str,
    /// The default, in words.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
    apply: fn(&mut Layer, &str) -> Result<(), String>,
}

impl Key {
    /// The spelling shown first (environment, else file).
    pub fn name(&self) -> &'static str {
        self.env.or(self.kineto).unwrap_or("")
    }
}

/// Kineto file keys kinetrace accepts and ignores (they tune Kineto internals or PyTorch client
/// options kinetrace has no counterpart for).
pub const KINETO_IGNORED: [(&str, &str); 4] = [
    (
        "CUPTI_PER_THREAD_BUFFER_ENABLED",
        "kinetrace chooses CUPTI's buffer mode itself",
    ),
    (
        "ACTIVITIES_DISPLAY_CUDA_SYNC_WAIT_EVENTS",
        "sync records follow ACTIVITY_TYPES",
    ),
    ("PROFILE_WITH_FLOPS", "kinetrace records no FLOP estimates"),
    ("REQUEST_TRACE_ID", "trace ids are generated per trace"),
];

/// Kineto file keys kinetrace does not implement: an error, since ignoring them would change what
/// the user asked for.
pub const KINETO_UNSUPPORTED: [&str; 4] = [
    "ACTIVITIES_WARMUP_ITERATIONS",
    "PROFILE_START_ITERATION_ROUNDUP",
    "PROFILE_START_TIME",
    "TEARDOWN_CUPTI",
];

/// `KINETRACE_*` variables that other kinetrace tools and tests read; the profiler ignores them.
pub const NOT_PROFILER_KEYS: [&str; 13] = [
    "KINETRACE_PRELOAD_PATH",
    "KINETRACE_EMBED_SHIM",
    "KINETRACE_BIN",
    "KINETRACE_GIT_HASH",
    "KINETRACE_DEMO",
    "KINETRACE_TEST_CHILD",
    "KINETRACE_CUPTI_WHEELS",
    "KINETRACE_CUPTI_REGEN",
    "KINETRACE_UPDATE_GOLDEN",
    "KINETRACE_HTA_FIXTURE",
    "KINETRACE_ROCM_FIXTURE",
    "KINETRACE_ALLOW_MISSING_TRACES",
    "KINETRACE_BLESS",
];

/// The environment keys that choose a capture window (a tool setting one removes the others).
pub const WINDOW_ENV_KEYS: [&str; 7] = [
    "KINETRACE_ITERATIONS",
    "KINETRACE_START_ITERATION",
    "KINETRACE_STEPS",
    "KINETRACE_DURATION",
    "KINETRACE_DELAY",
    "KINETRACE_SCHEDULE",
    "KINETRACE_WHOLE_RUN",
];

/// One layer's settings (file or environment).
#[derive(Default)]
struct Layer {
    kineto_config: Option<PathBuf>,
    output_dir: Option<PathBuf>,
    log_file: Option<PathBuf>,
    iterations: Option<u32>,
    start_iteration: Option<u64>,
    steps: Option<(u64, u64)>,
    duration: Option<Duration>,
    delay: Option<Duration>,
    warmup_period: bool,
    schedule: Option<Schedule>,
    whole_run: Option<bool>,
    activities: Option<ActivitySet>,
    memory: Option<bool>,
    gzip: Option<bool>,
    ranks: Option<Ranks>,
    max_gpu_buffer_mb: Option<u32>,
    max_cpu_buffer_mb: Option<u32>,
    log: Option<LogTarget>,
    control: Option<bool>,
    control_dir: Option<PathBuf>,
    signal: Option<Option<CaptureLength>>,
    cupti_path: Option<PathBuf>,
    rocm_max_events: Option<u32>,
    step_nvtx: Option<String>,
    torch_ops: Option<bool>,
    record_shapes: Option<bool>,
    with_modules: Option<bool>,
    with_stack: Option<bool>,
    profile_memory: Option<bool>,
    dynolog: Option<bool>,
    dynolog_interval: Option<Duration>,
    dynolog_uid: Option<u32>,
    flight_span: Option<kinetrace::FlightSpan>,
    flight_memory: Option<usize>,
    flight_signal: Option<bool>,
    flight_slow: Option<Option<u32>>,
    flight_slow_window: Option<u32>,
    flight_slow_interval: Option<Duration>,
    flight_hang: Option<Option<Duration>>,
    flight_after: Option<Duration>,
    /// Which key set each field, for conflict messages.
    names: Vec<(&'static str, &'static str)>,
}

impl Config {
    /// Reads this process's environment (and the `KINETO_CONFIG` file it names).
    pub fn from_env() -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Config::from_vars(&vars, |p| std::fs::read_to_string(p))
    }

    // `from_vars` (the layering of file and environment) is in load.rs. `RANK`, `LOCAL_RANK` and
    // `WORLD_SIZE` are the launcher's, read by `kinetrace::env::Distributed`.

    /// The socket directory: `control_dir`, else `/tmp/kinetrace-<uid>`.
    pub fn control_dir_or_default(&self) -> PathBuf {
        self.control_dir.clone().unwrap_or_else(default_control_dir)
    }
}

pub use crate::control::default_control_dir;
