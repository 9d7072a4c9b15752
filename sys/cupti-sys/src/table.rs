//! The libloading function table: one field per CUPTI entry point kinetrace calls.

use core::ffi::{c_char, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::v13::{
    CUcontext, CUptiResult, CUpti_Activity, CUpti_ActivityAttribute, CUpti_ActivityKind,
    CUpti_ActivityThreadIdType, CUpti_BuffersCallbackCompleteFunc,
    CUpti_BuffersCallbackRequestFunc, CUpti_CallbackDomain, CUpti_CallbackFunc, CUpti_CallbackId,
    CUpti_ExternalCorrelationKind, CUpti_SubscriberHandle,
};

/// Why [`Cupti::load`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` refused the file.
    Open {
        /// The path (or SONAME) that was opened.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library lacks an entry point kinetrace cannot work without.
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The symbol.
        symbol: &'static str,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Open { path, message } => write!(f, "cannot load {}: {message}", path.display()),
            LoadError::MissingSymbol { path, symbol } => write!(
                f,
                "{} lacks the required symbol {symbol}; it is not a CUPTI library kinetrace supports (11.8 or newer)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {}

macro_rules! function_table {
    (
        required { $( $(#[$rdoc:meta])* $rname:ident ( $($rarg:ty),* ); )* }
        optional { $( $(#[$odoc:meta])* $oname:ident ( $($oarg:ty),* ); )* }
    ) => {
        /// The CUPTI entry points kinetrace uses, resolved from one loaded library.
        ///
        /// Field names are the vendor's. Every function returns a `CUptiResult`. Optional entry points
        /// are `None` when the library predates them. The library is never unloaded: CUPTI keeps our
        /// callbacks registered for the life of the process.
        #[allow(non_snake_case)]
        pub struct Cupti {
            $( $(#[$rdoc])* pub $rname: unsafe extern "C" fn($($rarg),*) -> CUptiResult, )*
            $( $(#[$odoc])* pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> CUptiResult>, )*
            path: PathBuf,
            lib: ManuallyDrop<Library>,
        }

        /// Symbols whose absence makes [`Cupti::load`] fail.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($rname)),*];
        /// Symbols that may be missing (older libraries); their fields are `None` then.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($oname)),*];

        impl Cupti {
            /// Resolves the table from an opened library. `path` names it in errors.
            ///
            /// # Safety
            /// `lib` must be a CUPTI library (or a library that implements these symbols with CUPTI's C
            /// signatures): the symbols are cast to those signatures unchecked.
            #[allow(non_snake_case)]
            pub unsafe fn from_library(lib: Library, path: &Path) -> Result<Cupti, LoadError> {
                $(
                    // SAFETY: the caller guarantees the symbol has this C signature; the pointer stays
                    // valid because the library is never unloaded (ManuallyDrop below).
                    let $rname = match unsafe { lib.get::<unsafe extern "C" fn($($rarg),*) -> CUptiResult>(concat!(stringify!($rname), "\0").as_bytes()) } {
                        Ok(f) => *f,
                        Err(_) => return Err(LoadError::MissingSymbol { path: path.to_path_buf(), symbol: stringify!($rname) }),
                    };
                )*
                $(
                    // SAFETY: as above.
                    let $oname = unsafe { lib.get::<unsafe extern "C" fn($($oarg),*) -> CUptiResult>(concat!(stringify!($oname), "\0").as_bytes()) }
                        .ok()
                        .map(|f| *f);
                )*
                Ok(Cupti { $($rname,)* $($oname,)* path: path.to_path_buf(), lib: ManuallyDrop::new(lib) })
            }

            /// The optional symbols this library lacks.
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $( if self.$oname.is_none() { v.push(stringify!($oname)); } )*
                v
            }
        }
    };
}

function_table! {
    required {
        /// `cuptiGetVersion(uint32_t *version)`.
        cuptiGetVersion(*mut u32);
        /// `cuptiActivityRegisterCallbacks(request, complete)`.
        cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
        /// `cuptiActivityEnable(kind)`.
        cuptiActivityEnable(CUpti_ActivityKind);
        /// `cuptiActivityDisable(kind)`.
        cuptiActivityDisable(CUpti_ActivityKind);
        /// `cuptiActivityFlushAll(flag)`.
        cuptiActivityFlushAll(u32);
        /// `cuptiActivityGetNextRecord(buffer, validBufferSizeBytes, &record)`.
        cuptiActivityGetNextRecord(*mut u8, usize, *mut *mut CUpti_Activity);
        /// `cuptiActivityGetNumDroppedRecords(context, streamId, &dropped)`.
        cuptiActivityGetNumDroppedRecords(CUcontext, u32, *mut usize);
        /// `cuptiFinalize()`.
        cuptiFinalize();
    }
    optional {
        /// `cuptiGetTimestamp(uint64_t *timestamp)`.
        cuptiGetTimestamp(*mut u64);
        /// `cuptiGetResultString(result, &str)`; unusable without a driver on 13.3+.
        cuptiGetResultString(CUptiResult, *mut *const c_char);
        /// `cuptiSubscribe(&subscriber, callback, userdata)`.
        cuptiSubscribe(*mut CUpti_SubscriberHandle, CUpti_CallbackFunc, *mut c_void);
        /// `cuptiUnsubscribe(subscriber)`.
        cuptiUnsubscribe(CUpti_SubscriberHandle);
        /// `cuptiEnableDomain(enable, subscriber, domain)`.
        cuptiEnableDomain(u32, CUpti_SubscriberHandle, CUpti_CallbackDomain);
        /// `cuptiEnableCallback(enable, subscriber, domain, cbid)`.
        cuptiEnableCallback(u32, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
        /// `cuptiActivityPushExternalCorrelationId(kind, id)`.
        cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind, u64);
        /// `cuptiActivityPopExternalCorrelationId(kind, &lastId)`.
        cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind, *mut u64);
        /// `cuptiSetThreadIdType(type)`.
        cuptiSetThreadIdType(CUpti_ActivityThreadIdType);
        /// `cuptiActivitySetAttribute(attr, &valueSize, value)`.
        cuptiActivitySetAttribute(CUpti_ActivityAttribute, *mut usize, *mut c_void);
        /// `cuptiActivityFlushPeriod(ms)`.
        cuptiActivityFlushPeriod(u32);
        /// `cuptiActivityEnableRuntimeApi(cbid, enable)` (12.5+).
        cuptiActivityEnableRuntimeApi(CUpti_CallbackId, u8);
        /// `cuptiActivityEnableDriverApi(cbid, enable)` (12.5+).
        cuptiActivityEnableDriverApi(CUpti_CallbackId, u8);
        /// `cuptiActivityGetStructSize(kind, version, &size)` (13.2+).
        cuptiActivityGetStructSize(CUpti_ActivityKind, u32, *mut usize);
        /// `cuptiActivityEnableAndDump(kind)`: enable, and emit records for resources (devices,
        /// contexts, streams) that already exist.
        cuptiActivityEnableAndDump(CUpti_ActivityKind);
    }
}

impl Cupti {
    /// Opens the library at `path` (a file path, or a bare SONAME searched on the loader path) and
    /// resolves the table. Never panics.
    ///
    /// # Safety
    /// Opening a library runs its initialisers; `path` must name a CUPTI library (or a faithful fake).
    pub unsafe fn load(path: &Path) -> Result<Cupti, LoadError> {
        // SAFETY: the caller vouches for the library's initialisers.
        let lib = unsafe { Library::new(path) }.map_err(|e| LoadError::Open {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // SAFETY: the caller vouches that it is CUPTI.
        unsafe { Cupti::from_library(lib, path) }
    }

    /// The path (or SONAME) the library was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying library handle (for looking up symbols outside the table).
    pub fn library(&self) -> &Library {
        &self.lib
    }
}

impl fmt::Debug for Cupti {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cupti")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
