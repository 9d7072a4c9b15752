//! Living next to another CUPTI client (PyTorch's Kineto, Nsight): CUPTI before 13.3 allows one
//! subscriber per process, so kinetrace holds it only while a window is open, and records CPU only
//! while someone else holds it. Also: no environment writes, and logging that cannot panic. Each
//! test runs in its own child process (CUPTI, the fake and the session are process-wide).

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use kinetrace_core::schedule::Schedule;
use kinetrace_core::{ActivitySet, ActivityType};
use kinetrace_cupti::{CuptiConfig, CuptiSource};

const MULTIPLE_SUBSCRIBERS: u32 = 39;

fn config(lib: &Path) -> CuptiConfig {
    CuptiConfig {
        library: Some(lib.to_path_buf()),
        driver: Some(lib.to_path_buf()),
        buffer_size: 4096,
        ..CuptiConfig::default()
    }
}

/// wait 1, warm-up 1, active 1: window `n` is enabled at step 3n+1, records step 3n+2 and ends at
/// step 3n+3.
fn schedule(windows: u32) -> Schedule {
    Schedule::new(1, 1, 1).unwrap().with_repeat(windows)
}

/// Steps into window `n`'s recorded step, runs `work` there, and steps out (the window ends).
fn window(session: &kinetrace_core::Session, work: impl FnOnce()) {
    session.step(); // warm-up: CUPTI enabled
    session.step(); // recording
    work();
    session.step(); // the window ends
}

/// Ten kernels inside a span.
fn work(fake: &Fake) {
    let _s = annotation("work");
    for _ in 0..10 {
        fake.kernel("k", 7);
    }
}

fn subscriber_lines(log: &Log) -> Vec<String> {
    log.lines()
        .into_iter()
        .filter(|l| l.contains("subscriber"))
        .collect()
}

/// A foreign client subscribed before kinetrace's window: one line, a CPU-only window, a quiet
/// CPU-only window while it still holds CUPTI, and GPU records again once it has gone.
#[test]
fn foreign_subscriber_before_the_window() {
    in_child("foreign_subscriber_before_the_window", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_as(dir.path(), "libcupti.so.12");
        let fake = Fake::open(&lib);
        assert_eq!(fake.foreign_subscribe(), 0);
        let log = Log::default();
        let (session, windows) = session(
            CuptiSource::new(config(&lib)),
            ActivitySet::default_set(),
            Some(schedule(3)),
            Duration::from_millis(5),
            &log,
        );
        let mut during = Vec::new();
        window(&session, || {
            work(&fake);
            during.push(fake.stats());
        });
        windows.wait_for(1);
        window(&session, || {
            work(&fake);
            during.push(fake.stats());
        });
        windows.wait_for(2);
        assert_eq!(fake.foreign_unsubscribe(), 0);
        window(&session, || work(&fake));
        session.stop();
        let seen = windows.get();
        let stats = fake.stats();

        let lines = subscriber_lines(&log);
        assert_eq!(lines.len(), 1, "said once: {:?}", log.lines());
        assert!(
            lines[0].contains("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
                && lines[0].contains("CPU"),
            "{lines:?}"
        );
        for s in &during {
            assert_eq!(
                s.enabled_kinds, 0,
                "nothing enabled while another client owns CUPTI"
            );
            assert_eq!(s.foreign_subscribed, 1);
        }
        assert_eq!(seen.len(), 3);
        for (i, w) in seen.iter().take(2).enumerate() {
            assert_eq!(w.gpu, 0, "window {i}: CPU only");
            assert_eq!(w.of(ActivityType::UserAnnotation), 2, "window {i}: {w:?}");
            assert!(
                w.meta("cupti_subscriber")
                    .is_some_and(|v| v.contains("another CUPTI client")),
                "window {i}: {:?}",
                w.metadata
            );
        }
        let w = &seen[2];
        assert_eq!(w.of(ActivityType::Kernel), 10, "GPU again: {w:?}");
        assert_eq!(w.runtime.len(), 10);
        assert!(
            w.runtime.iter().all(|(_, ext)| ext.is_some()),
            "linked to the span: {:?}",
            w.runtime
        );
        assert!(w.meta("cupti_subscriber").is_none(), "{:?}", w.metadata);
        // The foreign client's subscribe and unsubscribe, and kinetrace's, once.
        assert_eq!((stats.subscribes, stats.unsubscribes), (2, 2), "{stats:?}");
    });
}

/// While kinetrace's window is open it holds the subscriber (a foreign subscribe fails with 39);
/// once the window closed, the foreign client gets it; after it leaves, kinetrace records again.
#[test]
fn foreign_subscriber_during_and_after_the_window() {
    in_child(
        "foreign_subscriber_during_and_after_the_window",
        &[],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            let log = Log::default();
            let (session, windows) = session(
                CuptiSource::new(config(&lib)),
                ActivitySet::default_set(),
                Some(schedule(2)),
                Duration::from_millis(5),
                &log,
            );
            let mut during = None;
            window(&session, || {
                work(&fake);
                during = Some(fake.foreign_subscribe());
            });
            assert_eq!(during, Some(MULTIPLE_SUBSCRIBERS), "kinetrace holds it");
            // Released when the window closed (by the collector, which finishes windows).
            wait_until(
                Duration::from_secs(30),
                || fake.stats().subscribed == 0,
                || format!("still subscribed: {:?}", fake.stats()),
            );
            assert_eq!(fake.foreign_subscribe(), 0, "free after the window");
            assert_eq!(fake.foreign_unsubscribe(), 0);
            window(&session, || work(&fake));
            session.stop();
            let seen = windows.get();
            assert!(log.lines().is_empty(), "{:?}", log.lines());
            assert_eq!(seen.len(), 2);
            for w in &seen {
                assert_eq!(w.of(ActivityType::Kernel), 10, "{w:?}");
            }
            let stats = fake.stats();
            assert_eq!((stats.subscribes, stats.unsubscribes), (3, 3), "{stats:?}");
        },
    );
}

/// Dropping the source with `finalize_on_drop` (the library default) unsubscribes exactly once and
/// finalizes; without it (the preload shim) the subscriber is still given back when the window ends.
#[test]
fn the_subscriber_is_released_exactly_once() {
    in_child("the_subscriber_is_released_exactly_once", &[], || {
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_as(dir.path(), "libcupti.so.12");
        let fake = Fake::open(&lib);
        for finalize in [true, false] {
            let before = fake.stats();
            let mut cfg = config(&lib);
            cfg.finalize_on_drop = finalize;
            let profiler = trace_session(
                vec![Box::new(CuptiSource::new(cfg))],
                ActivitySet::default_set(),
                &dir.path().join(format!("traces-{finalize}")),
                &Log::default(),
            );
            fake.kernel("k", 7);
            assert_eq!(fake.stats().subscribed, 1);
            profiler.stop();
            let after = fake.stats();
            assert_eq!(after.subscribed, 0, "finalize {finalize}: {after:?}");
            assert_eq!(
                (
                    after.subscribes - before.subscribes,
                    after.unsubscribes - before.unsubscribes,
                    after.finalized - before.finalized,
                ),
                (1, 1, finalize as u32),
                "finalize {finalize}: {after:?}"
            );
        }
    });
}

/// A thread inside a CUDA call when the window closes gets no exit callback for it (kinetrace has
/// unsubscribed), so the External id pushed at its entry is never popped. A later window must not
/// link that thread's calls to the old span.
#[test]
fn an_unpopped_external_id_does_not_outlive_its_window() {
    in_child(
        "an_unpopped_external_id_does_not_outlive_its_window",
        &[],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            let log = Log::default();
            let (first, first_seen) = session(
                CuptiSource::new(config(&lib)),
                ActivitySet::default_set(),
                None,
                Duration::from_millis(5),
                &log,
            );
            {
                let _old = annotation("old");
                fake.kernel("k", 7);
                // The window ends while this thread is inside a CUDA call.
                let mut first = Some(first);
                fake.call_around(&mut || {
                    first.take().unwrap().stop();
                });
            }
            assert_eq!(fake.stats().subscribed, 0);
            let (second, second_seen) = session(
                CuptiSource::new(config(&lib)),
                ActivitySet::default_set(),
                None,
                Duration::from_millis(5),
                &log,
            );
            // Outside any span: nothing to link to.
            fake.kernel("k", 7);
            second.stop();
            let (first, second) = (&first_seen.get()[0], &second_seen.get()[0]);
            assert_eq!(first.runtime.len(), 1, "{first:?}");
            assert!(first.runtime[0].1.is_some(), "{:?}", first.runtime);
            assert_eq!(second.runtime.len(), 1, "{second:?}");
            assert_eq!(
                second.runtime[0].1, None,
                "no link to the old window's span"
            );
        },
    );
}

/// A thread blocked in a CUDA synchronize call is seen as waiting from its enter callback to its
/// exit (what the flight recorder's hang check reads: no op or API record names the call while it
/// runs), and only while a window's callbacks are subscribed.
#[test]
fn a_synchronize_call_in_progress_is_an_open_wait() {
    in_child(
        "a_synchronize_call_in_progress_is_an_open_wait",
        &[],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            let log = Log::default();
            let tid = kinetrace_core::recorder::current_tid().max(1);
            let mine = || {
                kinetrace_core::waits::open()
                    .filter(|&(t, _, _)| t == tid)
                    .map(|(_, name, _)| kinetrace_core::intern::resolve(name).to_string())
                    .collect::<Vec<_>>()
            };
            let (window, _seen) = session(
                CuptiSource::new(config(&lib)),
                ActivitySet::default_set(),
                None,
                Duration::from_millis(5),
                &log,
            );
            let mut during = Vec::new();
            fake.sync_around(3, &mut || during = mine());
            assert_eq!(during, ["cudaStreamSynchronize"]);
            assert!(mine().is_empty(), "{:?}", mine());
            // Not a wait: a stream waiting on an event does not block the host.
            fake.sync_around(2, &mut || during = mine());
            assert!(during.is_empty(), "{during:?}");
            window.stop();
            fake.sync_around(4, &mut || during = mine());
            assert!(during.is_empty(), "no window, no callbacks: {during:?}");
        },
    );
}

/// Markers asked for without `NVTX_INJECTION64_PATH`: kinetrace does not set the variable (that
/// races the job's own `getenv`), and says once how to get markers.
#[test]
fn markers_without_nvtx_injection_are_explained_once() {
    in_child(
        "markers_without_nvtx_injection_are_explained_once",
        &[],
        || {
            assert!(
                std::env::var_os("NVTX_INJECTION64_PATH").is_none(),
                "in_child starts the test without NVTX_INJECTION64_PATH"
            );
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            let source_log = Log::default();
            let mut cfg = config(&lib);
            cfg.log = Some(std::sync::Arc::new(source_log.sink()));
            let log = Log::default();
            let (session, windows) = session(
                CuptiSource::new(cfg),
                ActivitySet::all(),
                Some(schedule(2)),
                Duration::from_millis(5),
                &log,
            );
            window(&session, || work(&fake));
            assert!(
                std::env::var_os("NVTX_INJECTION64_PATH").is_none(),
                "the environment is the job's: never written"
            );
            window(&session, || work(&fake));
            session.stop();
            assert_eq!(windows.get().len(), 2);
            let lines = source_log.lines();
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].contains("NVTX_INJECTION64_PATH")
                    && lines[0].contains(lib.to_str().unwrap()),
                "{lines:?}"
            );
        },
    );
}

/// With no log hook the source writes to standard error; a broken standard error (closed pipe,
/// full disk) must not panic the job.
#[test]
fn logging_survives_a_broken_stderr() {
    in_child_with_broken_stderr(
        "logging_survives_a_broken_stderr",
        &[
            ("FAKE_CUPTI_VERSION", "130500"),
            ("FAKE_CUPTI_WRONG_STRUCT_SIZE", "10"),
        ],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.13");
            let fake = Fake::open(&lib);
            let profiler = trace_session(
                vec![Box::new(CuptiSource::new(config(&lib)))],
                ActivitySet::all(),
                &dir.path().join("traces"),
                &Log::default(),
            );
            fake.memcpy(1, 1, 3, 1024, 7);
            assert_eq!(profiler.stop().len(), 1);
            println!("survived");
        },
    );
}
