//! The control socket's client side (`kinetrace trigger`): find the listening processes, send a
//! request, read the replies with a bound on each read.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::{CaptureSpec, Reply, Request};

/// The processes with a control socket in `dir`, by pid (ascending).
pub fn list_sockets(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid = name.strip_suffix(".sock")?.parse().ok()?;
            Some((pid, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Sends `request` to the socket at `path` and returns the replies (one, or two for a `wait`
/// capture). `timeout` bounds each read.
pub fn send(path: &Path, request: &Request, timeout: Duration) -> std::io::Result<Vec<Reply>> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    writeln!(stream, "{}", request.encode())?;
    let wait = matches!(request, Request::Capture(CaptureSpec { wait: true, .. }));
    let mut replies = Vec::new();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let reply = Reply::decode(line.trim()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad reply `{}`", line.trim()),
            )
        })?;
        let more = wait && reply.verb == "accepted";
        replies.push(reply);
        if !more {
            break;
        }
    }
    Ok(replies)
}
