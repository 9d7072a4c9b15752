//! The report as terminal tables, the most telling row of each first.

use kinetrace_analysis::Report;

use crate::cli::Analysis;
use crate::op_sort::OpSort;
use crate::table::{bytes, clip, dur_us, pct, Align, Table};

const NAME_WIDTH: usize = 70;

/// Renders the selected analyses (the op table in `sort`'s order, which `report.ops` is in).
pub fn render(report: &Report, analyses: &[Analysis], top: usize, sort: OpSort) -> String {
    let mut out = String::new();
    out.push_str(&header(report));
    // Without any GPU row the four GPU analyses have nothing to show: one line says so, once.
    let cpu_only = report.ranks.iter().all(|r| r.gpu_rows == 0);
    let mut said_cpu_only = false;
    for a in analyses {
        if cpu_only && a.needs_gpu() {
            if !said_cpu_only {
                said_cpu_only = true;
                out.push_str(&format!(
                    "\nGPU sections ({}): no GPU rows in any trace (a CPU-only job), nothing to \
                     show\n",
                    analyses
                        .iter()
                        .filter(|a| a.needs_gpu())
                        .map(|a| a.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            continue;
        }
        let tables = match a {
            Analysis::Temporal => vec![temporal(report)],
            Analysis::Overlap => vec![overlap(report)],
            Analysis::Idle => vec![idle(report)],
            Analysis::Kernels => vec![kernel_types(report), kernels(report)],
            Analysis::Ops => vec![ops(report, sort)],
            Analysis::Efficiency => {
                out.push_str(&crate::efficiency_view::efficiency_text(report, top));
                continue;
            }
            Analysis::Collectives => {
                out.push_str(&crate::efficiency_view::collectives_text(report, top));
                continue;
            }
            Analysis::Steps => vec![steps(report)],
            Analysis::Memory => vec![memory(report)],
        };
        for mut t in tables {
            t.truncate(top);
            out.push('\n');
            out.push_str(&t.render());
        }
        if *a == Analysis::Steps {
            out.push_str(&straggler_line(report));
        }
        if *a == Analysis::Memory {
            out.push_str(&memory_lines(report, top));
        }
    }
    out
}

/// "2 ranks analysed (0, 1)"; with cycles, "1 rank analysed (0), 2 traces: rank 0 in cycles 0–1".
fn header(report: &Report) -> String {
    let mut ranks: Vec<i64> = report.ranks.iter().map(|r| r.rank).collect();
    ranks.dedup();
    let list: Vec<String> = ranks.iter().map(i64::to_string).collect();
    let mut out = format!(
        "{} rank{} analysed ({})",
        ranks.len(),
        if ranks.len() == 1 { "" } else { "s" },
        list.join(", ")
    );
    if report.has_cycles() {
        let cycled: Vec<String> = report
            .ranks
            .iter()
            .filter(|r| r.cycles > 1 && r.cycle == 0)
            .map(|r| format!("rank {} in cycles 0–{}", r.rank, r.cycles - 1))
            .collect();
        out.push_str(&format!(
            ", {} traces: {}",
            report.ranks.len(),
            cycled.join(", ")
        ));
    }
    out.push('\n');
    out
}

/// The columns of a per-rank table: a `cycle` column after `rank` when some rank has cycles.
fn cols(r: &Report, c: &[(&'static str, Align)]) -> Vec<(&'static str, Align)> {
    let mut c = c.to_vec();
    if r.has_cycles() {
        c.insert(1, ("cycle", Align::Right));
    }
    c
}

/// A row's cells, with its cycle after the rank when the table has that column.
fn cells(r: &Report, cycle: u32, mut v: Vec<String>) -> Vec<String> {
    if r.has_cycles() {
        v.insert(1, cycle.to_string());
    }
    v
}

fn temporal(r: &Report) -> Table {
    let mut t = Table::new(
        "GPU time per rank (temporal breakdown; most idle first)",
        &cols(
            r,
            &[
                ("rank", Align::Right),
                ("idle", Align::Right),
                ("compute", Align::Right),
                ("non-compute", Align::Right),
                ("kernel span", Align::Right),
                ("idle %", Align::Right),
                ("compute %", Align::Right),
                ("non-compute %", Align::Right),
            ],
        ),
    );
    let mut rows: Vec<_> = r.temporal_breakdown.iter().collect();
    rows.sort_by(|a, b| {
        let key = |x: &&kinetrace_analysis::hta::Temporal| x.idle_time_pctg.get().unwrap_or(-1.0);
        key(b)
            .total_cmp(&key(a))
            .then((a.rank, a.cycle).cmp(&(b.rank, b.cycle)))
    });
    for x in rows {
        t.row(cells(
            r,
            x.cycle,
            vec![
                x.rank.to_string(),
                dur_us(x.idle_time_us.0),
                dur_us(x.compute_time_us.0),
                dur_us(x.non_compute_time_us.0),
                dur_us(x.kernel_time_us.0),
                pct(x.idle_time_pctg.get()),
                pct(x.compute_time_pctg.get()),
                pct(x.non_compute_time_pctg.get()),
            ],
        ));
    }
    t
}

fn overlap(r: &Report) -> Table {
    let mut t = Table::new(
        "Communication overlapped by computation (least overlap first)",
        &cols(r, &[("rank", Align::Right), ("overlap %", Align::Right)]),
    );
    let mut rows: Vec<_> = r.comm_comp_overlap.iter().collect();
    rows.sort_by(|a, b| {
        let key = |x: &&kinetrace_analysis::hta::Overlap| {
            x.comp_comm_overlap_pctg.get().unwrap_or(f64::INFINITY)
        };
        key(a)
            .total_cmp(&key(b))
            .then((a.rank, a.cycle).cmp(&(b.rank, b.cycle)))
    });
    for x in rows {
        let v = x.comp_comm_overlap_pctg.get();
        t.row(cells(
            r,
            x.cycle,
            vec![
                x.rank.to_string(),
                if v.is_some() {
                    pct(v)
                } else {
                    "- (no communication kernels)".into()
                },
            ],
        ));
    }
    t
}

fn idle(r: &Report) -> Table {
    let mut t = Table::new(
        "GPU idle time per rank and stream (largest first)",
        &cols(
            r,
            &[
                ("rank", Align::Right),
                ("stream", Align::Right),
                ("category", Align::Left),
                ("idle", Align::Right),
                ("share", Align::Right),
                ("gaps", Align::Right),
                ("mean gap", Align::Right),
                ("median gap", Align::Right),
                ("max gap", Align::Right),
            ],
        ),
    );
    let mut rows: Vec<_> = r.idle_time_breakdown.iter().collect();
    rows.sort_by(|a, b| {
        b.idle_time_us.0.total_cmp(&a.idle_time_us.0).then(
            (a.rank, a.cycle, a.stream, a.idle_category).cmp(&(
                b.rank,
                b.cycle,
                b.stream,
                b.idle_category,
            )),
        )
    });
    let opt = |v: Option<f64>| v.map_or_else(|| "-".into(), dur_us);
    for x in rows {
        let s = &x.interval_stats;
        t.row(cells(
            r,
            x.cycle,
            vec![
                x.rank.to_string(),
                x.stream.to_string(),
                x.idle_category.as_str().into(),
                dur_us(x.idle_time_us.0),
                pct(x.idle_time_ratio.get().map(|v| v * 100.0)),
                s.count.to_string(),
                opt(s.mean),
                opt(s.p50),
                opt(s.max),
            ],
        ));
    }
    t
}

fn kernel_types(r: &Report) -> Table {
    let mut t = Table::new(
        "GPU time by kernel type, all ranks (largest first)",
        &[
            ("kernel type", Align::Left),
            ("time", Align::Right),
            ("share", Align::Right),
        ],
    );
    for x in &r.kernel_type_breakdown {
        t.row(vec![
            x.kernel_type.clone(),
            dur_us(x.sum_us as f64),
            pct(x.percentage.get()),
        ]);
    }
    t
}

fn kernels(r: &Report) -> Table {
    let mut t = Table::new(
        "Top kernels per type and rank (largest total first; mean/min/max per launch)",
        &cols(
            r,
            &[
                ("rank", Align::Right),
                ("type", Align::Left),
                ("kernel", Align::Left),
                ("total", Align::Right),
                ("launches", Align::Right),
                ("mean", Align::Right),
                ("min", Align::Right),
                ("max", Align::Right),
            ],
        ),
    );
    let mut rows: Vec<_> = r.kernel_breakdown.iter().collect();
    rows.sort_by(|a, b| {
        b.sum_us
            .0
            .total_cmp(&a.sum_us.0)
            .then((a.rank, a.cycle).cmp(&(b.rank, b.cycle)))
    });
    for x in rows {
        t.row(cells(
            r,
            x.cycle,
            vec![
                x.rank.to_string(),
                x.kernel_type.as_str().to_lowercase(),
                clip(&x.name, NAME_WIDTH),
                dur_us(x.sum_us.0),
                x.count.to_string(),
                // True per-launch statistics, not HTA's (which repeat the total for listed kernels
                // once a type has more than `num_kernels` kernels; those stay in the JSON/CSV).
                dur_us(x.launch_mean_us.0),
                dur_us(x.launch_min_us.0),
                dur_us(x.launch_max_us.0),
            ],
        ));
    }
    t
}

/// The op table, as `key_averages().table()`: calls, self and total CPU time with their share of
/// the table's self CPU time and the time per call; GPU columns when kernels were launched;
/// memory columns when `[memory]` events were; the shape column when grouped by shape.
fn ops(r: &Report, sort: OpSort) -> Table {
    let gpu = r.ops.iter().any(|o| o.gpu_total_us.0 > 0.0);
    let cpu_mem = r
        .ops
        .iter()
        .any(|o| o.cpu_mem_bytes != 0 || o.cpu_mem_self_bytes != 0);
    let gpu_mem = r
        .ops
        .iter()
        .any(|o| o.gpu_mem_bytes != 0 || o.gpu_mem_self_bytes != 0);
    let shapes = r.ops.iter().any(|o| o.shape.is_some());
    let mut columns = vec![("kind", Align::Left), ("name", Align::Left)];
    if shapes {
        columns.push(("input shapes", Align::Left));
    }
    columns.extend([
        ("calls", Align::Right),
        ("self CPU", Align::Right),
        ("self CPU %", Align::Right),
        ("total CPU", Align::Right),
        ("total CPU %", Align::Right),
        ("CPU avg", Align::Right),
    ]);
    if gpu {
        columns.extend([
            ("self GPU", Align::Right),
            ("self GPU %", Align::Right),
            ("total GPU", Align::Right),
            ("GPU avg", Align::Right),
        ]);
    }
    if cpu_mem {
        columns.extend([("self CPU mem", Align::Right), ("CPU mem", Align::Right)]);
    }
    if gpu_mem {
        columns.extend([("self GPU mem", Align::Right), ("GPU mem", Align::Right)]);
    }
    let title = format!("Ops and annotations, all ranks ({})", sort.describe());
    let mut t = Table::new(&title, &columns);
    for x in &r.ops {
        let mut v = vec![x.kind.as_str().into(), clip(&x.name, NAME_WIDTH)];
        if shapes {
            v.push(clip(x.shape.as_deref().unwrap_or("-"), NAME_WIDTH));
        }
        v.extend([
            x.count.to_string(),
            dur_us(x.cpu_self_us.0),
            pct(x.cpu_self_pct.get()),
            dur_us(x.cpu_total_us.0),
            pct(x.cpu_total_pct.get()),
            dur_us(x.cpu_avg_us.0),
        ]);
        if gpu {
            v.extend([
                dur_us(x.gpu_self_us.0),
                pct(x.gpu_self_pct.get()),
                dur_us(x.gpu_total_us.0),
                dur_us(x.gpu_avg_us.0),
            ]);
        }
        if cpu_mem {
            v.extend([bytes(x.cpu_mem_self_bytes), bytes(x.cpu_mem_bytes)]);
        }
        if gpu_mem {
            v.extend([bytes(x.gpu_mem_self_bytes), bytes(x.gpu_mem_bytes)]);
        }
        t.row(v);
    }
    t
}

fn steps(r: &Report) -> Table {
    // Without a kernel in any step (a CPU-only job) the GPU columns would be zeros: the CPU's
    // split (outside collectives, in collectives, and which one) is shown instead.
    let cpu_only = r.steps.iter().all(|s| s.kernels == 0);
    let collectives = r.steps.iter().any(|s| s.collective_us.0 > 0.0);
    let columns: &[(&str, Align)] = if cpu_only && !collectives {
        &[
            ("rank", Align::Right),
            ("step", Align::Right),
            ("step time", Align::Right),
        ]
    } else if cpu_only {
        &[
            ("rank", Align::Right),
            ("step", Align::Right),
            ("step time", Align::Right),
            ("outside collectives", Align::Right),
            ("in collectives", Align::Right),
            ("collective", Align::Left),
        ]
    } else {
        &[
            ("rank", Align::Right),
            ("step", Align::Right),
            ("step time", Align::Right),
            ("GPU busy", Align::Right),
            ("compute", Align::Right),
            ("communication", Align::Right),
            ("kernels", Align::Right),
        ]
    };
    let mut t = Table::new("Steps per rank (slowest first)", &cols(r, columns));
    // A partial step (the capture ended inside it) is listed last, marked, never ranked.
    let mut rows: Vec<_> = r.steps.iter().collect();
    rows.sort_by(|a, b| {
        a.partial
            .cmp(&b.partial)
            .then(b.step_time_us.0.total_cmp(&a.step_time_us.0))
            .then((a.rank, a.step).cmp(&(b.rank, b.step)))
    });
    for x in rows {
        let step = if x.partial {
            format!("{} partial", x.step)
        } else {
            x.step.to_string()
        };
        let mut v = vec![x.rank.to_string(), step, dur_us(x.step_time_us.0)];
        if !cpu_only {
            v.extend([
                dur_us(x.gpu_busy_us.0),
                dur_us(x.compute_us.0),
                dur_us(x.comm_us.0),
                x.kernels.to_string(),
            ]);
        } else if collectives {
            v.extend([
                dur_us((x.step_time_us.0 - x.collective_us.0).max(0.0)),
                dur_us(x.collective_us.0),
                x.collective.clone().unwrap_or_default(),
            ]);
        }
        t.row(cells(r, x.cycle, v));
    }
    t
}

fn straggler_line(r: &Report) -> String {
    let partial: Vec<String> = r
        .steps
        .iter()
        .filter(|s| s.partial)
        .map(|s| format!("rank {} step {}", s.rank, s.step))
        .collect();
    let note = if partial.is_empty() {
        String::new()
    } else {
        format!(
            "  partial: {} — the capture ended inside {} (the run's end or an interruption), \
             so {} teardown or part of an iteration; left out of step statistics\n",
            partial.join(", "),
            if partial.len() == 1 { "it" } else { "each" },
            if partial.len() == 1 {
                "it holds"
            } else {
                "each holds"
            }
        )
    };
    note + &straggler_text(r) + "\n"
}

/// The straggler sentence: who is slow, who waits for it how long and where; or why none is named.
fn straggler_text(r: &Report) -> String {
    use kinetrace_analysis::steps::{Basis, StragglerVerdict};
    if let Some(s) = &r.straggler {
        let what = match s.basis {
            Basis::Gpu => "compute kernel time",
            Basis::Cpu => "CPU time outside collectives",
        };
        let wait_in = s
            .wait_in
            .as_deref()
            .map(|c| format!("in {c}"))
            .unwrap_or_else(|| match s.basis {
                Basis::Gpu => "in communication kernels".into(),
                Basis::Cpu => "in collectives".into(),
            });
        return format!(
            "  straggler: rank {} is slow ({} per step of {what} vs {} on the other ranks; the \
             slowest in {} of {} shared steps); rank {} waits {} per step {wait_in} for it",
            s.rank,
            dur_us(s.mean_compute_us.0),
            dur_us(s.others_mean_compute_us.0),
            s.slowest_in_steps,
            s.steps_compared,
            s.waiting_rank,
            dur_us(s.waiting_rank_wait_us.0),
        );
    }
    let why = match &r.no_straggler {
        Some(StragglerVerdict::OneRank) | None => {
            "one rank only: nothing to compare it with".to_string()
        }
        Some(StragglerVerdict::NoSharedStep) => {
            "the ranks share no whole step (ProfilerStep numbers differ)".to_string()
        }
        Some(StragglerVerdict::NoBasis) => {
            "no basis to compare the ranks: no GPU kernel and no collective in their steps"
                .to_string()
        }
        Some(StragglerVerdict::Even {
            basis,
            slowest_us,
            others_us,
        }) => format!(
            "none: the ranks are even ({} per step of {} on the slowest, {} on the others, \
             within 5% of a step)",
            dur_us(slowest_us.0),
            match basis {
                Basis::Gpu => "compute kernel time",
                Basis::Cpu => "CPU time outside collectives",
            },
            dur_us(others_us.0)
        ),
    };
    format!("  straggler: {why}")
}

/// Memory devices, highest peak first.
fn memory_order(r: &Report) -> Vec<&kinetrace_analysis::memory::MemoryDevice> {
    let mut rows: Vec<_> = r.memory.iter().collect();
    rows.sort_by(|a, b| {
        b.peak_allocated_bytes
            .cmp(&a.peak_allocated_bytes)
            .then((a.rank, a.cycle, a.device).cmp(&(b.rank, b.cycle, b.device)))
    });
    rows
}

/// Per device (as many as the table shows): what ran at the peak, and the first step against
/// the later ones in one line.
/// Where memory numbers come from, when the traces have none.
pub const NO_MEMORY_EVENTS: &str = "  no [memory] events in the traces: record PyTorch's \
     allocator (CPU and GPU tensors) with kinetrace record --profile-memory (torch.profiler: \
     profile_memory=True), or the CUDA driver's allocations with --memory (nothing on a CPU-only \
     job)\n";

fn memory_lines(r: &Report, top: usize) -> String {
    let mut out = String::new();
    if r.memory.is_empty() {
        out.push_str(NO_MEMORY_EVENTS);
    }
    let shown = if top == 0 { usize::MAX } else { top };
    for x in memory_order(r).into_iter().take(shown) {
        let dev = if x.device < 0 {
            "cpu".to_owned()
        } else {
            format!("gpu {}", x.device)
        };
        let mut at = String::new();
        if let Some(s) = x.peak_step {
            at.push_str(&format!(" in step {s}"));
            if let Some(k) = x.peak_phase {
                at.push_str(&format!(" {}", k.as_str()));
            }
        }
        if let Some(ops) = &x.peak_ops {
            at.push_str(&format!(", running {ops}"));
        }
        let who = if r.has_cycles() {
            format!("rank {} cycle {}", x.rank, x.cycle)
        } else {
            format!("rank {}", x.rank)
        };
        if !at.is_empty() {
            out.push_str(&format!("  {who} {dev} peak:{at}\n"));
        }
        if let Some(note) = &x.first_step_note {
            out.push_str(&format!("  {who} {dev} first step: {note}\n"));
        }
    }
    out
}

fn memory(r: &Report) -> Table {
    let mut t = Table::new(
        "Memory per rank and device (highest peak first)",
        &cols(
            r,
            &[
                ("rank", Align::Right),
                ("device", Align::Left),
                ("peak allocated", Align::Right),
                ("at", Align::Right),
                ("in step", Align::Right),
                ("peak reserved", Align::Right),
                ("final", Align::Right),
                ("later − first step", Align::Right),
            ],
        ),
    );
    for x in memory_order(r) {
        t.row(cells(
            r,
            x.cycle,
            vec![
                x.rank.to_string(),
                if x.device < 0 {
                    "cpu".into()
                } else {
                    format!("gpu {}", x.device)
                },
                bytes(x.peak_allocated_bytes),
                format!("{:.2} ms", x.peak_at_ms),
                x.peak_step.map_or_else(|| "-".into(), |s| s.to_string()),
                bytes(x.peak_reserved_bytes),
                bytes(x.final_allocated_bytes),
                x.later_minus_first_bytes.map_or_else(
                    || "-".into(),
                    |d| format!("{}{}", if d > 0 { "+" } else { "" }, bytes(d)),
                ),
            ],
        ));
    }
    if r.memory.is_empty() {
        t.hidden = 0;
    }
    t
}
