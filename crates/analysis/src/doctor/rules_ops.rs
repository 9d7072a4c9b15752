//! The rules about what the GPU computes that it need not: implicit casts, fp32 GEMMs in a
//! half-precision run, per-parameter optimizer steps, and forward ops recomputed in backward.

use std::collections::{BTreeMap, HashMap};

use crate::units::fmt_us;

use super::context::{Ctx, Kind};
use super::rules::{
    clip, pct, per, per_window, share_text, significant, tallies_to_evidence, top_examples, Tally,
};
use super::{finding, Finding, Rule, Severity, MAX_EXAMPLES};

/// The cast rule.
pub const DTYPE_CASTS: Rule = Rule {
    id: "dtype-casts",
    title: "Implicit dtype casts run as GPU kernels every step",
    severity: Severity::Warning,
    fix:
        "Cast once, not every step: keep weights and inputs in the dtype the math runs in (create \
          tensors with the right `dtype`, cast the model once with `.to(dtype)`), let the \
          DataLoader produce that dtype, and under autocast avoid mixing fp32 buffers into \
          half-precision ops; check the callers listed for `.float()`/`.half()`/`.to(dtype)`.",
};

const CAST_OPS: &[&str] = &[
    "aten::to",
    "aten::_to_copy",
    "aten::type_as",
    "aten::float",
    "aten::half",
    "aten::bfloat16",
];

/// Fires when kernels launched under a cast op (`aten::to`, `aten::_to_copy`, ...) take at least
/// 2% of the mean step and 20 µs per step. (Copies between devices run as memcpys, not kernels, so
/// a kernel under a cast op converts a dtype or a layout on the device.) The cost is their GPU
/// time.
pub(super) fn dtype_casts(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    let mut total = 0;
    let mut casts = 0u64;
    let mut weighted = Vec::new();
    for i in ctx.of_kind(Kind::Kernel) {
        let Some(l) = ctx.launcher(i) else { continue };
        if ctx.window_of(i).is_none() {
            continue;
        }
        let chain: Vec<usize> = ctx.ancestors(l).collect();
        let Some(outer_cast) = chain
            .iter()
            .rposition(|&a| ctx.kind(a) == Kind::CpuOp && CAST_OPS.contains(&ctx.name(a)))
        else {
            continue;
        };
        let caller = chain[outer_cast + 1..]
            .iter()
            .find(|&&a| {
                !ctx.is_step_row(a) && matches!(ctx.kind(a), Kind::CpuOp | Kind::Annotation)
            })
            .map_or("(top level)", |&a| ctx.name(a));
        let what = format!("{} under {}", ctx.name(chain[outer_cast]), clip(caller, 80));
        let r = ctx.row(i);
        let g = groups.entry(what).or_default();
        g.count += 1;
        g.time += r.dur;
        total += r.dur;
        casts += 1;
        weighted.push((r.dur, i));
    }
    let cost = per_window(ctx, total);
    if casts == 0 || !significant(ctx, cost, 20_000.0, 0.02) {
        return None;
    }
    let summary = format!(
        "{:.1} cast kernels {} take {} of GPU time ({})",
        casts as f64 / ctx.windows.len() as f64,
        per(ctx),
        fmt_us(cost / 1000.0),
        share_text(ctx, cost),
    );
    Some(finding(
        &DTYPE_CASTS,
        ctx,
        Some(total as f64),
        summary,
        tallies_to_evidence(ctx, groups),
        top_examples(ctx, weighted),
    ))
}

/// The fp32-GEMM rule.
pub const FP32_GEMM: Rule = Rule {
    id: "fp32-gemm",
    title: "fp32 GEMMs in a run that otherwise uses half precision",
    severity: Severity::Warning,
    fix: "Run those matmuls in bf16/fp16 too: cover them with `torch.autocast`, or find the fp32 \
          inputs (a buffer, a mask or a layer kept in fp32) and cast them once; if fp32 is \
          needed, allow TF32 (`torch.backends.cuda.matmul.allow_tf32 = True` or \
          `torch.set_float32_matmul_precision(\"high\")`).",
};

fn is_gemm(lower: &str) -> bool {
    lower.contains("gemm") || lower.contains("matmul")
}

fn is_fp32_gemm(lower: &str) -> bool {
    is_gemm(lower)
        && (lower.contains("sgemm") || lower.contains("f32f32") || lower.contains("gemm_fp32"))
}

fn is_half_gemm(lower: &str) -> bool {
    is_gemm(lower)
        && [
            "hgemm", "bf16", "f16f16", "fp16", "half", "bfloat16", "h1688", "h16816", "h884",
        ]
        .iter()
        .any(|m| lower.contains(m))
}

/// Fires when fp32 GEMM kernels (`sgemm`, `f32f32`) take at least 5% of GEMM time while
/// half-precision GEMMs (`hgemm`, `bf16`, `f16`, ...) take at least 10% of it, and the estimated
/// cost is at least 1% of the step. The cost is an estimate: half of the fp32 GEMM time
/// (half-precision tensor-core GEMMs run at least twice as fast).
pub(super) fn fp32_gemm(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut fp32: BTreeMap<String, Tally> = BTreeMap::new();
    let (mut t32, mut t16, mut tall) = (0i64, 0i64, 0i64);
    let mut weighted = Vec::new();
    for i in ctx.of_kind(Kind::Kernel) {
        if ctx.window_of(i).is_none() {
            continue;
        }
        let lower = ctx.name(i).to_ascii_lowercase();
        if !is_gemm(&lower) {
            continue;
        }
        let d = ctx.row(i).dur;
        tall += d;
        if is_fp32_gemm(&lower) {
            t32 += d;
            let g = fp32.entry(clip(ctx.name(i), 100)).or_default();
            g.count += 1;
            g.time += d;
            weighted.push((d, i));
        } else if is_half_gemm(&lower) {
            t16 += d;
        }
    }
    let all = tall as f64;
    let cost_total = t32 / 2;
    if t32 == 0
        || (t32 as f64) < 0.05 * all
        || (t16 as f64) < 0.10 * all
        || !significant(ctx, per_window(ctx, cost_total), 10_000.0, 0.01)
    {
        return None;
    }
    let summary = format!(
        "fp32 GEMMs take {} of GPU time {} ({} of GEMM time) while half-precision GEMMs take {}; \
         running them in half precision would save about {} {}",
        fmt_us(per_window(ctx, t32) / 1000.0),
        per(ctx),
        pct(t32 as f64, all),
        fmt_us(per_window(ctx, t16) / 1000.0),
        fmt_us(per_window(ctx, cost_total) / 1000.0),
        per(ctx),
    );
    Some(finding(
        &FP32_GEMM,
        ctx,
        Some(cost_total as f64),
        summary,
        tallies_to_evidence(ctx, fp32),
        top_examples(ctx, weighted),
    ))
}

// ---------------------------------------------------------------------------------------------

/// The optimizer rule.
pub const PER_PARAMETER_OPTIMIZER: Rule = Rule {
    id: "per-parameter-optimizer",
    title: "Optimizer step runs per parameter (no foreach/fused implementation)",
    severity: Severity::Warning,
    fix: "Use the multi-tensor implementations: `foreach=True` or `fused=True` on \
          `torch.optim.Adam/AdamW/SGD` (the default picks foreach only when every parameter is \
          on a supported device and no option rules it out), or a fused optimizer from your \
          framework; `torch.compile` the optimizer step.",
};

/// Elementwise ops an unfused optimizer runs once per parameter.
const PER_PARAM_OPS: &[&str] = &[
    "aten::add_",
    "aten::mul_",
    "aten::addcmul_",
    "aten::addcdiv_",
    "aten::div_",
    "aten::sub_",
    "aten::lerp_",
    "aten::sqrt",
    "aten::sqrt_",
    "aten::add",
    "aten::mul",
    "aten::div",
    "aten::maximum",
    "aten::clamp_",
    "aten::zero_",
    "aten::copy_",
];

/// Fires when `Optimizer.step#…` ranges run on average at least 100 per-parameter elementwise ops
/// (directly, not nested in another op) per call, no `_foreach_`/`_fused_` op, and those ops take
/// at least 5% of the mean step and 100 µs. The cost is their host time (the launches a
/// multi-tensor optimizer replaces with a few).
pub(super) fn per_parameter_optimizer(ctx: &Ctx<'_>) -> Option<Finding> {
    let opt_rows: Vec<usize> = ctx
        .of_kind(Kind::Annotation)
        .filter(|&i| ctx.name(i).starts_with("Optimizer.step#"))
        .filter(|&i| ctx.window_of(i).is_some())
        .collect();
    if opt_rows.is_empty() {
        return None;
    }
    let is_opt: HashMap<usize, ()> = opt_rows.iter().map(|&i| (i, ())).collect();
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    let (mut per_param, mut foreach, mut time) = (0u64, 0u64, 0i64);
    let mut weighted = Vec::new();
    for i in ctx.of_kind(Kind::CpuOp) {
        // The first op or optimizer range above this op: only ops called by the optimizer itself.
        let Some(a) = ctx
            .ancestors(i)
            .find(|&a| ctx.kind(a) == Kind::CpuOp || is_opt.contains_key(&a))
        else {
            continue;
        };
        if !is_opt.contains_key(&a) {
            continue;
        }
        let name = ctx.name(i);
        if name.starts_with("aten::_foreach_") || name.starts_with("aten::_fused_") {
            foreach += 1;
        } else if PER_PARAM_OPS.contains(&name) {
            per_param += 1;
            let d = ctx.row(i).dur;
            time += d;
            let g = groups.entry(name.to_owned()).or_default();
            g.count += 1;
            g.time += d;
            weighted.push((d, i));
        }
    }
    let calls = opt_rows.len() as f64;
    let cost = per_window(ctx, time);
    if foreach > 0 || (per_param as f64) < 100.0 * calls || !significant(ctx, cost, 100_000.0, 0.05)
    {
        return None;
    }
    let summary = format!(
        "{} ({} call{}) runs {:.0} per-parameter ops per call and no foreach/fused op; they take \
         {} of host time {} ({})",
        ctx.name(opt_rows[0]),
        opt_rows.len(),
        if opt_rows.len() == 1 { "" } else { "s" },
        per_param as f64 / calls,
        fmt_us(cost / 1000.0),
        per(ctx),
        share_text(ctx, cost),
    );
    let examples = std::iter::once(ctx.example(opt_rows[0]))
        .chain(
            top_examples(ctx, weighted)
                .into_iter()
                .take(MAX_EXAMPLES - 1),
        )
        .collect();
    Some(finding(
        &PER_PARAMETER_OPTIMIZER,
        ctx,
        Some(time as f64),
        summary,
        tallies_to_evidence(ctx, groups),
        examples,
    ))
}

// ---------------------------------------------------------------------------------------------

/// The recomputation rule.
pub const RECOMPUTE_IN_BACKWARD: Rule = Rule {
    id: "recompute-in-backward",
    title: "Forward ops run again inside backward (activation checkpointing)",
    severity: Severity::Warning,
    fix: "If memory allows, checkpoint fewer layers: selective activation checkpointing (keep \
          cheap-to-store, expensive-to-recompute activations such as attention and matmul outputs), \
          checkpoint every other block, or turn it off where the memory headroom is there; check \
          whether a library turned it on (`gradient_checkpointing_enable()`, FSDP/accelerate \
          configs).",
};

/// Forward-level ops that backward itself never calls (their gradients are `…_backward` ops, `mm`,
/// `t` and the like), so finding one inside backward means a forward ran again there.
const FORWARD_OPS: &[&str] = &[
    "aten::linear",
    "aten::conv1d",
    "aten::conv2d",
    "aten::conv3d",
    "aten::layer_norm",
    "aten::group_norm",
    "aten::batch_norm",
    "aten::embedding",
    "aten::scaled_dot_product_attention",
    "aten::dropout",
    "aten::gelu",
    "aten::silu",
];

/// Fires when kernels launched under a forward-level op (`aten::linear`, `aten::conv2d`,
/// `aten::layer_norm`, `aten::scaled_dot_product_attention`, ...) that itself runs inside an
/// `autograd::engine::evaluate_function: …` op (backward) take at least 5% of the mean step and
/// 100 µs per step. The cost is their GPU time: the recomputation.
pub(super) fn recompute_in_backward(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    let mut total = 0;
    let mut weighted = Vec::new();
    for i in ctx.of_kind(Kind::Kernel) {
        let Some(l) = ctx.launcher(i) else { continue };
        if ctx.window_of(i).is_none() {
            continue;
        }
        let chain: Vec<usize> = ctx.ancestors(l).collect();
        let Some(fwd) = chain
            .iter()
            .position(|&a| ctx.kind(a) == Kind::CpuOp && FORWARD_OPS.contains(&ctx.name(a)))
        else {
            continue;
        };
        let Some(&bwd) = chain[fwd + 1..].iter().find(|&&a| {
            ctx.kind(a) == Kind::CpuOp
                && ctx
                    .name(a)
                    .starts_with("autograd::engine::evaluate_function:")
        }) else {
            continue;
        };
        let what = format!(
            "{} inside {}",
            ctx.name(chain[fwd]),
            clip(
                ctx.name(bwd)
                    .trim_start_matches("autograd::engine::evaluate_function:")
                    .trim(),
                60
            )
        );
        let d = ctx.row(i).dur;
        let g = groups.entry(what).or_default();
        g.count += 1;
        g.time += d;
        total += d;
        weighted.push((d, i));
    }
    let cost = per_window(ctx, total);
    if weighted.is_empty() || !significant(ctx, cost, 100_000.0, 0.05) {
        return None;
    }
    let summary = format!(
        "{:.1} kernels {} of forward ops run again during backward, {} of GPU time ({})",
        weighted.len() as f64 / ctx.windows.len() as f64,
        per(ctx),
        fmt_us(cost / 1000.0),
        share_text(ctx, cost),
    );
    Some(finding(
        &RECOMPUTE_IN_BACKWARD,
        ctx,
        Some(total as f64),
        summary,
        tallies_to_evidence(ctx, groups),
        top_examples(ctx, weighted),
    ))
}
