//! The GPU backend a profiler records with by default: CUPTI on NVIDIA (feature `cupti`), loaded at
//! run time. On a machine without a CUDA driver or libcupti the source is still added; it records
//! nothing, says why in one line when recording first starts, and the trace metadata says the same
//! (`cupti_status`), so the profiler records CPU activity only.

use std::path::PathBuf;

use kinetrace_core::session::LogFn;
use kinetrace_core::ActivitySource;

/// How the default GPU backend is set up (builder settings, kept for [`crate::Profiler::add_gpu`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct GpuSettings {
    /// Use this library (libcupti) instead of searching for one.
    pub library: Option<PathBuf>,
    /// Bound on the backend's activity buffers, in bytes (`None`: the backend's default).
    pub max_buffer_bytes: Option<usize>,
}

/// The default GPU source, logging through `log`.
#[cfg(feature = "cupti")]
pub(crate) fn source(settings: &GpuSettings, log: &LogFn) -> Box<dyn ActivitySource> {
    use kinetrace_cupti::{CuptiConfig, CuptiSource};
    let defaults = CuptiConfig::default();
    let config = CuptiConfig {
        library: settings.library.clone(),
        max_buffer_bytes: settings
            .max_buffer_bytes
            .unwrap_or(defaults.max_buffer_bytes),
        // One log channel: the backend's warnings go where the profiler's do (the session also
        // hands it its log; this covers what the backend says before a session exists).
        log: Some(log.clone()),
        ..defaults
    };
    Box::new(CuptiSource::new(config))
}

/// Without a GPU backend compiled in: a source that says so once and records nothing.
#[cfg(not(feature = "cupti"))]
pub(crate) fn source(_settings: &GpuSettings, _log: &LogFn) -> Box<dyn ActivitySource> {
    use kinetrace_core::{ActivitySet, SourceError};
    struct Off {
        reported: bool,
    }
    impl ActivitySource for Off {
        fn name(&self) -> &str {
            "gpu"
        }
        fn enable(&mut self, _: ActivitySet) -> Result<(), SourceError> {
            if std::mem::replace(&mut self.reported, true) {
                return Ok(());
            }
            Err(SourceError {
                source: "gpu".into(),
                message: "this build of kinetrace has no GPU backend (feature `cupti`)".into(),
            })
        }
    }
    Box::new(Off { reported: false })
}

/// Whether a GPU backend is compiled in.
pub(crate) const BUILT_IN: bool = cfg!(feature = "cupti");
