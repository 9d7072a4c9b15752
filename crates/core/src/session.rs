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
        let mut state = State {
            config,
            sources,
            source_failed: vec![false; n_sources],
            sinks,
            on_trace_ready,
            action: ProfilerAction::None,
            step_num: 0,
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
        Ok(Session { shared, collector })
    }

    /// Marks a step boundary (a training iteration): closes `ProfilerStep#N`, advances the schedule and
    /// opens `ProfilerStep#N+1`. Exports and fires `on_trace_ready` when a cycle ends here.
    pub fn step(&self) {
        let mut s = lock(&self.shared);
        s.close_step_span();
        s.step_num += 1;
        s.record_steps = true;
        if let Trigger::Schedule(_) = s.config.trigger {
            let next = s.target_action(Duration::ZERO);
            s.transition(next);
        }
        s.open_step_span();
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
        {
            let mut s = lock(&self.shared);
            if s.shutdown {
                return;
            }
            s.shutdown = true;
            s.close_step_span();
            let exit = commands_on_exit(s.action);
            s.run(exit);
            s.action = ProfilerAction::None;
            // A window still open here (WARMUP exit) is discarded.
            s.discard_open_windows();
            recorder::set_active(false);
        }
        self.shared.wake.notify_all();
        if let Some(h) = self.collector.take() {
            let _ = h.join();
        }
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
        if let Trigger::TimeWindow(_) = s.config.trigger {
            let next = s.target_action(s.started.elapsed());
            if next != s.action {
                s.close_step_span();
                s.transition(next);
                s.open_step_span();
            }
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
        match self.config.trigger {
            Trigger::Always => ProfilerAction::Record,
            Trigger::Schedule(s) => s.action(self.step_num),
            Trigger::TimeWindow(w) => w.action_at(elapsed),
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
        for (i, src) in self.sources.iter_mut().enumerate() {
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
        let sink = match self.sinks.open(self.cycle) {
            Ok(s) => Some(s),
            Err(e) => {
                self.log(&format!(
                    "cannot open the trace output for cycle {}: {e}; this cycle is not recorded",
                    self.cycle
                ));
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
                self.outputs.push(out);
            }
            Err(e) => self.log(&format!("trace for cycle {cycle} not written: {e}")),
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
