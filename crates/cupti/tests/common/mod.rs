//! Shared helpers: child-process isolation, the fake library, trace loading.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a child test process may run before it is killed and the test fails with its output.
/// Generous: CI runs on a loaded 2-core machine.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// For tests that ask for markers and count the log's lines: with NVTX injection set, the source
/// has no reason to explain how to get markers, a line that would otherwise reach the session's log
/// (`subscriber.rs` tests that line). The value only has to be set; nothing here loads it.
pub const NVTX_SET: (&str, &str) = ("NVTX_INJECTION64_PATH", "libcupti.so");

/// Runs `body` in a fresh child process (CUPTI state, the fake's configuration and kinetrace's
/// session are process-wide). `name` must be the test's own name.
pub fn in_child(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    in_child_within(name, env, CHILD_DEADLINE, body)
}

/// [`in_child`] with another deadline.
pub fn in_child_within(name: &str, env: &[(&str, &str)], deadline: Duration, body: impl FnOnce()) {
    if is_child(name) {
        body();
        return;
    }
    let (status, text) = run_child(name, env, ChildStderr::Captured, deadline);
    assert!(status.success(), "child {name} failed ({status}):\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
}

/// Like [`in_child`], but the child's standard error is a pipe whose reading end is closed at once,
/// so every write to it fails (a full disk or a closed pipe, as a job's stderr can be).
pub fn in_child_with_broken_stderr(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if is_child(name) {
        body();
        return;
    }
    let (status, text) = run_child(name, env, ChildStderr::Broken, CHILD_DEADLINE);
    assert!(status.success(), "child {name} failed ({status}):\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
}

fn is_child(name: &str) -> bool {
    std::env::var("KINETRACE_CUPTI_TEST_CHILD").as_deref() == Ok(name)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChildStderr {
    Captured,
    Broken,
}

/// Re-runs this test binary for test `name` only, and returns its status and output (stdout, then
/// stderr). Fails the test with the output seen so far if the child outlives `limit`.
fn run_child(
    name: &str,
    env: &[(&str, &str)],
    stderr: ChildStderr,
    limit: Duration,
) -> (ExitStatus, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("KINETRACE_CUPTI_TEST_CHILD", name)
        // Whether markers can be recorded is each test's own choice, not the environment's.
        .env_remove("NVTX_INJECTION64_PATH")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the test binary");
    let out = collect(child.stdout.take());
    let err = match stderr {
        ChildStderr::Captured => collect(child.stderr.take()),
        ChildStderr::Broken => {
            // Closing our end makes every write the child makes to stderr fail (EPIPE; Rust
            // programs ignore SIGPIPE).
            drop(child.stderr.take());
            Arc::new(Mutex::new(Vec::new()))
        }
    };
    let text = |out: &Arc<Mutex<Vec<u8>>>, err: &Arc<Mutex<Vec<u8>>>| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.lock().unwrap()),
            String::from_utf8_lossy(&err.lock().unwrap())
        )
    };
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "child {name} still running after {limit:?}; killed. Output so far:\n{}",
                    text(&out, &err)
                );
            }
            Err(e) => panic!("waiting for child {name}: {e}"),
        }
    };
    // The child has exited; its pipes reach end of file unless it left a process behind holding
    // them, so give the readers a bounded moment to finish.
    let settle = Instant::now() + Duration::from_secs(10);
    while Instant::now() < settle && (Arc::strong_count(&out) > 1 || Arc::strong_count(&err) > 1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    (status, text(&out, &err))
}

/// Reads `pipe` to its end on a thread, into a buffer the caller can look at any time.
fn collect(pipe: Option<impl Read + Send + 'static>) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    if let Some(mut pipe) = pipe {
        let b = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
            drop(b);
        });
    }
    buf
}

/// Waits until `done()` holds, failing with `what()` after `deadline`.
pub fn wait_until(deadline: Duration, mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let end = Instant::now() + deadline;
    while !done() {
        assert!(
            Instant::now() < end,
            "gave up after {deadline:?} waiting: {}",
            what()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The fake libcupti built as a dev-dependency.
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for p in [
        deps.join("libkinetrace_fake_cupti.so"),
        deps.join("../libkinetrace_fake_cupti.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libkinetrace_fake_cupti.so not found next to {}; build kinetrace-fake-cupti",
        exe.display()
    );
}

/// Links the fake under a CUPTI file name in a temp dir (the name is the SONAME fallback).
pub fn fake_as(dir: &Path, file_name: &str) -> PathBuf {
    let p = dir.join(file_name);
    std::os::unix::fs::symlink(fake_library(), &p).unwrap();
    p
}

/// The fake's control entry points, resolved from the same (already loaded) file.
pub struct Fake {
    lib: libloading::Library,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct FakeStats {
    pub records_written: u64,
    pub records_dropped: u64,
    pub buffers_completed: u64,
    pub finalized: u32,
    pub enabled_kinds: u32,
    pub subscribed: u32,
    pub null_buffers_before_v27: u64,
    pub subscribes: u64,
    pub unsubscribes: u64,
    pub foreign_subscribed: u32,
}

macro_rules! sym {
    ($self:ident, $name:literal, $t:ty) => {
        // SAFETY: (test) the fake exports these with exactly these signatures.
        *unsafe { $self.lib.get::<$t>($name) }.unwrap()
    };
}

impl Fake {
    pub fn open(path: &Path) -> Fake {
        // SAFETY: the fake's initialisers do nothing.
        let lib = unsafe { libloading::Library::new(path) }.unwrap();
        Fake { lib }
    }
    pub fn kernel(&self, name: &str, stream: u32) -> u32 {
        let c = std::ffi::CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_cupti_launch_kernel\0",
            unsafe extern "C" fn(*const i8, u32, u64) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(c.as_ptr(), stream, 5_000) }
    }
    pub fn driver_kernel(&self, name: &str, stream: u32) -> u32 {
        let c = std::ffi::CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_cupti_driver_launch\0",
            unsafe extern "C" fn(*const i8, u32, u64) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(c.as_ptr(), stream, 5_000) }
    }
    pub fn graph(&self, graph_id: u32, nodes: u32, stream: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_graph_launch\0",
            unsafe extern "C" fn(u32, u32, u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(graph_id, nodes, stream) }
    }
    pub fn memcpy(&self, kind: u8, src: u8, dst: u8, bytes: u64, stream: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_memcpy\0",
            unsafe extern "C" fn(u8, u8, u8, u64, u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(kind, src, dst, bytes, stream) }
    }
    pub fn memset(&self, bytes: u64, stream: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_memset\0",
            unsafe extern "C" fn(u64, u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(bytes, stream) }
    }
    pub fn sync(&self, kind: u32, stream: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_sync\0",
            unsafe extern "C" fn(u32, u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(kind, stream) }
    }
    pub fn sync_on(&self, kind: u32, stream: u32, event: u32, context: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_sync_on\0",
            unsafe extern "C" fn(u32, u32, u32, u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values.
        unsafe { f(kind, stream, event, context) }
    }
    pub fn event_record(&self, event: u32, stream: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_event_record\0",
            unsafe extern "C" fn(u32, u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values.
        unsafe { f(event, stream) }
    }
    pub fn mempool(&self, op: u32, address: u64, size: u64) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_mempool\0",
            unsafe extern "C" fn(u32, u64, u64) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values.
        unsafe { f(op, address, size) }
    }
    pub fn malloc(&self, addr: u64, bytes: u64) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_malloc\0",
            unsafe extern "C" fn(u64, u64) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(addr, bytes) }
    }
    pub fn free(&self, addr: u64, bytes: u64) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_free\0",
            unsafe extern "C" fn(u64, u64) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(addr, bytes) }
    }
    pub fn runtime_call(&self, cbid: u32) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_runtime_call\0",
            unsafe extern "C" fn(u32) -> u32
        );
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(cbid) }
    }
    /// Another CUPTI client (PyTorch's Kineto) subscribes; returns the CUPTI code.
    pub fn foreign_subscribe(&self) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_foreign_subscribe\0",
            unsafe extern "C" fn() -> u32
        );
        // SAFETY: the fake's entry point, no arguments.
        unsafe { f() }
    }
    /// The other client unsubscribes; returns the CUPTI code.
    pub fn foreign_unsubscribe(&self) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_foreign_unsubscribe\0",
            unsafe extern "C" fn() -> u32
        );
        // SAFETY: the fake's entry point, no arguments.
        unsafe { f() }
    }
    /// A runtime call that runs `during` between its enter callback and its records.
    pub fn call_around(&self, during: &mut dyn FnMut()) -> u32 {
        extern "C" fn trampoline(arg: *mut std::ffi::c_void) {
            // SAFETY: `arg` is the `&mut &mut dyn FnMut()` passed below, alive for the call.
            let f = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
            f();
        }
        let f = sym!(
            self,
            b"fake_cupti_call_around\0",
            unsafe extern "C" fn(
                extern "C" fn(*mut std::ffi::c_void),
                *mut std::ffi::c_void,
            ) -> u32
        );
        let mut during = during;
        // SAFETY: the fake calls `trampoline` once, synchronously, with this pointer.
        unsafe {
            f(
                trampoline,
                &mut during as *mut &mut dyn FnMut() as *mut std::ffi::c_void,
            )
        }
    }
    /// Hands back the buffers held under `FAKE_CUPTI_HOLD=1`; returns how many.
    pub fn release_held(&self) -> u64 {
        let f = sym!(
            self,
            b"fake_cupti_release_held\0",
            unsafe extern "C" fn() -> u64
        );
        // SAFETY: the fake's entry point, no arguments.
        unsafe { f() }
    }
    /// Records of `kind` written into client buffers so far.
    pub fn written_of_kind(&self, kind: u32) -> u64 {
        let f = sym!(
            self,
            b"fake_cupti_written_of_kind\0",
            unsafe extern "C" fn(u32) -> u64
        );
        // SAFETY: the fake's entry point, a plain value.
        unsafe { f(kind) }
    }
    pub fn stats(&self) -> FakeStats {
        let f = sym!(
            self,
            b"fake_cupti_stats\0",
            unsafe extern "C" fn(*mut FakeStats)
        );
        let mut s = FakeStats::default();
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        unsafe { f(&mut s) };
        s
    }
}

/// Collects the profiler's one-line messages.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn sink(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let l = self.0.clone();
        move |m: &str| l.lock().unwrap().push(m.to_string())
    }
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

pub fn load_trace(dir: &Path) -> Value {
    let mut files: Vec<PathBuf> = walk(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        1,
        "expected one trace in {}: {files:?}",
        dir.display()
    );
    serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
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

pub fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents")
}

pub fn x<'a>(trace: &'a Value, cat: &'a str) -> Vec<&'a Value> {
    events(trace)
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == cat)
        .collect()
}

/// What one window's sink received.
#[derive(Clone, Debug, Default)]
pub struct WindowSeen {
    /// Records by type.
    pub by_type: std::collections::HashMap<kinetrace::ActivityType, u64>,
    /// Records from the GPU source (everything but CPU spans and annotations).
    pub gpu: u64,
    /// Runtime API records: (correlation, External id).
    pub runtime: Vec<(Option<u64>, Option<u64>)>,
    /// `dropped_events.cupti` for the window.
    pub dropped_cupti: u64,
    /// The trace metadata.
    pub metadata: Vec<(String, String)>,
    /// Whether the window was finished (its trace written).
    pub finished: bool,
}

impl WindowSeen {
    pub fn of(&self, t: kinetrace::ActivityType) -> u64 {
        self.by_type.get(&t).copied().unwrap_or(0)
    }
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every window a [`recording_sinks`] factory opened, in order.
#[derive(Clone, Default)]
pub struct Windows(pub Arc<Mutex<Vec<WindowSeen>>>);

impl Windows {
    pub fn get(&self) -> Vec<WindowSeen> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until `n` windows are written (the collector writes them on its own thread; a test
    /// that changes the source between windows waits, so each trace describes its own window).
    pub fn wait_for(&self, n: usize) {
        wait_until(
            Duration::from_secs(60),
            || self.0.lock().unwrap().len() >= n,
            || format!("{} of {n} windows written", self.0.lock().unwrap().len()),
        );
    }
}

struct RecordingSink {
    all: Windows,
    index: usize,
}

impl kinetrace_core::Sink for RecordingSink {
    fn record(&mut self, a: &kinetrace_core::Activity) -> std::io::Result<()> {
        use kinetrace::ActivityType as T;
        let mut all = self.all.0.lock().unwrap();
        let w = &mut all[self.index];
        let t = a.activity_type();
        *w.by_type.entry(t).or_default() += 1;
        if !matches!(t, T::CpuOp | T::UserAnnotation) {
            w.gpu += 1;
        }
        if t == T::Runtime {
            w.runtime.push((a.correlation, a.external_id));
        }
        Ok(())
    }

    fn finish(
        self: Box<Self>,
        meta: &kinetrace_core::TraceMeta,
    ) -> std::io::Result<kinetrace_core::TraceOutput> {
        let mut all = self.all.0.lock().unwrap();
        let w = &mut all[self.index];
        w.dropped_cupti = meta
            .dropped
            .iter()
            .find(|(k, _)| k == "cupti")
            .map_or(0, |(_, n)| *n);
        w.metadata = meta.metadata.clone();
        w.finished = true;
        Ok(kinetrace_core::TraceOutput {
            path: None,
            events: w.gpu,
            cycle: meta.cycle,
        })
    }
}

/// A sink factory that records what each window received, in memory.
pub fn recording_sinks() -> (Box<dyn kinetrace_core::SinkFactory>, Windows) {
    let windows = Windows::default();
    let w = windows.clone();
    let factory = move |_cycle: u32| -> std::io::Result<Box<dyn kinetrace_core::Sink>> {
        let mut all = w.0.lock().unwrap();
        all.push(WindowSeen::default());
        Ok(Box::new(RecordingSink {
            all: w.clone(),
            index: all.len() - 1,
        }))
    };
    (Box::new(factory), windows)
}

/// Starts a session on `source` recording into memory, with the schedule `schedule` (None: one
/// window from start to stop) and the collector polling every `collect_interval`.
pub fn session(
    source: kinetrace_cupti::CuptiSource,
    activities: kinetrace::ActivitySet,
    schedule: Option<kinetrace::Schedule>,
    collect_interval: Duration,
    log: &Log,
) -> (kinetrace_core::Session, Windows) {
    let (sinks, windows) = recording_sinks();
    let log_fn = log.sink();
    let config = kinetrace_core::SessionConfig {
        activities,
        trigger: match schedule {
            Some(s) => kinetrace_core::Trigger::Schedule(s),
            None => kinetrace_core::Trigger::Always,
        },
        collect_interval,
        log: Arc::new(log_fn),
        ..kinetrace_core::SessionConfig::default()
    };
    let session = kinetrace_core::Session::start(config, vec![Box::new(source)], sinks, None)
        .expect("no other session in this process");
    (session, windows)
}
