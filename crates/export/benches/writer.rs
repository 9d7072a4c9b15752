//! Exporter throughput on a realistic mix: per launch, a runtime call with its flow start and a kernel
//! with full args and its flow end; plus CPU ops and copies. Peer figure (not measured here): PyTorch
//! 2.15's exporter writes 0.53 M events/s (136 MB/s) on this class of machine, per the foundation issue.

#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
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
                    graph_node_id: None,
                }),
            });
        }
        corr += 1;
    }
    v.truncate(n);
    v
}

fn bench(c: &mut Criterion) {
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

    let mut g = c.benchmark_group("export");
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
    g.bench_function("sink_to_file_100k_records", |b| {
        b.iter(|| {
            let target = TraceDir {
                dir: dir.path().to_owned(),
                worker: "bench".into(),
                gzip: false,
            };
            let mut sink: Box<dyn Sink> =
                Box::new(KinetoSink::create(target, &window).expect("sink"));
            for a in &acts {
                sink.record(a).expect("write");
            }
            let out = sink
                .finish(&TraceMeta {
                    window_start: acts[0].start,
                    window_end: acts[acts.len() - 1].end,
                    ..Default::default()
                })
                .expect("finish");
            std::fs::remove_file(out.path.expect("path")).expect("cleanup");
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
