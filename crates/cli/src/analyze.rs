//! `kinetrace analyze`: read every rank in parallel, print tables (or JSON), write CSV and SVG.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kinetrace_analysis::{analyze, discover, Progress, Report};

use crate::cli::{Analysis, AnalyzePlan};
use crate::{csv, svg, text};

/// Top-level JSON keys of each analysis (the rest: ranks, problems, notes, step_filter_applied).
fn json_keys(a: Analysis) -> &'static [&'static str] {
    match a {
        Analysis::Temporal => &["temporal_breakdown"],
        Analysis::Overlap => &["comm_comp_overlap"],
        Analysis::Idle => &["idle_time_breakdown"],
        Analysis::Kernels => &[
            "kernel_type_breakdown",
            "kernel_type_breakdown_per_rank",
            "kernel_breakdown",
        ],
        Analysis::Ops => &["ops"],
        Analysis::Efficiency => &["efficiency"],
        Analysis::Collectives => &["collectives"],
        Analysis::Steps => &["steps", "straggler", "no_straggler"],
        Analysis::Memory => &["memory"],
    }
}

/// A one-line progress indicator on stderr, redrawn at most every 100 ms, only on a terminal.
pub(crate) struct ProgressLine {
    pub(crate) enabled: bool,
    pub(crate) last: Mutex<Option<Instant>>,
}

impl ProgressLine {
    pub(crate) fn update(&self, p: &Progress<'_>) {
        if !self.enabled {
            return;
        }
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        let now = Instant::now();
        if p.done < p.total && last.is_some_and(|t| now - t < Duration::from_millis(100)) {
            return;
        }
        *last = Some(now);
        let mb = |b: u64| b as f64 / 1e6;
        let _ = write!(
            io::stderr(),
            "\r\x1b[2Kreading traces: {}/{} files, {:.0}/{:.0} MB",
            p.done,
            p.total,
            mb(p.done_bytes),
            mb(p.total_bytes)
        );
    }

    pub(crate) fn clear(&self) {
        if self.enabled {
            let _ = write!(io::stderr(), "\r\x1b[2K");
        }
    }
}

/// Runs the analyses. Exit code 0 when at least one rank was analysed, 1 when none could be.
pub fn run_analyze(plan: AnalyzePlan) -> Result<ExitCode> {
    let (files, problems) = discover(&plan.paths);
    let progress = ProgressLine {
        enabled: !plan.quiet && io::stderr().is_terminal() && files.len() > 1,
        last: Mutex::new(None),
    };
    let started = Instant::now();
    let mut report = analyze(&files, problems, &plan.options, &|p| progress.update(p));
    progress.clear();
    plan.sort.sort(&mut report.ops);

    let mut stderr = io::stderr().lock();
    for p in &report.problems {
        writeln!(stderr, "kinetrace: skipped {p}")?;
    }
    if !plan.quiet {
        for n in &report.notes {
            writeln!(stderr, "kinetrace: note: {n}")?;
        }
    }
    drop(stderr);
    if !report.analysed_any() {
        eprintln!(
            "kinetrace: nothing could be analysed ({} input{} with problems above)",
            report.problems.len(),
            if report.problems.len() == 1 { "" } else { "s" }
        );
        return Ok(ExitCode::from(1));
    }

    if let Some(dir) = &plan.csv {
        let written = csv::write(&report, &plan.analyses, dir)?;
        if !plan.quiet {
            eprintln!(
                "kinetrace: wrote {} CSV files into {}",
                written.len(),
                dir.display()
            );
        }
    }
    if let Some(path) = &plan.plot {
        crate::output::write_file(path, svg::render(&report).as_bytes())
            .with_context(|| format!("cannot write the plot to {}", path.display()))?;
        if !plan.quiet {
            eprintln!("kinetrace: wrote {}", path.display());
        }
    }
    let mut stdout = io::stdout().lock();
    if plan.json {
        write_json(&report, &plan.analyses, &mut stdout)?;
    } else {
        stdout.write_all(text::render(&report, &plan.analyses, plan.top, plan.sort).as_bytes())?;
        if !plan.quiet {
            writeln!(
                stdout,
                "\n({} file{} in {:.2} s)",
                report.ranks.len() + report.problems.len(),
                if report.ranks.len() + report.problems.len() == 1 {
                    ""
                } else {
                    "s"
                },
                started.elapsed().as_secs_f64()
            )?;
        }
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn write_json(report: &Report, analyses: &[Analysis], out: &mut impl Write) -> Result<()> {
    let mut value = serde_json::to_value(report).context("cannot serialise the report")?;
    if let Some(obj) = value.as_object_mut() {
        for a in Analysis::ALL {
            if !analyses.contains(&a) {
                for k in json_keys(a) {
                    obj.remove(*k);
                }
            }
        }
    }
    serde_json::to_writer_pretty(&mut *out, &value)?;
    writeln!(out)?;
    Ok(())
}
