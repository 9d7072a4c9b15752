//! What a training loop feels of the profiler: how long `step()` takes (above all the step that ends
//! a window, which used to write the whole trace), and how much of a burst of spans reaches the
//! trace. Run with `cargo bench --bench session`; it prints a table (no criterion statistics: these
//! are latencies and counts, each from one run, repeated a few times).
//!
//! - **step latency**: 40 steps of 3,530 spans and 1 ms of other work each (141 k events per
//!   40-step window, the figure, about 3.5 M spans/s), a schedule recording steps 10–49;
//!   every `step()` call is timed.
//! - **burst**: 1 M spans (pausing 0.2 ms every 10 k, as a job between operators does), with the
//!   default settings, twice: paced at the 4.5 M spans/s, and as fast as the thread can
//!   (several times that); how many reach the trace and how many are counted as dropped.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use kinetrace::{record_function, Profiler, Schedule};

fn dropped_cpu(path: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split("\"cpu_ring\": ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn step_latency() {
    const SPANS_PER_STEP: usize = 3_530;
    let dir = tempfile::tempdir().expect("temp dir");
    let profiler = Profiler::builder()
        .schedule(Schedule::new(9, 1, 40).expect("schedule"))
        .output_dir(dir.path())
        .log(|m| eprintln!("kinetrace: {m}"))
        .start()
        .expect("profiler starts");
    let mut steps = Vec::new();
    for _ in 0..52 {
        for _ in 0..SPANS_PER_STEP {
            drop(black_box(record_function("op")));
        }
        spin(Duration::from_millis(1));
        let t = Instant::now();
        profiler.step();
        steps.push(t.elapsed());
    }
    let out = profiler.stop();
    let events = out.first().map(|o| o.events).unwrap_or(0);
    let dropped = out
        .first()
        .and_then(|o| o.path.as_deref())
        .map(dropped_cpu)
        .unwrap_or(0);
    // steps[i] is the call that ends step i; the window records steps 10..=49, so the call ending
    // step 49 ends the window.
    let ending = steps[49];
    let mut inside: Vec<Duration> = steps[10..49].to_vec();
    inside.sort();
    println!(
        "step latency: window of {events} events ({dropped} dropped); window-ending step() {:.1} µs; \
         steps inside the window: median {:.1} µs, max {:.1} µs",
        ending.as_secs_f64() * 1e6,
        inside[inside.len() / 2].as_secs_f64() * 1e6,
        inside[inside.len() - 1].as_secs_f64() * 1e6,
    );
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// `rate`: spans per second to keep to (`None`: as fast as possible).
fn burst(rate: Option<f64>) {
    const SPANS: u64 = 1_000_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let profiler = Profiler::builder()
        .output_dir(dir.path())
        .log(|m| eprintln!("kinetrace: {m}"))
        .start()
        .expect("profiler starts");
    let t = Instant::now();
    for i in 0..SPANS {
        drop(black_box(record_function("burst_op")));
        if i % 1_000 == 999 {
            if let Some(rate) = rate {
                // Keep to the rate: wait until this many spans are due.
                let due = Duration::from_secs_f64((i + 1) as f64 / rate);
                while t.elapsed() < due {
                    std::hint::spin_loop();
                }
            }
        }
        if i % 10_000 == 9_999 {
            spin(Duration::from_micros(200));
        }
    }
    let took = t.elapsed();
    let out = profiler.stop();
    let events = out.first().map(|o| o.events).unwrap_or(0);
    let dropped = out
        .first()
        .and_then(|o| o.path.as_deref())
        .map(dropped_cpu)
        .unwrap_or(0);
    println!(
        "burst: {SPANS} spans at {:.2} M spans/s: {events} in the trace, {dropped} dropped ({:.1} % kept)",
        SPANS as f64 / took.as_secs_f64() / 1e6,
        events as f64 * 100.0 / SPANS as f64,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing to run.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for _ in 0..3 {
        step_latency();
    }
    for _ in 0..3 {
        burst(Some(4.5e6));
    }
    for _ in 0..3 {
        burst(None);
    }
}
