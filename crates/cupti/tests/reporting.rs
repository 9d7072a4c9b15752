//! What the CUPTI source says about what went wrong: every CUPTI failure that does not stop
//! recording is counted in the trace metadata (`cupti_ignored_errors`), failures at teardown are
//! said in one line, errors name the call and the kind that failed, and messages go through one
//! log (the session's, or the config's override). Each test runs in its own child process.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kinetrace_core::source::ActivitySource;
use kinetrace_core::{ActivitySet, ActivityType};
use kinetrace_cupti::{CuptiConfig, CuptiError, CuptiSource};
use serde_json::Value;

fn config(lib: &Path) -> CuptiConfig {
    CuptiConfig {
        library: Some(lib.to_path_buf()),
        driver: Some(lib.to_path_buf()),
        buffer_size: 4096,
        late_buffer_wait: Duration::from_millis(500),
        ..CuptiConfig::default()
    }
}

/// One window over `kernels` kernel launches inside a span, written as a trace. Returns the trace,
/// the session's log and the fake's counters.
fn window(file: &str, activities: ActivitySet, kernels: usize) -> (Value, Vec<String>, FakeStats) {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_as(dir.path(), file);
    let fake = Fake::open(&lib);
    let out = dir.path().join("traces");
    let log = Log::default();
    let profiler = trace_session(
        vec![Box::new(CuptiSource::new(config(&lib)))],
        activities,
        &out,
        &log,
    );
    {
        let _s = annotation("work");
        for _ in 0..kernels {
            fake.kernel("k", 7);
        }
    }
    assert_eq!(profiler.stop().len(), 1, "the trace is still written");
    (load_trace(&out), log.lines(), fake.stats())
}

fn ignored_errors(trace: &Value) -> Vec<String> {
    trace["cupti_ignored_errors"]
        .as_str()
        .unwrap_or("")
        .split("; ")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Calls whose failure only costs a detail (thread ids, the noise filter, an External id pop, a
/// disable, the unsubscribe) are each counted, by call and code, in the window's trace; the
/// window itself records everything.
#[test]
fn failures_that_do_not_stop_recording_are_counted_in_the_trace() {
    in_child(
        "failures_that_do_not_stop_recording_are_counted_in_the_trace",
        &[
            ("FAKE_CUPTI_VERSION", "130500"),
            (
                "FAKE_CUPTI_FAIL",
                "cuptiSetThreadIdType,cuptiActivityEnableRuntimeApi,cuptiActivityPopExternalCorrelationId,cuptiActivityDisable,cuptiUnsubscribe",
            ),
            ("FAKE_CUPTI_FAIL_CODE", "15"),
            NVTX_SET,
        ],
        || {
            let (trace, log, _) = window("libcupti.so.13", ActivitySet::all(), 10);
            let kernels = x(&trace, "kernel");
            assert_eq!(kernels.len(), 10, "recording is not affected");
            assert!(
                kernels
                    .iter()
                    .all(|k| k["args"].get("External id").is_some()),
                "pushes worked, so every kernel is linked"
            );
            assert!(log.is_empty(), "nothing to say in the log: {log:?}");
            let e = CuptiError(15);
            // One request per blocklisted runtime call that the cbid table names.
            let noise = kinetrace_cupti::sys::cbid::RUNTIME_CBID_NAMES
                .iter()
                .filter(|raw| {
                    !raw.is_empty()
                        && kinetrace_cupti::names::RUNTIME_BLOCKLIST
                            .contains(&kinetrace_core::intern::api_name(raw))
                })
                .count();
            assert!(noise > 0);
            let kinds = kinetrace_cupti::kinds_for(ActivitySet::all()).len();
            assert_eq!(
                ignored_errors(&trace),
                [
                    format!("cuptiSetThreadIdType: 1 × {e}"),
                    format!("cuptiActivityEnableRuntimeApi: {noise} × {e}"),
                    format!("cuptiActivityDisable: {kinds} × {e}"),
                    format!("cuptiUnsubscribe: 1 × {e}"),
                    format!("cuptiActivityPopExternalCorrelationId: 10 × (last) {e}"),
                ],
                "{}",
                trace["cupti_ignored_errors"]
            );
        },
    );
}

/// A buffer whose records `cuptiActivityGetNextRecord` refuses to walk loses them; the trace says
/// how many buffers that happened to, instead of silently having fewer records.
#[test]
fn buffers_the_record_iterator_refuses_are_reported() {
    in_child(
        "buffers_the_record_iterator_refuses_are_reported",
        &[
            ("FAKE_CUPTI_FAIL", "cuptiActivityGetNextRecord"),
            ("FAKE_CUPTI_FAIL_CODE", "21"),
            NVTX_SET,
        ],
        || {
            let (trace, log, stats) = window("libcupti.so.12", ActivitySet::all(), 60);
            assert_eq!(x(&trace, "kernel").len(), 0, "no record could be read");
            assert!(stats.buffers_completed > 1, "{stats:?}");
            assert_eq!(
                ignored_errors(&trace),
                [format!(
                    "cuptiActivityGetNextRecord: {} × CUPTI_ERROR_INVALID_KIND (21)",
                    stats.buffers_completed
                )],
                "{}",
                trace["cupti_ignored_errors"]
            );
            assert!(log.is_empty(), "{log:?}");
        },
    );
}

/// When the first kind of a window cannot be enabled, the one line says which kind: copies only
/// were asked for, so it is MEMCPY (not CONCURRENT_KERNEL, which was never requested).
#[test]
fn a_kind_that_cannot_be_enabled_is_named() {
    in_child(
        "a_kind_that_cannot_be_enabled_is_named",
        &[
            ("FAKE_CUPTI_FAIL", "cuptiActivityEnable"),
            ("FAKE_CUPTI_FAIL_CODE", "15"),
        ],
        || {
            let copies = ActivitySet::empty().with(ActivityType::Memcpy);
            let (_, log, stats) = window("libcupti.so.12", copies, 1);
            assert_eq!(stats.enabled_kinds, 0);
            assert_eq!(log.len(), 1, "{log:?}");
            assert!(
                log[0].starts_with(&format!(
                    "cupti: cuptiActivityEnable(MEMCPY) failed: {}",
                    CuptiError(15)
                )),
                "{log:?}"
            );
        },
    );
}

/// Failures while the source shuts down come after the last trace: they are said in one line.
#[test]
fn failures_at_teardown_are_said_once() {
    in_child(
        "failures_at_teardown_are_said_once",
        &[
            ("FAKE_CUPTI_FAIL", "cuptiFinalize,cuptiActivityDisable"),
            ("FAKE_CUPTI_FAIL_CODE", "15"),
        ],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            let log = Log::default();
            let mut cfg = config(&lib);
            cfg.log = Some(Arc::new(log.sink()));
            let mut source = CuptiSource::new(cfg);
            let kernels = ActivitySet::empty().with(ActivityType::Kernel);
            source.enable(kernels).unwrap();
            fake.kernel("k", 7);
            // Dropped with the window still open: flushed, disabled, finalized.
            source.poll(&mut |_| {});
            drop(source);
            let lines = log.lines();
            let kinds = kinetrace_cupti::kinds_for(kernels).len();
            let e = CuptiError(15);
            assert_eq!(
                lines,
                [format!(
                    "cupti: CUPTI calls failed while the source shut down (after the last trace): cuptiActivityDisable: {kinds} × {e}; cuptiFinalize: 1 × {e}"
                )]
            );
            assert_eq!(fake.stats().finalized, 0, "the fake refused it");
        },
    );
}

/// A source that never recorded (every call fails) has said why once, through its enable error;
/// the same failures at exit add no second line.
#[test]
fn a_source_that_never_recorded_says_one_line() {
    in_child(
        "a_source_that_never_recorded_says_one_line",
        &[("FAKE_CUPTI_FAIL", "*"), ("FAKE_CUPTI_FAIL_CODE", "999")],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let log = Log::default();
            let mut cfg = config(&lib);
            cfg.log = Some(Arc::new(log.sink()));
            let mut source = CuptiSource::new(cfg);
            let e = source
                .enable(ActivitySet::empty().with(ActivityType::Kernel))
                .unwrap_err();
            assert!(e.message.contains("CUPTI_ERROR_UNKNOWN"), "{e}");
            source.disable();
            drop(source);
            assert!(log.lines().is_empty(), "{:?}", log.lines());
        },
    );
}

/// Without an override, the source's lines go to the log the session gives it; with
/// `CuptiConfig::log`, to that one.
#[test]
fn messages_go_to_the_log_the_session_gives() {
    in_child("messages_go_to_the_log_the_session_gives", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_as(dir.path(), "libcupti.so.12");
        let _fake = Fake::open(&lib);
        let markers = ActivitySet::empty().with(ActivityType::Marker);
        let session_log = Log::default();
        let mut source = CuptiSource::new(CuptiConfig {
            external_ids: false,
            ..config(&lib)
        });
        source.set_log(Arc::new(session_log.sink()));
        source.enable(markers).unwrap();
        source.disable();
        let lines = session_log.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("NVTX_INJECTION64_PATH"), "{lines:?}");
        drop(source);

        let own = Log::default();
        let mut cfg = config(&lib);
        cfg.external_ids = false;
        cfg.log = Some(Arc::new(own.sink()));
        let mut source = CuptiSource::new(cfg);
        source.set_log(Arc::new(session_log.sink()));
        source.enable(markers).unwrap();
        source.disable();
        assert_eq!(own.lines().len(), 1, "{:?}", own.lines());
        assert_eq!(session_log.lines().len(), 1, "the override wins");
    });
}

/// The reason a source is off is a typed error whose line names what is missing.
#[test]
fn an_off_source_says_why_by_type() {
    let source = CuptiSource::new(CuptiConfig {
        library: Some("/nonexistent/libcupti.so.12".into()),
        ..CuptiConfig::default()
    });
    let e = source.library_info().unwrap_err();
    assert_eq!(
        *e,
        kinetrace_cupti::CuptiOpenError::ExplicitMissing {
            path: "/nonexistent/libcupti.so.12".into()
        }
    );
    assert_eq!(e.to_string(), "/nonexistent/libcupti.so.12 does not exist");
}
