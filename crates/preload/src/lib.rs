/*!
`libkinetrace.so`: the shim that profiles jobs nobody edited. Load it with `LD_PRELOAD` (its
constructor then points `CUDA_INJECTION64_PATH` at itself if that is unset) or name it in
`CUDA_INJECTION64_PATH` (the CUDA driver calls [`InitializeInjection`] during `cuInit`). Loaded
any other way (`kinetrace.profile` loads it with ctypes) it changes no environment variable and
stays dormant until one of its entry points is called.

This crate holds only the C entry points and the few libc calls the safe facade cannot make
(`atexit`, `pthread_atfork`, `sigaction`, `setenv`, `dladdr`, `SO_PEERCRED`, and the signal mask
around stderr writes so a closed pipe cannot raise SIGPIPE), and the handlers that keep the trace
when SIGINT, SIGTERM or SIGHUP ends the job (`exit_signals.rs`). Every entry point is wrapped in
`catch_unwind` and forwards to `kinetrace-agent`, where the behaviour lives: dormant until CUDA
initialises or a step is reported, then one session per process. The constructor installs a panic
hook that turns a panic of kinetrace code into one log line (nothing on the job's stderr).

Exports:
- `InitializeInjection()`: the CUDA driver's injection entry point.
- `InitializeInjectionNvtx2()`: the NVTX injection entry point (`NVTX_INJECTION64_PATH`, which the
  constructor sets when `KINETRACE_STEP_NVTX` is, and the `sitecustomize` in PyTorch processes):
  matching NVTX ranges mark steps, and pushed ranges become spans inside windows (PyTorch's ops).
- `kinetrace_step()`: marks a step (iteration) boundary; the Python module calls it.
- `kinetrace_save_at_exit()`: saves a capture in progress now; the `sitecustomize` calls it from
  Python's `atexit` (an unhandled KeyboardInterrupt ends Python past C's exit handlers).
- `kinetrace_is_active()`: 1 while this process profiles.
- `kinetrace_torch_state()`, `kinetrace_range_push()`, `kinetrace_range_pop()`, `kinetrace_log()`:
  what the Python side uses to turn PyTorch's ops on inside windows and to record module ranges.
- `kinetrace_op_begin()`, `kinetrace_op_end()`: what kinetrace's compiled PyTorch extension
  (`python/kinetrace/_ops_ext.cpp`) calls from its RecordFunction callbacks, once per op in a window;
  `kinetrace_op_args()` and `kinetrace_op_args_generation()`: how it gets the id of an op's args
  text (once per distinct text).
- `kinetrace_flight_exception()`, `kinetrace_flight_thread_exception()`: an exception left the
  Python training loop, or a thread running it (flight recorder).
- `kinetrace_set_distributed_info()`: what the Python side says of `torch.distributed`, written as
  the traces' `distributedInfo`.
- `rocprofiler_configure`: rocprofiler-sdk's tool entry point; when HIP initialises the SDK finds it
  (this library preloaded, or named in `ROCP_TOOL_LIBRARIES`) and kinetrace registers as a tool;
  once initialised, it starts profiling with the GPU as `InitializeInjection` does.
- `kinetrace_profile_start()`, `kinetrace_profile_step()`, `kinetrace_profile_request()`,
  `kinetrace_profile_outputs()`, `kinetrace_profile_stop()`, `kinetrace_config_key_known()`,
  `kinetrace_api_version()`: the in-process API `kinetrace.profile` drives through ctypes (the
  library loaded, not preloaded; configuration handed over as text, see `api.rs`).
- `cuptiActivityRegisterCallbacks`: interposes the CUPTI call torch.profiler's Kineto makes when it
  takes CUPTI over, so kinetrace can step aside first (then forwards to the real one).
*/
#![deny(missing_docs)]

mod api;
mod exit_signals;
mod nvtx;
mod report;
mod shim;
mod torch_ops;

pub use api::{
    kinetrace_api_version, kinetrace_config_key_known, kinetrace_profile_outputs,
    kinetrace_profile_request, kinetrace_profile_start, kinetrace_profile_step,
    kinetrace_profile_stop,
};
pub use nvtx::InitializeInjectionNvtx2;
pub use shim::{
    cuptiActivityRegisterCallbacks, kinetrace_flight_exception, kinetrace_flight_thread_exception,
    kinetrace_is_active, kinetrace_log, kinetrace_range_pop, kinetrace_range_push,
    kinetrace_save_at_exit, kinetrace_set_distributed_info, kinetrace_step, kinetrace_torch_state,
    rocprofiler_configure, InitializeInjection,
};
pub use torch_ops::{
    kinetrace_memory, kinetrace_op_args, kinetrace_op_args_generation, kinetrace_op_begin,
    kinetrace_op_end, kinetrace_py_epoch,
};
