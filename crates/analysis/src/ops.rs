//! The op table, like PyTorch's `key_averages()`: CPU ops, annotations and runtime calls by name,
//! with self CPU time and the GPU time of the kernels they launched.
//!
//! - Self CPU time: an event's duration minus the time of the CPU-side events nested directly in
//!   it on the same thread (`cpu_op`, `user_annotation`, `cuda_runtime`, `cuda_driver`; Python
//!   stack events are not counted as children).
//! - GPU time: a kernel (memcpy, memset) belongs to the op around the runtime call that launched it
//!   (same `correlation`); without such a call, to the CPU op whose `External id` it carries (an
//!   annotation's when no op has it). "Self GPU" is an op's own kernels; "total GPU" adds the
//!   kernels of every op nested in it, so a `ProfilerStep#N` annotation totals its step.

use serde::Serialize;

use crate::fastmap::FastMap;
use crate::hta::Symbols;
use crate::rows::{Row, Rows};
use crate::units::Us;

/// What kind of CPU-side event an op-table entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `cat: cpu_op` (ATen ops and the like).
    CpuOp,
    /// `cat: user_annotation` (`record_function` ranges, `ProfilerStep#N`).
    Annotation,
    /// `cat: cuda_runtime` / `cuda_driver` (also HIP calls on ROCm).
    Runtime,
}

impl OpKind {
    /// Short label for tables.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::CpuOp => "op",
            OpKind::Annotation => "annotation",
            OpKind::Runtime => "runtime",
        }
    }

    fn of_cat(cat: &str) -> Option<OpKind> {
        match cat {
            "cpu_op" => Some(OpKind::CpuOp),
            "user_annotation" => Some(OpKind::Annotation),
            "cuda_runtime" | "cuda_driver" => Some(OpKind::Runtime),
            _ => None,
        }
    }
}

/// One op-table entry: all events of one kind and name (in one rank, or summed over ranks).
#[derive(Clone, Debug, Serialize)]
pub struct OpStat {
    /// Kind.
    pub kind: OpKind,
    /// Name.
    pub name: String,
    /// Number of events.
    pub count: u64,
    /// Sum of durations.
    pub cpu_total_us: Us,
    /// Sum of durations minus directly nested CPU events.
    pub cpu_self_us: Us,
    /// GPU time of the kernels these events launched themselves.
    pub gpu_self_us: Us,
    /// GPU time of the kernels launched by these events or anything nested in them.
    pub gpu_total_us: Us,
}

#[derive(Default, Clone, Copy)]
struct Acc {
    count: u64,
    cpu_total: i64,
    cpu_self: i64,
    gpu_self: i64,
    gpu_total: i64,
}

/// The op table of one rank, in no particular order.
pub(crate) fn op_table(rows: &Rows, sym: &Symbols) -> Vec<OpStat> {
    let all = &rows.rows;
    let kinds: Vec<Option<OpKind>> = rows.strings.iter().map(|s| OpKind::of_cat(s)).collect();
    let kind = |r: &Row| -> Option<OpKind> {
        if sym.is_gpu_row(r) {
            None
        } else {
            kinds[r.cat as usize]
        }
    };
    // Rows of the table, and for each its parent (index into `ops`) and nested CPU time.
    let ops: Vec<u32> = (0..all.len() as u32)
        .filter(|&i| kind(&all[i as usize]).is_some())
        .collect();
    let mut by_thread: FastMap<u32, Vec<usize>> = FastMap::default();
    for (k, &i) in ops.iter().enumerate() {
        by_thread.entry(all[i as usize].thread).or_default().push(k);
    }
    let mut parent: Vec<Option<usize>> = vec![None; ops.len()];
    let mut nested = vec![0i64; ops.len()];
    for (_, mut list) in by_thread {
        let row = |k: usize| &all[ops[k] as usize];
        list.sort_by_key(|&k| (row(k).ts, std::cmp::Reverse(row(k).dur), k));
        let mut stack: Vec<usize> = Vec::new();
        for k in list {
            let r = row(k);
            while stack.last().is_some_and(|&top| row(top).end() <= r.ts) {
                stack.pop();
            }
            if let Some(&top) = stack.last() {
                parent[k] = Some(top);
                nested[top] += (r.end().min(row(top).end()) - r.ts).max(0);
            }
            stack.push(k);
        }
    }
    // GPU time by External id.
    // Maps sized from a count pass: growing them by rehashing cost more (copies, page faults)
    // than counting.
    let owned = ops
        .iter()
        .filter(|&&i| {
            let r = &all[i as usize];
            r.ext != -1 && matches!(kind(r), Some(OpKind::CpuOp | OpKind::Annotation))
        })
        .count();
    let mut owner: FastMap<i64, usize> =
        FastMap::with_capacity_and_hasher(owned, Default::default());
    for (k, &i) in ops.iter().enumerate() {
        let r = &all[i as usize];
        if r.ext == -1 {
            continue;
        }
        match kind(r) {
            Some(OpKind::CpuOp) => {
                owner.insert(r.ext, k);
            }
            Some(OpKind::Annotation) => {
                owner.entry(r.ext).or_insert(k);
            }
            _ => {}
        }
    }
    let runtimes = ops
        .iter()
        .filter(|&&i| {
            let r = &all[i as usize];
            r.corr != -1 && kind(r) == Some(OpKind::Runtime)
        })
        .count();
    let mut runtime_by_corr: FastMap<i64, usize> =
        FastMap::with_capacity_and_hasher(runtimes, Default::default());
    for (k, &i) in ops.iter().enumerate() {
        let r = &all[i as usize];
        if r.corr != -1 && kind(r) == Some(OpKind::Runtime) {
            runtime_by_corr.insert(r.corr, k);
        }
    }
    let mut gpu_self = vec![0i64; ops.len()];
    let mut gpu_total = vec![0i64; ops.len()];
    for r in all.iter().filter(|r| r.on_stream_with_corr()) {
        let launcher = runtime_by_corr
            .get(&r.corr)
            .map(|&rt| parent[rt].unwrap_or(rt))
            .or_else(|| (r.ext != -1).then(|| owner.get(&r.ext).copied()).flatten());
        let Some(k) = launcher else {
            continue;
        };
        gpu_self[k] += r.dur;
        let mut at = Some(k);
        let mut depth = 0;
        while let Some(a) = at {
            gpu_total[a] += r.dur;
            at = parent[a];
            depth += 1;
            if depth > 10_000 {
                break; // malformed nesting; a real stack is far shallower
            }
        }
    }
    let mut acc: FastMap<(OpKind, u32), Acc> = FastMap::default();
    for (k, &i) in ops.iter().enumerate() {
        let r = &all[i as usize];
        let Some(kd) = kind(r) else { continue };
        let a = acc.entry((kd, r.name)).or_default();
        a.count += 1;
        a.cpu_total += r.dur;
        a.cpu_self += (r.dur - nested[k]).max(0);
        a.gpu_self += gpu_self[k];
        a.gpu_total += gpu_total[k];
    }
    acc.into_iter()
        .map(|((kind, name), a)| OpStat {
            kind,
            name: rows.str(name).to_owned(),
            count: a.count,
            cpu_total_us: Us::from_ns(a.cpu_total),
            cpu_self_us: Us::from_ns(a.cpu_self),
            gpu_self_us: Us::from_ns(a.gpu_self),
            gpu_total_us: Us::from_ns(a.gpu_total),
        })
        .collect()
}
