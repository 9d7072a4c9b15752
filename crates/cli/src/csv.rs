//! The report as CSV files, one per table.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kinetrace_analysis::Report;

use crate::cli::Analysis;

pub(crate) fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

pub(crate) fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, num)
}

struct Csv {
    name: String,
    text: String,
}

impl Csv {
    fn new(name: &str, header: &[&str]) -> Csv {
        Csv {
            name: name.to_string(),
            text: header.join(",") + "\n",
        }
    }
    fn row(&mut self, cells: &[String]) {
        let cells: Vec<String> = cells.iter().map(|c| field(c)).collect();
        self.text.push_str(&cells.join(","));
        self.text.push('\n');
    }
}

/// Writes the selected tables into `dir`; returns the files written.
pub fn write(report: &Report, analyses: &[Analysis], dir: &Path) -> Result<Vec<PathBuf>> {
    let out = crate::output::dir(dir, "CSV")?;
    let mut files = Vec::new();
    for a in analyses {
        let tables = match a {
            Analysis::Efficiency => crate::efficiency_view::efficiency_csv(&report.efficiency),
            Analysis::Collectives => crate::efficiency_view::collectives_csv(&report.collectives),
            _ => Vec::new(),
        };
        for (name, text) in tables {
            files.push(Csv {
                name: name.to_string(),
                text,
            });
        }
        match a {
            Analysis::Temporal => {
                let mut c = Csv::new(
                    "temporal.csv",
                    &[
                        "rank",
                        "idle_time_us",
                        "compute_time_us",
                        "non_compute_time_us",
                        "kernel_time_us",
                        "idle_time_pctg",
                        "compute_time_pctg",
                        "non_compute_time_pctg",
                        "cycle",
                    ],
                );
                for t in &report.temporal_breakdown {
                    c.row(&[
                        t.rank.to_string(),
                        num(t.idle_time_us.0),
                        num(t.compute_time_us.0),
                        num(t.non_compute_time_us.0),
                        num(t.kernel_time_us.0),
                        opt(t.idle_time_pctg.get()),
                        opt(t.compute_time_pctg.get()),
                        opt(t.non_compute_time_pctg.get()),
                        t.cycle.to_string(),
                    ]);
                }
                files.push(c);
            }
            Analysis::Overlap => {
                let mut c = Csv::new("overlap.csv", &["rank", "comp_comm_overlap_pctg", "cycle"]);
                for o in &report.comm_comp_overlap {
                    c.row(&[
                        o.rank.to_string(),
                        opt(o.comp_comm_overlap_pctg.get()),
                        o.cycle.to_string(),
                    ]);
                }
                files.push(c);
            }
            Analysis::Idle => {
                let mut c = Csv::new(
                    "idle.csv",
                    &[
                        "rank",
                        "stream",
                        "idle_category",
                        "idle_time_us",
                        "idle_time_ratio",
                        "count",
                        "mean_us",
                        "std_us",
                        "min_us",
                        "p25_us",
                        "p50_us",
                        "p75_us",
                        "max_us",
                        "cycle",
                    ],
                );
                for i in &report.idle_time_breakdown {
                    let s = &i.interval_stats;
                    c.row(&[
                        i.rank.to_string(),
                        i.stream.to_string(),
                        i.idle_category.as_str().into(),
                        num(i.idle_time_us.0),
                        opt(i.idle_time_ratio.get()),
                        s.count.to_string(),
                        opt(s.mean),
                        opt(s.std),
                        opt(s.min),
                        opt(s.p25),
                        opt(s.p50),
                        opt(s.p75),
                        opt(s.max),
                        i.cycle.to_string(),
                    ]);
                }
                files.push(c);
            }
            Analysis::Kernels => {
                let mut c = Csv::new("kernel_types.csv", &["kernel_type", "sum_us", "percentage"]);
                for k in &report.kernel_type_breakdown {
                    c.row(&[
                        k.kernel_type.clone(),
                        k.sum_us.to_string(),
                        opt(k.percentage.get()),
                    ]);
                }
                files.push(c);
                let mut c = Csv::new(
                    "kernels.csv",
                    &[
                        "kernel_type",
                        "name",
                        "rank",
                        "sum_us",
                        "max_us",
                        "min_us",
                        "mean_us",
                        "stddev",
                        "count",
                        "launch_mean_us",
                        "launch_min_us",
                        "launch_max_us",
                        "launch_stddev_us",
                        "cycle",
                    ],
                );
                for k in &report.kernel_breakdown {
                    c.row(&[
                        k.kernel_type.as_str().into(),
                        k.name.clone(),
                        k.rank.to_string(),
                        num(k.sum_us.0),
                        num(k.max_us.0),
                        num(k.min_us.0),
                        num(k.mean_us.0),
                        num(k.stddev),
                        k.count.to_string(),
                        num(k.launch_mean_us.0),
                        num(k.launch_min_us.0),
                        num(k.launch_max_us.0),
                        num(k.launch_stddev_us.0),
                        k.cycle.to_string(),
                    ]);
                }
                files.push(c);
            }
            Analysis::Ops => {
                let mut c = Csv::new(
                    "ops.csv",
                    &[
                        "kind",
                        "name",
                        "count",
                        "cpu_self_us",
                        "cpu_total_us",
                        "gpu_self_us",
                        "gpu_total_us",
                        "shape",
                        "cpu_avg_us",
                        "gpu_avg_us",
                        "cpu_self_pct",
                        "cpu_total_pct",
                        "gpu_self_pct",
                        "gpu_total_pct",
                        "cpu_mem_self_bytes",
                        "cpu_mem_bytes",
                        "gpu_mem_self_bytes",
                        "gpu_mem_bytes",
                    ],
                );
                for o in &report.ops {
                    c.row(&[
                        o.kind.as_str().into(),
                        o.name.clone(),
                        o.count.to_string(),
                        num(o.cpu_self_us.0),
                        num(o.cpu_total_us.0),
                        num(o.gpu_self_us.0),
                        num(o.gpu_total_us.0),
                        o.shape.clone().unwrap_or_default(),
                        num(o.cpu_avg_us.0),
                        num(o.gpu_avg_us.0),
                        num(o.cpu_self_pct.0),
                        num(o.cpu_total_pct.0),
                        num(o.gpu_self_pct.0),
                        num(o.gpu_total_pct.0),
                        o.cpu_mem_self_bytes.to_string(),
                        o.cpu_mem_bytes.to_string(),
                        o.gpu_mem_self_bytes.to_string(),
                        o.gpu_mem_bytes.to_string(),
                    ]);
                }
                files.push(c);
            }
            Analysis::Steps => {
                let mut c = Csv::new(
                    "steps.csv",
                    &[
                        "rank",
                        "step",
                        "start_ms",
                        "step_time_us",
                        "gpu_busy_us",
                        "compute_us",
                        "comm_us",
                        "kernels",
                        "cycle",
                        "partial",
                    ],
                );
                for s in &report.steps {
                    c.row(&[
                        s.rank.to_string(),
                        s.step.to_string(),
                        num(s.start_ms),
                        num(s.step_time_us.0),
                        num(s.gpu_busy_us.0),
                        num(s.compute_us.0),
                        num(s.comm_us.0),
                        s.kernels.to_string(),
                        s.cycle.to_string(),
                        s.partial.to_string(),
                    ]);
                }
                files.push(c);
            }
            Analysis::Efficiency | Analysis::Collectives => {}
            Analysis::Memory => {
                let mut c = Csv::new(
                    "memory.csv",
                    &[
                        "rank",
                        "device",
                        "samples",
                        "peak_allocated_bytes",
                        "peak_at_ms",
                        "peak_step",
                        "peak_reserved_bytes",
                        "final_allocated_bytes",
                        "first_step_peak_bytes",
                        "later_steps_peak_bytes",
                        "peak_phase",
                        "peak_ops",
                        "first_step_reserved_bytes",
                        "later_steps_reserved_bytes",
                        "first_step_reserved_growth_bytes",
                        "later_steps_reserved_growth_bytes",
                        "first_step_note",
                        "cycle",
                    ],
                );
                let mut tl = Csv::new(
                    "memory_timeline.csv",
                    &[
                        "rank",
                        "device",
                        "t_ms",
                        "allocated_bytes",
                        "reserved_bytes",
                        "cycle",
                    ],
                );
                let o = |v: Option<i64>| v.map_or_else(String::new, |v| v.to_string());
                for m in &report.memory {
                    c.row(&[
                        m.rank.to_string(),
                        m.device.to_string(),
                        m.samples.to_string(),
                        m.peak_allocated_bytes.to_string(),
                        num(m.peak_at_ms),
                        o(m.peak_step),
                        m.peak_reserved_bytes.to_string(),
                        m.final_allocated_bytes.to_string(),
                        o(m.first_step_peak_bytes),
                        o(m.later_steps_peak_bytes),
                        m.peak_phase.map_or("", |k| k.as_str()).to_owned(),
                        m.peak_ops.clone().unwrap_or_default(),
                        o(m.first_step_reserved_bytes),
                        o(m.later_steps_reserved_bytes),
                        o(m.first_step_reserved_growth_bytes),
                        o(m.later_steps_reserved_growth_bytes),
                        m.first_step_note.clone().unwrap_or_default(),
                        m.cycle.to_string(),
                    ]);
                    for p in &m.timeline {
                        tl.row(&[
                            m.rank.to_string(),
                            m.device.to_string(),
                            num(p.t_ms),
                            p.allocated.to_string(),
                            p.reserved.to_string(),
                            m.cycle.to_string(),
                        ]);
                    }
                }
                files.push(c);
                files.push(tl);
            }
        }
    }
    let mut written = Vec::new();
    for c in files {
        written.push(crate::output::write_in(&out, &c.name, c.text.as_bytes())?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(num(f64::NAN), "");
        assert_eq!(num(12.0), "12");
    }
}
