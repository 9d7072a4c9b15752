//! The demo workload: a program that profiles itself.
//!
//! A toy "training loop" runs 8 steps. Each step opens `forward`/`backward`/`optimizer` ranges and
//! launches kernels, copies and sets on a simulated GPU (two streams), so the full pipeline — thread
//! rings, the schedule, the collector, the Kineto exporter — runs without a GPU. The schedule is
//! `wait=1, warmup=1, active=2, repeat=2, skip_first=1`, PyTorch's documentation example, so two
//! trace files are written, holding steps 3–4 and 7–8.
//!
//! Run: `cargo run --release --example demo [-- OUTPUT_DIR]`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kinetrace::activity::{MemcpyKind, MemoryKind};
use kinetrace::{record_function, record_function_dyn, Profiler, Schedule};
use kinetrace_test_support::SimulatedGpu;

fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "kinetrace-traces/demo".into());
    let gpu = SimulatedGpu::new(0);
    let schedule = Schedule::new(1, 1, 2)
        .expect("valid schedule")
        .with_repeat(2)
        .with_skip_first(1);
    let profiler = match Profiler::builder()
        .schedule(schedule)
        .output_dir(&dir)
        .worker_name("demo")
        .source(gpu.clone())
        .on_trace_ready(|t| {
            if let Some(p) = &t.path {
                eprintln!("trace ready: cycle {} -> {}", t.cycle, p.display());
            }
        })
        .start()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("demo: cannot start the profiler: {e}");
            std::process::exit(2);
        }
    };

    let started = Instant::now();
    for _step in 0..10 {
        {
            let _fwd = record_function("forward");
            gpu.memcpy(
                MemcpyKind::HtoD,
                MemoryKind::Pinned,
                MemoryKind::Device,
                4 << 20,
                7,
                60_000,
            );
            for layer in 0..4 {
                let _l = record_function_dyn(&format!("layer{layer}"));
                gpu.launch_kernel("ampere_sgemm_128x64_tn", 7, 120_000);
                gpu.launch_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", 7, 30_000);
                busy(Duration::from_micros(40));
            }
        }
        {
            let _bwd = record_function("backward");
            for _ in 0..4 {
                gpu.launch_kernel("ampere_sgemm_64x64_nn", 7, 150_000);
                busy(Duration::from_micros(40));
            }
            gpu.launch_kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                13,
                300_000,
            );
        }
        {
            let _opt = record_function("optimizer");
            gpu.memset(1 << 20, 7, 8_000);
            gpu.launch_kernel(
                "void at::native::multi_tensor_apply_kernel<Adam>",
                7,
                40_000,
            );
            gpu.synchronize_stream(7);
        }
        busy(Duration::from_millis(1));
        profiler.step();
    }
    let written = profiler.stop();
    let wall = started.elapsed();

    println!(
        "kinetrace demo: 10 steps in {:.1} ms, {} trace file(s) in {dir}",
        wall.as_secs_f64() * 1e3,
        written.len()
    );
    for t in &written {
        let Some(path) = &t.path else { continue };
        let trace = match kinetrace::export::read_trace(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("demo: cannot read back {}: {e}", path.display());
                std::process::exit(1);
            }
        };
        let mut by_cat: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
        let mut steps = Vec::new();
        for e in &trace.events {
            if e.ph != kinetrace::export::reader::Phase::Complete {
                continue;
            }
            let cat = e.cat.map(|c| trace.str(c)).unwrap_or("");
            let dur_us = e.dur_ns() as f64 / 1e3;
            let entry = by_cat.entry(cat).or_default();
            entry.0 += 1;
            entry.1 += dur_us;
            let name = trace.str(e.name);
            if name.starts_with("ProfilerStep#") {
                steps.push(format!("{name} {dur_us:.0} us"));
            }
        }
        println!(
            "\n{} ({} events, cycle {})",
            path.display(),
            t.events,
            t.cycle
        );
        println!("  {:<18} {:>7} {:>12}", "category", "events", "total (us)");
        for (cat, (n, us)) in &by_cat {
            println!("  {cat:<18} {n:>7} {us:>12.1}");
        }
        println!("  steps: {}", steps.join(", "));
    }
}
