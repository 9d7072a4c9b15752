//! HolisticTraceAnalysis 0.5.0's four analyses for one rank: temporal breakdown, comm/comp
//! overlap, idle-time breakdown and kernel breakdown.
//!
//! # The rows HTA analyses
//!
//! After loading ([`crate::rows`]), HTA filters each rank (`Trace._filter_irrelevant_gpu_kernels`)
//! when the *global* symbol table (cat and name strings of every rank) holds at least two strings
//! containing `ProfilerStep`:
//!
//! - GPU rows are `stream >= 0 and correlation >= 0`, or named `Event Sync` / `Context Sync`;
//!   every other row is a CPU row;
//! - CPU rows are kept when they start before the last `…ProfilerStep…` CPU row of the rank (all
//!   of them with `include_last_profiler_step`; none when the rank has no step row);
//! - a GPU row is kept once for each kept CPU row with the same `correlation` (a pandas inner
//!   merge, so it can be repeated, or dropped when its runtime call was in the last step);
//! - the rows are then in this order: the kept GPU rows in file order, then the kept CPU rows.
//!
//! # Ties
//!
//! HTA sorts with pandas' default (`quicksort`), which numpy 2 runs as a SIMD sort that is not
//! stable, so rows with equal timestamps come out in an order that depends on the CPU. Here every
//! sort is stable (ties keep the order above). The results can differ only where the order of
//! equal timestamps matters: an HTA-rounded `dur` of −1 µs inside interval merging, two kernels
//! starting in the same µs on one stream, and kernels with equal total time at the "others" cut.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::fastmap::FastMap;
use crate::kernel::{kernel_type, KernelType};
use crate::rows::{Row, Rows};
use crate::stats::{quantile_sorted, std_sample, Describe};
use crate::units::{Num, Us};

/// Knobs of the HTA analyses (HTA's own defaults in [`HtaOptions::default`]).
#[derive(Clone, Debug)]
pub struct HtaOptions {
    /// Idle gaps shorter than this (µs) that are not host waits are "kernel wait"
    /// (HTA's `consecutive_kernel_delay`, default 30).
    pub kernel_wait_threshold_us: f64,
    /// Kernels per type and rank before the rest become `others` (HTA's `num_kernels`, 10).
    pub num_kernels: usize,
    /// Kernels past this quantile of cumulative time become `others` (`duration_ratio`, 0.8).
    pub duration_ratio: f64,
    /// Keep the last ProfilerStep (HTA's `include_last_profiler_step`, default false).
    pub include_last_step: bool,
}

impl Default for HtaOptions {
    fn default() -> Self {
        HtaOptions {
            kernel_wait_threshold_us: 30.0,
            num_kernels: 10,
            duration_ratio: 0.8,
            include_last_step: false,
        }
    }
}

/// Which rows of a rank HTA analyses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepFilter {
    /// Every row (fewer than two ProfilerStep strings in all ranks).
    All,
    /// CPU rows before the last step, and the GPU rows they launched.
    DropLastStep,
    /// All CPU rows (none if the rank has no step), and the GPU rows they launched.
    KeepLastStep,
}

/// Temporal breakdown of one rank (HTA `get_temporal_breakdown`).
#[derive(Clone, Debug, Serialize)]
pub struct Temporal {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// Time inside the GPU span with no kernel running.
    pub idle_time_us: Us,
    /// Time with a computation kernel running.
    pub compute_time_us: Us,
    /// The rest of the span: communication, memory and other kernels only.
    pub non_compute_time_us: Us,
    /// From the first kernel start to the last kernel end.
    pub kernel_time_us: Us,
    /// `100 · idle / kernel_time` (HTA prints it rounded to 2 decimals).
    pub idle_time_pctg: Num,
    /// `100 · compute / kernel_time`.
    pub compute_time_pctg: Num,
    /// `100 · non_compute / kernel_time`.
    pub non_compute_time_pctg: Num,
}

/// Communication/computation overlap of one rank (HTA `get_comm_comp_overlap`).
#[derive(Clone, Debug, Serialize)]
pub struct Overlap {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// Percentage of communication time during which a computation kernel also runs; `null` when
    /// the rank has no communication kernel.
    pub comp_comm_overlap_pctg: Num,
}

/// Idle-time category of HTA's idle breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleCategory {
    /// The kernel's runtime call started after the previous kernel on the stream ended.
    HostWait,
    /// A short gap (below the threshold) between back-to-back kernels.
    KernelWait,
    /// Any other gap (and the first kernel of a stream, which has no gap).
    Other,
}

impl IdleCategory {
    /// HTA's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleCategory::HostWait => "host_wait",
            IdleCategory::KernelWait => "kernel_wait",
            IdleCategory::Other => "other",
        }
    }
}

/// One row of HTA's idle-time breakdown.
#[derive(Clone, Debug, Serialize)]
pub struct IdleRow {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// Stream.
    pub stream: i64,
    /// Category.
    pub idle_category: IdleCategory,
    /// Sum of the gaps in this category.
    pub idle_time_us: Us,
    /// Share of the stream's idle time; `null` when the stream has none.
    pub idle_time_ratio: Num,
    /// Statistics of the gaps (µs), HTA's `show_idle_interval_stats`.
    pub interval_stats: Describe,
}

/// Time per kernel type, or combination of types running at once, on one rank.
#[derive(Clone, Debug, Serialize)]
pub struct KernelTypeTime {
    /// `COMPUTATION`, `COMMUNICATION`, `MEMORY` or `A overlapping B[ overlapping C]`.
    pub kernel_type: String,
    /// Whole µs (HTA truncates each segment to an integer).
    pub sum_us: i64,
}

/// One row of HTA's per-kernel table (`get_gpu_kernel_breakdown`'s second frame).
#[derive(Clone, Debug, Serialize)]
pub struct KernelRow {
    /// Kernel type.
    pub kernel_type: KernelType,
    /// Kernel name, or `others` for the aggregated tail.
    pub name: String,
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// Total duration.
    pub sum_us: Us,
    /// Longest duration. For `others` and for any kernel of a type that had more than
    /// `num_kernels` kernels, HTA's quirk applies: max/min/mean/stddev are over the kernels'
    /// *totals*, so a kept kernel shows its total in every column and stddev 0.
    pub max_us: Us,
    /// Shortest duration (see `max_us`).
    pub min_us: Us,
    /// Mean duration (see `max_us`).
    pub mean_us: Us,
    /// Sample standard deviation (0 for a single value, see `max_us`).
    pub stddev: f64,
    /// Number of launches (not in HTA's output).
    pub count: usize,
    /// True mean duration per launch (not in HTA's output; for `others`, over every launch of
    /// the grouped kernels). Equal to `mean_us` where HTA's quirk does not apply.
    pub launch_mean_us: Us,
    /// True shortest launch (not in HTA's output).
    pub launch_min_us: Us,
    /// True longest launch (not in HTA's output).
    pub launch_max_us: Us,
    /// True sample standard deviation of the launches, µs (0 for one launch; not in HTA's output).
    pub launch_stddev_us: Us,
}

/// HTA's four analyses on one rank.
#[derive(Clone, Debug)]
pub(crate) struct HtaRank {
    /// Rows with `stream != -1` HTA analyses.
    pub gpu_rows: usize,
    /// `None` when there is no GPU row (HTA raises).
    pub temporal: Option<Temporal>,
    /// `None` when there is no GPU row.
    pub overlap: Option<Overlap>,
    /// Empty when there is no kernel row (HTA raises).
    pub idle: Vec<IdleRow>,
    /// Per kernel type or overlap combination.
    pub kernel_types: Vec<KernelTypeTime>,
    /// Per kernel (top ones, then `others`).
    pub kernels: Vec<KernelRow>,
}

/// `cat` values HTA's idle breakdown accepts.
const KERNEL_CATS: [&str; 7] = [
    "kernel",
    "Kernel",
    "gpu_memset",
    "Memset",
    "gpu_memcpy",
    "Memcpy",
    "mtia_ccp_events",
];

/// Per-string facts, computed once per rank.
pub(crate) struct Symbols {
    /// Kernel type by name id.
    pub kernel_type: Vec<KernelType>,
    /// Whether the string is an idle-breakdown kernel cat.
    pub kernel_cat: Vec<bool>,
    /// Whether the string is `Event Sync` or `Context Sync`.
    pub sync_name: Vec<bool>,
    /// Whether the string contains `ProfilerStep`.
    pub step_name: Vec<bool>,
}

impl Symbols {
    pub fn new(rows: &Rows) -> Symbols {
        let s = &rows.strings;
        Symbols {
            kernel_type: s.iter().map(|t| kernel_type(t)).collect(),
            kernel_cat: s.iter().map(|t| KERNEL_CATS.contains(&&**t)).collect(),
            sync_name: s
                .iter()
                .map(|t| &**t == "Event Sync" || &**t == "Context Sync")
                .collect(),
            step_name: s.iter().map(|t| t.contains("ProfilerStep")).collect(),
        }
    }

    pub(crate) fn is_gpu_row(&self, r: &Row) -> bool {
        r.on_stream_with_corr() || self.sync_name[r.name as usize]
    }
}

/// The rows HTA keeps (indices into `rows.rows`, possibly repeated), in HTA's order.
pub(crate) fn hta_view(rows: &Rows, sym: &Symbols, filter: StepFilter) -> Vec<u32> {
    let all = &rows.rows;
    if filter == StepFilter::All {
        return (0..all.len() as u32).collect();
    }
    let is_cpu = |r: &Row| !sym.is_gpu_row(r);
    let step_starts = all
        .iter()
        .filter(|r| is_cpu(r) && sym.step_name[r.name as usize])
        .map(|r| r.hts);
    let keep_cpu: Box<dyn Fn(&Row) -> bool> = match filter {
        StepFilter::DropLastStep => match step_starts.max() {
            Some(last) => Box::new(move |r: &Row| r.hts < last),
            None => Box::new(|_| false),
        },
        _ => {
            let any = all
                .iter()
                .any(|r| is_cpu(r) && sym.step_name[r.name as usize]);
            Box::new(move |_| any)
        }
    };
    let mut kept_cpu = Vec::new();
    for (i, r) in all.iter().enumerate() {
        if is_cpu(r) && keep_cpu(r) {
            kept_cpu.push(i as u32);
        }
    }
    // Sized up front: growing it by rehashing cost more (copies, page faults) than the pass above.
    let mut cpu_by_corr: FastMap<i64, u32> =
        FastMap::with_capacity_and_hasher(kept_cpu.len(), Default::default());
    for &i in &kept_cpu {
        *cpu_by_corr.entry(all[i as usize].corr).or_default() += 1;
    }
    let mut view = Vec::new();
    for (i, r) in all.iter().enumerate() {
        if !is_cpu(r) {
            let times = cpu_by_corr.get(&r.corr).copied().unwrap_or(0);
            view.extend(std::iter::repeat_n(i as u32, times as usize));
        }
    }
    view.extend(kept_cpu);
    view
}

/// Merges intervals the way HTA's `merge_kernel_intervals` does: sorted by start, a row starts a
/// new group when it starts after the largest end seen so far; a group spans from its first start
/// to its largest end. (With HTA's −1 µs durations a group can be empty or inverted.)
fn merge(mut iv: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    iv.sort_by_key(|&(s, _)| s);
    let mut out: Vec<(i64, i64)> = Vec::new();
    let mut max_end: Option<i64> = None;
    for (s, e) in iv {
        match (max_end, out.last_mut()) {
            (Some(m), Some(last)) if s <= m => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
        max_end = Some(max_end.map_or(e, |m| m.max(e)));
    }
    out
}

fn run_time(merged: &[(i64, i64)]) -> i64 {
    merged.iter().map(|&(s, e)| e - s).sum()
}

/// A sweep over merged intervals of several kinds: `(time, delta)` events sorted by time (stable:
/// the order they were added breaks ties), and the running sum after each.
fn sweep(groups: &[(&[(i64, i64)], i64)]) -> Vec<(i64, i64)> {
    let mut events = Vec::new();
    for &(merged, value) in groups {
        events.extend(merged.iter().map(|&(s, _)| (s, value)));
        events.extend(merged.iter().map(|&(_, e)| (e, -value)));
    }
    events.sort_by_key(|&(t, _)| t);
    let mut running = 0;
    events
        .into_iter()
        .map(|(t, d)| {
            running += d;
            (t, running)
        })
        .collect()
}

/// Runs the four analyses on the rows of `view`.
pub(crate) fn analyze_rank(
    rank: i64,
    rows: &Rows,
    sym: &Symbols,
    view: &[u32],
    opts: &HtaOptions,
) -> HtaRank {
    let all = &rows.rows;
    let gpu: Vec<&Row> = view
        .iter()
        .map(|&i| &all[i as usize])
        .filter(|r| r.stream != -1)
        .collect();
    let ktype = |r: &Row| sym.kernel_type[r.name as usize];
    let intervals = |t: Option<KernelType>| -> Vec<(i64, i64)> {
        gpu.iter()
            .filter(|r| t.is_none_or(|t| ktype(r) == t))
            .map(|r| (r.hts, r.hend()))
            .collect()
    };

    let mut out = HtaRank {
        gpu_rows: gpu.len(),
        temporal: None,
        overlap: None,
        idle: Vec::new(),
        kernel_types: Vec::new(),
        kernels: Vec::new(),
    };
    if gpu.is_empty() {
        return out;
    }

    // Temporal breakdown.
    let merged_all = merge(intervals(None));
    let kernel_time = merged_all.last().map_or(0, |l| l.1) - merged_all[0].0;
    let idle = kernel_time - run_time(&merged_all);
    let comp = merge(intervals(Some(KernelType::Computation)));
    let compute = run_time(&comp);
    let non_compute = kernel_time - compute - idle;
    let pct = |v: i64| Num(100.0 * Num::ratio(v as f64, kernel_time as f64).0);
    out.temporal = Some(Temporal {
        rank,
        cycle: 0,
        idle_time_us: Us::from_ns(idle),
        compute_time_us: Us::from_ns(compute),
        non_compute_time_us: Us::from_ns(non_compute),
        kernel_time_us: Us::from_ns(kernel_time),
        idle_time_pctg: pct(idle),
        compute_time_pctg: pct(compute),
        non_compute_time_pctg: pct(non_compute),
    });

    // Comm/comp overlap: the time the running status (comm = 1, comp = 2) is 3.
    let comm = merge(intervals(Some(KernelType::Communication)));
    let status = sweep(&[(&comm, 1), (&comp, 2)]);
    let overlap: i64 = status
        .windows(2)
        .filter(|w| w[0].1 == 3)
        .map(|w| w[1].0 - w[0].0)
        .sum();
    out.overlap = Some(Overlap {
        rank,
        cycle: 0,
        comp_comm_overlap_pctg: Num(100.0 * Num::ratio(overlap as f64, run_time(&comm) as f64).0),
    });

    // Kernel-type time, with overlaps (bit per type, in HTA's order).
    let mem = merge(intervals(Some(KernelType::Memory)));
    let types = [
        (KernelType::Computation, 1),
        (KernelType::Communication, 2),
        (KernelType::Memory, 4),
    ];
    let status = sweep(&[(&comp, 1), (&comm, 2), (&mem, 4)]);
    let mut by_label: BTreeMap<i64, i64> = BTreeMap::new();
    for w in status.windows(2) {
        if w[0].1 > 0 {
            // pandas `astype(int)` on µs: truncation toward zero.
            *by_label.entry(w[0].1).or_default() += (w[1].0 - w[0].0) / 1000;
        }
    }
    out.kernel_types = by_label
        .into_iter()
        .filter(|&(_, us)| us != 0)
        .map(|(running, sum_us)| {
            let label = types
                .iter()
                .filter(|(_, bit)| running & bit != 0)
                .map(|(t, _)| t.as_str())
                .collect::<Vec<_>>()
                .join(" overlapping ");
            KernelTypeTime {
                kernel_type: label,
                sum_us,
            }
        })
        .collect();

    // Kernel table.
    for t in [
        KernelType::Computation,
        KernelType::Communication,
        KernelType::Memory,
    ] {
        let mut by_name: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for r in gpu.iter().filter(|r| ktype(r) == t) {
            by_name
                .entry(rows.str(r.name))
                .or_default()
                .push(r.hdur as f64 / 1000.0);
        }
        out.kernels.extend(kernel_table(
            t,
            rank,
            by_name,
            opts.num_kernels,
            opts.duration_ratio,
        ));
    }

    // Idle-time breakdown.
    out.idle = idle_breakdown(rank, rows, sym, view, opts.kernel_wait_threshold_us);
    out
}

/// `(sum, max, min, mean, sample stddev or 0)` of `values`.
fn describe(values: &[f64]) -> (f64, f64, f64, f64, f64) {
    let sum: f64 = values.iter().sum();
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    (
        sum,
        max,
        min,
        sum / values.len() as f64,
        std_sample(values).unwrap_or(0.0),
    )
}

/// A row whose HTA statistics are over `values` and whose launch statistics are over `launches`.
fn agg(name: String, t: KernelType, rank: i64, values: &[f64], launches: &[f64]) -> KernelRow {
    let (sum, max, min, mean, std) = describe(values);
    let (_, lmax, lmin, lmean, lstd) = describe(launches);
    KernelRow {
        kernel_type: t,
        name,
        rank,
        cycle: 0,
        sum_us: Us(sum),
        max_us: Us(max),
        min_us: Us(min),
        mean_us: Us(mean),
        stddev: std,
        count: launches.len(),
        launch_mean_us: Us(lmean),
        launch_min_us: Us(lmin),
        launch_max_us: Us(lmax),
        launch_stddev_us: Us(lstd),
    }
}

/// HTA's `_aggr_gpu_kernel_time` for one type on one rank.
fn kernel_table(
    t: KernelType,
    rank: i64,
    by_name: BTreeMap<&str, Vec<f64>>,
    num_kernels: usize,
    duration_ratio: f64,
) -> Vec<KernelRow> {
    let mut rows: Vec<(KernelRow, Vec<f64>)> = by_name
        .into_iter()
        .map(|(name, durs)| (agg(name.to_owned(), t, rank, &durs, &durs), durs))
        .collect();
    // Descending by sum; stable, so equal sums stay in name order.
    rows.sort_by(|a, b| b.0.sum_us.0.total_cmp(&a.0.sum_us.0));
    if rows.len() <= num_kernels {
        return rows.into_iter().map(|(r, _)| r).collect();
    }
    let mut cumsum = Vec::with_capacity(rows.len());
    let mut acc = 0.0;
    for (r, _) in &rows {
        acc += r.sum_us.0;
        cumsum.push(acc);
    }
    let mut sorted = cumsum.clone();
    sorted.sort_by(f64::total_cmp);
    let q = quantile_sorted(&sorted, duration_ratio).unwrap_or(f64::INFINITY);
    // HTA re-aggregates the kept rows over their totals (its quirk, kept in the HTA-named fields);
    // the launch statistics stay over the launches themselves.
    let mut groups: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (i, (r, durs)) in rows.into_iter().enumerate() {
        let name = if cumsum[i] > q || i >= num_kernels {
            "others".to_owned()
        } else {
            r.name
        };
        let g = groups.entry(name).or_default();
        g.0.push(r.sum_us.0);
        g.1.extend(durs);
    }
    groups
        .into_iter()
        .map(|(name, (sums, launches))| agg(name, t, rank, &sums, &launches))
        .collect()
}

fn idle_breakdown(
    rank: i64,
    rows: &Rows,
    sym: &Symbols,
    view: &[u32],
    threshold_us: f64,
) -> Vec<IdleRow> {
    let all = &rows.rows;
    // Which rows are in the view (by row number), and the row holding event index 0.
    let mut in_view = vec![false; all.len()];
    for &i in view {
        in_view[i as usize] = true;
    }
    let event0 = all.iter().position(|r| r.index == 0);
    // HTA's `index_correlation`, computed before filtering: a GPU row points at the last CPU row
    // with its correlation, a CPU row at the last GPU row; otherwise `min(correlation, 0)`, and 0
    // then joins with whatever row has index 0.
    let mut last_cpu: FastMap<i64, usize> = FastMap::default();
    let mut last_gpu: FastMap<i64, usize> = FastMap::default();
    for (i, r) in all.iter().enumerate() {
        if r.corr != -1 {
            if sym.is_gpu_row(r) {
                last_gpu.insert(r.corr, i);
            } else {
                last_cpu.insert(r.corr, i);
            }
        }
    }
    let runtime_ts = |r: &Row| -> Option<i64> {
        let partner = if r.corr == -1 {
            None
        } else if sym.is_gpu_row(r) {
            last_cpu.get(&r.corr).copied()
        } else {
            last_gpu.get(&r.corr).copied()
        };
        let target = match partner {
            Some(p) => Some(p),
            None if r.corr >= 0 => event0,
            None => None,
        }?;
        in_view[target].then(|| all[target].hts)
    };

    // Kernel rows by stream, streams in order of first appearance.
    let mut streams: Vec<i64> = Vec::new();
    let mut per_stream: FastMap<i64, Vec<(i64, i64, Option<i64>)>> = FastMap::default();
    for &i in view {
        let r = &all[i as usize];
        if r.stream == -1 || !sym.kernel_cat[r.cat as usize] {
            continue;
        }
        per_stream
            .entry(r.stream)
            .or_insert_with(|| {
                streams.push(r.stream);
                Vec::new()
            })
            .push((r.hts, r.hend(), runtime_ts(r)));
    }
    let threshold_ns = threshold_us * 1000.0;
    let mut out = Vec::new();
    for stream in streams {
        let mut ks = per_stream.remove(&stream).unwrap_or_default();
        ks.sort_by_key(|k| k.0);
        let mut gaps: BTreeMap<IdleCategory, Vec<f64>> = BTreeMap::new();
        let mut prev_end: Option<i64> = None;
        for &(ts, end, rt) in &ks {
            let gap = prev_end.map(|p| ts - p);
            let host = matches!((rt, prev_end), (Some(rt), Some(p)) if rt > p);
            let cat = if host {
                IdleCategory::HostWait
            } else if gap.is_some_and(|g| (g as f64) < threshold_ns) {
                IdleCategory::KernelWait
            } else {
                IdleCategory::Other
            };
            let entry = gaps.entry(cat).or_default();
            if let Some(g) = gap {
                entry.push(g as f64 / 1000.0);
            }
            prev_end = Some(end);
        }
        let sums: Vec<(IdleCategory, f64, Vec<f64>)> = gaps
            .into_iter()
            .map(|(c, v)| (c, v.iter().sum(), v))
            .collect();
        let total: f64 = sums.iter().map(|s| s.1).sum();
        for (cat, sum, values) in sums {
            out.push(IdleRow {
                rank,
                cycle: 0,
                stream,
                idle_category: cat,
                idle_time_us: Us(sum),
                idle_time_ratio: Num::ratio(sum, total),
                interval_stats: Describe::of(&values),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_like_hta() {
        assert_eq!(
            merge(vec![(5, 7), (0, 2), (1, 3), (3, 4)]),
            vec![(0, 4), (5, 7)]
        );
        // A -1 µs row alone forms an inverted group.
        assert_eq!(
            merge(vec![(0, 2), (10, 9), (10, 12)]),
            vec![(0, 2), (10, 9), (10, 12)]
        );
        assert_eq!(run_time(&merge(vec![(0, 2), (10, 9), (10, 12)])), 3);
    }

    #[test]
    fn sweep_tracks_running_status() {
        let comm = [(0, 10)];
        let comp = [(5, 15)];
        let s = sweep(&[(&comm, 1), (&comp, 2)]);
        assert_eq!(s, vec![(0, 1), (5, 3), (10, 2), (15, 0)]);
    }

    #[test]
    fn others_aggregation_uses_totals() {
        let mut by_name = BTreeMap::new();
        let names: Vec<String> = (0..12).map(|i| format!("k{i:02}")).collect();
        for (i, n) in names.iter().enumerate() {
            by_name.insert(n.as_str(), vec![(i + 1) as f64, (i + 1) as f64]);
        }
        let rows = kernel_table(KernelType::Computation, 3, by_name, 10, 0.8);
        let others = rows.iter().find(|r| r.name == "others").unwrap();
        // Sums are 2, 4, ..., 24; descending cumsum: 24, 46, 66, 84, 100, 114, 126, 136, 144,
        // 150, 154, 156; q(0.8) over those = 144 + 0.8 * (150 - 144) = 148.8, so the last three
        // (sums 6, 4, 2) are "others".
        assert_eq!(others.sum_us.0, 12.0);
        assert_eq!(others.max_us.0, 6.0);
        assert_eq!(others.min_us.0, 2.0);
        assert_eq!(others.count, 6);
        let kept = rows.iter().find(|r| r.name == "k11").unwrap();
        assert_eq!(
            (kept.sum_us.0, kept.max_us.0, kept.stddev),
            (24.0, 24.0, 0.0)
        );
        // The true per-launch numbers: two launches of 12 µs.
        assert_eq!(
            (
                kept.count,
                kept.launch_mean_us.0,
                kept.launch_min_us.0,
                kept.launch_max_us.0,
                kept.launch_stddev_us.0
            ),
            (2, 12.0, 12.0, 12.0, 0.0)
        );
        // `others` over its six launches (1, 1, 2, 2, 3, 3 µs), not over the three totals.
        assert_eq!(
            (
                others.launch_mean_us.0,
                others.launch_min_us.0,
                others.launch_max_us.0
            ),
            (2.0, 1.0, 3.0)
        );
        assert_eq!(rows.len(), 10);
    }
}
