//! KERNEL / CONCURRENT_KERNEL records (Kernel8 prefix, the same in Kernel9 – Kernel13).

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::UnixNanos;

use super::{base, nonzero_u32, Decoded, Decoder, Rec};

impl Decoder {
    #[inline]
    pub(super) fn kernel(&mut self, r: Rec<'_>) -> Decoded {
        type K = base::CUpti_ActivityKernel8;
        if r.0.len() < size_of::<K>() {
            return Decoded::TooShort;
        }
        let start = r.u64(off!(CUpti_ActivityKernel8.start));
        let end = r.u64(off!(CUpti_ActivityKernel8.end));
        if start == 0 && end == 0 {
            self.stats.kernels_without_timestamps += 1;
        }
        let device = r.u32(off!(CUpti_ActivityKernel8.deviceId));
        let context = r.u32(off!(CUpti_ActivityKernel8.contextId));
        self.learn_context(context, device);
        let name = self
            .names
            .get(r.u64(off!(CUpti_ActivityKernel8.name)) as usize)
            .unwrap_or(self.unknown_name);
        let dim = |o: usize| r.u32(o);
        let queued = r.u64(off!(CUpti_ActivityKernel8.queued));
        let shared = r.u32(off!(CUpti_ActivityKernel8.staticSharedMemory)) as i32 as i64
            + r.u32(off!(CUpti_ActivityKernel8.dynamicSharedMemory)) as i32 as i64;
        Decoded::Activity(Activity {
            start: UnixNanos(start),
            end: UnixNanos(end),
            correlation: Some(r.u32(off!(CUpti_ActivityKernel8.correlationId)) as u64),
            external_id: None,
            detail: Detail::Kernel(Kernel {
                name,
                device,
                context: Some(context),
                stream: r.u32(off!(CUpti_ActivityKernel8.streamId)),
                grid: Some([
                    dim(off!(CUpti_ActivityKernel8.gridX)),
                    dim(off!(CUpti_ActivityKernel8.gridY)),
                    dim(off!(CUpti_ActivityKernel8.gridZ)),
                ]),
                block: Some([
                    dim(off!(CUpti_ActivityKernel8.blockX)),
                    dim(off!(CUpti_ActivityKernel8.blockY)),
                    dim(off!(CUpti_ActivityKernel8.blockZ)),
                ]),
                registers_per_thread: Some(
                    r.u16(off!(CUpti_ActivityKernel8.registersPerThread)) as u32
                ),
                shared_memory: Some(shared.max(0) as u64),
                // CUPTI_TIMESTAMP_UNKNOWN (0) unless latency timestamps are on.
                queued: (queued != 0).then_some(UnixNanos(queued)),
                graph_id: nonzero_u32(r.u32(off!(CUpti_ActivityKernel8.graphId))),
                kind_arg: false,
                graph_node_id: {
                    let n = r.u64(off!(CUpti_ActivityKernel8.graphNodeId));
                    (n != 0).then_some(n)
                },
            }),
        })
    }
}
