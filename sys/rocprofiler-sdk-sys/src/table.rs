//! The libloading function table: one field per rocprofiler-sdk entry point kinetrace calls.

use core::ffi::{c_char, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::{
    AgentsCallback, BufferCallback, BufferId, CallbackTracingFn, ConfigureFn, ContextId,
    KindCallback, OperationCallback, Status,
};

/// Why [`RocprofilerSdk::load`] failed.
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
                "{} lacks the required symbol {symbol}; it is not a rocprofiler-sdk kinetrace supports (0.4 or newer)",
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
        /// The rocprofiler-sdk entry points kinetrace uses, resolved from one loaded library.
        ///
        /// Field names are the vendor's. Optional entry points are `None` when the library lacks
        /// them. The library is never unloaded: the SDK keeps our callbacks for the life of the
        /// process.
        pub struct RocprofilerSdk {
            $( $(#[$rdoc])* pub $rname: unsafe extern "C" fn($($rarg),*) -> $rret, )*
            $( $(#[$odoc])* pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> $oret>, )*
            path: PathBuf,
            lib: ManuallyDrop<Library>,
        }

        /// Symbols whose absence makes [`RocprofilerSdk::load`] fail.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($rname)),*];
        /// Symbols that may be missing; their fields are `None` then.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($oname)),*];

        impl RocprofilerSdk {
            /// Resolves the table from an opened library. `path` names it in errors.
            ///
            /// # Safety
            /// `lib` must be a rocprofiler-sdk (or a library that implements these symbols with
            /// the SDK's C signatures): the symbols are cast to those signatures unchecked.
            pub unsafe fn from_library(lib: Library, path: &Path) -> Result<RocprofilerSdk, LoadError> {
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
                Ok(RocprofilerSdk { $($rname,)* $($oname,)* path: path.to_path_buf(), lib: ManuallyDrop::new(lib) })
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
        /// `rocprofiler_get_version(uint32_t* major, uint32_t* minor, uint32_t* patch)`.
        rocprofiler_get_version(*mut u32, *mut u32, *mut u32) -> Status;
        /// `rocprofiler_get_timestamp(uint64_t* ns)`: CLOCK_BOOTTIME.
        rocprofiler_get_timestamp(*mut u64) -> Status;
        /// `rocprofiler_create_context(rocprofiler_context_id_t*)`; the handle must be 0 before.
        rocprofiler_create_context(*mut ContextId) -> Status;
        /// `rocprofiler_start_context(ctx)`.
        rocprofiler_start_context(ContextId) -> Status;
        /// `rocprofiler_stop_context(ctx)`.
        rocprofiler_stop_context(ContextId) -> Status;
        /// `rocprofiler_create_buffer(ctx, size, watermark, policy, callback, data, &buffer)`.
        rocprofiler_create_buffer(ContextId, usize, usize, i32, BufferCallback, *mut c_void, *mut BufferId) -> Status;
        /// `rocprofiler_flush_buffer(buffer)`: hands what the buffer holds to its callback.
        rocprofiler_flush_buffer(BufferId) -> Status;
        /// `rocprofiler_configure_buffer_tracing_service(ctx, kind, ops, n_ops, buffer)`.
        rocprofiler_configure_buffer_tracing_service(ContextId, i32, *const i32, usize, BufferId) -> Status;
        /// `rocprofiler_configure_callback_tracing_service(ctx, kind, ops, n_ops, callback, data)`.
        rocprofiler_configure_callback_tracing_service(ContextId, i32, *const i32, usize, CallbackTracingFn, *mut c_void) -> Status;
        /// `rocprofiler_query_buffer_tracing_kind_name(kind, &name, &len)`.
        rocprofiler_query_buffer_tracing_kind_name(i32, *mut *const c_char, *mut u64) -> Status;
        /// `rocprofiler_query_buffer_tracing_kind_operation_name(kind, op, &name, &len)`.
        rocprofiler_query_buffer_tracing_kind_operation_name(i32, i32, *mut *const c_char, *mut u64) -> Status;
        /// `rocprofiler_query_callback_tracing_kind_name(kind, &name, &len)`.
        rocprofiler_query_callback_tracing_kind_name(i32, *mut *const c_char, *mut u64) -> Status;
        /// `rocprofiler_query_callback_tracing_kind_operation_name(kind, op, &name, &len)`.
        rocprofiler_query_callback_tracing_kind_operation_name(i32, i32, *mut *const c_char, *mut u64) -> Status;
        /// `rocprofiler_iterate_buffer_tracing_kinds(cb, data)`.
        rocprofiler_iterate_buffer_tracing_kinds(KindCallback, *mut c_void) -> Status;
        /// `rocprofiler_iterate_buffer_tracing_kind_operations(kind, cb, data)`.
        rocprofiler_iterate_buffer_tracing_kind_operations(i32, OperationCallback, *mut c_void) -> Status;
        /// `rocprofiler_iterate_callback_tracing_kinds(cb, data)`.
        rocprofiler_iterate_callback_tracing_kinds(KindCallback, *mut c_void) -> Status;
        /// `rocprofiler_iterate_callback_tracing_kind_operations(kind, cb, data)`.
        rocprofiler_iterate_callback_tracing_kind_operations(i32, OperationCallback, *mut c_void) -> Status;
    }
    optional {
        /// `rocprofiler_force_configure(configure)`: register a tool from code (before any ROCm
        /// runtime initialises).
        rocprofiler_force_configure(ConfigureFn) -> Status;
        /// `rocprofiler_is_initialized(int*)`: 0 not yet, -1 initialising, 1 done.
        rocprofiler_is_initialized(*mut i32) -> Status;
        /// `rocprofiler_query_available_agents(version, cb, agent_size, data)`.
        rocprofiler_query_available_agents(i32, AgentsCallback, usize, *mut c_void) -> Status;
        /// `rocprofiler_get_status_string(status)`.
        rocprofiler_get_status_string(Status) -> *const c_char;
    }
}

impl RocprofilerSdk {
    /// Opens the library at `path` (a file path, or a bare SONAME searched on the loader path) and
    /// resolves the table. Never panics.
    ///
    /// # Safety
    /// Opening a library runs its initialisers; `path` must name a rocprofiler-sdk (or a faithful
    /// fake).
    pub unsafe fn load(path: &Path) -> Result<RocprofilerSdk, LoadError> {
        // SAFETY: the caller vouches for the library's initialisers.
        let lib = unsafe { Library::new(path) }.map_err(|e| LoadError::Open {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // SAFETY: the caller vouches that it is the SDK.
        unsafe { RocprofilerSdk::from_library(lib, path) }
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

impl fmt::Debug for RocprofilerSdk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RocprofilerSdk")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
