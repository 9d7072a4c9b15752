//! The compact records the SDK's callbacks copy into the [`Queue`](crate::queue::Queue): what the
//! collector needs of each SDK record, as a fixed number of words (the SDK's own record memory is
//! only valid during the callback).

use kinetrace_rocprofiler_sdk_sys::{v0, v1, KernelDispatchRecord};

use crate::queue::{Words, WORDS};

/// Which argument struct of the HIP API payload an operation has (`sys::hip_args`), from its name;
/// `None` for calls whose arguments Kineto does not write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ArgLayout {
    /// `hipLaunchKernel`, `hipExtLaunchKernel`.
    LaunchKernel = 1,
    /// `hipModuleLaunchKernel`.
    ModuleLaunchKernel = 2,
    /// `hipExtModuleLaunchKernel`, `hipHccModuleLaunchKernel`.
    ExtModuleLaunchKernel = 3,
    /// `hipMemcpy`.
    Memcpy = 4,
    /// `hipMemcpyAsync`, `hipMemcpyWithStream`.
    MemcpyStream = 5,
    /// `hipMalloc`.
    Malloc = 6,
    /// `hipFree`.
    Free = 7,
    /// `hipMemset`, `hipMemsetD8`: `(dst, value, bytes)`.
    Memset = 8,
    /// `hipMemsetD16`: a count of 2-byte elements.
    MemsetD16 = 9,
    /// `hipMemsetD32`: a count of 4-byte elements.
    MemsetD32 = 10,
    /// `hipMemsetAsync`, `hipMemsetD8Async`: with a stream.
    MemsetAsync = 11,
    /// `hipMemsetD16Async`.
    MemsetD16Async = 12,
    /// `hipMemsetD32Async`.
    MemsetD32Async = 13,
}

impl ArgLayout {
    /// The layout of the HIP call `name`.
    pub fn of_name(name: &str) -> Option<ArgLayout> {
        Some(match name {
            "hipLaunchKernel" | "hipExtLaunchKernel" => ArgLayout::LaunchKernel,
            "hipModuleLaunchKernel" => ArgLayout::ModuleLaunchKernel,
            "hipExtModuleLaunchKernel" | "hipHccModuleLaunchKernel" => {
                ArgLayout::ExtModuleLaunchKernel
            }
            "hipMemcpy" => ArgLayout::Memcpy,
            "hipMemcpyAsync" | "hipMemcpyWithStream" => ArgLayout::MemcpyStream,
            "hipMalloc" => ArgLayout::Malloc,
            "hipFree" => ArgLayout::Free,
            "hipMemset" | "hipMemsetD8" => ArgLayout::Memset,
            "hipMemsetD16" => ArgLayout::MemsetD16,
            "hipMemsetD32" => ArgLayout::MemsetD32,
            "hipMemsetAsync" | "hipMemsetD8Async" => ArgLayout::MemsetAsync,
            "hipMemsetD16Async" => ArgLayout::MemsetD16Async,
            "hipMemsetD32Async" => ArgLayout::MemsetD32Async,
            _ => return None,
        })
    }

    /// The layout stored as `u8` by [`ArgLayout::of_name`]'s table (0: none).
    pub fn from_u8(v: u8) -> Option<ArgLayout> {
        Some(match v {
            1 => ArgLayout::LaunchKernel,
            2 => ArgLayout::ModuleLaunchKernel,
            3 => ArgLayout::ExtModuleLaunchKernel,
            4 => ArgLayout::Memcpy,
            5 => ArgLayout::MemcpyStream,
            6 => ArgLayout::Malloc,
            7 => ArgLayout::Free,
            8 => ArgLayout::Memset,
            9 => ArgLayout::MemsetD16,
            10 => ArgLayout::MemsetD32,
            11 => ArgLayout::MemsetAsync,
            12 => ArgLayout::MemsetD16Async,
            13 => ArgLayout::MemsetD32Async,
            _ => return None,
        })
    }
}

/// What a HIP call's payload said that the trace shows (read in the API callback).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RawArgs {
    /// Nothing read.
    #[default]
    None,
    /// A kernel launch.
    Launch {
        /// The launched function (host address or `hipFunction_t`).
        function: u64,
        /// The `hipStream_t`.
        stream: u64,
        /// The grid as given.
        grid: [u32; 3],
        /// The block as given.
        block: [u32; 3],
        /// Dynamic LDS bytes.
        shared: u32,
    },
    /// A copy.
    Copy {
        /// The `hipStream_t`, if the call takes one.
        stream: Option<u64>,
        /// Source address.
        src: u64,
        /// Destination address.
        dst: u64,
        /// Bytes.
        size: u64,
        /// `hipMemcpyKind`.
        kind: u32,
    },
    /// `hipMalloc` (with `size`) or `hipFree`.
    Malloc {
        /// The block.
        ptr: u64,
        /// Bytes asked for (hipMalloc).
        size: Option<u64>,
    },
    /// A memset: what its ROCclr fill kernels write.
    Fill {
        /// The `hipStream_t`, if the call takes one.
        stream: Option<u64>,
        /// Destination address.
        dst: u64,
        /// Bytes set (the count times the element size).
        bytes: u64,
    },
}

impl RawArgs {
    /// The stream the call's GPU work runs on, if it names one.
    pub fn stream(&self) -> Option<u64> {
        match *self {
            RawArgs::Launch { stream, .. } => Some(stream),
            RawArgs::Copy { stream, .. } | RawArgs::Fill { stream, .. } => stream,
            _ => None,
        }
    }

    /// The bytes a memset sets, for memsets.
    pub fn fill_bytes(&self) -> Option<u64> {
        match *self {
            RawArgs::Fill { bytes, .. } => Some(bytes),
            _ => None,
        }
    }

    /// The launched function, for launches.
    pub fn function(&self) -> Option<u64> {
        match *self {
            RawArgs::Launch { function, .. } => Some(function),
            _ => None,
        }
    }
}

/// A HIP runtime API call, from the callback-tracing ENTER/EXIT pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiRec {
    /// The SDK's operation number (resolved to a name through the SDK).
    pub operation: u32,
    /// `correlation_id.internal`.
    pub correlation: u64,
    /// The calling thread (system tid).
    pub tid: u32,
    /// ENTER, on the SDK's clock (CLOCK_BOOTTIME ns).
    pub start: u64,
    /// EXIT.
    pub end: u64,
    /// The kinetrace span open on the calling thread, 0 for none.
    pub external: u64,
    /// What the payload said.
    pub args: RawArgs,
}

/// A kernel dispatch (buffer tracing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRec {
    /// The launching call's id.
    pub correlation: u64,
    /// GPU start (CLOCK_BOOTTIME ns).
    pub start: u64,
    /// GPU end.
    pub end: u64,
    /// The GPU agent's handle.
    pub agent: u64,
    /// The HSA queue's handle.
    pub queue: u64,
    /// Key into the kernel-symbol map.
    pub kernel_id: u64,
    /// Work-items per work-group.
    pub workgroup: [u32; 3],
    /// Total work-items per dimension.
    pub grid: [u32; 3],
    /// LDS bytes per work-group.
    pub group_segment: u32,
}

/// A memory copy (buffer tracing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRec {
    /// The enqueuing call's id.
    pub correlation: u64,
    /// The SDK's operation number (the direction, resolved by name).
    pub operation: u32,
    /// Start (CLOCK_BOOTTIME ns).
    pub start: u64,
    /// End.
    pub end: u64,
    /// Source agent handle.
    pub src_agent: u64,
    /// Destination agent handle.
    pub dst_agent: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// A roctracer HIP_OPS record: a dispatch (`value`: the interned kernel name) or a copy or fill
/// (`value`: bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRec {
    /// The enqueuing call's id.
    pub correlation: u64,
    /// Start (the HSA clock, ns).
    pub start: u64,
    /// End.
    pub end: u64,
    /// The device's KFD node id.
    pub device: i32,
    /// The HIP stream's queue index.
    pub queue: u64,
    /// `HIP_OP_ID_*`.
    pub op: u32,
    /// The ROCclr command kind.
    pub kind: u32,
    /// Kernel name id or bytes.
    pub value: u64,
}

/// A memory allocation or free (buffer tracing, SDK 1.x).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRec {
    /// The allocating call's id.
    pub correlation: u64,
    /// The SDK's operation number (allocate / free, resolved by name).
    pub operation: u32,
    /// The allocating thread.
    pub tid: u32,
    /// When (CLOCK_BOOTTIME ns).
    pub start: u64,
    /// The agent whose memory it is.
    pub agent: u64,
    /// The block's address.
    pub address: u64,
    /// The block's size.
    pub bytes: u64,
}

/// One record copied out of a callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raw {
    /// A HIP runtime API call.
    Api(ApiRec),
    /// A kernel dispatch.
    Kernel(KernelRec),
    /// A memory copy.
    Copy(CopyRec),
    /// A roctracer HIP_OPS record.
    Op(OpRec),
    /// A memory allocation or free.
    Memory(MemoryRec),
}

/// Which record a queue slot's words hold (their first word's low byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// [`ApiRec`].
    Api,
    /// [`KernelRec`].
    Kernel,
    /// [`CopyRec`].
    Copy,
    /// [`OpRec`].
    Op,
    /// [`MemoryRec`].
    Memory,
}

const API: u64 = 1;
// The API tag's second byte says which arguments follow (words 6..12), the third which optional
// ones are present.
const ARGS_LAUNCH: u64 = 1 << 8;
const ARGS_COPY: u64 = 2 << 8;
const ARGS_MALLOC: u64 = 3 << 8;
const ARGS_FILL: u64 = 4 << 8;
const ARGS_MASK: u64 = 0xff << 8;
const HAS_OPTION: u64 = 1 << 16;
const KERNEL: u64 = 2;
const COPY: u64 = 3;
const MEMORY: u64 = 4;
const OP: u64 = 5;

#[inline]
fn pair(a: u32, b: u32) -> u64 {
    u64::from(a) | (u64::from(b) << 32)
}

#[inline]
fn split(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

impl Tag {
    /// The record kind of `w`, `None` for words no `to_words` wrote.
    #[inline]
    pub fn of(w: &Words) -> Option<Tag> {
        Some(match w[0] & !(ARGS_MASK | HAS_OPTION) {
            API => Tag::Api,
            KERNEL => Tag::Kernel,
            COPY => Tag::Copy,
            OP => Tag::Op,
            MEMORY => Tag::Memory,
            _ => return None,
        })
    }
}

impl ApiRec {
    /// The words of this record.
    #[inline]
    pub fn to_words(&self) -> Words {
        let (tag, rest) = match self.args {
            RawArgs::None => (API, [0; 6]),
            RawArgs::Launch {
                function,
                stream,
                grid,
                block,
                shared,
            } => (
                API | ARGS_LAUNCH,
                [
                    function,
                    stream,
                    pair(grid[0], grid[1]),
                    pair(grid[2], block[0]),
                    pair(block[1], block[2]),
                    u64::from(shared),
                ],
            ),
            RawArgs::Copy {
                stream,
                src,
                dst,
                size,
                kind,
            } => (
                API | ARGS_COPY | if stream.is_some() { HAS_OPTION } else { 0 },
                [stream.unwrap_or(0), src, dst, size, u64::from(kind), 0],
            ),
            RawArgs::Malloc { ptr, size } => (
                API | ARGS_MALLOC | if size.is_some() { HAS_OPTION } else { 0 },
                [ptr, size.unwrap_or(0), 0, 0, 0, 0],
            ),
            RawArgs::Fill { stream, dst, bytes } => (
                API | ARGS_FILL | if stream.is_some() { HAS_OPTION } else { 0 },
                [stream.unwrap_or(0), dst, bytes, 0, 0, 0],
            ),
        };
        let mut w = [0u64; WORDS];
        w[..6].copy_from_slice(&[
            tag,
            pair(self.operation, self.tid),
            self.correlation,
            self.start,
            self.end,
            self.external,
        ]);
        w[6..].copy_from_slice(&rest);
        w
    }

    /// The call of `w`, if it holds one.
    #[inline]
    pub fn from_words(w: &Words) -> Option<ApiRec> {
        if w[0] & !(ARGS_MASK | HAS_OPTION) != API {
            return None;
        }
        let has = w[0] & HAS_OPTION != 0;
        let (operation, tid) = split(w[1]);
        let args = match w[0] & ARGS_MASK {
            0 => RawArgs::None,
            ARGS_LAUNCH => {
                let (g0, g1) = split(w[8]);
                let (g2, b0) = split(w[9]);
                let (b1, b2) = split(w[10]);
                RawArgs::Launch {
                    function: w[6],
                    stream: w[7],
                    grid: [g0, g1, g2],
                    block: [b0, b1, b2],
                    shared: w[11] as u32,
                }
            }
            ARGS_COPY => RawArgs::Copy {
                stream: has.then_some(w[6]),
                src: w[7],
                dst: w[8],
                size: w[9],
                kind: w[10] as u32,
            },
            ARGS_MALLOC => RawArgs::Malloc {
                ptr: w[6],
                size: has.then_some(w[7]),
            },
            ARGS_FILL => RawArgs::Fill {
                stream: has.then_some(w[6]),
                dst: w[7],
                bytes: w[8],
            },
            _ => return None,
        };
        Some(ApiRec {
            operation,
            correlation: w[2],
            tid,
            start: w[3],
            end: w[4],
            external: w[5],
            args,
        })
    }
}

impl KernelRec {
    /// What kinetrace keeps of a kernel-dispatch record (the same layout in both ABIs).
    #[inline]
    pub fn of(r: &KernelDispatchRecord) -> KernelRec {
        let d = &r.dispatch_info;
        KernelRec {
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

    /// The words of this record.
    #[inline]
    pub fn to_words(&self) -> Words {
        let (g, w) = (self.grid, self.workgroup);
        [
            KERNEL,
            self.correlation,
            self.start,
            self.end,
            self.agent,
            self.queue,
            self.kernel_id,
            pair(w[0], w[1]),
            pair(w[2], g[0]),
            pair(g[1], g[2]),
            u64::from(self.group_segment),
            0,
        ]
    }

    /// The dispatch of `w`, if it holds one.
    #[inline]
    pub fn from_words(w: &Words) -> Option<KernelRec> {
        if w[0] != KERNEL {
            return None;
        }
        let (wx, wy) = split(w[7]);
        let (wz, gx) = split(w[8]);
        let (gy, gz) = split(w[9]);
        Some(KernelRec {
            correlation: w[1],
            start: w[2],
            end: w[3],
            agent: w[4],
            queue: w[5],
            kernel_id: w[6],
            workgroup: [wx, wy, wz],
            grid: [gx, gy, gz],
            group_segment: w[10] as u32,
        })
    }
}

impl CopyRec {
    /// What kinetrace keeps of a memory-copy record: the 0.x record is the prefix of the 1.x one
    /// (its correlation id is the 16-byte async one in both), so this reads both ABIs.
    #[inline]
    pub fn of(r: &v0::MemoryCopyRecord) -> CopyRec {
        CopyRec {
            correlation: r.correlation_id.internal,
            operation: r.operation,
            start: r.start_timestamp,
            end: r.end_timestamp,
            src_agent: r.src_agent_id.handle,
            dst_agent: r.dst_agent_id.handle,
            bytes: r.bytes,
        }
    }

    /// The words of this record.
    #[inline]
    pub fn to_words(&self) -> Words {
        [
            COPY,
            self.correlation,
            u64::from(self.operation),
            self.start,
            self.end,
            self.src_agent,
            self.dst_agent,
            self.bytes,
            0,
            0,
            0,
            0,
        ]
    }

    /// The copy of `w`, if it holds one.
    #[inline]
    pub fn from_words(w: &Words) -> Option<CopyRec> {
        (w[0] == COPY).then(|| CopyRec {
            correlation: w[1],
            operation: w[2] as u32,
            start: w[3],
            end: w[4],
            src_agent: w[5],
            dst_agent: w[6],
            bytes: w[7],
        })
    }
}

impl OpRec {
    /// The words of this record.
    #[inline]
    pub fn to_words(&self) -> Words {
        [
            OP,
            self.correlation,
            self.start,
            self.end,
            u64::from(self.device as u32),
            self.queue,
            pair(self.op, self.kind),
            self.value,
            0,
            0,
            0,
            0,
        ]
    }

    /// The roctracer record of `w`, if it holds one.
    #[inline]
    pub fn from_words(w: &Words) -> Option<OpRec> {
        if w[0] != OP {
            return None;
        }
        let (op, kind) = split(w[6]);
        Some(OpRec {
            correlation: w[1],
            start: w[2],
            end: w[3],
            device: w[4] as u32 as i32,
            queue: w[5],
            op,
            kind,
            value: w[7],
        })
    }
}

impl MemoryRec {
    /// What kinetrace keeps of a 1.x memory-allocation record.
    #[inline]
    pub fn of(r: &v1::MemoryAllocationRecord) -> MemoryRec {
        MemoryRec {
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
    #[inline]
    pub fn to_words(&self) -> Words {
        [
            MEMORY,
            self.correlation,
            pair(self.operation, self.tid),
            self.start,
            self.agent,
            self.address,
            self.bytes,
            0,
            0,
            0,
            0,
            0,
        ]
    }

    /// The allocation or free of `w`, if it holds one.
    #[inline]
    pub fn from_words(w: &Words) -> Option<MemoryRec> {
        if w[0] != MEMORY {
            return None;
        }
        let (operation, tid) = split(w[2]);
        Some(MemoryRec {
            correlation: w[1],
            operation,
            tid,
            start: w[3],
            agent: w[4],
            address: w[5],
            bytes: w[6],
        })
    }
}

impl Raw {
    /// The words of this record.
    #[inline]
    pub fn to_words(&self) -> Words {
        match self {
            Raw::Api(r) => r.to_words(),
            Raw::Kernel(r) => r.to_words(),
            Raw::Copy(r) => r.to_words(),
            Raw::Op(r) => r.to_words(),
            Raw::Memory(r) => r.to_words(),
        }
    }

    /// The record of `w`, `None` for words no [`Raw::to_words`] wrote.
    pub fn from_words(w: &Words) -> Option<Raw> {
        match Tag::of(w)? {
            Tag::Api => ApiRec::from_words(w).map(Raw::Api),
            Tag::Kernel => KernelRec::from_words(w).map(Raw::Kernel),
            Tag::Copy => CopyRec::from_words(w).map(Raw::Copy),
            Tag::Op => OpRec::from_words(w).map(Raw::Op),
            Tag::Memory => MemoryRec::from_words(w).map(Raw::Memory),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let rs = [
            Raw::Api(ApiRec {
                operation: 214,
                correlation: 7,
                tid: 1234,
                start: 10,
                end: 20,
                external: 99,
                args: RawArgs::None,
            }),
            Raw::Api(ApiRec {
                operation: 214,
                correlation: 8,
                tid: 1234,
                start: 10,
                end: 20,
                external: 0,
                args: RawArgs::Launch {
                    function: 0x7e00_0001,
                    stream: 0x5555_0000_1234,
                    grid: [16, 2, u32::MAX],
                    block: [256, 1, 4],
                    shared: 512,
                },
            }),
            Raw::Api(ApiRec {
                operation: 268,
                correlation: 9,
                tid: 1,
                start: 1,
                end: 2,
                external: 3,
                args: RawArgs::Copy {
                    stream: Some(0),
                    src: 0x5500,
                    dst: 0x7f00,
                    size: 1 << 40,
                    kind: 1,
                },
            }),
            Raw::Api(ApiRec {
                operation: 259,
                correlation: 10,
                tid: 1,
                start: 1,
                end: 2,
                external: 3,
                args: RawArgs::Copy {
                    stream: None,
                    src: 1,
                    dst: 2,
                    size: 3,
                    kind: 4,
                },
            }),
            Raw::Api(ApiRec {
                operation: 293,
                correlation: 13,
                tid: 1,
                start: 1,
                end: 2,
                external: 5,
                args: RawArgs::Fill {
                    stream: Some(0x5555_0000_1234),
                    dst: 0x7f00_0000_2000,
                    bytes: 1 << 33,
                },
            }),
            Raw::Api(ApiRec {
                operation: 292,
                correlation: 14,
                tid: 1,
                start: 1,
                end: 2,
                external: 0,
                args: RawArgs::Fill {
                    stream: None,
                    dst: 0x7f00_0000_3000,
                    bytes: 4096,
                },
            }),
            Raw::Api(ApiRec {
                operation: 215,
                correlation: 11,
                tid: 1,
                start: 1,
                end: 2,
                external: 0,
                args: RawArgs::Malloc {
                    ptr: 0x7f00_0000_1000,
                    size: Some(4096),
                },
            }),
            Raw::Api(ApiRec {
                operation: 90,
                correlation: 12,
                tid: 1,
                start: 1,
                end: 2,
                external: 0,
                args: RawArgs::Malloc {
                    ptr: 0x7f00_0000_1000,
                    size: None,
                },
            }),
            Raw::Kernel(KernelRec {
                correlation: 7,
                start: 11,
                end: 19,
                agent: 0x200,
                queue: 0xdead,
                kernel_id: 3,
                workgroup: [256, 1, 2],
                grid: [4096, 3, u32::MAX],
                group_segment: 65536,
            }),
            Raw::Copy(CopyRec {
                correlation: 8,
                operation: 2,
                start: 1,
                end: 2,
                src_agent: 0x100,
                dst_agent: 0x200,
                bytes: u64::MAX,
            }),
            Raw::Op(OpRec {
                correlation: 13,
                start: 1,
                end: 2,
                device: -1,
                queue: 3,
                op: 1,
                kind: 0x1207,
                value: 1 << 33,
            }),
            Raw::Memory(MemoryRec {
                correlation: 9,
                operation: 3,
                tid: 77,
                start: 5,
                agent: 0x300,
                address: 0x7f00_0000_1000,
                bytes: 1 << 30,
            }),
        ];
        for r in rs {
            assert_eq!(Raw::from_words(&r.to_words()), Some(r));
        }
        assert_eq!(Raw::from_words(&[0; WORDS]), None);
    }
}
