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
//! - Memory (`[memory]` events, torch.profiler's `profile_memory=True`): an allocation (positive
//!   `Bytes`) or free (negative) belongs to the innermost op open on its thread at its time; "self"
//!   is an op's own, "total" adds the ops nested in it, each split into CPU (`Device Id` −1) and
//!   GPU, as `key_averages()`' CPU Mem / Self CPU Mem / CUDA Mem / Self CUDA Mem.
//! - With `by_shape`, ops are also told apart by their `Input Dims` (`key_averages(
//!   group_by_input_shape=True)`); ops recorded without shapes have none.
//!
//! Averages and percentages over the whole table are filled in when the ranks are combined
//! ([`fill_shares`]).

use serde::Serialize;

use crate::fastmap::FastMap;
use crate::hta::Symbols;
use crate::rows::{Row, Rows};
use crate::units::{Num, Us};

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
    /// `Input Dims` when the table is grouped by shape (`None`: not grouped, or recorded without).
    pub shape: Option<String>,
    /// Total CPU time per call (`key_averages`' CPU time avg).
    pub cpu_avg_us: Us,
    /// Total GPU time per call.
    pub gpu_avg_us: Us,
    /// Self CPU time as a share of the whole table's self CPU time, in %.
    pub cpu_self_pct: Num,
    /// Total CPU time as a share of the whole table's self CPU time, in % (as `key_averages`).
    pub cpu_total_pct: Num,
    /// Self GPU time as a share of the whole table's self GPU time, in % (`null` without GPU).
    pub gpu_self_pct: Num,
    /// Total GPU time as a share of the whole table's self GPU time, in %.
    pub gpu_total_pct: Num,
    /// CPU memory allocated minus freed by these events themselves, bytes.
    pub cpu_mem_self_bytes: i64,
    /// The same with everything nested in them.
    pub cpu_mem_bytes: i64,
    /// GPU memory allocated minus freed by these events themselves, bytes.
    pub gpu_mem_self_bytes: i64,
    /// The same with everything nested in them.
    pub gpu_mem_bytes: i64,
}

/// Fills the averages and the shares of the whole table (`ops`: every rank's entries combined).
pub(crate) fn fill_shares(ops: &mut [OpStat]) {
    let cpu: f64 = ops.iter().map(|o| o.cpu_self_us.0).sum();
    let gpu: f64 = ops.iter().map(|o| o.gpu_self_us.0).sum();
    for o in ops {
        let n = o.count.max(1) as f64;
        o.cpu_avg_us = Us(o.cpu_total_us.0 / n);
        o.gpu_avg_us = Us(o.gpu_total_us.0 / n);
        o.cpu_self_pct = Num::ratio(100.0 * o.cpu_self_us.0, cpu);
        o.cpu_total_pct = Num::ratio(100.0 * o.cpu_total_us.0, cpu);
        o.gpu_self_pct = Num::ratio(100.0 * o.gpu_self_us.0, gpu);
        o.gpu_total_pct = Num::ratio(100.0 * o.gpu_total_us.0, gpu);
    }
}

#[derive(Default, Clone, Copy)]
struct Acc {
    count: u64,
    cpu_total: i64,
    cpu_self: i64,
    gpu_self: i64,
    gpu_total: i64,
    mem: [i64; 4],
}

/// Memory slots of [`Acc::mem`]: CPU self, CPU total, GPU self, GPU total.
const CPU_SELF: usize = 0;
const CPU_TOTAL: usize = 1;
const GPU_SELF: usize = 2;
const GPU_TOTAL: usize = 3;

/// The op table of one rank, in no particular order; by `Input Dims` too with `by_shape`.
pub(crate) fn op_table(rows: &Rows, sym: &Symbols, by_shape: bool) -> Vec<OpStat> {
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
    let row = |k: usize| &all[ops[k] as usize];
    let mut sorted: Vec<(u32, Vec<usize>)> = Vec::new();
    for (thread, mut list) in by_thread {
        list.sort_by_key(|&k| (row(k).ts, std::cmp::Reverse(row(k).dur), k));
        let mut stack: Vec<usize> = Vec::new();
        for &k in &list {
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
        sorted.push((thread, list));
    }
    let mem = memory_by_op(rows, &sorted, &parent, &row);
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
    let mut shapes = Shapes::default();
    let mut acc: FastMap<(OpKind, u32, u32), Acc> = FastMap::default();
    for (k, &i) in ops.iter().enumerate() {
        let r = &all[i as usize];
        let Some(kd) = kind(r) else { continue };
        let dims = if by_shape {
            rows.op_args(i).map_or(NO_SHAPE, |id| shapes.of(rows, id))
        } else {
            NO_SHAPE
        };
        let a = acc.entry((kd, r.name, dims)).or_default();
        a.count += 1;
        a.cpu_total += r.dur;
        a.cpu_self += (r.dur - nested[k]).max(0);
        a.gpu_self += gpu_self[k];
        a.gpu_total += gpu_total[k];
        if let Some(m) = mem.get(k) {
            for (slot, v) in a.mem.iter_mut().zip(m) {
                *slot += v;
            }
        }
    }
    acc.into_iter()
        .map(|((kind, name, dims), a)| OpStat {
            kind,
            name: rows.str(name).to_owned(),
            count: a.count,
            cpu_total_us: Us::from_ns(a.cpu_total),
            cpu_self_us: Us::from_ns(a.cpu_self),
            gpu_self_us: Us::from_ns(a.gpu_self),
            gpu_total_us: Us::from_ns(a.gpu_total),
            shape: shapes.text(dims).map(str::to_owned),
            cpu_avg_us: Us(0.0),
            gpu_avg_us: Us(0.0),
            cpu_self_pct: Num(f64::NAN),
            cpu_total_pct: Num(f64::NAN),
            gpu_self_pct: Num(f64::NAN),
            gpu_total_pct: Num(f64::NAN),
            cpu_mem_self_bytes: a.mem[CPU_SELF],
            cpu_mem_bytes: a.mem[CPU_TOTAL],
            gpu_mem_self_bytes: a.mem[GPU_SELF],
            gpu_mem_bytes: a.mem[GPU_TOTAL],
        })
        .collect()
}

/// No `Input Dims` (an op recorded without shapes, or a table not grouped by shape).
const NO_SHAPE: u32 = u32::MAX;

/// The `Input Dims` of ops' args texts ([`Rows::op_args`]), each text read once: an op's shape is
/// its `Input Dims` alone, as `key_averages(group_by_input_shape=True)` keys on `input_shapes`
/// (ops differing only in dtype, strides or concrete inputs share a row), written as PyTorch
/// writes it (`[[64, 16], [16]]`).
#[derive(Default)]
struct Shapes {
    /// Args text id → index into `texts` (or [`NO_SHAPE`]).
    by_args: FastMap<u32, u32>,
    by_text: FastMap<String, u32>,
    texts: Vec<String>,
}

impl Shapes {
    fn of(&mut self, rows: &Rows, args: u32) -> u32 {
        if let Some(&s) = self.by_args.get(&args) {
            return s;
        }
        let dims = serde_json::from_str::<serde_json::Value>(rows.str(args))
            .ok()
            .and_then(|v| v.get("Input Dims").map(python_text));
        let s = match dims {
            None => NO_SHAPE,
            Some(text) => {
                let next = self.texts.len() as u32;
                *self.by_text.entry(text).or_insert_with_key(|t| {
                    self.texts.push(t.clone());
                    next
                })
            }
        };
        self.by_args.insert(args, s);
        s
    }

    fn text(&self, shape: u32) -> Option<&str> {
        self.texts.get(shape as usize).map(String::as_str)
    }
}

/// A JSON value as Python's `str()` of the same lists prints it (`json.dumps`' separators): one
/// space after each comma.
fn python_text(v: &serde_json::Value) -> String {
    fn write(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Array(items) => {
                out.push('[');
                for (n, item) in items.iter().enumerate() {
                    if n > 0 {
                        out.push_str(", ");
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// Per op (index into the op list), the `[memory]` bytes of [`Acc::mem`]'s slots: each sample
/// goes to the innermost op open on its thread at its time (self) and to every op around it
/// (total). `sorted`: each thread's ops by start, longest first; empty without samples.
fn memory_by_op<'a>(
    rows: &Rows,
    sorted: &[(u32, Vec<usize>)],
    parent: &[Option<usize>],
    row: &impl Fn(usize) -> &'a Row,
) -> Vec<[i64; 4]> {
    if rows.mem.is_empty() {
        return Vec::new();
    }
    let mut out = vec![[0i64; 4]; parent.len()];
    let mut samples: FastMap<u32, Vec<(i64, i64, bool)>> = FastMap::default();
    for m in rows.mem.iter().filter(|m| m.bytes != 0) {
        samples
            .entry(m.thread)
            .or_default()
            .push((m.ts, m.bytes, m.device >= 0));
    }
    for (thread, list) in sorted {
        let Some(mine) = samples.get_mut(thread) else {
            continue;
        };
        mine.sort_by_key(|s| s.0);
        let mut stack: Vec<usize> = Vec::new();
        let mut next = 0;
        for &(t, bytes, gpu) in mine.iter() {
            while next < list.len() && row(list[next]).ts <= t {
                let k = list[next];
                while stack.last().is_some_and(|&top| row(top).end() <= row(k).ts) {
                    stack.pop();
                }
                stack.push(k);
                next += 1;
            }
            while stack.last().is_some_and(|&top| row(top).end() < t) {
                stack.pop();
            }
            let Some(&k) = stack.last() else { continue };
            let (own, total) = if gpu {
                (GPU_SELF, GPU_TOTAL)
            } else {
                (CPU_SELF, CPU_TOTAL)
            };
            out[k][own] += bytes;
            let mut at = Some(k);
            let mut depth = 0;
            while let Some(a) = at {
                out[a][total] += bytes;
                at = parent[a];
                depth += 1;
                if depth > 10_000 {
                    break; // malformed nesting; a real stack is far shallower
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::load_rows;
    use serde_json::{json, Value};

    fn rows_of(events: Vec<Value>) -> Rows {
        let doc = serde_json::to_vec(&json!({"traceEvents": events})).unwrap();
        load_rows(
            std::path::Path::new("t.json"),
            &doc[..],
            &Default::default(),
        )
        .unwrap()
    }

    fn op(name: &str, tid: i64, ts: i64, dur: i64, dims: Option<Value>) -> Value {
        let mut args = json!({});
        if let Some(d) = dims {
            args["Input Dims"] = d;
        }
        json!({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args})
    }

    fn mem(tid: i64, ts: i64, bytes: i64, device: i64) -> Value {
        json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
               "tid": tid, "ts": ts, "args": {"Bytes": bytes, "Total Allocated": 0,
               "Total Reserved": 0, "Device Id": device, "Device Type": if device < 0 { 0 } else { 1 }}})
    }

    fn table(rows: &Rows, by_shape: bool) -> Vec<OpStat> {
        let mut t = op_table(rows, &Symbols::new(rows), by_shape);
        fill_shares(&mut t);
        t.sort_by(|a, b| (&a.name, &a.shape).cmp(&(&b.name, &b.shape)));
        t
    }

    /// An allocation belongs to the innermost op open on its thread (self) and to every op around
    /// it (total); a free counts negative; GPU memory apart from CPU memory; another thread's
    /// samples go to that thread's ops.
    #[test]
    fn memory_goes_to_the_innermost_op_and_to_those_around_it() {
        let rows = rows_of(vec![
            op("aten::linear", 1, 100, 100, None),
            op("aten::addmm", 1, 110, 50, None),
            op("aten::empty", 1, 120, 5, None),
            mem(1, 105, 1000, -1),
            mem(1, 122, 4096, -1),
            mem(1, 130, 512, 0),
            mem(1, 150, -1000, -1),
            op("aten::copy_", 2, 110, 20, None),
            mem(2, 115, 64, -1),
            // Outside every op: nobody's.
            mem(1, 500, 7, -1),
        ]);
        let t = table(&rows, false);
        let get = |name: &str| t.iter().find(|o| o.name == name).unwrap();
        let m = |o: &OpStat| {
            (
                o.cpu_mem_self_bytes,
                o.cpu_mem_bytes,
                o.gpu_mem_self_bytes,
                o.gpu_mem_bytes,
            )
        };
        assert_eq!(m(get("aten::empty")), (4096, 4096, 0, 0));
        assert_eq!(m(get("aten::addmm")), (-1000, 3096, 512, 512));
        assert_eq!(m(get("aten::linear")), (1000, 4096, 0, 512));
        assert_eq!(m(get("aten::copy_")), (64, 64, 0, 0));
    }

    /// Grouped by shape, the same op with other `Input Dims` is another row; averages and shares
    /// are of the whole table, as `key_averages()` computes them.
    #[test]
    fn grouping_by_shape_and_the_shares_of_the_table() {
        let rows = rows_of(vec![
            op("aten::mm", 1, 0, 30, Some(json!([[64, 16], [16, 32]]))),
            op("aten::mm", 1, 100, 10, Some(json!([[16, 1], [1, 64]]))),
            op("aten::mm", 1, 200, 20, Some(json!([[64, 16], [16, 32]]))),
            op("aten::relu", 1, 300, 40, None),
        ]);
        let plain = table(&rows, false);
        assert_eq!(plain.len(), 2);
        let mm = plain.iter().find(|o| o.name == "aten::mm").unwrap();
        assert_eq!((mm.count, mm.shape.as_deref()), (3, None));
        assert_eq!(mm.cpu_avg_us.0, 20.0);
        assert_eq!(mm.cpu_self_pct.get(), Some(60.0));
        assert_eq!(mm.gpu_self_pct.get(), None, "no GPU time: no share");

        let shaped = table(&rows, true);
        let rows: Vec<(&str, Option<&str>, u64, f64)> = shaped
            .iter()
            .map(|o| {
                (
                    o.name.as_str(),
                    o.shape.as_deref(),
                    o.count,
                    o.cpu_total_us.0,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("aten::mm", Some("[[16, 1], [1, 64]]"), 1, 10.0),
                ("aten::mm", Some("[[64, 16], [16, 32]]"), 2, 50.0),
                ("aten::relu", None, 1, 40.0),
            ]
        );
    }

    /// The shape is `Input Dims` alone, as `key_averages(group_by_input_shape=True)` keys on
    /// `input_shapes`: other dtypes, strides or concrete inputs of the same dims share its row.
    #[test]
    fn grouping_by_shape_keys_on_input_dims_alone() {
        let mut other = op("aten::mm", 1, 200, 20, Some(json!([[64, 16], [16, 32]])));
        other["args"]["Input type"] = json!(["double", "double"]);
        other["args"]["Input Strides"] = json!([[1, 64], [32, 1]]);
        let rows = rows_of(vec![
            op("aten::mm", 1, 0, 30, Some(json!([[64, 16], [16, 32]]))),
            other,
            op("aten::cat", 1, 300, 5, Some(json!([[[2, 3], [2, 3]], []]))),
        ]);
        let shaped = table(&rows, true);
        let got: Vec<(&str, Option<&str>, u64)> = shaped
            .iter()
            .map(|o| (o.name.as_str(), o.shape.as_deref(), o.count))
            .collect();
        assert_eq!(
            got,
            [
                ("aten::cat", Some("[[[2, 3], [2, 3]], []]"), 1),
                ("aten::mm", Some("[[64, 16], [16, 32]]"), 2),
            ]
        );
    }
}
