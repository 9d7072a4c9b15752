//! One clock domain for every record: nanoseconds since the Unix epoch.
//!
//! CUPTI stamps GPU records with `CLOCK_REALTIME`-based nanoseconds, so that is the domain every record
//! lives in. CPU spans are timed with the monotonic clock (`Instant`, which is `CLOCK_MONOTONIC` on
//! Linux) because it never steps backwards, and are converted with a fixed offset measured once:
//!
//! ```text
//! unix_ns(t) = anchor_unix_ns + (t - anchor_instant)
//! ```
//!
//! where `(anchor_instant, anchor_unix_ns)` is the pair with the narrowest bracket out of a few samples
//! of `Instant::now(); SystemTime::now(); Instant::now()`. The offset is not re-measured, so an NTP step
//! of the wall clock during a run shifts GPU records against CPU spans by the step (CUPTI has the same
//! property; a backend may supply its own converter).

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

/// Initialises the clock anchor eagerly, so the first span does not pay for it.
pub fn init() {
    let _ = anchor();
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

    #[test]
    fn from_instant_before_the_anchor_is_earlier() {
        let early = Instant::now();
        init();
        let later = Instant::now();
        assert!(UnixNanos::from_instant(early) <= UnixNanos::from_instant(later));
    }
}
