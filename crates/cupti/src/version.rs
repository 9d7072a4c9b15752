//! Which CUPTI release is loaded, and what record layouts it writes.
//!
//! CUPTI always writes its own newest struct for each kind; the client cannot choose. Every record
//! type is prefix-stable from 11.8 to 13.5 (checked against every wheel by the layout test in
//! `kinetrace-cupti-sys`), so the decoders read the 11.8 prefix and the release only decides record
//! sizes (for the size cross-check and for synthesising buffers).

use std::fmt;

use kinetrace_cupti_sys::layouts::{record_size, release_of_api_version, Family};

/// A CUPTI library release, as far as record layouts are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    /// CUDA major version (11, 12, 13).
    pub major: u8,
    /// CUDA minor version.
    pub minor: u8,
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The newest release whose layouts this build knows. Newer libraries are read with these layouts
/// (their records only append fields).
pub const NEWEST_KNOWN: Release = Release {
    major: 13,
    minor: 5,
};

impl Release {
    /// CUPTI 11.8.
    pub const V11_8: Release = Release {
        major: 11,
        minor: 8,
    };
    /// CUPTI 12.9.
    pub const V12_9: Release = Release {
        major: 12,
        minor: 9,
    };
    /// CUPTI 13.0.
    pub const V13_0: Release = Release {
        major: 13,
        minor: 0,
    };
    /// CUPTI 13.5.
    pub const V13_5: Release = Release {
        major: 13,
        minor: 5,
    };

    /// The release from `cuptiGetVersion`'s value and the library's SONAME. Version 18 is shared by
    /// 11.8, 12.0 and 12.1, so the SONAME (`libcupti.so.11.8` vs `libcupti.so.12`) decides.
    /// `None` for values no release reports. (The mapping is `kinetrace-cupti-sys`'s
    /// [`release_of_api_version`], shared with the test fake.)
    pub fn from_api_version(api: u32, soname: &str) -> Option<Release> {
        release_of_api_version(api, soname).map(|(major, minor)| Release { major, minor })
    }

    /// Record sizes this release writes, from `kinetrace-cupti-sys`'s release → struct table
    /// ([`record_size`]).
    pub fn layout(self) -> Layout {
        let size = |family| record_size(family, (self.major, self.minor));
        Layout {
            release: self,
            kernel: size(Family::Kernel),
            memcpy: size(Family::Memcpy),
            memcpy_p2p: size(Family::MemcpyP2p),
            memset: size(Family::Memset),
            api: size(Family::Api),
            sync: size(Family::Sync),
            memory: size(Family::Memory),
            memory_pool: size(Family::MemoryPool),
            external_correlation: size(Family::ExternalCorrelation),
            overhead: size(Family::Overhead),
            marker: size(Family::Marker),
            device: size(Family::Device),
            context: size(Family::Context),
            cuda_event: size(Family::CudaEvent),
        }
    }
}

/// The size in bytes of each record kind one release writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Layout {
    pub release: Release,
    pub kernel: usize,
    pub memcpy: usize,
    pub memcpy_p2p: usize,
    pub memset: usize,
    pub api: usize,
    pub sync: usize,
    pub memory: usize,
    pub memory_pool: usize,
    pub external_correlation: usize,
    pub overhead: usize,
    pub marker: usize,
    pub device: usize,
    pub context: usize,
    pub cuda_event: usize,
}

impl Layout {
    /// The size of a record of `kind` (a `CUPTI_ACTIVITY_KIND_*` value), or `None` for kinds
    /// kinetrace does not read.
    #[inline]
    pub fn size_of_kind(&self, kind: u32) -> Option<usize> {
        Some(match Family::of_kind(kind)? {
            Family::Kernel => self.kernel,
            Family::Memcpy => self.memcpy,
            Family::MemcpyP2p => self.memcpy_p2p,
            Family::Memset => self.memset,
            Family::Api => self.api,
            Family::Sync => self.sync,
            Family::Memory => self.memory,
            Family::MemoryPool => self.memory_pool,
            Family::ExternalCorrelation => self.external_correlation,
            Family::Overhead => self.overhead,
            Family::Marker => self.marker,
            Family::Device => self.device,
            Family::Context => self.context,
            Family::CudaEvent => self.cuda_event,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_releases() {
        assert_eq!(
            Release::from_api_version(18, "libcupti.so.11.8"),
            Some(Release::V11_8)
        );
        assert_eq!(
            Release::from_api_version(18, "libcupti.so.12"),
            Some(Release {
                major: 12,
                minor: 0
            })
        );
        assert_eq!(
            Release::from_api_version(28, "libcupti.so.12"),
            Some(Release::V12_9)
        );
        assert_eq!(
            Release::from_api_version(130001, "libcupti.so.13"),
            Some(Release::V13_0)
        );
        assert_eq!(
            Release::from_api_version(130101, "libcupti.so.13"),
            Some(Release {
                major: 13,
                minor: 1
            })
        );
        assert_eq!(
            Release::from_api_version(130500, "libcupti.so.13"),
            Some(Release::V13_5)
        );
        assert_eq!(Release::from_api_version(25, "libcupti.so.12"), None);
        assert_eq!(Release::from_api_version(0, "libcupti.so.13"), None);
    }

    #[test]
    fn intermediate_12_x_releases_follow_the_research_table() {
        // (cuptiGetVersion, kernel, memcpy, sync, memory2, overhead, device, context, cuda_event)
        // from the research notes' §1.2/§1.4 (structs each 12.x wheel writes).
        let rows = [
            (18, 208, 88, 40, 120, 40, 176, 16, 24), // 12.0 / 12.1 (libcupti.so.12)
            (20, 208, 88, 40, 120, 40, 184, 16, 24), // 12.2: Device5
            (21, 208, 88, 40, 120, 48, 184, 16, 24), // 12.3: Overhead2
            (22, 208, 88, 40, 120, 56, 184, 24, 24), // 12.4: Overhead3, Context2
            (23, 208, 88, 40, 120, 56, 184, 32, 24), // 12.5: Context3
            (24, 208, 88, 40, 128, 56, 184, 32, 24), // 12.6: Memory4
            (26, 208, 96, 56, 128, 56, 184, 32, 56), // 12.8: Memcpy6, Synchronization2, CudaEvent2
            (28, 208, 96, 56, 128, 56, 184, 32, 56), // 12.9
        ];
        for (v, kernel, memcpy, sync, memory, overhead, device, context, event) in rows {
            let l = Release::from_api_version(v, "libcupti.so.12")
                .unwrap()
                .layout();
            assert_eq!(
                (
                    l.kernel,
                    l.memcpy,
                    l.sync,
                    l.memory,
                    l.overhead,
                    l.device,
                    l.context,
                    l.cuda_event
                ),
                (kernel, memcpy, sync, memory, overhead, device, context, event),
                "cuptiGetVersion {v}"
            );
            assert_eq!((l.memset, l.memory_pool), (88, 72), "cuptiGetVersion {v}");
        }
        let l = Release::V11_8.layout();
        assert_eq!((l.device, l.context, l.cuda_event), (176, 16, 24));
        let l = Release::from_api_version(130101, "libcupti.so.13")
            .unwrap()
            .layout();
        assert_eq!((l.device, l.context, l.cuda_event), (184, 40, 56));
        let l = Release::from_api_version(130202, "libcupti.so.13")
            .unwrap()
            .layout();
        assert_eq!((l.kernel, l.device, l.context), (224, 192, 40));
    }

    #[test]
    fn sizes_follow_the_research_table() {
        let l = Release::V11_8.layout();
        assert_eq!(
            (l.kernel, l.memcpy, l.memset, l.sync, l.memory, l.overhead),
            (200, 88, 88, 40, 120, 40)
        );
        let l = Release::V12_9.layout();
        assert_eq!(
            (
                l.kernel,
                l.memcpy,
                l.memset,
                l.sync,
                l.memory,
                l.memory_pool
            ),
            (208, 96, 88, 56, 128, 72)
        );
        let l = Release::V13_0.layout();
        assert_eq!((l.kernel, l.memcpy, l.memory_pool), (216, 96, 80));
        let l = Release {
            major: 13,
            minor: 3,
        }
        .layout();
        assert_eq!(l.kernel, 232);
        let l = Release::V13_5.layout();
        assert_eq!(
            (l.kernel, l.memcpy, l.memset, l.overhead),
            (248, 112, 104, 56)
        );
        assert_eq!(
            (l.api, l.memcpy_p2p, l.external_correlation, l.marker),
            (40, 96, 24, 56)
        );
        assert_eq!((l.device, l.context, l.cuda_event), (192, 40, 80));
        // A release newer than this build is read with the newest layout we know.
        assert_eq!(
            Release {
                major: 13,
                minor: 9
            }
            .layout()
            .kernel,
            248
        );
    }
}
