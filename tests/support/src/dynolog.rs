//! A clean-room fake of the dynolog daemon's IPC side, written from the protocol's description (not
//! from kinetrace's client, so a framing mistake there is not mirrored here): it binds the daemon's
//! datagram address, reads polls (`"req"`: a 40-byte header `{u64 size; char type[32]}` then
//! `{i32 type; i32 n; i64 jobid; i32 pids[n]}`), records them, and answers each with `"req"` and the
//! config text of a pending request when the poll's type has the activities bit (2) and its job and
//! pids match, else with an empty config, as `dyno gputrace` leaves them with the real daemon.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// One poll the daemon received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poll {
    /// The type bitmask (2: the client is idle and takes activity requests; 0: busy).
    pub kind: i32,
    /// The client's job id.
    pub job_id: i64,
    /// The client's pid and ancestors.
    pub pids: Vec<i32>,
    /// Whether the request was handed out in the reply.
    pub handed_out: bool,
}

/// What the daemon answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// As dynolog does.
    Normally,
    /// Bytes that are not a message (a broken or hostile daemon).
    Garbage,
}

struct Pending {
    job_id: i64,
    /// 0: any process of the job (what `dyno gputrace` without `--pids` sends).
    pid: i32,
    config: String,
}

#[derive(Default)]
struct State {
    polls: Vec<Poll>,
    pending: Vec<Pending>,
    /// Datagrams that were not a well-formed poll, and senders without a name.
    problems: Vec<String>,
    garbage: bool,
}

/// The fake daemon; dropping it stops its thread and removes a filesystem socket.
pub struct FakeDynolog {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    file: Option<PathBuf>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeDynolog {
    /// Binds the abstract name `name` (with the trailing NUL dynolog puts in the address).
    pub fn abstract_name(name: &str) -> FakeDynolog {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let addr = SocketAddr::from_abstract_name(n).expect("abstract address");
        let socket = UnixDatagram::bind_addr(&addr)
            .unwrap_or_else(|e| panic!("fake dynolog cannot bind @{name}: {e}"));
        Self::serve(socket, None)
    }

    /// Binds `dir/name` (`dir/dynolog` for the real daemon), as the daemon does with
    /// `KINETO_IPC_SOCKET_DIR=dir`.
    pub fn in_dir(dir: &Path, name: &str) -> FakeDynolog {
        let path = dir.join(name);
        let socket = UnixDatagram::bind(&path)
            .unwrap_or_else(|e| panic!("fake dynolog cannot bind {}: {e}", path.display()));
        Self::serve(socket, Some(path))
    }

    fn serve(socket: UnixDatagram, file: Option<PathBuf>) -> FakeDynolog {
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("read timeout");
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            // Relaxed: a flag with no data attached.
            while !sp.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let reply = answer(&st, &buf[..n], &from);
                if let Some(reply) = reply {
                    let _ = socket.send_to_addr(&reply, &from);
                }
            }
        });
        FakeDynolog {
            state,
            stop,
            thread: Some(thread),
            file,
        }
    }

    /// Queues a request for `pid` (0: any) of job `job_id`, as `dyno gputrace` does.
    pub fn queue(&self, job_id: i64, pid: i32, config: &str) {
        lock(&self.state).pending.push(Pending {
            job_id,
            pid,
            config: config.to_string(),
        });
    }

    /// Answers garbage from now on (or normally again).
    pub fn answer(&self, a: Answer) {
        lock(&self.state).garbage = a == Answer::Garbage;
    }

    /// The polls received so far.
    pub fn polls(&self) -> Vec<Poll> {
        lock(&self.state).polls.clone()
    }

    /// Requests not handed out yet.
    pub fn pending(&self) -> usize {
        lock(&self.state).pending.len()
    }

    /// Datagrams that were not a well-formed poll from a named sender (the real daemon logs or
    /// aborts on them).
    pub fn problems(&self) -> Vec<String> {
        lock(&self.state).problems.clone()
    }

    /// Everything seen, for failure messages.
    pub fn seen(&self) -> String {
        let s = lock(&self.state);
        format!(
            "polls {:?}; pending {}; problems {:?}",
            s.polls,
            s.pending.len(),
            s.problems
        )
    }
}

impl Drop for FakeDynolog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn ne_i32(b: &[u8]) -> i32 {
    i32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// The reply to one datagram (`None`: nothing can be sent back).
fn answer(state: &Mutex<State>, d: &[u8], from: &SocketAddr) -> Option<Vec<u8>> {
    let mut s = lock(state);
    if from.is_unnamed() {
        s.problems.push("a datagram from an unnamed sender".into());
        return None;
    }
    if d.len() < 40 {
        s.problems.push(format!("a {}-byte datagram", d.len()));
        return None;
    }
    let size = u64::from_ne_bytes(d[..8].try_into().unwrap()) as usize;
    let ty: Vec<u8> = d[8..40].iter().take_while(|&&b| b != 0).copied().collect();
    let body = &d[40..];
    if ty != b"req" || size != body.len() || size < 16 || (size - 16) % 4 != 0 {
        s.problems.push(format!(
            "type {:?}, size {size}, {} payload bytes",
            String::from_utf8_lossy(&ty),
            body.len()
        ));
        return None;
    }
    let kind = ne_i32(&body[0..4]);
    let n = ne_i32(&body[4..8]);
    let job_id = i64::from_ne_bytes(body[8..16].try_into().unwrap());
    let pids: Vec<i32> = body[16..].chunks(4).map(ne_i32).collect();
    if n as usize != pids.len() {
        s.problems.push(format!("n = {n} with {} pids", pids.len()));
        return None;
    }
    let mut config = String::new();
    let mut handed_out = false;
    // A garbage-sending daemon hands nothing out: the request stays pending.
    if kind & 2 != 0 && !s.garbage {
        if let Some(i) = s
            .pending
            .iter()
            .position(|p| p.job_id == job_id && (p.pid == 0 || pids.contains(&p.pid)))
        {
            config = s.pending.remove(i).config;
            handed_out = true;
        }
    }
    s.polls.push(Poll {
        kind,
        job_id,
        pids,
        handed_out,
    });
    if s.garbage {
        return Some(b"\x07not a dynolog message".to_vec());
    }
    let mut reply = (config.len() as u64).to_ne_bytes().to_vec();
    let mut ty = [0u8; 32];
    ty[..3].copy_from_slice(b"req");
    reply.extend_from_slice(&ty);
    reply.extend_from_slice(config.as_bytes());
    Some(reply)
}
