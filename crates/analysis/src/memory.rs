//! The memory timeline from `[memory]` instant events (`profile_memory=True`): allocated and
//! reserved bytes over time per device, the peak (when, in which step and phase, under which
//! ops), the training phases of each step (forward / backward / optimizer, from the
//! annotations), and how the first step compares with the later ones: the caching allocator
//! warms up in the first step (reserved memory grows there and stays flat after), and growth
//! after it points at fragmentation or a leak.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rows::{MemSample, Rows};
use crate::steps::StepRow;

/// One point of a memory timeline: the levels from `t_ms` until the next point (a step
/// function: memory changes only at `[memory]` events).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemPoint {
    /// ms since the rank's first event.
    pub t_ms: f64,
    /// `Total Allocated`, bytes.
    pub allocated: i64,
    /// `Total Reserved`, bytes.
    pub reserved: i64,
}

/// A part of a training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseKind {
    /// From the step's start to the first backward op (or a `forward` annotation).
    Forward,
    /// The autograd engine's `autograd::engine::evaluate_function: …` ops, first to last (or a
    /// `backward` annotation).
    Backward,
    /// `Optimizer.step#…` and `Optimizer.zero_grad#…` annotations (or an `optimizer` one).
    Optimizer,
}

impl PhaseKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Forward => "forward",
            PhaseKind::Backward => "backward",
            PhaseKind::Optimizer => "optimizer",
        }
    }
}

/// One phase of one step on one rank.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseSpan {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// Step number (`ProfilerStep#N`).
    pub step: i64,
    /// Which phase.
    pub kind: PhaseKind,
    /// Start, ms since the rank's first event.
    pub start_ms: f64,
    /// End, ms since the rank's first event.
    pub end_ms: f64,
}

/// Memory use of one device on one rank.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryDevice {
    /// Rank.
    pub rank: i64,
    /// The rank's cycle, 0-based in time order (see [`crate::Placement`]).
    pub cycle: u32,
    /// `Device Id` (−1: host memory).
    pub device: i64,
    /// Number of `[memory]` events.
    pub samples: usize,
    /// Highest `Total Allocated`.
    pub peak_allocated_bytes: i64,
    /// When it was first reached, ms since the rank's first event.
    pub peak_at_ms: f64,
    /// The step it happened in, if inside a `ProfilerStep`.
    pub peak_step: Option<i64>,
    /// The phase it happened in, when the step's phases are known.
    pub peak_phase: Option<PhaseKind>,
    /// The CPU ops running at the peak: outermost, then innermost (`aten::linear > aten::mm`).
    pub peak_ops: Option<String>,
    /// Highest `Total Reserved`.
    pub peak_reserved_bytes: i64,
    /// `Total Allocated` after the last event.
    pub final_allocated_bytes: i64,
    /// The first step with samples (the allocator's warm-up step when profiling starts early).
    pub first_step: Option<i64>,
    /// Peak allocated inside the first step, when there are steps.
    pub first_step_peak_bytes: Option<i64>,
    /// Highest peak allocated inside any later step, when there are at least two steps.
    pub later_steps_peak_bytes: Option<i64>,
    /// `later_steps_peak − first_step_peak`.
    pub later_minus_first_bytes: Option<i64>,
    /// Highest `Total Reserved` inside the first step.
    pub first_step_reserved_bytes: Option<i64>,
    /// Highest `Total Reserved` inside any later step.
    pub later_steps_reserved_bytes: Option<i64>,
    /// How much `Total Reserved` grew inside the first step (from the last level before it, or
    /// its first sample).
    pub first_step_reserved_growth_bytes: Option<i64>,
    /// The most `Total Reserved` grew inside any one later step.
    pub later_steps_reserved_growth_bytes: Option<i64>,
    /// The first step against the later ones, in one line (when there are two steps with
    /// samples).
    pub first_step_note: Option<String>,
    /// The timeline, thinned to at most the requested number of points (each kept point holds
    /// the highest allocated and reserved levels of its time bucket, so peaks survive).
    pub timeline: Vec<MemPoint>,
}

/// Which phase a CPU row's name marks, if any.
fn phase_of(cat: &str, name: &str) -> Option<PhaseKind> {
    if name.starts_with("autograd::engine::evaluate_function") {
        return Some(PhaseKind::Backward);
    }
    if name.starts_with("Optimizer.") {
        return Some(PhaseKind::Optimizer);
    }
    if cat != "user_annotation" {
        return None;
    }
    // User annotations such as `## forward ##` or Lightning's `[Strategy]…backward`.
    let lower = name.to_ascii_lowercase();
    if lower.contains("backward") {
        Some(PhaseKind::Backward)
    } else if lower.contains("optimizer") {
        Some(PhaseKind::Optimizer)
    } else if lower.contains("forward") {
        Some(PhaseKind::Forward)
    } else {
        None
    }
}

/// Merges intervals (sorted by start) into disjoint ones.
fn merged(mut iv: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    iv.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (s, e) in iv {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e.max(s))),
        }
    }
    out
}

/// `[a, b)` minus the disjoint sorted `holes`.
fn minus(a: f64, b: f64, holes: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut cur = a;
    for &(s, e) in holes {
        if e <= cur || s >= b {
            continue;
        }
        if s > cur {
            out.push((cur, s));
        }
        cur = cur.max(e);
    }
    if cur < b {
        out.push((cur, b));
    }
    out
}

/// The forward / backward / optimizer phases of every step of one rank. Backward is the hull of
/// the autograd engine's ops that start in the step; optimizer the union of the `Optimizer.*`
/// annotations; forward, without a `forward` annotation, the time from the step's start to the
/// backward's start outside the optimizer (only in steps with a backward, so inference steps
/// get no guessed phases).
pub(crate) fn phases(rank: i64, rows: &Rows, steps: &[StepRow], origin_ns: i64) -> Vec<PhaseSpan> {
    if steps.is_empty() {
        return Vec::new();
    }
    let ms = |t: i64| (t - origin_ns) as f64 / 1e6;
    // Phase kind per interned string, decided once.
    let mut kinds: Vec<Option<Option<PhaseKind>>> = vec![None; rows.strings.len()];
    let mut marked: Vec<(PhaseKind, f64, f64)> = Vec::new();
    for r in rows.rows.iter().filter(|r| r.stream < 0) {
        let k = *kinds[r.name as usize]
            .get_or_insert_with(|| phase_of(rows.str(r.cat), rows.str(r.name)));
        if let Some(k) = k {
            marked.push((k, ms(r.ts), ms(r.end())));
        }
    }
    let mut out = Vec::new();
    if marked.is_empty() {
        return out;
    }
    for st in steps {
        let (a, b) = (st.start_ms, st.start_ms + st.step_time_us.0 / 1000.0);
        let of = |kind: PhaseKind| -> Vec<(f64, f64)> {
            marked
                .iter()
                .filter(|m| m.0 == kind && (a..b).contains(&m.1))
                .map(|m| (m.1, m.2.min(b)))
                .collect()
        };
        let optimizer = merged(of(PhaseKind::Optimizer));
        let bwd = of(PhaseKind::Backward);
        let backward = (!bwd.is_empty()).then(|| {
            let s = bwd.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
            let e = bwd.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            (s, e)
        });
        let mut forward = merged(of(PhaseKind::Forward));
        if forward.is_empty() {
            if let Some((bs, _)) = backward {
                forward = minus(a, bs, &optimizer);
            }
        }
        let mut push = |kind, (s, e): (f64, f64)| {
            if e > s {
                out.push(PhaseSpan {
                    rank,
                    cycle: 0,
                    step: st.step,
                    kind,
                    start_ms: s,
                    end_ms: e,
                });
            }
        };
        forward
            .into_iter()
            .for_each(|iv| push(PhaseKind::Forward, iv));
        backward
            .into_iter()
            .for_each(|iv| push(PhaseKind::Backward, iv));
        optimizer
            .into_iter()
            .for_each(|iv| push(PhaseKind::Optimizer, iv));
    }
    out.sort_by(|x, y| x.start_ms.total_cmp(&y.start_ms));
    out
}

/// The outermost and innermost `cpu_op` running at `t_ns` (`outer > inner`, or one name).
fn ops_at(rows: &Rows, t_ns: i64) -> Option<String> {
    let mut outer: Option<&crate::rows::Row> = None;
    let mut inner: Option<&crate::rows::Row> = None;
    for r in &rows.rows {
        if r.stream >= 0 || !(r.ts <= t_ns && t_ns <= r.end()) || rows.str(r.cat) != "cpu_op" {
            continue;
        }
        if outer.is_none_or(|o| r.dur > o.dur) {
            outer = Some(r);
        }
        if inner.is_none_or(|i| r.dur < i.dur) {
            inner = Some(r);
        }
    }
    let (o, i) = (outer?, inner?);
    Some(if o.name == i.name {
        rows.str(o.name).to_owned()
    } else {
        format!("{} > {}", rows.str(o.name), rows.str(i.name))
    })
}

/// Per-device memory summaries of one rank.
pub(crate) fn memory(
    rank: i64,
    rows: &Rows,
    steps: &[StepRow],
    phases: &[PhaseSpan],
    origin_ns: i64,
    max_points: usize,
) -> Vec<MemoryDevice> {
    let mut by_device: BTreeMap<i64, Vec<MemSample>> = BTreeMap::new();
    for s in &rows.mem {
        by_device.entry(s.device).or_default().push(*s);
    }
    let ms = |t: i64| (t - origin_ns) as f64 / 1e6;
    let step_end = |s: &StepRow| s.start_ms + s.step_time_us.0 / 1000.0;
    let step_of = |t_ms: f64| -> Option<i64> {
        steps
            .iter()
            .rev()
            .find(|s| s.start_ms <= t_ms && t_ms < step_end(s))
            .map(|s| s.step)
    };
    by_device
        .into_iter()
        .map(|(device, mut v)| {
            v.sort_by_key(|s| s.ts);
            let peak = v
                .iter()
                .fold(None::<&MemSample>, |best, s| match best {
                    Some(b) if b.allocated >= s.allocated => Some(b),
                    _ => Some(s),
                })
                .copied();
            // Per step with samples: (step, peak allocated, peak reserved, reserved growth).
            let per_step: Vec<(i64, i64, i64, i64)> = steps
                .iter()
                .filter_map(|st| {
                    let (a, b) = (st.start_ms, step_end(st));
                    let inside: Vec<&MemSample> =
                        v.iter().filter(|s| (a..b).contains(&ms(s.ts))).collect();
                    let first = inside.first()?;
                    let before = v
                        .iter()
                        .take_while(|s| ms(s.ts) < a)
                        .last()
                        .map_or(first.reserved, |s| s.reserved);
                    let alloc = inside.iter().map(|s| s.allocated).max()?;
                    let res = inside.iter().map(|s| s.reserved).max()?;
                    Some((st.step, alloc, res, res - before))
                })
                .collect();
            let first = per_step.first().copied();
            let later = &per_step[per_step.len().min(1)..];
            let later_max = |f: fn(&(i64, i64, i64, i64)) -> i64| later.iter().map(f).max();
            let peak_at_ms = peak.map_or(0.0, |p| ms(p.ts));
            let peak_step = peak.and_then(|_| step_of(peak_at_ms));
            let mut d = MemoryDevice {
                rank,
                cycle: 0,
                device,
                samples: v.len(),
                peak_allocated_bytes: peak.map_or(0, |p| p.allocated),
                peak_at_ms,
                peak_step,
                peak_phase: peak_step.and_then(|_| {
                    phases
                        .iter()
                        .find(|p| p.start_ms <= peak_at_ms && peak_at_ms < p.end_ms)
                        .map(|p| p.kind)
                }),
                peak_ops: peak.and_then(|p| ops_at(rows, p.ts)),
                peak_reserved_bytes: v.iter().map(|s| s.reserved).max().unwrap_or(0),
                final_allocated_bytes: v.last().map_or(0, |s| s.allocated),
                first_step: first.map(|f| f.0),
                first_step_peak_bytes: first.map(|f| f.1),
                later_steps_peak_bytes: later_max(|s| s.1),
                later_minus_first_bytes: None,
                first_step_reserved_bytes: first.map(|f| f.2),
                later_steps_reserved_bytes: later_max(|s| s.2),
                first_step_reserved_growth_bytes: first.map(|f| f.3),
                later_steps_reserved_growth_bytes: later_max(|s| s.3),
                first_step_note: None,
                timeline: thin(&v, origin_ns, max_points),
            };
            d.later_minus_first_bytes = d
                .first_step_peak_bytes
                .zip(d.later_steps_peak_bytes)
                .map(|(f, l)| l - f);
            d.first_step_note = first_step_note(&d);
            d
        })
        .collect()
}

/// The first step against the later ones, in one line: the caching allocator's warm-up
/// (reserved memory grows in the first step, then stays flat), growth after it, and a first-step
/// allocation peak that later steps do not reach (or exceed). `None` with fewer than two steps
/// with samples.
pub fn first_step_note(d: &MemoryDevice) -> Option<String> {
    use crate::units::fmt_bytes as b;
    let step = d.first_step?;
    let (fa, la) = (d.first_step_peak_bytes?, d.later_steps_peak_bytes?);
    let (fr, lr) = (d.first_step_reserved_bytes?, d.later_steps_reserved_bytes?);
    let (fg, lg) = (
        d.first_step_reserved_growth_bytes?,
        d.later_steps_reserved_growth_bytes?,
    );
    // Changes under 1% of the level (or 1 MiB for reserved, the caching allocator's smallest
    // segment is 2 MiB) are noise.
    let small = |delta: i64, level: i64, floor: i64| delta.abs() <= (level.abs() / 100).max(floor);
    let mut parts = Vec::new();
    let reserved = fr > 0 || lr > 0;
    if reserved {
        let warm = !small(fg, fr, 1 << 20);
        let grows = !small(lg, lr, 1 << 20);
        parts.push(match (warm, grows) {
            (true, false) => format!(
                "caching-allocator warm-up in step {step}: reserved grew by {} to {} there and \
                 stays flat after (peak {} in later steps)",
                b(fg),
                b(fr),
                b(lr)
            ),
            (_, true) => format!(
                "reserved still grows after step {step} (by up to {} within a later step, to {}): \
                 fragmentation or a leak, not only warm-up",
                b(lg),
                b(lr)
            ),
            (false, false) => format!(
                "no allocator warm-up in the window: reserved is flat from step {step} on ({})",
                b(fr.max(lr))
            ),
        });
    }
    if !small(fa - la, fa.max(la), 0) && fa > la {
        parts.push(format!(
            "step {step} peaks higher than the later steps ({} vs {} allocated): one-off \
             first-step allocations",
            b(fa),
            b(la)
        ));
    } else if !small(la - fa, fa.max(la), 0) && la > fa {
        parts.push(format!(
            "the allocated peak is higher in a later step ({} in step {step} → {}): memory kept across steps or larger inputs",
            b(fa),
            b(la)
        ));
    } else {
        parts.push(format!(
            "step {step} and the later steps peak alike ({} vs {} allocated)",
            b(fa),
            b(la)
        ));
    }
    Some(parts.join("; "))
}

/// At most `max_points` points: the samples grouped into equal time buckets, each bucket becoming
/// one point at its first sample's time holding the bucket's highest allocated and reserved
/// levels (so peaks survive), and the last sample, so the end level shows.
fn thin(v: &[MemSample], origin_ns: i64, max_points: usize) -> Vec<MemPoint> {
    let point = |s: &MemSample| MemPoint {
        t_ms: (s.ts - origin_ns) as f64 / 1e6,
        allocated: s.allocated,
        reserved: s.reserved,
    };
    if v.len() <= max_points.max(2) {
        return v.iter().map(point).collect();
    }
    let buckets = (max_points - 1).max(1) as i128;
    let (t0, t1) = (v[0].ts as i128, v[v.len() - 1].ts as i128);
    let span = (t1 - t0).max(1);
    let mut out: Vec<MemPoint> = Vec::new();
    let mut current: Option<(i128, MemPoint)> = None;
    for s in v {
        let b = ((s.ts as i128 - t0) * buckets / span).min(buckets - 1);
        match &mut current {
            Some((cb, p)) if *cb == b => {
                p.allocated = p.allocated.max(s.allocated);
                p.reserved = p.reserved.max(s.reserved);
            }
            _ => {
                if let Some((_, p)) = current {
                    out.push(p);
                }
                current = Some((b, point(s)));
            }
        }
    }
    if let Some((_, p)) = current {
        out.push(p);
    }
    out.push(point(&v[v.len() - 1]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::Row;
    use crate::units::Us;

    fn sample(ts_ms: i64, allocated: i64, reserved: i64) -> MemSample {
        MemSample {
            ts: ts_ms * 1_000_000,
            device: 0,
            allocated,
            reserved,
            bytes: 0,
            thread: 0,
        }
    }

    fn step(step: i64, start_ms: f64, len_ms: f64) -> StepRow {
        StepRow {
            rank: 0,
            cycle: 0,
            step,
            start_ms,
            step_time_us: Us(len_ms * 1000.0),
            gpu_busy_us: Us(0.0),
            compute_us: Us(0.0),
            comm_us: Us(0.0),
            kernels: 0,
            partial: false,
            collective_us: Us(0.0),
            collective: None,
        }
    }

    /// Rows from `(cat, name, start ms, dur ms)`.
    fn rows(ops: &[(&str, &str, f64, f64)], mem: Vec<MemSample>) -> Rows {
        let mut strings: Vec<Box<str>> = Vec::new();
        let mut id = |s: &str| -> u32 {
            match strings.iter().position(|x| &**x == s) {
                Some(i) => i as u32,
                None => {
                    strings.push(s.into());
                    strings.len() as u32 - 1
                }
            }
        };
        let rows = ops
            .iter()
            .enumerate()
            .map(|(i, &(cat, name, t, d))| Row {
                index: i as u32,
                name: id(name),
                cat: id(cat),
                thread: 0,
                stream: -1,
                corr: -1,
                ext: -1,
                hts: 0,
                hdur: 0,
                ts: (t * 1e6) as i64,
                dur: (d * 1e6) as i64,
            })
            .collect();
        Rows {
            strings,
            rows,
            mem,
            rounded: false,
            rank: None,
            events: 0,
            base_ns: None,
            metadata: Vec::new(),
            host_pid: None,
            op_args: Vec::new(),
        }
    }

    #[test]
    fn peak_and_step_growth() {
        let v: Vec<MemSample> = [(1, 10), (5, 30), (12, 20), (15, 50), (25, 5)]
            .into_iter()
            .map(|(t, a)| sample(t, a, a * 2))
            .collect();
        let steps = [step(1, 0.0, 10.0), step(2, 10.0, 10.0)];
        let r = rows(&[("cpu_op", "aten::mm", 14.0, 2.0)], v);
        let m = memory(0, &r, &steps, &[], 0, 100);
        assert_eq!(m.len(), 1);
        let d = &m[0];
        assert_eq!(
            (d.peak_allocated_bytes, d.peak_at_ms, d.peak_step),
            (50, 15.0, Some(2))
        );
        assert_eq!(d.peak_ops.as_deref(), Some("aten::mm"));
        assert_eq!(
            (d.first_step_peak_bytes, d.later_steps_peak_bytes),
            (Some(30), Some(50))
        );
        assert_eq!(d.later_minus_first_bytes, Some(20));
        assert_eq!((d.peak_reserved_bytes, d.final_allocated_bytes), (100, 5));
    }

    #[test]
    fn phases_from_annotations() {
        let r = rows(
            &[
                ("user_annotation", "ProfilerStep#7", 0.0, 10.0),
                (
                    "user_annotation",
                    "Optimizer.zero_grad#SGD.zero_grad",
                    1.0,
                    1.0,
                ),
                ("cpu_op", "aten::linear", 2.0, 2.0),
                (
                    "cpu_op",
                    "autograd::engine::evaluate_function: MmBackward0",
                    5.0,
                    1.0,
                ),
                (
                    "cpu_op",
                    "autograd::engine::evaluate_function: TBackward0",
                    6.5,
                    1.0,
                ),
                ("user_annotation", "Optimizer.step#SGD.step", 8.0, 1.5),
                // An inference step: no backward, so no guessed forward.
                ("user_annotation", "ProfilerStep#8", 10.0, 5.0),
                ("cpu_op", "aten::linear", 11.0, 2.0),
            ],
            Vec::new(),
        );
        let steps = [step(7, 0.0, 10.0), step(8, 10.0, 5.0)];
        let p: Vec<(i64, &str, f64, f64)> = phases(0, &r, &steps, 0)
            .iter()
            .map(|p| (p.step, p.kind.as_str(), p.start_ms, p.end_ms))
            .collect();
        assert_eq!(
            p,
            [
                (7, "forward", 0.0, 1.0),
                (7, "optimizer", 1.0, 2.0),
                (7, "forward", 2.0, 5.0),
                (7, "backward", 5.0, 7.5),
                (7, "optimizer", 8.0, 9.5),
            ]
        );
    }

    /// A warm-up trace: reserved grows in step 1 and is flat later; one that keeps growing; and
    /// a steady one.
    #[test]
    fn first_step_anomaly() {
        const M: i64 = 1 << 20;
        let steps = [step(1, 0.0, 10.0), step(2, 10.0, 10.0), step(3, 20.0, 10.0)];
        let run = |pts: &[(i64, i64, i64)]| {
            let v = pts.iter().map(|&(t, a, r)| sample(t, a, r)).collect();
            let r = rows(&[], v);
            memory(0, &r, &steps, &[], 0, 100).remove(0)
        };
        let warm = run(&[
            (1, 100 * M, 128 * M),
            (5, 900 * M, 1024 * M),
            (12, 600 * M, 1024 * M),
            (22, 600 * M, 1024 * M),
        ]);
        assert_eq!(warm.first_step_reserved_growth_bytes, Some(896 * M));
        assert_eq!(warm.later_steps_reserved_growth_bytes, Some(0));
        let note = warm.first_step_note.unwrap();
        assert!(
            note.starts_with(
                "caching-allocator warm-up in step 1: reserved grew by 896.0 MiB to 1.00 GiB"
            ),
            "{note}"
        );
        assert!(
            note.contains("step 1 peaks higher than the later steps (900.0 MiB vs 600.0 MiB"),
            "{note}"
        );
        let leak = run(&[
            (1, 100 * M, 128 * M),
            (12, 300 * M, 512 * M),
            (22, 500 * M, 1024 * M),
        ]);
        let note = leak.first_step_note.unwrap();
        assert!(
            note.starts_with("reserved still grows after step 1"),
            "{note}"
        );
        assert!(
            note.contains("the allocated peak is higher in a later step"),
            "{note}"
        );
        let steady = run(&[
            (1, 100 * M, 128 * M),
            (12, 100 * M, 128 * M),
            (22, 100 * M, 128 * M),
        ]);
        let note = steady.first_step_note.unwrap();
        assert!(note.starts_with("no allocator warm-up"), "{note}");
        assert!(
            note.ends_with("peak alike (100.0 MiB vs 100.0 MiB allocated)"),
            "{note}"
        );
        let one_step = memory(
            0,
            &rows(&[], vec![sample(1, 1, 1)]),
            &steps[..1],
            &[],
            0,
            100,
        );
        assert_eq!(one_step[0].first_step_note, None);
    }

    #[test]
    fn thinning_keeps_peaks() {
        let v: Vec<MemSample> = (0..1000)
            .map(|i| {
                sample(
                    i,
                    if i == 537 { 9999 } else { i },
                    if i == 20 { 7777 } else { 0 },
                )
            })
            .collect();
        let t = thin(&v, 0, 50);
        assert!(t.len() <= 51, "{}", t.len());
        assert!(t.iter().any(|p| p.allocated == 9999));
        assert!(t.iter().any(|p| p.reserved == 7777));
        assert_eq!(t.last().unwrap().allocated, 999);
    }
}
