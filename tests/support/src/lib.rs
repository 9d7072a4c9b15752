/*!
Test doubles and helpers for kinetrace's own tests, the way `tracing-mock` serves tokio-rs/tracing:
one `publish = false` crate every test crate takes as a dev-dependency, instead of a copy per
`tests/common`.

It sits below the facade (it depends on `kinetrace-core` and `kinetrace-export` only), so any
crate's tests may use it without a dependency pointing up (`tests/it/workspace.rs` checks).

- [`SimulatedGpu`]: an [`ActivitySource`](kinetrace_core::ActivitySource) in memory, so the whole
  pipeline runs without a GPU (also drives `examples/demo.rs`).
- [`process`]: child processes waited on with a deadline, failing with what they printed; running
  one test in a fresh process.
- [`trace`]: finding and parsing written traces (plain or gzip), independently of kinetrace's reader.
- [`dynolog`]: a fake dynolog daemon (its datagram endpoint and replies) for the on-demand client.
- [`users`]: a second local user (created when root) for the tests of what other users cannot do.
- [`fake`]: where the fake libcupti (`tests/fakes/cupti`) was built.
- [`recording`]: a session writing Kineto traces from core and export alone, for backend tests
  that must not depend on the facade; [`Log`] collects one-line messages.
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod dynolog;
pub mod fake;
pub mod process;
pub mod recording;
pub mod simulated;
pub mod trace;
pub mod users;

pub use recording::{annotation, trace_session, Log};
pub use simulated::SimulatedGpu;
