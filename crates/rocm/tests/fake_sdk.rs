//! The ROCm backend driven through the fake librocprofiler-sdk (`tests/fakes/rocprofiler-sdk`):
//! real registration, contexts, buffers and callbacks in the real 1.x and 0.x layouts, into a real
//! session writing a real trace. Each scenario runs in its own process: the SDK's tool
//! registration, like the fake's fault configuration, is process-wide.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use kinetrace_core::activity::ActivitySet;
use kinetrace_core::schedule::Schedule;
use kinetrace_core::session::{Session, SessionConfig, Trigger};
use kinetrace_export::TraceDir;
use kinetrace_rocm::sys::Abi;
use kinetrace_rocm::{RocmConfig, RocmSource};
use kinetrace_test_support::fake::fake_rocprofiler_sdk_in;
use kinetrace_test_support::process::{in_child, wait_until};
use kinetrace_test_support::trace::{
    assert_one_flow_per_gpu_record, events, key_position, load_only_trace, only_trace_keys, x,
};
use kinetrace_test_support::{annotation, trace_session, Log};
use serde_json::Value;

/// The fake, linked under the real SONAME in `dir`.
fn fake_lib(dir: &Path) -> PathBuf {
    fake_rocprofiler_sdk_in(dir)
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FakeStats {
    records_delivered: u64,
    records_dropped: u64,
    callbacks: u64,
    contexts: u32,
    active_contexts: u32,
    configure_calls: u64,
    other_tool_records: u64,
    client_named: u32,
}

/// The fake's workload entry points, from the same (already loaded) file.
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
    fn load_kernel(&self, id: u64, name: &str) {
        let c = CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_rocp_load_kernel\0",
            unsafe extern "C" fn(u64, *const i8)
        );
        // SAFETY: the fake copies the name out during the call.
        unsafe { f(id, c.as_ptr()) }
    }
    fn kernel(&self, id: u64, gpu: u32, queue: u64) -> u64 {
        let f = sym!(
            self,
            b"fake_rocp_launch_kernel\0",
            unsafe extern "C" fn(u64, u32, u64, u32, u32, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(id, gpu, queue, 4096, 256, 5_000) }
    }
    fn kernel_on(&self, id: u64, gpu: u32, queue: u64, stream: u64) -> u64 {
        let f = sym!(
            self,
            b"fake_rocp_launch_kernel_on\0",
            unsafe extern "C" fn(u64, u32, u64, u32, u32, u64, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(id, gpu, queue, 4096, 256, 5_000, stream) }
    }
    fn memcpy(&self, bytes: u64, direction: u32, gpu: u32) -> u64 {
        let f = sym!(
            self,
            b"fake_rocp_memcpy\0",
            unsafe extern "C" fn(u64, u32, u32, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(bytes, direction, gpu, 3_000) }
    }
    fn memset(&self, fill_kernel: u64, bytes: u64, stream: u64, dispatches: u32) -> u64 {
        let f = sym!(
            self,
            b"fake_rocp_memset\0",
            unsafe extern "C" fn(u64, u64, u32, u64, u64, u32, u64) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(fill_kernel, bytes, 1, 0xa000, stream, dispatches, 2_000) }
    }
    fn roctx_push(&self, message: &str) {
        let c = CString::new(message).unwrap();
        let f = sym!(
            self,
            b"fake_rocp_roctx_push\0",
            unsafe extern "C" fn(*const i8)
        );
        // SAFETY: a NUL-terminated message, alive during the call.
        unsafe { f(c.as_ptr()) }
    }
    fn roctx_pop(&self) {
        let f = sym!(self, b"fake_rocp_roctx_pop\0", unsafe extern "C" fn());
        // SAFETY: no arguments.
        unsafe { f() }
    }
    fn memory(&self, free: bool, address: u64, bytes: u64, gpu: u32) -> u64 {
        let f = sym!(
            self,
            b"fake_rocp_memory\0",
            unsafe extern "C" fn(u32, u64, u64, u32) -> u64
        );
        // SAFETY: plain values.
        unsafe { f(u32::from(free), address, bytes, gpu) }
    }
    fn api(&self, name: &str) -> u64 {
        let c = CString::new(name).unwrap();
        let f = sym!(
            self,
            b"fake_rocp_api\0",
            unsafe extern "C" fn(*const i8) -> u64
        );
        // SAFETY: a NUL-terminated name.
        unsafe { f(c.as_ptr()) }
    }
    /// The SDK finalizes, as at exit.
    fn finalize(&self) {
        let f = sym!(self, b"fake_rocp_finalize\0", unsafe extern "C" fn());
        // SAFETY: no arguments.
        unsafe { f() }
    }
    fn stats(&self) -> FakeStats {
        let f = sym!(
            self,
            b"fake_rocp_stats\0",
            unsafe extern "C" fn(*mut FakeStats)
        );
        let mut s = FakeStats::default();
        // SAFETY: a valid out-pointer of the fake's layout.
        unsafe { f(&mut s) };
        s
    }
}

fn config(lib: &Path) -> RocmConfig {
    RocmConfig {
        library: Some(lib.to_path_buf()),
        ..RocmConfig::default()
    }
}

fn args(e: &Value) -> &Value {
    &e["args"]
}

/// The `hipStream_t` of the launch on a stream other than the null one.
const STREAM: u64 = 0x5a5a_0000;

/// The scenario of the main tests: two kernel symbols, launches inside a span and outside any, a
/// copy, a noisy call and a sync. Returns the correlation ids of the launches inside the span.
fn workload(fake: &Fake) -> Vec<u64> {
    let inside = {
        let _span = annotation("train_step");
        let ids = vec![
            fake.kernel(1, 1, 0xa000),
            fake.kernel(2, 1, 0xa000),
            fake.kernel(1, 0, 0xb000),
            fake.kernel_on(2, 0, 0xb000, STREAM),
        ];
        fake.memcpy(1 << 20, 2, 1);
        fake.memory(false, 0x7f00_0000_1000, 4096, 1);
        fake.memory(true, 0x7f00_0000_1000, 4096, 1);
        fake.api("hipGetDevice");
        ids
    };
    fake.kernel(77, 1, 0xa000); // never registered: "<unknown kernel>"
    fake.api("hipDeviceSynchronize");
    inside
}

fn scenario(version: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_lib(dir.path());
    let fake = Fake::open(&lib);
    let source = RocmSource::new(config(&lib));
    let info = source.library_info().expect("the fake loads").clone();
    let abi = if version.starts_with("0.") {
        Abi::V0
    } else {
        Abi::V1
    };
    assert_eq!(info.abi, abi);
    assert_eq!(
        format!("{}.{}.{}", info.version.0, info.version.1, info.version.2),
        version
    );
    let stats = fake.stats();
    assert_eq!(stats.configure_calls, 1);
    assert_eq!(
        stats.client_named, 1,
        "the tool names itself in the client id"
    );
    // The utility context runs from initialisation; the main one only inside windows.
    assert_eq!((stats.contexts, stats.active_contexts), (2, 1));
    // Code objects load before the first launch (here: before the window, as at import time).
    fake.load_kernel(1, "_Z4axpyPfS_f.kd");
    fake.load_kernel(2, "_Z4gemmPKfS0_Pf.kd");

    let out = dir.path().join("traces");
    let log = Log::default();
    let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
    wait_until(
        "the window to start the main context",
        || fake.stats().active_contexts == 2,
        || format!("{:?}", fake.stats()),
    );
    let inside = workload(&fake);
    let written = session.stop();
    assert_eq!(written.len(), 1);
    assert!(
        log.lines().is_empty(),
        "unexpected messages: {:?}",
        log.lines()
    );
    assert_eq!(
        fake.stats().active_contexts,
        1,
        "the main context stopped after the window"
    );

    let trace = load_only_trace(&out);
    let kernels = x(&trace, "kernel");
    // In time order: a launch is written once its dispatch names its kernel.
    let mut runtime = x(&trace, "cuda_runtime");
    runtime.sort_by(|a, b| a["ts"].as_f64().partial_cmp(&b["ts"].as_f64()).unwrap());
    let copies = x(&trace, "gpu_memcpy");
    let names: Vec<&str> = kernels
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "_Z4axpyPfS_f",
            "_Z4gemmPKfS0_Pf",
            "_Z4axpyPfS_f",
            "_Z4gemmPKfS0_Pf",
            "<unknown kernel>"
        ]
    );
    // 5 launches, 1 copy, an allocation and its free, 1 sync; hipGetDevice is noise Kineto leaves
    // out.
    let calls: Vec<&str> = runtime
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        calls,
        [
            "hipLaunchKernel",
            "hipLaunchKernel",
            "hipLaunchKernel",
            "hipLaunchKernel",
            "hipMemcpyAsync",
            "hipMalloc",
            "hipFree",
            "hipLaunchKernel",
            "hipDeviceSynchronize"
        ]
    );
    // The calls' arguments as Kineto writes them, read from the SDK's payload; the id is `cid`.
    let launch = args(runtime[0]);
    assert_eq!(launch["kernel"], "_Z4axpyPfS_f", "{launch}");
    assert_eq!(launch["stream"], "0x0");
    assert_eq!(launch["grid"], serde_json::json!([16, 1, 1]));
    assert_eq!(launch["block"], serde_json::json!([256, 1, 1]));
    assert_eq!(launch["shared memory"], 0);
    assert!(
        launch["cid"].is_u64() && launch.get("cbid").is_none(),
        "{launch}"
    );
    assert_eq!(args(runtime[1])["kernel"], "_Z4gemmPKfS0_Pf");
    assert_eq!(args(runtime[3])["stream"], format!("{STREAM:#x}"));
    assert!(
        args(runtime[7]).get("kernel").is_none(),
        "a kernel never registered has no name: {}",
        runtime[7]
    );
    let copy = args(runtime[4]);
    assert_eq!(
        (
            &copy["src"],
            &copy["dst"],
            &copy["size"],
            &copy["kind"],
            &copy["stream"]
        ),
        (
            &"0x55674ecd4180".into(),
            &"0x7fda0e810200".into(),
            &"1048576".into(),
            &"1".into(),
            &"0x0".into()
        ),
        "{copy}"
    );
    let (malloc, free) = (args(runtime[5]), args(runtime[6]));
    assert_eq!(
        (&malloc["ptr"], &malloc["size"]),
        (&"0x7f0000001000".into(), &4096.into())
    );
    assert_eq!(free["ptr"], "0x7f0000001000");
    assert!(free.get("size").is_none(), "{free}");
    assert_eq!(
        args(runtime[8]).as_object().unwrap().len(),
        2,
        "{}",
        runtime[8]
    );
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0]["name"], "Memcpy HtoD (Host -> Device)");
    assert_eq!(args(copies[0])["bytes"], 1 << 20);
    // 1.x: the agent's index among GPUs; 0.x (agents not read): GPU 1 was the first one used.
    let copy_device = if abi == Abi::V1 { 1 } else { 0 };
    assert_eq!(args(copies[0])["device"], copy_device);

    // Every GPU record carries its call's correlation id, and the call's External id.
    let span = x(&trace, "user_annotation")
        .into_iter()
        .find(|e| e["name"] == "train_step")
        .expect("the span");
    let span_id = args(span)["External id"].as_u64().expect("span id");
    for (k, corr) in kernels.iter().zip(&inside) {
        assert_eq!(args(k)["correlation"].as_u64(), Some(*corr));
        assert_eq!(args(k)["External id"].as_u64(), Some(span_id), "{k}");
        let call = runtime
            .iter()
            .find(|r| args(r)["correlation"].as_u64() == Some(*corr))
            .expect("the launching call");
        assert_eq!(args(call)["External id"].as_u64(), Some(span_id));
        // The call and its kernel are joined by an ac2g flow with the correlation id.
        let flows: Vec<&Value> = events(&trace)
            .iter()
            .filter(|e| e["cat"] == "ac2g" && e["id"].as_u64() == Some(*corr))
            .collect();
        assert_eq!(flows.len(), 2, "{flows:?}");
    }
    assert!(
        args(kernels[4]).get("External id").is_none(),
        "launched outside the span"
    );
    assert_eq!(args(copies[0])["External id"].as_u64(), Some(span_id));
    // Kineto's grid is in work-groups: 4096 work-items in groups of 256.
    assert_eq!(args(kernels[0])["grid"], serde_json::json!([16, 1, 1]));
    assert_eq!(args(kernels[0])["block"], serde_json::json!([256, 1, 1]));
    // Device: the agent's index among GPUs (1.x) or in order of first use (0.x, agents unread);
    // stream: the launch's HIP stream, the null stream 0 and others from 1 in order of first use.
    let place = |k: &Value| {
        (
            args(k)["device"].as_u64().unwrap(),
            args(k)["stream"].as_u64().unwrap(),
        )
    };
    match abi {
        Abi::V1 => {
            assert_eq!(
                [place(kernels[0]), place(kernels[2]), place(kernels[3])],
                [(1, 0), (0, 0), (0, 1)]
            );
            let devices = trace["deviceProperties"].as_array().expect("devices");
            assert_eq!(devices.len(), 2);
            // The agents are known when the window opens: the devices are in the head, as
            // Kineto writes them, and only there.
            let keys = only_trace_keys(&out);
            assert_eq!(key_position(&keys, "deviceProperties"), 1, "{keys:?}");
            assert!(key_position(&keys, "traceEvents") > 1, "{keys:?}");
            assert_eq!(devices[1]["name"], "AMD Instinct MI250X");
            assert_eq!(devices[1]["numSms"], 104);
            assert_eq!(devices[1]["warpSize"], 64);
        }
        Abi::V0 => {
            assert_eq!(
                [place(kernels[0]), place(kernels[2]), place(kernels[3])],
                [(0, 0), (1, 0), (1, 1)]
            );
        }
    }
    // GPU time sits inside the call that launched it, in the Unix domain the host clock uses.
    for (k, corr) in kernels.iter().zip(&inside) {
        let call = runtime
            .iter()
            .find(|r| args(r)["correlation"].as_u64() == Some(*corr))
            .unwrap();
        let (ks, cs) = (k["ts"].as_f64().unwrap(), call["ts"].as_f64().unwrap());
        let ce = cs + call["dur"].as_f64().unwrap();
        assert!(
            ks >= cs && ks <= ce + 1.0,
            "kernel at {ks}, call {cs}..{ce}"
        );
    }
    // Allocations (1.x): `[memory]` instants on the allocating thread, linked to the span.
    let memory: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["name"] == "[memory]")
        .collect();
    match abi {
        Abi::V1 => {
            assert_eq!(memory.len(), 2, "{memory:?}");
            assert_eq!(args(memory[0])["Bytes"], 4096);
            assert_eq!(args(memory[1])["Bytes"], -4096);
            assert_eq!(args(memory[0])["Addr"], 0x7f00_0000_1000u64);
            assert_eq!(args(memory[0])["Device Id"], 1);
            assert_eq!(memory[0]["tid"], runtime[0]["tid"]);
            assert_eq!(trace["rocprofiler_sdk_memory_allocation"], "on");
        }
        Abi::V0 => {
            assert!(memory.is_empty(), "{memory:?}");
            assert_eq!(
                trace["rocprofiler_sdk_memory_allocation"],
                "off: not read on this SDK version"
            );
        }
    }
    assert_eq!(trace["rocprofiler_sdk_version"], version);
    assert_eq!(trace["rocprofiler_sdk_found"], "named explicitly");
    // Each kernel and the copy: exactly one flow from its call.
    assert_eq!(
        assert_one_flow_per_gpu_record(&trace),
        kernels.len() + copies.len()
    );
    trace
}

#[test]
fn abi_1x_kernels_copies_and_calls_with_names_and_links() {
    in_child(
        "abi_1x_kernels_copies_and_calls_with_names_and_links",
        &[],
        || {
            scenario("1.1.0");
        },
    );
}

#[test]
fn abi_1_0_agents_with_the_smaller_struct() {
    in_child(
        "abi_1_0_agents_with_the_smaller_struct",
        &[("FAKE_ROCP_VERSION", "1.0.2")],
        || {
            scenario("1.0.2");
        },
    );
}

#[test]
fn abi_0x_layouts() {
    in_child("abi_0x_layouts", &[("FAKE_ROCP_VERSION", "0.6.0")], || {
        scenario("0.6.0");
    });
}

#[test]
fn kinds_and_operations_are_resolved_by_name() {
    in_child(
        "kinds_and_operations_are_resolved_by_name",
        &[("FAKE_ROCP_RENUMBER", "1")],
        || {
            scenario("1.1.0");
        },
    );
}

/// ROCclr carries out a `hipMemset*` as dispatches of its fill kernels: those become
/// `gpu_memset` events with the call's bytes (once per call), on the call's stream, linked to it;
/// other kernels stay kernels.
fn memsets_scenario() -> Value {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_lib(dir.path());
    let fake = Fake::open(&lib);
    let source = RocmSource::new(config(&lib));
    fake.load_kernel(1, "_Z4axpyPfS_f.kd");
    fake.load_kernel(9, "__amd_rocclr_fillBufferAligned.kd");
    let out = dir.path().join("traces");
    let log = Log::default();
    let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
    wait_until(
        "the window to start the main context",
        || fake.stats().active_contexts == 2,
        || format!("{:?}", fake.stats()),
    );
    let (one, split) = {
        let _span = annotation("zero_grad");
        let one = fake.memset(9, 4096, STREAM, 1);
        // An unaligned size: ROCclr splits it into several fill dispatches.
        let split = fake.memset(9, 1_000_003, 0, 3);
        fake.kernel(1, 1, 0xa000);
        (one, split)
    };
    assert_eq!(session.stop().len(), 1);
    let trace = load_only_trace(&out);
    let sets = x(&trace, "gpu_memset");
    let kernels = x(&trace, "kernel");
    assert_eq!(
        kernels.len(),
        1,
        "only the axpy dispatch is a kernel: {kernels:?}"
    );
    assert_eq!(kernels[0]["name"], "_Z4axpyPfS_f");
    assert_eq!(sets.len(), 4, "one event per fill dispatch: {sets:?}");
    let of = |c: u64| -> Vec<&Value> {
        sets.iter()
            .copied()
            .filter(|e| args(e)["correlation"] == c)
            .collect()
    };
    let one_sets = of(one);
    assert_eq!(one_sets.len(), 1);
    assert_eq!(args(one_sets[0])["bytes"], 4096);
    let split_sets = of(split);
    assert_eq!(split_sets.len(), 3);
    let bytes: u64 = split_sets
        .iter()
        .map(|e| args(e)["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(bytes, 1_000_003, "the call's bytes are counted once");
    // Each links to its call and the span around the call, on the call's GPU and stream rows.
    let calls = x(&trace, "cuda_runtime");
    let call = |c: u64| {
        calls
            .iter()
            .find(|e| args(e)["correlation"] == c)
            .unwrap_or_else(|| panic!("no call {c}: {calls:?}"))
    };
    assert_eq!(call(one)["name"], "hipMemsetAsync");
    for e in &sets {
        assert!(args(e)["External id"].as_u64().is_some(), "{e}");
        assert_eq!(
            args(e)["External id"],
            args(call(args(e)["correlation"].as_u64().unwrap()))["External id"]
        );
        // GPU 1 of the fake, like the kernel's.
        assert_eq!(args(e)["device"], args(kernels[0])["device"]);
    }
    assert_ne!(args(one_sets[0])["stream"], args(split_sets[0])["stream"]);
    assert_eq!(args(split_sets[0])["stream"], 0, "the null stream's row");
    // Kineto draws a flow from a memset call to its GPU work, as from a launch: every fill
    // dispatch and the kernel end exactly one flow that starts on its call.
    assert_eq!(assert_one_flow_per_gpu_record(&trace), sets.len() + 1);
    trace
}

#[test]
fn memsets_become_gpu_memset() {
    in_child(
        "memsets_become_gpu_memset",
        &[
            ("ROCR_VISIBLE_DEVICES", "0,1"),
            ("HIP_VISIBLE_DEVICES", "1"),
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("GPU_DEVICE_ORDINAL", "1"),
        ],
        || {
            let trace = memsets_scenario();
            // Said in the trace: device numbers there are the SDK's GPU agents, not HIP's.
            assert_eq!(
                trace["rocm_visible_devices"],
                "ROCR_VISIBLE_DEVICES=0,1 HIP_VISIBLE_DEVICES=1 CUDA_VISIBLE_DEVICES=1 GPU_DEVICE_ORDINAL=1"
            );
            assert_eq!(trace["rocm_queue_records"], "65536");
        },
    );
}

#[test]
fn memsets_become_gpu_memset_abi_0x() {
    in_child(
        "memsets_become_gpu_memset_abi_0x",
        &[("FAKE_ROCP_VERSION", "0.6.0")],
        || {
            memsets_scenario();
        },
    );
}

/// What the marker hooks saw: `+message` per push, `-` per pop.
static MARKERS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn markers_scenario() {
    kinetrace_rocm::on_marker(
        |m| {
            MARKERS
                .lock()
                .unwrap()
                .push(format!("+{}", m.to_string_lossy()))
        },
        || MARKERS.lock().unwrap().push("-".into()),
    );
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_lib(dir.path());
    let fake = Fake::open(&lib);
    let _source = RocmSource::new(config(&lib));
    // Outside any window too: roctx ranges can mark steps.
    fake.roctx_push("ProfilerStep#1");
    fake.roctx_push("aten::linear");
    fake.roctx_pop();
    fake.roctx_pop();
    assert_eq!(
        *MARKERS.lock().unwrap(),
        ["+ProfilerStep#1", "+aten::linear", "-", "-"]
    );
}

#[test]
fn roctx_ranges_reach_the_marker_hooks() {
    in_child("roctx_ranges_reach_the_marker_hooks", &[], markers_scenario);
}

#[test]
fn roctx_ranges_reach_the_marker_hooks_abi_0x() {
    in_child(
        "roctx_ranges_reach_the_marker_hooks_abi_0x",
        &[("FAKE_ROCP_VERSION", "0.6.0")],
        markers_scenario,
    );
}

#[test]
fn nothing_is_recorded_outside_the_window() {
    in_child("nothing_is_recorded_outside_the_window", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_lib(dir.path());
        let fake = Fake::open(&lib);
        let source = RocmSource::new(config(&lib));
        // Code objects load after registration (the SDK registers tools before HIP starts).
        fake.load_kernel(1, "before.kd");
        fake.load_kernel(2, "inside.kd");
        fake.load_kernel(3, "after.kd");
        let log = Log::default();
        let out = dir.path().join("traces");
        let config = SessionConfig {
            activities: ActivitySet::all(),
            trigger: Trigger::Schedule(Schedule::new(1, 1, 1).unwrap()),
            log: log.log_fn(),
            ..SessionConfig::default()
        };
        let session = Session::start(
            config,
            vec![Box::new(source)],
            Box::new(TraceDir::new(&out)),
            None,
        )
        .unwrap();
        // Step 0 waits: the main context stays stopped, so the SDK records nothing at all.
        let before = fake.stats();
        fake.kernel(1, 0, 0xa);
        assert_eq!(fake.stats().active_contexts, 1);
        assert_eq!(
            fake.stats().callbacks,
            before.callbacks,
            "no API callback while stopped"
        );
        session.step();
        // Warm-up then active: the context runs.
        wait_until(
            "warm-up to start the main context",
            || fake.stats().active_contexts == 2,
            || format!("{:?}", fake.stats()),
        );
        session.step();
        fake.kernel(2, 0, 0xa);
        session.step();
        wait_until(
            "the window's end to stop the main context",
            || fake.stats().active_contexts == 1,
            || format!("{:?}", fake.stats()),
        );
        let calls = fake.stats().callbacks;
        fake.kernel(3, 0, 0xa);
        assert_eq!(
            fake.stats().callbacks,
            calls,
            "no API callback after the window"
        );
        let written = session.stop();
        assert_eq!(written.len(), 1);
        let trace = load_only_trace(&out);
        let names: Vec<&str> = x(&trace, "kernel")
            .iter()
            .map(|k| k["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["inside"]);
        assert_eq!(x(&trace, "cuda_runtime").len(), 1);
        assert!(log.lines().is_empty(), "{:?}", log.lines());
    });
}

/// Runs a small workload through a session with the fake's faults from the environment; returns
/// the trace, the log's lines and the fake's counters. The job must survive whatever happens.
fn survives(cfg: impl FnOnce(&mut RocmConfig), launches: u32) -> (Value, Vec<String>, FakeStats) {
    survives_after(cfg, |_| {}, launches)
}

/// [`survives`], running `first` on the fake once the window is open.
fn survives_after(
    cfg: impl FnOnce(&mut RocmConfig),
    first: impl FnOnce(&Fake),
    launches: u32,
) -> (Value, Vec<String>, FakeStats) {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_lib(dir.path());
    let fake = Fake::open(&lib);
    let mut c = config(&lib);
    cfg(&mut c);
    let source = RocmSource::new(c);
    fake.load_kernel(1, "k.kd");
    let live = source.is_live();
    let idle = fake.stats().active_contexts;
    let out = dir.path().join("traces");
    let log = Log::default();
    let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
    if live {
        // Enable runs on the collector; a source that failed to enable has logged by then.
        wait_until(
            "the window to start (or fail to start) the main context",
            || fake.stats().active_contexts == idle + 1 || !log.lines().is_empty(),
            || format!("{:?} {:?}", fake.stats(), log.lines()),
        );
    }
    first(&fake);
    {
        let _s = annotation("work");
        for _ in 0..launches {
            fake.kernel(1, 0, 0xa);
        }
    }
    let written = session.stop();
    assert_eq!(
        written.len(),
        1,
        "a trace is written whatever the backend did"
    );
    (load_only_trace(&out), log.lines(), fake.stats())
}

fn one_line(log: &[String], needle: &str) {
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].contains(needle), "{log:?}");
}

#[test]
fn fault_dropped_records_are_counted() {
    in_child(
        "fault_dropped_records_are_counted",
        &[("FAKE_ROCP_DROP_EVERY", "3")],
        || {
            let (trace, log, stats) = survives(|_| {}, 30);
            assert!(stats.records_dropped > 0);
            assert_eq!(x(&trace, "kernel").len() as u64 + stats.records_dropped, 30);
            assert_eq!(
                trace["dropped_events"]["rocm"].as_u64(),
                Some(stats.records_dropped)
            );
            assert!(log.iter().all(|l| !l.contains("panic")), "{log:?}");
        },
    );
}

/// Work still running when the window ends: the SDK writes its records after the window's last
/// flush, as the context stops. They are the window's (flushed after the stop, as Kineto does),
/// not lost.
#[test]
fn records_written_as_the_context_stops_are_in_the_window() {
    in_child(
        "records_written_as_the_context_stops_are_in_the_window",
        &[("FAKE_ROCP_COMPLETE_AT_STOP", "1")],
        || {
            let (trace, log, stats) = survives(|_| {}, 7);
            assert_eq!(stats.records_delivered, 7, "{stats:?}");
            assert_eq!(x(&trace, "kernel").len(), 7, "{log:?}");
            assert_eq!(trace["dropped_events"]["rocm"], 0, "{trace}");
            let queue = kinetrace_rocm::queue_stats().unwrap();
            assert_eq!(queue.accepted, queue.taken, "{queue:?}");
            assert!(log.is_empty(), "{log:?}");
        },
    );
}

/// The SDK finalizes while a window is open, as it does at a normal exit before kinetrace's own
/// exit handler saves the capture: it stops the contexts and calls the tool's `finalize`, which
/// takes what the buffer holds; from then on the SDK refuses every flush. The window's trace has
/// every dispatch, copy and fill, and nothing asks the SDK for what it would refuse (no line). A
/// later window records the CPU side and says once why there is no GPU work.
#[test]
fn the_sdk_finalizing_mid_window_loses_nothing_and_says_nothing() {
    in_child(
        "the_sdk_finalizing_mid_window_loses_nothing_and_says_nothing",
        &[],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_lib(dir.path());
            let fake = Fake::open(&lib);
            let source = RocmSource::new(config(&lib));
            fake.load_kernel(1, "_Z4axpyPfS_f.kd");
            fake.load_kernel(9, "__amd_rocclr_fillBufferAligned.kd");
            let out = dir.path().join("traces");
            let log = Log::default();
            let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
            wait_until(
                "the window to start the main context",
                || fake.stats().active_contexts == 2,
                || format!("{:?}", fake.stats()),
            );
            {
                let _s = annotation("step");
                for _ in 0..3 {
                    fake.kernel(1, 0, 0xa000);
                }
                fake.memcpy(4096, 2, 0);
                fake.memset(9, 1_000_003, 0, 2);
            }
            // Below the watermark: every record is still in the SDK's buffer.
            assert_eq!(fake.stats().records_delivered, 0);
            fake.finalize();
            assert_eq!(
                fake.stats().active_contexts,
                0,
                "the SDK stopped every context"
            );
            assert_eq!(session.stop().len(), 1);
            assert!(log.lines().is_empty(), "{:?}", log.lines());
            let trace = load_only_trace(&out);
            assert_eq!(x(&trace, "kernel").len(), 3);
            assert_eq!(x(&trace, "gpu_memcpy").len(), 1);
            assert_eq!(x(&trace, "gpu_memset").len(), 2);
            assert_eq!(x(&trace, "cuda_runtime").len(), 5);
            assert_eq!(assert_one_flow_per_gpu_record(&trace), 6);
            assert_eq!(trace["dropped_events"]["rocm"], 0);

            // A window after the SDK finalized: CPU work only, and one line saying why.
            let out = dir.path().join("later");
            let session = trace_session(
                vec![Box::new(RocmSource::new(config(&lib)))],
                ActivitySet::all(),
                &out,
                &log,
            );
            {
                let _s = annotation("after");
                fake.kernel(1, 0, 0xa000);
            }
            assert_eq!(session.stop().len(), 1);
            one_line(&log.lines(), "rocprofiler-sdk has finalized");
            let trace = load_only_trace(&out);
            assert_eq!(x(&trace, "kernel").len(), 0);
            assert_eq!(x(&trace, "user_annotation").len(), 1);
        },
    );
}

#[test]
fn flood_is_bounded_and_counted() {
    in_child("flood_is_bounded_and_counted", &[], || {
        // A queue of 8 records and a buffer handed over every record: the callbacks outrun the
        // collector, the queue refuses, and every refused record is counted.
        let (trace, _log, _stats) = survives_after(
            |c| {
                c.queue_records = 8;
                c.buffer_bytes = 4096;
                c.watermark = 1;
            },
            |fake| {
                // One call the collector has taken: its window's start is applied, so the drops
                // of the flood fall inside the window's bounds.
                fake.api("hipDeviceSynchronize");
                wait_until(
                    "the collector to take the first record",
                    || kinetrace_rocm::queue_stats().is_some_and(|q| q.taken == 1),
                    || format!("{:?}", kinetrace_rocm::queue_stats()),
                );
            },
            2_000,
        );
        let written = (x(&trace, "kernel").len() + x(&trace, "cuda_runtime").len()) as u64;
        let q = kinetrace_rocm::queue_stats().expect("registered");
        // Every record the callbacks produced was queued or counted, and every queued one is in
        // the trace: nothing is lost silently, and memory stays at 8 slots.
        assert!(q.refused > 0, "a flood into 8 slots must drop: {q:?}");
        assert_eq!(q.accepted + q.refused, 4_001, "{q:?}");
        assert_eq!(written, q.accepted, "{q:?}");
        assert_eq!(trace["dropped_events"]["rocm"].as_u64(), Some(q.refused));
    });
}

#[test]
fn fault_start_context_fails() {
    in_child(
        "fault_start_context_fails",
        &[("FAKE_ROCP_FAIL", "rocprofiler_start_context")],
        || {
            // The utility context cannot start either: initialisation fails, said once.
            let (trace, log, _) = survives(|_| {}, 3);
            assert_eq!(x(&trace, "kernel").len(), 0);
            assert_eq!(
                x(&trace, "user_annotation").len(),
                1,
                "CPU events still recorded"
            );
            one_line(
                &log,
                "rocprofiler_start_context failed with status 1 (General error)",
            );
        },
    );
}

#[test]
fn fault_create_buffer_fails() {
    in_child(
        "fault_create_buffer_fails",
        &[("FAKE_ROCP_FAIL", "rocprofiler_create_buffer")],
        || {
            let (trace, log, _) = survives(|_| {}, 3);
            assert_eq!(x(&trace, "kernel").len(), 0);
            one_line(&log, "setting up tracing in");
            assert!(
                log[0].contains("rocprofiler_create_buffer failed"),
                "{log:?}"
            );
        },
    );
}

#[test]
fn fault_flush_fails() {
    in_child(
        "fault_flush_fails",
        &[("FAKE_ROCP_FAIL", "rocprofiler_flush_buffer")],
        || {
            let (trace, log, _) = survives(|c| c.watermark = 1, 5);
            // Every record was handed over at its watermark, so nothing is lost; the failing
            // flush is said, not fatal.
            assert_eq!(x(&trace, "kernel").len(), 5);
            assert!(!log.is_empty());
            assert!(
                log.iter()
                    .all(|l| l.contains("rocprofiler_flush_buffer failed")),
                "{log:?}"
            );
        },
    );
}

#[test]
fn fault_registered_too_late() {
    in_child(
        "fault_registered_too_late",
        &[("FAKE_ROCP_ALREADY_INITIALIZED", "1")],
        || {
            let (trace, log, stats) = survives(|_| {}, 3);
            assert_eq!(stats.configure_calls, 0);
            assert_eq!(x(&trace, "kernel").len(), 0);
            one_line(&log, "registered too late");
            assert!(log[0].contains("ROCP_TOOL_LIBRARIES"), "{log:?}");
        },
    );
}

#[test]
fn fault_version_too_old() {
    in_child(
        "fault_version_too_old",
        &[("FAKE_ROCP_VERSION", "0.3.0")],
        || {
            let (_, log, stats) = survives(|_| {}, 1);
            assert_eq!(
                stats.configure_calls, 0,
                "nothing is registered with an unknown ABI"
            );
            one_line(&log, "is rocprofiler-sdk 0.3.0; kinetrace reads 0.4 – 1.x");
        },
    );
}

#[test]
fn fault_not_a_rocprofiler_sdk() {
    in_child("fault_not_a_rocprofiler_sdk", &[], || {
        // libm opens, but lacks every SDK symbol: the first required one is named.
        let source = RocmSource::new(RocmConfig {
            library: Some("libm.so.6".into()),
            ..RocmConfig::default()
        });
        let e = source.library_info().unwrap_err().to_string();
        assert!(
            e.contains("libm.so.6 lacks the required symbol rocprofiler_get_version"),
            "{e}"
        );
        let missing = RocmSource::new(RocmConfig {
            library: Some("/nonexistent/librocprofiler-sdk.so.1".into()),
            ..RocmConfig::default()
        });
        let e = missing.library_info().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/librocprofiler-sdk.so.1"), "{e}");
    });
}

#[test]
fn beside_another_tool() {
    in_child(
        "beside_another_tool",
        &[("FAKE_ROCP_OTHER_TOOL", "1")],
        || {
            // Kineto registered first and traces dispatches into its own buffer: kinetrace records
            // its window and leaves the other tool's stream whole, before, during and after it.
            let (trace, log, stats) = survives(|_| {}, 4);
            assert!(log.is_empty(), "{log:?}");
            assert_eq!(x(&trace, "kernel").len(), 4);
            assert_eq!(stats.other_tool_records, 4, "{stats:?}");
        },
    );
}

#[test]
fn dropping_the_source_stops_its_context() {
    in_child("dropping_the_source_stops_its_context", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_lib(dir.path());
        let fake = Fake::open(&lib);
        let mut source = RocmSource::new(config(&lib));
        use kinetrace_core::source::ActivitySource;
        source.enable(ActivitySet::all()).unwrap();
        assert!(source.is_active());
        source.enable(ActivitySet::all()).unwrap(); // harmless while on
        assert_eq!(fake.stats().active_contexts, 2);
        drop(source);
        assert_eq!(fake.stats().active_contexts, 1);
        // A process registers once: a second source reuses the registration.
        let again = RocmSource::new(config(&lib));
        assert!(again.is_live(), "{:?}", again.library_info().err());
        assert_eq!(fake.stats().configure_calls, 1);
    });
}

/// Kineto's ROCm 6.2 trace (`<repo>/../shared/traces/amd_trace`), or `None` (after a skip line)
/// when it is absent and `KINETRACE_ALLOW_MISSING_TRACES=1`; panics when it is absent otherwise.
fn kineto_rocm_trace() -> Option<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/amd_trace");
    let file = dir.join("mi250_minitoy_train_ROCm6_2_kineto.json.gz");
    if file.is_file() {
        return Some(kinetrace_test_support::trace::load_json(&file));
    }
    if std::env::var("KINETRACE_ALLOW_MISSING_TRACES").as_deref() == Ok("1") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {} is absent and KINETRACE_ALLOW_MISSING_TRACES=1",
            file.display()
        );
        return None;
    }
    panic!(
        "the reference trace is missing: expected {} (<repo>/../shared/traces). Set KINETRACE_ALLOW_MISSING_TRACES=1 to skip the tests that need it.",
        file.display()
    );
}

/// The `args` keys events of category `cat` carry, over the whole trace.
fn arg_keys(trace: &Value, cat: &str) -> std::collections::BTreeSet<String> {
    x(trace, cat)
        .iter()
        .filter_map(|e| e["args"].as_object())
        .flat_map(|o| o.keys().cloned())
        .collect()
}

fn set(keys: &[&str]) -> std::collections::BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// The conventions both traces follow: GPU events sit on (pid = device, tid = stream); every
/// launching call has an `ac2g` start on its own row at its own time, with its correlation id as
/// the flow id, finished (`bp: e`) on each GPU event it launched; a call that launches nothing gets
/// a flow end on its own row.
fn check_conventions(trace: &Value, who: &str) {
    let runtime = x(trace, "cuda_runtime");
    let gpu: Vec<&Value> = x(trace, "kernel")
        .into_iter()
        .chain(x(trace, "gpu_memcpy"))
        .chain(x(trace, "gpu_memset"))
        .collect();
    assert!(!runtime.is_empty() && !gpu.is_empty(), "{who}");
    let flows: Vec<&Value> = events(trace)
        .iter()
        .filter(|e| e["cat"] == "ac2g")
        .collect();
    for g in &gpu {
        assert_eq!(g["pid"], args(g)["device"], "{who}: {g}");
        assert_eq!(g["tid"], args(g)["stream"], "{who}: {g}");
        let corr = args(g)["correlation"].as_u64().unwrap();
        let call = runtime
            .iter()
            .find(|r| args(r)["correlation"].as_u64() == Some(corr))
            .unwrap_or_else(|| panic!("{who}: no call for {g}"));
        let start = flows
            .iter()
            .find(|f| f["ph"] == "s" && f["id"].as_u64() == Some(corr))
            .unwrap_or_else(|| panic!("{who}: no flow start for {g}"));
        assert_eq!(
            (&start["pid"], &start["tid"], &start["ts"]),
            (&call["pid"], &call["tid"], &call["ts"]),
            "{who}"
        );
        let end = flows
            .iter()
            .find(|f| f["ph"] == "f" && f["id"].as_u64() == Some(corr) && f["pid"] == g["pid"])
            .unwrap_or_else(|| panic!("{who}: no flow end for {g}"));
        assert_eq!(
            (&end["bp"], &end["tid"], &end["ts"]),
            (&"e".into(), &g["tid"], &g["ts"]),
            "{who}"
        );
    }
    // The flow list: a call in it starts a flow on its own row; any other call ends one there.
    // (kinetrace's list is Kineto's plus the memset, copy and launch variants Kineto's ROCm list
    // lacks; its trace has none of those.)
    for r in &runtime {
        let corr = args(r)["correlation"].as_u64().unwrap();
        let starts = kinetrace_rocm::decode::starts_flow(r["name"].as_str().unwrap());
        let own = |ph: &str| {
            flows.iter().any(|f| {
                f["ph"] == ph
                    && f["id"].as_u64() == Some(corr)
                    && f["pid"] == r["pid"]
                    && f["tid"] == r["tid"]
            })
        };
        assert_eq!((own("s"), own("f")), (starts, !starts), "{who}: {r}");
    }
}

/// The differences from Kineto's ROCm trace that `docs/rocm-support.md` lists, checked here so
/// the list stays true.
#[test]
fn trace_shape_matches_kinetos_rocm_trace() {
    in_child("trace_shape_matches_kinetos_rocm_trace", &[], || {
        let Some(kineto) = kineto_rocm_trace() else {
            return;
        };
        let ours = scenario("1.1.0");
        check_conventions(&kineto, "Kineto");
        check_conventions(&ours, "kinetrace");
        let diff = |cat: &str| {
            let (o, k) = (arg_keys(&ours, cat), arg_keys(&kineto, cat));
            (
                o.difference(&k)
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>(),
                k.difference(&o)
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>(),
            )
        };
        // (only in ours, only in Kineto's)
        // Kineto's trace has no allocation call: it would write `ptr` too.
        assert_eq!(diff("cuda_runtime"), (set(&["ptr"]), set(&[])));
        // The same forms: addresses, copy sizes and kinds as strings, dims as arrays.
        let kineto_runtime = x(&kineto, "cuda_runtime");
        let ours_runtime = x(&ours, "cuda_runtime");
        for key in [
            "stream",
            "src",
            "dst",
            "size",
            "kind",
            "kernel",
            "grid",
            "block",
            "shared memory",
            "cid",
        ] {
            let kind_of = |events: &[&Value]| {
                events
                    .iter()
                    .find_map(|e| e["args"].get(key))
                    .map(|v| match v {
                        Value::String(s) if s.starts_with("0x") => "address",
                        Value::String(_) => "string",
                        Value::Number(_) => "number",
                        Value::Array(_) => "array",
                        _ => "other",
                    })
            };
            assert_eq!(kind_of(&ours_runtime), kind_of(&kineto_runtime), "{key}");
        }
        assert_eq!(
            diff("kernel"),
            (set(&["block", "grid", "shared memory"]), set(&[]))
        );
        assert_eq!(
            diff("gpu_memcpy"),
            (set(&["bytes", "memory bandwidth (GB/s)"]), set(&[]))
        );
        // The operation kinds as Kineto spells them.
        for t in [&kineto, &ours] {
            assert!(x(t, "kernel")
                .iter()
                .all(|e| e["args"]["kind"] == "Dispatch Kernel"));
            assert!(x(t, "gpu_memcpy")
                .iter()
                .all(|e| e["args"]["kind"] == "HtoD"));
        }
        // The copy names are Kineto's.
        for t in [&kineto, &ours] {
            assert!(x(t, "gpu_memcpy")
                .iter()
                .all(|e| e["name"] == "Memcpy HtoD (Host -> Device)"));
        }
        // Every top-level key Kineto writes but `record_shapes` (a PyTorch setting).
        for k in kineto.as_object().unwrap().keys() {
            assert!(
                k == "record_shapes" || ours.get(k).is_some(),
                "kinetrace lacks the top-level key {k}"
            );
        }
        for key in [
            "id",
            "name",
            "totalGlobalMem",
            "computeMajor",
            "computeMinor",
            "warpSize",
            "numSms",
        ] {
            assert!(
                ours["deviceProperties"][0].get(key).is_some()
                    && kineto["deviceProperties"][0].get(key).is_some(),
                "{key}"
            );
        }
    });
}

/// The SDK found kinetrace's `rocprofiler_configure` itself when HIP initialised (as it does for
/// a preloaded shim or `ROCP_TOOL_LIBRARIES`): a copy of the fake already loaded in the process.
fn sdk_loaded_by_the_job(dir: &Path) -> (Fake, u32) {
    let lib = dir.join("librocprofiler-sdk.so.1");
    std::fs::copy(kinetrace_test_support::fake::fake_rocprofiler_sdk(), &lib).unwrap();
    let fake = Fake::open(&lib);
    let init = sym!(
        fake,
        b"fake_rocp_runtime_init\0",
        unsafe extern "C" fn(Option<kinetrace_rocm::sys::ConfigureFn>) -> u32
    );
    // SAFETY: `tool_configure` is kinetrace's configure function, passed as a tool the SDK found.
    let tools = unsafe { init(Some(kinetrace_rocm::tool_configure)) };
    (fake, tools)
}

#[test]
fn registered_by_the_sdk_when_hip_initialises() {
    in_child("registered_by_the_sdk_when_hip_initialises", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let (fake, tools) = sdk_loaded_by_the_job(dir.path());
        assert_eq!(tools, 1);
        let stats = fake.stats();
        assert_eq!((stats.configure_calls, stats.client_named), (1, 1));
        assert_eq!((stats.contexts, stats.active_contexts), (2, 1));
        fake.load_kernel(1, "_Z6kernelv.kd");
        // The profiler starts later (at a step): its source uses that registration, and finds the
        // library the job loaded without being told where it is.
        let source = RocmSource::new(RocmConfig::default());
        let info = source.library_info().expect("live").clone();
        assert_eq!(info.origin, kinetrace_rocm::loader::Origin::Loaded);
        assert_eq!(fake.stats().configure_calls, 1, "registered once");
        let out = dir.path().join("traces");
        let log = Log::default();
        let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
        {
            let _s = annotation("step");
            fake.kernel(1, 0, 0xa);
        }
        session.stop();
        assert!(log.lines().is_empty(), "{:?}", log.lines());
        let trace = load_only_trace(&out);
        let k = x(&trace, "kernel");
        assert_eq!(k.len(), 1);
        assert_eq!(k[0]["name"], "_Z6kernelv");
        assert!(args(k[0])["External id"].as_u64().is_some());
    });
}

#[test]
fn registered_by_the_sdk_with_an_unknown_version() {
    in_child(
        "registered_by_the_sdk_with_an_unknown_version",
        &[("FAKE_ROCP_VERSION", "2.0.0")],
        || {
            let dir = tempfile::tempdir().unwrap();
            let (fake, tools) = sdk_loaded_by_the_job(dir.path());
            assert_eq!(tools, 1);
            // kinetrace opted out (configure returned null): nothing was set up in the SDK...
            assert_eq!(fake.stats().contexts, 0);
            // ...and the source says why, once, instead of "registered too late".
            let source = RocmSource::new(RocmConfig::default());
            let e = source.library_info().unwrap_err().to_string();
            assert!(e.contains("is rocprofiler-sdk 2.0.0"), "{e}");
        },
    );
}
