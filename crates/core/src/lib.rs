/*!
kinetrace's core: the record types every backend produces, the clock they share, the per-thread
lock-free rings CPU-side events are recorded into, the schedule state machine, and the session that
wires sources, rings and a sink together.

The key design decision: recording is a fixed-size copy into a thread-owned single-producer ring, so
the hot path never locks or allocates; everything else (pairing, filtering, export) happens on the
collector side. This crate has no vendor dependency.
*/
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod activity;
pub mod clock;
pub mod flight;
pub mod framework;
pub mod intern;
pub mod launch;
pub mod op_args;
pub mod recorder;
#[allow(unsafe_code)]
pub mod ring;
pub mod schedule;
pub mod session;
pub mod source;
pub mod waits;

pub use activity::*;
pub use clock::UnixNanos;
pub use framework::{DistributedInfo, FrameworkOptions, FrameworkOverrides, ProcessGroupConfig};
pub use intern::{intern, NameId, NameTable};
pub use op_args::ArgsId;
pub use session::{Session, SessionConfig, SessionError, Trigger};
pub use source::{
    ActivitySource, Sink, SinkFactory, SourceError, TraceMeta, TraceOutput, WindowInfo,
};
