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

use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kinetrace_core::activity::{Activity, ActivitySet, ActivityType, DeviceProperties};
use kinetrace_core::recorder;
use kinetrace_core::source::{ActivitySource, SourceError};
use kinetrace_cupti_sys::v13 as sys;
use kinetrace_cupti_sys::Cupti;

use crate::decode::{decode_batch, CStrNames, Decoder, ExternalIds, KINETRACE_EXTERNAL_KIND};
use crate::kinds;
use crate::loader::{self, Driver, Origin, SearchInputs};
use crate::names::{DRIVER_BLOCKLIST, RUNTIME_BLOCKLIST};
use crate::pool::{BufferPool, Completed, DEFAULT_BUFFER_SIZE, DEFAULT_MAX_BYTES};
use crate::result::{CuptiError, IntoResult, MULTIPLE_SUBSCRIBERS};
use crate::version::{Release, NEWEST_KNOWN};

/// The process-wide buffer pool (CUPTI's buffer callbacks carry no user data).
static POOL: BufferPool = BufferPool::new();

/// Counts subscriptions (starts at 1). An External id pushed in an enter callback of one
/// subscription whose exit callback never came (the window closed, and we unsubscribed, while the
/// call ran) is popped at the thread's next enter callback of a later subscription.
static SUBSCRIPTION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (subscription, External ids this thread pushed in it and has not popped yet). No destructor
    /// and a const initialiser: free to use from CUPTI callbacks on any thread.
    static PUSHED: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

/// Writes one line to standard error, ignoring failure: a closed pipe or a full disk must not
/// panic the job (`eprintln!` would).
fn write_stderr(line: &str) {
    let text = format!("kinetrace: {line}\n");
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Counters of the process-wide activity-buffer pool.
pub fn pool_stats() -> crate::pool::PoolStats {
    POOL.stats()
}

/// Where the source's own one-line messages go (problems that do not stop recording, so they are
/// not a [`SourceError`]).
#[derive(Clone)]
pub struct LogHook(pub Arc<dyn Fn(&str) + Send + Sync>);

impl LogHook {
    /// A hook calling `f` with each line.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> LogHook {
        LogHook(Arc::new(f))
    }
}

impl fmt::Debug for LogHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogHook(..)")
    }
}

/// Settings for [`CuptiSource`].
#[derive(Clone, Debug)]
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
    /// Where one-line warnings go (`None`: standard error, prefixed `kinetrace: `).
    pub log: Option<LogHook>,
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

/// Extern "C" callbacks reach the push/pop functions through the subscriber's user data.
struct ExternalFns {
    push: unsafe extern "C" fn(u32, u64) -> u32,
    pop: unsafe extern "C" fn(u32, *mut u64) -> u32,
}

struct Live {
    cupti: Cupti,
    info: LibraryInfo,
    decoder: Decoder,
    ids: ExternalIds,
    /// The API callback's user data, leaked once (CUPTI may call back with it until finalized);
    /// `None` when the library lacks the External id entry points.
    fns: Option<&'static ExternalFns>,
    /// Our subscriber handle while a window holds it, else 0.
    subscriber: usize,
    /// This window's `cuptiSubscribe` failure, other than another client holding it.
    subscribe_error: Option<CuptiError>,
    /// This window records CPU only: another CUPTI client held the subscriber when it opened.
    yielded: bool,
    /// The first yield was reported (as an `enable` error); later ones are quiet.
    yield_reported: bool,
    /// Our buffer callbacks are registered and kinds enabled for the open window: only then is
    /// the activity API (flush, dropped count) ours to call.
    active: bool,
    enabled: Vec<u32>,
    kind_errors: Vec<(u32, CuptiError)>,
    /// Kinds not enabled because `cuptiActivityGetStructSize` disagreed with the layout table:
    /// (kind, size the library reports, size the table expects).
    refused: Vec<(u32, usize, usize)>,
    flush_error: Option<CuptiError>,
    cupti_dropped: u64,
    discarded: u64,
    /// Buffers CUPTI still held when a window's flush stopped waiting, as (slot, generation).
    late: Vec<(usize, u64)>,
    /// How many of those the last window missed.
    late_buffers_window: u64,
    /// Records of late buffers that came back, counted and discarded.
    late_records: u64,
    /// Markers were asked for without NVTX injection, and that was said.
    markers_reported: bool,
    /// CUPTI calls whose failure does not stop recording: the first failure of each.
    ignored: Vec<(&'static str, CuptiError)>,
    scratch: Vec<Completed>,
    pending: Vec<Activity>,
}

enum State {
    Off { reason: String, reported: bool },
    Live(Box<Live>),
}

/// The CUPTI backend. Construct it with [`CuptiSource::new`]; it never fails: a node without a CUDA
/// driver or libcupti gets a source that reports why once and records nothing.
pub struct CuptiSource {
    config: CuptiConfig,
    state: State,
}

fn err(message: impl Into<String>) -> SourceError {
    SourceError {
        source: "cupti".into(),
        message: message.into(),
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
        CuptiSource { config, state }
    }

    fn open(config: &CuptiConfig) -> Result<Live, String> {
        let found = loader::locate(&SearchInputs::from_process(config.library.clone()))?;
        let driver = loader::check_driver(config.driver.as_deref())?;
        let cupti = found.cupti;
        let mut api_version = 0u32;
        // SAFETY: `api_version` is a valid out-pointer; the driver check above passed, so CUPTI's
        // first call cannot take the process down (CUPTI 13.2 crashes without a driver).
        unsafe { (cupti.cuptiGetVersion)(&mut api_version) }
            .result()
            .map_err(|e| format!("cuptiGetVersion failed in {}: {e}", cupti.path().display()))?;
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
        // SAFETY: CUPTI's name pointers in records are NUL-terminated strings it keeps alive for the
        // life of the process (CStrNames' contract).
        let names = unsafe { CStrNames::new() };
        let fns = match (
            cupti.cuptiActivityPushExternalCorrelationId,
            cupti.cuptiActivityPopExternalCorrelationId,
        ) {
            // Leaked once per source: CUPTI may call back with this pointer until it is finalized.
            (Some(push), Some(pop)) => Some(&*Box::leak(Box::new(ExternalFns { push, pop }))),
            _ => None,
        };
        Ok(Live {
            decoder: Decoder::new(release.layout(), names, config.keep_noise),
            cupti,
            info,
            ids: ExternalIds::default(),
            fns,
            subscriber: 0,
            subscribe_error: None,
            yielded: false,
            yield_reported: false,
            active: false,
            enabled: Vec::new(),
            kind_errors: Vec::new(),
            refused: Vec::new(),
            flush_error: None,
            cupti_dropped: 0,
            discarded: 0,
            late: Vec::new(),
            late_buffers_window: 0,
            late_records: 0,
            markers_reported: false,
            ignored: Vec::new(),
            scratch: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// What was loaded, or why the source is off.
    pub fn library_info(&self) -> Result<&LibraryInfo, &str> {
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

impl Live {
    fn log(config: &CuptiConfig, line: &str) {
        match &config.log {
            Some(h) => (h.0)(line),
            None => write_stderr(line),
        }
    }

    /// Keeps the first failure of a call whose failure does not stop recording (for metadata).
    fn note(&mut self, call: &'static str, rc: u32) {
        if let Err(e) = rc.result() {
            if !self.ignored.iter().any(|(c, _)| *c == call) {
                self.ignored.push((call, e));
            }
        }
    }

    fn enable(&mut self, config: &CuptiConfig, activities: ActivitySet) -> Result<(), SourceError> {
        // What metadata reports is about the window being opened.
        self.kind_errors.clear();
        self.subscribe_error = None;
        self.yielded = false;
        self.flush_error = None;
        self.late_buffers_window = 0;
        if config.external_ids && self.subscriber == 0 {
            // First, before any activity-API call: if another client holds CUPTI, we touch nothing.
            match self.subscribe() {
                Ok(()) => {}
                Err(e) if e == MULTIPLE_SUBSCRIBERS => {
                    self.yielded = true;
                    if self.yield_reported {
                        // Said once already; this window is CPU only, quietly.
                        return Ok(());
                    }
                    self.yield_reported = true;
                    return Err(err(format!(
                        "another CUPTI client holds the subscriber ({e}); GPU activity is not recorded while it does, CPU activity is (checked again at each window)"
                    )));
                }
                Err(e) => self.subscribe_error = Some(e),
            }
        }
        let c = &self.cupti;
        POOL.configure(
            config.buffer_size,
            config.max_buffer_bytes,
            self.info.release >= Release::V12_9,
        );
        POOL.prefill(2);
        POOL.set_record_counter(c.cuptiActivityGetNextRecord);
        if let Some(f) = c.cuptiSetThreadIdType {
            // SAFETY: plain value argument. Failure only means pthread ids instead of tids.
            let rc = unsafe { f(sys::CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM) };
            self.note("cuptiSetThreadIdType", rc);
        }
        let c = &self.cupti;
        if let (Some(f), true) = (
            c.cuptiActivitySetAttribute,
            self.info.release
                >= Release {
                    major: 12,
                    minor: 3,
                },
        ) {
            // Per-thread buffers (default on in 13.x) would request buffers on hot application
            // threads; one global stream of buffers suits the pool.
            let mut value: u8 = 0;
            let mut size = std::mem::size_of::<u8>();
            // SAFETY: `size` and `value` are valid for the call and sized as CUPTI expects (uint8_t).
            let rc = unsafe {
                f(
                    sys::CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER,
                    &mut size,
                    &mut value as *mut u8 as *mut c_void,
                )
            };
            self.note("cuptiActivitySetAttribute(PER_THREAD_ACTIVITY_BUFFER)", rc);
        }
        let c = &self.cupti;
        // SAFETY: both callbacks are `extern "C"` functions with CUPTI's signatures that never unwind.
        if let Err(e) = unsafe {
            (c.cuptiActivityRegisterCallbacks)(Some(buffer_requested), Some(buffer_completed))
        }
        .result()
        {
            self.release();
            return Err(err(format!("cuptiActivityRegisterCallbacks failed: {e}")));
        }
        self.active = true;
        // Drops CUPTI counted before this window (another client's) are not this window's.
        self.read_dropped();
        if self.subscriber != 0 {
            if let Some(f) = self.cupti.cuptiEnableDomain {
                for domain in [
                    sys::CUPTI_CB_DOMAIN_RUNTIME_API,
                    sys::CUPTI_CB_DOMAIN_DRIVER_API,
                ] {
                    // SAFETY: the subscriber handle came from cuptiSubscribe and is still subscribed.
                    let rc =
                        unsafe { f(1, self.subscriber as sys::CUpti_SubscriberHandle, domain) };
                    self.note("cuptiEnableDomain", rc);
                }
            }
        }
        if !config.keep_noise {
            self.disable_noise();
        }
        if activities.contains(ActivityType::Marker)
            && !self.markers_reported
            && std::env::var_os("NVTX_INJECTION64_PATH").is_none()
        {
            // Setting the variable here would race the job's own getenv (threads exist by now), and
            // NVTX reads it once, at its first call: only the user can set it, before the start.
            self.markers_reported = true;
            Self::log(
                config,
                &format!(
                    "cupti: markers were asked for, but NVTX_INJECTION64_PATH is unset, so NVTX ranges are not recorded; to record them, start the process with NVTX_INJECTION64_PATH={}",
                    self.info.path.display()
                ),
            );
        }
        let c = &self.cupti;
        let wanted = kinds_for(activities);
        self.refused = match c.cuptiActivityGetStructSize {
            Some(f) => struct_size_mismatches(self.info.release, &wanted, |kind| {
                let mut size = 0usize;
                // SAFETY: `size` is a valid out-pointer; version 0 asks about this library.
                (unsafe { f(kind, 0, &mut size) } == 0).then_some(size)
            }),
            None => Vec::new(),
        };
        if !self.refused.is_empty() {
            let list: Vec<String> = self
                .refused
                .iter()
                .map(|(k, got, want)| format!("kind {k} is {got} B, expected {want} B"))
                .collect();
            let line = format!(
                "cupti: cuptiActivityGetStructSize disagrees with the record layouts of CUPTI {} ({}); not recording those kinds",
                self.info.release,
                list.join(", ")
            );
            Self::log(config, &line);
        }
        for kind in wanted {
            if self.refused.iter().any(|(k, _, _)| *k == kind) {
                continue;
            }
            let c = &self.cupti;
            let enable = match c.cuptiActivityEnableAndDump {
                // Devices and contexts that exist already (CUDA initialised before the window)
                // only get records through EnableAndDump.
                Some(f) if kind == kinds::DEVICE || kind == kinds::CONTEXT => f,
                _ => c.cuptiActivityEnable,
            };
            // SAFETY: plain value argument.
            match unsafe { enable(kind) }.result() {
                Ok(()) => self.enabled.push(kind),
                Err(e) if kind == kinds::CONCURRENT_KERNEL || self.enabled.is_empty() => {
                    self.release();
                    return Err(err(format!(
                        "cuptiActivityEnable(CONCURRENT_KERNEL) failed: {e}"
                    )));
                }
                Err(e) => self.kind_errors.push((kind, e)),
            }
        }
        Ok(())
    }

    /// Subscribes for the API callbacks that push External ids. `Ok` also when the library cannot
    /// link (no subscribe or push/pop entry points): there is nothing to hold then.
    fn subscribe(&mut self) -> Result<(), CuptiError> {
        let (Some(subscribe), Some(fns)) = (self.cupti.cuptiSubscribe, self.fns) else {
            return Ok(());
        };
        let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; `api_callback` has CUPTI's callback signature and
        // catches panics; `fns` lives forever.
        unsafe {
            subscribe(
                &mut handle,
                Some(api_callback),
                fns as *const ExternalFns as *mut c_void,
            )
        }
        .result()?;
        if handle.is_null() {
            return Err(crate::result::UNKNOWN);
        }
        // Before any callback of this subscription: the domains are enabled after this. Relaxed:
        // the value is only a tag compared for equality; a thread that still reads the old one
        // keeps its stale ids until its next call, and pops them then.
        SUBSCRIPTION.fetch_add(1, Ordering::Relaxed);
        self.subscriber = handle as usize;
        Ok(())
    }

    fn disable_noise(&self) {
        use kinetrace_cupti_sys::cbid::{DRIVER_CBID_NAMES, RUNTIME_CBID_NAMES};
        let pairs = [
            (
                self.cupti.cuptiActivityEnableRuntimeApi,
                &RUNTIME_CBID_NAMES[..],
                RUNTIME_BLOCKLIST,
            ),
            (
                self.cupti.cuptiActivityEnableDriverApi,
                &DRIVER_CBID_NAMES[..],
                DRIVER_BLOCKLIST,
            ),
        ];
        for (f, table, blocklist) in pairs {
            let Some(f) = f else { continue };
            for (cbid, raw) in table.iter().enumerate() {
                if !raw.is_empty() && blocklist.contains(&kinetrace_core::intern::api_name(raw)) {
                    // SAFETY: plain value arguments; unknown cbids are rejected by CUPTI, not UB.
                    // Not noted on failure: a release that lacks a cbid rejects it, which is fine
                    // (the decoder's own blocklist drops those records anyway).
                    let _ = unsafe { f(cbid as u32, 0) };
                }
            }
        }
    }

    /// Ends the window's use of CUPTI: kinds and callback domains off, the dropped count read,
    /// and the subscriber given back so another client (PyTorch's Kineto) can have it.
    fn release(&mut self) {
        for kind in std::mem::take(&mut self.enabled) {
            // SAFETY: plain value argument.
            let rc = unsafe { (self.cupti.cuptiActivityDisable)(kind) };
            self.note("cuptiActivityDisable", rc);
        }
        if self.active {
            // No record is made after this: the count is complete for the window.
            self.read_dropped();
            self.active = false;
        }
        if self.subscriber != 0 {
            let handle = self.subscriber as sys::CUpti_SubscriberHandle;
            if let Some(f) = self.cupti.cuptiEnableDomain {
                for domain in [
                    sys::CUPTI_CB_DOMAIN_RUNTIME_API,
                    sys::CUPTI_CB_DOMAIN_DRIVER_API,
                ] {
                    // SAFETY: the handle came from cuptiSubscribe and is still subscribed.
                    let rc = unsafe { f(0, handle, domain) };
                    self.note("cuptiEnableDomain", rc);
                }
            }
            if let Some(f) = self.cupti.cuptiUnsubscribe {
                // SAFETY: the handle came from cuptiSubscribe and is unsubscribed once (zeroed next).
                let rc = unsafe { f(handle) };
                self.note("cuptiUnsubscribe", rc);
            }
            self.subscriber = 0;
        }
    }

    /// Adds what CUPTI dropped since the last read. Null context and stream 0 name the global
    /// queue: every buffer has been global since CUDA 6.0 (the context and stream the completion
    /// callback passes are deprecated and always null and 0), and the per-thread buffers of 13.x
    /// are turned off in `enable`. Read whether or not a buffer completed: when the pool is
    /// exhausted and no buffer completes afterwards, nothing else would read it.
    fn read_dropped(&mut self) {
        let mut dropped = 0usize;
        // SAFETY: a null context is allowed (the global queue); `dropped` is a valid out-pointer.
        // Called from the collector, outside any lock the buffer callbacks take (they take none).
        let rc = unsafe {
            (self.cupti.cuptiActivityGetNumDroppedRecords)(std::ptr::null_mut(), 0, &mut dropped)
        };
        match rc.result() {
            Ok(()) => self.cupti_dropped += dropped as u64,
            Err(_) => self.note("cuptiActivityGetNumDroppedRecords", rc),
        }
    }

    /// Decodes every completed buffer; counts the records of late ones instead.
    fn drain(&mut self, emit: &mut dyn FnMut(&Activity)) {
        let mut taken = std::mem::take(&mut self.scratch);
        POOL.take_ready(&mut taken);
        let mut slices: Vec<&[u8]> = Vec::new();
        let mut late = 0u64;
        for c in &taken {
            // SAFETY: the slot is TAKEN: CUPTI completed it and published `valid` bytes with Release
            // (we Acquired), and nobody writes it until we release it below.
            let buf = unsafe { std::slice::from_raw_parts(c.ptr as *const u8, c.valid) };
            let offsets = record_offsets(&self.cupti, c.ptr as *mut u8, c.valid);
            if self.late.contains(&(c.slot, c.generation)) {
                // Its window's trace is written already; it is not this window's.
                late += offsets.len() as u64;
            } else if c.discard {
                self.discarded += offsets.len() as u64;
            } else {
                for (i, &start) in offsets.iter().enumerate() {
                    let end = offsets.get(i + 1).copied().unwrap_or(c.valid);
                    slices.push(&buf[start..end]);
                }
            }
        }
        decode_batch(
            &mut self.decoder,
            &mut self.ids,
            slices,
            &mut self.pending,
            emit,
        );
        for c in taken.drain(..) {
            POOL.release(c.slot);
        }
        self.scratch = taken;
        self.late_records += late;
        // Forget late buffers that came back (or were recycled by the pool as reserve buffers).
        self.late
            .retain(|(slot, generation)| POOL.not_taken(*slot, *generation));
        if self.active {
            self.read_dropped();
        }
    }

    /// The end of a window: everything CUPTI holds is forced out and decoded. See the module
    /// documentation for buffers that do not come back in time.
    fn flush(&mut self, config: &CuptiConfig, emit: &mut dyn FnMut(&Activity)) {
        let wait = config.late_buffer_wait;
        if !self.active {
            // Not ours this window (another client holds CUPTI, or enable failed).
            self.drain(emit);
            return;
        }
        let mut outstanding = POOL.outstanding();
        outstanding.retain(|b| !self.late.contains(b));
        // SAFETY: plain value argument; called from the collector, never from a CUPTI callback.
        self.flush_error =
            unsafe { (self.cupti.cuptiActivityFlushAll)(sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) }
                .result()
                .err();
        // A failed flush returns nothing: waiting would only delay the job. (The buffer CUPTI was
        // filling stays with it, and `cupti_flush` in the metadata says the window is incomplete.)
        let deadline = Instant::now()
            + if self.flush_error.is_some() {
                Duration::ZERO
            } else {
                wait
            };
        loop {
            outstanding.retain(|(s, g)| POOL.still_out(*s, *g));
            if outstanding.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                if self.flush_error.is_none() {
                    self.late_buffers_window = outstanding.len() as u64;
                    self.late.extend_from_slice(&outstanding);
                    Self::log(
                        config,
                        &format!(
                            "cupti: {} activity buffer(s) still with CUPTI {} ms after the end-of-window flush; their records are not in this trace (counted as cupti_late_records when they come back)",
                            outstanding.len(),
                            wait.as_millis()
                        ),
                    );
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.drain(emit);
    }
}

/// Offsets of every record in a completed buffer, found with the library's own iterator (never by
/// `sizeof`), so records of kinds and sizes this build does not know are stepped over correctly.
fn record_offsets(cupti: &Cupti, buf: *mut u8, valid: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
    loop {
        // SAFETY: `buf`/`valid` describe a buffer CUPTI completed; `rec` is null or the previous
        // record CUPTI returned from this buffer.
        if unsafe { (cupti.cuptiActivityGetNextRecord)(buf, valid, &mut rec) } != 0 || rec.is_null()
        {
            break;
        }
        let off = (rec as usize).wrapping_sub(buf as usize);
        if off >= valid || out.last().is_some_and(|last| off <= *last) {
            break;
        }
        out.push(off);
    }
    out
}

/// CUPTI's buffer request callback: a pooled buffer, never a panic.
extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let r = catch_unwind(|| POOL.request());
    let (ptr, len) = r.unwrap_or((std::ptr::null_mut(), 0));
    if buffer.is_null() || size.is_null() {
        return;
    }
    // SAFETY: CUPTI passes valid out-pointers (checked non-null above).
    unsafe {
        *buffer = ptr;
        *size = len;
        if !max_records.is_null() {
            *max_records = 0;
        }
    }
}

/// CUPTI's buffer completion callback: hands the buffer to the decoder; no decoding, allocation or
/// locking here.
extern "C" fn buffer_completed(
    context: sys::CUcontext,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    // Context and stream are deprecated (always null and 0): every buffer is global.
    let _ = (context, stream);
    let _ = catch_unwind(AssertUnwindSafe(|| POOL.complete(buffer, valid)));
}

/// API enter/exit callback: pushes the enclosing kinetrace span's id as a CUSTOM2 external correlation
/// id around each CUDA call, so the records of that call carry it. Allocation-free and lock-free.
///
/// A call that is running when the window closes gets no exit callback from us (we unsubscribed),
/// so its id stays on CUPTI's per-thread stack. Each push is tagged with the subscription it was made
/// in (in the thread's `PUSHED` and in the call's scratch word); the thread's first enter callback in
/// a later subscription pops what is left, so old ids never label a later window's calls.
extern "C" fn api_callback(userdata: *mut c_void, _domain: u32, _cbid: u32, cbdata: *const c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if userdata.is_null() || cbdata.is_null() {
            return;
        }
        // SAFETY: `userdata` is the leaked `ExternalFns` passed to cuptiSubscribe; `cbdata` is the
        // CUpti_CallbackData CUPTI passes for runtime/driver API domains (the only ones enabled).
        let (fns, data) = unsafe {
            (
                &*(userdata as *const ExternalFns),
                &*(cbdata as *const sys::CUpti_CallbackData),
            )
        };
        let scratch = data.correlationData;
        let pop = || {
            let mut last = 0u64;
            // SAFETY: `last` is a valid out-pointer.
            let _ = unsafe { (fns.pop)(KINETRACE_EXTERNAL_KIND, &mut last) };
        };
        let Ok((tag, depth)) = PUSHED.try_with(Cell::get) else {
            return;
        };
        if data.callbackSite == sys::CUPTI_API_ENTER {
            // Relaxed: a tag compared for equality (see `subscribe`).
            let now = SUBSCRIPTION.load(Ordering::Relaxed);
            let mut depth = depth;
            if tag != now {
                // Pushed in an earlier subscription and never popped: not ours to keep.
                for _ in 0..depth {
                    pop();
                }
                depth = 0;
            }
            let pushed = match recorder::current_external_id() {
                // SAFETY: plain value arguments.
                Some(id) => (unsafe { (fns.push)(KINETRACE_EXTERNAL_KIND, id) }) == 0,
                None => false,
            };
            let _ = PUSHED.try_with(|p| p.set((now, depth + pushed as u32)));
            if !scratch.is_null() {
                // SAFETY: CUPTI's per-call scratch word, valid from enter to exit of this call.
                unsafe { *scratch = if pushed { now } else { 0 } };
            }
        } else if !scratch.is_null() {
            // SAFETY: as above.
            let pushed_in = unsafe { *scratch };
            // Only a push of the thread's current subscription is still on the stack.
            if pushed_in != 0 && pushed_in == tag && depth > 0 {
                pop();
                let _ = PUSHED.try_with(|p| p.set((tag, depth - 1)));
            }
        }
    }));
}

impl ActivitySource for CuptiSource {
    fn name(&self) -> &str {
        "cupti"
    }

    fn metadata(&self) -> Vec<(String, String)> {
        let mut m = Vec::new();
        match &self.state {
            State::Off { reason, .. } => m.push(("cupti_status".into(), format!("off: {reason}"))),
            State::Live(l) => {
                let i = &l.info;
                m.push(("cupti_version".into(), i.api_version.to_string()));
                m.push(("cupti_release".into(), i.release.to_string()));
                m.push(("cupti_library".into(), i.path.display().to_string()));
                m.push(("cupti_soname".into(), i.soname.clone()));
                if let Some(v) = i.driver.version {
                    m.push(("cuda_driver_version".into(), v.to_string()));
                }
                m.push(("cupti_dropped_records".into(), l.cupti_dropped.to_string()));
                let pool = POOL.stats();
                m.push((
                    "kinetrace_cupti_discarded_records".into(),
                    (l.discarded + pool.discarded_records).to_string(),
                ));
                m.push((
                    "kinetrace_cupti_refused_buffers".into(),
                    pool.refused.to_string(),
                ));
                let s = l.decoder.stats();
                if s.kernels_without_timestamps > 0 {
                    m.push((
                        "cupti_kernels_without_timestamps".into(),
                        s.kernels_without_timestamps.to_string(),
                    ));
                }
                if s.too_short + s.size_mismatch > 0 {
                    m.push((
                        "cupti_layout_warnings".into(),
                        format!(
                            "{} short, {} unexpected sizes",
                            s.too_short, s.size_mismatch
                        ),
                    ));
                }
                if l.yielded {
                    m.push((
                        "cupti_subscriber".into(),
                        "held by another CUPTI client (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED): GPU activity is not recorded in this window".into(),
                    ));
                }
                if let Some(e) = l.subscribe_error {
                    m.push((
                        "cupti_subscribe".into(),
                        format!("failed: {e}; External id links are missing"),
                    ));
                }
                if !l.kind_errors.is_empty() {
                    let v: Vec<String> = l
                        .kind_errors
                        .iter()
                        .map(|(k, e)| format!("kind {k}: {e}"))
                        .collect();
                    m.push(("cupti_kinds_failed".into(), v.join("; ")));
                }
                if !l.refused.is_empty() {
                    let v: Vec<String> = l
                        .refused
                        .iter()
                        .map(|(k, got, want)| format!("kind {k}: {got} B, expected {want} B"))
                        .collect();
                    m.push(("cupti_kinds_refused".into(), v.join("; ")));
                }
                let p = l.decoder.pool_stats();
                if p.records > 0 {
                    m.push((
                        "cupti_memory_pools".into(),
                        format!(
                            "{} records: {} created, {} trimmed, {} destroyed; {} live pools, {} bytes (peak {})",
                            p.records, p.created, p.trimmed, p.destroyed, p.live, p.live_bytes, p.peak_bytes
                        ),
                    ));
                }
                if let Some(e) = l.flush_error {
                    m.push(("cupti_flush".into(), format!("failed: {e}")));
                }
                if l.late_buffers_window > 0 {
                    m.push((
                        "cupti_late_buffers".into(),
                        format!(
                            "{} buffers not returned by CUPTI within {} ms of the end-of-window flush; their records are not in this trace",
                            l.late_buffers_window,
                            self.config.late_buffer_wait.as_millis()
                        ),
                    ));
                }
                if l.late_records > 0 {
                    m.push((
                        "cupti_late_records".into(),
                        format!(
                            "{} records (since the source started) came back in buffers after their window's trace was written; counted, not written",
                            l.late_records
                        ),
                    ));
                }
                if !l.ignored.is_empty() {
                    let v: Vec<String> = l
                        .ignored
                        .iter()
                        .map(|(call, e)| format!("{call}: {e}"))
                        .collect();
                    m.push(("cupti_ignored_errors".into(), v.join("; ")));
                }
            }
        }
        m
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
                Err(err(reason.clone()))
            }
            State::Live(l) => l.enable(&self.config, activities),
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
            l.flush(&self.config, emit);
        }
    }

    fn dropped(&self) -> u64 {
        match &self.state {
            // Refused buffers are not records: CUPTI counts what it could not write in cupti_dropped.
            State::Live(l) => l.cupti_dropped + l.discarded + POOL.stats().discarded_records,
            State::Off { .. } => 0,
        }
    }
}

impl Drop for CuptiSource {
    fn drop(&mut self) {
        if let State::Live(l) = &mut self.state {
            // Never detach CUPTI under another client that holds it.
            let finalize = self.config.finalize_on_drop && !l.yielded;
            if finalize && l.active {
                // A window still open (the source was used without a session): take back what
                // CUPTI holds before it detaches. Its records go nowhere.
                // SAFETY: plain value argument; not called from a CUPTI callback.
                let _ = unsafe {
                    (l.cupti.cuptiActivityFlushAll)(sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)
                };
                l.drain(&mut |_| {});
            }
            // Kinds off and the subscriber given back (once: `release` zeroes the handle).
            l.release();
            if finalize {
                // SAFETY: no argument; every kind is disabled and buffers are flushed, so CUPTI
                // detaches with nothing in flight from us.
                let _ = unsafe { (l.cupti.cuptiFinalize)() };
            }
        }
    }
}
