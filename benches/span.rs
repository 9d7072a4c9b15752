//! Span enter/exit cost, recording and idle, side by side with the clock it is measured against.
//!
//! The targets are ratios to one `Instant::now()` on the same machine in the same run: a recording
//! span (enter + exit of `record_function("literal")`) at most 1×, an idle span at most ¼. Criterion
//! gives the detailed figures; the table printed at the end gives the ratios, each the best of 15
//! chunks of 20,000 calls (the least-disturbed chunk, on a machine shared with other work).
//!
//! Peer figure for comparison (not measured by this bench): PyTorch's profiler records a `cpu_op`
//! in about 1.6 µs on this class of machine (figure given in the foundation issue).

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kinetrace::{intern, record_function, record_function_dyn, record_function_id, Profiler};

/// Spans per timed chunk: fewer than the ring holds.
const CHUNK: u64 = 20_000;

/// Times `iters` calls of `f` in chunks, pausing (untimed) between chunks so the collector drains the
/// ring: a push only measures honestly while the ring has room (a refused push is cheaper).
fn timed(iters: u64, f: impl Fn()) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        total += t.elapsed();
        left -= n;
        std::thread::sleep(Duration::from_millis(50));
    }
    total
}

/// Nanoseconds per call of `f`: the best of 15 chunks.
fn best_ns(f: impl Fn()) -> f64 {
    (0..15)
        .map(|_| timed(CHUNK, &f).as_nanos() as f64 / CHUNK as f64)
        .fold(f64::INFINITY, f64::min)
}

fn spans(c: &mut Criterion) {
    let name = intern("bench_span");
    let mut g = c.benchmark_group("span_enter_exit");
    g.bench_function("clock_reference_instant_now", |b| {
        b.iter(|| black_box(Instant::now()))
    });
    g.bench_function("inactive", |b| {
        b.iter(|| drop(black_box(record_function(black_box("bench_span")))))
    });
    g.bench_function("inactive_id", |b| {
        b.iter(|| drop(black_box(record_function_id(black_box(name)))))
    });

    let dir = tempfile::tempdir().expect("temp dir");
    let profiler = Profiler::builder()
        .output_dir(dir.path())
        // Larger than one timed chunk, so no push in a chunk finds the ring full.
        .ring_capacity(1 << 17)
        .log(|m| eprintln!("kinetrace: {m}"))
        .start()
        .expect("profiler starts");
    // Timed in chunks (see `timed`); the drop count printed at the end must be 0.
    g.sample_size(20);
    g.bench_function("active", |b| {
        b.iter_custom(|iters| timed(iters, || drop(black_box(record_function("bench_span")))))
    });
    g.bench_function("active_span_macro", |b| {
        b.iter_custom(|iters| timed(iters, || drop(black_box(kinetrace::span!("bench_span")))))
    });
    g.bench_function("active_id", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                drop(black_box(record_function_id(black_box(name))))
            })
        })
    });
    g.bench_function("active_dyn", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                drop(black_box(record_function_dyn(black_box("bench_span"))))
            })
        })
    });
    g.finish();

    // The ratio table, all in this run.
    let active = best_ns(|| drop(black_box(record_function("bench_span"))));
    let active_macro = best_ns(|| drop(black_box(kinetrace::span!("bench_span"))));
    let out = profiler.stop();
    let idle = best_ns(|| drop(black_box(record_function(black_box("bench_span")))));
    let clock = best_ns(|| {
        black_box(Instant::now());
    });
    // The physical floor of a recorded span: two time-stamp reads (enter, exit).
    let floor = two_tsc_reads();
    eprintln!("\nspan cost against one Instant::now() (best of 15 chunks of {CHUNK}):");
    eprintln!("  Instant::now()                     {clock:6.2} ns  (reference)");
    if let Some(floor) = floor {
        eprintln!(
            "  two rdtsc (a span's floor)         {floor:6.2} ns  = {:.2}x",
            floor / clock
        );
    }
    eprintln!(
        "  recording record_function(\"lit\")   {active:6.2} ns  = {:.2}x  (target <= 1x)",
        active / clock
    );
    eprintln!(
        "  recording span!(\"lit\")              {active_macro:6.2} ns  = {:.2}x",
        active_macro / clock
    );
    if let Some(floor) = floor {
        eprintln!(
            "  recording over the floor: record_function {:.2}x, span! {:.2}x",
            active / floor,
            active_macro / floor
        );
    }
    eprintln!(
        "  idle record_function(\"lit\")        {idle:6.2} ns  = {:.2}x  (target <= 0.25x)",
        idle / clock
    );
    eprintln!(
        "  recording clock: {}",
        if kinetrace::clock_is_tsc() {
            "time-stamp counter"
        } else {
            "CLOCK_MONOTONIC"
        }
    );
    if let Some(p) = out.first().and_then(|o| o.path.as_ref()) {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let dropped = text
            .split("\"cpu_ring\": ")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .unwrap_or("?");
        eprintln!(
            "active run: {} spans recorded, {dropped} dropped by full rings",
            out[0].events
        );
    }
}

/// Two `rdtsc` reads, best of 15 chunks (`None` off x86-64).
fn two_tsc_reads() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        Some(best_ns(|| {
            // SAFETY: `rdtsc` reads the time-stamp counter; it has no preconditions on x86-64.
            let a = unsafe { std::arch::x86_64::_rdtsc() };
            // SAFETY: as above.
            let b = unsafe { std::arch::x86_64::_rdtsc() };
            black_box((a, b));
        }))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

criterion_group!(benches, spans);
criterion_main!(benches);
