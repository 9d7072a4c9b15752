//! Keeping the trace when a signal ends the job: SIGINT (Ctrl-C), SIGTERM (a scheduler, `kill`)
//! and SIGHUP (a closed terminal), where the job left them at their default action, which ends the
//! process at once, so no exit handler runs.
//!
//! When profiling starts, each of these signals whose action is still the default gets a handler,
//! and a thread of kinetrace's own waits for it on a pipe. The handler does only what is
//! async-signal-safe: it writes the signal number to the pipe, waits (`poll`, at most the exit
//! budget plus a quarter second) for the thread to answer that the agent's exit path has run (it saves the
//! capture in progress, or gives up past the budget and removes its unfinished files), then puts
//! the default action back and raises the signal again. So the process ends as it would have: by
//! the same signal (a shell still sees 130 for SIGINT), only up to the exit budget later.
//!
//! - A signal the job handles or ignores is left alone: Python's SIGINT handler (KeyboardInterrupt;
//!   the `sitecustomize` saves from Python's own `atexit`, see `kinetrace_save_at_exit`), a C++
//!   handler, a Rust `ctrlc` handler, `nohup`'s SIG_IGN. Its handler decides; an ordinary exit saves
//!   the trace. A handler the job installs later replaces kinetrace's, as it would the default.
//! - kinetrace's threads are started with these signals blocked ([`blocked`] around every entry
//!   point that may start profiling), so the kernel delivers them to a thread of the job, as it
//!   did before: a job that blocks them everywhere and takes them with `sigwait` still gets them.
//! - A second signal while the first is being handled is dropped by the thread it lands on; the
//!   first one ends the process.
//! - A forked child (its copy of the handler has no thread to answer) puts the default back and
//!   re-raises at once.

use std::ffi::c_int;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use kinetrace_agent as agent;

/// The signals whose default action ends the process and that people use to stop a job.
const SIGNALS: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Orderings: ARMED is Release once the descriptors are stored and Acquire in the handler, so a
/// handler that sees it armed sees them; the rest are flags (Relaxed, or AcqRel for the swap that
/// picks the one handler that saves).
static INSTALLED: AtomicBool = AtomicBool::new(false);
static ARMED: AtomicBool = AtomicBool::new(false);
static BUSY: AtomicBool = AtomicBool::new(false);
/// The write end of the pipe the thread reads signals from.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// The read end of the pipe the thread answers on.
static DONE: AtomicI32 = AtomicI32::new(-1);

/// The three signals as a set.
fn signal_set() -> libc::sigset_t {
    // SAFETY: `sigset_t` is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t and the signals are valid numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Unblocks, when dropped, those of the three signals this thread did not block before.
struct Unblock(libc::sigset_t);

impl Drop for Unblock {
    fn drop(&mut self) {
        // SAFETY: a valid set; changes only this thread's mask.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.0, std::ptr::null_mut()) };
    }
}

/// Runs `f` with SIGINT, SIGTERM and SIGHUP blocked in this thread, so that threads it starts
/// (kinetrace's collector, control, cleanup and exit threads) inherit them blocked. A signal
/// arriving meanwhile stays pending and is delivered when `f` returns. Other changes `f` makes to
/// the mask are kept.
pub(crate) fn blocked<R>(f: impl FnOnce() -> R) -> R {
    let set = signal_set();
    // SAFETY: plain data filled by pthread_sigmask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid set and out-pointer; changes only this thread's mask.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) } != 0 {
        return f();
    }
    // SAFETY: plain data, initialised by sigemptyset.
    let mut newly: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sets; `old` was filled by pthread_sigmask.
    unsafe {
        libc::sigemptyset(&mut newly);
        for s in SIGNALS {
            if libc::sigismember(&old, s) == 0 {
                libc::sigaddset(&mut newly, s);
            }
        }
    }
    let _unblock = Unblock(newly);
    f()
}

/// Installs the handlers and starts the thread (once per process; from the thread that started
/// profiling). Signals the job handles or ignores are left alone; if none is left at its default,
/// nothing is installed.
pub(crate) fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    let at_default: Vec<c_int> = SIGNALS
        .into_iter()
        .filter(|&s| current_action(s) == Some(libc::SIG_DFL))
        .collect();
    if at_default.is_empty() {
        return;
    }
    let (Some((wake_r, wake_w)), Some((done_r, done_w))) = (pipe(), pipe()) else {
        return;
    };
    let spawned = blocked(|| {
        std::thread::Builder::new()
            .name("kinetrace-signal".into())
            .spawn(move || serve(wake_r, done_w))
    });
    if spawned.is_err() {
        for fd in [wake_r, wake_w, done_r, done_w] {
            // SAFETY: descriptors this function opened and nothing else uses.
            unsafe { libc::close(fd) };
        }
        agent::log("cannot start the thread that saves the trace when a signal ends the job; a job killed by SIGINT, SIGTERM or SIGHUP leaves no trace");
        return;
    }
    WAKE.store(wake_w, Ordering::Relaxed);
    DONE.store(done_r, Ordering::Relaxed);
    ARMED.store(true, Ordering::Release);
    for s in at_default {
        // SAFETY: zeroed is a valid sigaction; the fields set below make it a handler.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as extern "C" fn(c_int) as usize;
        act.sa_mask = signal_set();
        act.sa_flags = libc::SA_RESTART;
        // SAFETY: plain data filled by sigaction.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `act` is initialised; the signal is catchable; `old` is a valid out-pointer.
        if unsafe { libc::sigaction(s, &act, &mut old) } == 0 && old.sa_sigaction != libc::SIG_DFL {
            // The job set its own action in the meantime: it stays.
            // SAFETY: puts back the action sigaction just returned.
            unsafe { libc::sigaction(s, &old, std::ptr::null_mut()) };
        }
    }
}

/// A forked child: its copy of the handler has no thread to answer, so it re-raises at once.
/// Async-signal-safe (an atomic store).
pub(crate) fn after_fork_child() {
    ARMED.store(false, Ordering::Relaxed);
}

/// The action of `signal` now (SIG_DFL, SIG_IGN or a handler's address).
fn current_action(signal: c_int) -> Option<libc::sighandler_t> {
    // SAFETY: zeroed is a valid sigaction to be filled.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (null new action) with a valid out-pointer.
    (unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } == 0)
        .then_some(old.sa_sigaction)
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> Option<(c_int, c_int)> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    (unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0).then_some((fds[0], fds[1]))
}

/// The thread: waits for a signal number, runs the agent's exit path, answers.
fn serve(wake: c_int, done: c_int) {
    loop {
        let mut byte = 0u8;
        // SAFETY: reads one byte into a live local from a descriptor this thread owns.
        let n = unsafe { libc::read(wake, &mut byte as *mut u8 as *mut libc::c_void, 1) };
        if n == 1 {
            let _ = catch_unwind(|| agent::at_fatal_signal(c_int::from(byte)));
            // SAFETY: writes one byte from a live local to a descriptor this thread owns.
            unsafe { libc::write(done, &1u8 as *const u8 as *const libc::c_void, 1) };
        } else if !(n < 0 && errno() == libc::EINTR) {
            return;
        }
    }
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno location is always valid.
    unsafe { *libc::__errno_location() }
}

fn set_errno(v: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = v };
}

/// The handler. Async-signal-safe throughout: atomics, `write`, `poll`, `clock_gettime`,
/// `sigaction`, `raise`; errno is kept for the interrupted code.
extern "C" fn on_signal(signal: c_int) {
    let _ = catch_unwind(|| {
        let saved_errno = errno();
        if ARMED.load(Ordering::Acquire) {
            if BUSY.swap(true, Ordering::AcqRel) {
                // Another thread is saving; it ends the process when done.
                set_errno(saved_errno);
                return;
            }
            wait_for_save(signal);
        }
        // SAFETY: zeroed is a valid sigaction; SIG_DFL is the action being restored.
        let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: a valid action for a catchable signal; then the signal is raised for this
        // thread, where it stays pending (the handler blocks it) until the handler returns, and
        // then takes its default action.
        unsafe {
            libc::sigaction(signal, &dfl, std::ptr::null_mut());
            libc::raise(signal);
        }
        set_errno(saved_errno);
    });
}

/// Hands `signal` to the thread and waits for its answer, at most the exit budget plus 250 ms
/// (the agent's exit path gives up at the budget; [`CLEANUP_MS`] covers its cleanup).
fn wait_for_save(signal: c_int) {
    let byte = signal as u8;
    // SAFETY: writes one byte from a live local to the pipe's write end.
    if unsafe {
        libc::write(
            WAKE.load(Ordering::Relaxed),
            &byte as *const u8 as *const libc::c_void,
            1,
        )
    } != 1
    {
        return;
    }
    let limit_ms = agent::EXIT_BUDGET.as_millis() as i64 + CLEANUP_MS;
    let start = monotonic_ms();
    loop {
        let left = limit_ms - (monotonic_ms() - start);
        if left <= 0 {
            return;
        }
        let mut fd = libc::pollfd {
            fd: DONE.load(Ordering::Relaxed),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut fd, 1, left as c_int) };
        // Answered, timed out, or failed: done waiting. Interrupted: wait for what is left.
        if !(n < 0 && errno() == libc::EINTR) {
            return;
        }
    }
}

/// What the exit path may take past the budget: removing its unfinished files and one log line.
/// Past it the signal ends the process anyway (a saver stuck on a lock the interrupted thread holds
/// must not hold the job).
const CLEANUP_MS: i64 = 250;

fn monotonic_ms() -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec * 1000 + t.tv_nsec / 1_000_000
}
