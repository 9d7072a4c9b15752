//! The rules about what the GPU waits for: host syncs, input, launch overhead and exposed
//! collectives (and the helpers every rule module uses).
//!
//! Every rule measures a time it can defend as lost (GPU idle, exposed communication, cast
//! kernels) and fires only past a threshold on that time relative to the step, so a healthy trace
//! stays quiet. Thresholds are constants next to each rule, explained in `docs/doctor.md`.

use std::collections::{BTreeMap, HashMap};

use crate::kernel::{kernel_type, KernelType};
use crate::units::fmt_us;

use super::context::{Ctx, Kind};
use super::{evidence, finding, Evidence, Example, Finding, Rule, Severity, MAX_EXAMPLES};

/// `a / b` as a percentage for messages.
pub(super) fn pct(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.1}%", 100.0 * a / b)
    } else {
        "-".into()
    }
}

/// A per-window cost as a share of the mean step: `12.3% of the step`.
pub(super) fn share_text(ctx: &Ctx<'_>, per_window_ns: f64) -> String {
    format!(
        "{} {}",
        pct(per_window_ns, ctx.mean_window_ns()),
        ctx.of_step()
    )
}

/// Whether a per-window cost `ns` passes both an absolute floor and a share of the mean step.
pub(super) fn significant(ctx: &Ctx<'_>, per_window_ns: f64, floor_ns: f64, share: f64) -> bool {
    per_window_ns >= floor_ns && per_window_ns >= share * ctx.mean_window_ns()
}

pub(super) fn per_window(ctx: &Ctx<'_>, total_ns: i64) -> f64 {
    total_ns as f64 / ctx.windows.len().max(1) as f64
}

/// "per step" or "per trace", for summaries.
pub(super) fn per(ctx: &Ctx<'_>) -> &'static str {
    if ctx.has_steps {
        "per step"
    } else {
        "in the trace"
    }
}

/// The op a user wrote around row `i`: its outermost enclosing `cpu_op`, else its innermost
/// enclosing annotation other than a step.
pub(super) fn culprit(ctx: &Ctx<'_>, i: usize) -> String {
    let mut outer_op = None;
    let mut inner_annotation = None;
    for a in ctx.ancestors(i) {
        match ctx.kind(a) {
            Kind::CpuOp if !ctx.is_step_row(a) => outer_op = Some(a),
            Kind::Annotation if !ctx.is_step_row(a) && inner_annotation.is_none() => {
                inner_annotation = Some(a)
            }
            _ => {}
        }
    }
    outer_op
        .or(inner_annotation)
        .map_or_else(|| "(no enclosing op)".into(), |a| ctx.name(a).to_owned())
}

/// Counts and a time per key, with the rows that were the largest contributors.
#[derive(Default)]
pub(super) struct Tally {
    pub count: u64,
    pub time: i64,
}

pub(super) fn tallies_to_evidence(ctx: &Ctx<'_>, t: BTreeMap<String, Tally>) -> Vec<Evidence> {
    t.into_iter()
        .map(|(k, v)| evidence(ctx, k, v.count, v.time))
        .collect()
}

/// The examples: the rows with the largest weight, at most [`MAX_EXAMPLES`].
pub(super) fn top_examples(ctx: &Ctx<'_>, mut weighted: Vec<(i64, usize)>) -> Vec<Example> {
    weighted.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    weighted
        .into_iter()
        .take(MAX_EXAMPLES)
        .map(|(_, i)| ctx.example(i))
        .collect()
}

pub(super) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

// ---------------------------------------------------------------------------------------------

/// Host calls that block until the GPU (or a stream, or a copy) is done.
const SYNC_CALLS: &[&str] = &[
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaMemcpyFromSymbol",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuMemcpyDtoH_v2",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
    "hipMemcpy",
    "hipMemcpyWithStream",
];

/// The sync rule.
pub const SYNC_IN_STEP: Rule = Rule {
    id: "sync-in-step",
    title: "Host syncs in the training step leave the GPU idle",
    severity: Severity::Warning,
    fix: "Keep values on the GPU inside the step: defer `.item()`, `.cpu()`, `.tolist()`, \
          `print(tensor)` and data-dependent shapes (`nonzero`, boolean masks) to every N steps \
          or to after the loop; vectorise Python conditions on tensors (`torch.where`); log \
          metrics asynchronously (accumulate on the GPU, copy with `non_blocking=True` into \
          pinned memory); for input copies under `aten::to` use a pinned source \
          (`pin_memory=True`) and `non_blocking=True`; remove explicit \
          `torch.cuda.synchronize()` from the loop.",
};

/// Fires when the GPU idle that follows the syncs is at least 1% of the mean step and 10 µs per
/// step. The cost is that idle time: from the end of each sync to the next GPU work, counted
/// once when syncs follow each other, and never past the step's end.
pub(super) fn sync_in_step(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut calls: Vec<(usize, usize)> = ctx
        .of_kind(Kind::Runtime)
        .filter(|&i| SYNC_CALLS.contains(&ctx.name(i)))
        .filter_map(|i| Some((i, ctx.window_at(ctx.row(i).ts)?)))
        .collect();
    if calls.is_empty() {
        return None;
    }
    calls.sort_by_key(|&(i, _)| ctx.row(i).end());
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    let mut covered_until = i64::MIN;
    let mut total = 0;
    let mut weighted = Vec::new();
    for &(i, w) in &calls {
        let end = ctx.row(i).end();
        let idle_end = end + ctx.idle_until_work(end, ctx.windows[w].end);
        let idle = (idle_end - end.max(covered_until)).max(0);
        covered_until = covered_until.max(idle_end);
        total += idle;
        let g = groups
            .entry(format!("{} → {}", culprit(ctx, i), ctx.name(i)))
            .or_default();
        g.count += 1;
        g.time += idle;
        weighted.push((idle, i));
    }
    let cost = per_window(ctx, total);
    if !significant(ctx, cost, 10_000.0, 0.01) {
        return None;
    }
    let ev = tallies_to_evidence(ctx, groups);
    let top = ev
        .iter()
        .max_by(|a, b| a.time_us.0.total_cmp(&b.time_us.0))
        .map(|e| e.what.clone())
        .unwrap_or_default();
    let summary = format!(
        "{:.1} blocking syncs {} (most GPU idle after: {top}); the GPU then waits {} {} for the \
         host to launch work again ({})",
        calls.len() as f64 / ctx.windows.len() as f64,
        per(ctx),
        fmt_us(cost / 1000.0),
        per(ctx),
        share_text(ctx, cost),
    );
    Some(finding(
        &SYNC_IN_STEP,
        ctx,
        Some(total as f64),
        summary,
        ev,
        top_examples(ctx, weighted),
    ))
}

// ---------------------------------------------------------------------------------------------

/// The input rule.
pub const INPUT_BOUND: Rule = Rule {
    id: "input-bound",
    title: "Input-bound steps: the GPU waits for the DataLoader",
    severity: Severity::Warning,
    fix: "Feed the GPU ahead of time: more DataLoader workers (`num_workers`), \
          `persistent_workers=True`, a larger `prefetch_factor`, `pin_memory=True` with \
          `.to(device, non_blocking=True)`; move decoding and augmentation to the GPU or to a \
          preprocessed dataset; check storage and network throughput.",
};

fn is_loader(ctx: &Ctx<'_>, i: usize) -> bool {
    let name = ctx.name(i);
    match ctx.kind(i) {
        Kind::Annotation | Kind::CpuOp => {
            name.contains("DataLoader")
                && (name.contains("__next__") || name.starts_with("enumerate("))
        }
        Kind::Python => name.contains("dataloader.py") && name.contains("__next__"),
        _ => false,
    }
}

/// Fires when the GPU is idle during DataLoader fetches (`enumerate(DataLoader)#…__next__`
/// ranges, or `dataloader.py … __next__` Python frames) for at least 5% of the mean step and
/// 50 µs per step. The cost is that idle time.
pub(super) fn input_bound(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    let mut total = 0;
    let mut fetches = 0u64;
    let mut weighted = Vec::new();
    for i in 0..ctx.len() {
        if !is_loader(ctx, i) || ctx.ancestors(i).any(|a| is_loader(ctx, a)) {
            continue;
        }
        let r = ctx.row(i);
        let Some(w) = ctx
            .window_at(r.ts)
            .or_else(|| ctx.window_at(r.end() - 1))
            .map(|w| ctx.windows[w])
        else {
            continue;
        };
        let (a, b) = (r.ts.max(w.ts), r.end().min(w.end));
        let idle = (b - a) - ctx.busy_between(a, b);
        let g = groups.entry(ctx.name(i).to_owned()).or_default();
        g.count += 1;
        g.time += idle.max(0);
        total += idle.max(0);
        fetches += 1;
        weighted.push((idle, i));
    }
    let cost = per_window(ctx, total);
    if fetches == 0 || !significant(ctx, cost, 50_000.0, 0.05) {
        return None;
    }
    let summary = format!(
        "{:.1} DataLoader fetches {} with the GPU idle for {} of them ({})",
        fetches as f64 / ctx.windows.len() as f64,
        per(ctx),
        fmt_us(cost / 1000.0),
        share_text(ctx, cost),
    );
    Some(finding(
        &INPUT_BOUND,
        ctx,
        Some(total as f64),
        summary,
        tallies_to_evidence(ctx, groups),
        top_examples(ctx, weighted),
    ))
}

// ---------------------------------------------------------------------------------------------

/// The launch-overhead rule.
pub const SMALL_OP_STORM: Rule = Rule {
    id: "small-op-storm",
    title: "Eager small-op storm: the GPU waits for kernel launches",
    severity: Severity::Warning,
    fix: "Launch fewer, larger kernels: `torch.compile` the model (fuses elementwise chains), use \
          fused ops (fused optimizers, `scaled_dot_product_attention`, fused LayerNorm/GELU), \
          CUDA graphs (`torch.compile(mode=\"reduce-overhead\")`) for static shapes, or a larger \
          batch per step.",
};

/// Kernels shorter than this are "small".
const SMALL_KERNEL_NS: i64 = 50_000;

/// Launch-wait gaps at least this long are not launch latency (a sync, a stall, input): other
/// rules account for them.
const LAUNCH_GAP_MAX_NS: i64 = 1_000_000;

/// Fires when a step launches at least 200 kernels on average, at least 60% of them shorter than
/// 50 µs, the launch calls alone take at least 30% of the GPU's busy time (the host can barely
/// keep up), and the GPU waits for launches (gaps under 1 ms where the next kernel's launch call
/// started after the GPU ran dry, HTA's host wait) for at least 10% of the mean step and 100 µs.
/// The cost is that launch-wait time.
pub(super) fn small_op_storm(ctx: &Ctx<'_>) -> Option<Finding> {
    let n = ctx.windows.len();
    let mut per_win: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in 0..ctx.len() {
        if ctx.kind(i).is_gpu() {
            if let Some(w) = ctx.window_of(i) {
                per_win[w].push(i);
            }
        }
    }
    let mut kernels = 0u64;
    let mut small = 0u64;
    let mut launch_cpu = 0i64;
    let mut launches = 0u64;
    let mut wait = 0i64;
    let mut gaps: Vec<(i64, i64, i64)> = Vec::new();
    let mut small_by_name: HashMap<&str, Tally> = HashMap::new();
    for ops in &mut per_win {
        ops.sort_by_key(|&i| (ctx.row(i).ts, i));
        let mut max_end: Option<i64> = None;
        for &i in ops.iter() {
            let r = ctx.row(i);
            if ctx.kind(i) == Kind::Kernel {
                kernels += 1;
                if r.dur < SMALL_KERNEL_NS {
                    small += 1;
                    let t = small_by_name.entry(ctx.name(i)).or_default();
                    t.count += 1;
                    t.time += r.dur;
                }
                if let Some(l) = ctx.launcher(i) {
                    launches += 1;
                    launch_cpu += ctx.row(l).dur;
                }
            }
            if let Some(me) = max_end {
                if r.ts > me && ctx.launch_ts(i) > me && r.ts - me < LAUNCH_GAP_MAX_NS {
                    wait += r.ts - me;
                    gaps.push((r.ts - me, me, r.ts));
                }
            }
            max_end = Some(max_end.map_or(r.end(), |m| m.max(r.end())));
        }
    }
    let per_k = kernels as f64 / n.max(1) as f64;
    let cost = per_window(ctx, wait);
    if per_k < 200.0
        || (small as f64) < 0.6 * kernels as f64
        || !significant(ctx, cost, 100_000.0, 0.10)
    {
        return None;
    }
    let busy: i64 = ctx
        .windows
        .iter()
        .map(|w| ctx.busy_between(w.ts, w.end))
        .sum();
    if (launch_cpu as f64) < 0.3 * busy as f64 {
        return None;
    }
    let summary = format!(
        "{per_k:.0} kernels {} ({} shorter than 50 µs); launching them costs the host {} {} \
         against {} of GPU work, and the GPU waits {} {} for the next launch ({})",
        per(ctx),
        pct(small as f64, kernels as f64),
        fmt_us(per_window(ctx, launch_cpu) / 1000.0),
        per(ctx),
        fmt_us(per_window(ctx, busy) / 1000.0),
        fmt_us(cost / 1000.0),
        per(ctx),
        share_text(ctx, cost),
    );
    let mut ev: Vec<Evidence> = small_by_name
        .into_iter()
        .map(|(k, v)| evidence(ctx, clip(k, 100), v.count, v.time))
        .collect();
    // Sorted by count here (the kernels are small: their count is the point).
    ev.sort_by(|a, b| b.count.cmp(&a.count).then(a.what.cmp(&b.what)));
    ev.truncate(super::MAX_EVIDENCE_PER_RANK - 1);
    ev.push(evidence(
        ctx,
        "launch calls (host time)",
        launches,
        launch_cpu,
    ));
    gaps.sort_by_key(|g| std::cmp::Reverse(g.0));
    let examples = gaps
        .iter()
        .take(MAX_EXAMPLES)
        .map(|&(_, a, b)| ctx.span_example("GPU waits for the next launch".into(), a, b))
        .collect();
    let mut f = finding(
        &SMALL_OP_STORM,
        ctx,
        Some(wait as f64),
        summary,
        ev,
        examples,
    );
    f.evidence
        .sort_by(|a, b| b.count.cmp(&a.count).then(a.what.cmp(&b.what)));
    Some(f)
}

// ---------------------------------------------------------------------------------------------

/// The communication rule.
pub const EXPOSED_COMMUNICATION: Rule = Rule {
    id: "exposed-communication",
    title: "Collectives not overlapped with compute",
    severity: Severity::Warning,
    fix: "Overlap gradient communication with backward: with DDP, tune `bucket_cap_mb` so the \
          first buckets are ready early and keep `gradient_as_bucket_view=True`; avoid \
          `find_unused_parameters=True` unless needed; use `no_sync()` for gradient accumulation; \
          with FSDP enable `backward_prefetch` / `forward_prefetch`; make sure nothing \
          synchronizes the communication stream with the compute stream. If another rank is a \
          straggler, the wait shows here too: fix the straggler first.",
};

fn is_comm_kernel(name: &str) -> bool {
    kernel_type(name) == KernelType::Communication
        || name.starts_with("rccl")
        || name.contains("ncclDevKernel")
}

pub(super) fn merged(mut iv: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    iv.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for (s, e) in iv {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e.max(s))),
        }
    }
    out
}

fn overlap_with(merged: &[(i64, i64)], a: i64, b: i64) -> i64 {
    let from = merged.partition_point(|&(_, e)| e <= a);
    merged[from..]
        .iter()
        .take_while(|&&(s, _)| s < b)
        .map(|&(s, e)| (e.min(b) - s.max(a)).max(0))
        .sum()
}

/// Fires when communication kernels run with no computation kernel beside them for at least 10%
/// of the mean step and 100 µs per step. The cost is that exposed communication time.
pub(super) fn exposed_communication(ctx: &Ctx<'_>) -> Option<Finding> {
    let n = ctx.windows.len();
    let mut comm: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut comp: Vec<Vec<(i64, i64)>> = vec![Vec::new(); n];
    for i in ctx.of_kind(Kind::Kernel) {
        let Some(w) = ctx.window_of(i) else { continue };
        let name = ctx.name(i);
        let r = ctx.row(i);
        if is_comm_kernel(name) {
            comm[w].push(i);
        } else if kernel_type(name) == KernelType::Computation {
            comp[w].push((r.ts, r.end()));
        }
    }
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    let mut exposed_total = 0;
    let mut after_compute = 0u64;
    let mut collectives = 0u64;
    let mut weighted = Vec::new();
    for (w, ks) in comm.iter().enumerate() {
        let comp_m = merged(std::mem::take(&mut comp[w]));
        let last_comp_end = comp_m.last().map(|c| c.1);
        let comm_m = merged(
            ks.iter()
                .map(|&i| (ctx.row(i).ts, ctx.row(i).end()))
                .collect(),
        );
        exposed_total += comm_m
            .iter()
            .map(|&(s, e)| (e - s) - overlap_with(&comp_m, s, e))
            .sum::<i64>();
        for &i in ks {
            let r = ctx.row(i);
            let exposed = r.dur - overlap_with(&comp_m, r.ts, r.end());
            let g = groups.entry(clip(ctx.name(i), 100)).or_default();
            g.count += 1;
            g.time += exposed;
            collectives += 1;
            if last_comp_end.is_none_or(|e| r.ts >= e) {
                after_compute += 1;
            }
            weighted.push((exposed, i));
        }
    }
    let cost = per_window(ctx, exposed_total);
    if collectives == 0 || !significant(ctx, cost, 100_000.0, 0.10) {
        return None;
    }
    let summary = format!(
        "{} of communication {} runs with no compute beside it ({}); {} of {} \
         collectives start after the step's last compute kernel",
        fmt_us(cost / 1000.0),
        per(ctx),
        share_text(ctx, cost),
        after_compute,
        collectives,
    );
    Some(finding(
        &EXPOSED_COMMUNICATION,
        ctx,
        Some(exposed_total as f64),
        summary,
        tallies_to_evidence(ctx, groups),
        top_examples(ctx, weighted),
    ))
}
