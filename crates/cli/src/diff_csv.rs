//! `kinetrace diff --csv DIR`: the comparison as two CSV files, one row per comparison
//! (`diff_comparisons.csv`) and one per name and comparison (`diff_names.csv`), with the fields
//! of `--json` (docs/diff.md).

use std::path::{Path, PathBuf};

use anyhow::Result;
use kinetrace_analysis::diff::{Comparison, DiffReport};
use kinetrace_analysis::units::{Num, Us};
use serde::Serialize;

use crate::csv::{field, num};

fn opt_i(v: Option<i64>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

fn opt_us(v: Option<Us>) -> String {
    v.map_or_else(String::new, |u| num(u.0))
}

fn opt_num(v: Option<Num>) -> String {
    v.and_then(Num::get).map_or_else(String::new, num)
}

/// The snake_case name serde gives an enum value (as in `--json`).
fn name_of(v: impl Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn line(text: &mut String, cells: &[String]) {
    let cells: Vec<String> = cells.iter().map(|c| field(c)).collect();
    text.push_str(&cells.join(","));
    text.push('\n');
}

fn ranks(c: &Comparison) -> [String; 2] {
    [opt_i(c.base_rank), opt_i(c.new_rank)]
}

/// Writes the two files into `dir` (each through a temporary file renamed into place, so a file
/// is either the old one or complete: crate::output); returns their paths.
pub fn write(report: &DiffReport, dir: &Path) -> Result<Vec<PathBuf>> {
    let out = crate::output::dir(dir, "CSV")?;
    let mut comparisons = String::from(
        "base_rank,new_rank,selection,basis,base_step,new_step,base_steps,new_steps,\
         base_rows_in_no_step,new_rows_in_no_step,base_mean_step_us,new_mean_step_us,\
         step_time_diff_us,step_time_diff_share,step_time_category,time_threshold\n",
    );
    let mut names = String::from(
        "base_rank,new_rank,name,kind,control_counts,test_counts,control_total_duration,\
         test_total_duration,diff_counts,diff_duration,counts_change_categories,category,\
         control_counts_per_step,test_counts_per_step,control_duration_per_step,\
         test_duration_per_step,time_change_share,time_category\n",
    );
    for c in &report.comparisons {
        let [br, nr] = ranks(c);
        line(
            &mut comparisons,
            &[
                br.clone(),
                nr.clone(),
                name_of(c.selection),
                name_of(c.basis),
                opt_i(c.base_step),
                opt_i(c.new_step),
                c.base_steps.to_string(),
                c.new_steps.to_string(),
                c.base_rows_in_no_step.to_string(),
                c.new_rows_in_no_step.to_string(),
                opt_us(c.base_mean_step_us),
                opt_us(c.new_mean_step_us),
                opt_us(c.step_time_diff_us),
                opt_num(c.step_time_diff_share),
                c.step_time_category
                    .map_or_else(String::new, |k| k.as_str().into()),
                num(c.time_threshold),
            ],
        );
        for r in &c.rows {
            line(
                &mut names,
                &[
                    br.clone(),
                    nr.clone(),
                    r.name.clone(),
                    r.kind.into(),
                    r.control_counts.to_string(),
                    r.test_counts.to_string(),
                    num(r.control_total_duration.0),
                    num(r.test_total_duration.0),
                    r.diff_counts.to_string(),
                    num(r.diff_duration.0),
                    r.counts_change_categories.into(),
                    r.category.as_str().into(),
                    r.control_counts_per_step.map_or_else(String::new, num),
                    r.test_counts_per_step.map_or_else(String::new, num),
                    opt_us(r.control_duration_per_step),
                    opt_us(r.test_duration_per_step),
                    opt_num(Some(r.time_change_share)),
                    r.time_category.as_str().into(),
                ],
            );
        }
    }
    let mut written = Vec::new();
    for (file, text) in [
        ("diff_comparisons.csv", comparisons),
        ("diff_names.csv", names),
    ] {
        written.push(crate::output::write_in(&out, file, text.as_bytes())?);
    }
    Ok(written)
}
