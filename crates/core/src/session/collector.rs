//! The collector side: a thread that owns the sinks, the pairing tables and the clock converter,
//! drains the rings, polls the sources, applies the control side's [`Command`]s in order and
//! finishes windows (flush, trace, `on_trace_ready`), so that none of that happens on a training
//! thread.
//!
//! Records are assigned to windows by time. A window keeps host records (spans, API calls) that start
//! in `[start, stop)` and device records (kernels, copies) that start at or after `start`, since work
//! launched in the window may run past its end; when the next window starts at that same moment,
//! device records after the boundary go to it instead.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::control::{Command, Stamp};
use super::{lock, SessionConfig, Shared, TraceReadyCallback};
use crate::activity::{Activity, ActivitySet, AutogradRole, CpuSpan, Detail, OpArgs};
use crate::clock::{TickConverter, Ticks, UnixNanos};
use crate::flight::{FlightBuffer, FlightConfig};
use crate::op_args;
use crate::recorder::{self, CpuRecord};
use crate::source::{Sink, SinkFactory, TraceMeta, TraceOutput, WindowInfo, PARTIAL_STEP_KEY};

mod flight_dump;

/// Records held between a window's end and the start of the next one, or drained before their
/// window's start was applied, at most (beyond it they are counted as dropped).
const MAX_HELD: usize = 1 << 20;

/// The collector thread: works, then sleeps until woken (a command, a ring past its fill mark) or
/// until `interval` has passed.
pub(super) fn run(shared: &Shared, interval: Duration) {
    yield_to_the_job();
    loop {
        let mut c = lock(&shared.collector);
        let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.iteration(shared)));
        match round {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => {
                // A bug (or a source or sink that panicked): recording stops, and whoever waits for
                // the collector (stop, close, step_aside) is released instead of waiting forever.
                c.done = true;
                drop(c);
                abandon(shared);
                return;
            }
        }
        let more = c.behind;
        drop(c);
        // Rings still hold records past this round's budget: go on at once.
        if !more {
            std::thread::park_timeout(interval);
        }
    }
}

/// Test hook: runs on the collector between taking a round's commands and draining the rings
/// (where a loaded machine may preempt it while the job runs on).
#[cfg(test)]
pub(super) static AFTER_TAKING_COMMANDS: std::sync::Mutex<Option<Box<dyn FnMut() + Send>>> =
    std::sync::Mutex::new(None);

#[cfg(test)]
fn after_taking_commands() {
    if let Some(hook) = AFTER_TAKING_COMMANDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
    {
        hook();
    }
}

/// The collector is gone for good: nothing more is recorded, and waiters are told.
fn abandon(shared: &Shared) {
    recorder::set_active(false);
    let mut c = lock(&shared.control);
    c.collector_done = true;
    c.applied = c.queued;
    c.log("internal error: the collector stopped; recording is off in this process");
    drop(c);
    shared.finished.notify_all();
}

/// Lowers this (the collector's) thread's priority by 10 nice levels: when the job's threads and the
/// collector want the same core, the job runs first, and waking the collector (at a window's end,
/// at a ring's fill mark) does not preempt the thread that woke it. Best effort.
fn yield_to_the_job() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process, Pid};
        // On Linux the "process" these calls name by id is a thread.
        let Some(me) = Pid::from_raw(recorder::current_tid() as i32) else {
            return;
        };
        if let Ok(nice) = getpriority_process(Some(me)) {
            let _ = setpriority_process(Some(me), (nice + 10).min(19));
        }
    }
}

/// Records drained per round when no window ends in it: a long backlog is worked through in
/// rounds, so spare rings are topped up and commands applied between them.
const DRAIN_BUDGET: usize = 1 << 16;

struct Window {
    sink: Option<Box<dyn Sink>>,
    cycle: u32,
    start: UnixNanos,
    stop: Option<UnixNanos>,
    recording: bool,
    events: u64,
    write_error: Option<String>,
    /// Records lost on the way into the rings: the count at the start, then (once stopped) the
    /// window's own.
    ring_drops: u64,
    source_drops_at_start: Vec<u64>,
    /// The highest correlation id of an API call delivered to this window.
    last_launch: Option<u64>,
    /// The names of the recording threads whose records this window holds (for `thread_name`
    /// rows), and the last one looked up (records come thread by thread).
    threads: HashMap<u32, Option<String>>,
    last_tid: Option<u32>,
    /// What the sources said when the window stopped.
    sources: Option<SourcesSeen>,
    /// The step the window's end cut short (see `Command::Stop`).
    partial_step: Option<u64>,
    /// [`op_args::refused`] when the window started, then (once stopped) the window's own count:
    /// its ops written without their args because the table was full.
    args_refused: u64,
    /// The framework's allocator events (`profile_memory`) are kept whatever the activity set
    /// says: only a window that asked for them has them recorded at all.
    profile_memory: bool,
}

/// What a [`Command::Start`] says of the window it opens.
struct Opened {
    cycle: u32,
    sinks: Option<Box<dyn SinkFactory>>,
    lost: u64,
    framework: crate::framework::FrameworkOptions,
}

/// What a window's trace says of the sources, taken when it stopped.
#[derive(Default)]
struct SourcesSeen {
    names: Vec<String>,
    dropped: Vec<u64>,
    metadata: Vec<(String, String)>,
    devices: Vec<crate::activity::DeviceProperties>,
}

pub(super) struct Collector {
    activities: ActivitySet,
    rank: Option<u32>,
    world_size: Option<u32>,
    metadata: Vec<(String, String)>,
    log: super::LogFn,
    sinks: Box<dyn SinkFactory>,
    on_trace_ready: Option<TraceReadyCallback>,
    /// The open window (warming up or recording).
    window: Option<Window>,
    /// A window that has stopped and waits for its trace to be written (or discarded).
    stopped: Option<Window>,
    /// Records after a stopped window's end, for a window that starts right there.
    carry: Vec<Activity>,
    /// Records drained during warm-up that belong to a recording whose start is queued but not yet
    /// applied.
    early: Vec<Activity>,
    /// Records refused because `carry`/`early` were full.
    held_dropped: u64,
    /// The open window's end when its stop is queued but not yet applied (see `note_queued_stop`).
    queued_stop: Option<UnixNanos>,
    open_begins: HashMap<(u32, u64), (u32, CpuRecord)>,
    /// Per thread, the open `python_function` spans' ids, innermost last: a frame's `Python
    /// parent id` is the one open around it when it begins.
    python_open: HashMap<u32, Vec<u64>>,
    /// Per thread, a framework `[memory]` record waiting for its totals (the next record).
    memory_waiting: HashMap<u32, Activity>,
    /// The `Python parent id` of each open `python_function` span, by (tid, id).
    python_parents: HashMap<(u32, u64), u64>,
    /// Per thread, the `evaluate_function` span that began last, while no other span has begun
    /// after it there (see [`Collector::evaluate_function_rule`]).
    evaluating: HashMap<u32, u64>,
    /// The names of threads that have recorded into a ring, by tid (pruned when large).
    ring_names: HashMap<u32, Option<String>>,
    /// Ring records drained this iteration, not yet converted (reused: no allocation per event).
    drained: Vec<(u32, CpuRecord)>,
    /// Step spans the control side handed over (closed by a thread other than theirs), each with
    /// its thread's tid: drained with the rings.
    handed: Vec<(u32, CpuRecord)>,
    /// Converted records waiting to be routed to a window.
    pending: Vec<Activity>,
    /// Reused buffer for records polled from sources.
    polled: Vec<Activity>,
    clock: TickConverter,
    /// The last round stopped at its drain budget with records left in the rings.
    behind: bool,
    /// The outcome of the last trace (or of a sink that could not open), for on-demand requesters.
    last_result: Option<Result<TraceOutput, String>>,
    done: bool,
    /// The flight recorder's settings and kept records (when the session is one).
    flight: Option<FlightConfig>,
    flight_buffer: Option<FlightBuffer>,
    /// Dumps written (each is a cycle of its own).
    dumps: u32,
    /// The step whose hang was dumped (one dump per stall).
    hang_reported: Option<u64>,
    /// [`recorder::lost_records`] at the last dump.
    flight_lost: u64,
    /// A dump waiting out its after-period.
    flight_pending: Option<flight_dump::FlightJob>,
}

/// What the control side says of a flight recorder at the start of a round: the start of the
/// oldest step of a step span, the last step boundary and the step in progress.
struct FlightNow {
    span_start: Option<Ticks>,
    last_step_at: std::time::Instant,
    step: u64,
}

impl Collector {
    pub fn new(
        config: &SessionConfig,
        sinks: Box<dyn SinkFactory>,
        on_trace_ready: Option<TraceReadyCallback>,
    ) -> Collector {
        Collector {
            activities: config.activities,
            rank: config.rank,
            world_size: config.world_size,
            metadata: config.metadata.clone(),
            log: config.log.clone(),
            sinks,
            on_trace_ready,
            window: None,
            stopped: None,
            carry: Vec::new(),
            early: Vec::new(),
            held_dropped: 0,
            queued_stop: None,
            open_begins: HashMap::new(),
            python_open: HashMap::new(),
            memory_waiting: HashMap::new(),
            python_parents: HashMap::new(),
            evaluating: HashMap::new(),
            ring_names: HashMap::new(),
            drained: Vec::new(),
            handed: Vec::new(),
            pending: Vec::new(),
            polled: Vec::new(),
            clock: TickConverter::new(),
            behind: false,
            last_result: None,
            done: false,
            flight: config.flight,
            flight_buffer: config.flight.map(|f| FlightBuffer::new(f.memory_cap)),
            dumps: 0,
            hang_reported: None,
            flight_lost: recorder::lost_records(),
            flight_pending: None,
        }
    }

    fn log(&self, message: &str) {
        (self.log)(message)
    }

    /// One round of work. Returns `true` once the session has ended (nothing more will come).
    pub fn iteration(&mut self, shared: &Shared) -> bool {
        if self.done {
            return true;
        }
        recorder::collector_woke();
        let (cmds, taken_at, flight_now) = {
            let mut c = lock(&shared.control);
            if c.time_driven() && !c.shutdown {
                let next = c.target_action(c.started.elapsed());
                if next != c.action {
                    c.close_step_span();
                    c.transition(next, shared);
                    c.open_step_span();
                }
                c.settle_request();
            }
            let flight = c.flight.as_ref().map(|f| FlightNow {
                span_start: f.clock.span_start(),
                last_step_at: f.clock.last_step_at,
                step: c.step_num,
            });
            // Taken with the commands: a step handed over before a `Stop` of this batch is drained
            // before that stop is applied.
            self.handed.append(&mut c.handed_steps);
            // Read under the lock: every command not in this batch is stamped later than this.
            (std::mem::take(&mut c.queue), Ticks::now(), flight)
        };
        #[cfg(test)]
        after_taking_commands();
        // A time window that just opened needs its sources (the control side of a step does this
        // itself; here the collector is that control side).
        shared.enable_sources_if_wanted();
        if self.window.is_some() {
            // Spares first: a burst needs them before this round's draining and writing is done.
            recorder::replenish();
        }
        // A window that ends in this round needs every record up to its end.
        let ends = cmds
            .iter()
            .any(|c| matches!(c, Command::Stop { .. } | Command::Shutdown));
        self.drain_rings(if ends { usize::MAX } else { DRAIN_BUDGET });
        let horizon = self.clock.to_unix_covered(taken_at);
        let applied = cmds.len() as u64;
        let cmds: Vec<Command> = cmds.into_iter().collect();
        let mut cmds = cmds.into_iter();
        while let Some(cmd) = cmds.next() {
            if self.flight_pending.is_some()
                && matches!(cmd, Command::Stop { .. } | Command::Shutdown)
            {
                // The recording ends before a dump's after-period has: written now, with what
                // it has.
                let stop = flight_dump::stop_partial(&cmd)
                    .or_else(|| cmds.as_slice().iter().find_map(flight_dump::stop_partial));
                self.flight_write_pending(Some("close"), stop, shared);
            }
            self.apply(cmd, cmds.as_slice(), shared);
        }
        // Records that start after the batch was taken may belong to a window whose commands are
        // queued since (a loaded machine can run several steps between taking the batch and
        // routing): they wait for the next round, which has those commands.
        self.route_pending_before(horizon, shared);
        if self.window.as_ref().is_some_and(|w| w.recording) {
            self.poll_sources(shared);
        }
        if let Some(now) = flight_now {
            self.flight_maintain(&now, shared);
        }
        // Spare rings for bursts, while a window is open; none kept while idle.
        if self.window.is_some() {
            recorder::replenish();
        } else {
            recorder::release_spares();
        }
        if applied > 0 || self.done {
            let mut c = lock(&shared.control);
            c.applied += applied;
            c.collector_done |= self.done;
            drop(c);
            shared.finished.notify_all();
        }
        self.done
    }

    fn apply(&mut self, cmd: Command, rest: &[Command], shared: &Shared) {
        match cmd {
            Command::Prepare { at } => {
                let at = self.time_of(at);
                self.route_pending_before(at, shared);
                if self.window.is_none() {
                    self.window = Some(self.new_window(at, shared));
                }
            }
            Command::Start {
                at,
                cycle,
                sinks,
                lost,
                framework,
            } => {
                let at = self.time_of(at);
                let opened = Opened {
                    cycle,
                    sinks,
                    lost,
                    framework,
                };
                self.start(at, opened, rest, shared)
            }
            Command::Stop {
                at,
                lost,
                partial_step,
            } => {
                let at = self.time_of(at);
                if let Some(w) = self.window.as_mut() {
                    w.ring_drops = lost.saturating_sub(w.ring_drops);
                    w.partial_step = partial_step;
                    w.args_refused = op_args::refused().saturating_sub(w.args_refused);
                }
                self.stop(at, rest, shared)
            }
            Command::TraceReady => self.trace_ready(shared),
            Command::Settle { idle, epoch } => self.settle(idle, epoch, shared),
            Command::Notify { done, fallback } => {
                let result = self.last_result.take().unwrap_or(Err(fallback));
                let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result)));
                if told.is_err() {
                    self.log("a capture's completion callback panicked; continuing");
                }
            }
            Command::ForgetResult => self.last_result = None,
            Command::Dump {
                trigger,
                merged,
                span_start,
                at,
                after,
                sinks,
            } => {
                let job = flight_dump::FlightJob {
                    trigger,
                    merged,
                    wanted: self.flight_span_start(span_start, at),
                    fired: self.clock.to_unix(at),
                    after,
                    sinks,
                };
                let stop = rest.iter().find_map(flight_dump::stop_partial);
                self.flight_begin(job, stop, shared);
            }
            Command::Shutdown => {
                self.route_pending(shared);
                self.done = true;
            }
        }
    }

    fn time_of(&mut self, at: Stamp) -> UnixNanos {
        match at {
            // Covered: the records around this bound, converted in other rounds, compare with it
            // as their ticks do.
            Stamp::Now(t) => self.clock.to_unix_covered(t),
            Stamp::Due(u) => u,
        }
    }

    fn new_window(&self, at: UnixNanos, shared: &Shared) -> Window {
        Window {
            sink: None,
            cycle: 0,
            start: at,
            stop: None,
            recording: false,
            events: 0,
            write_error: None,
            ring_drops: recorder::lost_records(),
            source_drops_at_start: source_drops(shared),
            last_launch: None,
            threads: HashMap::new(),
            last_tid: None,
            sources: None,
            partial_step: None,
            args_refused: op_args::refused(),
            profile_memory: false,
        }
    }

    fn start(&mut self, at: UnixNanos, opened: Opened, rest: &[Command], shared: &Shared) {
        let Opened {
            cycle,
            sinks,
            lost,
            framework,
        } = opened;
        // Warm-up records end here; the ones that start later wait for the recording.
        self.route_pending_before(at, shared);
        let mut window = match self.window.take() {
            Some(w) => w,
            None => self.new_window(at, shared),
        };
        // What the trace can say first (HTA reads the rank from the start of the file; streaming
        // readers take the devices from the head). The sources were enabled before this start
        // was queued, so they know the devices they will record on, if they can know them now.
        let devices = lock(&shared.sources)
            .list
            .iter()
            .flat_map(|s| s.device_properties())
            .collect();
        let info = WindowInfo {
            cycle,
            rank: self.rank,
            world_size: self.world_size,
            pid: std::process::id(),
            host_name: super::host_name(),
            devices,
            framework,
            distributed: lock(&shared.distributed).clone(),
        };
        let opened = match sinks {
            // A flight recorder's window keeps its records in memory; dumps open their own sinks.
            _ if self.flight.is_some() => Err(std::io::Error::other("flight")),
            Some(mut sinks) => sinks.open(&info),
            None => self.sinks.open(&info),
        };
        window.sink = match opened {
            Ok(s) => Some(s),
            Err(_) if self.flight.is_some() => None,
            Err(e) => {
                self.log(&format!(
                    "cannot open the trace output for cycle {cycle}: {e}; this cycle is not recorded"
                ));
                self.last_result = Some(Err(format!("cannot open the trace output: {e}")));
                None
            }
        };
        window.recording = true;
        window.profile_memory = framework.profile_memory;
        window.start = at;
        window.cycle = cycle;
        window.ring_drops = lost;
        window.args_refused = op_args::refused();
        window.source_drops_at_start = source_drops(shared);
        self.window = Some(window);
        self.note_queued_stop(rest, shared);
        let held: Vec<Activity> = self.carry.drain(..).chain(self.early.drain(..)).collect();
        for a in held {
            if a.start >= at {
                self.route(a, shared);
            }
        }
    }

    fn stop(&mut self, at: UnixNanos, rest: &[Command], shared: &Shared) {
        self.route_pending_before(at, shared);
        let Some(w) = self.window.as_mut() else {
            return;
        };
        // The end is fixed first, then everything the sources completed up to now is routed.
        w.stop = Some(at);
        self.queued_stop = None;
        // Idle after this window (the same transition ends in an idle settle, no window opens).
        let idle_after = rest
            .iter()
            .take_while(|c| !matches!(c, Command::Prepare { .. } | Command::Start { .. }))
            .find_map(|c| match c {
                Command::Settle { idle: true, epoch } => Some(*epoch),
                _ => None,
            });
        let (seen, idle) = self.flush_sources(idle_after, shared);
        let Some(mut w) = self.window.take() else {
            return;
        };
        w.sources = Some(seen);
        // Device work launched in this window (by an API call it holds: correlation ids only grow)
        // and running past its end is part of it. Everything else after the end waits for a
        // window that starts later (or goes once the session is idle).
        let mut carry = std::mem::take(&mut self.carry);
        carry.retain(|a| {
            let launched_inside = a
                .correlation
                .is_some_and(|c| w.last_launch.is_some_and(|last| c <= last));
            if !a.activity_type().on_host() && launched_inside {
                deliver(
                    &mut w,
                    self.activities,
                    &self.ring_names,
                    self.flight_buffer.as_mut(),
                    a,
                );
                return false;
            }
            true
        });
        self.carry = carry;
        if idle {
            // Truly idle: no window is pending, so nothing still held can belong to one.
            self.early.clear();
            self.carry.clear();
        }
        if w.recording {
            self.stopped = Some(w);
        } else if let Some(s) = w.sink {
            s.discard();
        }
    }

    fn settle(&mut self, idle: bool, epoch: u64, shared: &Shared) {
        if let Some(w) = self.stopped.take() {
            if let Some(s) = w.sink {
                s.discard();
            }
        }
        if !idle {
            return;
        }
        if let Some(w) = self.window.take() {
            // A warm-up that ended without recording.
            if let Some(s) = w.sink {
                s.discard();
            }
        }
        if self.disable_sources(epoch, shared) {
            // Truly idle: no window is pending, so nothing held can belong to one, and no record
            // still to be written holds an op args id.
            self.early.clear();
            self.carry.clear();
            op_args::reset();
        }
    }

    /// Flushes and disables the sources unless a window has wanted them since `epoch`; what comes
    /// out belongs to no window. Whether the session was idle since `epoch`.
    fn disable_sources(&mut self, epoch: u64, shared: &Shared) -> bool {
        let mut sources = lock(&shared.sources);
        self.disable_locked(&mut sources, epoch, shared, &mut |_| {})
    }

    /// Flushes and disables the (locked) sources unless a window has wanted them since `epoch`
    /// (returns whether it was idle since then). Records go to `emit`: those completed before the
    /// disable, then those the source produced until it stopped (a vendor keeps writing until its
    /// context stops: Kineto stops, then flushes), so a window ending here loses none of them.
    fn disable_locked(
        &mut self,
        sources: &mut super::Sources,
        epoch: u64,
        shared: &Shared,
        emit: &mut dyn FnMut(&Activity),
    ) -> bool {
        {
            let c = lock(&shared.control);
            if c.sources_wanted || c.sources_epoch != epoch {
                return false;
            }
            if !c.sources_enabled {
                return true;
            }
        }
        let super::Sources { list, failed } = sources;
        for (src, failed) in list.iter_mut().zip(failed.iter()) {
            if !*failed {
                src.flush(emit);
                src.disable();
                src.flush(emit);
            }
        }
        lock(&shared.control).sources_enabled = false;
        true
    }

    /// Flushes the sources for the window that is stopping and, under the same lock, takes what
    /// its trace says of them (metadata, devices, drops): a source enabled again for the next
    /// window before this trace is written must not change what it says about this one.
    /// When the session goes idle after this window (`disable`: the epoch of that idle), the
    /// sources are disabled here too, before the trace's view is taken, so it includes how that
    /// went.
    /// Also returns whether the session is idle after it (the sources were disabled).
    fn flush_sources(&mut self, disable: Option<u64>, shared: &Shared) -> (SourcesSeen, bool) {
        let mut polled = std::mem::take(&mut self.polled);
        polled.clear();
        let mut idle = false;
        let seen = {
            let mut sources = lock(&shared.sources);
            let super::Sources { list, failed } = &mut *sources;
            for (src, failed) in list.iter_mut().zip(failed.iter()) {
                if !*failed {
                    src.flush(&mut |a| polled.push(*a));
                }
            }
            if let Some(epoch) = disable {
                // What the sources produce until they stop is this window's too.
                idle = self.disable_locked(&mut sources, epoch, shared, &mut |a| polled.push(*a));
            }
            let super::Sources { list, .. } = &mut *sources;
            SourcesSeen {
                names: list.iter().map(|s| s.name().to_string()).collect(),
                dropped: list.iter().map(|s| s.dropped()).collect(),
                metadata: list.iter().flat_map(|s| s.metadata()).collect(),
                devices: list.iter().flat_map(|s| s.device_properties()).collect(),
            }
        };
        for a in polled.drain(..) {
            self.route(a, shared);
        }
        self.polled = polled;
        (seen, idle)
    }

    /// Looks up the first stop the control side has queued since this round's commands were taken:
    /// the end of the open window, for the records routed before it is applied.
    /// `rest`: the commands of this round still to apply, which come first.
    fn note_queued_stop(&mut self, rest: &[Command], shared: &Shared) {
        let stop_of = |c: &Command| match c {
            Command::Stop { at, .. } => Some(*at),
            _ => None,
        };
        let at = match rest.iter().find_map(stop_of) {
            Some(at) => Some(at),
            None => lock(&shared.control).queue.iter().find_map(stop_of),
        };
        self.queued_stop = at.map(|at| self.time_of(at));
    }

    fn poll_sources(&mut self, shared: &Shared) {
        self.note_queued_stop(&[], shared);
        self.take_from_sources(shared, false);
    }

    /// Takes what the sources (CUPTI, ROCm) have — what they completed (`poll`) or, with `flush`,
    /// everything they hold — and routes it; sources that failed are skipped.
    fn take_from_sources(&mut self, shared: &Shared, flush: bool) {
        let mut polled = std::mem::take(&mut self.polled);
        polled.clear();
        {
            let mut sources = lock(&shared.sources);
            let super::Sources { list, failed } = &mut *sources;
            for (src, failed) in list.iter_mut().zip(failed.iter()) {
                if *failed {
                    continue;
                }
                if flush {
                    src.flush(&mut |a| polled.push(*a));
                } else {
                    src.poll(&mut |a| polled.push(*a));
                }
            }
        }
        for a in polled.drain(..) {
            self.route(a, shared);
        }
        self.polled = polled;
    }

    fn trace_ready(&mut self, shared: &Shared) {
        let Some(w) = self.stopped.take() else {
            return;
        };
        let cycle = w.cycle;
        let Some(sink) = w.sink else {
            return;
        };
        if let Some(e) = &w.write_error {
            self.log(&format!("trace for cycle {cycle} not written: {e}"));
            self.last_result = Some(Err(format!("trace not written: {e}")));
            sink.discard();
            return;
        }
        let mut dropped = vec![("cpu_ring".to_string(), w.ring_drops)];
        if w.args_refused > 0 {
            // Ops written without their args: the args table was full.
            dropped.push(("op_args".to_string(), w.args_refused));
        }
        let seen = w.sources.unwrap_or_default();
        for (i, (name, now)) in seen.names.iter().zip(&seen.dropped).enumerate() {
            let before = w.source_drops_at_start.get(i).copied().unwrap_or(0);
            dropped.push((name.clone(), now.saturating_sub(before)));
        }
        let (mut metadata, devices) = (seen.metadata, seen.devices);
        if self.held_dropped > 0 {
            dropped.push((
                "collector".to_string(),
                std::mem::take(&mut self.held_dropped),
            ));
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
        metadata.extend(self.metadata.iter().cloned());
        if let Some(step) = w.partial_step {
            metadata.push((PARTIAL_STEP_KEY.to_string(), step.to_string()));
        }
        let mut thread_names: Vec<(u32, String)> = w
            .threads
            .iter()
            .map(|(tid, name)| (*tid, name.clone().unwrap_or_default()))
            .collect();
        thread_names.sort();
        let meta = TraceMeta {
            trace_id: trace_id(w.start, cycle),
            host_name: super::host_name(),
            pid: std::process::id(),
            process_name: super::process_name(),
            rank: self.rank,
            world_size: self.world_size,
            devices,
            metadata,
            dropped,
            thread_names,
            window_start: w.start,
            window_end: w.stop.unwrap_or_else(UnixNanos::now),
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
                lock(&shared.control).outputs.push(out);
            }
            Err(e) => {
                self.log(&format!("trace for cycle {cycle} not written: {e}"));
                self.last_result = Some(Err(format!("trace not written: {e}")));
            }
        }
    }

    /// Drains every ring and converts what came out into `pending`.
    fn drain_rings(&mut self, budget: usize) {
        // Both buffers are kept and reused, so draining allocates nothing per event.
        let mut batch = std::mem::take(&mut self.drained);
        batch.clear();
        let mut behind = false;
        {
            if self.ring_names.len() > 4096 {
                self.ring_names.clear();
            }
            let names = &mut self.ring_names;
            let mut reg = recorder::registry();
            // Each thread gets its share of the budget, so one busy thread does not starve the rest.
            let share = (budget / reg.len().max(1)).max(4096);
            reg.retain_mut(|r| {
                let tid = r.tid;
                let (n, finished) = r.drain(share, |rec| batch.push((tid, rec)));
                if n > 0 {
                    names.entry(tid).or_insert_with(|| r.thread_name.clone());
                }
                behind |= n == share;
                !finished
            });
        }
        // Records of another thread's row, as if drained from its ring.
        batch.append(&mut self.handed);
        self.behind = behind;
        // After the drain: every record in `batch` is older than now, so a point taken now makes
        // its conversion an interpolation, which no later point changes (see `cover`).
        self.clock.calibrate();
        let newest = batch.iter().map(|(_, rec)| rec.last_tick()).max();
        if let Some(t) = newest {
            self.clock.cover(t);
        }
        let pid = std::process::id();
        for &(tid, rec) in &batch {
            let activity = match rec {
                CpuRecord::Span {
                    name,
                    annotation,
                    start,
                    end,
                    id,
                } => Some(span_activity(
                    name,
                    annotation,
                    self.clock.to_unix(start),
                    self.clock.to_unix(end),
                    id,
                    pid,
                    tid,
                    OpArgs::NONE,
                )),
                CpuRecord::Begin {
                    id, args, python, ..
                } => {
                    if python {
                        // The parent rides in the pairing table until the end comes.
                        let open = self.python_open.entry(tid).or_default();
                        let parent = open.last().copied().unwrap_or(0);
                        if open.len() < 4096 {
                            open.push(id);
                        }
                        self.open_begins.insert((tid, id), (pid, rec));
                        self.python_parents.insert((tid, id), parent);
                    } else {
                        self.evaluate_function_rule(tid, id, args);
                        self.open_begins.insert((tid, id), (pid, rec));
                    }
                    None
                }
                CpuRecord::End { end, id } => match self.open_begins.remove(&(tid, id)) {
                    Some((
                        pid,
                        CpuRecord::Begin {
                            name,
                            annotation,
                            python,
                            start,
                            id,
                            args,
                        },
                    )) => {
                        let start = self.clock.to_unix(start);
                        let end = self.clock.to_unix(end);
                        if python {
                            if let Some(open) = self.python_open.get_mut(&tid) {
                                if let Some(at) = open.iter().rposition(|o| *o == id) {
                                    open.remove(at);
                                }
                            }
                            let parent = self.python_parents.remove(&(tid, id)).unwrap_or(0);
                            Some(python_activity(
                                name, start, end, id, parent, pid, tid, args,
                            ))
                        } else {
                            Some(span_activity(
                                name, annotation, start, end, id, pid, tid, args,
                            ))
                        }
                    }
                    _ => None,
                },
                CpuRecord::Memory {
                    at,
                    address,
                    bytes,
                    device,
                } => {
                    let a =
                        memory_activity(self.clock.to_unix(at), address, bytes, device, pid, tid);
                    // One left waiting lost its totals (the ring was full): it goes without.
                    self.memory_waiting.insert(tid, a)
                }
                CpuRecord::HostMemory {
                    at,
                    address,
                    bytes,
                    allocated_hi,
                    allocated_lo,
                } => {
                    let mut a =
                        memory_activity(self.clock.to_unix(at), address, bytes, -1, pid, tid);
                    if let Detail::Memory(m) = &mut a.detail {
                        m.total_allocated =
                            Some(u64::from(allocated_hi) << 32 | u64::from(allocated_lo));
                        // c10's host allocator reserves nothing (HostMemory is written only then).
                        m.total_reserved = Some(0);
                    }
                    Some(a)
                }
                CpuRecord::MemoryTotals {
                    allocated,
                    reserved,
                } => self.memory_waiting.remove(&tid).map(|mut a| {
                    if let Detail::Memory(m) = &mut a.detail {
                        m.total_allocated = Some(allocated);
                        m.total_reserved = Some(reserved);
                    }
                    a
                }),
            };
            if let Some(a) = activity {
                self.pending.push(a);
            }
        }
        self.drained = batch;
        // Bound the pairing table: begins whose end never came (a span left open forever).
        if self.open_begins.len() > 65_536 {
            self.open_begins.clear();
        }
        if self.evaluating.len() > 4096 {
            self.evaluating.clear();
        }
        if self.python_parents.len() > 65_536 || self.python_open.len() > 4096 {
            self.python_parents.clear();
            self.python_open.clear();
        }
        // Records wait for their totals across rounds (a drain may stop between the two); one
        // whose totals were lost to a full ring goes out without them when the next one comes.
        if self.memory_waiting.len() > 4096 {
            self.memory_waiting.clear();
        }
    }

    /// torch.profiler's rule for autograd's `evaluate_function` ranges, which PyTorch records
    /// without a sequence number: one whose next span begun on the same thread is a backward
    /// function takes that function's sequence number (so it reads like torch.profiler's and
    /// `fwdbwd` tools see it). Called with every span's begin, in the order the thread recorded
    /// them; costs one emptiness check unless an `evaluate_function` just began.
    fn evaluate_function_rule(&mut self, tid: u32, id: u64, args: OpArgs) {
        if !self.evaluating.is_empty() {
            if let Some(evaluate) = self.evaluating.remove(&tid) {
                let sequence = args.sequence();
                if args.role() == AutogradRole::BackwardFunction && sequence.is_some() {
                    if let Some((_, CpuRecord::Begin { args: a, .. })) =
                        self.open_begins.get_mut(&(tid, evaluate))
                    {
                        *a = a.with_sequence(sequence);
                    }
                }
            }
        }
        if args.role() == AutogradRole::EvaluateFunction {
            self.evaluating.insert(tid, id);
        }
    }

    /// Routes every pending (drained, host) record.
    fn route_pending(&mut self, shared: &Shared) {
        self.route_pending_before(UnixNanos(u64::MAX), shared);
    }

    /// Routes the pending records that start before `at`, in the order they were drained; later
    /// ones stay pending. `at` is the moment a command changes the windows (one batch of commands
    /// may open and close several), or the end of what this round's commands cover. Writing a
    /// large batch takes a while: spare rings are topped up along the way, so a burst still going
    /// on does not run out of them.
    fn route_pending_before(&mut self, at: UnixNanos, shared: &Shared) {
        let mut pending = std::mem::take(&mut self.pending);
        let mut routed = 0usize;
        pending.retain(|a| {
            if a.start >= at {
                return true;
            }
            routed += 1;
            if routed % (1 << 14) == 0 && self.window.is_some() {
                recorder::replenish();
            }
            self.route(*a, shared);
            false
        });
        self.pending = pending;
    }

    /// Puts one record where its time stamp says it belongs (see the module docs).
    fn route(&mut self, a: Activity, shared: &Shared) {
        let Some(w) = self.window.as_mut() else {
            return;
        };
        if !w.recording {
            // Warm-up: only a recording whose start is queued but not applied yet wants it.
            let from = shared.recording_from.load(Ordering::Acquire);
            if from != u64::MAX && a.start >= self.clock.to_unix_covered(Ticks(from)) {
                hold(&mut self.early, &mut self.held_dropped, a);
            }
            return;
        }
        if a.start < w.start {
            return;
        }
        // The end the collector has applied, else the one queued for it (a collector behind the
        // job polls device work of later steps, even of later windows, before it applies the end).
        let until = w.stop.or(self.queued_stop).unwrap_or(UnixNanos(u64::MAX));
        if a.start >= until {
            hold(&mut self.carry, &mut self.held_dropped, a);
            return;
        }
        deliver(
            w,
            self.activities,
            &self.ring_names,
            self.flight_buffer.as_mut(),
            &a,
        );
    }
}

fn hold(v: &mut Vec<Activity>, dropped: &mut u64, a: Activity) {
    if v.len() < MAX_HELD {
        v.push(a);
    } else {
        *dropped += 1;
    }
}

/// Hands one record to the window's sink if its type is wanted.
fn deliver(
    w: &mut Window,
    activities: ActivitySet,
    ring_names: &HashMap<u32, Option<String>>,
    flight: Option<&mut FlightBuffer>,
    a: &Activity,
) {
    let framework_memory = w.profile_memory && matches!(a.detail, Detail::Memory(_));
    if !(activities.contains(a.activity_type()) || framework_memory) || w.write_error.is_some() {
        return;
    }
    if let Some(tid) = a.thread().filter(|t| w.last_tid != Some(*t)) {
        w.last_tid = Some(tid);
        if let Some(name) = ring_names.get(&tid) {
            // Once per thread and window: the name for its `thread_name` row.
            w.threads.entry(tid).or_insert_with(|| name.clone());
        }
    }
    if let Some(kept) = flight {
        // A flight recorder keeps it (no sink: dumps are written from the buffer).
        kept.push(*a);
        w.events += 1;
        return;
    }
    let Some(sink) = w.sink.as_mut() else {
        return;
    };
    match sink.record(a) {
        Ok(()) => w.events += 1,
        Err(e) => w.write_error = Some(e.to_string()),
    }
    if matches!(a.detail, Detail::Runtime(_) | Detail::Driver(_)) {
        w.last_launch = w.last_launch.max(a.correlation);
    }
}

fn source_drops(shared: &Shared) -> Vec<u64> {
    lock(&shared.sources)
        .list
        .iter()
        .map(|s| s.dropped())
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn span_activity(
    name: crate::intern::NameId,
    annotation: bool,
    start: UnixNanos,
    end: UnixNanos,
    id: u64,
    pid: u32,
    tid: u32,
    args: OpArgs,
) -> Activity {
    let span = CpuSpan {
        name,
        pid,
        tid,
        args,
    };
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

#[allow(clippy::too_many_arguments)]
fn python_activity(
    name: crate::intern::NameId,
    start: UnixNanos,
    end: UnixNanos,
    id: u64,
    parent: u64,
    pid: u32,
    tid: u32,
    args: OpArgs,
) -> Activity {
    Activity {
        start,
        end,
        correlation: None,
        external_id: Some(id),
        detail: Detail::PythonFunction(crate::activity::PythonSpan {
            span: CpuSpan {
                name,
                pid,
                tid,
                args,
            },
            parent: (parent != 0).then_some(parent),
        }),
    }
}

/// A framework allocator's event (its totals are filled in from the record after it).
fn memory_activity(
    at: UnixNanos,
    address: u64,
    bytes: i64,
    device: i16,
    pid: u32,
    tid: u32,
) -> Activity {
    Activity {
        start: at,
        end: at,
        correlation: None,
        external_id: None,
        detail: Detail::Memory(crate::activity::Memory {
            op: if bytes < 0 {
                crate::activity::MemoryOp::Free
            } else {
                crate::activity::MemoryOp::Alloc
            },
            device: u32::try_from(device).ok(),
            address,
            bytes: bytes.unsigned_abs(),
            total_allocated: None,
            total_reserved: None,
            pid,
            tid,
        }),
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
