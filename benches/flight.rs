//! The flight recorder's cost, side by side in one run (`cargo bench --bench flight`; prints a
//! table, no criterion statistics):
//!
//! - **always-on overhead**: a training-like loop of 10 ms steps (a fixed amount of arithmetic per
//!   step, calibrated to 10 ms without the profiler), each with 40 `record_function` annotations
//!   and 20 `cudaLaunchKernel` calls through the fake libcupti (a runtime API call and a kernel
//!   record each), without a profiler and with `flight_recorder(60s)`, in alternating blocks
//!   (`KINETRACE_FLIGHT_BLOCKS`, default 10, of 100 steps each way); the step's wall time, the
//!   training thread's CPU time, and the CPU time kinetrace's own threads take per step; then
//!   the same with 1,000 op spans per step (a framework recording its ops). Only this part:
//!   `KINETRACE_FLIGHT_OVERHEAD_ONLY=1`.
//! - **a dump of a full span**: the buffer filled to the cap (256 MiB of records) by a burst of
//!   spans, then a dump; how long the collector takes to write it (trigger to `on_trace_ready`),
//!   and the step times of a loop running meanwhile.
//! - **memory over a soak**: RSS sampled every second while the loop runs at a high event rate
//!   with a 64 MiB cap (so the cap binds), for `KINETRACE_SOAK_SECS` (default 60) seconds.

#![allow(missing_docs)]

use std::ffi::{c_char, CString};
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kinetrace::{record_function, FlightSpan, FlightTrigger, Profiler};
use kinetrace_cupti::{CuptiConfig, CuptiSource};

type Launch = unsafe extern "C" fn(*const c_char, u32, u64) -> u32;

struct Fake {
    _lib: libloading::Library,
    launch: Launch,
}

fn fake() -> Fake {
    let path = kinetrace_test_support::fake::fake_cupti();
    // SAFETY: (bench) the fake libcupti's initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&path) }.expect("the fake libcupti loads");
    // SAFETY: (bench) the fake exports it with this signature.
    let launch = *unsafe { lib.get::<Launch>(b"fake_cupti_launch_kernel\0") }.unwrap();
    Fake { _lib: lib, launch }
}

fn profiler(
    dir: &std::path::Path,
    cap: usize,
    ready: Option<Arc<Mutex<Option<Instant>>>>,
) -> Profiler {
    let lib = kinetrace_test_support::fake::fake_cupti();
    let mut b = Profiler::builder()
        .output_dir(dir)
        .source(CuptiSource::new(CuptiConfig {
            library: Some(lib.clone()),
            driver: Some(lib),
            ..CuptiConfig::default()
        }))
        .flight_recorder(FlightSpan::Time(Duration::from_secs(60)))
        .flight_memory(cap)
        .flight_slow_step(None)
        .log(|m| eprintln!("kinetrace: {m}"));
    if let Some(r) = ready {
        b = b.on_trace_ready(move |_| *r.lock().unwrap() = Some(Instant::now()));
    }
    b.start().expect("profiler starts")
}

/// Arithmetic that takes about `units` × the calibrated unit.
fn work(units: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..units {
        x = black_box(x.rotate_left(7) ^ i).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }
    x
}

/// One training-like step: `units` of work split around 40 annotations and 20 kernel launches.
fn step(f: &Fake, names: &[CString], units: u64) {
    let per = units / 20;
    for name in names.iter().take(20) {
        let _a = record_function("layer");
        let _b = record_function("linear");
        // SAFETY: (bench) a NUL-terminated name, plain values.
        unsafe { (f.launch)(name.as_ptr(), 7, 50_000) };
        black_box(work(per));
    }
}

/// This thread's CPU time, in ms.
fn thread_cpu() -> f64 {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn cpu_clock(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: (bench) a valid clock id and a timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// The step times of one mode (ms), and the CPU time the process's other threads used meanwhile.
#[derive(Default)]
struct Blocks {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    other_cpu: f64,
}

impl Blocks {
    fn run(&mut self, body: impl FnOnce(&mut Self)) {
        let (p, t) = (cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID), thread_cpu());
        body(self);
        self.other_cpu += (cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID) - p) - (thread_cpu() - t);
    }

    fn step(&mut self, wall: Instant, cpu: f64) {
        self.wall.push(wall.elapsed().as_secs_f64() * 1e3);
        self.cpu.push(thread_cpu() - cpu);
    }
}

/// `n` op-like spans (a framework's ops, each a span while a profiler records).
fn ops_step(n: usize) {
    for _ in 0..n {
        drop(black_box(record_function("aten::linear")));
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

fn main() {
    let mut m_off = 0.0;
    let f = fake();
    let names: Vec<CString> = (0..20)
        .map(|k| CString::new(format!("sgemm_{k}")).unwrap())
        .collect();
    // Calibrate: units for a 10 ms step without a profiler.
    let t = Instant::now();
    black_box(work(10_000_000));
    let units = (10_000_000.0 * 0.010 / t.elapsed().as_secs_f64()) as u64;
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "flight recorder bench: Activity is {} bytes; step = {units} work units",
        std::mem::size_of::<kinetrace::activity::Activity>()
    );

    // `KINETRACE_SOAK_ONLY=1`: the soak alone, in a process that has not held the 256 MiB span of
    // part 2 (the allocator keeps memory it was given back, which would hide the soak's own).
    if std::env::var("KINETRACE_SOAK_ONLY").as_deref() == Ok("1") {
        soak(&f, &names, units, dir.path());
        return;
    }
    // 1. Always-on overhead: alternating blocks of 100 steps, off and on. Wall time is what the
    // job sees, but on a shared machine other processes' work lands in it; the training thread's
    // own CPU time is what recording adds to the step on a core of its own, and the CPU time of
    // kinetrace's threads (the collector) is what it takes from the rest of the machine.
    let blocks: usize = std::env::var("KINETRACE_FLIGHT_BLOCKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    for (label, ops) in [
        ("without per-op spans", 0),
        ("with 1,000 op spans per step", 1000),
    ] {
        let (mut off, mut on) = (Blocks::default(), Blocks::default());
        for _ in 0..blocks {
            off.run(|b| {
                for _ in 0..100 {
                    let w = Instant::now();
                    let c = thread_cpu();
                    step(&f, &names, units);
                    ops_step(ops);
                    b.step(w, c);
                }
            });
            let p = profiler(dir.path(), 256 << 20, None);
            on.run(|b| {
                for _ in 0..100 {
                    let w = Instant::now();
                    let c = thread_cpu();
                    step(&f, &names, units);
                    ops_step(ops);
                    p.step();
                    b.step(w, c);
                }
            });
            drop(p);
        }
        let (w_off, w_on) = (median(&mut off.wall), median(&mut on.wall));
        let (c_off, c_on) = (median(&mut off.cpu), median(&mut on.cpu));
        let other = (on.other_cpu - off.other_cpu) / on.wall.len() as f64;
        println!(
            "always-on, {label} (40 annotations + 20 kernel launches per step, {} steps each \
             way, medians): wall {w_off:.3} -> {w_on:.3} ms ({:+.2} %); training thread CPU \
             {c_off:.3} -> {c_on:.3} ms ({:+.2} %); kinetrace's other threads {:.1} us CPU per \
             step ({:.2} % of a step)",
            off.wall.len(),
            100.0 * (w_on - w_off) / w_off,
            100.0 * (c_on - c_off) / c_off,
            other * 1e3,
            100.0 * other / c_off,
        );
        if ops == 0 {
            m_off = w_off;
        }
    }

    // `KINETRACE_FLIGHT_OVERHEAD_ONLY=1`: part 1 alone.
    if std::env::var("KINETRACE_FLIGHT_OVERHEAD_ONLY").as_deref() == Ok("1") {
        return;
    }
    // 2. A dump of a full 256 MiB span, with the loop running while it is written.
    let ready = Arc::new(Mutex::new(None));
    let p = profiler(dir.path(), 256 << 20, Some(ready.clone()));
    let per_record = std::mem::size_of::<kinetrace::activity::Activity>();
    let target = (256usize << 20) / per_record;
    let t = Instant::now();
    for i in 0..target {
        drop(black_box(record_function("burst")));
        if i % 10_000 == 0 {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    println!(
        "filled: {target} spans in {:.1} s, RSS {:.0} MiB",
        t.elapsed().as_secs_f64(),
        rss_mib()
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut during = Vec::new();
    let t0 = Instant::now();
    p.flight_dump(FlightTrigger::Request("bench".into()))
        .expect("dump queued");
    let written = loop {
        let t = Instant::now();
        step(&f, &names, units);
        p.step();
        during.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(at) = *ready.lock().unwrap() {
            break at.duration_since(t0);
        }
        if t0.elapsed() > Duration::from_secs(120) {
            panic!("no dump after 120 s");
        }
    };
    let out = p.outputs();
    let bytes = out
        .last()
        .and_then(|o| o.path.as_ref())
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let events = out.last().map_or(0, |o| o.events);
    let steps_during = during.len();
    println!(
        "dump: {events} events, {:.0} MiB of JSON written in {:.2} s; {steps_during} steps ran \
         meanwhile, median {:.3} ms, max {:.3} ms (off: {m_off:.3} ms)",
        bytes as f64 / (1 << 20) as f64,
        written.as_secs_f64(),
        median(&mut during.clone()),
        during.iter().cloned().fold(0.0, f64::max),
    );
    drop(p);
    for o in std::fs::read_dir(dir.path())
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::remove_file(o.path());
    }

    soak(&f, &names, units, dir.path());
}

/// 3. Memory over a soak: a 64 MiB cap reached quickly (200 spans per step on top).
fn soak(f: &Fake, names: &[CString], units: u64, dir: &std::path::Path) {
    let secs: u64 = std::env::var("KINETRACE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let before = rss_mib();
    let p = profiler(dir, 64 << 20, None);
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(secs) {
        for _ in 0..200 {
            drop(black_box(record_function("soak")));
        }
        step(f, names, units);
        p.step();
        if start.elapsed() >= next {
            samples.push(rss_mib());
            next += Duration::from_secs(1);
        }
    }
    let half = &samples[samples.len() / 2..];
    println!(
        "soak: {secs} s, 64 MiB cap; RSS (MiB) before {before:.0}, at 1 s {:.0}, at the half \
         {:.0}, max of the second half {:.0}, at the end {:.0}",
        samples.get(1).copied().unwrap_or(0.0),
        half[0],
        half.iter().cloned().fold(0.0, f64::max),
        samples.last().copied().unwrap_or(0.0)
    );
    drop(p);
}
