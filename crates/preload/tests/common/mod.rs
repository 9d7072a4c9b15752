//! Helpers: the built shim and test programs, a scratch world per test, trace reading.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
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

/// How long a test waits on another process before it fails with what it saw. Generous: CI runs
/// on a loaded 2-core machine; no test depends on being fast.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A running child whose piped stdout and stderr are drained as they come (so it never blocks on a
/// full pipe), waited on with [`DEADLINE`]. Every failure message carries what the child printed so
/// far, plus the files named with [`Job::show`] (the kinetrace log).
pub struct Job {
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    show: Vec<PathBuf>,
}

fn drain(
    pipe: Option<impl Read + Send + 'static>,
    into: &Arc<Mutex<Vec<u8>>>,
) -> Option<std::thread::JoinHandle<()>> {
    let mut pipe = pipe?;
    let into = into.clone();
    Some(std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => into.lock().unwrap().extend_from_slice(&buf[..n]),
            }
        }
    }))
}

impl Job {
    /// Spawns `c` with stdout and stderr piped.
    pub fn spawn(mut c: Command) -> Job {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        Job::spawn_as_is(c)
    }

    /// Spawns `c` with the stdio it was given (piped streams are drained).
    pub fn spawn_as_is(mut c: Command) -> Job {
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {:?}: {e}", c.get_program()));
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let readers = [
            drain(child.stdout.take(), &stdout),
            drain(child.stderr.take(), &stderr),
        ]
        .into_iter()
        .flatten()
        .collect();
        Job {
            child,
            stdout,
            stderr,
            readers,
            show: Vec::new(),
        }
    }

    /// Spawns `c` with stdout piped and stderr piped, then closes the reading end of stderr at once:
    /// the child's stderr is a pipe nobody will ever read (writes fail with EPIPE / SIGPIPE).
    pub fn spawn_closing_stderr(mut c: Command) -> Job {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut job = Job::spawn_as_is_keeping_stderr(c);
        drop(job.child.stderr.take());
        job
    }

    fn spawn_as_is_keeping_stderr(mut c: Command) -> Job {
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {:?}: {e}", c.get_program()));
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let readers = drain(child.stdout.take(), &stdout).into_iter().collect();
        Job {
            child,
            stdout,
            stderr,
            readers,
            show: Vec::new(),
        }
    }

    /// Also show this file (a log) when a wait fails.
    pub fn show(mut self, path: &Path) -> Job {
        self.show.push(path.to_path_buf());
        self
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdout so far.
    pub fn stdout_so_far(&self) -> String {
        text(&self.stdout.lock().unwrap())
    }

    /// What the child printed so far and the files to show, for a failure message.
    pub fn seen(&self) -> String {
        let mut s = format!(
            "stdout:\n{}\nstderr:\n{}",
            self.stdout_so_far(),
            text(&self.stderr.lock().unwrap())
        );
        for p in &self.show {
            s.push_str(&format!(
                "\n{}:\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            ));
        }
        s
    }

    /// Waits until `ready` holds, polling; fails with what the child printed if the deadline passes
    /// or the child exits first.
    pub fn wait_until(&mut self, what: &str, mut ready: impl FnMut(&Job) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if ready(self) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                if ready(self) {
                    return;
                }
                panic!(
                    "waiting for {what}: the child exited ({status}) first; {}",
                    self.seen()
                );
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "waiting for {what}: timed out after {DEADLINE:?}; {}",
                    self.seen()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `path` exists and is not empty, and returns its contents.
    pub fn wait_for_file(&mut self, path: &Path) -> String {
        self.wait_until(&path.display().to_string(), |_| {
            std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
        });
        std::fs::read_to_string(path).unwrap()
    }

    /// Waits for the child to exit (killing it and failing past the deadline) and returns all it
    /// printed.
    pub fn wait(mut self) -> Output {
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("timed out after {DEADLINE:?}; {}", self.seen());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The pipes close when the child and everything it spawned have exited; a grandchild that
        // keeps them open must not hang the test either.
        let drained_by = Instant::now() + DEADLINE;
        for r in std::mem::take(&mut self.readers) {
            while !r.is_finished() {
                assert!(
                    Instant::now() < drained_by,
                    "the child exited ({status}) but its output pipes stayed open; {}",
                    self.seen()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = r.join();
        }
        Output {
            status,
            stdout: std::mem::take(&mut *self.stdout.lock().unwrap()),
            stderr: std::mem::take(&mut *self.stderr.lock().unwrap()),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A test that failed half-way leaves no process behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs with stdout and stderr piped and a deadline; panics if the program hangs.
pub fn run(c: Command) -> Output {
    Job::spawn(c).wait()
}

/// Waits (polling, with [`DEADLINE`]) until `ready` holds; fails with `seen()` otherwise.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool, seen: impl Fn() -> String) {
    let deadline = Instant::now() + DEADLINE;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "waiting for {what}: timed out after {DEADLINE:?}; {}",
            seen()
        );
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
    // The export crate depends on flate2; its reader already checked the file. Decode via gzip(1),
    // fed from a thread so that neither side blocks on a full pipe.
    let mut c = Command::new("gzip");
    c.arg("-dc").stdin(Stdio::piped());
    let mut job = Job::spawn(c);
    let mut stdin = job.child.stdin.take().unwrap();
    let raw = raw.to_vec();
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(&raw);
    });
    let o = job.wait();
    let _ = feeder.join();
    assert!(o.status.success(), "gzip -dc: {}", text(&o.stderr));
    out.push_str(&String::from_utf8(o.stdout).unwrap());
}
