//! Against the REAL libcupti from the pinned wheels (`scripts/cupti-wheels.sh` puts them in
//! target/cupti-wheels). This machine has no GPU and no driver: the libraries load, the version is
//! read where the library answers without a driver, and the backend turns itself off with one clear
//! message and no crash. Each case runs in its own process.

mod common;

use std::path::PathBuf;

use common::*;
use kinetrace_cupti::{CuptiConfig, CuptiSource, Release};
use kinetrace_cupti_sys::Cupti;

fn wheel_lib(dir: &str, rel: &str) -> PathBuf {
    let root = std::env::var_os("KINETRACE_CUPTI_WHEELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/cupti-wheels")
        });
    let p = root.join(dir).join(rel);
    assert!(
        p.exists(),
        "{} is missing: run scripts/cupti-wheels.sh first",
        p.display()
    );
    p
}

fn v11_8() -> PathBuf {
    wheel_lib(
        "nvidia-cuda-cupti-cu11-11.8.87",
        "nvidia/cuda_cupti/lib/libcupti.so.11.8",
    )
}
fn v12_9() -> PathBuf {
    wheel_lib(
        "nvidia-cuda-cupti-cu12-12.9.79",
        "nvidia/cuda_cupti/lib/libcupti.so.12",
    )
}
fn v13_1() -> PathBuf {
    wheel_lib(
        "nvidia-cuda-cupti-13.1.115",
        "nvidia/cu13/lib/libcupti.so.13",
    )
}
fn v13_5() -> PathBuf {
    wheel_lib(
        "nvidia-cuda-cupti-13.5.25",
        "nvidia/cu13/lib/libcupti.so.13",
    )
}

/// Loads with every required symbol, has the expected SONAME, and (raw call, allowed here because
/// these releases answer without a driver) reports the expected version.
fn loads_and_reads_version(path: PathBuf, soname: &str, expected: Option<(u32, Release)>) {
    assert_eq!(
        kinetrace_cupti::loader::elf_soname(&path).as_deref(),
        Some(soname)
    );
    // SAFETY: (test) a real libcupti.
    let cupti = unsafe { Cupti::load(&path) }.expect("loads with every required symbol");
    let mut v = 0u32;
    // SAFETY: (test) valid out-pointer; these releases do not need the driver for this call.
    let rc = unsafe { (cupti.cuptiGetVersion)(&mut v) };
    match expected {
        Some((api, release)) => {
            assert_eq!((rc, v), (0, api));
            assert_eq!(Release::from_api_version(v, soname), Some(release));
        }
        None => {
            // 13.3+ answer CUPTI_ERROR_UNKNOWN without a driver; we name it ourselves.
            assert_eq!(rc, 999);
            assert_eq!(
                kinetrace_cupti::CuptiError(rc).name(),
                Some("CUPTI_ERROR_UNKNOWN")
            );
        }
    }
}

#[test]
fn real_11_8_loads_and_reports_18() {
    in_child("real_11_8_loads_and_reports_18", &[], || {
        loads_and_reads_version(v11_8(), "libcupti.so.11.8", Some((18, Release::V11_8)))
    });
}

#[test]
fn real_12_9_loads_and_reports_28() {
    in_child("real_12_9_loads_and_reports_28", &[], || {
        loads_and_reads_version(v12_9(), "libcupti.so.12", Some((28, Release::V12_9)))
    });
}

#[test]
fn real_13_1_loads_and_reports_130101() {
    in_child("real_13_1_loads_and_reports_130101", &[], || {
        loads_and_reads_version(
            v13_1(),
            "libcupti.so.13",
            Some((
                130101,
                Release {
                    major: 13,
                    minor: 1,
                },
            )),
        )
    });
}

#[test]
fn real_13_5_loads_and_answers_unknown_without_driver() {
    in_child(
        "real_13_5_loads_and_answers_unknown_without_driver",
        &[],
        || loads_and_reads_version(v13_5(), "libcupti.so.13", None),
    );
}

/// The backend on a machine without a driver: off, one message, the job and the trace go on.
fn turns_off_without_driver(lib: PathBuf) {
    assert!(
        kinetrace_cupti::loader::check_driver(None).is_err(),
        "this test expects a machine without libcuda.so.1"
    );
    let source = CuptiSource::new(CuptiConfig {
        library: Some(lib),
        ..CuptiConfig::default()
    });
    let reason = source.library_info().unwrap_err().to_string();
    assert!(reason.starts_with("no CUDA driver"), "{reason}");
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let p = trace_session(
        vec![Box::new(source)],
        kinetrace_core::ActivitySet::default_set(),
        dir.path(),
        &log,
    );
    {
        let _s = annotation("work");
    }
    assert_eq!(p.stop().len(), 1);
    let lines = log.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("no CUDA driver") && lines[0].contains("libcuda.so.1"),
        "{lines:?}"
    );
}

#[test]
fn real_12_9_turns_off_without_driver() {
    in_child("real_12_9_turns_off_without_driver", &[], || {
        turns_off_without_driver(v12_9())
    });
}

#[test]
fn real_13_5_turns_off_without_driver() {
    // 13.2 would kill the process on its first call here; the driver check comes first.
    in_child("real_13_5_turns_off_without_driver", &[], || {
        turns_off_without_driver(v13_5())
    });
}

#[test]
fn real_12_9_with_a_stand_in_driver_fails_cleanly_by_name() {
    // The driver check is pointed at a stand-in, so the real 12.9 library is called: the version is
    // read through the backend's own path, and enabling fails with a named error instead of crashing.
    in_child(
        "real_12_9_with_a_stand_in_driver_fails_cleanly_by_name",
        &[],
        || {
            let mut source = CuptiSource::new(CuptiConfig {
                library: Some(v12_9()),
                driver: Some(fake_library()),
                ..CuptiConfig::default()
            });
            let info = source.library_info().expect("loads").clone();
            assert_eq!((info.api_version, info.release), (28, Release::V12_9));
            use kinetrace_core::ActivitySource;
            let e = source
                .enable(kinetrace_core::ActivitySet::default())
                .unwrap_err();
            assert!(e.message.contains("CUPTI_ERROR_NOT_INITIALIZED"), "{e}");
            source.flush(&mut |_| panic!("no records without a GPU"));
            source.disable();
        },
    );
}

#[test]
fn real_12_9_timestamps_are_in_the_unix_domain() {
    in_child("real_12_9_timestamps_are_in_the_unix_domain", &[], || {
        // SAFETY: (test) a real libcupti; cuptiGetTimestamp answers without a driver on 12.9.
        let cupti = unsafe { Cupti::load(&v12_9()) }.unwrap();
        let f = cupti.cuptiGetTimestamp.expect("12.9 has cuptiGetTimestamp");
        let mut ts = 0u64;
        // SAFETY: (test) valid out-pointer.
        assert_eq!(unsafe { f(&mut ts) }, 0);
        let ours = kinetrace_core::UnixNanos::now().0;
        assert!(
            ours.abs_diff(ts) < 50_000_000,
            "cupti {ts} vs kinetrace {ours}"
        );
    });
}
