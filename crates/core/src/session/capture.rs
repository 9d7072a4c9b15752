//! On-demand captures: what can be asked of a live session, and how the session settles a request.

use std::time::Duration;

use super::{SinkFactory, TraceOutput};
use crate::framework::FrameworkOverrides;
use crate::schedule::ProfilerAction;

/// When an on-demand capture starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureStart {
    /// Now: a step capture includes the current step (from now on); a timed one starts at once.
    Now,
    /// At the next step boundary (timed captures: now).
    NextStep,
    /// At step `n`, or at the next step boundary if `n` is already past.
    AtStep(u64),
    /// This long from now.
    After(Duration),
}

/// How long an on-demand capture records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureLength {
    /// This many whole steps (at least 1), each a `ProfilerStep#N` annotation.
    Steps(u32),
    /// This much wall time.
    Duration(Duration),
}

/// Called once when an on-demand capture ends: the trace written, or why there is none.
pub type CaptureDone = Box<dyn FnOnce(Result<TraceOutput, String>) + Send>;

/// An on-demand capture for a live session (see [`Session::request_capture`]).
pub struct CaptureRequest {
    /// When it starts.
    pub start: CaptureStart,
    /// How long it lasts.
    pub length: CaptureLength,
    /// Where its trace goes, instead of the session's own sinks.
    pub sinks: Option<Box<dyn SinkFactory>>,
    /// Told the outcome when the capture ends.
    pub on_done: Option<CaptureDone>,
    /// What the framework recorders turn on for this capture, where it differs from the session's
    /// own settings (a dynolog request's `PROFILE_REPORT_INPUT_SHAPES`).
    pub framework: FrameworkOverrides,
}

impl CaptureRequest {
    /// A capture of `length` starting at `start`, written by the session's own sinks.
    pub fn new(start: CaptureStart, length: CaptureLength) -> Self {
        CaptureRequest {
            start,
            length,
            sinks: None,
            on_done: None,
            framework: FrameworkOverrides::default(),
        }
    }
}

/// What an accepted capture will record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturePlan {
    /// Steps `first..=last`.
    Steps {
        /// The first recorded step.
        first: u64,
        /// The last recorded step.
        last: u64,
    },
    /// `duration` of wall time starting `delay` from the request.
    Time {
        /// From the request to the start of recording.
        delay: Duration,
        /// Length of the recording.
        duration: Duration,
    },
}

/// Why a capture request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureRefused {
    /// A capture is already in progress or pending; the text says which.
    Busy(String),
    /// The session stepped aside for another profiler (the reason).
    SteppedAside(String),
    /// The session is stopping.
    Stopped,
    /// The request itself is invalid (zero steps or duration).
    Invalid(String),
}

impl std::fmt::Display for CaptureRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureRefused::Busy(what) => write!(f, "busy: {what}"),
            CaptureRefused::SteppedAside(why) => write!(f, "profiling is off: {why}"),
            CaptureRefused::Stopped => write!(f, "the profiler is stopping"),
            CaptureRefused::Invalid(why) => write!(f, "invalid request: {why}"),
        }
    }
}

impl std::error::Error for CaptureRefused {}

/// A snapshot of a session, for status reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionStatus {
    /// The current step number.
    pub step_num: u64,
    /// The current action.
    pub action: ProfilerAction,
    /// The on-demand capture pending or in progress.
    pub capture: Option<CapturePlan>,
    /// Traces written so far.
    pub traces: usize,
    /// Why the session stepped aside, if it did.
    pub stepped_aside: Option<String>,
    /// The session is a flight recorder (always recording; it answers requests with dumps).
    pub flight: bool,
}

pub(super) fn describe_plan(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps {first}..={last}"),
        CapturePlan::Time { delay, duration } => {
            format!(
                "{} ms after a delay of {} ms",
                duration.as_millis(),
                delay.as_millis()
            )
        }
    }
}
