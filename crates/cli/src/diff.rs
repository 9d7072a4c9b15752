//! `kinetrace diff`: compare two runs name by name and say where the time went.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use kinetrace_analysis::diff::{summary, Comparison, DiffReport};
use kinetrace_analysis::{diff, discover};

use crate::analyze::ProgressLine;
use crate::cli::DiffPlan;
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

fn comparison(c: &Comparison, top: usize, out: &mut String) {
    let title = match (c.base_rank, c.new_rank) {
        (Some(b), Some(n)) if b == n => format!("rank {b}"),
        (Some(b), Some(n)) => format!("rank {b} vs rank {n}"),
        _ => "all ranks pooled".into(),
    };
    out.push_str(&format!("{title}: {}\n", summary(c)));
    let mut kinds = Table::new(
        "  time by kind (ops and annotations nest: their totals overlap)",
        &[
            ("kind", Align::Left),
            ("base", Align::Right),
            ("new", Align::Right),
            ("change", Align::Right),
        ],
    );
    for k in &c.by_kind {
        kinds.row(vec![
            k.kind.into(),
            dur_us(k.base_us.0),
            dur_us(k.new_us.0),
            signed(k.diff_us.0),
        ]);
    }
    indent(&kinds.render(), out);
    let mut t = Table::new(
        "  names, largest duration change first",
        &[
            ("name", Align::Left),
            ("kind", Align::Left),
            ("base #", Align::Right),
            ("new #", Align::Right),
            ("Δ #", Align::Right),
            ("base time", Align::Right),
            ("new time", Align::Right),
            ("Δ time", Align::Right),
            ("change", Align::Left),
        ],
    );
    for r in &c.rows {
        t.row(vec![
            clip(&r.name, 60),
            r.kind.into(),
            r.control_counts.to_string(),
            r.test_counts.to_string(),
            if r.diff_counts > 0 {
                format!("+{}", r.diff_counts)
            } else {
                r.diff_counts.to_string()
            },
            dur_us(r.control_total_duration.0),
            dur_us(r.test_total_duration.0),
            signed(r.diff_duration.0),
            r.category.as_str().into(),
        ]);
    }
    t.truncate(top);
    out.push('\n');
    indent(&t.render(), out);
    let counts: Vec<String> = c
        .ops_diff
        .iter()
        .map(|(k, v)| format!("{} {}", v.len(), k.as_str()))
        .collect();
    out.push_str(&format!("  names: {}\n", counts.join(", ")));
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
