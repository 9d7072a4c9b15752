//! `kinetrace diff`: what changed between two runs, name by name, in HolisticTraceAnalysis'
//! `TraceDiff` terms, plus how the time changed.
//!
//! Each side is one or more trace files. Every row HTA keeps (events with `dur` and `cat`) is
//! grouped by its `name` (across `cat`s, as `TraceDiff.compare_traces` groups by name), with its
//! count and total duration on HTA's clock (float timestamps rounded inward to whole µs, as HTA
//! does), so the numbers can be checked against HTA. A name's count category is
//! `TraceDiff.ops_diff`'s (added, deleted, increased, decreased or unchanged in count); its time
//! category says the same of its time, with a threshold.
//!
//! Rows are given steps by HTA's rule ([`crate::iteration`]). By default every step of both sides
//! counts, HTA's `compare_traces` given all iterations; `--step first` is HTA's own default (each
//! side's first step), `--step N` one step. When the sides have different numbers of steps, the
//! comparison is of per-step means. Ranks are compared rank by rank (the ranks both sides have),
//! or pooled into one comparison.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use kinetrace_export::reader::ReadOptions;
use serde::Serialize;

use crate::fastmap::FastMap;
use crate::iteration::iterations;
use crate::load::{map_sources, place, read_rank, FileProblem, Progress, TraceKey, TraceSource};
use crate::steps::step_number;
use crate::units::{fmt_us, Num, Us};

/// Version of the `--json` layout.
pub const SCHEMA_VERSION: u32 = 2;

/// Default time threshold: a name's time within ±5 % of the base is unchanged.
pub const DEFAULT_TIME_THRESHOLD: f64 = 0.05;

/// Changes of time below this (µs, on the comparison's basis) are unchanged whatever the share:
/// HTA's clock has whole µs.
pub const TIME_FLOOR_US: f64 = 1.0;

/// The name under which per-step means put every `ProfilerStep#N` row (each step's name occurs
/// once, so it has no per-step mean of its own).
pub const STEPS_NAME: &str = "ProfilerStep#*";

/// Which steps are compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepChoice {
    /// Every step of each side (the whole traces when a side has no steps).
    #[default]
    All,
    /// Each side's first step (the smallest `ProfilerStep` number of the side), HTA's default.
    First,
    /// This `ProfilerStep` number on both sides.
    Number(i64),
    /// Every step numbered below this one (a flight dump's slow step against those before it).
    Before(i64),
}

/// Options of a diff.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// Worker threads (0: one per CPU).
    pub jobs: usize,
    /// Pool all ranks of each side into one comparison.
    pub pool: bool,
    /// The steps compared.
    pub step: StepChoice,
    /// A time change within this share of the base time (or under [`TIME_FLOOR_US`]) is
    /// "unchanged".
    pub time_threshold: f64,
    /// The trace reader's limits.
    pub read: ReadOptions,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            jobs: 0,
            pool: false,
            step: StepChoice::All,
            time_threshold: DEFAULT_TIME_THRESHOLD,
            read: ReadOptions::default(),
        }
    }
}

/// A category of change: HTA `ops_diff`'s by count, and the same names by time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Only in the new trace.
    Added,
    /// Only in the base trace.
    Deleted,
    /// In both, more (more often, or longer) in the new one.
    Increased,
    /// In both, less in the new one.
    Decreased,
    /// In both, the same (by time: within the threshold).
    Unchanged,
}

impl Change {
    /// The name HTA's `ops_diff` uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Deleted => "deleted",
            Change::Increased => "increased",
            Change::Decreased => "decreased",
            Change::Unchanged => "unchanged",
        }
    }

    /// By count: `base_count × new_steps` against `new_count × base_steps`, so per-step means
    /// are compared exactly (with equal steps, HTA's comparison of the counts).
    fn by_count(base: u64, new: u64, base_steps: u64, new_steps: u64) -> Change {
        let (b, n) = (
            u128::from(base) * u128::from(new_steps),
            u128::from(new) * u128::from(base_steps),
        );
        match (base, new) {
            (0, _) => Change::Added,
            (_, 0) => Change::Deleted,
            _ if n > b => Change::Increased,
            _ if n < b => Change::Decreased,
            _ => Change::Unchanged,
        }
    }

    /// By time (µs on the comparison's basis): unchanged within `threshold` of the base or
    /// [`TIME_FLOOR_US`].
    fn by_time(present: (bool, bool), base_us: f64, new_us: f64, threshold: f64) -> Change {
        match present {
            (false, _) => Change::Added,
            (_, false) => Change::Deleted,
            _ => {
                let d = new_us - base_us;
                if d.abs() <= (threshold * base_us.abs()).max(TIME_FLOOR_US) {
                    Change::Unchanged
                } else if d > 0.0 {
                    Change::Increased
                } else {
                    Change::Decreased
                }
            }
        }
    }
}

/// Which rows a comparison counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Every row: a side has no `ProfilerStep`.
    WholeTrace,
    /// The rows of every step.
    AllSteps,
    /// Each side's first step.
    FirstStep,
    /// One step number.
    Step,
}

/// What the per-name numbers of a comparison are compared on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Totals (the sides have as many steps, or no steps).
    Totals,
    /// Means per step: the sides have different numbers of steps.
    PerStepMean,
}

/// One name in both traces. The `control_*`/`test_*`/`diff_*`/`counts_change_categories` fields
/// are HTA `compare_traces`' columns (base = control, new = test), always from totals.
#[derive(Clone, Debug, Serialize)]
pub struct DiffRow {
    /// The event name.
    pub name: String,
    /// What it is, from its `cat` (`kernel`, `memcpy`, `memset`, `op`, `annotation`, `runtime`,
    /// `python`, `other`; the first `cat` seen when a name has several).
    pub kind: &'static str,
    /// Count in the base trace.
    pub control_counts: u64,
    /// Count in the new trace.
    pub test_counts: u64,
    /// Total duration in the base trace (µs, HTA's rounding).
    pub control_total_duration: Us,
    /// Total duration in the new trace.
    pub test_total_duration: Us,
    /// `test_counts − control_counts`.
    pub diff_counts: i64,
    /// `test_total_duration − control_total_duration`.
    pub diff_duration: Us,
    /// `+`, `-` or `=` by count, as HTA.
    pub counts_change_categories: &'static str,
    /// HTA `ops_diff`'s category (on per-step mean counts when the basis is per step).
    pub category: Change,
    /// Count per step of the base side (`null` without steps).
    pub control_counts_per_step: Option<f64>,
    /// Count per step of the new side.
    pub test_counts_per_step: Option<f64>,
    /// Duration per step of the base side.
    pub control_duration_per_step: Option<Us>,
    /// Duration per step of the new side.
    pub test_duration_per_step: Option<Us>,
    /// Time change on the comparison's basis, as a share of the base time (`null` when the base
    /// time is 0).
    pub time_change_share: Num,
    /// Category by time on the comparison's basis (see [`DiffOptions::time_threshold`]).
    pub time_category: Change,
}

/// The duration change of one kind of event.
#[derive(Clone, Debug, Serialize)]
pub struct KindChange {
    /// Kind (see [`DiffRow::kind`]).
    pub kind: &'static str,
    /// Total duration in the base trace.
    pub base_us: Us,
    /// Total duration in the new trace.
    pub new_us: Us,
    /// The difference.
    pub diff_us: Us,
    /// Per step of the base side (`null` without steps).
    pub base_per_step_us: Option<Us>,
    /// Per step of the new side.
    pub new_per_step_us: Option<Us>,
}

/// One comparison: a rank against the same rank, or all ranks pooled.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The base side's rank (`null` when pooled).
    pub base_rank: Option<i64>,
    /// The new side's rank (`null` when pooled).
    pub new_rank: Option<i64>,
    /// Which rows are counted.
    pub selection: Selection,
    /// What rows are compared on.
    pub basis: Basis,
    /// Traces on the base side of this comparison: a rank's cycles are merged into one side
    /// (every trace when pooled).
    pub base_traces: usize,
    /// The same on the new side.
    pub new_traces: usize,
    /// The base step compared, when one step is.
    pub base_step: Option<i64>,
    /// The new step compared, when one step is.
    pub new_step: Option<i64>,
    /// `ProfilerStep`s counted on the base side.
    pub base_steps: usize,
    /// `ProfilerStep`s counted on the new side.
    pub new_steps: usize,
    /// Base steps the capture's end cut short (partial: in the rows, not in the step time).
    pub base_partial_steps: usize,
    /// The same on the new side.
    pub new_partial_steps: usize,
    /// Rows of the base side in no step by HTA's rule, left out (with all steps selected).
    pub base_rows_in_no_step: u64,
    /// The same on the new side.
    pub new_rows_in_no_step: u64,
    /// Mean step time on the base side (`null` without steps).
    pub base_mean_step_us: Option<Us>,
    /// Mean step time on the new side.
    pub new_mean_step_us: Option<Us>,
    /// `new − base` mean step time.
    pub step_time_diff_us: Option<Us>,
    /// Its share of the base step time.
    pub step_time_diff_share: Option<Num>,
    /// The mean step time by time category (`null` without steps on both sides).
    pub step_time_category: Option<Change>,
    /// The time threshold used (a share of the base time).
    pub time_threshold: f64,
    /// Duration change per kind, largest absolute change first. Kernels, copies and sets add up
    /// GPU time; ops and annotations nest, so their totals count nested time more than once.
    pub by_kind: Vec<KindChange>,
    /// Every name, largest absolute duration change (on the basis) first.
    pub rows: Vec<DiffRow>,
    /// Names per count category, as HTA `ops_diff` returns them (sorted by name).
    pub ops_diff: BTreeMap<Change, Vec<String>>,
    /// Names per time category (sorted by name).
    pub time_diff: BTreeMap<Change, Vec<String>>,
}

/// Everything `kinetrace diff` reports.
#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Files read on the base side.
    pub base_files: Vec<PathBuf>,
    /// Files read on the new side.
    pub new_files: Vec<PathBuf>,
    /// The comparisons.
    pub comparisons: Vec<Comparison>,
    /// Files that could not be read, and ranks only one side has.
    pub problems: Vec<FileProblem>,
}

impl DiffReport {
    /// Whether there is anything to show.
    pub fn compared_any(&self) -> bool {
        !self.comparisons.is_empty()
    }
}

#[derive(Clone, Copy, Default)]
struct Acc {
    count: u64,
    dur_ns: i64,
}

impl Acc {
    fn add(&mut self, o: Acc) {
        self.count += o.count;
        self.dur_ns += o.dur_ns;
    }
}

/// Totals by the reader's name id.
type ByName = FastMap<u32, Acc>;

/// One trace file reduced to the per-name totals the chosen steps need.
struct FileSummary {
    key: TraceKey,
    rank: i64,
    /// Name text and kind (from the first `cat` seen) by the reader's string id.
    names: FastMap<u32, (String, &'static str)>,
    /// Every step number of the file, with its host `ProfilerStep` span (ns) when it has one
    /// (a step seen only GPU-side has none).
    spans: BTreeMap<i64, Option<i64>>,
    /// The rows of the steps kept: every step ([`StepChoice::All`]), the file's first step
    /// ([`StepChoice::First`]; a side's first step is the first of the files that have it) or
    /// step N.
    kept: ByName,
    /// The step kept, when one is.
    kept_step: Option<i64>,
    /// Rows in no step (every row when the file has no steps).
    no_step: ByName,
    has_steps: bool,
    /// The step the capture's end cut short (see [`crate::steps`]): a step, not a step time.
    partial_step: Option<i64>,
}

fn kind_of(cat: &str) -> &'static str {
    match cat {
        "kernel" | "Kernel" => "kernel",
        "gpu_memcpy" | "Memcpy" => "memcpy",
        "gpu_memset" | "Memset" => "memset",
        "cpu_op" | "Operator" => "op",
        "user_annotation" | "gpu_user_annotation" => "annotation",
        "cuda_runtime" | "cuda_driver" | "Runtime" => "runtime",
        "python_function" => "python",
        _ => "other",
    }
}

fn summarize_file(
    source: &TraceSource,
    choice: StepChoice,
    read: &ReadOptions,
) -> Result<FileSummary, FileProblem> {
    let (rows, rank, rank_source) = read_rank(source, read)?;
    let key = TraceKey::new(source.path(), &rows, rank, rank_source);
    let it = iterations(&rows);
    // Per string: its step number (names) and whether it is a host step's `cat`.
    let number: Vec<Option<i64>> = rows.strings.iter().map(|t| step_number(t)).collect();
    let host_cat: Vec<bool> = rows
        .strings
        .iter()
        .map(|t| matches!(&**t, "user_annotation" | "cpu_op" | "Operator"))
        .collect();
    let mut first_cat: Vec<u32> = vec![u32::MAX; rows.strings.len()];
    let mut spans: BTreeMap<i64, Option<i64>> = BTreeMap::new();
    // Per step while reading (the file's first step is known only at the end); consecutive rows
    // mostly share one, so the last step's slot is remembered.
    let mut index: FastMap<i64, usize> = FastMap::default();
    let mut steps: Vec<(i64, ByName)> = Vec::new();
    let mut no_step = ByName::default();
    let mut last: Option<(i64, usize)> = None;
    for (r, step) in rows.rows.iter().zip(&it.of_row) {
        let name = r.name as usize;
        if first_cat[name] == u32::MAX {
            first_cat[name] = r.cat;
        }
        if let Some(n) = number[name] {
            // The step's span: its first host `ProfilerStep` row (not the GPU-side copy).
            let span = spans.entry(n).or_default();
            if host_cat[r.cat as usize] && span.is_none() {
                *span = Some(r.dur);
            }
        }
        let bucket = match *step {
            Some(n) => {
                let k = match last {
                    Some((m, k)) if m == n => k,
                    _ => *index.entry(n).or_insert_with(|| {
                        steps.push((n, ByName::default()));
                        steps.len() - 1
                    }),
                };
                last = Some((n, k));
                &mut steps[k].1
            }
            None => &mut no_step,
        };
        bucket.entry(r.name).or_default().add(Acc {
            count: 1,
            dur_ns: r.hdur,
        });
    }
    let kept_step = match choice {
        StepChoice::All => None,
        StepChoice::First => spans.keys().next().copied(),
        StepChoice::Number(n) => spans.contains_key(&n).then_some(n),
        StepChoice::Before(_) => None,
    };
    let below = match choice {
        StepChoice::Before(limit) => limit,
        _ => i64::MAX,
    };
    let mut kept = ByName::default();
    for (n, names) in steps {
        if kept_step.is_none_or(|k| k == n) && n < below {
            for (id, a) in names {
                kept.entry(id).or_default().add(a);
            }
        }
    }
    let names = first_cat
        .iter()
        .enumerate()
        .filter(|(_, &cat)| cat != u32::MAX)
        .map(|(id, &cat)| {
            let id = id as u32;
            (id, (rows.str(id).to_owned(), kind_of(rows.str(cat))))
        })
        .collect();
    Ok(FileSummary {
        key,
        rank,
        names,
        spans,
        kept,
        kept_step,
        no_step,
        has_steps: it.has_steps,
        partial_step: crate::steps::partial_step(&rows),
    })
}

/// Which rows of a file make a side.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pick {
    Whole,
    AllSteps,
    /// The steps numbered below this one (their rows are the file's kept rows).
    Before(i64),
    /// One step number (`None`: the side has no step, so nothing).
    One(Option<i64>),
}

#[derive(Clone, Default)]
struct NameAcc {
    kind: &'static str,
    count: u64,
    dur_ns: i64,
}

/// One rank (or several, pooled) reduced to per-name totals of the rows picked.
#[derive(Clone, Default)]
struct Side {
    names: HashMap<String, NameAcc>,
    steps: usize,
    timed_steps: usize,
    step_ns: i64,
    in_no_step: u64,
    /// Steps the capture's end cut short: counted, never timed.
    partial_steps: usize,
}

impl Side {
    fn of(files: &[&FileSummary], pick: Pick) -> Side {
        let mut side = Side::default();
        for f in files {
            let mut count_step = |n: i64, span: Option<i64>| {
                side.steps += 1;
                if f.partial_step == Some(n) {
                    side.partial_steps += 1;
                } else if let Some(ns) = span {
                    side.timed_steps += 1;
                    side.step_ns += ns;
                }
            };
            let mut by_id = ByName::default();
            let mut take = |m: &ByName| {
                for (id, a) in m {
                    by_id.entry(*id).or_default().add(*a);
                }
            };
            match pick {
                Pick::Whole | Pick::AllSteps => {
                    f.spans.iter().for_each(|(&n, &span)| count_step(n, span));
                    take(&f.kept);
                    if pick == Pick::Whole {
                        take(&f.no_step);
                    } else {
                        side.in_no_step += f.no_step.values().map(|a| a.count).sum::<u64>();
                    }
                }
                Pick::Before(limit) => {
                    f.spans
                        .range(..limit)
                        .for_each(|(&n, &span)| count_step(n, span));
                    take(&f.kept);
                }
                Pick::One(Some(n)) if f.kept_step == Some(n) => {
                    count_step(n, f.spans.get(&n).copied().flatten());
                    take(&f.kept);
                }
                Pick::One(_) => {}
            }
            for (id, a) in by_id {
                let (name, kind) = &f.names[&id];
                let e = side.names.entry(name.clone()).or_insert_with(|| NameAcc {
                    kind,
                    ..NameAcc::default()
                });
                e.count += a.count;
                e.dur_ns += a.dur_ns;
            }
        }
        side
    }

    fn mean_step_ns(&self) -> Option<f64> {
        (self.timed_steps > 0).then(|| self.step_ns as f64 / self.timed_steps as f64)
    }

    /// Every `ProfilerStep#N` row under [`STEPS_NAME`].
    fn fold_steps(&mut self) {
        let steps: Vec<String> = self
            .names
            .keys()
            .filter(|n| step_number(n).is_some())
            .cloned()
            .collect();
        for n in steps {
            let a = self.names.remove(&n).expect("listed");
            let e = self
                .names
                .entry(STEPS_NAME.to_owned())
                .or_insert_with(|| NameAcc {
                    kind: a.kind,
                    ..NameAcc::default()
                });
            e.count += a.count;
            e.dur_ns += a.dur_ns;
        }
    }
}

/// What a comparison is of: its selection, the step compared on each side, and the time
/// threshold.
struct Frame {
    traces: (usize, usize),
    selection: Selection,
    base_step: Option<i64>,
    new_step: Option<i64>,
    threshold: f64,
}

fn per_step(total: f64, steps: usize) -> Option<f64> {
    (steps > 0).then(|| total / steps as f64)
}

fn compare(
    mut base: Side,
    mut new: Side,
    ranks: (Option<i64>, Option<i64>),
    frame: &Frame,
) -> Comparison {
    let basis = if frame.selection == Selection::AllSteps && base.steps != new.steps {
        base.fold_steps();
        new.fold_steps();
        Basis::PerStepMean
    } else {
        Basis::Totals
    };
    // Divisors of the basis: 1 for totals.
    let (bdiv, ndiv) = match basis {
        Basis::Totals => (1.0, 1.0),
        Basis::PerStepMean => (base.steps as f64, new.steps as f64),
    };
    let (bsteps, nsteps) = match basis {
        Basis::Totals => (1, 1),
        Basis::PerStepMean => (base.steps as u64, new.steps as u64),
    };
    let mut names: Vec<&String> = base.names.keys().chain(new.names.keys()).collect();
    names.sort();
    names.dedup();
    let empty = NameAcc::default();
    let mut rows: Vec<(f64, DiffRow)> = names
        .into_iter()
        .map(|name| {
            let b = base.names.get(name).unwrap_or(&empty);
            let n = new.names.get(name).unwrap_or(&empty);
            let (bt, nt) = (Us::from_ns(b.dur_ns).0, Us::from_ns(n.dur_ns).0);
            let (bb, nb) = (bt / bdiv, nt / ndiv);
            let diff_counts = n.count as i64 - b.count as i64;
            let row = DiffRow {
                name: name.clone(),
                kind: if b.count > 0 { b.kind } else { n.kind },
                control_counts: b.count,
                test_counts: n.count,
                control_total_duration: Us(bt),
                test_total_duration: Us(nt),
                diff_counts,
                diff_duration: Us::from_ns(n.dur_ns - b.dur_ns),
                counts_change_categories: match diff_counts {
                    d if d > 0 => "+",
                    d if d < 0 => "-",
                    _ => "=",
                },
                category: Change::by_count(b.count, n.count, bsteps, nsteps),
                control_counts_per_step: per_step(b.count as f64, base.steps),
                test_counts_per_step: per_step(n.count as f64, new.steps),
                control_duration_per_step: per_step(bt, base.steps).map(Us),
                test_duration_per_step: per_step(nt, new.steps).map(Us),
                time_change_share: Num::ratio(nb - bb, bb),
                time_category: Change::by_time((b.count > 0, n.count > 0), bb, nb, frame.threshold),
            };
            (nb - bb, row)
        })
        .collect();
    rows.sort_by(|(da, a), (db, b)| {
        db.abs()
            .total_cmp(&da.abs())
            .then_with(|| a.name.cmp(&b.name))
    });
    let rows: Vec<DiffRow> = rows.into_iter().map(|(_, r)| r).collect();
    let ops_diff = by_category(&rows, |r| r.category);
    let time_diff = by_category(&rows, |r| r.time_category);
    let mut kinds: BTreeMap<&'static str, (f64, f64)> = BTreeMap::new();
    for r in &rows {
        let k = kinds.entry(r.kind).or_default();
        k.0 += r.control_total_duration.0;
        k.1 += r.test_total_duration.0;
    }
    let mut by_kind: Vec<(f64, KindChange)> = kinds
        .into_iter()
        .map(|(kind, (b, n))| {
            (
                n / ndiv - b / bdiv,
                KindChange {
                    kind,
                    base_us: Us(b),
                    new_us: Us(n),
                    diff_us: Us(n - b),
                    base_per_step_us: per_step(b, base.steps).map(Us),
                    new_per_step_us: per_step(n, new.steps).map(Us),
                },
            )
        })
        .collect();
    by_kind.sort_by(|(a, _), (b, _)| b.abs().total_cmp(&a.abs()));
    let (bm, nm) = (base.mean_step_ns(), new.mean_step_ns());
    let diff = bm.zip(nm).map(|(b, n)| n - b);
    Comparison {
        base_rank: ranks.0,
        new_rank: ranks.1,
        selection: frame.selection,
        basis,
        base_traces: frame.traces.0,
        new_traces: frame.traces.1,
        base_step: frame.base_step,
        new_step: frame.new_step,
        base_steps: base.steps,
        new_steps: new.steps,
        base_partial_steps: base.partial_steps,
        new_partial_steps: new.partial_steps,
        base_rows_in_no_step: base.in_no_step,
        new_rows_in_no_step: new.in_no_step,
        base_mean_step_us: bm.map(|v| Us(v.round() / 1000.0)),
        new_mean_step_us: nm.map(|v| Us(v.round() / 1000.0)),
        step_time_diff_us: diff.map(|d| Us(d.round() / 1000.0)),
        step_time_diff_share: diff.zip(bm).map(|(d, b)| Num::ratio(d, b)),
        step_time_category: bm
            .zip(nm)
            .map(|(b, n)| Change::by_time((true, true), b / 1e3, n / 1e3, frame.threshold)),
        time_threshold: frame.threshold,
        by_kind: by_kind.into_iter().map(|(_, k)| k).collect(),
        rows,
        ops_diff,
        time_diff,
    }
}

/// Names per category; every category is present, empty or not, as in HTA's `ops_diff`.
fn by_category(rows: &[DiffRow], of: impl Fn(&DiffRow) -> Change) -> BTreeMap<Change, Vec<String>> {
    let mut m: BTreeMap<Change, Vec<String>> = [
        Change::Added,
        Change::Deleted,
        Change::Increased,
        Change::Decreased,
        Change::Unchanged,
    ]
    .into_iter()
    .map(|c| (c, Vec::new()))
    .collect();
    for r in rows {
        m.entry(of(r)).or_default().push(r.name.clone());
    }
    for v in m.values_mut() {
        v.sort();
    }
    m
}

/// Compares `base` with `new` (files, one rank each). `problems` from [`crate::discover`] on
/// either side are carried into the report.
pub fn diff(
    base: &[PathBuf],
    new: &[PathBuf],
    problems: Vec<FileProblem>,
    opts: &DiffOptions,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> DiffReport {
    let sources: Vec<TraceSource> = base
        .iter()
        .chain(new)
        .cloned()
        .map(TraceSource::File)
        .collect();
    diff_sources(&sources, base.len(), problems, opts, progress)
}

/// The smallest step number of a side's files (HTA's first iteration of a trace directory).
fn first_step<'a>(files: impl IntoIterator<Item = &'a FileSummary>) -> Option<i64> {
    files
        .into_iter()
        .filter_map(|f| f.spans.keys().next().copied())
        .min()
}

/// Compares the files of one comparison (a rank, or every rank pooled).
fn compare_files(
    base: &[&FileSummary],
    new: &[&FileSummary],
    ranks: (Option<i64>, Option<i64>),
    first: (Option<i64>, Option<i64>),
    opts: &DiffOptions,
) -> Comparison {
    let (selection, picks) = match opts.step {
        StepChoice::All => {
            if base.iter().chain(new).all(|f| f.has_steps) {
                (Selection::AllSteps, (Pick::AllSteps, Pick::AllSteps))
            } else {
                (Selection::WholeTrace, (Pick::Whole, Pick::Whole))
            }
        }
        StepChoice::First => (
            Selection::FirstStep,
            (Pick::One(first.0), Pick::One(first.1)),
        ),
        StepChoice::Number(n) => (Selection::Step, (Pick::One(Some(n)), Pick::One(Some(n)))),
        StepChoice::Before(n) => (Selection::AllSteps, (Pick::Before(n), Pick::Before(n))),
    };
    let one = |p: Pick| match p {
        Pick::One(n) => n,
        _ => None,
    };
    let frame = Frame {
        traces: (base.len(), new.len()),
        selection,
        base_step: one(picks.0),
        new_step: one(picks.1),
        threshold: opts.time_threshold,
    };
    compare(
        Side::of(base, picks.0),
        Side::of(new, picks.1),
        ranks,
        &frame,
    )
}

fn all_files(m: &BTreeMap<i64, Vec<FileSummary>>) -> Vec<&FileSummary> {
    m.values().flatten().collect()
}

/// [`diff`] over files or in-memory traces: the first `n_base` sources are the base side.
pub fn diff_sources(
    sources: &[TraceSource],
    n_base: usize,
    mut problems: Vec<FileProblem>,
    opts: &DiffOptions,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> DiffReport {
    let results = map_sources(sources, opts.jobs, progress, &|s| {
        summarize_file(s, opts.step, &opts.read)
    });
    let mut sides: [BTreeMap<i64, Vec<FileSummary>>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut files: [Vec<PathBuf>; 2] = [Vec::new(), Vec::new()];
    let mut read: [Vec<FileSummary>; 2] = [Vec::new(), Vec::new()];
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(summary) => read[usize::from(i >= n_base)].push(summary),
            Err(p) => problems.push(p),
        }
    }
    // Each side is a folder of ranks × cycles: a rank's cycles are merged, duplicates skipped.
    for (which, side) in read.into_iter().enumerate() {
        let placed = place(&side.iter().map(|f| &f.key).collect::<Vec<_>>());
        for (summary, p) in side.into_iter().zip(placed) {
            match p {
                Ok(_) => {
                    files[which].push(summary.key.file.clone());
                    sides[which].entry(summary.rank).or_default().push(summary);
                }
                Err(e) => problems.push(e),
            }
        }
    }
    let mut comparisons = Vec::new();
    let [base, new] = &sides;
    let first = (first_step(all_files(base)), first_step(all_files(new)));
    if base.is_empty() || new.is_empty() {
        // Nothing to compare; the problems say why.
    } else if opts.pool {
        comparisons.push(compare_files(
            &all_files(base),
            &all_files(new),
            (None, None),
            first,
            opts,
        ));
    } else if base.len() == 1 && new.len() == 1 {
        // One rank each: compare them whatever their numbers.
        let (br, bs) = base.iter().next().expect("one rank");
        let (nr, ns) = new.iter().next().expect("one rank");
        comparisons.push(compare_files(
            &bs.iter().collect::<Vec<_>>(),
            &ns.iter().collect::<Vec<_>>(),
            (Some(*br), Some(*nr)),
            first,
            opts,
        ));
    } else {
        for (rank, bs) in base {
            match new.get(rank) {
                Some(ns) => comparisons.push(compare_files(
                    &bs.iter().collect::<Vec<_>>(),
                    &ns.iter().collect::<Vec<_>>(),
                    (Some(*rank), Some(*rank)),
                    first,
                    opts,
                )),
                None => problems.push(only_one_side(*rank, "base", &files[0])),
            }
        }
        for rank in new.keys().filter(|r| !base.contains_key(r)) {
            problems.push(only_one_side(*rank, "new", &files[1]));
        }
    }
    problems.sort_by(|a, b| a.file.cmp(&b.file));
    let [base_files, new_files] = files;
    DiffReport {
        schema_version: SCHEMA_VERSION,
        base_files,
        new_files,
        comparisons,
        problems,
    }
}

fn only_one_side(rank: i64, side: &str, files: &[PathBuf]) -> FileProblem {
    FileProblem {
        file: files.first().cloned().unwrap_or_default(),
        offset: None,
        message: format!(
            "rank {rank} is only on the {side} side, so it is not compared (use --pool to compare \
             all ranks together)"
        ),
    }
}

/// Step `step` of one trace (a flight dump's slow step) against the steps before it in the same
/// trace, on per-step means: what the slow step did differently.
pub fn step_against_earlier(
    path: &std::path::Path,
    step: i64,
    opts: &DiffOptions,
) -> Result<Comparison, FileProblem> {
    let source = TraceSource::File(path.to_path_buf());
    let base = summarize_file(&source, StepChoice::Before(step), &opts.read)?;
    let new = summarize_file(&source, StepChoice::Number(step), &opts.read)?;
    let frame = Frame {
        traces: (1, 1),
        selection: Selection::AllSteps,
        base_step: None,
        new_step: Some(step),
        threshold: opts.time_threshold,
    };
    Ok(compare(
        Side::of(&[&base], Pick::Before(step)),
        Side::of(&[&new], Pick::One(Some(step))),
        (Some(base.rank), Some(new.rank)),
        &frame,
    ))
}

/// What a comparison counts, in words: "all 3 steps of each side", "per-step means of …".
pub fn scope(c: &Comparison) -> String {
    let steps = |n: usize| format!("{n} step{}", if n == 1 { "" } else { "s" });
    let step =
        |s: Option<i64>| s.map_or_else(|| "none".to_owned(), |n| format!("ProfilerStep#{n}"));
    let mut s = match (c.selection, c.basis) {
        (Selection::WholeTrace, _) => "whole traces (a side has no ProfilerStep)".to_owned(),
        (Selection::AllSteps, Basis::Totals) => format!("all {} of each side", steps(c.base_steps)),
        (Selection::AllSteps, Basis::PerStepMean) => format!(
            "per-step means (base {}, new {}): counts and times below are per step, \
             ProfilerStep#N rows as {STEPS_NAME}",
            steps(c.base_steps),
            steps(c.new_steps)
        ),
        (Selection::FirstStep, _) => format!(
            "the first step of each side ({} vs {}), as HTA's default",
            step(c.base_step),
            step(c.new_step)
        ),
        (Selection::Step, _) => step(c.base_step),
    };
    if matches!(c.selection, Selection::Step | Selection::FirstStep) {
        match (c.base_steps, c.new_steps) {
            (0, 0) => s.push_str(" (on neither side)"),
            (0, _) => s.push_str(" (not on the base side)"),
            (_, 0) => s.push_str(" (not on the new side)"),
            _ => {}
        }
    }
    let pooled = c.base_rank.is_none();
    let merged = |n: usize, side: &str| match n {
        1 => None,
        _ if pooled => Some(format!("{n} {side} traces")),
        _ => Some(format!("{n} {side} cycles")),
    };
    let merged: Vec<String> = [merged(c.base_traces, "base"), merged(c.new_traces, "new")]
        .into_iter()
        .flatten()
        .collect();
    if !merged.is_empty() {
        s.push_str(&format!("; merged: {}", merged.join(", ")));
    }
    if c.base_partial_steps + c.new_partial_steps > 0 {
        s.push_str(&format!(
            "; partial (the capture ended inside them, so not in the step time): {} base, {} new",
            c.base_partial_steps, c.new_partial_steps
        ));
    }
    let left_out = c.base_rows_in_no_step + c.new_rows_in_no_step;
    if left_out > 0 {
        s.push_str(&format!(
            "; left out: {} base and {} new rows in no step",
            c.base_rows_in_no_step, c.new_rows_in_no_step
        ));
    }
    s
}

/// One line saying where the time went in a comparison: the step time change and the largest
/// changes by kind and by name (per step when the comparison is of per-step means).
pub fn summary(c: &Comparison) -> String {
    let per_step = c.basis == Basis::PerStepMean;
    let mut parts = Vec::new();
    if let (Some(b), Some(n), Some(d)) =
        (c.base_mean_step_us, c.new_mean_step_us, c.step_time_diff_us)
    {
        let share = c
            .step_time_diff_share
            .and_then(|s| s.get())
            .map_or_else(String::new, |s| format!(", {:+.1}%", 100.0 * s));
        parts.push(format!(
            "step time {} → {} ({}{}{share})",
            fmt_us(b.0),
            fmt_us(n.0),
            if d.0 >= 0.0 { "+" } else { "" },
            fmt_us(d.0)
        ));
    }
    let kind_diff = |k: &KindChange| -> f64 {
        if per_step {
            k.new_per_step_us.unwrap_or_default().0 - k.base_per_step_us.unwrap_or_default().0
        } else {
            k.diff_us.0
        }
    };
    let gpu: Vec<String> = c
        .by_kind
        .iter()
        .filter(|k| matches!(k.kind, "kernel" | "memcpy" | "memset") && kind_diff(k) != 0.0)
        .map(|k| {
            let d = kind_diff(k);
            format!("{} {}{}", k.kind, sign(d), fmt_us(d.abs()))
        })
        .collect();
    let per = if per_step { " per step" } else { "" };
    if !gpu.is_empty() {
        parts.push(format!("GPU time{per}: {}", gpu.join(", ")));
    }
    let row_diff = |r: &DiffRow| -> f64 {
        if per_step {
            r.test_duration_per_step.unwrap_or_default().0
                - r.control_duration_per_step.unwrap_or_default().0
        } else {
            r.diff_duration.0
        }
    };
    let top: Vec<String> = c
        .rows
        .iter()
        .filter(|r| r.kind != "annotation" && row_diff(r) != 0.0)
        .take(3)
        .map(|r| {
            let d = row_diff(r);
            format!("{} {}{}", short(&r.name), sign(d), fmt_us(d.abs()))
        })
        .collect();
    if !top.is_empty() {
        parts.push(format!("most changed{per}: {}", top.join(", ")));
    }
    if parts.is_empty() {
        "no change".into()
    } else {
        parts.join("; ")
    }
}

fn sign(v: f64) -> &'static str {
    if v < 0.0 {
        "−"
    } else {
        "+"
    }
}

fn short(name: &str) -> String {
    if name.chars().count() <= 50 {
        name.to_owned()
    } else {
        let mut s: String = name.chars().take(49).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
