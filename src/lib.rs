/*!
kinetrace: an in-process GPU profiler runtime that writes traces in the Kineto JSON format PyTorch's
profiler writes, so Perfetto, TensorBoard's profiler plugin and HolisticTraceAnalysis open them
unchanged.

```no_run
use kinetrace::{Profiler, Schedule};

let profiler = Profiler::builder()
    .schedule(Schedule::new(1, 1, 2).unwrap().with_repeat(1))
    .output_dir("traces")
    .start()
    .expect("profiler starts");
for _ in 0..6 {
    let _step = kinetrace::record_function("forward");
    // ... train ...
    profiler.step();
}
let written = profiler.stop();
println!("{written:?}");
```

The GPU is recorded by default when a supported runtime is present (CUDA, through CUPTI loaded at
run time); elsewhere the profiler records CPU activity only and says why in one line.
[`ProfilerBuilder::cpu_only`] opts out.

This crate is what a library user needs and nothing else: [`Profiler`], the `record_function`
guards and [`span!`], the `tracing` layer, and the types they take. The record model, rings and
session live in `kinetrace-core`, the format in `kinetrace-export` (re-exported as [`export`]);
backends implement [`ActivitySource`]. Profiling a job nobody edited (the preload shim, its
environment configuration and control socket) is `kinetrace-agent`'s job, built on this crate.
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use kinetrace_core::activity::{self, ActivitySet, ActivityType};
pub use kinetrace_core::flight::{
    FlightConfig, FlightSpan, FlightTrigger, SlowStepRule, DEFAULT_FLIGHT_AFTER,
    DEFAULT_FLIGHT_MEMORY,
};
pub use kinetrace_core::intern::{intern, NameId};
pub use kinetrace_core::recorder::{Callsite, SpanGuard};
pub use kinetrace_core::schedule::{ProfilerAction, Schedule, ScheduleError, TimeWindow};
pub use kinetrace_core::session::{
    CaptureDone, CaptureLength, CapturePlan, CaptureRefused, CaptureRequest, CaptureStart,
    FlightRefused, SessionStatus,
};
pub use kinetrace_core::{
    ActivitySource, DistributedInfo, FrameworkOptions, FrameworkOverrides, ProcessGroupConfig,
    SessionError, Sink, SinkFactory, SourceError, TraceMeta, TraceOutput, UnixNanos, WindowInfo,
};
pub use kinetrace_export as export;

pub mod env;
mod gpu;
#[cfg(feature = "tracing")]
pub mod layer;
mod profiler;

#[cfg(feature = "tracing")]
pub use layer::KinetraceLayer;
pub use profiler::{Error, FlightHandle, Profiler, ProfilerBuilder};

/// The ROCm tool entry points a library exporting `rocprofiler_configure` (the preload shim)
/// forwards to; see `kinetrace_rocm::tool_configure` and `kinetrace_rocm::on_tool_initialized`.
#[cfg(feature = "rocm")]
#[doc(hidden)]
pub mod rocm_tool {
    pub use kinetrace_rocm::{on_marker, on_tool_initialized, tool_configure};
}

/// Version and git facts stamped by `build.rs`, written into trace metadata.
pub const BUILD_INFO: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("KINETRACE_GIT_HASH"),
    ")"
);

/// Opens a named range (a `user_annotation`, like `torch.profiler.record_function`) that ends when
/// the guard drops. Costs one relaxed load when no profiler is recording. The name is interned the
/// first time a thread uses it and then found by its address, so a string literal costs no hashing;
/// for names built at run time use [`record_function_dyn`].
#[inline(always)]
pub fn record_function(name: &'static str) -> SpanGuard {
    SpanGuard::enter_static(name, true)
}

/// Like [`record_function`] for a name that is not `'static` (built at run time): the name is
/// hashed and looked up on every call while recording.
#[inline]
pub fn record_function_dyn(name: &str) -> SpanGuard {
    if !kinetrace_core::recorder::is_active() {
        return SpanGuard::inactive();
    }
    SpanGuard::enter(intern(name), true)
}

/// Whether spans are timed with the CPU's time-stamp counter in this process (an invariant counter
/// the kernel trusts), rather than `CLOCK_MONOTONIC`.
pub fn clock_is_tsc() -> bool {
    kinetrace_core::clock::ticks_are_tsc()
}

/// Opens a `user_annotation` range whose name is interned once per call site (the cheapest form for
/// hot code): `let _g = kinetrace::span!("forward");`. The name must be a `'static` string.
#[macro_export]
macro_rules! span {
    ($name:expr) => {{
        static CALLSITE: $crate::Callsite = $crate::Callsite::new($name);
        $crate::record_function_id(CALLSITE.name_id())
    }};
}

/// Like [`record_function`] with a name interned ahead of time (the cheapest form, for hot loops).
#[inline(always)]
pub fn record_function_id(name: NameId) -> SpanGuard {
    SpanGuard::enter(name, true)
}

/// Opens a `cpu_op` range (an operator, as opposed to a user annotation).
#[inline]
pub fn record_op(name: NameId) -> SpanGuard {
    SpanGuard::enter(name, false)
}
