//! On-demand control: a per-process Unix socket `kinetrace trigger` talks to.
//!
//! Split by role: [`protocol`] (the request and reply lines), [`server`] (the listening socket in
//! the profiled process, its directory rules and peer checks), [`client`] (what `kinetrace
//! trigger` sends), [`confine`] (output directories in requests stay under the trace root).

use std::path::{Path, PathBuf};

pub mod client;
pub mod confine;
pub mod protocol;
pub mod server;

pub use client::{list_sockets, send};
pub use confine::{confine, open_inside, ConfineError};
pub use protocol::{CaptureLength, CaptureSpec, ProtocolError, Reply, Request};
pub use server::{ControlDirError, ControlServer, PeerUid};

/// This process's effective user id, from `/proc/self/status`.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The socket of process `pid` in `dir`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// `/tmp/kinetrace-<uid>`: where processes listen and `kinetrace trigger` looks by default.
pub fn default_control_dir() -> PathBuf {
    let uid = effective_uid().unwrap_or(0);
    PathBuf::from(format!("/tmp/kinetrace-{uid}"))
}
