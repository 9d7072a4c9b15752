//! What processes of this user on this host left when they were killed or left with `_exit`
//! (unfinished trace files under the trace root, control sockets nobody listens on) is removed by
//! the next process that starts profiling, on a helper thread, with one line saying what went.

use std::path::{Path, PathBuf};

use crate::control::{effective_uid, list_sockets};
use crate::process::Running;

/// Starts the helper thread (nothing if the process table cannot be read).
pub(crate) fn start_cleanup(r: &'static Running) {
    let Some(uid) = effective_uid() else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        // Which processes are gone cannot be told.
        return;
    }
    let control_dir = r.config.control.then(|| r.config.control_dir_or_default());
    let spawned = std::thread::Builder::new()
        .name("kinetrace-clean".into())
        .spawn(move || {
            let gone = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();
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
    drop(spawned);
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
