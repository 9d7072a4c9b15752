//! The flight recorder driven through a recording sink: what a dump holds, what its head says,
//! and each trigger the session fires itself (slow step, hang).

use super::tests::TURN;
use super::*;
use crate::activity::{Activity, Detail};
use crate::clock::UnixNanos;
use crate::flight::{FlightSpan, SlowStepRule};
use crate::recorder::CpuRecord;
use crate::source::{Sink, SinkFactory, TraceMeta};
use std::sync::mpsc;

/// One dump: the step annotations and op names it holds, and its head.
#[derive(Clone, Debug, Default)]
struct Dump {
    steps: Vec<u64>,
    /// Each step annotation's (step, pid, tid), in the order written.
    step_rows: Vec<(u64, u32, u32)>,
    ops: Vec<String>,
    meta: Vec<(String, String)>,
    start: u64,
    end: u64,
}

impl Dump {
    fn get(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type Dumps = Arc<Mutex<Vec<Dump>>>;

struct DumpSink {
    dump: Dump,
    out: Dumps,
    starts: Vec<u64>,
}

impl Sink for DumpSink {
    fn record(&mut self, a: &Activity) -> std::io::Result<()> {
        self.starts.push(a.start.0);
        match &a.detail {
            Detail::UserAnnotation(s) => {
                let n = crate::intern::resolve(s.name).to_string();
                if let Some(step) = n.strip_prefix("ProfilerStep#") {
                    let step = step.parse().unwrap();
                    self.dump.steps.push(step);
                    self.dump.step_rows.push((step, s.pid, s.tid));
                }
            }
            Detail::CpuOp(s) => self
                .dump
                .ops
                .push(crate::intern::resolve(s.name).to_string()),
            _ => {}
        }
        Ok(())
    }
    fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput> {
        let mut dump = self.dump;
        dump.steps.sort();
        dump.meta = meta.metadata.clone();
        dump.start = meta.window_start.0;
        dump.end = meta.window_end.0;
        // Every record lies in the span the head states.
        assert!(
            self.starts
                .iter()
                .all(|&s| s >= dump.start && s <= dump.end),
            "records outside [{}, {}]",
            dump.start,
            dump.end
        );
        let events = self.starts.len() as u64;
        self.out.lock().unwrap().push(dump);
        Ok(TraceOutput {
            path: None,
            events,
            cycle: meta.cycle,
        })
    }
}

use super::tests::start_session;

/// A sink that keeps the dump it is given in `out`.
fn dump_sink(out: &Dumps) -> Box<dyn Sink> {
    Box::new(DumpSink {
        dump: Dump::default(),
        out: out.clone(),
        starts: Vec::new(),
    })
}

/// A flight recorder whose dumps go to `out`, its log nowhere.
fn start(flight: FlightConfig, out: &Dumps) -> Session {
    start_session(|| {
        let out = out.clone();
        let config = SessionConfig {
            log: Arc::new(|_| {}),
            flight: Some(flight),
            ..SessionConfig::default()
        };
        let sinks: Box<dyn SinkFactory> =
            Box::new(move |_cycle: u32| -> std::io::Result<Box<dyn Sink>> { Ok(dump_sink(&out)) });
        (config, sinks)
    })
}

/// One op span named `op{step}` inside the current step.
fn op(step: u64) {
    let name = crate::intern::intern(&format!("op{step}"));
    let _g = crate::recorder::SpanGuard::enter(name, false);
}

/// Begins an all-reduce on this thread (a collective the hang check watches): its span id.
fn allreduce_begin() -> u64 {
    let id = crate::recorder::next_span_id();
    crate::recorder::push(CpuRecord::Begin {
        name: crate::intern::intern("c10d::allreduce_"),
        annotation: false,
        python: false,
        start: crate::clock::Ticks::now(),
        id,
        args: crate::activity::OpArgs::NONE,
    });
    id
}

/// Ends the span `id` on this thread.
fn span_end(id: u64) {
    crate::recorder::push(CpuRecord::End {
        end: crate::clock::Ticks::now(),
        id,
    });
}

/// Waits (up to a minute: a loaded machine) until `n` dumps are written.
fn wait_dumps(out: &Dumps, n: usize) -> Vec<Dump> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let d = out.lock().unwrap().clone();
        if d.len() >= n || Instant::now() > end {
            assert!(
                d.len() >= n,
                "{} dumps after 60 s, wanted {n}: {d:?}",
                d.len()
            );
            return d;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// No automatic trigger and no after-period: a dump is written when asked, at once.
fn no_auto(span: FlightSpan) -> FlightConfig {
    FlightConfig {
        slow_step: None,
        after: Duration::ZERO,
        ..FlightConfig::new(span)
    }
}

/// A head key as a number.
fn num(d: &Dump, key: &str) -> u64 {
    d.get(key)
        .unwrap_or_else(|| panic!("no {key}: {:?}", d.meta))
        .parse()
        .unwrap()
}

#[test]
fn a_step_span_dump_holds_the_last_steps_and_recording_goes_on() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let session = start(no_auto(FlightSpan::Steps(5)), &out);
    for s in 0..30 {
        op(s);
        session.step();
    }
    // Nothing is written until a trigger fires.
    std::thread::sleep(Duration::from_millis(100));
    assert!(out.lock().unwrap().is_empty());
    session
        .flight_dump(FlightTrigger::Request("test".into()))
        .unwrap();
    let d = wait_dumps(&out, 1).remove(0);
    // The last 5 whole steps and the one in progress (step 30, begun by the last step()).
    assert_eq!(d.steps, vec![25, 26, 27, 28, 29, 30], "{d:?}");
    assert_eq!(d.get("flight_trigger"), Some("request"));
    assert_eq!(d.get("flight_first_step"), Some("25"));
    assert_eq!(d.get("flight_last_step"), Some("30"));
    assert_eq!(d.get("flight_span"), Some("5steps"));
    assert_eq!(d.get("flight_cap_bound"), Some("false"));
    // The last events are the ops of the final steps, none older than the span.
    let mut ops = d.ops.clone();
    ops.sort();
    assert_eq!(ops, vec!["op25", "op26", "op27", "op28", "op29"], "{d:?}");
    // Recording went on: a later dump holds later steps.
    for s in 30..40 {
        op(s);
        session.step();
    }
    session
        .flight_dump(FlightTrigger::Request("test".into()))
        .unwrap();
    let d = wait_dumps(&out, 2).remove(1);
    assert_eq!(d.steps, vec![35, 36, 37, 38, 39, 40], "{d:?}");
    // A flight recorder writes nothing at close by itself.
    let outputs = session.stop();
    assert_eq!(outputs.len(), 2);
    assert_eq!(out.lock().unwrap().len(), 2);
}

#[test]
fn a_slow_step_dumps_with_its_time_and_the_median() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = FlightConfig::new(FlightSpan::Time(Duration::from_secs(60)));
    config.slow_step = Some(SlowStepRule {
        factor: 3.0,
        window: 20,
        // Zero: a step the loaded machine made slow by accident cannot hold back the injected one.
        min_interval: Duration::ZERO,
    });
    let session = start(config, &out);
    let ms = Duration::from_millis;
    for s in 0..20 {
        op(s);
        std::thread::sleep(ms(5));
        session.step();
    }
    // Step 20: a 400 ms step, 80x the 5 ms ones (a loaded machine stretches them, not 27x).
    op(20);
    std::thread::sleep(ms(400));
    session.step();
    // A step the loaded machine stretched by chance may have dumped first: wait for step 20's.
    let end = Instant::now() + Duration::from_secs(60);
    let dumps = loop {
        let d = out.lock().unwrap().clone();
        if d.iter().any(|d| d.get("flight_slow_step") == Some("20")) {
            break d;
        }
        assert!(
            Instant::now() < end,
            "no dump for step 20 after 60 s: {d:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let d = dumps
        .iter()
        .find(|d| d.get("flight_slow_step") == Some("20"))
        .expect("found above");
    assert_eq!(d.get("flight_trigger"), Some("slow_step"));
    let dur: u64 = d.get("flight_slow_step_ns").unwrap().parse().unwrap();
    let median: u64 = d.get("flight_median_step_ns").unwrap().parse().unwrap();
    assert!(dur >= 400_000_000, "{dur}");
    assert!(dur > 3 * median, "{dur} vs {median}");
    assert!(d.get("flight_reason").unwrap().contains("step 20 took"));
    // The slow step's op is the last one in it.
    assert!(d.ops.iter().any(|o| o == "op20"), "{d:?}");
    assert!(d.steps.contains(&20), "{d:?}");
    drop(session);
}

#[test]
fn a_hang_in_a_collective_dumps_naming_it() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = no_auto(FlightSpan::Time(Duration::from_secs(60)));
    config.hang_after = Some(Duration::from_millis(300));
    let session = start(config, &out);
    for s in 0..3 {
        op(s);
        session.step();
    }
    // An all-reduce begins and never ends (its rank's peer never comes); no more steps.
    let id = allreduce_begin();
    let d = wait_dumps(&out, 1).remove(0);
    assert_eq!(d.get("flight_trigger"), Some("hang"), "{d:?}");
    assert_eq!(d.get("flight_hang_op"), Some("c10d::allreduce_"));
    assert_eq!(d.get("flight_hang_step"), Some("3"));
    let stalled: u64 = d.get("flight_hang_stalled_ns").unwrap().parse().unwrap();
    assert!(stalled >= 300_000_000, "{stalled}");
    assert_eq!(d.steps, vec![0, 1, 2, 3]);
    // Once per stall: no second dump while the same step hangs.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(out.lock().unwrap().len(), 1);
    span_end(id);
    drop(session);
}

/// A thread blocked in a CUDA synchronize call is a hang too, though no op names it (`.item()`
/// waiting on a collective that never completes on the GPU): the CUPTI callback reports the wait
/// ([`crate::waits`]), and the dump names the call and its thread.
#[test]
fn a_hang_in_a_device_wait_dumps_naming_the_call() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = no_auto(FlightSpan::Time(Duration::from_secs(60)));
    config.hang_after = Some(Duration::from_millis(300));
    let session = start(config, &out);
    for s in 0..2 {
        op(s);
        session.step();
    }
    let (began, tid) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let waiter = std::thread::spawn(move || {
        crate::waits::begin(crate::intern::intern("cudaStreamSynchronize"));
        began.send(crate::recorder::current_tid()).unwrap();
        // Blocked until the test has seen the dump (at most a minute).
        let _ = released.recv_timeout(Duration::from_secs(60));
        crate::waits::end();
    });
    let tid = tid.recv_timeout(Duration::from_secs(60)).unwrap();
    let d = wait_dumps(&out, 1).remove(0);
    release.send(()).unwrap();
    waiter.join().unwrap();
    assert_eq!(d.get("flight_trigger"), Some("hang"), "{d:?}");
    assert_eq!(d.get("flight_hang_op"), Some("cudaStreamSynchronize"));
    assert_eq!(d.get("flight_hang_tid"), Some(tid.to_string().as_str()));
    assert_eq!(d.get("flight_hang_step"), Some("2"));
    assert!(num(&d, "flight_hang_open_ns") >= 300_000_000, "{d:?}");
    drop(session);
}

#[test]
fn without_a_collective_open_a_long_step_is_no_hang() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = no_auto(FlightSpan::Time(Duration::from_secs(60)));
    config.hang_after = Some(Duration::from_millis(100));
    let session = start(config, &out);
    session.step();
    op(1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(out.lock().unwrap().is_empty());
    drop(session);
}

/// A rank that was late for other reasons (no step for longer than the hang time, no collective
/// open) and then enters a collective that goes through at once is no hang: the collective
/// itself must have been open that long.
#[test]
fn a_late_rank_entering_a_collective_is_no_hang() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = no_auto(FlightSpan::Time(Duration::from_secs(60)));
    config.hang_after = Some(Duration::from_millis(300));
    let session = start(config, &out);
    session.step();
    op(1);
    std::thread::sleep(Duration::from_millis(600));
    // The all-reduce is open for a few collector rounds, then completes.
    let id = allreduce_begin();
    std::thread::sleep(Duration::from_millis(100));
    span_end(id);
    session.step();
    std::thread::sleep(Duration::from_millis(200));
    assert!(out.lock().unwrap().is_empty(), "{:?}", out.lock().unwrap());
    drop(session);
}

#[test]
fn the_cap_binds_and_the_dump_says_what_it_covers() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let chunk = crate::flight::CHUNK_RECORDS;
    let mut config = no_auto(FlightSpan::Time(Duration::from_secs(600)));
    // Two chunks: the span wants everything, the cap keeps the newest two chunks at most.
    config.memory_cap = 2 * chunk * std::mem::size_of::<Activity>();
    let session = start(config, &out);
    for s in 0..(4 * chunk as u64) {
        op(s % 7);
        if s % 1000 == 0 {
            // Lets the collector drain before a ring fills.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    session
        .flight_dump(FlightTrigger::Request("test".into()))
        .unwrap();
    let d = wait_dumps(&out, 1).remove(0);
    assert_eq!(d.get("flight_cap_bound"), Some("true"), "{:?}", d.meta);
    let evicted: u64 = d.get("flight_cap_evicted").unwrap().parse().unwrap();
    assert!(evicted >= chunk as u64, "{evicted}");
    assert!(d.ops.len() <= 2 * chunk, "{}", d.ops.len());
    let start: u64 = d.get("flight_start_ns").unwrap().parse().unwrap();
    let wanted: u64 = d.get("flight_wanted_start_ns").unwrap().parse().unwrap();
    assert!(start > wanted);
    assert_eq!(start, d.start);
    drop(session);
}

#[test]
fn a_second_trigger_while_a_dump_is_queued_joins_it() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let session = start(no_auto(FlightSpan::Steps(3)), &out);
    session.step();
    // Holding the collector's lock keeps the first dump queued while the second comes.
    let held = lock(&session.shared.collector);
    session
        .flight_dump(FlightTrigger::Request("first".into()))
        .unwrap();
    assert_eq!(
        session.flight_dump(FlightTrigger::Signal("SIGUSR2".into())),
        Err(FlightRefused::Busy)
    );
    drop(held);
    wait_dumps(&out, 1);
    // Let the collector clear the queued mark (it does so after the trace is written).
    let end = Instant::now() + Duration::from_secs(60);
    while lock(&session.shared.control)
        .flight
        .as_ref()
        .is_some_and(|f| f.dump_queued)
    {
        assert!(Instant::now() < end, "the dump stays queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The next dump says one trigger was folded into the earlier one... and is accepted.
    session
        .flight_dump(FlightTrigger::Request("third".into()))
        .unwrap();
    let d = wait_dumps(&out, 2);
    assert_eq!(d[0].get("flight_requested_by"), Some("first"));
    assert_eq!(d[1].get("flight_merged_triggers"), Some("1"));
    drop(session);
}

#[test]
fn a_session_that_is_no_flight_recorder_refuses_dumps() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let session = start_session(|| {
        let config = SessionConfig {
            log: Arc::new(|_| {}),
            trigger: Trigger::OnDemand,
            ..SessionConfig::default()
        };
        let sinks: Box<dyn SinkFactory> = Box::new(|_c: u32| -> std::io::Result<Box<dyn Sink>> {
            Err(std::io::Error::other("unused"))
        });
        (config, sinks)
    });
    let e = session
        .flight_dump(FlightTrigger::Request("x".into()))
        .unwrap_err();
    assert_eq!(e, FlightRefused::NotFlight);
    assert!(e.to_string().contains("KINETRACE_FLIGHT_RECORDER"));
}

/// A disk that fills during a dump: that dump is not written (one line says why), the job is not
/// touched, recording goes on, and the next dump is whole.
#[test]
fn a_disk_full_during_a_dump_loses_that_dump_only() {
    struct FullDisk;
    impl Sink for FullDisk {
        fn record(&mut self, _: &Activity) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(28))
        }
        fn finish(self: Box<Self>, _: &TraceMeta) -> std::io::Result<TraceOutput> {
            panic!("a failed sink is never finished")
        }
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let full = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let session = start_session(|| {
        let (out, full, lines) = (out.clone(), full.clone(), lines.clone());
        let sinks: Box<dyn SinkFactory> =
            Box::new(move |_c: u32| -> std::io::Result<Box<dyn Sink>> {
                if full.load(std::sync::atomic::Ordering::SeqCst) {
                    return Ok(Box::new(FullDisk));
                }
                Ok(dump_sink(&out))
            });
        let config = SessionConfig {
            log: Arc::new(move |m: &str| lines.lock().unwrap().push(m.to_string())),
            flight: Some(no_auto(FlightSpan::Steps(3))),
            ..SessionConfig::default()
        };
        (config, sinks)
    });
    for s in 0..5 {
        op(s);
        session.step();
    }
    session
        .flight_dump(FlightTrigger::Request("full".into()))
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while !lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("not written"))
    {
        assert!(Instant::now() < end, "no line: {:?}", lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    let said = lines.lock().unwrap().clone();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("requested by full") && said[0].contains("os error 28"),
        "{said:?}"
    );
    full.store(false, std::sync::atomic::Ordering::SeqCst);
    for s in 5..10 {
        op(s);
        session.step();
    }
    session
        .flight_dump(FlightTrigger::Request("room".into()))
        .unwrap();
    let d = wait_dumps(&out, 1).remove(0);
    assert_eq!(d.steps, vec![7, 8, 9, 10], "{d:?}");
    assert_eq!(d.ops, vec!["op7", "op8", "op9"], "{d:?}");
    drop(session);
}

/// The process ending always gets its dump, even while another is queued.
#[test]
fn the_process_ending_never_joins_a_queued_dump() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let session = start(no_auto(FlightSpan::Steps(3)), &out);
    session.step();
    let held = lock(&session.shared.collector);
    session
        .flight_dump(FlightTrigger::Request("first".into()))
        .unwrap();
    session
        .flight_dump(FlightTrigger::Exit("SIGTERM".into()))
        .unwrap();
    session
        .flight_dump(FlightTrigger::Exception {
            type_name: "RuntimeError".into(),
            message: "boom".into(),
            thread: None,
        })
        .unwrap();
    drop(held);
    let d = wait_dumps(&out, 3);
    let kinds: Vec<_> = d.iter().map(|d| d.get("flight_trigger").unwrap()).collect();
    assert_eq!(kinds, ["request", "exit", "exception"]);
    drop(session);
}

/// An after-period: the dump goes on recording after its trigger and ends exactly where the
/// period does. What was recorded before that end is in it (steps included, the one running past
/// the end partial), what came after is not; the training thread never waited.
#[test]
fn a_dump_holds_what_follows_its_trigger_for_the_after_period() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let after = Duration::from_millis(600);
    let mut config = no_auto(FlightSpan::Time(Duration::from_secs(60)));
    config.after = after;
    let session = start(config, &out);
    for s in 0..5 {
        op(s);
        session.step();
    }
    let asked = Instant::now();
    session
        .flight_dump(FlightTrigger::Request("test".into()))
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_millis(100),
        "the trigger waited"
    );
    // Ops (and steps) from the trigger to well past the period, each with the times around it.
    let mut spans = Vec::new();
    let mut s = 100;
    while asked.elapsed() < after * 2 {
        let before = UnixNanos::now().0;
        op(s);
        spans.push((s, before, UnixNanos::now().0));
        session.step();
        s += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = wait_dumps(&out, 1).remove(0);
    let fired = num(&d, "flight_trigger_ns");
    let end = num(&d, "flight_end_ns");
    assert_eq!(num(&d, "flight_after_ns"), after.as_nanos() as u64);
    assert_eq!(end, fired + after.as_nanos() as u64, "{:?}", d.meta);
    assert_eq!(d.end, end);
    assert_eq!(d.get("flight_after_cut_by"), None);
    let name = |s: u64| format!("op{s}");
    let (mut inside, mut outside) = (0, 0);
    for (s, before, after_op) in spans {
        if after_op < end {
            inside += 1;
            assert!(
                d.ops.contains(&name(s)),
                "op{s} before the end is missing: {d:?}"
            );
        } else if before > end {
            outside += 1;
            assert!(
                !d.ops.contains(&name(s)),
                "op{s} after the end is in: {d:?}"
            );
        }
    }
    assert!(
        inside >= 2 && outside >= 2,
        "{inside} ops inside, {outside} after"
    );
    // The ops before the trigger, and the steps of the period, the last one partial.
    assert!(d.ops.contains(&name(4)), "{d:?}");
    let last = *d.steps.last().unwrap();
    assert!(last > 5, "{d:?}");
    assert_eq!(
        d.get("kinetrace_partial_step"),
        Some(last.to_string().as_str())
    );
    drop(session);
}

/// The process ending during an after-period: the waiting dump is written at once, cut short
/// (holding what the period recorded so far), then the ending's own.
#[test]
fn an_exception_during_an_after_period_writes_both_dumps_at_once() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = no_auto(FlightSpan::Steps(3));
    // Far longer than the wait below: a dump that waited it out fails the test.
    config.after = Duration::from_secs(600);
    let session = start(config, &out);
    for s in 0..5 {
        op(s);
        session.step();
    }
    session
        .flight_dump(FlightTrigger::Request("first".into()))
        .unwrap();
    op(50);
    // Joins the waiting dump, as during any dump.
    assert_eq!(
        session.flight_dump(FlightTrigger::Signal("SIGUSR2".into())),
        Err(FlightRefused::Busy)
    );
    session
        .flight_dump(FlightTrigger::Exception {
            type_name: "RuntimeError".into(),
            message: "boom".into(),
            thread: None,
        })
        .unwrap();
    let d = wait_dumps(&out, 2);
    let kinds: Vec<_> = d.iter().map(|d| d.get("flight_trigger").unwrap()).collect();
    assert_eq!(kinds, ["request", "exception"]);
    assert_eq!(d[0].get("flight_after_cut_by"), Some("exception"));
    assert_eq!(num(&d[0], "flight_after_ns"), 600_000_000_000);
    assert!(d[0].ops.contains(&"op50".to_string()), "{:?}", d[0]);
    assert_eq!(d[0].steps, vec![2, 3, 4, 5], "{:?}", d[0]);
    // The ending's own dump never waits.
    assert_eq!(num(&d[1], "flight_after_ns"), 0);
    assert!(d[1].ops.contains(&"op50".to_string()), "{:?}", d[1]);
    drop(session);
}

/// The session closing (a normal exit) during an after-period writes the waiting dump at once.
#[test]
fn closing_during_an_after_period_writes_the_waiting_dump() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let mut config = no_auto(FlightSpan::Steps(3));
    config.after = Duration::from_secs(600);
    let session = start(config, &out);
    for s in 0..5 {
        op(s);
        session.step();
    }
    session
        .flight_dump(FlightTrigger::Request("first".into()))
        .unwrap();
    // Steps 5..=10, each of more ops than a chunk holds: the 3-step span moves on by whole
    // chunks meanwhile, but the waiting dump keeps the span as it stood at its trigger.
    for s in 5..11 {
        for _ in 0..crate::flight::CHUNK_RECORDS {
            op(s);
        }
        std::thread::sleep(Duration::from_millis(30));
        session.step();
    }
    op(60);
    let closed = Instant::now();
    let outputs = session.stop();
    assert!(closed.elapsed() < Duration::from_secs(60));
    assert_eq!(outputs.len(), 1);
    let d = out.lock().unwrap().clone();
    assert_eq!(d.len(), 1, "{d:?}");
    let d = &d[0];
    assert_eq!(d.get("flight_after_cut_by"), Some("close"));
    assert!(d.ops.contains(&"op60".to_string()));
    // From the trigger's span (steps 2..4) to the step the close cut short, partial.
    assert_eq!(d.steps, (2..=11).collect::<Vec<_>>(), "{:?}", d.meta);
    assert_eq!(d.get("kinetrace_partial_step"), Some("11"));
    assert!(d.ops.contains(&"op2".to_string()));
    assert_eq!(
        d.ops.iter().filter(|o| *o == "op7").count(),
        crate::flight::CHUNK_RECORDS
    );
}

/// The process ending while the training thread is inside a step: the exit thread (here the test's)
/// closes the session, ending that step before the collector writes the ending's dump. The partial
/// `ProfilerStep` goes on the training thread's row, like its whole steps, not on the closer's.
#[test]
fn a_step_the_exit_closes_from_another_thread_stays_on_the_training_threads_row() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let out = Dumps::default();
    let session = start(no_auto(FlightSpan::Steps(3)), &out);
    let (stepped_tx, stepped_rx) = mpsc::channel::<u32>();
    let (ended_tx, ended_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let session = &session;
        let trainer = scope.spawn(move || {
            for s in 0..5 {
                op(s);
                session.step();
            }
            // Inside step 5 when the process ends.
            op(5);
            stepped_tx.send(crate::recorder::current_tid()).unwrap();
            // Alive until the dump is written, as a training thread is while the exit runs.
            let _ = ended_rx.recv_timeout(Duration::from_secs(60));
        });
        let trainer_tid = stepped_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        let exiting = crate::recorder::current_tid();
        assert_ne!(trainer_tid, exiting);
        {
            // The close comes before the collector writes the dump (it is held meanwhile).
            let held = lock(&session.shared.collector);
            session
                .flight_dump(FlightTrigger::Exit("SIGTERM".into()))
                .unwrap();
            lock(&session.shared.control).close(&session.shared);
            drop(held);
        }
        session.close();
        ended_tx.send(()).unwrap();
        trainer.join().unwrap();
        let d = wait_dumps(&out, 1);
        assert_eq!(d.len(), 1, "{d:?}");
        let d = &d[0];
        assert_eq!(d.get("flight_trigger"), Some("exit"));
        assert_eq!(d.get("kinetrace_partial_step"), Some("5"));
        assert_eq!(d.steps, vec![2, 3, 4, 5], "{d:?}");
        assert!(d.ops.contains(&"op5".to_string()), "{d:?}");
        let pid = std::process::id();
        for &(step, p, tid) in &d.step_rows {
            assert_eq!(
                (p, tid),
                (pid, trainer_tid),
                "ProfilerStep#{step} not on the trainer's row (exit thread {exiting}): {:?}",
                d.step_rows
            );
        }
    });
    drop(session);
}
