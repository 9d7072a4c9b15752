//! The flight recorder: record all the time, keep only the last span (seconds or steps) in bounded
//! memory, and write a normal trace of that span when something goes wrong.
//!
//! The pieces here are plain data with no I/O, so they are tested on their own:
//!
//! - [`FlightConfig`]: the span, the memory cap and the automatic triggers (slow step, hang).
//! - [`FlightTrigger`]: why a dump is written; it becomes the dump's `flight_*` head keys.
//! - [`FlightBuffer`]: the collector's store of drained records, a queue of fixed-size chunks in
//!   arrival order. Whole chunks are dropped from the front once every record in them started before
//!   the span, or when the cap is reached (then the dump says from when on it is complete). Chunks
//!   are allocated by the collector and reused, so the recording threads never allocate for it, and
//!   neither does the collector once the buffer has reached its steady size.
//! - [`StepClock`]: the control side's step history: the starts of the last steps (the span of a
//!   `20steps` recorder) and the slow-step rule (a step longer than k × the rolling median).
//!
//! The session wires them in: the collector owns the buffer and writes dumps; `step()` runs the
//! slow-step check (a comparison with a median of at most a few hundred numbers, no allocation);
//! every trigger only queues a command, so the training thread never waits for a dump.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::activity::Activity;
use crate::clock::{Ticks, UnixNanos};

/// Default bound on the records a flight recorder keeps: 256 MiB per process.
pub const DEFAULT_FLIGHT_MEMORY: usize = 256 << 20;

/// Default after-period: a dump of a slow step, a hang, a request or a signal also holds the 2 s
/// that follow its trigger (see [`FlightConfig::after`]).
pub const DEFAULT_FLIGHT_AFTER: Duration = Duration::from_secs(2);

/// Records per chunk of a [`FlightBuffer`] (a chunk is the unit of eviction).
pub const CHUNK_RECORDS: usize = 4096;

/// The accepted form of a flight span, as error messages state it.
pub const SPAN_FORM: &str = "a duration with a unit s or m, such as 60s or 2m, or a step count \
                             such as 20steps";

/// How much a flight recorder keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightSpan {
    /// The last this much wall time.
    Time(Duration),
    /// The last this many whole steps, plus the step in progress.
    Steps(u32),
}

impl FlightSpan {
    /// Parses `60s`, `2m`, `500ms` or `20steps` (also `20step`).
    pub fn parse(text: &str) -> Result<FlightSpan, String> {
        let t = text.trim();
        let bad = || format!("`{text}` is not a flight span; expected {SPAN_FORM}");
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| bad())?;
        if n == 0 {
            return Err(bad());
        }
        match unit {
            "steps" | "step" => Ok(FlightSpan::Steps(u32::try_from(n).map_err(|_| bad())?)),
            "ms" => Ok(FlightSpan::Time(Duration::from_millis(n))),
            "s" => Ok(FlightSpan::Time(Duration::from_secs(n))),
            "m" | "min" => Ok(FlightSpan::Time(Duration::from_secs(n.saturating_mul(60)))),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for FlightSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlightSpan::Time(d) if d.subsec_millis() == 0 => write!(f, "{}s", d.as_secs()),
            FlightSpan::Time(d) => write!(f, "{}ms", d.as_millis()),
            FlightSpan::Steps(n) => write!(f, "{n}steps"),
        }
    }
}

/// The slow-step trigger: a step longer than `factor` × the median of the last `window` steps
/// dumps, at most once per `min_interval`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowStepRule {
    /// k: how many times the median a step must take to count as slow (> 1).
    pub factor: f64,
    /// M: how many earlier steps the median is taken over (2..=1024).
    pub window: u32,
    /// The shortest time between two slow-step dumps.
    pub min_interval: Duration,
}

impl Default for SlowStepRule {
    fn default() -> Self {
        SlowStepRule {
            factor: 3.0,
            window: 20,
            min_interval: Duration::from_secs(60),
        }
    }
}

/// What a flight recorder keeps and when it dumps by itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlightConfig {
    /// How much it keeps.
    pub span: FlightSpan,
    /// Bound on the bytes of the records kept ([`DEFAULT_FLIGHT_MEMORY`]).
    pub memory_cap: usize,
    /// Dump on a slow step (`None`: off).
    pub slow_step: Option<SlowStepRule>,
    /// Dump when no step came for this long while a collective or a sync has been open that
    /// long (`None`: off).
    pub hang_after: Option<Duration>,
    /// How long after its trigger a dump goes on recording before it is written (zero: written
    /// at once; [`DEFAULT_FLIGHT_AFTER`]). The process ending (an exit signal, an exception)
    /// never waits: it writes at once, and a dump waiting out its after-period is written then.
    pub after: Duration,
}

impl FlightConfig {
    /// A recorder of `span` with the default cap, the default slow-step rule and no hang check.
    pub fn new(span: FlightSpan) -> FlightConfig {
        FlightConfig {
            span,
            memory_cap: DEFAULT_FLIGHT_MEMORY,
            slow_step: Some(SlowStepRule::default()),
            hang_after: None,
            after: DEFAULT_FLIGHT_AFTER,
        }
    }
}

/// Why a dump is written.
#[derive(Clone, Debug, PartialEq)]
pub enum FlightTrigger {
    /// Asked for from outside: `kinetrace trigger --dump`, the API, dynolog (who asked).
    Request(String),
    /// A signal the job configured for it (its name, `SIGUSR2`).
    Signal(String),
    /// A step took `dur_ns`, more than `factor` × the median `median_ns` of the `window` steps
    /// before it.
    SlowStep {
        /// The slow step's number.
        step: u64,
        /// Its duration.
        dur_ns: u64,
        /// The median of the steps before it.
        median_ns: u64,
        /// k.
        factor: f64,
        /// How many steps the median is over.
        window: u32,
    },
    /// No step for `stalled_ns` while `op` was open on thread `tid` (for `open_ns`).
    Hang {
        /// The open collective or sync.
        op: String,
        /// The thread it is open on.
        tid: u32,
        /// How long it has been open.
        open_ns: u64,
        /// How long since the last step.
        stalled_ns: u64,
        /// The step in progress.
        step: u64,
    },
    /// The process is ending on this signal (its name).
    Exit(String),
    /// An exception left the training loop: its type and message.
    Exception {
        /// The exception's type (`torch.OutOfMemoryError`).
        type_name: String,
        /// Its message (shortened).
        message: String,
        /// The thread it left, when not the main one (Python's `threading.excepthook`).
        thread: Option<String>,
    },
}

impl FlightTrigger {
    /// The value of the dump's `flight_trigger` key: `request`, `signal`, `slow_step`, `hang`,
    /// `exit`, `exception`.
    pub fn kind(&self) -> &'static str {
        match self {
            FlightTrigger::Request(_) => "request",
            FlightTrigger::Signal(_) => "signal",
            FlightTrigger::SlowStep { .. } => "slow_step",
            FlightTrigger::Hang { .. } => "hang",
            FlightTrigger::Exit(_) => "exit",
            FlightTrigger::Exception { .. } => "exception",
        }
    }

    /// One sentence: why this dump was written.
    pub fn describe(&self) -> String {
        match self {
            FlightTrigger::Request(who) => format!("requested by {who}"),
            FlightTrigger::Signal(s) => format!("{s} received"),
            FlightTrigger::SlowStep {
                step,
                dur_ns,
                median_ns,
                factor,
                window,
            } => format!(
                "step {step} took {:.3} ms, {:.1}x the median {:.3} ms of the {window} steps \
                 before it (threshold {factor}x)",
                *dur_ns as f64 / 1e6,
                *dur_ns as f64 / (*median_ns).max(1) as f64,
                *median_ns as f64 / 1e6
            ),
            FlightTrigger::Hang {
                op,
                tid,
                open_ns,
                stalled_ns,
                step,
            } => format!(
                "no step for {:.1} s (step {step} in progress) while {op} has been open for \
                 {:.1} s on thread {tid}",
                *stalled_ns as f64 / 1e9,
                *open_ns as f64 / 1e9
            ),
            FlightTrigger::Exit(s) => format!("the process is ending on {s}"),
            FlightTrigger::Exception {
                type_name,
                message,
                thread: None,
            } => format!("{type_name} left the training loop: {message}"),
            FlightTrigger::Exception {
                type_name,
                message,
                thread: Some(t),
            } => format!("{type_name} left thread {t}: {message}"),
        }
    }

    /// Whether it ends the process (an exit signal, an exception): such a dump is the last
    /// chance, so it never joins another and never waits for an after-period.
    pub fn is_ending(&self) -> bool {
        matches!(
            self,
            FlightTrigger::Exit(_) | FlightTrigger::Exception { .. }
        )
    }

    /// The trigger's own head keys (beside `flight_trigger` and `flight_reason`).
    pub fn metadata(&self) -> Vec<(String, String)> {
        let kv = |k: &str, v: String| (k.to_string(), v);
        match self {
            FlightTrigger::SlowStep {
                step,
                dur_ns,
                median_ns,
                factor,
                window,
            } => vec![
                kv("flight_slow_step", step.to_string()),
                kv("flight_slow_step_ns", dur_ns.to_string()),
                kv("flight_median_step_ns", median_ns.to_string()),
                kv("flight_slow_factor", factor.to_string()),
                kv("flight_median_window", window.to_string()),
            ],
            FlightTrigger::Hang {
                op,
                tid,
                open_ns,
                stalled_ns,
                step,
            } => vec![
                kv("flight_hang_op", op.clone()),
                kv("flight_hang_tid", tid.to_string()),
                kv("flight_hang_open_ns", open_ns.to_string()),
                kv("flight_hang_stalled_ns", stalled_ns.to_string()),
                kv("flight_hang_step", step.to_string()),
            ],
            FlightTrigger::Exception {
                type_name, thread, ..
            } => {
                let mut m = vec![kv("flight_exception", type_name.clone())];
                if let Some(t) = thread {
                    m.push(kv("flight_exception_thread", t.clone()));
                }
                m
            }
            FlightTrigger::Exit(s) | FlightTrigger::Signal(s) => {
                vec![kv("flight_signal", s.clone())]
            }
            FlightTrigger::Request(who) => vec![kv("flight_requested_by", who.clone())],
        }
    }
}

/// Whether an op name is a collective or a sync a hang waits in: `c10d::`, NCCL, Gloo,
/// `record_param_comms`, or a synchronize call.
pub fn is_collective_or_sync(name: &str) -> bool {
    name.starts_with("c10d::")
        || name.contains("nccl")
        || name.contains("Nccl")
        || name.contains("gloo")
        || name.contains("Gloo")
        || name == "record_param_comms"
        || name.contains("ynchronize")
}

/// One chunk of kept records, in arrival order.
struct Chunk {
    records: Vec<Activity>,
    /// The latest start among `records` (a chunk goes once this is before the span).
    max_start: UnixNanos,
}

/// The collector's store of the last span (see the module docs).
pub struct FlightBuffer {
    chunks: VecDeque<Chunk>,
    /// Emptied chunks kept for reuse (a few; the rest are freed).
    free: Vec<Vec<Activity>>,
    max_chunks: usize,
    /// Records are complete from here on: the latest start among records the cap evicted.
    complete_from: UnixNanos,
    /// Records the cap evicted since the last dump.
    cap_evicted: u64,
}

impl FlightBuffer {
    /// A buffer holding at most `memory_cap` bytes of records (at least two chunks).
    pub fn new(memory_cap: usize) -> FlightBuffer {
        let chunk_bytes = CHUNK_RECORDS * std::mem::size_of::<Activity>();
        FlightBuffer {
            chunks: VecDeque::new(),
            free: Vec::new(),
            max_chunks: (memory_cap / chunk_bytes).max(2),
            complete_from: UnixNanos(0),
            cap_evicted: 0,
        }
    }

    /// Keeps `a`, evicting the oldest chunk if the cap is reached.
    pub fn push(&mut self, a: Activity) {
        let full = self
            .chunks
            .back()
            .is_none_or(|c| c.records.len() == CHUNK_RECORDS);
        if full {
            let records = if self.chunks.len() >= self.max_chunks {
                // The cap binds: the oldest chunk goes, and the span is complete only after it.
                let old = self.chunks.pop_front().expect("max_chunks >= 2");
                self.complete_from = self.complete_from.max(old.max_start);
                self.cap_evicted += old.records.len() as u64;
                let mut r = old.records;
                // Records are `Copy`: clearing is O(1).
                r.clear();
                r
            } else {
                self.free
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(CHUNK_RECORDS))
            };
            self.chunks.push_back(Chunk {
                records,
                max_start: UnixNanos(0),
            });
        }
        let c = self.chunks.back_mut().expect("a chunk was just ensured");
        c.max_start = c.max_start.max(a.start);
        c.records.push(a);
    }

    /// Drops the chunks whose every record started before `cutoff` (older than the span).
    pub fn evict_before(&mut self, cutoff: UnixNanos) {
        // The newest chunk stays: records keep arriving into it.
        while self.chunks.len() > 1 && self.chunks.front().is_some_and(|c| c.max_start < cutoff) {
            let mut old = self.chunks.pop_front().expect("checked").records;
            if self.free.len() < 4 {
                old.clear();
                self.free.push(old);
            }
        }
    }

    /// Records kept now.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.records.len()).sum()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.chunks.iter().all(|c| c.records.is_empty())
    }

    /// Bytes the chunks hold (allocated capacity, reusable ones included).
    pub fn memory(&self) -> usize {
        let cap: usize = self
            .chunks
            .iter()
            .map(|c| c.records.capacity())
            .sum::<usize>()
            + self.free.iter().map(Vec::capacity).sum::<usize>();
        cap * std::mem::size_of::<Activity>()
    }

    /// The kept records, oldest chunk first (arrival order, not sorted by time).
    pub fn records(&self) -> impl Iterator<Item = &Activity> {
        self.chunks.iter().flat_map(|c| c.records.iter())
    }

    /// From when on the kept records are complete (the cap evicted older ones); 0 if it never did.
    pub fn complete_from(&self) -> UnixNanos {
        self.complete_from
    }

    /// Records the cap evicted since the last call (the dump reports and resets it).
    pub fn take_cap_evicted(&mut self) -> u64 {
        std::mem::take(&mut self.cap_evicted)
    }
}

/// The control side's step history: the starts of the last steps and the slow-step rule.
pub(crate) struct StepClock {
    /// The starts of the last `span_steps + 1` steps (the one in progress last).
    starts: VecDeque<Ticks>,
    span_steps: usize,
    /// Durations of the last M steps (ns), oldest first.
    durations: VecDeque<u64>,
    /// Scratch for the median (capacity M: no allocation per step).
    scratch: Vec<u64>,
    rule: Option<SlowStepRule>,
    /// When the last step boundary was (or the session started).
    pub last_step_at: Instant,
    /// Whether a step boundary has been seen (the first step's length is unknown before).
    seen_step: bool,
    last_slow_dump: Option<Instant>,
}

impl StepClock {
    pub fn new(config: &FlightConfig) -> StepClock {
        let span_steps = match config.span {
            FlightSpan::Steps(n) => n as usize,
            FlightSpan::Time(_) => 0,
        };
        let m = config.slow_step.map_or(0, |r| r.window as usize);
        StepClock {
            starts: VecDeque::with_capacity(span_steps + 2),
            span_steps,
            durations: VecDeque::with_capacity(m + 1),
            scratch: Vec::with_capacity(m + 1),
            rule: config.slow_step,
            last_step_at: Instant::now(),
            seen_step: false,
            last_slow_dump: None,
        }
    }

    /// A step began at `start` (its `ProfilerStep` span's start).
    pub fn step_began(&mut self, start: Ticks) {
        if self.span_steps == 0 {
            return;
        }
        self.starts.push_back(start);
        while self.starts.len() > self.span_steps + 1 {
            self.starts.pop_front();
        }
    }

    /// The start of the oldest step of the span (for a step span), `None` for a time span.
    pub fn span_start(&self) -> Option<Ticks> {
        self.starts.front().copied()
    }

    /// Step `step` ended `now`: its duration is checked against the median of those before it.
    /// Returns the slow-step trigger when it fires.
    pub fn step_ended(&mut self, step: u64, now: Instant) -> Option<FlightTrigger> {
        let dur = now.saturating_duration_since(self.last_step_at);
        self.last_step_at = now;
        if !std::mem::replace(&mut self.seen_step, true) {
            // From the session's start to the first boundary is not a whole step.
            return None;
        }
        let rule = self.rule?;
        let dur_ns = dur.as_nanos() as u64;
        let m = rule.window as usize;
        let mut fired = None;
        // At least half the window (and 3) before a median means anything.
        if self.durations.len() >= (m / 2).max(3) {
            self.scratch.clear();
            self.scratch.extend(self.durations.iter().copied());
            let mid = self.scratch.len() / 2;
            let median_ns = *self.scratch.select_nth_unstable(mid).1;
            let due = self
                .last_slow_dump
                .is_none_or(|t| now.saturating_duration_since(t) >= rule.min_interval);
            if median_ns > 0 && (dur_ns as f64) > rule.factor * median_ns as f64 && due {
                self.last_slow_dump = Some(now);
                fired = Some(FlightTrigger::SlowStep {
                    step,
                    dur_ns,
                    median_ns,
                    factor: rule.factor,
                    window: self.durations.len() as u32,
                });
            }
        }
        self.durations.push_back(dur_ns);
        while self.durations.len() > m {
            self.durations.pop_front();
        }
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::{CpuSpan, Detail, OpArgs};
    use crate::intern::NameId;

    fn rec(start: u64) -> Activity {
        Activity {
            start: UnixNanos(start),
            end: UnixNanos(start + 1),
            correlation: None,
            external_id: None,
            detail: Detail::CpuOp(CpuSpan {
                name: NameId(0),
                pid: 1,
                tid: 1,
                args: OpArgs::NONE,
            }),
        }
    }

    #[test]
    fn spans_parse_and_bad_ones_state_the_form() {
        assert_eq!(
            FlightSpan::parse("60s"),
            Ok(FlightSpan::Time(Duration::from_secs(60)))
        );
        assert_eq!(
            FlightSpan::parse("2m"),
            Ok(FlightSpan::Time(Duration::from_secs(120)))
        );
        assert_eq!(FlightSpan::parse("20steps"), Ok(FlightSpan::Steps(20)));
        assert_eq!(FlightSpan::parse("1step"), Ok(FlightSpan::Steps(1)));
        for bad in ["", "0s", "60", "s", "20 parsecs", "-3s", "99999999999steps"] {
            let e = FlightSpan::parse(bad).unwrap_err();
            assert!(
                e.contains("such as 60s") && e.contains("20steps"),
                "{bad}: {e}"
            );
        }
        assert_eq!(FlightSpan::Steps(20).to_string(), "20steps");
        assert_eq!(FlightSpan::Time(Duration::from_secs(60)).to_string(), "60s");
    }

    #[test]
    fn the_buffer_drops_whole_chunks_older_than_the_span() {
        let mut b = FlightBuffer::new(DEFAULT_FLIGHT_MEMORY);
        for t in 0..(3 * CHUNK_RECORDS as u64) {
            b.push(rec(t));
        }
        assert_eq!(b.len(), 3 * CHUNK_RECORDS);
        // The first chunk ends at CHUNK_RECORDS - 1: a cutoff just after it drops it alone.
        b.evict_before(UnixNanos(CHUNK_RECORDS as u64));
        assert_eq!(b.len(), 2 * CHUNK_RECORDS);
        assert_eq!(b.records().next().unwrap().start.0, CHUNK_RECORDS as u64);
        // Never the newest chunk, even when everything is old.
        b.evict_before(UnixNanos(u64::MAX));
        assert_eq!(b.len(), CHUNK_RECORDS);
        assert_eq!(
            b.complete_from(),
            UnixNanos(0),
            "the span, not the cap, evicted"
        );
    }

    #[test]
    fn the_cap_binds_and_says_from_when_the_span_is_complete() {
        let chunk_bytes = CHUNK_RECORDS * std::mem::size_of::<Activity>();
        let mut b = FlightBuffer::new(3 * chunk_bytes);
        for t in 0..(5 * CHUNK_RECORDS as u64) {
            b.push(rec(t));
        }
        assert_eq!(b.len(), 3 * CHUNK_RECORDS);
        assert!(b.memory() <= 3 * chunk_bytes, "{} bytes", b.memory());
        // Two chunks evicted: records up to the end of the second are gone.
        assert_eq!(b.complete_from(), UnixNanos(2 * CHUNK_RECORDS as u64 - 1));
        assert_eq!(b.take_cap_evicted(), 2 * CHUNK_RECORDS as u64);
        assert_eq!(b.take_cap_evicted(), 0);
        assert_eq!(
            b.records().map(|a| a.start.0).min(),
            Some(2 * CHUNK_RECORDS as u64)
        );
    }

    #[test]
    fn a_slow_step_fires_once_per_interval_with_its_median() {
        let mut config = FlightConfig::new(FlightSpan::Steps(4));
        config.slow_step = Some(SlowStepRule {
            factor: 3.0,
            window: 10,
            min_interval: Duration::from_secs(3600),
        });
        let mut c = StepClock::new(&config);
        let t0 = Instant::now();
        c.last_step_at = t0;
        let ms = Duration::from_millis;
        let mut t = t0;
        // The first boundary is not a whole step; then ten 10 ms steps.
        assert!(c.step_ended(0, t).is_none());
        for s in 1..=10 {
            t += ms(10);
            assert!(c.step_ended(s, t).is_none(), "step {s}");
        }
        t += ms(25); // 2.5x: not slow
        assert!(c.step_ended(11, t).is_none());
        t += ms(40); // 4x: slow
        match c.step_ended(12, t) {
            Some(FlightTrigger::SlowStep {
                step,
                dur_ns,
                median_ns,
                ..
            }) => {
                assert_eq!(step, 12);
                assert_eq!(dur_ns, 40_000_000);
                assert_eq!(median_ns, 10_000_000);
            }
            other => panic!("{other:?}"),
        }
        t += ms(40);
        assert!(c.step_ended(13, t).is_none(), "within the interval");
        // The step history keeps the last 4 + 1 starts.
        for i in 0..10 {
            c.step_began(Ticks(i));
        }
        assert_eq!(c.span_start(), Some(Ticks(5)));
    }

    #[test]
    fn collectives_and_syncs_are_recognised() {
        for n in [
            "c10d::allreduce_",
            "nccl:all_reduce",
            "ProcessGroupGloo::allreduce",
            "record_param_comms",
            "cudaDeviceSynchronize",
            "cudaStreamSynchronize",
        ] {
            assert!(is_collective_or_sync(n), "{n}");
        }
        for n in ["aten::mm", "train_step", "ProfilerStep#3"] {
            assert!(!is_collective_or_sync(n), "{n}");
        }
    }
}
