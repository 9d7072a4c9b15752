//! The path of SDK records through kinetrace, measured with the functions the live source runs:
//! the buffer callback's copy of each record into the queue (`queue_records`, given record headers
//! as the SDK passes them), and the collector's drain of the queue into `Activity`s
//! (`decode::drain`), which looks up each GPU record's call (`External id`, HIP stream, launched
//! function) in the table the API callback fills at ENTER. Kineto's budget for CUPTI is 20 M
//! records/s; this measures the same for
//! - `kernel_dispatch`: a buffer of 4096 dispatch records (16 kernels, 4 streams, interleaved);
//! - `memory_copy`: a buffer of 4096 copy records;
//! - `step_mix`: what a training step queues: 4096 HIP calls with their arguments (as the API
//!   callback queues them at EXIT: launches, `hipMemcpyAsync`, `hipMemsetAsync`), then the buffer
//!   of their GPU records (dispatches, copies, ROCclr fill dispatches that become memsets), all
//!   counted.
//!
//! `cargo bench -p kinetrace-rocm --bench decode`
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::collections::HashMap;
use std::ffi::c_void;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kinetrace_rocm::decode::{drain, Decoder};
use kinetrace_rocm::external::{CallInfo, ExternalIds};
use kinetrace_rocm::queue::Queue;
use kinetrace_rocm::record::{ApiRec, RawArgs};
use kinetrace_rocm::sys::{
    v1, AgentId, AsyncCorrelationId, Dim3, KernelDispatchInfo, KernelDispatchRecord, QueueId,
    RecordHeader, UserData, BUFFER_CATEGORY_TRACING,
};
use kinetrace_rocm::{queue_records, Kinds};

const N: usize = 4096;
const DISPATCH: u32 = 11;
const COPY: u32 = 10;
const LAUNCH: u32 = 214;
const MEMCPY_ASYNC: u32 = 268;
const MEMSET_ASYNC: u32 = 293;
const HTOD: u32 = 2;
const KERNELS: u64 = 16;
/// Kernel id of the ROCclr fill kernel (`__amd_rocclr_fillBufferAligned`).
const FILL: u64 = KERNELS;
const STREAM: u64 = 0x5555_0000_1000;

fn kinds() -> Kinds {
    Kinds {
        kernel_dispatch: DISPATCH as i32,
        memory_copy: COPY as i32,
        hip_runtime_api: 1,
        code_object: 2,
        kernel_symbol_register: 3,
        memory_allocation: None,
        markers: None,
    }
}

fn dispatch(correlation: u64, kernel_id: u64, queue: u64) -> KernelDispatchRecord {
    KernelDispatchRecord {
        size: std::mem::size_of::<KernelDispatchRecord>() as u64,
        kind: DISPATCH,
        operation: 2,
        correlation_id: AsyncCorrelationId {
            internal: correlation,
            external: UserData::default(),
        },
        thread_id: 1234,
        start_timestamp: 1_000 + correlation * 10,
        end_timestamp: 1_005 + correlation * 10,
        dispatch_info: KernelDispatchInfo {
            size: 72,
            agent_id: AgentId { handle: 0x200 },
            queue_id: QueueId { handle: queue },
            kernel_id,
            dispatch_id: correlation,
            private_segment_size: 0,
            group_segment_size: 1024,
            workgroup_size: Dim3 { x: 256, y: 1, z: 1 },
            grid_size: Dim3 {
                x: 65_536,
                y: 4,
                z: 1,
            },
            reserved_padding: [0; 56],
        },
    }
}

fn copy(correlation: u64) -> v1::MemoryCopyRecord {
    v1::MemoryCopyRecord {
        size: std::mem::size_of::<v1::MemoryCopyRecord>() as u64,
        kind: COPY,
        operation: HTOD,
        correlation_id: AsyncCorrelationId {
            internal: correlation,
            external: UserData::default(),
        },
        thread_id: 1234,
        start_timestamp: 1_000 + correlation * 10,
        end_timestamp: 1_005 + correlation * 10,
        dst_agent_id: AgentId { handle: 0x200 },
        src_agent_id: AgentId { handle: 0x100 },
        bytes: 4096,
        dst_address: 0x7f00_0000_0000,
        src_address: 0x5500_0000_0000,
    }
}

/// One SDK buffer: its records and the header array the buffer callback is given.
struct Buffer {
    _dispatches: Vec<KernelDispatchRecord>,
    _copies: Vec<v1::MemoryCopyRecord>,
    _headers: Vec<RecordHeader>,
    pointers: Vec<*mut RecordHeader>,
}

impl Buffer {
    /// `order[i]`: whether record `i` is a copy (else a dispatch) and its correlation id and
    /// kernel id.
    fn new(order: &[(bool, u64, u64)]) -> Buffer {
        let mut dispatches: Vec<_> = order
            .iter()
            .filter(|o| !o.0)
            .map(|&(_, c, k)| dispatch(c, k, 0xa000 + c % 4))
            .collect();
        let mut copies: Vec<_> = order.iter().filter(|o| o.0).map(|o| copy(o.1)).collect();
        let (mut d, mut c) = (0, 0);
        let mut headers: Vec<RecordHeader> = order
            .iter()
            .map(|o| {
                let (kind, payload) = if o.0 {
                    c += 1;
                    (COPY, &mut copies[c - 1] as *mut _ as *mut c_void)
                } else {
                    d += 1;
                    (DISPATCH, &mut dispatches[d - 1] as *mut _ as *mut c_void)
                };
                RecordHeader {
                    category: BUFFER_CATEGORY_TRACING,
                    kind,
                    payload,
                }
            })
            .collect();
        let pointers = headers.iter_mut().map(|h| h as *mut RecordHeader).collect();
        Buffer {
            _dispatches: dispatches,
            _copies: copies,
            _headers: headers,
            pointers,
        }
    }

    fn queue(&self, kinds: &Kinds, queue: &Queue) -> u64 {
        // SAFETY: `pointers` holds `len` pointers to headers of this buffer, whose payloads are
        // whole records of the sizes they state, alive as long as `self`.
        unsafe { queue_records(kinds, self.pointers.as_ptr(), self.pointers.len(), queue) }
    }
}

fn decoder() -> Decoder {
    Decoder::new(
        &[
            (LAUNCH as i32, "hipLaunchKernel".into()),
            (MEMCPY_ASYNC as i32, "hipMemcpyAsync".into()),
            (MEMSET_ASYNC as i32, "hipMemsetAsync".into()),
        ],
        &[(HTOD as i32, "MEMORY_COPY_HOST_TO_DEVICE".into())],
        HashMap::from([(0x200, 0)]),
        0,
        false,
    )
}

fn kernel_name(id: u64) -> Option<String> {
    Some(if id == FILL {
        "__amd_rocclr_fillBufferAligned".into()
    } else {
        format!("kernel_{id}")
    })
}

/// What each call of the step is: 0 a launch, 1 a copy, 2 a memset.
fn call_kind(i: u64) -> u8 {
    match i % 16 {
        5 | 13 => 1,
        9 => 2,
        _ => 0,
    }
}

/// The HIP call `correlation`, as the API callback queues it at EXIT.
fn api(correlation: u64) -> ApiRec {
    let args = match call_kind(correlation) {
        0 => RawArgs::Launch {
            function: 0x7e00_0000 + correlation % KERNELS,
            stream: STREAM + correlation % 4,
            grid: [256, 4, 1],
            block: [256, 1, 1],
            shared: 0,
        },
        1 => RawArgs::Copy {
            stream: Some(STREAM),
            src: 0x5500_0000_0000,
            dst: 0x7f00_0000_0000,
            size: 4096,
            kind: 1,
        },
        _ => RawArgs::Fill {
            stream: Some(STREAM),
            dst: 0x7f00_0000_0000,
            bytes: 4096,
        },
    };
    ApiRec {
        operation: [LAUNCH, MEMCPY_ASYNC, MEMSET_ASYNC][call_kind(correlation) as usize],
        correlation,
        tid: 1234,
        start: correlation * 10,
        end: correlation * 10 + 3,
        external: 1 + correlation / 8,
        args,
    }
}

/// What the API callback remembered at ENTER for `correlation`'s GPU records.
fn call_info(correlation: u64) -> CallInfo {
    let ApiRec { args, external, .. } = api(correlation);
    CallInfo {
        external,
        stream: args.stream(),
        function: args.function(),
        bytes: args.fill_bytes(),
    }
}

fn bench(c: &mut Criterion) {
    let kinds = kinds();
    let queue = Queue::new(4 * N);
    let external = ExternalIds::new();
    for corr in 1..=N as u64 {
        external.set_call(corr, call_info(corr));
    }
    let mut g = c.benchmark_group("sdk_buffer");
    let run =
        |g: &mut criterion::BenchmarkGroup<_>, label: &str, buffer: &Buffer, api: &[ApiRec]| {
            let mut d = decoder();
            g.throughput(Throughput::Elements(
                (buffer.pointers.len() + api.len()) as u64,
            ));
            g.bench_function(label, |b| {
                b.iter(|| {
                    for call in api {
                        queue.push(&black_box(call).to_words());
                    }
                    let skipped = buffer.queue(&kinds, &queue);
                    let mut n = 0u64;
                    drain(&queue, &mut d, kernel_name, &external, &mut |a| {
                        n += a.end.0 + a.external_id.unwrap_or(0)
                    });
                    black_box((n, skipped))
                })
            });
            // Every record was queued and mapped: none refused or skipped.
            assert_eq!(queue.refused(), 0);
        };

    let order: Vec<_> = (1..=N as u64).map(|c| (false, c, c % KERNELS)).collect();
    run(&mut g, "kernel_dispatch", &Buffer::new(&order), &[]);
    let order: Vec<_> = (1..=N as u64).map(|c| (true, c, 0)).collect();
    run(&mut g, "memory_copy", &Buffer::new(&order), &[]);
    let order: Vec<_> = (1..=N as u64)
        .map(|c| match call_kind(c) {
            0 => (false, c, c % KERNELS),
            1 => (true, c, 0),
            _ => (false, c, FILL),
        })
        .collect();
    let calls: Vec<ApiRec> = (1..=N as u64).map(api).collect();
    run(&mut g, "step_mix", &Buffer::new(&order), &calls);
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
