//! One clock domain for every record: nanoseconds since the Unix epoch.
//!
//! CUPTI stamps GPU records with `CLOCK_REALTIME`-based nanoseconds, so that is the domain every record
//! lives in. CPU-side times are taken from the monotonic clock (`Instant`, which is `CLOCK_MONOTONIC`
//! on Linux) because it never steps backwards, and are converted with a fixed offset measured once:
//!
//! ```text
//! unix_ns(t) = anchor_unix_ns + (t - anchor_instant)
//! ```
//!
//! where `(anchor_instant, anchor_unix_ns)` is the pair with the narrowest bracket out of a few samples
//! of `Instant::now(); SystemTime::now(); Instant::now()`. The offset is not re-measured, so an NTP step
//! of the wall clock during a run shifts GPU records against CPU spans by the step (CUPTI has the same
//! property; a backend may supply its own converter).
//!
//! The recording hot path does not even read `CLOCK_MONOTONIC`: it stores raw [`Ticks`], which are the
//! CPU's time-stamp counter where that is invariant ([`tsc`]) and monotonic nanoseconds elsewhere. The
//! collector turns ticks into [`UnixNanos`] with a [`TickConverter`], which it calibrates against
//! `CLOCK_MONOTONIC` at every drain: conversion is piecewise linear between those calibration points,
//! so a drift of the counter's rate against the kernel clock (NTP slews `CLOCK_MONOTONIC`) never
//! accumulates beyond one interval.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A point in time, in nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixNanos(pub u64);

impl UnixNanos {
    /// The time now, from the monotonic clock converted to the Unix domain.
    #[inline]
    pub fn now() -> Self {
        let a = anchor();
        UnixNanos(a.unix_ns + a.instant.elapsed().as_nanos() as u64)
    }

    /// Converts an `Instant` taken in this process to the Unix domain.
    pub fn from_instant(t: Instant) -> Self {
        let a = anchor();
        match t.checked_duration_since(a.instant) {
            Some(d) => UnixNanos(a.unix_ns + d.as_nanos() as u64),
            None => UnixNanos(a.unix_ns.saturating_sub((a.instant - t).as_nanos() as u64)),
        }
    }

    /// Nanoseconds since the epoch.
    pub fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or 0 when `earlier` is later.
    pub fn saturating_sub(self, earlier: UnixNanos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

struct Anchor {
    instant: Instant,
    unix_ns: u64,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let mut best: Option<(u128, Anchor)> = None;
        for _ in 0..5 {
            let before = Instant::now();
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let after = Instant::now();
            let width = (after - before).as_nanos();
            // The wall reading sits somewhere in [before, after]; take the midpoint.
            let mid = before + (after - before) / 2;
            if best.as_ref().is_none_or(|(w, _)| width < *w) {
                best = Some((
                    width,
                    Anchor {
                        instant: mid,
                        unix_ns: wall,
                    },
                ));
            }
        }
        best.map(|(_, a)| a).expect("five samples were taken")
    })
}

/// Initialises the clock anchor and picks the recording clock eagerly, so the first span does not pay
/// for it.
pub fn init() {
    let _ = anchor();
    let _ = mode();
}

#[allow(unsafe_code)]
mod tsc;

/// A raw reading of the recording clock: time-stamp-counter ticks where the CPU has an invariant
/// counter, else nanoseconds of `CLOCK_MONOTONIC` since the process's clock anchor. Meaningful only
/// through a [`TickConverter`]; which of the two it is never changes during a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticks(pub u64);

const MODE_UNSET: u8 = 0;
const MODE_TSC: u8 = 1;
const MODE_MONOTONIC: u8 = 2;

/// Which clock [`Ticks::now`] reads. Chosen once; Relaxed everywhere because every thread that
/// races the choice computes the same answer.
static MODE: AtomicU8 = AtomicU8::new(MODE_UNSET);

#[inline(always)]
fn mode() -> u8 {
    match MODE.load(Ordering::Relaxed) {
        MODE_UNSET => choose_mode(),
        m => m,
    }
}

#[cold]
fn choose_mode() -> u8 {
    let m = if tsc::usable() {
        MODE_TSC
    } else {
        MODE_MONOTONIC
    };
    MODE.store(m, Ordering::Relaxed);
    m
}

/// Nanoseconds of `CLOCK_MONOTONIC` since the clock anchor.
fn monotonic_ns() -> u64 {
    anchor().instant.elapsed().as_nanos() as u64
}

impl Ticks {
    /// The recording clock now: one `rdtsc` where the counter is usable.
    #[inline(always)]
    pub fn now() -> Ticks {
        if mode() == MODE_TSC {
            Ticks(tsc::read())
        } else {
            Ticks(monotonic_ns())
        }
    }
}

/// Whether [`Ticks`] are time-stamp-counter ticks in this process (else monotonic nanoseconds).
pub fn ticks_are_tsc() -> bool {
    mode() == MODE_TSC
}

/// Most calibration points a converter keeps (at one per collector tick, several seconds' worth):
/// ticks older than the oldest are converted by extending the oldest interval.
const MAX_POINTS: usize = 512;

/// Turns [`Ticks`] into [`UnixNanos`]. Owned by the collector; [`calibrate`](Self::calibrate) adds a
/// point `(ticks, monotonic ns)` and conversion interpolates between the two points around a tick
/// value (extending the nearest interval outside them). Take a point after draining the rings, so
/// the records drained are older than it and are interpolated, never extrapolated.
#[derive(Clone, Debug)]
pub struct TickConverter {
    tsc: bool,
    /// Calibration points, ascending in both coordinates.
    points: std::collections::VecDeque<(u64, u64)>,
}

impl Default for TickConverter {
    fn default() -> Self {
        Self::new()
    }
}

impl TickConverter {
    /// A converter with its first calibration interval (for counter ticks, a short one measured now,
    /// about 200 µs, so conversion works before the first [`calibrate`](Self::calibrate)).
    pub fn new() -> TickConverter {
        let tsc = ticks_are_tsc();
        let mut c = TickConverter {
            tsc,
            points: std::collections::VecDeque::with_capacity(MAX_POINTS),
        };
        if tsc {
            // Two points about 200 µs apart (a few tries each, in case of preemption).
            for _ in 0..2 {
                let before = c.points.len();
                for _ in 0..10 {
                    c.calibrate();
                    if c.points.len() > before {
                        break;
                    }
                }
                if c.points.len() == before {
                    // Preempted every time: a wide sample beats none (the next ones replace it).
                    c.points.push_back(sample(u64::MAX).unwrap_or_default());
                }
                let until = Instant::now() + std::time::Duration::from_micros(200);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
        }
        c
    }

    /// Adds a calibration point for now (no-op for monotonic ticks, which need none). A sample
    /// whose bracket was stretched by preemption is not used; the next call tries again.
    pub fn calibrate(&mut self) {
        if !self.tsc {
            return;
        }
        let Some(point) = sample_tsc_against_monotonic() else {
            return;
        };
        if let Some(&(t, m)) = self.points.back() {
            // Keep points strictly increasing; a point within 50 µs of the last adds nothing.
            if point.0 <= t || point.1 < m + 50_000 {
                return;
            }
        }
        if self.points.len() == MAX_POINTS {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// Makes sure a calibration point lies after `t` (adding one now if none does), so that `t` is
    /// interpolated, not extrapolated. Points are only ever appended, so once covered, a tick
    /// converts to the same value at every later conversion: a window bound converted in one round
    /// and a record converted in a later one compare as their ticks do. (Extrapolating with the
    /// last interval's slope and interpolating later with a new point's can differ by hundreds of
    /// microseconds when the points are a few hundred microseconds apart and their midpoints a few
    /// off.)
    pub fn cover(&mut self, t: Ticks) {
        if !self.tsc || self.points.back().is_some_and(|&(pt, _)| pt > t.0) {
            return;
        }
        // A clean sample if one of a few tries gets it. Else (preempted every time) a point on the
        // line the last interval extends: a point is needed now, and one from a stretched bracket
        // could be off by half its width, moving every conversion near it.
        let point = (0..16)
            .find_map(|_| sample_tsc_against_monotonic())
            .or_else(|| {
                let now = tsc::read();
                let mono = self.monotonic_of(Ticks(now));
                Some((now, u64::try_from(mono).ok()?))
            });
        let Some((pt, mut pm)) = point else { return };
        if let Some(&(lt, lm)) = self.points.back() {
            if pt <= lt {
                return;
            }
            // Strictly increasing in both coordinates, whatever the bracket's error.
            pm = pm.max(lm + 1);
        }
        if self.points.len() == MAX_POINTS {
            self.points.pop_front();
        }
        self.points.push_back((pt, pm));
    }

    /// [`cover`](Self::cover)s `t`, then converts it: the value it will always convert to.
    pub fn to_unix_covered(&mut self, t: Ticks) -> UnixNanos {
        self.cover(t);
        self.to_unix(t)
    }

    /// Monotonic nanoseconds since the anchor for `t`.
    fn monotonic_of(&self, t: Ticks) -> i128 {
        if !self.tsc {
            return i128::from(t.0);
        }
        let n = self.points.len();
        if n < 2 {
            // Unreachable after `new`; a counter tick is then taken as a nanosecond.
            return self.points.back().map_or(i128::from(t.0), |&(pt, pm)| {
                i128::from(pm) + i128::from(t.0) - i128::from(pt)
            });
        }
        // The interval holding `t`: usually the last one (records are drained within a tick).
        let i = if t.0 >= self.points[n - 2].0 {
            n - 2
        } else {
            match self.points.binary_search_by(|p| p.0.cmp(&t.0)) {
                Ok(i) => i.min(n - 2),
                Err(0) => 0,
                Err(i) => (i - 1).min(n - 2),
            }
        };
        let (t0, m0) = self.points[i];
        let (t1, m1) = self.points[i + 1];
        let (t0, m0, t1, m1) = (t0 as i128, m0 as i128, t1 as i128, m1 as i128);
        m0 + (i128::from(t.0) - t0) * (m1 - m0) / (t1 - t0)
    }

    /// `t` in the Unix domain.
    pub fn to_unix(&self, t: Ticks) -> UnixNanos {
        let ns = i128::from(anchor().unix_ns) + self.monotonic_of(t);
        UnixNanos(ns.clamp(0, u64::MAX as i128) as u64)
    }
}

/// Widest bracket `tsc; Instant; tsc` accepted as a calibration sample, in counter ticks (a few
/// microseconds on any invariant-TSC CPU): a wider one was interrupted, and its midpoint could be
/// off by half its width.
const MAX_BRACKET_TICKS: u64 = 20_000;

/// One `(ticks, monotonic ns)` pair: the narrowest of a few brackets `tsc; Instant; tsc`, with the
/// counter read taken at the bracket's midpoint; `None` when every bracket was interrupted.
fn sample_tsc_against_monotonic() -> Option<(u64, u64)> {
    sample(MAX_BRACKET_TICKS)
}

fn sample(max_width: u64) -> Option<(u64, u64)> {
    let a = anchor();
    let mut best: Option<(u64, (u64, u64))> = None;
    for _ in 0..5 {
        let before = tsc::read();
        let mono = a.instant.elapsed().as_nanos() as u64;
        let after = tsc::read();
        let width = after.wrapping_sub(before);
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, (before + width / 2, mono)));
        }
    }
    best.filter(|(w, _)| *w <= max_width).map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_tracks_the_wall_clock() {
        let ours = UnixNanos::now().0 as i128;
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        // Same domain: within 50 ms of each other (an NTP step during the test would break this).
        assert!((ours - wall).abs() < 50_000_000, "ours={ours} wall={wall}");
    }

    #[test]
    fn now_is_monotonic() {
        let mut last = UnixNanos::now();
        for _ in 0..10_000 {
            let t = UnixNanos::now();
            assert!(t >= last);
            last = t;
        }
    }

    /// Over a couple of seconds of calibrating as the collector does (a point per 20 ms), converted
    /// recording-clock readings agree with `CLOCK_REALTIME` read at the same moment.
    #[test]
    fn converted_ticks_track_the_realtime_clock_over_a_long_run() {
        init();
        let mut conv = TickConverter::new();
        let mut samples = Vec::new();
        let started = Instant::now();
        while started.elapsed() < std::time::Duration::from_secs(2) {
            // A bracket: a reading whose neighbours are far apart was interrupted; skip it.
            let before = Ticks::now();
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as i128;
            let after = Ticks::now();
            if conv.to_unix(after).0 - conv.to_unix(before).0 < 20_000 {
                samples.push((Ticks(before.0 + (after.0 - before.0) / 2), wall));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            conv.calibrate();
        }
        assert!(samples.len() > 20, "only {} clean samples", samples.len());
        let worst = samples
            .iter()
            .map(|&(t, wall)| (conv.to_unix(t).0 as i128 - wall).abs())
            .max()
            .unwrap();
        // The anchor pairs the two clocks once, to within its bracket; after that only the
        // interpolation error remains (tens of ns). An NTP step during the test would break this.
        assert!(
            worst < 200_000,
            "worst disagreement {worst} ns over {} samples",
            samples.len()
        );
    }

    /// A tick converted once converts to exactly the same value after any later calibration. Before
    /// `cover`, a tick newer than the last point was extrapolated, and a later point moved it (the
    /// schedule test in CI lost the first step span of a window that way: the window's start,
    /// converted early, landed after the span's start, converted later).
    #[test]
    fn a_covered_tick_converts_the_same_ever_after() {
        init();
        if !ticks_are_tsc() {
            // Monotonic ticks are nanoseconds already: nothing to calibrate, nothing can move.
            return;
        }
        let mut conv = TickConverter::new();
        let mut seen = Vec::new();
        for _ in 0..20 {
            std::thread::sleep(std::time::Duration::from_millis(3));
            let t = Ticks::now();
            seen.push((t, conv.to_unix_covered(t)));
            std::thread::sleep(std::time::Duration::from_millis(2));
            conv.calibrate();
        }
        for &(t, first) in &seen {
            assert_eq!(conv.to_unix(t), first, "tick {t:?} moved");
        }
        let converted: Vec<UnixNanos> = seen.iter().map(|&(_, u)| u).collect();
        assert!(converted.windows(2).all(|p| p[0] < p[1]));
    }

    #[test]
    fn ticks_convert_monotonically() {
        init();
        let conv = TickConverter::new();
        let mut last = conv.to_unix(Ticks::now());
        for _ in 0..10_000 {
            let t = conv.to_unix(Ticks::now());
            assert!(t >= last);
            last = t;
        }
    }

    #[test]
    fn from_instant_before_the_anchor_is_earlier() {
        let early = Instant::now();
        init();
        let later = Instant::now();
        assert!(UnixNanos::from_instant(early) <= UnixNanos::from_instant(later));
    }
}
