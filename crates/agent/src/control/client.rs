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
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    exchange(stream, request)
}

/// Writes the request and reads the replies. A server that refuses a connection as it accepts it
/// (busy, another user) answers and closes without reading: the write then fails (EPIPE, reset),
/// and the refusal waiting in the socket is the answer.
fn exchange(mut stream: UnixStream, request: &Request) -> std::io::Result<Vec<Reply>> {
    if let Err(e) = writeln!(stream, "{}", request.encode()) {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        if !matches!(e.kind(), BrokenPipe | ConnectionReset) {
            return Err(e);
        }
        let mut line = String::new();
        return match BufReader::new(stream).read_line(&mut line) {
            Ok(n) if n > 0 => Reply::decode(line.trim()).map(|r| vec![r]).ok_or(e),
            _ => Err(e),
        };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers and closes before reading: the request cannot be written, and the
    /// client reports the server's answer instead of the broken pipe.
    #[test]
    fn a_refusal_sent_before_the_request_was_read_is_the_answer() {
        let (client, server) = UnixStream::pair().unwrap();
        let refusal = Reply::new("refused", &[("pid", "7"), ("reason", "busy")]);
        writeln!(&server, "{}", refusal.encode()).unwrap();
        drop(server);
        let replies = exchange(client, &Request::Status).unwrap();
        assert_eq!(replies, vec![refusal]);
    }
}
