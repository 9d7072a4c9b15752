//! Every record CUPTI produced in a window is either in that window's trace or counted: as dropped
//! (CUPTI's own count, or buffers the pool discarded), or as late (a buffer CUPTI returned after the
//! window closed). Each test runs in its own child process (CUPTI, the fake and the session are
//! process-wide).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kinetrace_core::schedule::Schedule;
use kinetrace_core::{ActivitySet, ActivityType};
use kinetrace_cupti::{CuptiConfig, CuptiSource};
use kinetrace_cupti_sys::v13;

const STREAMS: [u32; 2] = [7, 13];

fn config(lib: &Path) -> CuptiConfig {
    CuptiConfig {
        library: Some(lib.to_path_buf()),
        driver: Some(lib.to_path_buf()),
        buffer_size: 4096,
        ..CuptiConfig::default()
    }
}

/// Records that reach a buffer but never become a trace event: devices, contexts (kept for the
/// trace header) and external-correlation records (folded into the API records).
fn non_event_written(fake: &Fake) -> u64 {
    [
        v13::CUPTI_ACTIVITY_KIND_DEVICE,
        v13::CUPTI_ACTIVITY_KIND_CONTEXT,
        v13::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    ]
    .iter()
    .map(|k| fake.written_of_kind(*k))
    .sum()
}

/// Every GPU record is dropped and no buffer ever completes: CUPTI's dropped count must still be
/// read (from the global queue) at the end of the window. Before the fix it was only read per
/// completed buffer, so these drops vanished.
#[test]
fn drops_are_counted_when_no_buffer_completes() {
    in_child(
        "drops_are_counted_when_no_buffer_completes",
        &[
            ("FAKE_CUPTI_DROP_EVERY", "1"),
            // DEVICE/CONTEXT are enabled with EnableAndDump: failing it keeps their records (the
            // only ones that would reach a buffer) out of this window.
            ("FAKE_CUPTI_FAIL", "cuptiActivityEnableAndDump"),
        ],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            // CUDA initialised (and the kernel's function loaded) before profiling.
            fake.kernel("k", 7);
            let before = fake.stats();
            let log = Log::default();
            let (session, windows) = session(
                CuptiSource::new(config(&lib)),
                ActivitySet::empty().with(ActivityType::Kernel),
                None,
                Duration::from_millis(20),
                &log,
            );
            for i in 0..50 {
                fake.kernel("k", STREAMS[i % 2]);
            }
            session.stop();
            let after = fake.stats();
            assert_eq!(
                after.buffers_completed, before.buffers_completed,
                "precondition: no buffer completes in this window"
            );
            assert_eq!(after.records_dropped - before.records_dropped, 50);
            let w = &windows.get()[0];
            assert_eq!(w.gpu, 0);
            assert_eq!(w.dropped_cupti, 50, "{w:?}");
            let lines = log.lines();
            assert!(
                lines.iter().any(|l| l.contains("50 events dropped")),
                "{lines:?}"
            );
        },
    );
}

/// One flooded window: a pool of 4 small buffers, a collector polling every 100 µs, `kernels`
/// launches. Returns (records in the trace, dropped in the trace, produced).
fn flood_window(lib: &Path, fake: &Fake, kernels: usize) -> (u64, u64, u64) {
    let mut cfg = config(lib);
    cfg.max_buffer_bytes = 4 * 4096;
    let before = (fake.stats(), non_event_written(fake));
    let log = Log::default();
    let (session, windows) = session(
        CuptiSource::new(cfg),
        ActivitySet::default_set(),
        None,
        Duration::from_micros(100),
        &log,
    );
    for i in 0..kernels {
        fake.kernel("flood", STREAMS[i % 2]);
    }
    session.stop();
    let after = (fake.stats(), non_event_written(fake));
    let produced = (after.0.records_written - before.0.records_written)
        + (after.0.records_dropped - before.0.records_dropped)
        - (after.1 - before.1);
    let w = windows.get().remove(0);
    assert!(w.finished);
    (w.gpu, w.dropped_cupti, produced)
}

/// The CI flake, made likely: a collector that falls behind (it polls every 100 µs, two threads burn
/// both cores, and the fake keeps it busy for 1 ms after each read of the dropped count, as a
/// preemption would), so a flood often ends while every buffer is with the collector: CUPTI drops
/// records after the count was read, and no buffer completes afterwards. Floods of different
/// lengths end at different points of the collector's cycle. Every iteration must account for every
/// record exactly. Before the fix (the count read only per completed buffer) about a third of the
/// iterations lost drops.
#[test]
fn flood_accounting_is_exact_under_load() {
    in_child(
        "flood_accounting_is_exact_under_load",
        &[
            ("FAKE_CUPTI_VERSION", "28"),
            ("FAKE_CUPTI_SLOW_READER_NS", "1000000"),
        ],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            fake.kernel("flood", 7);
            let stop = Arc::new(AtomicBool::new(false));
            let burners: Vec<_> = (0..2)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let mut x = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            x = std::hint::black_box(x.wrapping_mul(6364136223846793005) + 1);
                        }
                    })
                })
                .collect();
            let mut failures = Vec::new();
            let mut total_dropped = 0;
            const ITERATIONS: usize = 30;
            for i in 0..ITERATIONS {
                let (in_trace, dropped, produced) =
                    flood_window(&lib, &fake, 1000 + (i * 97) % 1000);
                total_dropped += dropped;
                if in_trace + dropped != produced {
                    failures.push(format!(
                        "iteration {i}: {in_trace} in the trace + {dropped} dropped != {produced} produced"
                    ));
                }
            }
            stop.store(true, Ordering::Relaxed);
            for b in burners {
                b.join().unwrap();
            }
            assert!(failures.is_empty(), "{failures:#?}");
            assert!(
                total_dropped > 0,
                "the flood must overflow the pool to test anything"
            );
            println!("{ITERATIONS} iterations exact; {total_dropped} records dropped in all");
        },
    );
}

/// Buffers CUPTI returns after the window's flush stopped waiting: their records are not in that
/// window's trace (it is written already), are not decoded into the next window, and are counted
/// (`cupti_late_records` in later traces), with one line when the window ends without them.
#[test]
fn late_buffers_are_counted_not_lost() {
    in_child(
        "late_buffers_are_counted_not_lost",
        &[("FAKE_CUPTI_HOLD", "1")],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            fake.kernel("k", 7);
            let source_log = Log::default();
            let mut cfg = config(&lib);
            cfg.late_buffer_wait = Duration::from_millis(20);
            // No External id records (they are not trace events, but a late buffer's count
            // includes them): every record of the window is then a trace event or late.
            cfg.external_ids = false;
            cfg.log = Some(std::sync::Arc::new(source_log.sink()));
            let log = Log::default();
            // wait 1, warm-up 1, active 1: windows record steps 2 and 5.
            let schedule = Schedule::new(1, 1, 1).unwrap().with_repeat(2);
            let (session, windows) = session(
                CuptiSource::new(cfg),
                ActivitySet::default_set(),
                Some(schedule),
                Duration::from_millis(5),
                &log,
            );
            session.step(); // 1: warm-up, CUPTI enabled
            session.step(); // 2: recording
            let before = (fake.stats(), non_event_written(&fake));
            for i in 0..60 {
                fake.kernel("k", STREAMS[i % 2]);
            }
            // The buffers filled so far come back in time...
            assert!(fake.release_held() > 0);
            // ...these do not: CUPTI still holds them when the window's flush gives up.
            for i in 0..60 {
                fake.kernel("k", STREAMS[i % 2]);
            }
            session.step(); // 3: window 0 ends
            let after = (fake.stats(), non_event_written(&fake));
            let produced = (after.0.records_written - before.0.records_written)
                + (after.0.records_dropped - before.0.records_dropped)
                - (after.1 - before.1);
            let late_lines = || -> Vec<String> {
                source_log
                    .lines()
                    .into_iter()
                    .filter(|l| l.contains("still with CUPTI"))
                    .collect()
            };
            // The collector flushes the ended window on its own thread; its wait gives up there.
            wait_until(
                Duration::from_secs(30),
                || !late_lines().is_empty(),
                || format!("{:?}", source_log.lines()),
            );
            assert_eq!(late_lines().len(), 1, "{:?}", source_log.lines());
            // Now CUPTI returns them, after the window closed.
            assert!(fake.release_held() > 0);
            session.step(); // 4: warm-up of window 1
            session.step(); // 5: recording
            session.step(); // 6: window 1 ends
            session.stop();
            let seen = windows.get();
            assert_eq!(seen.len(), 2);
            let w0 = &seen[0];
            let late_buffers: u64 = w0
                .meta("cupti_late_buffers")
                .unwrap_or_else(|| panic!("{:?}", w0.metadata))
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(late_buffers > 0);
            let late: u64 = seen[1]
                .meta("cupti_late_records")
                .unwrap_or_else(|| panic!("{:?}", seen[1].metadata))
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(w0.gpu > 0 && late > 0, "{} {late}", w0.gpu);
            assert_eq!(w0.dropped_cupti, 0);
            assert_eq!(
                w0.gpu + late,
                produced,
                "every record of window 0 is in its trace or counted late"
            );
            assert_eq!(seen[1].gpu, 0, "nothing of window 0 leaks into window 1");
        },
    );
}
