//! `kinetrace convert IN OUT.pftrace`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;

/// Arguments of `kinetrace convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The Kineto trace to read (.json or .json.gz).
    pub input: PathBuf,
    /// The Perfetto trace to write (.pftrace).
    pub output: PathBuf,
}

/// Converts one trace and prints what was written.
pub fn run_convert(args: ConvertArgs) -> anyhow::Result<ExitCode> {
    if args.output.extension().is_none_or(|x| x != "pftrace") {
        bail!(
            "{}: the output must end in .pftrace (Perfetto's native format)",
            args.output.display()
        );
    }
    // The error names the file.
    let stats = kinetrace_perfetto::convert_file(&args.input, &args.output)?;
    let mut line = format!(
        "kinetrace: wrote {}: {} slices ({} overlap lanes), {} instants, {} counter values, {} flows",
        args.output.display(),
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
    eprintln!("{line}");
    Ok(ExitCode::SUCCESS)
}
