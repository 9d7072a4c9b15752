//! The CUPTI [`ActivitySource`]: loads the library, registers the buffer callbacks, subscribes to API
//! callbacks for `External id` linking, and decodes completed buffers on the collector thread.

use std::ffi::c_void;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
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
use crate::result::{CuptiError, IntoResult};
use crate::version::{Release, NEWEST_KNOWN};

/// The process-wide buffer pool (CUPTI's buffer callbacks carry no user data).
static POOL: BufferPool = BufferPool::new();

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
    /// Link GPU work to enclosing kinetrace spans (subscribes to the callback API).
    pub external_ids: bool,
    /// When markers are recorded, point `NVTX_INJECTION64_PATH` at the loaded libcupti if unset.
    pub nvtx_injection: bool,
    /// How long a flush waits for buffers CUPTI completes after `cuptiActivityFlushAll` returned.
    pub late_buffer_wait: Duration,
    /// Call `cuptiFinalize` when the source is dropped, so the job runs at full speed afterwards.
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
            nvtx_injection: true,
            late_buffer_wait: Duration::from_millis(100),
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
    subscriber: usize,
    subscribe_error: Option<CuptiError>,
    enabled: Vec<u32>,
    kind_errors: Vec<(u32, CuptiError)>,
    /// Kinds not enabled because `cuptiActivityGetStructSize` disagreed with the layout table:
    /// (kind, size the library reports, size the table expects).
    refused: Vec<(u32, usize, usize)>,
    flush_error: Option<CuptiError>,
    cupti_dropped: u64,
    discarded: u64,
    late_buffers_missed: u64,
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
        Ok(Live {
            decoder: Decoder::new(release.layout(), names, config.keep_noise),
            cupti,
            info,
            ids: ExternalIds::default(),
            subscriber: 0,
            subscribe_error: None,
            enabled: Vec::new(),
            kind_errors: Vec::new(),
            refused: Vec::new(),
            flush_error: None,
            cupti_dropped: 0,
            discarded: 0,
            late_buffers_missed: 0,
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
    fn enable(&mut self, config: &CuptiConfig, activities: ActivitySet) -> Result<(), SourceError> {
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
            let _ = unsafe { f(sys::CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM) };
        }
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
            let _ = unsafe {
                f(
                    sys::CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER,
                    &mut size,
                    &mut value as *mut u8 as *mut c_void,
                )
            };
        }
        // SAFETY: both callbacks are `extern "C"` functions with CUPTI's signatures that never unwind.
        unsafe {
            (c.cuptiActivityRegisterCallbacks)(Some(buffer_requested), Some(buffer_completed))
        }
        .result()
        .map_err(|e| err(format!("cuptiActivityRegisterCallbacks failed: {e}")))?;
        if config.external_ids && self.subscriber == 0 && self.subscribe_error.is_none() {
            self.subscribe();
        }
        let c = &self.cupti;
        if self.subscriber != 0 {
            if let Some(f) = c.cuptiEnableDomain {
                for domain in [
                    sys::CUPTI_CB_DOMAIN_RUNTIME_API,
                    sys::CUPTI_CB_DOMAIN_DRIVER_API,
                ] {
                    // SAFETY: the subscriber handle came from cuptiSubscribe and is still subscribed.
                    let _ = unsafe { f(1, self.subscriber as sys::CUpti_SubscriberHandle, domain) };
                }
            }
        }
        if !config.keep_noise {
            self.disable_noise();
        }
        if activities.contains(ActivityType::Marker)
            && config.nvtx_injection
            && std::env::var_os("NVTX_INJECTION64_PATH").is_none()
        {
            // NVTX reads this once, at its first call; set it before any NVTX use.
            std::env::set_var("NVTX_INJECTION64_PATH", &self.info.path);
        }
        self.kind_errors.clear();
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
            match &config.log {
                Some(h) => (h.0)(&line),
                None => eprintln!("kinetrace: {line}"),
            }
        }
        for kind in wanted {
            if self.refused.iter().any(|(k, _, _)| *k == kind) {
                continue;
            }
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
                    self.disable_kinds();
                    return Err(err(format!(
                        "cuptiActivityEnable(CONCURRENT_KERNEL) failed: {e}"
                    )));
                }
                Err(e) => self.kind_errors.push((kind, e)),
            }
        }
        Ok(())
    }

    fn subscribe(&mut self) {
        let c = &self.cupti;
        let (Some(subscribe), Some(push), Some(pop)) = (
            c.cuptiSubscribe,
            c.cuptiActivityPushExternalCorrelationId,
            c.cuptiActivityPopExternalCorrelationId,
        ) else {
            return;
        };
        // Leaked on purpose: CUPTI may call back with this pointer until it is finalized.
        let fns: &'static ExternalFns = Box::leak(Box::new(ExternalFns { push, pop }));
        let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; `api_callback` has CUPTI's callback signature and
        // catches panics; `fns` lives forever.
        match unsafe {
            subscribe(
                &mut handle,
                Some(api_callback),
                fns as *const ExternalFns as *mut c_void,
            )
        }
        .result()
        {
            Ok(()) if !handle.is_null() => self.subscriber = handle as usize,
            Ok(()) => self.subscribe_error = Some(CuptiError(999)),
            Err(e) => self.subscribe_error = Some(e),
        }
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
                    let _ = unsafe { f(cbid as u32, 0) };
                }
            }
        }
    }

    fn disable_kinds(&mut self) {
        for kind in self.enabled.drain(..) {
            // SAFETY: plain value argument.
            let _ = unsafe { (self.cupti.cuptiActivityDisable)(kind) };
        }
        if self.subscriber != 0 {
            if let Some(f) = self.cupti.cuptiEnableDomain {
                for domain in [
                    sys::CUPTI_CB_DOMAIN_RUNTIME_API,
                    sys::CUPTI_CB_DOMAIN_DRIVER_API,
                ] {
                    // SAFETY: the handle came from cuptiSubscribe.
                    let _ = unsafe { f(0, self.subscriber as sys::CUpti_SubscriberHandle, domain) };
                }
            }
        }
    }

    /// Decodes every completed buffer.
    fn drain(&mut self, emit: &mut dyn FnMut(&Activity)) {
        let mut taken = std::mem::take(&mut self.scratch);
        POOL.take_ready(&mut taken);
        let mut slices: Vec<&[u8]> = Vec::new();
        for c in &taken {
            // SAFETY: the slot is TAKEN: CUPTI completed it and published `valid` bytes with Release
            // (we Acquired), and nobody writes it until we release it below.
            let buf = unsafe { std::slice::from_raw_parts(c.ptr as *const u8, c.valid) };
            let offsets = record_offsets(&self.cupti, c.ptr as *mut u8, c.valid);
            if c.discard {
                self.discarded += offsets.len() as u64;
            } else {
                for (i, &start) in offsets.iter().enumerate() {
                    let end = offsets.get(i + 1).copied().unwrap_or(c.valid);
                    slices.push(&buf[start..end]);
                }
            }
            let mut dropped = 0usize;
            // SAFETY: context/stream are what CUPTI reported for this buffer; `dropped` is a valid
            // out-pointer. Called outside any lock the callbacks take (there are none).
            if unsafe {
                (self.cupti.cuptiActivityGetNumDroppedRecords)(
                    c.context as sys::CUcontext,
                    c.stream,
                    &mut dropped,
                )
            } == 0
            {
                self.cupti_dropped += dropped as u64;
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
    }

    fn flush(&mut self, wait: Duration, emit: &mut dyn FnMut(&Activity)) {
        let outstanding = POOL.outstanding();
        // SAFETY: plain value argument; called from the collector, never from a CUPTI callback.
        self.flush_error =
            unsafe { (self.cupti.cuptiActivityFlushAll)(sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) }
                .result()
                .err();
        let deadline = Instant::now() + wait;
        loop {
            let waiting = outstanding
                .iter()
                .filter(|(s, g)| POOL.still_out(*s, *g))
                .count();
            if waiting == 0 {
                break;
            }
            if Instant::now() >= deadline {
                self.late_buffers_missed += waiting as u64;
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
    let _ = catch_unwind(AssertUnwindSafe(|| {
        POOL.complete(buffer, valid, context as *mut c_void, stream)
    }));
}

/// API enter/exit callback: pushes the enclosing kinetrace span's id as a CUSTOM2 external correlation
/// id around each CUDA call, so the records of that call carry it.
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
        if data.callbackSite == sys::CUPTI_API_ENTER {
            let pushed = match recorder::current_external_id() {
                // SAFETY: plain value arguments.
                Some(id) => (unsafe { (fns.push)(KINETRACE_EXTERNAL_KIND, id) }) == 0,
                None => false,
            };
            if !scratch.is_null() {
                // SAFETY: CUPTI's per-call scratch word, valid from enter to exit of this call.
                unsafe { *scratch = pushed as u64 };
            }
        } else if !scratch.is_null() {
            // SAFETY: as above.
            if unsafe { *scratch } == 1 {
                let mut last = 0u64;
                // SAFETY: `last` is a valid out-pointer.
                let _ = unsafe { (fns.pop)(KINETRACE_EXTERNAL_KIND, &mut last) };
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
                if l.late_buffers_missed > 0 {
                    m.push((
                        "cupti_late_buffers_missed".into(),
                        l.late_buffers_missed.to_string(),
                    ));
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
            l.disable_kinds();
        }
    }

    fn poll(&mut self, emit: &mut dyn FnMut(&Activity)) {
        if let State::Live(l) = &mut self.state {
            l.drain(emit);
        }
    }

    fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) {
        if let State::Live(l) = &mut self.state {
            l.flush(self.config.late_buffer_wait, emit);
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
            l.disable_kinds();
            if !self.config.finalize_on_drop {
                return;
            }
            l.flush(Duration::ZERO, &mut |_| {});
            if l.subscriber != 0 {
                if let Some(f) = l.cupti.cuptiUnsubscribe {
                    // SAFETY: the handle came from cuptiSubscribe and is unsubscribed once.
                    let _ = unsafe { f(l.subscriber as sys::CUpti_SubscriberHandle) };
                }
                l.subscriber = 0;
            }
            // SAFETY: no argument; every kind is disabled and buffers are flushed, so CUPTI detaches
            // with nothing in flight from us.
            let _ = unsafe { (l.cupti.cuptiFinalize)() };
        }
    }
}
