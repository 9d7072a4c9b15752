//! A ROCm trace written through the real ROCm backend from the fake rocprofiler-sdk
//! (`tests/fakes/rocprofiler-sdk`, SDK 1.1 layouts), for the compatibility test
//! `tests/compat/test_hta_rocm.py` (HolisticTraceAnalysis 0.5.0 loads it).
//!
//! Run: `cargo run --release -p kinetrace-rocm --example rocm_fixture -- OUTPUT_DIR`
//!
//! # The construction
//!
//! Four steps `ProfilerStep#1..#4` (user annotations). In each, on GPU 0 (null stream, one HSA
//! queue): `hipLaunchKernel` of `_Z4gemmPKfS0_Pf` running 50 µs, `hipLaunchKernel` of
//! `_Z4axpyPfS_f` running 30 µs, and `hipMemcpyAsync` of 1 MiB host → device running 3 µs. The
//! fake stamps real `CLOCK_BOOTTIME` times (each GPU record starts 1 µs after its call's start),
//! so only durations, names and counts are fixed: HTA keeps steps #1–#3 (it drops the last
//! `ProfilerStep`), so its kernel breakdown has each kernel 3 times (sum 150 µs / 90 µs, mean
//! 50 / 30) and the copy 3 times (9 µs, mean 3), and the launch statistics 6 launches.

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
    let source = RocmSource::new(RocmConfig {
        library: Some(lib.clone()),
        ..RocmConfig::default()
    });
    if let Err(e) = source.library_info() {
        panic!("the ROCm backend did not start: {e}");
    }
    for (id, name) in [(1, "_Z4gemmPKfS0_Pf.kd"), (2, "_Z4axpyPfS_f.kd")] {
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
        // SAFETY: (fixture) plain values.
        unsafe {
            launch(1, 0, 0xa000, 4096, 256, 50_000);
            launch(2, 0, 0xa000, 4096, 256, 30_000);
            copy(1 << 20, 2, 0, 3_000);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let written = session.stop();
    assert_eq!(written.len(), 1, "one trace: {:?}", log.lines());
    assert!(log.lines().is_empty(), "{:?}", log.lines());
    println!("rocm_fixture: wrote {written:?}");
}
