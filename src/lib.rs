/*!
kinetrace: an in-process GPU profiler runtime that writes traces in the Kineto JSON format PyTorch's
profiler writes, so Perfetto, TensorBoard's profiler plugin and HolisticTraceAnalysis open them
unchanged.

```no_run
use kinetrace::{Profiler, Schedule};

let profiler = Profiler::builder()
    .schedule(Schedule::new(1, 1, 2).unwrap().with_repeat(1))
    .output_dir("traces")
    .start()
    .expect("profiler starts");
for _ in 0..6 {
    let _step = kinetrace::record_function("forward");
    // ... train ...
    profiler.step();
}
let written = profiler.stop();
println!("{written:?}");
```

This crate is a facade: the record model, rings and session live in `kinetrace-core`, the format in
`kinetrace-export`; backends implement [`ActivitySource`].
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use kinetrace_core::activity::{self, ActivitySet, ActivityType};
pub use kinetrace_core::intern::{intern, NameId};
pub use kinetrace_core::recorder::{Callsite, SpanGuard};
pub use kinetrace_core::schedule::{ProfilerAction, Schedule, ScheduleError, TimeWindow};
pub use kinetrace_core::simulated::SimulatedGpu;
pub use kinetrace_core::{
    ActivitySource, Session, SessionError, Sink, SinkFactory, SourceError, TraceMeta, TraceOutput,
    UnixNanos, WindowInfo,
};
pub use kinetrace_export as export;

#[cfg(feature = "cupti")]
pub use kinetrace_cupti::{CuptiConfig, CuptiSource};
pub mod config;
pub mod control;
pub mod inject;
#[cfg(feature = "tracing")]
pub mod layer;
#[cfg(feature = "tracing")]
pub use layer::KinetraceLayer;

use kinetrace_core::session::{SessionConfig, Trigger};
use kinetrace_export::TraceDir;

/// Version and git facts stamped by `build.rs`, written into trace metadata.
pub const BUILD_INFO: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("KINETRACE_GIT_HASH"),
    ")"
);

/// Why a profiler could not start.
#[derive(Debug)]
pub enum Error {
    /// A configuration value is malformed.
    Config {
        /// The key (builder method or environment variable).
        key: String,
        /// What was wrong and the accepted form.
        message: String,
    },
    /// The session could not start.
    Session(SessionError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config { key, message } => write!(f, "invalid `{key}`: {message}"),
            Error::Session(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

impl From<ScheduleError> for Error {
    fn from(e: ScheduleError) -> Self {
        Error::Config {
            key: e.field.to_string(),
            message: e.to_string(),
        }
    }
}

/// A running profiler. Dropping it stops recording and writes any partial cycle.
pub struct Profiler {
    session: Session,
    dir: PathBuf,
}

impl Profiler {
    /// Starts configuring a profiler.
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }

    /// Marks a training step boundary (like `torch.profiler.profile.step()`).
    pub fn step(&self) {
        self.session.step()
    }

    /// The current step number.
    pub fn step_num(&self) -> u64 {
        self.session.step_num()
    }

    /// The schedule's current action.
    pub fn action(&self) -> ProfilerAction {
        self.session.action()
    }

    /// The run directory traces are written to.
    pub fn output_dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Traces written so far.
    pub fn outputs(&self) -> Vec<TraceOutput> {
        self.session.outputs()
    }

    /// Stops recording (saving a cycle in progress) and returns every trace written.
    pub fn stop(self) -> Vec<TraceOutput> {
        self.session.stop()
    }
}

/// Configures a [`Profiler`].
pub struct ProfilerBuilder {
    activities: ActivitySet,
    trigger: Trigger,
    dir: Option<PathBuf>,
    worker: Option<String>,
    gzip: bool,
    rank: Option<u32>,
    world_size: Option<u32>,
    on_trace_ready: Option<kinetrace_core::session::TraceReadyCallback>,
    sources: Vec<Box<dyn ActivitySource>>,
    ring_capacity: Option<usize>,
    metadata: Vec<(String, String)>,
    log: Option<kinetrace_core::session::LogFn>,
    errors: Vec<Error>,
}

impl Default for ProfilerBuilder {
    fn default() -> Self {
        ProfilerBuilder {
            activities: ActivitySet::default_set(),
            trigger: Trigger::Always,
            dir: None,
            worker: None,
            gzip: false,
            rank: None,
            world_size: None,
            on_trace_ready: None,
            sources: Vec::new(),
            ring_capacity: None,
            metadata: Vec::new(),
            log: None,
            errors: Vec::new(),
        }
    }
}

impl ProfilerBuilder {
    /// Which records to keep (default: Kineto's default set).
    pub fn activities(mut self, activities: ActivitySet) -> Self {
        self.activities = activities;
        self
    }

    /// Records the steps `schedule` selects, one trace per cycle.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        if let Err(e) = schedule.validate() {
            self.errors.push(e.into());
        }
        self.trigger = Trigger::Schedule(schedule);
        self
    }

    /// Records steps `start..=end` as one trace.
    pub fn step_range(mut self, start: u64, end: u64) -> Self {
        match Schedule::step_range(start, end) {
            Ok(s) => self.trigger = Trigger::Schedule(s),
            Err(e) => self.errors.push(e.into()),
        }
        self
    }

    /// Records `duration` of wall time starting `delay` after start.
    pub fn time_window(mut self, delay: Duration, duration: Duration) -> Self {
        match TimeWindow::new(delay, duration) {
            Ok(w) => self.trigger = Trigger::TimeWindow(w),
            Err(e) => self.errors.push(e.into()),
        }
        self
    }

    /// The run directory (default: `$KINETRACE_OUTPUT_DIR`, else `./kinetrace-traces`).
    pub fn output_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The worker name in file names (default `{hostname}_{pid}`).
    pub fn worker_name(mut self, name: impl Into<String>) -> Self {
        self.worker = Some(name.into());
        self
    }

    /// Gzip the traces.
    pub fn gzip(mut self, yes: bool) -> Self {
        self.gzip = yes;
        self
    }

    /// The distributed rank (default: `$RANK`, else `$LOCAL_RANK`).
    pub fn rank(mut self, rank: u32) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The world size (default: `$WORLD_SIZE`).
    pub fn world_size(mut self, n: u32) -> Self {
        self.world_size = Some(n);
        self
    }

    /// Called with each trace once written (on the thread that ended the cycle).
    pub fn on_trace_ready(mut self, f: impl FnMut(&TraceOutput) + Send + 'static) -> Self {
        self.on_trace_ready = Some(Box::new(f));
        self
    }

    /// Adds an activity source (a GPU backend).
    pub fn source(mut self, source: impl ActivitySource + 'static) -> Self {
        self.sources.push(Box::new(source));
        self
    }

    /// Adds the NVIDIA backend (CUPTI) with default settings. On a machine without a CUDA driver or
    /// libcupti it logs one line and the profiler records CPU events only.
    #[cfg(feature = "cupti")]
    pub fn cuda(self) -> Self {
        self.source(CuptiSource::new(CuptiConfig::default()))
    }

    /// Slots in each thread's ring (default 16384). Events beyond it between drains are dropped and
    /// counted.
    pub fn ring_capacity(mut self, slots: usize) -> Self {
        self.ring_capacity = Some(slots);
        self
    }

    /// Adds a top-level string metadata key to every trace.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Where kinetrace's one-line messages go (default: stderr, prefixed `kinetrace: `).
    pub fn log(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.log = Some(Arc::new(f));
        self
    }

    /// Starts the profiler.
    pub fn start(mut self) -> Result<Profiler, Error> {
        if let Some(e) = self.errors.drain(..).next() {
            return Err(e);
        }
        let rank = match self.rank {
            Some(r) => Some(r),
            None => env_u32("RANK")?.or(env_u32("LOCAL_RANK")?),
        };
        let world_size = match self.world_size {
            Some(w) => Some(w),
            None => env_u32("WORLD_SIZE")?,
        };
        let dir = self.dir.unwrap_or_else(|| {
            std::env::var_os("KINETRACE_OUTPUT_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("kinetrace-traces"))
        });
        let mut target = TraceDir::new(&dir);
        if let Some(w) = self.worker {
            target.worker = w;
        }
        target.gzip = self.gzip;
        let mut config = SessionConfig {
            activities: self.activities,
            trigger: self.trigger,
            rank,
            world_size,
            metadata: self.metadata,
            ..SessionConfig::default()
        };
        config
            .metadata
            .push(("kinetrace_build".into(), BUILD_INFO.into()));
        if let Some(n) = self.ring_capacity {
            config.ring_capacity = n;
        }
        if let Some(log) = self.log {
            config.log = log;
        }
        let session = Session::start(config, self.sources, Box::new(target), self.on_trace_ready)
            .map_err(Error::Session)?;
        Ok(Profiler { session, dir })
    }
}

fn env_u32(key: &str) -> Result<Option<u32>, Error> {
    match std::env::var(key) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v.trim().parse().map(Some).map_err(|_| Error::Config {
            key: key.into(),
            message: format!("`{v}` is not a rank; expected a non-negative integer such as 0"),
        }),
        Err(_) => Ok(None),
    }
}

/// Opens a named range (a `user_annotation`, like `torch.profiler.record_function`) that ends when
/// the guard drops. Costs one relaxed load when no profiler is recording. The name is interned the
/// first time a thread uses it and then found by its address, so a string literal costs no hashing;
/// for names built at run time use [`record_function_dyn`].
#[inline(always)]
pub fn record_function(name: &'static str) -> SpanGuard {
    SpanGuard::enter_static(name, true)
}

/// Like [`record_function`] for a name that is not `'static` (built at run time): the name is
/// hashed and looked up on every call while recording.
#[inline]
pub fn record_function_dyn(name: &str) -> SpanGuard {
    if !kinetrace_core::recorder::is_active() {
        return SpanGuard::inactive();
    }
    SpanGuard::enter(intern(name), true)
}

/// Whether spans are timed with the CPU's time-stamp counter in this process (an invariant counter
/// the kernel trusts), rather than `CLOCK_MONOTONIC`.
pub fn clock_is_tsc() -> bool {
    kinetrace_core::clock::ticks_are_tsc()
}

/// Opens a `user_annotation` range whose name is interned once per call site (the cheapest form for
/// hot code): `let _g = kinetrace::span!("forward");`. The name must be a `'static` string.
#[macro_export]
macro_rules! span {
    ($name:expr) => {{
        static CALLSITE: $crate::Callsite = $crate::Callsite::new($name);
        $crate::record_function_id(CALLSITE.name_id())
    }};
}

/// Like [`record_function`] with a name interned ahead of time (the cheapest form, for hot loops).
#[inline(always)]
pub fn record_function_id(name: NameId) -> SpanGuard {
    SpanGuard::enter(name, true)
}

/// Opens a `cpu_op` range (an operator, as opposed to a user annotation).
#[inline]
pub fn record_op(name: NameId) -> SpanGuard {
    SpanGuard::enter(name, false)
}
