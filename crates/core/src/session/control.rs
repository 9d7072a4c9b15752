//! The control side: the schedule's state, the on-demand request and the step span, held for
//! microseconds by `step()` and friends. Transitions become [`Command`]s for the collector, stamped
//! with the time they happened.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{
    CaptureDone, CapturePlan, LogFn, SessionConfig, Shared, SinkFactory, TraceOutput, Trigger,
};
use crate::activity::ActivitySet;
use crate::clock::{Ticks, UnixNanos};
use crate::framework::{FrameworkOptions, FrameworkOverrides};
use crate::intern::NameId;
use crate::recorder::{self, CpuRecord};
use crate::schedule::TimeWindow;
use crate::schedule::{commands, commands_on_exit, ProfilerAction, Schedule, SessionCommand};

/// Work for the collector, in the order it must happen.
pub(super) enum Command {
    /// A window opens (warm-up): records before `at` are not part of it. Times are on the recording
    /// clock, so the collector converts them exactly as it converts the records they bound.
    Prepare { at: Stamp },
    /// Keep records from `at` on, in a trace of cycle `cycle` written by `sinks` (the request's) or
    /// the session's own.
    Start {
        at: Stamp,
        cycle: u32,
        sinks: Option<Box<dyn SinkFactory>>,
        /// [`recorder::lost_records`] at `at`.
        lost: u64,
        /// What the framework recorders have on in this window.
        framework: FrameworkOptions,
    },
    /// The window ends at `at`: host records after it are not part of it.
    Stop {
        at: Stamp,
        /// [`recorder::lost_records`] at `at`.
        lost: u64,
        /// The step this end cut short (its `ProfilerStep` ended here, not at a step boundary):
        /// the trace says so (`kinetrace_partial_step`), so analyses leave it out of step
        /// statistics.
        partial_step: Option<u64>,
    },
    /// Write the stopped window's trace.
    TraceReady,
    /// After every transition: a stopped window not made ready is discarded; when `idle`, an open
    /// warm-up is discarded and the sources are flushed and disabled, unless a window has wanted
    /// them since (`epoch` is [`Control::sources_epoch`] when this was queued).
    Settle { idle: bool, epoch: u64 },
    /// Tell an on-demand requester the outcome: the last trace written since the request, or
    /// `fallback`.
    Notify { done: CaptureDone, fallback: String },
    /// A new request begins: forget the outcome of earlier windows.
    ForgetResult,
    /// Write a flight dump of the kept span now (`merged`: triggers that came while the previous
    /// dump was queued and were folded into it).
    Dump {
        trigger: crate::flight::FlightTrigger,
        merged: u64,
        /// The span as it stood when the trigger fired: the dump covers it and what followed
        /// until the collector wrote it (a busy collector must not let the slow step slide out).
        span_start: Option<Ticks>,
        at: Ticks,
        /// How long the dump goes on recording after `at` before it is written (zero: at once).
        after: std::time::Duration,
        /// Where it goes, instead of the session's own sinks (a requester's file).
        sinks: Option<Box<dyn SinkFactory>>,
    },
    /// The session ends after everything queued before this.
    Shutdown,
}

/// The control side of a flight recorder: the step history and whether a dump is queued.
pub(super) struct FlightControl {
    pub clock: crate::flight::StepClock,
    /// A dump is queued or being written (cleared by the collector when it is written).
    pub dump_queued: bool,
    /// Triggers that came while a dump was queued (said in the next dump's head).
    pub merged: u64,
    /// The after-period of the dumps that wait for one ([`crate::flight::FlightConfig::after`]).
    pub after: std::time::Duration,
}

/// When a command happened.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stamp {
    /// Now, on the recording clock (so the collector converts it exactly as the records).
    Now(Ticks),
    /// The moment a time window's bound was due; the collector, which drives time windows, notices
    /// it a little later, and records are assigned by when it was due.
    Due(UnixNanos),
}

pub(super) enum RequestKind {
    Steps(Schedule),
    Time(TimeWindow, Instant),
}

pub(super) struct ActiveRequest {
    pub kind: RequestKind,
    pub plan: CapturePlan,
    pub sinks: Option<Box<dyn SinkFactory>>,
    pub on_done: Option<CaptureDone>,
    pub framework: FrameworkOverrides,
}

pub(super) struct StepSpan {
    pub id: u64,
    previous_external_id: u64,
    pub start: Ticks,
    pub step: u64,
    /// The thread whose row it goes on: the one that drives the steps (the last to call `step()`,
    /// else the one that started the session). A flight dump writes the step in progress there, and a close
    /// from another thread hands it to the collector for that row (see [`Control::handed_steps`]).
    pub tid: u32,
    /// The thread whose external id `open_step_span` set (only that thread's is restored).
    pushed_on: u32,
}

/// Step spans kept for the collector at most (they come one per cross-thread close: a capture's
/// end, the session's close; beyond this they are dropped).
const MAX_HANDED_STEPS: usize = 64;

pub(super) struct Control {
    pub trigger: Trigger,
    pub activities: ActivitySet,
    /// The session's own framework options (a request may change them for its capture).
    pub framework: FrameworkOptions,
    pub log: LogFn,
    pub action: ProfilerAction,
    pub step_num: u64,
    /// The cycle the next trace belongs to.
    pub cycle: u32,
    /// Whether steps get `ProfilerStep#N` annotations: from the start with a schedule (as torch does
    /// when given one), otherwise from the first `step()` call on.
    pub record_steps: bool,
    pub step_span: Option<StepSpan>,
    /// The thread that last called `step()` (before any, the one that started the session): the
    /// step spans go on its row.
    pub step_tid: u32,
    /// Step spans closed by a thread other than theirs (the process's exit thread, a signal's, a
    /// close or a capture's end from another thread), with the tid of the row they belong on:
    /// the collector drains them with the rings (a ring is its own thread's row).
    pub handed_steps: Vec<(u32, CpuRecord)>,
    /// The step an ending capture cuts short, for its `Stop` (see [`Command::Stop`]).
    pub partial_step: Option<u64>,
    pub started: Instant,
    pub shutdown: bool,
    /// The on-demand capture pending or in progress.
    pub request: Option<ActiveRequest>,
    /// Set by `step_aside`: nothing is recorded any more.
    pub stepped_aside: Option<String>,
    /// Traces written (the collector appends).
    pub outputs: Vec<TraceOutput>,
    /// Work for the collector, and how many commands were ever queued and applied (so a caller
    /// can wait until what it queued is done).
    pub queue: VecDeque<Command>,
    pub queued: u64,
    pub applied: u64,
    /// Whether a window needs the sources now, and whether they are enabled.
    pub sources_wanted: bool,
    /// Counts the windows that wanted the sources: a queued disable is stale once it has moved on.
    pub sources_epoch: u64,
    /// The epoch whose window the sources were last enabled for.
    pub enabled_epoch: u64,
    pub sources_enabled: bool,
    /// The collector has processed the shutdown.
    pub collector_done: bool,
    /// The flight recorder's control side, when the session is one.
    pub flight: Option<FlightControl>,
}

impl Control {
    pub fn new(config: &SessionConfig) -> Control {
        Control {
            trigger: config.trigger,
            activities: config.activities,
            framework: config.framework,
            log: config.log.clone(),
            action: ProfilerAction::None,
            step_num: config.first_step,
            cycle: 0,
            record_steps: matches!(config.trigger, Trigger::Schedule(_)) || config.flight.is_some(),
            step_span: None,
            step_tid: recorder::current_tid(),
            handed_steps: Vec::new(),
            partial_step: None,
            started: Instant::now(),
            shutdown: false,
            request: None,
            stepped_aside: None,
            outputs: Vec::new(),
            queue: VecDeque::new(),
            queued: 0,
            applied: 0,
            sources_wanted: false,
            sources_epoch: 0,
            enabled_epoch: 0,
            sources_enabled: false,
            collector_done: false,
            flight: config.flight.as_ref().map(|f| FlightControl {
                clock: crate::flight::StepClock::new(f),
                dump_queued: false,
                merged: 0,
                after: f.after,
            }),
        }
    }

    /// Queues a flight dump, unless one is queued already (then this trigger is folded into it
    /// and counted: a burst of triggers writes one dump, not one each). The process ending is
    /// always queued.
    pub fn queue_dump(
        &mut self,
        trigger: crate::flight::FlightTrigger,
        sinks: Option<Box<dyn SinkFactory>>,
    ) -> Result<(), super::FlightRefused> {
        if self.shutdown {
            return Err(super::FlightRefused::Stopped);
        }
        let Some(f) = self.flight.as_mut() else {
            return Err(super::FlightRefused::NotFlight);
        };
        // The process ending (a signal, an exception) is the last chance for a dump: it never
        // joins one queued before, which may hold none of what led to the end.
        let ending = trigger.is_ending();
        if f.dump_queued && !ending {
            f.merged += 1;
            return Err(super::FlightRefused::Busy);
        }
        f.dump_queued = true;
        let merged = std::mem::take(&mut f.merged);
        let span_start = f.clock.span_start();
        // The process ending writes at once; so does a dump into a requester's own file (a
        // dynolog request asked for what already happened, and is answered as before).
        let after = if ending || sinks.is_some() {
            std::time::Duration::ZERO
        } else {
            f.after
        };
        self.push(Command::Dump {
            trigger,
            merged,
            span_start,
            at: Ticks::now(),
            after,
            sinks,
        });
        Ok(())
    }

    pub fn log(&self, message: &str) {
        (self.log)(message)
    }

    /// Queues work for the collector.
    pub fn push(&mut self, cmd: Command) {
        self.queue.push_back(cmd);
        self.queued += 1;
    }

    /// The framework options in force now: the request's while one is pending or recording
    /// (its window is the only one that can open then), else the session's.
    pub fn framework_now(&self) -> FrameworkOptions {
        match &self.request {
            Some(r) => r.framework.apply(self.framework),
            None => self.framework,
        }
    }

    pub fn target_action(&self, elapsed: Duration) -> ProfilerAction {
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
        match self.trigger {
            Trigger::Always => ProfilerAction::Record,
            Trigger::Schedule(s) => s.action(self.step_num),
            Trigger::TimeWindow(w) => w.action_at(elapsed),
            Trigger::OnDemand => ProfilerAction::None,
        }
    }

    /// Whether `step()` moves the action: a step request, or a schedule when no request is active.
    pub fn step_driven(&self) -> bool {
        match &self.request {
            Some(r) => matches!(r.kind, RequestKind::Steps(_)),
            None => matches!(self.trigger, Trigger::Schedule(_)),
        }
    }

    /// Whether the collector moves the action as time passes.
    pub fn time_driven(&self) -> bool {
        match &self.request {
            Some(r) => matches!(r.kind, RequestKind::Time(..)),
            None => matches!(self.trigger, Trigger::TimeWindow(_)),
        }
    }

    /// Moves to `next`, queueing what the schedule's commands ask for.
    pub fn transition(&mut self, next: ProfilerAction, shared: &Shared) {
        let prev = self.action;
        self.action = next;
        if prev != next || matches!(prev, ProfilerAction::RecordAndSave) {
            self.run(commands(prev, next), shared);
        }
        self.settle(shared);
    }

    fn run(&mut self, cmds: &[SessionCommand], shared: &Shared) {
        for cmd in cmds {
            match cmd {
                SessionCommand::Prepare => {
                    self.sources_wanted = self.stepped_aside.is_none();
                    self.sources_epoch += 1;
                    shared.recording_from.store(u64::MAX, Ordering::Release);
                    recorder::set_active(true);
                    let at = self.stamp(SessionCommand::Prepare);
                    self.push(Command::Prepare { at });
                }
                SessionCommand::Start => {
                    let at = self.stamp(SessionCommand::Start);
                    let now = Ticks::now();
                    shared.recording_from.store(now.0, Ordering::Release);
                    let sinks = self.request.as_mut().and_then(|r| r.sinks.take());
                    let framework = self.framework_now();
                    self.push(Command::Start {
                        at,
                        cycle: self.cycle,
                        sinks,
                        lost: recorder::lost_records(),
                        framework,
                    });
                }
                SessionCommand::Stop => {
                    recorder::set_active(false);
                    let at = self.stamp(SessionCommand::Stop);
                    let partial_step = self.partial_step.take();
                    self.push(Command::Stop {
                        at,
                        lost: recorder::lost_records(),
                        partial_step,
                    });
                }
                SessionCommand::TraceReady => {
                    self.push(Command::TraceReady);
                    self.cycle += 1;
                }
                SessionCommand::Warn(m) => self.log(m),
            }
        }
    }

    fn settle(&mut self, shared: &Shared) {
        let idle = self.action == ProfilerAction::None;
        if idle {
            recorder::set_active(false);
            self.sources_wanted = false;
            shared.recording_from.store(u64::MAX, Ordering::Release);
        }
        self.push(Command::Settle {
            idle,
            epoch: self.sources_epoch,
        });
    }

    /// When `cmd` happens: for a time window's bounds, when they were due (if that has passed);
    /// otherwise now.
    fn stamp(&self, cmd: SessionCommand) -> Stamp {
        let window = match &self.request {
            Some(ActiveRequest {
                kind: RequestKind::Time(w, t0),
                ..
            }) => Some((*w, *t0)),
            Some(_) => None,
            None => match self.trigger {
                Trigger::TimeWindow(w) => Some((w, self.started)),
                _ => None,
            },
        };
        let due = window.and_then(|(w, t0)| match cmd {
            SessionCommand::Prepare => t0.checked_add(w.delay.saturating_sub(w.warmup)),
            SessionCommand::Start => t0.checked_add(w.delay),
            SessionCommand::Stop => w.end().and_then(|end| t0.checked_add(end)),
            _ => None,
        });
        match due.filter(|t| *t <= Instant::now()) {
            Some(t) => Stamp::Due(UnixNanos::from_instant(t)),
            None => Stamp::Now(Ticks::now()),
        }
    }

    /// Ends the on-demand capture once its window has passed, telling the requester the outcome.
    pub fn settle_request(&mut self) {
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

    /// At close: a time window whose start is due but that the collector (which drives time
    /// windows) has not started yet, starved by a busy machine, starts now, with the bounds it was
    /// due at (see `stamp`), so closing saves it as it would have been recorded.
    fn catch_up_on_a_time_window(&mut self, shared: &Shared) {
        if self.stepped_aside.is_some() || self.action == ProfilerAction::RecordAndSave {
            return;
        }
        let due = match &self.request {
            Some(ActiveRequest {
                kind: RequestKind::Time(w, t0),
                ..
            }) => t0.elapsed() >= w.delay,
            Some(_) => false,
            // The session's own time window, if it has not been written yet.
            None => match self.trigger {
                Trigger::TimeWindow(w) => self.cycle == 0 && self.started.elapsed() >= w.delay,
                _ => false,
            },
        };
        if due {
            self.transition(ProfilerAction::RecordAndSave, shared);
        }
    }

    /// Ends a capture in progress now (saving it; a warm-up is discarded) and goes idle.
    pub fn end_capture(&mut self, shared: &Shared) {
        // The step in progress ends here, not at a step boundary: its trace marks it partial.
        self.partial_step = self.step_span.as_ref().map(|s| s.step);
        self.close_step_span();
        let exit = commands_on_exit(self.action);
        self.run(exit, shared);
        self.partial_step = None;
        self.action = ProfilerAction::None;
        self.settle(shared);
    }

    /// Shuts the session down (idempotent): saves a capture in progress, tells a pending request,
    /// and queues the collector's end.
    pub fn close(&mut self, shared: &Shared) {
        if self.shutdown {
            return;
        }
        self.shutdown = true;
        self.catch_up_on_a_time_window(shared);
        self.end_capture(shared);
        self.finish_request("the profiler stopped before the capture recorded anything");
        self.push(Command::Shutdown);
    }

    /// Ends the pending request: the collector tells it the last trace written, or `fallback`.
    pub fn finish_request(&mut self, fallback: &str) {
        if let Some(r) = self.request.take() {
            if let Some(done) = r.on_done {
                self.push(Command::Notify {
                    done,
                    fallback: fallback.to_string(),
                });
            }
        }
    }

    pub fn open_step_span(&mut self) {
        if self.action == ProfilerAction::None || self.shutdown || !self.record_steps {
            return;
        }
        let id = recorder::next_span_id();
        let start = Ticks::now();
        let me = recorder::current_tid();
        self.step_span = Some(StepSpan {
            id,
            previous_external_id: recorder::push_external_id(id),
            start,
            step: self.step_num,
            tid: self.step_tid,
            pushed_on: me,
        });
        if let Some(f) = self.flight.as_mut() {
            f.clock.step_began(start);
        }
    }

    /// `step()` is called on this thread: the steps go on its row, the open one included.
    pub fn stepping_on(&mut self, tid: u32) {
        self.step_tid = tid;
        if let Some(s) = self.step_span.as_mut() {
            s.tid = tid;
        }
    }

    pub fn close_step_span(&mut self) {
        let Some(s) = self.step_span.take() else {
            return;
        };
        let me = recorder::current_tid();
        if me == s.pushed_on {
            recorder::restore_external_id(s.previous_external_id);
        }
        // The same clock as the spans inside the step, so they nest exactly.
        let span = CpuRecord::Span {
            name: NameId::step(s.step),
            annotation: true,
            start: s.start,
            end: Ticks::now(),
            id: s.id,
        };
        if me == s.tid {
            recorder::push(span);
        } else if self.handed_steps.len() < MAX_HANDED_STEPS {
            // Closed from another thread: this thread's ring would put it on this thread's row.
            self.handed_steps.push((s.tid, span));
        }
    }
}
