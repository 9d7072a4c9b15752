//! A second local user for the tests of what another user on the node can (not) do to a job.
//!
//! Run as root, [`other_user`] creates (once per machine) a system user `kinetrace-other` with
//! `useradd` and returns it; commands built with [`OtherUser::command`] run as that uid. Not root,
//! or when `useradd` fails: under `CI=true` the test fails (a missing prerequisite never passes
//! silently in CI), elsewhere it is skipped with one line on stderr.
//!
//! Pitfall: the checkout may sit in a 0700 temporary directory (as in CI), so the other user can
//! read nothing under it, the built binaries included. Copy what they run with
//! [`OtherUser::stage`], and give them directories made with [`OtherUser::world_dir`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The name of the user the tests create.
pub const NAME: &str = "kinetrace-other";

/// A local user other than the one running the tests.
#[derive(Clone, Debug)]
pub struct OtherUser {
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
}

/// The effective uid of this process, from `/proc/self/status` (no `unsafe` in this crate).
pub fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|e| e.parse().ok())
        .expect("an effective uid in /proc/self/status")
}

/// Whether a missing prerequisite must fail the run (`CI=true`).
pub fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn lookup(name: &str) -> Option<OtherUser> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || f[0] != name {
            return None;
        }
        Some(OtherUser {
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
        })
    })
}

/// The second user, created if needed; `None` (after one line on stderr) where a test may skip.
///
/// # Panics
/// Under `CI=true`, when there is no such user and it cannot be created.
pub fn other_user(test: &str) -> Option<OtherUser> {
    let why = match obtain() {
        Ok(u) => return Some(u),
        Err(why) => why,
    };
    if strict() {
        panic!("{test}: needs a second local user and cannot have one: {why} (CI=true: failing, not skipping)");
    }
    eprintln!("{test}: SKIPPED: needs a second local user: {why}");
    None
}

fn obtain() -> Result<OtherUser, String> {
    if let Some(u) = lookup(NAME) {
        return Ok(u);
    }
    if euid() != 0 {
        return Err(format!(
            "not root (euid {}), so `{NAME}` cannot be created",
            euid()
        ));
    }
    let out = Command::new("useradd")
        .args(["--system", "--user-group", "--no-create-home"])
        .args([
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            NAME,
        ])
        .output()
        .map_err(|e| format!("cannot run useradd: {e}"))?;
    // Another test may have created it in the meantime (exit 9: the name exists).
    lookup(NAME).ok_or_else(|| {
        format!(
            "useradd {NAME} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// A user id with no line in `/etc/passwd` (what `docker run --user N` gives a job): for tests of
/// a job running as such a uid. Found, not created: the first free id from 54321 up. Needs root
/// to run anything as it: `None` (after one line on stderr) where a test may skip.
///
/// # Panics
/// Under `CI=true`, when not root.
pub fn unlisted_uid(test: &str) -> Option<u32> {
    if euid() != 0 {
        let why = format!(
            "not root (euid {}), so nothing can run as another uid",
            euid()
        );
        if strict() {
            panic!("{test}: needs to run as a uid without a passwd entry: {why} (CI=true: failing, not skipping)");
        }
        eprintln!("{test}: SKIPPED: needs to run as a uid without a passwd entry: {why}");
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let listed: Vec<u32> = passwd
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    (54321..).find(|uid| !listed.contains(uid))
}

impl OtherUser {
    /// `program` to be run as this user (std drops the supplementary groups when root sets a uid).
    /// `HOME` points nowhere it could write; the rest of the environment is inherited.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(program);
        c.uid(self.uid).gid(self.gid).env("HOME", "/nonexistent");
        c
    }

    /// A fresh directory under `/tmp` (not under the checkout), mode 0777 and not sticky: the
    /// shared, group- or world-writable output directory an attacker can plant files in.
    pub fn world_dir(&self) -> ScratchDir {
        ScratchDir::new("kinetrace-world-", 0o777)
    }

    /// Copies the executable (or library) at `path` into a fresh 0755 directory under `/tmp`
    /// this user can read, and returns the copy's path.
    pub fn stage(&self, path: &Path) -> (ScratchDir, PathBuf) {
        let dir = ScratchDir::new("kinetrace-stage-", 0o755);
        let to = dir.path().join(path.file_name().expect("a file name"));
        std::fs::copy(path, &to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", path.display(), to.display()));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        (dir, to)
    }
}

/// A directory under `/tmp` with a chosen mode, removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `/tmp/{prefix}{pid}-{n}` with `mode` (not masked by the umask).
    pub fn new(prefix: &str, mode: u32) -> ScratchDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        loop {
            // Relaxed: only uniqueness within this process matters; create_dir settles races.
            let n = N.fetch_add(1, Ordering::Relaxed);
            let p = PathBuf::from(format!("/tmp/{prefix}{}-{n}", std::process::id()));
            match std::fs::create_dir(&p) {
                Ok(()) => {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                        .expect("chmod");
                    return ScratchDir(p);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("create {}: {e}", p.display()),
            }
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_other_user_is_not_us_and_runs_commands_as_itself() {
        let Some(u) = other_user("users::tests") else {
            return;
        };
        assert_ne!(u.uid, euid());
        let out = u.command("id").arg("-u").output().expect("run id -u");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            u.uid.to_string()
        );
        let (_dir, copy) = u.stage(Path::new("/bin/true"));
        assert!(u
            .command(&copy)
            .status()
            .expect("run the staged copy")
            .success());
    }
}
