//! The capture schedule: a pure state machine (no I/O, no clocks) that says, for each profiler
//! step or each instant of a time window, whether the profiler is idle, warming up or recording,
//! and what the session must do when that changes.
//!
//! Step schedules reproduce `torch.profiler.schedule` of torch 2.15 exactly, `skip_first_wait`
//! and `repeat` included (see `shared/research/kineto-format.md` §5.2). [`commands`] and
//! [`commands_on_exit`] are torch's action map, and a session drives them the way
//! `torch.profiler.profile` does:
//!
//! ```text
//! start:   step_num = 0; cur = action(0); run commands(None, cur)
//! step():  prev = cur; step_num += 1; cur = action(step_num); run commands(prev, cur)
//! stop:    run commands_on_exit(cur)
//! ```
//!
//! `TraceReady` therefore fires inside the `step()` that *leaves* a cycle's last active step, so
//! `step_num` already names the next step. The trace holds the steps recorded since `Start`.

use std::fmt;
use std::time::Duration;

/// What the profiler does during one step: torch's `ProfilerAction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfilerAction {
    /// Sources off; nothing is collected.
    None,
    /// Sources on, so their start-up cost is paid now, but events are discarded.
    Warmup,
    /// Events are kept.
    Record,
    /// Events are kept, and this is the cycle's last step: leaving it saves the trace.
    RecordAndSave,
}

impl ProfilerAction {
    /// torch's spelling: `NONE`, `WARMUP`, `RECORD` or `RECORD_AND_SAVE`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "NONE",
            Self::Warmup => "WARMUP",
            Self::Record => "RECORD",
            Self::RecordAndSave => "RECORD_AND_SAVE",
        }
    }

    /// Whether events produced now are kept (`Record` or `RecordAndSave`).
    pub const fn is_recording(self) -> bool {
        matches!(self, Self::Record | Self::RecordAndSave)
    }
}

/// A step schedule: `torch.profiler.schedule(wait, warmup, active, repeat, skip_first,
/// skip_first_wait)`.
///
/// After `skip_first` idle steps, each cycle is `wait` idle steps, `warmup` warm-up steps and
/// `active` recorded steps, the last of which is [`ProfilerAction::RecordAndSave`]. Every cycle
/// is its own trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// Idle steps before the first cycle.
    pub skip_first: u32,
    /// Leave out the `wait` phase of the first cycle only (torch: `skip_first_wait != 0`).
    pub skip_first_wait: bool,
    /// Idle steps at the start of each cycle.
    pub wait: u32,
    /// Steps per cycle with the sources on but events discarded.
    pub warmup: u32,
    /// Recorded steps per cycle; at least 1.
    pub active: u32,
    /// Number of cycles; 0 repeats until the profiler stops.
    pub repeat: u32,
}

/// The keys [`Schedule::from_pairs`] accepts.
pub const SCHEDULE_KEYS: [&str; 6] = [
    "wait",
    "warmup",
    "active",
    "repeat",
    "skip_first",
    "skip_first_wait",
];

/// torch's warning for a schedule without warm-up (`torch.profiler.schedule`).
pub const NO_WARMUP_WARNING: &str =
    "Profiler won't be using warmup, this can skew profiler results";

impl Schedule {
    /// `wait` idle, `warmup` warm-up and `active` recorded steps per cycle, repeated forever, with
    /// no skipped steps. Fails if `active` is 0.
    pub fn new(wait: u32, warmup: u32, active: u32) -> Result<Schedule, ScheduleError> {
        let s = Self::unchecked(wait, warmup, active);
        s.validate().map(|()| s)
    }

    const fn unchecked(wait: u32, warmup: u32, active: u32) -> Self {
        Self {
            skip_first: 0,
            skip_first_wait: false,
            wait,
            warmup,
            active,
            repeat: 0,
        }
    }

    /// Sets the number of cycles (0: forever).
    pub const fn with_repeat(self, repeat: u32) -> Self {
        Self { repeat, ..self }
    }

    /// Sets the number of idle steps before the first cycle.
    pub const fn with_skip_first(self, n: u32) -> Self {
        Self {
            skip_first: n,
            ..self
        }
    }

    /// Sets whether the first cycle leaves out its `wait` phase.
    pub const fn with_skip_first_wait(self, yes: bool) -> Self {
        Self {
            skip_first_wait: yes,
            ..self
        }
    }

    /// Checks torch's rule: `active >= 1` (the other fields are unsigned, hence valid).
    pub fn validate(&self) -> Result<(), ScheduleError> {
        if self.active == 0 {
            return Err(ScheduleError::new("active", "is 0"));
        }
        Ok(())
    }

    /// torch's warning for this schedule, if any: it warns (but accepts) when `warmup` is 0.
    pub fn warning(&self) -> Option<&'static str> {
        (self.warmup == 0).then_some(NO_WARMUP_WARNING)
    }

    fn cycle_len(&self) -> u128 {
        u128::from(self.wait) + u128::from(self.warmup) + u128::from(self.active)
    }

    /// The action for profiler step `step` (`step_num`: 0 at start, +1 per `step()`), computed
    /// as `schedule_fn` in torch/profiler/profiler.py does. An invalid schedule (`active == 0`)
    /// is `None` throughout.
    pub fn action(&self, step: u64) -> ProfilerAction {
        let skip = u64::from(self.skip_first);
        if self.active == 0 || step < skip {
            return ProfilerAction::None;
        }
        // u128: `step + wait` and the cycle arithmetic cannot overflow.
        let mut s = u128::from(step - skip);
        if self.skip_first_wait {
            s += u128::from(self.wait);
        }
        let n = self.cycle_len();
        if self.repeat > 0 && s / n >= u128::from(self.repeat) {
            return ProfilerAction::None;
        }
        let m = s % n;
        let wait = u128::from(self.wait);
        if m < wait {
            ProfilerAction::None
        } else if m < wait + u128::from(self.warmup) {
            ProfilerAction::Warmup
        } else if m < n - 1 {
            ProfilerAction::Record
        } else {
            ProfilerAction::RecordAndSave
        }
    }

    /// With `repeat > 0`, the step of the last cycle's `RecordAndSave`; every later step is
    /// `None` (saturates at `u64::MAX`). `None` when the schedule repeats forever or is invalid.
    pub fn last_active_step(&self) -> Option<u64> {
        if self.repeat == 0 || self.active == 0 {
            return None;
        }
        let shift = u128::from(self.wait) * u128::from(self.skip_first_wait);
        let last = u128::from(self.skip_first) + u128::from(self.repeat) * self.cycle_len() - 1;
        Some(u64::try_from(last - shift).unwrap_or(u64::MAX))
    }

    /// An explicit step range `[start, end]`, inclusive (the `profile_step_start/end` knob):
    /// `Record` for `start..end`, `RecordAndSave` at `end`, `None` elsewhere; one cycle, no
    /// warm-up. Rejects `end < start`, a `start` beyond `u32::MAX` and a range longer than
    /// `u32::MAX` steps.
    pub fn step_range(start: u64, end: u64) -> Result<Schedule, ScheduleError> {
        if end < start {
            let message = format!("`end` ({end}) is less than `start` ({start})");
            return Err(ScheduleError::new("end", message));
        }
        let skip_first = u32::try_from(start)
            .map_err(|_| ScheduleError::new("start", format!("{start} is too large")))?;
        let too_long = || ScheduleError::new("end", format!("{start}..={end} is too long"));
        let active = u32::try_from(end - start)
            .ok()
            .and_then(|d| d.checked_add(1));
        let s = Self::unchecked(0, 0, active.ok_or_else(too_long)?);
        Ok(s.with_skip_first(skip_first).with_repeat(1))
    }

    /// Parses key/value strings as they come from the environment or a config file, for
    /// example `[("wait", "1"), ("warmup", "1"), ("active", "2")]`.
    ///
    /// Keys are [`SCHEDULE_KEYS`]; values are non-negative integers (`skip_first_wait` also
    /// takes `true`/`false`; any non-zero integer is true, as in torch). Surrounding whitespace
    /// is ignored. `active` is required and at least 1; the other keys default to 0. Unknown,
    /// repeated or missing keys and bad values are errors naming the key.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Schedule, ScheduleError> {
        let mut vals: [Option<u32>; 6] = [None; 6];
        for (key, value) in pairs {
            let key = key.trim();
            let Some(i) = SCHEDULE_KEYS.iter().position(|k| *k == key) else {
                return Err(ScheduleError::new("key", format!("unknown key `{key}`")));
            };
            let field = SCHEDULE_KEYS[i];
            if vals[i].is_some() {
                return Err(ScheduleError::new(field, "is given more than once"));
            }
            vals[i] = Some(parse_value(field, value.trim())?);
        }
        let [wait, warmup, active, repeat, skip_first, skip_first_wait] = vals;
        let s = Schedule {
            skip_first: skip_first.unwrap_or(0),
            skip_first_wait: skip_first_wait.unwrap_or(0) != 0,
            wait: wait.unwrap_or(0),
            warmup: warmup.unwrap_or(0),
            active: active.ok_or_else(|| ScheduleError::new("active", "is missing"))?,
            repeat: repeat.unwrap_or(0),
        };
        s.validate().map(|()| s)
    }
}

fn parse_value(field: &'static str, v: &str) -> Result<u32, ScheduleError> {
    match (field, v.to_ascii_lowercase().as_str()) {
        ("skip_first_wait", "true") => return Ok(1),
        ("skip_first_wait", "false") => return Ok(0),
        _ => {}
    }
    v.parse::<u32>().map_err(|_| {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let message = if v.is_empty() {
            "is empty".to_owned()
        } else if v.strip_prefix('-').is_some_and(digits) {
            format!("{v} is negative")
        } else if digits(v.trim_start_matches('+')) {
            format!("{v} is too large")
        } else {
            format!("`{v}` is not an integer")
        };
        ScheduleError::new(field, message)
    })
}

/// An invalid schedule or time window, naming the offending field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleError {
    /// The field or knob at fault (`active`, `end`, `duration`, ...), or `key` for an unknown key.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl ScheduleError {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }

    /// The accepted form of `field`, as the `Display` output shows it.
    pub fn expected(&self) -> &'static str {
        match self.field {
            "active" => "an integer >= 1",
            "wait" | "warmup" | "skip_first" => "a non-negative integer",
            "repeat" => "a non-negative integer; 0 repeats forever",
            "skip_first_wait" => "0, 1, true or false",
            "key" => "one of wait, warmup, active, repeat, skip_first, skip_first_wait",
            "start" => "a step number up to 4294967295",
            "end" => "end >= start, at most 4294967295 steps after it",
            "duration" => "a duration > 0",
            _ => "a valid value",
        }
    }
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (field, message, expected) = (self.field, &self.message, self.expected());
        write!(f, "invalid schedule `{field}`: ")?;
        write!(f, "{message} (expected {expected})")
    }
}

impl std::error::Error for ScheduleError {}

/// One thing the session must do on a change of action; [`commands`] gives them in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionCommand {
    /// Open a new trace: enable the sources and discard what they produce (torch `prepare_trace`).
    Prepare,
    /// Start keeping events in the trace `Prepare` opened (torch `start_trace`).
    Start,
    /// Stop the sources and close the trace (torch `stop_trace`). Unless `TraceReady` follows,
    /// the trace is discarded.
    Stop,
    /// Export the closed trace and fire `on_trace_ready` (torch `_trace_ready`).
    TraceReady,
    /// Log this warning: the sequence of actions is malformed (torch `warn(...)`). Never
    /// produced by a valid [`Schedule`].
    Warn(&'static str),
}

const WARMUP_NONE: &str = "Incorrect schedule: WARMUP followed by NONE";
const RECORD_NONE: &str = "Incorrect schedule: RECORD followed by NONE";
const RECORD_WARMUP: &str = "Incorrect schedule: RECORD followed by WARMUP";

/// What the session must do, in order, when the action goes from `prev` to `next` (also when
/// they are equal: `RecordAndSave` to `RecordAndSave` saves one trace and opens the next).
///
/// This is torch's action map: the `(prev_action, current_action)` table that
/// `torch.profiler.profile` keeps in `action_map` (torch/profiler/profiler.py, built in
/// `profile.__init__`, or `_get_action_map` in later releases) and `_transit_action` runs. Each
/// arm below was checked against that table entry by entry.
pub fn commands(prev: ProfilerAction, next: ProfilerAction) -> &'static [SessionCommand] {
    use ProfilerAction as A;
    use SessionCommand as C;
    match (prev, next) {
        (A::None, A::None) | (A::Warmup, A::Warmup) => &[],
        (A::Record, A::Record | A::RecordAndSave) => &[],
        (A::None, A::Warmup) => &[C::Prepare],
        (A::None, A::Record | A::RecordAndSave) => &[C::Prepare, C::Start],
        // torch starts and stops the warmed-up trace without saving it.
        (A::Warmup, A::None) => &[C::Warn(WARMUP_NONE), C::Start, C::Stop],
        (A::Warmup, A::Record | A::RecordAndSave) => &[C::Start],
        (A::Record, A::None) => &[C::Warn(RECORD_NONE), C::Stop],
        (A::Record, A::Warmup) => &[C::Warn(RECORD_WARMUP), C::Stop],
        (A::RecordAndSave, A::None) => &[C::Stop, C::TraceReady],
        (A::RecordAndSave, A::Warmup) => &[C::Stop, C::TraceReady, C::Prepare],
        (A::RecordAndSave, A::Record | A::RecordAndSave) => {
            &[C::Stop, C::TraceReady, C::Prepare, C::Start]
        }
    }
}

/// What the session must do when the profiler is stopped or dropped during `current`: torch's
/// `(current, None)` entries of the same action map. `Record`/`RecordAndSave`: stop and save the
/// partial cycle. `Warmup`: start and stop without saving, i.e. discard. `None`: nothing.
pub fn commands_on_exit(current: ProfilerAction) -> &'static [SessionCommand] {
    use SessionCommand as C;
    match current {
        ProfilerAction::None => &[],
        ProfilerAction::Warmup => &[C::Start, C::Stop],
        ProfilerAction::Record | ProfilerAction::RecordAndSave => &[C::Stop, C::TraceReady],
    }
}

/// A time window, measured from when the profiler starts: idle until `delay - warmup`, warm up
/// until `delay`, record until `delay + duration`, then idle for good. One trace.
///
/// The whole recording phase is [`ProfilerAction::RecordAndSave`], the last (and only) "step"
/// of its cycle, so that leaving it stops and saves the trace. A session polling
/// [`action_at`](Self::action_at) must therefore apply [`commands`] only when the action
/// changes, as [`transition`](Self::transition) does, and [`commands_on_exit`] on stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimeWindow {
    /// From the profiler's start to the start of recording.
    pub delay: Duration,
    /// Warm-up just before recording (clipped to `delay`).
    pub warmup: Duration,
    /// Length of the recording; more than zero.
    pub duration: Duration,
}

impl TimeWindow {
    /// Records for `duration` starting `delay` after the profiler starts, without warm-up.
    /// Fails if `duration` is zero.
    pub fn new(delay: Duration, duration: Duration) -> Result<Self, ScheduleError> {
        let warmup = Duration::ZERO;
        let w = Self {
            delay,
            warmup,
            duration,
        };
        w.validate().map(|()| w)
    }

    /// Sets the warm-up before `delay`.
    pub const fn with_warmup(self, warmup: Duration) -> Self {
        Self { warmup, ..self }
    }

    /// Checks that `duration` is not zero.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        if self.duration.is_zero() {
            return Err(ScheduleError::new("duration", "is zero"));
        }
        Ok(())
    }

    /// When recording ends, or `None` if `delay + duration` overflows (it never ends).
    pub fn end(&self) -> Option<Duration> {
        self.delay.checked_add(self.duration)
    }

    /// The action `elapsed` after the profiler started. The window is half-open: `Warmup` from
    /// `delay - warmup`, `RecordAndSave` from `delay`, `None` again from `delay + duration`.
    pub fn action_at(&self, elapsed: Duration) -> ProfilerAction {
        if self.end().is_some_and(|end| elapsed >= end) {
            ProfilerAction::None
        } else if elapsed >= self.delay {
            ProfilerAction::RecordAndSave
        } else if elapsed >= self.delay.saturating_sub(self.warmup) {
            ProfilerAction::Warmup
        } else {
            ProfilerAction::None
        }
    }

    /// The commands for moving from the poll at elapsed time `prev` to the poll at `now`: none
    /// when the action is unchanged, else [`commands`]. A jump from warm-up past the whole
    /// window warns and discards.
    pub fn transition(&self, prev: Duration, now: Duration) -> &'static [SessionCommand] {
        let (a, b) = (self.action_at(prev), self.action_at(now));
        if a == b {
            &[]
        } else {
            commands(a, b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProfilerAction::{None as N, Record as R, RecordAndSave as S, Warmup as W};
    use super::SessionCommand as C;
    use super::*;

    /// A session reduced to its trace state; panics on a command that is illegal where it runs.
    #[derive(Default)]
    struct Sim {
        state: St,
        saved: Vec<Vec<u64>>,
        warned: bool,
    }
    #[derive(Default, Debug)]
    enum St {
        #[default]
        Idle,
        Prepared,
        Started(Vec<u64>),
        Stopped(Vec<u64>),
    }

    impl Sim {
        fn apply(&mut self, cmds: &[SessionCommand]) {
            for c in cmds {
                self.state = match (std::mem::take(&mut self.state), c) {
                    (St::Idle | St::Stopped(_), C::Prepare) => St::Prepared,
                    (St::Prepared, C::Start) => St::Started(Vec::new()),
                    (St::Started(v), C::Stop) => St::Stopped(v),
                    (St::Stopped(v), C::TraceReady) => {
                        self.saved.push(v);
                        St::Idle
                    }
                    (st, C::Warn(_)) => {
                        self.warned = true;
                        st
                    }
                    (st, c) => panic!("{c:?} in state {st:?}"),
                };
            }
        }
        /// The action the state amounts to (a stopped, unsaved trace is as good as none).
        fn phase(&self) -> ProfilerAction {
            match self.state {
                St::Idle | St::Stopped(_) => N,
                St::Prepared => W,
                St::Started(_) => R,
            }
        }
    }

    /// Drives `commands` as torch's `profile` does through step_num `last`, then stops. Returns
    /// the saved traces (as ProfilerStep numbers), the step_nums whose `step()` fired
    /// TraceReady, and whether anything warned.
    fn drive(act: impl Fn(u64) -> ProfilerAction, last: u64) -> (Vec<Vec<u64>>, Vec<u64>, bool) {
        let (mut sim, mut ready, mut cur) = (Sim::default(), Vec::new(), N); // start(): from NONE
        for step_num in 0..=last {
            let prev = std::mem::replace(&mut cur, act(step_num));
            let before = sim.saved.len();
            sim.apply(commands(prev, cur));
            if sim.saved.len() > before {
                ready.push(step_num);
            }
            if let St::Started(v) = &mut sim.state {
                v.push(step_num); // ProfilerStep#step_num runs until the next step()
            }
        }
        sim.apply(commands_on_exit(cur));
        (sim.saved, ready, sim.warned)
    }

    /// Independent reference from §5.2's prose, not its formula: lay the run out one phase at a
    /// time. Returns the action of each step in `0..len` and each cycle's active steps.
    fn reference(s: &Schedule, len: usize) -> (Vec<ProfilerAction>, Vec<Vec<u64>>) {
        let mut acts = vec![N; s.skip_first as usize];
        let mut cycles = Vec::new();
        while acts.len() < len && (s.repeat == 0 || cycles.len() < s.repeat as usize) {
            let skip_wait = cycles.is_empty() && s.skip_first_wait;
            acts.resize(acts.len() + if skip_wait { 0 } else { s.wait as usize }, N);
            acts.resize(acts.len() + s.warmup as usize, W);
            let first = acts.len();
            acts.resize(first + s.active as usize - 1, R);
            acts.push(S);
            cycles.push((first as u64..acts.len() as u64).collect());
        }
        acts.resize(len, N); // cycles exhausted: NONE forever
        (acts, cycles)
    }

    /// `from_pairs` on `"k=v,k=v"`.
    fn parse(spec: &str) -> Result<Schedule, ScheduleError> {
        Schedule::from_pairs(spec.split(',').map(|kv| kv.split_once('=').unwrap()))
    }

    #[test]
    fn torch_doc_table_wait1_warmup1_active2_repeat2_skip1() {
        let s = Schedule::new(1, 1, 2).unwrap().with_repeat(2);
        let s = s.with_skip_first(1);
        let table = [N, N, W, R, S, N, W, R, S, N, N, N];
        for (k, want) in table.iter().enumerate() {
            assert_eq!(s.action(k as u64), *want, "step {k}");
        }
        assert!((12..10_000).all(|k| s.action(k) == N));
        let (saved, ready, warned) = drive(|k| s.action(k), 11);
        assert_eq!(ready, [5, 9], "on_trace_ready fires in step() to 5 and 9");
        assert_eq!(saved, [vec![3, 4], vec![7, 8]]);
        assert!(!warned);
        assert_eq!((s.last_active_step(), s.warning()), (Some(8), None));
    }

    #[test]
    fn exhaustive_against_reference() {
        const LEN: u64 = 60;
        for i in 0..4 * 2 * 4 * 4 * 4 * 4 {
            let digit = |div: u32, base: u32| i / div % base;
            let (skip_first, skip_first_wait) = (digit(1, 4), digit(4, 2) == 1);
            let (wait, warmup, active) = (digit(8, 4), digit(32, 4), 1 + digit(128, 4));
            let repeat = digit(512, 4);
            let s = Schedule {
                skip_first,
                skip_first_wait,
                wait,
                warmup,
                active,
                repeat,
            };
            let (want, cycles) = reference(&s, LEN as usize);
            for k in 0..LEN {
                assert_eq!(s.action(k), want[k as usize], "{s:?} step {k}");
            }
            let last_save = cycles.last().and_then(|c| c.last().copied());
            if s.repeat > 0 {
                assert_eq!(cycles.len(), s.repeat as usize, "{s:?}: all cycles fit");
            }
            let want = last_save.filter(|_| s.repeat > 0);
            assert_eq!(s.last_active_step(), want, "{s:?}");
            // Stop after every step: partial cycles are saved unless still warming up.
            for last in 0..LEN {
                let (saved, ready, warned) = drive(|k| s.action(k), last);
                let cut = |c: &Vec<u64>| c.iter().copied().filter(|&k| k <= last).collect();
                let want_saved: Vec<Vec<u64>> = cycles.iter().map(cut).collect();
                let want_saved: Vec<_> = want_saved.into_iter().filter(|c| !c.is_empty()).collect();
                assert_eq!(saved, want_saved, "{s:?} stopped at {last}");
                let ends = cycles.iter().map(|c| c[c.len() - 1] + 1);
                let want_ready: Vec<_> = ends.filter(|&k| k <= last).collect();
                assert_eq!(ready, want_ready, "{s:?}");
                assert!(!warned, "{s:?}");
            }
        }
    }

    #[test]
    fn action_map_is_consistent() {
        let all = [N, W, R, S];
        // Malformed pairs warn and just stop, as in torch (even RECORD -> WARMUP prepares nothing).
        let bad = |p, n| matches!((p, n), (W, N) | (R, N) | (R, W));
        let level = |p, n| match n {
            _ if bad(p, n) => N,
            S => R,
            n => n,
        };
        for prev in all {
            for next in all {
                let mut sim = Sim::default();
                sim.apply(commands(N, prev)); // reach the state `prev` implies
                sim.apply(commands(prev, next));
                let what = format!("{prev:?} -> {next:?}");
                assert_eq!(sim.phase(), level(prev, next), "{what}");
                assert_eq!(sim.saved.len(), usize::from(prev == S), "{what}");
                assert_eq!(sim.warned, bad(prev, next), "{what}");
            }
            let mut sim = Sim::default();
            sim.apply(commands(N, prev));
            sim.apply(commands_on_exit(prev));
            assert_eq!(sim.phase(), N);
            let saves = usize::from(prev.is_recording());
            assert_eq!(sim.saved.len(), saves, "exit in {prev:?}");
        }
        let restart = [C::Stop, C::TraceReady, C::Prepare, C::Start];
        assert_eq!(commands(S, R), restart);
        assert_eq!(commands(W, N), [C::Warn(WARMUP_NONE), C::Start, C::Stop]);
        assert_eq!(commands_on_exit(W), [C::Start, C::Stop]);
    }

    #[test]
    fn step_range_and_parsing() {
        let r = Schedule::step_range(3, 5).unwrap();
        let got: Vec<_> = (0..9).map(|k| r.action(k)).collect();
        assert_eq!(got, [N, N, N, R, R, S, N, N, N]);
        assert_eq!(r.last_active_step(), Some(5));
        assert_eq!(drive(|k| r.action(k), 20).0, [vec![3, 4, 5]]);
        let one = Schedule::step_range(0, 0).unwrap();
        assert_eq!((one.action(0), one.action(1)), (S, N));
        let longest = Schedule::step_range(1, u32::MAX.into()).unwrap();
        assert_eq!(longest.active, u32::MAX);

        let s = parse("wait= 1 ,warmup=1,active=2,repeat=2,skip_first=1");
        let want = Schedule::new(1, 1, 2).map(|s| s.with_repeat(2).with_skip_first(1));
        assert_eq!(s, want);
        let s = parse("active=3,skip_first_wait=TRUE").unwrap();
        assert!(s.skip_first_wait && s.wait == 0 && s.warmup == 0);
        assert_eq!(s.warning(), Some(NO_WARMUP_WARNING));
        assert!(parse("active=1,skip_first_wait=2").unwrap().skip_first_wait);
        assert!(
            !parse("skip_first_wait=false,active=1")
                .unwrap()
                .skip_first_wait
        );
        assert_eq!(
            Schedule::from_pairs([("active", "1")]),
            Schedule::new(0, 0, 1)
        );
    }

    #[test]
    fn validation_errors_name_the_field() {
        let msg = |r: Result<Schedule, ScheduleError>| r.unwrap_err().to_string();
        let cases: [(Result<Schedule, ScheduleError>, &str); 4] = [
            (Schedule::new(1, 1, 0), "`active`: is 0 (expected an integer >= 1)"),
            (Schedule::step_range(7, 5), "`end`: `end` (5) is less than `start` (7) (expected end >= start, at most 4294967295 steps after it)"),
            (Schedule::step_range(1 << 32, 1 << 32), "`start`: 4294967296 is too large (expected a step number up to 4294967295)"),
            (Schedule::step_range(0, u32::MAX.into()), "`end`: 0..=4294967295 is too long (expected end >= start, at most 4294967295 steps after it)"),
        ];
        for (r, want) in cases {
            assert_eq!(msg(r), format!("invalid schedule {want}"));
        }
        let cases: [(&str, &str, &str); 11] = [
            ("wait=1,active=-2", "active", "`active`: -2 is negative (expected an integer >= 1)"),
            ("warmup=1.5,active=1", "warmup", "`warmup`: `1.5` is not an integer (expected a non-negative integer)"),
            ("warmup=abc", "warmup", "`warmup`: `abc` is not an integer (expected a non-negative integer)"),
            ("active=1,wiat=1", "key", "`key`: unknown key `wiat` (expected one of wait, warmup, active, repeat, skip_first, skip_first_wait)"),
            ("active=0", "active", "`active`: is 0 (expected an integer >= 1)"),
            ("wait=1", "active", "`active`: is missing (expected an integer >= 1)"),
            ("active=1,repeat=99999999999", "repeat", "`repeat`: 99999999999 is too large (expected a non-negative integer; 0 repeats forever)"),
            ("active=1,active=2", "active", "`active`: is given more than once (expected an integer >= 1)"),
            ("active=1,skip_first=", "skip_first", "`skip_first`: is empty (expected a non-negative integer)"),
            ("active=1,skip_first=-1", "skip_first", "`skip_first`: -1 is negative (expected a non-negative integer)"),
            ("active=1,skip_first_wait=yes", "skip_first_wait", "`skip_first_wait`: `yes` is not an integer (expected 0, 1, true or false)"),
        ];
        for (pairs, field, want) in cases {
            let e = parse(pairs).unwrap_err();
            let want = (field, format!("invalid schedule {want}"));
            assert_eq!((e.field, e.to_string()), want);
        }
        let e = TimeWindow::new(Duration::from_secs(1), Duration::ZERO).unwrap_err();
        let e: Box<dyn std::error::Error> = Box::new(e);
        let want = "invalid schedule `duration`: is zero (expected a duration > 0)";
        assert_eq!(e.to_string(), want);
    }

    #[test]
    fn time_window_phases_at_boundaries() {
        let (ms, ns) = (Duration::from_millis, Duration::from_nanos);
        let w = TimeWindow::new(ms(100), ms(50)).map(|w| w.with_warmup(ms(20)));
        let w = w.unwrap();
        let at = |t: Duration| w.action_at(t);
        assert_eq!([at(ms(0)), at(ms(79)), at(ms(80) - ns(1))], [N, N, N]);
        assert_eq!([at(ms(80)), at(ms(100) - ns(1))], [W, W]);
        assert_eq!([at(ms(100)), at(ms(150) - ns(1))], [S, S]);
        assert_eq!([at(ms(150)), at(Duration::MAX)], [N, N]);
        assert_eq!(w.end(), Some(ms(150)));

        assert_eq!(w.transition(ms(0), ms(80)), [C::Prepare]);
        assert_eq!(w.transition(ms(90), ms(100)), [C::Start]);
        assert_eq!(w.transition(ms(100), ms(149)), []);
        assert_eq!(w.transition(ms(120), ms(150)), [C::Stop, C::TraceReady]);
        assert_eq!(w.transition(ms(0), ms(500)), []);
        assert_eq!(w.transition(ms(90), ms(500)), commands(W, N));
        assert_eq!(commands_on_exit(at(ms(120))), [C::Stop, C::TraceReady]);

        // Polling every 10 ms saves exactly one trace.
        let mut sim = Sim::default();
        sim.apply(commands(N, at(ms(0))));
        for t in 1..40 {
            sim.apply(w.transition(ms(10 * (t - 1)), ms(10 * t)));
        }
        sim.apply(commands_on_exit(at(ms(390))));
        assert_eq!((sim.saved.len(), sim.warned), (1, false));

        let early = TimeWindow::new(ms(10), ms(5)).unwrap().with_warmup(ms(50));
        let got = [ms(0), ms(10), ms(15)].map(|t| early.action_at(t));
        assert_eq!(got, [W, S, N]);
        let now = TimeWindow::new(Duration::ZERO, ms(1)).unwrap();
        assert_eq!([Duration::ZERO, ms(1)].map(|t| now.action_at(t)), [S, N]);
        let never = TimeWindow::new(Duration::MAX, ms(1)).unwrap();
        assert_eq!((never.end(), never.action_at(Duration::MAX)), (None, S));
    }
}
