//! Where the fake libcupti (`tests/fakes/cupti`, package `kinetrace-fake-cupti`) was built. A test
//! crate that uses it takes `kinetrace-fake-cupti` as a dev-dependency, so cargo builds it into the
//! same profile directory as the test binary.

use std::path::{Path, PathBuf};

/// The fake's file name.
pub const FAKE_CUPTI_FILE: &str = "libkinetrace_fake_cupti.so";

/// `target/<profile>/`: the directory above the running test binary's own (`deps/`, `examples/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The fake libcupti (it also exports `cuDriverGetVersion`, so it stands in for libcuda too).
pub fn fake_cupti() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let here = exe.parent().unwrap();
    for p in [
        here.join(FAKE_CUPTI_FILE),
        profile_dir().join("deps").join(FAKE_CUPTI_FILE),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{FAKE_CUPTI_FILE} not found next to {}; take kinetrace-fake-cupti as a dev-dependency",
        exe.display()
    );
}

/// Links the fake under `file_name` in `dir` (a CUPTI or driver file name the loader searches for).
pub fn fake_as(dir: &Path, file_name: &str) -> PathBuf {
    let p = dir.join(file_name);
    std::os::unix::fs::symlink(fake_cupti(), &p).unwrap();
    p
}
