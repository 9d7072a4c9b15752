//! Making the process's tool: find the library, check its version, resolve every kind and
//! operation kinetrace needs by name. Shared by a source's own registration and by the SDK calling
//! `rocprofiler_configure` itself.

use kinetrace_rocprofiler_sdk_sys::Abi;

use crate::decode::NOISE;
use crate::external::ExternalIds;
use crate::ffi::{self, Kinds, Markers, Names, Plan, Setup, Tool, Tracing};
use crate::loader::{self, SearchInputs};
use crate::queue::Queue;
use crate::record::ArgLayout;
use crate::source::{RocmConfig, RocmOpenError};

pub(crate) fn find(table: &[(i32, String)], name: &str) -> Option<i32> {
    table.iter().find(|(_, n)| n == name).map(|(k, _)| *k)
}

/// The process's tool: the one installed already (by an earlier source, or by the SDK calling
/// [`tool_configure`]), else one made now for the library the search finds. Registers nothing.
pub(crate) fn install_tool(config: &RocmConfig) -> Result<&'static Tool, RocmOpenError> {
    if let Some(e) = LAZY_FAILURE.get() {
        return Err(e.clone());
    }
    let found = loader::locate(&SearchInputs::from_process(config.library.clone()))
        .map_err(RocmOpenError::NotFound)?;
    let path = found.sdk.path().to_path_buf();
    if let Some(t) = ffi::tool() {
        // The dynamic loader hands back the same library for the same path.
        if t.path != path && config.library.is_some() {
            return Err(RocmOpenError::OtherLibrary {
                registered: t.path.clone(),
                path,
            });
        }
        return Ok(t);
    }
    let call = |error| RocmOpenError::Call {
        path: path.clone(),
        error,
    };
    let version = ffi::get_version(&found.sdk).map_err(call)?;
    let abi = Abi::of_version(version.0, version.1).ok_or(RocmOpenError::UnsupportedVersion {
        path: path.clone(),
        version,
    })?;
    let missing = |what: &str| RocmOpenError::MissingKind {
        path: path.clone(),
        what: what.to_owned(),
    };
    let sdk = &found.sdk;
    let buffer_kinds = ffi::kinds(sdk, Tracing::Buffer).map_err(call)?;
    let callback_kinds = ffi::kinds(sdk, Tracing::Callback).map_err(call)?;
    let kernel_dispatch = find(&buffer_kinds, "KERNEL_DISPATCH")
        .ok_or_else(|| missing("buffer-tracing kind KERNEL_DISPATCH"))?;
    let memory_copy = find(&buffer_kinds, "MEMORY_COPY")
        .ok_or_else(|| missing("buffer-tracing kind MEMORY_COPY"))?;
    let hip_runtime_api = find(&callback_kinds, "HIP_RUNTIME_API")
        .ok_or_else(|| missing("callback-tracing kind HIP_RUNTIME_API"))?;
    let code_object = find(&callback_kinds, "CODE_OBJECT")
        .ok_or_else(|| missing("callback-tracing kind CODE_OBJECT"))?;
    let code_ops = ffi::operations(sdk, Tracing::Callback, code_object).map_err(call)?;
    // roctx (optional: an SDK without marker tracing records everything else).
    let markers = find(&callback_kinds, "MARKER_CORE_API").and_then(|kind| {
        let ops = ffi::operations(sdk, Tracing::Callback, kind).ok()?;
        Some(Markers {
            kind,
            push: find(&ops, "roctxRangePushA")?,
            pop: find(&ops, "roctxRangePop")?,
        })
    });
    let kernel_symbol_register = find(&code_ops, "CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER")
        .ok_or_else(|| missing("code-object operation DEVICE_KERNEL_SYMBOL_REGISTER"))?;
    let hip_ops = ffi::operations(sdk, Tracing::Callback, hip_runtime_api).map_err(call)?;
    let copy_ops = ffi::operations(sdk, Tracing::Buffer, memory_copy).map_err(call)?;
    let memory_allocation = match abi {
        Abi::V1 => find(&buffer_kinds, "MEMORY_ALLOCATION"),
        Abi::V0 => None,
    };
    let allocation_ops = match memory_allocation {
        Some(k) => ffi::operations(sdk, Tracing::Buffer, k).map_err(call)?,
        None => Vec::new(),
    };
    let hip_operations = if config.keep_noise {
        Vec::new()
    } else {
        hip_ops
            .iter()
            .filter(|(_, n)| !NOISE.contains(&n.as_str()))
            .map(|(op, _)| *op)
            .collect()
    };
    let arg_layouts = arg_layouts(&hip_ops);
    // Leaked: the SDK keeps our callbacks, which reach the table, for the life of the process.
    let sdk = &*Box::leak(Box::new(found.sdk));
    Ok(ffi::install(Tool {
        sdk,
        path,
        abi,
        kinds: Kinds {
            kernel_dispatch,
            memory_copy,
            hip_runtime_api,
            code_object,
            kernel_symbol_register,
            memory_allocation,
            markers,
        },
        names: Names {
            version,
            origin: found.origin,
            hip_ops,
            copy_ops,
            allocation_ops,
        },
        plan: Plan {
            buffer_bytes: config.buffer_bytes,
            watermark: config.watermark,
            hip_operations,
        },
        queue: Queue::new(config.queue_records),
        external: ExternalIds::new(),
        arg_layouts,
        sdk_dropped: Default::default(),
        skipped: Default::default(),
        finalized: Default::default(),
        configured: Default::default(),
        kernel_names: Default::default(),
        setup: std::sync::Mutex::new(Setup::default()),
    }))
}

/// The [`ArgLayout`] of each HIP operation number, by name (numbers past 65 535 are not read).
fn arg_layouts(hip_ops: &[(i32, String)]) -> Box<[u8]> {
    let named: Vec<(usize, u8)> = hip_ops
        .iter()
        .filter_map(|(op, n)| {
            let op = usize::try_from(*op).ok().filter(|o| *o < 1 << 16)?;
            ArgLayout::of_name(n).map(|l| (op, l as u8))
        })
        .collect();
    let len = named.iter().map(|(op, _)| op + 1).max().unwrap_or(0);
    let mut table = vec![0u8; len];
    for (op, l) in named {
        table[op] = l;
    }
    table.into_boxed_slice()
}

/// Why the tool could not be made when the SDK called [`tool_configure`] (said by the first
/// source).
static LAZY_FAILURE: std::sync::OnceLock<RocmOpenError> = std::sync::OnceLock::new();

/// Makes the tool for the SDK that is calling `rocprofiler_configure` (it is loaded, so the search
/// finds it first). `None` (kinetrace opts out) when that fails; the first source says why.
pub(crate) fn install_for_sdk() -> Option<&'static Tool> {
    match install_tool(&RocmConfig::default()) {
        Ok(t) => Some(t),
        Err(e) => {
            let _ = LAZY_FAILURE.set(e);
            None
        }
    }
}
