#![allow(missing_docs)] // criterion_group! generates an undocumented fn.
//! Decoding throughput over synthetic buffers in the 12.9 and 13.5 layouts: a realistic mix of
//! kernels, runtime calls, external-correlation records, copies and sets, decoded and linked to
//! external ids exactly as the live pipeline does. Target: ≥ 20 M records/s single-threaded.

use std::hint::black_box;
use std::mem::size_of;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kinetrace_cupti::decode::{decode_batch, CStrNames, Decoder, ExternalIds, RecordIter};
use kinetrace_cupti::sys::{v12, v13};
use kinetrace_cupti::Release;

static NAMES: [&std::ffi::CStr; 4] = [c"gemm_kernel", c"elementwise_add", c"softmax", c"reduce"];

fn push<T>(buf: &mut Vec<u8>, v: &T) {
    // SAFETY: plain-data record structs, fully initialised from Default.
    buf.extend_from_slice(unsafe {
        std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>())
    });
}

macro_rules! kernel {
    ($t:ty, $corr:expr) => {{
        let mut k: $t = Default::default();
        k.kind = 10;
        k.start = 1_700_000_000_000_000_000 + $corr as u64 * 1000;
        k.end = k.start + 500;
        k.streamId = 7 + ($corr % 2);
        k.gridX = 64;
        k.blockX = 128;
        k.correlationId = $corr;
        k.name = NAMES[$corr as usize % 4].as_ptr();
        k
    }};
}

/// `records` records: per launch, one external-correlation, one runtime and one GPU record
/// (3 kernels : 1 memcpy : 1 memset).
fn buffer(release: Release, records: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut corr = 1u32;
    while buf.len() / 8 < records * 8 && count(&buf, release) < records {
        let ext = v12::CUpti_ActivityExternalCorrelation {
            kind: 39,
            externalKind: 5,
            externalId: corr as u64 / 10 + 1,
            correlationId: corr,
            ..Default::default()
        };
        push(&mut buf, &ext);
        let api = v12::CUpti_ActivityAPI {
            kind: 5,
            cbid: 211,
            start: 1,
            end: 2,
            processId: 1,
            threadId: 2,
            correlationId: corr,
            returnValue: 0,
        };
        push(&mut buf, &api);
        match (corr % 5, release >= Release::V13_5) {
            (0, false) => push(
                &mut buf,
                &v12::CUpti_ActivityMemcpy6 {
                    kind: 1,
                    copyKind: 1,
                    bytes: 4096,
                    correlationId: corr,
                    ..Default::default()
                },
            ),
            (0, true) => push(
                &mut buf,
                &v13::CUpti_ActivityMemcpy7 {
                    kind: 1,
                    copyKind: 1,
                    bytes: 4096,
                    correlationId: corr,
                    ..Default::default()
                },
            ),
            (1, false) => push(
                &mut buf,
                &v12::CUpti_ActivityMemset4 {
                    kind: 2,
                    bytes: 4096,
                    correlationId: corr,
                    ..Default::default()
                },
            ),
            (1, true) => push(
                &mut buf,
                &v13::CUpti_ActivityMemset5 {
                    kind: 2,
                    bytes: 4096,
                    correlationId: corr,
                    ..Default::default()
                },
            ),
            (_, false) => push(&mut buf, &kernel!(v12::CUpti_ActivityKernel9, corr)),
            (_, true) => push(&mut buf, &kernel!(v13::CUpti_ActivityKernel13, corr)),
        }
        corr += 1;
    }
    buf
}

fn count(buf: &[u8], release: Release) -> usize {
    RecordIter::new(buf, release.layout()).count()
}

fn bench(c: &mut Criterion) {
    for (label, release) in [
        ("cupti_12_9", Release::V12_9),
        ("cupti_13_5", Release::V13_5),
    ] {
        let buf = buffer(release, 30_000);
        let n = count(&buf, release);
        let mut g = c.benchmark_group("decode");
        g.throughput(Throughput::Elements(n as u64));
        // SAFETY: the only name pointers in these buffers point at the 'static NAMES.
        let names = unsafe { CStrNames::new() };
        let mut decoder = Decoder::new(release.layout(), names, false);
        let mut ids = ExternalIds::default();
        let mut pending = Vec::with_capacity(n);
        g.bench_function(label, |b| {
            b.iter(|| {
                let mut kernels = 0u64;
                decode_batch(
                    &mut decoder,
                    &mut ids,
                    RecordIter::new(black_box(&buf), release.layout()),
                    &mut pending,
                    &mut |a| {
                        kernels += a.external_id.is_some() as u64;
                    },
                );
                black_box(kernels)
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
