//! The roctracer 4.1 fallback (`libroctracer64.so.4`, ROCm 5.x – 7.2): used by [`RocmSource`]
//! when rocprofiler-sdk is absent or was initialised without kinetrace ("registered too late";
//! roctracer can attach after HIP started). Never both in one source: the SDK is tried first.
//!
//! HIP API calls come from the HIP_API domain callback, GPU work from the HIP_OPS activity pool;
//! both are turned on only while a window is open. Mapping as Kineto's roctracer path: calls are
//! `cuda_runtime` events with `cid` = `HIP_API_ID_*`; dispatches are kernels on (device = the KFD
//! node id, stream = the HIP stream's queue index) as the record gives them; copies are
//! `gpu_memcpy` by ROCclr command (`CopyHostToDevice`…), fills `gpu_memset`; barriers are dropped.
//!
//! [`RocmSource`]: crate::RocmSource

use std::fmt;
use std::path::PathBuf;

use kinetrace_core::activity::Activity;
use kinetrace_core::UnixNanos;

use crate::decode::{Decoder, NOISE};
use crate::ffi::roctracer::{self as ffi, Tracer};
use crate::ffi::SdkError;
use crate::loader::{candidates_of, Origin, SearchInputs, ROCTRACER_SONAMES};
use crate::source::RocmConfig;

/// HIP API ids asked for names (`HIP_API_ID_LAST` is 446 in the newest HIP).
pub(crate) const HIP_API_IDS: u32 = 2048;

/// What was loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracerInfo {
    /// The library path (or SONAME) opened.
    pub path: PathBuf,
    /// Where the search found it.
    pub origin: Origin,
    /// `roctracer_version_major/minor`.
    pub version: (u32, u32),
}

/// Why roctracer could not be used: its `Display` is appended to the line saying why the SDK could
/// not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TracerError {
    /// No `libroctracer64.so.4` anywhere the search looked.
    NotFound,
    /// Found, but unusable (each candidate's reason).
    Unusable(Vec<String>),
    /// Not version 4.
    Version {
        /// The library.
        path: PathBuf,
        /// What it reported.
        version: (u32, u32),
    },
    /// A call needed to start failed.
    Call {
        /// The library.
        path: PathBuf,
        /// What failed.
        error: SdkError,
    },
}

impl fmt::Display for TracerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TracerError::NotFound => {
                write!(f, "no roctracer 4.1 (libroctracer64.so.4) to fall back to")
            }
            TracerError::Unusable(why) => write!(f, "no usable roctracer: {}", why.join("; ")),
            TracerError::Version {
                path,
                version: (a, b),
            } => write!(
                f,
                "{} is roctracer {a}.{b}; kinetrace reads 4.x",
                path.display()
            ),
            TracerError::Call { path, error } => {
                write!(f, "roctracer ({}): {error}", path.display())
            }
        }
    }
}

/// The roctracer side of a live source.
pub(crate) struct TracerLive {
    tracer: &'static Tracer,
    pub(crate) info: TracerInfo,
    /// Made at the first record: the HIP API names (`roctracer_op_string` asks libamdhip64) and
    /// the clock offset (`roctracer_get_timestamp` answers 0 before HSA is initialised) are only
    /// sure to be there once HIP runs.
    decoder: Option<Decoder>,
    keep_noise: bool,
    /// HIP API ids of Kineto's skip list (their callbacks are turned off), once known.
    noise: Vec<i32>,
    pub(crate) active: bool,
    dropped_before: u64,
}

/// The offset from the HSA clock to Unix time (as the SDK source's), taken once HIP runs.
fn clock_offset(t: &Tracer) -> Result<i64, SdkError> {
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..5 {
        let before = UnixNanos::now().0;
        let ns = ffi::timestamp(t)?;
        if ns == 0 {
            return Err(SdkError {
                call: "roctracer_get_timestamp",
                status: 0,
                text: Some("answered 0 (HSA not initialised)".into()),
            });
        }
        let after = UnixNanos::now().0;
        let width = after.saturating_sub(before);
        let offset = (before + width / 2) as i64 - ns as i64;
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, offset));
        }
    }
    Ok(best.map_or(0, |(_, o)| o))
}

/// Finds, checks and sets up roctracer (the pool is opened; recording starts with a window).
pub(crate) fn open(config: &RocmConfig) -> Result<TracerLive, TracerError> {
    let tracer = match ffi::tracer() {
        Some(t) => t,
        None => {
            let inputs = SearchInputs::from_process_for(
                config.roctracer_library.clone(),
                "KINETRACE_ROCTRACER_PATH",
            );
            let mut tried = Vec::new();
            let mut found = None;
            for (path, origin) in candidates_of(&inputs, "libroctracer64.so", ROCTRACER_SONAMES) {
                let bare = path.components().count() == 1;
                if !bare && !path.exists() {
                    if origin == Origin::Explicit {
                        tried.push(format!("{}: no such file", path.display()));
                    }
                    continue;
                }
                match ffi::load(&path) {
                    Ok(rt) => {
                        found = Some((rt, origin));
                        break;
                    }
                    Err(kinetrace_roctracer_sys::LoadError::Open { .. }) if bare => {}
                    Err(e) => tried.push(e.to_string()),
                }
            }
            let Some((rt, origin)) = found else {
                return Err(if tried.is_empty() {
                    TracerError::NotFound
                } else {
                    TracerError::Unusable(tried)
                });
            };
            let version = ffi::version(&rt);
            if version.0 != 4 {
                return Err(TracerError::Version {
                    path: rt.path().to_path_buf(),
                    version,
                });
            }
            let t = ffi::install(rt, config.queue_records);
            ORIGIN.get_or_init(|| origin);
            t
        }
    };
    let path = tracer.path.clone();
    // Kineto's pool is 16 KiB; the SDK buffer's size keeps the callbacks as rare as there.
    ffi::open_pool(tracer, config.buffer_bytes).map_err(|error| TracerError::Call {
        path: path.clone(),
        error,
    })?;
    Ok(TracerLive {
        tracer,
        info: TracerInfo {
            path,
            origin: ORIGIN.get().copied().unwrap_or(Origin::Explicit),
            version: ffi::version(tracer.rt),
        },
        decoder: None,
        keep_noise: config.keep_noise,
        noise: Vec::new(),
        active: false,
        dropped_before: tracer.queue.refused(),
    })
}

static ORIGIN: std::sync::OnceLock<Origin> = std::sync::OnceLock::new();

impl TracerLive {
    pub(crate) fn enable(&mut self) -> Result<(), SdkError> {
        if !self.active {
            // The arguments of launches and copies are read once HIP can name its ids (else from
            // the first record on, see `decoder`).
            if !self.tracer.has_arg_layouts() {
                self.tracer
                    .set_arg_layouts(&ffi::hip_api_names(self.tracer, HIP_API_IDS));
            }
            ffi::enable(self.tracer, &self.noise)?;
            self.active = true;
        }
        Ok(())
    }

    pub(crate) fn disable(&mut self) -> Result<(), SdkError> {
        if !self.active {
            return Ok(());
        }
        self.active = false;
        ffi::disable(self.tracer);
        // What the pool holds goes to the queue, for the next flush.
        ffi::flush(self.tracer)
    }

    /// The decoder, made now if this is the first record (see [`TracerLive::decoder`]).
    fn decoder(&mut self) -> &mut Decoder {
        let t = self.tracer;
        let keep_noise = self.keep_noise;
        let noise = &mut self.noise;
        self.decoder.get_or_insert_with(|| {
            let names = ffi::hip_api_names(t, HIP_API_IDS);
            t.set_arg_layouts(&names);
            if !keep_noise {
                *noise = names
                    .iter()
                    .filter(|(_, n)| NOISE.contains(&n.as_str()))
                    .map(|(op, _)| *op)
                    .collect();
            }
            // A failed read leaves GPU times unshifted rather than losing them.
            let offset = clock_offset(t).unwrap_or(0);
            Decoder::new(&names, &[], Default::default(), offset, keep_noise)
        })
    }

    pub(crate) fn drain(&mut self, emit: &mut dyn FnMut(&Activity)) {
        let t = self.tracer;
        // The decoder is made at the first record.
        if !t.queue.has_ready() {
            return;
        }
        // roctracer's dispatch records carry the kernel's name (interned when copied).
        crate::decode::drain(&t.queue, self.decoder(), |_| None, &t.external, emit);
    }

    pub(crate) fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) -> Result<(), SdkError> {
        let r = ffi::flush(self.tracer);
        self.drain(emit);
        // The window ends: launch calls no dispatch named go without their kernel's name.
        if let Some(d) = &mut self.decoder {
            d.take_released(true, emit);
        }
        r
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.tracer
            .queue
            .refused()
            .saturating_sub(self.dropped_before)
    }
}
