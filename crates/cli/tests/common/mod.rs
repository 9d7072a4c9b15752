//! Waiting on processes with a deadline: every test that waits on a child goes through [`Watched`],
//! which collects stdout and stderr on reader threads and, when the deadline passes, kills the
//! child's whole process group and fails with what it saw so far. A plain `output()`, `wait()` or
//! read of a child's pipe could hang a test (and CI) forever.

#![allow(dead_code)] // each test binary uses its own part

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The deadline of a `kinetrace` run in these tests: generous, CI runs on a loaded 2-core machine.
pub const RUN: Duration = Duration::from_secs(60);

/// A child whose stdout and stderr are being collected.
pub struct Watched {
    child: Child,
    what: String,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    eof: Receiver<()>,
    start: Instant,
}

impl Watched {
    /// Spawns `cmd` in a process group of its own (so a deadline can kill its whole tree), stdin
    /// from /dev/null, stdout and stderr piped.
    pub fn spawn(cmd: &mut Command) -> Watched {
        let what = format!("{cmd:?}");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        let (tx, eof) = channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        for (pipe, buf) in [
            (
                Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
                out.clone(),
            ),
            (Box::new(child.stderr.take().unwrap()), err.clone()),
        ] {
            let tx = tx.clone();
            // Detached on purpose: a pipe some leftover grandchild holds open must not hang us.
            std::thread::spawn(move || {
                let mut pipe = pipe;
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    buf.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
                let _ = tx.send(());
            });
        }
        Watched {
            child,
            what,
            out,
            err,
            eof,
            start: Instant::now(),
        }
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }

    /// Kills the process group and fails with everything seen so far.
    pub fn fail(mut self, why: &str) -> ! {
        self.kill_group();
        let _ = self.child.wait();
        panic!(
            "{why} (after {:.1} s): {}\n--- stdout so far:\n{}\n--- stderr so far:\n{}",
            self.start.elapsed().as_secs_f64(),
            self.what,
            self.stdout(),
            self.stderr()
        );
    }

    fn kill_group(&mut self) {
        if let Some(p) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
    }

    /// Waits until stdout contains `text`, or fails after `deadline`.
    pub fn wait_for_stdout(self, text: &str, deadline: Duration) -> Watched {
        let end = Instant::now() + deadline;
        loop {
            if self.stdout().contains(text) {
                return self;
            }
            if Instant::now() > end {
                self.fail(&format!("no `{}` on stdout", text.escape_debug()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the exit and for the end of both pipes, or fails after `deadline`.
    pub fn finish(mut self, deadline: Duration) -> Output {
        let end = Instant::now() + deadline;
        let status: ExitStatus = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() > end => self.fail("still running at the deadline"),
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => self.fail(&format!("cannot wait: {e}")),
            }
        };
        for _ in 0..2 {
            let left = end.saturating_duration_since(Instant::now());
            if self.eof.recv_timeout(left).is_err() {
                self.fail(&format!(
                    "exited ({status}) but its stdout/stderr stayed open: a process it started outlived it"
                ));
            }
        }
        Output {
            status,
            stdout: self.out.lock().unwrap().clone(),
            stderr: self.err.lock().unwrap().clone(),
        }
    }
}

/// `cmd.output()` with a deadline.
pub fn output(cmd: &mut Command, deadline: Duration) -> Output {
    Watched::spawn(cmd).finish(deadline)
}
