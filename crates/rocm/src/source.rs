//! The ROCm [`ActivitySource`]: finds rocprofiler-sdk, picks the ABI by its version, resolves the
//! kinds and operations it needs by name, registers kinetrace as an SDK tool, and starts the main
//! context only while a window is open.
//!
//! Registration: `rocprofiler_force_configure` runs the tool's `configure` and `initialize` on the
//! spot; in `initialize` kinetrace creates a utility context (kernel-symbol callbacks, always
//! started), and a main context with one LOSSLESS buffer for KERNEL_DISPATCH and MEMORY_COPY
//! records and HIP runtime API callback tracing, left stopped. A process can register a tool only
//! before the ROCm runtimes initialise: when the SDK was initialised without us, the source says
//! "registered too late" once and records nothing.
//!
//! Messages: one line per problem, to the session's log ([`ActivitySource::set_log`]), standard
//! error before there is a session, or [`RocmConfig::log`].

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use kinetrace_core::activity::{Activity, ActivitySet, ActivityType, DeviceProperties};
use kinetrace_core::session::LogFn;
use kinetrace_core::source::{ActivitySource, SourceError};
use kinetrace_core::UnixNanos;
use kinetrace_rocprofiler_sdk_sys::Abi;

use crate::decode::Decoder;
use crate::ffi::{self, Agent, Kinds, Registration, SdkError, Tool};
use crate::install::install_tool;
use crate::loader::{NotFound, Origin};
use crate::roctracer::{TracerError, TracerInfo, TracerLive};

/// Settings for [`RocmSource`].
#[derive(Clone)]
pub struct RocmConfig {
    /// Use this librocprofiler-sdk (else `KINETRACE_ROCPROFILER_SDK_PATH`, else the search in
    /// [`crate::loader`]).
    pub library: Option<PathBuf>,
    /// Bytes of the SDK buffer (Kineto: 256 KiB).
    pub buffer_bytes: usize,
    /// Fill level at which the SDK hands the buffer over (Kineto: 128 KiB).
    pub watermark: usize,
    /// Records the queue from the SDK's callbacks to the collector holds; past it records are
    /// dropped and counted (the callbacks never wait).
    pub queue_records: usize,
    /// Keep the HIP calls Kineto leaves out (`hipGetDevice`...).
    pub keep_noise: bool,
    /// Where this source's one-line messages go instead of the session's log.
    pub log: Option<LogFn>,
    /// Use this libroctracer64 for the fallback (else `KINETRACE_ROCTRACER_PATH`, else the same
    /// search as for the SDK, for `libroctracer64.so.4`).
    pub roctracer_library: Option<PathBuf>,
}

impl Default for RocmConfig {
    fn default() -> Self {
        RocmConfig {
            library: None,
            buffer_bytes: 256 << 10,
            watermark: 128 << 10,
            queue_records: 1 << 16,
            keep_noise: false,
            log: None,
            roctracer_library: None,
        }
    }
}

impl fmt::Debug for RocmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RocmConfig")
            .field("library", &self.library)
            .field("buffer_bytes", &self.buffer_bytes)
            .field("watermark", &self.watermark)
            .field("queue_records", &self.queue_records)
            .field("keep_noise", &self.keep_noise)
            .field("roctracer_library", &self.roctracer_library)
            .finish_non_exhaustive()
    }
}

/// Why the ROCm backend could not start: its `Display` is the one line the job's log shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RocmOpenError {
    /// No usable library.
    NotFound(NotFound),
    /// A version whose layouts kinetrace does not know.
    UnsupportedVersion {
        /// The library.
        path: PathBuf,
        /// `rocprofiler_get_version`.
        version: (u32, u32, u32),
    },
    /// An SDK call needed to start failed.
    Call {
        /// The library.
        path: PathBuf,
        /// What failed.
        error: SdkError,
    },
    /// The library does not list a kind or operation kinetrace needs.
    MissingKind {
        /// The library.
        path: PathBuf,
        /// Which (`buffer-tracing kind KERNEL_DISPATCH`...).
        what: String,
    },
    /// The SDK was initialised before kinetrace could register as a tool.
    RegisteredTooLate {
        /// The library.
        path: PathBuf,
    },
    /// The library cannot register a tool from code.
    NoForceConfigure {
        /// The library.
        path: PathBuf,
    },
    /// The tool's `initialize` failed (contexts, buffer or services).
    Initialize {
        /// The library.
        path: PathBuf,
        /// What failed.
        error: SdkError,
    },
    /// rocprofiler-sdk could not be used, and neither could the roctracer found.
    NoFallback {
        /// Why not the SDK.
        sdk: Box<RocmOpenError>,
        /// Why not roctracer.
        roctracer: TracerError,
    },
    /// Another library was registered as this process's tool before.
    OtherLibrary {
        /// The library registered first.
        registered: PathBuf,
        /// The one asked for now.
        path: PathBuf,
    },
}

impl fmt::Display for RocmOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RocmOpenError::NotFound(e) => write!(f, "{e}"),
            RocmOpenError::UnsupportedVersion { path, version: (a, b, c) } => write!(
                f,
                "{} is rocprofiler-sdk {a}.{b}.{c}; kinetrace reads 0.4 – 1.x (ROCm 6.2 and later)",
                path.display()
            ),
            RocmOpenError::Call { path, error } => write!(f, "{} ({})", error, path.display()),
            RocmOpenError::MissingKind { path, what } => write!(
                f,
                "{} does not list the {what} kinetrace records; it is not a rocprofiler-sdk kinetrace supports",
                path.display()
            ),
            RocmOpenError::RegisteredTooLate { path } => write!(
                f,
                "registered too late: {} was initialised before kinetrace could register as a tool (a ROCm runtime started first); set ROCP_TOOL_LIBRARIES to the kinetrace library, or start kinetrace before the first HIP call",
                path.display()
            ),
            RocmOpenError::NoForceConfigure { path } => write!(
                f,
                "{} lacks rocprofiler_force_configure, so kinetrace cannot register from code; set ROCP_TOOL_LIBRARIES to the kinetrace library",
                path.display()
            ),
            RocmOpenError::Initialize { path, error } => write!(
                f,
                "setting up tracing in {} failed: {error}",
                path.display()
            ),
            RocmOpenError::NoFallback { sdk, roctracer } => write!(f, "{sdk}; {roctracer}"),
            RocmOpenError::OtherLibrary { registered, path } => write!(
                f,
                "kinetrace is already registered with {}; cannot also use {}",
                registered.display(),
                path.display()
            ),
        }
    }
}

/// Counters of the process-wide path from the SDK's callbacks to the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Records the callbacks queued.
    pub accepted: u64,
    /// Records the collector took from the queue.
    pub taken: u64,
    /// Records the callbacks could not queue (full): dropped and counted.
    pub refused: u64,
    /// Records the SDK reported dropped (`drop_count` of the buffer callback).
    pub sdk_dropped: u64,
    /// Buffer records of a kind or size kinetrace does not read.
    pub skipped: u64,
    /// Slots of the queue (`RocmConfig::queue_records` of the source that set it up, rounded up
    /// to a power of two; fixed for the process).
    pub capacity: usize,
}

/// The counters, once a source has registered kinetrace with an SDK, else once one has set up
/// the roctracer fallback (`None` before).
pub fn queue_stats() -> Option<QueueStats> {
    use std::sync::atomic::Ordering::Relaxed;
    if let Some(t) = ffi::tool() {
        return Some(QueueStats {
            accepted: t.queue.accepted(),
            taken: t.queue.taken(),
            refused: t.queue.refused(),
            sdk_dropped: t.sdk_dropped.load(Relaxed),
            skipped: t.skipped.load(Relaxed),
            capacity: t.queue.capacity(),
        });
    }
    ffi::roctracer::tracer().map(|t| QueueStats {
        accepted: t.queue.accepted(),
        taken: t.queue.taken(),
        refused: t.queue.refused(),
        sdk_dropped: 0,
        skipped: t.skipped.load(Relaxed),
        capacity: t.queue.capacity(),
    })
}

/// What was loaded, for metadata and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryInfo {
    /// The library path (or SONAME) opened.
    pub path: PathBuf,
    /// Where the search found it.
    pub origin: Origin,
    /// `rocprofiler_get_version`.
    pub version: (u32, u32, u32),
    /// The ABI that implies.
    pub abi: Abi,
    /// The kind and operation numbers of this library, resolved by name.
    pub kinds: Kinds,
    /// Optional entry points the library lacks.
    pub missing_optional: Vec<&'static str>,
}

struct Live {
    tool: &'static Tool,
    info: LibraryInfo,
    decoder: Decoder,
    devices: Vec<DeviceProperties>,
    main: kinetrace_rocprofiler_sdk_sys::ContextId,
    buffer: kinetrace_rocprofiler_sdk_sys::BufferId,
    active: bool,
    /// Why memory-allocation tracing is off, when configuring it failed.
    allocations_off: Option<SdkError>,
    /// Records the queue refused or the SDK dropped, at creation (the tool is process-wide).
    dropped_before: u64,
    /// A window wanted the source after the SDK finalized, and was told.
    finalized_reported: bool,
}

enum State {
    Off {
        reason: RocmOpenError,
        reported: bool,
    },
    Live(Box<Live>),
    /// The roctracer fallback, and why the SDK was not used.
    Tracer {
        live: Box<TracerLive>,
        why: RocmOpenError,
        announced: bool,
    },
}

/// Which library a [`RocmSource`] records with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// rocprofiler-sdk (ROCm 6.2 and later).
    RocprofilerSdk,
    /// roctracer 4.1, the fallback.
    Roctracer,
    /// Neither: the source records nothing.
    Off,
}

/// SDK failures roctracer can stand in for: no SDK, or one initialised without kinetrace
/// (roctracer attaches after HIP started).
fn roctracer_helps(e: &RocmOpenError) -> bool {
    matches!(
        e,
        RocmOpenError::NotFound(_)
            | RocmOpenError::RegisteredTooLate { .. }
            | RocmOpenError::NoForceConfigure { .. }
    )
}

/// The ROCm backend. [`RocmSource::new`] never fails: a node without rocprofiler-sdk gets a source
/// that says why once and records nothing.
pub struct RocmSource {
    config: RocmConfig,
    state: State,
    log: LogFn,
}

fn stderr_log() -> LogFn {
    Arc::new(|line: &str| {
        use std::io::Write;
        let text = format!("kinetrace: {line}\n");
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    })
}

fn source_error(e: impl fmt::Display) -> SourceError {
    SourceError {
        source: "rocm".into(),
        message: e.to_string(),
    }
}

/// The offset from the SDK's clock to Unix time: the narrowest of five brackets
/// `(UnixNanos::now(), rocprofiler_get_timestamp, UnixNanos::now())`.
fn clock_offset(tool: &Tool) -> Result<i64, SdkError> {
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..5 {
        let before = UnixNanos::now().0;
        let sdk = ffi::timestamp(tool.sdk)?;
        let after = UnixNanos::now().0;
        let width = after.saturating_sub(before);
        let mid = before + width / 2;
        let offset = mid as i64 - sdk as i64;
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, offset));
        }
    }
    Ok(best.map_or(0, |(_, o)| o))
}

impl RocmSource {
    /// Finds the library, checks its version, registers kinetrace as a tool and sets up tracing.
    pub fn new(config: RocmConfig) -> RocmSource {
        let state = match Self::open(&config) {
            Ok(live) => State::Live(Box::new(live)),
            Err(reason) if roctracer_helps(&reason) => match crate::roctracer::open(&config) {
                Ok(live) => State::Tracer {
                    live: Box::new(live),
                    why: reason,
                    announced: false,
                },
                // No roctracer either: the SDK's reason is the line.
                Err(TracerError::NotFound) => State::Off {
                    reason,
                    reported: false,
                },
                Err(roctracer) => State::Off {
                    reason: RocmOpenError::NoFallback {
                        sdk: Box::new(reason),
                        roctracer,
                    },
                    reported: false,
                },
            },
            Err(reason) => State::Off {
                reason,
                reported: false,
            },
        };
        let log = config.log.clone().unwrap_or_else(stderr_log);
        RocmSource { config, state, log }
    }

    fn open(config: &RocmConfig) -> Result<Live, RocmOpenError> {
        let tool = install_tool(config)?;
        let path = tool.path.clone();
        let call = |error| RocmOpenError::Call {
            path: path.clone(),
            error,
        };
        let (abi, version) = (tool.abi, tool.names.version);
        let info = LibraryInfo {
            path: path.clone(),
            origin: tool.names.origin,
            version,
            abi,
            kinds: tool.kinds.clone(),
            missing_optional: tool.sdk.missing_optional(),
        };
        match ffi::register(tool) {
            Registration::Done => {}
            Registration::TooLate => return Err(RocmOpenError::RegisteredTooLate { path }),
            Registration::NoForceConfigure => return Err(RocmOpenError::NoForceConfigure { path }),
            Registration::Failed(error) => return Err(RocmOpenError::Call { path, error }),
        }
        let (main, buffer, allocations_off) = {
            let setup = tool.setup.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(error) = &setup.error {
                return Err(RocmOpenError::Initialize {
                    path,
                    error: error.clone(),
                });
            }
            match (setup.main, setup.buffer) {
                (Some(m), Some(b)) => (m, b, setup.allocations_off.clone()),
                _ => {
                    return Err(RocmOpenError::Initialize {
                        path,
                        error: SdkError {
                            call: "initialize",
                            status: -1,
                            text: Some("the SDK never called the tool's initialize".into()),
                        },
                    })
                }
            }
        };
        let agents = ffi::query_agents(tool.sdk, abi, version.1)
            .map_err(call)?
            .unwrap_or_default();
        let gpus: HashMap<u64, u32> = agents
            .iter()
            .filter(|a| a.gpu)
            .map(|a| (a.handle, a.logical_type_index.max(0) as u32))
            .collect();
        let devices = agents
            .iter()
            .filter(|a| a.gpu)
            .map(device_properties)
            .collect();
        let offset = clock_offset(tool).map_err(call)?;
        let n = &tool.names;
        let decoder = Decoder::new(&n.hip_ops, &n.copy_ops, gpus, offset, config.keep_noise)
            .with_allocations(&n.allocation_ops);
        Ok(Live {
            tool,
            info,
            decoder,
            devices,
            main,
            buffer,
            active: false,
            allocations_off,
            dropped_before: tool.queue.refused()
                + tool.sdk_dropped.load(std::sync::atomic::Ordering::Relaxed),
            finalized_reported: false,
        })
    }

    /// The rocprofiler-sdk loaded, or why none is used (the source may then record through
    /// roctracer: [`RocmSource::backend`]).
    pub fn library_info(&self) -> Result<&LibraryInfo, &RocmOpenError> {
        match &self.state {
            State::Live(l) => Ok(&l.info),
            State::Off { reason, .. } => Err(reason),
            State::Tracer { why, .. } => Err(why),
        }
    }

    /// The roctracer the source falls back to, if it does.
    pub fn roctracer_info(&self) -> Option<&TracerInfo> {
        match &self.state {
            State::Tracer { live, .. } => Some(&live.info),
            _ => None,
        }
    }

    /// Which library the source records with.
    pub fn backend(&self) -> Backend {
        match self.state {
            State::Live(_) => Backend::RocprofilerSdk,
            State::Tracer { .. } => Backend::Roctracer,
            State::Off { .. } => Backend::Off,
        }
    }

    /// Whether the source can record.
    pub fn is_live(&self) -> bool {
        !matches!(self.state, State::Off { .. })
    }

    /// Whether recording is on (a window is open).
    pub fn is_active(&self) -> bool {
        match &self.state {
            State::Live(l) => l.active,
            State::Tracer { live, .. } => live.active,
            State::Off { .. } => false,
        }
    }
}

fn device_properties(a: &Agent) -> DeviceProperties {
    let v = a.gfx_target_version;
    DeviceProperties {
        id: a.logical_type_index.max(0) as u32,
        name: if a.product_name.is_empty() {
            a.name.clone()
        } else {
            a.product_name.clone()
        },
        total_global_mem: a.local_mem_size,
        compute_major: (v / 10_000) % 100,
        compute_minor: (v / 100) % 100,
        max_threads_per_block: a.workgroup_max,
        // Kineto's ROCm path: 32 waves of the wavefront per CU.
        max_threads_per_multiprocessor: a.wave_front_size * 32,
        regs_per_block: 65_536,
        warp_size: a.wave_front_size,
        shared_mem_per_block: 65_536,
        num_sms: a.cu_count,
        regs_per_multiprocessor: None,
        shared_mem_per_block_optin: None,
        shared_mem_per_multiprocessor: None,
    }
}

impl Live {
    fn dropped(&self) -> u64 {
        (self.tool.queue.refused()
            + self
                .tool
                .sdk_dropped
                .load(std::sync::atomic::Ordering::Relaxed))
        .saturating_sub(self.dropped_before)
    }

    fn drain(&mut self, emit: &mut dyn FnMut(&Activity)) {
        let tool = self.tool;
        let names = &tool.kernel_names;
        crate::decode::drain(
            &tool.queue,
            &mut self.decoder,
            |id| {
                names
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&id)
                    .cloned()
            },
            &tool.external,
            emit,
        );
    }
}

impl ActivitySource for RocmSource {
    fn name(&self) -> &str {
        "rocm"
    }

    fn set_log(&mut self, log: LogFn) {
        if self.config.log.is_none() {
            self.log = log;
        }
    }

    fn metadata(&self) -> Vec<(String, String)> {
        let mut m = self.backend_metadata();
        if m.is_empty() {
            return m;
        }
        if let Some(q) = queue_stats() {
            m.push(("rocm_queue_records".into(), q.capacity.to_string()));
        }
        if let Some(v) = visible_devices() {
            m.push(("rocm_visible_devices".into(), v));
        }
        m
    }

    fn device_properties(&self) -> Vec<DeviceProperties> {
        match &self.state {
            State::Live(l) => l.devices.clone(),
            State::Tracer { .. } | State::Off { .. } => Vec::new(),
        }
    }

    fn enable(&mut self, activities: ActivitySet) -> Result<(), SourceError> {
        match &mut self.state {
            State::Off { reason, reported } => {
                if *reported {
                    return Ok(());
                }
                *reported = true;
                Err(source_error(&*reason))
            }
            State::Live(l) => {
                let wanted = [
                    ActivityType::Kernel,
                    ActivityType::Memcpy,
                    ActivityType::Runtime,
                ]
                .iter()
                .any(|t| activities.contains(*t));
                if !wanted || l.active {
                    return Ok(());
                }
                if l.tool.finalized() {
                    // The process is exiting: the SDK takes no new work and starts no context.
                    if std::mem::replace(&mut l.finalized_reported, true) {
                        return Ok(());
                    }
                    return Err(source_error(
                        "rocprofiler-sdk has finalized (the process is exiting): no GPU records after this",
                    ));
                }
                ffi::start_context(l.tool.sdk, l.main).map_err(source_error)?;
                l.active = true;
                Ok(())
            }
            State::Tracer {
                live,
                why,
                announced,
            } => {
                if !std::mem::replace(announced, true) {
                    let (a, b) = live.info.version;
                    (self.log)(&format!(
                        "rocm: recording through roctracer {a}.{b} ({}) because rocprofiler-sdk cannot be used: {why}",
                        live.info.path.display()
                    ));
                }
                live.enable().map_err(source_error)
            }
        }
    }

    fn disable(&mut self) {
        if let State::Live(l) = &mut self.state {
            if !l.active {
                return;
            }
            l.active = false;
            if l.tool.finalized() {
                // The SDK stopped every context before the tool's `finalize`, which took the
                // buffer's records; it refuses any flush from now on.
                return;
            }
            // Stopping a context that is not active is an error (§8.6): only ours, once.
            if let Err(e) = ffi::stop_context(l.tool.sdk, l.main) {
                (self.log)(&format!("rocm: {e}"));
            }
            // Records buffered before the stop stay available to the next flush.
            let _ = ffi::flush_buffer(l.tool.sdk, l.buffer);
        }
        if let State::Tracer { live, .. } = &mut self.state {
            if let Err(e) = live.disable() {
                (self.log)(&format!("rocm: {e}"));
            }
        }
    }

    fn poll(&mut self, emit: &mut dyn FnMut(&Activity)) {
        match &mut self.state {
            State::Live(l) => l.drain(emit),
            State::Tracer { live, .. } => live.drain(emit),
            State::Off { .. } => {}
        }
    }

    fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) {
        if let State::Live(l) = &mut self.state {
            // Once the SDK is finalizing, the tool's `finalize` has flushed for the last time (the
            // SDK refuses any flush after it): what it handed over waits in the queue.
            if !l.tool.finalized() {
                if let Err(e) = ffi::flush_buffer(l.tool.sdk, l.buffer) {
                    (self.log)(&format!("rocm: {e}"));
                }
            }
            l.drain(emit);
            // The window ends: launch calls no dispatch named go without their kernel's name.
            l.decoder.take_released(true, emit);
        }
        if let State::Tracer { live, .. } = &mut self.state {
            if let Err(e) = live.flush(emit) {
                (self.log)(&format!("rocm: {e}"));
            }
        }
    }

    fn dropped(&self) -> u64 {
        match &self.state {
            State::Live(l) => l.dropped(),
            State::Tracer { live, .. } => live.dropped(),
            State::Off { .. } => 0,
        }
    }
}

impl Drop for RocmSource {
    fn drop(&mut self) {
        // Leave the SDK as a later source in this process expects it: the main context stopped.
        self.disable();
    }
}

impl RocmSource {
    /// What the trace says of the backend in use.
    fn backend_metadata(&self) -> Vec<(String, String)> {
        match &self.state {
            State::Live(l) => {
                let (a, b, c) = l.info.version;
                vec![
                    ("rocm_backend".into(), "rocprofiler-sdk".into()),
                    ("rocprofiler_sdk_version".into(), format!("{a}.{b}.{c}")),
                    (
                        "rocprofiler_sdk_library".into(),
                        l.info.path.display().to_string(),
                    ),
                    ("rocprofiler_sdk_found".into(), l.info.origin.to_string()),
                    (
                        "rocprofiler_sdk_memory_allocation".into(),
                        match (&l.allocations_off, l.info.kinds.memory_allocation) {
                            (Some(e), _) => format!("off: {e}"),
                            (None, Some(_)) => "on".into(),
                            (None, None) => "off: not read on this SDK version".into(),
                        },
                    ),
                ]
            }
            State::Tracer { live, why, .. } => {
                let (a, b) = live.info.version;
                vec![
                    ("rocm_backend".into(), "roctracer".into()),
                    ("roctracer_version".into(), format!("{a}.{b}")),
                    (
                        "roctracer_library".into(),
                        live.info.path.display().to_string(),
                    ),
                    ("roctracer_found".into(), live.info.origin.to_string()),
                    ("rocm_fallback_reason".into(), why.to_string()),
                ]
            }
            State::Off { .. } => Vec::new(),
        }
    }
}

/// The device-visibility variables set in the process (`ROCR_VISIBLE_DEVICES` filters the agents
/// the SDK lists; `HIP_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES` and `GPU_DEVICE_ORDINAL` only
/// HIP's numbering), as `NAME=value` pairs: the trace's `device` is the agent's index among the
/// GPUs the SDK lists, as in Kineto, so a rank's `cuda:0` may be another device number there.
fn visible_devices() -> Option<String> {
    let set: Vec<String> = [
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
    .collect();
    (!set.is_empty()).then(|| set.join(" "))
}
