//! Which op launched each GPU row: through the row's own `External id`, else through the runtime
//! call with its `correlation` (that call's `External id`, else the innermost `cpu_op` around the
//! call on its thread). `ac2g` flows are never needed (TraceLens links only through them, and
//! drops every GPU row of a trace without flows).

use crate::fastmap::FastMap;
use crate::rows::{Row, Rows};

/// What a row is, by its `cat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowKind {
    Kernel,
    Memcpy,
    Memset,
    CpuOp,
    Runtime,
    Other,
}

impl RowKind {
    pub fn of_cat(cat: &str) -> RowKind {
        match cat {
            "kernel" | "Kernel" => RowKind::Kernel,
            "gpu_memcpy" | "Memcpy" => RowKind::Memcpy,
            "gpu_memset" | "Memset" => RowKind::Memset,
            "cpu_op" | "Operator" => RowKind::CpuOp,
            "cuda_runtime" | "cuda_driver" | "Runtime" => RowKind::Runtime,
            _ => RowKind::Other,
        }
    }

    pub fn is_gpu(self) -> bool {
        matches!(self, RowKind::Kernel | RowKind::Memcpy | RowKind::Memset)
    }
}

/// The kind of each interned string used as a `cat`.
pub(crate) fn cat_kinds(rows: &Rows) -> Vec<RowKind> {
    rows.strings.iter().map(|s| RowKind::of_cat(s)).collect()
}

/// How many ops before a runtime call are looked at for the one around it: ops nest, so the
/// innermost op around a call is the last one started before it that has not ended; a long run
/// of finished siblings in between is cut short (the call then has no op).
const ENCLOSING_SCAN: usize = 256;

/// An External id no op has (yet).
const NO_OP: u32 = u32::MAX;

/// `(GPU row, op row)` for every GPU row, the op `None` when nothing links it.
pub(crate) fn launching_ops(rows: &Rows, kinds: &[RowKind]) -> Vec<(u32, Option<u32>)> {
    let all = &rows.rows;
    let kind = |r: &Row| kinds[r.cat as usize];
    let gpu: Vec<u32> = (0..all.len() as u32)
        .filter(|&i| kind(&all[i as usize]).is_gpu())
        .collect();
    if gpu.is_empty() {
        return Vec::new();
    }
    // The External ids wanted (the GPU rows' own), then one pass over the ops for them: a trace
    // has several times more ops than launches, and a lookup costs less than an insert.
    let mut by_ext: FastMap<i64, u32> =
        FastMap::with_capacity_and_hasher(gpu.len(), Default::default());
    for &g in &gpu {
        let e = all[g as usize].ext;
        if e != -1 {
            by_ext.insert(e, NO_OP);
        }
    }
    let fill = |by_ext: &mut FastMap<i64, u32>| {
        for (i, r) in all.iter().enumerate() {
            if r.ext != -1 && kind(r) == RowKind::CpuOp {
                if let Some(slot) = by_ext.get_mut(&r.ext) {
                    *slot = i as u32;
                }
            }
        }
    };
    fill(&mut by_ext);
    let op_of = |by_ext: &FastMap<i64, u32>, e: i64| -> Option<u32> {
        if e == -1 {
            return None;
        }
        by_ext.get(&e).copied().filter(|&o| o != NO_OP)
    };
    let mut out: Vec<(u32, Option<u32>)> = gpu
        .iter()
        .map(|&g| (g, op_of(&by_ext, all[g as usize].ext)))
        .collect();
    if out.iter().all(|(_, op)| op.is_some()) {
        return out;
    }
    // Some rows carry no (known) External id: go through their runtime call, whose External id
    // joins the wanted ones.
    let mut by_corr: FastMap<i64, u32> = FastMap::default();
    for (i, r) in all.iter().enumerate() {
        if r.corr != -1 && kind(r) == RowKind::Runtime {
            by_corr.insert(r.corr, i as u32);
        }
    }
    let call_of = |r: &Row| {
        (r.corr != -1)
            .then(|| by_corr.get(&r.corr).copied())
            .flatten()
    };
    let mut more = false;
    for &(g, op) in &out {
        if op.is_some() {
            continue;
        }
        if let Some(call) = call_of(&all[g as usize]) {
            let e = all[call as usize].ext;
            if e != -1 && !by_ext.contains_key(&e) {
                by_ext.insert(e, NO_OP);
                more = true;
            }
        }
    }
    if more {
        fill(&mut by_ext);
    }
    let mut per_thread: Option<FastMap<u32, Vec<u32>>> = None;
    for (g, op) in &mut out {
        if op.is_some() {
            continue;
        }
        let Some(call) = call_of(&all[*g as usize]) else {
            continue;
        };
        let c = &all[call as usize];
        if let Some(o) = op_of(&by_ext, c.ext) {
            *op = Some(o);
            continue;
        }
        let threads = per_thread.get_or_insert_with(|| {
            let mut m: FastMap<u32, Vec<u32>> = FastMap::default();
            for (i, r) in all.iter().enumerate() {
                if kind(r) == RowKind::CpuOp {
                    m.entry(r.thread).or_default().push(i as u32);
                }
            }
            for list in m.values_mut() {
                list.sort_by_key(|&i| (all[i as usize].ts, std::cmp::Reverse(all[i as usize].dur)));
            }
            m
        });
        if let Some(list) = threads.get(&c.thread) {
            let k = list.partition_point(|&i| all[i as usize].ts <= c.ts);
            *op = list[..k]
                .iter()
                .rev()
                .take(ENCLOSING_SCAN)
                .find(|&&i| all[i as usize].end() >= c.end())
                .copied();
        }
    }
    out
}
