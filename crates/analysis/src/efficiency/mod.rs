//! How close to the hardware the ops run: FLOPs and bytes per op from its shapes (the model
//! table in [`models`]), achieved TFLOP/s and TB/s over the kernels it launched, the roofline
//! bound from the device's vendor peaks ([`peaks`]), and GPU time by category.
//!
//! - An op's GPU time is the time of the GPU rows it launched ([`link`]: `External id`, else the
//!   runtime call's `correlation`), over the whole trace (no step filter).
//! - Groups are (op, input shapes, dtypes, parameters): achieved rates are total FLOPs (bytes)
//!   over total kernel time, never means of per-call rates.
//! - The roofline time of a group is `max(FLOPs / compute peak, bytes / bandwidth)`; its fraction
//!   is roofline time over kernel time (1 = at the hardware's limit).
//! - Categories: a `gpu_memcpy` row is memcpy, a `gpu_memset` row memset, a collective kernel
//!   communication; any other kernel takes its op's category: the model table's for a modelled
//!   op, else the category with the most time among all the op's kernels (by kernel name).
//!
//! Units: FLOPs and bytes are plain counts; TFLOP/s and TB/s are decimal (10¹²).

pub mod docs;
mod eval;
mod link;
pub(crate) mod models;
pub(crate) mod peaks;
#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::fastmap::FastMap;
use crate::rows::Rows;
use crate::units::{Num, Us};

pub(crate) use eval::{evaluate, Input, OpArgs, Work};
pub(crate) use link::{cat_kinds, launching_ops, RowKind};
pub use models::{Category, Precision};
pub use peaks::DevicePeaks;

use models::{kernel_category, model_of, Formula, Model};
use peaks::{compute_peak, match_device, DeviceProps};

/// Peaks given on the command line; each replaces the table's figure (and gives a roofline on a
/// device the table does not know, when both are given).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeakOverride {
    /// Compute peak, TFLOP/s, for every op whatever its precision.
    pub tflops: Option<f64>,
    /// Memory bandwidth, TB/s.
    pub tb_per_s: Option<f64>,
}

/// The device of one trace and the peaks its roofline uses.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceRow {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle.
    pub cycle: u32,
    /// `deviceProperties[].name`, when the trace has one.
    pub name: Option<String>,
    /// The peaks-table row it matched.
    pub matched: Option<&'static str>,
    /// That row's peaks.
    pub peaks: Option<DevicePeaks>,
    /// `--peak-tflops`, used for every op.
    pub peak_tflops_override: Option<f64>,
    /// The bandwidth the roofline uses (the table's or `--peak-bandwidth`), TB/s.
    pub bandwidth_tb_s: Option<f64>,
    /// Why this trace has no roofline, when it has none.
    pub no_roofline: Option<String>,
}

/// GPU time of one category, over all ranks.
#[derive(Clone, Debug, Serialize)]
pub struct CategoryRow {
    /// The category.
    pub category: Category,
    /// GPU rows (kernels, copies, sets) counted in it.
    pub rows: u64,
    /// Their summed durations (rows on different streams that overlap each count in full).
    pub time_us: Us,
    /// Share of all GPU rows' summed durations.
    pub share: Num,
}

/// Whether compute or memory bounds a group on the roofline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// FLOPs / compute peak is the larger.
    Compute,
    /// Bytes / bandwidth is the larger.
    Memory,
}

/// One (op, shapes, dtypes, parameters) group over all ranks.
#[derive(Clone, Debug, Serialize)]
pub struct OpEfficiency {
    /// Op name.
    pub op: String,
    /// The tensor inputs' shapes (`5×128, 128×128, 128`).
    pub shapes: String,
    /// Their dtypes.
    pub dtypes: String,
    /// What the model read beyond the shapes (`M=5 N=128 K=128`, `stride [2,2] pad [1,1]`).
    pub params: String,
    /// Its category.
    pub category: Category,
    /// The precision its math runs in (which peak applies).
    pub precision: Precision,
    /// Calls.
    pub calls: u64,
    /// Whether `time_us` is GPU time (the kernels the calls launched) or, on a trace without GPU
    /// rows, the calls' CPU time.
    pub on_gpu: bool,
    /// Summed time of the calls' kernels (or CPU time, see `on_gpu`).
    pub time_us: Us,
    /// Total FLOPs of the calls.
    pub flops: f64,
    /// Total bytes the calls read and write (`null` when a size is unknown).
    pub bytes: Option<f64>,
    /// FLOPs over time, 10¹² per second.
    pub tflops_per_s: Num,
    /// Bytes over time, 10¹² per second.
    pub tb_per_s: Num,
    /// FLOPs per byte.
    pub intensity: Num,
    /// The time the roofline allows (summed over the ranks with a roofline).
    pub roofline_us: Option<Us>,
    /// Roofline time over the time of the same calls (1 = at the hardware's limit).
    pub roofline_fraction: Num,
    /// What bounds it.
    pub bound: Option<Bound>,
    /// Why some or all of its calls have no roofline.
    pub no_roofline: Option<String>,
    /// A GEMM's `[batch, M, N, K]`.
    pub gemm_bmnk: Option<[i64; 4]>,
    /// Ranks it ran on.
    pub ranks: Vec<i64>,
}

/// Ops with GPU time that no model covers, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Unmodelled {
    /// Op name (`(no op)` for GPU rows no op launched).
    pub op: String,
    /// Its category.
    pub category: Category,
    /// Calls.
    pub calls: u64,
    /// Their GPU time.
    pub time_us: Us,
    /// Why there is no model.
    pub why: String,
}

/// The efficiency section of the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Efficiency {
    /// Per trace: its device and the peaks used.
    pub devices: Vec<DeviceRow>,
    /// GPU time by category, over all ranks.
    pub categories: Vec<CategoryRow>,
    /// The modelled groups, most time first.
    pub ops: Vec<OpEfficiency>,
    /// GPU time no model covers, most first.
    pub unmodelled: Vec<Unmodelled>,
    /// Share of the ops' GPU time the modelled groups hold.
    pub modelled_share: Num,
    /// What the reader of these numbers should know.
    pub notes: Vec<String>,
}

/// A group as one rank accumulates it.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub op: String,
    pub shapes: String,
    pub dtypes: String,
    pub params: String,
    pub category: Category,
    pub precision: Precision,
    pub calls: u64,
    pub on_gpu: bool,
    pub time_ns: i64,
    pub flops: f64,
    pub bytes: Option<f64>,
    /// Roofline time, its compute and memory parts, and the kernel time they cover (ns).
    pub roofline_ns: f64,
    pub compute_ns: f64,
    pub memory_ns: f64,
    pub roof_time_ns: i64,
    pub no_roofline: Option<String>,
    pub gemm: Option<[i64; 4]>,
    /// The op row of the call with the most GPU time (GPU groups).
    pub longest: Option<u32>,
}

/// One rank's efficiency, before ranks are combined.
#[derive(Clone, Debug)]
pub(crate) struct RankEfficiency {
    pub device: DeviceRow,
    pub groups: Vec<Group>,
    /// Per category (index of [`Category::ALL`]): rows and ns.
    pub categories: [(u64, i64); 10],
    pub unmodelled: Vec<Unmodelled>,
    /// GPU time of ops (modelled or not), ns.
    pub op_time_ns: i64,
}

/// The peaks one rank's roofline uses.
struct Roof {
    table: Option<DevicePeaks>,
    tflops: Option<f64>,
    bandwidth: Option<f64>,
    /// Why the table has no row for the device.
    unknown: String,
}

impl Roof {
    /// `(compute peak TFLOP/s, bandwidth TB/s)` for a group, or why there is none.
    fn for_group(&self, category: Category, precision: Precision) -> Result<(f64, f64), String> {
        let missing = |what: &str, flag: &str| {
            if self.table.is_none() && self.tflops.is_none() && self.bandwidth.is_none() {
                self.unknown.clone()
            } else {
                format!("no {what} (give {flag})")
            }
        };
        let bw = self
            .bandwidth
            .ok_or_else(|| missing("memory bandwidth", "--peak-bandwidth"))?;
        let peak = match (self.tflops, &self.table) {
            (Some(t), _) => t,
            (None, Some(p)) => compute_peak(p, category, precision),
            (None, None) => return Err(missing("compute peak", "--peak-tflops")),
        };
        if peak <= 0.0 {
            return Err(format!(
                "{} has no {} peak for {}",
                self.table.map_or("the device", |p| p.name),
                precision.as_str(),
                if category.is_matrix() {
                    "matrix math"
                } else {
                    "vector math"
                }
            ));
        }
        Ok((peak, bw))
    }
}

/// The device of a trace from `deviceProperties`, and the roofline's peaks.
fn device(rows: &Rows, over: &PeakOverride, has_gpu: bool) -> (DeviceRow, Roof) {
    let props: Vec<DeviceProps> = rows
        .metadata
        .iter()
        .rev()
        .find(|(k, _)| k == "deviceProperties")
        .and_then(|(_, v)| serde_json::from_str(v).ok())
        .unwrap_or_default();
    let mut names: Vec<&str> = props.iter().map(|p| p.name.as_str()).collect();
    names.dedup();
    let (name, matched, why) = match (names.as_slice(), props.first()) {
        ([], _) | (_, None) => (
            None,
            None,
            if has_gpu {
                "the trace has no deviceProperties (written before Kineto recorded them)".to_owned()
            } else {
                "no GPU rows in the trace".to_owned()
            },
        ),
        ([one], Some(p)) => match match_device(p) {
            Some(d) => (Some(one.to_string()), Some(d), String::new()),
            None => (
                Some(one.to_string()),
                None,
                format!(
                    "`{one}` ({} SMs/CUs, {:.0} GiB) is not in the peaks table",
                    p.sms.map_or("?".into(), |s| s.to_string()),
                    p.total_mem.unwrap_or(0.0) / (1u64 << 30) as f64
                ),
            ),
        },
        (many, _) => (
            Some(many.join(", ")),
            None,
            format!("the trace lists different GPUs ({})", many.join(", ")),
        ),
    };
    let table = matched.map(|d| d.peaks);
    let roof = Roof {
        table,
        tflops: over.tflops,
        bandwidth: over.tb_per_s.or(table.map(|p| p.bandwidth)),
        unknown: why.clone(),
    };
    let complete = roof.bandwidth.is_some() && (roof.tflops.is_some() || roof.table.is_some());
    let no_roofline = (!complete).then(|| {
        if has_gpu {
            format!(
                "{why}: achieved rates only; --peak-tflops and --peak-bandwidth give a roofline"
            )
        } else {
            why.clone()
        }
    });
    (
        DeviceRow {
            rank: 0,
            cycle: 0,
            name,
            matched: table.map(|p| p.name),
            peaks: table,
            peak_tflops_override: over.tflops,
            bandwidth_tb_s: roof.bandwidth,
            no_roofline,
        },
        roof,
    )
}

const NO_ARGS: u32 = u32::MAX;

/// One rank's efficiency and collective instances (they share the GPU rows' links to ops).
pub(crate) fn rank_device_work(
    rows: &Rows,
    over: &PeakOverride,
) -> (RankEfficiency, Vec<crate::collectives::Instance>) {
    let kinds = cat_kinds(rows);
    let links = launching_ops(rows, &kinds);
    let world = rows
        .metadata
        .iter()
        .rev()
        .find(|(k, _)| k == "distributedInfo")
        .and_then(|(_, v)| serde_json::from_str::<serde_json::Value>(v).ok())
        .and_then(|v| v.get("world_size")?.as_i64());
    (
        rank_efficiency(rows, &kinds, &links, over),
        crate::collectives::rank_instances(rows, &kinds, &links, world),
    )
}

/// Computes one rank's efficiency from its GPU rows' links ([`launching_ops`]).
pub(crate) fn rank_efficiency(
    rows: &Rows,
    kinds: &[RowKind],
    links: &[(u32, Option<u32>)],
    over: &PeakOverride,
) -> RankEfficiency {
    let (device, roof) = device(rows, over, !links.is_empty());
    let mut eff = RankEfficiency {
        device,
        groups: Vec::new(),
        categories: [(0, 0); 10],
        unmodelled: Vec::new(),
        op_time_ns: 0,
    };
    // Per interned name, the category of a kernel with that name (computed once).
    let mut kernel_cat: Vec<Option<Category>> = vec![None; rows.strings.len()];
    // Per interned name, its model (looked up once).
    let mut models: Vec<Option<Option<&'static Model>>> = vec![None; rows.strings.len()];
    let mut model_of_name = |name: u32| -> Option<&'static Model> {
        *models[name as usize].get_or_insert_with(|| model_of(rows.str(name)))
    };
    if links.is_empty() {
        if !rows.op_args.is_empty() {
            cpu_groups(rows, kinds, &mut model_of_name, &mut eff);
        }
        return eff;
    }
    // Per op: its GPU time. Copy and set rows and collective kernels keep their own category;
    // an op's other kernels take the op's: its model's, or (an op without a model) the one with
    // the most time among all of them by kernel name, never just the first kernel's.
    let mut per_op: FastMap<u32, i64> =
        FastMap::with_capacity_and_hasher(links.len(), Default::default());
    let mut unknown: FastMap<u32, [(u64, i64); 10]> = FastMap::default();
    // Ops without a model whose rows all keep their own category: the first such category.
    let mut own_only: FastMap<u32, Category> = FastMap::default();
    let mut unlinked: FastMap<u32, (u64, i64)> = FastMap::default();
    let add = |cats: &mut [(u64, i64); 10], c: Category, dur: i64| {
        let slot = &mut cats[c.index()];
        slot.0 += 1;
        slot.1 += dur;
    };
    for &(g, op) in links {
        let r = &rows.rows[g as usize];
        let dur = r.dur.max(0);
        let kind = kinds[r.cat as usize];
        let own = match kind {
            RowKind::Memcpy => Some(Category::Memcpy),
            RowKind::Memset => Some(Category::Memset),
            _ => None,
        };
        let cat = own.unwrap_or_else(|| {
            *kernel_cat[r.name as usize].get_or_insert_with(|| kernel_category(rows.str(r.name)))
        });
        let Some(o) = op else {
            add(&mut eff.categories, cat, dur);
            let u = unlinked.entry(r.name).or_default();
            u.0 += 1;
            u.1 += dur;
            continue;
        };
        *per_op.entry(o).or_default() += dur;
        let model = model_of_name(rows.rows[o as usize].name);
        if own.is_some() || cat == Category::Communication {
            add(&mut eff.categories, cat, dur);
            if model.is_none() {
                own_only.entry(o).or_insert(cat);
            }
            continue;
        }
        match model {
            Some(m) => add(&mut eff.categories, m.category, dur),
            None => add(unknown.entry(o).or_insert([(0, 0); 10]), cat, dur),
        }
    }
    // An op without a model: its kernels' category with the most time.
    let mut unknown_category: FastMap<u32, Category> =
        FastMap::with_capacity_and_hasher(unknown.len(), Default::default());
    for (o, kernels) in unknown {
        let category = Category::ALL
            .iter()
            .filter(|c| kernels[c.index()].0 > 0)
            .max_by_key(|c| (kernels[c.index()].1, std::cmp::Reverse(c.index())))
            .copied()
            .unwrap_or(Category::Other);
        let slot = &mut eff.categories[category.index()];
        for (n, ns) in kernels {
            slot.0 += n;
            slot.1 += ns;
        }
        unknown_category.insert(o, category);
    }
    // Groups by (op name, args), evaluated once each.
    struct Pending {
        calls: u64,
        ns: i64,
        category: Category,
        longest: (i64, u32),
    }
    let mut pending: FastMap<(u32, u32), Pending> = FastMap::default();
    let mut unmodelled: FastMap<(u32, u8), (u64, i64, Category)> = FastMap::default();
    for (o, ns) in per_op {
        let name = rows.rows[o as usize].name;
        let model = model_of_name(name);
        eff.op_time_ns += ns;
        match model {
            Some(m) if !matches!(m.formula, Formula::None) => {
                let args = rows.op_args(o).unwrap_or(NO_ARGS);
                let p = pending.entry((name, args)).or_insert(Pending {
                    calls: 0,
                    ns: 0,
                    category: m.category,
                    longest: (ns, o),
                });
                p.calls += 1;
                p.ns += ns;
                // The longest call; the first in the trace of equally long ones.
                if (ns, std::cmp::Reverse(o)) > (p.longest.0, std::cmp::Reverse(p.longest.1)) {
                    p.longest = (ns, o);
                }
            }
            _ => {
                let (reason, category) = match model {
                    Some(m) => (1, m.category),
                    None => (
                        0,
                        unknown_category
                            .get(&o)
                            .or_else(|| own_only.get(&o))
                            .copied()
                            .unwrap_or(Category::Other),
                    ),
                };
                let u = unmodelled.entry((name, reason)).or_insert((0, 0, category));
                u.0 += 1;
                u.1 += ns;
            }
        }
    }
    let mut parsed: FastMap<u32, Option<OpArgs>> = FastMap::default();
    let mut keys: Vec<((u32, u32), Pending)> = pending.into_iter().collect();
    keys.sort_unstable_by_key(|(k, _)| *k);
    for ((name, args), p) in keys {
        let model = model_of_name(name).expect("pending ops have a model");
        let op_args = if args == NO_ARGS {
            None
        } else {
            parsed
                .entry(args)
                .or_insert_with(|| OpArgs::parse(rows.str(args)))
                .as_ref()
        };
        let why = match op_args {
            None => Err("no shapes in the trace (record_shapes off)"),
            Some(a) => evaluate(model, rows.str(name), a).map(|w| (a, w)),
        };
        match why {
            Ok((a, work)) => {
                let (shapes, dtypes) = a.shapes_text();
                let mut g = group(
                    rows.str(name),
                    shapes,
                    dtypes,
                    p.category,
                    work,
                    p.calls,
                    p.ns,
                    true,
                    &roof,
                );
                g.longest = Some(p.longest.1);
                eff.groups.push(g);
            }
            Err(why) => eff.unmodelled.push(Unmodelled {
                op: rows.str(name).to_owned(),
                category: p.category,
                calls: p.calls,
                time_us: Us::from_ns(p.ns),
                why: why.to_owned(),
            }),
        }
    }
    for ((name, reason), (calls, ns, category)) in unmodelled {
        eff.unmodelled.push(Unmodelled {
            op: rows.str(name).to_owned(),
            category,
            calls,
            time_us: Us::from_ns(ns),
            why: if reason == 1 {
                "category only (no FLOP/byte model)".into()
            } else {
                "no model for this op".into()
            },
        });
    }
    for (name, (calls, ns)) in unlinked {
        eff.unmodelled.push(Unmodelled {
            op: format!("(no op) {}", rows.str(name)),
            category: kernel_cat[name as usize].unwrap_or(Category::Other),
            calls,
            time_us: Us::from_ns(ns),
            why: "no op launched it (no External id or runtime call links it)".into(),
        });
    }
    eff
}

/// A rank's group with its roofline.
#[allow(clippy::too_many_arguments)]
fn group(
    op: &str,
    shapes: String,
    dtypes: String,
    category: Category,
    work: Work,
    calls: u64,
    time_ns: i64,
    on_gpu: bool,
    roof: &Roof,
) -> Group {
    let n = calls as f64;
    let flops = work.flops * n;
    let bytes = work.bytes.map(|b| b * n);
    let mut g = Group {
        op: op.to_owned(),
        shapes,
        dtypes,
        params: work.label,
        category,
        precision: work.precision,
        calls,
        on_gpu,
        time_ns,
        flops,
        bytes,
        roofline_ns: 0.0,
        compute_ns: 0.0,
        memory_ns: 0.0,
        roof_time_ns: 0,
        no_roofline: None,
        gemm: work.gemm,
        longest: None,
    };
    if !on_gpu {
        g.no_roofline = Some("CPU time (a trace without GPU rows): no roofline".into());
        return g;
    }
    let Some(bytes) = bytes else {
        g.no_roofline = Some("a tensor's size is unknown (a tensor list has no dtype)".into());
        return g;
    };
    match roof.for_group(category, work.precision) {
        Ok((peak, bw)) => {
            // TFLOP/s = 10³ FLOP/ns; TB/s = 10³ B/ns.
            g.compute_ns = flops / (peak * 1e3);
            g.memory_ns = bytes / (bw * 1e3);
            g.roofline_ns = g.compute_ns.max(g.memory_ns);
            g.roof_time_ns = time_ns;
        }
        Err(why) => g.no_roofline = Some(why),
    }
    g
}

/// On a trace without GPU rows: the innermost modelled ops, with their CPU time. A copy or fill
/// inside a modelled op (addmm copying its bias into the output) is part of that op's work: it
/// neither counts on its own nor makes the op around it an outer one.
fn cpu_groups(
    rows: &Rows,
    kinds: &[RowKind],
    model_of_name: &mut dyn FnMut(u32) -> Option<&'static Model>,
    eff: &mut RankEfficiency,
) {
    let all = &rows.rows;
    let mut by_thread: FastMap<u32, Vec<u32>> = FastMap::default();
    for (i, r) in all.iter().enumerate() {
        if kinds[r.cat as usize] == RowKind::CpuOp
            && model_of_name(r.name).is_some_and(|m| !matches!(m.formula, Formula::None))
        {
            by_thread.entry(r.thread).or_default().push(i as u32);
        }
    }
    let mut leaf: FastMap<u32, bool> = FastMap::default();
    for (_, mut list) in by_thread {
        list.sort_by_key(|&i| {
            (
                all[i as usize].ts,
                std::cmp::Reverse(all[i as usize].dur),
                i,
            )
        });
        let mut stack: Vec<u32> = Vec::new();
        for i in list {
            let r = &all[i as usize];
            while stack.last().is_some_and(|&t| all[t as usize].end() <= r.ts) {
                stack.pop();
            }
            let helper = model_of_name(r.name)
                .is_some_and(|m| matches!(m.formula, Formula::Copy { .. } | Formula::Fill));
            match (stack.last(), helper) {
                (Some(_), true) => {
                    leaf.insert(i, false);
                }
                (Some(&parent), false) => {
                    leaf.insert(parent, false);
                    leaf.entry(i).or_insert(true);
                }
                (None, _) => {
                    leaf.entry(i).or_insert(true);
                }
            }
            stack.push(i);
        }
    }
    let mut acc: FastMap<(u32, u32), (u64, i64)> = FastMap::default();
    for (i, is_leaf) in leaf {
        if !is_leaf {
            continue;
        }
        let r = &all[i as usize];
        let Some(args) = rows.op_args(i) else {
            continue;
        };
        let a = acc.entry((r.name, args)).or_default();
        a.0 += 1;
        a.1 += r.dur.max(0);
    }
    let roof = Roof {
        table: None,
        tflops: None,
        bandwidth: None,
        unknown: String::new(),
    };
    let mut keys: Vec<((u32, u32), (u64, i64))> = acc.into_iter().collect();
    keys.sort_unstable_by_key(|(k, _)| *k);
    for ((name, args), (calls, ns)) in keys {
        let Some(model) = model_of_name(name) else {
            continue;
        };
        let Some(parsed) = OpArgs::parse(rows.str(args)) else {
            continue;
        };
        if let Ok(work) = evaluate(model, rows.str(name), &parsed) {
            let (shapes, dtypes) = parsed.shapes_text();
            eff.groups.push(group(
                rows.str(name),
                shapes,
                dtypes,
                model.category,
                work,
                calls,
                ns,
                false,
                &roof,
            ));
        }
    }
}

/// Combines the ranks' efficiency into the report's section.
pub(crate) fn merge(ranks: Vec<(i64, u32, RankEfficiency)>) -> Efficiency {
    let mut out = Efficiency::default();
    let mut cats = [(0u64, 0i64); 10];
    type Key = (String, String, String, String, bool);
    let mut groups: FastMap<Key, (OpEfficiency, f64, f64, f64, i64)> = FastMap::default();
    let mut unmodelled: FastMap<(String, String), Unmodelled> = FastMap::default();
    let mut op_time = 0i64;
    let mut notes: Vec<String> = Vec::new();
    for (rank, cycle, eff) in ranks {
        let has_gpu_time = eff.categories.iter().any(|c| c.0 > 0);
        if let Some(why) = &eff.device.no_roofline {
            if has_gpu_time && !notes.iter().any(|n| n.ends_with(why.as_str())) {
                notes.push(format!("rank {rank}: {why}"));
            }
        }
        out.devices.push(DeviceRow {
            rank,
            cycle,
            ..eff.device
        });
        for (c, r) in cats.iter_mut().zip(eff.categories) {
            c.0 += r.0;
            c.1 += r.1;
        }
        op_time += eff.op_time_ns;
        for g in eff.groups {
            let key = (
                g.op.clone(),
                g.shapes.clone(),
                g.dtypes.clone(),
                g.params.clone(),
                g.on_gpu,
            );
            let e = groups.entry(key).or_insert_with(|| {
                (
                    OpEfficiency {
                        op: g.op.clone(),
                        shapes: g.shapes.clone(),
                        dtypes: g.dtypes.clone(),
                        params: g.params.clone(),
                        category: g.category,
                        precision: g.precision,
                        calls: 0,
                        on_gpu: g.on_gpu,
                        time_us: Us(0.0),
                        flops: 0.0,
                        bytes: Some(0.0),
                        tflops_per_s: Num(f64::NAN),
                        tb_per_s: Num(f64::NAN),
                        intensity: Num(f64::NAN),
                        roofline_us: None,
                        roofline_fraction: Num(f64::NAN),
                        bound: None,
                        no_roofline: None,
                        gemm_bmnk: g.gemm,
                        ranks: Vec::new(),
                    },
                    0.0,
                    0.0,
                    0.0,
                    0,
                )
            });
            let (o, roofline, compute, memory, roof_time) = e;
            o.calls += g.calls;
            o.time_us.0 += g.time_ns as f64 / 1000.0;
            o.flops += g.flops;
            o.bytes = o.bytes.zip(g.bytes).map(|(a, b)| a + b);
            if !o.ranks.contains(&rank) {
                o.ranks.push(rank);
            }
            if g.no_roofline.is_some() && o.no_roofline.is_none() {
                o.no_roofline = g.no_roofline.clone();
            }
            *roofline += g.roofline_ns;
            *compute += g.compute_ns;
            *memory += g.memory_ns;
            *roof_time += g.roof_time_ns;
        }
        for u in eff.unmodelled {
            let e = unmodelled
                .entry((u.op.clone(), u.why.clone()))
                .or_insert_with(|| Unmodelled {
                    time_us: Us(0.0),
                    calls: 0,
                    ..u.clone()
                });
            e.calls += u.calls;
            e.time_us.0 += u.time_us.0;
        }
    }
    let total: i64 = cats.iter().map(|c| c.1).sum();
    out.categories = Category::ALL
        .iter()
        .zip(cats)
        .filter(|(_, c)| c.0 > 0)
        .map(|(&category, (rows, ns))| CategoryRow {
            category,
            rows,
            time_us: Us::from_ns(ns),
            share: Num::ratio(ns as f64, total as f64),
        })
        .collect();
    out.categories
        .sort_by(|a, b| b.time_us.0.total_cmp(&a.time_us.0));
    let mut modelled_ns = 0.0;
    out.ops = groups
        .into_values()
        .map(|(mut o, roofline, compute, memory, roof_time)| {
            let secs = o.time_us.0 / 1e6;
            if o.on_gpu {
                modelled_ns += o.time_us.0 * 1000.0;
            }
            o.tflops_per_s = Num::ratio(o.flops / 1e12, secs);
            o.tb_per_s = match o.bytes {
                Some(b) => Num::ratio(b / 1e12, secs),
                None => Num(f64::NAN),
            };
            o.intensity = match o.bytes {
                Some(b) => Num::ratio(o.flops, b),
                None => Num(f64::NAN),
            };
            if roof_time > 0 {
                o.roofline_us = Some(Us(roofline.round() / 1000.0));
                o.roofline_fraction = Num::ratio(roofline, roof_time as f64);
                o.bound = Some(if compute >= memory {
                    Bound::Compute
                } else {
                    Bound::Memory
                });
            }
            o.time_us = Us((o.time_us.0 * 1000.0).round() / 1000.0);
            o
        })
        .collect();
    out.ops.sort_by(|a, b| {
        b.time_us
            .0
            .total_cmp(&a.time_us.0)
            .then_with(|| (&a.op, &a.shapes, &a.params).cmp(&(&b.op, &b.shapes, &b.params)))
    });
    out.unmodelled = unmodelled.into_values().collect();
    out.unmodelled.sort_by(|a, b| {
        b.time_us
            .0
            .total_cmp(&a.time_us.0)
            .then_with(|| a.op.cmp(&b.op))
    });
    out.modelled_share = Num::ratio(modelled_ns, op_time as f64);
    if out.ops.iter().any(|o| !o.on_gpu) {
        notes.push(
            "traces without GPU rows: FLOPs and bytes of the modelled ops with their CPU time \
             (the innermost modelled op of each call), no roofline"
                .into(),
        );
    }
    out.notes = notes;
    out
}
