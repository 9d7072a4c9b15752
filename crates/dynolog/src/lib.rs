/*!
A client of dynolog's on-demand tracing channel, so that `dyno gputrace` (and unitrace, which runs
it on every host of a SLURM job) reaches kinetrace-profiled processes through an existing dynolog
deployment, unchanged on the dynolog side. It speaks libkineto's side of the protocol: a
background thread polls the node's daemon over a local datagram socket and turns each request it
hands out into a capture of the running session, through the same request path as
`kinetrace trigger` ([`SessionHandle::request_capture`]).

The design decision: one thread per process that never touches the job. It sends a poll at start
and then every interval (Kineto's `ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS`, 5 s by default), waits
~90 ms for the reply, and sleeps in short slices so that stopping it takes at most one of them. A
missing daemon, a malformed reply or a request that cannot be honoured is one log line; nothing
blocks, panics or exits.

Files: `wire.rs` (the 40-byte header and the poll payload), `endpoint.rs` (the socket: abstract or
`KINETO_IPC_SOCKET_DIR` names), `request.rs` (the config text → a [`request::Request`]),
`poller.rs` (the thread, the opt-in rules, the trace's sink and metadata).
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod endpoint;
mod poller;
pub mod request;
pub mod wire;

pub use kinetrace_core::session::SessionHandle;
pub use poller::{ancestor_pids, libkineto_mapped, start, Poller, Settings, REPLY_WAIT};
