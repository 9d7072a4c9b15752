//! Reader throughput on the largest reference trace (`ns_resolution_trace`, 68k events, 15 MB of
//! JSON, float absolute µs), found at `<repo>/../shared/traces`; when that folder is absent, on a
//! synthetic trace of the same shape. Throughput is reported per byte of decompressed JSON.
//! Peer figure: Python's `json.loads` alone takes about 200 ms (77 MB/s) on that file here.

#![allow(missing_docs)]

use std::io::Read;
use std::path::{Path, PathBuf};

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kinetrace_export::reader::{for_each_event_from_reader, read_trace, read_trace_from_reader};

fn reference_trace() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../../shared/traces/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    );
    p.is_file().then_some(p)
}

/// A trace shaped like Kineto's pretty-printed output: runtime calls, kernels and flows.
fn synthetic(n: usize) -> Vec<u8> {
    let mut s = String::from("{\n  \"schemaVersion\": 1,\n  \"traceEvents\": [\n");
    let mut ts_ns: u64 = 1_712_195_495_519_836_506;
    for i in 0..n {
        if i > 0 {
            s.push_str(",\n");
        }
        ts_ns += 1_537;
        let ts = format!("{}.{:03}", ts_ns / 1000, ts_ns % 1000);
        match i % 3 {
            0 => s.push_str(&format!(
                "  {{\n    \"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 1102, \"tid\": 1262,\n    \"ts\": {ts}, \"dur\": 6.121,\n    \"args\": {{\n      \"External id\": {i},\"cbid\": 211, \"correlation\": {i}\n    }}\n  }}"
            )),
            1 => s.push_str(&format!(
                "  {{\n    \"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*, float const*)\", \"pid\": 0, \"tid\": 7,\n    \"ts\": {ts}, \"dur\": 2.240,\n    \"args\": {{\n      \"External id\": {i},\n      \"queued\": 0, \"device\": 0, \"context\": 1,\n      \"stream\": 7, \"correlation\": {i},\n      \"registers per thread\": 16,\n      \"shared memory\": 0,\n      \"blocks per SM\": 0.5,\n      \"warps per SM\": 2.0,\n      \"grid\": [54, 1, 1],\n      \"block\": [128, 1, 1],\n      \"est. achieved occupancy %\": 3\n    }}\n  }}"
            )),
            _ => s.push_str(&format!(
                "  {{\n    \"ph\": \"f\", \"id\": {i}, \"pid\": 0, \"tid\": 7, \"ts\": {ts},\n    \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"\n  }}"
            )),
        }
    }
    s.push_str("\n  ],\n  \"traceName\": \"synthetic.json\"\n}\n");
    s.into_bytes()
}

fn bench(c: &mut Criterion) {
    let path = reference_trace();
    let plain = match &path {
        Some(p) => {
            let gz = std::fs::read(p).unwrap();
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(gz.as_slice())
                .read_to_end(&mut out)
                .unwrap();
            out
        }
        None => {
            eprintln!("reference trace absent: benchmarking a synthetic trace instead");
            synthetic(68_692)
        }
    };
    let name = Path::new("bench.json");
    let events = read_trace_from_reader(name, plain.as_slice())
        .unwrap()
        .events
        .len();
    eprintln!(
        "{events} events, {:.1} MB of JSON",
        plain.len() as f64 / 1e6
    );

    let mut g = c.benchmark_group("reader");
    g.throughput(Throughput::Bytes(plain.len() as u64));
    g.sample_size(20);
    if let Some(p) = &path {
        g.bench_function("read_trace(ns_resolution .json.gz)", |b| {
            b.iter(|| black_box(read_trace(p).unwrap().events.len()))
        });
    }
    g.bench_function("read_trace_from_reader(plain JSON in memory)", |b| {
        b.iter(|| {
            black_box(
                read_trace_from_reader(name, plain.as_slice())
                    .unwrap()
                    .events
                    .len(),
            )
        })
    });
    g.bench_function("for_each_event_from_reader(plain JSON in memory)", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for_each_event_from_reader(name, plain.as_slice(), |e, _| {
                n += usize::from(e.stream.is_some());
            })
            .unwrap();
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
