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

use std::path::{Path, PathBuf};
use std::time::Duration;

use kinetrace_core::activity::{ActivitySet, ActivityType};
use kinetrace_core::schedule::Schedule;
use kinetrace_core::session::CaptureLength;

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

/// Which processes of a job profile, by `RANK` (else `LOCAL_RANK`, else 0).
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
    /// The Kineto-style file that was read, if any.
    pub kineto_config: Option<PathBuf>,
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
            log: LogTarget::Stderr,
            control: true,
            control_dir: None,
            signal: None,
            cupti_path: None,
            kineto_config: None,
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
pub const KINETO_IGNORED: [(&str, &str); 9] = [
    (
        "CUPTI_PER_THREAD_BUFFER_ENABLED",
        "kinetrace chooses CUPTI's buffer mode itself",
    ),
    (
        "ACTIVITIES_DISPLAY_CUDA_SYNC_WAIT_EVENTS",
        "sync records follow ACTIVITY_TYPES",
    ),
    (
        "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS",
        "on-demand requests arrive over kinetrace's socket",
    ),
    (
        "ROCTRACER_MAX_EVENTS",
        "ROCm is not handled by this backend",
    ),
    (
        "PROFILE_REPORT_INPUT_SHAPES",
        "kinetrace records no input shapes",
    ),
    ("PROFILE_WITH_STACK", "kinetrace records no Python stacks"),
    ("PROFILE_WITH_FLOPS", "kinetrace records no FLOP estimates"),
    (
        "PROFILE_WITH_MODULES",
        "kinetrace records no module hierarchy",
    ),
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
pub const NOT_PROFILER_KEYS: [&str; 12] = [
    "KINETRACE_PRELOAD_PATH",
    "KINETRACE_BIN",
    "KINETRACE_GIT_HASH",
    "KINETRACE_DEMO",
    "KINETRACE_CUPTI_TEST_CHILD",
    "KINETRACE_CUPTI_WHEELS",
    "KINETRACE_CUPTI_REGEN",
    "KINETRACE_UPDATE_GOLDEN",
    "KINETRACE_HTA_FIXTURE",
    "KINETRACE_ALLOW_MISSING_TRACES",
    "KINETRACE_PRELOAD_TEST_CHILD",
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

const FORM_POS_INT: &str = "an integer >= 1, such as 3";
const FORM_NONNEG_INT: &str = "an integer >= 0, such as 10";
const FORM_BOOL: &str = "1, 0, true or false";
const FORM_DURATION: &str = "an integer with a unit ms, s or m, such as 500ms or 2s";
const FORM_PATH: &str = "a non-empty path";

/// Every key, in documentation order.
pub static KEYS: &[Key] = &[
    Key {
        env: Some("KINETO_CONFIG"),
        kineto: None,
        form: "the path of a Kineto-style file of KEY=VALUE lines (`#` starts a comment)",
        default: "none",
        doc: "Reads the Kineto keys below (and any KINETRACE_ key) from this file; the environment \
              overrides it.",
        apply: |l, v| path(v).map(|p| l.kineto_config = Some(p)),
    },
    Key {
        env: Some("KINETRACE_OUTPUT_DIR"),
        kineto: None,
        form: FORM_PATH,
        default: "./kinetrace-traces",
        doc: "The trace root: each profiled process writes `{host}_{pid}.{time}.pt.trace.json[.gz]` \
              here. On-demand requests may name directories under it, never outside.",
        apply: |l, v| path(v).map(|p| l.output_dir = Some(p)),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_LOG_FILE"),
        form: "a file path such as /tmp/trace.json",
        default: "none",
        doc: "Kineto's output file: traces go to its directory, named `{stem}_{pid}.{time}.pt.trace.json`.",
        apply: |l, v| path(v).map(|p| l.log_file = Some(p)),
    },
    Key {
        env: Some("KINETRACE_ITERATIONS"),
        kineto: Some("ACTIVITIES_ITERATIONS"),
        form: FORM_POS_INT,
        default: "none (no iteration window)",
        doc: "Record this many iterations (optimizer steps or explicit step calls) as one trace. \
              Window key.",
        apply: |l, v| pos_u32(v).map(|n| l.iterations = Some(n)),
    },
    Key {
        env: Some("KINETRACE_START_ITERATION"),
        kineto: Some("PROFILE_START_ITERATION"),
        form: FORM_NONNEG_INT,
        default: "0",
        doc: "The first iteration of the iteration window (at once if the process is already past \
              it). Needs KINETRACE_ITERATIONS.",
        apply: |l, v| u64_(v).map(|n| l.start_iteration = Some(n)),
    },
    Key {
        env: Some("KINETRACE_STEPS"),
        kineto: None,
        form: "FIRST-LAST with FIRST <= LAST, such as 10-20",
        default: "none",
        doc: "Record steps FIRST to LAST inclusive (a framework's profile_step_start/end). Window key.",
        apply: |l, v| step_range(v).map(|r| l.steps = Some(r)),
    },
    Key {
        env: Some("KINETRACE_DURATION"),
        kineto: None,
        form: FORM_DURATION,
        default: "500ms when KINETRACE_DELAY is set, else none",
        doc: "Record this much wall time as one trace, starting KINETRACE_DELAY after profiling \
              starts in the process (CUDA initialisation or the first step). Window key.",
        apply: |l, v| duration(v, false).map(|d| l.duration = Some(d)),
    },
    Key {
        env: Some("KINETRACE_DELAY"),
        kineto: None,
        form: "an integer with a unit ms, s or m, such as 30s (0 allowed)",
        default: "0s",
        doc: "Wait this long before the timed window. Window key.",
        apply: |l, v| duration(v, true).map(|d| l.delay = Some(d)),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_DURATION_MSECS"),
        form: "an integer number of milliseconds >= 1, such as 500",
        default: "500 when a timed window is chosen",
        doc: "Kineto's timed window length. Window key.",
        apply: |l, v| pos_u32(v).map(|n| l.duration = Some(Duration::from_millis(n.into()))),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_DURATION_SECS"),
        form: "an integer number of seconds >= 1, such as 2",
        default: "none",
        doc: "Kineto's timed window length in seconds. Window key.",
        apply: |l, v| pos_u32(v).map(|n| l.duration = Some(Duration::from_secs(n.into()))),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_WARMUP_PERIOD_SECS"),
        form: "an integer number of seconds >= 0, such as 5",
        default: "5 when a timed window is chosen in the file (Kineto's default)",
        doc: "Kineto's warm-up: the timed window starts this long after profiling starts, with CUPTI \
              enabled (events discarded) during it. Window key.",
        apply: |l, v| {
            u64_(v).map(|n| {
                l.delay = Some(Duration::from_secs(n));
                l.warmup_period = true;
            })
        },
    },
    Key {
        env: Some("KINETRACE_SCHEDULE"),
        kineto: None,
        form: "comma-separated wait=N, warmup=N, active=N (required, >= 1), repeat=N, skip_first=N, \
               skip_first_wait=0|1, such as wait=1,warmup=1,active=2,repeat=1",
        default: "none",
        doc: "A torch.profiler.schedule over steps; one trace per cycle. Window key.",
        apply: |l, v| schedule(v).map(|s| l.schedule = Some(s)),
    },
    Key {
        env: Some("KINETRACE_WHOLE_RUN"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "Record from the start of profiling to process exit as one trace (like nsys). Window key.",
        apply: |l, v| boolean(v).map(|b| l.whole_run = Some(b)),
    },
    Key {
        env: Some("KINETRACE_ACTIVITIES"),
        kineto: Some("ACTIVITY_TYPES"),
        form: "a comma-separated list of cpu_op, user_annotation, cuda_runtime, cuda_driver, kernel, \
               gpu_memcpy, gpu_memset, cuda_sync, cpu_instant_event, marker, overhead (Kineto names \
               kinetrace does not record, such as python_function, are accepted and have no effect)",
        default: "all but cpu_instant_event and marker (Kineto's default set)",
        doc: "Which records to keep.",
        apply: |l, v| activities(v).map(|a| l.activities = Some(a)),
    },
    Key {
        env: Some("KINETRACE_MEMORY"),
        kineto: Some("PROFILE_PROFILE_MEMORY"),
        form: FORM_BOOL,
        default: "0",
        doc: "Also record allocations and frees (`[memory]` instant events).",
        apply: |l, v| boolean(v).map(|b| l.memory = Some(b)),
    },
    Key {
        env: Some("KINETRACE_GZIP"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "Write `.pt.trace.json.gz`.",
        apply: |l, v| boolean(v).map(|b| l.gzip = Some(b)),
    },
    Key {
        env: Some("KINETRACE_RANKS"),
        kineto: None,
        form: "all, or a comma-separated list of ranks and ranges, such as 0,8 or 0-3,8",
        default: "all",
        doc: "Which ranks profile, matched against RANK, else LOCAL_RANK, else 0 (a single process \
              is rank 0). Other processes stay dormant.",
        apply: |l, v| ranks(v).map(|r| l.ranks = Some(r)),
    },
    Key {
        env: Some("KINETRACE_MAX_GPU_BUFFER_MB"),
        kineto: Some("ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB"),
        form: FORM_POS_INT,
        default: "128",
        doc: "Bound on CUPTI activity buffers; records beyond it are dropped and counted in the trace.",
        apply: |l, v| pos_u32(v).map(|n| l.max_gpu_buffer_mb = Some(n)),
    },
    Key {
        env: Some("KINETRACE_LOG"),
        kineto: None,
        form: "stderr, or a file path to append to",
        default: "stderr",
        doc: "Where kinetrace's one-line messages go. With a file, kinetrace writes nothing to the \
              job's own output.",
        apply: |l, v| {
            path(v).map(|p| {
                l.log = Some(if p == Path::new("stderr") {
                    LogTarget::Stderr
                } else {
                    LogTarget::File(p)
                })
            })
        },
    },
    Key {
        env: Some("KINETRACE_CONTROL"),
        kineto: None,
        form: FORM_BOOL,
        default: "1",
        doc: "Listen for `kinetrace trigger` on a per-process Unix socket (only the same user may \
              connect).",
        apply: |l, v| boolean(v).map(|b| l.control = Some(b)),
    },
    Key {
        env: Some("KINETRACE_CONTROL_DIR"),
        kineto: None,
        form: FORM_PATH,
        default: "/tmp/kinetrace-<uid>",
        doc: "The directory of control sockets, created with mode 0700; kinetrace refuses one owned \
              by another user or open to others.",
        apply: |l, v| path(v).map(|p| l.control_dir = Some(p)),
    },
    Key {
        env: Some("KINETRACE_SIGNAL"),
        kineto: None,
        form: "off, on (= 500ms), a duration such as 2s, or a step count such as 3steps",
        default: "off",
        doc: "Capture this much when the process receives SIGUSR2 (for hosts where sockets are \
              unavailable). Off by default: the job's own SIGUSR2 handling is left alone.",
        apply: |l, v| signal(v).map(|s| l.signal = Some(s)),
    },
    Key {
        env: Some("KINETRACE_OPTIMIZER_HOOK"),
        kineto: None,
        form: FORM_BOOL,
        default: "1",
        doc: "With `kinetrace record`, a global PyTorch optimizer step hook marks each iteration \
              (installed lazily by the `sitecustomize` record puts on PYTHONPATH). 0 turns it off for \
              jobs that call `kinetrace.step()` themselves.",
        apply: |l, v| boolean(v).map(|_| l.names.push(("other", "KINETRACE_OPTIMIZER_HOOK"))),
    },
    Key {
        env: Some("KINETRACE_CUPTI_PATH"),
        kineto: None,
        form: FORM_PATH,
        default: "search: the libcupti already loaded, CUDA_HOME, pip wheels, the loader path",
        doc: "Use this libcupti.",
        apply: |l, v| path(v).map(|p| l.cupti_path = Some(p)),
    },
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
    log: Option<LogTarget>,
    control: Option<bool>,
    control_dir: Option<PathBuf>,
    signal: Option<Option<CaptureLength>>,
    cupti_path: Option<PathBuf>,
    /// Which key set each field, for conflict messages.
    names: Vec<(&'static str, &'static str)>,
}

impl Layer {
    fn key_for(&self, field: &str) -> &'static str {
        self.names
            .iter()
            .rev()
            .find(|(f, _)| *f == field)
            .map(|(_, k)| *k)
            .unwrap_or("")
    }

    /// The window this layer chooses, if any.
    fn window(
        &self,
        origin: &dyn Fn(&'static str) -> Origin,
    ) -> Result<Option<Window>, ConfigError> {
        let mut chosen: Vec<(&'static str, Window)> = Vec::new();
        let err = |key: &'static str, message: String| ConfigError {
            key: key.to_string(),
            origin: origin(key),
            message,
        };
        if self.iterations.is_some() || self.start_iteration.is_some() {
            let Some(count) = self.iterations else {
                let key = self.key_for("start_iteration");
                let need = if key.starts_with("KINETRACE_") {
                    "KINETRACE_ITERATIONS"
                } else {
                    "ACTIVITIES_ITERATIONS"
                };
                return Err(err(key, format!("has no effect without {need}; set both")));
            };
            let start = self.start_iteration.unwrap_or(0);
            chosen.push((
                self.key_for("iterations"),
                Window::Iterations { start, count },
            ));
        }
        if let Some((first, last)) = self.steps {
            chosen.push((self.key_for("steps"), Window::Steps { first, last }));
        }
        if self.duration.is_some() || self.delay.is_some() {
            let key = if self.duration.is_some() {
                self.key_for("duration")
            } else {
                self.key_for("delay")
            };
            let from_file = !key.starts_with("KINETRACE_");
            let delay = self.delay.unwrap_or(if from_file {
                Duration::from_secs(5)
            } else {
                Duration::ZERO
            });
            let warmup = if from_file { delay } else { Duration::ZERO };
            let duration = self.duration.unwrap_or(Duration::from_millis(500));
            chosen.push((
                key,
                Window::Time {
                    delay,
                    warmup,
                    duration,
                },
            ));
        }
        if let Some(s) = self.schedule {
            chosen.push((self.key_for("schedule"), Window::Schedule(s)));
        }
        if self.whole_run == Some(true) {
            chosen.push((self.key_for("whole_run"), Window::WholeRun));
        }
        match chosen.as_slice() {
            [] => Ok(None),
            [(_, w)] => Ok(Some(*w)),
            [(a, _), (b, _), ..] => Err(err(
                b,
                format!("conflicts with {a}: both choose a capture window; keep one"),
            )),
        }
    }
}

fn field_of(key: &Key) -> &'static str {
    match key.name() {
        "KINETO_CONFIG" => "kineto_config",
        "KINETRACE_OUTPUT_DIR" => "output_dir",
        "ACTIVITIES_LOG_FILE" => "log_file",
        "KINETRACE_ITERATIONS" => "iterations",
        "KINETRACE_START_ITERATION" => "start_iteration",
        "KINETRACE_STEPS" => "steps",
        "KINETRACE_DURATION" | "ACTIVITIES_DURATION_MSECS" | "ACTIVITIES_DURATION_SECS" => {
            "duration"
        }
        "KINETRACE_DELAY" | "ACTIVITIES_WARMUP_PERIOD_SECS" => "delay",
        "KINETRACE_SCHEDULE" => "schedule",
        "KINETRACE_WHOLE_RUN" => "whole_run",
        _ => "other",
    }
}

fn find_env_key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.env == Some(name))
}

fn find_file_key(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.kineto == Some(name) || (k.env == Some(name) && name != "KINETO_CONFIG"))
}

fn apply(
    layer: &mut Layer,
    key: &'static Key,
    spelled: &'static str,
    value: &str,
) -> Result<(), String> {
    let value = value.trim();
    (key.apply)(layer, value).map_err(|what| {
        let shown = if value.is_empty() {
            "is empty".to_string()
        } else {
            format!("`{value}` {what}")
        };
        format!("{shown}; expected {}", key.form)
    })?;
    layer.names.push((field_of(key), spelled));
    Ok(())
}

impl Config {
    /// Reads this process's environment (and the `KINETO_CONFIG` file it names).
    pub fn from_env() -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Config::from_vars(&vars, |p| std::fs::read_to_string(p))
    }

    /// Resolves `vars` (environment pairs; only `KINETRACE_*` and `KINETO_CONFIG` are read), with
    /// `read` fetching the Kineto file's text.
    pub fn from_vars(
        vars: &[(String, String)],
        read: impl Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Config, ConfigError> {
        let mut env = Layer::default();
        let mut names: Vec<&str> = vars
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| k.starts_with("KINETRACE_") || *k == "KINETO_CONFIG")
            .collect();
        names.sort_unstable();
        for name in names {
            let value = vars
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str());
            let value = value.unwrap_or("");
            if NOT_PROFILER_KEYS.contains(&name) {
                continue;
            }
            let Some(key) = find_env_key(name) else {
                return Err(ConfigError {
                    key: name.to_string(),
                    origin: Origin::Env,
                    message: unknown_message(name, KEYS.iter().filter_map(|k| k.env)),
                });
            };
            apply(&mut env, key, key.env.unwrap_or_default(), value).map_err(|message| {
                ConfigError {
                    key: name.to_string(),
                    origin: Origin::Env,
                    message,
                }
            })?;
        }
        let mut file = Layer::default();
        let mut file_path = None;
        let mut file_lines: Vec<(&'static str, usize)> = Vec::new();
        if let Some(path) = env.kineto_config.clone() {
            let text = read(&path).map_err(|e| ConfigError {
                key: "KINETO_CONFIG".into(),
                origin: Origin::Env,
                message: format!(
                    "cannot read {}: {e}; expected the path of a readable file",
                    path.display()
                ),
            })?;
            for (i, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let origin = Origin::File(path.clone(), i + 1);
                let Some((k, v)) = line.split_once('=') else {
                    return Err(ConfigError {
                        key: line.to_string(),
                        origin,
                        message: "is not a KEY=VALUE line".into(),
                    });
                };
                let k = k.trim();
                if KINETO_IGNORED.iter().any(|(n, _)| *n == k) {
                    continue;
                }
                if KINETO_UNSUPPORTED.contains(&k) {
                    return Err(ConfigError {
                        key: k.to_string(),
                        origin,
                        message: "is a Kineto key kinetrace does not implement; remove it (see docs/config.md)".into(),
                    });
                }
                let Some(key) = find_file_key(k) else {
                    let known = KEYS
                        .iter()
                        .flat_map(|k| [k.kineto, k.env])
                        .flatten()
                        .chain(KINETO_IGNORED.iter().map(|(n, _)| *n));
                    return Err(ConfigError {
                        key: k.to_string(),
                        origin,
                        message: unknown_message(k, known),
                    });
                };
                let spelled = if key.kineto == Some(k) {
                    key.kineto
                } else {
                    key.env
                };
                let spelled = spelled.unwrap_or_default();
                apply(&mut file, key, spelled, v).map_err(|message| ConfigError {
                    key: k.to_string(),
                    origin: origin.clone(),
                    message,
                })?;
                file_lines.push((spelled, i + 1));
            }
            file_path = Some(path);
        }
        let file_origin = |key: &'static str| match &file_path {
            Some(p) => Origin::File(
                p.clone(),
                file_lines
                    .iter()
                    .rev()
                    .find(|(k, _)| *k == key)
                    .map(|(_, l)| *l)
                    .unwrap_or(0),
            ),
            None => Origin::Env,
        };
        let window = match env.window(&|_| Origin::Env)? {
            Some(w) => w,
            None => file.window(&file_origin)?.unwrap_or(Window::OnDemand),
        };
        let mut c = Config {
            window,
            kineto_config: file_path,
            ..Config::default()
        };
        for layer in [file, env] {
            if let Some(p) = layer.log_file {
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|s| !s.is_empty());
                c.worker_prefix = stem;
                c.output_dir = p
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."));
            }
            if let Some(v) = layer.output_dir {
                c.output_dir = v;
            }
            if let Some(v) = layer.activities {
                c.activities = v;
            }
            if let Some(v) = layer.memory {
                c.activities = if v {
                    c.activities.with(ActivityType::Memory)
                } else {
                    c.activities.without(ActivityType::Memory)
                };
            }
            if let Some(v) = layer.gzip {
                c.gzip = v;
            }
            if let Some(v) = layer.ranks {
                c.ranks = Some(v);
            }
            if let Some(v) = layer.max_gpu_buffer_mb {
                c.max_gpu_buffer_mb = v;
            }
            if let Some(v) = layer.log {
                c.log = v;
            }
            if let Some(v) = layer.control {
                c.control = v;
            }
            if let Some(v) = layer.control_dir {
                c.control_dir = Some(v);
            }
            if let Some(v) = layer.signal {
                c.signal = v;
            }
            if let Some(v) = layer.cupti_path {
                c.cupti_path = Some(v);
            }
        }
        Ok(c)
    }

    /// This process's rank as `KINETRACE_RANKS` matches it: `RANK`, else `LOCAL_RANK`, else 0. A
    /// malformed value is an error naming the variable.
    pub fn process_rank(vars: &[(String, String)]) -> Result<u32, ConfigError> {
        for key in ["RANK", "LOCAL_RANK"] {
            if let Some((_, v)) = vars.iter().rev().find(|(k, _)| k == key) {
                if v.trim().is_empty() {
                    continue;
                }
                return v.trim().parse().map_err(|_| ConfigError {
                    key: key.into(),
                    origin: Origin::Env,
                    message: format!("`{v}` is not a rank; expected an integer >= 0 such as 0"),
                });
            }
        }
        Ok(0)
    }

    /// The socket directory: `control_dir`, else `/tmp/kinetrace-<uid>`.
    pub fn control_dir_or_default(&self) -> PathBuf {
        self.control_dir.clone().unwrap_or_else(default_control_dir)
    }
}

/// `/tmp/kinetrace-<uid>`: where `kinetrace trigger` looks by default.
pub fn default_control_dir() -> PathBuf {
    let uid = crate::control::effective_uid().unwrap_or(0);
    PathBuf::from(format!("/tmp/kinetrace-{uid}"))
}

/// The known spelling closest to `name` (case-insensitive), if it is close enough to be a typo.
pub fn suggest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for k in known {
        let d = edit_distance(&name.to_ascii_uppercase(), &k.to_ascii_uppercase());
        if best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, k));
        }
    }
    best.filter(|(d, k)| *d <= (k.len() / 3).max(2))
        .map(|(_, k)| k)
}

fn unknown_message<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
    match suggest(name, known) {
        Some(k) => format!("is not a kinetrace setting; did you mean {k}? (see docs/config.md)"),
        None => "is not a kinetrace setting (see docs/config.md for the list)".to_string(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

// Value parsers: each returns what is wrong (the caller adds the value and the accepted form).

fn nonempty(v: &str) -> Result<&str, String> {
    if v.is_empty() {
        Err("is empty".into())
    } else {
        Ok(v)
    }
}

fn path(v: &str) -> Result<PathBuf, String> {
    nonempty(v).map(PathBuf::from)
}

fn u64_(v: &str) -> Result<u64, String> {
    nonempty(v)?;
    if v.starts_with('-') {
        return Err("is negative".into());
    }
    v.parse::<u64>().map_err(|_| "is not an integer".into())
}

fn pos_u32(v: &str) -> Result<u32, String> {
    let n = u64_(v)?;
    if n == 0 {
        return Err("is 0".into());
    }
    u32::try_from(n).map_err(|_| "is too large".into())
}

fn boolean(v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err("is not a boolean".into()),
    }
}

/// `500ms`, `2s`, `1m`.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().ok()?;
    match unit.trim() {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" | "min" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

fn duration(v: &str, zero_ok: bool) -> Result<Duration, String> {
    nonempty(v)?;
    let d = parse_duration(v).ok_or_else(|| {
        if v.bytes().all(|b| b.is_ascii_digit()) {
            "has no unit".to_string()
        } else {
            "is not a duration".to_string()
        }
    })?;
    if d.is_zero() && !zero_ok {
        return Err("is zero".into());
    }
    Ok(d)
}

fn step_range(v: &str) -> Result<(u64, u64), String> {
    let (a, b) = v.split_once('-').ok_or("is not FIRST-LAST")?;
    let (a, b) = (u64_(a.trim())?, u64_(b.trim())?);
    if b < a {
        return Err("ends before it starts".into());
    }
    Schedule::step_range(a, b).map_err(|e| e.message)?;
    Ok((a, b))
}

fn schedule(v: &str) -> Result<Schedule, String> {
    let mut pairs = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, val) = part
            .split_once('=')
            .ok_or_else(|| format!("has `{part}`, which is not key=N"))?;
        pairs.push((k.trim(), val.trim()));
    }
    Schedule::from_pairs(pairs).map_err(|e| format!("has `{}` that {}", e.field, e.message))
}

/// Kineto `cat` names kinetrace accepts in `ACTIVITY_TYPES` but does not record.
const KINETO_OTHER_TYPES: [&str; 9] = [
    "python_function",
    "external_correlation",
    "gpu_user_annotation",
    "cuda_event",
    "cuda_profiler_range",
    "collective_comm",
    "mtia_runtime",
    "privateuse1_runtime",
    "hpu_op",
];

fn activities(v: &str) -> Result<ActivitySet, String> {
    let mut set = ActivitySet::empty();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let name = name.to_ascii_lowercase();
        if let Some(t) = ActivityType::ALL.iter().find(|t| t.kineto_name() == name) {
            set = set.with(*t);
        } else if !KINETO_OTHER_TYPES.contains(&name.as_str()) {
            let names = ActivityType::ALL.iter().map(|t| t.kineto_name());
            return Err(match suggest(&name, names) {
                Some(k) => format!("has `{name}`, which is no activity type; did you mean {k}?"),
                None => format!("has `{name}`, which is no activity type"),
            });
        }
    }
    if set.is_empty() {
        return Err("selects nothing kinetrace records".into());
    }
    Ok(set)
}

fn ranks(v: &str) -> Result<Ranks, String> {
    if v == "all" {
        return Ok(Ranks(vec![(0, u32::MAX)]));
    }
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim) {
        let parse = |s: &str| -> Result<u32, String> {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("has `{}`, which is not a rank", s.trim()))
        };
        let range = match part.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => {
                let r = parse(part)?;
                (r, r)
            }
        };
        if range.1 < range.0 {
            return Err(format!("has `{part}`, which ends before it starts"));
        }
        out.push(range);
    }
    Ok(Ranks(out))
}

fn signal(v: &str) -> Result<Option<CaptureLength>, String> {
    match v {
        "off" | "0" | "false" => return Ok(None),
        "on" | "1" | "true" => {
            return Ok(Some(CaptureLength::Duration(Duration::from_millis(500))))
        }
        _ => {}
    }
    if let Some(n) = v.strip_suffix("steps").or_else(|| v.strip_suffix("step")) {
        return pos_u32(n.trim()).map(|n| Some(CaptureLength::Steps(n)));
    }
    duration(v, false).map(|d| Some(CaptureLength::Duration(d)))
}

/// The key table as the Markdown that `docs/config.md` holds between its markers.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Environment | Kineto file key | Accepted form | Default | Meaning |\n|---|---|---|---|---|\n",
    );
    let cell = |s: &str| {
        s.replace('|', "\\|")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    for k in KEYS {
        let code = |s: Option<&str>| s.map(|s| format!("`{s}`")).unwrap_or_else(|| "–".into());
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            code(k.env),
            code(k.kineto),
            cell(k.form),
            cell(k.default),
            cell(k.doc)
        ));
    }
    out.push_str("\nKineto file keys accepted and ignored:\n\n");
    for (k, why) in KINETO_IGNORED {
        out.push_str(&format!("- `{k}`: {why}.\n"));
    }
    out.push_str("\nKineto file keys that are an error (kinetrace does not implement them): ");
    let list: Vec<String> = KINETO_UNSUPPORTED
        .iter()
        .map(|k| format!("`{k}`"))
        .collect();
    out.push_str(&list.join(", "));
    out.push_str(".\n\n`KINETRACE_*` variables read by other kinetrace tools and tests, ignored by the profiler: ");
    let list: Vec<String> = NOT_PROFILER_KEYS.iter().map(|k| format!("`{k}`")).collect();
    out.push_str(&list.join(", "));
    out.push_str(".\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(&vars, |_| Err(std::io::Error::other("no file")))
    }

    fn with_file(pairs: &[(&str, &str)], text: &str) -> Result<Config, ConfigError> {
        let mut vars: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        vars.push(("KINETO_CONFIG".into(), "/etc/kineto.conf".into()));
        let text = text.to_string();
        Config::from_vars(&vars, move |_| Ok(text.clone()))
    }

    #[test]
    fn no_settings_is_on_demand_with_defaults() {
        let c = env(&[("PATH", "/bin"), ("HOME", "/root")]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.window, Window::OnDemand);
    }

    #[test]
    fn every_window_key_from_the_environment() {
        let c = env(&[
            ("KINETRACE_ITERATIONS", "3"),
            ("KINETRACE_START_ITERATION", "10"),
        ])
        .unwrap();
        assert_eq!(
            c.window,
            Window::Iterations {
                start: 10,
                count: 3
            }
        );
        let c = env(&[("KINETRACE_STEPS", "4-6")]).unwrap();
        assert_eq!(c.window, Window::Steps { first: 4, last: 6 });
        let c = env(&[("KINETRACE_DURATION", "2s"), ("KINETRACE_DELAY", "30s")]).unwrap();
        assert_eq!(
            c.window,
            Window::Time {
                delay: Duration::from_secs(30),
                warmup: Duration::ZERO,
                duration: Duration::from_secs(2)
            }
        );
        let c = env(&[("KINETRACE_SCHEDULE", "wait=1, warmup=1,active=2,repeat=1")]).unwrap();
        assert_eq!(
            c.window,
            Window::Schedule(Schedule::new(1, 1, 2).unwrap().with_repeat(1))
        );
        let c = env(&[("KINETRACE_WHOLE_RUN", "1")]).unwrap();
        assert_eq!(c.window, Window::WholeRun);
    }

    #[test]
    fn other_keys_from_the_environment() {
        let c = env(&[
            ("KINETRACE_OUTPUT_DIR", "/data/traces"),
            ("KINETRACE_GZIP", "true"),
            ("KINETRACE_MEMORY", "1"),
            ("KINETRACE_RANKS", "0-3,8"),
            ("KINETRACE_MAX_GPU_BUFFER_MB", "64"),
            ("KINETRACE_LOG", "/tmp/k.log"),
            ("KINETRACE_CONTROL", "0"),
            ("KINETRACE_CONTROL_DIR", "/run/k"),
            ("KINETRACE_SIGNAL", "3steps"),
            (
                "KINETRACE_ACTIVITIES",
                "kernel,cuda_runtime,python_function",
            ),
        ])
        .unwrap();
        assert_eq!(c.output_dir, PathBuf::from("/data/traces"));
        assert!(c.gzip);
        assert!(c.activities.contains(ActivityType::Memory));
        assert!(c.activities.contains(ActivityType::Kernel));
        assert!(!c.activities.contains(ActivityType::CpuOp));
        let r = c.ranks.unwrap();
        assert!(r.contains(0) && r.contains(3) && r.contains(8) && !r.contains(4));
        assert_eq!(c.max_gpu_buffer_mb, 64);
        assert_eq!(c.log, LogTarget::File("/tmp/k.log".into()));
        assert!(!c.control);
        assert_eq!(c.control_dir, Some(PathBuf::from("/run/k")));
        assert_eq!(c.signal, Some(CaptureLength::Steps(3)));
        assert_eq!(
            env(&[("KINETRACE_SIGNAL", "on")]).unwrap().signal,
            Some(CaptureLength::Duration(Duration::from_millis(500)))
        );
    }

    /// Every key given a malformed value: one error naming the key, the value and the form.
    #[test]
    fn every_malformed_value_names_the_key_and_the_accepted_form() {
        let bad: &[(&str, &str)] = &[
            ("KINETO_CONFIG", ""),
            ("KINETRACE_OUTPUT_DIR", ""),
            ("KINETRACE_ITERATIONS", "three"),
            ("KINETRACE_ITERATIONS", "0"),
            ("KINETRACE_START_ITERATION", "-1"),
            ("KINETRACE_STEPS", "20-10"),
            ("KINETRACE_STEPS", "10"),
            ("KINETRACE_DURATION", "500"),
            ("KINETRACE_DURATION", "0s"),
            ("KINETRACE_DELAY", "soon"),
            ("KINETRACE_SCHEDULE", "wait=1,warmup=1"),
            ("KINETRACE_SCHEDULE", "wait=x,active=1"),
            ("KINETRACE_WHOLE_RUN", "yes"),
            ("KINETRACE_ACTIVITIES", "kernal"),
            ("KINETRACE_MEMORY", "on"),
            ("KINETRACE_GZIP", "2"),
            ("KINETRACE_RANKS", "0,x"),
            ("KINETRACE_MAX_GPU_BUFFER_MB", "0"),
            ("KINETRACE_LOG", ""),
            ("KINETRACE_CONTROL", "maybe"),
            ("KINETRACE_CONTROL_DIR", ""),
            ("KINETRACE_SIGNAL", "loud"),
            ("KINETRACE_CUPTI_PATH", ""),
            ("KINETRACE_OPTIMIZER_HOOK", "no"),
        ];
        let mut covered: Vec<&str> = Vec::new();
        for (k, v) in bad {
            let e = env(&[(k, v)]).expect_err(&format!("{k}={v} must be refused"));
            assert_eq!(e.key, *k);
            let key = find_env_key(k).unwrap();
            let text = e.to_string();
            assert!(text.starts_with(&format!("{k}: ")), "{text}");
            assert!(
                text.contains(key.form),
                "{text} lacks the form `{}`",
                key.form
            );
            if !v.is_empty() {
                assert!(text.contains(&format!("`{v}`")), "{text} lacks the value");
            }
            covered.push(k);
        }
        for k in KEYS.iter().filter_map(|k| k.env) {
            assert!(covered.contains(&k), "no malformed-value case for {k}");
        }
        // File-only keys.
        for (k, v) in [
            ("ACTIVITIES_DURATION_MSECS", "fast"),
            ("ACTIVITIES_DURATION_SECS", "0"),
            ("ACTIVITIES_WARMUP_PERIOD_SECS", "-5"),
            ("ACTIVITIES_LOG_FILE", ""),
            ("ACTIVITIES_ITERATIONS", "x"),
            ("ACTIVITY_TYPES", "kernels"),
        ] {
            let e = with_file(&[], &format!("# comment\n\n{k} = {v}\n")).expect_err(k);
            assert_eq!(e.key, k);
            assert_eq!(e.origin, Origin::File("/etc/kineto.conf".into(), 3));
            assert!(
                e.to_string()
                    .starts_with(&format!("/etc/kineto.conf:3: {k}: ")),
                "{e}"
            );
            assert!(
                e.to_string().contains(find_file_key(k).unwrap().form),
                "{e}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_errors_with_a_suggestion() {
        let e = env(&[("KINETRACE_ITERATONS", "3")]).unwrap_err();
        assert_eq!(e.key, "KINETRACE_ITERATONS");
        assert!(
            e.message.contains("did you mean KINETRACE_ITERATIONS?"),
            "{e}"
        );
        let e = env(&[("KINETRACE_XYZZY_PLUGH", "1")]).unwrap_err();
        assert!(!e.message.contains("did you mean"), "{e}");
        let e = with_file(&[], "ACTIVITIES_DURATON_MSECS=500\n").unwrap_err();
        assert!(
            e.message
                .contains("did you mean ACTIVITIES_DURATION_MSECS?"),
            "{e}"
        );
        let e = env(&[("KINETRACE_ACTIVITIES", "kernal")]).unwrap_err();
        assert!(e.message.contains("did you mean kernel?"), "{e}");
        // Keys of other kinetrace tools are not the profiler's business.
        assert!(env(&[("KINETRACE_PRELOAD_PATH", "/x.so"), ("KINETRACE_BIN", "x")]).is_ok());
    }

    #[test]
    fn kineto_files_are_read_and_the_environment_overrides_them() {
        let text = "\
# a Kineto config
ACTIVITIES_WARMUP_PERIOD_SECS=2
ACTIVITIES_DURATION_MSECS=750
ACTIVITY_TYPES=kernel,cuda_runtime,gpu_memcpy
ACTIVITIES_LOG_FILE=/tmp/out/job.json
ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB=32
PROFILE_PROFILE_MEMORY=true
CUPTI_PER_THREAD_BUFFER_ENABLED=true
PROFILE_WITH_STACK=true
";
        let c = with_file(&[], text).unwrap();
        assert_eq!(
            c.window,
            Window::Time {
                delay: Duration::from_secs(2),
                warmup: Duration::from_secs(2),
                duration: Duration::from_millis(750)
            }
        );
        assert_eq!(c.output_dir, PathBuf::from("/tmp/out"));
        assert_eq!(c.worker_prefix.as_deref(), Some("job"));
        assert_eq!(c.max_gpu_buffer_mb, 32);
        assert!(c.activities.contains(ActivityType::Memory));
        assert!(!c.activities.contains(ActivityType::CpuOp));
        assert_eq!(c.kineto_config, Some(PathBuf::from("/etc/kineto.conf")));
        // The environment's window replaces the file's; its other keys override one by one.
        let c = with_file(
            &[
                ("KINETRACE_ITERATIONS", "2"),
                ("KINETRACE_MAX_GPU_BUFFER_MB", "8"),
                ("KINETRACE_OUTPUT_DIR", "/x"),
            ],
            text,
        )
        .unwrap();
        assert_eq!(c.window, Window::Iterations { start: 0, count: 2 });
        assert_eq!(c.max_gpu_buffer_mb, 8);
        assert_eq!(c.output_dir, PathBuf::from("/x"));
        // Kineto's iteration keys.
        let c = with_file(&[], "PROFILE_START_ITERATION=5\nACTIVITIES_ITERATIONS=4\n").unwrap();
        assert_eq!(c.window, Window::Iterations { start: 5, count: 4 });
        // A file only choosing a duration gets Kineto's 5 s warm-up.
        let c = with_file(&[], "ACTIVITIES_DURATION_SECS=1\n").unwrap();
        assert!(matches!(c.window, Window::Time { delay, .. } if delay == Duration::from_secs(5)));
    }

    #[test]
    fn conflicts_unsupported_keys_and_bad_files_are_errors() {
        let e = env(&[("KINETRACE_ITERATIONS", "3"), ("KINETRACE_DURATION", "1s")]).unwrap_err();
        assert!(
            e.message.contains("conflicts with KINETRACE_ITERATIONS"),
            "{e}"
        );
        let e = env(&[("KINETRACE_START_ITERATION", "3")]).unwrap_err();
        assert_eq!(e.key, "KINETRACE_START_ITERATION");
        assert!(e.message.contains("without KINETRACE_ITERATIONS"), "{e}");
        let e = with_file(&[], "PROFILE_START_ITERATION=3\n").unwrap_err();
        assert!(e.message.contains("without ACTIVITIES_ITERATIONS"), "{e}");
        assert_eq!(e.origin, Origin::File("/etc/kineto.conf".into(), 1));
        let e = with_file(
            &[],
            "ACTIVITIES_ITERATIONS=3\nACTIVITIES_DURATION_MSECS=100\n",
        )
        .unwrap_err();
        assert!(e.message.contains("conflicts"), "{e}");
        let e = with_file(&[], "TEARDOWN_CUPTI=1\n").unwrap_err();
        assert!(e.message.contains("does not implement"), "{e}");
        let e = with_file(&[], "just words\n").unwrap_err();
        assert!(e.message.contains("KEY=VALUE"), "{e}");
        let e = env(&[("KINETO_CONFIG", "/nonexistent/kineto.conf")]).unwrap_err();
        assert_eq!(e.key, "KINETO_CONFIG");
        assert!(
            e.message.contains("cannot read /nonexistent/kineto.conf"),
            "{e}"
        );
    }

    #[test]
    fn ranks_come_from_rank_then_local_rank_then_zero() {
        let v = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            Config::process_rank(&v(&[("RANK", "8"), ("LOCAL_RANK", "0")])).unwrap(),
            8
        );
        assert_eq!(Config::process_rank(&v(&[("LOCAL_RANK", "3")])).unwrap(), 3);
        assert_eq!(Config::process_rank(&v(&[])).unwrap(), 0);
        let e = Config::process_rank(&v(&[("RANK", "first")])).unwrap_err();
        assert_eq!(e.key, "RANK");
    }

    #[test]
    fn window_env_keys_are_exactly_the_window_keys() {
        for k in KEYS {
            let Some(env) = k.env else { continue };
            let is_window =
                field_of(k) != "other" && !["kineto_config", "output_dir"].contains(&field_of(k));
            assert_eq!(WINDOW_ENV_KEYS.contains(&env), is_window, "{env}");
        }
    }

    #[test]
    fn docs_config_md_matches_the_key_table() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let begin = "<!-- BEGIN KEY TABLE (generated from src/config.rs: KINETRACE_BLESS=1 cargo test -p kinetrace --lib config) -->\n";
        let end = "<!-- END KEY TABLE -->";
        let table = markdown_table();
        let (Some(a), Some(b)) = (text.find(begin), text.find(end)) else {
            panic!("{} lacks the key table markers", path.display());
        };
        let current = &text[a + begin.len()..b];
        if current != table {
            if std::env::var_os("KINETRACE_BLESS").is_some() {
                let new = format!("{}{begin}{table}{}", &text[..a], &text[b..]);
                std::fs::write(&path, new).unwrap();
                return;
            }
            panic!(
                "docs/config.md is out of date with the key table; run KINETRACE_BLESS=1 cargo test -p kinetrace --lib config"
            );
        }
        for k in KEYS {
            assert!(
                current.contains(&format!("`{}`", k.name())),
                "{} undocumented",
                k.name()
            );
        }
    }
}
