//! The command line, as clap types. Nothing outside this crate sees them: each subcommand's
//! arguments become a plain, validated plan first.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kinetrace_analysis::efficiency::PeakOverride;
use kinetrace_analysis::{HtaOptions, Options, ReadOptions, StepChoice};

use crate::op_sort::{GroupBy, OpSort};

/// kinetrace: an in-process GPU profiler that writes Kineto (PyTorch profiler) traces, and the
/// tools to read them.
#[derive(Debug, Parser)]
#[command(name = "kinetrace", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Analyse Kineto traces (one file per rank): HolisticTraceAnalysis's numbers, in a fraction
    /// of the time.
    Analyze(AnalyzeArgs),
    /// Find what costs time in Kineto traces and say what to do about it: findings, most costly
    /// first, with evidence and the direction of the fix.
    Doctor(DoctorArgs),
    /// Compare two runs: per name, counts and durations in each and the change (HTA TraceDiff's
    /// numbers and categories), the step time change, and where the time went.
    Diff(DiffArgs),
    /// Run a command with GPU profiling (no code changes), then list the traces and summarise them.
    Record(crate::record::RecordArgs),
    /// Ask running kinetrace-enabled processes to capture now (on-demand profiling).
    Trigger(crate::trigger::TriggerArgs),
    /// Convert a Kineto trace (.json or .json.gz, kinetrace's or PyTorch's) to Perfetto's native
    /// format (.pftrace): overlapping slices in lanes, flows, args as debug annotations.
    Convert(crate::convert::ConvertArgs),
}

/// The trace reader's limits: one flag, the same on every command that reads traces.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The longest single JSON value a trace may hold (one trace event, or one top-level value),
    /// in bytes or with a K, M or G suffix (KiB, MiB, GiB). A file with a longer one is reported
    /// (the file and the byte offset) instead of being read into memory.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "64M",
        value_parser = parse_size
    )]
    pub max_value_size: usize,
}

impl ReadArgs {
    /// The reader's options.
    pub fn options(&self) -> ReadOptions {
        ReadOptions {
            max_value_bytes: self.max_value_size,
        }
    }
}

/// A size: a number of bytes, or with a `K`, `M` or `G` suffix (`KiB`, `MiB`, `GiB` too).
fn parse_size(s: &str) -> Result<usize, String> {
    let bad = || {
        format!("expected a size in bytes, or with a K, M or G suffix (KiB, MiB, GiB), like 64M or 1G; got `{s}`")
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(bad()),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(1usize << shift).ok_or_else(bad)?;
    if bytes < 1024 {
        return Err(format!(
            "must be at least 1K (a trace event alone takes more); got `{s}`"
        ));
    }
    Ok(bytes)
}

/// The analyses, selectable with `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Analysis {
    /// Idle / compute / non-compute GPU time per rank (HTA get_temporal_breakdown).
    Temporal,
    /// Share of communication time overlapped by computation, per rank (HTA get_comm_comp_overlap).
    Overlap,
    /// GPU idle gaps per rank and stream: host wait, kernel wait, other (HTA get_idle_time_breakdown).
    Idle,
    /// Time by kernel type and their overlaps, and the top kernels per type and rank (HTA get_gpu_kernel_breakdown).
    Kernels,
    /// CPU ops and annotations by self CPU time and by the GPU time of the kernels they launched (like key_averages).
    Ops,
    /// Per-op FLOPs and bytes from the shapes, achieved TFLOP/s and TB/s, the roofline; GPU time by category.
    Efficiency,
    /// Collectives by kind, group, dtype and size: time, algorithm and bus bandwidth; each rank's wait for the others.
    Collectives,
    /// Time of each ProfilerStep per rank, and the straggler rank that keeps the others waiting.
    Steps,
    /// Allocated/reserved memory over time from [memory] events: peak, when, first step vs later steps.
    Memory,
}

impl Analysis {
    /// All analyses, in report order.
    pub const ALL: [Analysis; 9] = [
        Analysis::Temporal,
        Analysis::Overlap,
        Analysis::Idle,
        Analysis::Kernels,
        Analysis::Ops,
        Analysis::Efficiency,
        Analysis::Collectives,
        Analysis::Steps,
        Analysis::Memory,
    ];

    /// Whether it is about GPU rows only (nothing to show on a CPU-only trace).
    pub fn needs_gpu(self) -> bool {
        matches!(
            self,
            Analysis::Temporal
                | Analysis::Overlap
                | Analysis::Idle
                | Analysis::Kernels
                | Analysis::Collectives
        )
    }

    /// Its `--only` name.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }
}

const ANALYZE_AFTER_HELP: &str = "\
ANALYSES (all by default; pick some with --only):
  temporal  idle / compute / non-compute GPU time per rank (HTA get_temporal_breakdown)
  overlap   share of communication time overlapped by computation per rank (HTA get_comm_comp_overlap)
  idle      GPU idle gaps per rank and stream: host wait, kernel wait, other (HTA get_idle_time_breakdown)
  kernels   time by kernel type and overlaps, top kernels per type and rank (HTA get_gpu_kernel_breakdown)
  ops       CPU ops and annotations by self CPU time and GPU time of their kernels (like key_averages)
  efficiency  per-op FLOPs and bytes from the shapes, achieved TFLOP/s and TB/s against the
            device's roofline (vendor peaks; --peak-tflops/--peak-bandwidth), GPU time by category
  collectives  collectives by kind, group, dtype and size: time, algorithm and bus bandwidth
            (nccl-tests); across ranks each collective's transfer time and each rank's wait
  steps     time of each ProfilerStep per rank, and the straggler rank
  memory    allocated/reserved memory over time from [memory] events: peak, when, step growth

The first four give HolisticTraceAnalysis 0.5.0's numbers, quirks included (it drops the last
ProfilerStep and rounds float timestamps inward to whole µs).

EXAMPLES:
  kinetrace analyze ./traces                      tables for every rank in ./traces
  kinetrace analyze ./traces --only temporal,idle
  kinetrace analyze ./traces --json > report.json
  kinetrace analyze rank0.json.gz rank1.json.gz --csv out/ --plot out/report.svg";

/// `kinetrace analyze`.
#[derive(Debug, Args)]
#[command(after_help = ANALYZE_AFTER_HELP)]
pub struct AnalyzeArgs {
    /// Trace directories (every *.json / *.gz file in them, one per rank) or trace files.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Run only these analyses (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "ANALYSIS")]
    pub only: Vec<Analysis>,

    /// Print the report as JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Also write one CSV file per table into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub csv: Option<PathBuf>,

    /// Also draw the temporal breakdown per rank and the memory timeline into an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Idle gaps shorter than this many µs count as kernel wait (HTA's consecutive_kernel_delay).
    #[arg(long, default_value_t = 30.0, value_name = "US")]
    pub kernel_wait_us: f64,

    /// Kernels listed per type and rank before the rest become "others" (HTA's num_kernels).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub num_kernels: usize,

    /// Kernels past this fraction of cumulative time become "others" (HTA's duration_ratio).
    #[arg(long, default_value_t = 0.8, value_name = "RATIO")]
    pub duration_ratio: f64,

    /// Keep the last ProfilerStep, which HTA drops by default (HTA's include_last_profiler_step).
    #[arg(long)]
    pub include_last_step: bool,

    /// Rows per table in the terminal (0: all).
    #[arg(long, default_value_t = 15, value_name = "N")]
    pub top: usize,

    /// Sort the op table by this column, largest first (torch's sort_by names work too:
    /// self_cpu_time_total, cpu_time_total, cpu_time, self_cuda_time_total, count, ...).
    #[arg(long, value_enum, default_value_t = OpSort::SelfCpu, value_name = "COLUMN")]
    pub sort: OpSort,

    /// Group the op table by input shape too (`Input Dims`; record with --record-shapes).
    #[arg(long, value_enum, value_name = "WHAT")]
    pub group_by: Option<GroupBy>,

    /// The device's compute peak in TFLOP/s, for every op (replaces the peaks table's figures;
    /// with --peak-bandwidth, gives a roofline on a device the table does not know).
    #[arg(long, value_name = "TFLOPS")]
    pub peak_tflops: Option<f64>,

    /// The device's memory bandwidth in TB/s (10¹² bytes per second).
    #[arg(long, value_name = "TBPS")]
    pub peak_bandwidth: Option<f64>,

    /// Worker threads reading traces (default: one per CPU).
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,

    /// No progress indicator and no notes on stderr (problems with files are still reported).
    #[arg(short, long)]
    pub quiet: bool,

    #[command(flatten)]
    pub read: ReadArgs,
}

/// A validated `analyze` invocation.
#[derive(Debug, Clone)]
pub struct AnalyzePlan {
    /// Inputs.
    pub paths: Vec<PathBuf>,
    /// Selected analyses, in report order.
    pub analyses: Vec<Analysis>,
    /// JSON instead of tables.
    pub json: bool,
    /// CSV directory.
    pub csv: Option<PathBuf>,
    /// SVG file.
    pub plot: Option<PathBuf>,
    /// Terminal rows per table (`usize::MAX` for all).
    pub top: usize,
    /// Quiet.
    pub quiet: bool,
    /// The op table's order.
    pub sort: OpSort,
    /// Library options.
    pub options: Options,
}

impl AnalyzeArgs {
    /// Checks the arguments and builds the plan.
    pub fn plan(self) -> Result<AnalyzePlan> {
        if !(self.kernel_wait_us.is_finite() && self.kernel_wait_us >= 0.0) {
            bail!(
                "--kernel-wait-us must be a number of µs ≥ 0, got {}",
                self.kernel_wait_us
            );
        }
        if !(self.duration_ratio > 0.0 && self.duration_ratio <= 1.0) {
            bail!(
                "--duration-ratio must be in (0, 1], got {} (HTA's default is 0.8)",
                self.duration_ratio
            );
        }
        if self.num_kernels == 0 {
            bail!("--num-kernels must be at least 1 (HTA's default is 10)");
        }
        if let Some(plot) = &self.plot {
            if plot.extension().and_then(|e| e.to_str()) != Some("svg") {
                bail!(
                    "--plot writes SVG: give a file name ending in .svg (got {})",
                    plot.display()
                );
            }
        }
        if self.jobs == Some(0) {
            bail!("--jobs must be at least 1 (leave it out for one per CPU)");
        }
        let peaks = peak_override(self.peak_tflops, self.peak_bandwidth)?;
        let analyses = if self.only.is_empty() {
            Analysis::ALL.to_vec()
        } else {
            Analysis::ALL
                .into_iter()
                .filter(|a| self.only.contains(a))
                .collect()
        };
        Ok(AnalyzePlan {
            paths: self.paths,
            analyses,
            json: self.json,
            csv: self.csv,
            plot: self.plot,
            top: if self.top == 0 { usize::MAX } else { self.top },
            quiet: self.quiet,
            sort: self.sort,
            options: Options {
                hta: HtaOptions {
                    kernel_wait_threshold_us: self.kernel_wait_us,
                    num_kernels: self.num_kernels,
                    duration_ratio: self.duration_ratio,
                    include_last_step: self.include_last_step,
                },
                jobs: self.jobs.unwrap_or(0),
                ops_by_shape: self.group_by == Some(GroupBy::Shape),
                read: self.read.options(),
                peaks,
                ..Options::default()
            },
        })
    }
}

/// `--peak-tflops` and `--peak-bandwidth`: positive numbers.
fn peak_override(tflops: Option<f64>, tb_per_s: Option<f64>) -> Result<PeakOverride> {
    for (flag, v, example) in [
        ("--peak-tflops", tflops, "989.5 (H100 SXM, bf16 dense)"),
        ("--peak-bandwidth", tb_per_s, "3.35 (H100 SXM)"),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                bail!("{flag} must be a number > 0, such as {example}; got {v}");
            }
        }
    }
    Ok(PeakOverride { tflops, tb_per_s })
}

const DOCTOR_AFTER_HELP: &str = "\
Each finding names the fault, its estimated cost per step, the evidence (ops, kernels, calls,
ranks, with counts and times), two or three places to look at in Perfetto, and the direction of
the fix. The rules, their thresholds and why: docs/doctor.md.

The exit code is 0 whenever at least one trace was read, findings or not; 1 when none could be.

EXAMPLES:
  kinetrace doctor ./traces                  every rank in ./traces
  kinetrace doctor rank0.json.gz --json      findings as JSON (layout in docs/doctor.md)";

/// `kinetrace doctor`.
#[derive(Debug, Args)]
#[command(after_help = DOCTOR_AFTER_HELP)]
pub struct DoctorArgs {
    /// Trace directories (every *.json / *.gz file in them, one per rank) or trace files.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Print the findings as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,

    /// The device's compute peak in TFLOP/s, for every op (the roofline rule; replaces the
    /// peaks table's figures).
    #[arg(long, value_name = "TFLOPS")]
    pub peak_tflops: Option<f64>,

    /// The device's memory bandwidth in TB/s (10¹² bytes per second).
    #[arg(long, value_name = "TBPS")]
    pub peak_bandwidth: Option<f64>,

    /// Worker threads reading traces (default: one per CPU).
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,

    /// No progress indicator and no timing line (problems with files are still reported).
    #[arg(short, long)]
    pub quiet: bool,

    #[command(flatten)]
    pub read: ReadArgs,
}

/// A validated `doctor` invocation.
#[derive(Debug, Clone)]
pub struct DoctorPlan {
    /// Inputs.
    pub paths: Vec<PathBuf>,
    /// JSON instead of text.
    pub json: bool,
    /// Quiet.
    pub quiet: bool,
    /// Library options.
    pub options: kinetrace_analysis::DoctorOptions,
}

impl DoctorArgs {
    /// Checks the arguments and builds the plan.
    pub fn plan(self) -> Result<DoctorPlan> {
        if self.jobs == Some(0) {
            bail!("--jobs must be at least 1 (leave it out for one per CPU)");
        }
        Ok(DoctorPlan {
            paths: self.paths,
            json: self.json,
            quiet: self.quiet,
            options: kinetrace_analysis::DoctorOptions {
                jobs: self.jobs.unwrap_or(0),
                read: self.read.options(),
                peaks: peak_override(self.peak_tflops, self.peak_bandwidth)?,
            },
        })
    }
}

const DIFF_AFTER_HELP: &str = "\
Each side is a trace file or a directory of them (one per rank). Ranks are compared rank by rank
(the ranks both sides have; one file each is compared whatever its rank), or all pooled with
--pool. Names are grouped across categories and counted over every step (--step first: each
side's first step, HTA's default; --step N: one step), rows given steps by HTA's rule, with
durations on HTA's clock, so the numbers and the added / deleted / increased / decreased /
unchanged count categories can be checked against HTA's TraceDiff. Each name also gets a time
category (unchanged within --time-threshold). When the sides have different numbers of steps,
per-step means are compared. Layout of --json and --csv: docs/diff.md.

EXAMPLES:
  kinetrace diff before/ after/              rank by rank, largest change first
  kinetrace diff before/ after/ --pool       all ranks together
  kinetrace diff a.json.gz b.json.gz --step first --json
  kinetrace diff a.json.gz b.json.gz --csv out/";

/// `kinetrace diff`.
#[derive(Debug, Args)]
#[command(after_help = DIFF_AFTER_HELP)]
pub struct DiffArgs {
    /// The base run: a trace file or a directory of them.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,

    /// The new run: a trace file or a directory of them.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,

    /// Compare all ranks of each side together instead of rank by rank.
    #[arg(long)]
    pub pool: bool,

    /// Steps compared: `all` (every step of each side), `first` (each side's first step, HTA's
    /// default) or a ProfilerStep number N on both sides. GPU rows count in the step of their
    /// launch call.
    #[arg(long, value_name = "all|first|N", default_value = "all", value_parser = parse_step)]
    pub step: StepChoice,

    /// A name's time change within this percentage of its base time (or under 1 µs) is
    /// "unchanged" in the time category.
    #[arg(
        long,
        default_value_t = 5.0,
        value_name = "PCT",
        allow_negative_numbers = true
    )]
    pub time_threshold: f64,

    /// Print the comparison as JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Also write the comparison as CSV files into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub csv: Option<PathBuf>,

    /// Rows per table in the terminal (0: all).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub top: usize,

    /// Worker threads reading traces (default: one per CPU).
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,

    /// No progress indicator and no timing line.
    #[arg(short, long)]
    pub quiet: bool,

    #[command(flatten)]
    pub read: ReadArgs,
}

/// A validated `diff` invocation.
#[derive(Debug, Clone)]
pub struct DiffPlan {
    /// Base side.
    pub base: PathBuf,
    /// New side.
    pub new: PathBuf,
    /// JSON instead of text.
    pub json: bool,
    /// CSV directory.
    pub csv: Option<PathBuf>,
    /// Terminal rows per table (`usize::MAX` for all).
    pub top: usize,
    /// Quiet.
    pub quiet: bool,
    /// Library options.
    pub options: kinetrace_analysis::DiffOptions,
}

fn parse_step(s: &str) -> Result<StepChoice, String> {
    match s {
        "all" => Ok(StepChoice::All),
        "first" => Ok(StepChoice::First),
        _ => s
            .parse()
            .map(StepChoice::Number)
            .map_err(|_| format!("expected `all`, `first` or a ProfilerStep number, got `{s}`")),
    }
}

impl DiffArgs {
    /// Checks the arguments and builds the plan.
    pub fn plan(self) -> Result<DiffPlan> {
        if self.jobs == Some(0) {
            bail!("--jobs must be at least 1 (leave it out for one per CPU)");
        }
        if !(self.time_threshold.is_finite() && self.time_threshold >= 0.0) {
            bail!(
                "--time-threshold must be a percentage ≥ 0, got {}",
                self.time_threshold
            );
        }
        Ok(DiffPlan {
            base: self.base,
            new: self.new,
            json: self.json,
            csv: self.csv,
            top: if self.top == 0 { usize::MAX } else { self.top },
            quiet: self.quiet,
            options: kinetrace_analysis::DiffOptions {
                jobs: self.jobs.unwrap_or(0),
                pool: self.pool,
                step: self.step,
                time_threshold: self.time_threshold / 100.0,
                read: self.read.options(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<AnalyzePlan> {
        let cli = Cli::try_parse_from(args)?;
        let Command::Analyze(a) = cli.command else {
            panic!("not analyze")
        };
        a.plan()
    }

    #[test]
    fn command_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn only_keeps_report_order() {
        let p = parse(&["kinetrace", "analyze", "d", "--only", "memory,temporal"]).unwrap();
        assert_eq!(p.analyses, vec![Analysis::Temporal, Analysis::Memory]);
        let p = parse(&["kinetrace", "analyze", "d"]).unwrap();
        assert_eq!(p.analyses.len(), 9);
        assert_eq!(p.options.hta.kernel_wait_threshold_us, 30.0);
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["kinetrace", "analyze"]).is_err());
        assert!(parse(&["kinetrace", "analyze", "d", "--only", "nope"]).is_err());
        let e = parse(&["kinetrace", "analyze", "d", "--plot", "x.png"]).unwrap_err();
        assert!(e.to_string().contains(".svg"), "{e}");
        assert!(parse(&["kinetrace", "analyze", "d", "--duration-ratio", "1.5"]).is_err());
        assert!(parse(&["kinetrace", "analyze", "d", "--jobs", "0"]).is_err());
        for bad in ["0", "-1", "nan", "inf"] {
            let flag = format!("--peak-tflops={bad}");
            let e = parse(&["kinetrace", "analyze", "d", &flag]).unwrap_err();
            assert!(
                e.to_string().contains("--peak-tflops must be"),
                "{bad}: {e}"
            );
            let flag = format!("--peak-bandwidth={bad}");
            let e = parse(&["kinetrace", "analyze", "d", &flag]).unwrap_err();
            assert!(
                e.to_string().contains("--peak-bandwidth must be"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn peaks_reach_the_options() {
        let p = parse(&[
            "kinetrace",
            "analyze",
            "d",
            "--peak-tflops",
            "989.5",
            "--peak-bandwidth",
            "3.35",
        ])
        .unwrap();
        assert_eq!(
            p.options.peaks,
            PeakOverride {
                tflops: Some(989.5),
                tb_per_s: Some(3.35)
            }
        );
        let p = parse(&[
            "kinetrace",
            "analyze",
            "d",
            "--only",
            "collectives,efficiency",
        ])
        .unwrap();
        assert_eq!(
            p.analyses,
            vec![Analysis::Efficiency, Analysis::Collectives]
        );
    }

    #[test]
    fn doctor_arguments() {
        let cli = Cli::try_parse_from(["kinetrace", "doctor", "a", "b.json", "--json"]).unwrap();
        let Command::Doctor(a) = cli.command else {
            panic!("not doctor")
        };
        let p = a.plan().unwrap();
        assert_eq!(p.paths.len(), 2);
        assert!(p.json);
        assert!(Cli::try_parse_from(["kinetrace", "doctor"]).is_err());
        let cli = Cli::try_parse_from(["kinetrace", "doctor", "d", "-j", "0"]).unwrap();
        let Command::Doctor(a) = cli.command else {
            panic!("not doctor")
        };
        assert!(a.plan().is_err());
    }

    #[test]
    fn max_value_size_takes_sizes_and_every_reading_command_has_it() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("8KiB"), Ok(8 << 10));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["0", "100", "1T", "x", "M", "-1M", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let p = parse(&["kinetrace", "analyze", "d"]).unwrap();
        assert_eq!(p.options.read.max_value_bytes, 64 << 20);
        let p = parse(&["kinetrace", "analyze", "d", "--max-value-size", "1G"]).unwrap();
        assert_eq!(p.options.read.max_value_bytes, 1 << 30);
        for cmd in ["analyze", "doctor", "diff", "convert"] {
            let c = Cli::command();
            let sub = c.find_subcommand(cmd).unwrap();
            assert!(
                sub.get_arguments()
                    .any(|a| a.get_long() == Some("max-value-size")),
                "{cmd} has no --max-value-size"
            );
        }
    }

    #[test]
    fn help_has_one_line_per_analysis() {
        let help = Cli::command()
            .find_subcommand_mut("analyze")
            .unwrap()
            .render_long_help()
            .to_string();
        for name in [
            "temporal",
            "overlap",
            "idle",
            "kernels",
            "ops",
            "efficiency",
            "collectives",
            "steps",
            "memory",
        ] {
            let lines = help
                .lines()
                .filter(|l| l.trim_start().starts_with(&format!("{name} ")))
                .count();
            assert!(lines >= 1, "no line for {name} in:\n{help}");
        }
    }
}
