//! Shared helpers: child-process isolation, the fake library, trace loading.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// Runs `body` in a fresh child process (CUPTI state, the fake's configuration and kinetrace's
/// session are process-wide). `name` must be the test's own name.
pub fn in_child(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if std::env::var("KINETRACE_CUPTI_TEST_CHILD").as_deref() == Ok(name) {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("KINETRACE_CUPTI_TEST_CHILD", name)
        .envs(env.iter().copied())
        .output()
        .expect("spawn the test binary");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "child {name} failed ({}):\n{text}",
        out.status
    );
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
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
