//! The process's profiling phase: one enum, one pure transition function, stored in one atomic.
//!
//! ```text
//!            fork (child)                      start finished: ok
//!   Child <─────────────── Dormant ──step / CUDA──> Starting ─────────────> Running ──exit──> Off
//!     │                                               │   │                    │
//!     └──────────CUDA initialising──────────────────>─┘   └─not / failed /     │ fork (child)
//!                                                            panicked ─> Off   v
//!                                    Starting ──fork (child)────────────────> Forked
//! ```
//!
//! - **Dormant**: loaded, nothing read, nothing started (a shell, a launcher, a compiler stays here).
//! - **Child**: forked from a dormant process. Steps are counted but start nothing (multiprocessing
//!   workers report none of their own and may leave with `os._exit`); only initialising CUDA
//!   itself starts profiling.
//! - **Starting**: one thread is reading the configuration and starting the profiler.
//! - **Running**: profiling (possibly stepped aside for another CUPTI client, which the profiler's
//!   status says; the phase does not change, so steps keep counting).
//! - **Forked**: a child of a running or starting process. It keeps nothing: no capture, no flush,
//!   no file (its copies of the parent's locks may be held by threads it does not have).
//! - **Off**: for good: not selected, misconfigured, a panic while starting, or after exit.
//!
//! The phase is one `AtomicU8` because the atfork child handler must read and write it
//! async-signal-safely (an atomic compare-and-swap, nothing else).

use std::sync::atomic::{AtomicU8, Ordering};

/// Where the process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Not started; nothing read.
    Dormant = 0,
    /// Forked from a dormant process: only CUDA initialising starts it.
    Child = 1,
    /// Starting (under the start lock).
    Starting = 2,
    /// Profiling.
    Running = 3,
    /// Forked from a running or starting process: never profiles.
    Forked = 4,
    /// Never profiles again.
    Off = 5,
}

impl Phase {
    /// Every phase (for tests and tables).
    pub const ALL: [Phase; 6] = [
        Phase::Dormant,
        Phase::Child,
        Phase::Starting,
        Phase::Running,
        Phase::Forked,
        Phase::Off,
    ];

    fn from_u8(v: u8) -> Phase {
        Phase::ALL
            .into_iter()
            .find(|p| *p as u8 == v)
            .unwrap_or(Phase::Off)
    }
}

/// How a start ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The profiler runs.
    Started,
    /// This process is not to profile (rank not selected, another tool injected, another CUPTI
    /// client): quietly, or with one line.
    NotProfiling,
    /// It cannot (malformed configuration, the profiler would not start): one line.
    Failed,
    /// Starting panicked (the panic hook said where).
    Panicked,
}

/// What happened to the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The CUDA driver is initialising (`InitializeInjection`).
    CudaInitializing,
    /// The job reported a step (or an NVTX range marked one).
    Step,
    /// This is the child of a fork (the atfork child handler).
    ForkChild,
    /// Starting ended.
    StartFinished(Outcome),
    /// Another CUPTI client took CUPTI over: the running profiler steps aside, a later start does
    /// not profile (neither changes the phase).
    StepAside,
    /// The process is exiting and the exit handler has finished.
    Exit,
}

/// The phase after `event` in phase `phase`. Pure: the table the module docs draw.
pub fn next(phase: Phase, event: Event) -> Phase {
    use Event::*;
    use Phase::*;
    match (phase, event) {
        // Forked and Off are for good.
        (Forked | Off, _) => phase,
        (Dormant, CudaInitializing | Step) => Starting,
        (Child, CudaInitializing) => Starting,
        (Child, Step) => Child,
        (Dormant, ForkChild) => Child,
        (Child, ForkChild) => Child,
        (Starting | Running, ForkChild) => Forked,
        (Starting, StartFinished(Outcome::Started)) => Running,
        (Starting, StartFinished(_)) => Off,
        // A start finishing in another phase is not one this process began.
        (Dormant | Child | Running, StartFinished(_)) => phase,
        // Another thread is starting: it decides.
        (Starting, CudaInitializing | Step | StepAside | Exit) => Starting,
        (Running, CudaInitializing | Step | StepAside) => Running,
        (Running, Exit) => Off,
        (Dormant | Child, StepAside | Exit) => phase,
    }
}

/// The process's phase, in one atomic.
pub struct PhaseCell(AtomicU8);

impl Default for PhaseCell {
    fn default() -> Self {
        PhaseCell::new()
    }
}

impl PhaseCell {
    /// Dormant.
    pub const fn new() -> PhaseCell {
        PhaseCell(AtomicU8::new(Phase::Dormant as u8))
    }

    /// The phase now. Acquire: pairs with the Release in [`apply`](Self::apply), so whoever sees
    /// Running also sees the profiler stored before it.
    pub fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::Acquire))
    }

    /// Applies `event`; returns the phases before and after. A compare-and-swap loop, so it is
    /// async-signal-safe (the atfork child handler uses it).
    pub fn apply(&self, event: Event) -> (Phase, Phase) {
        let mut before = self.0.load(Ordering::Acquire);
        loop {
            let after = next(Phase::from_u8(before), event) as u8;
            match self
                .0
                .compare_exchange_weak(before, after, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (Phase::from_u8(before), Phase::from_u8(after)),
                Err(now) => before = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event::*;
    use Phase::*;

    const EVENTS: [Event; 9] = [
        CudaInitializing,
        Step,
        ForkChild,
        StartFinished(Outcome::Started),
        StartFinished(Outcome::NotProfiling),
        StartFinished(Outcome::Failed),
        StartFinished(Outcome::Panicked),
        StepAside,
        Exit,
    ];

    /// The expected phase for every (phase, event) pair, row by row in the order of
    /// [`Phase::ALL`] and columns in the order of [`EVENTS`].
    const TABLE: [[Phase; 9]; 6] = [
        // CUDA      Step      Fork     Started  NotProf  Failed  Panicked StepAside Exit
        [
            Starting, Starting, Child, Dormant, Dormant, Dormant, Dormant, Dormant, Dormant,
        ], // Dormant
        [
            Starting, Child, Child, Child, Child, Child, Child, Child, Child,
        ], // Child
        [
            Starting, Starting, Forked, Running, Off, Off, Off, Starting, Starting,
        ], // Starting
        [
            Running, Running, Forked, Running, Running, Running, Running, Running, Off,
        ], // Running
        [
            Forked, Forked, Forked, Forked, Forked, Forked, Forked, Forked, Forked,
        ], // Forked
        [Off, Off, Off, Off, Off, Off, Off, Off, Off], // Off
    ];

    #[test]
    fn every_phase_and_event() {
        for (i, p) in Phase::ALL.into_iter().enumerate() {
            for (j, e) in EVENTS.into_iter().enumerate() {
                assert_eq!(next(p, e), TABLE[i][j], "{p:?} on {e:?}");
            }
        }
    }

    #[test]
    fn forked_and_off_are_for_good_and_only_a_start_leaves_starting() {
        for e in EVENTS {
            assert_eq!(next(Forked, e), Forked);
            assert_eq!(next(Off, e), Off);
        }
        for p in Phase::ALL {
            for e in EVENTS {
                let q = next(p, e);
                if q == Running {
                    assert!(
                        p == Running || e == StartFinished(Outcome::Started),
                        "{p:?} {e:?}"
                    );
                }
                if p == Starting && q != Starting {
                    assert!(matches!(e, StartFinished(_) | ForkChild), "{e:?}");
                }
            }
        }
    }

    #[test]
    fn the_cell_applies_events_and_round_trips_every_phase() {
        for p in Phase::ALL {
            assert_eq!(Phase::from_u8(p as u8), p);
        }
        let c = PhaseCell::new();
        assert_eq!(c.get(), Dormant);
        assert_eq!(c.apply(ForkChild), (Dormant, Child));
        assert_eq!(c.apply(Step), (Child, Child));
        assert_eq!(c.apply(CudaInitializing), (Child, Starting));
        assert_eq!(
            c.apply(StartFinished(Outcome::Started)),
            (Starting, Running)
        );
        assert_eq!(c.apply(ForkChild), (Running, Forked));
        assert_eq!(c.get(), Forked);
    }
}
