//! Shared helpers: the fake library's control entry points and sessions recording into memory.
//! Child-process isolation, the fake's path, trace loading and the log collector come from
//! `kinetrace-test-support`.
#![allow(dead_code, unused_imports)] // each test binary uses its own part

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use kinetrace_test_support::fake::{fake_as, fake_cupti as fake_library};
pub use kinetrace_test_support::process::{
    in_child, in_child_with_broken_stderr, in_child_within, CHILD_DEADLINE,
};
pub use kinetrace_test_support::trace::{
    assert_one_flow_per_gpu_record, events, key_position, load_only_trace as load_trace,
    only_trace_keys, x,
};
pub use kinetrace_test_support::{annotation, trace_session, Log};

/// For tests that ask for markers and count the log's lines: with NVTX injection set, the source
/// has no reason to explain how to get markers, a line that would otherwise reach the session's log
/// (`subscriber.rs` tests that line). The value only has to be set; nothing here loads it.
pub const NVTX_SET: (&str, &str) = ("NVTX_INJECTION64_PATH", "libcupti.so");

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
    /// `cudaLaunchKernel` reaching `cuLaunchKernel` inside it: (runtime corr, driver corr).
    pub fn kernel_via_driver(&self, name: &str, stream: u32) -> (u32, u32) {
        let c = std::ffi::CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_cupti_launch_kernel_nested\0",
            unsafe extern "C" fn(*const i8, u32, u64, *mut u32) -> u32
        );
        let mut driver = 0;
        // SAFETY: the fake's entry point, called with plain values / valid pointers.
        let runtime = unsafe { f(c.as_ptr(), stream, 5_000, &mut driver) };
        (runtime, driver)
    }
    /// External-correlation pushes the fake has seen, on any thread.
    pub fn external_pushes(&self) -> u64 {
        let f = sym!(
            self,
            b"fake_cupti_external_pushes\0",
            unsafe extern "C" fn() -> u64
        );
        // SAFETY: the fake's entry point, no arguments.
        unsafe { f() }
    }
    /// External ids left on this thread's CUPTI stack.
    pub fn external_depth(&self) -> u32 {
        let f = sym!(
            self,
            b"fake_cupti_external_depth\0",
            unsafe extern "C" fn() -> u32
        );
        // SAFETY: the fake's entry point, no arguments.
        unsafe { f() }
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
    /// A synchronization of `sync_type` (3: `cudaStreamSynchronize`) that runs `during` while the
    /// caller is blocked in it (between its enter and exit callbacks).
    pub fn sync_around(&self, sync_type: u32, during: &mut dyn FnMut()) -> u32 {
        extern "C" fn trampoline(arg: *mut std::ffi::c_void) {
            // SAFETY: `arg` is the `&mut &mut dyn FnMut()` passed below, alive for the call.
            let f = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
            f();
        }
        let f = sym!(
            self,
            b"fake_cupti_sync_around\0",
            unsafe extern "C" fn(
                u32,
                extern "C" fn(*mut std::ffi::c_void),
                *mut std::ffi::c_void,
            ) -> u32
        );
        let mut during = during;
        // SAFETY: the fake calls `trampoline` once, synchronously, with this pointer.
        unsafe {
            f(
                sync_type,
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

/// What one window's sink received.
#[derive(Clone, Debug, Default)]
pub struct WindowSeen {
    /// Records by type.
    pub by_type: std::collections::HashMap<kinetrace_core::ActivityType, u64>,
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
    pub fn of(&self, t: kinetrace_core::ActivityType) -> u64 {
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
        // Written, not only opened: a sink is made when its window starts.
        let written = || self.0.lock().unwrap().iter().filter(|w| w.finished).count();
        wait_until(
            Duration::from_secs(60),
            || written() >= n,
            || format!("{} of {n} windows written", written()),
        );
    }
}

struct RecordingSink {
    all: Windows,
    index: usize,
}

impl kinetrace_core::Sink for RecordingSink {
    fn record(&mut self, a: &kinetrace_core::Activity) -> std::io::Result<()> {
        use kinetrace_core::ActivityType as T;
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
    activities: kinetrace_core::ActivitySet,
    schedule: Option<kinetrace_core::schedule::Schedule>,
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
