//! [`Profiler`] and its builder.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kinetrace_core::activity::Activity;
use kinetrace_core::flight::{FlightConfig, FlightSpan, FlightTrigger, SlowStepRule};
use kinetrace_core::schedule::{ProfilerAction, Schedule, ScheduleError, TimeWindow};
use kinetrace_core::session::{
    CapturePlan, CaptureRefused, CaptureRequest, FlightRefused, LogFn, SessionConfig,
    SessionStatus, TraceReadyCallback, Trigger,
};
use kinetrace_core::{
    ActivitySet, ActivitySource, DistributedInfo, FrameworkOptions, Session, SessionError, Sink,
    SinkFactory, TraceMeta, TraceOutput, WindowInfo,
};
use kinetrace_export::TraceDir;

use crate::env::{Distributed, EnvError};
use crate::gpu::{self, GpuSettings};
use crate::BUILD_INFO;

/// Why a profiler could not start.
#[derive(Debug)]
pub enum Error {
    /// A builder setting is malformed.
    Config {
        /// The builder method (or schedule field).
        key: String,
        /// What was wrong and the accepted form.
        message: String,
    },
    /// A launcher variable (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`) is malformed.
    Env(EnvError),
    /// The session could not start.
    Session(SessionError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config { key, message } => write!(f, "invalid `{key}`: {message}"),
            Error::Env(e) => e.fmt(f),
            Error::Session(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config { .. } => None,
            Error::Env(e) => Some(e),
            Error::Session(e) => Some(e),
        }
    }
}

impl From<ScheduleError> for Error {
    fn from(e: ScheduleError) -> Self {
        Error::Config {
            key: e.field.to_string(),
            message: e.to_string(),
        }
    }
}

impl From<EnvError> for Error {
    fn from(e: EnvError) -> Self {
        Error::Env(e)
    }
}

/// A running profiler. Dropping it stops recording and writes any partial cycle.
pub struct Profiler {
    /// Declared before `session` so that dropping the profiler stops polling first.
    dynolog: Option<kinetrace_dynolog::Poller>,
    session: Session,
    dir: PathBuf,
    gpu: GpuSettings,
    /// The GPU backend was added (at start or by [`Profiler::add_gpu`]). Relaxed: it only keeps a
    /// second backend from being added; the session's own lock orders the additions.
    gpu_added: AtomicBool,
    log: LogFn,
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
    pub fn output_dir(&self) -> &Path {
        &self.dir
    }

    /// Traces written so far.
    pub fn outputs(&self) -> Vec<TraceOutput> {
        self.session.outputs()
    }

    /// Asks for a capture now (on-demand profiling, e.g. from a signal or an admin endpoint):
    /// refused while another is pending or in progress, while the trigger records by itself, after
    /// [`step_aside`](Self::step_aside) and while stopping. The plan says what will be recorded.
    pub fn request_capture(&self, request: CaptureRequest) -> Result<CapturePlan, CaptureRefused> {
        self.session.request_capture(request)
    }

    /// Asks the flight recorder ([`ProfilerBuilder::flight_recorder`]) for a dump of the span it
    /// keeps: the collector thread writes it (a normal trace whose head says why, the span and
    /// steps it covers); this returns at once, and recording goes on. Refused when the flight
    /// recorder is off, while stopping, and while another dump is queued (the trigger is then
    /// counted in that dump's `flight_merged_triggers`).
    pub fn flight_dump(&self, trigger: FlightTrigger) -> Result<(), FlightRefused> {
        self.session.flight_dump(trigger)
    }

    /// A handle that asks for flight dumps from another thread without keeping the profiler
    /// alive (an agent's control thread).
    pub fn flight_handle(&self) -> FlightHandle {
        FlightHandle(self.session.handle())
    }

    /// Adds an activity source to the running profiler; it is enabled at once if a capture is
    /// open.
    pub fn add_source(&self, source: impl ActivitySource + 'static) {
        self.session.add_source(Box::new(source));
    }

    /// Adds the GPU backend (set up as the builder said) unless the profiler has it already, e.g.
    /// when the GPU runtime initialised after a [`cpu_only`](ProfilerBuilder::cpu_only) start.
    /// Returns whether it was added now.
    pub fn add_gpu(&self) -> bool {
        if self.gpu_added.swap(true, Ordering::Relaxed) {
            return false;
        }
        self.session.add_source(gpu::source(&self.gpu, &self.log));
        true
    }

    /// Whether the GPU backend has been added (at the start, or by [`add_gpu`](Self::add_gpu)).
    pub fn has_gpu(&self) -> bool {
        self.gpu_added.load(Ordering::Relaxed)
    }

    /// Steps aside for another profiler (one that took over the GPU tracing library): a capture in
    /// progress ends now and is saved, nothing is recorded afterwards, and the reason shows in
    /// [`status`](Self::status).
    pub fn step_aside(&self, reason: &str) {
        self.session.step_aside(reason)
    }

    /// What the framework recorders (the shim's PyTorch hooks) should have on now: the options
    /// of the capture request in force, else the profiler's own
    /// ([`ProfilerBuilder::framework`]).
    pub fn framework_options(&self) -> FrameworkOptions {
        self.session.framework_options()
    }

    /// What the job says of its distributed setup (`torch.distributed`'s backend, rank and
    /// process groups): every trace whose window opens from now on writes it as its
    /// `distributedInfo`, in place of the configured rank and world size.
    pub fn set_distributed_info(&self, info: Option<DistributedInfo>) {
        self.session.set_distributed_info(info)
    }

    /// A snapshot: step, action, the capture pending or in progress, traces written.
    pub fn status(&self) -> SessionStatus {
        self.session.status()
    }

    /// Ends recording without waiting for the collector thread, for process exit (where joining a
    /// thread can hang): a capture in progress is saved. Returns every trace written. Dropping
    /// the profiler afterwards is still allowed.
    pub fn close(&self) -> Vec<TraceOutput> {
        if let Some(p) = &self.dynolog {
            p.stop();
        }
        self.session.close()
    }

    /// Stops recording (saving a cycle in progress) and returns every trace written.
    pub fn stop(self) -> Vec<TraceOutput> {
        let Profiler {
            dynolog, session, ..
        } = self;
        drop(dynolog);
        session.stop()
    }

    /// Whether this profiler polls a dynolog daemon for `dyno gputrace` requests (see
    /// [`ProfilerBuilder::dynolog`]).
    pub fn polls_dynolog(&self) -> bool {
        self.dynolog.is_some()
    }
}

/// Asks a profiler for flight dumps from another thread ([`Profiler::flight_handle`]).
#[derive(Clone, Debug)]
pub struct FlightHandle(kinetrace_core::session::SessionHandle);

impl FlightHandle {
    /// [`Profiler::flight_dump`]; [`FlightRefused::Stopped`] once the profiler is gone.
    pub fn flight_dump(&self, trigger: FlightTrigger) -> Result<(), FlightRefused> {
        self.0.flight_dump(trigger)
    }
}

/// Whether the GPU backend is added at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gpu {
    /// Yes, unless explicit sources were given.
    Default,
    /// Never (`cpu_only`).
    Off,
    /// Yes, even beside explicit sources (`cuda`).
    On,
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
    first_step: u64,
    framework: FrameworkOptions,
    on_trace_ready: Option<TraceReadyCallback>,
    sources: Vec<Box<dyn ActivitySource>>,
    gpu: Gpu,
    gpu_settings: GpuSettings,
    ring_capacity: Option<usize>,
    ring_memory_cap: Option<usize>,
    metadata: Vec<(String, String)>,
    log: Option<LogFn>,
    dynolog: Option<bool>,
    dynolog_interval: Option<Duration>,
    dynolog_uid: Option<Option<u32>>,
    perfetto: bool,
    flight: Option<FlightConfig>,
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
            first_step: 0,
            framework: FrameworkOptions::default(),
            on_trace_ready: None,
            sources: Vec::new(),
            gpu: Gpu::Default,
            gpu_settings: GpuSettings::default(),
            ring_capacity: None,
            ring_memory_cap: None,
            metadata: Vec::new(),
            log: None,
            dynolog: None,
            dynolog_interval: None,
            dynolog_uid: None,
            perfetto: false,
            flight: None,
            errors: Vec::new(),
        }
    }
}

impl ProfilerBuilder {
    /// What a framework's recorder turns on in every window (`record_shapes`, `with_stack`,
    /// `profile_memory`, as torch.profiler names them): the trace head says so, and the shim's
    /// PyTorch hooks read it ([`Profiler::framework_options`]). Default: all off.
    pub fn framework(mut self, options: FrameworkOptions) -> Self {
        self.framework = options;
        self
    }

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
    pub fn time_window(self, delay: Duration, duration: Duration) -> Self {
        self.time_window_with_warmup(delay, Duration::ZERO, duration)
    }

    /// Like [`time_window`](Self::time_window), with the GPU backend already on (its events
    /// discarded) for `warmup` before recording starts (Kineto's warm-up period; at most `delay`).
    pub fn time_window_with_warmup(
        mut self,
        delay: Duration,
        warmup: Duration,
        duration: Duration,
    ) -> Self {
        match TimeWindow::new(delay, duration) {
            Ok(w) => self.trigger = Trigger::TimeWindow(w.with_warmup(warmup)),
            Err(e) => self.errors.push(e.into()),
        }
        self
    }

    /// Records nothing by itself: only the captures [`Profiler::request_capture`] asks for.
    pub fn on_demand(mut self) -> Self {
        self.trigger = Trigger::OnDemand;
        self
    }

    /// The step number the profiler starts at (steps the program took before profiling began), so
    /// `ProfilerStep#N` and step ranges count from the program's own first step.
    pub fn first_step(mut self, step: u64) -> Self {
        self.first_step = step;
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

    /// Adds an activity source (a GPU backend of your own, a simulated device). Given one, the
    /// profiler does not add its default GPU backend.
    pub fn source(mut self, source: impl ActivitySource + 'static) -> Self {
        self.sources.push(Box::new(source));
        self
    }

    /// Records CPU activity only: no GPU backend is loaded. Without it (and without
    /// [`source`](Self::source)), the profiler records the GPU when a supported runtime is present
    /// (CUDA, through CUPTI), and CPU activity only otherwise, saying why in one line.
    pub fn cpu_only(mut self) -> Self {
        self.gpu = Gpu::Off;
        self
    }

    /// The GPU backend is now added by default; this also adds it beside explicit
    /// [`source`](Self::source)s.
    #[deprecated(
        since = "0.1.0",
        note = "the GPU is recorded by default; remove `.cuda()` (use `.cpu_only()` to opt out)"
    )]
    pub fn cuda(mut self) -> Self {
        self.gpu = Gpu::On;
        self
    }

    /// Load this GPU tracing library (libcupti) instead of searching for it (the search: the one
    /// already loaded, `$KINETRACE_CUPTI_PATH`, `CUDA_HOME`, pip wheels, the loader path).
    pub fn gpu_library(mut self, path: impl Into<PathBuf>) -> Self {
        self.gpu_settings.library = Some(path.into());
        self
    }

    /// Bound on the GPU backend's activity buffers, in MiB (default 128); records beyond it are
    /// dropped and counted in the trace.
    pub fn max_gpu_buffer_mb(mut self, mib: u32) -> Self {
        self.gpu_settings.max_buffer_bytes = Some((mib as usize) << 20);
        self
    }

    /// Bound on the ROCm backend's queue of records between its callbacks and the collector
    /// (default 65536, Kineto's `ROCTRACER_MAX_EVENTS`); records beyond it are dropped and
    /// counted in the trace.
    pub fn rocm_max_events(mut self, records: u32) -> Self {
        self.gpu_settings.rocm_max_events = Some(records as usize);
        self
    }

    /// Slots in each thread's ring (default 16384). A thread that fills its ring between drains
    /// goes on in a spare one (see [`ring_memory_cap`](Self::ring_memory_cap)).
    pub fn ring_capacity(mut self, slots: usize) -> Self {
        self.ring_capacity = Some(slots);
        self
    }

    /// Bound on the memory of all threads' rings together (default 256 MiB, about 6.7 M buffered
    /// spans). Bursts grow a thread's buffer in spare rings up to it; past it, events are dropped
    /// and counted in the trace.
    pub fn ring_memory_cap(mut self, bytes: usize) -> Self {
        self.ring_memory_cap = Some(bytes);
        self
    }

    /// Adds a top-level string metadata key to every trace.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Where kinetrace's one-line messages go, the GPU backend's included (default: stderr,
    /// prefixed `kinetrace: `).
    pub fn log(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.log = Some(Arc::new(f));
        self
    }

    /// Answer dynolog's `dyno gputrace` (default: `$KINETRACE_DYNOLOG`, else off): a thread polls
    /// the node's dynolog daemon at start and then every [`dynolog_interval`](Self::dynolog_interval)
    /// and turns each request into a capture, as [`Profiler::request_capture`] would, written to the
    /// requested file (docs/record.md, "Fleet: dynolog"). In a process without libkineto,
    /// `KINETO_USE_DAEMON` must be set too; where libkineto is loaded and `KINETO_USE_DAEMON` is set,
    /// libkineto polls and kinetrace does not. Each case that leaves it off says so in one line.
    /// Requests are refused while the profiler records by itself, so pair it with
    /// [`on_demand`](Self::on_demand).
    pub fn dynolog(mut self, on: bool) -> Self {
        self.dynolog = Some(on);
        self
    }

    /// Also accept dynolog replies from this uid (a daemon run as a service user; default:
    /// `$KINETRACE_DYNOLOG_UID`, else none). Replies count only from senders whose credentials the
    /// kernel vouches for: root, this process's uid, or this one; any other user who binds the
    /// daemon's name while the daemon is down is dropped with one log line.
    pub fn dynolog_uid(mut self, uid: Option<u32>) -> Self {
        self.dynolog_uid = Some(uid);
        self
    }

    /// Time between dynolog polls (default 5 s, Kineto's `ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS`;
    /// the daemon forgets a process silent for over 60 s).
    pub fn dynolog_interval(mut self, interval: Duration) -> Self {
        if interval.is_zero() || interval > Duration::from_secs(60) {
            self.errors.push(Error::Config {
                key: "dynolog_interval".into(),
                message: format!(
                    "{interval:?} is not a poll interval; expected more than 0 and at most 60 s                      (the daemon forgets a process silent for longer)"
                ),
            });
        }
        self.dynolog_interval = Some(interval);
        self
    }

    /// Runs as a flight recorder: records all the time, keeps the last `span` (`FlightSpan::Time`
    /// or `FlightSpan::Steps`; [`FlightSpan::parse`] reads `60s` or `20steps`) in memory bounded by
    /// [`flight_memory`](Self::flight_memory), and writes a trace of it only when a trigger fires:
    /// [`Profiler::flight_dump`], or a slow step ([`flight_slow_step`](Self::flight_slow_step), on
    /// by default: 3x the median of the last 20 steps, at most once a minute), or a hang
    /// ([`flight_hang_after`](Self::flight_hang_after), off by default). The window settings
    /// (schedule, time window, on demand) do not apply then.
    pub fn flight_recorder(mut self, span: FlightSpan) -> Self {
        let keep = self.flight;
        let mut config = FlightConfig::new(span);
        if let Some(k) = keep {
            config.memory_cap = k.memory_cap;
            config.slow_step = k.slow_step;
            config.hang_after = k.hang_after;
            config.after = k.after;
        }
        self.flight = Some(config);
        self
    }

    /// Bound on the memory of the records the flight recorder keeps (default 256 MiB). When it
    /// binds, the oldest records go first and each dump says from when on it is complete. Turns
    /// the flight recorder on (a 60 s span unless [`flight_recorder`](Self::flight_recorder) says).
    pub fn flight_memory(mut self, bytes: usize) -> Self {
        if bytes == 0 {
            self.errors.push(Error::Config {
                key: "flight_memory".into(),
                message: "0 bytes; expected a size > 0, such as 256 << 20".into(),
            });
        }
        self.flight_settings().memory_cap = bytes;
        self
    }

    /// The flight recorder's slow-step trigger (`None`: off).
    pub fn flight_slow_step(mut self, rule: Option<SlowStepRule>) -> Self {
        if let Some(r) = rule {
            if r.factor.is_nan() || r.factor <= 1.0 || !(2..=1024).contains(&r.window) {
                self.errors.push(Error::Config {
                    key: "flight_slow_step".into(),
                    message: format!(
                        "factor {} over {} steps; expected a factor > 1 and 2 to 1024 steps",
                        r.factor, r.window
                    ),
                });
            }
        }
        self.flight_settings().slow_step = rule;
        self
    }

    /// The flight recorder's hang trigger: no step for `after` while a collective or a sync has
    /// been open that long (`None`: off).
    pub fn flight_hang_after(mut self, after: Option<Duration>) -> Self {
        self.flight_settings().hang_after = after;
        self
    }

    /// How long a flight dump goes on recording after its trigger before the collector writes
    /// it (default [`DEFAULT_FLIGHT_AFTER`](crate::DEFAULT_FLIGHT_AFTER), 2 s; zero: at once): the
    /// steps after a slow step, whether a hang resolves. The training thread never waits for it.
    /// The process ending (an exit signal, an exception) writes at once, and a dump still waiting
    /// then is written first. Turns the flight recorder on (a 60 s span unless
    /// [`flight_recorder`](Self::flight_recorder) says).
    pub fn flight_after(mut self, after: Duration) -> Self {
        self.flight_settings().after = after;
        self
    }

    fn flight_settings(&mut self) -> &mut FlightConfig {
        self.flight
            .get_or_insert_with(|| FlightConfig::new(FlightSpan::Time(Duration::from_secs(60))))
    }

    /// Also write each trace in Perfetto's native format, `x.pt.trace.pftrace` beside
    /// `x.pt.trace.json[.gz]` (converted from the JSON once it is written, on the collector thread;
    /// captures asked for with their own sinks get no twin). A conversion that fails is one log line.
    pub fn perfetto(mut self, yes: bool) -> Self {
        self.perfetto = yes;
        self
    }

    /// Starts the profiler. Fails on a malformed setting (naming it), a malformed `RANK`,
    /// `LOCAL_RANK` or `WORLD_SIZE` that was not given explicitly, or another profiler running in
    /// this process.
    pub fn start(mut self) -> Result<Profiler, Error> {
        if let Some(e) = self.errors.drain(..).next() {
            return Err(e);
        }
        let dynolog = match self.dynolog {
            Some(on) => on,
            None => env_flag("KINETRACE_DYNOLOG")?,
        };
        let dynolog_uid = match self.dynolog_uid {
            Some(u) => u,
            None => env_uid("KINETRACE_DYNOLOG_UID")?,
        };
        let (rank, world_size) = match (self.rank, self.world_size) {
            (Some(r), Some(w)) => (Some(r), Some(w)),
            (r, w) => {
                let env = Distributed::from_env()?;
                (r.or(env.rank), w.or(env.world_size))
            }
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
            first_step: self.first_step,
            framework: self.framework,
            flight: self.flight,
            ..SessionConfig::default()
        };
        config
            .metadata
            .push(("kinetrace_build".into(), BUILD_INFO.into()));
        if let Some(n) = self.ring_capacity {
            config.ring_capacity = n;
        }
        if let Some(n) = self.ring_memory_cap {
            config.ring_memory_cap = n;
        }
        if let Some(log) = self.log {
            config.log = log;
        }
        let log = config.log.clone();
        let add_gpu = match self.gpu {
            Gpu::Off => false,
            Gpu::On => true,
            Gpu::Default => self.sources.is_empty() && gpu::BUILT_IN,
        };
        let mut sources = self.sources;
        if add_gpu {
            sources.push(gpu::source(&self.gpu_settings, &log));
        }
        let sinks: Box<dyn SinkFactory> = if self.perfetto {
            Box::new(PerfettoTwin {
                inner: target,
                log: log.clone(),
            })
        } else {
            Box::new(target)
        };
        let session =
            Session::start(config, sources, sinks, self.on_trace_ready).map_err(Error::Session)?;
        let dynolog = dynolog
            .then(|| {
                let mut settings = kinetrace_dynolog::Settings::from_env();
                if let Some(i) = self.dynolog_interval {
                    settings.interval = i;
                }
                settings.allowed_uid = dynolog_uid;
                kinetrace_dynolog::start(session.handle(), settings, log.clone())
            })
            .flatten();
        Ok(Profiler {
            dynolog,
            session,
            dir,
            gpu: self.gpu_settings,
            gpu_added: AtomicBool::new(add_gpu),
            log,
        })
    }
}

/// A `1`/`0`/`true`/`false` environment variable (unset or empty: off), as the agent's key table
/// reads its booleans.
fn env_flag(key: &str) -> Result<bool, Error> {
    match std::env::var(key).as_deref().map(str::trim) {
        Err(_) | Ok("") => Ok(false),
        Ok("1") | Ok("true") => Ok(true),
        Ok("0") | Ok("false") => Ok(false),
        Ok(other) => Err(Error::Config {
            key: key.to_string(),
            message: format!("`{other}` is not a switch; expected 1, 0, true or false"),
        }),
    }
}

/// A uid from an environment variable (unset or empty: none), as the agent's key table reads it.
fn env_uid(key: &str) -> Result<Option<u32>, Error> {
    match std::env::var(key).as_deref().map(str::trim) {
        Err(_) | Ok("") => Ok(None),
        Ok(v) => match v.parse::<u32>() {
            Ok(n) if n != u32::MAX => Ok(Some(n)),
            _ => Err(Error::Config {
                key: key.to_string(),
                message: format!("`{v}` is not a uid; expected an integer >= 0 such as 998"),
            }),
        },
    }
}

/// The session's trace directory, with a `.pftrace` twin written after each JSON trace.
struct PerfettoTwin {
    inner: TraceDir,
    log: LogFn,
}

impl SinkFactory for PerfettoTwin {
    fn open(&mut self, window: &WindowInfo) -> std::io::Result<Box<dyn Sink>> {
        Ok(Box::new(TwinSink {
            inner: self.inner.open(window)?,
            log: self.log.clone(),
        }))
    }
}

struct TwinSink {
    inner: Box<dyn Sink>,
    log: LogFn,
}

impl Sink for TwinSink {
    fn record(&mut self, activity: &Activity) -> std::io::Result<()> {
        self.inner.record(activity)
    }

    fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
        let out = self.inner.finish(meta)?;
        if let Some(json) = &out.path {
            let name = json
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stem = name
                .strip_suffix(".json.gz")
                .or_else(|| name.strip_suffix(".json"))
                .unwrap_or(&name);
            let twin = json.with_file_name(format!("{stem}.pftrace"));
            if let Err(e) = kinetrace_perfetto::convert_file(json, &twin) {
                (self.log)(&format!("no .pftrace twin: {e}"));
            }
        }
        Ok(out)
    }

    fn discard(self: Box<Self>) {
        self.inner.discard()
    }
}
