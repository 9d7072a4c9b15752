//! Signal pass-through for `kinetrace record`.
//!
//! The handlers are installed before the command exists ([`install`]); a signal that arrives
//! before it starts is kept and delivered right after it starts, so SIGTERM at any moment either
//! reaches the command or (in the instant before `main` installs them) ends kinetrace before it
//! started anything. Never an orphaned command.
//!
//! Which signals are forwarded:
//! - SIGTERM, SIGUSR1, SIGUSR2: always.
//! - SIGINT, SIGQUIT, SIGHUP: when sent by a process (`kill`, a batch scheduler: `si_code` is
//!   `SI_USER`, `SI_QUEUE` or `SI_TKILL`). One the kernel generated (Ctrl-C, Ctrl-\, a terminal
//!   hang-up) went to the whole foreground process group, the command included, so it is not sent
//!   twice, unless the command left kinetrace's process group, which the terminal's signal then
//!   missed. (A process that signals the whole group, `kill -INT -PGID`, reaches the command
//!   directly and through kinetrace: it gets that signal twice. Nothing tells the two apart.)
//! - A signal that was ignored when kinetrace started (`nohup`, `&` in a script) stays ignored by
//!   kinetrace and, inherited, by the command.
//!
//! kinetrace itself survives these signals while the command runs (to list the traces
//! afterwards); once the command has ended, one of them has its default effect. When the command
//! dies of a signal, kinetrace dies of the same signal.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use rustix::process::{Pid, Signal};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::exfiltrator::WithRawSiginfo;
use signal_hook::iterator::{Handle, SignalsInfo};

/// The signals handled.
const HANDLED: [i32; 6] = [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2];

/// `si_code` values (Linux, `<asm-generic/siginfo.h>`): user-space senders are <= 0 (`SI_USER` 0,
/// `SI_QUEUE` -1, `SI_TKILL` -6, ...); the kernel's own (`SI_KERNEL` 0x80) are positive.
fn sent_by_a_process(si_code: i32) -> bool {
    si_code <= 0
}

/// Whether to pass `sig` on to the command. `from_process`: sent by a process rather than the
/// kernel; `same_group`: the command is in kinetrace's process group (so it got the terminal's
/// signals itself).
pub fn should_forward(sig: i32, from_process: bool, same_group: bool) -> bool {
    match sig {
        SIGTERM | SIGUSR1 | SIGUSR2 => true,
        SIGINT | SIGQUIT | SIGHUP => from_process || !same_group,
        _ => false,
    }
}

enum Stage {
    /// The command does not exist yet: the signals to deliver once it does.
    Before(Vec<i32>),
    /// The command runs with this pid (not yet reaped, so the pid is still its own).
    Running(Pid),
    /// The command has ended.
    After,
}

/// Forwards while alive (see the module docs).
pub struct Forwarder {
    stage: Arc<Mutex<Stage>>,
    handle: Option<Handle>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<Stage>) -> MutexGuard<'_, Stage> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the handlers; call it before starting the command. If that fails (no thread, no
/// pipe), signals keep their default effect and the command still runs.
pub fn install() -> Forwarder {
    let stage = Arc::new(Mutex::new(Stage::Before(Vec::new())));
    let off = |stage| Forwarder {
        stage,
        handle: None,
        thread: None,
    };
    // The thread first: handlers with nobody to read them would swallow the signals (signal-hook
    // does not put the default back when they are dropped).
    let (tx, rx) = std::sync::mpsc::channel::<SignalsInfo<WithRawSiginfo>>();
    let shared = stage.clone();
    let Ok(thread) = std::thread::Builder::new()
        .name("kinetrace-signals".into())
        .spawn(move || {
            let Ok(mut signals) = rx.recv() else {
                return;
            };
            for info in signals.forever() {
                let (sig, from_process) = (info.si_signo, sent_by_a_process(info.si_code));
                let mut stage = lock(&shared);
                match &mut *stage {
                    Stage::Before(queue) => queue.push(sig),
                    Stage::Running(pid) => deliver(*pid, sig, from_process),
                    Stage::After => {
                        drop(stage);
                        let _ = signal_hook::low_level::emulate_default_handler(sig);
                    }
                }
            }
        })
    else {
        return off(stage);
    };
    let ignored = ignored_now();
    let wanted: Vec<i32> = HANDLED
        .into_iter()
        .filter(|s| ignored & (1u64 << (s - 1)) == 0)
        .collect();
    let Ok(signals) = SignalsInfo::<WithRawSiginfo>::new(&wanted) else {
        drop(tx);
        let _ = thread.join();
        return off(stage);
    };
    let handle = signals.handle();
    if tx.send(signals).is_err() {
        let _ = thread.join();
        return off(stage);
    }
    Forwarder {
        stage,
        handle: Some(handle),
        thread: Some(thread),
    }
}

impl Forwarder {
    /// The command started as `pid`: delivers what arrived before, then forwards as it comes.
    pub fn started(&self, pid: u32) {
        let Some(pid) = Pid::from_raw(pid as i32) else {
            return;
        };
        let mut stage = lock(&self.stage);
        if let Stage::Before(queue) = &mut *stage {
            for sig in std::mem::take(queue) {
                // Whoever sent it, the command did not exist to get it: it needs this copy.
                deliver_unconditionally(pid, sig);
            }
        }
        *stage = Stage::Running(pid);
    }

    /// The command has ended (call before reaping it, so no signal goes to a reused pid).
    pub fn ended(&self) {
        *lock(&self.stage) = Stage::After;
    }
}

fn deliver(pid: Pid, sig: i32, from_process: bool) {
    let same_group = match (
        rustix::process::getpgid(Some(pid)),
        rustix::process::getpgid(None),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    };
    if should_forward(sig, from_process, same_group) {
        deliver_unconditionally(pid, sig);
    }
}

fn deliver_unconditionally(pid: Pid, sig: i32) {
    if let Some(s) = signal(sig) {
        let _ = rustix::process::kill_process(pid, s);
    }
}

fn signal(raw: i32) -> Option<Signal> {
    Some(match raw {
        SIGHUP => Signal::HUP,
        SIGINT => Signal::INT,
        SIGQUIT => Signal::QUIT,
        SIGTERM => Signal::TERM,
        SIGUSR1 => Signal::USR1,
        SIGUSR2 => Signal::USR2,
        _ => return None,
    })
}

/// The signals this process ignores (`SigIgn` of `/proc/self/status`, bit n-1 for signal n); 0
/// if it cannot be read. Read before installing anything, it is what kinetrace inherited.
fn ignored_now() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_sig_ign(&s))
        .unwrap_or(0)
}

fn parse_sig_ign(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("SigIgn:"))?;
    u64::from_str_radix(line["SigIgn:".len()..].trim(), 16).ok()
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.close();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The command's exit code, or the same death by signal for kinetrace itself.
pub fn exit_like(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    if let Some(sig) = status.signal() {
        let _ = signal_hook::low_level::emulate_default_handler(sig);
        return ExitCode::from((128 + sig).clamp(0, 255) as u8);
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_signals_are_not_sent_twice_and_sent_ones_are_forwarded() {
        for sig in [SIGINT, SIGQUIT, SIGHUP] {
            assert!(should_forward(sig, true, true), "{sig} from kill");
            assert!(!should_forward(sig, false, true), "{sig} from the terminal");
            assert!(
                should_forward(sig, false, false),
                "{sig} from the terminal, the command in another group"
            );
        }
        for sig in [SIGTERM, SIGUSR1, SIGUSR2] {
            assert!(should_forward(sig, false, true) && should_forward(sig, true, true));
        }
        assert!(sent_by_a_process(0) && sent_by_a_process(-1) && sent_by_a_process(-6));
        assert!(!sent_by_a_process(0x80));
    }

    #[test]
    fn ignored_signals_are_read_from_proc_status() {
        let status = "Name:\tx\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000001001\nSigCgt:\t0\n";
        let ign = parse_sig_ign(status).unwrap();
        assert_eq!(ign, (1 << (SIGHUP - 1)) | (1 << (13 - 1)));
        assert!(parse_sig_ign("Name:\tx\n").is_none());
        // The Rust runtime ignores SIGPIPE (13) in this test process.
        assert_ne!(ignored_now() & (1 << (13 - 1)), 0);
    }
}
