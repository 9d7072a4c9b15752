//! The GPU backend a profiler records with by default: CUPTI on NVIDIA (feature `cupti`), else
//! rocprofiler-sdk on AMD (feature `rocm`; roctracer 4.1 when the SDK is absent or registered too
//! late), all loaded at run time. On a machine with neither the
//! source is still added; it records nothing, says why in one line when recording first starts,
//! and the trace metadata says the same (`cupti_status`), so the profiler records CPU activity
//! only. A node where rocprofiler-sdk exists but cannot be used (registered too late, say) gets the
//! ROCm source, so the line says what went wrong with the runtime the node has.

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
    /// Bound on the ROCm backend's record queue (`None`: the backend's default).
    #[cfg_attr(not(feature = "rocm"), allow(dead_code))]
    pub rocm_max_events: Option<usize>,
}

/// The default GPU source, logging through `log`: CUPTI when it is live (or named explicitly),
/// else rocprofiler-sdk when one is found, else the CUPTI source that says why not.
#[cfg(all(feature = "cupti", feature = "rocm"))]
pub(crate) fn source(settings: &GpuSettings, log: &LogFn) -> Box<dyn ActivitySource> {
    let cupti = cupti_source(settings, log);
    if cupti.is_live() || settings.library.is_some() {
        return Box::new(cupti);
    }
    match rocm_source(settings, log) {
        Some(rocm) => Box::new(rocm),
        None => Box::new(cupti),
    }
}

/// The default GPU source, logging through `log`.
#[cfg(all(feature = "cupti", not(feature = "rocm")))]
pub(crate) fn source(settings: &GpuSettings, log: &LogFn) -> Box<dyn ActivitySource> {
    Box::new(cupti_source(settings, log))
}

/// The default GPU source, logging through `log`: rocprofiler-sdk (a build without CUPTI).
#[cfg(all(feature = "rocm", not(feature = "cupti")))]
pub(crate) fn source(settings: &GpuSettings, log: &LogFn) -> Box<dyn ActivitySource> {
    Box::new(kinetrace_rocm::RocmSource::new(rocm_config(settings, log)))
}

/// The ROCm backend's settings.
#[cfg(feature = "rocm")]
fn rocm_config(settings: &GpuSettings, log: &LogFn) -> kinetrace_rocm::RocmConfig {
    let defaults = kinetrace_rocm::RocmConfig::default();
    kinetrace_rocm::RocmConfig {
        log: Some(log.clone()),
        queue_records: settings.rocm_max_events.unwrap_or(defaults.queue_records),
        ..defaults
    }
}

/// The ROCm source, unless neither rocprofiler-sdk nor roctracer was found.
#[cfg(all(feature = "cupti", feature = "rocm"))]
fn rocm_source(settings: &GpuSettings, log: &LogFn) -> Option<kinetrace_rocm::RocmSource> {
    use kinetrace_rocm::{RocmOpenError, RocmSource};
    let source = RocmSource::new(rocm_config(settings, log));
    match source.library_info() {
        // Neither rocprofiler-sdk nor roctracer.
        Err(RocmOpenError::NotFound(_)) if !source.is_live() => None,
        _ => Some(source),
    }
}

#[cfg(feature = "cupti")]
fn cupti_source(settings: &GpuSettings, log: &LogFn) -> kinetrace_cupti::CuptiSource {
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
    CuptiSource::new(config)
}

/// Without a GPU backend compiled in: a source that says so once and records nothing.
#[cfg(not(any(feature = "cupti", feature = "rocm")))]
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
                message: "this build of kinetrace has no GPU backend (features `cupti`, `rocm`)"
                    .into(),
            })
        }
    }
    Box::new(Off { reported: false })
}

/// Whether a GPU backend is compiled in.
pub(crate) const BUILT_IN: bool = cfg!(any(feature = "cupti", feature = "rocm"));
