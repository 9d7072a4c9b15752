//! The control socket's server side: each profiled process listens on `<dir>/<pid>.sock`.
//!
//! The directory is created with mode 0700 and refused if another user owns it or others may enter
//! it; the socket itself is made 0600. On top of the file modes, each connection's peer user is
//! checked (when the embedding gives a way to read it; the preload shim does, with `SO_PEERCRED`)
//! and a request from another user is refused with a reply saying so.
//!
//! Connections are served from the polling thread without blocking it: each keeps its partial
//! request line between polls, so one slow or idle client delays no other. At most
//! [`MAX_PENDING`] may wait at once, each for [`REQUEST_TIMEOUT`]; a request line longer than
//! [`MAX_REQUEST_BYTES`] is refused, never cut and obeyed.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::protocol::{Reply, Request};
use super::{effective_uid, socket_path};

/// Reads the user id of a connected peer (the preload shim supplies one based on `SO_PEERCRED`).
pub type PeerUid = fn(&UnixStream) -> std::io::Result<u32>;

/// Why the control socket cannot listen.
#[derive(Debug)]
pub enum ControlDirError {
    /// The directory cannot be created.
    Create {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The directory cannot be read.
    Read {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// It is not a directory.
    NotADirectory(PathBuf),
    /// Another user owns it.
    Owner {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's user.
        me: u32,
    },
    /// Others may enter it.
    Mode {
        /// The directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The socket cannot be bound.
    Listen {
        /// The socket.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The socket cannot be made non-blocking.
    SetUp {
        /// The socket.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

impl fmt::Display for ControlDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlDirError::Create { dir, error } => write!(
                f,
                "cannot create the control directory {}: {error}",
                dir.display()
            ),
            ControlDirError::Read { dir, error } => {
                write!(f, "cannot read {}: {error}", dir.display())
            }
            ControlDirError::NotADirectory(dir) => write!(f, "{} is not a directory", dir.display()),
            ControlDirError::Owner { dir, owner, me } => write!(
                f,
                "the control directory {} belongs to user {owner}, not to this user ({me}); set KINETRACE_CONTROL_DIR",
                dir.display()
            ),
            ControlDirError::Mode { dir, mode } => write!(
                f,
                "the control directory {} has mode {mode:o}; it must be 0700 (chmod 700 it)",
                dir.display()
            ),
            ControlDirError::Listen { path, error } => {
                write!(f, "cannot listen on {}: {error}", path.display())
            }
            ControlDirError::SetUp { path, error } => {
                write!(f, "cannot set up {}: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for ControlDirError {}

/// Creates the socket directory (mode 0700) or checks an existing one: it must be a directory
/// owned by this user that no one else can enter.
pub fn prepare_dir(dir: &Path) -> Result<(), ControlDirError> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| ControlDirError::Create {
                dir: dir.to_path_buf(),
                error,
            })?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|error| ControlDirError::Read {
        dir: dir.to_path_buf(),
        error,
    })?;
    let me = effective_uid().unwrap_or(u32::MAX);
    if !meta.is_dir() {
        return Err(ControlDirError::NotADirectory(dir.to_path_buf()));
    }
    if meta.uid() != me {
        return Err(ControlDirError::Owner {
            dir: dir.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(ControlDirError::Mode {
            dir: dir.to_path_buf(),
            mode: meta.mode() & 0o777,
        });
    }
    Ok(())
}

/// The longest request line served, in bytes without the newline. A longer one is refused whole:
/// acting on a cut line could run a request the client never sent.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// Connections waiting for their request line at once; one more is refused (busy) until some are
/// served or time out. Bounds the memory and descriptors a client can hold in the host job.
pub const MAX_PENDING: usize = 16;

/// How long a connection may take to send its request line before it is refused.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A listening control socket.
///
/// Served by [`poll`](Self::poll) from one thread, without blocking: every connection is
/// non-blocking and keeps its partial line between polls, so a client that connects and says
/// nothing delays no one else (it is refused after [`REQUEST_TIMEOUT`]). No thread is started
/// per connection; only a `wait` capture's final reply is written from a thread of its own.
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    peer_uid: Option<PeerUid>,
    uid: u32,
    pending: std::sync::Mutex<Vec<Pending>>,
    request_timeout: Duration,
}

/// An accepted connection still sending its request line.
struct Pending {
    stream: UnixStream,
    line: Vec<u8>,
    since: Instant,
}

/// What reading a pending connection gave.
enum Received {
    /// No full line yet.
    Waiting,
    /// A request line (without its newline).
    Line(String),
    /// Refuse with this reason.
    Refuse(String),
    /// The client left or the socket failed: drop it silently.
    Gone,
}

/// What the server does with a request from an accepted peer: the first reply, and for `wait`
/// captures a receiver the final reply arrives on.
pub type Handler<'a> = &'a dyn Fn(Request) -> (Reply, Option<std::sync::mpsc::Receiver<Reply>>);

impl ControlServer {
    /// Listens on `<dir>/<pid>.sock` (see [`prepare_dir`] for the directory's rules).
    pub fn bind(
        dir: &Path,
        pid: u32,
        peer_uid: Option<PeerUid>,
    ) -> Result<ControlServer, ControlDirError> {
        prepare_dir(dir)?;
        let path = socket_path(dir, pid);
        // A leftover of an earlier process with this pid.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|error| ControlDirError::Listen {
            path: path.clone(),
            error,
        })?;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        listener
            .set_nonblocking(true)
            .map_err(|error| ControlDirError::SetUp {
                path: path.clone(),
                error,
            })?;
        Ok(ControlServer {
            listener,
            path,
            peer_uid,
            uid: effective_uid().unwrap_or(u32::MAX),
            pending: std::sync::Mutex::new(Vec::new()),
            request_timeout: REQUEST_TIMEOUT,
        })
    }

    /// Changes how long a connection may take to send its request line ([`REQUEST_TIMEOUT`]).
    pub fn set_request_timeout(&mut self, timeout: Duration) {
        self.request_timeout = timeout;
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listening descriptor (a forked child closes it).
    pub fn raw_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.listener.as_raw_fd()
    }

    /// Accepts the connections waiting now and serves every one whose request line has arrived;
    /// never blocks. Returns how many connections were finished (answered or dropped). A `wait`
    /// capture is finished on its own thread.
    pub fn poll(&self, handler: Handler<'_>) -> usize {
        // Taken out so that a panicking handler cannot poison anything for the next poll.
        let mut pending =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let pid = std::process::id().to_string();
        let mut finished = 0;
        while let Ok((stream, _)) = self.listener.accept() {
            // The peer's user first: another user's connection is answered and closed at once.
            if let Some(reason) = self.foreign_peer(&stream) {
                refuse(stream, &pid, &reason);
                finished += 1;
                continue;
            }
            if pending.len() >= MAX_PENDING {
                let reason = format!(
                    "busy: {MAX_PENDING} connections are already waiting to send their request; try again"
                );
                refuse(stream, &pid, &reason);
                finished += 1;
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                finished += 1;
                continue;
            }
            pending.push(Pending {
                stream,
                line: Vec::new(),
                since: Instant::now(),
            });
        }
        let mut i = 0;
        while i < pending.len() {
            let state = read_some(&mut pending[i], self.request_timeout);
            if matches!(state, Received::Waiting) {
                i += 1;
                continue;
            }
            let conn = pending.swap_remove(i);
            finished += 1;
            match state {
                Received::Line(line) => serve(conn.stream, &pid, &line, handler),
                Received::Refuse(reason) => refuse(conn.stream, &pid, &reason),
                Received::Gone | Received::Waiting => {}
            }
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append(&mut pending);
        finished
    }

    /// Why this peer may not talk to us, if it may not.
    fn foreign_peer(&self, stream: &UnixStream) -> Option<String> {
        let peer_uid = self.peer_uid?;
        match peer_uid(stream) {
            Ok(uid) if uid == self.uid => None,
            Ok(uid) => Some(format!(
                "user {uid} may not control this process (it belongs to user {}); run kinetrace trigger as that user",
                self.uid
            )),
            Err(e) => Some(format!("cannot identify the peer: {e}")),
        }
    }
}

/// Reads what has arrived on `conn` without blocking.
fn read_some(conn: &mut Pending, timeout: Duration) -> Received {
    let mut chunk = [0u8; 1024];
    loop {
        // Never more than one byte past the limit: enough to tell an over-long line.
        let room = (MAX_REQUEST_BYTES + 1).saturating_sub(conn.line.len());
        let want = room.min(chunk.len());
        match (&conn.stream).read(&mut chunk[..want.max(1)]) {
            Ok(0) => {
                // The client closed its side: what it sent is the whole request, if anything.
                return if conn.line.is_empty() {
                    Received::Gone
                } else {
                    finish_line(std::mem::take(&mut conn.line))
                };
            }
            Ok(n) => {
                let start = conn.line.len();
                conn.line.extend_from_slice(&chunk[..n]);
                if let Some(at) = conn.line[start..].iter().position(|b| *b == b'\n') {
                    let mut line = std::mem::take(&mut conn.line);
                    line.truncate(start + at);
                    return finish_line(line);
                }
                if conn.line.len() > MAX_REQUEST_BYTES {
                    return Received::Refuse(format!(
                        "the request line is longer than {MAX_REQUEST_BYTES} bytes; nothing was done"
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return if conn.since.elapsed() >= timeout {
                    Received::Refuse(format!(
                        "no complete request line within {} ms",
                        timeout.as_millis()
                    ))
                } else {
                    Received::Waiting
                };
            }
            Err(_) => return Received::Gone,
        }
    }
}

fn finish_line(line: Vec<u8>) -> Received {
    if line.len() > MAX_REQUEST_BYTES {
        return Received::Refuse(format!(
            "the request line is longer than {MAX_REQUEST_BYTES} bytes; nothing was done"
        ));
    }
    match String::from_utf8(line) {
        Ok(l) => Received::Line(l),
        Err(_) => Received::Refuse("the request line is not UTF-8".into()),
    }
}

/// Writes one reply line. The socket is non-blocking and its buffer empty, so a line this short
/// goes out whole or the client is gone.
fn reply(mut stream: &UnixStream, r: &Reply) -> bool {
    let mut line = r.encode();
    line.push('\n');
    stream.write_all(line.as_bytes()).is_ok()
}

fn refuse(stream: UnixStream, pid: &str, reason: &str) {
    let _ = reply(
        &stream,
        &Reply::new("refused", &[("pid", pid), ("reason", reason)]),
    );
}

fn serve(stream: UnixStream, pid: &str, line: &str, handler: Handler<'_>) {
    let (first, later) = match Request::decode(line.trim()) {
        Ok(r) => handler(r),
        Err(reason) => (
            Reply::new("refused", &[("pid", pid), ("reason", &reason.to_string())]),
            None,
        ),
    };
    if !reply(&stream, &first) {
        return;
    }
    if let Some(rx) = later {
        // The final reply may come much later; a blocking write with a bound, off this thread.
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = std::thread::Builder::new()
            .name("kinetrace-reply".into())
            .spawn(move || {
                if let Ok(r) = rx.recv() {
                    let _ = reply(&stream, &r);
                }
            });
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::{list_sockets, send};
    use super::*;
    use std::io::{BufRead, BufReader};

    #[test]
    fn the_control_directory_must_be_private_and_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ctl");
        prepare_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = prepare_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("mode 755") && e.contains("0700"), "{e}");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(prepare_dir(&file)
            .unwrap_err()
            .to_string()
            .contains("not a directory"));
    }

    #[test]
    fn a_server_answers_and_refuses_other_users() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ctl");
        let me = effective_uid().unwrap();
        let server = ControlServer::bind(&dir, 77, Some(|_| Ok(effective_uid().unwrap()))).unwrap();
        assert_eq!(
            std::fs::metadata(server.path()).unwrap().mode() & 0o777,
            0o600
        );
        assert_eq!(list_sockets(&dir), vec![(77, server.path().to_path_buf())]);
        let path = server.path().to_path_buf();
        let client =
            std::thread::spawn(move || send(&path, &Request::Status, Duration::from_secs(5)));
        let handler = |r: Request| {
            assert_eq!(r, Request::Status);
            (Reply::new("status", &[("step", "4")]), None)
        };
        while server.poll(&handler) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let replies = client.join().unwrap().unwrap();
        assert_eq!(replies[0].get("step"), Some("4"));

        let other = ControlServer::bind(&dir, 78, Some(|_| Ok(12345))).unwrap();
        let path = other.path().to_path_buf();
        let client =
            std::thread::spawn(move || send(&path, &Request::Status, Duration::from_secs(5)));
        let handler = |_: Request| -> (Reply, Option<std::sync::mpsc::Receiver<Reply>>) {
            panic!("a refused peer reaches no handler")
        };
        while other.poll(&handler) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let replies = client.join().unwrap().unwrap();
        assert_eq!(replies[0].verb, "refused");
        let reason = replies[0].get("reason").unwrap();
        assert!(
            reason.contains("user 12345 may not control") && reason.contains(&me.to_string()),
            "{reason}"
        );
        drop(other);
        assert_eq!(
            list_sockets(&dir).len(),
            1,
            "a dropped server removes its socket"
        );
    }

    /// Polls `server` on a thread (as the injected runtime does) until the returned flag is set;
    /// the handler counts its calls and answers `status` requests.
    fn serve(
        server: ControlServer,
    ) -> (
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
        std::thread::JoinHandle<()>,
    ) {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let (s, c) = (stop.clone(), calls.clone());
        let t = std::thread::spawn(move || {
            let handler = |r: Request| {
                c.fetch_add(1, Ordering::SeqCst);
                match r {
                    Request::Status => (Reply::new("status", &[("step", "4")]), None),
                    Request::Capture(_) | Request::Dump => (Reply::new("accepted", &[]), None),
                }
            };
            while !s.load(Ordering::SeqCst) {
                server.poll(&handler);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        (stop, calls, t)
    }

    /// One reply line, within a deadline.
    fn read_reply(stream: &UnixStream) -> Reply {
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        Reply::decode(line.trim()).unwrap_or_else(|| panic!("bad reply `{line}`"))
    }

    #[test]
    fn an_oversized_request_line_is_refused_and_not_obeyed() {
        use std::sync::atomic::Ordering;
        let tmp = tempfile::tempdir().unwrap();
        let server = ControlServer::bind(&tmp.path().join("ctl"), 79, None).unwrap();
        let path = server.path().to_path_buf();
        let (stop, calls, t) = serve(server);
        // Cut at 4096 bytes, this would still be a valid capture request.
        let mut s = UnixStream::connect(&path).unwrap();
        writeln!(s, "capture steps=1 out={}", "a".repeat(5000)).unwrap();
        let r = read_reply(&s);
        assert_eq!(r.verb, "refused", "{r:?}");
        let reason = r.get("reason").unwrap_or("");
        assert!(reason.contains("4096 bytes"), "{reason}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "the cut request was obeyed"
        );
        // A line of exactly the limit is served.
        let mut s = UnixStream::connect(&path).unwrap();
        let line = format!("capture steps=1 out={}", "a".repeat(4096 - 20));
        assert_eq!(line.len(), 4096);
        writeln!(s, "{line}").unwrap();
        assert_eq!(read_reply(&s).verb, "accepted");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    fn idle_connections_do_not_delay_another_client() {
        let tmp = tempfile::tempdir().unwrap();
        let mut server = ControlServer::bind(&tmp.path().join("ctl"), 80, None).unwrap();
        // The idle ones must still be waiting when status is answered, however loaded the machine.
        server.set_request_timeout(Duration::from_secs(600));
        let path = server.path().to_path_buf();
        let (stop, _, t) = serve(server);
        // Same-user clients that connect and send nothing, before the one that asks.
        let idle: Vec<UnixStream> = (0..5)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let replies = send(&path, &Request::Status, Duration::from_secs(60)).unwrap();
        assert_eq!(replies[0].verb, "status", "{replies:?}");
        // Served while the idle ones were still waiting: none of them was answered or closed.
        for (i, c) in idle.iter().enumerate() {
            c.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 512];
            match (&*c).read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(n) => panic!(
                    "idle connection {i} was answered before status: `{}`",
                    String::from_utf8_lossy(&buf[..n]).trim()
                ),
                Err(e) => panic!("idle connection {i}: {e}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    fn a_silent_connection_is_refused_after_the_timeout_and_too_many_are_refused_at_once() {
        use std::sync::atomic::Ordering;
        let tmp = tempfile::tempdir().unwrap();
        let mut server = ControlServer::bind(&tmp.path().join("ctl"), 81, None).unwrap();
        server.set_request_timeout(Duration::from_millis(50));
        let path = server.path().to_path_buf();
        let (stop, calls, t) = serve(server);
        let silent = UnixStream::connect(&path).unwrap();
        let r = read_reply(&silent);
        assert_eq!(r.verb, "refused");
        assert!(
            r.get("reason")
                .unwrap()
                .contains("no complete request line within 50 ms"),
            "{r:?}"
        );
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();

        let mut server = ControlServer::bind(&tmp.path().join("ctl"), 82, None).unwrap();
        server.set_request_timeout(Duration::from_secs(600));
        let path = server.path().to_path_buf();
        let (stop, calls2, t) = serve(server);
        let idle: Vec<UnixStream> = (0..MAX_PENDING)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        // Accepted after all of them (the backlog is first in, first out): refused, not queued.
        let s = UnixStream::connect(&path).unwrap();
        writeln!(&s, "status").unwrap();
        let one_more = read_reply(&s);
        assert_eq!(one_more.verb, "refused", "{one_more:?}");
        assert!(
            one_more
                .get("reason")
                .unwrap()
                .contains(&format!("busy: {MAX_PENDING} connections")),
            "{one_more:?}"
        );
        drop(idle);
        // Once they are gone, requests are served again.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = send(&path, &Request::Status, Duration::from_secs(60)).unwrap();
            if r[0].verb == "status" {
                break;
            }
            assert!(Instant::now() < deadline, "still refused: {r:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(calls2.load(Ordering::SeqCst) >= 1);
    }
}
