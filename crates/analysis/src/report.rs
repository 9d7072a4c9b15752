//! Combining per-rank summaries into one report.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Serialize;

use crate::collectives::Collectives;
use crate::efficiency::Efficiency;
use crate::hta::{IdleRow, KernelRow, Overlap, Temporal};
use crate::load::{place, FileProblem, Placement, RankSource, RankSummary, TraceKey};
use crate::memory::{MemoryDevice, PhaseSpan};
use crate::ops::{OpKind, OpStat};
use crate::steps::{straggler, StepRow, Straggler, StragglerVerdict};
use crate::units::{Num, Us};

/// One analysed rank.
#[derive(Clone, Debug, Serialize)]
pub struct RankInfo {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// How many cycles of the rank were analysed.
    pub cycles: u32,
    /// Its file.
    pub file: PathBuf,
    /// Where the rank number came from.
    pub rank_source: RankSource,
    /// Events in `traceEvents`.
    pub events: u64,
    /// Events HTA keeps as rows (with `dur` and `cat`).
    pub rows: usize,
    /// Rows on a GPU stream (`stream != -1`) after HTA's step filter.
    pub gpu_rows: usize,
    /// Whether the file has float timestamps, which HTA rounds inward to whole µs.
    pub rounded_timestamps: bool,
}

/// Time of one kernel type (or overlap of types) over all ranks, HTA's first kernel-breakdown frame.
#[derive(Clone, Debug, Serialize)]
pub struct KernelTypeShare {
    /// `COMPUTATION`, `COMMUNICATION overlapping MEMORY`, ...
    pub kernel_type: String,
    /// Whole µs, summed over ranks.
    pub sum_us: i64,
    /// Share of all kernel time (HTA prints it rounded to 1 decimal).
    pub percentage: Num,
}

/// The same, for one rank.
#[derive(Clone, Debug, Serialize)]
pub struct RankKernelTypeTime {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle.
    pub cycle: u32,
    /// Kernel type or overlap.
    pub kernel_type: String,
    /// Whole µs.
    pub sum_us: i64,
}

/// Everything `kinetrace analyze` computes.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The traces analysed, by rank and cycle.
    pub ranks: Vec<RankInfo>,
    /// Inputs that could not be analysed (one entry per file).
    pub problems: Vec<FileProblem>,
    /// Things the reader of the numbers should know (missing GPU rows, filters applied).
    pub notes: Vec<String>,
    /// Whether HTA's step filter applied (at least two `ProfilerStep` names over all ranks).
    pub step_filter_applied: bool,
    /// HTA temporal breakdown, one row per rank with GPU rows.
    pub temporal_breakdown: Vec<Temporal>,
    /// HTA comm/comp overlap, one row per rank (`null` percentage without communication).
    pub comm_comp_overlap: Vec<Overlap>,
    /// HTA idle-time breakdown, per rank, stream and category, with interval statistics.
    pub idle_time_breakdown: Vec<IdleRow>,
    /// HTA kernel-type breakdown over all ranks, largest first.
    pub kernel_type_breakdown: Vec<KernelTypeShare>,
    /// The kernel-type breakdown per rank.
    pub kernel_type_breakdown_per_rank: Vec<RankKernelTypeTime>,
    /// HTA kernel breakdown: top kernels per type and rank, sorted by type, name, rank.
    pub kernel_breakdown: Vec<KernelRow>,
    /// Op table over all ranks, by self CPU time.
    pub ops: Vec<OpStat>,
    /// Steps per rank.
    pub steps: Vec<StepRow>,
    /// The straggler rank, with two or more ranks sharing steps.
    pub straggler: Option<Straggler>,
    /// Why there is no straggler, when there is none.
    pub no_straggler: Option<StragglerVerdict>,
    /// Memory per rank and device.
    pub memory: Vec<MemoryDevice>,
    /// Forward / backward / optimizer phases of each step, for ranks with memory samples.
    pub phases: Vec<PhaseSpan>,
    /// FLOPs, bytes and roofline per op group, and GPU time by category.
    pub efficiency: Efficiency,
    /// Collectives by kind, group, dtype and size; each rank's wait for the others.
    pub collectives: Collectives,
}

impl Report {
    /// Whether at least one rank was analysed.
    pub fn analysed_any(&self) -> bool {
        !self.ranks.is_empty()
    }

    /// Whether some rank has more than one cycle (tables then show the cycle).
    pub fn has_cycles(&self) -> bool {
        self.ranks.iter().any(|r| r.cycles > 1)
    }
}

/// Builds the report. `results` are in input order; the traces are placed as ranks × cycles
/// ([`place`]), duplicates reported.
pub(crate) fn build(
    results: Vec<Result<RankSummary, FileProblem>>,
    mut problems: Vec<FileProblem>,
) -> Report {
    let read: Vec<RankSummary> = results
        .into_iter()
        .filter_map(|r| r.map_err(|p| problems.push(p)).ok())
        .collect();
    let keys: Vec<&TraceKey> = read.iter().map(|s| &s.key).collect();
    let placed = place(&keys);
    let mut by_rank: BTreeMap<(i64, u32), (RankSummary, Placement)> = BTreeMap::new();
    for (s, p) in read.into_iter().zip(placed) {
        match p {
            Ok(p) => {
                by_rank.insert((p.rank, p.cycle), (s, p));
            }
            Err(e) => problems.push(e),
        }
    }
    let mut symbols: Vec<&str> = by_rank
        .values()
        .flat_map(|(s, _)| s.step_symbols.iter().map(String::as_str))
        .collect();
    symbols.sort_unstable();
    symbols.dedup();
    let step_filter_applied = symbols.len() >= 2;

    let mut notes = Vec::new();
    if !by_rank.is_empty() && !step_filter_applied {
        notes.push(format!(
            "fewer than two ProfilerStep annotations in the traces ({} found): as in HTA, the \
             last step is not dropped and every kernel counts",
            symbols.len()
        ));
    }
    let mut report = Report {
        ranks: Vec::new(),
        problems: Vec::new(),
        notes: Vec::new(),
        step_filter_applied,
        temporal_breakdown: Vec::new(),
        comm_comp_overlap: Vec::new(),
        idle_time_breakdown: Vec::new(),
        kernel_type_breakdown: Vec::new(),
        kernel_type_breakdown_per_rank: Vec::new(),
        kernel_breakdown: Vec::new(),
        ops: Vec::new(),
        steps: Vec::new(),
        straggler: None,
        no_straggler: None,
        memory: Vec::new(),
        phases: Vec::new(),
        efficiency: Efficiency::default(),
        collectives: Collectives::default(),
    };
    let mut efficiency = Vec::new();
    let mut collectives = Vec::new();
    let mut type_totals: HashMap<String, i64> = HashMap::new();
    let mut ops: HashMap<(OpKind, String, Option<String>), OpStat> = HashMap::new();
    for ((rank, cycle), (s, placed)) in by_rank {
        if placed.cycles > 1 && cycle == 0 {
            notes.push(format!(
                "rank {rank}: {} traces of one process, taken as its cycles 0–{} in time order \
                 (per-rank tables show the cycle; steps and ops count every cycle)",
                placed.cycles,
                placed.cycles - 1
            ));
        }
        let hta = if step_filter_applied {
            s.filtered
        } else {
            s.unfiltered.unwrap_or(s.filtered)
        };
        let has_any_gpu = s.rows > 0 && hta.gpu_rows > 0;
        if !has_any_gpu {
            let why = if s.stream_rows > 0 && step_filter_applied {
                "no GPU rows left after HTA's step filter (it keeps only GPU rows whose \
                 launching call has the same `correlation` and started before the last \
                 ProfilerStep; this rank has no such rows, or no ProfilerStep at all)"
            } else {
                "no GPU rows (events with `args.stream` and `args.correlation`): a CPU-only \
                 trace; the temporal, idle and kernel breakdowns need GPU kernels"
            };
            notes.push(format!("rank {rank} ({}): {why}", s.file.display()));
            report.comm_comp_overlap.push(Overlap {
                rank,
                cycle,
                comp_comm_overlap_pctg: Num(f64::NAN),
            });
        }
        report.ranks.push(RankInfo {
            rank,
            cycle,
            cycles: placed.cycles,
            file: s.file.clone(),
            rank_source: s.rank_source,
            events: s.events,
            rows: s.rows,
            gpu_rows: hta.gpu_rows,
            rounded_timestamps: s.rounded,
        });
        if s.rank_source == RankSource::Default {
            notes.push(format!(
                "{}: no rank in the file (`distributedInfo.rank`): taken as rank 0, as HTA does",
                s.file.display()
            ));
        }
        report
            .temporal_breakdown
            .extend(hta.temporal.map(|t| Temporal { cycle, ..t }));
        report
            .comm_comp_overlap
            .extend(hta.overlap.map(|o| Overlap { cycle, ..o }));
        report
            .idle_time_breakdown
            .extend(hta.idle.into_iter().map(|i| IdleRow { cycle, ..i }));
        for t in hta.kernel_types {
            *type_totals.entry(t.kernel_type.clone()).or_default() += t.sum_us;
            report
                .kernel_type_breakdown_per_rank
                .push(RankKernelTypeTime {
                    rank,
                    cycle,
                    kernel_type: t.kernel_type,
                    sum_us: t.sum_us,
                });
        }
        report
            .kernel_breakdown
            .extend(hta.kernels.into_iter().map(|k| KernelRow { cycle, ..k }));
        for op in s.ops {
            let e = ops
                .entry((op.kind, op.name.clone(), op.shape.clone()))
                .or_insert_with(|| OpStat {
                    count: 0,
                    cpu_total_us: Us(0.0),
                    cpu_self_us: Us(0.0),
                    gpu_self_us: Us(0.0),
                    gpu_total_us: Us(0.0),
                    cpu_mem_self_bytes: 0,
                    cpu_mem_bytes: 0,
                    gpu_mem_self_bytes: 0,
                    gpu_mem_bytes: 0,
                    ..op.clone()
                });
            e.count += op.count;
            e.cpu_total_us.0 += op.cpu_total_us.0;
            e.cpu_self_us.0 += op.cpu_self_us.0;
            e.gpu_self_us.0 += op.gpu_self_us.0;
            e.gpu_total_us.0 += op.gpu_total_us.0;
            e.cpu_mem_self_bytes += op.cpu_mem_self_bytes;
            e.cpu_mem_bytes += op.cpu_mem_bytes;
            e.gpu_mem_self_bytes += op.gpu_mem_self_bytes;
            e.gpu_mem_bytes += op.gpu_mem_bytes;
        }
        report
            .steps
            .extend(s.steps.into_iter().map(|x| StepRow { cycle, ..x }));
        report
            .memory
            .extend(s.memory.into_iter().map(|m| MemoryDevice { cycle, ..m }));
        report
            .phases
            .extend(s.phases.into_iter().map(|p| PhaseSpan { cycle, ..p }));
        efficiency.extend(s.efficiency.map(|e| (rank, cycle, e)));
        collectives.push((rank, cycle, s.collectives));
    }
    report.efficiency = crate::efficiency::merge(efficiency);
    report.collectives = crate::collectives::merge(collectives, &report.steps);
    let total: i64 = type_totals.values().sum();
    let mut shares: Vec<KernelTypeShare> = type_totals
        .into_iter()
        .map(|(kernel_type, sum_us)| KernelTypeShare {
            percentage: Num(100.0 * Num::ratio(sum_us as f64, total as f64).0),
            kernel_type,
            sum_us,
        })
        .collect();
    shares.sort_by(|a, b| {
        b.sum_us
            .cmp(&a.sum_us)
            .then(a.kernel_type.cmp(&b.kernel_type))
    });
    report.kernel_type_breakdown = shares;
    report.kernel_breakdown.sort_by(|a, b| {
        (a.kernel_type.as_str(), &a.name, a.rank, a.cycle).cmp(&(
            b.kernel_type.as_str(),
            &b.name,
            b.rank,
            b.cycle,
        ))
    });
    let mut ops: Vec<OpStat> = ops.into_values().collect();
    ops.sort_by(|a, b| {
        b.cpu_self_us
            .0
            .total_cmp(&a.cpu_self_us.0)
            .then_with(|| (a.kind, &a.name, &a.shape).cmp(&(b.kind, &b.name, &b.shape)))
    });
    crate::ops::fill_shares(&mut ops);
    report.ops = ops;
    match straggler(&report.steps) {
        Ok(s) => report.straggler = Some(s),
        Err(why) => report.no_straggler = Some(why),
    }
    report.comm_comp_overlap.sort_by_key(|o| (o.rank, o.cycle));
    problems.sort_by(|a, b| a.file.cmp(&b.file));
    report.problems = problems;
    report.notes = notes;
    report
}
