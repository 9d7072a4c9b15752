//! Temporary files and publishing them under their final names.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::dir::{at, Dir};

/// How many random names are tried before giving up on `EEXIST` (each has 64 random bits: only
/// names planted by someone who can read this process's mind collide).
const NAME_TRIES: usize = 16;

/// How many published files [`Replace::PublishedHere`] remembers (the oldest are forgotten).
const REMEMBERED: usize = 4096;

/// What publishing does when the final name exists already. Whatever the choice, a name is never
/// written through: it is replaced by a rename or left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// Never replace: publishing fails with `AlreadyExists`.
    Never,
    /// Replace only a regular file (not a symlink, not a directory) owned by this process's
    /// effective uid: outputs a user names on the command line (`kinetrace convert a.json
    /// out.pftrace`, run twice).
    OwnFile,
    /// Replace only a regular file this process published itself (same device and inode): names
    /// that someone else asked for (a dynolog request), where a file the process did not create
    /// is never replaced.
    PublishedHere,
}

/// A temporary file made by [`Dir::create_temp`]: removed when dropped unless published (and only
/// by the process that made it: a forked child's copy leaves it alone).
#[derive(Debug)]
pub struct Temp {
    dir: Arc<Dir>,
    name: String,
    /// A descriptor of the file for its mode and identity (the caller writes through its own).
    file: OwnedFd,
    owner: u32,
    live: bool,
}

impl Dir {
    /// Creates a new temporary file in this directory, named by `name` from a random part (16 hex
    /// digits; a new one on `EEXIST`): `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`, mode 0600, so nothing
    /// that was there (a symlink, a file) is opened, and no one else can read it until it is
    /// published. Returns the file to write and the handle that publishes or removes it.
    pub fn create_temp(
        self: &Arc<Self>,
        mut name: impl FnMut(&str) -> String,
    ) -> io::Result<(File, Temp)> {
        let mut last = None;
        for _ in 0..NAME_TRIES {
            let n = name(&random_hex()?);
            check_name(&n)?;
            match rustix::fs::openat(
                self.fd(),
                n.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => {
                    let mine = rustix::io::fcntl_dupfd_cloexec(&fd, 0)
                        .map_err(|e| at(e, &self.path().join(&n), "create"))?;
                    let temp = Temp {
                        dir: self.clone(),
                        name: n,
                        file: mine,
                        owner: std::process::id(),
                        live: true,
                    };
                    return Ok((File::from(fd), temp));
                }
                Err(Errno::EXIST) => last = Some(n),
                Err(e) => return Err(at(e, &self.path().join(&n), "create")),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "cannot create a temporary file in {}: {NAME_TRIES} random names were taken \
                 (the last {}); someone is planting files there",
                self.path().display(),
                last.unwrap_or_default()
            ),
        ))
    }

    /// Removes `name` from this directory (not following it, and not a directory).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        rustix::fs::unlinkat(self.fd(), name, AtFlags::empty())
            .map_err(|e| at(e, &self.path().join(name), "remove"))
    }

    /// Whether `name` exists in this directory (as anything, a symlink included).
    pub fn contains(&self, name: &str) -> bool {
        rustix::fs::statat(self.fd(), name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }
}

impl Temp {
    /// Its name in its directory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its path (the directory's path joined with the name: for messages).
    pub fn path(&self) -> PathBuf {
        self.dir.path().join(&self.name)
    }

    /// The directory it is in.
    pub fn dir(&self) -> &Arc<Dir> {
        &self.dir
    }

    /// Renames the file to `name` in its directory, with the mode a new file gets (0666 less the
    /// umask), by `renameat2(RENAME_NOREPLACE)`: an existing `name` is left alone unless `replace`
    /// allows replacing it (then by a plain rename, which replaces the name and never writes
    /// through it). On failure the file stays, still 0600, and can be published under another
    /// name or dropped. Returns the published path.
    pub fn publish(&mut self, name: &str, replace: Replace) -> io::Result<PathBuf> {
        check_name(name)?;
        let path = self.dir.path().join(name);
        if !self.live {
            return Err(io::Error::other(format!(
                "{} is already published or removed",
                self.path().display()
            )));
        }
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(0o666 & !umask()))
            .map_err(|e| at(e, &path, "publish"))?;
        let result = match rename_no_replace(&self.dir, &self.name, name) {
            Err(Errno::EXIST) => self.replace(name, replace),
            other => other.map_err(|e| at(e, &path, "rename into")),
        };
        if let Err(e) = result {
            let _ = rustix::fs::fchmod(&self.file, Mode::from_raw_mode(0o600));
            return Err(e);
        }
        self.live = false;
        // After the rename, which sets the change time: what a later check compares.
        if let Ok(st) = rustix::fs::fstat(&self.file) {
            remember(identity(&st));
        }
        Ok(path)
    }

    /// Replaces the existing `name` if `replace` allows it.
    fn replace(&self, name: &str, replace: Replace) -> io::Result<()> {
        let path = self.dir.path().join(name);
        let exists = |why: &str| {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists ({why}): not replaced", path.display()),
            )
        };
        if replace == Replace::Never {
            return Err(exists("kinetrace replaces no file here"));
        }
        let st = rustix::fs::statat(self.dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| at(e, &path, "check"))?;
        let kind = FileType::from_raw_mode(st.st_mode as _);
        if kind != FileType::RegularFile {
            return Err(exists(&format!("a {}, not a regular file", describe(kind))));
        }
        match replace {
            Replace::OwnFile if st.st_uid != crate::euid() => {
                return Err(exists(&format!(
                    "it belongs to uid {}, not to this process's uid {}",
                    st.st_uid,
                    crate::euid()
                )))
            }
            Replace::PublishedHere if !published(identity(&st)) => {
                return Err(exists("this process did not create it"))
            }
            _ => {}
        }
        // The name may have been swapped since the check (in a directory others can write): a
        // rename replaces whatever is there and never writes through it, so the worst case is
        // that the swapped-in entry is the one replaced.
        rustix::fs::renameat(self.dir.fd(), self.name.as_str(), self.dir.fd(), name)
            .map_err(|e| at(e, &path, "rename into"))
    }

    /// Removes the file now (as dropping does).
    pub fn discard(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        if self.live && std::process::id() == self.owner {
            self.live = false;
            let _ = self.dir.remove(&self.name);
        }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `renameat2(RENAME_NOREPLACE)`. A filesystem without it (`EINVAL`; `ENOSYS` on kernels before
/// 3.15) must not lose the file: `linkat` then gives the same guarantee (it fails with `EEXIST`
/// when the name exists and never follows it), and the temporary name is unlinked after.
pub(crate) fn rename_no_replace(dir: &Dir, from: &str, to: &str) -> Result<(), Errno> {
    match rustix::fs::renameat_with(dir.fd(), from, dir.fd(), to, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL | Errno::NOSYS) => link_no_replace(dir, from, to),
        other => other,
    }
}

/// The fallback of [`rename_no_replace`]: a hard link under the final name, then the temporary
/// name removed (if that fails, the hidden temporary name stays beside the published file). A
/// filesystem without hard links either (`EPERM`, `EOPNOTSUPP`: FAT, some FUSE) gets a plain rename
/// when the name is free: a name planted between the check and the rename would be replaced, never
/// written through, and the trace is not lost.
pub(crate) fn link_no_replace(dir: &Dir, from: &str, to: &str) -> Result<(), Errno> {
    match rustix::fs::linkat(dir.fd(), from, dir.fd(), to, AtFlags::empty()) {
        Ok(()) => {
            let _ = rustix::fs::unlinkat(dir.fd(), from, AtFlags::empty());
            Ok(())
        }
        Err(Errno::PERM | Errno::OPNOTSUPP | Errno::MLINK) => {
            match rustix::fs::statat(dir.fd(), to, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(_) => Err(Errno::EXIST),
                Err(Errno::NOENT) => rustix::fs::renameat(dir.fd(), from, dir.fd(), to),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Opens the file `path` for appending (a log), creating it (mode 0666 less the umask) if missing,
/// with `O_NONBLOCK` (a FIFO nobody reads fails at once instead of blocking). Its directory is
/// opened as [`Dir::open`] does. The file itself is opened with `O_NOFOLLOW`; a symlink there is
/// followed only when root or this process's effective uid owns it (`/dev/stderr`), and only if it
/// is still the same link after the open; another user's link is refused.
pub fn open_append(path: &Path) -> io::Result<File> {
    let me = crate::euid();
    open_append_trusting(path, &|uid| uid == 0 || uid == me)
}

fn open_append_trusting(path: &Path, trusted: &dyn Fn(u32) -> bool) -> io::Result<File> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = crate::dir::open_trusting(parent, trusted)?;
    let flags =
        OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::openat(
        dir.fd(),
        name,
        flags | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o666),
    ) {
        Ok(fd) => Ok(File::from(fd)),
        Err(Errno::LOOP) => {
            let link = rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| at(e, path, "open"))?;
            if !trusted(link.st_uid) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "cannot open {}: it is a symlink owned by uid {}; kinetrace follows only \
                         symlinks of root or of its own uid {}",
                        path.display(),
                        link.st_uid,
                        crate::euid()
                    ),
                ));
            }
            // Followed by the kernel (a magic link such as /proc/self/fd/2 has no text to walk),
            // then checked to be the link that was judged.
            let fd = rustix::fs::openat(dir.fd(), name, flags, Mode::from_raw_mode(0o666))
                .map_err(|e| at(e, path, "open"))?;
            let again = rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| at(e, path, "open"))?;
            if (again.st_dev, again.st_ino) != (link.st_dev, link.st_ino) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "cannot open {}: it changed while it was opened",
                        path.display()
                    ),
                ));
            }
            Ok(File::from(fd))
        }
        Err(e) => Err(at(e, path, "open")),
    }
}

/// Writes `bytes` to `name` in `dir` through a temporary file (`.{name}.{random}.tmp`) published
/// with `replace`: the name holds either what was there or the whole new content.
pub fn write_new(
    dir: &Arc<Dir>,
    name: &str,
    bytes: &[u8],
    replace: Replace,
) -> io::Result<PathBuf> {
    check_name(name)?;
    let (mut file, mut temp) = dir.create_temp(|r| format!(".{name}.{r}.tmp"))?;
    file.write_all(bytes)
        .and_then(|()| file.flush())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot write {}: {e}", temp.path().display()),
            )
        })?;
    drop(file);
    temp.publish(name, replace)
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::Symlink => "symlink",
        FileType::Directory => "directory",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        _ => "special file",
    }
}

/// A file name, not a path: no `/`, not `.` or `..`, not empty.
fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{name}` is not a file name"),
        ));
    }
    Ok(())
}

/// 64 random bits as 16 hex digits, from the kernel.
fn random_hex() -> io::Result<String> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        match rustix::rand::getrandom(&mut b[got..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
    }
    Ok(format!("{:016x}", u64::from_ne_bytes(b)))
}

/// The process's umask, read from `/proc/self/status` (setting it to read it would race with
/// other threads creating files); 022 where it cannot be read.
fn umask() -> u32 {
    static MASK: OnceLock<u32> = OnceLock::new();
    *MASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o022)
    })
}

/// A file's identity: device and inode, and the change time, since an inode number is reused
/// once its file is removed (a file changed since it was published no longer matches: it is then
/// not replaced, the cautious side).
type Identity = (u64, u64, i64, i64);

// The field types differ across architectures (st_ctime_nsec is unsigned on x86-64).
#[allow(clippy::unnecessary_cast)]
fn identity(st: &rustix::fs::Stat) -> Identity {
    (
        st.st_dev as u64,
        st.st_ino as u64,
        st.st_ctime as i64,
        st.st_ctime_nsec as i64,
    )
}

/// The files this process published, for [`Replace::PublishedHere`].
static PUBLISHED: Mutex<VecDeque<Identity>> = Mutex::new(VecDeque::new());

fn remember(id: Identity) {
    let mut p = PUBLISHED.lock().unwrap_or_else(|e| e.into_inner());
    if p.len() >= REMEMBERED {
        p.pop_front();
    }
    p.push_back(id);
}

fn published(id: Identity) -> bool {
    let p = PUBLISHED.lock().unwrap_or_else(|e| e.into_inner());
    p.contains(&id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
    use std::path::Path;

    fn dir() -> (tempfile::TempDir, Arc<Dir>) {
        let tmp = tempfile::tempdir().unwrap();
        let d = Dir::create_all(tmp.path()).unwrap();
        (tmp, d)
    }

    fn names(p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_temp_file_is_0600_until_published_then_gets_the_usual_mode() {
        let (tmp, d) = dir();
        let (mut f, mut t) = d.create_temp(|r| format!(".t.{r}.tmp")).unwrap();
        f.write_all(b"{}").unwrap();
        let m = std::fs::symlink_metadata(t.path()).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        // 16 random hex digits in the name.
        let r = t
            .name()
            .strip_prefix(".t.")
            .unwrap()
            .strip_suffix(".tmp")
            .unwrap();
        assert!(
            r.len() == 16 && r.chars().all(|c| c.is_ascii_hexdigit()),
            "{r}"
        );
        let p = t.publish("t.json", Replace::Never).unwrap();
        assert_eq!(p, tmp.path().join("t.json"));
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o666 & !umask());
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        drop(t);
        assert_eq!(names(tmp.path()), ["t.json"]);
    }

    #[test]
    fn a_symlink_planted_at_the_temp_name_is_skipped_not_followed() {
        let (tmp, d) = dir();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The first random name is planted (as if guessed): a new one is drawn.
        let mut tries = 0;
        let (mut f, t) = d
            .create_temp(|r| {
                tries += 1;
                let n = format!(".t.{r}.tmp");
                if tries == 1 {
                    symlink(&victim, tmp.path().join(&n)).unwrap();
                }
                n
            })
            .unwrap();
        assert_eq!(tries, 2);
        f.write_all(b"trace").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o777, 0o600);
        drop(t);
        // Only the planted link stays: the temp file is gone with its handle.
        assert_eq!(names(tmp.path()).len(), 2);
        // Every name taken: an error that says so, nothing written anywhere.
        let e = d
            .create_temp(|_| {
                let _ = symlink(&victim, tmp.path().join(".always"));
                ".always".into()
            })
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("random names were taken"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
    }

    #[test]
    fn publishing_never_replaces_a_planted_name() {
        let (tmp, d) = dir();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        symlink(&victim, tmp.path().join("trace.json")).unwrap();
        std::fs::write(tmp.path().join("other.json"), "someone's").unwrap();
        for replace in [Replace::Never, Replace::OwnFile, Replace::PublishedHere] {
            let (mut f, mut t) = d.create_temp(|r| format!(".t.{r}")).unwrap();
            f.write_all(b"trace").unwrap();
            let e = t.publish("trace.json", replace).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{replace:?}");
            if replace != Replace::Never {
                assert!(e.to_string().contains("a symlink"), "{e}");
            }
            // Still 0600 and still there: it can go elsewhere.
            assert_eq!(std::fs::metadata(t.path()).unwrap().mode() & 0o777, 0o600);
            if replace == Replace::PublishedHere {
                // A regular file this process did not publish is not replaced either.
                let e = t.publish("other.json", replace).unwrap_err();
                assert!(e.to_string().contains("did not create it"), "{e}");
            }
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("other.json")).unwrap(),
            "someone's"
        );
        assert!(std::fs::symlink_metadata(tmp.path().join("trace.json"))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn own_files_and_own_publications_are_replaced_when_asked() {
        let (tmp, d) = dir();
        std::fs::write(tmp.path().join("out.pftrace"), "old").unwrap();
        write_new(&d, "out.pftrace", b"new", Replace::OwnFile).unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("out.pftrace")).unwrap(),
            b"new"
        );
        write_new(&d, "x.json", b"1", Replace::PublishedHere).unwrap();
        write_new(&d, "x.json", b"2", Replace::PublishedHere).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("x.json")).unwrap(), b"2");
        let e = write_new(&d, "x.json", b"3", Replace::Never).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(names(tmp.path()), ["out.pftrace", "x.json"]);
        assert!(write_new(&d, "../x", b"", Replace::Never).is_err());
    }

    #[test]
    fn without_renameat2_a_link_publishes_without_replacing() {
        let (tmp, d) = dir();
        let (_f, mut t) = d.create_temp(|r| format!(".t.{r}")).unwrap();
        symlink("/nonexistent", tmp.path().join("planted")).unwrap();
        assert_eq!(link_no_replace(&d, t.name(), "planted"), Err(Errno::EXIST));
        link_no_replace(&d, t.name(), "fresh").unwrap();
        // The temporary name is gone; the handle no longer has anything to remove.
        t.live = false;
        assert_eq!(names(tmp.path()), ["fresh", "planted"]);
    }

    #[test]
    fn a_log_is_appended_to_without_following_another_users_link() {
        let (tmp, _d) = dir();
        let log = tmp.path().join("kinetrace.log");
        for line in ["a\n", "b\n"] {
            open_append(&log)
                .unwrap()
                .write_all(line.as_bytes())
                .unwrap();
        }
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "a\nb\n");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        let link = tmp.path().join("planted.log");
        symlink(&victim, &link).unwrap();
        // As if another user had planted it: not followed, nothing appended.
        let e = open_append_trusting(&link, &|_| false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("is a symlink owned by uid"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        // One's own link (`/dev/stderr` is root's) is followed.
        open_append(&link).unwrap().write_all(b"!").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret!");
        assert!(open_append(Path::new("/dev/null")).is_ok());
    }

    #[test]
    fn a_forked_copy_leaves_the_file_alone() {
        let (tmp, d) = dir();
        let (_f, mut t) = d.create_temp(|r| format!(".t.{r}")).unwrap();
        t.owner = std::process::id().wrapping_add(1);
        let p = t.path();
        drop(t);
        assert!(p.exists());
        assert_eq!(names(tmp.path()).len(), 1);
    }
}
