//! Helpers: the built shim and test programs, a scratch world per test, trace reading.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `target/<profile>/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

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

/// The fake libcupti (it also exports `cuDriverGetVersion`, so it stands in for libcuda too).
pub fn fake_cupti() -> PathBuf {
    let p = profile_dir().join("deps/libkinetrace_fake_cupti.so");
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
}

impl World {
    pub fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let libs = tmp.path().join("libs");
        std::fs::create_dir(&libs).unwrap();
        for name in ["libcuda.so.1", "libcupti.so.12"] {
            std::os::unix::fs::symlink(fake_cupti(), libs.join(name)).unwrap();
        }
        World {
            out: tmp.path().join("traces"),
            ctl: tmp.path().join("ctl"),
            log: tmp.path().join("kinetrace.log"),
            libs,
            tmp,
        }
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
        c
    }

    /// Like [`command`], with the shim preloaded.
    pub fn preloaded(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut c = self.command(program, args);
        c.env("LD_PRELOAD", shim());
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

pub fn is_trace(p: &Path) -> bool {
    let s = p.to_string_lossy();
    let name = p
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    !name.starts_with('.') && (s.ends_with(".pt.trace.json") || s.ends_with(".pt.trace.json.gz"))
}

pub fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(dir).into_iter().filter(|p| is_trace(p)).collect();
    v.sort();
    v
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Runs with a deadline; panics if the program hangs.
pub fn run(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "timed out:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A parsed trace.
pub struct Trace {
    pub path: PathBuf,
    pub json: Value,
}

impl Trace {
    pub fn load(path: &Path) -> Trace {
        let raw = std::fs::read(path).unwrap();
        let text = if path.to_string_lossy().ends_with(".gz") {
            let mut s = String::new();
            flate2_decode(&raw, &mut s);
            s
        } else {
            String::from_utf8(raw).unwrap()
        };
        // The reader the export crate ships must accept it too.
        kinetrace_export::read_trace(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Trace {
            path: path.to_path_buf(),
            json: serde_json::from_str(&text).unwrap(),
        }
    }

    pub fn events(&self) -> &Vec<Value> {
        self.json["traceEvents"].as_array().unwrap()
    }

    fn names(&self, cat: &str) -> Vec<String> {
        self.events()
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == cat)
            .map(|e| e["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// The `ProfilerStep#N` numbers, ascending.
    pub fn steps(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .names("user_annotation")
            .iter()
            .filter_map(|n| n.strip_prefix("ProfilerStep#")?.parse().ok())
            .collect();
        v.sort();
        v
    }

    /// The step each kernel came from (`step<N>_kernel<K>`), ascending and deduplicated.
    pub fn kernel_steps(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .names("kernel")
            .iter()
            .filter_map(|n| n.strip_prefix("step")?.split('_').next()?.parse().ok())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn kernels(&self) -> usize {
        self.names("kernel").len()
    }

    /// Every kernel's correlation id has a runtime call with the same id.
    pub fn assert_correlated(&self) {
        let runtime: std::collections::HashSet<i64> = self
            .events()
            .iter()
            .filter(|e| e["cat"] == "cuda_runtime")
            .filter_map(|e| e["args"]["correlation"].as_i64())
            .collect();
        for e in self.events().iter().filter(|e| e["cat"] == "kernel") {
            let c = e["args"]["correlation"]
                .as_i64()
                .expect("kernel correlation");
            assert!(
                runtime.contains(&c),
                "kernel {} has no runtime call",
                e["name"]
            );
        }
    }

    pub fn rank(&self) -> Option<i64> {
        self.json["distributedInfo"]["rank"].as_i64()
    }
}

fn flate2_decode(raw: &[u8], out: &mut String) {
    // The export crate depends on flate2; its reader already checked the file. Decode via gzip(1).
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(raw).unwrap();
    let o = child.wait_with_output().unwrap();
    out.push_str(&String::from_utf8(o.stdout).unwrap());
}

/// Waits until `path` exists and returns its contents.
pub fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{} never appeared", path.display());
}
