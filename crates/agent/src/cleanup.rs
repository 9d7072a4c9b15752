//! What processes of this user on this host left when they were killed or left with `_exit`
//! (unfinished trace files under the trace root, control sockets nobody listens on) is removed by
//! the next process that starts profiling, on a helper thread, with one line saying what went.
//! Exit waits for that thread (within what is left of its budget, at most
//! [`CLEANUP_EXIT_WAIT`]), so a process that ends right after it started still finishes the job;
//! one that cannot says so, and the next process tries again.
//!
//! Whether a process is gone is asked in this process's own pid namespace (`kill(pid, 0)`), never
//! through `/proc/<pid>`: a pid namespace made without its own `/proc` (`unshare --pid --fork`)
//! sees its parent's, where the same number names another process or none.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::list_sockets;
use crate::process::Running;

/// How long exit waits, at most, for the removal to be over.
pub(crate) const CLEANUP_EXIT_WAIT: Duration = Duration::from_secs(1);

/// Whether no process `pid` exists in this process's pid namespace: `kill(pid, 0)` fails with
/// `ESRCH` (`EPERM` means one exists, of another user). Pids in the names of unfinished files are
/// of the writer's namespace, which the names also carry; files of other namespaces are never
/// judged here.
pub fn process_is_gone(pid: u32) -> bool {
    use rustix::process::{test_kill_process, Pid};
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    matches!(test_kill_process(pid), Err(rustix::io::Errno::SRCH))
}

/// The helper thread's end, which exit waits for.
#[derive(Default)]
pub(crate) struct Cleanup {
    over: Mutex<bool>,
    ended: Condvar,
}

impl Cleanup {
    /// Waits until the removal is over or `deadline` passes; whether it is over.
    pub(crate) fn wait_until(&self, deadline: Instant) -> bool {
        let mut over = self.over.lock().unwrap_or_else(|e| e.into_inner());
        while !*over {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            over = match self.ended.wait_timeout(over, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

/// Marks the removal over when dropped (a panic on the thread included).
struct Finish(Arc<Cleanup>);

impl Drop for Finish {
    fn drop(&mut self) {
        *self.0.over.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.ended.notify_all();
    }
}

/// Starts the helper thread; what exit waits on (`None`: no thread).
pub(crate) fn start_cleanup(r: &'static Running) -> Option<Arc<Cleanup>> {
    if std::fs::read_link("/proc/self/ns/pid").is_err() {
        // Unfinished files' names cannot say which pid namespace wrote them: whose pid is whose
        // cannot be told.
        return None;
    }
    let uid = rustix::process::geteuid().as_raw();
    let control_dir = r.config.control.then(|| r.config.control_dir_or_default());
    let cleanup = Arc::new(Cleanup::default());
    let finish = Finish(cleanup.clone());
    let spawned = std::thread::Builder::new()
        .name("kinetrace-clean".into())
        .spawn(move || {
            let _finish = finish;
            // Test hook (outside the KINETRACE_ key space on purpose): a removal slower than the
            // process, as on a slow shared file system, without depending on this machine's speed.
            if let Some(ms) = std::env::var("_KINETRACE_TEST_CLEANUP_DELAY_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                std::thread::sleep(Duration::from_millis(ms));
            }
            let gone = |pid: u32| process_is_gone(pid);
            let mut removed = kinetrace::export::writer::remove_abandoned(&r.root, uid, &gone);
            if let Some(dir) = control_dir {
                removed.extend(remove_dead_sockets(&dir, uid, &gone));
            }
            if !removed.is_empty() {
                const SHOWN: usize = 3;
                let mut shown: Vec<String> = removed
                    .iter()
                    .take(SHOWN)
                    .map(|p| p.display().to_string())
                    .collect();
                if removed.len() > SHOWN {
                    shown.push("...".into());
                }
                (r.log)(&format!(
                    "removed {} file(s) that killed processes (or ones that left with _exit) \
                     left behind: {}",
                    removed.len(),
                    shown.join(", ")
                ));
            }
        });
    spawned.is_ok().then_some(cleanup)
}

/// The control sockets in `dir` whose process is gone and on which nobody listens (a socket is
/// reachable only on its own host, so a refused connection and a missing pid say the same thing
/// twice), removed.
fn remove_dead_sockets(dir: &Path, uid: u32, gone: &dyn Fn(u32) -> bool) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
        return Vec::new();
    }
    list_sockets(dir)
        .into_iter()
        .filter(|(pid, path)| {
            *pid != std::process::id()
                && gone(*pid)
                && std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == uid)
                && matches!(
                    std::os::unix::net::UnixStream::connect(path),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
                )
                && std::fs::remove_file(path).is_ok()
        })
        .map(|(_, path)| path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_is_gone_only_when_kill_finds_no_such_process() {
        assert!(!process_is_gone(std::process::id()));
        // A child we ran and reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_is_gone(pid));
        // Never a process group or every process (`kill(0 | -1, 0)`): not judged.
        assert!(!process_is_gone(0));
        assert!(!process_is_gone(u32::MAX));
    }

    #[test]
    fn exit_waits_for_the_removal_only_until_its_deadline() {
        let c = Arc::new(Cleanup::default());
        assert!(!c.wait_until(Instant::now() + Duration::from_millis(10)));
        let finish = Finish(c.clone());
        let t = std::thread::spawn(move || drop(finish));
        assert!(c.wait_until(Instant::now() + Duration::from_secs(60)));
        t.join().unwrap();
    }
}
