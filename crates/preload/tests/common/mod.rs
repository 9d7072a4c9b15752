//! Helpers: the built shim and test programs, a scratch world per test. Processes with deadlines,
//! trace reading and the fake libcupti's path come from `kinetrace-test-support`.
#![allow(dead_code, unused_imports)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use kinetrace_test_support::fake::{fake_cupti, profile_dir};
pub use kinetrace_test_support::process::{run, text, wait_until, Job, DEADLINE};
pub use kinetrace_test_support::trace::{is_trace, traces_in, walk, Trace};

/// The shim under test.
pub fn shim() -> PathBuf {
    // Built from src/lib.rs as an example, so every test run has a fresh one (see Cargo.toml).
    let p = profile_dir().join("examples/libkinetrace.so");
    assert!(
        p.exists(),
        "{} not built (cargo test -p kinetrace-preload builds it)",
        p.display()
    );
    p
}

/// The stand-in training job (`examples/fake_train.rs`).
pub fn fake_train() -> PathBuf {
    let p = profile_dir().join("examples/fake_train");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A scratch world: trace root, control dir, log file, and a library dir where `libcuda.so.1` and
/// `libcupti.so.12` are the fake.
pub struct World {
    pub tmp: tempfile::TempDir,
    pub out: PathBuf,
    pub ctl: PathBuf,
    pub log: PathBuf,
    pub libs: PathBuf,
    /// The shim [`World::preloaded`] loads.
    pub shim: PathBuf,
    /// The stand-in job.
    pub train: PathBuf,
}

impl World {
    pub fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        World::in_dir(tmp, shim(), fake_train(), fake_cupti())
    }

    fn in_dir(tmp: tempfile::TempDir, shim: PathBuf, train: PathBuf, cupti: PathBuf) -> World {
        let libs = tmp.path().join("libs");
        std::fs::create_dir(&libs).unwrap();
        for name in ["libcuda.so.1", "libcupti.so.12"] {
            std::os::unix::fs::symlink(&cupti, libs.join(name)).unwrap();
        }
        World {
            out: tmp.path().join("traces"),
            ctl: tmp.path().join("ctl"),
            log: tmp.path().join("kinetrace.log"),
            libs,
            tmp,
            shim,
            train,
        }
    }

    /// A world another user can use: its directory (mode 0777) lies where every ancestor lets others
    /// through, and holds world-readable copies of the shim, the stand-in job and the fake libcupti,
    /// so nothing depends on where the checkout sits (CI clones into a 0700 directory).
    pub fn for_another_user() -> World {
        use std::os::unix::fs::PermissionsExt;
        let base = reachable_scratch();
        let tmp = tempfile::tempdir_in(&base).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = |from: PathBuf, mode: u32| {
            let to = bin.join(from.file_name().unwrap());
            std::fs::copy(&from, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
            to
        };
        let (shim, train, cupti) = (
            copy(shim(), 0o755),
            copy(fake_train(), 0o755),
            copy(fake_cupti(), 0o755),
        );
        World::in_dir(tmp, shim, train, cupti)
    }

    /// `program args` with a clean kinetrace environment: the trace root, control dir and log file
    /// of this world, the fake CUDA libraries on the loader path, and no shim (see [`preloaded`]).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("KINETRACE_")
                || k.starts_with("KINETO_")
                || k.starts_with("CUDA_INJECTION")
                || k == "LD_PRELOAD"
                || ["RANK", "LOCAL_RANK", "WORLD_SIZE", "RUST_BACKTRACE"].contains(&k.as_str())
            {
                c.env_remove(&k);
            }
        }
        c.env("KINETRACE_OUTPUT_DIR", &self.out)
            .env("KINETRACE_CONTROL_DIR", &self.ctl)
            .env("KINETRACE_LOG", &self.log)
            .env("KINETRACE_CUPTI_PATH", self.libs.join("libcupti.so.12"))
            .env("LD_LIBRARY_PATH", &self.libs)
            .stdin(Stdio::null());
        default_signals(&mut c);
        c
    }

    /// Like [`command`], with the shim preloaded.
    pub fn preloaded(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut c = self.command(program, args);
        c.env("LD_PRELOAD", &self.shim);
        c
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every finished trace under the trace root, sorted.
    pub fn traces(&self) -> Vec<PathBuf> {
        traces_in(&self.out)
    }

    /// Anything left under the trace root that is not a finished trace (spools, temporaries).
    pub fn leftovers(&self) -> Vec<PathBuf> {
        walk(&self.out)
            .into_iter()
            .filter(|p| !is_trace(p))
            .collect()
    }
}

/// A scratch directory every user can reach: `std::env::temp_dir()` if each of its ancestors lets
/// others through (o+x), else `/tmp`.
pub fn reachable_scratch() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let reachable = |d: &Path| {
        d.is_dir()
            && d.ancestors()
                .all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
    };
    let candidates = [std::env::temp_dir(), PathBuf::from("/tmp")];
    candidates
        .iter()
        .find(|d| reachable(d))
        .cloned()
        .unwrap_or_else(|| panic!("none of {candidates:?} can be reached by other users"))
}

/// Starts the child with SIGINT, SIGTERM and SIGHUP at their default action, as from a terminal:
/// an ignored signal is inherited across exec, so a suite run under `nohup` (SIGHUP ignored) or by
/// a runner without job control (SIGINT ignored) would otherwise give every job an ignored signal,
/// and a test that ends a job with it would wait for nothing.
fn default_signals(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls only `signal`, which is
    // async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        c.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}
