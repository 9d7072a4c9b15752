//! Path confinement: output directories named in control requests must lie under the process's
//! trace root. The check is lexical first ([`confine`]: relative paths are taken under the root,
//! absolute ones must lie inside it, `..` is refused outright), then on the real paths once a
//! directory exists ([`check_inside`]), which catches a symlink inside the root pointing out of it.

use std::fmt;
use std::path::{Component, Path, PathBuf};

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
    /// The directory's real path is outside the root's real path (a symlink on the way).
    ResolvesOutside {
        /// The directory.
        dir: PathBuf,
        /// Its real path.
        resolved: PathBuf,
        /// The root's real path.
        root: PathBuf,
    },
    /// A real path cannot be found.
    Unresolvable {
        /// The path.
        dir: PathBuf,
        /// Why.
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
            ConfineError::ResolvesOutside {
                dir,
                resolved,
                root,
            } => write!(
                f,
                "{} resolves to {}, outside the trace root {}",
                dir.display(),
                resolved.display(),
                root.display()
            ),
            ConfineError::Unresolvable { dir, error } => {
                write!(f, "cannot resolve {}: {error}", dir.display())
            }
        }
    }
}

impl std::error::Error for ConfineError {}

/// Resolves an output directory named in a request against the trace root: relative paths are
/// taken under the root, absolute ones must lie inside it, and `..` is refused outright. The
/// result is lexical; call [`check_inside`] once the directory exists to catch symlinks.
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

/// Checks that the real path of `dir` (which exists) is inside the root's real path.
pub fn check_inside(root: &Path, dir: &Path) -> Result<(), ConfineError> {
    let unresolvable = |error| ConfineError::Unresolvable {
        dir: dir.to_path_buf(),
        error,
    };
    let r = root.canonicalize().map_err(unresolvable)?;
    let d = dir.canonicalize().map_err(unresolvable)?;
    if d.starts_with(&r) {
        Ok(())
    } else {
        Err(ConfineError::ResolvesOutside {
            dir: dir.to_path_buf(),
            resolved: d,
            root: r,
        })
    }
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
        // A symlink inside the root that points out of it is caught once it exists.
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("escape")).unwrap();
        let dir = confine(&root, Some(Path::new("escape"))).unwrap();
        assert!(check_inside(&root, &dir)
            .unwrap_err()
            .to_string()
            .contains("outside the trace root"));
        std::fs::create_dir(root.join("fine")).unwrap();
        check_inside(&root, &root.join("fine")).unwrap();
    }
}
