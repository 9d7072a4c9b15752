//! The in-process entry points `kinetrace.profile` (python/kinetrace/_profile.py) drives through
//! ctypes: start a profiler configured by text, step it, ask for a capture, list its traces, stop
//! it. The behaviour is `kinetrace_agent::embed`'s; each entry point here is wrapped in
//! `catch_unwind` and only converts C strings and buffers.
//!
//! Buffers follow `snprintf`: at most `len - 1` bytes and a NUL are written, and the full length
//! (without the NUL) is returned, so a caller whose buffer was short can ask again.

use std::ffi::{c_char, c_int, CStr};
use std::panic::catch_unwind;

use kinetrace_agent as agent;

use crate::exit_signals::blocked;

/// The contract of these entry points; the Python side refuses a shim with another.
const API_VERSION: c_int = 1;

/// Copies `text` into `buf` (`len` bytes) as `snprintf` would; returns `text`'s length.
///
/// # Safety
/// `buf` is null or points to `len` writable bytes.
unsafe fn write_out(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: per the contract `buf` has `len` writable bytes and `n + 1 <= len`; the source is
        // `text`'s own bytes, which cannot overlap a caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// A NUL-terminated string argument, or `None` for null / non-UTF-8.
///
/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn arg<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

/// This API's version (1).
#[no_mangle]
pub extern "C" fn kinetrace_api_version() -> c_int {
    API_VERSION
}

/// Starts profiling this process as `config` says: `KINETRACE_KEY=value` lines (docs/config.md).
/// No environment variable is read for it and nothing needs preloading; the GPU backend attaches
/// at run time (see `kinetrace_agent::embed`). Returns 0 when started, else 1 with the reason in
/// `message`.
///
/// # Safety
/// `config` is null or a NUL-terminated string; `message` is null or points to `message_len`
/// writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_profile_start(
    config: *const c_char,
    message: *mut c_char,
    message_len: usize,
) -> c_int {
    // SAFETY: per the contract.
    let text = unsafe { arg(config) };
    // Blocked: the runtime's threads start with SIGINT, SIGTERM and SIGHUP blocked, so the job's
    // threads get them (see `exit_signals.rs`).
    let result = catch_unwind(|| match text {
        Some(t) => blocked(|| agent::embed::start(t)),
        None => Err("the configuration is not UTF-8 text".to_string()),
    })
    .unwrap_or_else(|_| Err("internal error while starting (see the log)".to_string()));
    match result {
        Ok(()) => {
            crate::shim::install_after(agent::Install {
                atexit: true,
                sigusr2: false,
            });
            0
        }
        Err(why) => {
            // SAFETY: per the contract.
            unsafe { write_out(&why, message, message_len) };
            1
        }
    }
}

/// A step boundary of the running `kinetrace.profile` (nothing when none runs). Blocked as the
/// start is: a step may add the GPU backend, whose threads start here.
#[no_mangle]
pub extern "C" fn kinetrace_profile_step() {
    let _ = catch_unwind(|| blocked(agent::embed::step));
}

/// Asks the running `kinetrace.profile` for a capture of `steps` steps from now. 0 when accepted,
/// else 1 with the reason in `message`.
///
/// # Safety
/// `message` is null or points to `message_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_profile_request(
    steps: u32,
    message: *mut c_char,
    message_len: usize,
) -> c_int {
    let result = catch_unwind(|| agent::embed::request(steps))
        .unwrap_or_else(|_| Err("internal error (see the log)".to_string()));
    match result {
        Ok(()) => 0,
        Err(why) => {
            // SAFETY: per the contract.
            unsafe { write_out(&why, message, message_len) };
            1
        }
    }
}

/// The traces the running `kinetrace.profile` wrote so far (else the last one stopped), one path a
/// line, into `buf`; returns the text's full length.
///
/// # Safety
/// `buf` is null or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_profile_outputs(buf: *mut c_char, len: usize) -> usize {
    let text = catch_unwind(|| {
        agent::embed::outputs()
            .iter()
            .map(|p| p.to_string_lossy().into_owned() + "\n")
            .collect::<String>()
    })
    .unwrap_or_default();
    // SAFETY: per the contract.
    unsafe { write_out(&text, buf, len) }
}

/// Stops the running `kinetrace.profile`: a capture in progress is saved and every trace is
/// written when this returns (`kinetrace_profile_outputs` lists them). 0 when stopped, else 1 with
/// the reason in `message`.
///
/// # Safety
/// `message` is null or points to `message_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_profile_stop(message: *mut c_char, message_len: usize) -> c_int {
    let result = catch_unwind(agent::embed::stop)
        .unwrap_or_else(|_| Err("internal error while stopping (see the log)".to_string()));
    match result {
        Ok(_) => 0,
        Err(why) => {
            // SAFETY: per the contract.
            unsafe { write_out(&why, message, message_len) };
            1
        }
    }
}

/// 1 if `name` (such as `KINETRACE_RECORD_SHAPES`) is a configuration key this runtime knows,
/// else 0.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kinetrace_config_key_known(name: *const c_char) -> c_int {
    // SAFETY: per the contract.
    let name = unsafe { arg(name) };
    catch_unwind(|| name.is_some_and(agent::embed::key_known)).unwrap_or(false) as c_int
}
