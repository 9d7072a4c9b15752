//! The path of one SDK record through kinetrace: copied out of the SDK's record in the buffer
//! callback (`Raw::of_dispatch` / `Raw::of_copy`), through the lock-free queue, and mapped to an
//! `Activity` on the collector side. Kineto's budget for CUPTI is 20 M records/s; this measures
//! the same for a buffer of 4096 dispatch records and of 4096 copy records.
//!
//! `cargo bench -p kinetrace-rocm --bench decode`
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::collections::HashMap;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kinetrace_rocm::decode::Decoder;
use kinetrace_rocm::queue::Queue;
use kinetrace_rocm::record::Raw;
use kinetrace_rocm::sys::{
    v0, AgentId, AsyncCorrelationId, Dim3, KernelDispatchInfo, KernelDispatchRecord, QueueId,
    UserData,
};

const N: usize = 4096;

fn dispatches() -> Vec<KernelDispatchRecord> {
    (0..N as u64)
        .map(|i| KernelDispatchRecord {
            size: 184,
            kind: 11,
            operation: 2,
            correlation_id: AsyncCorrelationId {
                internal: i + 1,
                external: UserData::default(),
            },
            thread_id: 1234,
            start_timestamp: 1_000 + i * 10,
            end_timestamp: 1_005 + i * 10,
            dispatch_info: KernelDispatchInfo {
                size: 72,
                agent_id: AgentId { handle: 0x200 },
                queue_id: QueueId {
                    handle: 0xa000 + (i % 4),
                },
                kernel_id: i % 16,
                dispatch_id: i,
                private_segment_size: 0,
                group_segment_size: 0,
                workgroup_size: Dim3 { x: 256, y: 1, z: 1 },
                grid_size: Dim3 {
                    x: 65_536,
                    y: 1,
                    z: 1,
                },
                reserved_padding: [0; 56],
            },
        })
        .collect()
}

fn copies() -> Vec<v0::MemoryCopyRecord> {
    (0..N as u64)
        .map(|i| v0::MemoryCopyRecord {
            size: 96,
            kind: 10,
            operation: 2,
            correlation_id: v0::CorrelationId {
                internal: i + 1,
                external: UserData::default(),
            },
            thread_id: 1234,
            start_timestamp: 1_000 + i * 10,
            end_timestamp: 1_005 + i * 10,
            dst_agent_id: AgentId { handle: 0x200 },
            src_agent_id: AgentId { handle: 0x100 },
            bytes: 4096,
        })
        .collect()
}

fn decoder() -> Decoder {
    Decoder::new(
        &[(214, "hipLaunchKernel".into())],
        &[(2, "MEMORY_COPY_HOST_TO_DEVICE".into())],
        HashMap::from([(0x200, 0)]),
        0,
        false,
    )
}

fn bench(c: &mut Criterion) {
    let queue = Queue::new(N);
    let mut g = c.benchmark_group("sdk_buffer");
    g.throughput(Throughput::Elements(N as u64));
    let names: Vec<String> = (0..16).map(|i| format!("kernel_{i}")).collect();
    let records = dispatches();
    let mut d = decoder();
    g.bench_function("kernel_dispatch", |b| {
        b.iter(|| {
            for r in &records {
                queue.push(&Raw::of_dispatch(black_box(r)).to_words());
            }
            let mut n = 0u64;
            while let Some(w) = queue.pop() {
                let raw = Raw::from_words(&w).unwrap();
                let a = d.decode(&raw, |id| Some(names[id as usize].clone()), |_| None);
                n += a.map_or(0, |a| a.end.0);
            }
            black_box(n)
        })
    });
    let records = copies();
    g.bench_function("memory_copy", |b| {
        b.iter(|| {
            for r in &records {
                queue.push(&Raw::of_copy(black_box(r)).to_words());
            }
            let mut n = 0u64;
            while let Some(w) = queue.pop() {
                let raw = Raw::from_words(&w).unwrap();
                let a = d.decode(&raw, |_| None, |_| None);
                n += a.map_or(0, |a| a.end.0);
            }
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
