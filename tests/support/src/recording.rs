//! Recording without the facade: what a backend's tests need to run the real pipeline (a
//! [`Session`] writing Kineto traces through [`TraceDir`]) while depending only on crates below the
//! facade.

use std::path::Path;
use std::sync::{Arc, Mutex};

use kinetrace_core::recorder::SpanGuard;
use kinetrace_core::session::{LogFn, SessionConfig, Trigger};
use kinetrace_core::{ActivitySet, ActivitySource, Session};
use kinetrace_export::TraceDir;

/// Collects one-line messages (a session's, a source's).
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    /// A log function appending each line here.
    pub fn sink(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let l = self.0.clone();
        move |m: &str| {
            l.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(m.to_string())
        }
    }

    /// [`Log::sink`] as a session's [`LogFn`].
    pub fn log_fn(&self) -> LogFn {
        Arc::new(self.sink())
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Opens a `user_annotation` range until the guard drops (what `kinetrace::record_function` does).
pub fn annotation(name: &'static str) -> SpanGuard {
    SpanGuard::enter_static(name, true)
}

/// Starts a session recording `activities` from `sources` from now until it stops, as one trace
/// in `dir`, with its messages going to `log`. Fails the test if another session is running.
pub fn trace_session(
    sources: Vec<Box<dyn ActivitySource>>,
    activities: ActivitySet,
    dir: &Path,
    log: &Log,
) -> Session {
    let config = SessionConfig {
        activities,
        trigger: Trigger::Always,
        log: log.log_fn(),
        ..SessionConfig::default()
    };
    Session::start(config, sources, Box::new(TraceDir::new(dir)), None)
        .expect("no other session in this process")
}
