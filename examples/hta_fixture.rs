//! A two-rank trace directory whose HolisticTraceAnalysis (HTA 0.5.0) numbers are known exactly.
//!
//! Each rank is a separate [`Profiler`] run (one after the other in this process; only one profiler
//! may run at a time) with `.rank(r).world_size(2).worker_name("rank{r}")` and a [`SimulatedGpu`]
//! source. Nothing is timed for real: every record is injected with a constructed timestamp — CPU
//! records through the calling thread's ring (`kinetrace_core::recorder::push`), GPU records through
//! [`SimulatedGpu::inject`] with correlation ids from [`SimulatedGpu::next_correlation`]. The
//! compatibility test `tests/compat/test_hta.py` asserts HTA's results against the numbers below.
//!
//! Run: `cargo run --release --example hta_fixture -- OUTPUT_DIR`
//!
//! # The construction (identical on both ranks; all times in µs)
//!
//! The base `B` is taken right after `start()`, rounded up to a whole microsecond, plus a margin, so
//! every record lies inside the recording window and every `ts`/`dur` in the trace is a whole
//! number of microseconds (HTA's ns rounding then changes nothing).
//!
//! Four steps `ProfilerStep#1..#4` (user annotations), step `k` spanning `[S_k, S_k + 1075)` with
//! `S_k = B + (k-1)·1075`. HTA drops the last step (#4): it keeps CPU rows with `ts <` the start of
//! the last `ProfilerStep` and GPU rows whose `correlation` is on a kept CPU row, so only steps
//! #1–#3 count below. Step #4 carries the same work plus an extra 5000 µs compute kernel
//! [S_4 + 1000, S_4 + 6000) that would change every number if it were not dropped: with
//! `include_last_profiler_step=True` the kernel time is (S_1 + 100) → (S_4 + 6000) = 3·1075 + 5900 =
//! 9125, busy 4·750 + 5000 = 8000, idle 1125, compute 4·500 + 5000 = 7000, non-compute 1000.
//!
//! Per step, offsets from `S`:
//!
//! | record                          | CPU runtime call (corr c)  | GPU, stream       | GPU interval |
//! |---------------------------------|----------------------------|-------------------|--------------|
//! | `Memcpy HtoD (Pinned -> Device)`| `cudaMemcpyAsync` @ 10, 5  | 7                 | [100, 225)   |
//! | `sm90_xmma_gemm_fwd_A` compute  | `cudaLaunchKernel` @ 20, 5 | 7                 | [245, 495)   |
//! | `sm90_xmma_gemm_bwd_B` compute  | `cudaLaunchKernel` @ 30, 5 | 7                 | [575, 825)   |
//! | `ncclDevKernel_AllReduce_…` comm| `cudaLaunchKernel` @ 40, 5 | 13                | [700, 950)   |
//!
//! plus `cpu_op`s `aten::mm` [15, 35) around the two gemm launches and `nccl:all_reduce` [38, 48)
//! around the NCCL launch (CPU rows: no `stream`, so HTA's GPU analyses ignore them; they give
//! torch-tb-profiler operators to attach kernels to).
//!
//! ## Temporal breakdown (per rank)
//!
//! - GPU busy per step: [100,225) ∪ [245,495) ∪ [575,950) = 125 + 250 + 375 = 750.
//! - Kernel time (first GPU start to last GPU end over the kept steps):
//!   (S_1 + 100) → (S_3 + 950) = 2·1075 + 850 = **3000**.
//! - Idle: in-step gaps 20 + 80 = 100, three times = 300; between steps (S_k + 950 → S_{k+1} + 100)
//!   225, twice = 450; total **750 = 25 %**.
//! - Compute (merged COMPUTATION kernels): 2 × 250 per step × 3 = **1500 = 50 %**.
//! - Non-compute: 3000 − 1500 − 750 = **750 = 25 %** (memcpy 3 × 125 + NCCL not under compute 3 × 125).
//!
//! ## Communication/computation overlap (per rank)
//!
//! NCCL [700, 950) overlaps gemm B [575, 825) on [700, 825) = 125 of its 250: **50 %**.
//!
//! ## Idle-time breakdown (per rank, `consecutive_kernel_delay` = 30, the default)
//!
//! Per stream, the gap before each kernel is *host wait* when its runtime call started after the
//! previous kernel on the stream ended, else *kernel wait* when the gap is < 30, else *other*.
//!
//! - Stream 7: memcpy → A gap 20, A's launch @20 is before the memcpy ends @225: kernel wait
//!   3 × 20 = **60**; A → B gap 80, B's launch @30 is before A ends @495: other 3 × 80 = **240**;
//!   B (ends S_k + 825) → next step's memcpy (S_{k+1} + 100) gap 350, launched @ S_{k+1} + 10, after
//!   B ended: host wait 2 × 350 = **700**. Total 1000: ratios 0.70 / 0.06 / 0.24.
//! - Stream 13: NCCL (ends S_k + 950) → next NCCL (S_{k+1} + 700) gap 825, launched @ S_{k+1} + 40:
//!   host wait 2 × 825 = **1650**, ratio 1.0.
//!
//! ## GPU kernel breakdown (both ranks together)
//!
//! Per rank, by name: each gemm 3 × 250 = 750, NCCL 3 × 250 = 750, memcpy 3 × 125 = 375. By type
//! (HTA splits overlapping time out): COMPUTATION alone 1500 − 375 = 1125, COMPUTATION overlapping
//! COMMUNICATION 375, COMMUNICATION alone 375, MEMORY 375; over two ranks **2250 / 750 / 750 / 750**
//! (50 % / 16.7 % / 16.7 % / 16.7 %).

use std::time::Duration;

use kinetrace::activity::{
    Activity, ApiCall, CpuSpan, Detail, Kernel, Memcpy, MemcpyKind, MemoryKind,
};
use kinetrace::{intern, NameId, Profiler, UnixNanos};
use kinetrace_core::recorder;
use kinetrace_test_support::SimulatedGpu;

const NS_PER_US: u64 = 1_000;
/// Step period (µs).
const STEP_US: u64 = 1_075;
/// `ProfilerStep#1..=#STEPS`; HTA drops the last.
const STEPS: u64 = 4;
/// Margin between the window start and the first step (µs).
const MARGIN_US: u64 = 1_000;
const COMPUTE_STREAM: u32 = 7;
const COMM_STREAM: u32 = 13;
const DEVICE: u32 = 0;
/// Duration of every runtime API call (µs).
const API_US: u64 = 5;

const GEMM_A: &str = "sm90_xmma_gemm_fwd_A";
const GEMM_B: &str = "sm90_xmma_gemm_bwd_B";
const NCCL: &str =
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)";
/// Only in the dropped last step.
const DROPPED: &str = "sm90_xmma_gemm_last_step_only";

/// Builds the records of one rank relative to a base time.
struct Rank<'a> {
    gpu: &'a SimulatedGpu,
    base_ns: u64,
    pid: u32,
    tid: u32,
}

enum Work {
    Kernel { name: &'static str, stream: u32 },
    Memcpy { bytes: u64, stream: u32 },
}

impl Rank<'_> {
    fn at(&self, us: u64) -> UnixNanos {
        UnixNanos(self.base_ns + us * NS_PER_US)
    }

    /// Host records of the constructed workload go through the source too (with their own
    /// pid, tid and times), like the device records.
    fn push_cpu(&self, activity: Activity) {
        self.gpu.inject(activity);
    }

    fn span(&self, annotation: bool, name: NameId, start_us: u64, end_us: u64, id: u64) {
        let span = CpuSpan {
            name,
            pid: self.pid,
            tid: self.tid,
            args: Default::default(),
        };
        self.push_cpu(Activity {
            start: self.at(start_us),
            end: self.at(end_us),
            correlation: None,
            external_id: Some(id),
            detail: if annotation {
                Detail::UserAnnotation(span)
            } else {
                Detail::CpuOp(span)
            },
        });
    }

    /// A runtime call at `call_us` launching `work` that runs on the GPU over `[gpu_start_us, gpu_end_us)`.
    fn launch(
        &self,
        external_id: u64,
        call_us: u64,
        work: Work,
        gpu_start_us: u64,
        gpu_end_us: u64,
    ) {
        let correlation = self.gpu.next_correlation();
        let (api, cbid) = match work {
            Work::Kernel { .. } => ("cudaLaunchKernel", 211),
            Work::Memcpy { .. } => ("cudaMemcpyAsync", 41),
        };
        self.push_cpu(Activity {
            start: self.at(call_us),
            end: self.at(call_us + API_US),
            correlation: Some(correlation),
            external_id: Some(external_id),
            detail: Detail::Runtime(ApiCall {
                name: intern(api),
                cbid: Some(cbid),
                pid: self.pid,
                tid: self.tid,
                launches_work: true,
                args: Default::default(),
            }),
        });
        let detail = match work {
            Work::Kernel { name, stream } => Detail::Kernel(Kernel {
                name: intern(name),
                device: DEVICE,
                context: Some(1),
                stream,
                grid: Some([132, 1, 1]),
                block: Some([256, 1, 1]),
                registers_per_thread: Some(64),
                shared_memory: Some(0),
                queued: None,
                graph_id: None,
                kind_arg: false,
                graph_node_id: None,
            }),
            Work::Memcpy { bytes, stream } => Detail::Memcpy(Memcpy {
                kind: MemcpyKind::HtoD,
                src_kind: MemoryKind::Pinned,
                dst_kind: MemoryKind::Device,
                bytes,
                device: DEVICE,
                context: Some(1),
                stream,
                kind_arg: false,
                peer: None,
            }),
        };
        self.gpu.inject(Activity {
            start: self.at(gpu_start_us),
            end: self.at(gpu_end_us),
            correlation: Some(correlation),
            external_id: Some(external_id),
            detail,
        });
    }

    /// One `ProfilerStep#step` starting `s` µs after the base (the table in the module docs).
    fn step(&self, step: u64, s: u64) {
        let step_id = recorder::next_span_id();
        self.span(
            true,
            intern(&format!("ProfilerStep#{step}")),
            s,
            s + STEP_US,
            step_id,
        );
        // 25 MB in 125 µs: 200 GB/s.
        let memcpy = Work::Memcpy {
            bytes: 25_000_000,
            stream: COMPUTE_STREAM,
        };
        self.launch(step_id, s + 10, memcpy, s + 100, s + 225);

        let mm_id = recorder::next_span_id();
        self.span(false, intern("aten::mm"), s + 15, s + 35, mm_id);
        let a = Work::Kernel {
            name: GEMM_A,
            stream: COMPUTE_STREAM,
        };
        self.launch(mm_id, s + 20, a, s + 245, s + 495);
        let b = Work::Kernel {
            name: GEMM_B,
            stream: COMPUTE_STREAM,
        };
        self.launch(mm_id, s + 30, b, s + 575, s + 825);

        let ar_id = recorder::next_span_id();
        self.span(false, intern("nccl:all_reduce"), s + 38, s + 48, ar_id);
        let nccl = Work::Kernel {
            name: NCCL,
            stream: COMM_STREAM,
        };
        self.launch(ar_id, s + 40, nccl, s + 700, s + 950);

        if step == STEPS {
            // Dropped by HTA with the last step; were it kept, kernel time and compute would grow.
            let extra = Work::Kernel {
                name: DROPPED,
                stream: COMPUTE_STREAM,
            };
            self.launch(step_id, s + 50, extra, s + 1_000, s + 6_000);
        }
    }
}

/// Rounds up to a whole microsecond.
fn ceil_us(t: UnixNanos) -> u64 {
    t.0.div_ceil(NS_PER_US) * NS_PER_US
}

fn record_rank(dir: &str, rank: u32) -> Vec<kinetrace::TraceOutput> {
    let gpu = SimulatedGpu::new(DEVICE);
    let profiler = match Profiler::builder()
        .output_dir(dir)
        .worker_name(format!("rank{rank}"))
        .rank(rank)
        .world_size(2)
        .source(gpu.clone())
        .start()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("hta_fixture: cannot start the profiler for rank {rank}: {e}");
            std::process::exit(2);
        }
    };
    let builder = Rank {
        gpu: &gpu,
        base_ns: ceil_us(UnixNanos::now()) + MARGIN_US * NS_PER_US,
        pid: std::process::id(),
        tid: recorder::current_tid(),
    };
    for step in 1..=STEPS {
        builder.step(step, (step - 1) * STEP_US);
    }
    // Let the constructed timeline (last step plus its long kernel) pass so the recording window holds
    // every record, as it would for a real run.
    let end = builder.at((STEPS - 1) * STEP_US + 6_000 + MARGIN_US);
    while UnixNanos::now() < end {
        std::thread::sleep(Duration::from_micros(
            end.saturating_sub(UnixNanos::now()) / NS_PER_US + 1,
        ));
    }
    profiler.stop()
}

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: hta_fixture OUTPUT_DIR");
        std::process::exit(2);
    };
    for rank in 0..2 {
        let written = record_rank(&dir, rank);
        let paths: Vec<_> = written.iter().filter_map(|t| t.path.as_ref()).collect();
        if paths.len() != 1 {
            eprintln!(
                "hta_fixture: rank {rank} wrote {} traces, expected 1",
                paths.len()
            );
            std::process::exit(1);
        }
        println!(
            "rank {rank}: {} ({} events)",
            paths[0].display(),
            written[0].events
        );
    }
}
