//! Step times per rank (one row per `ProfilerStep#N`) and the straggler rank.
//!
//! A step is a CPU row named `ProfilerStep#N` (HTA's regex `ProfilerStep\s*#\s*(\d+)`, matched
//! at the start). A step the capture's end cut short (kinetrace names it in the trace's
//! `kinetrace_partial_step`: the capture ended at exit, on a signal or stepping aside, inside it) is
//! listed but marked partial and left out of every step statistic: it holds a run's teardown, or
//! the part of an interrupted iteration that was done, not a step's time. Its time is the annotation's duration. A kernel (memcpy, memset) belongs to the
//! step in which the CPU call that launched it (same `correlation`) started. Per step and rank:
//! GPU busy time (union of all its kernels), compute time (union of computation kernels) and
//! communication time (union of communication kernels), all on exact timestamps.
//!
//! The straggler: in a step every rank took part in, the rank with the most compute time keeps the
//! others waiting inside their collectives. The straggler rank is the one that is slowest in the
//! most steps (ties: the larger total compute). What compute and waiting are depends on what the
//! traces hold ([`Basis`]): with GPU kernels, computation and communication kernel time; without
//! any (a CPU-only job: gloo, or CPU work beside it), the step's time outside collectives and the
//! host time in collectives (c10d, gloo, NCCL, MPI, UCC ops and annotations, on any thread). With
//! one rank, no shared step, no basis (no kernel and no collective in the steps) or ranks within
//! 5 % of the straggler's step time of each other, there is no straggler, and [`StragglerVerdict`] says why; it is
//! never a rank picked among zeros.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::fastmap::FastMap;
use crate::hta::Symbols;
use crate::kernel::KernelType;
use crate::rows::{Row, Rows};
use crate::units::Us;

/// One step on one rank.
#[derive(Clone, Debug, Serialize)]
pub struct StepRow {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// Step number `N` of `ProfilerStep#N`.
    pub step: i64,
    /// Start, ms since the rank's first event.
    pub start_ms: f64,
    /// Duration of the `ProfilerStep#N` annotation.
    pub step_time_us: Us,
    /// Time with any kernel of the step running.
    pub gpu_busy_us: Us,
    /// Time with a computation kernel of the step running.
    pub compute_us: Us,
    /// Time with a communication kernel of the step running.
    pub comm_us: Us,
    /// Kernels, memcpys and memsets launched in the step.
    pub kernels: u64,
    /// The capture ended inside this step (see the module docs): not a whole step, left out of
    /// step statistics.
    pub partial: bool,
    /// Host time in collectives (c10d, gloo, NCCL, MPI, UCC ops and annotations, any thread),
    /// the union within the step: where a CPU-only rank waits for the others.
    pub collective_us: Us,
    /// The collective with the most host time in the step.
    pub collective: Option<String>,
}

/// What compute and waiting are measured in (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Computation and communication kernel time.
    Gpu,
    /// The step's time outside collectives, and host time in collectives.
    Cpu,
}

impl StepRow {
    /// Compute time on `basis`.
    pub fn compute_on(&self, basis: Basis) -> f64 {
        match basis {
            Basis::Gpu => self.compute_us.0,
            Basis::Cpu => (self.step_time_us.0 - self.collective_us.0).max(0.0),
        }
    }

    /// Waiting (communication) time on `basis`.
    pub fn wait_on(&self, basis: Basis) -> f64 {
        match basis {
            Basis::Gpu => self.comm_us.0,
            Basis::Cpu => self.collective_us.0,
        }
    }
}

/// Host rows that are collectives: c10d's ops (`c10d::allreduce_`), the backends' annotations
/// (`gloo:all_reduce`, `nccl:all_reduce`), PyTorch's `record_param_comms`.
pub(crate) fn is_host_collective(name: &str) -> bool {
    ["c10d::", "gloo:", "nccl:", "mpi:", "ucc:"]
        .iter()
        .any(|p| name.starts_with(p))
        || name == "record_param_comms"
}

/// The straggler rank over the steps all ranks share.
#[derive(Clone, Debug, Serialize)]
pub struct Straggler {
    /// The rank.
    pub rank: i64,
    /// What compute and waiting are measured in.
    pub basis: Basis,
    /// The other rank that waits the most per step.
    pub waiting_rank: i64,
    /// Its mean waiting time per step.
    pub waiting_rank_wait_us: Us,
    /// The collective the other ranks wait in the most (CPU basis), if named.
    pub wait_in: Option<String>,
    /// Steps in which it had the most compute time.
    pub slowest_in_steps: usize,
    /// Steps compared (present on every rank).
    pub steps_compared: usize,
    /// Its mean compute time per step.
    pub mean_compute_us: Us,
    /// Mean compute time per step of the other ranks.
    pub others_mean_compute_us: Us,
    /// Mean communication time per step of the other ranks (where they wait for it).
    pub others_mean_comm_us: Us,
}

/// Why there is no straggler.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum StragglerVerdict {
    /// One rank only.
    OneRank,
    /// No step number every rank has (whole steps only).
    NoSharedStep,
    /// No GPU kernel and no collective in the shared steps: nothing tells who waits for whom.
    NoBasis,
    /// The slowest rank's compute is within 5 % of its step time of the others'.
    Even {
        /// What compute was measured in.
        basis: Basis,
        /// The slowest rank's mean compute per step.
        slowest_us: Us,
        /// The others' mean compute per step.
        others_us: Us,
    },
}

/// The trace-level key kinetrace's writer names a partial step with (kinetrace-core's
/// `PARTIAL_STEP_KEY`).
pub const PARTIAL_STEP_KEY: &str = "kinetrace_partial_step";

/// The step the capture's end cut short, as the trace names it.
pub(crate) fn partial_step(rows: &Rows) -> Option<i64> {
    rows.metadata
        .iter()
        .find(|(k, _)| k == PARTIAL_STEP_KEY)
        // Metadata values are JSON text: the writer's string `"12"` (a bare number reads too).
        .and_then(|(_, v)| v.trim().trim_matches('"').parse().ok())
}

/// `N` when `name` matches `ProfilerStep\s*#\s*(\d+)` at its start.
pub fn step_number(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("ProfilerStep")?.trim_start();
    let rest = rest.strip_prefix('#')?.trim_start();
    let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
    digits.parse().ok()
}

fn union_ns(mut iv: Vec<(i64, i64)>) -> i64 {
    iv.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(i64, i64)> = None;
    for (s, e) in iv {
        match &mut cur {
            Some(c) if s <= c.1 => c.1 = c.1.max(e),
            _ => {
                if let Some(c) = cur {
                    total += c.1 - c.0;
                }
                cur = Some((s, e.max(s)));
            }
        }
    }
    total + cur.map_or(0, |c| c.1 - c.0)
}

/// The steps of one rank, by step number.
pub(crate) fn steps(rank: i64, rows: &Rows, sym: &Symbols, origin_ns: i64) -> Vec<StepRow> {
    let all = &rows.rows;
    let numbers: Vec<Option<i64>> = rows.strings.iter().map(|s| step_number(s)).collect();
    let mut spans: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for r in all.iter().filter(|r| !sym.is_gpu_row(r)) {
        if let Some(n) = numbers[r.name as usize] {
            spans.entry(n).or_insert((r.ts, r.end()));
        }
    }
    if spans.is_empty() {
        return Vec::new();
    }
    let ordered: Vec<(i64, (i64, i64))> = spans.iter().map(|(&n, &s)| (n, s)).collect();
    let step_at = |t: i64| -> Option<i64> {
        ordered
            .iter()
            .rev()
            .find(|(_, (s, e))| *s <= t && t < *e)
            .map(|(n, _)| *n)
    };
    let launchers = |r: &&Row| r.corr != -1 && !sym.is_gpu_row(r);
    // Sized from a count pass: growing it by rehashing cost more (copies, page faults).
    let n = all.iter().filter(launchers).count();
    let mut launch: FastMap<i64, i64> = FastMap::with_capacity_and_hasher(n, Default::default());
    for r in all.iter().filter(launchers) {
        launch.insert(r.corr, r.ts);
    }
    #[derive(Default)]
    struct Acc {
        all: Vec<(i64, i64)>,
        comp: Vec<(i64, i64)>,
        comm: Vec<(i64, i64)>,
    }
    let mut acc: FastMap<i64, Acc> = FastMap::default();
    // Host time in collectives, clipped to the step its row starts in.
    let coll_name: Vec<bool> = rows.strings.iter().map(|s| is_host_collective(s)).collect();
    /// A step's collective intervals, and host time per collective name.
    type Collectives = (Vec<(i64, i64)>, FastMap<u32, i64>);
    let mut coll: FastMap<i64, Collectives> = FastMap::default();
    for r in all
        .iter()
        .filter(|r| coll_name[r.name as usize] && !sym.is_gpu_row(r))
    {
        let Some(n) = step_at(r.ts) else { continue };
        let (_, e) = spans[&n];
        let iv = (r.ts, r.end().min(e));
        let c = coll.entry(n).or_default();
        c.0.push(iv);
        *c.1.entry(r.name).or_default() += iv.1 - iv.0;
    }
    for r in all.iter().filter(|r| r.on_stream_with_corr()) {
        let Some(step) = launch.get(&r.corr).and_then(|&t| step_at(t)) else {
            continue;
        };
        let a = acc.entry(step).or_default();
        let iv = (r.ts, r.end());
        a.all.push(iv);
        match sym.kernel_type[r.name as usize] {
            KernelType::Computation => a.comp.push(iv),
            KernelType::Communication => a.comm.push(iv),
            _ => {}
        }
    }
    let partial = partial_step(rows);
    ordered
        .into_iter()
        .map(|(n, (s, e))| {
            let a = acc.remove(&n).unwrap_or_default();
            let (coll_iv, coll_names) = coll.remove(&n).unwrap_or_default();
            let top = coll_names
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                .map(|(name, _)| rows.strings[name as usize].to_string());
            StepRow {
                collective_us: Us::from_ns(union_ns(coll_iv)),
                collective: top,
                rank,
                cycle: 0,
                step: n,
                partial: partial == Some(n),
                start_ms: (s - origin_ns) as f64 / 1e6,
                step_time_us: Us::from_ns(e - s),
                kernels: a.all.len() as u64,
                gpu_busy_us: Us::from_ns(union_ns(a.all)),
                compute_us: Us::from_ns(union_ns(a.comp)),
                comm_us: Us::from_ns(union_ns(a.comm)),
            }
        })
        .collect()
}

/// The straggler over all ranks' whole steps, or why there is none (see the module docs).
pub(crate) fn straggler(steps: &[StepRow]) -> Result<Straggler, StragglerVerdict> {
    let mut by_step: BTreeMap<i64, Vec<&StepRow>> = BTreeMap::new();
    let mut ranks: Vec<i64> = steps.iter().map(|s| s.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    if ranks.len() < 2 {
        return Err(StragglerVerdict::OneRank);
    }
    for s in steps.iter().filter(|s| !s.partial) {
        by_step.entry(s.step).or_default().push(s);
    }
    let shared: Vec<Vec<&StepRow>> = by_step
        .into_values()
        .filter(|v| v.len() == ranks.len())
        .collect();
    if shared.is_empty() {
        return Err(StragglerVerdict::NoSharedStep);
    }
    let all = || shared.iter().flatten();
    let basis = if all().any(|s| s.kernels > 0) {
        Basis::Gpu
    } else {
        Basis::Cpu
    };
    let no_basis = match basis {
        Basis::Gpu => all().all(|s| s.compute_us.0 == 0.0),
        Basis::Cpu => all().all(|s| s.collective_us.0 == 0.0),
    };
    if no_basis {
        return Err(StragglerVerdict::NoBasis);
    }
    let mut wins: FastMap<i64, usize> = FastMap::default();
    let mut compute: FastMap<i64, f64> = FastMap::default();
    let mut wait: FastMap<i64, f64> = FastMap::default();
    for step in &shared {
        let slowest = step
            .iter()
            .max_by(|a, b| {
                a.compute_on(basis)
                    .total_cmp(&b.compute_on(basis))
                    .then(b.rank.cmp(&a.rank))
            })
            .ok_or(StragglerVerdict::NoSharedStep)?;
        *wins.entry(slowest.rank).or_default() += 1;
        for s in step {
            *compute.entry(s.rank).or_default() += s.compute_on(basis);
            *wait.entry(s.rank).or_default() += s.wait_on(basis);
        }
    }
    let get = |m: &FastMap<i64, f64>, r: i64| m.get(&r).copied().unwrap_or(0.0);
    let rank = *ranks
        .iter()
        .max_by(|a, b| {
            let key = |r: &i64| (wins.get(r).copied().unwrap_or(0), get(&compute, *r));
            let (wa, ca) = key(a);
            let (wb, cb) = key(b);
            wa.cmp(&wb).then(ca.total_cmp(&cb)).then(b.cmp(a))
        })
        .ok_or(StragglerVerdict::OneRank)?;
    let n = shared.len() as f64;
    let others = (ranks.len() - 1) as f64;
    let mut others_compute = 0.0;
    let mut others_comm = 0.0;
    let mut step_time = 0.0;
    let mut wait_names: BTreeMap<&str, usize> = BTreeMap::new();
    for step in &shared {
        for s in step.iter() {
            if s.rank == rank {
                step_time += s.step_time_us.0;
                continue;
            }
            others_compute += s.compute_on(basis);
            others_comm += s.wait_on(basis);
            if let Some(c) = &s.collective {
                *wait_names.entry(c).or_default() += 1;
            }
        }
    }
    let mine = get(&compute, rank) / n;
    let theirs = others_compute / (n * others);
    if mine - theirs <= 0.05 * (step_time / n) {
        return Err(StragglerVerdict::Even {
            basis,
            slowest_us: Us(mine),
            others_us: Us(theirs),
        });
    }
    let waiting_rank = *ranks
        .iter()
        .filter(|&&r| r != rank)
        .max_by(|a, b| get(&wait, **a).total_cmp(&get(&wait, **b)).then(b.cmp(a)))
        .ok_or(StragglerVerdict::OneRank)?;
    let wait_in = match basis {
        Basis::Cpu => wait_names
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
            .map(|(name, _)| name.to_string()),
        Basis::Gpu => None,
    };
    Ok(Straggler {
        rank,
        basis,
        waiting_rank,
        waiting_rank_wait_us: Us(get(&wait, waiting_rank) / n),
        wait_in,
        slowest_in_steps: wins.get(&rank).copied().unwrap_or(0),
        steps_compared: shared.len(),
        mean_compute_us: Us(mine),
        others_mean_compute_us: Us(theirs),
        others_mean_comm_us: Us(others_comm / (n * others)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rank: i64, step: i64, compute: f64, comm: f64) -> StepRow {
        StepRow {
            rank,
            cycle: 0,
            step,
            start_ms: 0.0,
            step_time_us: Us(100.0),
            gpu_busy_us: Us(compute + comm),
            compute_us: Us(compute),
            comm_us: Us(comm),
            kernels: 1,
            partial: false,
            collective_us: Us(0.0),
            collective: None,
        }
    }

    #[test]
    fn step_numbers() {
        assert_eq!(step_number("ProfilerStep#551"), Some(551));
        assert_eq!(step_number("ProfilerStep # 7"), Some(7));
        assert_eq!(step_number("ProfilerStep#"), None);
        assert_eq!(step_number("xProfilerStep#1"), None);
    }

    #[test]
    fn union_merges_overlaps() {
        assert_eq!(union_ns(vec![(0, 10), (5, 15), (20, 25)]), 20);
        assert_eq!(union_ns(vec![]), 0);
    }

    #[test]
    fn straggler_is_the_slowest_rank() {
        let steps = vec![
            row(0, 1, 10.0, 50.0),
            row(1, 1, 40.0, 5.0),
            row(0, 2, 12.0, 45.0),
            row(1, 2, 41.0, 4.0),
            row(0, 3, 50.0, 1.0), // only rank 0 has step 3
        ];
        let s = straggler(&steps).unwrap();
        assert_eq!((s.rank, s.slowest_in_steps, s.steps_compared), (1, 2, 2));
        assert_eq!(s.basis, Basis::Gpu);
        assert_eq!(s.mean_compute_us.0, 40.5);
        assert_eq!(s.others_mean_comm_us.0, 47.5);
        assert_eq!((s.waiting_rank, s.waiting_rank_wait_us.0), (0, 47.5));
        assert_eq!(
            straggler(&steps[..1]).unwrap_err(),
            StragglerVerdict::OneRank
        );
    }
}
