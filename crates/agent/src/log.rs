//! The agent's one log channel. Every line kinetrace says in an injected process goes through
//! [`log`]: to the `KINETRACE_LOG` target once the configuration is read (and the profiler gets the
//! same function, so the session's and the GPU backend's lines go there too), before that to
//! `KINETRACE_LOG` if that alone is usable, else stderr. Stderr is written through the shim's
//! writer, which keeps a closed pipe from raising SIGPIPE; write errors are ignored. Panics of
//! kinetrace code become one line too ([`panicked`]).

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Arc;

use kinetrace_core::session::LogFn;

use crate::config::LogTarget;
use crate::process::PROCESS;

/// Writes bytes to the process's stderr: never panics, ignores errors.
pub type StderrWriter = fn(&[u8]);

/// The end of the line a panic is reported with, by what the panicking code was doing.
pub(crate) const CONTINUES: &str = "profiling continues";
pub(crate) const STOPS: &str = "profiling stops in this process";

thread_local! {
    /// What a panic on this thread means for profiling (see [`panicked`]).
    static ON_PANIC: Cell<&'static str> = const { Cell::new(CONTINUES) };
}

/// Logs one line through this process's log (see the module docs).
pub fn log(message: &str) {
    if let Some(log) = crate::embed::log_fn() {
        return log(message);
    }
    match PROCESS.running.get() {
        Some(r) => (r.log)(message),
        None => fallback_log(message),
    }
}

/// Logs to `KINETRACE_LOG` if that alone is usable (the rest of the configuration may be what is
/// wrong), else stderr.
pub(crate) fn fallback_log(message: &str) {
    let target = std::env::var_os("KINETRACE_LOG")
        .filter(|v| !v.is_empty() && v != "stderr")
        .map(|p| LogTarget::File(PathBuf::from(p)))
        .unwrap_or(LogTarget::Stderr);
    make_log(&target)(message);
}

/// The one way a line reaches stderr: never panics, never raises SIGPIPE (with the shim's writer),
/// errors ignored.
fn write_stderr(line: &str) {
    match PROCESS.embedding.stderr.get() {
        Some(write) => write(line.as_bytes()),
        None => {
            use std::io::Write;
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// The log function for `target`.
pub(crate) fn make_log(target: &LogTarget) -> LogFn {
    match target {
        LogTarget::Stderr => Arc::new(|m: &str| write_stderr(&format!("kinetrace: {m}\n"))),
        LogTarget::File(path) => {
            let path = path.clone();
            Arc::new(move |m: &str| {
                use std::io::Write;
                let line = format!("kinetrace[{}]: {m}\n", std::process::id());
                // Opened with O_NONBLOCK (a FIFO nobody reads fails at once instead of blocking
                // the job) and without following another user's symlink (kinetrace-files).
                let written = kinetrace_files::open_append(&path)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
                if let Err(e) = written {
                    write_stderr(&format!(
                        "kinetrace: {m} (cannot write {}: {e})\n",
                        path.display()
                    ));
                }
            })
        }
    }
}

/// The shim's panic hook: a panic in kinetrace code (the shim's copy of the standard library only
/// sees those) becomes one log line, `internal error: MESSAGE at FILE:LINE; WHAT NOW`, and nothing
/// on the job's stderr besides what the log target says. Must not panic (a panic in a panic hook
/// aborts the process): the log path only formats and writes, ignoring errors.
pub fn panicked(message: &str, location: Option<(&str, u32)>) {
    let at = location
        .map(|(file, line)| format!(" at {file}:{line}"))
        .unwrap_or_default();
    let then = ON_PANIC.try_with(Cell::get).unwrap_or(CONTINUES);
    log(&format!("internal error: {message}{at}; {then}"));
}

/// Runs `f` with `what` as the meaning of a panic on this thread (see [`panicked`]).
pub(crate) fn on_panic<T>(what: &'static str, f: impl FnOnce() -> T) -> T {
    let before = ON_PANIC.with(|c| c.replace(what));
    let out = f();
    ON_PANIC.with(|c| c.set(before));
    out
}

/// Sets what a panic means on this thread for the rest of its life (a thread of the agent's own).
pub(crate) fn on_panic_forever(what: &'static str) {
    ON_PANIC.with(|c| c.set(what));
}
