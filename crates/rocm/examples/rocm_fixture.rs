//! A ROCm trace written through the real ROCm backend from the fake rocprofiler-sdk
//! (`tests/fakes/rocprofiler-sdk`, SDK 1.1 layouts), for the compatibility test
//! `tests/compat/test_hta_rocm.py` (HolisticTraceAnalysis 0.5.0 loads it).
//!
//! Run: `cargo run --release -p kinetrace-rocm --example rocm_fixture -- OUTPUT_DIR`
//!
//! # The construction
//!
//! Four steps `ProfilerStep#1..#4` (user annotations). In each, on GPU 0, the calls come first and
//! the GPU runs their work at set times from `t`, 100 ms after the step's start (the fake's
//! one-shot GPU start, so the timeline is exact); the step ends after t+400 µs:
//!
//! | call | GPU record | stream (HSA queue) | runs |
//! |---|---|---|---|
//! | `hipLaunchKernel` | `_Z4gemmPKfS0_Pf` | null (0xa000) | t+100 µs – t+150 µs |
//! | `hipLaunchKernel` | `_Z4axpyPfS_f` | null (0xa000) | t+150 µs – t+180 µs |
//! | `hipLaunchKernel` | RCCL's `ncclDevKernel_Generic(…)` | 2nd stream (0xb000) | t+160 µs – t+200 µs |
//! | `hipMemcpyAsync` 1 MiB host → device | the copy | null | t+200 µs – t+203 µs |
//!
//! HTA keeps steps #1–#3 (it drops the last `ProfilerStep`), so its kernel breakdown has the
//! gemm 3 times (sum 150 µs, mean 50), the axpy 3 times (90 µs, mean 30), the all-reduce 3 times
//! as `COMMUNICATION` (120 µs, mean 40) and the copy 3 times as `MEMORY` (9 µs, mean 3); half of
//! each all-reduce (t+160 – t+180) runs under computation, so the comm/comp overlap is 50 %.

use std::ffi::{c_char, CString};
use std::path::PathBuf;

use kinetrace_core::activity::ActivitySet;
use kinetrace_rocm::{RocmConfig, RocmSource};
use kinetrace_test_support::fake::fake_rocprofiler_sdk_in;
use kinetrace_test_support::{annotation, trace_session, Log};

type Load = unsafe extern "C" fn(u64, *const c_char);
type Launch = unsafe extern "C" fn(u64, u32, u64, u32, u32, u64) -> u64;
type Copy = unsafe extern "C" fn(u64, u32, u32, u64) -> u64;
type Api = unsafe extern "C" fn(*const c_char) -> u64;
type LaunchOn = unsafe extern "C" fn(u64, u32, u64, u32, u32, u64, u64) -> u64;
type Now = extern "C" fn() -> u64;
type At = extern "C" fn(u64);

/// The RCCL kernel of the construction (HTA calls a kernel with `nccl` in its name communication).
const ALLREDUCE: &str = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)";
/// How far after a step's start its GPU work begins.
const LEAD_NS: u64 = 100_000_000;
/// The all-reduce's HIP stream.
const COMM_STREAM: u64 = 0x5555_0000_2000;

fn main() {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .expect("usage: rocm_fixture OUTPUT_DIR"),
    );
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let lib = fake_rocprofiler_sdk_in(tmp.path());
    // SAFETY: (fixture) the fake SDK's initialisers do nothing.
    let sdk = unsafe { libloading::Library::new(&lib) }.expect("the fake SDK loads");
    // SAFETY: (fixture) the fake's entry points with their signatures.
    let (load, launch, copy, api) = unsafe {
        (
            *sdk.get::<Load>(b"fake_rocp_load_kernel\0").unwrap(),
            *sdk.get::<Launch>(b"fake_rocp_launch_kernel\0").unwrap(),
            *sdk.get::<Copy>(b"fake_rocp_memcpy\0").unwrap(),
            *sdk.get::<Api>(b"fake_rocp_api\0").unwrap(),
        )
    };
    // SAFETY: (fixture) as above.
    let (launch_on, now, at) = unsafe {
        (
            *sdk.get::<LaunchOn>(b"fake_rocp_launch_kernel_on\0")
                .unwrap(),
            *sdk.get::<Now>(b"fake_rocp_now\0").unwrap(),
            *sdk.get::<At>(b"fake_rocp_next_gpu_start\0").unwrap(),
        )
    };
    let source = RocmSource::new(RocmConfig {
        library: Some(lib.clone()),
        ..RocmConfig::default()
    });
    if let Err(e) = source.library_info() {
        panic!("the ROCm backend did not start: {e}");
    }
    let allreduce = format!("{ALLREDUCE}.kd");
    for (id, name) in [
        (1, "_Z4gemmPKfS0_Pf.kd"),
        (2, "_Z4axpyPfS_f.kd"),
        (3, allreduce.as_str()),
    ] {
        let name = CString::new(name).unwrap();
        // SAFETY: (fixture) a NUL-terminated name the fake copies.
        unsafe { load(id, name.as_ptr()) };
    }
    let log = Log::default();
    let session = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
    // The window starts the main context on the collector: wait until calls are traced.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while kinetrace_rocm::queue_stats().is_none_or(|q| q.accepted == 0) {
        // SAFETY: (fixture) a NUL-terminated name; a call made before the context starts is not
        // traced. No GPU work: HTA keeps what comes before the first step.
        unsafe { api(c"hipDeviceSynchronize".as_ptr()) };
        assert!(
            std::time::Instant::now() < deadline,
            "the window never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for step in [
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
        "ProfilerStep#4",
    ] {
        let _step = annotation(step);
        // The GPU timeline starts well after the calls, so every call comes before its work
        // even when this thread is held up (HTA's idle-time categories compare the two).
        let t = now() + LEAD_NS;
        let us = |n: u64| t + n * 1_000;
        // SAFETY: (fixture) plain values.
        unsafe {
            at(us(100));
            launch(1, 0, 0xa000, 4096, 256, 50_000);
            at(us(150));
            launch(2, 0, 0xa000, 4096, 256, 30_000);
            at(us(160));
            launch_on(3, 0, 0xb000, 4096, 256, 40_000, COMM_STREAM);
            at(us(200));
            copy(1 << 20, 2, 0, 3_000);
        }
        // The step lasts past its GPU work.
        while now() < us(400) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let written = session.stop();
    assert_eq!(written.len(), 1, "one trace: {:?}", log.lines());
    assert!(log.lines().is_empty(), "{:?}", log.lines());
    println!("rocm_fixture: wrote {written:?}");
}
