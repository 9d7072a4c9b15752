//! Directories opened once, one component at a time, without following others' symlinks.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

/// The most symlinks one walk follows (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// Mode bits of a directory that others may write into: group or world write.
const OTHERS_WRITE: u32 = 0o022;
/// The sticky bit: only an entry's owner may rename or remove it.
const STICKY: u32 = 0o1000;

/// An open directory: every file made in it is made relative to this descriptor, so a rename or a
/// symlink swapped in at its path afterwards changes nothing.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// The path it was opened by (as given, for messages and the paths of files made in it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens the directory a user named (an output directory in the configuration or on the
    /// command line), creating what is missing (mode 0777 less the umask, as `mkdir -p`). Each
    /// component is opened with `O_NOFOLLOW|O_DIRECTORY`; a symlink on the way is followed only
    /// when root or this process's effective uid owns it (the user's own setup, such as
    /// `/scratch -> /mnt/scratch`), and refused when another user does.
    pub fn create_all(path: &Path) -> io::Result<Arc<Dir>> {
        Dir::locate(path)?.open()
    }

    /// As [`create_all`](Self::create_all), for a directory that must exist already.
    pub fn open(path: &Path) -> io::Result<Arc<Dir>> {
        let me = crate::euid();
        open_trusting(path, &|uid| uid == 0 || uid == me)
    }

    /// Opens as much of a user-named directory as exists now (with the rules of
    /// [`create_all`](Self::create_all)); the rest is made by [`Place::open`]. Nothing is created.
    pub fn locate(path: &Path) -> io::Result<Place> {
        let me = crate::euid();
        locate_trusting(path, &|uid| uid == 0 || uid == me)
    }
}

/// [`Dir::open`], following the symlinks whose owner `trusted` accepts.
pub(crate) fn open_trusting(path: &Path, trusted: &dyn Fn(u32) -> bool) -> io::Result<Arc<Dir>> {
    let place = locate_trusting(path, trusted)?;
    if let Some((name, _)) = place.missing.first() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "cannot open {}: {} does not exist",
                path.display(),
                Path::new(name).display()
            ),
        ));
    }
    Ok(place.base)
}

/// [`Dir::locate`], following the symlinks whose owner `trusted` accepts.
fn locate_trusting(path: &Path, trusted: &dyn Fn(u32) -> bool) -> io::Result<Place> {
    if path.as_os_str().is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an empty path names no directory",
        ));
    }
    let mut todo = Vec::new();
    push_components(&mut todo, path);
    let start = if path.is_absolute() { "/" } else { "." };
    let mut cur = open_dir(CWD, start).map_err(|e| at(e, Path::new(start), "open"))?;
    let mut links = 0;
    while let Some(seg) = todo.pop() {
        let seg = match seg {
            Seg::Root => {
                cur = open_dir(CWD, "/").map_err(|e| at(e, Path::new("/"), "open"))?;
                continue;
            }
            Seg::Name(n) => n,
        };
        match open_dir(&cur, &seg) {
            Ok(fd) => cur = fd,
            Err(Errno::NOENT) => {
                let mut missing = vec![(seg, Check::User)];
                while let Some(s) = todo.pop() {
                    match s {
                        Seg::Name(n) if is_plain(&n) => missing.push((n, Check::User)),
                        _ => {
                            return Err(io::Error::new(
                                io::ErrorKind::NotFound,
                                format!(
                                    "cannot resolve {}: {} does not exist",
                                    path.display(),
                                    Path::new(&missing[0].0).display()
                                ),
                            ))
                        }
                    }
                }
                return Ok(Place {
                    base: Arc::new(Dir {
                        fd: cur,
                        path: path.to_path_buf(),
                    }),
                    missing,
                    path: path.to_path_buf(),
                });
            }
            Err(e @ (Errno::NOTDIR | Errno::LOOP)) => {
                let st = rustix::fs::statat(&cur, &seg, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| at(e, path, "resolve"))?;
                if FileType::from_raw_mode(st.st_mode as _) != FileType::Symlink {
                    return Err(at(e, path, "open"));
                }
                let owner = st.st_uid;
                if !trusted(owner) {
                    return Err(refused(format!(
                        "{}: {} is a symlink owned by uid {owner}; kinetrace follows only \
                             symlinks of root or of its own uid {}",
                        path.display(),
                        Path::new(&seg).display(),
                        crate::euid()
                    )));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(at(Errno::LOOP, path, "resolve"));
                }
                let target = rustix::fs::readlinkat(&cur, &seg, Vec::new())
                    .map_err(|e| at(e, path, "resolve"))?;
                // The link read must be the one whose owner was checked (in a directory others
                // can write to, it may have been swapped in between).
                let again = rustix::fs::statat(&cur, &seg, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| at(e, path, "resolve"))?;
                if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
                    return Err(refused(format!(
                        "{}: {} changed while it was read",
                        path.display(),
                        Path::new(&seg).display()
                    )));
                }
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                push_components(&mut todo, &target);
            }
            Err(e) => return Err(at(e, path, "open")),
        }
    }
    Ok(Place {
        base: Arc::new(Dir {
            fd: cur,
            path: path.to_path_buf(),
        }),
        missing: Vec::new(),
        path: path.to_path_buf(),
    })
}

/// A directory opened as far as it exists, and the components still to be made below that.
/// Made for requests that are checked when they arrive and written later: what exists is held
/// open from the check on, and what is made later is made below it.
#[derive(Clone, Debug)]
pub struct Place {
    base: Arc<Dir>,
    missing: Vec<(OsString, Check)>,
    path: PathBuf,
}

/// How a component to be made is checked once it exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Part of a path the user named: made with mode 0777 less the umask, not followed if a
    /// symlink appears there meanwhile.
    User,
    /// Below a requested place: made with mode 0755, and must be a directory of root or the
    /// effective uid that no one else may write to (unless sticky).
    Private,
}

impl Place {
    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the whole directory exists (was opened when this place was made).
    pub fn exists(&self) -> bool {
        self.missing.is_empty()
    }

    /// The place `rel` below this one, for a path a request names: `rel` is relative and has only
    /// plain names (no `..`). What exists of it is opened now, each component with
    /// `O_NOFOLLOW|O_DIRECTORY` (a symlink is refused whoever owns it), and each must be a
    /// directory owned by root or the effective uid that no one else may write to, unless sticky.
    pub fn join(&self, rel: &Path) -> io::Result<Place> {
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => names.push(n.to_os_string()),
                Component::CurDir => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: only a relative path of plain names may be asked for below {}",
                            rel.display(),
                            self.path.display()
                        ),
                    ))
                }
            }
        }
        let path = self.path.join(rel);
        let mut missing = self.missing.clone();
        if !missing.is_empty() {
            missing.extend(names.into_iter().map(|n| (n, Check::Private)));
            return Ok(Place {
                base: self.base.clone(),
                missing,
                path,
            });
        }
        let mut cur: Option<OwnedFd> = None;
        let mut names = names.into_iter();
        while let Some(n) = names.next() {
            let parent = cur.as_ref().map_or(self.base.fd(), |f| f.as_fd());
            match open_private(parent, &n, &path) {
                Ok(fd) => cur = Some(fd),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    missing.push((n, Check::Private));
                    missing.extend(names.map(|n| (n, Check::Private)));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let base = match cur {
            Some(fd) => Arc::new(Dir {
                fd,
                path: path.clone(),
            }),
            None => self.base.clone(),
        };
        Ok(Place {
            base,
            missing,
            path,
        })
    }

    /// The directory, made now where it is missing: each component is made (`mkdirat`) below the
    /// one opened before, then opened with `O_NOFOLLOW|O_DIRECTORY` and checked as it was asked
    /// for (a symlink or another user's directory put there meanwhile is refused).
    pub fn open(&self) -> io::Result<Arc<Dir>> {
        if self.missing.is_empty() {
            return Ok(self.base.clone());
        }
        let mut cur: Option<OwnedFd> = None;
        for (name, check) in &self.missing {
            let parent = cur.as_ref().map_or(self.base.fd(), |f| f.as_fd());
            let mode = match check {
                Check::User => Mode::from_raw_mode(0o777),
                Check::Private => Mode::from_raw_mode(0o755),
            };
            match rustix::fs::mkdirat(parent, name.as_os_str(), mode) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(at(e, &self.path, "create directory")),
            }
            let fd = match check {
                Check::User => match open_dir(parent, name) {
                    Ok(fd) => fd,
                    Err(e @ (Errno::NOTDIR | Errno::LOOP)) => {
                        return Err(refused(format!(
                            "cannot create directory {}: {} is not a directory ({e}); a symlink \
                             put there is not followed",
                            self.path.display(),
                            Path::new(name).display()
                        )))
                    }
                    Err(e) => return Err(at(e, &self.path, "open")),
                },
                Check::Private => open_private(parent, name, &self.path)?,
            };
            cur = Some(fd);
        }
        Ok(Arc::new(Dir {
            // Cannot be None: `missing` is not empty.
            fd: cur.ok_or_else(|| io::Error::other("no directory opened"))?,
            path: self.path.clone(),
        }))
    }
}

/// One step of a walk: back to `/` (an absolute symlink target), or a name (`..` included).
enum Seg {
    Root,
    Name(OsString),
}

/// Pushes `p`'s components onto `todo` so that they pop in order.
fn push_components(todo: &mut Vec<Seg>, p: &Path) {
    for c in p.components().rev() {
        match c {
            Component::RootDir => todo.push(Seg::Root),
            Component::Normal(n) => todo.push(Seg::Name(n.to_os_string())),
            Component::ParentDir => todo.push(Seg::Name("..".into())),
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

fn is_plain(n: &OsStr) -> bool {
    n != ".." && n != "."
}

/// `openat(dir, name, O_PATH|O_DIRECTORY|O_NOFOLLOW)`: a symlink fails (`ENOTDIR` or `ELOOP`).
/// `O_PATH`: a component only searchable (mode --x) opens as it resolves in a path.
fn open_dir<Fd: AsFd, P: rustix::path::Arg>(dir: Fd, name: P) -> Result<OwnedFd, Errno> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // With `O_PATH` some kernels hand out the symlink itself: only a directory counts.
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode as _) != FileType::Directory {
        return Err(Errno::NOTDIR);
    }
    Ok(fd)
}

/// Opens `name` below `dir` for a requested path: a real directory (never through a symlink) of
/// root or the effective uid, writable by no one else unless sticky. `NotFound` when missing.
fn open_private(dir: BorrowedFd<'_>, name: &OsStr, whole: &Path) -> io::Result<OwnedFd> {
    let shown = || Path::new(name).display().to_string();
    let fd = match open_dir(dir, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: {} does not exist", whole.display(), shown()),
            ))
        }
        Err(e @ (Errno::NOTDIR | Errno::LOOP)) => {
            let link = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode as _) == FileType::Symlink);
            return Err(refused(if link {
                format!(
                    "{}: {} is a symlink; a requested directory is never reached through one",
                    whole.display(),
                    shown()
                )
            } else {
                format!("{}: {} is not a directory ({e})", whole.display(), shown())
            }));
        }
        Err(e) => return Err(at(e, whole, "open")),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| at(e, whole, "check"))?;
    let me = crate::euid();
    if st.st_uid != 0 && st.st_uid != me {
        return Err(refused(format!(
            "{}: {} belongs to uid {}, not to root or this process's uid {me}",
            whole.display(),
            shown(),
            st.st_uid
        )));
    }
    let mode = st.st_mode as u32;
    if mode & OTHERS_WRITE != 0 && mode & STICKY == 0 {
        return Err(refused(format!(
            "{}: {} is writable by other users (mode {:04o}) and not sticky",
            whole.display(),
            shown(),
            mode & 0o7777
        )));
    }
    Ok(fd)
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// An errno as an `io::Error` naming the path and what was tried.
pub(crate) fn at(e: Errno, path: &Path, what: &str) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_user_path_is_created_and_held_open() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("a/b/c");
        let d = Dir::create_all(&p).unwrap();
        assert!(p.is_dir());
        assert_eq!(d.path(), p);
        // Renamed away afterwards: the descriptor still names the directory that was opened.
        std::fs::rename(tmp.path().join("a"), tmp.path().join("moved")).unwrap();
        std::fs::create_dir_all(&p).unwrap();
        let (_f, mut t) = d.create_temp(|r| format!(".x.{r}.tmp")).unwrap();
        t.publish("x", crate::Replace::Never).unwrap();
        assert!(tmp.path().join("moved/b/c/x").exists());
        assert!(!p.join("x").exists());
    }

    #[test]
    fn own_symlinks_on_a_user_path_are_followed() {
        // The test runs as the symlinks' owner, so they are trusted: `/scratch -> /mnt/...`.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        symlink(tmp.path().join("real"), tmp.path().join("abs")).unwrap();
        symlink("real", tmp.path().join("rel")).unwrap();
        for via in ["abs", "rel"] {
            let d = Dir::create_all(&tmp.path().join(via).join("sub")).unwrap();
            let (_f, mut t) = d.create_temp(|r| format!(".{r}")).unwrap();
            t.publish(via, crate::Replace::Never).unwrap();
            assert!(tmp.path().join("real/sub").join(via).exists(), "{via}");
        }
        // A loop ends with an error, not a hang.
        symlink("loop", tmp.path().join("loop")).unwrap();
        let e = Dir::create_all(&tmp.path().join("loop/x")).unwrap_err();
        assert!(e.to_string().contains("symbolic links"), "{e}");
        // A file on the way is not a directory.
        std::fs::write(tmp.path().join("file"), "").unwrap();
        assert!(Dir::create_all(&tmp.path().join("file/x")).is_err());
        assert!(Dir::open(&tmp.path().join("missing")).is_err());
    }

    #[test]
    fn another_users_symlink_on_a_user_path_is_refused() {
        // As if the link's owner were someone else: the walk trusts no owner here.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        let e = locate_trusting(&tmp.path().join("link/sub"), &|_| false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("is a symlink owned by uid"), "{e}");
        // The last component too: `O_NOFOLLOW` there as everywhere.
        let e = locate_trusting(&tmp.path().join("link"), &|_| false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(locate_trusting(&tmp.path().join("real"), &|_| false).is_ok());
    }

    #[test]
    fn a_requested_path_never_goes_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let victim = tmp.path().join("victim");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&victim).unwrap();
        chmod(&root, 0o755);
        symlink(&victim, root.join("link")).unwrap();
        let base = Dir::locate(&root).unwrap();
        let e = base.join(Path::new("link/x")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("is a symlink"), "{e}");
        for bad in ["../x", "/etc", "a/../b"] {
            assert_eq!(
                base.join(Path::new(bad)).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bad}"
            );
        }
        // Checked when asked for, made later: a symlink swapped in meanwhile is refused.
        let later = base.join(Path::new("sub/deeper")).unwrap();
        assert!(!later.exists());
        symlink(&victim, root.join("sub")).unwrap();
        let e = later.open().unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
        // An existing directory is held open from the check on: swapping it afterwards for a
        // symlink changes nothing.
        std::fs::create_dir(root.join("held")).unwrap();
        chmod(&root.join("held"), 0o755);
        let held = base.join(Path::new("held")).unwrap();
        std::fs::rename(root.join("held"), tmp.path().join("held-moved")).unwrap();
        symlink(&victim, root.join("held")).unwrap();
        let d = held.open().unwrap();
        let (_f, mut t) = d.create_temp(|r| format!(".{r}")).unwrap();
        t.publish("trace.json", crate::Replace::Never).unwrap();
        assert!(tmp.path().join("held-moved/trace.json").exists());
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
    }

    #[test]
    fn a_requested_directory_open_to_others_is_refused_unless_sticky() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir(root.join("shared")).unwrap();
        chmod(&root.join("shared"), 0o777);
        std::fs::create_dir(root.join("group")).unwrap();
        chmod(&root.join("group"), 0o775);
        std::fs::create_dir(root.join("sticky")).unwrap();
        chmod(&root.join("sticky"), 0o1777);
        let base = Dir::locate(root).unwrap();
        for bad in ["shared/x", "group"] {
            let e = base.join(Path::new(bad)).unwrap_err();
            assert!(
                e.to_string().contains("writable by other users"),
                "{bad}: {e}"
            );
        }
        let ok = base.join(Path::new("sticky/mine")).unwrap();
        let d = ok.open().unwrap();
        let st = rustix::fs::fstat(&d.fd).unwrap();
        // Made 0755 whatever the umask allows more of: its own check must pass.
        assert_eq!(st.st_mode as u32 & 0o022, 0);
        assert!(root.join("sticky/mine").is_dir());
    }
}
