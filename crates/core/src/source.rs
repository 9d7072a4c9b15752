//! The two seams of the pipeline: where records come from ([`ActivitySource`]) and where a finished
//! window's records go ([`Sink`]).
//!
//! Both traits have default bodies for everything optional, so a backend implements only what it
//! supports (the way `tracing_subscriber::Layer` does).

use std::fmt;
use std::path::PathBuf;

use crate::activity::{Activity, ActivitySet, DeviceProperties};
use crate::clock::UnixNanos;
use crate::session::LogFn;

/// Why a source could not do what the session asked. The session logs it once and carries on
/// without that source: profiling problems never stop the host job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    /// The source's name.
    pub source: String,
    /// What went wrong, in one line.
    pub message: String,
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source, self.message)
    }
}

impl std::error::Error for SourceError {}

/// A producer of GPU-side records (CUPTI, rocprofiler-sdk, the simulated GPU in tests).
///
/// CPU-side records (API callbacks) go into the per-thread rings through [`crate::recorder`]; records
/// that arrive in bulk from the vendor (activity buffers) are handed over by [`poll`](Self::poll) and
/// [`flush`](Self::flush).
pub trait ActivitySource: Send {
    /// Short name for messages and metadata (`"cupti"`).
    fn name(&self) -> &str;

    /// Gives the source the session's log, for its one-line messages (problems that do not stop
    /// recording). Called when the source is added to a session; before that a source logs where it
    /// chooses (standard error).
    fn set_log(&mut self, log: LogFn) {
        let _ = log;
    }

    /// `(key, value)` pairs for the trace metadata, e.g. `("cupti_version", "130100")`.
    fn metadata(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Properties of the devices this source sees.
    fn device_properties(&self) -> Vec<DeviceProperties> {
        Vec::new()
    }

    /// Starts producing records of the given types. Called when a window opens (the start of
    /// warm-up). It may be called again, while enabled, for the next window when the previous one
    /// ended too recently to be disabled in between: it must then be harmless, and is the moment
    /// to retry anything that failed for the previous window.
    fn enable(&mut self, activities: ActivitySet) -> Result<(), SourceError>;

    /// Stops producing records (the collector calls it once no window needs the source). Records
    /// already produced stay available to [`flush`](Self::flush).
    fn disable(&mut self) {}

    /// Hands over records completed so far without forcing the vendor to flush. Called periodically by
    /// the collector.
    fn poll(&mut self, emit: &mut dyn FnMut(&Activity)) {
        let _ = emit;
    }

    /// Forces out every completed record and hands it over. Called at the end of a window.
    fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) {
        self.poll(emit)
    }

    /// Whether the last [`enable`](Self::enable) left the source recording less than asked
    /// (another client holds the vendor library, say) in a way a later `enable` may mend: the next
    /// window's enable is then never skipped, even when the source is still on from this one.
    fn degraded(&self) -> bool {
        false
    }

    /// Records this source lost (buffers full, vendor drops), since it was created.
    fn dropped(&self) -> u64 {
        0
    }
}

/// Everything about a window the trace header needs, known once the window has ended.
#[derive(Clone, Debug, Default)]
pub struct TraceMeta {
    /// A 32-hex-digit id for this trace.
    pub trace_id: String,
    /// Host name.
    pub host_name: String,
    /// OS process id.
    pub pid: u32,
    /// Process name (`argv[0]`'s file name).
    pub process_name: String,
    /// Distributed rank, if any.
    pub rank: Option<u32>,
    /// World size, if known.
    pub world_size: Option<u32>,
    /// Devices seen by the sources.
    pub devices: Vec<DeviceProperties>,
    /// Extra top-level keys: (key, value as a JSON string literal's content).
    pub metadata: Vec<(String, String)>,
    /// Records lost, by where they were lost: (`"cpu_ring"`, n), (`"cupti"`, n)...
    pub dropped: Vec<(String, u64)>,
    /// Names of threads that recorded: (tid, name).
    pub thread_names: Vec<(u32, String)>,
    /// Window start.
    pub window_start: UnixNanos,
    /// Window end.
    pub window_end: UnixNanos,
    /// Which cycle of the schedule this trace is (0-based).
    pub cycle: u32,
}

/// The top-level key of a trace whose capture ended inside a step (at exit, on a signal, when
/// stepping aside) rather than at a step boundary: its value is that step's number, and its
/// `ProfilerStep#N` is partial (it runs to the end of the capture: a run's teardown, or the part
/// of an interrupted iteration that was done), so analyses leave it out of step statistics.
pub const PARTIAL_STEP_KEY: &str = "kinetrace_partial_step";

/// What a sink produced for one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOutput {
    /// The file written, if any.
    pub path: Option<PathBuf>,
    /// Records written.
    pub events: u64,
    /// Which cycle of the schedule this trace is (0-based).
    pub cycle: u32,
}

/// A consumer of one window's records (the Kineto exporter; a recording sink in tests).
pub trait Sink: Send {
    /// Takes one record. Called from the collector as records arrive, so a sink should stream.
    fn record(&mut self, activity: &Activity) -> std::io::Result<()>;

    /// Ends the window: writes whatever needs the header facts and publishes the result.
    fn finish(self: Box<Self>, meta: &TraceMeta) -> std::io::Result<TraceOutput>;

    /// Abandons the window (warm-up ended without recording, or the profiler went away): nothing may be
    /// left behind.
    fn discard(self: Box<Self>) {}
}

/// What is known about a window when its sink opens, before the first record: what a sink can write
/// first (a trace file's head). The rest comes with [`TraceMeta`] at [`Sink::finish`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowInfo {
    /// Which cycle of the schedule this window is (0-based).
    pub cycle: u32,
    /// Distributed rank, if any.
    pub rank: Option<u32>,
    /// World size, if known.
    pub world_size: Option<u32>,
    /// OS process id.
    pub pid: u32,
    /// Host name.
    pub host_name: String,
    /// The devices the sources know when the window opens (CUPTI's and rocprofiler-sdk's are
    /// known by then): a trace writes them in its head, as Kineto does, where streaming readers
    /// look. Devices first seen later come with [`TraceMeta::devices`].
    pub devices: Vec<DeviceProperties>,
    /// What the framework recorders have on in this window (written in the head as torch.profiler
    /// writes its switches).
    pub framework: crate::framework::FrameworkOptions,
    /// What the job said of its distributed setup, if it did (then the head's `distributedInfo`
    /// is this, not `rank` and `world_size`).
    pub distributed: Option<std::sync::Arc<crate::framework::DistributedInfo>>,
}

/// Opens one [`Sink`] per window.
pub trait SinkFactory: Send {
    /// Opens the sink for one window.
    fn open(&mut self, window: &WindowInfo) -> std::io::Result<Box<dyn Sink>>;
}

/// A closure taking the cycle is a factory (for sinks that need nothing else at open).
impl<F> SinkFactory for F
where
    F: FnMut(u32) -> std::io::Result<Box<dyn Sink>> + Send,
{
    fn open(&mut self, window: &WindowInfo) -> std::io::Result<Box<dyn Sink>> {
        self(window.cycle)
    }
}
