//! Saving the capture in progress when the process ends, whichever way it ends:
//!
//! - an ordinary exit (the shim's C `atexit` handler);
//! - a Python interpreter finalising (the `sitecustomize`'s Python `atexit` callback calls the shim's
//!   `kinetrace_save_at_exit`): Python ends an unhandled KeyboardInterrupt (Ctrl-C) by killing itself
//!   with SIGINT after finalisation, so C `atexit` handlers never run there;
//! - a signal whose default action ends the process (SIGINT, SIGTERM, SIGHUP left at their default):
//!   the shim's handler hands it to a thread of its own, which calls here, then lets the signal take
//!   its default action.
//!
//! The process ends once, through `process::end`, within one [`EXIT_BUDGET`]: the capture in
//! progress is saved (the preloaded shim's, or that of a `kinetrace.profile` the job never
//! stopped), then the removal of what killed processes left gets what is left of the budget.
//! Whoever comes first saves, on a thread of its own, and waits for it until the deadline;
//! whoever comes while that save runs (a SIGTERM during Python's finalisation, say) waits for the
//! same save, within its own budget, instead of starting another. Past the budget the unfinished
//! files are removed and the process ends anyway, with one line. The state is one atomic and
//! waiting is polling it, so waiting takes no lock the interrupted thread could hold.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kinetrace_core::session::LogFn;

use crate::log::on_panic;
use crate::process::EXIT_BUDGET;

/// How the process is ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// An exit: `exit()`, the end of `main`, a Python interpreter finalising.
    Exit,
    /// A signal whose default action ends the process (its number).
    Signal(i32),
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Exit => f.write_str("at exit"),
            Ending::Signal(s) => write!(f, "on {}", signal_name(*s)),
        }
    }
}

/// `SIGINT` for 2, and so on for the signals kinetrace handles; `signal N` for others.
pub fn signal_name(signal: i32) -> String {
    match signal {
        1 => "SIGHUP".into(),
        2 => "SIGINT".into(),
        3 => "SIGQUIT".into(),
        9 => "SIGKILL".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

const IDLE: u8 = 0;
const SAVING: u8 = 1;
const SAVED: u8 = 2;
/// The save panicked (the panic hook said where).
const FAILED: u8 = 3;

/// The one save at the end of the process (a process ends once, whichever profiler it ran: the
/// preloaded shim's or `kinetrace.profile`'s). Orderings: `state` is Release when the save finishes
/// and Acquire when read, so a waiter that sees SAVED sees the files it wrote; `log` is set before
/// `state` leaves IDLE (AcqRel), so a waiter that sees it left IDLE finds it; the flag is Relaxed (it
/// guards one log line).
struct ExitSave {
    state: AtomicU8,
    log: OnceLock<LogFn>,
    gave_up: AtomicBool,
}

static EXIT_SAVE: ExitSave = ExitSave {
    state: AtomicU8::new(IDLE),
    log: OnceLock::new(),
    gave_up: AtomicBool::new(false),
};

/// Marks the save FAILED if its thread unwinds before it finished.
struct FinishGuard;

impl Drop for FinishGuard {
    fn drop(&mut self) {
        let _ =
            EXIT_SAVE
                .state
                .compare_exchange(SAVING, FAILED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Runs `save` (a capture in progress being written as the process ends) on a thread of its own
/// and waits for it until `deadline` (at most [`EXIT_BUDGET`] from the start of the ending); past
/// that its unfinished files are removed and one line (to `log`) says so. A caller that comes while
/// another's save runs, or after it, waits for that save instead (its own `save` is dropped).
pub(crate) fn save_within_budget(
    log: &LogFn,
    deadline: Instant,
    ending: Ending,
    save: impl FnOnce() + Send + 'static,
) {
    let _ = EXIT_SAVE.log.set(log.clone());
    if EXIT_SAVE
        .state
        .compare_exchange(IDLE, SAVING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        let spawned = std::thread::Builder::new()
            .name("kinetrace-exit".into())
            .spawn(move || {
                let guard = FinishGuard;
                on_panic("the capture in progress is not saved", || {
                    // Test hook (outside the KINETRACE_ key space on purpose): a slow save, so the
                    // exit budget can be tested without depending on how fast this machine writes.
                    if let Some(ms) = std::env::var("_KINETRACE_TEST_EXIT_DELAY_MS")
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                    {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    save();
                });
                EXIT_SAVE.state.store(SAVED, Ordering::Release);
                drop(guard);
            });
        if spawned.is_err() {
            EXIT_SAVE.state.store(FAILED, Ordering::Release);
            give_up(
                log,
                &format!("could not start saving the capture in progress {ending}"),
            );
            return;
        }
    }
    wait(log, deadline, ending);
}

/// Waits, until `deadline`, for the save another caller started (a signal that comes while Python's
/// exit saves, say); returns at once when none was.
pub(crate) fn wait_for_save(deadline: Instant, ending: Ending) {
    if EXIT_SAVE.state.load(Ordering::Acquire) == IDLE {
        return;
    }
    if let Some(log) = EXIT_SAVE.log.get() {
        wait(log, deadline, ending);
    }
}

fn wait(log: &LogFn, deadline: Instant, ending: Ending) {
    loop {
        match EXIT_SAVE.state.load(Ordering::Acquire) {
            SAVED => return,
            FAILED => {
                give_up(
                    log,
                    &format!("saving the capture in progress failed {ending}"),
                );
                return;
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            give_up(
                log,
                &format!(
                    "gave up saving the capture in progress after {} s {ending}",
                    EXIT_BUDGET.as_secs()
                ),
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The save did not finish: its spool and temporary trace go now, and nothing is renamed into
/// place after this, so the line stays true. Said once.
fn give_up(log: &LogFn, why: &str) {
    kinetrace::export::writer::abandon_unfinished();
    if !EXIT_SAVE.gave_up.swap(true, Ordering::Relaxed) {
        log(&format!(
            "{why}; its unfinished files were removed and no trace file was left"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_name_their_signal() {
        assert_eq!(Ending::Exit.to_string(), "at exit");
        assert_eq!(Ending::Signal(2).to_string(), "on SIGINT");
        assert_eq!(Ending::Signal(15).to_string(), "on SIGTERM");
        assert_eq!(Ending::Signal(1).to_string(), "on SIGHUP");
        assert_eq!(Ending::Signal(40).to_string(), "on signal 40");
    }
}
