//! How the shim speaks inside someone else's process: log lines reach stderr without ever raising
//! SIGPIPE, and panics of kinetrace code become one log line instead of Rust's "thread panicked"
//! message on the job's stderr.

use std::ffi::c_void;

use kinetrace_agent as agent;

/// Installs both (from the constructor).
pub(crate) fn install() {
    agent::set_stderr_writer(write_stderr);
    // This library has its own copy of the standard library, so the hook sees only panics of
    // kinetrace code, never the job's (a Rust job keeps its own hook).
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        agent::panicked(message, info.location().map(|l| (l.file(), l.line())));
    }));
}

/// Writes `bytes` to file descriptor 2 and ignores every error. A write to a pipe whose reader has
/// gone raises SIGPIPE, which kills a job that (like most C programs) leaves it at its default; so
/// SIGPIPE is blocked in this thread around the write, a SIGPIPE the write raised is consumed, and
/// the mask is restored. A SIGPIPE that was already pending stays pending for the job.
pub(crate) fn write_stderr(bytes: &[u8]) {
    // SAFETY: `sigset_t` is plain data; sigemptyset initialises it before use.
    let mut pipe: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `pipe` is a valid sigset_t; SIGPIPE is a valid signal number.
    unsafe {
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
    }
    // SAFETY: as above, plain data filled by pthread_sigmask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid set and out-pointer; changes only this thread's mask.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old) } != 0 {
        // Without the mask the write could kill the job: the line is dropped instead.
        return;
    }
    // SAFETY: plain data filled by sigpending.
    let mut pending: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; `pending` is initialised when it returns 0.
    let already = unsafe { libc::sigpending(&mut pending) } == 0
        // SAFETY: `pending` was filled by sigpending.
        && unsafe { libc::sigismember(&pending, libc::SIGPIPE) } == 1;
    let mut rest = bytes;
    let mut broken_pipe = false;
    while !rest.is_empty() {
        // SAFETY: writes `rest.len()` bytes from a live slice to descriptor 2.
        let n = unsafe { libc::write(2, rest.as_ptr() as *const c_void, rest.len()) };
        if n > 0 {
            rest = &rest[n as usize..];
            continue;
        }
        let errno = std::io::Error::last_os_error().raw_os_error();
        if n < 0 && errno == Some(libc::EINTR) {
            continue;
        }
        broken_pipe = n < 0 && errno == Some(libc::EPIPE);
        break;
    }
    if broken_pipe && !already {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid set and timeout; consumes the SIGPIPE this thread's write raised (returns
        // at once with EAGAIN if there is none, e.g. when SIGPIPE is ignored).
        unsafe { libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero) };
    }
    // SAFETY: restores the mask saved above (a valid set).
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
}
