//! Where the fake libcupti (`tests/fakes/cupti`, package `kinetrace-fake-cupti`) and the fake
//! librocprofiler-sdk (`tests/fakes/rocprofiler-sdk`) and the fake libroctracer64
//! (`tests/fakes/roctracer`) were built. A test crate that uses one takes
//! its package as a dev-dependency, so cargo builds it into the same profile directory as the test
//! binary.

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

/// The fake librocprofiler-sdk's file name (`tests/fakes/rocprofiler-sdk`).
pub const FAKE_ROCPROFILER_SDK_FILE: &str = "libkinetrace_fake_rocprofiler_sdk.so";

/// The fake librocprofiler-sdk (a test crate takes `kinetrace-fake-rocprofiler-sdk` as a
/// dev-dependency).
pub fn fake_rocprofiler_sdk() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let here = exe.parent().unwrap();
    for p in [
        here.join(FAKE_ROCPROFILER_SDK_FILE),
        profile_dir().join("deps").join(FAKE_ROCPROFILER_SDK_FILE),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{FAKE_ROCPROFILER_SDK_FILE} not found next to {}; take kinetrace-fake-rocprofiler-sdk as a dev-dependency",
        exe.display()
    );
}

/// Links the fake librocprofiler-sdk under its 1.x SONAME in `dir`.
pub fn fake_rocprofiler_sdk_in(dir: &Path) -> PathBuf {
    let p = dir.join("librocprofiler-sdk.so.1");
    std::os::unix::fs::symlink(fake_rocprofiler_sdk(), &p).unwrap();
    p
}

/// Links the fake under `file_name` in `dir` (a CUPTI or driver file name the loader searches for).
pub fn fake_as(dir: &Path, file_name: &str) -> PathBuf {
    let p = dir.join(file_name);
    std::os::unix::fs::symlink(fake_cupti(), &p).unwrap();
    p
}

/// The fake libroctracer64's file name (`tests/fakes/roctracer`).
pub const FAKE_ROCTRACER_FILE: &str = "libkinetrace_fake_roctracer.so";

/// The fake libroctracer64 (a test crate takes `kinetrace-fake-roctracer` as a dev-dependency).
pub fn fake_roctracer() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let here = exe.parent().unwrap();
    for p in [
        here.join(FAKE_ROCTRACER_FILE),
        profile_dir().join("deps").join(FAKE_ROCTRACER_FILE),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{FAKE_ROCTRACER_FILE} not found next to {}; take kinetrace-fake-roctracer as a dev-dependency",
        exe.display()
    );
}

/// Links the fake libroctracer64 under its SONAME in `dir`.
pub fn fake_roctracer_in(dir: &Path) -> PathBuf {
    let p = dir.join("libroctracer64.so.4");
    std::os::unix::fs::symlink(fake_roctracer(), &p).unwrap();
    p
}
