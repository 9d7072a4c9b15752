//! Child processes waited on with a deadline. Every wait fails, past its deadline, with what the
//! child printed so far (a plain `wait()` or read of a child's pipe could hang a test run forever),
//! and a test that fails half-way leaves no process behind.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits on another process before it fails with what it saw. Generous: CI runs
/// on a loaded 2-core machine; no test depends on being fast.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How long a test run in a child process ([`in_child`]) may take.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// A running child whose piped stdout and stderr are drained as they come (so it never blocks on a
/// full pipe), waited on with [`DEADLINE`]. Every failure message carries what the child printed so
/// far, plus the files named with [`Job::show`] (a log).
pub struct Job {
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    show: Vec<PathBuf>,
}

/// Reads `pipe` to its end on a thread, into `into`.
fn drain(
    pipe: Option<impl Read + Send + 'static>,
    into: &Arc<Mutex<Vec<u8>>>,
) -> Option<std::thread::JoinHandle<()>> {
    let mut pipe = pipe?;
    let into = into.clone();
    Some(std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => lock(&into).extend_from_slice(&buf[..n]),
            }
        }
    }))
}

fn lock(b: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

impl Job {
    /// Spawns `c` with stdout and stderr piped.
    pub fn spawn(mut c: Command) -> Job {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        Job::spawn_as_is(c)
    }

    /// Spawns `c` with the stdio it was given (piped streams are drained).
    pub fn spawn_as_is(mut c: Command) -> Job {
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {:?}: {e}", c.get_program()));
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let readers = [
            drain(child.stdout.take(), &stdout),
            drain(child.stderr.take(), &stderr),
        ]
        .into_iter()
        .flatten()
        .collect();
        Job {
            child,
            stdout,
            stderr,
            readers,
            show: Vec::new(),
        }
    }

    /// Spawns `c` with stdout and stderr piped, then closes the reading end of stderr at once: the
    /// child's stderr is a pipe nobody will ever read (writes fail with EPIPE / SIGPIPE).
    pub fn spawn_closing_stderr(mut c: Command) -> Job {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {:?}: {e}", c.get_program()));
        drop(child.stderr.take());
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let readers = drain(child.stdout.take(), &stdout).into_iter().collect();
        Job {
            child,
            stdout,
            stderr,
            readers,
            show: Vec::new(),
        }
    }

    /// Also show this file (a log) when a wait fails.
    pub fn show(mut self, path: &Path) -> Job {
        self.show.push(path.to_path_buf());
        self
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdout so far.
    pub fn stdout_so_far(&self) -> String {
        text(&lock(&self.stdout))
    }

    /// What the child printed so far and the files to show, for a failure message.
    pub fn seen(&self) -> String {
        let mut s = format!(
            "stdout:\n{}\nstderr:\n{}",
            self.stdout_so_far(),
            text(&lock(&self.stderr))
        );
        for p in &self.show {
            s.push_str(&format!(
                "\n{}:\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            ));
        }
        s
    }

    /// Waits until `ready` holds, polling; fails with what the child printed if the deadline passes
    /// or the child exits first.
    pub fn wait_until(&mut self, what: &str, mut ready: impl FnMut(&Job) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if ready(self) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                if ready(self) {
                    return;
                }
                panic!(
                    "waiting for {what}: the child exited ({status}) first; {}",
                    self.seen()
                );
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "waiting for {what}: timed out after {DEADLINE:?}; {}",
                    self.seen()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `path` exists and is not empty, and returns its contents.
    pub fn wait_for_file(&mut self, path: &Path) -> String {
        self.wait_until(&path.display().to_string(), |_| {
            std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
        });
        std::fs::read_to_string(path).unwrap()
    }

    /// Waits for the child to exit (killing it and failing past the deadline) and returns all it
    /// printed.
    pub fn wait(mut self) -> Output {
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("timed out after {DEADLINE:?}; {}", self.seen());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The pipes close when the child and everything it spawned have exited; a grandchild that
        // keeps them open must not hang the test either.
        let drained_by = Instant::now() + DEADLINE;
        for r in std::mem::take(&mut self.readers) {
            while !r.is_finished() {
                assert!(
                    Instant::now() < drained_by,
                    "the child exited ({status}) but its output pipes stayed open; {}",
                    self.seen()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = r.join();
        }
        Output {
            status,
            stdout: std::mem::take(&mut *lock(&self.stdout)),
            stderr: std::mem::take(&mut *lock(&self.stderr)),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A test that failed half-way leaves no process behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `c` with stdout and stderr piped and [`DEADLINE`]; panics if the program hangs.
pub fn run(c: Command) -> Output {
    Job::spawn(c).wait()
}

/// Waits (polling, with [`DEADLINE`]) until `ready` holds; fails with `seen()` otherwise.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool, seen: impl Fn() -> String) {
    let deadline = Instant::now() + DEADLINE;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "waiting for {what}: timed out after {DEADLINE:?}; {}",
            seen()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Bytes a process printed, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The variable naming the one test a re-run test binary is to run as the child (see [`in_child`]).
pub const CHILD_VAR: &str = "KINETRACE_TEST_CHILD";

/// Runs `body` in a fresh child process: the test binary is run again for test `name` only (state
/// such as CUPTI's, a fake library's configuration and kinetrace's session is process-wide). `name`
/// must be the test's own name (with its module path if it has one); `env` is added to the child's
/// environment. Fails with the child's output if it fails, runs no test or outlives
/// [`CHILD_DEADLINE`].
pub fn in_child(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    in_child_within(name, env, CHILD_DEADLINE, body)
}

/// [`in_child`] with another deadline.
pub fn in_child_within(name: &str, env: &[(&str, &str)], deadline: Duration, body: impl FnOnce()) {
    if is_child(name) {
        body();
        return;
    }
    let (status, text) = run_child(name, env, ChildStderr::Captured, deadline);
    assert!(status.success(), "child {name} failed ({status}):\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
}

/// Like [`in_child`], but the child's standard error is a pipe whose reading end is closed at once,
/// so every write to it fails (a full disk or a closed pipe, as a job's stderr can be).
pub fn in_child_with_broken_stderr(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if is_child(name) {
        body();
        return;
    }
    let (status, text) = run_child(name, env, ChildStderr::Broken, CHILD_DEADLINE);
    assert!(status.success(), "child {name} failed ({status}):\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
}

/// Whether this process is the child [`in_child`] started for test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_VAR).as_deref() == Ok(name)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChildStderr {
    Captured,
    Broken,
}

/// Re-runs this test binary for test `name` only, and returns its status and output (stdout, then
/// stderr). Fails the test with the output seen so far if the child outlives `limit`.
fn run_child(
    name: &str,
    env: &[(&str, &str)],
    stderr: ChildStderr,
    limit: Duration,
) -> (ExitStatus, String) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, name)
        // Whether markers can be recorded is each test's own choice, not the environment's.
        .env_remove("NVTX_INJECTION64_PATH")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let job = match stderr {
        ChildStderr::Captured => Job::spawn(c),
        // Closing our end makes every write the child makes to stderr fail (EPIPE; Rust programs
        // ignore SIGPIPE).
        ChildStderr::Broken => Job::spawn_closing_stderr(c),
    };
    let deadline = Instant::now() + limit;
    let mut job = job;
    let status = loop {
        match job.child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = job.child.kill();
                let _ = job.child.wait();
                panic!(
                    "child {name} still running after {limit:?}; killed. Output so far:\n{}",
                    job.seen()
                );
            }
            Err(e) => panic!("waiting for child {name}: {e}"),
        }
    };
    // The child has exited; its pipes reach end of file unless it left a process behind holding
    // them, so give the readers a bounded moment to finish.
    let settle = Instant::now() + Duration::from_secs(10);
    while Instant::now() < settle && job.readers.iter().any(|r| !r.is_finished()) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = format!("{}\n{}", job.stdout_so_far(), text(&lock(&job.stderr)));
    (status, out)
}
