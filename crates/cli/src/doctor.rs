//! `kinetrace doctor`: run the rules over every rank and print the findings, most costly first.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use kinetrace_analysis::doctor::{DoctorReport, Finding};
use kinetrace_analysis::flight::{flight_dumps, FlightDump};
use kinetrace_analysis::{discover, doctor, DiffOptions};

use crate::analyze::ProgressLine;
use crate::cli::DoctorPlan;
use crate::table::{clip, dur_us, Align, Table};

/// Runs the doctor. Exit code 0 when at least one trace was read (findings or not), 1 when none.
pub fn run_doctor(plan: DoctorPlan) -> Result<ExitCode> {
    let (files, problems) = discover(&plan.paths);
    let progress = ProgressLine {
        enabled: !plan.quiet && io::stderr().is_terminal() && files.len() > 1,
        last: Mutex::new(None),
    };
    let started = Instant::now();
    let report = doctor(&files, problems, &plan.options, &|p| progress.update(p));
    progress.clear();
    let mut stderr = io::stderr().lock();
    for p in &report.problems {
        writeln!(stderr, "kinetrace: skipped {p}")?;
    }
    drop(stderr);
    if !report.read_any() {
        eprintln!(
            "kinetrace: no trace could be read ({} input{} with problems above)",
            report.problems.len(),
            if report.problems.len() == 1 { "" } else { "s" }
        );
        return Ok(ExitCode::from(1));
    }
    let mut stdout = io::stdout().lock();
    // Flight dumps first, from their trigger.
    let opts = DiffOptions {
        read: plan.options.read,
        ..DiffOptions::default()
    };
    let (dumps, problems) = flight_dumps(&files, &opts);
    for p in problems {
        eprintln!("kinetrace: flight dump not read: {p}");
    }
    if plan.json {
        // The report's object with one more key, `flight`: an object per dump (empty without).
        let mut doc = serde_json::to_value(&report).context("cannot write the JSON")?;
        if let Some(o) = doc.as_object_mut() {
            let flight = serde_json::to_value(&dumps).context("cannot write the JSON")?;
            o.insert("flight".into(), flight);
        }
        serde_json::to_writer_pretty(&mut stdout, &doc).context("cannot write the JSON")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(render_flight(&dumps).as_bytes())?;
        stdout.write_all(render(&report).as_bytes())?;
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

/// Flight dumps, each from its trigger: a slow step against the steps before it; for hangs, the
/// op each rank was stuck in and the last collective it finished. Empty without flight dumps.
pub fn render_flight(dumps: &[FlightDump]) -> String {
    let mut out = String::new();
    for d in dumps {
        let rank = d
            .rank
            .map_or_else(|| "rank ?".to_string(), |r| format!("rank {r}"));
        out.push_str(&format!(
            "Flight dump, {rank} ({}): {}
",
            d.trigger, d.reason
        ));
        let steps = d.steps.map_or_else(
            || "no steps".to_string(),
            |(a, b)| format!("steps {a}..={b}"),
        );
        out.push_str(&format!(
            "  {steps} in {}
",
            d.file.display()
        ));
        if let Some(c) = &d.slow_step {
            out.push_str("  the slow step against the steps before it in this dump:\n  ");
            crate::diff::comparison(c, 10, &mut out);
        }
        if let Some(op) = &d.hang_op {
            out.push_str(&format!("  stuck in: {op}\n"));
        }
        if d.trigger == "hang" || d.hang_op.is_some() {
            match &d.last_collective {
                Some(l) => out.push_str(&format!(
                    "  last collective finished: {} ({}), {} before the dump\n",
                    l.name,
                    dur_us(l.dur_us),
                    dur_us(l.ended_us_before_dump)
                )),
                None => out.push_str("  last collective finished: none in this dump\n"),
            }
        }
        out.push('\n');
    }
    let hangs: Vec<&FlightDump> = dumps.iter().filter(|d| d.trigger == "hang").collect();
    if hangs.len() > 1 {
        let mut t = Table::new(
            "Hang: each rank's last collective",
            &[
                ("rank", Align::Right),
                ("stuck in", Align::Left),
                ("last finished", Align::Left),
                ("before the dump", Align::Right),
            ],
        );
        for d in hangs {
            t.row(vec![
                d.rank.map_or_else(|| "?".into(), |r| r.to_string()),
                d.hang_op.clone().unwrap_or_else(|| "-".into()),
                d.last_collective
                    .as_ref()
                    .map_or_else(|| "none".into(), |l| clip(&l.name, 60)),
                d.last_collective
                    .as_ref()
                    .map_or_else(|| "-".into(), |l| dur_us(l.ended_us_before_dump)),
            ]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    out
}

/// The report as text: a header line, then one block per finding.
pub fn render(report: &DoctorReport) -> String {
    let mut out = String::new();
    let mut ranks: Vec<i64> = report.ranks.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let steps: usize = report.ranks.iter().map(|r| r.steps).sum();
    let n = report.findings.len();
    let cycles = |rank: i64| {
        report
            .ranks
            .iter()
            .find(|r| r.rank == rank)
            .map_or(1, |r| r.cycles)
    };
    out.push_str(&format!(
        "{} trace{} read (rank{} {}), {} step{}: {} finding{}\n",
        report.ranks.len(),
        if report.ranks.len() == 1 { "" } else { "s" },
        if ranks.len() == 1 { "" } else { "s" },
        ranks
            .iter()
            .map(|&r| match cycles(r) {
                1 => r.to_string(),
                n => format!("{r} in cycles 0–{}", n - 1),
            })
            .collect::<Vec<_>>()
            .join(", "),
        steps,
        if steps == 1 { "" } else { "s" },
        n,
        if n == 1 { "" } else { "s" },
    ));
    if steps == 0 {
        out.push_str(
            "  no ProfilerStep annotations: costs are for the whole trace, not per step\n",
        );
    }
    if n == 0 {
        out.push_str(&format!(
            "\nno findings: none of the {} rules fired\n",
            kinetrace_analysis::doctor::RULES.len()
        ));
    }
    for f in &report.findings {
        out.push('\n');
        finding(f, report.ranks.iter().any(|r| r.cycles > 1), &mut out);
    }
    out
}

fn ranks_text(ranks: &[i64]) -> String {
    let list: Vec<String> = ranks.iter().map(i64::to_string).collect();
    format!(
        "rank{} {}",
        if ranks.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

fn finding(f: &Finding, cycled: bool, out: &mut String) {
    out.push_str(&format!(
        "{}[{}]: {}\n",
        f.severity.as_str(),
        f.rule,
        f.title
    ));
    let worst = f
        .examples
        .first()
        .map(|e| e.rank)
        .or_else(|| f.evidence.first().map(|e| e.rank));
    let per = if f.per_step {
        "per step"
    } else {
        "in the trace"
    };
    match (f.cost_per_step_us, worst) {
        (Some(c), Some(w)) if f.ranks.len() > 1 => out.push_str(&format!(
            "  cost: {} {per}{} on rank {w}, the worst of {}\n",
            dur_us(c.0),
            share(f),
            ranks_text(&f.ranks)
        )),
        (Some(c), _) => out.push_str(&format!(
            "  cost: {} {per}{} ({})\n",
            dur_us(c.0),
            share(f),
            ranks_text(&f.ranks)
        )),
        (None, _) => out.push_str(&format!("  on {}\n", ranks_text(&f.ranks))),
    }
    wrap(&f.summary, "  ", "  ", out);
    if !f.evidence.is_empty() {
        // Findings that count without a time (drops, memory states) get no time columns.
        let timed = f.evidence.iter().any(|e| e.time_us.0 != 0.0);
        let mut columns = vec![
            ("rank", Align::Right),
            ("what", Align::Left),
            ("count", Align::Right),
            ("per step", Align::Right),
        ];
        if timed {
            columns.extend([("time", Align::Right), ("per step ", Align::Right)]);
        }
        let mut t = Table::new("  evidence:", &columns);
        for e in &f.evidence {
            let mut row = vec![
                e.rank.to_string(),
                clip(&e.what, 80),
                e.count.to_string(),
                format!("{:.1}", e.count_per_step),
            ];
            if timed {
                row.extend([dur_us(e.time_us.0), dur_us(e.time_per_step_us.0)]);
            }
            t.row(row);
        }
        indent(&t.render(), out);
    }
    if !f.examples.is_empty() {
        out.push_str("  look at (Perfetto time from the trace start; ts as in the file):\n");
        for e in &f.examples {
            let cycle = if cycled {
                format!(" cycle {}", e.cycle)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "    rank {}{cycle} at {:.3} ms: {} ({}), ts {:.3}\n",
                e.rank,
                e.at_ms,
                clip(&e.name, 80),
                dur_us(e.dur_us.0),
                e.ts_us
            ));
        }
    }
    wrap(f.fix, "  fix: ", "       ", out);
}

fn share(f: &Finding) -> String {
    f.cost_share
        .and_then(|s| s.get())
        .map_or_else(String::new, |s| {
            let of = if f.per_step { "step" } else { "trace" };
            format!(" ({:.1}% of the {of})", 100.0 * s)
        })
}

/// Indents every line of a rendered table by two more spaces (the title keeps its own).
fn indent(text: &str, out: &mut String) {
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push_str("  ");
        }
        out.push_str(line);
        out.push('\n');
    }
}

/// Word-wraps `text` at 100 columns, the first line after `first`, the rest after `rest`.
fn wrap(text: &str, first: &str, rest: &str, out: &mut String) {
    const WIDTH: usize = 100;
    let mut line = String::from(first);
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = String::from(rest);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    if !empty {
        out.push_str(&line);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_word_boundaries() {
        let mut out = String::new();
        let text = "word ".repeat(40);
        wrap(&text, "  fix: ", "       ", &mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.len() > 1);
        assert!(lines.iter().all(|l| l.chars().count() <= 100), "{out}");
        assert!(lines[0].starts_with("  fix: word"));
        assert!(lines[1].starts_with("       word"));
    }
}
