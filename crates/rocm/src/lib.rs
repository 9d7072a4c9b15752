/*!
The ROCm backend of kinetrace: an [`ActivitySource`](kinetrace_core::ActivitySource) that records
HIP runtime calls, kernel dispatches and memory copies through rocprofiler-sdk (ROCm 6.2 and later,
SDK ABI 0.x and 1.x), loaded at run time so it builds and runs anywhere.

The key design decision: **the library found at run time decides how bytes are read and what the
numbers mean.** [`loader`] finds the SDK; its `rocprofiler_get_version` picks the ABI (the record
structs of `kinetrace-rocprofiler-sdk-sys`, asserted against the research's layout table); every
kind and operation number is resolved by name through the SDK's own query functions, since 1.0
renumbered them. The SDK's callbacks only copy what the collector needs into a lock-free
[`queue`]; mapping to [`Activity`](kinetrace_core::Activity) happens on the collector thread in
[`decode`].

No AMD GPU has ever run this code: it is verified against the fake library in
`tests/fakes/rocprofiler-sdk`, which implements the same C ABI with the real record layouts.

```no_run
let source = kinetrace_rocm::RocmSource::new(Default::default());
// kinetrace::Profiler::builder().source(source).start()
# drop(source);
```
*/
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod decode;
pub mod external;
#[allow(unsafe_code)]
mod ffi;
mod install;
pub mod loader;
pub mod queue;
pub mod record;
pub mod roctracer;
mod source;

pub use ffi::{
    on_marker, on_tool_initialized, queue_records, tool_configure, Agent, Kinds, Markers, SdkError,
};
pub use roctracer::{TracerError, TracerInfo};
pub use source::{
    queue_stats, Backend, LibraryInfo, QueueStats, RocmConfig, RocmOpenError, RocmSource,
};

/// The raw bindings, for tests and tools that need the vendor structs.
pub use kinetrace_rocprofiler_sdk_sys as sys;
