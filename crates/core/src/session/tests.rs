//! Session behaviour driven through recording sinks.

use super::*;
use crate::activity::{Activity, Detail};
use crate::recorder::CpuRecord;
use crate::source::Sink;
use crate::source::TraceMeta;
use std::sync::mpsc;

/// Sessions are process-wide: these tests take turns (and wait for other modules' sessions).
pub(super) static TURN: Mutex<()> = Mutex::new(());

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

/// Starts a session made by `make`, waiting its turn while another test's is still ending (the
/// recorder is process-wide). Also the flight tests'.
pub(super) fn start_session(make: impl Fn() -> (SessionConfig, Box<dyn SinkFactory>)) -> Session {
    loop {
        let (config, sinks) = make();
        match Session::start(config, Vec::new(), sinks, None) {
            Ok(s) => return s,
            Err(SessionError::AlreadyRunning) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// A session's config with no log, on `trigger`.
fn quiet(trigger: Trigger) -> SessionConfig {
    SessionConfig {
        trigger,
        log: Arc::new(|_| {}),
        ..SessionConfig::default()
    }
}

fn start(trigger: Trigger, first_step: u64, out: &Traces) -> Session {
    start_session(|| {
        let config = SessionConfig {
            first_step,
            ..quiet(trigger)
        };
        (config, sinks(out))
    })
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
    let result = done
        .recv_timeout(Duration::from_secs(30))
        .expect("told when the capture ended");
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
        done.recv_timeout(Duration::from_secs(30)).unwrap().is_ok(),
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

/// Counts the spans named `name` a window receives, and reports the window's ring drops.
struct CountSink {
    name: crate::intern::NameId,
    seen: u64,
    out: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Sink for CountSink {
    fn record(&mut self, a: &Activity) -> std::io::Result<()> {
        if let Detail::UserAnnotation(span) = &a.detail {
            if span.name == self.name {
                self.seen += 1;
            }
        }
        Ok(())
    }
    fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
        let dropped = meta
            .dropped
            .iter()
            .find(|(k, _)| k == "cpu_ring")
            .map(|(_, n)| *n)
            .unwrap_or(0);
        self.out.lock().unwrap().push((self.seen, dropped));
        Ok(TraceOutput {
            path: None,
            events: self.seen,
            cycle: meta.cycle,
        })
    }
}

/// Threads that record and exit while the collector drains: every span is either in the trace or
/// counted as dropped, including the last ones a thread pushes just before it exits (the collector
/// must not retire a ring between draining it and seeing its writer gone).
#[test]
fn spans_of_exiting_threads_are_written_or_counted() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    const ROUNDS: usize = if cfg!(miri) { 2 } else { 400 };
    const THREADS: usize = 8;
    const SPANS: usize = 40;
    let name = crate::intern::intern("exiting_thread_span");
    let out: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let out2 = out.clone();
    let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
        Ok(Box::new(CountSink {
            name,
            seen: 0,
            out: out2.clone(),
        }))
    });
    let config = SessionConfig {
        trigger: Trigger::Always,
        // Small rings and a busy collector: drops and retirements race with the pushes.
        ring_capacity: 16,
        collect_interval: Duration::from_micros(200),
        log: Arc::new(|_| {}),
        ..SessionConfig::default()
    };
    let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
    for _ in 0..ROUNDS {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..SPANS {
                        let _span = crate::recorder::SpanGuard::enter(name, true);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    session.stop();
    let got = out.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let (seen, dropped) = got[0];
    assert_eq!(
        seen + dropped,
        (ROUNDS * THREADS * SPANS) as u64,
        "{seen} written + {dropped} dropped"
    );
}

/// A push made while the same thread is already pushing (what a signal handler interrupting a push
/// does) is refused rather than deadlocking, and counted with the ring drops.
#[test]
fn a_push_inside_a_push_is_refused_and_counted() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let before = crate::recorder::refused_pushes();
    let record = |id| CpuRecord::End {
        end: crate::clock::Ticks(1),
        id,
    };
    let inner = std::thread::spawn(move || {
        let mut inner_ok = None;
        let outer_ok = crate::recorder::push_with(|_, _| {
            inner_ok = Some(crate::recorder::push(record(2)));
            record(1)
        });
        (outer_ok, inner_ok)
    })
    .join()
    .unwrap();
    assert_eq!(inner, (true, Some(false)));
    assert_eq!(crate::recorder::refused_pushes() - before, 1);
}

/// A burst larger than a thread's ring goes on in spare rings the collector prepared (no drop, no
/// allocation on the recording thread); a memory bound too small for them makes it drop and count.
#[test]
fn a_burst_goes_on_in_spare_rings_within_the_memory_bound() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let name = crate::intern::intern("burst_span");
    // Without spares, 100,000 spans at full speed overrun a 64-slot ring whatever the collector does.
    for (cap, spans, expect_drops) in [(usize::MAX, 300u64, false), (0, 100_000, true)] {
        let out: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let out2 = out.clone();
        let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
            Ok(Box::new(CountSink {
                name,
                seen: 0,
                out: out2.clone(),
            }))
        });
        let config = SessionConfig {
            trigger: Trigger::Always,
            ring_capacity: 64,
            ring_memory_cap: cap,
            // The collector only prepares spares; it does not drain during the burst.
            collect_interval: Duration::from_secs(3600),
            log: Arc::new(|_| {}),
            ..SessionConfig::default()
        };
        let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
        if !expect_drops {
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while crate::recorder::spare_rings() < 4 {
                assert!(std::time::Instant::now() < end, "no spare rings were made");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // 64 in the thread's own ring and 4 × 64 in spares: 300 fit without a drain.
        std::thread::spawn(move || {
            for _ in 0..spans {
                let _span = crate::recorder::SpanGuard::enter(name, true);
            }
        })
        .join()
        .unwrap();
        session.stop();
        let (seen, dropped) = out.lock().unwrap()[0];
        assert_eq!(seen + dropped, spans, "{seen} written + {dropped} dropped");
        assert_eq!(
            dropped > 0,
            expect_drops,
            "{seen} written + {dropped} dropped"
        );
    }
}

/// A sink (or source) that panics on the collector thread stops recording; it never leaves a
/// caller of `close`/`stop` waiting forever, and says so once.
#[test]
fn a_panic_on_the_collector_releases_everyone_waiting_for_it() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    struct PanickingSink;
    impl Sink for PanickingSink {
        fn record(&mut self, _: &Activity) -> std::io::Result<()> {
            panic!("a sink bug");
        }
        fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
            Ok(TraceOutput {
                path: None,
                events: 0,
                cycle: meta.cycle,
            })
        }
    }
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let l2 = lines.clone();
    let config = SessionConfig {
        trigger: Trigger::Always,
        log: Arc::new(move |m| l2.lock().unwrap().push(m.to_string())),
        ..SessionConfig::default()
    };
    let sinks =
        Box::new(|_cycle: u32| -> std::io::Result<Box<dyn Sink>> { Ok(Box::new(PanickingSink)) });
    let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
    {
        let _span = crate::recorder::SpanGuard::enter(crate::intern::intern("doomed"), true);
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let closed = session.close();
        let stopped = session.stop();
        let _ = tx.send((closed.len(), stopped.len()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("close and stop returned");
    assert_eq!(got, (0, 0));
    let lines = lines.lock().unwrap();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("the collector stopped"))
            .count(),
        1,
        "{lines:?}"
    );
}

/// A time window's bounds are when they were due, not when the collector (which drives time
/// windows) noticed them: a collector that wakes long after the window's end still closes it at
/// its end.
#[test]
fn a_time_window_ends_when_it_was_due_however_late_the_collector_notices() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let name = crate::intern::intern("timed_span");
    let out: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let out2 = out.clone();
    let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
        Ok(Box::new(CountSink {
            name,
            seen: 0,
            out: out2.clone(),
        }))
    });
    let window = TimeWindow::new(Duration::ZERO, Duration::from_millis(30)).unwrap();
    let config = SessionConfig {
        trigger: Trigger::TimeWindow(window),
        // The collector looks long after the window's end.
        collect_interval: Duration::from_millis(400),
        log: Arc::new(|_| {}),
        ..SessionConfig::default()
    };
    let started = std::time::Instant::now();
    let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
    // One span a millisecond for 200 ms: recording stays on until the collector notices the end.
    let mut spans = 0u64;
    while started.elapsed() < Duration::from_millis(200) {
        let _span = crate::recorder::SpanGuard::enter(name, true);
        spans += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    session.stop();
    let (seen, _) = out.lock().unwrap()[0];
    // About 30 spans started in the 30 ms window (fewer on a slow machine, never more than the
    // window can hold); before, the window ran until the collector woke.
    assert!(
        seen > 0 && seen <= 31,
        "{seen} of {spans} spans in a 30 ms window"
    );
}

/// A collector preempted after taking its commands, while the job runs a whole window of steps, still
/// puts every step in the window's trace. Before, the steps drained in that round were routed with
/// that round's (older) commands, found no window, and were lost: CI saw a schedule window's trace
/// without its `ProfilerStep`s on a loaded machine.
#[test]
fn a_collector_that_lags_a_whole_window_behind_the_job_loses_no_step() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Traces::default();
    let mut schedule = crate::schedule::Schedule::new(1, 1, 2).unwrap();
    schedule.repeat = 1;
    let session = start(Trigger::Schedule(schedule), 0, &out);
    // Hold the collector in its next round, right after it took the (empty) command queue.
    let (paused_tx, paused) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let mut armed = true;
    *super::collector::AFTER_TAKING_COMMANDS.lock().unwrap() = Some(Box::new(move || {
        if std::mem::take(&mut armed) {
            let _ = paused_tx.send(());
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
    }));
    paused
        .recv_timeout(Duration::from_secs(30))
        .expect("the collector ran a round");
    // The whole window (warm-up at step 1, recording at steps 2 and 3) while it is held.
    for _ in 0..5 {
        session.step();
    }
    release.send(()).unwrap();
    let outputs = session.stop();
    *super::collector::AFTER_TAKING_COMMANDS.lock().unwrap() = None;
    assert_eq!(outputs.len(), 1);
    assert_eq!(*out.lock().unwrap(), vec![steps(&[2, 3])]);
}

/// Device work polled by a collector that is a whole cycle behind the job goes to the window it ran
/// in, not to the first window still open on the collector's side: the end that window gets is its
/// own queued stop, never a later window's (CI once saw a 2-step window with the kernels of 6 steps).
#[test]
fn device_work_of_later_windows_stays_out_of_a_lagging_collectors_window() {
    use crate::activity::{ActivitySet, Kernel};
    use crate::source::{ActivitySource, SourceError};
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    type Done = Arc<Mutex<Vec<Activity>>>;
    struct Device(Done);
    impl ActivitySource for Device {
        fn name(&self) -> &str {
            "device"
        }
        fn enable(&mut self, _: ActivitySet) -> Result<(), SourceError> {
            Ok(())
        }
        fn poll(&mut self, emit: &mut dyn FnMut(&Activity)) {
            for a in self.0.lock().unwrap().drain(..) {
                emit(&a);
            }
        }
        fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) {
            self.poll(emit)
        }
    }
    // Kernel names per trace.
    struct KernelSink {
        kernels: Vec<String>,
        out: Traces,
    }
    impl Sink for KernelSink {
        fn record(&mut self, a: &Activity) -> std::io::Result<()> {
            if let Detail::Kernel(k) = &a.detail {
                self.kernels
                    .push(crate::intern::resolve(k.name).to_string());
            }
            Ok(())
        }
        fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
            self.out.lock().unwrap().push(self.kernels);
            Ok(TraceOutput {
                path: None,
                events: 0,
                cycle: meta.cycle,
            })
        }
    }
    let done = Done::default();
    let out = Traces::default();
    let o2 = out.clone();
    let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
        Ok(Box::new(KernelSink {
            kernels: Vec::new(),
            out: o2.clone(),
        }))
    });
    let mut schedule = crate::schedule::Schedule::new(1, 1, 2).unwrap();
    schedule.repeat = 2;
    let config = SessionConfig {
        trigger: Trigger::Schedule(schedule),
        log: Arc::new(|_| {}),
        ..SessionConfig::default()
    };
    let session = Session::start(config, vec![Box::new(Device(done.clone()))], sinks, None)
        .expect("tests take turns");
    let kernel = |step: u64| {
        let now = crate::clock::UnixNanos::now();
        done.lock().unwrap().push(Activity {
            start: now,
            end: crate::clock::UnixNanos(now.0 + 1_000),
            correlation: None,
            external_id: None,
            detail: Detail::Kernel(Kernel {
                name: crate::intern::intern(&format!("step{step}")),
                device: 0,
                context: None,
                stream: 7,
                grid: None,
                block: None,
                registers_per_thread: None,
                shared_memory: None,
                queued: None,
                graph_id: None,
                kind_arg: false,
                graph_node_id: None,
            }),
        });
        std::thread::sleep(Duration::from_millis(1));
    };
    // Steps 0 (wait) and 1 (warm-up), then the first window records from step 2 on.
    for step in 0..2 {
        kernel(step);
        session.step();
    }
    // Once the collector has applied that start, hold it in its next round, right after it took
    // its commands, while the job runs through the rest of both cycles.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let c = lock(&session.shared.control);
        if c.applied == c.queued {
            break;
        }
        drop(c);
        assert!(
            std::time::Instant::now() < deadline,
            "the collector never caught up"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (paused_tx, paused) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let mut armed = true;
    *super::collector::AFTER_TAKING_COMMANDS.lock().unwrap() = Some(Box::new(move || {
        if std::mem::take(&mut armed) {
            let _ = paused_tx.send(());
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
    }));
    paused
        .recv_timeout(Duration::from_secs(30))
        .expect("the collector ran a round");
    for step in 2..9 {
        kernel(step);
        session.step();
    }
    release.send(()).unwrap();
    session.stop();
    *super::collector::AFTER_TAKING_COMMANDS.lock().unwrap() = None;
    let got = out.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            vec!["step2".to_string(), "step3".to_string()],
            vec!["step6".to_string(), "step7".to_string()]
        ]
    );
}

/// Autograd's `evaluate_function` spans take the sequence number of the backward function that
/// begins right after them on their thread, as torch.profiler gives them; one followed by
/// anything else (an op a hook runs first) keeps none.
#[test]
fn evaluate_function_spans_take_their_backward_functions_sequence_number() {
    use crate::activity::{AutogradRole, OpArgs};
    use crate::clock::Ticks;
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    type Seen = Arc<Mutex<Vec<(String, Option<u64>)>>>;
    let out: Seen = Arc::default();
    struct SeqSink(Seen);
    impl Sink for SeqSink {
        fn record(&mut self, a: &Activity) -> std::io::Result<()> {
            if let Detail::CpuOp(s) = &a.detail {
                let name = crate::intern::resolve(s.name).to_string();
                self.0.lock().unwrap().push((name, s.args.sequence()));
            }
            Ok(())
        }
        fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
            Ok(TraceOutput {
                path: None,
                events: 0,
                cycle: meta.cycle,
            })
        }
    }
    let out2 = out.clone();
    let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
        Ok(Box::new(SeqSink(out2.clone())))
    });
    let config = SessionConfig {
        log: Arc::new(|_| {}),
        ..SessionConfig::default()
    };
    let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
    let begin = |name: &str, id: u64, args: OpArgs| {
        assert!(recorder::push(CpuRecord::Begin {
            name: crate::intern::intern(name),
            annotation: false,
            python: false,
            start: Ticks::now(),
            id,
            args,
        }));
    };
    let end = |id: u64| {
        assert!(recorder::push(CpuRecord::End {
            end: Ticks::now(),
            id
        }))
    };
    let evaluate = OpArgs::NONE.with_role(AutogradRole::EvaluateFunction);
    let backward = |seq| OpArgs::new(None, Some(seq)).with_role(AutogradRole::BackwardFunction);
    // evaluate_function: AddmmBackward0 → AddmmBackward0 (seq 25) → aten::mm
    begin(
        "autograd::engine::evaluate_function: AddmmBackward0",
        9001,
        evaluate,
    );
    begin("AddmmBackward0", 9002, backward(25));
    begin("aten::mm", 9003, OpArgs::NONE);
    end(9003);
    end(9002);
    end(9001);
    // A hook's op first (a forward op with its own number): the evaluate_function keeps none.
    begin(
        "autograd::engine::evaluate_function: ReluBackward0",
        9004,
        evaluate,
    );
    begin("aten::mul", 9005, OpArgs::new(None, Some(3)));
    end(9005);
    begin("ReluBackward0", 9006, backward(23));
    end(9006);
    end(9004);
    session.stop();
    let mut got = out.lock().unwrap().clone();
    got.sort();
    let want = |n: &str, s: Option<u64>| (n.to_string(), s);
    let mut expected = vec![
        want(
            "autograd::engine::evaluate_function: AddmmBackward0",
            Some(25),
        ),
        want("AddmmBackward0", Some(25)),
        want("aten::mm", None),
        want("autograd::engine::evaluate_function: ReluBackward0", None),
        want("aten::mul", Some(3)),
        want("ReluBackward0", Some(23)),
    ];
    expected.sort();
    assert_eq!(got, expected);
}

/// A capture request's framework options are the ones in force while it is pending or recording,
/// and its trace's head gets them; before and after, the session's own. The job's distributed
/// info reaches the heads of windows that open after it was given.
#[test]
fn a_requests_framework_options_hold_for_its_window_only() {
    use crate::framework::{DistributedInfo, FrameworkOptions, FrameworkOverrides};
    use crate::source::WindowInfo;
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let opened: Arc<Mutex<Vec<WindowInfo>>> = Arc::default();
    struct Opens(Arc<Mutex<Vec<WindowInfo>>>, Traces);
    impl SinkFactory for Opens {
        fn open(&mut self, w: &WindowInfo) -> std::io::Result<Box<dyn Sink>> {
            self.0.lock().unwrap().push(w.clone());
            Ok(Box::new(StepSink {
                steps: Vec::new(),
                out: self.1.clone(),
            }))
        }
    }
    let own = FrameworkOptions {
        record_shapes: true,
        ..Default::default()
    };
    let out = Traces::default();
    let session = start_session(|| {
        let config = SessionConfig {
            framework: own,
            ..quiet(Trigger::OnDemand)
        };
        (config, Box::new(Opens(opened.clone(), out.clone())))
    });
    assert_eq!(session.framework_options(), own);
    session.set_distributed_info(Some(DistributedInfo {
        backend: Some("gloo".into()),
        rank: 1,
        world_size: Some(2),
        ..Default::default()
    }));
    let mut req = CaptureRequest::new(CaptureStart::NextStep, CaptureLength::Steps(1));
    req.framework = FrameworkOverrides {
        record_shapes: Some(false),
        with_stack: Some(true),
        ..Default::default()
    };
    let (req, done) = with_done(req);
    session.request_capture(req).unwrap();
    let asked = FrameworkOptions {
        record_shapes: false,
        with_stack: true,
        profile_memory: false,
    };
    assert_eq!(session.framework_options(), asked, "pending");
    session.step();
    assert_eq!(session.framework_options(), asked, "recording");
    session.step();
    done.recv_timeout(Duration::from_secs(30))
        .expect("told when the capture ended")
        .unwrap();
    assert_eq!(session.framework_options(), own, "after");
    drop(session);
    let opened = opened.lock().unwrap();
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].framework, asked);
    let info = opened[0]
        .distributed
        .as_deref()
        .expect("the job's distributed info");
    assert_eq!((info.rank, info.backend.as_deref()), (1, Some("gloo")));
}

/// Ops whose args the full table refused are counted in the trace's `dropped_events.op_args`.
#[test]
fn args_the_full_table_refused_are_counted_in_the_trace() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dropped: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    struct Meta(Arc<Mutex<Vec<(String, u64)>>>);
    impl Sink for Meta {
        fn record(&mut self, _: &Activity) -> std::io::Result<()> {
            Ok(())
        }
        fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
            *self.0.lock().unwrap() = meta.dropped.clone();
            Ok(TraceOutput {
                path: None,
                events: 0,
                cycle: meta.cycle,
            })
        }
    }
    let d2 = dropped.clone();
    let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
        Ok(Box::new(Meta(d2.clone())))
    });
    let config = SessionConfig {
        log: Arc::new(|_| {}),
        ..SessionConfig::default()
    };
    let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
    let huge = "x".repeat(crate::op_args::MAX_ARGS_BYTES + 1);
    assert_eq!(crate::op_args::intern(&huge), None);
    session.stop();
    let dropped = dropped.lock().unwrap();
    let n = dropped
        .iter()
        .find(|(k, _)| k == "op_args")
        .map(|(_, n)| *n);
    // Other tests may refuse texts at the same time: at least this one.
    assert!(n.is_some_and(|n| n >= 1), "{dropped:?}");
}

/// Keeps each trace's `kinetrace_partial_step` metadata.
struct PartialSink {
    out: Arc<Mutex<Vec<Option<String>>>>,
}

impl Sink for PartialSink {
    fn record(&mut self, _: &Activity) -> std::io::Result<()> {
        Ok(())
    }
    fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
        let partial = meta
            .metadata
            .iter()
            .find(|(k, _)| k == crate::source::PARTIAL_STEP_KEY)
            .map(|(_, v)| v.clone());
        self.out.lock().unwrap().push(partial);
        Ok(TraceOutput {
            path: None,
            events: 0,
            cycle: meta.cycle,
        })
    }
}

/// A capture that ends at a step boundary has no partial step; one that the end of the session
/// cuts (exit, a signal) names the step it cut, whose `ProfilerStep` ran to that end.
#[test]
fn a_capture_cut_by_the_end_of_the_session_names_its_partial_step() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let factory = {
        let out = out.clone();
        Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
            Ok(Box::new(PartialSink { out: out.clone() }))
        })
    };
    let session = start_session(|| (quiet(Trigger::OnDemand), factory.clone()));
    let (req, done) = with_done(CaptureRequest::new(
        CaptureStart::Now,
        CaptureLength::Steps(2),
    ));
    session.request_capture(req).unwrap();
    session.step();
    session.step();
    assert!(done.recv_timeout(Duration::from_secs(60)).unwrap().is_ok());
    session
        .request_capture(CaptureRequest::new(
            CaptureStart::Now,
            CaptureLength::Steps(10),
        ))
        .unwrap();
    session.step();
    session.step();
    session.close();
    // Steps 0 and 1 whole; then steps 2, 3 and the cut 4.
    assert_eq!(*out.lock().unwrap(), vec![None, Some("4".to_string())]);
}

/// Python frame spans get the `Python parent id` of the frame span open around them on their
/// thread (none for the outermost), and a framework `[memory]` record takes the totals record
/// that follows it; both reach the trace only in a window that asked for allocator events.
#[test]
fn python_frames_get_their_parents_and_allocator_events_their_totals() {
    use crate::activity::{MemoryOp, OpArgs};
    use crate::clock::Ticks;
    use crate::framework::FrameworkOptions;
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    type Seen = Arc<Mutex<Vec<Activity>>>;
    struct All(Seen);
    impl Sink for All {
        fn record(&mut self, a: &Activity) -> std::io::Result<()> {
            self.0.lock().unwrap().push(*a);
            Ok(())
        }
        fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
            Ok(TraceOutput {
                path: None,
                events: 0,
                cycle: meta.cycle,
            })
        }
    }
    let run = |profile_memory: bool| -> Vec<Activity> {
        let out: Seen = Arc::default();
        let out2 = out.clone();
        let sinks = Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
            Ok(Box::new(All(out2.clone())))
        });
        let config = SessionConfig {
            framework: FrameworkOptions {
                profile_memory,
                with_stack: true,
                ..Default::default()
            },
            log: Arc::new(|_| {}),
            ..SessionConfig::default()
        };
        let session = Session::start(config, Vec::new(), sinks, None).expect("tests take turns");
        let begin = |name: &str, id: u64, python: bool| {
            assert!(recorder::push(CpuRecord::Begin {
                name: crate::intern::intern(name),
                annotation: false,
                python,
                start: Ticks::now(),
                id,
                args: OpArgs::NONE,
            }));
        };
        let end = |id: u64| {
            assert!(recorder::push(CpuRecord::End {
                end: Ticks::now(),
                id
            }))
        };
        // <module> → train → aten::mm (an op between frames is no frame's parent) → forward.
        begin("guide.py(1): <module>", 7001, true);
        begin("guide.py(17): train", 7002, true);
        begin("aten::mm", 7003, false);
        begin("model.py(9): forward", 7004, true);
        assert!(recorder::push(CpuRecord::Memory {
            at: Ticks::now(),
            address: 0x1000,
            bytes: 4096,
            device: -1,
        }));
        assert!(recorder::push(CpuRecord::MemoryTotals {
            allocated: 8192,
            reserved: 0,
        }));
        assert!(recorder::push(CpuRecord::Memory {
            at: Ticks::now(),
            address: 0x1000,
            bytes: -4096,
            device: 0,
        }));
        assert!(recorder::push(CpuRecord::MemoryTotals {
            allocated: 4096,
            reserved: 1 << 20,
        }));
        // A host event in one slot, with a total past 32 bits (its high bits in the other field).
        assert!(recorder::push(
            CpuRecord::host_memory(Ticks::now(), 0x2000, 512, (5 << 32) + 7).unwrap()
        ));
        end(7004);
        end(7003);
        end(7002);
        // A later sibling of train: its parent is <module> again.
        begin("guide.py(30): evaluate", 7005, true);
        end(7005);
        end(7001);
        session.stop();
        let got = out.lock().unwrap().clone();
        got
    };
    let got = run(true);
    let frames: Vec<(String, u64, Option<u64>)> = got
        .iter()
        .filter_map(|a| match &a.detail {
            Detail::PythonFunction(p) => Some((
                crate::intern::resolve(p.span.name).to_string(),
                a.external_id.unwrap(),
                p.parent,
            )),
            _ => None,
        })
        .collect();
    let mut frames = frames;
    frames.sort_by_key(|f| f.1);
    assert_eq!(
        frames,
        vec![
            ("guide.py(1): <module>".to_string(), 7001, None),
            ("guide.py(17): train".to_string(), 7002, Some(7001)),
            ("model.py(9): forward".to_string(), 7004, Some(7002)),
            ("guide.py(30): evaluate".to_string(), 7005, Some(7001)),
        ]
    );
    // The op between them is a cpu_op, not a frame.
    assert!(got
        .iter()
        .any(|a| matches!(a.detail, Detail::CpuOp(_)) && a.external_id == Some(7003)));
    let memory: Vec<_> = got
        .iter()
        .filter_map(|a| match a.detail {
            Detail::Memory(m) => {
                Some((m.op, m.device, m.bytes, m.total_allocated, m.total_reserved))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        memory,
        vec![
            (MemoryOp::Alloc, None, 4096, Some(8192), Some(0)),
            (MemoryOp::Free, Some(0), 4096, Some(4096), Some(1 << 20)),
            (MemoryOp::Alloc, None, 512, Some((5 << 32) + 7), Some(0)),
        ]
    );
    // A window without profile_memory keeps no allocator events (Kineto's default activity set
    // has no memory records), and still has the frames.
    let got = run(false);
    assert!(!got.iter().any(|a| matches!(a.detail, Detail::Memory(_))));
    assert_eq!(
        got.iter()
            .filter(|a| matches!(a.detail, Detail::PythonFunction(_)))
            .count(),
        4
    );
}

/// A `ProfilerStep` annotation's (step, pid, tid).
type StepRow = (u64, u32, u32);

/// Keeps each trace's `ProfilerStep` annotations.
struct StepRowSink {
    rows: Vec<StepRow>,
    out: Arc<Mutex<Vec<Vec<StepRow>>>>,
}

impl Sink for StepRowSink {
    fn record(&mut self, a: &Activity) -> std::io::Result<()> {
        if let Detail::UserAnnotation(span) = &a.detail {
            let name = crate::intern::resolve(span.name).to_string();
            if let Some(step) = name.strip_prefix("ProfilerStep#") {
                self.rows.push((step.parse().unwrap(), span.pid, span.tid));
            }
        }
        Ok(())
    }
    fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
        let mut rows = self.rows;
        rows.sort();
        self.out.lock().unwrap().push(rows);
        Ok(TraceOutput {
            path: None,
            events: 0,
            cycle: meta.cycle,
        })
    }
}

/// The steps go on the row of the thread that calls `step()`: also the one a capture requested
/// from another thread (an on-demand poller) opens, and the one the session's close from another
/// thread (the process's exit) cuts short, not on those threads' rows.
#[test]
fn steps_opened_or_closed_on_other_threads_stay_on_the_stepping_threads_row() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out: Arc<Mutex<Vec<Vec<StepRow>>>> = Arc::default();
    let factory = {
        let out = out.clone();
        Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> {
            Ok(Box::new(StepRowSink {
                rows: Vec::new(),
                out: out.clone(),
            }))
        })
    };
    let session = start_session(|| (quiet(Trigger::OnDemand), factory.clone()));
    let (to_trainer, trainer_rx) = mpsc::channel::<()>();
    let (to_main, main_rx) = mpsc::channel::<u32>();
    let other = crate::recorder::current_tid();
    let session = &session;
    std::thread::scope(|scope| {
        let trainer = scope.spawn(move || {
            session.step();
            to_main.send(crate::recorder::current_tid()).unwrap();
            // The capture is requested here, from the other thread.
            trainer_rx.recv_timeout(Duration::from_secs(60)).unwrap();
            session.step();
            session.step();
            to_main.send(0).unwrap();
            // In step 3 when the other thread closes the session.
            let _ = trainer_rx.recv_timeout(Duration::from_secs(60));
        });
        let trainer_tid = main_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_ne!(trainer_tid, other);
        session
            .request_capture(CaptureRequest::new(
                CaptureStart::Now,
                CaptureLength::Steps(10),
            ))
            .unwrap();
        to_trainer.send(()).unwrap();
        main_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        session.close();
        to_trainer.send(()).unwrap();
        trainer.join().unwrap();
        let traces = out.lock().unwrap().clone();
        let pid = std::process::id();
        // Steps 1 and 2 whole, then step 3, cut by the close: all on the trainer's row.
        assert_eq!(
            traces,
            vec![vec![
                (1, pid, trainer_tid),
                (2, pid, trainer_tid),
                (3, pid, trainer_tid)
            ]],
            "the other thread is {other}"
        );
    });
}

#[test]
fn ring_records_stay_32_bytes() {
    // The memory event is split in two records so that every slot stays this size (a host event's
    // total rides in the spare bytes beside the tag).
    assert_eq!(std::mem::size_of::<CpuRecord>(), 32);
}

#[test]
fn a_host_total_past_48_bits_does_not_fit_one_slot() {
    let at = crate::clock::Ticks(1);
    assert!(CpuRecord::host_memory(at, 1, 1, (1 << 48) - 1).is_some());
    assert!(CpuRecord::host_memory(at, 1, 1, 1 << 48).is_none());
}
