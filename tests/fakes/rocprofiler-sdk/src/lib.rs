/*!
A fake `librocprofiler-sdk` for tests (never shipped). It implements the part of the SDK's C ABI
kinetrace uses: the version query, the registration dance (`rocprofiler_force_configure` → the
tool's `rocprofiler_configure` → its `initialize`, after which configuration is locked), contexts,
buffers, buffer and callback tracing services, the kind/operation name queries and iterators,
agents and flushing. Records are written in the **real layouts of the ABI the reported version
implies** (the `#[repr(C)]` types of `kinetrace-rocprofiler-sdk-sys`, whose offsets are asserted
there against the research table): 0.x (16-byte correlation id, 56-byte callback record, 80-byte
copy record, client id without `size`) or 1.x (24-byte correlation id, 64-byte callback record,
96-byte copy record).

Workloads are driven by the test through `fake_rocp_*` entry points that behave like HIP calls on
the calling thread: the HIP API callback at ENTER and EXIT (one `rocprofiler_user_data_t` per call
and service, shared by both phases, as the SDK does) on every active context that traces
`HIP_RUNTIME_API`, and the asynchronous records (kernel dispatch, memory copy) of the call appended
to the buffer of every active context that traces their kind, carrying the call's correlation id.
Code-object loads call the `CODE_OBJECT` callback. `fake_rocp_runtime_init` is HIP initialising:
the tools in `ROCP_TOOL_LIBRARIES` and the `rocprofiler_configure` visible through `RTLD_DEFAULT`
(a preloaded library's) are registered then, as rocprofiler-register and the SDK do. A buffer is handed to its callback when it
reaches its watermark and at `rocprofiler_flush_buffer`, on the calling thread (the real SDK uses a
background thread; the callback must not care).

Finalization, as the real SDK does it: once a tool with a `finalize` has been initialised, the SDK
registers its own `atexit` handler (after the tools' `initialize`, so a handler a tool registered
inside `initialize` runs after it). Finalizing stops every context (work in flight completes into
its buffer), runs each tool's `finalize` (a flush in there still hands records over), and then the
SDK is finalized: `rocprofiler_flush_buffer` answers FINALIZED (21, "Invalid request because
rocprofiler has finalized"), `rocprofiler_start_context` CONFIGURATION_LOCKED, and
`rocprofiler_stop_context` SUCCESS (everything is stopped). What a buffer still holds then is never
delivered. `fake_rocp_finalize` finalizes on the spot.

The machine: one CPU agent and two GPU agents (`gfx90a`, 104 CUs, wavefront 64).

Numbers: kind and operation numbers follow the real ones of each ABI (buffer-tracing kinds were
renumbered in 1.0), except the HIP API operation ids, which are the real 7.0 ones for the launch,
copy and allocation calls and the fake's own otherwise (a tool must resolve them by name anyway).
Error statuses are 1.x's.

Fault injection (environment, read once):
- `FAKE_ROCP_VERSION=M.m.p` — the version reported (default `1.1.0`); `0.x` switches the layouts.
- `FAKE_ROCP_FAIL=rocprofiler_start_context,...` — those entry points fail with status 1 (ERROR).
- `FAKE_ROCP_DROP_EVERY=N` — every Nth asynchronous record is dropped and reported in the next
  buffer callback's `drop_count`.
- `FAKE_ROCP_ALREADY_INITIALIZED=1` — the SDK was initialised before the tool asked: `is_initialized`
  answers 1 and `force_configure` answers CONFIGURATION_LOCKED (a tool registered too late).
- `FAKE_ROCP_RENUMBER=1` — every kind and operation number is shifted (by 40 and 7): a tool that
  hard-codes numbers reads the wrong records.
- `FAKE_ROCP_OTHER_TOOL=1` — another tool (as PyTorch's Kineto is) registered first: it has its own
  started context tracing kernel dispatches into its own buffer, whose records the fake counts
  (`other_tool_records`), and the configure call gets priority 1.
- `FAKE_ROCP_COMPLETE_AT_STOP=1` — asynchronous records stay in flight (the GPU still runs the
  work) until their context stops, which writes them into the buffer: records produced after a
  window's last flush and before the context stop, which a tool must still flush and read.
*/
#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

mod faults;
mod machine;
mod names;

pub mod exports;
pub mod workload;

pub use workload::FakeStats;

pub(crate) use std::ffi::{c_char, c_void, CStr};
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
pub(crate) use std::sync::{Mutex, MutexGuard, OnceLock};

pub(crate) use kinetrace_rocprofiler_sdk_sys::{
    self as sys, v0, v1, Abi, AgentId, AgentPrefix, AgentsCallback, AsyncCorrelationId,
    BufferCallback, BufferId, CallbackTracingFn, ConfigureFn, ContextId, Dim3, KernelDispatchInfo,
    KernelDispatchRecord, KernelSymbolRegisterData, KindCallback, OperationCallback, QueueId,
    RecordHeader, Status, UserData,
};

pub(crate) use faults::*;
pub(crate) use machine::*;
pub(crate) use names::*;

pub(crate) const ERROR: Status = 1;
pub(crate) const CONTEXT_NOT_FOUND: Status = 2;
pub(crate) const BUFFER_NOT_FOUND: Status = 3;
pub(crate) const KIND_NOT_FOUND: Status = 4;
pub(crate) const OPERATION_NOT_FOUND: Status = 5;
pub(crate) const CONTEXT_ID_NOT_ZERO: Status = 13;
pub(crate) const CONFIGURATION_LOCKED: Status = 16;
pub(crate) const NOT_IMPLEMENTED: Status = 17;
pub(crate) const INCOMPATIBLE_ABI: Status = 18;
pub(crate) const INVALID_ARGUMENT: Status = 19;
pub(crate) const FINALIZED: Status = 21;
