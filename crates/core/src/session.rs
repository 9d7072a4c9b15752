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

use crate::activity::{Activity, ActivitySet, CpuSpan, Detail};
use crate::clock::UnixNanos;
use crate::intern::intern;
use crate::recorder::{self, CpuRecord};
use crate::schedule::{
    commands, commands_on_exit, ProfilerAction, Schedule, SessionCommand, TimeWindow,
};
use crate::source::{ActivitySource, Sink, SinkFactory, TraceMeta, TraceOutput};

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

/// When an on-demand capture starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureStart {
    /// Now: a step capture includes the current step (from now on); a timed one starts at once.
    Now,
    /// At the next step boundary (timed captures: now).
    NextStep,
    /// At step `n`, or at the next step boundary if `n` is already past.
    AtStep(u64),
    /// This long from now.
    After(Duration),
}

/// How long an on-demand capture records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureLength {
    /// This many whole steps (at least 1), each a `ProfilerStep#N` annotation.
    Steps(u32),
    /// This much wall time.
    Duration(Duration),
}

/// Called once when an on-demand capture ends: the trace written, or why there is none.
pub type CaptureDone = Box<dyn FnOnce(Result<TraceOutput, String>) + Send>;

/// An on-demand capture for a live session (see [`Session::request_capture`]).
pub struct CaptureRequest {
    /// When it starts.
    pub start: CaptureStart,
    /// How long it lasts.
    pub length: CaptureLength,
    /// Where its trace goes, instead of the session's own sinks.
    pub sinks: Option<Box<dyn SinkFactory>>,
    /// Told the outcome when the capture ends.
    pub on_done: Option<CaptureDone>,
}

impl CaptureRequest {
    /// A capture of `length` starting at `start`, written by the session's own sinks.
    pub fn new(start: CaptureStart, length: CaptureLength) -> Self {
        CaptureRequest {
            start,
            length,
            sinks: None,
            on_done: None,
        }
    }
}

/// What an accepted capture will record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturePlan {
    /// Steps `first..=last`.
    Steps {
        /// The first recorded step.
        first: u64,
        /// The last recorded step.
        last: u64,
    },
    /// `duration` of wall time starting `delay` from the request.
    Time {
        /// From the request to the start of recording.
        delay: Duration,
        /// Length of the recording.
        duration: Duration,
    },
}

/// Why a capture request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureRefused {
    /// A capture is already in progress or pending; the text says which.
    Busy(String),
    /// The session stepped aside for another profiler (the reason).
    SteppedAside(String),
    /// The session is stopping.
    Stopped,
    /// The request itself is invalid (zero steps or duration).
    Invalid(String),
}

impl std::fmt::Display for CaptureRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureRefused::Busy(what) => write!(f, "busy: {what}"),
            CaptureRefused::SteppedAside(why) => write!(f, "profiling is off: {why}"),
            CaptureRefused::Stopped => write!(f, "the profiler is stopping"),
            CaptureRefused::Invalid(why) => write!(f, "invalid request: {why}"),
        }
    }
}

impl std::error::Error for CaptureRefused {}

/// A snapshot of a session, for status reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionStatus {
    /// The current step number.
    pub step_num: u64,
    /// The current action.
    pub action: ProfilerAction,
    /// The on-demand capture pending or in progress.
    pub capture: Option<CapturePlan>,
    /// Traces written so far.
    pub traces: usize,
    /// Why the session stepped aside, if it did.
    pub stepped_aside: Option<String>,
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
            log: Arc::new(|m| eprintln!("kinetrace: {m}")),
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
    start: UnixNanos,
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

impl State {
    fn log(&self, message: &str) {
        (self.config.log)(message)
    }

    fn target_action(&self, elapsed: Duration) -> ProfilerAction {
        if self.stepped_aside.is_some() {
            return ProfilerAction::None;
        }
        match &self.request {
            Some(ActiveRequest {
                kind: RequestKind::Steps(s),
                ..
            }) => return s.action(self.step_num),
            Some(ActiveRequest {
                kind: RequestKind::Time(w, t0),
                ..
            }) => return w.action_at(t0.elapsed()),
            None => {}
        }
        match self.config.trigger {
            Trigger::Always => ProfilerAction::Record,
            Trigger::Schedule(s) => s.action(self.step_num),
            Trigger::TimeWindow(w) => w.action_at(elapsed),
            Trigger::OnDemand => ProfilerAction::None,
        }
    }

    /// Whether `step()` moves the action: a step request, or a schedule when no request is active.
    fn step_driven(&self) -> bool {
        match &self.request {
            Some(r) => matches!(r.kind, RequestKind::Steps(_)),
            None => matches!(self.config.trigger, Trigger::Schedule(_)),
        }
    }

    /// Whether the collector moves the action as time passes.
    fn time_driven(&self) -> bool {
        match &self.request {
            Some(r) => matches!(r.kind, RequestKind::Time(..)),
            None => matches!(self.config.trigger, Trigger::TimeWindow(_)),
        }
    }

    /// Ends the on-demand capture once its window has passed, telling the requester the outcome.
    fn settle_request(&mut self) {
        let finished = match &self.request {
            None => return,
            Some(r) => match &r.kind {
                RequestKind::Steps(s) => s
                    .last_active_step()
                    .is_some_and(|last| self.step_num > last),
                RequestKind::Time(w, t0) => w.end().is_some_and(|end| t0.elapsed() >= end),
            },
        };
        if finished && self.action == ProfilerAction::None {
            self.finish_request("nothing was recorded");
        }
    }

    /// Ends a capture in progress now (saving it; a warm-up is discarded) and goes idle.
    fn end_capture(&mut self) {
        self.close_step_span();
        let exit = commands_on_exit(self.action);
        self.run(exit);
        self.action = ProfilerAction::None;
        // A window still open here (WARMUP exit) is discarded.
        self.discard_open_windows();
        recorder::set_active(false);
    }

    /// Shuts the session down (idempotent): saves a capture in progress, tells a pending request.
    fn close(&mut self) {
        if self.shutdown {
            return;
        }
        self.shutdown = true;
        self.end_capture();
        self.finish_request("the profiler stopped before the capture recorded anything");
    }

    /// Ends the pending request now, telling it the last trace written or `fallback`.
    fn finish_request(&mut self, fallback: &str) {
        if let Some(r) = self.request.take() {
            let result = self
                .last_result
                .take()
                .unwrap_or_else(|| Err(fallback.to_string()));
            if let Some(done) = r.on_done {
                done(result);
            }
        }
    }

    fn transition(&mut self, next: ProfilerAction) {
        let prev = self.action;
        self.action = next;
        if prev != next || matches!(prev, ProfilerAction::RecordAndSave) {
            let cmds = commands(prev, next);
            self.run(cmds);
        }
        self.discard_open_windows();
    }

    fn run(&mut self, cmds: &[SessionCommand]) {
        for cmd in cmds {
            match cmd {
                SessionCommand::Prepare => self.prepare(),
                SessionCommand::Start => self.start_recording(),
                SessionCommand::Stop => self.stop_recording(),
                SessionCommand::TraceReady => self.trace_ready(),
                SessionCommand::Warn(m) => self.log(m),
            }
        }
    }

    fn ring_drops_total(&self) -> u64 {
        self.retired_ring_drops
            + recorder::registry()
                .iter()
                .map(|r| r.reader.dropped())
                .sum::<u64>()
    }

    fn prepare(&mut self) {
        if self.window.is_some() {
            return;
        }
        // Leftovers from before this window are not part of it.
        self.collect(true);
        let activities = self.config.activities;
        let mut failures = Vec::new();
        let stepped_aside = self.stepped_aside.is_some();
        for (i, src) in self.sources.iter_mut().enumerate() {
            if stepped_aside {
                self.source_failed[i] = true;
                continue;
            }
            match src.enable(activities) {
                Ok(()) => self.source_failed[i] = false,
                Err(e) => {
                    self.source_failed[i] = true;
                    failures.push(format!("{e}; recording continues without it"));
                }
            }
        }
        failures.iter().for_each(|m| self.log(m));
        let now = UnixNanos::now();
        self.window = Some(Window {
            sink: None,
            start: now,
            end: now,
            recording: false,
            events: 0,
            write_error: None,
            ring_drops_at_start: self.ring_drops_total(),
            source_drops_at_start: self.sources.iter().map(|s| s.dropped()).collect(),
            threads: HashMap::new(),
        });
        recorder::set_active(true);
    }

    fn start_recording(&mut self) {
        if self.window.is_none() {
            self.prepare();
        }
        // Warm-up events end here.
        self.collect(true);
        let cycle = self.cycle;
        let opened = match self.request.as_mut().and_then(|r| r.sinks.as_mut()) {
            Some(sinks) => sinks.open(cycle),
            None => self.sinks.open(cycle),
        };
        let sink = match opened {
            Ok(s) => Some(s),
            Err(e) => {
                self.log(&format!(
                    "cannot open the trace output for cycle {cycle}: {e}; this cycle is not recorded"
                ));
                self.last_result = Some(Err(format!("cannot open the trace output: {e}")));
                None
            }
        };
        let ring_drops = self.ring_drops_total();
        let source_drops = self.sources.iter().map(|s| s.dropped()).collect();
        if let Some(w) = self.window.as_mut() {
            w.sink = sink;
            w.recording = true;
            w.start = UnixNanos::now();
            w.ring_drops_at_start = ring_drops;
            w.source_drops_at_start = source_drops;
        }
    }

    fn stop_recording(&mut self) {
        if self.window.is_none() {
            return;
        }
        self.collect(false);
        let mut flushed = Vec::new();
        for (i, src) in self.sources.iter_mut().enumerate() {
            if self.source_failed[i] {
                continue;
            }
            src.flush(&mut |a| flushed.push(*a));
            src.disable();
        }
        recorder::set_active(false);
        // Records are already drained above; late ring entries from other threads come in now.
        self.collect(false);
        for a in &flushed {
            self.deliver(a);
        }
        if let Some(mut w) = self.window.take() {
            w.end = UnixNanos::now();
            self.stopped = Some(w);
        }
    }

    fn trace_ready(&mut self) {
        let Some(w) = self.stopped.take() else {
            return;
        };
        let cycle = self.cycle;
        self.cycle += 1;
        let Some(sink) = w.sink else {
            return;
        };
        if let Some(e) = &w.write_error {
            self.log(&format!("trace for cycle {cycle} not written: {e}"));
            self.last_result = Some(Err(format!("trace not written: {e}")));
            sink.discard();
            return;
        }
        let ring_drops = self.ring_drops_total() - w.ring_drops_at_start;
        let mut dropped = vec![("cpu_ring".to_string(), ring_drops)];
        for (i, src) in self.sources.iter().enumerate() {
            let before = w.source_drops_at_start.get(i).copied().unwrap_or(0);
            dropped.push((src.name().to_string(), src.dropped().saturating_sub(before)));
        }
        let lost: u64 = dropped.iter().map(|(_, n)| n).sum();
        if lost > 0 {
            let detail: Vec<String> = dropped
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| format!("{n} from {k}"))
                .collect();
            self.log(&format!(
                "cycle {cycle}: {lost} events dropped ({}); the trace is incomplete (raise ring_capacity / buffer sizes)",
                detail.join(", ")
            ));
        }
        let mut metadata = Vec::new();
        for src in &self.sources {
            metadata.extend(src.metadata());
        }
        metadata.extend(self.config.metadata.iter().cloned());
        let mut thread_names: Vec<(u32, String)> = w
            .threads
            .iter()
            .map(|(tid, name)| (*tid, name.clone().unwrap_or_default()))
            .collect();
        thread_names.sort();
        let meta = TraceMeta {
            trace_id: trace_id(w.start, cycle),
            host_name: host_name(),
            pid: std::process::id(),
            process_name: process_name(),
            rank: self.config.rank,
            world_size: self.config.world_size,
            devices: self
                .sources
                .iter()
                .flat_map(|s| s.device_properties())
                .collect(),
            metadata,
            dropped,
            thread_names,
            window_start: w.start,
            window_end: w.end,
            cycle,
        };
        match sink.finish(&meta) {
            Ok(out) => {
                if let Some(cb) = self.on_trace_ready.as_mut() {
                    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(&out)));
                    if res.is_err() {
                        self.log("the on_trace_ready callback panicked; continuing");
                    }
                }
                self.last_result = Some(Ok(out.clone()));
                self.outputs.push(out);
            }
            Err(e) => {
                self.log(&format!("trace for cycle {cycle} not written: {e}"));
                self.last_result = Some(Err(format!("trace not written: {e}")));
            }
        }
    }

    fn discard_open_windows(&mut self) {
        if let Some(w) = self.stopped.take() {
            if let Some(s) = w.sink {
                s.discard();
            }
        }
        let leaving_warmup = self.action == ProfilerAction::None && self.window.is_some();
        if leaving_warmup {
            self.collect(true);
            for (i, src) in self.sources.iter_mut().enumerate() {
                if !self.source_failed[i] {
                    src.flush(&mut |_| {});
                    src.disable();
                }
            }
            recorder::set_active(false);
            if let Some(w) = self.window.take() {
                if let Some(s) = w.sink {
                    s.discard();
                }
            }
        }
    }

    /// Drains every ring (and polls sources unless discarding) into the current window.
    fn collect(&mut self, discard: bool) {
        let mut batch: Vec<(u32, Option<String>, CpuRecord)> = Vec::new();
        {
            let mut reg = recorder::registry();
            let mut retired = 0;
            reg.retain_mut(|r| {
                let (tid, name) = (r.tid, &r.thread_name);
                r.reader.drain(|rec| batch.push((tid, name.clone(), rec)));
                if r.reader.writer_gone() {
                    retired += r.reader.dropped();
                    false
                } else {
                    true
                }
            });
            self.retired_ring_drops += retired;
        }
        if !discard {
            let mut polled = Vec::new();
            for (i, src) in self.sources.iter_mut().enumerate() {
                if !self.source_failed[i] {
                    src.poll(&mut |a| polled.push(*a));
                }
            }
            for a in &polled {
                self.deliver(a);
            }
        }
        let pid = std::process::id();
        for (tid, name, rec) in batch {
            let activity = match rec {
                CpuRecord::Complete(a) => Some(a),
                CpuRecord::Span {
                    name,
                    annotation,
                    start,
                    end,
                    id,
                } => Some(span_activity(name, annotation, start, end, id, pid, tid)),
                CpuRecord::Begin { id, .. } => {
                    self.open_begins.insert((tid, id), (pid, rec));
                    None
                }
                CpuRecord::End { end, id } => match self.open_begins.remove(&(tid, id)) {
                    Some((
                        pid,
                        CpuRecord::Begin {
                            name,
                            annotation,
                            start,
                            id,
                        },
                    )) => Some(span_activity(name, annotation, start, end, id, pid, tid)),
                    _ => None,
                },
            };
            if let (Some(a), false) = (activity, discard) {
                if self.deliver(&a) {
                    if let Some(w) = self.window.as_mut() {
                        w.threads.entry(tid).or_insert(name);
                    }
                }
            }
        }
        // Bound the pairing table: begins whose end never came (a span left open forever).
        if self.open_begins.len() > 65_536 {
            self.open_begins.clear();
        }
    }

    /// Hands one record to the open sink if it belongs to the recording window.
    fn deliver(&mut self, a: &Activity) -> bool {
        let activities = self.config.activities;
        let Some(w) = self.window.as_mut().filter(|w| w.recording) else {
            return false;
        };
        if a.start < w.start || !activities.contains(a.activity_type()) {
            return false;
        }
        let Some(sink) = w.sink.as_mut() else {
            return false;
        };
        if w.write_error.is_some() {
            return false;
        }
        match sink.record(a) {
            Ok(()) => {
                w.events += 1;
                true
            }
            Err(e) => {
                w.write_error = Some(e.to_string());
                false
            }
        }
    }

    fn open_step_span(&mut self) {
        if self.action == ProfilerAction::None || self.shutdown || !self.record_steps {
            return;
        }
        let id = recorder::next_span_id();
        self.step_span = Some(StepSpan {
            id,
            previous_external_id: recorder::push_external_id(id),
            start: UnixNanos::now(),
            step: self.step_num,
        });
    }

    fn close_step_span(&mut self) {
        let Some(s) = self.step_span.take() else {
            return;
        };
        recorder::restore_external_id(s.previous_external_id);
        let name = intern(&format!("ProfilerStep#{}", s.step));
        let end = UnixNanos::now();
        recorder::push_with(|pid, tid| {
            CpuRecord::Complete(Activity {
                start: s.start,
                end,
                correlation: None,
                external_id: Some(s.id),
                detail: Detail::UserAnnotation(CpuSpan { name, pid, tid }),
            })
        });
    }
}

fn describe_plan(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps {first}..={last}"),
        CapturePlan::Time { delay, duration } => {
            format!(
                "{} ms after a delay of {} ms",
                duration.as_millis(),
                delay.as_millis()
            )
        }
    }
}

fn span_activity(
    name: crate::intern::NameId,
    annotation: bool,
    start: UnixNanos,
    end: UnixNanos,
    id: u64,
    pid: u32,
    tid: u32,
) -> Activity {
    let span = CpuSpan { name, pid, tid };
    Activity {
        start,
        end,
        correlation: None,
        external_id: Some(id),
        detail: if annotation {
            Detail::UserAnnotation(span)
        } else {
            Detail::CpuOp(span)
        },
    }
}

fn trace_id(start: UnixNanos, cycle: u32) -> String {
    // Unique enough across processes and cycles: time, pid and cycle mixed through SplitMix64.
    let mut x = start.0 ^ ((std::process::id() as u64) << 32) ^ cycle as u64;
    let mut out = String::with_capacity(32);
    for _ in 0..2 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.push_str(&format!("{z:016X}"));
    }
    out
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
mod tests {
    use super::*;
    use crate::activity::Detail;
    use std::sync::mpsc;

    /// Sessions are process-wide: these tests take turns (and wait for other modules' sessions).
    static TURN: Mutex<()> = Mutex::new(());

    type Traces = Arc<Mutex<Vec<Vec<String>>>>;

    struct StepSink {
        steps: Vec<String>,
        out: Traces,
    }

    impl Sink for StepSink {
        fn record(&mut self, a: &Activity) -> std::io::Result<()> {
            if let Detail::UserAnnotation(span) = &a.detail {
                let name = crate::intern::resolve(span.name).to_string();
                if name.starts_with("ProfilerStep#") {
                    self.steps.push(name);
                }
            }
            Ok(())
        }
        fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
            let mut steps = self.steps;
            steps.sort_by_key(|s| s[13..].parse::<u64>().unwrap_or(0));
            let events = steps.len() as u64;
            self.out.lock().unwrap().push(steps);
            Ok(TraceOutput {
                path: None,
                events,
                cycle: meta.cycle,
            })
        }
    }

    fn sinks(out: &Traces) -> Box<dyn SinkFactory> {
        let out = out.clone();
        Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
            Ok(Box::new(StepSink {
                steps: Vec::new(),
                out: out.clone(),
            }))
        })
    }

    fn start(trigger: Trigger, first_step: u64, out: &Traces) -> Session {
        loop {
            let config = SessionConfig {
                trigger,
                first_step,
                log: Arc::new(|_| {}),
                ..SessionConfig::default()
            };
            match Session::start(config, Vec::new(), sinks(out), None) {
                Ok(s) => return s,
                Err(SessionError::AlreadyRunning) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    fn steps(v: &[u64]) -> Vec<String> {
        v.iter().map(|n| format!("ProfilerStep#{n}")).collect()
    }

    fn with_done(
        mut r: CaptureRequest,
    ) -> (CaptureRequest, mpsc::Receiver<Result<TraceOutput, String>>) {
        let (tx, rx) = mpsc::channel();
        r.on_done = Some(Box::new(move |res| {
            let _ = tx.send(res);
        }));
        (r, rx)
    }

    #[test]
    fn on_demand_step_capture_records_exactly_the_requested_steps() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let out = Traces::default();
        let session = start(Trigger::OnDemand, 0, &out);
        for _ in 0..5 {
            session.step();
        }
        assert_eq!(session.action(), ProfilerAction::None);
        let (req, done) = with_done(CaptureRequest::new(
            CaptureStart::NextStep,
            CaptureLength::Steps(3),
        ));
        let plan = session.request_capture(req).unwrap();
        assert_eq!(plan, CapturePlan::Steps { first: 6, last: 8 });
        // A second request while one is pending is refused and says why.
        let again = session.request_capture(CaptureRequest::new(
            CaptureStart::NextStep,
            CaptureLength::Steps(1),
        ));
        assert!(
            matches!(&again, Err(CaptureRefused::Busy(m)) if m.contains("steps 6..=8")),
            "{again:?}"
        );
        for _ in 0..3 {
            session.step();
            assert!(done.try_recv().is_err(), "done too early");
        }
        session.step(); // leaves step 8
        let result = done.try_recv().expect("told when the capture ended");
        assert_eq!(result.unwrap().events, 3);
        assert_eq!(*out.lock().unwrap(), vec![steps(&[6, 7, 8])]);
        // Idle again: a new request is accepted.
        let plan = session
            .request_capture(CaptureRequest::new(
                CaptureStart::AtStep(2),
                CaptureLength::Steps(1),
            ))
            .unwrap();
        assert_eq!(
            plan,
            CapturePlan::Steps {
                first: 10,
                last: 10
            },
            "a past step means the next one"
        );
        drop(session);
    }

    #[test]
    fn capture_now_includes_the_current_step_and_first_step_is_honoured() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let out = Traces::default();
        let session = start(Trigger::OnDemand, 40, &out);
        assert_eq!(session.step_num(), 40);
        let plan = session
            .request_capture(CaptureRequest::new(
                CaptureStart::Now,
                CaptureLength::Steps(2),
            ))
            .unwrap();
        assert_eq!(
            plan,
            CapturePlan::Steps {
                first: 40,
                last: 41
            }
        );
        assert_eq!(session.action(), ProfilerAction::Record);
        for _ in 0..4 {
            session.step();
        }
        assert_eq!(session.stop().len(), 1);
        assert_eq!(*out.lock().unwrap(), vec![steps(&[40, 41])]);
    }

    #[test]
    fn timed_capture_ends_by_itself_and_uses_the_request_sinks() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let own = Traces::default();
        let theirs = Traces::default();
        let session = start(Trigger::OnDemand, 0, &own);
        let mut req = CaptureRequest::new(
            CaptureStart::NextStep,
            CaptureLength::Duration(Duration::from_millis(60)),
        );
        req.sinks = Some(sinks(&theirs));
        let (req, done) = with_done(req);
        session.request_capture(req).unwrap();
        assert!(session.action().is_recording());
        session.step();
        let result = done
            .recv_timeout(Duration::from_secs(10))
            .expect("the collector ends the window");
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(session.action(), ProfilerAction::None);
        assert!(own.lock().unwrap().is_empty());
        assert_eq!(theirs.lock().unwrap().len(), 1);
        assert_eq!(session.status().capture, None);
    }

    #[test]
    fn always_sessions_refuse_and_zero_lengths_are_invalid() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let out = Traces::default();
        let session = start(Trigger::Always, 0, &out);
        let r = session.request_capture(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Steps(1),
        ));
        assert!(
            matches!(&r, Err(CaptureRefused::Busy(m)) if m.contains("whole run")),
            "{r:?}"
        );
        drop(session);
        let session = start(Trigger::OnDemand, 0, &out);
        let r = session.request_capture(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Steps(0),
        ));
        assert!(matches!(r, Err(CaptureRefused::Invalid(_))));
        let r = session.request_capture(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Duration(Duration::ZERO),
        ));
        assert!(matches!(r, Err(CaptureRefused::Invalid(_))));
    }

    #[test]
    fn stepping_aside_saves_the_partial_capture_and_refuses_more() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let out = Traces::default();
        let session = start(Trigger::OnDemand, 0, &out);
        let (req, done) = with_done(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Steps(5),
        ));
        session.request_capture(req).unwrap();
        session.step();
        session.step_aside("torch.profiler took over CUPTI");
        assert!(
            done.try_recv().unwrap().is_ok(),
            "the partial capture is saved"
        );
        assert_eq!(*out.lock().unwrap(), vec![steps(&[0, 1])]);
        assert_eq!(session.action(), ProfilerAction::None);
        let r = session.request_capture(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Steps(1),
        ));
        assert!(matches!(&r, Err(CaptureRefused::SteppedAside(m)) if m.contains("torch.profiler")));
        assert!(session.status().stepped_aside.is_some());
    }

    #[test]
    fn close_saves_the_capture_in_progress_and_drop_after_close_is_fine() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let out = Traces::default();
        let session = start(Trigger::OnDemand, 0, &out);
        let (req, done) = with_done(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Steps(10),
        ));
        session.request_capture(req).unwrap();
        session.step();
        let written = session.close();
        assert_eq!(written.len(), 1);
        assert!(done.try_recv().unwrap().is_ok());
        assert_eq!(
            session.request_capture(CaptureRequest::new(
                CaptureStart::Now,
                CaptureLength::Steps(1)
            )),
            Err(CaptureRefused::Stopped)
        );
        drop(session);
        // The process-wide slot was given back.
        let again = start(Trigger::OnDemand, 0, &out);
        drop(again);
    }
}
