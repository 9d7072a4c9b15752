//! Runtime/driver API names from the generated cbid tables, Kineto's noise blocklist, and which calls
//! launch (or wait for) GPU work and so start an `ac2g` flow.

use kinetrace_core::intern::{api_name, intern, NameId};
use kinetrace_cupti_sys::cbid::{DRIVER_CBID_NAMES, RUNTIME_CBID_NAMES};

/// Runtime calls Kineto drops as noise (`CuptiActivityProfiler.cpp` blocklist).
pub const RUNTIME_BLOCKLIST: &[&str] = &[
    "cudaGetDevice",
    "cudaSetDevice",
    "cudaGetLastError",
    "cudaEventCreate",
    "cudaEventCreateWithFlags",
    "cudaEventDestroy",
];

/// Driver calls Kineto disables as noise (it asks CUPTI not to record them on 12.5+).
pub const DRIVER_BLOCKLIST: &[&str] = &[
    "cuKernelGetAttribute",
    "cuDevicePrimaryCtxGetState",
    "cuCtxGetCurrent",
    "cuGetProcAddress",
];

/// Whether a call of this (suffix-stripped) name launches or waits for GPU work: Kineto's
/// "requires flow correlation" set, plus the driver calls that enqueue a GPU record themselves
/// (`cuMemcpy*`, `cuMemset*`, the cooperative launches, `cuGraphLaunch`), so that every kernel,
/// copy and memset whose call is in the trace has its flow. (A driver call the runtime makes
/// inside one of its own calls has its own correlation id; the GPU record carries the runtime
/// call's, so no record gets two flows.)
pub fn launches_work(name: &str) -> bool {
    let name = name.strip_suffix("_ptsz").unwrap_or(name);
    let name = name.strip_suffix("_ptds").unwrap_or(name);
    matches!(
        name,
        "cudaLaunchKernel"
            | "cudaLaunchCooperativeKernel"
            | "cudaLaunchCooperativeKernelMultiDevice"
            | "cudaLaunchKernelExC"
            | "cudaGraphLaunch"
            | "cudaStreamSynchronize"
            | "cudaDeviceSynchronize"
            | "cudaStreamWaitEvent"
            | "cuLaunchKernel"
            | "cuLaunchKernelEx"
            | "cuLaunchCooperativeKernel"
            | "cuLaunchCooperativeKernelMultiDevice"
            | "cuGraphLaunch"
    ) || name.starts_with("cudaMemcpy")
        || name.starts_with("cudaMemset")
        || name.starts_with("cuMemcpy")
        || name.starts_with("cuMemset")
}

/// What the decoder needs to know about one callback id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiInfo {
    /// The Kineto spelling (no `_v1234` suffix).
    pub name: NameId,
    /// Whether it starts an `ac2g` flow.
    pub launches_work: bool,
}

/// Per-domain caches of [`ApiInfo`], filled on first sight of each cbid.
pub struct ApiNames {
    keep_noise: bool,
    runtime: Vec<Option<Option<ApiInfo>>>,
    driver: Vec<Option<Option<ApiInfo>>>,
}

impl ApiNames {
    /// Empty caches. With `keep_noise`, blocklisted calls are kept.
    pub fn new(keep_noise: bool) -> Self {
        ApiNames {
            keep_noise,
            runtime: vec![None; RUNTIME_CBID_NAMES.len()],
            driver: vec![None; DRIVER_CBID_NAMES.len()],
        }
    }

    /// The info for `cbid`, or `None` when the call is blocklisted.
    #[inline]
    pub fn get(&mut self, runtime: bool, cbid: u32) -> Option<ApiInfo> {
        let keep_noise = self.keep_noise;
        let (cache, table, blocklist, prefix) = if runtime {
            (
                &mut self.runtime,
                &RUNTIME_CBID_NAMES[..],
                RUNTIME_BLOCKLIST,
                "cudaApi",
            )
        } else {
            (
                &mut self.driver,
                &DRIVER_CBID_NAMES[..],
                DRIVER_BLOCKLIST,
                "cuApi",
            )
        };
        if let Some(Some(hit)) = cache.get(cbid as usize) {
            return *hit;
        }
        let raw = table.get(cbid as usize).copied().unwrap_or("");
        let info = if raw.is_empty() {
            // A cbid newer than our tables: still recorded, under a name that says which it was.
            Some(ApiInfo {
                name: intern(&format!("{prefix}#{cbid}")),
                launches_work: false,
            })
        } else {
            let name = api_name(raw);
            if !keep_noise && blocklist.contains(&name) {
                None
            } else {
                Some(ApiInfo {
                    name: intern(name),
                    launches_work: launches_work(name),
                })
            }
        };
        if let Some(slot) = cache.get_mut(cbid as usize) {
            *slot = Some(info);
        }
        info
    }
}

/// The raw header name of a runtime cbid (`cudaLaunchKernel_v7000`), if known.
pub fn runtime_raw_name(cbid: u32) -> Option<&'static str> {
    RUNTIME_CBID_NAMES
        .get(cbid as usize)
        .copied()
        .filter(|s| !s.is_empty())
}

/// The runtime cbid whose header name is `raw` (for tests and the fake library).
pub fn runtime_cbid(raw: &str) -> Option<u32> {
    RUNTIME_CBID_NAMES
        .iter()
        .position(|n| *n == raw)
        .map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinetrace_core::intern::resolve;

    #[test]
    fn names_are_stripped_and_classified() {
        let mut n = ApiNames::new(false);
        let launch = n.get(true, 211).unwrap();
        assert_eq!(&*resolve(launch.name), "cudaLaunchKernel");
        assert!(launch.launches_work);
        let memcpy = n
            .get(true, runtime_cbid("cudaMemcpyAsync_v3020").unwrap())
            .unwrap();
        assert_eq!(&*resolve(memcpy.name), "cudaMemcpyAsync");
        assert!(memcpy.launches_work);
        let malloc = n
            .get(true, runtime_cbid("cudaMalloc_v3020").unwrap())
            .unwrap();
        assert!(!malloc.launches_work);
        let cu = n.get(false, 307).unwrap();
        assert_eq!(&*resolve(cu.name), "cuLaunchKernel");
        assert!(cu.launches_work);
        // Driver calls that enqueue a copy or a memset themselves start its flow too.
        for raw in [
            "cuMemcpyHtoDAsync_v2",
            "cuMemsetD32Async",
            "cuMemcpyAsync_ptsz",
        ] {
            let cbid = DRIVER_CBID_NAMES
                .iter()
                .position(|n| *n == raw)
                .unwrap_or_else(|| panic!("{raw} in the driver table"));
            let info = n.get(false, cbid as u32).unwrap();
            assert!(info.launches_work, "{raw}");
        }
        let ctx = DRIVER_CBID_NAMES
            .iter()
            .position(|n| *n == "cuCtxSynchronize")
            .unwrap();
        assert!(!n.get(false, ctx as u32).unwrap().launches_work);
        // Newer than the table: kept, named by number.
        assert_eq!(
            &*resolve(n.get(true, 100_000).unwrap().name),
            "cudaApi#100000"
        );
    }

    #[test]
    fn noise_is_dropped_unless_asked() {
        let get_device = runtime_cbid("cudaGetDevice_v3020").unwrap();
        assert_eq!(ApiNames::new(false).get(true, get_device), None);
        assert!(ApiNames::new(true).get(true, get_device).is_some());
        // Cached answers are the same.
        let mut n = ApiNames::new(false);
        assert_eq!(n.get(true, get_device), None);
        assert_eq!(n.get(true, get_device), None);
    }
}
