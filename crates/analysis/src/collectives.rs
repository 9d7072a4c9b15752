//! Collectives: one row per (kind, process group, dtype, message size) with count, time, bytes
//! and nccl-tests' algorithm and bus bandwidth; and across ranks, the n-th collective of each
//! process group matched over all ranks, so that each instance splits into its transfer (the
//! shortest rank's time) and each other rank's wait for the last one to arrive.
//!
//! - An instance is one collective kernel (`nccl…`/`rccl…`). What it moved comes from the
//!   kernel's own args (`Collective name`, `In msg nelems`, `Out msg nelems`, `dtype`, `Group
//!   size`, `Process Group Name`; torch copies them there from `record_param_comms`), else from
//!   the op that launched it (`record_param_comms`' args, else a `c10d::` op's tensor shapes),
//!   else only its kind from the kernel name. An instance without a size is still counted and
//!   timed (TraceLens drops it).
//! - Message size S follows nccl-tests: the larger of the input and output buffers (all-gather:
//!   the gathered output; reduce-scatter: the full input). Algorithm bandwidth = S / time; bus
//!   bandwidth = algorithm bandwidth × [`BUS_FACTORS`]. GB/s are decimal (10⁹).
//! - A kernel's duration on one rank includes waiting for the others: a collective finishes
//!   together everywhere, so the rank that arrived last has the shortest kernel. Matched over
//!   ranks, the shortest duration is the transfer and each rank's excess is its wait.

use serde::Serialize;

use crate::efficiency::models::dtype;
use crate::efficiency::{OpArgs, RowKind};
use crate::fastmap::FastMap;
use crate::rows::Rows;
use crate::steps::StepRow;
use crate::units::{Num, Us};

/// How a collective's algorithm bandwidth becomes bus bandwidth (nccl-tests,
/// `doc/PERFORMANCE.md`): the data each rank's link carries relative to S.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BusFactor {
    /// 2(n−1)/n.
    AllReduce,
    /// (n−1)/n.
    Gather,
    /// 1.
    One,
}

impl BusFactor {
    fn of(self, n: i64) -> Option<f64> {
        let n = n as f64;
        match self {
            _ if n < 1.0 => None,
            BusFactor::AllReduce => Some(2.0 * (n - 1.0) / n),
            BusFactor::Gather => Some((n - 1.0) / n),
            BusFactor::One => Some(1.0),
        }
    }
}

/// `(substring of the name lower-cased without `_`, kind, bus factor)`, first match wins: the
/// `Collective name` arg, a `c10d::` op name, or an NCCL kernel name.
pub(crate) const BUS_FACTORS: &[(&str, &str, BusFactor)] = &[
    ("allreduce", "all_reduce", BusFactor::AllReduce),
    ("allgather", "all_gather", BusFactor::Gather),
    ("reducescatter", "reduce_scatter", BusFactor::Gather),
    ("alltoall", "all_to_all", BusFactor::Gather),
    ("broadcast", "broadcast", BusFactor::One),
    ("sendrecv", "send_recv", BusFactor::One),
    ("reduce", "reduce", BusFactor::One),
    ("send", "send", BusFactor::One),
    ("recv", "recv", BusFactor::One),
    ("gather", "gather", BusFactor::One),
    ("scatter", "scatter", BusFactor::One),
    ("barrier", "barrier", BusFactor::One),
];

/// The kind and bus factor of a collective name.
fn kind_of(name: &str) -> Option<(&'static str, BusFactor)> {
    let key: String = name
        .chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    BUS_FACTORS
        .iter()
        .find(|(p, _, _)| key.contains(p))
        .map(|&(_, k, f)| (k, f))
}

/// Whether a kernel is a collective (NCCL/RCCL).
pub(crate) fn is_collective_kernel(name: &str) -> bool {
    let head = name.as_bytes().get(..4);
    head.is_some_and(|h| h.eq_ignore_ascii_case(b"nccl") || h.eq_ignore_ascii_case(b"rccl"))
        || name.contains("cross_device_reduce")
}

/// NCCL's algorithm and protocol in a kernel name: `ncclKernel_AllReduce_RING_LL_Sum_float` →
/// `RING LL`.
fn nccl_algo(name: &str) -> Option<String> {
    let head = name.split('(').next().unwrap_or(name);
    let parts: Vec<&str> = head
        .split('_')
        .filter(|t| {
            matches!(
                *t,
                "RING"
                    | "TREE"
                    | "COLLNET"
                    | "COLLNETDIRECT"
                    | "COLLNETCHAIN"
                    | "NVLS"
                    | "NVLSTREE"
                    | "PAT"
                    | "LL"
                    | "LL128"
                    | "SIMPLE"
            )
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// Where an instance's size and group came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveSource {
    /// The kernel's own args.
    KernelArgs,
    /// `record_param_comms`' args.
    OpArgs,
    /// The launching `c10d::`/`record_param_comms` op's tensor shapes.
    OpShapes,
    /// Only the kernel's name: kind known, size and group unknown.
    KernelName,
}

/// One collective kernel on one rank.
#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub ts: i64,
    pub dur: i64,
    pub kind: &'static str,
    pub factor: BusFactor,
    pub group: String,
    pub dtype: Option<String>,
    /// nccl-tests' S, bytes.
    pub bytes: Option<f64>,
    /// Ranks in the group.
    pub n: Option<i64>,
    pub algo: Option<String>,
    pub source: CollectiveSource,
}

/// The collective args of a kept-args string.
#[derive(Default)]
struct CollArgs {
    name: Option<String>,
    in_n: Option<f64>,
    out_n: Option<f64>,
    dtype: Option<String>,
    group: Option<String>,
    n: Option<i64>,
}

fn coll_args(text: &str) -> Option<CollArgs> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let name = v.get("Collective name")?.as_str()?.to_owned();
    let num = |k: &str| {
        v.get(k).and_then(|x| {
            x.as_f64()
                .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
        })
    };
    let text_of = |k: &str| {
        v.get(k).map(|x| match x.as_str() {
            Some(s) => s.to_owned(),
            None => x.to_string(),
        })
    };
    let ranks = text_of("Process Group Ranks").and_then(|r| {
        let body = r.trim().strip_prefix('[')?.strip_suffix(']')?.to_owned();
        Some(body.split(',').filter(|s| !s.trim().is_empty()).count() as i64)
    });
    let group = match (
        text_of("Process Group Name"),
        text_of("Process Group Description"),
    ) {
        (Some(n), Some(d)) if !d.is_empty() && d != n => Some(format!("{n} ({d})")),
        (Some(n), _) => Some(n),
        (None, _) => text_of("Process Group ID"),
    };
    Some(CollArgs {
        name: Some(name),
        in_n: num("In msg nelems"),
        out_n: num("Out msg nelems"),
        dtype: text_of("dtype"),
        group,
        n: num("Group size").map(|g| g as i64).or(ranks),
    })
}

/// One rank's collective instances, in time order. `world` is `distributedInfo.world_size`,
/// the size of a group the trace does not name.
pub(crate) fn rank_instances(
    rows: &Rows,
    kinds: &[RowKind],
    links: &[(u32, Option<u32>)],
    world: Option<i64>,
) -> Vec<Instance> {
    let mut out = Vec::new();
    let mut parsed: FastMap<u32, Option<CollArgs>> = FastMap::default();
    // Per interned name: 0 not looked at yet, 1 a collective kernel, 2 not one.
    let mut collective = vec![0u8; rows.strings.len()];
    for &(g, op) in links {
        let r = &rows.rows[g as usize];
        if kinds[r.cat as usize] != RowKind::Kernel {
            continue;
        }
        let seen = &mut collective[r.name as usize];
        if *seen == 0 {
            *seen = if is_collective_kernel(rows.str(r.name)) {
                1
            } else {
                2
            };
        }
        if *seen == 2 {
            continue;
        }
        let name = rows.str(r.name);
        let ids = [Some(g), op].map(|row| row.and_then(|row| rows.op_args(row)));
        for id in ids.into_iter().flatten() {
            parsed.entry(id).or_insert_with(|| coll_args(rows.str(id)));
        }
        let args_of = |id: Option<u32>| id.and_then(|id| parsed.get(&id)?.as_ref());
        let (args, source) = match (args_of(ids[0]), args_of(ids[1])) {
            (Some(a), _) => (Some(a), CollectiveSource::KernelArgs),
            (None, Some(a)) => (Some(a), CollectiveSource::OpArgs),
            (None, None) => (None, CollectiveSource::KernelName),
        };
        let from_name = kind_of(name).unwrap_or(("other", BusFactor::One));
        let mut inst = Instance {
            ts: r.ts,
            dur: r.dur.max(0),
            kind: from_name.0,
            factor: from_name.1,
            group: "?".into(),
            dtype: None,
            bytes: None,
            n: None,
            algo: nccl_algo(name),
            source,
        };
        if let Some(a) = args {
            if let Some((k, f)) = a.name.as_deref().and_then(kind_of) {
                (inst.kind, inst.factor) = (k, f);
            }
            inst.dtype = a.dtype.clone();
            let size = a
                .dtype
                .as_deref()
                .and_then(dtype)
                .map(|(s, _)| f64::from(s));
            let elems = match (a.in_n, a.out_n) {
                (Some(i), Some(o)) => Some(i.max(o)),
                (i, o) => i.or(o),
            };
            inst.bytes = elems.zip(size).map(|(e, s)| e * s);
            inst.n = a.n;
            if let Some(g) = &a.group {
                inst.group = g.clone();
            }
        } else if let Some(o) = op {
            // Older traces: the launching op's tensors give the size and dtype.
            let op_name = rows.str(rows.rows[o as usize].name);
            if let Some(args) = rows.op_args(o).and_then(|id| OpArgs::parse(rows.str(id))) {
                let mut best: Option<(f64, String)> = None;
                for x in args.inputs.iter().take(2) {
                    if let crate::efficiency::Input::Tensor { dims, dtype: t } = x {
                        let Some((s, _)) = dtype(t) else { continue };
                        let b =
                            dims.iter().map(|&d| d.max(0) as f64).product::<f64>() * f64::from(s);
                        if best.as_ref().is_none_or(|(bb, _)| b > *bb) {
                            best = Some((b, t.clone()));
                        }
                    }
                }
                if let Some((b, t)) = best {
                    inst.bytes = Some(b);
                    inst.dtype = Some(t);
                    inst.source = CollectiveSource::OpShapes;
                }
            }
            if let Some((k, f)) = kind_of(op_name).filter(|_| op_name.starts_with("c10d::")) {
                (inst.kind, inst.factor) = (k, f);
            }
        }
        if inst.n.is_none() && inst.group == "?" {
            inst.n = world;
        }
        out.push(inst);
    }
    out.sort_by_key(|i| i.ts);
    out
}

/// One (kind, group, dtype, size) row over all ranks.
#[derive(Clone, Debug, Serialize)]
pub struct CollectiveRow {
    /// `all_reduce`, `all_gather`, ...
    pub kind: &'static str,
    /// Process group (`0 (default_pg)`; `?` when the trace does not say).
    pub group: String,
    /// Its dtype, as the trace spells it.
    pub dtype: Option<String>,
    /// Message size S (nccl-tests), bytes; `null` when the trace does not say.
    pub bytes: Option<f64>,
    /// Ranks in the group.
    pub group_size: Option<i64>,
    /// NCCL's algorithm and protocol, from the kernel name (`RING LL`).
    pub algorithm: Option<String>,
    /// Where the size came from.
    pub source: CollectiveSource,
    /// Kernels, over all ranks.
    pub calls: u64,
    /// Their summed durations (each rank's, waiting included).
    pub time_us: Us,
    /// S over the mean duration, GB/s.
    pub algbw_gb_s: Num,
    /// Algorithm bandwidth × the bus factor, GB/s.
    pub busbw_gb_s: Num,
    /// Instances matched across ranks.
    pub matched: u64,
    /// Their transfer time: per instance the shortest rank's duration, summed.
    pub transfer_us: Us,
    /// S over the mean transfer time, GB/s (the collective's own speed, without waiting).
    pub transfer_algbw_gb_s: Num,
    /// The same as bus bandwidth, GB/s.
    pub transfer_busbw_gb_s: Num,
    /// Ranks it ran on.
    pub ranks: Vec<i64>,
}

/// What waiting in collectives cost one rank.
#[derive(Clone, Debug, Serialize)]
pub struct RankWait {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle.
    pub cycle: u32,
    /// Its collective kernels.
    pub collectives: u64,
    /// Of them, matched with the other ranks'.
    pub matched: u64,
    /// Time its matched collectives spent waiting for the last rank to arrive.
    pub wait_us: Us,
    /// That per step (per trace without steps).
    pub wait_per_step_us: Us,
    /// Its share of the rank's mean step time.
    pub wait_share: Num,
    /// The rank it waited for longest.
    pub waited_for: Option<i64>,
    /// Matched instances where this rank was the last to arrive.
    pub last_count: u64,
    /// The other ranks' wait in those instances.
    pub caused_wait_us: Us,
}

/// The rank the others wait for in collectives.
#[derive(Clone, Debug, Serialize)]
pub struct CollectiveStraggler {
    /// The rank.
    pub rank: i64,
    /// The rank's cycle.
    pub cycle: u32,
    /// Matched instances where it arrived last.
    pub last_count: u64,
    /// Matched instances.
    pub matched: u64,
    /// The other ranks' median wait per step.
    pub others_wait_per_step_us: Us,
    /// That as a share of their median step time.
    pub others_wait_share: Num,
}

/// The collectives section of the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Collectives {
    /// One row per kind, group, dtype and size.
    pub rows: Vec<CollectiveRow>,
    /// Per rank and cycle, with two or more ranks.
    pub waits: Vec<RankWait>,
    /// The rank the others wait for, when one stands out (last in at least 60% of the matched
    /// instances).
    pub straggler: Option<CollectiveStraggler>,
    /// What the reader should know.
    pub notes: Vec<String>,
    /// The matched instances with the longest wait on one rank, longest first (for doctor's
    /// examples).
    #[serde(skip)]
    pub(crate) worst_waits: Vec<WorstWait>,
}

/// One rank's wait in one matched instance.
#[derive(Clone, Debug)]
pub(crate) struct WorstWait {
    pub rank: i64,
    pub cycle: u32,
    pub kind: &'static str,
    pub ts: i64,
    pub dur: i64,
    pub wait: i64,
    pub last: i64,
}

/// How many [`WorstWait`]s are kept.
const WORST: usize = 3;

type RowKey = (
    &'static str,
    String,
    Option<String>,
    Option<u64>,
    Option<i64>,
);

fn row_key(i: &Instance) -> RowKey {
    (
        i.kind,
        i.group.clone(),
        i.dtype.clone(),
        i.bytes.map(f64::to_bits),
        i.n,
    )
}

/// Combines the ranks' instances; `steps` (all ranks) give the per-step cost of waiting.
pub(crate) fn merge(ranks: Vec<(i64, u32, Vec<Instance>)>, steps: &[StepRow]) -> Collectives {
    let mut out = Collectives::default();
    let mut rows: FastMap<RowKey, CollectiveRow> = FastMap::default();
    let mut without_size = 0u64;
    for (rank, _, list) in &ranks {
        for i in list {
            without_size += u64::from(i.bytes.is_none());
            let r = rows.entry(row_key(i)).or_insert_with(|| CollectiveRow {
                kind: i.kind,
                group: i.group.clone(),
                dtype: i.dtype.clone(),
                bytes: i.bytes,
                group_size: i.n,
                algorithm: i.algo.clone(),
                source: i.source,
                calls: 0,
                time_us: Us(0.0),
                algbw_gb_s: Num(f64::NAN),
                busbw_gb_s: Num(f64::NAN),
                matched: 0,
                transfer_us: Us(0.0),
                transfer_algbw_gb_s: Num(f64::NAN),
                transfer_busbw_gb_s: Num(f64::NAN),
                ranks: Vec::new(),
            });
            r.calls += 1;
            r.time_us.0 += i.dur as f64 / 1000.0;
            if !r.ranks.contains(rank) {
                r.ranks.push(*rank);
            }
        }
    }
    if without_size > 0 {
        out.notes.push(format!(
            "{without_size} collective kernel{} without a message size (no collective args on \
             the kernel or its `record_param_comms`, no shapes on its `c10d::` op): counted and \
             timed, no bandwidth",
            if without_size == 1 { "" } else { "s" }
        ));
    }

    // Across ranks: the n-th instance of each (cycle, group) on every rank that has the group.
    // (cycle, group) → each rank with the group and its instances.
    type Members<'a> = Vec<(i64, &'a Vec<Instance>)>;
    let mut by_group: FastMap<(u32, String), Members<'_>> = FastMap::default();
    let distinct_ranks = {
        let mut r: Vec<i64> = ranks.iter().map(|(r, _, _)| *r).collect();
        r.sort_unstable();
        r.dedup();
        r.len()
    };
    for (rank, cycle, list) in &ranks {
        let mut groups: Vec<&str> = list.iter().map(|i| i.group.as_str()).collect();
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            by_group
                .entry((*cycle, g.to_owned()))
                .or_default()
                .push((*rank, list));
        }
    }
    #[derive(Default, Clone)]
    struct W {
        collectives: u64,
        matched: u64,
        wait: i64,
        last: u64,
        caused: i64,
        waited_for: FastMap<i64, i64>,
    }
    let mut waits: FastMap<(i64, u32), W> = FastMap::default();
    for (rank, cycle, list) in &ranks {
        waits.entry((*rank, *cycle)).or_default().collectives += list.len() as u64;
    }
    let mut total_matched = 0u64;
    let mut keys: Vec<&(u32, String)> = by_group.keys().collect();
    keys.sort();
    let keys: Vec<(u32, String)> = keys.into_iter().cloned().collect();
    for key in keys {
        let members = &by_group[&key];
        if members.len() < 2 {
            continue;
        }
        let (cycle, group) = key;
        let seqs: Vec<(i64, Vec<&Instance>)> = members
            .iter()
            .map(|(r, l)| (*r, l.iter().filter(|i| i.group == group).collect()))
            .collect();
        let n = seqs.iter().map(|(_, s)| s.len()).min().unwrap_or(0);
        let longest = seqs.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
        if longest != n {
            out.notes.push(format!(
                "process group {group}: the ranks have {n} to {longest} collectives in the trace; \
                 the first {n} are matched"
            ));
        }
        for k in 0..n {
            let kinds: Vec<&str> = seqs.iter().map(|(_, s)| s[k].kind).collect();
            if kinds.iter().any(|&x| x != kinds[0]) {
                out.notes.push(format!(
                    "process group {group}: the ranks' collective #{k} differ ({}); matching \
                     stops there",
                    seqs.iter()
                        .map(|(r, s)| format!("rank {r}: {}", s[k].kind))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                break;
            }
            let (last_rank, transfer) = seqs
                .iter()
                .map(|(r, s)| (*r, s[k].dur))
                .min_by_key(|&(r, d)| (d, r))
                .expect("two or more ranks");
            total_matched += 1;
            let mut caused = 0;
            for (r, s) in &seqs {
                let w = s[k].dur - transfer;
                if w > 0 {
                    out.worst_waits.push(WorstWait {
                        rank: *r,
                        cycle,
                        kind: s[k].kind,
                        ts: s[k].ts,
                        dur: s[k].dur,
                        wait: w,
                        last: last_rank,
                    });
                    out.worst_waits
                        .sort_by(|a, b| b.wait.cmp(&a.wait).then(a.ts.cmp(&b.ts)));
                    out.worst_waits.truncate(WORST);
                }
                let e = waits.entry((*r, cycle)).or_default();
                e.matched += 1;
                e.wait += w;
                if *r != last_rank {
                    caused += w;
                    *e.waited_for.entry(last_rank).or_default() += w;
                }
            }
            let e = waits.entry((last_rank, cycle)).or_default();
            e.last += 1;
            e.caused += caused;
            let first = seqs[0].1[k];
            if let Some(row) = rows.get_mut(&row_key(first)) {
                row.matched += 1;
                row.transfer_us.0 += transfer as f64 / 1000.0;
            }
        }
    }
    if distinct_ranks == 1 && !rows.is_empty() {
        out.notes.push(
            "collectives of one rank: each kernel's time includes waiting for the other ranks; \
             analyze all ranks' traces together for the transfer time and its bandwidth"
                .into(),
        );
    }
    for r in rows.values_mut() {
        let factor = BUS_FACTORS
            .iter()
            .find(|(_, k, _)| *k == r.kind)
            .map_or(BusFactor::One, |&(_, _, f)| f);
        let fac = r.group_size.and_then(|n| factor.of(n));
        if let Some(s) = r.bytes {
            // bytes / µs = 10⁶ B/s; GB/s = 10⁹ B/s.
            r.algbw_gb_s = Num::ratio(s * r.calls as f64 / 1e3, r.time_us.0);
            r.busbw_gb_s = Num(fac.map_or(f64::NAN, |f| r.algbw_gb_s.0 * f));
            if r.matched > 0 {
                r.transfer_algbw_gb_s = Num::ratio(s * r.matched as f64 / 1e3, r.transfer_us.0);
                r.transfer_busbw_gb_s = Num(fac.map_or(f64::NAN, |f| r.transfer_algbw_gb_s.0 * f));
            }
        }
        r.time_us = Us((r.time_us.0 * 1000.0).round() / 1000.0);
        r.transfer_us = Us((r.transfer_us.0 * 1000.0).round() / 1000.0);
    }
    out.rows = rows.into_values().collect();
    out.rows.sort_by(|a, b| {
        b.time_us
            .0
            .total_cmp(&a.time_us.0)
            .then_with(|| (a.kind, &a.group).cmp(&(b.kind, &b.group)))
    });

    if total_matched == 0 {
        return out;
    }
    // Per-step cost: each rank's steps (or the whole trace).
    let mut step_stats: FastMap<(i64, u32), (u64, f64)> = FastMap::default();
    for s in steps {
        let e = step_stats.entry((s.rank, s.cycle)).or_default();
        e.0 += 1;
        e.1 += s.step_time_us.0;
    }
    let mut list: Vec<((i64, u32), W)> = waits.into_iter().collect();
    list.sort_by_key(|(k, _)| *k);
    for ((rank, cycle), w) in list {
        let (n_steps, step_total) = step_stats.get(&(rank, cycle)).copied().unwrap_or((0, 0.0));
        let per = w.wait as f64 / 1000.0 / n_steps.max(1) as f64;
        out.waits.push(RankWait {
            rank,
            cycle,
            collectives: w.collectives,
            matched: w.matched,
            wait_us: Us::from_ns(w.wait),
            wait_per_step_us: Us((per * 1000.0).round() / 1000.0),
            wait_share: if n_steps > 0 {
                Num::ratio(per, step_total / n_steps as f64)
            } else {
                Num(f64::NAN)
            },
            waited_for: w
                .waited_for
                .iter()
                .max_by_key(|(r, ns)| (**ns, -**r))
                .filter(|(_, ns)| **ns > 0)
                .map(|(r, _)| *r),
            last_count: w.last,
            caused_wait_us: Us::from_ns(w.caused),
        });
    }
    out.straggler = straggler(&out.waits);
    out
}

/// The rank last to arrive in at least 60% of its matched instances, with the others' median
/// wait per step.
fn straggler(waits: &[RankWait]) -> Option<CollectiveStraggler> {
    let s = waits
        .iter()
        .filter(|w| w.matched >= 2)
        .max_by_key(|w| (w.last_count, -w.rank))?;
    if (s.last_count as f64) < 0.6 * s.matched as f64 {
        return None;
    }
    let mut others: Vec<&RankWait> = waits
        .iter()
        .filter(|w| w.cycle == s.cycle && w.rank != s.rank)
        .collect();
    if others.is_empty() {
        return None;
    }
    others.sort_by(|a, b| a.wait_per_step_us.0.total_cmp(&b.wait_per_step_us.0));
    let mid = others[others.len() / 2];
    Some(CollectiveStraggler {
        rank: s.rank,
        cycle: s.cycle,
        last_count: s.last_count,
        matched: s.matched,
        others_wait_per_step_us: mid.wait_per_step_us,
        others_wait_share: mid.wait_share,
    })
}
