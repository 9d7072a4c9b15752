//! The session: wires sources, the thread rings and a sink together, driven by a trigger.
//!
//! It holds no policy of its own: the [`crate::schedule`] state machine decides what happens on each
//! step (or tick of a time window) and the session carries out its commands.
//!
//! Two sides, so that a training step never waits for profiling work:
//!
//! - **Control** ([`control`]): the schedule's state, the on-demand request, the step span. A step,
//!   a capture request or a status query holds its lock for microseconds. A transition turns the
//!   action's commands into [`Command`]s stamped with the time they happened, queues them and wakes
//!   the collector. The one piece of work it does itself is enabling the sources when a window opens
//!   while they are off (as `torch.profiler`'s `step()` does), so that the first step of a window is
//!   recorded; the collector never holds the sources then (it touches them only while a window is
//!   open or closing).
//! - **Collector** ([`collector`]): a thread that owns everything else: the sinks, the pairing
//!   tables, the clock converter. It drains the rings and polls the sources every
//!   `collect_interval` (sooner when a ring passes its fill mark), applies the queued commands in
//!   order, and finishes windows: flushing the sources, writing the trace (header, rename) and
//!   calling `on_trace_ready` all happen there. Records are assigned to a window by their time
//!   stamps, not by when the collector sees them.
//!
//! [`Session::stop`] and dropping the session wait for the collector to finish every queued window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::activity::ActivitySet;
use crate::flight::{FlightConfig, FlightTrigger};
use crate::framework::{DistributedInfo, FrameworkOptions};
use crate::recorder;
use crate::schedule::{ProfilerAction, Schedule, TimeWindow};
use crate::source::{ActivitySource, SinkFactory, TraceOutput};

mod capture;
mod collector;
mod control;

use capture::describe_plan;
pub use capture::{
    CaptureDone, CaptureLength, CapturePlan, CaptureRefused, CaptureRequest, CaptureStart,
    SessionStatus,
};
use collector::Collector;
use control::{ActiveRequest, Command, Control, RequestKind};

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

/// Called with each finished trace, on the collector thread.
pub type TraceReadyCallback = Box<dyn FnMut(&TraceOutput) + Send>;

/// Where the session's one-line messages go.
pub type LogFn = Arc<dyn Fn(&str) + Send + Sync>;

/// The default message sink: one line on stderr prefixed `kinetrace: `. It never panics: a full
/// disk or a closed pipe on stderr loses the line, not the session.
pub fn stderr_log() -> LogFn {
    Arc::new(|m: &str| {
        use std::io::Write;
        let line = format!("kinetrace: {m}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    })
}

/// Settings for a session.
pub struct SessionConfig {
    /// Which records to keep.
    pub activities: ActivitySet,
    /// When to record.
    pub trigger: Trigger,
    /// Slots per thread ring.
    pub ring_capacity: usize,
    /// Bound on the memory of all thread rings together, spare rings for bursts included
    /// ([`recorder::DEFAULT_RING_MEMORY_CAP`]).
    pub ring_memory_cap: usize,
    /// How often the collector drains rings and polls sources (it is also woken when a ring passes
    /// its fill mark).
    pub collect_interval: Duration,
    /// Distributed rank.
    pub rank: Option<u32>,
    /// World size.
    pub world_size: Option<u32>,
    /// Extra metadata for every trace.
    pub metadata: Vec<(String, String)>,
    /// Message sink (default: [`stderr_log`]).
    pub log: LogFn,
    /// The step number the session starts at (steps the process took before profiling began).
    pub first_step: u64,
    /// What the framework recorders turn on in every window (a capture request may change it for
    /// its own), written in each trace's head.
    pub framework: FrameworkOptions,
    /// Run as a flight recorder: record all the time, keep the last span, write it only when a
    /// trigger fires ([`Session::flight_dump`], a slow step, a hang). The trigger is then
    /// [`Trigger::Always`] whatever was set.
    pub flight: Option<FlightConfig>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            activities: ActivitySet::default_set(),
            trigger: Trigger::Always,
            ring_capacity: recorder::DEFAULT_RING_CAPACITY,
            ring_memory_cap: recorder::DEFAULT_RING_MEMORY_CAP,
            collect_interval: Duration::from_millis(20),
            rank: None,
            world_size: None,
            metadata: Vec::new(),
            log: stderr_log(),
            first_step: 0,
            framework: FrameworkOptions::default(),
            flight: None,
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

/// Why a flight dump was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlightRefused {
    /// The session is not a flight recorder.
    NotFlight,
    /// A dump is queued or being written; this trigger was folded into it (its head counts it).
    Busy,
    /// The session is stopping.
    Stopped,
}

impl std::fmt::Display for FlightRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlightRefused::NotFlight => {
                "the flight recorder is off in this process (KINETRACE_FLIGHT_RECORDER)"
            }
            FlightRefused::Busy => "a flight dump is already being written; this trigger joins it",
            FlightRefused::Stopped => "the profiler is stopping",
        })
    }
}

impl std::error::Error for FlightRefused {}

/// A running session. Dropping it stops recording and writes any partial cycle.
pub struct Session {
    shared: Arc<Shared>,
    collector: Option<JoinHandle<()>>,
    /// Set once `SESSION_LIVE` is given back.
    released: bool,
}

/// The sources and which of them failed to enable (skipped until the next window).
struct Sources {
    list: Vec<Box<dyn ActivitySource>>,
    failed: Vec<bool>,
}

struct Shared {
    control: Mutex<Control>,
    /// Signalled when the collector has processed the shutdown.
    finished: Condvar,
    /// Lock order: `sources` before `control`; nothing takes `sources` while holding `control`.
    sources: Mutex<Sources>,
    /// The collector's own state; only the collector thread locks it (or, without one, whoever
    /// runs its work inline).
    collector: Mutex<Collector>,
    /// The recording window's start as the control side set it, for records the collector drains
    /// before it has seen the command (recording-clock ticks; `u64::MAX` while none is pending).
    /// Release on store, Acquire on load: a record pushed after the store on the same thread is
    /// seen with it.
    recording_from: AtomicU64,
    /// A source's last enable left it degraded (see `ActivitySource::degraded`).
    sources_degraded: AtomicBool,
    /// Whether a collector thread runs (else its work is done inline by the caller).
    threaded: AtomicBool,
    /// What the job said of its distributed setup, for the heads of the traces that open later.
    distributed: Mutex<Option<Arc<DistributedInfo>>>,
}

impl Session {
    /// Starts a session. Recording begins at once for [`Trigger::Always`], at the first selected step
    /// for schedules, and after the delay for time windows.
    pub fn start(
        config: SessionConfig,
        sources: Vec<Box<dyn ActivitySource>>,
        sinks: Box<dyn SinkFactory>,
        on_trace_ready: Option<crate::session::TraceReadyCallback>,
    ) -> Result<Session, SessionError> {
        let mut config = config;
        if config.flight.is_some() {
            config.trigger = Trigger::Always;
        }
        if SESSION_LIVE
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(SessionError::AlreadyRunning);
        }
        crate::clock::init();
        recorder::set_ring_capacity(config.ring_capacity);
        recorder::set_ring_memory_cap(config.ring_memory_cap);
        let interval = config.collect_interval;
        let n_sources = sources.len();
        // One log channel: every source speaks through the session's.
        let mut sources = sources;
        for src in &mut sources {
            src.set_log(config.log.clone());
        }
        let collector = Collector::new(&config, sinks, on_trace_ready);
        let control = Control::new(&config);
        let shared = Arc::new(Shared {
            control: Mutex::new(control),
            finished: Condvar::new(),
            sources: Mutex::new(Sources {
                list: sources,
                failed: vec![false; n_sources],
            }),
            collector: Mutex::new(collector),
            recording_from: AtomicU64::new(u64::MAX),
            sources_degraded: AtomicBool::new(false),
            threaded: AtomicBool::new(false),
            distributed: Mutex::new(None),
        });
        {
            let mut c = lock(&shared.control);
            let first = c.target_action(Duration::ZERO);
            c.transition(first, &shared);
            c.open_step_span();
        }
        shared.enable_sources_if_wanted();
        let bg = shared.clone();
        let collector = std::thread::Builder::new()
            .name("kinetrace-collector".into())
            .spawn(move || collector::run(&bg, interval))
            .ok();
        match &collector {
            Some(handle) => {
                recorder::set_collector(Some(handle.thread().clone()));
                shared.threaded.store(true, Ordering::Release);
                handle.thread().unpark();
            }
            None => {
                lock(&shared.control).log(
                    "could not start the collector thread; events are collected at each step only",
                );
                shared.run_inline();
            }
        }
        Ok(Session {
            shared,
            collector,
            released: false,
        })
    }

    /// Marks a step boundary (a training iteration): closes `ProfilerStep#N`, advances the schedule and
    /// opens `ProfilerStep#N+1`. When a cycle ends here its trace is written by the collector, not
    /// by this call.
    pub fn step(&self) {
        let queued = {
            let mut s = lock(&self.shared.control);
            let before = s.queued;
            s.stepping_on(recorder::current_tid());
            s.close_step_span();
            let ended = s.step_num;
            let slow = s
                .flight
                .as_mut()
                .and_then(|f| f.clock.step_ended(ended, Instant::now()));
            if let Some(trigger) = slow {
                // Folded into a dump already queued, if any: nothing to do about a refusal.
                let _ = s.queue_dump(trigger, None);
            }
            s.step_num += 1;
            s.record_steps = true;
            if s.step_driven() {
                let next = s.target_action(Duration::ZERO);
                if next != s.action || next == ProfilerAction::RecordAndSave {
                    s.transition(next, &self.shared);
                }
            }
            s.settle_request();
            s.open_step_span();
            s.queued != before
        };
        self.shared.after_control(queued);
    }

    /// Asks a live session for a capture now (on-demand profiling). Refused while another capture
    /// is pending or in progress, in [`Trigger::Always`] sessions (always recording), after
    /// [`step_aside`](Self::step_aside) and while stopping. A step capture records whole steps, each
    /// a `ProfilerStep#N` annotation; the trace goes to the request's sinks if it has some.
    pub fn request_capture(&self, request: CaptureRequest) -> Result<CapturePlan, CaptureRefused> {
        self.shared.request_capture(request)
    }

    /// A handle that can ask this session for captures and its status from another thread (an
    /// on-demand poller), without keeping the session alive: once the session is stopped or
    /// dropped, requests are refused as [`CaptureRefused::Stopped`].
    pub fn handle(&self) -> SessionHandle {
        SessionHandle {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Asks the flight recorder for a dump of the kept span now: queued for the collector, which
    /// writes it; this returns at once. Refused when the session is no flight recorder, while it
    /// stops, and while another dump is queued (the trigger is then counted in that dump's head).
    pub fn flight_dump(&self, trigger: FlightTrigger) -> Result<(), FlightRefused> {
        self.shared.flight_dump(trigger, None)
    }

    /// Adds a source to the live session (a GPU backend that became available after the session
    /// started, e.g. when CUDA initialises). It is enabled at once if a window is open.
    pub fn add_source(&self, mut source: Box<dyn ActivitySource>) {
        let mut sources = lock(&self.shared.sources);
        let (enable, activities, log) = {
            let c = lock(&self.shared.control);
            (
                c.sources_enabled && c.stepped_aside.is_none(),
                c.activities,
                c.log.clone(),
            )
        };
        source.set_log(log.clone());
        let mut failed = false;
        if enable {
            if let Err(e) = source.enable(activities) {
                failed = true;
                log(&format!("{e}; recording continues without it"));
            }
        }
        sources.list.push(source);
        sources.failed.push(failed);
    }

    /// Steps aside for another profiler: a capture in progress ends now and is saved, a pending
    /// one is cancelled, the sources are never enabled again and nothing more is recorded. Unlike
    /// a step, this waits (up to [`STEP_ASIDE_WAIT`]) until the collector has flushed the sources
    /// and written the trace: the caller is about to hand the vendor library to someone else.
    pub fn step_aside(&self, reason: &str) {
        let target = {
            let mut s = lock(&self.shared.control);
            if s.stepped_aside.is_some() || s.shutdown {
                return;
            }
            s.stepped_aside = Some(reason.to_string());
            s.end_capture(&self.shared);
            s.finish_request(&format!("cancelled: {reason}"));
            s.queued
        };
        self.shared.after_control(true);
        self.shared.wait_applied(target, STEP_ASIDE_WAIT);
    }

    /// What the framework recorders should have on now: the options of the capture request in
    /// force, else the session's own.
    pub fn framework_options(&self) -> FrameworkOptions {
        lock(&self.shared.control).framework_now()
    }

    /// What the job says of its distributed setup (`torch.distributed`'s backend, rank and
    /// groups): the `distributedInfo` of every trace whose window opens from now on, in place of
    /// the rank and world size the session was configured with. `None` goes back to those.
    pub fn set_distributed_info(&self, info: Option<DistributedInfo>) {
        *lock(&self.shared.distributed) = info.map(Arc::new);
    }

    /// A snapshot for status reports.
    pub fn status(&self) -> SessionStatus {
        self.shared.status()
    }

    /// Ends the session without joining its collector thread, for use at process exit: a capture in
    /// progress is saved (one in warm-up discarded), nothing is recorded afterwards. Waits until the
    /// collector has written what was queued and returns every trace written. Dropping the session
    /// afterwards is still allowed.
    pub fn close(&self) -> Vec<TraceOutput> {
        self.shared.close();
        let mut c = lock(&self.shared.control);
        while !c.collector_done {
            c = self
                .shared
                .finished
                .wait(c)
                .unwrap_or_else(|e| e.into_inner());
        }
        c.outputs.clone()
    }

    /// The current step number (0 before the first [`step`](Self::step)).
    pub fn step_num(&self) -> u64 {
        lock(&self.shared.control).step_num
    }

    /// The schedule's current action.
    pub fn action(&self) -> ProfilerAction {
        lock(&self.shared.control).action
    }

    /// Traces written so far (a window that just ended may still be being written).
    pub fn outputs(&self) -> Vec<TraceOutput> {
        lock(&self.shared.control).outputs.clone()
    }

    /// Stops: a cycle in RECORD is saved, one in WARMUP is discarded. Waits for every queued trace
    /// and returns every trace written.
    pub fn stop(mut self) -> Vec<TraceOutput> {
        self.shutdown();
        let outputs = std::mem::take(&mut lock(&self.shared.control).outputs);
        outputs
    }

    fn shutdown(&mut self) {
        if self.released {
            return;
        }
        self.shared.close();
        if let Some(h) = self.collector.take() {
            let _ = h.join();
        }
        recorder::set_collector(None);
        recorder::release_spares();
        self.released = true;
        SESSION_LIVE.store(false, Ordering::Release);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A weak handle on a [`Session`] (see [`Session::handle`]): captures and status from another
/// thread, refused once the session is gone.
#[derive(Clone)]
pub struct SessionHandle {
    shared: std::sync::Weak<Shared>,
}

impl SessionHandle {
    /// [`Session::request_capture`], or [`CaptureRefused::Stopped`] once the session is gone.
    pub fn request_capture(&self, request: CaptureRequest) -> Result<CapturePlan, CaptureRefused> {
        match self.shared.upgrade() {
            Some(shared) => shared.request_capture(request),
            None => Err(CaptureRefused::Stopped),
        }
    }

    /// [`Session::flight_dump`], or [`FlightRefused::Stopped`] once the session is gone.
    pub fn flight_dump(&self, trigger: FlightTrigger) -> Result<(), FlightRefused> {
        self.flight_dump_to(trigger, None)
    }

    /// [`Session::flight_dump`] written by `sinks` (a requester's own file) instead of the
    /// session's.
    pub fn flight_dump_to(
        &self,
        trigger: FlightTrigger,
        sinks: Option<Box<dyn SinkFactory>>,
    ) -> Result<(), FlightRefused> {
        match self.shared.upgrade() {
            Some(shared) => shared.flight_dump(trigger, sinks),
            None => Err(FlightRefused::Stopped),
        }
    }

    /// [`Session::status`], or `None` once the session is gone.
    pub fn status(&self) -> Option<SessionStatus> {
        self.shared.upgrade().map(|s| s.status())
    }
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionHandle")
    }
}

/// The longest [`Session::step_aside`] waits for the collector.
pub const STEP_ASIDE_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    fn flight_dump(
        &self,
        trigger: FlightTrigger,
        sinks: Option<Box<dyn SinkFactory>>,
    ) -> Result<(), FlightRefused> {
        lock(&self.control).queue_dump(trigger, sinks)?;
        self.wake_collector();
        Ok(())
    }

    fn request_capture(&self, request: CaptureRequest) -> Result<CapturePlan, CaptureRefused> {
        let plan = {
            let mut s = lock(&self.control);
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
            if s.action != ProfilerAction::None {
                let what = match s.trigger {
                    Trigger::Always if s.flight.is_some() => {
                        "the flight recorder is on: ask it for a dump instead".to_string()
                    }
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
                framework: request.framework,
            });
            s.push(Command::ForgetResult);
            let next = s.target_action(s.started.elapsed());
            if next != s.action {
                s.close_step_span();
                s.transition(next, self);
                s.open_step_span();
            }
            plan
        };
        self.after_control(true);
        Ok(plan)
    }

    fn status(&self) -> SessionStatus {
        let s = lock(&self.control);
        SessionStatus {
            step_num: s.step_num,
            action: s.action,
            capture: s.request.as_ref().map(|r| r.plan),
            traces: s.outputs.len(),
            stepped_aside: s.stepped_aside.clone(),
            flight: s.flight.is_some(),
        }
    }

    /// Waits until the collector has applied the first `target` commands, or `limit` passed.
    fn wait_applied(&self, target: u64, limit: Duration) {
        let end = Instant::now() + limit;
        let mut c = lock(&self.control);
        while c.applied < target && !c.collector_done {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            c = self
                .finished
                .wait_timeout(c, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// What every control-side call does after releasing the control lock: enable the sources if a
    /// window opened while they were off, then let the collector (or, without one, this thread) do
    /// the queued work.
    fn after_control(&self, queued: bool) {
        self.enable_sources_if_wanted();
        // A step that changed nothing lets the collector keep its own pace: waking it would hand it
        // the CPU in the middle of the training loop for nothing.
        if queued {
            self.wake_collector();
        }
    }

    fn wake_collector(&self) {
        if self.threaded.load(Ordering::Acquire) {
            recorder::wake_collector();
        } else {
            self.run_inline();
        }
    }

    /// Without a collector thread: does its work now, on the caller's thread.
    fn run_inline(&self) {
        let mut c = lock(&self.collector);
        c.iteration(self);
    }

    /// Queues the end of the session (saving a capture in progress) and wakes the collector.
    fn close(&self) {
        {
            let mut c = lock(&self.control);
            c.close(self);
        }
        self.wake_collector();
    }

    /// Enables the sources for a window that wants them: if they are off, now (waiting for the
    /// collector if it holds them, which it does not while they are off); if they are still on
    /// from an earlier window, enables them again for this one (a source retries what failed, such
    /// as a subscriber another client held) unless the collector is busy with them right now.
    /// Called without the control lock (lock order: sources, then control).
    fn enable_sources_if_wanted(&self) {
        let needed = |c: &Control| {
            c.sources_wanted
                && c.stepped_aside.is_none()
                && (!c.sources_enabled || c.enabled_epoch != c.sources_epoch)
        };
        let (must_wait, epoch) = {
            let c = lock(&self.control);
            if !needed(&c) {
                return;
            }
            (!c.sources_enabled, c.sources_epoch)
        };
        let mut sources = if must_wait {
            lock(&self.sources)
        } else {
            match self.sources.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock)
                    if !self.sources_degraded.load(Ordering::Acquire) =>
                {
                    // Still on from the last window; refreshing them is not worth a wait.
                    lock(&self.control).enabled_epoch = epoch;
                    return;
                }
                // Degraded in the last window (another profiler held the vendor library): this
                // enable is its chance to recover, worth the wait for the collector's brief hold.
                Err(std::sync::TryLockError::WouldBlock) => lock(&self.sources),
            }
        };
        let c = lock(&self.control);
        if !needed(&c) {
            return;
        }
        drop(c);
        self.enable_locked(&mut sources);
    }

    /// Enables every source for the window that wants them now, with the sources locked (lock
    /// order: sources, then control).
    fn enable_locked(&self, sources: &mut Sources) {
        let c = lock(&self.control);
        let (activities, log, epoch) = (c.activities, c.log.clone(), c.sources_epoch);
        // Enabling makes vendor calls (milliseconds at most); the control lock is not needed for it.
        drop(c);
        let Sources { list, failed } = sources;
        let mut messages = Vec::new();
        for (src, failed) in list.iter_mut().zip(failed.iter_mut()) {
            match src.enable(activities) {
                Ok(()) => *failed = false,
                Err(e) => {
                    *failed = true;
                    messages.push(format!("{e}; recording continues without it"));
                }
            }
        }
        messages.iter().for_each(|m| log(m));
        self.sources_degraded
            .store(list.iter().any(|s| s.degraded()), Ordering::Release);
        let mut c = lock(&self.control);
        c.sources_enabled = true;
        c.enabled_epoch = epoch;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
mod flight_tests;
#[cfg(test)]
mod tests;
