//! The polling thread and the rules for starting it.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kinetrace_core::activity::Activity;
use kinetrace_core::schedule::ProfilerAction;
use kinetrace_core::session::{
    CapturePlan, CaptureRequest, CaptureStart, LogFn, SessionHandle, SessionStatus,
};
use kinetrace_core::{Sink, SinkFactory, TraceMeta, TraceOutput, WindowInfo};
use kinetrace_export::TraceDir;
use kinetrace_files::Dir;

use crate::endpoint::{Endpoint, Namespace, Reply, DAEMON};
use crate::request::{self, Context, Start};
use crate::wire;

/// How long a poll waits for the daemon's reply (libkineto: 9 tries 10 ms apart).
pub const REPLY_WAIT: Duration = Duration::from_millis(90);

/// The most ancestors a poll names (libkineto's `kMaxParentPids`).
const MAX_ANCESTORS: usize = 10;

/// The longest a stop request waits to be noticed.
const SLICE: Duration = Duration::from_millis(50);

/// How the client finds the daemon and what it tells it.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Abstract names, or filesystem sockets in `KINETO_IPC_SOCKET_DIR`.
    pub namespace: Namespace,
    /// The daemon's name (`dynolog`).
    pub daemon: String,
    /// Between polls (`ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS`, default 5 s).
    pub interval: Duration,
    /// `SLURM_JOB_ID`, else 0.
    pub job_id: i64,
    /// Where requested traces may go (`KINETO_ONDEMAND_TRACE_DIR`, else `/tmp/`).
    pub trace_dir: String,
    /// `KINETO_USE_DAEMON` is set (libkineto polls when it is, whatever its value).
    pub use_daemon: bool,
    /// A uid besides root and this process's whose replies count (`KINETRACE_DYNOLOG_UID`: a
    /// daemon run as a service user); replies of any other user are dropped.
    pub allowed_uid: Option<u32>,
}

impl Settings {
    /// The default poll interval (Kineto's).
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

    /// From this process's environment: `KINETO_IPC_SOCKET_DIR`, `SLURM_JOB_ID`,
    /// `KINETO_ONDEMAND_TRACE_DIR`, `KINETO_USE_DAEMON`. The interval is the default.
    pub fn from_env() -> Settings {
        let var = |k: &str| std::env::var(k).ok();
        Settings {
            namespace: Namespace::from_var(var("KINETO_IPC_SOCKET_DIR").as_deref()),
            // Test hook (outside the KINETRACE_ key space on purpose): tests running in parallel
            // each talk to a fake daemon of their own name.
            daemon: var("_KINETRACE_TEST_DYNOLOG_NAME").unwrap_or_else(|| DAEMON.to_string()),
            interval: Self::DEFAULT_INTERVAL,
            job_id: job_id(var("SLURM_JOB_ID").as_deref()),
            trace_dir: Context::trace_dir_from(var("KINETO_ONDEMAND_TRACE_DIR").as_deref()),
            use_daemon: std::env::var_os("KINETO_USE_DAEMON").is_some(),
            allowed_uid: None,
        }
    }
}

/// `SLURM_JOB_ID` as libkineto reads it (`strtoll`: leading digits, else 0).
fn job_id(var: Option<&str>) -> i64 {
    let v = var.unwrap_or("").trim_start();
    let digits: String = v
        .char_indices()
        .take_while(|(i, c)| c.is_ascii_digit() || (*i == 0 && (*c == '-' || *c == '+')))
        .map(|(_, c)| c)
        .collect();
    digits.parse().unwrap_or(0)
}

/// Whether libkineto is mapped into this process (per `/proc/self/maps` text): its own library,
/// or PyTorch's `libtorch_cpu`, which holds it.
pub fn libkineto_mapped(maps: &str) -> bool {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter_map(|p| p.rsplit('/').next())
        .any(|f| f.starts_with("libkineto.so") || f.starts_with("libtorch_cpu.so"))
}

/// This process and up to 10 ancestors, read from `/proc/<pid>/stat` as libkineto does (stopping
/// at pid 1, which is named only when it is this process: a container's init).
pub fn ancestor_pids() -> Vec<i32> {
    let mut pids = Vec::with_capacity(MAX_ANCESTORS + 1);
    let mut pid = std::process::id() as i32;
    for i in 0..=MAX_ANCESTORS {
        if i > 0 && pid <= 1 {
            break;
        }
        pids.push(pid);
        pid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| parent_of(&s))
            .unwrap_or(0);
    }
    pids
}

/// The parent pid in a `/proc/<pid>/stat` line (`pid (comm) state ppid ...`; `comm` may hold `)`).
fn parent_of(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The polling thread; dropping it stops the thread and waits for it (at most one sleep slice and
/// one reply wait).
pub struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Asks the thread to stop without waiting for it (at process exit, where joining could hang).
    pub fn stop(&self) {
        // Relaxed: a flag with no data attached.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts polling for `session` if the rules allow it, saying why not in one line otherwise: in a
/// process with libkineto and `KINETO_USE_DAEMON` set, libkineto polls and kinetrace does not (both
/// would claim the same requests); in a process without libkineto, `KINETO_USE_DAEMON` must be set
/// too (the daemon's port has no authentication, so answering it is opted into twice).
pub fn start(session: SessionHandle, settings: Settings, log: LogFn) -> Option<Poller> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    if libkineto_mapped(&maps) {
        if settings.use_daemon {
            log(KINETO_POLLS);
            return None;
        }
    } else if !settings.use_daemon {
        log(
            "dynolog: KINETRACE_DYNOLOG is on but KINETO_USE_DAEMON is not set; dynolog requests \
             are off (set both to answer `dyno gputrace`)",
        );
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("kinetrace-dynolog".into())
        .spawn(move || {
            let body = std::panic::AssertUnwindSafe(|| run(&session, &settings, &log, &flag));
            if std::panic::catch_unwind(body).is_err() {
                log("dynolog: internal error in the polling thread; dynolog requests are off");
            }
        });
    match spawned {
        Ok(t) => Some(Poller {
            stop,
            thread: Some(t),
        }),
        Err(e) => {
            // The log was moved into the closure that failed to start; say it through stderr.
            eprintln!(
                "kinetrace: dynolog: cannot start the polling thread ({e}); requests are off"
            );
            None
        }
    }
}

const KINETO_POLLS: &str =
    "dynolog: libkineto in this process polls the daemon (KINETO_USE_DAEMON \
                            is set); kinetrace does not poll as well, so requests go to libkineto";

/// A unique client name: libkineto uses `dynoconfigclient` + a uuid; the pid and the clock do here.
fn client_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "dynoconfigclient-kinetrace-{}-{nanos:08x}",
        std::process::id()
    )
}

/// The thread's loop: poll, handle the reply, sleep, until stopped or the session is gone.
fn run(session: &SessionHandle, s: &Settings, log: &LogFn, stop: &AtomicBool) {
    let name = client_name();
    let mut ep = match Endpoint::bind(&s.namespace, &name, &s.daemon, s.allowed_uid) {
        Ok(ep) => ep,
        Err(e) => {
            log(&format!(
                "dynolog: cannot bind the client socket {}: {e}; dynolog requests are off",
                s.namespace.describe(&name)
            ));
            return;
        }
    };
    let pids = ancestor_pids();
    let mut said_absent = false;
    let mut said = Said::default();
    while !stop.load(Ordering::Relaxed) {
        // libtorch may be loaded after profiling started: once libkineto polls, stop.
        if s.use_daemon
            && libkineto_mapped(&std::fs::read_to_string("/proc/self/maps").unwrap_or_default())
        {
            log(KINETO_POLLS);
            return;
        }
        let Some(status) = session.status() else {
            return;
        };
        let kind = if busy(&status) { 0 } else { wire::ACTIVITIES };
        // A reply that came after its poll's wait may hold a request the daemon has handed out:
        // take it now rather than lose it.
        loop {
            match ep.receive(Duration::ZERO) {
                Ok(Reply::None) | Err(_) => break,
                Ok(r) => on_reply(r, session, s, log, &mut said),
            }
        }
        let poll = wire::encode(wire::REQ, &wire::request_payload(kind, s.job_id, &pids));
        match ep.send(&poll) {
            Err(e) => {
                if !said_absent {
                    said_absent = true;
                    log(&format!(
                        "dynolog: no daemon at {} ({}); polling on quietly every {} ms",
                        s.namespace.describe(&s.daemon),
                        absent_reason(&e),
                        s.interval.as_millis()
                    ));
                }
            }
            Ok(()) => match ep.receive(REPLY_WAIT) {
                Ok(r) => on_reply(r, session, s, log, &mut said),
                Err(e) => {
                    log(&format!(
                        "dynolog: cannot read from the client socket: {e}; dynolog requests are off"
                    ));
                    return;
                }
            },
        }
        let until = Instant::now() + s.interval;
        while !stop.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::park_timeout(left.min(SLICE));
        }
    }
}

/// What was said already, so that a daemon sending garbage or a stranger answering every poll
/// costs one line, not one per poll.
#[derive(Default)]
struct Said {
    garbage: bool,
    strangers: Vec<u32>,
}

/// Acts on one reply: a request is handled, garbage said once until a good reply comes, a
/// stranger's datagram dropped with one line per stranger.
fn on_reply(r: Reply, session: &SessionHandle, s: &Settings, log: &LogFn, said: &mut Said) {
    let said_garbage = &mut said.garbage;
    match r {
        Reply::Stranger { uid, pid, from } => {
            if !said.strangers.contains(&uid) && said.strangers.len() < 16 {
                said.strangers.push(uid);
                log(&format!(
                    "dynolog: dropped a reply from uid {uid} (pid {pid}, {from}): only root, this \
                     process's uid {} and KINETRACE_DYNOLOG_UID{} are heard; another user may be \
                     holding the daemon's name",
                    rustix::process::geteuid().as_raw(),
                    s.allowed_uid.map(|u| format!(" ({u})")).unwrap_or_default()
                ));
            }
        }
        Reply::Config(text) => {
            *said_garbage = false;
            if !text.trim().is_empty() {
                handle(session, s, log, &text);
            }
        }
        Reply::Malformed(why) => {
            if !*said_garbage {
                *said_garbage = true;
                log(&format!(
                    "dynolog: ignored a malformed reply from the daemon: {why}"
                ));
            }
        }
        Reply::None => {}
    }
}

fn absent_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => {
            "nothing listens there".into()
        }
        _ => e.to_string(),
    }
}

/// A capture pending or in progress, or a window open: libkineto's "busy".
fn busy(s: &SessionStatus) -> bool {
    if s.flight {
        // A flight recorder is always recording and answers a request with a dump.
        return s.stepped_aside.is_some();
    }
    s.capture.is_some() || s.action != ProfilerAction::None || s.stepped_aside.is_some()
}

/// Turns one request into a capture, or says in one line why not.
fn handle(session: &SessionHandle, s: &Settings, log: &LogFn, text: &str) {
    let Some(status) = session.status() else {
        return;
    };
    let ctx = Context {
        now_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        step_num: status.step_num,
        pid: std::process::id(),
        trace_dir: s.trace_dir.clone(),
    };
    let r = match request::parse(text, &ctx) {
        Ok(r) => r,
        Err(e) => {
            log(&format!("dynolog: request ignored: {e}"));
            return;
        }
    };
    // Opened now, one component at a time below the on-demand directory: no symlink, only
    // directories of this uid or root that no one else may write to (unless sticky). The trace is
    // written below what was opened now.
    let place = match Dir::locate(Path::new(&s.trace_dir)).and_then(|p| p.join(&r.dir)) {
        Ok(p) => p,
        Err(e) => {
            log(&format!(
                "dynolog: request refused: ACTIVITIES_LOG_FILE: `{}`: {e}",
                r.log_file.display()
            ));
            return;
        }
    };
    let mut target = TraceDir::at(place);
    target.file_name = Some(r.file_name.clone());
    let mut metadata = vec![("kinetrace_trigger".to_string(), "dynolog".to_string())];
    for (k, v) in &r.trace_ids {
        metadata.push((format!("dynolog_{}", k.to_ascii_lowercase()), v.clone()));
    }
    if !r.ignored.is_empty() {
        metadata.push((
            "dynolog_not_applied".to_string(),
            format!(
                "{}: kinetrace does not apply these per request (no FLOP estimates or memory \
                 snapshots; module ranges follow the process's own settings)",
                r.ignored.join(", ")
            ),
        ));
    }
    let start = match r.start {
        Start::After(d) => CaptureStart::After(d),
        Start::AtStep(n) => CaptureStart::AtStep(n),
    };
    if status.flight {
        // The span the flight recorder keeps, into the requested file; the request's window
        // (start, length) does not apply: the dump is of what already happened.
        let trigger = kinetrace_core::flight::FlightTrigger::Request("dynolog".into());
        match session.flight_dump_to(trigger, Some(Box::new(Annotated { target, metadata }))) {
            Ok(()) => log(&format!(
                "dynolog: flight dump into {}",
                r.log_file.display()
            )),
            Err(e) => log(&format!("dynolog: request refused: {e}")),
        }
        return;
    }
    let mut req = CaptureRequest::new(start, r.length);
    req.sinks = Some(Box::new(Annotated { target, metadata }));
    req.framework = r.framework;
    match session.request_capture(req) {
        Ok(plan) => log(&format!(
            "dynolog: capturing {} into {}",
            describe(&plan),
            r.log_file.display()
        )),
        Err(e) => log(&format!("dynolog: request refused: {e}")),
    }
}

fn describe(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps {first}..={last}"),
        CapturePlan::Time { delay, duration } => format!(
            "{} ms starting in {} ms",
            duration.as_millis(),
            delay.as_millis()
        ),
    }
}

/// The requested file, with the request's facts added to the trace's metadata.
struct Annotated {
    target: TraceDir,
    metadata: Vec<(String, String)>,
}

impl SinkFactory for Annotated {
    fn open(&mut self, window: &WindowInfo) -> io::Result<Box<dyn Sink>> {
        Ok(Box::new(AnnotatedSink {
            inner: self.target.open(window)?,
            metadata: self.metadata.clone(),
        }))
    }
}

struct AnnotatedSink {
    inner: Box<dyn Sink>,
    metadata: Vec<(String, String)>,
}

impl Sink for AnnotatedSink {
    fn record(&mut self, activity: &Activity) -> io::Result<()> {
        self.inner.record(activity)
    }

    fn finish(self: Box<Self>, meta: &TraceMeta) -> io::Result<TraceOutput> {
        let mut meta = meta.clone();
        meta.metadata.extend(self.metadata);
        self.inner.finish(&meta)
    }

    fn discard(self: Box<Self>) {
        self.inner.discard()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_read_like_strtoll() {
        assert_eq!(job_id(None), 0);
        assert_eq!(job_id(Some("123456")), 123456);
        assert_eq!(job_id(Some(" 77_3")), 77);
        assert_eq!(job_id(Some("abc")), 0);
    }

    #[test]
    fn ancestors_start_with_this_process_and_follow_proc() {
        let pids = ancestor_pids();
        assert_eq!(pids[0], std::process::id() as i32);
        assert!(pids.len() <= 11, "{pids:?}");
        assert!(pids.iter().skip(1).all(|p| *p > 1), "{pids:?}");
        if pids.len() > 1 {
            assert_eq!(pids[1] as u32, std::os::unix::process::parent_id());
        }
        assert_eq!(parent_of("12 (a) b) c) S 7 12 12"), Some(7));
    }

    #[test]
    fn libkineto_is_seen_in_its_own_library_or_in_libtorch_cpu() {
        let line = |f: &str| format!("7f00-7f01 r-xp 00000000 08:01 42 {f}\n");
        assert!(!libkineto_mapped(&line("/usr/lib/libc.so.6")));
        assert!(libkineto_mapped(&line(
            "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so"
        )));
        assert!(libkineto_mapped(&line("/opt/lib/libkineto.so.1")));
    }

    #[test]
    fn a_metadata_sink_adds_the_request_facts() {
        let dir = tempfile::tempdir().unwrap();
        let mut target = TraceDir::new(dir.path());
        target.file_name = Some("x_1.json".into());
        let mut f = Annotated {
            target,
            metadata: vec![("kinetrace_trigger".into(), "dynolog".into())],
        };
        let sink = f.open(&WindowInfo::default()).unwrap();
        let out = sink.finish(&TraceMeta::default()).unwrap();
        assert_eq!(
            out.path.as_deref(),
            Some(dir.path().join("x_1.json").as_path())
        );
        let text = std::fs::read_to_string(dir.path().join("x_1.json")).unwrap();
        assert!(
            text.contains("\"kinetrace_trigger\": \"dynolog\""),
            "{text}"
        );
    }
}
