//! `kinetrace doctor`: what is wrong in a trace, what it costs per step, and what to do about it.
//!
//! Each rule ([`RULES`]) looks at one rank and either reports a [`Finding`] or stays silent; the
//! straggler rule compares ranks. A rule fires only past a threshold on the cost it measures (the
//! thresholds and why are in `docs/doctor.md` and on each rule's function), because a doctor that
//! cries wolf is worse than none. Findings of the same rule on several ranks become one finding
//! that names the ranks and shows the worst one.
//!
//! As in [`crate::analyze`], a rank is reduced to its findings as soon as it is read: workers read
//! one file each, run the rules and keep only the findings and the step rows the cross-rank rule
//! needs.

pub(crate) mod context;
mod rules;
mod rules_efficiency;
mod rules_host;
mod rules_ops;

use std::collections::BTreeMap;
use std::path::PathBuf;

use kinetrace_export::reader::ReadOptions;
use serde::Serialize;

use crate::collectives::Instance;
use crate::efficiency::{rank_device_work, PeakOverride};
use crate::hta::Symbols;
use crate::load::{
    map_sources, place, read_rank, FileProblem, Progress, RankSource, TraceKey, TraceSource,
};
use crate::steps::{steps, Basis, StepRow};
use crate::units::{Num, Us};

use context::Ctx;

/// Version of the `--json` layout; bumped when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// How serious a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Costs time in every step; worth fixing.
    Warning,
    /// Worth knowing when reading the trace (its numbers may mislead), not a fault in itself.
    Info,
}

impl Severity {
    /// `warning` / `info`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One rule of the catalog.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Rule {
    /// Stable id (`sync-in-step`), used in the JSON and in the docs.
    pub id: &'static str,
    /// The fault, in a few words.
    pub title: &'static str,
    /// Severity of its findings.
    pub severity: Severity,
    /// The direction of the fix.
    pub fix: &'static str,
}

/// The catalog, in no particular order (findings are sorted by cost).
pub const RULES: &[Rule] = &[
    rules::SYNC_IN_STEP,
    rules::INPUT_BOUND,
    rules::SMALL_OP_STORM,
    rules::EXPOSED_COMMUNICATION,
    STRAGGLER_RANK,
    rules_ops::DTYPE_CASTS,
    rules_ops::FP32_GEMM,
    rules_ops::PER_PARAMETER_OPTIMIZER,
    rules_ops::RECOMPUTE_IN_BACKWARD,
    rules_host::ALLOCATOR_CHURN,
    rules_host::MEMORY_PRESSURE,
    rules_host::HOST_STALL,
    rules_host::WARMUP_IN_WINDOW,
    rules_host::CUDA_GRAPHS,
    rules_host::COMPILED_REGIONS,
    rules_host::TRACE_DROPS,
    rules_efficiency::GEMM_BELOW_ROOFLINE,
];

/// One line of evidence: something counted on one rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    /// Rank.
    pub rank: i64,
    /// What was counted (an op, a kernel, a call, `op → call`).
    pub what: String,
    /// How many.
    pub count: u64,
    /// How many per step (per trace when it has no steps).
    pub count_per_step: f64,
    /// The time this line stands for (what the rule measures: GPU idle, exposed time, ...).
    pub time_us: Us,
    /// `time_us` per step.
    pub time_per_step_us: Us,
}

/// A place in the trace to look at.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Example {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle (its trace), 0-based in time order.
    pub cycle: u32,
    /// The event's name (or what the span is).
    pub name: String,
    /// ms since the rank's first event: where Perfetto's timeline shows it.
    pub at_ms: f64,
    /// `ts` as written in the file (µs), to search for in the JSON.
    pub ts_us: f64,
    /// Duration.
    pub dur_us: Us,
}

/// What one rule found.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The rule's id.
    pub rule: &'static str,
    /// The fault.
    pub title: &'static str,
    /// Severity.
    pub severity: Severity,
    /// One sentence with the key numbers (of the worst rank).
    pub summary: String,
    /// Ranks it was found on.
    pub ranks: Vec<i64>,
    /// Estimated time lost per step on the worst rank (per trace when it has no steps); `null`
    /// for findings without a time cost.
    pub cost_per_step_us: Option<Us>,
    /// That cost as a share of the worst rank's mean step time (0..1).
    pub cost_share: Option<Num>,
    /// Whether the ranks have `ProfilerStep`s (otherwise "per step" means "per trace").
    pub per_step: bool,
    /// What was counted, worst rank first, largest first.
    pub evidence: Vec<Evidence>,
    /// Two or three places to look at, on the worst rank.
    pub examples: Vec<Example>,
    /// The direction of the fix.
    pub fix: &'static str,
}

/// One trace file that was read.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorRank {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// How many cycles of the rank were read.
    pub cycles: u32,
    /// The file.
    pub file: PathBuf,
    /// Where the rank came from.
    pub rank_source: RankSource,
    /// Events in `traceEvents`.
    pub events: u64,
    /// `ProfilerStep`s in it.
    pub steps: usize,
    /// Their mean duration (`null` without steps).
    pub mean_step_us: Option<Us>,
    /// Kernels, memcpys and memsets in it.
    pub gpu_events: usize,
}

/// Everything `kinetrace doctor` reports.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorReport {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The files read, in input order (duplicates of a rank are problems instead).
    pub ranks: Vec<DoctorRank>,
    /// Inputs that could not be read.
    pub problems: Vec<FileProblem>,
    /// Findings, most costly first (then warnings without a cost, then infos).
    pub findings: Vec<Finding>,
}

impl DoctorReport {
    /// Whether at least one file was read.
    pub fn read_any(&self) -> bool {
        !self.ranks.is_empty()
    }
}

/// Options of a doctor run.
#[derive(Clone, Debug, Default)]
pub struct DoctorOptions {
    /// Worker threads (0: one per CPU).
    pub jobs: usize,
    /// The trace reader's limits.
    pub read: ReadOptions,
    /// Device peaks replacing the peaks table's (for the roofline rule).
    pub peaks: PeakOverride,
}

struct RankResult {
    key: TraceKey,
    info: DoctorRank,
    findings: Vec<Finding>,
    steps: RankSteps,
    /// Collective kernels, for matching across ranks.
    comms: Vec<Instance>,
}

/// A rank's steps, with what turns their `start_ms` back into trace times.
struct RankSteps {
    rows: Vec<StepRow>,
    /// The rank's first event (ns since the epoch): `start_ms` counts from it.
    origin_ns: i64,
    /// `baseTimeNanoseconds`, if the file's `ts` are relative to it.
    base_ns: Option<i64>,
}

impl RankSteps {
    fn example(&self, s: &StepRow) -> Example {
        let ts_ns = self.origin_ns as f64 + s.start_ms * 1e6 - self.base_ns.unwrap_or(0) as f64;
        Example {
            rank: s.rank,
            cycle: s.cycle,
            name: format!("ProfilerStep#{}", s.step),
            at_ms: s.start_ms,
            ts_us: ts_ns.round() / 1000.0,
            dur_us: s.step_time_us,
        }
    }
}

/// Runs every rule on `files` (one rank each). `problems` from [`crate::discover`] are carried
/// into the report; `progress` is called after each file.
pub fn doctor(
    files: &[PathBuf],
    problems: Vec<FileProblem>,
    opts: &DoctorOptions,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> DoctorReport {
    let sources: Vec<TraceSource> = files.iter().cloned().map(TraceSource::File).collect();
    doctor_sources(&sources, problems, opts, progress)
}

/// [`doctor`] over files or in-memory traces.
pub fn doctor_sources(
    sources: &[TraceSource],
    mut problems: Vec<FileProblem>,
    opts: &DoctorOptions,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> DoctorReport {
    let results = map_sources(sources, opts.jobs, progress, &|s| examine(s, opts));
    let read: Vec<RankResult> = results
        .into_iter()
        .filter_map(|r| r.map_err(|p| problems.push(p)).ok())
        .collect();
    let placed = place(&read.iter().map(|r| &r.key).collect::<Vec<_>>());
    let mut ranks = Vec::new();
    let mut findings = Vec::new();
    let mut all_steps: Vec<RankSteps> = Vec::new();
    let mut comms = Vec::new();
    for (mut r, p) in read.into_iter().zip(placed) {
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        r.info.cycle = p.cycle;
        r.info.cycles = p.cycles;
        for s in &mut r.steps.rows {
            s.cycle = p.cycle;
        }
        for f in &mut r.findings {
            for e in &mut f.examples {
                e.cycle = p.cycle;
            }
        }
        all_steps.push(r.steps);
        comms.push((r.info.rank, p.cycle, r.comms));
        ranks.push(r.info);
        findings.extend(r.findings);
    }
    findings.extend(straggler_rank(&all_steps));
    rules_efficiency::collective_waits(&mut findings, comms, &all_steps);
    problems.sort_by(|a, b| a.file.cmp(&b.file));
    DoctorReport {
        schema_version: SCHEMA_VERSION,
        ranks,
        problems,
        findings: merge(findings),
    }
}

/// Reads one file and runs the per-rank rules on it.
fn examine(source: &TraceSource, opts: &DoctorOptions) -> Result<RankResult, FileProblem> {
    let (rows, rank, rank_source) = read_rank(source, &opts.read)?;
    let ctx = Ctx::new(&rows, rank);
    let mut findings = run_rules(&ctx);
    let (efficiency, comms) = rank_device_work(&rows, &opts.peaks);
    findings.extend(rules_efficiency::gemm_below_roofline(&ctx, &efficiency));
    let sym = Symbols::new(&rows);
    let step_rows = steps(rank, &rows, &sym, ctx.origin);
    let gpu_events = (0..ctx.len()).filter(|&i| ctx.kind(i).is_gpu()).count();
    Ok(RankResult {
        key: TraceKey::new(source.path(), &rows, rank, rank_source),
        info: DoctorRank {
            rank,
            cycle: 0,
            cycles: 1,
            file: source.path().to_owned(),
            rank_source,
            events: rows.events,
            steps: if ctx.has_steps { ctx.windows.len() } else { 0 },
            mean_step_us: ctx
                .has_steps
                .then(|| Us(ctx.mean_window_ns().round() / 1000.0)),
            gpu_events,
        },
        findings,
        steps: RankSteps {
            rows: step_rows,
            origin_ns: ctx.origin,
            base_ns: rows.base_ns,
        },
        comms,
    })
}

/// Every per-rank rule on one rank.
fn run_rules(ctx: &Ctx<'_>) -> Vec<Finding> {
    [
        rules::sync_in_step(ctx),
        rules::input_bound(ctx),
        rules::small_op_storm(ctx),
        rules::exposed_communication(ctx),
        rules_ops::dtype_casts(ctx),
        rules_ops::fp32_gemm(ctx),
        rules_ops::per_parameter_optimizer(ctx),
        rules_ops::recompute_in_backward(ctx),
        rules_host::allocator_churn(ctx),
        rules_host::memory_pressure(ctx),
        rules_host::host_stall(ctx),
        rules_host::warmup_in_window(ctx),
        rules_host::cuda_graphs(ctx),
        rules_host::compiled_regions(ctx),
        rules_host::trace_drops(ctx),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Builds a finding of `rule` on `ctx`'s rank. `cost_ns` is the total over the rank's windows;
/// `None` for findings without a time cost.
fn finding(
    rule: &Rule,
    ctx: &Ctx<'_>,
    cost_ns: Option<f64>,
    summary: String,
    mut evidence: Vec<Evidence>,
    examples: Vec<Example>,
) -> Finding {
    let windows = ctx.windows.len().max(1) as f64;
    let per_step = cost_ns.map(|c| c / windows);
    evidence.sort_by(|a, b| {
        b.time_us
            .0
            .total_cmp(&a.time_us.0)
            .then(b.count.cmp(&a.count))
            .then(a.what.cmp(&b.what))
    });
    evidence.truncate(MAX_EVIDENCE_PER_RANK);
    Finding {
        rule: rule.id,
        title: rule.title,
        severity: rule.severity,
        summary,
        ranks: vec![ctx.rank],
        cost_per_step_us: per_step.map(|c| Us(c.round() / 1000.0)),
        cost_share: per_step.map(|c| Num::ratio(c, ctx.mean_window_ns())),
        per_step: ctx.has_steps,
        evidence,
        examples,
        fix: rule.fix,
    }
}

/// Evidence lines kept per rank and finding.
const MAX_EVIDENCE_PER_RANK: usize = 8;
/// Examples kept per finding.
const MAX_EXAMPLES: usize = 3;

/// An evidence line on `ctx`'s rank: `count` things standing for `time_ns` in all.
fn evidence(ctx: &Ctx<'_>, what: impl Into<String>, count: u64, time_ns: i64) -> Evidence {
    let windows = ctx.windows.len().max(1) as f64;
    Evidence {
        rank: ctx.rank,
        what: what.into(),
        count,
        count_per_step: count as f64 / windows,
        time_us: Us::from_ns(time_ns),
        time_per_step_us: Us((time_ns as f64 / windows).round() / 1000.0),
    }
}

/// The same rule on several ranks becomes one finding: the worst rank's numbers, every rank named.
fn merge(findings: Vec<Finding>) -> Vec<Finding> {
    let mut by_rule: BTreeMap<&'static str, Vec<Finding>> = BTreeMap::new();
    for f in findings {
        by_rule.entry(f.rule).or_default().push(f);
    }
    let cost = |f: &Finding| f.cost_per_step_us.map_or(-1.0, |c| c.0);
    let mut out: Vec<Finding> = by_rule
        .into_values()
        .map(|mut group| {
            group.sort_by(|a, b| cost(b).total_cmp(&cost(a)).then(a.ranks.cmp(&b.ranks)));
            let mut ranks: Vec<i64> = group.iter().flat_map(|f| f.ranks.clone()).collect();
            ranks.sort_unstable();
            ranks.dedup();
            let mut rest = group.into_iter();
            let mut worst = rest.next().expect("groups are never empty");
            for f in rest {
                worst.evidence.extend(f.evidence);
            }
            worst.evidence.truncate(MAX_EVIDENCE_PER_RANK * 2);
            worst.examples.truncate(MAX_EXAMPLES);
            worst.ranks = ranks;
            worst
        })
        .collect();
    out.sort_by(|a, b| {
        a.severity
            .cmp(&b.severity)
            .then(cost(b).total_cmp(&cost(a)))
            .then(a.rule.cmp(b.rule))
    });
    out
}

/// **Straggler rank**: in the steps every rank ran, one rank computes longer while the others wait
/// for it inside their collectives.
pub const STRAGGLER_RANK: Rule = Rule {
    id: "straggler-rank",
    title: "Straggler rank: one rank computes longer, the others wait in collectives",
    severity: Severity::Warning,
    fix: "Find what is different on that rank: more data per batch (uneven sequence lengths or \
          shards; balance or bucket them), rank-only work inside the step (logging, metrics, \
          checkpointing on rank 0: move it out of the step or make it async), a slower or \
          throttled GPU, or CPU contention (pin workers with proper affinity).",
};

/// Fires when two or more ranks share at least two steps, one rank is the slowest in compute in
/// at least 60% of them, and its mean extra compute over the others' median is at least 5% of the
/// step and 100 µs. The cost is that extra compute per step: the time every other rank waits.
fn straggler_rank(all: &[RankSteps]) -> Option<Finding> {
    // rank -> step -> compute/comm; a rank seen in two files with the same step is ambiguous.
    let mut by_rank: BTreeMap<i64, BTreeMap<i64, (&StepRow, &RankSteps)>> = BTreeMap::new();
    for r in all {
        for s in r.rows.iter().filter(|s| !s.partial) {
            by_rank.entry(s.rank).or_default().insert(s.step, (s, r));
        }
    }
    if by_rank.len() < 2 {
        return None;
    }
    let first = by_rank.values().next()?;
    let shared: Vec<i64> = first
        .keys()
        .copied()
        .filter(|n| by_rank.values().all(|m| m.contains_key(n)))
        .collect();
    if shared.len() < 2 {
        return None;
    }
    // GPU kernels if any rank has some in these steps, else CPU time outside collectives (see
    // `crate::steps`); no straggler from zeros.
    let rows = || {
        shared
            .iter()
            .flat_map(|n| by_rank.values().map(move |m| m[n].0))
    };
    let basis = if rows().any(|s| s.kernels > 0) {
        Basis::Gpu
    } else {
        Basis::Cpu
    };
    let no_basis = match basis {
        Basis::Gpu => rows().all(|s| s.compute_us.0 == 0.0),
        Basis::Cpu => rows().all(|s| s.collective_us.0 == 0.0),
    };
    if no_basis {
        return None;
    }
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        crate::stats::quantile_sorted(&v, 0.5).unwrap_or(0.0)
    };
    let mut wins: BTreeMap<i64, usize> = BTreeMap::new();
    for n in &shared {
        let slowest = by_rank.iter().max_by(|a, b| {
            a.1[n]
                .0
                .compute_on(basis)
                .total_cmp(&b.1[n].0.compute_on(basis))
        })?;
        *wins.entry(*slowest.0).or_default() += 1;
    }
    let (&rank, &won) = wins.iter().max_by_key(|(r, w)| (**w, -**r))?;
    if (won as f64) < 0.6 * shared.len() as f64 {
        return None;
    }
    let mut extra = 0.0;
    let mut step_time = 0.0;
    let mut others_comm = 0.0;
    let mut per_step: Vec<(f64, Example)> = Vec::new();
    for n in &shared {
        let (mine, steps) = by_rank[&rank][n];
        let others: Vec<&StepRow> = by_rank
            .iter()
            .filter(|(r, _)| **r != rank)
            .map(|(_, m)| m[n].0)
            .collect();
        let e =
            mine.compute_on(basis) - median(others.iter().map(|s| s.compute_on(basis)).collect());
        extra += e;
        step_time += mine.step_time_us.0;
        others_comm += median(others.iter().map(|s| s.wait_on(basis)).collect());
        per_step.push((e, steps.example(mine)));
    }
    // The steps where it was furthest behind.
    per_step.sort_by(|a, b| b.0.total_cmp(&a.0));
    let examples: Vec<Example> = per_step
        .into_iter()
        .take(MAX_EXAMPLES)
        .map(|(_, e)| e)
        .collect();
    let k = shared.len() as f64;
    let (extra, step_time, others_comm) = (extra / k, step_time / k, others_comm / k);
    if extra < 100.0 || extra < 0.05 * step_time {
        return None;
    }
    let evidence = by_rank
        .iter()
        .map(|(&r, m)| {
            let compute: f64 = shared.iter().map(|n| m[n].0.compute_on(basis)).sum();
            let comm: f64 = shared.iter().map(|n| m[n].0.wait_on(basis)).sum();
            Evidence {
                rank: r,
                what: match basis {
                    Basis::Gpu => format!(
                        "compute per step (communication {} per step)",
                        crate::units::fmt_us(comm / k)
                    ),
                    Basis::Cpu => format!(
                        "CPU time outside collectives per step (in collectives {} per step)",
                        crate::units::fmt_us(comm / k)
                    ),
                },
                count: shared.len() as u64,
                count_per_step: 1.0,
                time_us: Us(compute),
                time_per_step_us: Us((compute / k * 1000.0).round() / 1000.0),
            }
        })
        .collect();
    Some(Finding {
        rule: STRAGGLER_RANK.id,
        title: STRAGGLER_RANK.title,
        severity: STRAGGLER_RANK.severity,
        summary: match basis {
            Basis::Gpu => format!(
                "rank {rank} had the most compute in {won} of {} shared steps, {} per step more \
                 than the median rank; the other ranks spent a median {} per step in \
                 communication",
                shared.len(),
                crate::units::fmt_us(extra),
                crate::units::fmt_us(others_comm)
            ),
            Basis::Cpu => {
                let wait_in = shared
                    .iter()
                    .flat_map(|n| {
                        by_rank
                            .iter()
                            .filter(|(r, _)| **r != rank)
                            .map(move |(_, m)| m[n].0)
                    })
                    .filter_map(|s| s.collective.as_deref())
                    .fold(BTreeMap::<&str, usize>::new(), |mut m, c| {
                        *m.entry(c).or_default() += 1;
                        m
                    })
                    .into_iter()
                    .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
                    .map_or_else(|| "collectives".to_string(), |(c, _)| c.to_string());
                format!(
                    "rank {rank} is slow: in {won} of {} shared steps it had the most CPU time \
                     outside collectives, {} per step more than the median rank; the other ranks \
                     wait a median {} per step in {wait_in} for it",
                    shared.len(),
                    crate::units::fmt_us(extra),
                    crate::units::fmt_us(others_comm)
                )
            }
        },
        ranks: vec![rank],
        cost_per_step_us: Some(Us(extra.round())),
        cost_share: Some(Num::ratio(extra, step_time)),
        per_step: true,
        evidence,
        examples,
        fix: STRAGGLER_RANK.fix,
    })
}

#[cfg(test)]
mod tests;
