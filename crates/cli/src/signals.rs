//! Signal pass-through for `kinetrace record`: SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to kinetrace
//! (by `kill`, a batch scheduler) are forwarded to the command. SIGINT and SIGQUIT come from the
//! terminal, which sends them to the whole foreground process group, the command included, so
//! kinetrace only survives them (to list the traces afterwards) and does not send them twice. When
//! the command dies of a signal, kinetrace dies of the same signal.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::{Handle, Signals};

/// Forwards while alive.
pub struct Forwarder {
    handle: Option<Handle>,
    thread: Option<JoinHandle<()>>,
}

/// Starts forwarding the usual termination and user signals to `pid`.
pub fn forward_to(pid: u32) -> Forwarder {
    let Ok(mut signals) = Signals::new([SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2]) else {
        return Forwarder {
            handle: None,
            thread: None,
        };
    };
    let handle = signals.handle();
    let thread = std::thread::Builder::new()
        .name("kinetrace-signals".into())
        .spawn(move || {
            for raw in signals.forever() {
                if let (Some(p), Some(s)) =
                    (rustix::process::Pid::from_raw(pid as i32), signal(raw))
                {
                    let _ = rustix::process::kill_process(p, s);
                }
            }
        })
        .ok();
    Forwarder {
        handle: Some(handle),
        thread,
    }
}

/// The signals forwarded (SIGINT and SIGQUIT are not: see the module docs).
fn signal(raw: i32) -> Option<rustix::process::Signal> {
    use rustix::process::Signal;
    Some(match raw {
        SIGHUP => Signal::HUP,
        SIGTERM => Signal::TERM,
        SIGUSR1 => Signal::USR1,
        SIGUSR2 => Signal::USR2,
        _ => return None,
    })
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
