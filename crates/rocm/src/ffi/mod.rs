//! Everything that touches the SDK's C ABI: checked wrappers over the function table
//! ([`calls`]), the process-wide tool state the SDK's callbacks reach and its registration
//! ([`tool`]), and the `extern "C"` trampolines the SDK calls with records ([`callbacks`]). This is
//! the only module of the crate with `unsafe`.
//!
//! Every trampoline catches panics. The hot ones (the buffer callback and the HIP API callback)
//! allocate nothing and take no lock: they copy into the lock-free [`Queue`](crate::queue::Queue)
//! and the [`ExternalIds`](crate::external::ExternalIds) table. The code-object callback (once per
//! kernel symbol, at module load) takes a mutex to remember the kernel's name.

mod callbacks;
mod calls;
pub(crate) mod roctracer;
mod tool;

pub use callbacks::queue_records;
pub(crate) use calls::{
    flush_buffer, get_version, kinds, load, operations, query_agents, start_context, stop_context,
    timestamp, Tracing,
};
pub use calls::{Agent, SdkError};
pub(crate) use tool::{install, register, tool, Names, Plan, Registration, Setup, Tool};
pub use tool::{on_marker, on_tool_initialized, tool_configure, Kinds, Markers};
