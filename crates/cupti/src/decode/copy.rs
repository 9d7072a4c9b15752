//! MEMCPY (Memcpy5 prefix), MEMCPY2 (peer-to-peer, MemcpyPtoP4) and MEMSET (Memset4 prefix) records.

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::UnixNanos;

use super::{base, memory_kind, Decoded, Decoder, Rec};

fn memcpy_kind(v: u8) -> MemcpyKind {
    match v {
        1 => MemcpyKind::HtoD,
        2 => MemcpyKind::DtoH,
        3 => MemcpyKind::HtoA,
        4 => MemcpyKind::AtoH,
        5 => MemcpyKind::AtoA,
        6 => MemcpyKind::AtoD,
        7 => MemcpyKind::DtoA,
        8 => MemcpyKind::DtoD,
        9 => MemcpyKind::HtoH,
        10 => MemcpyKind::PtoP,
        _ => MemcpyKind::Unknown,
    }
}

impl Decoder {
    #[inline]
    pub(super) fn memcpy(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemcpy5>() {
            return Decoded::TooShort;
        }
        let device = r.u32(off!(CUpti_ActivityMemcpy5.deviceId));
        let context = r.u32(off!(CUpti_ActivityMemcpy5.contextId));
        self.learn_context(context, device);
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityMemcpy5.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityMemcpy5.end))),
            correlation: Some(r.u32(off!(CUpti_ActivityMemcpy5.correlationId)) as u64),
            external_id: None,
            detail: Detail::Memcpy(Memcpy {
                kind: memcpy_kind(r.u8(off!(CUpti_ActivityMemcpy5.copyKind))),
                src_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpy5.srcKind)) as u32),
                dst_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpy5.dstKind)) as u32),
                bytes: r.u64(off!(CUpti_ActivityMemcpy5.bytes)),
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityMemcpy5.streamId)),
                kind_arg: false,
                peer: None,
            }),
        })
    }

    #[inline]
    pub(super) fn memcpy_p2p(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemcpyPtoP4>() {
            return Decoded::TooShort;
        }
        let device = r.u32(off!(CUpti_ActivityMemcpyPtoP4.deviceId));
        let context = r.u32(off!(CUpti_ActivityMemcpyPtoP4.contextId));
        self.learn_context(context, device);
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityMemcpyPtoP4.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityMemcpyPtoP4.end))),
            // Note: correlationId is at 60 here, not 44 as in Memcpy.
            correlation: Some(r.u32(off!(CUpti_ActivityMemcpyPtoP4.correlationId)) as u64),
            external_id: None,
            detail: Detail::Memcpy(Memcpy {
                kind: memcpy_kind(r.u8(off!(CUpti_ActivityMemcpyPtoP4.copyKind))),
                src_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpyPtoP4.srcKind)) as u32),
                dst_kind: memory_kind(r.u8(off!(CUpti_ActivityMemcpyPtoP4.dstKind)) as u32),
                bytes: r.u64(off!(CUpti_ActivityMemcpyPtoP4.bytes)),
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityMemcpyPtoP4.streamId)),
                kind_arg: false,
                peer: Some(PeerCopy {
                    src_device: r.u32(off!(CUpti_ActivityMemcpyPtoP4.srcDeviceId)),
                    dst_device: r.u32(off!(CUpti_ActivityMemcpyPtoP4.dstDeviceId)),
                    src_context: Some(r.u32(off!(CUpti_ActivityMemcpyPtoP4.srcContextId))),
                    dst_context: Some(r.u32(off!(CUpti_ActivityMemcpyPtoP4.dstContextId))),
                }),
            }),
        })
    }

    #[inline]
    pub(super) fn memset(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemset4>() {
            return Decoded::TooShort;
        }
        let device = r.u32(off!(CUpti_ActivityMemset4.deviceId));
        let context = r.u32(off!(CUpti_ActivityMemset4.contextId));
        self.learn_context(context, device);
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityMemset4.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityMemset4.end))),
            correlation: Some(r.u32(off!(CUpti_ActivityMemset4.correlationId)) as u64),
            external_id: None,
            detail: Detail::Memset(Memset {
                memory_kind: memory_kind(r.u16(off!(CUpti_ActivityMemset4.memoryKind)) as u32),
                bytes: r.u64(off!(CUpti_ActivityMemset4.bytes)),
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityMemset4.streamId)),
            }),
        })
    }
}
