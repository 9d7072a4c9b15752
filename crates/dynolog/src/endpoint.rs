//! The client's datagram socket, as libkineto's `EndPoint` sets it up: `AF_UNIX`, `SOCK_DGRAM`, a
//! named address of its own (the daemon replies to the sender's name and aborts on an unnamed one).
//!
//! Abstract names are written with a trailing NUL counted in the address length (`\0dynolog\0`):
//! that is how dynolog binds and addresses them, and sending to `\0dynolog` without it is refused.
//! With `KINETO_IPC_SOCKET_DIR` set, both sides use filesystem sockets `$DIR/<name>` instead (the
//! way through separate network namespaces, such as containers); the directory string is used
//! verbatim, since the daemon checks that a sender's path starts with its own `$DIR/`.
//!
//! Anyone on the node can bind the abstract name `dynolog` while the daemon is not running (not
//! started yet, or restarting) and answer the poll. So the socket has `SO_PASSCRED` set, every
//! datagram arrives with its sender's credentials (`SCM_CREDENTIALS`, filled in by the kernel),
//! and only datagrams from root, this process's own uid or the one uid configured
//! (`KINETRACE_DYNOLOG_UID`) count: [`Reply::Stranger`] for the rest.

use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::wire;

/// The daemon's name (libkineto's `kDynoIpcName`).
pub const DAEMON: &str = "dynolog";

/// The longest name: `sun_path` holds 108 bytes, two of them the NULs around an abstract name.
const MAX_NAME: usize = 106;

/// Where the daemon listens and how names become addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// Linux abstract socket names (the default).
    Abstract,
    /// Filesystem sockets in this directory (`KINETO_IPC_SOCKET_DIR`).
    Dir(String),
}

impl Namespace {
    /// `Dir` when `KINETO_IPC_SOCKET_DIR` is set and non-empty, as libkineto and dynolog decide.
    pub fn from_var(var: Option<&str>) -> Namespace {
        match var {
            Some(d) if !d.is_empty() => Namespace::Dir(d.to_string()),
            _ => Namespace::Abstract,
        }
    }

    fn address(&self, name: &str) -> io::Result<SocketAddr> {
        if name.len() > MAX_NAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("socket name `{name}` is longer than {MAX_NAME} bytes"),
            ));
        }
        match self {
            Namespace::Abstract => {
                let mut n = Vec::with_capacity(name.len() + 1);
                n.extend_from_slice(name.as_bytes());
                n.push(0);
                SocketAddr::from_abstract_name(n)
            }
            Namespace::Dir(d) => SocketAddr::from_pathname(format!("{d}/{name}")),
        }
    }

    /// The address in words, for log lines (`@name` for an abstract one).
    pub fn describe(&self, name: &str) -> String {
        match self {
            Namespace::Abstract => format!("@{name}"),
            Namespace::Dir(d) => format!("{d}/{name}"),
        }
    }
}

/// A bound client socket; a filesystem one is removed when dropped.
pub struct Endpoint {
    socket: UnixDatagram,
    daemon: SocketAddr,
    /// The uids whose datagrams count, besides root and this process's own.
    allowed_uid: Option<u32>,
    /// The bound file, for a filesystem socket.
    file: Option<PathBuf>,
    buf: Vec<u8>,
}

/// The largest reply read: a config is a few hundred bytes.
const MAX_DATAGRAM: usize = 64 << 10;

/// What one poll got back.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// No reply within the wait (no daemon, or one that did not answer).
    None,
    /// The daemon's config text (empty: nothing pending).
    Config(String),
    /// A datagram that is not a `req` reply: what was wrong with it.
    Malformed(String),
    /// A datagram from a process of another user (not root, not this process's uid, not the
    /// configured one): dropped unread.
    Stranger {
        /// The sender's uid (`u32::MAX` when the kernel gave no credentials).
        uid: u32,
        /// The sender's pid.
        pid: i32,
        /// Its address, in words.
        from: String,
    },
}

/// Whether a datagram from `uid` counts: root, this process's effective uid, or `allowed`.
pub fn sender_allowed(uid: u32, own: u32, allowed: Option<u32>) -> bool {
    uid == 0 || uid == own || allowed == Some(uid)
}

impl Endpoint {
    /// Binds `name` (unique per process) in `ns`, addressing the daemon `daemon`; datagrams count
    /// only from root, this process's uid and `allowed_uid`.
    pub fn bind(
        ns: &Namespace,
        name: &str,
        daemon: &str,
        allowed_uid: Option<u32>,
    ) -> io::Result<Endpoint> {
        let own = ns.address(name)?;
        let file = own.as_pathname().map(|p| p.to_path_buf());
        if let Some(f) = &file {
            // A socket file left by a killed process of the same name (the name holds our pid).
            let _ = std::fs::remove_file(f);
        }
        let socket = UnixDatagram::bind_addr(&own)?;
        // Every datagram then carries its sender's credentials, as the kernel knows them.
        rustix::net::sockopt::set_socket_passcred(&socket, true)?;
        Ok(Endpoint {
            socket,
            daemon: ns.address(daemon)?,
            allowed_uid,
            file,
            buf: vec![0; MAX_DATAGRAM],
        })
    }

    /// Sends one datagram to the daemon (without blocking: a full queue is an error, not a wait).
    pub fn send(&self, datagram: &[u8]) -> io::Result<()> {
        self.socket.set_nonblocking(true)?;
        let r = self.socket.send_to_addr(datagram, &self.daemon);
        self.socket.set_nonblocking(false)?;
        r.map(|_| ())
    }

    /// Waits up to `wait` for the daemon's reply (`wait` zero: only what is queued already).
    pub fn receive(&mut self, wait: Duration) -> io::Result<Reply> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let got = if left.is_zero() {
                self.socket.set_nonblocking(true)?;
                let r = self.recv();
                self.socket.set_nonblocking(false)?;
                r
            } else {
                self.socket.set_read_timeout(Some(left))?;
                self.recv()
            };
            let (n, from, cred) = match got {
                Ok(x) => x,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(Reply::None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            // Any local process can send to an abstract name, and bind the daemon's while it is
            // not running: only datagrams of trusted users, from the daemon's name, count.
            let (uid, pid) = cred.unwrap_or((u32::MAX, 0));
            if !sender_allowed(uid, rustix::process::geteuid().as_raw(), self.allowed_uid) {
                return Ok(Reply::Stranger {
                    uid,
                    pid,
                    from: describe_addr(&from),
                });
            }
            if !same_address(&from, &self.daemon) {
                return Ok(Reply::Malformed(format!(
                    "a datagram from {}, not from the daemon",
                    describe_addr(&from)
                )));
            }
            return Ok(match wire::decode(&self.buf[..n]) {
                Ok((wire::REQ, payload)) => match std::str::from_utf8(payload) {
                    Ok(t) => Reply::Config(t.to_string()),
                    Err(_) => Reply::Malformed("its config text is not UTF-8".into()),
                },
                Ok((other, _)) => Reply::Malformed(format!("type `{other}`, expected `req`")),
                Err(e) => Reply::Malformed(e.to_string()),
            });
        }
    }
}

impl Endpoint {
    /// One datagram: its length, the sender's address and its credentials.
    fn recv(&mut self) -> io::Result<(usize, Address, Option<Cred>)> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut self.buf)];
        let msg = rustix::net::recvmsg(
            &self.socket,
            &mut iov,
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        )?;
        let mut cred = None;
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmCredentials(c) = m {
                cred = Some((c.uid.as_raw(), c.pid.as_raw_nonzero().get()));
            }
        }
        let from = match msg
            .address
            .and_then(|a| rustix::net::SocketAddrUnix::try_from(a).ok())
        {
            Some(a) => match (a.abstract_name(), a.path()) {
                (Some(n), _) => Address::Abstract(n.to_vec()),
                (None, Some(p)) => {
                    Address::Path(PathBuf::from(std::ffi::OsStr::from_bytes(p.to_bytes())))
                }
                _ => Address::Unnamed,
            },
            None => Address::Unnamed,
        };
        Ok((msg.bytes.min(self.buf.len()), from, cred))
    }
}

/// A sender's (uid, pid), as the kernel vouches for them.
type Cred = (u32, i32);

/// A sender's address.
enum Address {
    Abstract(Vec<u8>),
    Path(PathBuf),
    Unnamed,
}

fn same_address(a: &Address, b: &SocketAddr) -> bool {
    match (a, b.as_abstract_name(), b.as_pathname()) {
        (Address::Abstract(x), Some(y), _) => x == y,
        (Address::Path(p), None, Some(q)) => p == q,
        _ => false,
    }
}

fn describe_addr(a: &Address) -> String {
    match a {
        Address::Abstract(n) => format!("@{}", String::from_utf8_lossy(n).trim_end_matches('\0')),
        Address::Path(p) => p.display().to_string(),
        Address::Unnamed => "an unnamed socket".to_string(),
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_this_uid_and_the_configured_one_are_heard() {
        assert!(sender_allowed(0, 1000, None));
        assert!(sender_allowed(1000, 1000, None));
        assert!(!sender_allowed(1001, 1000, None));
        assert!(sender_allowed(1001, 1000, Some(1001)));
        assert!(!sender_allowed(1002, 1000, Some(1001)));
        assert!(!sender_allowed(u32::MAX, 1000, None));
    }

    #[test]
    fn abstract_names_carry_a_trailing_nul_and_dirs_are_used_verbatim() {
        let a = Namespace::Abstract.address("dynolog").unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"dynolog\0"[..]));
        let d = Namespace::from_var(Some("/run/dyno"))
            .address("dynolog")
            .unwrap();
        assert_eq!(
            d.as_pathname(),
            Some(std::path::Path::new("/run/dyno/dynolog"))
        );
        assert_eq!(Namespace::from_var(Some("")), Namespace::Abstract);
        assert!(Namespace::Abstract.address(&"x".repeat(107)).is_err());
    }

    #[test]
    fn a_reply_round_trips_between_two_endpoints() {
        let daemon_name = format!("kinetrace-test-daemon-{}", std::process::id());
        let daemon =
            UnixDatagram::bind_addr(&Namespace::Abstract.address(&daemon_name).unwrap()).unwrap();
        let client_name = format!("kinetrace-test-client-{}", std::process::id());
        let mut client =
            Endpoint::bind(&Namespace::Abstract, &client_name, &daemon_name, None).unwrap();
        client.send(&wire::encode(wire::REQ, b"x")).unwrap();
        let mut buf = [0u8; 128];
        let (n, from) = daemon.recv_from(&mut buf).unwrap();
        assert_eq!(n, 41);
        // The sender is named, NUL included, so a reply to that name reaches it.
        let mut expected = client_name.clone().into_bytes();
        expected.push(0);
        assert_eq!(from.as_abstract_name(), Some(&expected[..]));
        daemon
            .send_to_addr(&wire::encode(wire::REQ, b"A=1"), &from)
            .unwrap();
        assert_eq!(
            client.receive(Duration::from_secs(5)).unwrap(),
            Reply::Config("A=1".into())
        );
        let stranger = UnixDatagram::unbound().unwrap();
        stranger
            .send_to_addr(&wire::encode(wire::REQ, b"B=2"), &from)
            .unwrap();
        assert_eq!(
            client.receive(Duration::from_secs(5)).unwrap(),
            Reply::Malformed("a datagram from an unnamed socket, not from the daemon".into())
        );
        daemon.send_to_addr(b"junk", &from).unwrap();
        assert!(matches!(
            client.receive(Duration::from_secs(5)).unwrap(),
            Reply::Malformed(_)
        ));
        assert_eq!(client.receive(Duration::ZERO).unwrap(), Reply::None);
        daemon
            .send_to_addr(&wire::encode(wire::REQ, b""), &from)
            .unwrap();
        let queued = Instant::now() + Duration::from_secs(5);
        let mut got = client.receive(Duration::ZERO).unwrap();
        while got == Reply::None && Instant::now() < queued {
            std::thread::sleep(Duration::from_millis(5));
            got = client.receive(Duration::ZERO).unwrap();
        }
        assert_eq!(got, Reply::Config(String::new()));
    }
}
