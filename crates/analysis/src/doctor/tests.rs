//! Each rule on a small constructed trace that shows its fault, and on one that does not.
//!
//! The base is a healthy step: `ProfilerStep#N` of 10 ms whose GPU is busy from 50 µs to 9.95 ms
//! with one long GEMM launched early. Each test adds a fault (or its harmless look-alike) to it.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::*;
use crate::load::TraceSource;

const STEP: i64 = 10_000;

struct Trace {
    ev: Vec<Value>,
    corr: i64,
    meta: Vec<(&'static str, Value)>,
}

impl Trace {
    fn new() -> Trace {
        Trace {
            ev: Vec::new(),
            corr: 1000,
            meta: Vec::new(),
        }
    }

    fn x(&mut self, cat: &str, name: &str, (pid, tid): (i64, i64), ts: i64, dur: i64, args: Value) {
        self.ev.push(
            json!({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
            "ts": ts, "dur": dur, "args": args}),
        );
    }

    fn step(&mut self, n: i64, ts: i64, dur: i64) {
        self.x(
            "user_annotation",
            &format!("ProfilerStep#{n}"),
            (1, 1),
            ts,
            dur,
            json!({}),
        );
    }

    fn op(&mut self, name: &str, ts: i64, dur: i64) {
        self.x("cpu_op", name, (1, 1), ts, dur, json!({}));
    }

    fn annotation(&mut self, name: &str, ts: i64, dur: i64) {
        self.x("user_annotation", name, (1, 1), ts, dur, json!({}));
    }

    /// A runtime call with a fresh correlation id, which it returns.
    fn call(&mut self, name: &str, ts: i64, dur: i64) -> i64 {
        self.corr += 1;
        let c = self.corr;
        self.x(
            "cuda_runtime",
            name,
            (1, 1),
            ts,
            dur,
            json!({"correlation": c}),
        );
        c
    }

    fn gpu(&mut self, cat: &str, name: &str, stream: i64, ts: i64, dur: i64, corr: i64) {
        self.x(
            cat,
            name,
            (0, stream),
            ts,
            dur,
            json!({"stream": stream, "correlation": corr, "device": 0}),
        );
    }

    /// `cudaLaunchKernel` at `at` (5 µs) and its kernel on stream 7.
    fn launch(&mut self, name: &str, at: i64, ts: i64, dur: i64) {
        let c = self.call("cudaLaunchKernel", at, 5);
        self.gpu("kernel", name, 7, ts, dur, c);
    }

    /// A `[memory]` event on device 0.
    fn memory(&mut self, ts: i64, allocated: i64, reserved: i64) {
        self.ev.push(
            json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": 1, "tid": 1, "ts": ts, "args": {"Total Reserved": reserved,
            "Total Allocated": allocated, "Bytes": 1, "Device Id": 0, "Device Type": 1}}),
        );
    }

    /// A healthy step at `ts`: the GPU busy from +50 µs to +9.95 ms.
    fn healthy_step(&mut self, n: i64, ts: i64) {
        self.step(n, ts, STEP);
        self.op("aten::mm", ts + 10, 30);
        self.launch("sm90_xmma_gemm_bf16bf16_bf16f32", ts + 20, ts + 50, 9_900);
    }

    fn bytes(&self, rank: i64) -> Vec<u8> {
        let mut doc = json!({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
            "traceEvents": self.ev});
        for (k, v) in &self.meta {
            doc[*k] = v.clone();
        }
        serde_json::to_vec(&doc).unwrap()
    }
}

fn run(traces: &[&Trace]) -> DoctorReport {
    let sources: Vec<TraceSource> = traces
        .iter()
        .enumerate()
        .map(|(rank, t)| TraceSource::Memory {
            name: PathBuf::from(format!("rank{rank}.json")),
            bytes: t.bytes(rank as i64),
        })
        .collect();
    let r = doctor_sources(&sources, Vec::new(), &DoctorOptions::default(), &|_| {});
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    r
}

fn rules(r: &DoctorReport) -> Vec<&'static str> {
    r.findings.iter().map(|f| f.rule).collect()
}

fn get<'a>(r: &'a DoctorReport, rule: &str) -> &'a Finding {
    r.findings
        .iter()
        .find(|f| f.rule == rule)
        .unwrap_or_else(|| panic!("no {rule} finding in {:#?}", r.findings))
}

/// Three healthy steps #10..#12, with `fault` applied to each step's start time.
fn steps_with(fault: impl Fn(&mut Trace, i64)) -> Trace {
    let mut t = Trace::new();
    for k in 0..3 {
        let ts = 1_000_000 + k * STEP;
        t.healthy_step(10 + k, ts);
        fault(&mut t, ts);
    }
    t
}

/// Three steps whose GPU work is split around a hole at [4 ms, 6 ms), with `fault` in the hole.
fn steps_with_hole(fault: impl Fn(&mut Trace, i64)) -> Trace {
    let mut t = Trace::new();
    for k in 0..3 {
        let ts = 1_000_000 + k * STEP;
        t.step(10 + k, ts, STEP);
        t.launch("sm90_xmma_gemm_bf16bf16_bf16f32", ts + 20, ts + 50, 3_950);
        t.launch(
            "sm90_xmma_gemm_bf16bf16_bf16f32",
            ts + 5_990,
            ts + 6_000,
            3_950,
        );
        t.op("aten::mm", ts + 3_000, 30);
        fault(&mut t, ts);
    }
    t
}

#[test]
fn a_healthy_trace_has_no_findings() {
    let t = steps_with(|_, _| {});
    let r = run(&[&t, &t]);
    assert_eq!(rules(&r), Vec::<&str>::new());
    assert_eq!(r.ranks.len(), 2);
    assert_eq!(r.ranks[0].steps, 3);
    assert_eq!(r.ranks[0].mean_step_us, Some(Us(10_000.0)));
}

#[test]
fn sync_in_step() {
    // aten::item blocks until the first kernel ends (4 ms); the next launch comes at 6 ms.
    let t = steps_with_hole(|t, ts| {
        t.op("aten::item", ts + 300, 3_800);
        t.x(
            "cpu_op",
            "aten::_local_scalar_dense",
            (1, 1),
            ts + 305,
            3_790,
            json!({}),
        );
        t.call("cudaMemcpyAsync", ts + 310, 10);
        t.call("cudaStreamSynchronize", ts + 320, 3_700);
    });
    let r = run(&[&t]);
    let f = get(&r, "sync-in-step");
    // Idle from the sync's end (4.02 ms) to the next kernel (6 ms): 1980 µs per step.
    assert_eq!(f.cost_per_step_us, Some(Us(1980.0)));
    assert_eq!(f.evidence[0].what, "aten::item → cudaStreamSynchronize");
    assert_eq!(
        (f.evidence[0].count, f.evidence[0].count_per_step),
        (3, 1.0)
    );
    assert_eq!(f.examples.len(), 3);
    assert_eq!(f.examples[0].name, "cudaStreamSynchronize");
    assert!(f.per_step);

    // The same sync while another stream keeps the GPU busy, and a sync after the loop: quiet.
    let t = steps_with(|t, ts| {
        t.op("aten::item", ts + 300, 3_800);
        t.call("cudaStreamSynchronize", ts + 320, 3_700);
    });
    let mut t2 = steps_with(|_, _| {});
    t2.call("cudaDeviceSynchronize", 1_000_000 + 3 * STEP + 100, 500);
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
    assert_eq!(rules(&run(&[&t2])), Vec::<&str>::new());
}

#[test]
fn input_bound() {
    let name = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__";
    let t = steps_with_hole(|t, ts| t.annotation(name, ts + 4_000, 2_000));
    let r = run(&[&t]);
    let f = get(&r, "input-bound");
    assert_eq!(f.cost_per_step_us, Some(Us(2000.0)));
    assert_eq!(
        (f.evidence[0].what.as_str(), f.evidence[0].count),
        (name, 3)
    );
    // The host stall rule does not count the same wait again.
    assert!(!rules(&r).contains(&"host-stall"), "{:?}", rules(&r));

    // The same fetch while the GPU is busy (prefetching works): quiet.
    let t = steps_with(|t, ts| t.annotation(name, ts + 4_000, 2_000));
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
}

/// 300 kernels of 10 µs per step, each launched when the previous one has finished (or, for the
/// healthy variant, all queued up front).
fn storm(queued: bool) -> Trace {
    let mut t = Trace::new();
    for k in 0..3 {
        let ts = 1_000_000 + k * STEP;
        t.step(10 + k, ts, STEP);
        for j in 0..300 {
            let (at, run_at) = if queued {
                (ts + 10 + j * 6, ts + 2_000 + j * 10)
            } else {
                (ts + 10 + j * 25, ts + 20 + j * 25)
            };
            t.launch("vectorized_elementwise_kernel<add>", at, run_at, 10);
        }
    }
    t
}

#[test]
fn small_op_storm() {
    let r = run(&[&storm(false)]);
    let f = get(&r, "small-op-storm");
    // 299 gaps of 15 µs per step.
    assert_eq!(f.cost_per_step_us, Some(Us(299.0 * 15.0)));
    assert_eq!(f.evidence[0].count, 900);
    assert!(
        f.summary.starts_with("300 kernels per step"),
        "{}",
        f.summary
    );
    assert_eq!(f.examples[0].name, "GPU waits for the next launch");

    // The same kernels queued ahead of the GPU: no launch wait.
    let r = run(&[&storm(true)]);
    assert!(!rules(&r).contains(&"small-op-storm"), "{:?}", rules(&r));

    // 220 kernels of 40 µs, launched every 45 µs: the GPU waits 5 µs before each (11% of the
    // step), but launching costs the host far less than the GPU's work, so the gaps are launch
    // latency, not a storm: quiet.
    let mut t = Trace::new();
    for k in 0..3 {
        let ts = 1_000_000 + k * STEP;
        t.step(10 + k, ts, STEP);
        for j in 0..220 {
            t.launch(
                "elementwise_kernel<mul>",
                ts + 10 + j * 45,
                ts + 20 + j * 45,
                40,
            );
        }
    }
    assert!(!rules(&run(&[&t])).contains(&"small-op-storm"));
}

#[test]
fn exposed_communication() {
    let nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
    let t = steps_with_hole(|t, ts| {
        let c = t.call("cudaLaunchKernel", ts + 100, 5);
        t.gpu("kernel", nccl, 20, ts + 4_000, 2_000, c);
    });
    let r = run(&[&t]);
    let f = get(&r, "exposed-communication");
    assert_eq!(f.cost_per_step_us, Some(Us(2000.0)));
    assert_eq!(f.evidence[0].count, 3);
    assert!(
        f.summary.contains("0 of 3 collectives start after"),
        "{}",
        f.summary
    );

    // Overlapped with the GEMM: quiet.
    let t = steps_with(|t, ts| {
        let c = t.call("cudaLaunchKernel", ts + 100, 5);
        t.gpu("kernel", nccl, 20, ts + 1_000, 2_000, c);
    });
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
}

/// A rank whose steps compute for `compute` µs while an all-reduce runs until 9.95 ms.
fn rank_with_compute(compute: i64) -> Trace {
    let mut t = Trace::new();
    for k in 0..3 {
        let ts = 1_000_000 + k * STEP;
        t.step(10 + k, ts, STEP);
        t.launch("sm90_xmma_gemm_bf16bf16_bf16f32", ts + 20, ts + 50, compute);
        let c = t.call("cudaLaunchKernel", ts + 30, 5);
        t.gpu(
            "kernel",
            "ncclKernel_AllReduce_RING_LL_Sum_float",
            20,
            ts + 50,
            9_900,
            c,
        );
    }
    t
}

#[test]
fn straggler_rank() {
    let (fast, slow) = (rank_with_compute(3_000), rank_with_compute(6_000));
    let r = run(&[&fast, &slow, &fast]);
    let f = get(&r, "straggler-rank");
    assert_eq!(f.ranks, [1]);
    assert_eq!(f.cost_per_step_us, Some(Us(3000.0)));
    assert!(
        f.summary
            .starts_with("rank 1 had the most compute in 3 of 3"),
        "{}",
        f.summary
    );
    assert_eq!(f.evidence.len(), 3);
    // The steps where it was furthest behind, on the straggler, at their place in the file.
    let e = &f.examples[0];
    assert_eq!((e.rank, e.name.as_str()), (1, "ProfilerStep#10"));
    assert_eq!(
        (e.at_ms, e.ts_us, e.dur_us),
        (0.0, 1_000_000.0, Us(10_000.0))
    );
    assert_eq!(f.examples[2].ts_us, 1_020_000.0);

    // Equal ranks whose communication is overlapped: quiet.
    let even = rank_with_compute(9_900);
    let r = run(&[&even, &even, &even]);
    assert_eq!(rules(&r), Vec::<&str>::new());
}

#[test]
fn dtype_casts() {
    let copy = "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>";
    let cast = |t: &mut Trace, ts: i64, kernel: bool| {
        t.op("aten::linear", ts + 100, 200);
        t.op("aten::to", ts + 110, 100);
        t.x("cpu_op", "aten::_to_copy", (1, 1), ts + 111, 98, json!({}));
        t.x("cpu_op", "aten::copy_", (1, 1), ts + 112, 96, json!({}));
        if kernel {
            let c = t.call("cudaLaunchKernel", ts + 115, 5);
            t.gpu("kernel", copy, 8, ts + 4_000, 500, c);
        } else {
            let c = t.call("cudaMemcpyAsync", ts + 115, 5);
            t.gpu(
                "gpu_memcpy",
                "Memcpy HtoD (Pinned -> Device)",
                8,
                ts + 4_000,
                500,
                c,
            );
        }
    };
    let r = run(&[&steps_with(|t, ts| cast(t, ts, true))]);
    let f = get(&r, "dtype-casts");
    assert_eq!(f.cost_per_step_us, Some(Us(500.0)));
    assert_eq!(f.evidence[0].what, "aten::to under aten::linear");
    assert_eq!(f.examples[0].name, copy);

    // A host-to-device copy under aten::to is a memcpy, not a cast: quiet.
    let r = run(&[&steps_with(|t, ts| cast(t, ts, false))]);
    assert_eq!(rules(&r), Vec::<&str>::new());
}

#[test]
fn fp32_gemm() {
    let with = |t: &mut Trace, ts: i64| {
        let c = t.call("cudaLaunchKernel", ts + 25, 5);
        t.gpu("kernel", "ampere_sgemm_128x64_nn", 8, ts + 100, 2_000, c);
    };
    let r = run(&[&steps_with(with)]);
    let f = get(&r, "fp32-gemm");
    assert_eq!(f.cost_per_step_us, Some(Us(1000.0)));
    assert_eq!(f.evidence[0].what, "ampere_sgemm_128x64_nn");

    // An fp32 run (no half-precision GEMM at all): quiet.
    let mut t = Trace::new();
    for k in 0..3 {
        let ts = 1_000_000 + k * STEP;
        t.step(10 + k, ts, STEP);
        t.launch("ampere_sgemm_128x64_nn", ts + 20, ts + 50, 9_900);
    }
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
}

#[test]
fn per_parameter_optimizer() {
    let opt = |t: &mut Trace, ts: i64, foreach: bool| {
        t.annotation("Optimizer.step#AdamW.step", ts + 7_000, 2_500);
        for j in 0..200 {
            let name = if foreach {
                "aten::_foreach_add_"
            } else {
                "aten::add_"
            };
            t.op(name, ts + 7_010 + j * 12, 10);
        }
    };
    let r = run(&[&steps_with(|t, ts| opt(t, ts, false))]);
    let f = get(&r, "per-parameter-optimizer");
    assert_eq!(f.cost_per_step_us, Some(Us(2000.0)));
    assert_eq!(
        (f.evidence[0].what.as_str(), f.evidence[0].count),
        ("aten::add_", 600)
    );
    assert_eq!(f.examples[0].name, "Optimizer.step#AdamW.step");

    let r = run(&[&steps_with(|t, ts| opt(t, ts, true))]);
    assert_eq!(rules(&r), Vec::<&str>::new());
}

#[test]
fn recompute_in_backward() {
    // Backward runs on its own thread (tid 2), as the autograd engine does.
    let bwd = |t: &mut Trace, ts: i64, node: &str, op: &str| {
        t.x(
            "cpu_op",
            &format!("autograd::engine::evaluate_function: {node}"),
            (1, 2),
            ts + 100,
            300,
            json!({}),
        );
        t.x("cpu_op", op, (1, 2), ts + 110, 200, json!({}));
        t.corr += 1;
        let c = t.corr;
        t.x(
            "cuda_runtime",
            "cudaLaunchKernel",
            (1, 2),
            ts + 120,
            5,
            json!({"correlation": c}),
        );
        t.gpu(
            "kernel",
            "sm90_xmma_gemm_bf16bf16_bf16f32_nt",
            8,
            ts + 500,
            1_000,
            c,
        );
    };
    let r = run(&[&steps_with(|t, ts| {
        bwd(t, ts, "CheckpointFunctionBackward", "aten::linear")
    })]);
    let f = get(&r, "recompute-in-backward");
    assert_eq!(f.cost_per_step_us, Some(Us(1000.0)));
    assert_eq!(
        f.evidence[0].what,
        "aten::linear inside CheckpointFunctionBackward"
    );
    assert_eq!(f.evidence[0].count, 3);

    // An ordinary backward node launching its gradient GEMM: quiet.
    let r = run(&[&steps_with(|t, ts| {
        bwd(t, ts, "AddmmBackward0", "aten::mm")
    })]);
    assert_eq!(rules(&r), Vec::<&str>::new());
}

#[test]
fn allocator_churn() {
    let r = run(&[&steps_with_hole(|t, ts| {
        t.op("aten::empty", ts + 3_990, 130);
        t.call("cudaFree", ts + 4_000, 100);
    })]);
    let f = get(&r, "allocator-churn");
    // Steps 2 and 3: the call (100 µs) and the idle after it until 6 ms (1900 µs).
    assert_eq!(f.cost_per_step_us, Some(Us(2000.0)));
    assert_eq!(f.evidence[0].what, "aten::empty → cudaFree");
    assert_eq!(f.evidence[0].count, 2);

    // Allocations in the first step only (the caching allocator warming up): quiet.
    let mut t = steps_with(|_, _| {});
    t.call("cudaMalloc", 1_000_000 + 5_000, 100);
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
}

#[test]
fn memory_pressure() {
    const GIB: i64 = 1 << 30;
    let devices = json!([{"id": 0, "name": "H100", "totalGlobalMem": 80 * GIB}]);
    // Near capacity: 75 of 80 GiB reserved.
    let mut t = steps_with(|_, _| {});
    t.meta.push(("deviceProperties", devices.clone()));
    t.memory(1_000_100, 60 * GIB, 75 * GIB);
    let r = run(&[&t]);
    let f = get(&r, "memory-pressure");
    assert!(
        f.summary
            .contains("75.00 GiB reserved at the peak, 94% of its 80.00 GiB"),
        "{}",
        f.summary
    );
    assert_eq!(f.cost_per_step_us, None);
    // Fragmentation: at the allocation peak, 5 GiB reserved for 2 GiB allocated.
    let mut t = steps_with(|_, _| {});
    t.memory(1_000_100, 2 * GIB, 5 * GIB);
    let f = &run(&[&t]).findings[0];
    assert_eq!(f.rule, "memory-pressure");
    assert_eq!(
        f.evidence[0].what,
        "device 0: reserved ≥ 1.5× allocated at the peak"
    );

    // The cache kept after the peak (reserved far above allocated later, not at the peak), and
    // half the device reserved: quiet.
    let mut t = steps_with(|_, _| {});
    t.meta.push(("deviceProperties", devices));
    t.memory(1_000_100, 30 * GIB, 40 * GIB);
    t.memory(1_005_000, 5 * GIB, 40 * GIB);
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
}

#[test]
fn host_stall() {
    // Nothing at all happens in the hole, on any thread.
    let r = run(&[&steps_with_hole(|_, _| {})]);
    let f = get(&r, "host-stall");
    // From the GPU's last work (4 ms) to the next launch call (5.99 ms).
    assert_eq!(f.cost_per_step_us, Some(Us(1990.0)));
    assert_eq!(f.evidence[0].what, "(nothing recorded)");
    assert_eq!(f.examples.len(), 3);

    // A Python frame open across the gap names it.
    let r = run(&[&steps_with_hole(|t, ts| {
        t.x(
            "python_function",
            "train.py(42): log_metrics",
            (1, 1),
            ts + 3_500,
            2_500,
            json!({}),
        );
    })]);
    assert_eq!(
        get(&r, "host-stall").evidence[0].what,
        "train.py(42): log_metrics"
    );

    // A garbage collection over most of the gap names it, before the frame around it, and the
    // summary says how much of the stall was collections.
    let r = run(&[&steps_with_hole(|t, ts| {
        t.x(
            "python_function",
            "train.py(42): log_metrics",
            (1, 1),
            ts + 3_500,
            2_500,
            json!({}),
        );
        t.x(
            "user_annotation",
            "python::gc (gen 2)",
            (1, 1),
            ts + 4_200,
            1_600,
            json!({}),
        );
    })]);
    let f = get(&r, "host-stall");
    assert_eq!(
        f.evidence[0].what,
        "python::gc (gen 2) (garbage collection)"
    );
    assert!(
        f.summary.contains("in Python garbage collection"),
        "{}",
        f.summary
    );
    // One covering less than half of it does not.
    let r = run(&[&steps_with_hole(|t, ts| {
        t.x(
            "user_annotation",
            "python::gc (gen 0)",
            (1, 1),
            ts + 4_100,
            300,
            json!({}),
        );
    })]);
    let f = get(&r, "host-stall");
    assert_eq!(f.evidence[0].what, "(nothing recorded)");
    assert!(
        f.summary.contains("in Python garbage collection"),
        "{}",
        f.summary
    );

    // Gaps of 0.9 ms are ordinary overhead: quiet.
    let t = steps_with_hole(|t, ts| {
        for j in 0..2 {
            t.op("aten::add", ts + 4_000 + j * 950, 50);
        }
    });
    assert!(!rules(&run(&[&t])).contains(&"host-stall"));
}

#[test]
fn warmup_in_window() {
    let mut t = Trace::new();
    for k in 0..3 {
        t.healthy_step(k, 1_000_000 + k * STEP);
    }
    let r = run(&[&t]);
    assert_eq!(rules(&r), ["warmup-in-window"]);
    let f = get(&r, "warmup-in-window");
    assert_eq!((f.severity, f.cost_per_step_us), (Severity::Info, None));
    assert_eq!(f.examples[0].name, "ProfilerStep#0");

    // A slow first step later in the run.
    let mut t = steps_with(|_, _| {});
    t.ev.retain(|e| e["name"] != "ProfilerStep#10");
    t.step(10, 1_000_000 - 10_000, STEP + 10_000);
    t.op("aten::cudnn_convolution", 1_000_000 - 10_000, 10_000);
    assert_eq!(rules(&run(&[&t])), ["warmup-in-window"]);
    assert!(get(&run(&[&t]), "warmup-in-window").fix.contains("cuDNN"));
}

#[test]
fn warmup_advice_fits_a_cpu_only_job() {
    let mut t = Trace::new();
    for k in 0..3 {
        t.step(k, 1_000_000 + k * STEP, STEP);
        t.op("aten::addmm", 1_000_000 + k * STEP + 100, 9_000);
    }
    let r = run(&[&t]);
    let f = get(&r, "warmup-in-window");
    assert!(
        !f.fix.contains("cuDNN") && !f.fix.contains("CUDA"),
        "{}",
        f.fix
    );
    assert!(f.fix.contains("oneDNN"), "{}", f.fix);
}

#[test]
fn graphs_compiled_regions_and_drops_are_said_once() {
    let mut t = steps_with(|t, ts| {
        let c = t.call("cudaGraphLaunch", ts + 30, 5);
        t.gpu(
            "kernel",
            "triton_poi_fused_add_cos_sin_0",
            8,
            ts + 100,
            20,
            c,
        );
    });
    t.meta
        .push(("dropped_events", json!({"cpu_ring": 5, "cupti": 0})));
    t.meta.push((
        "INFO",
        json!(["INFO:2024 x.cpp:1] Record counts: Out-of-range = 9, CUPTI stopped early? = 1"]),
    ));
    let r = run(&[&t, &t]);
    assert_eq!(
        rules(&r),
        ["trace-drops", "compiled-regions", "cuda-graphs"],
        "{:#?}",
        r.findings
    );
    let drops = get(&r, "trace-drops");
    assert_eq!(drops.ranks, [0, 1]);
    let what: Vec<&str> = drops.evidence.iter().map(|e| e.what.as_str()).collect();
    assert!(
        what.contains(&"kinetrace dropped_events.cpu_ring"),
        "{what:?}"
    );
    assert!(
        what.iter().any(|w| w.contains("CUPTI stopped early? = 1")),
        "{what:?}"
    );
    assert_eq!(get(&r, "cuda-graphs").evidence[0].count, 3);

    // No drops recorded, and Kineto's out-of-range count alone: quiet.
    let mut t = steps_with(|_, _| {});
    t.meta.push(("dropped_events", json!({"cpu_ring": 0})));
    t.meta.push((
        "INFO",
        json!(["INFO:2024 x.cpp:1] Record counts: Out-of-range = 9, CUPTI stopped early? = 0"]),
    ));
    assert_eq!(rules(&run(&[&t])), Vec::<&str>::new());
}

#[test]
fn findings_are_sorted_by_cost_and_merged_across_ranks() {
    let name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let small = steps_with_hole(|t, ts| t.annotation(name, ts + 4_000, 1_000));
    let large = steps_with_hole(|t, ts| {
        t.annotation(name, ts + 4_000, 2_000);
        t.op("aten::item", ts + 300, 3_800);
        t.call("cudaStreamSynchronize", ts + 320, 3_600);
    });
    let r = run(&[&small, &large]);
    let input = get(&r, "input-bound");
    assert_eq!(input.ranks, [0, 1]);
    // The worst rank's numbers lead; both ranks' evidence is there.
    assert_eq!(input.cost_per_step_us, Some(Us(2000.0)));
    assert_eq!(input.examples[0].rank, 1);
    assert_eq!(input.evidence.len(), 2);
    let costs: Vec<f64> = r
        .findings
        .iter()
        .map(|f| f.cost_per_step_us.map_or(-1.0, |c| c.0))
        .collect();
    assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{costs:?}");
}

#[test]
fn every_rule_is_documented() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/doctor.md"),
    )
    .expect("docs/doctor.md");
    for rule in RULES {
        assert!(
            doc.contains(&format!("`{}`", rule.id)),
            "docs/doctor.md does not describe `{}`",
            rule.id
        );
    }
    let mut ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), RULES.len(), "rule ids are unique");
}
