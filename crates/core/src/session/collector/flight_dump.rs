//! The collector's side of a flight recorder: dropping what falls out of the span each round, the
//! hang check, and writing a dump (a normal trace of the kept span, through the session's sinks).

use std::collections::HashSet;
use std::time::Duration;

use super::{lock, trace_id, Collector, Command, FlightNow, Shared};
use crate::activity::Detail;
use crate::clock::UnixNanos;
use crate::flight::{is_collective_or_sync, FlightSpan, FlightTrigger};
use crate::intern::NameTable;
use crate::recorder::{self, CpuRecord};
use crate::source::{SinkFactory, TraceMeta, WindowInfo};

/// A dump whose trigger has fired: written at once, or once its after-period has passed (the
/// collector goes on recording meanwhile), or at once when the recording ends first.
pub(super) struct FlightJob {
    pub trigger: FlightTrigger,
    /// Triggers folded into it.
    pub merged: u64,
    /// Where the span started when the trigger fired.
    pub wanted: UnixNanos,
    /// When the trigger fired.
    pub fired: UnixNanos,
    /// How long after `fired` the dump goes on recording.
    pub after: Duration,
    /// A requester's own sinks, instead of the session's.
    pub sinks: Option<Box<dyn SinkFactory>>,
}

impl FlightJob {
    /// When its after-period ends.
    fn until(&self) -> UnixNanos {
        after_end(self.fired, self.after)
    }
}

fn after_end(fired: UnixNanos, after: Duration) -> UnixNanos {
    let after = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
    UnixNanos(fired.0.saturating_add(after))
}

/// The partial step of a `Stop` command (the recording ending cuts the step in progress).
pub(super) fn stop_partial(c: &Command) -> Option<u64> {
    match c {
        Command::Stop { partial_step, .. } => *partial_step,
        _ => None,
    }
}

impl Collector {
    /// Where the span starts as of `at`: `at` minus a time span, or the start of the oldest step
    /// of a step span (`span_start`; everything kept while fewer steps have been seen).
    pub(super) fn flight_span_start(
        &self,
        span_start: Option<crate::clock::Ticks>,
        at: crate::clock::Ticks,
    ) -> UnixNanos {
        let Some(f) = self.flight else {
            return UnixNanos(0);
        };
        match f.span {
            FlightSpan::Time(d) => {
                UnixNanos(self.clock.to_unix(at).0.saturating_sub(d.as_nanos() as u64))
            }
            FlightSpan::Steps(_) => span_start.map_or(UnixNanos(0), |t| self.clock.to_unix(t)),
        }
    }

    /// Once a round: drops the chunks older than the span, writes a dump whose after-period has
    /// passed, and dumps on a hang (no step for the configured time while a collective or a sync
    /// has been open that long on some thread), once per stall.
    pub(super) fn flight_maintain(&mut self, now: &FlightNow, shared: &Shared) {
        let mut cutoff = self.flight_span_start(now.span_start, crate::clock::Ticks::now());
        if let Some(p) = &self.flight_pending {
            // A dump waiting out its after-period keeps the span as it stood at its trigger.
            cutoff = cutoff.min(p.wanted);
        }
        if let Some(b) = self.flight_buffer.as_mut() {
            b.evict_before(cutoff);
        }
        if self
            .flight_pending
            .as_ref()
            .is_some_and(|p| UnixNanos::now() >= p.until())
        {
            self.flight_write_pending(None, None, shared);
        }
        let Some(after) = self.flight.and_then(|f| f.hang_after) else {
            return;
        };
        let stalled = now.last_step_at.elapsed();
        if stalled < after || self.hang_reported == Some(now.step) {
            return;
        }
        let Some((op, tid, open_ns)) = self.open_collective() else {
            return;
        };
        if u128::from(open_ns) < after.as_nanos() {
            // Open for less than the stall time: a rank that was late for other reasons (it
            // stopped before the collective, its peers waiting in it) and whose collective is
            // now going through is no hang.
            return;
        }
        self.hang_reported = Some(now.step);
        let trigger = FlightTrigger::Hang {
            op,
            tid,
            open_ns,
            stalled_ns: stalled.as_nanos() as u64,
            step: now.step,
        };
        // Marked queued on the control side, so a trigger that comes meanwhile joins this dump.
        let merged = {
            let mut c = lock(&shared.control);
            match c.flight.as_mut() {
                Some(f) if !f.dump_queued => {
                    f.dump_queued = true;
                    std::mem::take(&mut f.merged)
                }
                // One is queued already: it is written this round or the next, and covers this.
                _ => return,
            }
        };
        let at = crate::clock::Ticks::now();
        let job = FlightJob {
            trigger,
            merged,
            wanted: self.flight_span_start(now.span_start, at),
            fired: self.clock.to_unix(at),
            after: self.flight.map_or(Duration::ZERO, |f| f.after),
            sinks: None,
        };
        self.flight_begin(job, None, shared);
    }

    /// A trigger fired: the dump is written now, or, with an after-period, kept pending until it
    /// has passed (the queued mark stays set meanwhile, so later triggers join it).
    pub(super) fn flight_begin(
        &mut self,
        job: FlightJob,
        stop_in_rest: Option<u64>,
        shared: &Shared,
    ) {
        if let Some(cut) = self.flight_pending.as_ref().map(|_| job.trigger.kind()) {
            // Only the process ending comes while one waits: the waiting one is written first,
            // cut short, so nothing it holds is lost.
            self.flight_write_pending(Some(cut), stop_in_rest, shared);
        }
        if job.after.is_zero() {
            self.flight_dump(job, None, stop_in_rest, shared);
            Self::flight_dump_done(shared);
        } else {
            self.flight_pending = Some(job);
        }
    }

    /// Writes the dump waiting out its after-period: when the period has passed (`cut` `None`),
    /// or now because the recording ends (`cut` says by what: `close`, `exit`, `exception`).
    pub(super) fn flight_write_pending(
        &mut self,
        cut: Option<&str>,
        stop_in_rest: Option<u64>,
        shared: &Shared,
    ) {
        let Some(job) = self.flight_pending.take() else {
            return;
        };
        self.flight_dump(job, cut, stop_in_rest, shared);
        Self::flight_dump_done(shared);
    }

    /// The dump is written (or failed): the next trigger gets a dump of its own.
    fn flight_dump_done(shared: &Shared) {
        if let Some(f) = lock(&shared.control).flight.as_mut() {
            f.dump_queued = false;
        }
    }

    /// The oldest collective or sync open now (its name, thread and how long it has been open):
    /// an op open in the rings, or a blocking device wait in progress (a CUDA synchronize call,
    /// [`crate::waits`]), which no op may name.
    fn open_collective(&self) -> Option<(String, u32, u64)> {
        let names = NameTable::snapshot();
        let now = UnixNanos::now();
        let ops = self
            .open_begins
            .iter()
            .filter_map(|(&(tid, _), (_, rec))| match rec {
                CpuRecord::Begin { name, start, .. } => {
                    let n = names.get(*name);
                    is_collective_or_sync(&n).then(|| (n.into_owned(), tid, *start))
                }
                _ => None,
            });
        let waits = crate::waits::open()
            .map(|(tid, name, since)| (names.get(name).into_owned(), tid, since));
        ops.chain(waits)
            .min_by_key(|(_, _, start)| start.0)
            .map(|(n, tid, start)| (n, tid, now.saturating_sub(self.clock.to_unix(start))))
    }

    /// Writes a dump of the kept span: what the rings and sources hold now is taken in first.
    /// It ends now, or at the end of its after-period if that has passed and nothing `cut` it
    /// short. `stop_in_rest`: the partial step of a close queued in this round after the dump
    /// (it ends the step in progress: its `ProfilerStep` is then in the rings, partial).
    fn flight_dump(
        &mut self,
        job: FlightJob,
        cut: Option<&str>,
        stop_in_rest: Option<u64>,
        shared: &Shared,
    ) {
        let Some(config) = self.flight else {
            return;
        };
        let FlightJob {
            trigger,
            merged,
            wanted,
            fired,
            after,
            sinks,
        } = job;
        let trigger = &trigger;
        // The step in progress, read before the rings are drained: if it ends meanwhile, its
        // record is in the rings (and written instead of the partial one below).
        // Taken with the steps handed over (closed on another thread), which are drained as
        // the rings are: one closed after this is in neither.
        let in_progress = {
            let mut c = lock(&shared.control);
            self.handed.append(&mut c.handed_steps);
            c.step_span.as_ref().map(|s| (s.id, s.start, s.step, s.tid))
        };
        // Everything recorded up to now (a flight recorder has no window edges to respect): what
        // the job did since this round began is part of the span too.
        self.drain_rings(usize::MAX);
        self.route_pending(shared);
        if self.window.as_ref().is_some_and(|w| w.recording) {
            // Forced out, as at a window's end: device work done so far belongs in the dump.
            self.take_from_sources(shared, true);
        }
        // A close queued by now (the process ending) ended the step in progress: its record, in
        // the rings (or handed over) already, is partial.
        let closed_partial =
            stop_in_rest.or_else(|| lock(&shared.control).queue.iter().find_map(stop_partial));
        // With an after-period that has run its course, the dump ends where the period does;
        // cut short (or with none), it ends now.
        let end = match cut {
            None if !after.is_zero() => after_end(fired, after).min(UnixNanos::now()),
            _ => UnixNanos::now(),
        };
        let cycle = self.dumps;
        self.dumps += 1;
        let devices: Vec<_> = lock(&shared.sources)
            .list
            .iter()
            .flat_map(|s| s.device_properties())
            .collect();
        let info = WindowInfo {
            cycle,
            rank: self.rank,
            world_size: self.world_size,
            pid: std::process::id(),
            host_name: super::super::host_name(),
            devices: devices.clone(),
            framework: lock(&shared.control).framework_now(),
            distributed: lock(&shared.distributed).clone(),
        };
        let Some(buffer) = self.flight_buffer.as_mut() else {
            return;
        };
        let complete_from = buffer.complete_from();
        let cap_evicted = buffer.take_cap_evicted();
        let from = wanted.max(complete_from);
        let reason = trigger.describe();
        let opened = match sinks {
            Some(mut own) => own.open(&info),
            None => self.sinks.open(&info),
        };
        let mut sink = match opened {
            Ok(s) => s,
            Err(e) => {
                (self.log)(&format!("flight dump ({reason}) not written: {e}"));
                self.last_result = Some(Err(format!("cannot open the trace output: {e}")));
                return;
            }
        };
        let names = NameTable::snapshot();
        let (mut first_step, mut last_step) = (None::<u64>, None::<u64>);
        let mut tids = HashSet::new();
        let mut events = 0u64;
        let mut error = None;
        let mut in_progress_ended = false;
        // The step that ran past the end of an after-period: written up to it, partial.
        let mut cut_step = None;
        for a in buffer
            .records()
            .filter(|a| a.start >= from && a.start <= end)
        {
            let mut a = *a;
            if let Detail::UserAnnotation(s) = &a.detail {
                in_progress_ended |= in_progress.is_some_and(|(id, ..)| a.external_id == Some(id));
                let n = names.get(s.name);
                if let Some(step) = n
                    .strip_prefix("ProfilerStep#")
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    first_step = Some(first_step.map_or(step, |f| f.min(step)));
                    last_step = Some(last_step.map_or(step, |l| l.max(step)));
                    if a.end > end {
                        a.end = end;
                        cut_step = Some(step);
                    }
                }
            }
            if let Some(t) = a.thread() {
                tids.insert(t);
            }
            if let Err(e) = sink.record(&a) {
                error = Some(e);
                break;
            }
            events += 1;
        }
        // The step in progress has no `ProfilerStep` record yet (it is written when the step
        // ends): the dump shows it up to now, marked partial as a capture cut short is.
        // Or the close that follows ended it, writing it (partial) into the rings already.
        // One that began after the end of an after-period is not in the dump at all.
        let in_progress = in_progress
            .filter(|&(_, start, ..)| !in_progress_ended && self.clock.to_unix(start) <= end);
        let mut partial = cut_step.or(closed_partial.filter(|_| in_progress.is_none()));
        if let (None, Some((id, start, step, tid))) = (&error, in_progress) {
            let a = super::span_activity(
                crate::intern::NameId::step(step),
                true,
                self.clock.to_unix(start).max(from),
                end,
                id,
                info.pid,
                tid,
                crate::activity::OpArgs::NONE,
            );
            match sink.record(&a) {
                Ok(()) => {
                    events += 1;
                    partial = Some(step);
                    tids.insert(tid);
                    first_step = Some(first_step.map_or(step, |f| f.min(step)));
                    last_step = Some(last_step.map_or(step, |l| l.max(step)));
                }
                Err(e) => error = Some(e),
            }
        }
        if let Some(e) = error {
            (self.log)(&format!("flight dump ({reason}) not written: {e}"));
            self.last_result = Some(Err(format!("trace not written: {e}")));
            sink.discard();
            return;
        }
        let lost_now = recorder::lost_records();
        let ring_lost = lost_now.saturating_sub(std::mem::replace(&mut self.flight_lost, lost_now));
        let kv = |k: &str, v: String| (k.to_string(), v);
        let mut metadata = vec![
            kv("flight_trigger", trigger.kind().to_string()),
            kv("flight_reason", reason.clone()),
            kv("flight_span", config.span.to_string()),
            kv("flight_memory_cap", config.memory_cap.to_string()),
            kv("flight_start_ns", from.0.to_string()),
            kv("flight_end_ns", end.0.to_string()),
            kv("flight_wanted_start_ns", wanted.0.to_string()),
            kv("flight_cap_bound", (complete_from > wanted).to_string()),
            kv("flight_cap_evicted", cap_evicted.to_string()),
            kv("flight_merged_triggers", merged.to_string()),
            kv("flight_trigger_ns", fired.0.to_string()),
            kv("flight_after_ns", after.as_nanos().to_string()),
        ];
        if let Some(cut) = cut {
            metadata.push(kv("flight_after_cut_by", cut.to_string()));
        }
        if let (Some(f), Some(l)) = (first_step, last_step) {
            metadata.push(kv("flight_first_step", f.to_string()));
            metadata.push(kv("flight_last_step", l.to_string()));
        }
        if let Some(step) = partial {
            metadata.push(kv(crate::source::PARTIAL_STEP_KEY, step.to_string()));
        }
        metadata.extend(trigger.metadata());
        metadata.extend(self.metadata.iter().cloned());
        let mut thread_names: Vec<(u32, String)> = tids
            .into_iter()
            .filter_map(|t| Some((t, self.ring_names.get(&t)?.clone().unwrap_or_default())))
            .collect();
        thread_names.sort();
        let meta = TraceMeta {
            trace_id: trace_id(from, cycle),
            host_name: info.host_name.clone(),
            pid: info.pid,
            process_name: super::super::process_name(),
            rank: self.rank,
            world_size: self.world_size,
            devices,
            metadata,
            dropped: vec![
                ("cpu_ring".to_string(), ring_lost),
                ("flight_cap".to_string(), cap_evicted),
            ],
            thread_names,
            window_start: from,
            window_end: end,
            cycle,
        };
        match sink.finish(&meta) {
            Ok(out) => {
                let shown = out
                    .path
                    .as_ref()
                    .map_or_else(|| "a trace".to_string(), |p| p.display().to_string());
                (self.log)(&format!(
                    "flight dump ({reason}): {events} events in {shown}"
                ));
                if let Some(cb) = self.on_trace_ready.as_mut() {
                    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(&out)));
                    if res.is_err() {
                        (self.log)("the on_trace_ready callback panicked; continuing");
                    }
                }
                self.last_result = Some(Ok(out.clone()));
                lock(&shared.control).outputs.push(out);
            }
            Err(e) => {
                (self.log)(&format!("flight dump ({reason}) not written: {e}"));
                self.last_result = Some(Err(format!("trace not written: {e}")));
            }
        }
    }
}
