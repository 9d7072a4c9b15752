//! Span enter/exit cost, with the profiler recording and with no profiler running.
//!
//! Peer figure for comparison (not measured by this bench): PyTorch's profiler records a `cpu_op`
//! in about 1.6 µs on this class of machine (figure given in the foundation issue).

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kinetrace::{intern, record_function, record_function_id, Profiler};

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

fn spans(c: &mut Criterion) {
    let name = intern("bench_span");
    let mut g = c.benchmark_group("span_enter_exit");

    g.bench_function("inactive", |b| {
        b.iter(|| {
            let s = record_function_id(black_box(name));
            drop(black_box(s));
        })
    });
    g.bench_function("inactive_by_str", |b| {
        b.iter(|| drop(black_box(record_function(black_box("bench_span")))))
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
        b.iter_custom(|iters| {
            timed(iters, || {
                drop(black_box(record_function_id(black_box(name))))
            })
        })
    });
    g.bench_function("active_by_str", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                drop(black_box(record_function(black_box("bench_span"))))
            })
        })
    });
    g.finish();
    let out = profiler.stop();
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

criterion_group!(benches, spans);
criterion_main!(benches);
