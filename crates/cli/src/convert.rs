//! `kinetrace convert IN [OUT]`: one trace, or every trace of a directory.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use kinetrace_perfetto::Stats;

use crate::cli::ReadArgs;

const CONVERT_AFTER_HELP: &str = "\
OUTPUT NAMES: a trace converts to its file name with `.gz` and then `.json` taken off its end and
`.pftrace` put on (rank0.pt.trace.json.gz -> rank0.pt.trace.pftrace), in OUT when OUT is a
directory, else beside the trace. A directory converts every *.json / *.gz file directly in it, one
line per file; a file that cannot be converted is reported, the others are still converted, and
the exit code is then 1.

EXAMPLES:
  kinetrace convert rank0.pt.trace.json.gz rank0.pftrace
  kinetrace convert ./traces                  every trace in ./traces, written beside it
  kinetrace convert ./traces ./perfetto       into ./perfetto (created if missing)";

/// Arguments of `kinetrace convert`.
#[derive(Debug, Args)]
#[command(after_help = CONVERT_AFTER_HELP)]
pub struct ConvertArgs {
    /// The Kineto trace to read (.json or .json.gz), or a directory of them.
    pub input: PathBuf,
    /// The Perfetto trace to write (.pftrace); for a directory, the directory to write into
    /// (created if missing). Left out: beside each trace (see OUTPUT NAMES).
    pub output: Option<PathBuf>,

    #[command(flatten)]
    pub read: ReadArgs,
}

/// The `.pftrace` name of a trace file: `.gz`, then `.json`, taken off its name, `.pftrace` put on.
pub fn pftrace_name(trace: &Path) -> OsString {
    let name = trace.file_name().unwrap_or_default().to_string_lossy();
    let stem = name.strip_suffix(".gz").unwrap_or(&name);
    let stem = stem.strip_suffix(".json").unwrap_or(stem);
    OsString::from(format!("{stem}.pftrace"))
}

/// Converts one trace, or each trace of a directory, and prints what was written.
pub fn run_convert(args: ConvertArgs) -> anyhow::Result<ExitCode> {
    let read = args.read.options();
    if args.input.is_dir() {
        return convert_dir(&args.input, args.output.as_deref(), &read);
    }
    let output = match args.output {
        Some(out) if out.is_dir() => out.join(pftrace_name(&args.input)),
        Some(out) => out,
        None => args.input.with_file_name(pftrace_name(&args.input)),
    };
    if output.extension().is_none_or(|x| x != "pftrace") {
        bail!(
            "{}: the output must end in .pftrace (Perfetto's native format)",
            output.display()
        );
    }
    // The error names the file (and the byte offset).
    let stats = kinetrace_perfetto::convert_file_with(&args.input, &output, &read)?;
    eprintln!("kinetrace: {}", wrote(&output, &stats));
    Ok(ExitCode::SUCCESS)
}

/// Every trace directly in `dir`, one at a time (memory holds one), into `out` or beside them.
fn convert_dir(
    dir: &Path,
    out: Option<&Path>,
    read: &kinetrace_perfetto::ReadOptions,
) -> anyhow::Result<ExitCode> {
    if let Some(out) = out {
        if out.extension().is_some_and(|x| x == "pftrace") {
            bail!(
                "{}: a directory converts into a directory (one .pftrace per trace), not into one file",
                out.display()
            );
        }
        // Through kinetrace-files: another user's symlink on the way is not followed.
        if let Err(e) = kinetrace_files::Dir::create_all(out) {
            bail!("{}: cannot create the output directory: {e}", out.display());
        }
    }
    let (files, problems) = kinetrace_analysis::discover(&[dir.to_path_buf()]);
    if let Some(p) = problems.first() {
        bail!("{p}");
    }
    let total = files.len();
    let mut failed = 0;
    // Output name → the trace it was converted from (two traces must not share one).
    let mut written: HashMap<PathBuf, &Path> = HashMap::new();
    for (i, file) in files.iter().enumerate() {
        let n = i + 1;
        let target = out.unwrap_or(dir).join(pftrace_name(file));
        if let Some(first) = written.get(&target) {
            failed += 1;
            eprintln!(
                "kinetrace: [{n}/{total}] {}: not converted: its output {} is {}'s",
                file.display(),
                target.display(),
                first.display()
            );
            continue;
        }
        match kinetrace_perfetto::convert_file_with(file, &target, read) {
            Ok(stats) => {
                eprintln!("kinetrace: [{n}/{total}] {}", wrote(&target, &stats));
                written.insert(target, file);
            }
            Err(e) => {
                failed += 1;
                eprintln!("kinetrace: [{n}/{total}] {e}");
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "kinetrace: converted {} of {total} traces in {}; {failed} failed (above)",
            total - failed,
            dir.display()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `wrote OUT: N slices …`.
fn wrote(output: &Path, stats: &Stats) -> String {
    let memory = if stats.memory_events > 0 {
        format!(
            " ({} [memory] events as allocated/reserved curves)",
            stats.memory_events
        )
    } else {
        String::new()
    };
    let mut line = format!(
        "wrote {}: {} slices ({} overlap lanes), {} instants, {} counter values{memory}, {} flows",
        output.display(),
        stats.slices,
        stats.overlap_lanes,
        stats.instants,
        stats.counter_values,
        stats.flows
    );
    if !stats.skipped.is_empty() {
        let s: Vec<String> = stats
            .skipped
            .iter()
            .map(|(ph, n)| format!("{n} × ph {ph}"))
            .collect();
        line.push_str(&format!("; not converted: {}", s.join(", ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_drop_gz_then_json() {
        for (trace, want) in [
            ("d/rank0.pt.trace.json.gz", "rank0.pt.trace.pftrace"),
            ("a.json", "a.pftrace"),
            ("b.gz", "b.pftrace"),
            ("c.json.json.gz", "c.json.pftrace"),
        ] {
            assert_eq!(pftrace_name(Path::new(trace)), OsString::from(want));
        }
    }
}
