//! `kinetrace diff`: compare two runs name by name and say where the time went.

use std::collections::BTreeMap;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use kinetrace_analysis::diff::{scope, summary, Basis, Change, Comparison, DiffReport, DiffRow};
use kinetrace_analysis::{diff, discover};

use crate::analyze::ProgressLine;
use crate::cli::DiffPlan;
use crate::diff_csv;
use crate::table::{clip, dur_us, Align, Table};

/// Runs the comparison. Exit code 0 when something was compared, 1 when not (a side unreadable,
/// or no rank in common).
pub fn run_diff(plan: DiffPlan) -> Result<ExitCode> {
    let (base, mut problems) = discover(std::slice::from_ref(&plan.base));
    let (new, more) = discover(std::slice::from_ref(&plan.new));
    problems.extend(more);
    let progress = ProgressLine {
        enabled: !plan.quiet && io::stderr().is_terminal() && base.len() + new.len() > 2,
        last: Mutex::new(None),
    };
    let started = Instant::now();
    let report = diff(&base, &new, problems, &plan.options, &|p| {
        progress.update(p)
    });
    progress.clear();
    let mut stderr = io::stderr().lock();
    for p in &report.problems {
        writeln!(stderr, "kinetrace: skipped {p}")?;
    }
    drop(stderr);
    if !report.compared_any() {
        eprintln!(
            "kinetrace: nothing to compare ({} base and {} new trace{} read)",
            report.base_files.len(),
            report.new_files.len(),
            if report.new_files.len() == 1 { "" } else { "s" }
        );
        return Ok(ExitCode::from(1));
    }
    if let Some(dir) = &plan.csv {
        let written = diff_csv::write(&report, dir)?;
        if !plan.quiet {
            eprintln!(
                "kinetrace: wrote {} CSV files into {}",
                written.len(),
                dir.display()
            );
        }
    }
    let mut stdout = io::stdout().lock();
    if plan.json {
        serde_json::to_writer_pretty(&mut stdout, &report).context("cannot write the JSON")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(render(&report, &plan, plan.top).as_bytes())?;
        if !plan.quiet {
            writeln!(
                stdout,
                "\n({} files in {:.2} s)",
                report.base_files.len() + report.new_files.len(),
                started.elapsed().as_secs_f64()
            )?;
        }
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn render(report: &DiffReport, plan: &DiffPlan, top: usize) -> String {
    let mut out = format!(
        "base: {} ({} file{}), new: {} ({} file{})\n",
        plan.base.display(),
        report.base_files.len(),
        if report.base_files.len() == 1 {
            ""
        } else {
            "s"
        },
        plan.new.display(),
        report.new_files.len(),
        if report.new_files.len() == 1 { "" } else { "s" },
    );
    for c in &report.comparisons {
        out.push('\n');
        comparison(c, top, &mut out);
    }
    out
}

fn signed(us: f64) -> String {
    if us > 0.0 {
        format!("+{}", dur_us(us))
    } else {
        dur_us(us)
    }
}

/// A count, with two decimals when it is a per-step mean.
fn count(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn signed_count(v: f64) -> String {
    if v > 0.0 {
        format!("+{}", count(v))
    } else {
        count(v + 0.0)
    }
}

/// A row's counts and times on the comparison's basis.
fn on_basis(r: &DiffRow, basis: Basis) -> (f64, f64, f64, f64) {
    match basis {
        Basis::Totals => (
            r.control_counts as f64,
            r.test_counts as f64,
            r.control_total_duration.0,
            r.test_total_duration.0,
        ),
        Basis::PerStepMean => (
            r.control_counts_per_step.unwrap_or_default(),
            r.test_counts_per_step.unwrap_or_default(),
            r.control_duration_per_step.map_or(0.0, |u| u.0),
            r.test_duration_per_step.map_or(0.0, |u| u.0),
        ),
    }
}

pub(crate) fn comparison(c: &Comparison, top: usize, out: &mut String) {
    let title = match (c.base_rank, c.new_rank) {
        (Some(b), Some(n)) if b == n => format!("rank {b}"),
        (Some(b), Some(n)) => format!("rank {b} vs rank {n}"),
        _ => "all ranks pooled".into(),
    };
    out.push_str(&format!("{title}: {}\n", summary(c)));
    out.push_str(&format!("  compared: {}\n", scope(c)));
    let per_step = c.basis == Basis::PerStepMean;
    let per = if per_step { " per step" } else { "" };
    let mut kinds = Table::new(
        format!("  time by kind{per} (ops and annotations nest: their totals overlap)"),
        &[
            ("kind", Align::Left),
            ("base", Align::Right),
            ("new", Align::Right),
            ("change", Align::Right),
        ],
    );
    for k in &c.by_kind {
        let (b, n) = if per_step {
            (
                k.base_per_step_us.map_or(0.0, |u| u.0),
                k.new_per_step_us.map_or(0.0, |u| u.0),
            )
        } else {
            (k.base_us.0, k.new_us.0)
        };
        kinds.row(vec![k.kind.into(), dur_us(b), dur_us(n), signed(n - b)]);
    }
    indent(&kinds.render(), out);
    let mut t = Table::new(
        format!("  names{per}, largest time change first"),
        &[
            ("name", Align::Left),
            ("kind", Align::Left),
            ("base #", Align::Right),
            ("new #", Align::Right),
            ("Δ #", Align::Right),
            ("base time", Align::Right),
            ("new time", Align::Right),
            ("Δ time", Align::Right),
            ("Δ %", Align::Right),
            ("count", Align::Left),
            ("time", Align::Left),
        ],
    );
    for r in &c.rows {
        let (bc, nc, bt, nt) = on_basis(r, c.basis);
        t.row(vec![
            clip(&r.name, 60),
            r.kind.into(),
            count(bc),
            count(nc),
            signed_count(nc - bc),
            dur_us(bt),
            dur_us(nt),
            signed(nt - bt),
            r.time_change_share
                .get()
                .map_or_else(|| "-".into(), |s| format!("{:+.1}%", 100.0 * s)),
            r.category.as_str().into(),
            r.time_category.as_str().into(),
        ]);
    }
    t.truncate(top);
    out.push('\n');
    indent(&t.render(), out);
    out.push_str(&format!(
        "  names by count (HTA's categories): {}\n",
        counts(&c.ops_diff)
    ));
    out.push_str(&format!(
        "  names by time (unchanged within ±{}% or 1 µs): {}\n",
        100.0 * c.time_threshold,
        counts(&c.time_diff)
    ));
}

/// "6 added, 3 deleted, …".
fn counts(by: &BTreeMap<Change, Vec<String>>) -> String {
    by.iter()
        .map(|(k, v)| format!("{} {}", v.len(), k.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Indents every line but the first (the table's title carries its own indent).
fn indent(text: &str, out: &mut String) {
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push_str("  ");
        }
        out.push_str(line);
        out.push('\n');
    }
}
