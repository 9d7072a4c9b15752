//! Where `kinetrace record` finds the shim (`libkinetrace.so`), in this order:
//!
//! 1. `KINETRACE_PRELOAD_PATH`, when set;
//! 2. next to the executable, `../lib/` or `../lib/kinetrace/` (a build tree, a tarball, a package);
//! 3. inside the installed Python package, when this `kinetrace` came from the wheel: pip puts the
//!    command in a scheme's `bin/` and the package in the same scheme's
//!    `lib[64]/python3.*/{site,dist}-packages/kinetrace/` (venvs, `--user`, conda, Debian's
//!    `/usr/local`); a package whose `kinetrace-VERSION.dist-info` matches this binary comes first;
//! 4. the copy embedded in this binary at build time (`cargo install --path crates/cli` builds one,
//!    see build.rs), written once to `$XDG_CACHE_HOME/kinetrace/shim/` (`~/.cache/kinetrace/shim/`):
//!    a directory of this user's only, the file created whole (temporary name, then rename) and
//!    reused while its bytes are the embedded ones.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The shim built into this binary (empty when the build embedded none).
#[cfg(kinetrace_embedded_shim)]
const EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libkinetrace.so"));
#[cfg(not(kinetrace_embedded_shim))]
const EMBEDDED: &[u8] = &[];

/// The shim `record` preloads (see the module docs).
pub fn find() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KINETRACE_PRELOAD_PATH") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "KINETRACE_PRELOAD_PATH names {}, which does not exist",
            p.display()
        );
    }
    let exe = std::env::current_exe().context("cannot locate the kinetrace executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let beside = [
        dir.join("libkinetrace.so"),
        dir.join("../lib/libkinetrace.so"),
        dir.join("../lib/kinetrace/libkinetrace.so"),
    ];
    let found = beside
        .into_iter()
        .chain(in_python_packages(dir, env!("CARGO_PKG_VERSION")))
        .find(|c| c.is_file());
    if let Some(c) = found {
        return Ok(c.canonicalize().unwrap_or(c));
    }
    if !EMBEDDED.is_empty() {
        return write_embedded(&cache_dir()?, EMBEDDED);
    }
    bail!(
        "cannot find libkinetrace.so next to {} or in an installed kinetrace Python package (build it with `cargo build -p kinetrace-preload`, or set KINETRACE_PRELOAD_PATH)",
        exe.display()
    )
}

/// The wheel's shim for a command in `bin`: `bin/../lib{,64}/python3*/{site,dist}-packages/
/// kinetrace/libkinetrace.so`, those beside a `kinetrace-{version}.dist-info` first.
pub fn in_python_packages(bin: &Path, version: &str) -> Vec<PathBuf> {
    let mut found: Vec<(bool, PathBuf)> = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(bin.join("..").join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let dir = python.join(packages);
                let shim = dir.join("kinetrace/libkinetrace.so");
                if shim.is_file() && !found.iter().any(|(_, p)| *p == shim) {
                    let ours = dir.join(format!("kinetrace-{version}.dist-info")).is_dir();
                    found.push((!ours, shim));
                }
            }
        }
    }
    // Stable: the matching version first, then the order found.
    found.sort_by_key(|(other, _)| *other);
    found.into_iter().map(|(_, p)| p).collect()
}

fn cache_dir() -> Result<PathBuf> {
    let base =
        match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
            Some(v) => PathBuf::from(v),
            None => PathBuf::from(std::env::var_os("HOME").context(
                "cannot write the embedded shim: neither XDG_CACHE_HOME nor HOME is set",
            )?)
            .join(".cache"),
        };
    Ok(base.join("kinetrace").join("shim"))
}

/// Makes `dir` (and its parents) if missing, and checks it is this user's alone.
fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let meta =
        std::fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me {
        bail!(
            "{} is not a directory of this user; remove it or set XDG_CACHE_HOME",
            dir.display()
        );
    }
    if meta.mode() & 0o022 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.display()))?;
    }
    Ok(())
}

/// `bytes` as a file in `dir` named for their content (`libkinetrace-{fnv64}.so`): reused when it
/// is there, this user's, not writable by others and byte for byte the same; else written anew.
pub fn write_embedded(dir: &Path, bytes: &[u8]) -> Result<PathBuf> {
    private_dir(dir)?;
    let path = dir.join(format!("libkinetrace-{:016x}.so", fnv64(bytes)));
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        let me = rustix::process::geteuid().as_raw();
        let usable = meta.is_file()
            && meta.uid() == me
            && meta.mode() & 0o022 == 0
            && meta.len() == bytes.len() as u64
            && std::fs::read(&path).is_ok_and(|b| b == bytes);
        if usable {
            return Ok(path);
        }
    }
    let tmp = dir.join(format!(".libkinetrace-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // create_new (O_CREAT|O_EXCL) never follows a symlink planted at the name.
        .mode(0o755)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()));
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e)
            .with_context(|| format!("cannot write the embedded shim to {}", path.display()));
    }
    Ok(path)
}

/// FNV-1a, 64 bits: names the extracted file by its content.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wheels_shim_is_found_from_the_scripts_directory() {
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        assert!(in_python_packages(&bin, "0.1.0").is_empty());
        let put = |lib: &str, python: &str, packages: &str, version: Option<&str>| {
            let dir = t.path().join(lib).join(python).join(packages);
            std::fs::create_dir_all(dir.join("kinetrace")).unwrap();
            std::fs::write(dir.join("kinetrace/libkinetrace.so"), b"\x7fELF").unwrap();
            if let Some(v) = version {
                std::fs::create_dir(dir.join(format!("kinetrace-{v}.dist-info"))).unwrap();
            }
            dir.join("kinetrace/libkinetrace.so")
        };
        // A venv (or --user, conda) layout, another Python's older install beside it, and
        // Debian's dist-packages under lib64.
        let older = put("lib", "python3.10", "site-packages", Some("0.0.9"));
        let ours = put("lib", "python3.11", "site-packages", Some("0.1.0"));
        let debian = put("lib64", "python3", "dist-packages", None);
        let _not_python = put("lib", "perl5", "site-packages", Some("0.1.0"));
        let found = |version: &str| -> Vec<PathBuf> {
            in_python_packages(&bin, version)
                .iter()
                .map(|p| p.canonicalize().unwrap())
                .collect()
        };
        let real = |p: &PathBuf| p.canonicalize().unwrap();
        assert_eq!(
            found("0.1.0"),
            vec![real(&ours), real(&older), real(&debian)]
        );
        assert_eq!(found("0.0.9")[0], real(&older));
    }

    #[test]
    fn the_embedded_shim_is_written_once_privately_and_rewritten_when_changed() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("cache/kinetrace/shim");
        let path = write_embedded(&dir, b"shim one").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"shim one");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&path)), (0o700, 0o755));
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        // Reused as it is.
        assert_eq!(write_embedded(&dir, b"shim one").unwrap(), path);
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            modified
        );
        // Tampered with (same name, other bytes): written anew.
        std::fs::write(&path, b"shim 0ne").unwrap();
        assert_eq!(write_embedded(&dir, b"shim one").unwrap(), path);
        assert_eq!(std::fs::read(&path).unwrap(), b"shim one");
        // Writable by others: not trusted, written anew with the private mode.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(write_embedded(&dir, b"shim one").unwrap(), path);
        assert_eq!(mode(&path), 0o755);
        // Another build's shim gets its own file.
        let other = write_embedded(&dir, b"shim two").unwrap();
        assert_ne!(other, path);
        // No temporary file is left.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".so")), "{names:?}");
    }

    #[test]
    fn a_shared_cache_directory_is_refused_or_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("shim");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        write_embedded(&dir, b"x").unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // A symlink in its place is not followed.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = write_embedded(&link, b"x").unwrap_err();
        assert!(
            e.to_string().contains("is not a directory of this user"),
            "{e:#}"
        );
    }
}
