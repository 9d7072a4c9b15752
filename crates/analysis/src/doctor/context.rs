//! What every rule needs to know about one rank, computed once: the kind of each row, which host
//! event encloses which (per thread), the steps, when the GPU was busy, and which runtime call
//! launched each GPU row.

use std::collections::HashMap;

use crate::rows::{Row, Rows};
use crate::steps::step_number;
use crate::units::Us;

use super::Example;

/// What a row is, by its `cat` (not by HTA's `stream` test: a Triton `cpu_op` carrying a `stream`
/// argument is still a host op here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Kernel,
    Memcpy,
    Memset,
    CpuOp,
    Annotation,
    Runtime,
    Python,
    Other,
}

impl Kind {
    fn of_cat(cat: &str) -> Kind {
        match cat {
            "kernel" | "Kernel" => Kind::Kernel,
            "gpu_memcpy" | "Memcpy" => Kind::Memcpy,
            "gpu_memset" | "Memset" => Kind::Memset,
            "cpu_op" | "Operator" => Kind::CpuOp,
            "user_annotation" => Kind::Annotation,
            "cuda_runtime" | "cuda_driver" | "Runtime" => Kind::Runtime,
            "python_function" => Kind::Python,
            _ => Kind::Other,
        }
    }

    /// Work on a GPU stream.
    pub fn is_gpu(self) -> bool {
        matches!(self, Kind::Kernel | Kind::Memcpy | Kind::Memset)
    }

    /// Host-side events that nest per thread.
    fn is_host(self) -> bool {
        matches!(
            self,
            Kind::CpuOp | Kind::Annotation | Kind::Runtime | Kind::Python
        )
    }
}

/// A step (`ProfilerStep#N`), or the whole trace when it has none.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    /// `N`, or −1 for the whole trace.
    pub number: i64,
    pub ts: i64,
    pub end: i64,
}

impl Window {
    pub fn len(&self) -> i64 {
        self.end - self.ts
    }
}

const NONE: u32 = u32::MAX;

/// One rank, ready for the rules.
pub(crate) struct Ctx<'a> {
    pub rows: &'a Rows,
    pub rank: i64,
    kinds: Vec<Kind>,
    /// Innermost enclosing host row on the same thread, per row (`NONE` if none or not a host row).
    parent: Vec<u32>,
    /// Steps in time order, or one window over the whole trace.
    pub windows: Vec<Window>,
    /// Whether `windows` are real steps.
    pub has_steps: bool,
    /// Whether rows are `ProfilerStep` annotations (excluded from "enclosing op" searches).
    step_row: Vec<bool>,
    /// Merged intervals with any GPU row running (all devices and streams).
    pub busy: Vec<(i64, i64)>,
    /// The runtime row of each correlation id.
    launch: HashMap<i64, u32>,
    /// Start of the rank's first event (what Perfetto shows as 0).
    pub origin: i64,
}

impl<'a> Ctx<'a> {
    pub fn new(rows: &'a Rows, rank: i64) -> Ctx<'a> {
        let cat_kind: Vec<Kind> = rows.strings.iter().map(|s| Kind::of_cat(s)).collect();
        let all = &rows.rows;
        let kinds: Vec<Kind> = all.iter().map(|r| cat_kind[r.cat as usize]).collect();
        let numbers: Vec<Option<i64>> = rows.strings.iter().map(|s| step_number(s)).collect();

        // Nesting per thread: sort by (start, longest first), keep a stack of open rows.
        let mut parent = vec![NONE; all.len()];
        let mut by_thread: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, r) in all.iter().enumerate() {
            if kinds[i].is_host() {
                by_thread.entry(r.thread).or_default().push(i as u32);
            }
        }
        for (_, mut list) in by_thread {
            list.sort_by_key(|&i| {
                let r = &all[i as usize];
                (r.ts, std::cmp::Reverse(r.dur), i)
            });
            let mut stack: Vec<u32> = Vec::new();
            for i in list {
                let r = &all[i as usize];
                while stack
                    .last()
                    .is_some_and(|&top| all[top as usize].end() <= r.ts)
                {
                    stack.pop();
                }
                if let Some(&top) = stack.last() {
                    parent[i as usize] = top;
                }
                stack.push(i);
            }
        }

        let mut step_row = vec![false; all.len()];
        let mut windows: Vec<Window> = Vec::new();
        let mut seen: HashMap<i64, ()> = HashMap::new();
        for (i, r) in all.iter().enumerate() {
            if matches!(kinds[i], Kind::Annotation | Kind::CpuOp) {
                if let Some(n) = numbers[r.name as usize] {
                    step_row[i] = true;
                    if seen.insert(n, ()).is_none() {
                        windows.push(Window {
                            number: n,
                            ts: r.ts,
                            end: r.end(),
                        });
                    }
                }
            }
        }
        windows.sort_by_key(|w| (w.ts, w.number));
        // A step the capture's end cut short is no step's time (see `crate::steps`).
        if let Some(partial) = crate::steps::partial_step(rows) {
            if windows.iter().any(|w| w.number != partial) {
                windows.retain(|w| w.number != partial);
            }
        }
        let has_steps = !windows.is_empty();
        let origin = all.iter().map(|r| r.ts).min().unwrap_or(0);
        if !has_steps {
            let end = all.iter().map(Row::end).max().unwrap_or(origin);
            windows.push(Window {
                number: -1,
                ts: origin,
                end,
            });
        }

        let mut iv: Vec<(i64, i64)> = all
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| k.is_gpu())
            .map(|(r, _)| (r.ts, r.end()))
            .collect();
        iv.sort_unstable();
        let mut busy: Vec<(i64, i64)> = Vec::new();
        for (s, e) in iv {
            match busy.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => busy.push((s, e.max(s))),
            }
        }

        let mut launch = HashMap::new();
        for (i, r) in all.iter().enumerate() {
            if kinds[i] == Kind::Runtime && r.corr != -1 {
                launch.insert(r.corr, i as u32);
            }
        }
        Ctx {
            rows,
            rank,
            kinds,
            parent,
            windows,
            has_steps,
            step_row,
            busy,
            launch,
            origin,
        }
    }

    pub fn row(&self, i: usize) -> &Row {
        &self.rows.rows[i]
    }

    pub fn kind(&self, i: usize) -> Kind {
        self.kinds[i]
    }

    pub fn name(&self, i: usize) -> &str {
        self.rows.str(self.rows.rows[i].name)
    }

    pub fn len(&self) -> usize {
        self.rows.rows.len()
    }

    /// Rows of one kind, as indices.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(move |&i| self.kinds[i] == kind)
    }

    /// Whether row `i` is a `ProfilerStep#N` annotation.
    pub fn is_step_row(&self, i: usize) -> bool {
        self.step_row[i]
    }

    /// The enclosing host rows of `i` on its thread, innermost first.
    pub fn ancestors(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let mut at = self.parent[i];
        let mut depth = 0;
        std::iter::from_fn(move || {
            // A real stack is far shallower; the bound only guards against malformed nesting.
            if at == NONE || depth > 10_000 {
                return None;
            }
            let cur = at as usize;
            at = self.parent[cur];
            depth += 1;
            Some(cur)
        })
    }

    /// The runtime call that launched GPU row `i`, if the trace has it.
    pub fn launcher(&self, i: usize) -> Option<usize> {
        let r = self.row(i);
        (r.corr != -1)
            .then(|| self.launch.get(&r.corr).map(|&l| l as usize))
            .flatten()
    }

    /// When GPU row `i` was launched: its runtime call's start, else its own start.
    pub fn launch_ts(&self, i: usize) -> i64 {
        self.launcher(i).map_or(self.row(i).ts, |l| self.row(l).ts)
    }

    /// The window (index into `windows`) holding time `t`.
    pub fn window_at(&self, t: i64) -> Option<usize> {
        let k = self.windows.partition_point(|w| w.ts <= t);
        // Steps do not overlap in real traces; a few steps back covers the odd overlap without
        // making a lookup outside every step cost a scan of all of them.
        (k.saturating_sub(4)..k)
            .rev()
            .find(|&j| t < self.windows[j].end)
    }

    /// The window of row `i`: a GPU row's by its launch, a host row's by its start.
    pub fn window_of(&self, i: usize) -> Option<usize> {
        if self.kinds[i].is_gpu() {
            self.window_at(self.launch_ts(i))
        } else {
            self.window_at(self.row(i).ts)
        }
    }

    /// Time within `[a, b)` with some GPU row running.
    pub fn busy_between(&self, a: i64, b: i64) -> i64 {
        if b <= a {
            return 0;
        }
        let from = self.busy.partition_point(|&(_, e)| e <= a);
        self.busy[from..]
            .iter()
            .take_while(|&&(s, _)| s < b)
            .map(|&(s, e)| e.min(b) - s.max(a))
            .filter(|&d| d > 0)
            .sum()
    }

    /// Time from `t` until a GPU row next runs, when one runs before `limit` (0 if one runs at
    /// `t`). When the GPU gets no more work before `limit`, its idle time is not caused by
    /// whatever ended at `t`, so this is 0.
    pub fn idle_until_work(&self, t: i64, limit: i64) -> i64 {
        let k = self.busy.partition_point(|&(_, e)| e <= t);
        match self.busy.get(k) {
            Some(&(s, _)) if s < limit => (s - t).max(0),
            _ => 0,
        }
    }

    /// "of the step", or "of the trace" when it has no steps.
    pub fn of_step(&self) -> &'static str {
        if self.has_steps {
            "of the step"
        } else {
            "of the trace"
        }
    }

    /// Mean length of the windows, ns.
    pub fn mean_window_ns(&self) -> f64 {
        let total: i64 = self.windows.iter().map(Window::len).sum();
        total as f64 / self.windows.len().max(1) as f64
    }

    /// A pointer into the trace for row `i`.
    pub fn example(&self, i: usize) -> Example {
        let r = self.row(i);
        Example {
            rank: self.rank,
            cycle: 0,
            name: self.name(i).to_owned(),
            at_ms: (r.ts - self.origin) as f64 / 1e6,
            ts_us: (r.ts - self.rows.base_ns.unwrap_or(0)) as f64 / 1000.0,
            dur_us: Us::from_ns(r.dur),
        }
    }

    /// A pointer to a time span that is not one row (a gap, a stall).
    pub fn span_example(&self, name: String, ts: i64, end: i64) -> Example {
        Example {
            rank: self.rank,
            cycle: 0,
            name,
            at_ms: (ts - self.origin) as f64 / 1e6,
            ts_us: (ts - self.rows.base_ns.unwrap_or(0)) as f64 / 1000.0,
            dur_us: Us::from_ns(end - ts),
        }
    }
}
