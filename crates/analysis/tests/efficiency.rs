//! The efficiency and collectives sections on the real traces in `../shared/traces` (against
//! TraceLens 0.1.0, AMD-AGI/TraceLens commit 171dd747, run here on the same files with
//! `TraceLens_generate_perf_report_pytorch` and `TraceLens_generate_multi_rank_collective_
//! report_pytorch`; its figures are quoted as facts) and on constructed traces whose numbers are
//! worked out by hand.

use std::path::{Path, PathBuf};

use kinetrace_analysis::efficiency::{Bound, Category, PeakOverride};
use kinetrace_analysis::{
    analyze, analyze_sources, discover, doctor_sources, DoctorOptions, Options, Report, TraceSource,
};
use serde_json::{json, Value};

fn shared_traces() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    assert!(
        p.is_dir(),
        "the reference traces are missing: expected ../shared/traces next to the project root ({})",
        p.display()
    );
    p
}

fn run_dir(dir: &Path, peaks: PeakOverride) -> Report {
    let (files, problems) = discover(&[dir.to_owned()]);
    let opts = Options {
        peaks,
        ..Options::default()
    };
    analyze(&files, problems, &opts, &|_| {})
}

fn run(traces: Vec<Value>, peaks: PeakOverride) -> Report {
    let sources: Vec<TraceSource> = traces
        .into_iter()
        .enumerate()
        .map(|(i, t)| TraceSource::Memory {
            name: format!("rank{i}.json").into(),
            bytes: serde_json::to_vec(&t).unwrap(),
        })
        .collect();
    let opts = Options {
        jobs: 1,
        peaks,
        ..Options::default()
    };
    analyze_sources(&sources, Vec::new(), &opts, &|_| {})
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn amd_trace_categories_and_gemms_against_tracelens() {
    let r = run_dir(&shared_traces().join("amd_trace"), PeakOverride::default());
    let e = &r.efficiency;
    // "AMD Radeon Graphics" with 104 CUs: one GCD of an MI250.
    assert_eq!(e.devices[0].matched, Some("AMD MI250 (one GCD)"));
    assert!(e.notes.is_empty(), "{:?}", e.notes);
    // GPU time by category. TraceLens (ops_summary_by_category): elementwise 10 ops 78.80 µs,
    // GEMM 2 ops 37.12 µs, reduce 24.64 µs, multi_tensor_apply 8.48 µs. Its elementwise holds
    // aten::copy_'s two HtoD memcpys (38.161 µs); here they are memcpy, and the optimizer's
    // multi-tensor kernel is elementwise: 78.80 − 38.16 + 8.48 = 49.12 µs.
    let cats: Vec<(Category, u64, f64)> = e
        .categories
        .iter()
        .map(|c| (c.category, c.rows, c.time_us.0))
        .collect();
    assert_eq!(
        cats,
        [
            (Category::Elementwise, 9, 49.121),
            (Category::Memcpy, 2, 38.161),
            (Category::Gemm, 3, 37.12),
            (Category::Reduction, 2, 24.64),
        ]
    );
    // addmm launched a copy kernel (first, 6.88 µs) and the GEMM kernel (17.6 µs): both count,
    // as GEMM (its category is the op's, not its first kernel's).
    let addmm = e.ops.iter().find(|o| o.op == "aten::addmm").unwrap();
    assert_eq!(addmm.time_us.0, 24.48);
    assert_eq!((addmm.flops, addmm.bytes), (164_480.0, Some(71_168.0)));
    // TraceLens: TFLOPS/s 0.00671895960905555 (its kernel time 24.47998046875 µs, a float32
    // sum); here 164,480 / 24.48 µs.
    assert!(close(addmm.tflops_per_s.0, 164_480.0 / 24.48e-6 / 1e12));
    // Roofline on the MI250 GCD: compute 164,480 / 45.25 TFLOP/s (fp32 matrix) = 3.6 ns,
    // memory 71,168 B / 1.6384 TB/s = 43.4 ns: memory-bound, 43.4 ns of 24.48 µs = 0.18%.
    assert_eq!(addmm.bound, Some(Bound::Memory));
    assert!(close(
        addmm.roofline_fraction.0,
        71_168.0 / 1.6384e3 / 24_480.0
    ));
    let mm = e.ops.iter().find(|o| o.op == "aten::mm").unwrap();
    assert_eq!(
        (mm.flops, mm.bytes, mm.time_us.0),
        (163_840.0, Some(70_656.0), 12.64)
    );
    // The reduction TraceLens gets wrong (dim [0] ignored: 2,564 bytes): 3,072.
    let sum = e.ops.iter().find(|o| o.op == "aten::sum").unwrap();
    assert_eq!(sum.bytes, Some(3_072.0));
    // The copies are a memcpy group, not elementwise.
    let copy = e.ops.iter().find(|o| o.op == "aten::copy_").unwrap();
    assert_eq!(
        (copy.category, copy.calls, copy.time_us.0),
        (Category::Memcpy, 2, 38.161)
    );
}

#[test]
fn trace_filter_needs_no_flows_no_strides_and_no_device_properties() {
    // TraceLens stops on these files: "ValueError: No GPU events found in the trace" (no ac2g
    // flows). Their kernels carry External ids; elementwise ops have no Input Strides.
    let base = shared_traces().join("trace_filter");
    let r = run_dir(&base, PeakOverride::default());
    let e = &r.efficiency;
    let total: f64 = e.categories.iter().map(|c| c.time_us.0).sum();
    let kernels: i64 = r
        .kernel_type_breakdown_per_rank
        .iter()
        .filter(|k| !k.kernel_type.contains("overlapping"))
        .map(|k| k.sum_us)
        .sum();
    assert!(total > 0.0 && kernels > 0);
    let bmm = e
        .ops
        .iter()
        .find(|o| o.op == "aten::bmm" && o.shapes == "2048×606×160, 2048×160×20")
        .unwrap();
    // 8 calls of 2·2048·606·20·160 = 7,942,963,200 FLOPs.
    assert_eq!((bmm.calls, bmm.flops), (8, 8.0 * 7_942_963_200.0));
    assert_eq!(bmm.params, "B=2048 M=606 N=20 K=160");
    assert!(bmm.roofline_fraction.get().is_none());
    // Elementwise without strides: tanh([2048,160]) has a model.
    assert!(e.ops.iter().any(|o| o.op == "aten::tanh"));
    // No deviceProperties: one line says why there is no roofline, once per rank.
    assert_eq!(e.notes.len(), 1, "{:?}", e.notes);
    assert!(e.notes[0].contains("no deviceProperties"), "{:?}", e.notes);
    // Peaks from the command line give the roofline: mm(8192×512 · 512×8192) fp32 is
    // compute-bound (intensity 227.6 FLOP/B).
    let r = run_dir(
        &base,
        PeakOverride {
            tflops: Some(19.5),
            tb_per_s: Some(1.555),
        },
    );
    let mm = r
        .efficiency
        .ops
        .iter()
        .find(|o| o.op == "aten::mm" && o.params == "M=8192 N=8192 K=512")
        .unwrap();
    assert_eq!(mm.bound, Some(Bound::Compute));
    // 4 × 2·8192·8192·512 = 274,877,906,944 FLOPs at 19.5 TFLOP/s = 14.10 ms of 5.114 ms.
    assert!(close(
        mm.roofline_fraction.0,
        274_877_906_944.0 / 19.5e12 / (mm.time_us.0 * 1e-6)
    ));
    assert!(r.efficiency.notes.is_empty(), "{:?}", r.efficiency.notes);
}

#[test]
fn a_cpu_only_trace_gets_flops_with_cpu_time() {
    let r = run_dir(
        &shared_traces().join("torch_2_15_cpu"),
        PeakOverride::default(),
    );
    let e = &r.efficiency;
    assert!(e.categories.is_empty());
    // Both cycles of the rank: mm([128,32], [32,64]) twice per cycle: 4 × 2·128·64·32.
    let mm = e
        .ops
        .iter()
        .find(|o| o.op == "aten::mm" && o.shapes == "128×32, 32×64")
        .unwrap();
    assert_eq!((mm.calls, mm.flops, mm.on_gpu), (4, 2_097_152.0, false));
    // linear → addmm: only the innermost modelled op counts, so linear is not a group.
    assert!(!e.ops.iter().any(|o| o.op == "aten::linear"));
    assert!(e.ops.iter().any(|o| o.op == "aten::addmm"));
    assert!(e.ops.iter().all(|o| o.roofline_fraction.get().is_none()));
}

fn x(cat: &str, name: &str, pid: i64, tid: i64, ts: i64, dur: i64, args: Value) -> Value {
    json!({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
}

fn h100() -> Value {
    json!([{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_031_714_816u64, "numSms": 132}])
}

/// One op launching kernels through `cudaLaunchKernel`; `ext` on the kernels or not.
fn launch(
    ev: &mut Vec<Value>,
    op: (&str, i64, i64, Value),
    kernels: &[(&str, i64, i64)],
    corr: i64,
    ext_on_kernels: bool,
) {
    let (name, ts, dur, args) = op;
    let ext = corr * 10;
    let mut a = args;
    a["External id"] = json!(ext);
    ev.push(x("cpu_op", name, 1, 1, ts, dur, a));
    for (k, (kname, kts, kdur)) in kernels.iter().enumerate() {
        let c = corr + k as i64;
        ev.push(x(
            "cuda_runtime",
            "cudaLaunchKernel",
            1,
            1,
            ts + 1 + k as i64,
            1,
            if ext_on_kernels {
                json!({"External id": ext, "correlation": c})
            } else {
                json!({"correlation": c})
            },
        ));
        let mut ka = json!({"stream": 7, "correlation": c, "device": 0});
        if ext_on_kernels {
            ka["External id"] = json!(ext);
        }
        ev.push(x("kernel", kname, 0, 7, *kts, *kdur, ka));
    }
}

fn mm_args(m: i64, k: i64, n: i64, t: &str) -> Value {
    json!({"Input Dims": [[m, k], [k, n]], "Input type": [t, t], "Input Strides": [[k, 1], [n, 1]], "Concrete Inputs": ["", ""]})
}

#[test]
fn kernels_link_through_correlation_and_categories_use_every_kernel() {
    let mut ev = Vec::new();
    // mm whose kernel carries no External id and whose runtime call has none either: linked by
    // correlation to the call, then to the op around the call. 2·4096·4096·4096 FLOPs in 1 ms.
    launch(
        &mut ev,
        (
            "aten::mm",
            100,
            50,
            mm_args(4096, 4096, 4096, "c10::BFloat16"),
        ),
        &[("sm90_xmma_gemm_bf16bf16_bf16f32", 200, 1000)],
        1,
        false,
    );
    // A compiled region (no model) whose first kernel is elementwise (10 µs) and second a GEMM
    // (100 µs): GEMM for both kernels, not elementwise for the first.
    launch(
        &mut ev,
        ("CompiledFunction", 2000, 50, json!({})),
        &[
            ("triton_poi_fused_add_0", 2100, 10),
            ("triton_tem_fused_mm_1", 2120, 100),
        ],
        10,
        true,
    );
    // A copy op with a DtoD copy kernel: memcpy, never elementwise.
    launch(
        &mut ev,
        (
            "aten::copy_",
            3000,
            20,
            json!({"Input Dims": [[1024], [1024], []], "Input type": ["float", "float", "Scalar"]}),
        ),
        &[(
            "void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>",
            3100,
            5,
        )],
        20,
        true,
    );
    let t = json!({"schemaVersion": 1, "deviceProperties": h100(), "traceEvents": ev});
    let r = run(vec![t], PeakOverride::default());
    let e = &r.efficiency;
    let cats: Vec<(Category, u64, f64)> = e
        .categories
        .iter()
        .map(|c| (c.category, c.rows, c.time_us.0))
        .collect();
    assert_eq!(
        cats,
        [(Category::Gemm, 3, 1110.0), (Category::Memcpy, 1, 5.0)]
    );
    let mm = &e.ops[0];
    assert_eq!(mm.op, "aten::mm");
    assert_eq!(mm.time_us.0, 1000.0);
    // 137,438,953,472 FLOPs in 1 ms = 137.4 TFLOP/s; at 989.5 TFLOP/s (H100 SXM bf16) the
    // roofline allows 138.9 µs: 13.9% of it, compute-bound.
    let flops = 2.0 * 4096f64.powi(3);
    assert_eq!(mm.flops, flops);
    assert!(close(mm.tflops_per_s.0, flops / 1e-3 / 1e12));
    assert!(close(mm.roofline_fraction.0, flops / 989.5e12 / 1e-3));
    assert_eq!(mm.bound, Some(Bound::Compute));
    assert_eq!(e.devices[0].matched, Some("NVIDIA H100 SXM"));
}

#[test]
fn an_unknown_device_gives_rates_and_one_line() {
    let mut ev = Vec::new();
    launch(
        &mut ev,
        ("aten::mm", 100, 50, mm_args(1024, 1024, 1024, "float")),
        &[("ampere_sgemm_128x64_nn", 200, 100)],
        1,
        true,
    );
    let props =
        json!([{"id": 0, "name": "NVIDIA L4", "totalGlobalMem": 23_580_639_232u64, "numSms": 58}]);
    let t = json!({"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev});
    let r = run(vec![t.clone()], PeakOverride::default());
    let e = &r.efficiency;
    assert!(close(
        e.ops[0].tflops_per_s.0,
        2.0 * 1024f64.powi(3) / 100e-6 / 1e12
    ));
    assert!(e.ops[0].roofline_fraction.get().is_none());
    assert_eq!(e.notes.len(), 1);
    assert!(
        e.notes[0].contains("`NVIDIA L4` (58 SMs/CUs, 22 GiB) is not in the peaks table")
            && e.notes[0].contains("--peak-tflops"),
        "{:?}",
        e.notes
    );
    // One of the two flags is not enough for a roofline on an unknown device; both are.
    let r = run(
        vec![t.clone()],
        PeakOverride {
            tflops: None,
            tb_per_s: Some(0.3),
        },
    );
    assert!(r.efficiency.ops[0].roofline_fraction.get().is_none());
    let r = run(
        vec![t],
        PeakOverride {
            tflops: Some(30.3),
            tb_per_s: Some(0.3),
        },
    );
    assert!(close(
        r.efficiency.ops[0].roofline_fraction.0,
        2.0 * 1024f64.powi(3) / 30.3e12 / 100e-6
    ));
}

// ---------------------------------------------------------------------------------------------
// Collectives

#[test]
fn nccl_parser_config_collectives_match_tracelens_times() {
    let r = run_dir(
        &shared_traces().join("nccl_parser_config"),
        PeakOverride::default(),
    );
    let c = &r.collectives;
    // TraceLens coll_analysis (same grouping): dur_sum per (collective, dtype, In msg nelems),
    // 3 calls each. Its "In msg size (MB)" are MiB (2,049,000 floats = 7.8163 "MB"); S here is
    // bytes: 8,196,000.
    type Row<'a> = (&'a str, Option<&'a str>, Option<f64>, u64, f64);
    let got: Vec<Row<'_>> = c
        .rows
        .iter()
        .map(|x| (x.kind, x.dtype.as_deref(), x.bytes, x.calls, x.time_us.0))
        .collect();
    assert_eq!(
        got,
        [
            (
                "all_reduce",
                Some("Float"),
                Some(8_196_000.0),
                3,
                11_820.962
            ),
            (
                "all_reduce",
                Some("Float"),
                Some(31_502_336.0),
                3,
                11_081.355
            ),
            (
                "all_reduce",
                Some("Float"),
                Some(26_255_360.0),
                3,
                10_797.936
            ),
            (
                "all_reduce",
                Some("Float"),
                Some(26_550_272.0),
                3,
                7_214.656
            ),
            ("all_reduce", Some("Float"), Some(9_724_160.0), 3, 5_847.25),
            ("broadcast", Some("Float"), Some(212_480.0), 3, 91.007),
            ("broadcast", Some("Long"), Some(424.0), 3, 23.327),
        ]
    );
    // All-reduce over 2 ranks: bus bandwidth = algorithm bandwidth × 2(2−1)/2 = ×1;
    // algbw = 3 × 8,196,000 B / 11,820.962 µs = 2.080 GB/s.
    let first = &c.rows[0];
    assert!(close(
        first.algbw_gb_s.0,
        3.0 * 8_196_000.0 / 11_820.962e-6 / 1e9
    ));
    assert!(close(first.busbw_gb_s.0, first.algbw_gb_s.0));
    assert_eq!(first.group, "0 (default_pg)");
    assert_eq!(first.algorithm.as_deref(), Some("RING LL"));
    // One rank: no waits, and a note saying the times include waiting.
    assert!(c.waits.is_empty());
    assert!(
        c.notes.iter().any(|n| n.contains("one rank")),
        "{:?}",
        c.notes
    );
}

#[test]
fn trace_filter_collectives_are_matched_across_ranks() {
    // TraceLens (multi-rank report, --world_size 2): "No implicit sync collectives found" and
    // empty summaries: the kernels have no collective args. Here they are counted, matched and
    // their waits measured; sizes come from the c10d ops' shapes where the launch links to one.
    let r = run_dir(
        &shared_traces().join("trace_filter"),
        PeakOverride::default(),
    );
    let c = &r.collectives;
    let calls: u64 = c.rows.iter().map(|x| x.calls).sum();
    assert_eq!(calls, 20);
    let waits: Vec<(i64, u64, u64, f64, Option<i64>)> = c
        .waits
        .iter()
        .map(|w| (w.rank, w.matched, w.last_count, w.wait_us.0, w.waited_for))
        .collect();
    // Per matched pair: the shorter kernel is the transfer, the longer rank's excess its wait.
    assert_eq!(
        waits,
        [
            (0, 10, 3, 123_301.0, Some(1)),
            (1, 10, 7, 106_155.0, Some(0))
        ]
    );
    let s = c.straggler.as_ref().unwrap();
    assert_eq!((s.rank, s.last_count, s.matched), (1, 7, 10));
    assert!(c.notes.iter().any(|n| n.contains("without a message size")));
}

/// A rank with one all-reduce per 20 ms step, its NCCL kernel carrying torch's collective args.
fn comm_rank(rank: i64, durs: &[i64], bytes_elems: i64) -> Value {
    let mut ev = Vec::new();
    for (s, &d) in durs.iter().enumerate() {
        let t0 = 1_000_000 + s as i64 * 20_000;
        ev.push(x(
            "user_annotation",
            &format!("ProfilerStep#{s}"),
            1,
            1,
            t0,
            20_000,
            json!({"External id": 1000 + s}),
        ));
        let ext = 10 + s as i64;
        let args = json!({"External id": ext, "Collective name": "allreduce", "In msg nelems": bytes_elems,
            "Out msg nelems": bytes_elems, "Group size": 4, "dtype": "BFloat16",
            "Process Group Name": "0", "Process Group Description": "default_pg"});
        ev.push(x(
            "cpu_op",
            "record_param_comms",
            1,
            1,
            t0 + 10,
            20,
            args.clone(),
        ));
        ev.push(x(
            "cuda_runtime",
            "cudaLaunchKernel",
            1,
            1,
            t0 + 12,
            5,
            json!({"External id": ext, "correlation": ext}),
        ));
        let mut ka = args;
        ka["stream"] = json!(20);
        ka["correlation"] = json!(ext);
        ev.push(x(
            "kernel",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            0,
            20,
            t0 + 50,
            d,
            ka,
        ));
    }
    json!({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 4}, "traceEvents": ev})
}

#[test]
fn waits_are_each_ranks_time_beyond_the_shortest() {
    // Two steps, four ranks. Step 0 durations 400, 1400, 1400, 1000 µs: rank 0 arrived last,
    // transfer 400, waits 0/1000/1000/600 (2,600 caused by rank 0). Step 1: 500, 500, 2500, 300:
    // rank 3 last, waits 200/200/2200/0 (2,600 caused by rank 3).
    let durs = [[400, 500], [1400, 500], [1400, 2500], [1000, 300]];
    let ranks: Vec<Value> = (0..4)
        .map(|r| comm_rank(r, &durs[r as usize], 8_388_608))
        .collect();
    let r = run(ranks, PeakOverride::default());
    let c = &r.collectives;
    assert_eq!(c.rows.len(), 1);
    let row = &c.rows[0];
    // S = 8,388,608 bf16 = 16,777,216 B; 8 kernels, 8,000 µs in all; transfer 400 + 300 µs.
    assert_eq!(
        (row.kind, row.bytes, row.calls),
        ("all_reduce", Some(16_777_216.0), 8)
    );
    assert_eq!(
        (row.time_us.0, row.matched, row.transfer_us.0),
        (8_000.0, 2, 700.0)
    );
    // algbw = 8 × S / 8,000 µs = 16.78 GB/s; bus = × 2·3/4 = 25.17 GB/s. Transfer: 2 × S /
    // 700 µs = 47.94 GB/s, bus 71.90 GB/s.
    assert!(close(row.algbw_gb_s.0, 8.0 * 16_777_216.0 / 8_000e-6 / 1e9));
    assert!(close(row.busbw_gb_s.0, row.algbw_gb_s.0 * 1.5));
    assert!(close(
        row.transfer_algbw_gb_s.0,
        2.0 * 16_777_216.0 / 700e-6 / 1e9
    ));
    assert!(close(
        row.transfer_busbw_gb_s.0,
        row.transfer_algbw_gb_s.0 * 1.5
    ));
    let w: Vec<(i64, f64, u64, f64, Option<i64>)> = c
        .waits
        .iter()
        .map(|w| {
            (
                w.rank,
                w.wait_us.0,
                w.last_count,
                w.caused_wait_us.0,
                w.waited_for,
            )
        })
        .collect();
    assert_eq!(
        w,
        [
            (0, 200.0, 1, 2_600.0, Some(3)),
            (1, 1_200.0, 0, 0.0, Some(0)),
            (2, 3_200.0, 0, 0.0, Some(3)),
            (3, 600.0, 1, 2_600.0, Some(0)),
        ]
    );
    // Per step (2 steps of 20 ms): rank 2 waits 1.6 ms, 8% of its step.
    assert_eq!(c.waits[2].wait_per_step_us.0, 1_600.0);
    assert!(close(c.waits[2].wait_share.0, 0.08));
    // Nobody is last in 60% of the instances: no straggler.
    assert!(c.straggler.is_none());
}

#[test]
fn bus_bandwidth_follows_nccl_tests() {
    // n = 8: all-reduce 2·7/8, all-gather / reduce-scatter / all-to-all 7/8, broadcast 1.
    for (name, factor) in [
        ("allreduce", 1.75),
        ("_allgather_base", 0.875),
        ("reduce_scatter_tensor", 0.875),
        ("all_to_all", 0.875),
        ("broadcast", 1.0),
    ] {
        let mut ev = Vec::new();
        let args = json!({"External id": 5, "Collective name": name, "In msg nelems": 1_000_000,
            "Out msg nelems": 1_000_000, "Group size": 8, "dtype": "Float", "Process Group Name": "1"});
        ev.push(x(
            "cpu_op",
            "record_param_comms",
            1,
            1,
            100,
            20,
            args.clone(),
        ));
        let mut ka = args;
        ka["stream"] = json!(20);
        ka["correlation"] = json!(5);
        ev.push(x("kernel", "ncclDevKernel_Generic", 0, 20, 150, 1000, ka));
        let r = run(vec![json!({"traceEvents": ev})], PeakOverride::default());
        let row = &r.collectives.rows[0];
        // 4 MB in 1 ms = 4 GB/s.
        assert!(close(row.algbw_gb_s.0, 4.0), "{name}");
        assert!(
            close(row.busbw_gb_s.0, 4.0 * factor),
            "{name}: {}",
            row.busbw_gb_s.0
        );
    }
}

// ---------------------------------------------------------------------------------------------
// doctor

fn doctor_of(traces: Vec<Value>) -> kinetrace_analysis::DoctorReport {
    let sources: Vec<TraceSource> = traces
        .into_iter()
        .enumerate()
        .map(|(i, t)| TraceSource::Memory {
            name: format!("rank{i}.json").into(),
            bytes: serde_json::to_vec(&t).unwrap(),
        })
        .collect();
    doctor_sources(
        &sources,
        Vec::new(),
        &DoctorOptions {
            jobs: 1,
            ..DoctorOptions::default()
        },
        &|_| {},
    )
}

/// Four steps of 10 ms on an H100; per step a large well-shaped bf16 GEMM and a fp32 GEMM with
/// dims that are no multiple of 4.
fn gemm_trace(fp32_us: i64) -> Value {
    let mut ev = Vec::new();
    for s in 0..4i64 {
        let t0 = 1_000_000 + s * 10_000;
        ev.push(x(
            "user_annotation",
            &format!("ProfilerStep#{s}"),
            1,
            1,
            t0,
            10_000,
            json!({"External id": 9000 + s}),
        ));
        // bf16 4096³: 137.4 GFLOP in 200 µs = 687 TFLOP/s, 69% of 989.5.
        launch(
            &mut ev,
            (
                "aten::mm",
                t0 + 10,
                20,
                mm_args(4096, 4096, 4096, "c10::BFloat16"),
            ),
            &[("sm90_xmma_gemm_bf16bf16_bf16f32", t0 + 100, 200)],
            100 + s * 10,
            true,
        );
        // fp32 (2050 × 1000) · (1000 × 4098): 16.8 GFLOP at 67 TFLOP/s = 250.8 µs of roofline.
        launch(
            &mut ev,
            ("aten::mm", t0 + 40, 20, mm_args(2050, 1000, 4098, "float")),
            &[("sm90_xmma_gemm_f32f32_f32f32", t0 + 400, fp32_us)],
            105 + s * 10,
            true,
        );
    }
    json!({"schemaVersion": 1, "deviceProperties": h100(), "traceEvents": ev})
}

#[test]
fn doctor_flags_a_costly_gemm_far_below_its_roofline() {
    // The fp32 GEMM takes 2 ms per step: 250.8 µs of roofline is 12.5% (< 50%); at 70% of the
    // roofline it would take 358.3 µs, so 1.64 ms per step (16.4% of the step) is the cost.
    let r = doctor_of(vec![gemm_trace(2000)]);
    let f = r
        .findings
        .iter()
        .find(|f| f.rule == "gemm-below-roofline")
        .unwrap_or_else(|| panic!("{:#?}", r.findings));
    let roof = 2.0 * 2050.0 * 1000.0 * 4098.0 / 67e12 * 1e6;
    assert!((f.cost_per_step_us.unwrap().0 - (2000.0 - roof / 0.7)).abs() < 0.01);
    assert_eq!(f.evidence.len(), 1);
    let what = &f.evidence[0].what;
    assert!(what.contains("M=2050 N=4098 K=1000"), "{what}");
    assert!(what.contains("12.5%"), "{what}");
    assert!(
        what.contains("M=2050, N=4098 not a multiple of 4 (TF32)"),
        "{what}"
    );
    assert!(
        what.contains("fp32 while half-precision GEMMs run elsewhere"),
        "{what}"
    );
    assert!(!f.examples.is_empty());
    // Close to its roofline (300 µs: 84%), it is not flagged; neither is the bf16 GEMM (69%).
    let r = doctor_of(vec![gemm_trace(300)]);
    assert!(r.findings.iter().all(|f| f.rule != "gemm-below-roofline"));
}

#[test]
fn doctor_names_the_rank_the_others_wait_for_in_collectives() {
    // Rank 1 arrives last in both steps: transfer 300 µs, the others wait 5,000 µs per step.
    let durs = [[5_300, 5_300], [300, 300], [5_300, 5_300]];
    let ranks: Vec<Value> = (0..3)
        .map(|r| comm_rank(r, &durs[r as usize], 1_000_000))
        .collect();
    let r = doctor_of(ranks);
    let f = r
        .findings
        .iter()
        .find(|f| f.rule == "straggler-rank")
        .unwrap_or_else(|| panic!("{:#?}", r.findings));
    assert_eq!(f.ranks, [1]);
    assert_eq!(f.cost_per_step_us.unwrap().0, 5_000.0);
    assert!(
        f.summary.contains("rank 1 arrived last in 2 of 2"),
        "{}",
        f.summary
    );
    let waits: Vec<(i64, f64)> = f.evidence.iter().map(|e| (e.rank, e.time_us.0)).collect();
    assert_eq!(waits, [(0, 10_000.0), (1, 0.0), (2, 10_000.0)]);
    assert!(!f.examples.is_empty());
    // The same waits join the exposed-communication finding of the waiting ranks.
    let exposed = r
        .findings
        .iter()
        .find(|f| f.rule == "exposed-communication")
        .unwrap_or_else(|| panic!("{:#?}", r.findings));
    assert!(
        exposed
            .evidence
            .iter()
            .any(|e| e.what.starts_with("waiting in collectives for rank 1")),
        "{:#?}",
        exposed.evidence
    );
    assert!(
        exposed
            .summary
            .contains("waits 5.00 ms per step for rank 1"),
        "{}",
        exposed.summary
    );
}
