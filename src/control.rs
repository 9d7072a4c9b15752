//! On-demand control: a per-process Unix socket `kinetrace trigger` talks to.
//!
//! Each profiled process listens on `<dir>/<pid>.sock`. The directory is created with mode 0700 and
//! refused if another user owns it or others may enter it; the socket itself is made 0600. On top of
//! the file modes, each connection's peer user is checked (when the embedding gives a way to read it;
//! the preload shim does, with `SO_PEERCRED`) and a request from another user is refused with a
//! reply saying so. Output directories in requests must lie under the trace root.
//!
//! The protocol is one request line and one or two reply lines, each a verb followed by
//! space-separated `key=value` fields, values percent-encoded:
//!
//! ```text
//! → capture steps=3 out=run2 wait=1          (or duration_ms=500, delay_ms=, start_step=)
//! ← accepted pid=4242 dir=/traces/run2 plan=steps:11-13
//! ← done pid=4242 path=/traces/run2/host_4242.1700000000.pt.trace.json events=5120
//! → status
//! ← status pid=4242 step=10 action=NONE capture=none traces=0
//! ← refused pid=4242 reason=busy:%20...
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

pub use kinetrace_core::session::CaptureLength;

/// This process's effective user id, from `/proc/self/status`.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Reads the user id of a connected peer (the preload shim supplies one based on `SO_PEERCRED`).
pub type PeerUid = fn(&UnixStream) -> std::io::Result<u32>;

/// A request line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Capture now.
    Capture(CaptureSpec),
    /// Report the process's state.
    Status,
}

/// What to capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSpec {
    /// Steps or wall time.
    pub length: CaptureLength,
    /// Start at this step (steps) instead of the next one.
    pub start_step: Option<u64>,
    /// Start after this delay (time).
    pub delay: Option<Duration>,
    /// A directory under the trace root (relative to it, or absolute inside it).
    pub out: Option<PathBuf>,
    /// Keep the connection open and send `done`/`failed` when the trace is written.
    pub wait: bool,
}

/// A reply line: a verb and its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// `accepted`, `refused`, `done`, `failed` or `status`.
    pub verb: String,
    /// The fields, in order.
    pub fields: Vec<(String, String)>,
}

impl Reply {
    /// A reply with `verb` and `fields`.
    pub fn new(verb: &str, fields: &[(&str, &str)]) -> Reply {
        Reply {
            verb: verb.to_string(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The value of field `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The wire form (without the newline).
    pub fn encode(&self) -> String {
        encode_line(&self.verb, &self.fields)
    }

    /// Parses a wire line.
    pub fn decode(line: &str) -> Option<Reply> {
        let (verb, fields) = decode_line(line)?;
        Some(Reply { verb, fields })
    }
}

impl Request {
    /// The wire form (without the newline).
    pub fn encode(&self) -> String {
        match self {
            Request::Status => "status".into(),
            Request::Capture(c) => {
                let mut f: Vec<(String, String)> = Vec::new();
                match c.length {
                    CaptureLength::Steps(n) => f.push(("steps".into(), n.to_string())),
                    CaptureLength::Duration(d) => {
                        f.push(("duration_ms".into(), d.as_millis().to_string()))
                    }
                }
                if let Some(s) = c.start_step {
                    f.push(("start_step".into(), s.to_string()));
                }
                if let Some(d) = c.delay {
                    f.push(("delay_ms".into(), d.as_millis().to_string()));
                }
                if let Some(o) = &c.out {
                    f.push(("out".into(), o.to_string_lossy().into_owned()));
                }
                if c.wait {
                    f.push(("wait".into(), "1".into()));
                }
                encode_line("capture", &f)
            }
        }
    }

    /// Parses a wire line; the error says what is wrong.
    pub fn decode(line: &str) -> Result<Request, String> {
        let (verb, fields) = decode_line(line).ok_or("not a request line")?;
        let get = |k: &str| fields.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        let num = |k: &str| -> Result<Option<u64>, String> {
            get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| format!("{k}=`{v}` is not an integer"))
                })
                .transpose()
        };
        match verb.as_str() {
            "status" => Ok(Request::Status),
            "capture" => {
                let length = match (num("steps")?, num("duration_ms")?) {
                    (Some(n), None) => CaptureLength::Steps(
                        u32::try_from(n).map_err(|_| "steps is too large".to_string())?,
                    ),
                    (None, Some(ms)) => CaptureLength::Duration(Duration::from_millis(ms)),
                    _ => return Err("give exactly one of steps= and duration_ms=".into()),
                };
                Ok(Request::Capture(CaptureSpec {
                    length,
                    start_step: num("start_step")?,
                    delay: num("delay_ms")?.map(Duration::from_millis),
                    out: get("out").map(PathBuf::from),
                    wait: get("wait") == Some("1"),
                }))
            }
            other => Err(format!("unknown request `{other}`")),
        }
    }
}

fn encode_line(verb: &str, fields: &[(String, String)]) -> String {
    let mut s = verb.to_string();
    for (k, v) in fields {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || b"._/:+,-@".contains(&b) {
                s.push(b as char);
            } else {
                s.push_str(&format!("%{b:02X}"));
            }
        }
    }
    s
}

fn decode_line(line: &str) -> Option<(String, Vec<(String, String)>)> {
    let mut parts = line.split_ascii_whitespace();
    let verb = parts.next()?.to_string();
    let mut fields = Vec::new();
    for p in parts {
        let (k, v) = p.split_once('=')?;
        fields.push((k.to_string(), percent_decode(v)?));
    }
    Some((verb, fields))
}

fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Resolves an output directory named in a request against the trace root: relative paths are
/// taken under the root, absolute ones must lie inside it, and `..` is refused outright. The
/// result is lexical; call [`check_inside`] once the directory exists to catch symlinks.
pub fn confine(root: &Path, requested: Option<&Path>) -> Result<PathBuf, String> {
    let root = absolute(root);
    let Some(req) = requested else {
        return Ok(root);
    };
    if req.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{} contains `..`; output must stay under the trace root {}",
            req.display(),
            root.display()
        ));
    }
    let full = if req.is_absolute() {
        req.to_path_buf()
    } else {
        root.join(req)
    };
    if !full.starts_with(&root) {
        return Err(format!(
            "{} is outside the trace root {}",
            req.display(),
            root.display()
        ));
    }
    Ok(full)
}

/// After creating `dir`, checks that its real path is still inside the root's real path.
pub fn check_inside(root: &Path, dir: &Path) -> Result<(), String> {
    let (r, d) = (root.canonicalize(), dir.canonicalize());
    match (r, d) {
        (Ok(r), Ok(d)) if d.starts_with(&r) => Ok(()),
        (Ok(r), Ok(d)) => Err(format!(
            "{} resolves to {}, outside the trace root {}",
            dir.display(),
            d.display(),
            r.display()
        )),
        (_, Err(e)) | (Err(e), _) => Err(format!("cannot resolve {}: {e}", dir.display())),
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// Creates the socket directory (mode 0700) or checks an existing one: it must be a directory
/// owned by this user that no one else can enter.
pub fn prepare_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create the control directory {}: {e}", dir.display()))?;
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let me = effective_uid().unwrap_or(u32::MAX);
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != me {
        return Err(format!(
            "the control directory {} belongs to user {}, not to this user ({me}); set KINETRACE_CONTROL_DIR",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "the control directory {} has mode {:o}; it must be 0700 (chmod 700 it)",
            dir.display(),
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// The socket of process `pid` in `dir`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// A listening control socket.
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    peer_uid: Option<PeerUid>,
    uid: u32,
}

/// What the server does with a request from an accepted peer: the first reply, and for `wait`
/// captures a receiver the final reply arrives on.
pub type Handler<'a> = &'a dyn Fn(Request) -> (Reply, Option<std::sync::mpsc::Receiver<Reply>>);

impl ControlServer {
    /// Listens on `<dir>/<pid>.sock` (see [`prepare_dir`] for the directory's rules).
    pub fn bind(dir: &Path, pid: u32, peer_uid: Option<PeerUid>) -> Result<ControlServer, String> {
        prepare_dir(dir)?;
        let path = socket_path(dir, pid);
        // A leftover of an earlier process with this pid.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot set up {}: {e}", path.display()))?;
        Ok(ControlServer {
            listener,
            path,
            peer_uid,
            uid: effective_uid().unwrap_or(u32::MAX),
        })
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

    /// Serves every connection waiting now; returns how many were handled. A `wait` capture is
    /// finished on its own thread.
    pub fn poll(&self, handler: Handler<'_>) -> usize {
        let mut n = 0;
        while let Ok((stream, _)) = self.listener.accept() {
            n += 1;
            self.serve(stream, handler);
        }
        n
    }

    fn serve(&self, mut stream: UnixStream, handler: Handler<'_>) {
        let pid = std::process::id().to_string();
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        if let Some(peer_uid) = self.peer_uid {
            match peer_uid(&stream) {
                Ok(uid) if uid == self.uid => {}
                Ok(uid) => {
                    let reason = format!(
                        "user {uid} may not control this process (it belongs to user {}); run kinetrace trigger as that user",
                        self.uid
                    );
                    let _ = writeln!(
                        stream,
                        "{}",
                        Reply::new("refused", &[("pid", &pid), ("reason", &reason)]).encode()
                    );
                    return;
                }
                Err(e) => {
                    let reason = format!("cannot identify the peer: {e}");
                    let _ = writeln!(
                        stream,
                        "{}",
                        Reply::new("refused", &[("pid", &pid), ("reason", &reason)]).encode()
                    );
                    return;
                }
            }
        }
        let mut line = String::new();
        let read = BufReader::new((&stream).take(4096)).read_line(&mut line);
        let request = match read {
            Ok(_) => Request::decode(line.trim()),
            Err(e) => Err(format!("cannot read the request: {e}")),
        };
        let (first, later) = match request {
            Ok(r) => handler(r),
            Err(reason) => (
                Reply::new("refused", &[("pid", &pid), ("reason", &reason)]),
                None,
            ),
        };
        if writeln!(stream, "{}", first.encode()).is_err() {
            return;
        }
        if let Some(rx) = later {
            let _ = std::thread::Builder::new()
                .name("kinetrace-reply".into())
                .spawn(move || {
                    if let Ok(reply) = rx.recv() {
                        let _ = writeln!(stream, "{}", reply.encode());
                    }
                });
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let r = Request::Capture(CaptureSpec {
            length: CaptureLength::Steps(3),
            start_step: Some(10),
            delay: None,
            out: Some(PathBuf::from("run 2/ünï=%")),
            wait: true,
        });
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let r = Request::Capture(CaptureSpec {
            length: CaptureLength::Duration(Duration::from_millis(500)),
            start_step: None,
            delay: Some(Duration::from_secs(1)),
            out: None,
            wait: false,
        });
        assert_eq!(r.encode(), "capture duration_ms=500 delay_ms=1000");
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        assert_eq!(Request::decode("status").unwrap(), Request::Status);
        assert!(Request::decode("capture steps=1 duration_ms=3").is_err());
        assert!(Request::decode("capture").is_err());
        assert!(Request::decode("rm -rf").is_err());
        let reply = Reply::new("refused", &[("pid", "1"), ("reason", "busy: a b\nc")]);
        assert_eq!(Reply::decode(&reply.encode()).unwrap(), reply);
        assert!(!reply.encode().contains('\n'));
    }

    #[test]
    fn output_paths_may_not_escape_the_trace_root() {
        let root = Path::new("/data/traces");
        assert_eq!(confine(root, None).unwrap(), root);
        assert_eq!(
            confine(root, Some(Path::new("run2"))).unwrap(),
            root.join("run2")
        );
        assert_eq!(
            confine(root, Some(Path::new("/data/traces/a/b"))).unwrap(),
            root.join("a/b")
        );
        for bad in [
            "../etc",
            "a/../../x",
            "/etc",
            "/data/traces2",
            "/data/traces/../x",
        ] {
            let e = confine(root, Some(Path::new(bad))).unwrap_err();
            assert!(e.contains("trace root"), "{bad}: {e}");
        }
        // A symlink inside the root that points out of it is caught once it exists.
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("escape")).unwrap();
        let dir = confine(&root, Some(Path::new("escape"))).unwrap();
        assert!(check_inside(&root, &dir)
            .unwrap_err()
            .contains("outside the trace root"));
        std::fs::create_dir(root.join("fine")).unwrap();
        check_inside(&root, &root.join("fine")).unwrap();
    }

    #[test]
    fn the_control_directory_must_be_private_and_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ctl");
        prepare_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = prepare_dir(&dir).unwrap_err();
        assert!(e.contains("mode 755") && e.contains("0700"), "{e}");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(prepare_dir(&file).unwrap_err().contains("not a directory"));
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
}
