//! What a profiler does without being told: it records the GPU when a supported runtime is present
//! (no `.cuda()`), CPU activity only with one line otherwise, and takes the rank and world size
//! from the launcher's environment through the one parser (`kinetrace::env`). Each case runs in a
//! child process with its own environment (the loader path and launcher variables are read at
//! start), with the fake libcupti standing in for both CUDA's driver and CUPTI.

use std::path::Path;

use kinetrace::Profiler;
use kinetrace_test_support::fake::{fake_as, fake_rocprofiler_sdk_in};
use kinetrace_test_support::process::{in_child, is_child};
use kinetrace_test_support::trace::{load_json, traces_in, x_events};
use kinetrace_test_support::Log;

/// The child's scratch directory (made by the parent, passed in the environment).
const SCRATCH: &str = "_KINETRACE_IT_SCRATCH";

/// Runs `body(scratch dir)` in a child whose loader finds the fake as `libcuda.so.1` and whose
/// `KINETRACE_CUPTI_PATH` names it as `libcupti.so.12` (`with_gpu`), or finds neither.
fn in_gpu_child(name: &str, with_gpu: bool, extra: &[(&str, &str)], body: impl FnOnce(&Path)) {
    if is_child(name) {
        let dir = std::env::var(SCRATCH).expect("the parent sets the scratch dir");
        body(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let libs = tmp.path().join("libs");
    std::fs::create_dir(&libs).unwrap();
    let cupti = if with_gpu {
        fake_as(&libs, "libcuda.so.1");
        fake_as(&libs, "libcupti.so.12")
    } else {
        libs.join("libcupti.so.12")
    };
    let (libs, cupti) = (libs.display().to_string(), cupti.display().to_string());
    let scratch = tmp.path().display().to_string();
    let mut env = vec![
        ("LD_LIBRARY_PATH", libs.as_str()),
        ("KINETRACE_CUPTI_PATH", cupti.as_str()),
        (SCRATCH, scratch.as_str()),
        ("RANK", ""),
        ("LOCAL_RANK", ""),
        ("WORLD_SIZE", ""),
        ("CUDA_HOME", "/nonexistent"),
    ];
    env.extend_from_slice(extra);
    in_child(name, &env, || {});
}

#[test]
fn the_gpu_is_recorded_without_asking_when_a_runtime_is_present() {
    in_gpu_child(
        "defaults::the_gpu_is_recorded_without_asking_when_a_runtime_is_present",
        true,
        &[],
        |dir| {
            let log = Log::default();
            let out = dir.join("default");
            let p = Profiler::builder()
                .output_dir(&out)
                .log(log.sink())
                .start()
                .unwrap();
            {
                let _s = kinetrace::record_function("work");
            }
            assert_eq!(p.stop().len(), 1);
            let t = load_json(&traces_in(&out)[0]);
            let library = t["cupti_library"].as_str().unwrap_or_default();
            assert!(
                library.ends_with("libcupti.so.12"),
                "the GPU backend is not live: {:?}; log {:?}",
                t["cupti_status"],
                log.lines()
            );
            assert!(log.lines().is_empty(), "{:?}", log.lines());

            // `.cpu_only()` loads no GPU backend at all.
            let out = dir.join("cpu-only");
            let p = Profiler::builder()
                .output_dir(&out)
                .cpu_only()
                .log(log.sink())
                .start()
                .unwrap();
            assert_eq!(p.stop().len(), 1);
            let t = load_json(&traces_in(&out)[0]);
            assert!(t.get("cupti_library").is_none() && t.get("cupti_status").is_none());
            assert!(log.lines().is_empty(), "{:?}", log.lines());
        },
    );
}

#[test]
fn without_a_gpu_runtime_the_profiler_records_cpu_activity_and_says_why_once() {
    in_gpu_child(
        "defaults::without_a_gpu_runtime_the_profiler_records_cpu_activity_and_says_why_once",
        false,
        &[],
        |dir| {
            let log = Log::default();
            let p = Profiler::builder()
                .output_dir(dir)
                .log(log.sink())
                .start()
                .unwrap();
            for _ in 0..3 {
                let _s = kinetrace::record_function("work");
                p.step();
            }
            assert_eq!(p.stop().len(), 1);
            let t = load_json(&traces_in(dir)[0]);
            assert_eq!(
                x_events(&t, "user_annotation")
                    .filter(|e| e["name"] == "work")
                    .count(),
                3
            );
            let lines = log.lines();
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].starts_with("cupti: "), "{lines:?}");
            let status = t["cupti_status"].as_str().unwrap_or_default();
            assert!(status.starts_with("off: "), "{status}");
        },
    );
}

#[test]
fn without_cuda_the_gpu_is_recorded_through_rocprofiler_sdk() {
    // The parent links the fake SDK; the child (no CUDA driver, no libcupti) is pointed at it.
    let tmp = tempfile::tempdir().unwrap();
    let sdk = if is_child("defaults::without_cuda_the_gpu_is_recorded_through_rocprofiler_sdk") {
        String::new()
    } else {
        fake_rocprofiler_sdk_in(tmp.path()).display().to_string()
    };
    in_gpu_child(
        "defaults::without_cuda_the_gpu_is_recorded_through_rocprofiler_sdk",
        false,
        &[("KINETRACE_ROCPROFILER_SDK_PATH", sdk.as_str())],
        |dir| {
            let log = Log::default();
            let p = Profiler::builder()
                .output_dir(dir)
                .log(log.sink())
                .rocm_max_events(100)
                .start()
                .unwrap();
            {
                let _s = kinetrace::record_function("work");
            }
            assert_eq!(p.stop().len(), 1);
            let t = load_json(&traces_in(dir)[0]);
            // ROCTRACER_MAX_EVENTS's bound, rounded up to a power of two.
            assert_eq!(t["rocm_queue_records"], "128", "{t}");
            assert_eq!(
                t["rocprofiler_sdk_version"],
                "1.1.0",
                "log {:?}",
                log.lines()
            );
            assert!(t.get("cupti_status").is_none(), "CUPTI was not the source");
            let devices = t["deviceProperties"].as_array().expect("the SDK's agents");
            assert_eq!(devices.len(), 2);
            assert!(log.lines().is_empty(), "{:?}", log.lines());
        },
    );
}

#[test]
fn rank_and_world_size_come_from_the_launcher_through_one_parser() {
    // RANK wins over LOCAL_RANK, which is then not read at all.
    in_gpu_child(
        "defaults::rank_and_world_size_come_from_the_launcher_through_one_parser",
        false,
        &[("RANK", "2"), ("LOCAL_RANK", "gpu0"), ("WORLD_SIZE", "4")],
        |dir| {
            let p = Profiler::builder()
                .output_dir(dir)
                .cpu_only()
                .start()
                .unwrap_or_else(|e| panic!("{e}"));
            p.stop();
            let t = load_json(&traces_in(dir)[0]);
            assert_eq!(t["distributedInfo"]["rank"], 2);
            assert_eq!(t["distributedInfo"]["world_size"], 4);
        },
    );
}

#[test]
fn a_malformed_world_size_fails_the_start_naming_the_variable() {
    in_gpu_child(
        "defaults::a_malformed_world_size_fails_the_start_naming_the_variable",
        false,
        &[("RANK", "0"), ("WORLD_SIZE", "eight")],
        |dir| {
            let e = Profiler::builder()
                .output_dir(dir)
                .cpu_only()
                .start()
                .err()
                .expect("a malformed WORLD_SIZE is an error");
            assert_eq!(
                e.to_string(),
                "WORLD_SIZE: `eight` is not a world size; expected an integer >= 1 such as 8"
            );
            // Given explicitly, the environment is not consulted.
            Profiler::builder()
                .output_dir(dir)
                .cpu_only()
                .rank(0)
                .world_size(1)
                .start()
                .unwrap()
                .stop();
        },
    );
}
