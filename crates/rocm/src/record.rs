//! The compact records the SDK's callbacks copy into the [`Queue`](crate::queue::Queue): what the
//! collector needs of each SDK record, as a fixed number of words (the SDK's own record memory is
//! only valid during the callback).

use kinetrace_rocprofiler_sdk_sys::{v0, v1, KernelDispatchRecord};

use crate::queue::{Words, WORDS};

/// One record copied out of a callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raw {
    /// A HIP runtime API call, from the callback-tracing ENTER/EXIT pair.
    Api {
        /// The SDK's operation number (resolved to a name through the SDK).
        operation: u32,
        /// `correlation_id.internal`.
        correlation: u64,
        /// The calling thread (system tid).
        tid: u32,
        /// ENTER, on the SDK's clock (CLOCK_BOOTTIME ns).
        start: u64,
        /// EXIT.
        end: u64,
        /// The kinetrace span open on the calling thread, 0 for none.
        external: u64,
    },
    /// A kernel dispatch (buffer tracing).
    Kernel {
        /// The launching call's id.
        correlation: u64,
        /// GPU start (CLOCK_BOOTTIME ns).
        start: u64,
        /// GPU end.
        end: u64,
        /// The GPU agent's handle.
        agent: u64,
        /// The HSA queue's handle.
        queue: u64,
        /// Key into the kernel-symbol map.
        kernel_id: u64,
        /// Work-items per work-group.
        workgroup: [u32; 3],
        /// Total work-items per dimension.
        grid: [u32; 3],
        /// LDS bytes per work-group.
        group_segment: u32,
    },
    /// A memory copy (buffer tracing).
    Copy {
        /// The enqueuing call's id.
        correlation: u64,
        /// The SDK's operation number (the direction, resolved by name).
        operation: u32,
        /// Start (CLOCK_BOOTTIME ns).
        start: u64,
        /// End.
        end: u64,
        /// Source agent handle.
        src_agent: u64,
        /// Destination agent handle.
        dst_agent: u64,
        /// Bytes copied.
        bytes: u64,
    },
    /// A memory allocation or free (buffer tracing, SDK 1.x).
    Memory {
        /// The allocating call's id.
        correlation: u64,
        /// The SDK's operation number (allocate / free, resolved by name).
        operation: u32,
        /// The allocating thread.
        tid: u32,
        /// When (CLOCK_BOOTTIME ns).
        start: u64,
        /// The agent whose memory it is.
        agent: u64,
        /// The block's address.
        address: u64,
        /// The block's size.
        bytes: u64,
    },
}

const API: u64 = 1;
const KERNEL: u64 = 2;
const COPY: u64 = 3;
const MEMORY: u64 = 4;

fn pair(a: u32, b: u32) -> u64 {
    u64::from(a) | (u64::from(b) << 32)
}

fn split(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

impl Raw {
    /// What kinetrace keeps of a kernel-dispatch record (the same layout in both ABIs).
    pub fn of_dispatch(r: &KernelDispatchRecord) -> Raw {
        let d = &r.dispatch_info;
        Raw::Kernel {
            correlation: r.correlation_id.internal,
            start: r.start_timestamp,
            end: r.end_timestamp,
            agent: d.agent_id.handle,
            queue: d.queue_id.handle,
            kernel_id: d.kernel_id,
            workgroup: [d.workgroup_size.x, d.workgroup_size.y, d.workgroup_size.z],
            grid: [d.grid_size.x, d.grid_size.y, d.grid_size.z],
            group_segment: d.group_segment_size,
        }
    }

    /// What kinetrace keeps of a memory-copy record: the 0.x record is the prefix of the 1.x one
    /// (its correlation id is the 16-byte async one in both), so this reads both ABIs.
    pub fn of_copy(r: &v0::MemoryCopyRecord) -> Raw {
        Raw::Copy {
            correlation: r.correlation_id.internal,
            operation: r.operation,
            start: r.start_timestamp,
            end: r.end_timestamp,
            src_agent: r.src_agent_id.handle,
            dst_agent: r.dst_agent_id.handle,
            bytes: r.bytes,
        }
    }

    /// What kinetrace keeps of a 1.x memory-allocation record.
    pub fn of_allocation(r: &v1::MemoryAllocationRecord) -> Raw {
        Raw::Memory {
            correlation: r.correlation_id.internal,
            operation: r.operation,
            tid: r.thread_id as u32,
            start: r.start_timestamp,
            agent: r.agent_id.handle,
            address: r.address,
            bytes: r.allocation_size,
        }
    }

    /// The words of this record.
    pub fn to_words(&self) -> Words {
        let mut w = [0u64; WORDS];
        match *self {
            Raw::Api {
                operation,
                correlation,
                tid,
                start,
                end,
                external,
            } => {
                w[..6].copy_from_slice(&[
                    API,
                    pair(operation, tid),
                    correlation,
                    start,
                    end,
                    external,
                ]);
            }
            Raw::Kernel {
                correlation,
                start,
                end,
                agent,
                queue,
                kernel_id,
                workgroup,
                grid,
                group_segment,
            } => {
                w = [
                    KERNEL,
                    correlation,
                    start,
                    end,
                    agent,
                    queue,
                    kernel_id,
                    pair(workgroup[0], workgroup[1]),
                    pair(workgroup[2], grid[0]),
                    pair(grid[1], grid[2]),
                    u64::from(group_segment),
                    0,
                ];
            }
            Raw::Copy {
                correlation,
                operation,
                start,
                end,
                src_agent,
                dst_agent,
                bytes,
            } => {
                w[..8].copy_from_slice(&[
                    COPY,
                    correlation,
                    u64::from(operation),
                    start,
                    end,
                    src_agent,
                    dst_agent,
                    bytes,
                ]);
            }
            Raw::Memory {
                correlation,
                operation,
                tid,
                start,
                agent,
                address,
                bytes,
            } => {
                w[..7].copy_from_slice(&[
                    MEMORY,
                    correlation,
                    pair(operation, tid),
                    start,
                    agent,
                    address,
                    bytes,
                ]);
            }
        }
        w
    }

    /// The record of `w`, `None` for words no [`Raw::to_words`] wrote.
    pub fn from_words(w: &Words) -> Option<Raw> {
        Some(match w[0] {
            API => {
                let (operation, tid) = split(w[1]);
                Raw::Api {
                    operation,
                    correlation: w[2],
                    tid,
                    start: w[3],
                    end: w[4],
                    external: w[5],
                }
            }
            KERNEL => {
                let (wx, wy) = split(w[7]);
                let (wz, gx) = split(w[8]);
                let (gy, gz) = split(w[9]);
                Raw::Kernel {
                    correlation: w[1],
                    start: w[2],
                    end: w[3],
                    agent: w[4],
                    queue: w[5],
                    kernel_id: w[6],
                    workgroup: [wx, wy, wz],
                    grid: [gx, gy, gz],
                    group_segment: w[10] as u32,
                }
            }
            COPY => Raw::Copy {
                correlation: w[1],
                operation: w[2] as u32,
                start: w[3],
                end: w[4],
                src_agent: w[5],
                dst_agent: w[6],
                bytes: w[7],
            },
            MEMORY => {
                let (operation, tid) = split(w[2]);
                Raw::Memory {
                    correlation: w[1],
                    operation,
                    tid,
                    start: w[3],
                    agent: w[4],
                    address: w[5],
                    bytes: w[6],
                }
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let rs = [
            Raw::Api {
                operation: 214,
                correlation: 7,
                tid: 1234,
                start: 10,
                end: 20,
                external: 99,
            },
            Raw::Kernel {
                correlation: 7,
                start: 11,
                end: 19,
                agent: 0x200,
                queue: 0xdead,
                kernel_id: 3,
                workgroup: [256, 1, 2],
                grid: [4096, 3, u32::MAX],
                group_segment: 65536,
            },
            Raw::Copy {
                correlation: 8,
                operation: 2,
                start: 1,
                end: 2,
                src_agent: 0x100,
                dst_agent: 0x200,
                bytes: u64::MAX,
            },
            Raw::Memory {
                correlation: 9,
                operation: 3,
                tid: 77,
                start: 5,
                agent: 0x300,
                address: 0x7f00_0000_1000,
                bytes: 1 << 30,
            },
        ];
        for r in rs {
            assert_eq!(Raw::from_words(&r.to_words()), Some(r));
        }
        assert_eq!(Raw::from_words(&[0; WORDS]), None);
    }
}
