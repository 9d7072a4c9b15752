//! MARKER (NVTX ranges and instants, Marker2), OVERHEAD (Overhead prefix) and
//! EXTERNAL_CORRELATION records.

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::intern::NameId;
use kinetrace_core::UnixNanos;

use super::{base, Decoded, Decoder, Rec};

fn overhead_kind(v: u32) -> OverheadKind {
    match v {
        1 => OverheadKind::DriverCompiler,
        0x10000 => OverheadKind::BufferFlush,
        0x20000 => OverheadKind::Instrumentation,
        0x30000 => OverheadKind::Resource,
        0x40000 => OverheadKind::RuntimeTriggeredModuleLoading,
        0x50000 => OverheadKind::LazyFunctionLoading,
        0x60000 => OverheadKind::CommandBufferFull,
        0x70000 => OverheadKind::ActivityBufferRequest,
        _ => OverheadKind::Unknown,
    }
}

impl Decoder {
    #[inline]
    pub(super) fn external(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityExternalCorrelation>() {
            return Decoded::TooShort;
        }
        Decoded::External {
            kind: r.u32(off!(CUpti_ActivityExternalCorrelation.externalKind)),
            id: r.u64(off!(CUpti_ActivityExternalCorrelation.externalId)),
            correlation: r.u32(off!(CUpti_ActivityExternalCorrelation.correlationId)),
        }
    }

    #[inline]
    pub(super) fn overhead(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityOverhead>() {
            return Decoded::TooShort;
        }
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityOverhead.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityOverhead.end))),
            correlation: None,
            external_id: None,
            detail: Detail::Overhead(Overhead {
                kind: overhead_kind(r.u32(off!(CUpti_ActivityOverhead.overheadKind))),
            }),
        })
    }

    #[inline]
    pub(super) fn marker(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMarker2>() {
            return Decoded::TooShort;
        }
        let flags = r.u32(off!(CUpti_ActivityMarker2.flags));
        let ts = r.u64(off!(CUpti_ActivityMarker2.timestamp));
        let id = r.u32(off!(CUpti_ActivityMarker2.id));
        let object = off!(CUpti_ActivityMarker2.objectId);
        let (pid, tid) = (r.u32(object), r.u32(object + 4));
        let name = self
            .names
            .get(r.u64(off!(CUpti_ActivityMarker2.name)) as usize);
        let domain = self
            .names
            .get(r.u64(off!(CUpti_ActivityMarker2.domain)) as usize);
        let make = |start: u64, end: u64, name: NameId, domain, pid, tid| {
            Decoded::Activity(Activity {
                start: UnixNanos(start),
                end: UnixNanos(end),
                correlation: None,
                external_id: None,
                detail: Detail::Marker(Marker {
                    name,
                    domain,
                    pid,
                    tid,
                }),
            })
        };
        if flags & 1 != 0 {
            make(ts, ts, name.unwrap_or(self.unknown_name), domain, pid, tid)
        } else if flags & 2 != 0 {
            if self.open_markers.len() >= 65_536 {
                self.open_markers.clear();
            }
            self.open_markers.insert(
                id,
                (ts, name.unwrap_or(self.unknown_name), domain, pid, tid),
            );
            Decoded::Skipped
        } else if flags & 4 != 0 {
            match self.open_markers.remove(&id) {
                Some((start, name, domain, pid, tid)) => make(start, ts, name, domain, pid, tid),
                None => Decoded::Skipped,
            }
        } else {
            Decoded::Skipped
        }
    }
}
