//! The memory timeline from `[memory]` instant events (`profile_memory=True`): allocated and
//! reserved bytes over time per device, the peak and when it happens, and how the first step's
//! peak compares with the later steps' (growth after the first step points at a leak or at
//! caching that the first step warms up).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rows::MemSample;
use crate::steps::StepRow;

/// One point of a memory timeline.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemPoint {
    /// ms since the rank's first event.
    pub t_ms: f64,
    /// `Total Allocated`, bytes.
    pub allocated: i64,
    /// `Total Reserved`, bytes.
    pub reserved: i64,
}

/// Memory use of one device on one rank.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryDevice {
    /// Rank.
    pub rank: i64,
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
    /// Highest `Total Reserved`.
    pub peak_reserved_bytes: i64,
    /// `Total Allocated` after the last event.
    pub final_allocated_bytes: i64,
    /// Peak allocated inside the first step, when there are steps.
    pub first_step_peak_bytes: Option<i64>,
    /// Highest peak allocated inside any later step, when there are at least two steps.
    pub later_steps_peak_bytes: Option<i64>,
    /// `later_steps_peak − first_step_peak`.
    pub later_minus_first_bytes: Option<i64>,
    /// The timeline, thinned to at most the requested number of points (each kept point is the
    /// highest allocation of its time bucket, so peaks survive).
    pub timeline: Vec<MemPoint>,
}

/// Per-device memory summaries of one rank.
pub(crate) fn memory(
    rank: i64,
    samples: &[MemSample],
    steps: &[StepRow],
    origin_ns: i64,
    max_points: usize,
) -> Vec<MemoryDevice> {
    let mut by_device: BTreeMap<i64, Vec<MemSample>> = BTreeMap::new();
    for s in samples {
        by_device.entry(s.device).or_default().push(*s);
    }
    let ms = |t: i64| (t - origin_ns) as f64 / 1e6;
    let step_of = |t_ms: f64| -> Option<i64> {
        steps
            .iter()
            .rev()
            .find(|s| s.start_ms <= t_ms && t_ms < s.start_ms + s.step_time_us.0 / 1000.0)
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
            let step_peak = |step: &StepRow| -> Option<i64> {
                let (a, b) = (step.start_ms, step.start_ms + step.step_time_us.0 / 1000.0);
                v.iter()
                    .filter(|s| (a..b).contains(&ms(s.ts)))
                    .map(|s| s.allocated)
                    .max()
            };
            let first = steps.first().and_then(step_peak);
            let later = steps.iter().skip(1).filter_map(step_peak).max();
            let peak_at_ms = peak.map_or(0.0, |p| ms(p.ts));
            MemoryDevice {
                rank,
                device,
                samples: v.len(),
                peak_allocated_bytes: peak.map_or(0, |p| p.allocated),
                peak_at_ms,
                peak_step: peak.and_then(|_| step_of(peak_at_ms)),
                peak_reserved_bytes: v.iter().map(|s| s.reserved).max().unwrap_or(0),
                final_allocated_bytes: v.last().map_or(0, |s| s.allocated),
                first_step_peak_bytes: first,
                later_steps_peak_bytes: later,
                later_minus_first_bytes: first.zip(later).map(|(f, l)| l - f),
                timeline: thin(&v, origin_ns, max_points),
            }
        })
        .collect()
}

/// At most `max_points` points: the samples grouped into equal time buckets, keeping each
/// bucket's highest allocation (and the last sample, so the end level shows).
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
    let mut current: Option<(i128, MemSample)> = None;
    for s in v {
        let b = ((s.ts as i128 - t0) * buckets / span).min(buckets - 1);
        match &mut current {
            Some((cb, best)) if *cb == b => {
                if s.allocated > best.allocated {
                    *best = *s;
                }
            }
            _ => {
                if let Some((_, best)) = current {
                    out.push(point(&best));
                }
                current = Some((b, *s));
            }
        }
    }
    if let Some((_, best)) = current {
        out.push(point(&best));
    }
    out.push(point(&v[v.len() - 1]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Us;

    fn sample(ts_ms: i64, allocated: i64) -> MemSample {
        MemSample {
            ts: ts_ms * 1_000_000,
            device: 0,
            allocated,
            reserved: allocated * 2,
        }
    }

    fn step(step: i64, start_ms: f64, len_ms: f64) -> StepRow {
        StepRow {
            rank: 0,
            step,
            start_ms,
            step_time_us: Us(len_ms * 1000.0),
            gpu_busy_us: Us(0.0),
            compute_us: Us(0.0),
            comm_us: Us(0.0),
            kernels: 0,
        }
    }

    #[test]
    fn peak_and_step_growth() {
        let v: Vec<MemSample> = [(1, 10), (5, 30), (12, 20), (15, 50), (25, 5)]
            .into_iter()
            .map(|(t, a)| sample(t, a))
            .collect();
        let steps = [step(1, 0.0, 10.0), step(2, 10.0, 10.0)];
        let m = memory(0, &v, &steps, 0, 100);
        assert_eq!(m.len(), 1);
        let d = &m[0];
        assert_eq!(
            (d.peak_allocated_bytes, d.peak_at_ms, d.peak_step),
            (50, 15.0, Some(2))
        );
        assert_eq!(
            (d.first_step_peak_bytes, d.later_steps_peak_bytes),
            (Some(30), Some(50))
        );
        assert_eq!(d.later_minus_first_bytes, Some(20));
        assert_eq!((d.peak_reserved_bytes, d.final_allocated_bytes), (100, 5));
    }

    #[test]
    fn thinning_keeps_peaks() {
        let v: Vec<MemSample> = (0..1000)
            .map(|i| sample(i, if i == 537 { 9999 } else { i }))
            .collect();
        let t = thin(&v, 0, 50);
        assert!(t.len() <= 51, "{}", t.len());
        assert!(t.iter().any(|p| p.allocated == 9999));
        assert_eq!(t.last().unwrap().allocated, 999);
    }
}
