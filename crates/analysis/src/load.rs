//! Finding trace files, and reducing each to a small per-rank summary in parallel.
//!
//! Each worker thread takes the next file, reads it into rows, runs every analysis on it and keeps
//! only the summary before it takes another file, so at most one parsed rank per worker is in
//! memory. The only cross-rank input of the HTA analyses (whether the step filter applies, which
//! depends on the `ProfilerStep` strings of all ranks) is settled afterwards: a rank that cannot
//! decide it alone is analysed both ways.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use kinetrace_export::reader::{rank_like_hta_from_reader, ReadError, ReadOptions};
use serde::Serialize;

use crate::collectives::Instance;
use crate::efficiency::{rank_device_work, PeakOverride, RankEfficiency};
use crate::hta::{analyze_rank, hta_view, HtaOptions, HtaRank, StepFilter, Symbols};
use crate::memory::{memory, phases, MemoryDevice, PhaseSpan};
use crate::ops::{op_table, OpStat};
use crate::rows::{load_rows, Rows};
use crate::steps::{steps, StepRow};

/// A trace to analyse: a file, or bytes already in memory (tests, fuzzing).
#[derive(Clone, Debug)]
pub enum TraceSource {
    /// A file on disk, plain or gzip.
    File(PathBuf),
    /// In-memory bytes, named for messages.
    Memory {
        /// Name used in messages.
        name: PathBuf,
        /// The file's bytes.
        bytes: Vec<u8>,
    },
}

impl TraceSource {
    /// The path or name.
    pub fn path(&self) -> &Path {
        match self {
            TraceSource::File(p) => p,
            TraceSource::Memory { name, .. } => name,
        }
    }

    fn len(&self) -> u64 {
        match self {
            TraceSource::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
            TraceSource::Memory { bytes, .. } => bytes.len() as u64,
        }
    }

    fn open(&self) -> io::Result<Box<dyn Read + Send + '_>> {
        Ok(match self {
            TraceSource::File(p) => Box::new(BufReader::with_capacity(256 * 1024, File::open(p)?)),
            TraceSource::Memory { bytes, .. } => Box::new(&bytes[..]),
        })
    }
}

/// A file (or directory) that could not be analysed, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileProblem {
    /// The file or directory.
    pub file: PathBuf,
    /// Byte offset in the (decompressed) JSON, where the problem has one.
    pub offset: Option<u64>,
    /// What is wrong, and what to do about it where that is known.
    pub message: String,
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(o) => write!(f, "{}: at byte {o}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl From<ReadError> for FileProblem {
    fn from(e: ReadError) -> FileProblem {
        FileProblem {
            file: e.path,
            offset: e.offset,
            message: e.message,
        }
    }
}

/// The trace files named by `inputs`: a directory stands for every `*.json` / `*.gz` file directly
/// in it (as HTA takes them), sorted by name; a file stands for itself. Inputs that give no file
/// are reported.
pub fn discover(inputs: &[PathBuf]) -> (Vec<PathBuf>, Vec<FileProblem>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    let problem = |p: &Path, message: String| FileProblem {
        file: p.to_owned(),
        offset: None,
        message,
    };
    for input in inputs {
        match std::fs::metadata(input) {
            Err(e) => problems.push(problem(input, format!("cannot read: {e}"))),
            Ok(m) if m.is_dir() => match std::fs::read_dir(input) {
                Err(e) => problems.push(problem(input, format!("cannot list directory: {e}"))),
                Ok(entries) => {
                    let mut found: Vec<PathBuf> = entries
                        .filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| {
                            p.is_file()
                                && p.file_name()
                                    .and_then(|n| n.to_str())
                                    .is_some_and(|n| n.ends_with(".json") || n.ends_with(".gz"))
                        })
                        .collect();
                    if found.is_empty() {
                        problems.push(problem(
                            input,
                            "no trace files here (expected *.json or *.json.gz files, one per rank)"
                                .into(),
                        ));
                    }
                    found.sort();
                    files.extend(found);
                }
            },
            Ok(_) => files.push(input.clone()),
        }
    }
    (files, problems)
}

/// How the rank of a file was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankSource {
    /// `distributedInfo.rank`.
    DistributedInfo,
    /// HTA's regex `"rank":\s+(\d+)` found it elsewhere in the file.
    RankRegex,
    /// Nothing found: rank 0, as HTA assumes.
    Default,
}

/// Who wrote a trace and when: what tells the cycles of one process (a `--schedule` with
/// `repeat`, torch.profiler's `tensorboard_trace_handler` writing one file per cycle) from two
/// traces claiming one rank.
#[derive(Clone, Debug)]
pub(crate) struct TraceKey {
    pub file: PathBuf,
    pub rank: i64,
    pub rank_source: RankSource,
    /// `host_name`, when the trace has it.
    pub host: Option<String>,
    /// The pid of the host rows, when they have an integer one.
    pub pid: Option<i64>,
    /// First row start and last row end, ns since the epoch.
    pub span: (i64, i64),
}

impl TraceKey {
    pub fn new(file: &Path, rows: &Rows, rank: i64, rank_source: RankSource) -> TraceKey {
        let host = rows
            .metadata
            .iter()
            .find(|(k, _)| k == "host_name")
            .and_then(|(_, v)| serde_json::from_str::<String>(v).ok());
        let start = rows.rows.iter().map(|r| r.ts).min().unwrap_or(0);
        let end = rows.rows.iter().map(|r| r.end()).max().unwrap_or(start);
        TraceKey {
            file: file.to_owned(),
            rank,
            rank_source,
            host,
            pid: rows.host_pid,
            span: (start, end),
        }
    }

    fn process(&self) -> String {
        match (&self.pid, &self.host) {
            (Some(p), Some(h)) => format!("pid {p} on {h}"),
            (Some(p), None) => format!("pid {p}"),
            (None, Some(h)) => format!("an unknown pid on {h}"),
            (None, None) => "an unknown process".into(),
        }
    }

    /// Whether the two spans overlap by more than half the shorter one: the same capture, not
    /// two cycles (which follow each other; a GPU tail may reach a little into the next).
    fn same_time(&self, other: &TraceKey) -> bool {
        let overlap = self.span.1.min(other.span.1) - self.span.0.max(other.span.0);
        let shorter = (self.span.1 - self.span.0).min(other.span.1 - other.span.0);
        overlap > 0 && 2 * overlap >= shorter
    }
}

/// Where a trace sits in the set analysed: its rank, and which of that rank's cycles it is.
///
/// A folder holds ranks × cycles: every trace of one rank written by one process at different
/// times is a cycle of that rank (numbered from 0 in time order); a second process claiming the
/// rank, or a second trace of the same process over the same time (a copy), is a duplicate and
/// is reported, not analysed. `analyze`, `doctor`, `diff` and `record`'s summary all read a
/// folder this way ([`place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The rank.
    pub rank: i64,
    /// The cycle of the rank, 0-based in time order.
    pub cycle: u32,
    /// How many cycles of the rank are in the set.
    pub cycles: u32,
}

/// Places every trace (in input order) as a rank and cycle, or reports it as a duplicate. Of the
/// traces claiming one rank, the process of the first in input order keeps it.
pub(crate) fn place(keys: &[&TraceKey]) -> Vec<Result<Placement, FileProblem>> {
    let mut out: Vec<Option<Result<Placement, FileProblem>>> = vec![None; keys.len()];
    let mut by_rank: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
    for (i, k) in keys.iter().enumerate() {
        by_rank.entry(k.rank).or_default().push(i);
    }
    for (rank, files) in by_rank {
        let owner = keys[files[0]];
        // The first file's process keeps the rank: its traces at other times are its cycles.
        let mut cycles: Vec<usize> = Vec::new();
        for &i in &files {
            let k = keys[i];
            let clash = if (k.host.as_ref(), k.pid) != (owner.host.as_ref(), owner.pid) {
                Some((
                    owner.file.as_path(),
                    format!(
                        "written by another process ({}; that one by {})",
                        k.process(),
                        owner.process()
                    ),
                ))
            } else {
                cycles
                    .iter()
                    .map(|&c| keys[c])
                    .find(|c| c.same_time(k))
                    .map(|c| {
                        (
                            c.file.as_path(),
                            "the same process over the same time: a copy of it?".to_owned(),
                        )
                    })
            };
            match clash {
                None => cycles.push(i),
                Some((first, why)) => {
                    out[i] = Some(Err(FileProblem {
                        file: k.file.clone(),
                        offset: None,
                        message: format!(
                            "duplicate rank {rank}: {} already has it ({why}{}); this file is \
                             skipped. Give each rank's trace a distinct `distributedInfo.rank`, \
                             or analyse the files separately",
                            first.display(),
                            match k.rank_source {
                                RankSource::Default =>
                                    "; no rank in either file, so both count as rank 0",
                                _ => "",
                            }
                        ),
                    }))
                }
            }
        }
        cycles.sort_by_key(|&i| (keys[i].span.0, i));
        let n = cycles.len() as u32;
        for (c, &i) in cycles.iter().enumerate() {
            out[i] = Some(Ok(Placement {
                rank,
                cycle: c as u32,
                cycles: n,
            }));
        }
    }
    out.into_iter()
        .map(|p| p.expect("every trace is placed"))
        .collect()
}

/// Everything kept from one rank once its events are gone.
#[derive(Clone, Debug)]
pub(crate) struct RankSummary {
    pub key: TraceKey,
    pub file: PathBuf,
    pub rank_source: RankSource,
    pub events: u64,
    pub rows: usize,
    /// Rows with `stream != -1` before any filtering.
    pub stream_rows: usize,
    pub rounded: bool,
    /// Distinct cat/name strings containing `ProfilerStep`.
    pub step_symbols: Vec<String>,
    /// HTA's analyses with its step filter applied.
    pub filtered: HtaRank,
    /// Without the step filter; only when the rank alone has fewer than two step strings.
    pub unfiltered: Option<HtaRank>,
    pub ops: Vec<OpStat>,
    pub steps: Vec<StepRow>,
    pub memory: Vec<MemoryDevice>,
    /// Step phases, for ranks with memory samples.
    pub phases: Vec<PhaseSpan>,
    /// FLOPs, bytes and roofline per op group; GPU time by category.
    pub efficiency: Option<RankEfficiency>,
    /// Collective kernels, in time order.
    pub collectives: Vec<Instance>,
}

/// Options of a whole run.
#[derive(Clone, Debug)]
pub struct Options {
    /// HTA knobs.
    pub hta: HtaOptions,
    /// Worker threads (0: one per CPU).
    pub jobs: usize,
    /// Points per memory timeline.
    pub memory_points: usize,
    /// The op table tells ops apart by `Input Dims` too (`key_averages(group_by_input_shape=True)`).
    pub ops_by_shape: bool,
    /// The trace reader's limits.
    pub read: ReadOptions,
    /// Device peaks replacing the peaks table's.
    pub peaks: PeakOverride,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hta: HtaOptions::default(),
            jobs: 0,
            memory_points: 400,
            ops_by_shape: false,
            read: ReadOptions::default(),
            peaks: PeakOverride::default(),
        }
    }
}

/// Reads one trace into rows, with its rank (from `distributedInfo`, else HTA's regex over the
/// file, else 0), within the reader's limits `read`.
pub(crate) fn read_rank(
    source: &TraceSource,
    read: &ReadOptions,
) -> Result<(Rows, i64, RankSource), FileProblem> {
    let path = source.path();
    let input = source.open().map_err(|e| FileProblem {
        file: path.to_owned(),
        offset: None,
        message: format!("cannot open: {e}"),
    })?;
    let rows = load_rows(path, input, read)?;
    let (rank, rank_source) = match rows.rank {
        Some(r) => (r, RankSource::DistributedInfo),
        None => match source.open().ok().and_then(rank_like_hta_from_reader) {
            Some(r) => (r, RankSource::RankRegex),
            None => (0, RankSource::Default),
        },
    };
    Ok((rows, rank, rank_source))
}

/// Reads one trace and reduces it to its summary.
pub(crate) fn summarize(source: &TraceSource, opts: &Options) -> Result<RankSummary, FileProblem> {
    let path = source.path();
    let (rows, rank, rank_source) = read_rank(source, &opts.read)?;
    let sym = Symbols::new(&rows);
    // The op table needs nothing from the other analyses: it runs on a second thread meanwhile
    // (a single large rank otherwise leaves the second core idle once it is read).
    std::thread::scope(|scope| {
        let second = || {
            (
                op_table(&rows, &sym, opts.ops_by_shape),
                rank_device_work(&rows, &opts.peaks),
            )
        };
        let ops = std::thread::Builder::new()
            .name("kinetrace-ops".into())
            .spawn_scoped(scope, second)
            .ok();
        let mut summary = summarize_rows(path, &rows, rank, rank_source, &sym, opts);
        let (ops, (efficiency, collectives)) = match ops {
            Some(handle) => match handle.join() {
                Ok(done) => done,
                Err(panic) => panic::resume_unwind(panic),
            },
            None => second(),
        };
        summary.ops = ops;
        summary.efficiency = Some(efficiency);
        summary.collectives = collectives;
        Ok(summary)
    })
}

/// Every analysis of one rank but the op table (left empty).
fn summarize_rows(
    path: &Path,
    rows: &Rows,
    rank: i64,
    rank_source: RankSource,
    sym: &Symbols,
    opts: &Options,
) -> RankSummary {
    let mut used = vec![false; rows.strings.len()];
    for r in &rows.rows {
        used[r.name as usize] = true;
        used[r.cat as usize] = true;
    }
    let step_symbols: Vec<String> = rows
        .strings
        .iter()
        .enumerate()
        .filter(|&(i, _)| used[i] && sym.step_name[i])
        .map(|(_, s)| s.to_string())
        .collect();
    let filter = if opts.hta.include_last_step {
        StepFilter::KeepLastStep
    } else {
        StepFilter::DropLastStep
    };
    let filtered = analyze_rank(rank, rows, sym, &hta_view(rows, sym, filter), &opts.hta);
    let unfiltered = (step_symbols.len() < 2).then(|| {
        analyze_rank(
            rank,
            rows,
            sym,
            &hta_view(rows, sym, StepFilter::All),
            &opts.hta,
        )
    });
    let origin = rows
        .rows
        .iter()
        .map(|r| r.ts)
        .chain(rows.mem.iter().map(|m| m.ts))
        .min()
        .unwrap_or(0);
    let step_rows = steps(rank, rows, sym, origin);
    let phase_spans = if rows.mem.is_empty() {
        Vec::new()
    } else {
        phases(rank, rows, &step_rows, origin)
    };
    let mem = memory(
        rank,
        rows,
        &step_rows,
        &phase_spans,
        origin,
        opts.memory_points,
    );
    RankSummary {
        key: TraceKey::new(path, rows, rank, rank_source),
        file: path.to_owned(),
        rank_source,
        events: rows.events,
        rows: rows.rows.len(),
        stream_rows: rows.rows.iter().filter(|r| r.stream != -1).count(),
        rounded: rows.rounded,
        step_symbols,
        filtered,
        unfiltered,
        ops: Vec::new(),
        steps: step_rows,
        memory: mem,
        phases: phase_spans,
        efficiency: None,
        collectives: Vec::new(),
    }
}

/// Progress of a run, for a progress indicator.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    /// Files finished (read or failed).
    pub done: usize,
    /// Files in the run.
    pub total: usize,
    /// Bytes (on disk) of the finished files.
    pub done_bytes: u64,
    /// Bytes (on disk) of all files.
    pub total_bytes: u64,
    /// The file just finished.
    pub last: &'a Path,
}

/// Summarises every source on `jobs` worker threads, reporting each finished file to
/// `progress`. Results are in the order of `sources`.
pub(crate) fn summarize_all(
    sources: &[TraceSource],
    opts: &Options,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> Vec<Result<RankSummary, FileProblem>> {
    map_sources(sources, opts.jobs, progress, &|s| summarize(s, opts))
}

/// Runs `work` on every source on `jobs` worker threads (0: one per CPU), each worker taking the
/// next source when it is done with one, and reports each finished file to `progress`. A panic in
/// `work` becomes a problem with that file. Results are in the order of `sources`.
pub(crate) fn map_sources<T: Send>(
    sources: &[TraceSource],
    jobs: usize,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
    work: &(dyn Fn(&TraceSource) -> Result<T, FileProblem> + Sync),
) -> Vec<Result<T, FileProblem>> {
    let jobs = if jobs == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        jobs
    }
    .clamp(1, sources.len().max(1));
    let sizes: Vec<u64> = sources.iter().map(TraceSource::len).collect();
    let total_bytes = sizes.iter().sum();
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    let mut results: Vec<Option<Result<T, FileProblem>>> = std::iter::repeat_with(|| None)
        .take(sources.len())
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let next = &next;
            scope.spawn(move || loop {
                // Relaxed: the counter only hands out distinct indices; results travel by channel.
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(source) = sources.get(i) else { break };
                let result =
                    panic::catch_unwind(AssertUnwindSafe(|| work(source))).unwrap_or_else(|_| {
                        Err(FileProblem {
                            file: source.path().to_owned(),
                            offset: None,
                            message: "internal error while analysing this file (a bug in \
                                      kinetrace: please report it with the file)"
                                .into(),
                        })
                    });
                if tx.send((i, result)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut done_bytes = 0;
        for (n, (i, result)) in rx.into_iter().enumerate() {
            let done = n + 1;
            done_bytes += sizes[i];
            progress(&Progress {
                done,
                total: sources.len(),
                done_bytes,
                total_bytes,
                last: sources[i].path(),
            });
            results[i] = Some(result);
        }
    });
    results
        .into_iter()
        .zip(sources)
        .map(|(r, s)| {
            r.unwrap_or_else(|| {
                Err(FileProblem {
                    file: s.path().to_owned(),
                    offset: None,
                    message: "not analysed (worker stopped)".into(),
                })
            })
        })
        .collect()
}
