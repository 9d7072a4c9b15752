/*!
The Kineto trace format, without the runtime: a streaming writer that turns [`kinetrace_core::Activity`]
records into the JSON PyTorch's profiler writes (so Perfetto, TensorBoard and HolisticTraceAnalysis open
it unchanged), and a reader for Kineto traces in every timestamp variant found in the wild.
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod distributed;
mod document;
pub mod encoder;
mod json;
pub mod reader;
pub mod writer;

pub use distributed::parse_distributed_info;
pub use reader::{read_trace, ReadError, Trace, TraceEvent};
pub use writer::{default_worker_name, render_trace, KinetoSink, TraceDir, TraceEncoder};
