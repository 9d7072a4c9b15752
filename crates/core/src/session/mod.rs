//! The session: wires sources, the thread rings and a sink together, driven by a trigger.
//!
//! It holds no policy of its own: the [`crate::schedule`] state machine decides what happens on each
//! step (or tick of a time window) and the session carries out the [`SessionCommand`]s:
//!
//! - `Prepare`: turn recording on and enable sources; events are collected but discarded (warm-up).
//! - `Start`: open a sink; from now on events are kept.
//! - `Stop`: drain rings, flush sources, turn recording off.
//! - `TraceReady`: finish the sink (write the file) and fire `on_trace_ready`.
//!
//! A collector thread drains the rings and polls sources every `collect_interval` so memory stays
//! bounded; steps and the end of a window drain synchronously.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::activity::ActivitySet;
use crate::clock::UnixNanos;
use crate::recorder::{self, CpuRecord};
use crate::schedule::{commands_on_exit, ProfilerAction, Schedule, TimeWindow};
use crate::source::{ActivitySource, Sink, SinkFactory, TraceOutput};

mod capture;
mod window;

use capture::describe_plan;
pub use capture::{
    CaptureDone, CaptureLength, CapturePlan, CaptureRefused, CaptureRequest, CaptureStart,
    SessionStatus,
};

/// Only one session may record at a time: the rings and the on/off word are process-wide.
static SESSION_LIVE: AtomicBool = AtomicBool::new(false);

/// What decides when to record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Record from start to stop, as one trace.
    Always,
    /// Record the steps a [`Schedule`] selects (also used for explicit step ranges).
    Schedule(Schedule),
    /// Record a span of wall time.
    TimeWindow(TimeWindow),
    /// Record nothing by itself: only the captures [`Session::request_capture`] asks for.
    OnDemand,
}

/// Called with each finished trace.
pub type TraceReadyCallback = Box<dyn FnMut(&TraceOutput) + Send>;

/// Where the session's one-line messages go.
pub type LogFn = Arc<dyn Fn(&str) + Send + Sync>;

/// Settings for a session.
pub struct SessionConfig {
    /// Which records to keep.
    pub activities: ActivitySet,
    /// When to record.
    pub trigger: Trigger,
    /// Slots per thread ring.
    pub ring_capacity: usize,
    /// How often the collector drains rings and polls sources.
    pub collect_interval: Duration,
    /// Distributed rank.
    pub rank: Option<u32>,
    /// World size.
    pub world_size: Option<u32>,
    /// Extra metadata for every trace.
    pub metadata: Vec<(String, String)>,
    /// Message sink (default: one line on stderr prefixed `kinetrace: `).
    pub log: LogFn,
    /// The step number the session starts at (steps the process took before profiling began).
    pub first_step: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            activities: ActivitySet::default_set(),
            trigger: Trigger::Always,
            ring_capacity: recorder::DEFAULT_RING_CAPACITY,
            collect_interval: Duration::from_millis(20),
            rank: None,
            world_size: None,
            metadata: Vec::new(),
            // Not `eprintln!`: it panics when stderr is a full disk or a closed pipe, and a log
            // line must never take the program down.
            log: Arc::new(|m| {
                use std::io::Write;
                let _ = std::io::stderr().write_all(format!("kinetrace: {m}\n").as_bytes());
            }),
            first_step: 0,
        }
    }
}

/// Why a session could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionError {
    /// Another session is recording in this process.
    AlreadyRunning,
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::AlreadyRunning => write!(
                f,
                "another kinetrace profiler is already running in this process; stop it first"
            ),
        }
    }
}

impl std::error::Error for SessionError {}

/// A running session. Dropping it stops recording and writes any partial cycle.
pub struct Session {
    shared: Arc<Shared>,
    collector: Option<JoinHandle<()>>,
    /// Set once `SESSION_LIVE` is given back.
    released: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

struct Window {
    /// The sink, open once recording started.
    sink: Option<Box<dyn Sink>>,
    start: UnixNanos,
    end: UnixNanos,
    recording: bool,
    events: u64,
    write_error: Option<String>,
    ring_drops_at_start: u64,
    source_drops_at_start: Vec<u64>,
    threads: HashMap<u32, Option<String>>,
}

struct StepSpan {
    id: u64,
    previous_external_id: u64,
    start: crate::clock::Ticks,
    step: u64,
}

struct State {
    config: SessionConfig,
    sources: Vec<Box<dyn ActivitySource>>,
    /// Sources that failed to enable; skipped until the next Prepare.
    source_failed: Vec<bool>,
    sinks: Box<dyn SinkFactory>,
    on_trace_ready: Option<TraceReadyCallback>,
    action: ProfilerAction,
    step_num: u64,
    cycle: u32,
    window: Option<Window>,
    stopped: Option<Window>,
    open_begins: HashMap<(u32, u64), (u32, CpuRecord)>,
    retired_ring_drops: u64,
    step_span: Option<StepSpan>,
    /// Whether steps get `ProfilerStep#N` annotations: from the start with a schedule (as torch does
    /// when given one), otherwise from the first `step()` call on.
    record_steps: bool,
    started: Instant,
    outputs: Vec<TraceOutput>,
    shutdown: bool,
    /// The on-demand capture pending or in progress.
    request: Option<ActiveRequest>,
    /// The outcome of the last `TraceReady` (or of a sink that could not open).
    last_result: Option<Result<TraceOutput, String>>,
    /// Set by [`Session::step_aside`]: nothing is recorded any more.
    stepped_aside: Option<String>,
    /// Reused buffer for records drained from the rings.
    drained: Vec<(u32, CpuRecord)>,
    /// Reused buffer for records polled from sources.
    polled: Vec<crate::activity::Activity>,
    /// Converts the recording clock of drained records to Unix time.
    clock: crate::clock::TickConverter,
}

enum RequestKind {
    Steps(Schedule),
    Time(TimeWindow, Instant),
}

struct ActiveRequest {
    kind: RequestKind,
    plan: CapturePlan,
    sinks: Option<Box<dyn SinkFactory>>,
    on_done: Option<CaptureDone>,
}

impl Session {
    /// Starts a session. Recording begins at once for [`Trigger::Always`], at the first selected step
    /// for schedules, and after the delay for time windows.
    pub fn start(
        config: SessionConfig,
        sources: Vec<Box<dyn ActivitySource>>,
        sinks: Box<dyn SinkFactory>,
        on_trace_ready: Option<TraceReadyCallback>,
    ) -> Result<Session, SessionError> {
        if SESSION_LIVE
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(SessionError::AlreadyRunning);
        }
        crate::clock::init();
        recorder::set_ring_capacity(config.ring_capacity);
        let interval = config.collect_interval;
        let n_sources = sources.len();
        let record_steps = matches!(config.trigger, Trigger::Schedule(_));
        let step_num = config.first_step;
        let mut state = State {
            config,
            sources,
            source_failed: vec![false; n_sources],
            sinks,
            on_trace_ready,
            action: ProfilerAction::None,
            step_num,
            cycle: 0,
            window: None,
            stopped: None,
            open_begins: HashMap::new(),
            retired_ring_drops: 0,
            step_span: None,
            record_steps,
            started: Instant::now(),
            outputs: Vec::new(),
            shutdown: false,
            request: None,
            last_result: None,
            stepped_aside: None,
            drained: Vec::new(),
            polled: Vec::new(),
            clock: crate::clock::TickConverter::new(),
        };
        let first = state.target_action(Duration::ZERO);
        state.transition(first);
        state.open_step_span();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Condvar::new(),
        });
        let bg = shared.clone();
        let collector = std::thread::Builder::new()
            .name("kinetrace-collector".into())
            .spawn(move || collector_loop(&bg, interval))
            .ok();
        if collector.is_none() {
            (lock(&shared).config.log)(
                "could not start the collector thread; events are collected at each step only",
            );
        }
        Ok(Session {
            shared,
            collector,
            released: false,
        })
    }

    /// Marks a step boundary (a training iteration): closes `ProfilerStep#N`, advances the schedule and
    /// opens `ProfilerStep#N+1`. Exports and fires `on_trace_ready` when a cycle ends here.
    pub fn step(&self) {
        let mut s = lock(&self.shared);
        s.close_step_span();
        s.step_num += 1;
        s.record_steps = true;
        if s.step_driven() {
            let next = s.target_action(Duration::ZERO);
            s.transition(next);
        }
        s.settle_request();
        s.open_step_span();
    }

    /// Asks a live session for a capture now (on-demand profiling). Refused while another capture
    /// is pending or in progress, in [`Trigger::Always`] sessions (always recording), after
    /// [`step_aside`](Self::step_aside) and while stopping. A step capture records whole steps, each
    /// a `ProfilerStep#N` annotation; the trace goes to the request's sinks if it has some.
    pub fn request_capture(&self, request: CaptureRequest) -> Result<CapturePlan, CaptureRefused> {
        let mut s = lock(&self.shared);
        if s.shutdown {
            return Err(CaptureRefused::Stopped);
        }
        if let Some(why) = &s.stepped_aside {
            return Err(CaptureRefused::SteppedAside(why.clone()));
        }
        if let Some(r) = &s.request {
            return Err(CaptureRefused::Busy(format!(
                "a capture is already pending or in progress ({})",
                describe_plan(&r.plan)
            )));
        }
        if s.action != ProfilerAction::None || s.window.is_some() {
            let what = match s.config.trigger {
                Trigger::Always => "this session records the whole run".to_string(),
                _ => format!("recording (step {}, {})", s.step_num, s.action.as_str()),
            };
            return Err(CaptureRefused::Busy(what));
        }
        let step = s.step_num;
        let (kind, plan) = match request.length {
            CaptureLength::Steps(0) => return Err(CaptureRefused::Invalid("0 steps".into())),
            CaptureLength::Duration(d) if d.is_zero() => {
                return Err(CaptureRefused::Invalid("a zero duration".into()))
            }
            CaptureLength::Steps(n) => {
                let first = match request.start {
                    CaptureStart::Now => step,
                    CaptureStart::NextStep | CaptureStart::After(_) => step + 1,
                    CaptureStart::AtStep(at) => at.max(step + 1),
                };
                let last = first.saturating_add(u64::from(n) - 1);
                let schedule = Schedule::step_range(first, last)
                    .map_err(|e| CaptureRefused::Invalid(e.to_string()))?;
                (
                    RequestKind::Steps(schedule),
                    CapturePlan::Steps { first, last },
                )
            }
            CaptureLength::Duration(duration) => {
                let delay = match request.start {
                    CaptureStart::After(d) => d,
                    _ => Duration::ZERO,
                };
                let window = TimeWindow::new(delay, duration)
                    .map_err(|e| CaptureRefused::Invalid(e.to_string()))?;
                (
                    RequestKind::Time(window, Instant::now()),
                    CapturePlan::Time { delay, duration },
                )
            }
        };
        if matches!(kind, RequestKind::Steps(_)) {
            s.record_steps = true;
        }
        s.request = Some(ActiveRequest {
            kind,
            plan,
            sinks: request.sinks,
            on_done: request.on_done,
        });
        s.last_result = None;
        let next = s.target_action(s.started.elapsed());
        if next != s.action {
            s.close_step_span();
            s.transition(next);
            s.open_step_span();
        }
        drop(s);
        self.shared.wake.notify_all();
        Ok(plan)
    }

    /// Adds a source to the live session (a GPU backend that became available after the session
    /// started, e.g. when CUDA initialises). It is enabled at once if a capture is open.
    pub fn add_source(&self, mut source: Box<dyn ActivitySource>) {
        let mut s = lock(&self.shared);
        let mut failed = false;
        if s.window.is_some() && s.stepped_aside.is_none() {
            if let Err(e) = source.enable(s.config.activities) {
                failed = true;
                s.log(&format!("{e}; recording continues without it"));
            }
        }
        s.sources.push(source);
        s.source_failed.push(failed);
    }

    /// Steps aside for another profiler: a capture in progress ends now and is saved, a pending
    /// one is cancelled, the sources are never enabled again and nothing more is recorded.
    pub fn step_aside(&self, reason: &str) {
        let mut s = lock(&self.shared);
        if s.stepped_aside.is_some() || s.shutdown {
            return;
        }
        s.stepped_aside = Some(reason.to_string());
        s.end_capture();
        s.finish_request(&format!("cancelled: {reason}"));
    }

    /// A snapshot for status reports.
    pub fn status(&self) -> SessionStatus {
        let s = lock(&self.shared);
        SessionStatus {
            step_num: s.step_num,
            action: s.action,
            capture: s.request.as_ref().map(|r| r.plan),
            traces: s.outputs.len(),
            stepped_aside: s.stepped_aside.clone(),
        }
    }

    /// Ends the session without joining its collector thread, for use at process exit: a capture in
    /// progress is saved (one in warm-up discarded), nothing is recorded afterwards. Returns every
    /// trace written. Dropping the session afterwards is still allowed.
    pub fn close(&self) -> Vec<TraceOutput> {
        {
            let mut s = lock(&self.shared);
            s.close();
        }
        self.shared.wake.notify_all();
        lock(&self.shared).outputs.clone()
    }

    /// The current step number (0 before the first [`step`](Self::step)).
    pub fn step_num(&self) -> u64 {
        lock(&self.shared).step_num
    }

    /// The schedule's current action.
    pub fn action(&self) -> ProfilerAction {
        lock(&self.shared).action
    }

    /// Traces written so far.
    pub fn outputs(&self) -> Vec<TraceOutput> {
        lock(&self.shared).outputs.clone()
    }

    /// Stops: a cycle in RECORD is saved, one in WARMUP is discarded. Returns every trace written.
    pub fn stop(mut self) -> Vec<TraceOutput> {
        self.shutdown();
        let outputs = std::mem::take(&mut lock(&self.shared).outputs);
        outputs
    }

    fn shutdown(&mut self) {
        if self.released {
            return;
        }
        lock(&self.shared).close();
        self.shared.wake.notify_all();
        if let Some(h) = self.collector.take() {
            let _ = h.join();
        }
        self.released = true;
        SESSION_LIVE.store(false, Ordering::Release);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

fn collector_loop(shared: &Shared, interval: Duration) {
    let mut s = lock(shared);
    loop {
        if s.shutdown {
            return;
        }
        if s.time_driven() {
            let next = s.target_action(s.started.elapsed());
            if next != s.action {
                s.close_step_span();
                s.transition(next);
                s.open_step_span();
            }
            s.settle_request();
        }
        s.collect(false);
        s = shared
            .wake
            .wait_timeout(s, interval)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

/// This machine's host name (from `/proc` or `HOSTNAME`, else `"localhost"`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// This process's name: the file name of `argv[0]`.
pub fn process_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests;
