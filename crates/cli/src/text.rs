//! The report as terminal tables, the most telling row of each first.

use kinetrace_analysis::Report;

use crate::cli::Analysis;
use crate::table::{bytes, clip, dur_us, pct, Align, Table};

const NAME_WIDTH: usize = 70;

/// Renders the selected analyses.
pub fn render(report: &Report, analyses: &[Analysis], top: usize) -> String {
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
            Analysis::Ops => vec![ops(report)],
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

fn ops(r: &Report) -> Table {
    let mut t = Table::new(
        "Ops and annotations, all ranks (most self CPU time first)",
        &[
            ("kind", Align::Left),
            ("name", Align::Left),
            ("count", Align::Right),
            ("self CPU", Align::Right),
            ("total CPU", Align::Right),
            ("self GPU", Align::Right),
            ("total GPU", Align::Right),
        ],
    );
    for x in &r.ops {
        t.row(vec![
            x.kind.as_str().into(),
            clip(&x.name, NAME_WIDTH),
            x.count.to_string(),
            dur_us(x.cpu_self_us.0),
            dur_us(x.cpu_total_us.0),
            dur_us(x.gpu_self_us.0),
            dur_us(x.gpu_total_us.0),
        ]);
    }
    t
}

fn steps(r: &Report) -> Table {
    let mut t = Table::new(
        "Steps per rank (slowest first)",
        &cols(
            r,
            &[
                ("rank", Align::Right),
                ("step", Align::Right),
                ("step time", Align::Right),
                ("GPU busy", Align::Right),
                ("compute", Align::Right),
                ("communication", Align::Right),
                ("kernels", Align::Right),
            ],
        ),
    );
    let mut rows: Vec<_> = r.steps.iter().collect();
    rows.sort_by(|a, b| {
        b.step_time_us
            .0
            .total_cmp(&a.step_time_us.0)
            .then((a.rank, a.step).cmp(&(b.rank, b.step)))
    });
    for x in rows {
        t.row(cells(
            r,
            x.cycle,
            vec![
                x.rank.to_string(),
                x.step.to_string(),
                dur_us(x.step_time_us.0),
                dur_us(x.gpu_busy_us.0),
                dur_us(x.compute_us.0),
                dur_us(x.comm_us.0),
                x.kernels.to_string(),
            ],
        ));
    }
    t
}

fn straggler_line(r: &Report) -> String {
    match &r.straggler {
        Some(s) => format!(
            "  straggler: rank {} had the most compute in {} of {} shared steps ({} per step vs \
             {} on the other ranks, which spent {} per step in communication)\n",
            s.rank,
            s.slowest_in_steps,
            s.steps_compared,
            dur_us(s.mean_compute_us.0),
            dur_us(s.others_mean_compute_us.0),
            dur_us(s.others_mean_comm_us.0)
        ),
        None => "  straggler: needs two or more ranks with the same ProfilerStep numbers\n".into(),
    }
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
fn memory_lines(r: &Report, top: usize) -> String {
    let mut out = String::new();
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
