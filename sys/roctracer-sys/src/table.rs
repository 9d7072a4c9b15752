//! The libloading function table: one field per roctracer entry point kinetrace calls.

use core::ffi::{c_char, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::{ApiCallback, Properties, Record, Status};

/// Why [`Roctracer::load`] failed.
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
                "{} lacks the required symbol {symbol}; it is not a roctracer kinetrace supports (4.1, ROCm 5.x – 7.2)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {}

macro_rules! function_table {
    (
        required { $( $(#[$rdoc:meta])* $rname:ident ( $($rarg:ty),* ) -> $rret:ty; )* }
        optional { $( $(#[$odoc:meta])* $oname:ident ( $($oarg:ty),* ) -> $oret:ty; )* }
    ) => {
        /// The roctracer entry points kinetrace uses, resolved from one loaded library.
        ///
        /// Field names are the vendor's. Optional entry points are `None` when the library lacks
        /// them. The library is never unloaded: roctracer keeps our callbacks for the life of the
        /// process.
        pub struct Roctracer {
            $( $(#[$rdoc])* pub $rname: unsafe extern "C" fn($($rarg),*) -> $rret, )*
            $( $(#[$odoc])* pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> $oret>, )*
            path: PathBuf,
            lib: ManuallyDrop<Library>,
        }

        /// Symbols whose absence makes [`Roctracer::load`] fail.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($rname)),*];
        /// Symbols that may be missing; their fields are `None` then.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($oname)),*];

        impl Roctracer {
            /// Resolves the table from an opened library. `path` names it in errors.
            ///
            /// # Safety
            /// `lib` must be a roctracer (or a library that implements these symbols with its C
            /// signatures): the symbols are cast to those signatures unchecked.
            pub unsafe fn from_library(lib: Library, path: &Path) -> Result<Roctracer, LoadError> {
                $(
                    // SAFETY: the caller guarantees the symbol has this C signature; the pointer
                    // stays valid because the library is never unloaded (ManuallyDrop below).
                    let $rname = match unsafe { lib.get::<unsafe extern "C" fn($($rarg),*) -> $rret>(concat!(stringify!($rname), "\0").as_bytes()) } {
                        Ok(f) => *f,
                        Err(_) => return Err(LoadError::MissingSymbol { path: path.to_path_buf(), symbol: stringify!($rname) }),
                    };
                )*
                $(
                    // SAFETY: as above.
                    let $oname = unsafe { lib.get::<unsafe extern "C" fn($($oarg),*) -> $oret>(concat!(stringify!($oname), "\0").as_bytes()) }
                        .ok()
                        .map(|f| *f);
                )*
                Ok(Roctracer { $($rname,)* $($oname,)* path: path.to_path_buf(), lib: ManuallyDrop::new(lib) })
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
        /// `roctracer_version_major()`.
        roctracer_version_major() -> u32;
        /// `roctracer_version_minor()`.
        roctracer_version_minor() -> u32;
        /// `roctracer_error_string()`: the last error, no argument.
        roctracer_error_string() -> *const c_char;
        /// `roctracer_open_pool_expl(const roctracer_properties_t*, roctracer_pool_t**)`.
        roctracer_open_pool_expl(*const Properties, *mut *mut c_void) -> Status;
        /// `roctracer_close_pool_expl(pool)`.
        roctracer_close_pool_expl(*mut c_void) -> Status;
        /// `roctracer_enable_domain_callback(domain, callback, arg)`.
        roctracer_enable_domain_callback(u32, ApiCallback, *mut c_void) -> Status;
        /// `roctracer_disable_domain_callback(domain)`.
        roctracer_disable_domain_callback(u32) -> Status;
        /// `roctracer_enable_domain_activity_expl(domain, pool)`.
        roctracer_enable_domain_activity_expl(u32, *mut c_void) -> Status;
        /// `roctracer_disable_domain_activity(domain)`.
        roctracer_disable_domain_activity(u32) -> Status;
        /// `roctracer_flush_activity_expl(pool)`: blocks until the buffer callback has returned.
        roctracer_flush_activity_expl(*mut c_void) -> Status;
        /// `roctracer_next_record(record, &next)`: `next = record + 1` (fixed 64-byte stride).
        roctracer_next_record(*const Record, *mut *const Record) -> Status;
        /// `roctracer_op_string(domain, op, kind)`: for HIP_OPS the name comes from `kind`.
        roctracer_op_string(u32, u32, u32) -> *const c_char;
        /// `roctracer_get_timestamp(uint64_t*)`: the HSA system clock in ns.
        roctracer_get_timestamp(*mut u64) -> Status;
    }
    optional {
        /// `roctracer_enable_op_callback(domain, op, callback, arg)`.
        roctracer_enable_op_callback(u32, u32, ApiCallback, *mut c_void) -> Status;
        /// `roctracer_disable_op_callback(domain, op)`.
        roctracer_disable_op_callback(u32, u32) -> Status;
        /// `roctracer_op_code(domain, name, &op, &kind)`.
        roctracer_op_code(u32, *const c_char, *mut u32, *mut u32) -> Status;
        /// `roctracer_start()` (roctracer_ext.h): resumes all callbacks and activity.
        roctracer_start() -> ();
        /// `roctracer_stop()` (roctracer_ext.h): pauses all callbacks and activity.
        roctracer_stop() -> ();
        /// `roctracer_set_properties(domain, properties)`.
        roctracer_set_properties(u32, *mut c_void) -> Status;
    }
}

impl Roctracer {
    /// Opens the library at `path` (a file path, or a bare SONAME searched on the loader path) and
    /// resolves the table. Never panics.
    ///
    /// # Safety
    /// Opening a library runs its initialisers; `path` must name a roctracer (or a faithful fake).
    pub unsafe fn load(path: &Path) -> Result<Roctracer, LoadError> {
        // SAFETY: the caller vouches for the library's initialisers.
        let lib = unsafe { Library::new(path) }.map_err(|e| LoadError::Open {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // SAFETY: the caller vouches that it is roctracer.
        unsafe { Roctracer::from_library(lib, path) }
    }

    /// The path (or SONAME) the library was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying library handle.
    pub fn library(&self) -> &Library {
        &self.lib
    }
}

impl fmt::Debug for Roctracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Roctracer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
