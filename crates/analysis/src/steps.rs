//! Step times per rank (one row per `ProfilerStep#N`) and the straggler rank.
//!
//! A step is a CPU row named `ProfilerStep#N` (HTA's regex `ProfilerStep\s*#\s*(\d+)`, matched
//! at the start). Its time is the annotation's duration. A kernel (memcpy, memset) belongs to the
//! step in which the CPU call that launched it (same `correlation`) started. Per step and rank:
//! GPU busy time (union of all its kernels), compute time (union of computation kernels) and
//! communication time (union of communication kernels), all on exact timestamps.
//!
//! The straggler: in a step every rank took part in, the rank with the most compute time keeps the
//! others waiting inside their collectives. The straggler rank is the one that is slowest in the
//! most steps (ties: the larger total compute).

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
}

/// The straggler rank over the steps all ranks share.
#[derive(Clone, Debug, Serialize)]
pub struct Straggler {
    /// The rank.
    pub rank: i64,
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
    ordered
        .into_iter()
        .map(|(n, (s, e))| {
            let a = acc.remove(&n).unwrap_or_default();
            StepRow {
                rank,
                cycle: 0,
                step: n,
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

/// The straggler over all ranks' steps; `None` with fewer than two ranks or no shared step.
pub(crate) fn straggler(steps: &[StepRow]) -> Option<Straggler> {
    let mut by_step: BTreeMap<i64, Vec<&StepRow>> = BTreeMap::new();
    let mut ranks: Vec<i64> = steps.iter().map(|s| s.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    if ranks.len() < 2 {
        return None;
    }
    for s in steps {
        by_step.entry(s.step).or_default().push(s);
    }
    let shared: Vec<Vec<&StepRow>> = by_step
        .into_values()
        .filter(|v| v.len() == ranks.len())
        .collect();
    if shared.is_empty() {
        return None;
    }
    let mut wins: FastMap<i64, usize> = FastMap::default();
    let mut compute: FastMap<i64, f64> = FastMap::default();
    for step in &shared {
        let slowest = step.iter().max_by(|a, b| {
            a.compute_us
                .0
                .total_cmp(&b.compute_us.0)
                .then(b.rank.cmp(&a.rank))
        })?;
        *wins.entry(slowest.rank).or_default() += 1;
        for s in step {
            *compute.entry(s.rank).or_default() += s.compute_us.0;
        }
    }
    let rank = *ranks.iter().max_by(|a, b| {
        let key = |r: &i64| {
            (
                wins.get(r).copied().unwrap_or(0),
                compute.get(r).copied().unwrap_or(0.0),
            )
        };
        let (wa, ca) = key(a);
        let (wb, cb) = key(b);
        wa.cmp(&wb).then(ca.total_cmp(&cb)).then(b.cmp(a))
    })?;
    let n = shared.len() as f64;
    let others = (ranks.len() - 1) as f64;
    let mut others_compute = 0.0;
    let mut others_comm = 0.0;
    for step in &shared {
        for s in step.iter().filter(|s| s.rank != rank) {
            others_compute += s.compute_us.0;
            others_comm += s.comm_us.0;
        }
    }
    Some(Straggler {
        rank,
        slowest_in_steps: wins.get(&rank).copied().unwrap_or(0),
        steps_compared: shared.len(),
        mean_compute_us: Us(compute.get(&rank).copied().unwrap_or(0.0) / n),
        others_mean_compute_us: Us(others_compute / (n * others)),
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
        assert_eq!(s.mean_compute_us.0, 40.5);
        assert_eq!(s.others_mean_comm_us.0, 47.5);
        assert!(straggler(&steps[..1]).is_none());
    }
}
