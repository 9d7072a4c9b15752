//! Path confinement: output directories named in control requests must lie under the process's
//! trace root. The check is lexical first ([`confine`]: relative paths are taken under the root,
//! absolute ones must lie inside it, `..` is refused outright), then on the directories themselves
//! when the request arrives ([`open_inside`]): what exists is opened then, one component at a time
//! without following any symlink, and must belong to this user (or root) and be writable by no one
//! else unless sticky. The capture writes below the directories opened then, so a directory
//! swapped for a symlink between the request and the capture changes nothing.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use kinetrace_files::{Dir, Place};

/// Why an output directory is refused.
#[derive(Debug)]
pub enum ConfineError {
    /// The request names a path with `..`.
    ParentDir {
        /// As requested.
        requested: PathBuf,
        /// The trace root.
        root: PathBuf,
    },
    /// An absolute path outside the root.
    Outside {
        /// As requested.
        requested: PathBuf,
        /// The trace root.
        root: PathBuf,
    },
    /// The directory (or the root) cannot be used: a symlink on the way, another user's
    /// directory, one that others may write to, or an error opening it.
    Unsafe {
        /// The directory.
        dir: PathBuf,
        /// Why (naming the component).
        error: std::io::Error,
    },
}

impl fmt::Display for ConfineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfineError::ParentDir { requested, root } => write!(
                f,
                "{} contains `..`; output must stay under the trace root {}",
                requested.display(),
                root.display()
            ),
            ConfineError::Outside { requested, root } => write!(
                f,
                "{} is outside the trace root {}",
                requested.display(),
                root.display()
            ),
            ConfineError::Unsafe { dir, error } => {
                write!(f, "cannot write under {}: {error}", dir.display())
            }
        }
    }
}

impl std::error::Error for ConfineError {}

/// Resolves an output directory named in a request against the trace root: relative paths are
/// taken under the root, absolute ones must lie inside it, and `..` is refused outright. The
/// result is lexical; [`open_inside`] opens it.
pub fn confine(root: &Path, requested: Option<&Path>) -> Result<PathBuf, ConfineError> {
    let root = absolute(root);
    let Some(req) = requested else {
        return Ok(root);
    };
    if req.components().any(|c| c == Component::ParentDir) {
        return Err(ConfineError::ParentDir {
            requested: req.to_path_buf(),
            root,
        });
    }
    let full = if req.is_absolute() {
        req.to_path_buf()
    } else {
        root.join(req)
    };
    if !full.starts_with(&root) {
        return Err(ConfineError::Outside {
            requested: req.to_path_buf(),
            root,
        });
    }
    Ok(full)
}

/// Opens what exists of `dir` (a result of [`confine`] for `root`) now: the root as the user named
/// it (a symlink of another user on the way refused), then each component below it with
/// `O_NOFOLLOW` (no symlink at all), each a directory of this user or root that no one else may
/// write to unless sticky. What is missing is made below what was opened, when the capture starts.
/// Nothing is created here, so a refused request leaves nothing behind.
pub fn open_inside(root: &Path, dir: &Path) -> Result<Place, ConfineError> {
    let root = absolute(root);
    let rel = dir.strip_prefix(&root).map_err(|_| ConfineError::Outside {
        requested: dir.to_path_buf(),
        root: root.clone(),
    })?;
    let unsafe_dir = |error| ConfineError::Unsafe {
        dir: dir.to_path_buf(),
        error,
    };
    Dir::locate(&root)
        .and_then(|p| p.join(rel))
        .map_err(unsafe_dir)
}

/// `p` made absolute against the current directory (lexically).
pub fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_paths_may_not_escape_the_trace_root() {
        let root = Path::new("/data/traces");
        assert_eq!(confine(root, None).unwrap(), root);
        assert_eq!(
            confine(root, Some(Path::new("run2"))).unwrap(),
            root.join("run2")
        );
        assert_eq!(
            confine(root, Some(Path::new("/data/traces/a/b"))).unwrap(),
            root.join("a/b")
        );
        for bad in [
            "../etc",
            "a/../../x",
            "/etc",
            "/data/traces2",
            "/data/traces/../x",
        ] {
            let e = confine(root, Some(Path::new(bad))).unwrap_err().to_string();
            assert!(e.contains("trace root"), "{bad}: {e}");
        }
        // A symlink inside the root is never followed, wherever it points.
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("escape")).unwrap();
        std::fs::create_dir(root.join("inside")).unwrap();
        std::os::unix::fs::symlink(root.join("inside"), root.join("alias")).unwrap();
        for link in ["escape", "alias/x"] {
            let dir = confine(&root, Some(Path::new(link))).unwrap();
            let e = open_inside(&root, &dir).unwrap_err().to_string();
            assert!(e.contains("is a symlink"), "{link}: {e}");
        }
        let fine = open_inside(&root, &root.join("inside/new")).unwrap();
        assert!(!fine.exists());
        assert!(
            !root.join("inside/new").exists(),
            "nothing is made before the capture"
        );
        assert!(fine.open().unwrap().path().ends_with("inside/new"));
    }
}
