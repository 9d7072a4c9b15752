//! Raw ring throughput: one push, and push+drain in batches, of a full-size record.

#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kinetrace_core::clock::Ticks;
use kinetrace_core::recorder::CpuRecord;
use kinetrace_core::ring::ring;
use kinetrace_core::{NameId, UnixNanos};

fn record(i: u64) -> CpuRecord {
    CpuRecord::Span {
        name: NameId(1),
        annotation: true,
        start: Ticks(i),
        end: Ticks(i + 10),
        id: i,
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(1024));
    let (mut w, mut r) = ring::<CpuRecord>(4096);
    g.bench_function("push_1024_then_drain", |b| {
        b.iter(|| {
            for i in 0..1024 {
                let _ = w.try_push(black_box(record(i)));
            }
            r.drain(|v| {
                black_box(v);
            })
        })
    });
    g.finish();
    let mut g = c.benchmark_group("clock");
    g.bench_function("unix_nanos_now", |b| b.iter(|| black_box(UnixNanos::now())));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
