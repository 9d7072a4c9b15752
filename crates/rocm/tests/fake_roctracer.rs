//! The roctracer 4.1 fallback driven through the fake libroctracer64 (`tests/fakes/roctracer`):
//! real HIP API domain callbacks and 64-byte HIP_OPS records with out-of-line kernel names, into a
//! real session writing a real trace. The fallback is taken when rocprofiler-sdk is absent or was
//! initialised without kinetrace. Each scenario runs in its own process (the tracer, like the
//! fakes' fault configuration, is process-wide).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use kinetrace_core::activity::ActivitySet;
use kinetrace_core::schedule::Schedule;
use kinetrace_core::session::{Session, SessionConfig, Trigger};
use kinetrace_export::TraceDir;
use kinetrace_rocm::{Backend, RocmConfig, RocmSource};
use kinetrace_test_support::fake::{fake_rocprofiler_sdk_in, fake_roctracer_in};
use kinetrace_test_support::process::{in_child, wait_until};
use kinetrace_test_support::trace::{
    assert_one_flow_per_gpu_record, events, load_json, load_only_trace, x,
};
use kinetrace_test_support::{annotation, trace_session, Log};
use serde_json::Value;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FakeStats {
    records_delivered: u64,
    buffers_delivered: u64,
    callbacks: u64,
    api_enabled: u32,
    activity_enabled: u32,
    pools: u32,
}

/// The fake's workload entry points.
struct Fake {
    lib: libloading::Library,
}

macro_rules! sym {
    ($self:ident, $name:literal, $t:ty) => {
        // SAFETY: (test) the fake exports these with exactly these signatures.
        *unsafe { $self.lib.get::<$t>($name) }.unwrap()
    };
}

impl Fake {
    fn open(path: &Path) -> Fake {
        // SAFETY: the fake's initialisers do nothing.
        let lib = unsafe { libloading::Library::new(path) }.unwrap();
        Fake { lib }
    }
    fn kernel(&self, name: &str, device: i32, queue: u64) -> u64 {
        let c = CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_roct_launch_kernel\0",
            unsafe extern "C" fn(*const i8, i32, u64, u64) -> u64
        );
        // SAFETY: the fake copies the name during the call.
        unsafe { f(c.as_ptr(), device, queue, 4_000) }
    }
    fn memcpy(&self, bytes: u64, kind: u32, device: i32) -> u64 {
        let f = sym!(
            self,
            b"fake_roct_memcpy\0",
            unsafe extern "C" fn(u64, u32, i32, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(bytes, kind, device, 0) }
    }
    fn memset(&self, bytes: u64, device: i32) -> u64 {
        let f = sym!(
            self,
            b"fake_roct_memset\0",
            unsafe extern "C" fn(u64, i32, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(bytes, device, 0) }
    }
    fn barrier(&self, device: i32) -> u64 {
        let f = sym!(
            self,
            b"fake_roct_barrier\0",
            unsafe extern "C" fn(i32, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(device, 0) }
    }
    fn api(&self, name: &str) -> u64 {
        let c = CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_roct_api\0",
            unsafe extern "C" fn(*const i8) -> u64
        );
        // SAFETY: a NUL-terminated name.
        unsafe { f(c.as_ptr()) }
    }
    fn stats(&self) -> FakeStats {
        let f = sym!(
            self,
            b"fake_roct_stats\0",
            unsafe extern "C" fn(*mut FakeStats)
        );
        let mut s = FakeStats::default();
        // SAFETY: a valid out-pointer of the fake's layout.
        unsafe { f(&mut s) };
        s
    }
}

fn args(e: &Value) -> &Value {
    &e["args"]
}

/// No rocprofiler-sdk anywhere (none installed here; no path named), the fake roctracer named.
fn config(roctracer: &Path) -> RocmConfig {
    RocmConfig {
        roctracer_library: Some(roctracer.to_path_buf()),
        ..RocmConfig::default()
    }
}

/// Runs `work` inside a window of a session recording through `source`; returns the trace and the
/// log's lines.
fn record(
    source: RocmSource,
    fake: &Fake,
    dir: &Path,
    work: impl FnOnce(),
) -> (Value, Vec<String>) {
    let out = dir.join("traces");
    let log = Log::default();
    let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
    wait_until(
        "the window to turn roctracer on (or fail to)",
        || fake.stats().api_enabled == 1 || log.lines().iter().any(|l| l.contains("failed")),
        || format!("{:?} {:?}", fake.stats(), log.lines()),
    );
    work();
    let written = session.stop();
    assert_eq!(
        written.len(),
        1,
        "a trace is written whatever the backend did"
    );
    (load_only_trace(&out), log.lines())
}

fn roctracer_scenario(fake: &Fake, source: RocmSource, dir: &Path) -> (Value, Vec<String>) {
    assert_eq!(source.backend(), Backend::Roctracer);
    let info = source.roctracer_info().expect("roctracer").clone();
    assert_eq!(info.version, (4, 1));
    let (trace, log) = record(source, fake, dir, || {
        {
            let _span = annotation("train_step");
            fake.kernel("_Z4axpyPfS_f", 2, 0);
            fake.kernel("_Z4gemmPKfS0_Pf", 2, 1);
            fake.memcpy(2560, 0x11F4, 2);
            fake.memset(4096, 2);
            fake.barrier(2);
            fake.api("hipGetDevice");
        }
        fake.api("hipDeviceSynchronize");
    });
    assert_eq!(fake.stats().api_enabled, 0, "off after the window");
    assert_eq!(fake.stats().activity_enabled, 0, "off after the window");
    (trace, log)
}

fn check_roctracer_trace(trace: &Value) {
    let kernels = x(trace, "kernel");
    let names: Vec<&str> = kernels
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["_Z4axpyPfS_f", "_Z4gemmPKfS0_Pf"]);
    // As Kineto's roctracer path: the KFD node id and the stream's queue index, as recorded.
    assert_eq!(
        (
            args(kernels[0])["device"].as_u64(),
            args(kernels[0])["stream"].as_u64()
        ),
        (Some(2), Some(0))
    );
    assert_eq!(args(kernels[1])["stream"], 1);
    let copies = x(trace, "gpu_memcpy");
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0]["name"], "Memcpy HtoD (Host -> Device)");
    assert_eq!(args(copies[0])["bytes"], 2560);
    assert_eq!(args(copies[0])["kind"], "HtoD");
    assert_eq!(args(kernels[0])["kind"], "Dispatch Kernel");
    // The calls' arguments, as in Kineto's roctracer trace (`hip_prof_str.h` layouts read in the
    // callback): the launch's kernel (learned from its dispatch), grid, block, LDS and stream; the
    // copy's addresses, size, kind and stream.
    let call_of = |g: &Value| -> Value {
        let corr = args(g)["correlation"].as_u64().unwrap();
        x(trace, "cuda_runtime")
            .into_iter()
            .find(|r| args(r)["correlation"].as_u64() == Some(corr))
            .unwrap_or_else(|| panic!("no call for {g}"))
            .clone()
    };
    for (k, stream) in kernels.iter().zip([0u64, 0x5a5a_0001]) {
        let call = call_of(k);
        let a = args(&call);
        assert_eq!(a["kernel"], k["name"], "{call}");
        assert_eq!(a["grid"], serde_json::json!([16, 1, 1]), "{call}");
        assert_eq!(a["block"], serde_json::json!([256, 1, 1]), "{call}");
        assert_eq!(a["shared memory"], 0, "{call}");
        assert_eq!(a["stream"], format!("{stream:#x}"), "{call}");
    }
    let copy_call = call_of(copies[0]);
    let a = args(&copy_call);
    // Kineto writes these as strings.
    assert_eq!(
        (a["size"].as_str(), a["kind"].as_str()),
        (Some("2560"), Some("1")),
        "{copy_call}"
    );
    assert_eq!(a["stream"], "0x0", "{copy_call}");
    assert_eq!(a["src"], "0x55674ecd4180", "{copy_call}");
    let sets = x(trace, "gpu_memset");
    assert_eq!(sets.len(), 1, "a FILL_BUFFER is a memset");
    assert_eq!(args(sets[0])["bytes"], 4096);
    let mut runtime = x(trace, "cuda_runtime");
    runtime.sort_by(|a, b| a["ts"].as_f64().partial_cmp(&b["ts"].as_f64()).unwrap());
    let calls: Vec<(&str, u64)> = runtime
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                args(r)["cid"].as_u64().unwrap(),
            )
        })
        .collect();
    // hipGetDevice is Kineto's noise (its callback turned off); the barrier's record is dropped.
    assert_eq!(
        calls,
        [
            ("hipLaunchKernel", 107),
            ("hipLaunchKernel", 107),
            ("hipMemcpyAsync", 134),
            ("hipMemsetAsync", 159),
            ("hipStreamSynchronize", 199),
            ("hipDeviceSynchronize", 48),
        ]
    );
    let span = x(trace, "user_annotation")
        .into_iter()
        .find(|e| e["name"] == "train_step")
        .expect("the span");
    let span_id = args(span)["External id"].as_u64().unwrap();
    for g in kernels.iter().chain(&copies).chain(&sets) {
        let corr = args(g)["correlation"].as_u64().unwrap();
        let call = runtime
            .iter()
            .find(|r| args(r)["correlation"].as_u64() == Some(corr))
            .unwrap_or_else(|| panic!("no call for {g}"));
        assert_eq!(args(g)["External id"].as_u64(), Some(span_id), "{g}");
        assert_eq!(args(call)["External id"].as_u64(), Some(span_id), "{call}");
        let (gs, cs) = (g["ts"].as_f64().unwrap(), call["ts"].as_f64().unwrap());
        let ce = cs + call["dur"].as_f64().unwrap();
        assert!(gs >= cs && gs <= ce + 1.0, "GPU at {gs}, call {cs}..{ce}");
    }
    // Launches and copies start an ac2g flow that ends on their GPU event.
    for k in kernels.iter().chain(&copies) {
        let corr = args(k)["correlation"].as_u64();
        let ends: Vec<&Value> = events(trace)
            .iter()
            .filter(|e| e["cat"] == "ac2g" && e["id"].as_u64() == corr)
            .collect();
        assert_eq!(ends.len(), 2, "{ends:?}");
    }
    // So does the memset (its FILL_BUFFER record): every GPU record has exactly one flow.
    assert_eq!(assert_one_flow_per_gpu_record(trace), 4);
    assert!(
        args(runtime[5]).get("External id").is_none(),
        "outside the span"
    );
    assert_eq!(trace["rocm_backend"], "roctracer");
    assert_eq!(trace["roctracer_version"], "4.1");
    assert_eq!(trace["dropped_events"]["rocm"], 0);
}

#[test]
fn roctracer_when_there_is_no_rocprofiler_sdk() {
    in_child("roctracer_when_there_is_no_rocprofiler_sdk", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_roctracer_in(dir.path());
        let fake = Fake::open(&lib);
        let source = RocmSource::new(config(&lib));
        assert!(source.is_live());
        let (trace, log) = roctracer_scenario(&fake, source, dir.path());
        check_roctracer_trace(&trace);
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(
            log[0].contains("recording through roctracer 4.1"),
            "{log:?}"
        );
        assert!(log[0].contains("no rocprofiler-sdk found"), "{log:?}");
        assert_eq!(trace["roctracer_found"], "named explicitly");
    });
}

#[test]
fn roctracer_when_rocprofiler_sdk_was_registered_too_late() {
    in_child(
        "roctracer_when_rocprofiler_sdk_was_registered_too_late",
        &[("FAKE_ROCP_ALREADY_INITIALIZED", "1")],
        || {
            let dir = tempfile::tempdir().unwrap();
            let sdk = fake_rocprofiler_sdk_in(dir.path());
            let lib = fake_roctracer_in(dir.path());
            let fake = Fake::open(&lib);
            let source = RocmSource::new(RocmConfig {
                library: Some(sdk),
                ..config(&lib)
            });
            let (trace, log) = roctracer_scenario(&fake, source, dir.path());
            check_roctracer_trace(&trace);
            assert_eq!(log.len(), 1, "{log:?}");
            assert!(log[0].contains("registered too late"), "{log:?}");
            assert!(trace["rocm_fallback_reason"]
                .as_str()
                .unwrap()
                .contains("registered too late"));
        },
    );
}

/// Two windows of a schedule: roctracer is on only inside them, each trace holds its own active
/// step, and from the second window on Kineto's skip list no longer even calls back.
#[test]
fn roctracer_windows_turn_it_on_and_off() {
    in_child("roctracer_windows_turn_it_on_and_off", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_roctracer_in(dir.path());
        let fake = Fake::open(&lib);
        let source = RocmSource::new(config(&lib));
        let log = Log::default();
        let out = dir.path().join("traces");
        let session = Session::start(
            SessionConfig {
                activities: ActivitySet::all(),
                // wait, warm-up, active; twice.
                trigger: Trigger::Schedule(Schedule::new(1, 1, 1).unwrap().with_repeat(2)),
                log: log.log_fn(),
                ..SessionConfig::default()
            },
            vec![Box::new(source)],
            Box::new(TraceDir::new(&out)),
            None,
        )
        .unwrap();
        let mut noise_callbacks = Vec::new();
        for step in 0..6 {
            // Warm-up (steps 1, 4) turns roctracer on; the step after each active one, off.
            let on = matches!(step, 1 | 2 | 4 | 5);
            wait_until(
                "roctracer to follow the schedule",
                || (fake.stats().api_enabled == 1) == on,
                || format!("step {step}: {:?} {:?}", fake.stats(), log.lines()),
            );
            fake.kernel(&format!("k{step}"), 0, 0);
            let before = fake.stats().callbacks;
            fake.api("hipGetDevice");
            noise_callbacks.push(fake.stats().callbacks - before);
            session.step();
        }
        let written = session.stop();
        assert_eq!(written.len(), 2, "{:?}", log.lines());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let names: Vec<Vec<String>> = files
            .iter()
            .map(|f| {
                let t = load_json(f);
                x(&t, "kernel")
                    .iter()
                    .map(|k| k["name"].as_str().unwrap().to_owned())
                    .collect()
            })
            .collect();
        assert_eq!(names, [vec!["k2".to_owned()], vec!["k5".to_owned()]]);
        // Off outside windows; on in the first window (names not known yet); off per operation
        // from the second window on.
        assert_eq!(noise_callbacks, [0, 2, 2, 0, 0, 0], "{:?}", log.lines());
        assert_eq!(
            log.lines().len(),
            1,
            "one line says roctracer is used: {:?}",
            log.lines()
        );
    });
}

#[test]
fn rocprofiler_sdk_is_preferred_when_it_works() {
    in_child("rocprofiler_sdk_is_preferred_when_it_works", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let sdk = fake_rocprofiler_sdk_in(dir.path());
        let lib = fake_roctracer_in(dir.path());
        let fake = Fake::open(&lib);
        let source = RocmSource::new(RocmConfig {
            library: Some(sdk),
            ..config(&lib)
        });
        assert_eq!(source.backend(), Backend::RocprofilerSdk);
        assert_eq!(fake.stats().pools, 0, "never both in one source");
    });
}

#[test]
fn roctracer_fault_pool_fails_with_one_line() {
    in_child(
        "roctracer_fault_pool_fails_with_one_line",
        &[("FAKE_ROCT_FAIL", "roctracer_open_pool_expl")],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_roctracer_in(dir.path());
            let fake = Fake::open(&lib);
            let source = RocmSource::new(config(&lib));
            assert_eq!(source.backend(), Backend::Off);
            let (trace, log) = record(source, &fake, dir.path(), || {
                fake.kernel("k", 0, 0);
            });
            assert_eq!(log.len(), 1, "{log:?}");
            assert!(log[0].contains("no rocprofiler-sdk found"), "{log:?}");
            assert!(
                log[0].contains("roctracer_open_pool_expl failed with status -1 (fake roctracer: injected failure)"),
                "{log:?}"
            );
            assert!(x(&trace, "kernel").is_empty());
        },
    );
}

#[test]
fn roctracer_fault_enable_fails_and_the_job_goes_on() {
    in_child(
        "roctracer_fault_enable_fails_and_the_job_goes_on",
        &[("FAKE_ROCT_FAIL", "roctracer_enable_domain_callback")],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_roctracer_in(dir.path());
            let fake = Fake::open(&lib);
            let source = RocmSource::new(config(&lib));
            assert_eq!(source.backend(), Backend::Roctracer);
            let (trace, log) = record(source, &fake, dir.path(), || {
                fake.kernel("k", 0, 0);
            });
            assert!(
                log.iter()
                    .any(|l| l.contains("roctracer_enable_domain_callback failed")),
                "{log:?}"
            );
            assert!(
                x(&trace, "kernel").is_empty(),
                "activity was turned back off"
            );
            assert_eq!(fake.stats().activity_enabled, 0);
        },
    );
}

#[test]
fn roctracer_flood_is_bounded_and_counted() {
    in_child("roctracer_flood_is_bounded_and_counted", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_roctracer_in(dir.path());
        let fake = Fake::open(&lib);
        // Halves of 4 records and a queue of 8: the pool outruns the collector.
        let source = RocmSource::new(RocmConfig {
            buffer_bytes: 256,
            queue_records: 8,
            ..config(&lib)
        });
        const LAUNCHES: u64 = 400;
        let (trace, _log) = record(source, &fake, dir.path(), || {
            // One call the collector has taken: its window's start is applied, so the drops of
            // the flood fall inside the window's bounds.
            fake.api("hipDeviceSynchronize");
            wait_until(
                "the collector to take the first record",
                || kinetrace_rocm::queue_stats().is_some_and(|q| q.taken == 1),
                || format!("{:?}", kinetrace_rocm::queue_stats()),
            );
            for _ in 0..LAUNCHES {
                fake.kernel("k", 0, 0);
            }
        });
        let written = (x(&trace, "kernel").len() + x(&trace, "cuda_runtime").len()) as u64;
        let q = kinetrace_rocm::queue_stats().expect("set up");
        // Every record the callbacks produced was queued or counted, and every queued one is in
        // the trace: nothing is lost silently, and memory stays at 8 slots.
        assert!(q.refused > 0, "a flood into 8 slots must drop: {q:?}");
        assert_eq!(q.accepted + q.refused, 2 * LAUNCHES + 1, "{q:?}");
        assert_eq!(written, q.accepted, "{q:?}");
        assert_eq!(trace["dropped_events"]["rocm"].as_u64(), Some(q.refused));
    });
}
