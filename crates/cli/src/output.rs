//! Files the command line writes where the user said (`analyze --csv DIR --plot FILE`, `diff --csv
//! DIR`), through `kinetrace-files`: the directory is opened once without following another user's
//! symlink, each file is written to a new 0600 temporary file there and renamed into place. A file
//! of that name is replaced only when it is a regular file of this user (running a command twice);
//! a symlink or another user's file is left alone and the command fails naming it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use kinetrace_files::{Dir, Replace};

/// Opens the directory `dir` for output files, creating it where missing.
pub fn dir(dir: &Path, what: &str) -> Result<Arc<Dir>> {
    Dir::create_all(dir)
        .with_context(|| format!("cannot use the {what} directory {}", dir.display()))
}

/// Writes `bytes` to `name` in `dir`.
pub fn write_in(dir: &Arc<Dir>, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    kinetrace_files::write_new(dir, name, bytes, Replace::OwnFile)
        .with_context(|| format!("cannot write {}", dir.path().join(name).display()))
}

/// Writes `bytes` to the file `path` (whose directory must exist).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} names no file (or not in UTF-8)", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let d = Dir::open(parent).with_context(|| format!("cannot write {}", path.display()))?;
    write_in(&d, name, bytes)
}
