/*!
kinetrace's injected-process runtime: what profiles a job nobody edited. The preload shim
(`libkinetrace.so`, crate `kinetrace-preload`) holds only C entry points and forwards each to a
function here; `kinetrace record` and `kinetrace trigger` (crate `kinetrace-cli`) use the
configuration table and the control client.

The life of a process ([`state`] draws it):

- **Dormant** from load until CUDA initialises ([`cuda_initializing`], from the driver's call of
  `InitializeInjection`) or the job reports a step ([`step`], from the optimizer hook or an
  explicit call). A process that does neither (a shell, a launcher, a compiler) never reads the
  configuration, starts no thread and writes nothing.
- **Running**: the configuration ([`config`]) is read, ranks not selected go **Off** quietly, a
  malformed configuration goes Off with one message. Otherwise a [`kinetrace::Profiler`] starts,
  built through the public `ProfilerBuilder` like any library user's (with the GPU backend once
  CUDA is up), the configured window is applied, and the control socket ([`control`]) listens
  for `kinetrace trigger`.
- **Forked**: a child forked from a running (or starting) process keeps nothing: no capture, no
  flush, no file (its copy of the parent's locks may be held), even if it initialises CUDA. A
  child of a dormant process (a launcher, a worker pool made before CUDA) never starts at a step
  (multiprocessing workers report none of their own, and may leave with `os._exit`): only
  initialising CUDA itself starts it, and then rank selection applies as usual. Exec'd children
  start afresh.
- At exit ([`at_exit`]), when a Python interpreter finalises (Ctrl-C's KeyboardInterrupt ends
  Python past C's exit handlers), and when SIGINT, SIGTERM or SIGHUP ends the process
  ([`at_fatal_signal`]), a capture in progress (the preloaded shim's, or a `kinetrace.profile`
  the job never stopped) is saved within [`EXIT_BUDGET`]; past it the unfinished files are
  removed and the process ends anyway, leaving no partial trace.
- Starting also removes, on a helper thread, what processes of the same user on this host (and
  pid namespace) left when they were killed or left with `_exit` (spools, temporary traces,
  control sockets); the end of the process waits for it within what is left of the same budget,
  so a short process finishes it too.
- If another CUPTI client takes over ([`foreign_cupti_client`]) or another tool is injected,
  kinetrace steps aside with one message.

Nothing here may change the job's behaviour: every line goes through one log function ([`log()`],
which the profiler is given too), which ignores write errors (the shim's stderr writer also keeps a
closed pipe from raising SIGPIPE), and a panic in kinetrace code is reported as one line by the
shim's panic hook ([`panicked`]), never on the job's stderr; a panic while starting turns profiling
off for good.

Files: `process.rs` (the process state and the entry points), `state.rs` (phases and the pure
transition function), `start.rs` (configuration → profiler), `embed.rs` (`kinetrace.profile`'s
in-process profiler), `exit.rs` (the save at the end, however the process ends), `serve.rs` (the
control thread and requests), `cleanup.rs` (what killed processes left), `log.rs` (the log channel
and panics), `ops.rs` (PyTorch's ops as spans), `args.rs` (the check of ops' args texts),
`config/` (the key table and parser), `control/` (protocol, server, client, path confinement).
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod args;
mod cleanup;
pub mod config;
pub mod control;
pub mod embed;
mod exit;
mod log;
pub mod ops;
mod process;
mod serve;
mod start;
pub mod state;

pub use cleanup::process_is_gone;
pub use exit::signal_name;
pub use kinetrace::rocm_tool;
pub use log::{log, panicked, StderrWriter};
pub use process::{
    after_fork_child, at_exit, at_fatal_signal, cuda_initializing, flight_exception,
    foreign_cupti_client, is_running, nvtx_attach, nvtx_pop, nvtx_push, nvtx_range, range_pop,
    range_push, set_distributed_info, set_library_path, set_peer_uid, set_stderr_writer,
    signal_received, step, torch_state, Install, EXIT_BUDGET,
};
pub use serve::SubmitError;
pub use start::{loaded_cupti_paths, no_cuda_message, StartError, MEMORY_WITHOUT_CUDA};
