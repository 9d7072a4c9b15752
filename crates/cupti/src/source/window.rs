//! A loaded library and what one profiling window does with it: enable (subscribe, register the
//! buffer callbacks, turn kinds on), drain completed buffers into the decoder, flush at the end,
//! release. Every CUPTI call goes through [`crate::result`]; nothing here is `unsafe`.

use std::fmt;
use std::time::{Duration, Instant};

use kinetrace_core::activity::{Activity, ActivitySet, ActivityType};
use kinetrace_core::session::LogFn;
use kinetrace_cupti_sys::v13 as sys;
use kinetrace_cupti_sys::Cupti;

use super::callbacks;
use super::ignored::Ignored;
use super::{kinds_for, struct_size_mismatches, CuptiConfig, LibraryInfo, POOL};
use crate::decode::{decode_batch, Decoder, ExternalIds};
use crate::kinds;
use crate::names::{DRIVER_BLOCKLIST, RUNTIME_BLOCKLIST};
use crate::pool::Completed;
use crate::result::{self, activity, CuptiError, Subscriber, MULTIPLE_SUBSCRIBERS};
use crate::version::Release;

/// Why a window could not record GPU activity (the session logs it once and carries on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnableError {
    /// Another CUPTI client holds the callback API (`cuptiSubscribe` answered
    /// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`): the window records CPU activity only.
    Yielded(CuptiError),
    /// `cuptiActivityRegisterCallbacks` failed.
    RegisterCallbacks(CuptiError),
    /// The kernel kind (or the first kind asked for) could not be enabled.
    Kind {
        /// The entry point (`cuptiActivityEnable` or `cuptiActivityEnableAndDump`).
        call: &'static str,
        /// The `CUPTI_ACTIVITY_KIND_*` value.
        kind: u32,
        /// What it answered.
        error: CuptiError,
    },
}

impl fmt::Display for EnableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnableError::Yielded(e) => write!(
                f,
                "another CUPTI client holds the subscriber ({e}); GPU activity is not recorded while it does, CPU activity is (checked again at each window)"
            ),
            EnableError::RegisterCallbacks(e) => {
                write!(f, "cuptiActivityRegisterCallbacks failed: {e}")
            }
            EnableError::Kind { call, kind, error } => match kinds::name(*kind) {
                Some(name) => write!(f, "{call}({name}) failed: {error}"),
                None => write!(f, "{call}(kind {kind}) failed: {error}"),
            },
        }
    }
}

impl std::error::Error for EnableError {}

/// A library that loaded, and the state of its windows.
pub(super) struct Live {
    /// Leaked once per source: it is the API callback's user data, which CUPTI may use until it is
    /// finalized (and the library is never unloaded anyway).
    pub(super) cupti: &'static Cupti,
    pub(super) info: LibraryInfo,
    pub(super) decoder: Decoder,
    ids: ExternalIds,
    /// Our subscription while a window holds it.
    subscriber: Option<Subscriber>,
    /// This window's `cuptiSubscribe` failure, other than another client holding it.
    pub(super) subscribe_error: Option<CuptiError>,
    /// This window records CPU only: another CUPTI client held the subscriber when it opened.
    pub(super) yielded: bool,
    /// The first yield was reported (as an `enable` error); later ones are quiet.
    yield_reported: bool,
    /// Our buffer callbacks are registered and kinds enabled for the open window: only then is
    /// the activity API (flush, dropped count) ours to call.
    pub(super) active: bool,
    /// Some window got that far: the source recorded GPU activity at some point.
    pub(super) ever_active: bool,
    enabled: Vec<u32>,
    pub(super) kind_errors: Vec<(u32, CuptiError)>,
    /// Kinds not enabled because `cuptiActivityGetStructSize` disagreed with the layout table:
    /// (kind, size the library reports, size the table expects).
    pub(super) refused: Vec<(u32, usize, usize)>,
    pub(super) flush_error: Option<CuptiError>,
    pub(super) cupti_dropped: u64,
    pub(super) discarded: u64,
    /// The pool's count of records in discarded reserve buffers, as of the last drain.
    pub(super) pool_discarded: u64,
    /// Buffers CUPTI still held when a window's flush stopped waiting, as (slot, generation).
    late: Vec<(usize, u64)>,
    /// How many of those the last window missed.
    pub(super) late_buffers_window: u64,
    /// Records of late buffers that came back, counted and discarded.
    pub(super) late_records: u64,
    /// Markers were asked for without NVTX injection, and that was said.
    markers_reported: bool,
    /// CUPTI calls whose failure does not stop recording, counted.
    pub(super) ignored: Ignored,
    scratch: Vec<Completed>,
    offsets: Vec<usize>,
    pending: Vec<Activity>,
    /// Records decoded while a window opened (see [`Live::learn_devices`]), handed over by the next
    /// drain.
    held: Vec<Activity>,
}

impl Live {
    pub(super) fn new(cupti: &'static Cupti, info: LibraryInfo, decoder: Decoder) -> Live {
        Live {
            cupti,
            info,
            decoder,
            ids: ExternalIds::default(),
            subscriber: None,
            subscribe_error: None,
            yielded: false,
            yield_reported: false,
            active: false,
            ever_active: false,
            enabled: Vec::new(),
            kind_errors: Vec::new(),
            refused: Vec::new(),
            flush_error: None,
            cupti_dropped: 0,
            discarded: 0,
            pool_discarded: 0,
            late: Vec::new(),
            late_buffers_window: 0,
            late_records: 0,
            markers_reported: false,
            ignored: Ignored::default(),
            scratch: Vec::new(),
            offsets: Vec::new(),
            pending: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Counts a failure of an optional entry point (`None`: the library lacks it, not a failure).
    fn note<T>(&mut self, call: &'static str, r: Option<Result<T, CuptiError>>) {
        if let Some(r) = r {
            self.ignored.note(call, r);
        }
    }

    pub(super) fn enable(
        &mut self,
        config: &CuptiConfig,
        log: &LogFn,
        activities: ActivitySet,
    ) -> Result<(), EnableError> {
        // What metadata reports is about the window being opened.
        self.kind_errors.clear();
        self.subscribe_error = None;
        self.yielded = false;
        self.flush_error = None;
        self.late_buffers_window = 0;
        if config.external_ids && self.subscriber.is_none() {
            // First, before any activity-API call: if another client holds CUPTI, we touch nothing.
            match callbacks::subscribe_api_callback(self.cupti) {
                None => {}
                Some(Ok(s)) => self.subscriber = Some(s),
                Some(Err(e)) if e == MULTIPLE_SUBSCRIBERS => {
                    self.yielded = true;
                    if self.yield_reported {
                        // Said once already; this window is CPU only, quietly.
                        return Ok(());
                    }
                    self.yield_reported = true;
                    return Err(EnableError::Yielded(e));
                }
                Some(Err(e)) => self.subscribe_error = Some(e),
            }
        }
        let c = self.cupti;
        POOL.configure(
            config.buffer_size,
            config.max_buffer_bytes,
            self.info.release >= Release::V12_9,
        );
        POOL.prefill(2);
        POOL.set_library(c);
        // Failure only means pthread ids instead of tids.
        let r = activity::set_thread_id_type(c, sys::CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
        self.note("cuptiSetThreadIdType", r);
        if self.info.release
            >= (Release {
                major: 12,
                minor: 3,
            })
        {
            // Per-thread buffers (default on in 13.x) would request buffers on hot application
            // threads; one global stream of buffers suits the pool. The value is a uint8_t.
            let r = activity::set_attribute(
                c,
                sys::CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER,
                &mut [0u8],
            );
            self.note("cuptiActivitySetAttribute(PER_THREAD_ACTIVITY_BUFFER)", r);
        }
        if let Err(e) = callbacks::register_buffer_callbacks(c) {
            self.release();
            return Err(EnableError::RegisterCallbacks(e));
        }
        self.active = true;
        self.ever_active = true;
        // Drops CUPTI counted before this window (another client's) are not this window's.
        self.read_dropped();
        if let Some(s) = &self.subscriber {
            for domain in [
                sys::CUPTI_CB_DOMAIN_RUNTIME_API,
                sys::CUPTI_CB_DOMAIN_DRIVER_API,
            ] {
                if let Some(r) = result::enable_domain(c, true, s, domain) {
                    self.ignored.note("cuptiEnableDomain", r);
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
            log(&format!(
                "cupti: markers were asked for, but NVTX_INJECTION64_PATH is unset, so NVTX ranges are not recorded; to record them, start the process with NVTX_INJECTION64_PATH={}",
                self.info.path.display()
            ));
        }
        let wanted = kinds_for(activities);
        let mut size_errors = Vec::new();
        self.refused = struct_size_mismatches(self.info.release, &wanted, |kind| {
            // Version 0 asks about this library. It cannot say (no check then) when it lacks the
            // entry point (before 13.2) or answers NOT_SUPPORTED; any other failure is counted.
            match activity::get_struct_size(c, kind, 0)? {
                Ok(size) => Some(size),
                Err(e) if e == result::NOT_SUPPORTED => None,
                Err(e) => {
                    size_errors.push(e);
                    None
                }
            }
        });
        for e in size_errors {
            self.ignored.add("cuptiActivityGetStructSize", e, 1);
        }
        if !self.refused.is_empty() {
            let list: Vec<String> = self
                .refused
                .iter()
                .map(|(k, got, want)| format!("kind {k} is {got} B, expected {want} B"))
                .collect();
            log(&format!(
                "cupti: cuptiActivityGetStructSize disagrees with the record layouts of CUPTI {} ({}); not recording those kinds",
                self.info.release,
                list.join(", ")
            ));
        }
        for kind in wanted {
            if self.refused.iter().any(|(k, _, _)| *k == kind) {
                continue;
            }
            // Devices and contexts that exist already (CUDA initialised before the window) only
            // get records through EnableAndDump.
            let dump = kind == kinds::DEVICE || kind == kinds::CONTEXT;
            let (call, r) = match dump.then(|| activity::enable_and_dump(c, kind)).flatten() {
                Some(r) => ("cuptiActivityEnableAndDump", r),
                None => ("cuptiActivityEnable", activity::enable(c, kind)),
            };
            match r {
                Ok(()) => self.enabled.push(kind),
                Err(error) if kind == kinds::CONCURRENT_KERNEL || self.enabled.is_empty() => {
                    self.release();
                    return Err(EnableError::Kind { call, kind, error });
                }
                Err(e) => self.kind_errors.push((kind, e)),
            }
        }
        self.learn_devices();
        Ok(())
    }

    /// The trace's head, written when the window opens, lists the devices: the first time DEVICE
    /// is enabled (devices are remembered across windows), the records `cuptiActivityEnableAndDump`
    /// just wrote for the devices that exist are forced out and decoded now, and whatever else
    /// those buffers held waits for the next drain. Devices CUDA has not created yet (it
    /// initialises later) are not known now: the trace lists them at its end instead.
    fn learn_devices(&mut self) {
        if !self.decoder.device_properties().is_empty() || !self.enabled.contains(&kinds::DEVICE) {
            return;
        }
        let r = activity::flush_all(self.cupti, sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        self.ignored.note("cuptiActivityFlushAll", r);
        let mut held = std::mem::take(&mut self.held);
        self.drain(&mut |a| held.push(*a));
        self.held = held;
    }

    /// Asks CUPTI (12.5+) not to record the API calls Kineto drops as noise. A release that lacks
    /// a cbid rejects it; that is counted like any other ignored failure (the decoder's own
    /// blocklist drops those records anyway).
    fn disable_noise(&mut self) {
        use kinetrace_cupti_sys::cbid::{DRIVER_CBID_NAMES, RUNTIME_CBID_NAMES};
        type EnableApi = fn(&Cupti, u32, bool) -> Option<Result<(), CuptiError>>;
        let c = self.cupti;
        let pairs: [(&'static str, EnableApi, &[&str], &[&str]); 2] = [
            (
                "cuptiActivityEnableRuntimeApi",
                activity::enable_runtime_api,
                &RUNTIME_CBID_NAMES[..],
                RUNTIME_BLOCKLIST,
            ),
            (
                "cuptiActivityEnableDriverApi",
                activity::enable_driver_api,
                &DRIVER_CBID_NAMES[..],
                DRIVER_BLOCKLIST,
            ),
        ];
        for (call, f, table, blocklist) in pairs {
            for (cbid, raw) in table.iter().enumerate() {
                if !raw.is_empty() && blocklist.contains(&kinetrace_core::intern::api_name(raw)) {
                    match f(c, cbid as u32, false) {
                        // The library lacks the entry point: nothing more to ask.
                        None => break,
                        Some(r) => self.ignored.note(call, r),
                    }
                }
            }
        }
    }

    /// Ends the window's use of CUPTI: kinds and callback domains off, the dropped count read,
    /// and the subscriber given back so another client (PyTorch's Kineto) can have it.
    pub(super) fn release(&mut self) {
        let c = self.cupti;
        for kind in std::mem::take(&mut self.enabled) {
            self.ignored
                .note("cuptiActivityDisable", activity::disable(c, kind));
        }
        if self.active {
            // No record is made after this: the count is complete for the window.
            self.read_dropped();
            self.active = false;
        }
        if let Some(s) = self.subscriber.take() {
            for domain in [
                sys::CUPTI_CB_DOMAIN_RUNTIME_API,
                sys::CUPTI_CB_DOMAIN_DRIVER_API,
            ] {
                let r = result::enable_domain(c, false, &s, domain);
                self.note("cuptiEnableDomain", r);
            }
            let r = result::unsubscribe(c, s);
            self.note("cuptiUnsubscribe", r);
        }
    }

    /// Adds what CUPTI dropped since the last read. Read whether or not a buffer completed: when
    /// the pool is exhausted and no buffer completes afterwards, nothing else would read it.
    /// Called from the collector, outside any lock the buffer callbacks take (they take none).
    fn read_dropped(&mut self) {
        match activity::get_num_dropped_records(self.cupti) {
            Ok(dropped) => self.cupti_dropped += dropped as u64,
            Err(e) => self.ignored.add("cuptiActivityGetNumDroppedRecords", e, 1),
        }
    }

    /// Decodes every completed buffer; counts the records of late ones instead.
    pub(super) fn drain(&mut self, emit: &mut dyn FnMut(&Activity)) {
        for a in self.held.drain(..) {
            emit(&a);
        }
        // Reserve buffers are counted as they complete, on CUPTI's thread; the count joins
        // `dropped()` here, on the collector, so a window's drops are what its drains collected.
        self.pool_discarded = POOL.stats().discarded_records;
        let mut taken = std::mem::take(&mut self.scratch);
        POOL.take_ready(&mut taken);
        let mut offsets = std::mem::take(&mut self.offsets);
        let mut slices: Vec<&[u8]> = Vec::new();
        let mut late = 0u64;
        for c in &taken {
            offsets.clear();
            if let Err(e) = c.record_offsets(self.cupti, &mut offsets) {
                // The records before the error are read; the rest of the buffer is lost.
                self.ignored.add("cuptiActivityGetNextRecord", e, 1);
            }
            if self.late.contains(&(c.slot(), c.generation())) {
                // Its window's trace is written already; it is not this window's.
                late += offsets.len() as u64;
            } else if c.discard() {
                self.discarded += offsets.len() as u64;
            } else {
                let buf = c.bytes();
                for (i, &start) in offsets.iter().enumerate() {
                    let end = offsets.get(i + 1).copied().unwrap_or(buf.len());
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
            POOL.release(c);
        }
        self.scratch = taken;
        self.offsets = offsets;
        self.late_records += late;
        // Forget late buffers that came back (or were recycled by the pool as reserve buffers).
        self.late
            .retain(|(slot, generation)| POOL.not_taken(*slot, *generation));
        if self.active {
            self.read_dropped();
        }
    }

    /// The end of a window: everything CUPTI holds is forced out and decoded. See the module
    /// documentation of the source for buffers that do not come back in time.
    pub(super) fn flush(
        &mut self,
        config: &CuptiConfig,
        log: &LogFn,
        emit: &mut dyn FnMut(&Activity),
    ) {
        let wait = config.late_buffer_wait;
        if !self.active {
            // Not ours this window (another client holds CUPTI, or enable failed).
            self.drain(emit);
            return;
        }
        let mut outstanding = POOL.outstanding();
        outstanding.retain(|b| !self.late.contains(b));
        // Called from the collector, never from a CUPTI callback.
        self.flush_error =
            activity::flush_all(self.cupti, sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED).err();
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
                    log(&format!(
                        "cupti: {} activity buffer(s) still with CUPTI {} ms after the end-of-window flush; their records are not in this trace (counted as cupti_late_records when they come back)",
                        outstanding.len(),
                        wait.as_millis()
                    ));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.drain(emit);
    }

    /// What `Drop` does: a window still open is flushed (its records go nowhere), kinds are
    /// disabled, the subscriber given back, and CUPTI finalized if `finalize`. The failures of
    /// these calls are returned, rendered (the last trace is written already; the caller says so in
    /// one line).
    pub(super) fn teardown(&mut self, finalize: bool) -> Option<String> {
        // Count this teardown's failures apart from the windows' (which traces have shown).
        let windows = std::mem::take(&mut self.ignored);
        if finalize && self.active {
            // A window still open (the source was used without a session): take back what CUPTI
            // holds before it detaches.
            let r = activity::flush_all(self.cupti, sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
            self.ignored.note("cuptiActivityFlushAll", r);
            self.drain(&mut |_| {});
        }
        // Kinds off and the subscriber given back (once: `release` takes the handle).
        self.release();
        if finalize {
            // Every kind is disabled and buffers are flushed, so CUPTI detaches with nothing in
            // flight from us.
            self.ignored
                .note("cuptiFinalize", result::finalize(self.cupti));
        }
        std::mem::replace(&mut self.ignored, windows).render(&[])
    }
}
