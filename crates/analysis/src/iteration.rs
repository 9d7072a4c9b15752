//! Which `ProfilerStep` each row belongs to, by HolisticTraceAnalysis 0.5.0's rule, which its
//! `TraceDiff` uses to pick an iteration's rows: `add_iteration` in `hta/common/trace.py`, on the
//! CPU↔GPU links `transform_correlation_to_index` makes in the same file.
//!
//! - **Steps** are every row named `ProfilerStep#N` (`ProfilerStep\s*#\s*(\d+)`), whatever its
//!   `cat` or stream: the GPU-side `gpu_user_annotation` copies count too.
//! - **A row with `stream < 0`** (host rows, device-level syncs) is in the step whose span holds its
//!   start, `ts ≤ t < ts + dur` on HTA's clock; when spans overlap (a GPU-side step lagging into the
//!   next host step), the step row that comes **last in the file** wins.
//! - **A row with `stream > 0`** takes the step of the row its `correlation` links it to: a GPU row
//!   (`stream ≥ 0 and correlation ≥ 0`, or named `Event Sync` / `Context Sync`) links to the last
//!   non-GPU row in file order with the same `correlation` (the runtime call). Every kernel of a
//!   CUDA-graph replay shares the `cudaGraphLaunch`'s correlation, so the whole replay is in the
//!   launch's step, however far past the step's end it runs. A row is in **no step** when it has no
//!   such link: a kernel whose launch call is not in the trace, a Triton launch `cpu_op` carrying a
//!   `stream` argument (no `correlation`), or a launch call that is the file's first event (HTA
//!   tests the link's index with `> 0`).
//! - **`stream == 0`** is where kinetrace departs from HTA: HTA tests `stream > 0` here (while its
//!   own GPU-row test is `stream >= 0`), so every row on stream 0 is in no step; on the ROCm 6.2
//!   trace in HTA's own test data, where every kernel and copy is on stream 0, its iteration 1 has
//!   none of them. kinetrace gives stream-0 rows the `stream > 0` rule.

use crate::fastmap::FastMap;
use crate::rows::{Row, Rows};
use crate::steps::step_number;

/// Step numbers per row (`None`: in no step), and whether the file has any step row.
pub(crate) struct Iterations {
    /// Per row of [`Rows::rows`].
    pub of_row: Vec<Option<i64>>,
    /// Whether any row is a `ProfilerStep#N`.
    pub has_steps: bool,
}

/// A step row's span on HTA's clock, with its position in the file.
#[derive(Clone, Copy)]
struct Span {
    start: i64,
    end: i64,
    number: i64,
    order: usize,
}

/// For a time, the step whose span holds it, the latest in file order among overlapping ones.
/// Built once per file over the elementary intervals between span ends, so each lookup is a
/// binary search however many steps overlap.
struct StepLookup {
    /// Sorted boundaries; `owner[k]` covers `[bounds[k], bounds[k + 1])`.
    bounds: Vec<i64>,
    owner: Vec<Option<i64>>,
}

impl StepLookup {
    fn new(spans: &[Span]) -> StepLookup {
        let mut bounds: Vec<i64> = spans.iter().flat_map(|s| [s.start, s.end]).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let mut best: Vec<Option<(usize, i64)>> = vec![None; bounds.len().saturating_sub(1)];
        for s in spans.iter().filter(|s| s.end > s.start) {
            let from = bounds.partition_point(|&b| b < s.start);
            let to = bounds.partition_point(|&b| b < s.end);
            for slot in &mut best[from..to] {
                if slot.is_none_or(|(order, _)| order < s.order) {
                    *slot = Some((s.order, s.number));
                }
            }
        }
        StepLookup {
            bounds,
            owner: best.into_iter().map(|b| b.map(|(_, n)| n)).collect(),
        }
    }

    fn at(&self, t: i64) -> Option<i64> {
        let k = self.bounds.partition_point(|&b| b <= t);
        // `k − 1` is the last boundary ≤ t; past the last boundary nothing covers t.
        k.checked_sub(1)
            .and_then(|i| self.owner.get(i).copied())
            .flatten()
    }
}

/// HTA's GPU-row test (`_filter_gpu_kernels_with_cuda_sync`).
fn is_gpu_row(r: &Row, sync_name: &[bool]) -> bool {
    r.on_stream_with_corr() || sync_name[r.name as usize]
}

/// The step of every row of `rows`, by the rule in the module docs.
pub(crate) fn iterations(rows: &Rows) -> Iterations {
    let all = &rows.rows;
    let number_of: Vec<Option<i64>> = rows.strings.iter().map(|s| step_number(s)).collect();
    let sync_name: Vec<bool> = rows
        .strings
        .iter()
        .map(|s| &**s == "Event Sync" || &**s == "Context Sync")
        .collect();
    let spans: Vec<Span> = all
        .iter()
        .enumerate()
        .filter_map(|(order, r)| {
            number_of[r.name as usize].map(|number| Span {
                start: r.hts,
                end: r.hend(),
                number,
                order,
            })
        })
        .collect();
    let has_steps = !spans.is_empty();
    let lookup = StepLookup::new(&spans);
    let by_start = |r: &Row| lookup.at(r.hts);

    // The runtime call of each correlation: the last non-GPU row with it (a pandas merge then a
    // `.loc` assignment, where the last write wins).
    let mut launcher: FastMap<i64, u32> = FastMap::default();
    for (i, r) in all.iter().enumerate() {
        if r.corr != -1 && !is_gpu_row(r, &sync_name) {
            launcher.insert(r.corr, i as u32);
        }
    }
    let of_row = all
        .iter()
        .map(|r| {
            if r.stream < 0 {
                return by_start(r);
            }
            if r.corr == -1 || !is_gpu_row(r, &sync_name) {
                return None;
            }
            let l = &all[*launcher.get(&r.corr)? as usize];
            // HTA: `df.loc[x, "iteration"] if x > 0 else -1`, x being the launch row's index; a
            // launch row on a stream has no step of its own at that point.
            (l.index > 0 && l.stream < 0).then(|| by_start(l)).flatten()
        })
        .collect();
    Iterations { of_row, has_steps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::load_rows;
    use serde_json::{json, Value};

    fn rows_of(events: Vec<Value>) -> Rows {
        let doc = serde_json::to_vec(&json!({"traceEvents": events})).unwrap();
        load_rows(
            std::path::Path::new("t.json"),
            &doc[..],
            &Default::default(),
        )
        .unwrap()
    }

    fn ev(cat: &str, name: &str, ts: i64, dur: i64, args: Value) -> Value {
        json!({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args})
    }

    /// The step of the `k`-th row named `name`.
    fn step_of(rows: &Rows, it: &Iterations, name: &str, k: usize) -> Option<i64> {
        let i = (0..rows.rows.len())
            .filter(|&i| rows.str(rows.rows[i].name) == name)
            .nth(k)
            .unwrap();
        it.of_row[i]
    }

    #[test]
    fn gpu_rows_follow_their_launch_and_some_rows_are_in_no_step() {
        let rows = rows_of(vec![
            ev("user_annotation", "ProfilerStep#1", 0, 1000, json!({})),
            ev("user_annotation", "ProfilerStep#2", 1000, 1000, json!({})),
            // A graph launched near the end of step 1; its replay runs into step 2.
            ev(
                "cuda_runtime",
                "cudaGraphLaunch",
                900,
                5,
                json!({"correlation": 10}),
            ),
            ev(
                "kernel",
                "add",
                950,
                100,
                json!({"stream": 7, "correlation": 10, "graph id": 1}),
            ),
            ev(
                "kernel",
                "add",
                1050,
                100,
                json!({"stream": 7, "correlation": 10, "graph id": 1}),
            ),
            // A kernel whose launch is not in the trace.
            ev(
                "kernel",
                "add",
                1200,
                10,
                json!({"stream": 7, "correlation": 99}),
            ),
            // Inductor's launch op: a `stream`, no correlation.
            ev("cpu_op", "triton_k", 1300, 20, json!({"stream": 7})),
            ev(
                "cuda_driver",
                "cuLaunchKernel",
                1305,
                5,
                json!({"correlation": 11}),
            ),
            ev(
                "kernel",
                "triton_k",
                1400,
                10,
                json!({"stream": 7, "correlation": 11}),
            ),
            // Stream 0 (HTA: no step; kinetrace: its launch's).
            ev(
                "cuda_runtime",
                "cudaLaunchKernel",
                1500,
                5,
                json!({"correlation": 12}),
            ),
            ev(
                "kernel",
                "zero",
                1600,
                10,
                json!({"stream": 0, "correlation": 12}),
            ),
            // A host row outside every step.
            ev("cpu_op", "late", 2500, 10, json!({})),
        ]);
        let it = iterations(&rows);
        assert!(it.has_steps);
        assert_eq!(step_of(&rows, &it, "add", 0), Some(1));
        assert_eq!(step_of(&rows, &it, "add", 1), Some(1));
        assert_eq!(step_of(&rows, &it, "add", 2), None);
        assert_eq!(step_of(&rows, &it, "triton_k", 0), None);
        assert_eq!(step_of(&rows, &it, "triton_k", 1), Some(2));
        assert_eq!(step_of(&rows, &it, "zero", 0), Some(2));
        assert_eq!(step_of(&rows, &it, "late", 0), None);
        assert_eq!(step_of(&rows, &it, "ProfilerStep#2", 0), Some(2));
    }

    #[test]
    fn a_later_gpu_side_step_takes_host_rows_and_a_first_row_launch_links_nothing() {
        let rows = rows_of(vec![
            // The file's first row is a launch: HTA's `x > 0` test leaves its kernel out.
            ev(
                "cuda_runtime",
                "cudaLaunchKernel",
                10,
                5,
                json!({"correlation": 1}),
            ),
            ev("user_annotation", "ProfilerStep#1", 0, 1000, json!({})),
            ev("user_annotation", "ProfilerStep#2", 1000, 1000, json!({})),
            ev(
                "kernel",
                "first",
                20,
                10,
                json!({"stream": 7, "correlation": 1}),
            ),
            ev("cpu_op", "early_in_2", 1100, 10, json!({})),
            ev("cpu_op", "late_in_2", 1600, 10, json!({})),
            // Step 1's GPU side, written after the host rows, lags to 1500.
            ev("gpu_user_annotation", "ProfilerStep#1", 50, 1450, json!({})),
        ]);
        let it = iterations(&rows);
        assert_eq!(step_of(&rows, &it, "first", 0), None);
        assert_eq!(step_of(&rows, &it, "cudaLaunchKernel", 0), Some(1));
        assert_eq!(step_of(&rows, &it, "early_in_2", 0), Some(1));
        assert_eq!(step_of(&rows, &it, "late_in_2", 0), Some(2));
        // The host ProfilerStep#2 row itself starts inside step 1's GPU side.
        assert_eq!(step_of(&rows, &it, "ProfilerStep#2", 0), Some(1));
    }

    fn span(start: i64, end: i64, number: i64, order: usize) -> Span {
        Span {
            start,
            end,
            number,
            order,
        }
    }

    #[test]
    fn lookup_is_half_open_and_the_last_step_in_the_file_wins() {
        // Host steps 1 [0, 100) and 2 [100, 200); step 1's GPU-side span [50, 150) comes later in
        // the file, so it takes [50, 100) from step 1 (a no-op) and [100, 150) from step 2.
        let l = StepLookup::new(&[
            span(0, 100, 1, 0),
            span(100, 200, 2, 1),
            span(50, 150, 1, 2),
        ]);
        assert_eq!(l.at(-1), None);
        assert_eq!(l.at(0), Some(1));
        assert_eq!(l.at(99), Some(1));
        assert_eq!(l.at(100), Some(1));
        assert_eq!(l.at(149), Some(1));
        assert_eq!(l.at(150), Some(2));
        assert_eq!(l.at(199), Some(2));
        assert_eq!(l.at(200), None);
        // The GPU-side span first in the file: the host step wins where they overlap.
        let l = StepLookup::new(&[
            span(50, 150, 1, 0),
            span(0, 100, 1, 1),
            span(100, 200, 2, 2),
        ]);
        assert_eq!(l.at(120), Some(2));
        // Empty and negative spans hold nothing.
        let l = StepLookup::new(&[span(10, 10, 1, 0), span(30, 20, 2, 1)]);
        assert_eq!((l.at(10), l.at(25)), (None, None));
    }
}
