/*!
HolisticTraceAnalysis's analyses over Kineto trace directories, as a library: the same numbers as
HTA 0.5.0 for its temporal breakdown, comm/comp overlap, idle-time breakdown and kernel breakdown,
plus an op table, step times with the straggler rank, and the memory timeline; the doctor's
rules ([`doctor`]: what costs time in a trace, and what to do about it) and the comparison of two
runs ([`diff`], in HTA `TraceDiff`'s terms).

The key design decision: **a rank is reduced to its summary as soon as it is read.** Each worker
thread reads one trace with the streaming reader of `kinetrace-export` into compact rows, runs
every analysis on them, and drops them before taking the next file, so memory holds at most one
parsed rank per worker, whatever the number of ranks. HTA's single cross-rank dependency (whether
its last-step filter applies, decided by the `ProfilerStep` strings of all ranks) is resolved when
the summaries are combined; a rank that cannot decide it alone carries both variants.

HTA's semantics, quirks included, are documented where they are copied: [`hta`] (which rows, the
step filter, the analyses), [`kernel`] (classification by name) and the rounding of float
timestamps in the rows module.

```no_run
use kinetrace_analysis::{analyze, discover, Options};

let (files, problems) = discover(&["traces/".into()]);
let report = analyze(&files, problems, &Options::default(), &|_| {});
for t in &report.temporal_breakdown {
    println!("rank {}: {:?}% idle", t.rank, t.idle_time_pctg.get());
}
```
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod collectives;
pub mod diff;
pub mod doctor;
pub mod efficiency;
mod fastmap;
pub mod flight;
pub mod hta;
mod iteration;
pub mod kernel;
mod load;
pub mod memory;
pub mod ops;
mod report;
mod rows;
pub mod stats;
pub mod steps;
pub mod units;

use std::path::PathBuf;

pub use diff::{diff, diff_sources, DiffOptions, DiffReport, StepChoice};
pub use doctor::{doctor, doctor_sources, DoctorOptions, DoctorReport};
pub use hta::HtaOptions;
/// The trace reader's limits, as the options of every run carry them.
pub use kinetrace_export::reader::ReadOptions;
pub use load::{discover, FileProblem, Options, Placement, Progress, RankSource, TraceSource};
pub use report::{KernelTypeShare, RankInfo, RankKernelTypeTime, Report};

/// Analyses `files` (one rank each). `problems` from [`discover`] are carried into the report.
/// `progress` is called after each file.
pub fn analyze(
    files: &[PathBuf],
    problems: Vec<FileProblem>,
    opts: &Options,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> Report {
    let sources: Vec<TraceSource> = files.iter().cloned().map(TraceSource::File).collect();
    analyze_sources(&sources, problems, opts, progress)
}

/// [`analyze`] over files or in-memory traces.
pub fn analyze_sources(
    sources: &[TraceSource],
    problems: Vec<FileProblem>,
    opts: &Options,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> Report {
    let results = load::summarize_all(sources, opts, progress);
    report::build(results, problems)
}
