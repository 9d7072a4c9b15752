//! MEMORY2 records (Memory3 prefix: allocations and frees) and MEMORY_POOL records (MemoryPool2
//! prefix: counted in [`PoolStats`], the record model has no pool events).

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::UnixNanos;

use super::{base, memory_kind, nonzero_u32, Decoded, Decoder, Rec, MAP_MAX};

/// What MEMORY_POOL records said. kinetrace's record model has no event for a pool being created,
/// trimmed or destroyed (its `Memory` events are allocations and frees of blocks, which MEMORY2
/// reports), so pool records are summarised in the trace metadata instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// MEMORY_POOL records read.
    pub records: u64,
    /// Pools created.
    pub created: u64,
    /// Pools destroyed.
    pub destroyed: u64,
    /// Pools trimmed.
    pub trimmed: u64,
    /// Pools alive after the last record (created and not destroyed), as far as records show.
    pub live: u64,
    /// Their size in bytes after the last record.
    pub live_bytes: u64,
    /// The largest `live_bytes` seen.
    pub peak_bytes: u64,
}

impl Decoder {
    #[inline]
    pub(super) fn memory(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityMemory3>() {
            return Decoded::TooShort;
        }
        let op = match r.u32(off!(CUpti_ActivityMemory3.memoryOperationType)) {
            1 => MemoryOp::Alloc,
            2 => MemoryOp::Free,
            _ => return Decoded::Skipped,
        };
        let kind = memory_kind(r.u32(off!(CUpti_ActivityMemory3.memoryKind)));
        let on_device = matches!(
            kind,
            MemoryKind::Device | MemoryKind::DeviceStatic | MemoryKind::Array
        );
        let ts = UnixNanos(r.u64(off!(CUpti_ActivityMemory3.timestamp)));
        let pid = r.u32(off!(CUpti_ActivityMemory3.processId));
        Decoded::Activity(Activity {
            start: ts,
            end: ts,
            correlation: nonzero_u32(r.u32(off!(CUpti_ActivityMemory3.correlationId)))
                .map(u64::from),
            external_id: None,
            detail: Detail::Memory(Memory {
                op,
                device: on_device.then(|| r.u32(off!(CUpti_ActivityMemory3.deviceId))),
                address: r.u64(off!(CUpti_ActivityMemory3.address)),
                bytes: r.u64(off!(CUpti_ActivityMemory3.bytes)),
                total_allocated: None,
                total_reserved: None,
                pid,
                // CUPTI does not say which thread allocated.
                tid: 0,
            }),
        })
    }

    #[inline]
    pub(super) fn memory_pool(&mut self, r: Rec<'_>) -> Decoded {
        type P = base::CUpti_ActivityMemoryPool2;
        if r.0.len() < size_of::<P>() {
            return Decoded::TooShort;
        }
        let op = r.u32(off!(CUpti_ActivityMemoryPool2.memoryPoolOperationType));
        let device = r.u32(off!(CUpti_ActivityMemoryPool2.deviceId));
        let address = r.u64(off!(CUpti_ActivityMemoryPool2.address));
        let size = r.u64(off!(CUpti_ActivityMemoryPool2.size));
        let p = &mut self.pool_stats;
        p.records += 1;
        match op {
            1 => p.created += 1,
            2 => p.destroyed += 1,
            3 => p.trimmed += 1,
            _ => {}
        }
        match op {
            1 | 3 => {
                if self.pools.len() >= MAP_MAX && !self.pools.contains_key(&address) {
                    self.pools.clear();
                }
                self.pools.insert(address, (device, size));
            }
            2 => {
                self.pools.remove(&address);
            }
            _ => {}
        }
        p.live = self.pools.len() as u64;
        p.live_bytes = self.pools.values().map(|(_, s)| *s).sum();
        p.peak_bytes = p.peak_bytes.max(p.live_bytes);
        Decoded::MemoryPool { op, device, size }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{bytes, decoder};
    use super::super::*;
    use crate::kinds;
    use crate::version::Release;
    use kinetrace_cupti_sys::{v12, v13};

    #[test]
    fn memory_pool_records_are_counted_in_both_layouts() {
        macro_rules! pool {
            ($t:ty, $op:expr, $addr:expr, $size:expr) => {{
                let mut p: $t = Default::default();
                p.kind = kinds::MEMORY_POOL;
                p.memoryPoolOperationType = $op;
                p.deviceId = 1;
                p.address = $addr;
                p.size = $size;
                bytes(&p)
            }};
        }
        for release in [Release::V12_9, Release::V13_0] {
            let mut d = decoder(release);
            let recs = if release < Release::V13_0 {
                vec![
                    pool!(v12::CUpti_ActivityMemoryPool2, 1, 0x1000, 4096),
                    pool!(v12::CUpti_ActivityMemoryPool2, 1, 0x9000, 8192),
                    pool!(v12::CUpti_ActivityMemoryPool2, 3, 0x9000, 1024),
                    pool!(v12::CUpti_ActivityMemoryPool2, 2, 0x1000, 0),
                ]
            } else {
                vec![
                    pool!(v13::CUpti_ActivityMemoryPool3, 1, 0x1000, 4096),
                    pool!(v13::CUpti_ActivityMemoryPool3, 1, 0x9000, 8192),
                    pool!(v13::CUpti_ActivityMemoryPool3, 3, 0x9000, 1024),
                    pool!(v13::CUpti_ActivityMemoryPool3, 2, 0x1000, 0),
                ]
            };
            assert_eq!(
                d.decode(&recs[0]),
                Decoded::MemoryPool {
                    op: 1,
                    device: 1,
                    size: 4096
                }
            );
            for r in &recs[1..] {
                assert!(matches!(d.decode(r), Decoded::MemoryPool { .. }));
            }
            assert_eq!(
                d.pool_stats(),
                PoolStats {
                    records: 4,
                    created: 2,
                    destroyed: 1,
                    trimmed: 1,
                    live: 1,
                    live_bytes: 1024,
                    peak_bytes: 12288,
                },
                "{release}"
            );
            assert_eq!(d.stats().size_mismatch, 0, "{release}");
            assert_eq!(d.stats().unknown_kind, 0);
            assert_eq!(d.decode(&recs[0][..64]), Decoded::TooShort);
        }
    }
}
