//! The rules built on the efficiency and collectives analyses: GEMMs among the costliest ops far
//! below their roofline (per rank), and what waiting in collectives adds to the straggler and
//! exposed-communication findings (across ranks).

use std::collections::BTreeMap;

use crate::collectives::{self, Instance};
use crate::efficiency::{Category, Group, Precision, RankEfficiency};
use crate::units::{fmt_us, Us};

use super::context::Ctx;
use super::rules::{pct, per, per_window, share_text, significant, EXPOSED_COMMUNICATION};
use super::{finding, Evidence, Example, Finding, RankSteps, Rule, Severity, STRAGGLER_RANK};

/// The GEMM roofline rule.
pub const GEMM_BELOW_ROOFLINE: Rule = Rule {
    id: "gemm-below-roofline",
    title: "GEMMs among the costliest ops run far below the hardware's roofline",
    severity: Severity::Warning,
    fix: "Give the GEMM shapes tensor cores like: dims that are multiples of 8 for fp16/bf16, \
          16 for fp8/int8, 4 for TF32 (pad the hidden size, vocabulary or batch); run fp32 GEMMs \
          in bf16/fp16 (torch.autocast) or allow TF32 \
          (`torch.backends.cuda.matmul.allow_tf32 = True`); batch many small GEMMs into one \
          (bmm, grouped GEMM) or let torch.compile fuse them; for memory-bound shapes (a small \
          M or N) larger batches raise the arithmetic intensity.",
};

/// Op groups looked at: the ones with the most GPU time.
const TOP: usize = 5;
/// A GEMM below this fraction of its roofline is slow.
const SLOW: f64 = 0.5;
/// What a tuned GEMM reaches: the cost is the time beyond roofline time / this.
const ACHIEVABLE: f64 = 0.7;

/// The alignment tensor cores want for a precision (NVIDIA, "Matrix Multiplication Background",
/// https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/).
fn alignment(p: Precision) -> Option<i64> {
    match p {
        Precision::Fp16 | Precision::Bf16 => Some(8),
        Precision::Fp8 | Precision::Int8 => Some(16),
        Precision::Fp32 => Some(4),
        _ => None,
    }
}

/// Fires when a GEMM group is among the [`TOP`] op groups by GPU time and runs below [`SLOW`]
/// of its roofline, and running the slow ones at [`ACHIEVABLE`] of it would save at least 2% of
/// the mean step and 50 µs per step. Needs the device's peaks (the peaks table or
/// `--peak-tflops`/`--peak-bandwidth`).
pub(super) fn gemm_below_roofline(ctx: &Ctx<'_>, eff: &RankEfficiency) -> Option<Finding> {
    let mut groups: Vec<&Group> = eff.groups.iter().filter(|g| g.on_gpu).collect();
    groups.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then_with(|| a.op.cmp(&b.op)));
    let slow: Vec<(&Group, f64)> = groups
        .iter()
        .take(TOP)
        .filter(|g| g.category == Category::Gemm && g.roof_time_ns > 0)
        .map(|g| (*g, g.roofline_ns / g.roof_time_ns as f64))
        .filter(|&(_, f)| f < SLOW)
        .collect();
    if slow.is_empty() {
        return None;
    }
    let half_elsewhere = eff
        .groups
        .iter()
        .any(|g| g.category == Category::Gemm && g.precision.is_reduced());
    let mut cost = 0.0;
    let mut evidence = Vec::new();
    let mut examples = Vec::new();
    for &(g, f) in &slow {
        cost += (g.time_ns as f64 - g.roofline_ns / ACHIEVABLE).max(0.0);
        let mut why = Vec::new();
        if let (Some(a), Some([_, m, n, k])) = (alignment(g.precision), g.gemm) {
            let off: Vec<String> = [("M", m), ("N", n), ("K", k)]
                .iter()
                .filter(|(_, v)| v % a != 0)
                .map(|(d, v)| format!("{d}={v}"))
                .collect();
            if !off.is_empty() {
                why.push(format!(
                    "{} not a multiple of {a} ({})",
                    off.join(", "),
                    if g.precision == Precision::Fp32 {
                        "TF32".to_owned()
                    } else {
                        g.precision.as_str().to_owned()
                    }
                ));
            }
        }
        if g.precision == Precision::Fp32 {
            why.push(if half_elsewhere {
                "fp32 while half-precision GEMMs run elsewhere".into()
            } else {
                "fp32 (tensor cores only with TF32)".to_owned()
            });
        }
        let bound = if g.compute_ns >= g.memory_ns {
            "compute"
        } else {
            "memory"
        };
        let mut what = format!(
            "{} {} {} ({}): {} of roofline, {bound}-bound",
            g.op,
            g.shapes,
            g.dtypes,
            g.params,
            pct(f, 1.0)
        );
        for w in why {
            what.push_str("; ");
            what.push_str(&w);
        }
        evidence.push(super::evidence(ctx, what, g.calls, g.time_ns));
        if let Some(row) = g.longest {
            examples.push(ctx.example(row as usize));
        }
    }
    let cost_pw = per_window(ctx, cost as i64);
    if !significant(ctx, cost_pw, 50_000.0, 0.02) {
        return None;
    }
    let summary = format!(
        "{} of the {TOP} op groups with the most GPU time {} GEMM{} below {} of the roofline \
         ({}); at {} of it they would take {} less {} ({})",
        slow.len(),
        if slow.len() == 1 { "is a" } else { "are" },
        if slow.len() == 1 { "" } else { "s" },
        pct(SLOW, 1.0),
        slow.iter()
            .map(|(_, f)| pct(*f, 1.0))
            .collect::<Vec<_>>()
            .join(", "),
        pct(ACHIEVABLE, 1.0),
        fmt_us(cost_pw / 1000.0),
        per(ctx),
        share_text(ctx, cost_pw),
    );
    Some(finding(
        &GEMM_BELOW_ROOFLINE,
        ctx,
        Some(cost),
        summary,
        evidence,
        examples,
    ))
}

/// Matches the ranks' collectives (as `analyze` does) and feeds the result to the straggler
/// and exposed-communication findings: the rank the others wait for in collectives becomes a
/// straggler finding when the step-time rule found none, and every rank's wait joins the
/// evidence of both.
pub(super) fn collective_waits(
    findings: &mut Vec<Finding>,
    comms: Vec<(i64, u32, Vec<Instance>)>,
    steps: &[RankSteps],
) {
    if comms.iter().filter(|(_, _, l)| !l.is_empty()).count() < 2 {
        return;
    }
    let rows: Vec<_> = steps.iter().flat_map(|r| r.rows.iter().cloned()).collect();
    let mut step_count: BTreeMap<(i64, u32), usize> = BTreeMap::new();
    for s in &rows {
        *step_count.entry((s.rank, s.cycle)).or_default() += 1;
    }
    let merged = collectives::merge(comms, &rows);
    if merged.waits.is_empty() {
        return;
    }
    let evidence_of = |w: &collectives::RankWait| {
        let n = step_count
            .get(&(w.rank, w.cycle))
            .copied()
            .unwrap_or(0)
            .max(1) as f64;
        Evidence {
            rank: w.rank,
            what: format!(
                "waiting in collectives for {} (this rank arrived last in {} of {})",
                w.waited_for
                    .map_or("the other ranks".into(), |r| format!("rank {r}")),
                w.last_count,
                w.matched
            ),
            count: w.matched,
            count_per_step: w.matched as f64 / n,
            time_us: w.wait_us,
            time_per_step_us: w.wait_per_step_us,
        }
    };
    let has_steps = !rows.is_empty();
    let straggler_found = findings.iter().any(|f| f.rule == STRAGGLER_RANK.id);
    if let Some(s) = &merged.straggler {
        let significant = s.others_wait_per_step_us.0 >= 100.0
            && s.others_wait_share.get().is_none_or(|v| v >= 0.05);
        if !straggler_found && significant {
            let origin = |rank: i64, cycle: u32| {
                steps
                    .iter()
                    .find(|r| {
                        r.rows
                            .first()
                            .is_some_and(|x| x.rank == rank && x.cycle == cycle)
                    })
                    .map(|r| (r.origin_ns, r.base_ns))
            };
            let examples = merged
                .worst_waits
                .iter()
                .map(|w| {
                    let (origin_ns, base) = origin(w.rank, w.cycle).unwrap_or((w.ts, None));
                    Example {
                        rank: w.rank,
                        cycle: w.cycle,
                        name: format!(
                            "{} waiting {} for rank {}",
                            w.kind,
                            fmt_us(w.wait as f64 / 1000.0),
                            w.last
                        ),
                        at_ms: (w.ts - origin_ns) as f64 / 1e6,
                        ts_us: (w.ts - base.unwrap_or(0)) as f64 / 1000.0,
                        dur_us: Us::from_ns(w.dur),
                    }
                })
                .collect();
            findings.push(Finding {
                rule: STRAGGLER_RANK.id,
                title: STRAGGLER_RANK.title,
                severity: STRAGGLER_RANK.severity,
                summary: format!(
                    "rank {} arrived last in {} of {} collectives matched across ranks (the n-th \
                     of each process group on every rank); the other ranks waited a median {} \
                     {} for it inside their collectives",
                    s.rank,
                    s.last_count,
                    s.matched,
                    fmt_us(s.others_wait_per_step_us.0),
                    if has_steps {
                        "per step"
                    } else {
                        "in the trace"
                    },
                ),
                ranks: vec![s.rank],
                cost_per_step_us: Some(s.others_wait_per_step_us),
                cost_share: Some(s.others_wait_share),
                per_step: has_steps,
                evidence: merged.waits.iter().map(evidence_of).collect(),
                examples,
                fix: STRAGGLER_RANK.fix,
            });
        }
    }
    // Every rank's wait joins the straggler and exposed-communication evidence.
    for f in findings.iter_mut() {
        if f.rule == STRAGGLER_RANK.id && straggler_found {
            f.evidence.extend(
                merged
                    .waits
                    .iter()
                    .filter(|w| w.wait_us.0 > 0.0)
                    .map(evidence_of),
            );
        }
        if f.rule != EXPOSED_COMMUNICATION.id {
            continue;
        }
        let rank = f.ranks[0];
        let cycle = f.examples.first().map_or(0, |e| e.cycle);
        let Some(w) = merged
            .waits
            .iter()
            .find(|w| w.rank == rank && w.cycle == cycle && w.wait_us.0 > 0.0)
        else {
            continue;
        };
        f.summary.push_str(&format!(
            "; inside them this rank waits {} {} for {} to arrive",
            fmt_us(w.wait_per_step_us.0),
            if f.per_step {
                "per step"
            } else {
                "in the trace"
            },
            w.waited_for
                .map_or("the other ranks".into(), |r| format!("rank {r}"))
        ));
        if let Some(share) = w.wait_share.get() {
            f.summary
                .push_str(&format!(" ({} of the step)", pct(share, 1.0)));
        }
        f.evidence.push(evidence_of(w));
    }
}
