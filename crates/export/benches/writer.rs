//! Exporter throughput on a realistic mix: per launch, a runtime call with its flow start and a kernel
//! with full args and its flow end; plus CPU ops and copies. Peer figure (not measured here): PyTorch
//! 2.15's exporter writes 0.53 M events/s (136 MB/s) on this class of machine, per the foundation issue.
//!
//! Each figure is measured twice: in wall time (group `export`) and in the process's CPU time, all
//! threads (group `export_on_cpu`), which a loaded machine disturbs much less.

#![allow(missing_docs)]

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kinetrace_core::activity::*;
use kinetrace_core::{intern, Sink, TraceMeta, UnixNanos, WindowInfo};
use kinetrace_export::writer::{KinetoSink, TraceDir, TraceEncoder};

const BASE: u64 = 1_790_857_026_000_000_000;

fn mix(n: usize) -> Vec<Activity> {
    let kernels = [
        intern("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*, float const*)"),
        intern("ampere_sgemm_128x64_tn"),
        intern("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"),
    ];
    let launch = intern("cudaLaunchKernel");
    let op = intern("aten::addmm");
    let mut v = Vec::with_capacity(n);
    let mut t = BASE + 5_000_000_000_000;
    let mut corr = 1;
    while v.len() < n {
        t += 1_537;
        v.push(Activity {
            start: UnixNanos(t),
            end: UnixNanos(t + 8_123),
            correlation: None,
            external_id: Some(corr),
            detail: Detail::CpuOp(CpuSpan {
                name: op,
                pid: 4242,
                tid: 4243,
                args: Default::default(),
            }),
        });
        v.push(Activity {
            start: UnixNanos(t + 100),
            end: UnixNanos(t + 4_100),
            correlation: Some(corr),
            external_id: Some(corr),
            detail: Detail::Runtime(ApiCall {
                name: launch,
                cbid: Some(211),
                pid: 4242,
                tid: 4243,
                launches_work: true,
                args: Default::default(),
            }),
        });
        for k in 0..2 {
            v.push(Activity {
                start: UnixNanos(t + 10_000 + k * 20_000),
                end: UnixNanos(t + 25_731 + k * 20_000),
                correlation: Some(corr),
                external_id: Some(corr),
                detail: Detail::Kernel(Kernel {
                    name: kernels[(corr as usize + k as usize) % 3],
                    device: 0,
                    context: Some(1),
                    stream: 7,
                    grid: Some([1024, 1, 1]),
                    block: Some([256, 1, 1]),
                    registers_per_thread: Some(32),
                    shared_memory: Some(0),
                    queued: None,
                    graph_id: None,
                    kind_arg: false,
                    graph_node_id: None,
                }),
            });
        }
        corr += 1;
    }
    v.truncate(n);
    v
}

/// The finished trace, removed when dropped: outside the measured part (criterion drops a batched
/// routine's output after timing it), since deleting a trace is no part of writing one.
struct Written(std::path::PathBuf);

impl Drop for Written {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).expect("cleanup");
    }
}

fn bench<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let acts = mix(100_000);
    let window = WindowInfo {
        rank: Some(0),
        world_size: Some(1),
        ..Default::default()
    };
    let mut bytes = Vec::with_capacity(64 << 20);
    let mut enc = TraceEncoder::begin(&window, BASE, &mut bytes);
    bytes.clear();
    for a in &acts {
        enc.event(a, &mut bytes);
    }
    eprintln!(
        "mix: {} records -> {} bytes ({} B/record incl. flows)",
        acts.len(),
        bytes.len(),
        bytes.len() / acts.len()
    );

    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(acts.len() as u64));
    g.sample_size(20);
    g.bench_function("encode_100k_records", |b| {
        b.iter(|| {
            bytes.clear();
            let mut enc = TraceEncoder::begin(&window, BASE, &mut bytes);
            for a in &acts {
                enc.event(a, &mut bytes);
            }
            black_box(bytes.len())
        })
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let target = TraceDir {
        dir: dir.path().to_owned(),
        worker: "bench".into(),
        gzip: false,
        file_name: None,
        place: None,
    };
    let meta = TraceMeta {
        window_start: acts[0].start,
        window_end: acts[acts.len() - 1].end,
        ..Default::default()
    };
    // Open, stream every record, finish and rename: all a window's trace costs.
    g.bench_function("sink_to_file_100k_records", |b| {
        b.iter_batched(
            || target.clone(),
            |target| {
                let mut sink: Box<dyn Sink> =
                    Box::new(KinetoSink::create(target, &window).expect("sink"));
                for a in &acts {
                    sink.record(a).expect("write");
                }
                Written(sink.finish(&meta).expect("finish").path.expect("path"))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn wall(c: &mut Criterion) {
    bench(c, "export");
}

fn on_cpu(c: &mut Criterion<OnCpu>) {
    bench(c, "export_on_cpu");
}

/// CPU time of this process, all threads (the writer thread too), user and kernel, as the kernel
/// accounts it in `/proc/self/stat`. On a machine shared with other work this stays close to what
/// the work costs on a quiet one, where wall time also counts the time other processes had the CPU.
/// It is in clock ticks (1/100 s), which the sums over many iterations average out.
struct OnCpu;

fn on_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("(comm)") + 2..];
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse::<u64>().expect("utime/stime"))
        .sum();
    // USER_HZ is 100 on Linux.
    ticks * 10_000_000
}

impl Measurement for OnCpu {
    type Intermediate = u64;
    type Value = Duration;

    fn start(&self) -> u64 {
        on_cpu_ns()
    }
    fn end(&self, start: u64) -> Duration {
        Duration::from_nanos(on_cpu_ns().saturating_sub(start))
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NanosFormatter
    }
}

/// Values in nanoseconds, shown in ms and Melem/s like criterion's wall-time figures.
struct NanosFormatter;

impl ValueFormatter for NanosFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e6);
        "ms (on CPU)"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let n = match *t {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n,
        };
        values.iter_mut().for_each(|v| *v = n as f64 * 1e3 / *v);
        "M/s (on CPU)"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

criterion_group!(benches, wall);
criterion_group! {
    name = on_cpu_benches;
    config = Criterion::default().with_measurement(OnCpu);
    targets = on_cpu
}
criterion_main!(benches, on_cpu_benches);
