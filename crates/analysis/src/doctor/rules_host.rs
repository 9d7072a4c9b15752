//! The rules about the host and about the trace itself: allocator calls in the step, host stalls,
//! and the notes that keep a reader from misreading the numbers (warm-up steps in the window,
//! CUDA graphs, compiled regions, dropped records).

use std::collections::BTreeMap;

use crate::units::fmt_us;

use super::context::{Ctx, Kind};
use super::{evidence, finding, Example, Finding, Rule, Severity, MAX_EXAMPLES};

// ---------------------------------------------------------------------------------------------

/// The allocator rule.
pub const ALLOCATOR_CHURN: Rule = Rule {
    id: "allocator-churn",
    title: "Device memory allocated and freed inside steady-state steps",
    severity: Severity::Warning,
    fix: "Let the caching allocator reuse memory: avoid shapes that change every step (pad or \
          bucket them), set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against \
          fragmentation, do not call `torch.cuda.empty_cache()` in the loop, and allocate pinned \
          host buffers once. `cudaFree` also synchronizes the device.",
};

const ALLOC_CALLS: &[&str] = &[
    "cudaMalloc",
    "cudaFree",
    "cudaMallocHost",
    "cudaFreeHost",
    "cudaHostAlloc",
    "cudaMallocManaged",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "hipMalloc",
    "hipFree",
    "hipHostMalloc",
    "hipHostFree",
    "hipExtMallocWithFlags",
];

/// Fires when steps after the first one in the window call the device allocator (`cudaMalloc`,
/// `cudaFree`, `hipMalloc`, ...; not the stream-ordered `…Async` ones) at least twice in all, and
/// those calls plus the GPU idle right after them take at least 0.5% of the mean step and 10 µs
/// per step. The first step is left out: the caching allocator warms up there. The cost is the
/// calls' time and the idle after them, per later step.
pub(super) fn allocator_churn(ctx: &Ctx<'_>) -> Option<Finding> {
    if !ctx.has_steps || ctx.windows.len() < 2 {
        return None;
    }
    let mut calls: Vec<(usize, usize)> = ctx
        .of_kind(Kind::Runtime)
        .filter(|&i| ALLOC_CALLS.contains(&ctx.name(i)))
        .filter_map(|i| Some((i, ctx.window_at(ctx.row(i).ts)?)))
        .filter(|&(_, w)| w > 0)
        .collect();
    if calls.len() < 2 {
        return None;
    }
    calls.sort_by_key(|&(i, _)| ctx.row(i).ts);
    let mut groups: BTreeMap<String, super::rules::Tally> = BTreeMap::new();
    let mut covered_until = i64::MIN;
    let mut total = 0;
    let mut weighted = Vec::new();
    for &(i, w) in &calls {
        let r = ctx.row(i);
        let end = r.end() + ctx.idle_until_work(r.end(), ctx.windows[w].end);
        let cost = (end - r.ts.max(covered_until)).max(0);
        covered_until = covered_until.max(end);
        total += cost;
        let g = groups
            .entry(format!(
                "{} → {}",
                super::rules::culprit(ctx, i),
                ctx.name(i)
            ))
            .or_default();
        g.count += 1;
        g.time += cost;
        weighted.push((cost, i));
    }
    let later = (ctx.windows.len() - 1) as f64;
    let cost = total as f64 / later;
    if cost < 10_000.0 || cost < 0.005 * ctx.mean_window_ns() {
        return None;
    }
    let summary = format!(
        "{:.1} allocator calls per step after the first step; with the GPU idle they cause they \
         cost {} per step",
        calls.len() as f64 / later,
        fmt_us(cost / 1000.0),
    );
    // `finding` divides by every window; this cost is over the later ones only.
    let total_scaled = cost * ctx.windows.len() as f64;
    Some(finding(
        &ALLOCATOR_CHURN,
        ctx,
        Some(total_scaled),
        summary,
        super::rules::tallies_to_evidence(ctx, groups),
        super::rules::top_examples(ctx, weighted),
    ))
}

/// The memory rule.
pub const MEMORY_PRESSURE: Rule = Rule {
    id: "memory-pressure",
    title: "Device memory near capacity, or reserved far above allocated",
    severity: Severity::Warning,
    fix: "Near capacity the caching allocator frees its cache and retries (synchronizing) before \
          an out-of-memory error: lower the peak (smaller micro-batches with gradient \
          accumulation, activation checkpointing, freeing references to large tensors early). \
          Reserved far above allocated at the peak is fragmentation: set \
          `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` and keep tensor shapes stable.",
};

const GIB: i64 = 1 << 30;

/// Fires, from `[memory]` events (`profile_memory=True`) on a device, when the peak reserved
/// memory is at least 90% of the device's `totalGlobalMem` (from `deviceProperties`), or when at
/// the peak of allocated memory the reserved memory is at least 1.5× the allocated and 1 GiB above
/// it (fragmentation: cached blocks that do not fit). No time cost.
pub(super) fn memory_pressure(ctx: &Ctx<'_>) -> Option<Finding> {
    let capacity: BTreeMap<i64, i64> = ctx
        .rows
        .metadata
        .iter()
        .filter(|(k, _)| k == "deviceProperties")
        .filter_map(|(_, v)| serde_json::from_str::<serde_json::Value>(v).ok())
        .filter_map(|v| v.as_array().cloned())
        .flatten()
        .filter_map(|d| Some((d.get("id")?.as_i64()?, d.get("totalGlobalMem")?.as_i64()?)))
        .collect();
    let mut devices: BTreeMap<i64, Vec<&crate::rows::MemSample>> = BTreeMap::new();
    for m in ctx.rows.mem.iter().filter(|m| m.device >= 0) {
        devices.entry(m.device).or_default().push(m);
    }
    let mut ev = Vec::new();
    let mut lines = Vec::new();
    let mut examples = Vec::new();
    for (device, samples) in devices {
        let Some(peak_res) = samples.iter().max_by_key(|m| (m.reserved, -m.ts)) else {
            continue;
        };
        let Some(peak_alloc) = samples.iter().max_by_key(|m| (m.allocated, -m.ts)) else {
            continue;
        };
        let gib = |b: i64| b as f64 / GIB as f64;
        if let Some(&cap) = capacity.get(&device).filter(|&&c| c > 0) {
            if peak_res.reserved as f64 >= 0.9 * cap as f64 {
                lines.push(format!(
                    "device {device}: {:.2} GiB reserved at the peak, {:.0}% of its {:.2} GiB",
                    gib(peak_res.reserved),
                    100.0 * peak_res.reserved as f64 / cap as f64,
                    gib(cap)
                ));
                ev.push(evidence(
                    ctx,
                    format!("device {device}: peak reserved ≥ 90% of capacity"),
                    1,
                    0,
                ));
                examples.push(ctx.span_example(
                    format!("device {device}: peak reserved memory"),
                    peak_res.ts,
                    peak_res.ts,
                ));
            }
        }
        let (a, r) = (peak_alloc.allocated, peak_alloc.reserved);
        if r - a >= GIB && r as f64 >= 1.5 * a as f64 {
            lines.push(format!(
                "device {device}: at the allocation peak {:.2} GiB reserved for {:.2} GiB allocated",
                gib(r),
                gib(a)
            ));
            ev.push(evidence(
                ctx,
                format!("device {device}: reserved ≥ 1.5× allocated at the peak"),
                1,
                0,
            ));
            examples.push(ctx.span_example(
                format!("device {device}: allocation peak"),
                peak_alloc.ts,
                peak_alloc.ts,
            ));
        }
    }
    if lines.is_empty() {
        return None;
    }
    examples.truncate(MAX_EXAMPLES);
    Some(finding(
        &MEMORY_PRESSURE,
        ctx,
        None,
        lines.join("; "),
        ev,
        examples,
    ))
}

// ---------------------------------------------------------------------------------------------

/// The host-stall rule.
pub const HOST_STALL: Rule = Rule {
    id: "host-stall",
    title: "Host stalls: no op, no CUDA call, and an idle GPU",
    severity: Severity::Warning,
    fix: "Find what the process did in those gaps: a garbage-collection pause (call `gc.freeze()` \
          after setup, or `gc.disable()` and `gc.collect()` every N steps), another thread \
          holding the GIL (logging, metrics or data loading in threads), or Python work that is \
          not in any op (wrap it in `torch.profiler.record_function` to see it; profile with \
          `with_stack=True` to get its frames).",
};

/// Gaps shorter than this are ordinary Python overhead between ops.
const STALL_MIN_NS: i64 = 1_000_000;

/// Fires when, inside steps, there are at least two gaps of 1 ms or more during which no thread
/// runs a `cpu_op` or runtime call, no DataLoader fetch is open and no GPU work runs, and they
/// add up to at least 5% of the mean step. The cost is those gaps. A gap is named after the
/// innermost Python frame or annotation open across it, when the trace has one; a gap that a
/// garbage collection (`python::gc (gen N)`, which `kinetrace record --with-stack` records from
/// `gc.callbacks`) covers for at least half of it is named after the collection, and the summary
/// says how much of the stall time was collections.
pub(super) fn host_stall(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut active: Vec<(i64, i64)> = ctx.busy.clone();
    for i in 0..ctx.len() {
        let r = ctx.row(i);
        let counts = match ctx.kind(i) {
            Kind::CpuOp | Kind::Runtime => !ctx.is_step_row(i),
            Kind::Annotation | Kind::Python => {
                let n = ctx.name(i);
                n.contains("DataLoader")
                    || (n.contains("dataloader.py") && n.contains("__next__"))
                    // Waiting in a collective (gloo's annotation on its own thread) is waiting
                    // for the other ranks, not a stall of this one: the straggler finding says
                    // whom it waits for.
                    || crate::steps::is_host_collective(n)
            }
            _ => false,
        };
        if counts {
            active.push((r.ts, r.end()));
        }
    }
    let active = super::rules::merged(active);
    let mut gaps: Vec<(i64, i64)> = Vec::new();
    for w in &ctx.windows {
        let mut t = w.ts;
        let from = active.partition_point(|&(_, e)| e <= w.ts);
        for &(s, e) in active[from..].iter().take_while(|&&(s, _)| s < w.end) {
            if s > t && s - t >= STALL_MIN_NS {
                gaps.push((t, s));
            }
            t = t.max(e);
        }
        if w.end > t && w.end - t >= STALL_MIN_NS {
            gaps.push((t, w.end));
        }
    }
    let total: i64 = gaps.iter().map(|(a, b)| b - a).sum();
    let cost = total as f64 / ctx.windows.len() as f64;
    if gaps.len() < 2 || cost < 0.05 * ctx.mean_window_ns() {
        return None;
    }
    // Garbage collections, which are pauses whatever else is open.
    let collections: Vec<(i64, i64, usize)> = (0..ctx.len())
        .filter(|&i| ctx.kind(i) == Kind::Annotation && is_gc(ctx.name(i)))
        .map(|i| (ctx.row(i).ts, ctx.row(i).end(), i))
        .collect();
    let in_gc = |a: i64, b: i64| -> (i64, Option<usize>) {
        let mut time = 0;
        let mut most: Option<(usize, i64)> = None;
        for &(s, e, i) in &collections {
            let overlap = e.min(b) - s.max(a);
            if overlap > 0 {
                time += overlap;
                if most.is_none_or(|(_, o)| overlap > o) {
                    most = Some((i, overlap));
                }
            }
        }
        (time.min(b - a), most.map(|(i, _)| i))
    };
    let gc_total: i64 = gaps.iter().map(|&(a, b)| in_gc(a, b).0).sum();
    // Name each gap after what was open across it: a garbage collection covering half of it or
    // more, else the innermost Python frame, else annotation.
    let covering = |a: i64, b: i64| -> String {
        if let (time, Some(i)) = in_gc(a, b) {
            if 2 * time >= b - a {
                return format!("{} (garbage collection)", ctx.name(i));
            }
        }
        let mut best: Option<(usize, i64)> = None;
        for i in 0..ctx.len() {
            let r = ctx.row(i);
            let k = ctx.kind(i);
            if !(k == Kind::Python || (k == Kind::Annotation && !ctx.is_step_row(i))) {
                continue;
            }
            if r.ts <= a && r.end() >= b && best.is_none_or(|(_, d)| r.dur < d) {
                best = Some((i, r.dur));
            }
        }
        best.map_or_else(
            || "(nothing recorded)".into(),
            |(i, _)| ctx.name(i).to_owned(),
        )
    };
    let mut by_name: BTreeMap<String, super::rules::Tally> = BTreeMap::new();
    let mut sorted = gaps.clone();
    sorted.sort_by_key(|g| std::cmp::Reverse(g.1 - g.0));
    // Naming is a scan per gap; the longest few carry the finding.
    for &(a, b) in sorted.iter().take(50) {
        let g = by_name.entry(covering(a, b)).or_default();
        g.count += 1;
        g.time += b - a;
    }
    let longest = sorted[0].1 - sorted[0].0;
    let gc_note = if gc_total > 0 {
        format!(
            "; {} of it ({:.0}%) in Python garbage collection",
            fmt_us(gc_total as f64 / ctx.windows.len() as f64 / 1000.0),
            100.0 * gc_total as f64 / total as f64
        )
    } else {
        String::new()
    };
    let summary = format!(
        "{} gaps of 1 ms or more inside steps with no op, no CUDA call and an idle GPU: {} {} \
         ({:.1}% {}), the longest {}{gc_note}",
        gaps.len(),
        fmt_us(cost / 1000.0),
        if ctx.has_steps {
            "per step"
        } else {
            "in the trace"
        },
        100.0 * cost / ctx.mean_window_ns(),
        ctx.of_step(),
        fmt_us(longest as f64 / 1000.0),
    );
    let examples: Vec<Example> = sorted
        .iter()
        .take(MAX_EXAMPLES)
        .map(|&(a, b)| ctx.span_example("host stall".into(), a, b))
        .collect();
    Some(finding(
        &HOST_STALL,
        ctx,
        Some(total as f64),
        summary,
        super::rules::tallies_to_evidence(ctx, by_name),
        examples,
    ))
}

/// A garbage-collection range: `python::gc (gen N)`, as `kinetrace record --with-stack` records
/// Python's collections.
fn is_gc(name: &str) -> bool {
    name.starts_with("python::gc")
}

// ---------------------------------------------------------------------------------------------

/// The warm-up note.
pub const WARMUP_IN_WINDOW: Rule = Rule {
    id: "warmup-in-window",
    title: "The profiled window includes warm-up steps",
    severity: Severity::Info,
    fix: "Profile steady-state steps: start later with `torch.profiler.schedule(skip_first=10, \
          wait=1, warmup=1, active=3)` (or `kinetrace record --start-iteration 10`), so \
          cuDNN autotuning, allocator growth, lazy module loading and compilation are not in \
          the numbers.",
};

/// The warm-up fix for a trace without GPU rows: nothing of cuDNN or device memory applies.
pub const WARMUP_IN_WINDOW_CPU_FIX: &str = "Profile steady-state steps: start later with \
          `torch.profiler.schedule(skip_first=10, wait=1, warmup=1, active=3)` (or `kinetrace \
          record --start-iteration 10`), so the first calls' one-time costs (lazy module \
          loading, the allocator growing, oneDNN/MKL kernel selection and JIT, `torch.compile`) \
          are not in the numbers.";

/// Fires when the first step in the window is `ProfilerStep#0` or `#1` (the process's first or
/// second iteration), or, with three or more steps, when the first takes at least 1.5× the
/// median of the others. No cost: it distorts every other number rather than costing time.
pub(super) fn warmup_in_window(ctx: &Ctx<'_>) -> Option<Finding> {
    if !ctx.has_steps {
        return None;
    }
    let first = ctx.windows[0];
    let mut rest: Vec<f64> = ctx.windows[1..].iter().map(|w| w.len() as f64).collect();
    rest.sort_by(f64::total_cmp);
    let median = crate::stats::quantile_sorted(&rest, 0.5);
    let slow_first = rest.len() >= 2 && median.is_some_and(|m| first.len() as f64 >= 1.5 * m);
    if first.number > 1 && !slow_first {
        return None;
    }
    let summary = match median {
        Some(m) => format!(
            "the window starts at ProfilerStep#{} and its first step takes {} against a median {} \
             for the other {}",
            first.number,
            fmt_us(first.len() as f64 / 1000.0),
            fmt_us(m / 1000.0),
            rest.len()
        ),
        None => format!(
            "the window holds only ProfilerStep#{}, one of the process's first steps",
            first.number
        ),
    };
    let step_row = ctx
        .of_kind(Kind::Annotation)
        .chain(ctx.of_kind(Kind::CpuOp))
        .find(|&i| ctx.is_step_row(i) && ctx.row(i).ts == first.ts);
    let mut f = finding(
        &WARMUP_IN_WINDOW,
        ctx,
        None,
        summary,
        Vec::new(),
        step_row.map(|i| ctx.example(i)).into_iter().collect(),
    );
    // Advice for the devices present: a CPU-only job has no cuDNN autotuning.
    if ctx.busy.is_empty() {
        f.fix = WARMUP_IN_WINDOW_CPU_FIX;
    }
    Some(f)
}

// ---------------------------------------------------------------------------------------------

/// The CUDA-graph note.
pub const CUDA_GRAPHS: Rule = Rule {
    id: "cuda-graphs",
    title: "CUDA graph replays: one launch stands for many kernels",
    severity: Severity::Info,
    fix: "Expected with CUDA graphs (`torch.compile(mode=\"reduce-overhead\")`, \
          `torch.cuda.graphs`): the kernels inside a replay are not linked to ATen ops. To see \
          which op a kernel came from, profile a step without graphs.",
};

/// Fires when the trace has graph launches (`cudaGraphLaunch`, `cuGraphLaunch`,
/// `hipGraphLaunch`): said once, no cost.
pub(super) fn cuda_graphs(ctx: &Ctx<'_>) -> Option<Finding> {
    let launches: Vec<usize> = ctx
        .of_kind(Kind::Runtime)
        .filter(|&i| {
            matches!(
                ctx.name(i),
                "cudaGraphLaunch" | "cuGraphLaunch" | "hipGraphLaunch" | "cudaGraphLaunch_v10000"
            )
        })
        .collect();
    if launches.is_empty() {
        return None;
    }
    let time: i64 = launches.iter().map(|&i| ctx.row(i).dur).sum();
    Some(finding(
        &CUDA_GRAPHS,
        ctx,
        None,
        format!("{} graph launches in the trace", launches.len()),
        vec![evidence(
            ctx,
            ctx.name(launches[0]),
            launches.len() as u64,
            time,
        )],
        launches
            .iter()
            .take(MAX_EXAMPLES)
            .map(|&i| ctx.example(i))
            .collect(),
    ))
}

/// The compiled-region note.
pub const COMPILED_REGIONS: Rule = Rule {
    id: "compiled-regions",
    title: "torch.compile regions: Triton kernels instead of ATen ops",
    severity: Severity::Info,
    fix: "Expected with `torch.compile`: a Triton kernel's name lists the ops it fused \
          (`triton_poi_fused_add_cos_sin_0` fuses add, cos and sin). To map kernels back to \
          source lines, run with `TORCH_LOGS=output_code` or `TORCH_COMPILE_DEBUG=1`.",
};

/// Fires when kernels have Triton names (`triton_…`): said once, with their share of GPU time.
pub(super) fn compiled_regions(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut by_name: BTreeMap<String, super::rules::Tally> = BTreeMap::new();
    let (mut triton, mut all) = (0i64, 0i64);
    let mut weighted = Vec::new();
    for i in ctx.of_kind(Kind::Kernel) {
        let d = ctx.row(i).dur;
        all += d;
        if ctx.name(i).starts_with("triton_") || ctx.name(i).starts_with("triton__") {
            triton += d;
            let g = by_name.entry(ctx.name(i).to_owned()).or_default();
            g.count += 1;
            g.time += d;
            weighted.push((d, i));
        }
    }
    if weighted.is_empty() {
        return None;
    }
    let summary = format!(
        "{} Triton kernel launches ({} distinct) take {:.1}% of kernel time",
        weighted.len(),
        by_name.len(),
        if all > 0 {
            100.0 * triton as f64 / all as f64
        } else {
            0.0
        },
    );
    Some(finding(
        &COMPILED_REGIONS,
        ctx,
        None,
        summary,
        super::rules::tallies_to_evidence(ctx, by_name),
        super::rules::top_examples(ctx, weighted),
    ))
}

// ---------------------------------------------------------------------------------------------

/// The drops note.
pub const TRACE_DROPS: Rule = Rule {
    id: "trace-drops",
    title: "The trace says records were dropped: its numbers are incomplete",
    severity: Severity::Warning,
    fix: "Capture less per window (fewer steps, `record_shapes`/`with_stack` off) or give the \
          profiler more buffer: `KINETRACE_MAX_GPU_BUFFER_MB` (CUPTI records) and \
          `KINETRACE_MAX_CPU_BUFFER_MB` (spans) for kinetrace (docs/config.md), \
          `ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB` for Kineto. Do not trust totals from this trace \
          until it is complete.",
};

/// Fires when kinetrace's `dropped_events` has a non-zero count, or Kineto's log lines in the
/// trace (`INFO`/`WARNING`/`ERROR`) say CUPTI stopped early or the GPU buffer limit was hit.
/// Kineto's "Out-of-range" count is not a drop (records outside the window are expected).
pub(super) fn trace_drops(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut ev = Vec::new();
    for (key, value) in &ctx.rows.metadata {
        match key.as_str() {
            "dropped_events" => {
                if let Ok(serde_json::Value::Object(m)) = serde_json::from_str(value) {
                    for (k, v) in m {
                        if let Some(n) = v.as_u64().filter(|&n| n > 0) {
                            ev.push(evidence(ctx, format!("kinetrace dropped_events.{k}"), n, 0));
                        }
                    }
                }
            }
            "INFO" | "WARNING" | "ERROR" => {
                if let Ok(serde_json::Value::Array(lines)) = serde_json::from_str(value) {
                    for line in lines.iter().filter_map(|l| l.as_str()) {
                        let hit = line.contains("CUPTI stopped early? = 1")
                            || line.contains("GPU stopped early")
                            || line.contains("Exceeded max GPU buffer");
                        if hit {
                            let text = line.rsplit("] ").next().unwrap_or(line);
                            ev.push(evidence(ctx, format!("Kineto: {text}"), 1, 0));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if ev.is_empty() {
        return None;
    }
    let parts: Vec<String> = ev
        .iter()
        .map(|e| match e.what.strip_prefix("kinetrace dropped_events.") {
            Some(source) => format!(
                "kinetrace dropped {} {source} record{}",
                e.count,
                if e.count == 1 { "" } else { "s" }
            ),
            None => e.what.clone(),
        })
        .collect();
    let summary = format!("records were lost while capturing: {}", parts.join("; "));
    Some(finding(&TRACE_DROPS, ctx, None, summary, ev, Vec::new()))
}
