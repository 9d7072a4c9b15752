//! Which record struct each CUPTI release writes, per record family: the one release → layout
//! table. `kinetrace-cupti` reads record sizes from it (its `version` module), and the test fake
//! (`tests/fakes/cupti`) builds records with the structs it names, so the two cannot disagree.
//!
//! CUPTI always writes its own newest struct for a kind; the client cannot choose. A struct changes
//! only by appending fields, so a family's struct for a release is "the newest one that release
//! ships". The table follows the research notes (`shared/research`, the structs each wheel's
//! headers declare) and is checked against the wheels by `tests/layout.rs`.

/// A CUPTI release, as `(CUDA major, CUDA minor)`: `(11, 8)`, `(12, 9)`, `(13, 5)`.
pub type Release = (u8, u8);

/// The release a library is, from `cuptiGetVersion`'s value and the library's SONAME. Version 18
/// is shared by 11.8, 12.0 and 12.1, so the SONAME (`libcupti.so.11.8` vs `libcupti.so.12`)
/// decides. From 13.0 the value is `xxyyzz`. `None` for values no release reports (0, 19, 25...).
pub fn release_of_api_version(api: u32, soname: &str) -> Option<Release> {
    Some(match api {
        18 if soname.contains(".so.11") => (11, 8),
        18 => (12, 0),
        20 => (12, 2),
        21 => (12, 3),
        22 => (12, 4),
        23 => (12, 5),
        24 => (12, 6),
        26 => (12, 8),
        27 | 28 => (12, 9),
        v if (130_000..1_000_000).contains(&v) => ((v / 10_000) as u8, ((v / 100) % 100) as u8),
        _ => return None,
    })
}

/// Expands `$m!(Struct)` with the record struct release `$release` (a [`Release`]) writes for one
/// family: `kernel`, `memcpy`, `memcpy_p2p`, `memset`, `api`, `sync`, `memory`, `memory_pool`,
/// `external_correlation`, `overhead`, `marker`, `device`, `context` or `cuda_event`.
///
/// ```
/// use kinetrace_cupti_sys::with_record_struct;
/// macro_rules! size { ($t:ty) => { core::mem::size_of::<$t>() }; }
/// assert_eq!(with_record_struct!(kernel, (12, 9), size), 208);
/// assert_eq!(with_record_struct!(kernel, (13, 5), size), 248);
/// ```
#[macro_export]
macro_rules! with_record_struct {
    (kernel, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 4) {
            $m!($crate::v13::CUpti_ActivityKernel13)
        } else if r >= (13, 3) {
            $m!($crate::v13::CUpti_ActivityKernel12)
        } else if r >= (13, 1) {
            $m!($crate::v13::CUpti_ActivityKernel11)
        } else if r >= (13, 0) {
            $m!($crate::v13::CUpti_ActivityKernel10)
        } else if r >= (12, 0) {
            $m!($crate::v12::CUpti_ActivityKernel9)
        } else {
            $m!($crate::v12::CUpti_ActivityKernel8)
        }
    }};
    (memcpy, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 4) {
            $m!($crate::v13::CUpti_ActivityMemcpy7)
        } else if r >= (12, 8) {
            $m!($crate::v12::CUpti_ActivityMemcpy6)
        } else {
            $m!($crate::v12::CUpti_ActivityMemcpy5)
        }
    }};
    (memcpy_p2p, $release:expr, $m:ident) => {{
        let _: $crate::layouts::Release = $release;
        $m!($crate::v12::CUpti_ActivityMemcpyPtoP4)
    }};
    (memset, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 4) {
            $m!($crate::v13::CUpti_ActivityMemset5)
        } else {
            $m!($crate::v12::CUpti_ActivityMemset4)
        }
    }};
    (api, $release:expr, $m:ident) => {{
        let _: $crate::layouts::Release = $release;
        $m!($crate::v12::CUpti_ActivityAPI)
    }};
    (sync, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (12, 8) {
            $m!($crate::v12::CUpti_ActivitySynchronization2)
        } else {
            $m!($crate::v12::CUpti_ActivitySynchronization)
        }
    }};
    (memory, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (12, 6) {
            $m!($crate::v12::CUpti_ActivityMemory4)
        } else {
            $m!($crate::v12::CUpti_ActivityMemory3)
        }
    }};
    (memory_pool, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 0) {
            $m!($crate::v13::CUpti_ActivityMemoryPool3)
        } else {
            $m!($crate::v12::CUpti_ActivityMemoryPool2)
        }
    }};
    (external_correlation, $release:expr, $m:ident) => {{
        let _: $crate::layouts::Release = $release;
        $m!($crate::v12::CUpti_ActivityExternalCorrelation)
    }};
    (overhead, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (12, 4) {
            $m!($crate::v12::CUpti_ActivityOverhead3)
        } else if r >= (12, 3) {
            $m!($crate::v12::CUpti_ActivityOverhead2)
        } else {
            $m!($crate::v12::CUpti_ActivityOverhead)
        }
    }};
    (marker, $release:expr, $m:ident) => {{
        let _: $crate::layouts::Release = $release;
        $m!($crate::v12::CUpti_ActivityMarker2)
    }};
    (device, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 2) {
            $m!($crate::v13::CUpti_ActivityDevice6)
        } else if r >= (12, 2) {
            $m!($crate::v12::CUpti_ActivityDevice5)
        } else {
            $m!($crate::v12::CUpti_ActivityDevice4)
        }
    }};
    (context, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 1) {
            $m!($crate::v13::CUpti_ActivityContext4)
        } else if r >= (12, 5) {
            $m!($crate::v12::CUpti_ActivityContext3)
        } else if r >= (12, 4) {
            $m!($crate::v12::CUpti_ActivityContext2)
        } else {
            $m!($crate::v12::CUpti_ActivityContext)
        }
    }};
    (cuda_event, $release:expr, $m:ident) => {{
        let r: $crate::layouts::Release = $release;
        if r >= (13, 5) {
            $m!($crate::v13::CUpti_ActivityCudaEvent3)
        } else if r >= (12, 8) {
            $m!($crate::v12::CUpti_ActivityCudaEvent2)
        } else {
            $m!($crate::v12::CUpti_ActivityCudaEvent)
        }
    }};
}

/// A record family: the kinds that share one struct line (kernel and concurrent kernel; runtime
/// and driver API).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Family {
    Kernel,
    Memcpy,
    MemcpyP2p,
    Memset,
    Api,
    Sync,
    Memory,
    MemoryPool,
    ExternalCorrelation,
    Overhead,
    Marker,
    Device,
    Context,
    CudaEvent,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 14] = [
        Family::Kernel,
        Family::Memcpy,
        Family::MemcpyP2p,
        Family::Memset,
        Family::Api,
        Family::Sync,
        Family::Memory,
        Family::MemoryPool,
        Family::ExternalCorrelation,
        Family::Overhead,
        Family::Marker,
        Family::Device,
        Family::Context,
        Family::CudaEvent,
    ];

    /// The family of a `CUPTI_ACTIVITY_KIND_*` value, or `None` for kinds kinetrace does not read.
    #[inline]
    pub fn of_kind(kind: u32) -> Option<Family> {
        use crate::v13::*;
        Some(match kind {
            CUPTI_ACTIVITY_KIND_KERNEL | CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => Family::Kernel,
            CUPTI_ACTIVITY_KIND_MEMCPY => Family::Memcpy,
            CUPTI_ACTIVITY_KIND_MEMCPY2 => Family::MemcpyP2p,
            CUPTI_ACTIVITY_KIND_MEMSET => Family::Memset,
            CUPTI_ACTIVITY_KIND_RUNTIME | CUPTI_ACTIVITY_KIND_DRIVER => Family::Api,
            CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => Family::Sync,
            CUPTI_ACTIVITY_KIND_MEMORY2 => Family::Memory,
            CUPTI_ACTIVITY_KIND_MEMORY_POOL => Family::MemoryPool,
            CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => Family::ExternalCorrelation,
            CUPTI_ACTIVITY_KIND_OVERHEAD => Family::Overhead,
            CUPTI_ACTIVITY_KIND_MARKER => Family::Marker,
            CUPTI_ACTIVITY_KIND_DEVICE => Family::Device,
            CUPTI_ACTIVITY_KIND_CONTEXT => Family::Context,
            CUPTI_ACTIVITY_KIND_CUDA_EVENT => Family::CudaEvent,
            _ => return None,
        })
    }
}

/// The size in bytes of the records of `family` that `release` writes.
pub fn record_size(family: Family, release: Release) -> usize {
    macro_rules! size {
        ($t:ty) => {
            core::mem::size_of::<$t>()
        };
    }
    match family {
        Family::Kernel => with_record_struct!(kernel, release, size),
        Family::Memcpy => with_record_struct!(memcpy, release, size),
        Family::MemcpyP2p => with_record_struct!(memcpy_p2p, release, size),
        Family::Memset => with_record_struct!(memset, release, size),
        Family::Api => with_record_struct!(api, release, size),
        Family::Sync => with_record_struct!(sync, release, size),
        Family::Memory => with_record_struct!(memory, release, size),
        Family::MemoryPool => with_record_struct!(memory_pool, release, size),
        Family::ExternalCorrelation => with_record_struct!(external_correlation, release, size),
        Family::Overhead => with_record_struct!(overhead, release, size),
        Family::Marker => with_record_struct!(marker, release, size),
        Family::Device => with_record_struct!(device, release, size),
        Family::Context => with_record_struct!(context, release, size),
        Family::CudaEvent => with_record_struct!(cuda_event, release, size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_map_to_releases() {
        assert_eq!(
            release_of_api_version(18, "libcupti.so.11.8"),
            Some((11, 8))
        );
        assert_eq!(release_of_api_version(18, "libcupti.so.12"), Some((12, 0)));
        assert_eq!(release_of_api_version(28, "libcupti.so.12"), Some((12, 9)));
        assert_eq!(
            release_of_api_version(130_202, "libcupti.so.13"),
            Some((13, 2))
        );
        assert_eq!(release_of_api_version(25, "libcupti.so.12"), None);
        assert_eq!(release_of_api_version(0, "libcupti.so.13"), None);
    }

    #[test]
    fn families_cover_every_kind_with_a_struct() {
        use crate::v13::*;
        assert_eq!(
            Family::of_kind(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
            Some(Family::Kernel)
        );
        assert_eq!(Family::of_kind(CUPTI_ACTIVITY_KIND_NAME), None);
        for f in Family::ALL {
            // Every family has a struct at least as large as the kind field for every release.
            for r in [(11, 8), (12, 9), (13, 5)] {
                assert!(record_size(f, r) >= 16, "{f:?} {r:?}");
            }
        }
        // The boundaries of the research table.
        assert_eq!(record_size(Family::Kernel, (11, 8)), 200);
        assert_eq!(record_size(Family::Kernel, (12, 0)), 208);
        assert_eq!(record_size(Family::Kernel, (13, 0)), 216);
        assert_eq!(record_size(Family::Kernel, (13, 1)), 224);
        assert_eq!(record_size(Family::Kernel, (13, 3)), 232);
        assert_eq!(record_size(Family::Kernel, (13, 4)), 248);
        assert_eq!(record_size(Family::CudaEvent, (13, 5)), 80);
        assert_eq!(record_size(Family::Context, (12, 4)), 24);
    }
}
