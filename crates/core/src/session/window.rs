//! Carrying out the schedule's commands: opening, filling, finishing and discarding a window.

use std::collections::HashMap;

use super::*;
use crate::activity::{Activity, CpuSpan, Detail};
use crate::intern::intern;
use crate::schedule::{commands, SessionCommand};
use crate::source::{TraceMeta, WindowInfo};

impl State {
    pub(super) fn transition(&mut self, next: ProfilerAction) {
        let prev = self.action;
        self.action = next;
        if prev != next || matches!(prev, ProfilerAction::RecordAndSave) {
            let cmds = commands(prev, next);
            self.run(cmds);
        }
        self.discard_open_windows();
    }

    pub(super) fn run(&mut self, cmds: &[SessionCommand]) {
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

    pub(super) fn ring_drops_total(&self) -> u64 {
        self.retired_ring_drops
            + recorder::refused_pushes()
            + recorder::registry()
                .iter()
                .map(|r| r.reader.dropped())
                .sum::<u64>()
    }

    pub(super) fn prepare(&mut self) {
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

    pub(super) fn start_recording(&mut self) {
        if self.window.is_none() {
            self.prepare();
        }
        // Warm-up events end here.
        self.collect(true);
        let cycle = self.cycle;
        // What the trace can say first (HTA reads the rank from the start of the file).
        let info = WindowInfo {
            cycle,
            rank: self.config.rank,
            world_size: self.config.world_size,
            pid: std::process::id(),
            host_name: host_name(),
        };
        let opened = match self.request.as_mut().and_then(|r| r.sinks.as_mut()) {
            Some(sinks) => sinks.open(&info),
            None => self.sinks.open(&info),
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

    pub(super) fn stop_recording(&mut self) {
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

    pub(super) fn trace_ready(&mut self) {
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

    pub(super) fn discard_open_windows(&mut self) {
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
    pub(super) fn collect(&mut self, discard: bool) {
        // Both buffers are kept in the state and reused, so draining allocates nothing per event.
        let mut batch = std::mem::take(&mut self.drained);
        batch.clear();
        {
            let recording = self.window.as_ref().is_some_and(|w| w.recording) && !discard;
            let threads = self.window.as_mut().map(|w| &mut w.threads);
            let mut threads = threads.filter(|_| recording);
            let mut reg = recorder::registry();
            let mut retired = 0;
            reg.retain_mut(|r| {
                let tid = r.tid;
                let (n, finished) = r.reader.drain_final(|rec| batch.push((tid, rec)));
                if n > 0 {
                    if let Some(t) = threads.as_mut() {
                        // Once per thread and window: the name for its `thread_name` row.
                        t.entry(tid).or_insert_with(|| r.thread_name.clone());
                    }
                }
                if finished {
                    retired += r.reader.dropped();
                }
                !finished
            });
            self.retired_ring_drops += retired;
        }
        // After the drain: every record in `batch` is older than this point, so its conversion
        // interpolates between points and never extrapolates.
        self.clock.calibrate();
        if !discard {
            let mut polled = std::mem::take(&mut self.polled);
            polled.clear();
            for (i, src) in self.sources.iter_mut().enumerate() {
                if !self.source_failed[i] {
                    src.poll(&mut |a| polled.push(*a));
                }
            }
            for a in &polled {
                self.deliver(a);
            }
            self.polled = polled;
        }
        let pid = std::process::id();
        for &(tid, rec) in &batch {
            let activity = match rec {
                CpuRecord::Complete(a) => Some(a),
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
                )),
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
                    )) => Some(span_activity(
                        name,
                        annotation,
                        self.clock.to_unix(start),
                        self.clock.to_unix(end),
                        id,
                        pid,
                        tid,
                    )),
                    _ => None,
                },
            };
            if let (Some(a), false) = (activity, discard) {
                self.deliver(&a);
            }
        }
        self.drained = batch;
        // Bound the pairing table: begins whose end never came (a span left open forever).
        if self.open_begins.len() > 65_536 {
            self.open_begins.clear();
        }
    }

    /// Hands one record to the open sink if it belongs to the recording window.
    pub(super) fn deliver(&mut self, a: &Activity) -> bool {
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

    pub(super) fn open_step_span(&mut self) {
        if self.action == ProfilerAction::None || self.shutdown || !self.record_steps {
            return;
        }
        let id = recorder::next_span_id();
        self.step_span = Some(StepSpan {
            id,
            previous_external_id: recorder::push_external_id(id),
            start: crate::clock::Ticks::now(),
            step: self.step_num,
        });
    }

    pub(super) fn close_step_span(&mut self) {
        let Some(s) = self.step_span.take() else {
            return;
        };
        recorder::restore_external_id(s.previous_external_id);
        let name = intern(&format!("ProfilerStep#{}", s.step));
        // The same clock as the spans inside the step, so they nest exactly.
        recorder::push(CpuRecord::Span {
            name,
            annotation: true,
            start: s.start,
            end: crate::clock::Ticks::now(),
            id: s.id,
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
