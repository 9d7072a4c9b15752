//! The CUPTI [`ActivitySource`]: loads the library, registers the buffer callbacks, subscribes to API
//! callbacks for `External id` linking, and decodes completed buffers on the collector thread.
//!
//! CUPTI is shared with the rest of the process. Before 13.3 it allows one subscriber, and PyTorch's
//! Kineto falls back to CPU-only tracing when its `cuptiSubscribe` fails, so the source holds the
//! subscriber only while a window is open: it subscribes in `enable` and unsubscribes in
//! `disable`. When another client holds it, the window records CPU activity only (nothing of the
//! activity API is touched, since registering our buffer callbacks would take the other client's
//! records): said once, then retried quietly at each window.
//!
//! Accounting: every record CUPTI produced while a window was open ends up in that window's trace,
//! or counted as dropped (CUPTI's own count, read from the global queue at every poll and at the
//! end of the window, whether or not a buffer completed; or records of buffers the pool discarded),
//! or counted as late (below).
//!
//! Late buffers: `cuptiActivityFlushAll(FORCED)` is a blocking call, so at the end of a window CUPTI
//! has normally returned every buffer. A buffer it still holds after [`CuptiConfig::late_buffer_wait`]
//! cannot be in that window's trace (the trace is written next), and must not be decoded into the
//! next window either. Such a buffer is remembered; when it does come back its records are counted
//! (`cupti_late_records` in later traces) and discarded. The window that missed it says so in its
//! metadata (`cupti_late_buffers`) and in one line.
//!
//! Ignored failures: a CUPTI call whose failure does not stop recording (thread id type, per-thread
//! buffers, callback domains, noise filters, the struct-size check, dropped counts, the record
//! iterator, disable, unsubscribe, and the External id push/pop in the API callback) is counted by
//! call and code and listed in `cupti_ignored_errors`; failures at teardown, after the last trace,
//! are said in one line (unless the source never recorded: its enable failure was said already).
//!
//! Messages: one channel, the session's log ([`ActivitySource::set_log`]); standard error until a
//! session gives one; [`CuptiConfig::log`] overrides both.
//!
//! Layout: `window` drives CUPTI for a window through [`crate::result`], `callbacks` holds the
//! `extern "C"` trampolines (the only `unsafe` of the source), `ignored` the failure tally.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kinetrace_core::activity::{Activity, ActivitySet, ActivityType, DeviceProperties};
use kinetrace_core::session::LogFn;
use kinetrace_core::source::{ActivitySource, SourceError};

use crate::decode::Decoder;
use crate::kinds;
use crate::loader::{self, CuptiOpenError, Driver, Origin, SearchInputs};
use crate::pool::{BufferPool, DEFAULT_BUFFER_SIZE, DEFAULT_MAX_BYTES};
use crate::result;
use crate::version::{Release, NEWEST_KNOWN};

mod callbacks;
mod ignored;
mod metadata;
mod window;

pub use window::EnableError;
use window::Live;

/// The process-wide buffer pool (CUPTI's buffer callbacks carry no user data).
static POOL: BufferPool = BufferPool::new();

/// Counters of the process-wide activity-buffer pool.
pub fn pool_stats() -> crate::pool::PoolStats {
    POOL.stats()
}

/// The log used until a session gives one: one line on standard error, prefixed `kinetrace: `,
/// ignoring failure (a closed pipe or a full disk must not panic the job, as `eprintln!` would).
fn stderr_log() -> LogFn {
    Arc::new(|line: &str| {
        use std::io::Write;
        let text = format!("kinetrace: {line}\n");
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    })
}

/// Settings for [`CuptiSource`].
#[derive(Clone)]
pub struct CuptiConfig {
    /// Use this libcupti (else `KINETRACE_CUPTI_PATH`, else the search in [`crate::loader`]).
    pub library: Option<PathBuf>,
    /// Check this library instead of `libcuda.so.1` for the driver (tests).
    pub driver: Option<PathBuf>,
    /// Bytes per activity buffer (default 4 MiB).
    pub buffer_size: usize,
    /// Bound on all activity buffers together (default 128 MB, like Kineto).
    pub max_buffer_bytes: usize,
    /// Keep API calls Kineto drops as noise (`cudaGetDevice`…).
    pub keep_noise: bool,
    /// Link GPU work to enclosing kinetrace spans (subscribes to the callback API while a window is
    /// open). It is also how another CUPTI client is noticed: without it, a window's buffer
    /// callbacks replace those of a client that started before it.
    pub external_ids: bool,
    /// How long the end of a window waits for buffers CUPTI still holds after
    /// `cuptiActivityFlushAll` returned. Records of a buffer that comes back later are counted
    /// (`cupti_late_records`), not written.
    pub late_buffer_wait: Duration,
    /// Call `cuptiFinalize` when the source is dropped, so the job runs at full speed afterwards
    /// (skipped while another CUPTI client holds the subscriber).
    pub finalize_on_drop: bool,
    /// Where this source's one-line messages go instead of the session's log (tests and tools that
    /// want CUPTI's lines apart). `None`, the default: the session's log
    /// ([`ActivitySource::set_log`]), or standard error before there is a session.
    pub log: Option<LogFn>,
}

impl Default for CuptiConfig {
    fn default() -> Self {
        CuptiConfig {
            library: None,
            driver: None,
            buffer_size: DEFAULT_BUFFER_SIZE,
            max_buffer_bytes: DEFAULT_MAX_BYTES,
            keep_noise: false,
            external_ids: true,
            late_buffer_wait: Duration::from_millis(500),
            finalize_on_drop: true,
            log: None,
        }
    }
}

impl fmt::Debug for CuptiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CuptiConfig")
            .field("library", &self.library)
            .field("driver", &self.driver)
            .field("buffer_size", &self.buffer_size)
            .field("max_buffer_bytes", &self.max_buffer_bytes)
            .field("keep_noise", &self.keep_noise)
            .field("external_ids", &self.external_ids)
            .field("late_buffer_wait", &self.late_buffer_wait)
            .field("finalize_on_drop", &self.finalize_on_drop)
            .field("log", &self.log.as_ref().map(|_| "LogFn(..)"))
            .finish()
    }
}

/// What was loaded, for metadata and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryInfo {
    /// The library path (or SONAME) opened.
    pub path: PathBuf,
    /// Its SONAME.
    pub soname: String,
    /// Where the search found it.
    pub origin: Origin,
    /// `cuptiGetVersion`.
    pub api_version: u32,
    /// The release that implies.
    pub release: Release,
    /// The driver that was confirmed.
    pub driver: Driver,
    /// Optional entry points the library lacks.
    pub missing_optional: Vec<&'static str>,
}

enum State {
    Off {
        reason: CuptiOpenError,
        reported: bool,
    },
    Live(Box<Live>),
}

/// The CUPTI backend. Construct it with [`CuptiSource::new`]; it never fails: a node without a CUDA
/// driver or libcupti gets a source that reports why once and records nothing.
pub struct CuptiSource {
    config: CuptiConfig,
    state: State,
    /// Where messages go: `config.log`, else the session's (`set_log`), else standard error.
    log: LogFn,
}

fn source_error(e: impl fmt::Display) -> SourceError {
    SourceError {
        source: "cupti".into(),
        message: e.to_string(),
    }
}

impl CuptiSource {
    /// Finds libcupti, confirms the driver, and reads the version. No CUPTI call is made before the
    /// driver check passes.
    pub fn new(config: CuptiConfig) -> CuptiSource {
        let state = match Self::open(&config) {
            Ok(live) => State::Live(Box::new(live)),
            Err(reason) => State::Off {
                reason,
                reported: false,
            },
        };
        let log = config.log.clone().unwrap_or_else(stderr_log);
        CuptiSource { config, state, log }
    }

    fn open(config: &CuptiConfig) -> Result<Live, CuptiOpenError> {
        let found = loader::locate(&SearchInputs::from_process(config.library.clone()))?;
        let driver = loader::check_driver(config.driver.as_deref())?;
        // Leaked once per source: the API callback's user data, valid until CUPTI is finalized
        // (the library itself is never unloaded).
        let cupti = &*Box::leak(Box::new(found.cupti));
        // The driver check above passed, so CUPTI's first call cannot take the process down
        // (CUPTI 13.2 crashes without a driver).
        let api_version = result::get_version(cupti).map_err(|error| CuptiOpenError::Call {
            call: "cuptiGetVersion",
            library: cupti.path().to_path_buf(),
            error,
        })?;
        let release = Release::from_api_version(api_version, &found.soname).unwrap_or(NEWEST_KNOWN);
        let info = LibraryInfo {
            path: cupti.path().to_path_buf(),
            soname: found.soname,
            origin: found.origin,
            api_version,
            release,
            driver,
            missing_optional: cupti.missing_optional(),
        };
        let names = callbacks::names_of_completed_records();
        let decoder = Decoder::new(release.layout(), names, config.keep_noise);
        Ok(Live::new(cupti, info, decoder))
    }

    /// What was loaded, or why the source is off.
    pub fn library_info(&self) -> Result<&LibraryInfo, &CuptiOpenError> {
        match &self.state {
            State::Live(l) => Ok(&l.info),
            State::Off { reason, .. } => Err(reason),
        }
    }

    /// Whether the source can record.
    pub fn is_live(&self) -> bool {
        matches!(self.state, State::Live(_))
    }
}

/// The CUPTI kinds to enable for `activities`.
pub fn kinds_for(activities: ActivitySet) -> Vec<u32> {
    let mut v = Vec::new();
    let mut add = |t: ActivityType, ks: &[u32]| {
        if activities.contains(t) {
            v.extend_from_slice(ks);
        }
    };
    add(ActivityType::Kernel, &[kinds::CONCURRENT_KERNEL]);
    add(ActivityType::Memcpy, &[kinds::MEMCPY, kinds::MEMCPY2]);
    add(ActivityType::Memset, &[kinds::MEMSET]);
    add(ActivityType::Runtime, &[kinds::RUNTIME]);
    add(ActivityType::Driver, &[kinds::DRIVER]);
    // CUDA_EVENT tells which stream and `cudaEventRecord` an event sync waits on.
    add(
        ActivityType::Sync,
        &[kinds::SYNCHRONIZATION, kinds::CUDA_EVENT],
    );
    add(ActivityType::Overhead, &[kinds::OVERHEAD]);
    add(ActivityType::Memory, &[kinds::MEMORY2, kinds::MEMORY_POOL]);
    add(ActivityType::Marker, &[kinds::MARKER]);
    if !v.is_empty() {
        // DEVICE for the trace's deviceProperties, CONTEXT for the context → device map.
        v.extend_from_slice(&[kinds::EXTERNAL_CORRELATION, kinds::DEVICE, kinds::CONTEXT]);
    }
    v
}

/// Kinds (from `kinds`) whose record size, as `cuptiActivityGetStructSize` reports it, the decoders
/// must not trust: `(kind, reported, expected)`. A release this build knows must report exactly the
/// layout table's size; a newer one may have grown a kind (records only append) but never below
/// the base layout the decoders read. `size_of` answers the library's query (`None`: it could not
/// say, e.g. before 13.2).
pub fn struct_size_mismatches(
    release: Release,
    kinds: &[u32],
    mut size_of: impl FnMut(u32) -> Option<usize>,
) -> Vec<(u32, usize, usize)> {
    let table = release.layout();
    let base = Release::V11_8.layout();
    let known = release <= NEWEST_KNOWN;
    let mut out = Vec::new();
    for &kind in kinds {
        let (Some(expected), Some(min)) = (table.size_of_kind(kind), base.size_of_kind(kind))
        else {
            continue;
        };
        let Some(reported) = size_of(kind) else {
            continue;
        };
        if reported < min || (known && reported != expected) {
            out.push((kind, reported, expected));
        }
    }
    out
}

impl ActivitySource for CuptiSource {
    fn name(&self) -> &str {
        "cupti"
    }

    fn set_log(&mut self, log: LogFn) {
        if self.config.log.is_none() {
            self.log = log;
        }
    }

    fn metadata(&self) -> Vec<(String, String)> {
        metadata::metadata(&self.state, &self.config)
    }

    fn device_properties(&self) -> Vec<DeviceProperties> {
        match &self.state {
            State::Live(l) => l.decoder.device_properties().to_vec(),
            State::Off { .. } => Vec::new(),
        }
    }

    fn enable(&mut self, activities: ActivitySet) -> Result<(), SourceError> {
        match &mut self.state {
            State::Off { reason, reported } => {
                if *reported {
                    // Said once already; stay quietly off.
                    return Ok(());
                }
                *reported = true;
                Err(source_error(&*reason))
            }
            State::Live(l) => l
                .enable(&self.config, &self.log, activities)
                .map_err(source_error),
        }
    }

    fn disable(&mut self) {
        if let State::Live(l) = &mut self.state {
            l.release();
        }
    }

    fn poll(&mut self, emit: &mut dyn FnMut(&Activity)) {
        if let State::Live(l) = &mut self.state {
            l.drain(emit);
        }
    }

    fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) {
        if let State::Live(l) = &mut self.state {
            l.flush(&self.config, &self.log, emit);
        }
    }

    fn degraded(&self) -> bool {
        // Another CUPTI client held the subscriber: the next window tries to take it again.
        matches!(&self.state, State::Live(l) if l.yielded)
    }

    fn dropped(&self) -> u64 {
        match &self.state {
            // Refused buffers are not records: CUPTI counts what it could not write in cupti_dropped.
            State::Live(l) => l.cupti_dropped + l.discarded + l.pool_discarded,
            State::Off { .. } => 0,
        }
    }
}

impl Drop for CuptiSource {
    fn drop(&mut self) {
        if let State::Live(l) = &mut self.state {
            // Never detach CUPTI under another client that holds it.
            let finalize = self.config.finalize_on_drop && !l.yielded;
            let failed = l.teardown(finalize);
            // A source that never recorded has said why once already (its enable failed); the
            // same broken library failing again at exit is not news worth a second line.
            if let (Some(failed), true) = (failed, l.ever_active) {
                (self.log)(&format!(
                    "cupti: CUPTI calls failed while the source shut down (after the last trace): {failed}"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_size_cross_check() {
        let r = Release::V13_5;
        let l = r.layout();
        let wanted = [kinds::CONCURRENT_KERNEL, kinds::DEVICE, kinds::NAME];
        // Agreement, or a library that cannot say: nothing refused.
        assert!(struct_size_mismatches(r, &wanted, |k| l.size_of_kind(k)).is_empty());
        assert!(struct_size_mismatches(r, &wanted, |_| None).is_empty());
        // A known release reporting another size: refused.
        assert_eq!(
            struct_size_mismatches(r, &wanted, |k| l.size_of_kind(k).map(|s| s + 8)),
            vec![
                (kinds::CONCURRENT_KERNEL, 256, 248),
                (kinds::DEVICE, 200, 192)
            ]
        );
        // A release newer than this build may have grown a kind, but not below the base layout.
        let newer = Release {
            major: 13,
            minor: 9,
        };
        assert!(struct_size_mismatches(newer, &wanted, |_| Some(400)).is_empty());
        assert_eq!(
            struct_size_mismatches(newer, &[kinds::CONCURRENT_KERNEL], |_| Some(100)),
            vec![(kinds::CONCURRENT_KERNEL, 100, 248)]
        );
    }
}
