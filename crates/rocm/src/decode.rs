//! From the compact records the callbacks queued to [`Activity`]s, the way Kineto maps ROCm
//! records (research §3.4): HIP calls become `cuda_runtime` events with the SDK's operation number
//! as `cid` and the launch, copy and allocation arguments Kineto writes; dispatches become kernels
//! on (device = the agent's index among GPUs, stream = the HIP stream of the launch), copies
//! become `gpu_memcpy` events on the GPU end of the copy. Every GPU record carries the correlation
//! id of the call that enqueued it and that call's `External id`.
//!
//! Streams: the SDK's records name the HSA queue; the HIP stream comes from the launch (or copy)
//! call's arguments, remembered by correlation id. Streams are numbered as Kineto's rows: the null
//! stream is 0, every other stream (and, for a record whose call named none, its HSA queue) gets
//! the next number in order of first use.
//!
//! Pure apart from the name cache: the kernel-name lookup and the `External id` lookup are passed
//! in, so tests drive it without an SDK.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use kinetrace_core::activity::{
    Activity, ApiCall, CallArgs, Detail, Kernel, Memcpy, MemcpyKind, Memory, MemoryKind, MemoryOp,
    Memset,
};
use kinetrace_core::{intern, NameId, UnixNanos};

use crate::external::CallInfo;
use crate::record::{Raw, RawArgs};

/// HIP calls Kineto leaves out of its traces (its ROCm skip list): frequent, no GPU work.
pub const NOISE: &[&str] = &[
    "hipGetDevice",
    "hipSetDevice",
    "hipGetLastError",
    "__hipPushCallConfiguration",
    "__hipPopCallConfiguration",
    "hipCtxSetCurrent",
    "hipGetDevicePropertiesR0600",
    "hipGetDeviceCount",
    "hipDeviceGetAttribute",
    "hipRuntimeGetVersion",
    "hipPeekAtLastError",
    "hipModuleGetFunction",
];

/// HIP calls Kineto draws an `ac2g` flow from (launches, copies, allocation and graph launch).
pub const FLOW_STARTS: &[&str] = &[
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipLaunchCooperativeKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipHccModuleLaunchKernel",
    "hipMalloc",
    "hipFree",
    "hipMemcpy",
    "hipMemcpyAsync",
    "hipMemcpyWithStream",
    "hipGraphLaunch",
];

/// roctracer's `HIP_OP_ID_DISPATCH`.
const ROCTRACER_DISPATCH: u32 = 0;
/// The ROCclr command of a fill (`FILL_BUFFER`): a memset.
const ROCCLR_FILL_BUFFER: u32 = 0x1207;

/// Launch calls held at most while their kernel's name is unknown; past it they go without one.
pub const MAX_HELD: usize = 4096;

/// The name Kineto gives a dispatch whose kernel symbol was never registered.
pub const UNKNOWN_KERNEL: &str = "<unknown kernel>";

/// The direction of a copy operation, from the SDK's operation name.
pub fn copy_direction(name: &str) -> MemcpyKind {
    match name {
        "MEMORY_COPY_HOST_TO_DEVICE" => MemcpyKind::HtoD,
        "MEMORY_COPY_DEVICE_TO_HOST" => MemcpyKind::DtoH,
        "MEMORY_COPY_DEVICE_TO_DEVICE" => MemcpyKind::DtoD,
        "MEMORY_COPY_HOST_TO_HOST" => MemcpyKind::HtoH,
        _ => MemcpyKind::Unknown,
    }
}

/// FxHash (rustc's): one multiply per word. The maps below are keyed by SDK handles and ids, not by
/// untrusted input, so SipHash's flood resistance buys nothing on the decode path.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// What a GPU record's row is keyed by: the HIP stream of its call, else its HSA queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stream {
    Hip(u64),
    Queue(u64),
}

#[derive(Clone, Copy, Debug)]
struct ApiName {
    name: NameId,
    launches_work: bool,
    noise: bool,
}

/// The mapping state: names resolved through the SDK, the device and stream numbering, the clock
/// offset.
#[derive(Debug)]
pub struct Decoder {
    pid: u32,
    /// Unix ns = SDK ns (CLOCK_BOOTTIME) + this.
    offset_ns: i64,
    hip: FxMap<u32, ApiName>,
    copies: FxMap<u32, MemcpyKind>,
    /// Memory-allocation operations that free.
    frees: FxMap<u32, bool>,
    devices: FxMap<u64, u32>,
    streams: FxMap<Stream, u32>,
    kernels: FxMap<u64, NameId>,
    /// Launched function → kernel name, learned from the dispatches of launches.
    functions: FxMap<u64, NameId>,
    /// Launch calls of functions whose kernel is not known yet, held until a dispatch of theirs
    /// names it (or the window's flush): (function, call).
    held: Vec<(u64, Activity)>,
    /// Held calls whose kernel is now known, for [`Decoder::take_released`].
    released: Vec<Activity>,
    /// The last (stream, row) and (kernel id, name) looked up: records come in runs.
    last_stream: (Stream, u32),
    last_kernel: (u64, NameId),
    unknown_kernel: NameId,
    keep_noise: bool,
}

impl Decoder {
    /// A decoder for HIP operations `hip` and copy operations `copies` (number → SDK name), GPU
    /// agents `gpus` (handle → device index), and the clock offset.
    pub fn new(
        hip: &[(i32, String)],
        copies: &[(i32, String)],
        gpus: HashMap<u64, u32>,
        offset_ns: i64,
        keep_noise: bool,
    ) -> Decoder {
        Decoder {
            pid: std::process::id(),
            offset_ns,
            hip: hip
                .iter()
                .map(|(op, n)| {
                    (
                        *op as u32,
                        ApiName {
                            name: intern(n),
                            launches_work: FLOW_STARTS.contains(&n.as_str()),
                            noise: NOISE.contains(&n.as_str()),
                        },
                    )
                })
                .collect(),
            copies: copies
                .iter()
                .map(|(op, n)| (*op as u32, copy_direction(n)))
                .collect(),
            frees: FxMap::default(),
            devices: gpus.into_iter().collect(),
            streams: FxMap::default(),
            kernels: FxMap::default(),
            functions: FxMap::default(),
            held: Vec::new(),
            released: Vec::new(),
            last_stream: (Stream::Queue(u64::MAX), 0),
            last_kernel: (u64::MAX, NameId(u32::MAX)),
            unknown_kernel: intern(UNKNOWN_KERNEL),
            keep_noise,
        }
    }

    /// The memory-allocation operations (number → SDK name): `…FREE` ones free, the others
    /// allocate.
    pub fn with_allocations(mut self, ops: &[(i32, String)]) -> Decoder {
        self.frees = ops
            .iter()
            .map(|(op, n)| (*op as u32, n.ends_with("FREE")))
            .collect();
        self
    }

    fn time(&self, sdk_ns: u64) -> UnixNanos {
        UnixNanos((sdk_ns as i64).saturating_add(self.offset_ns).max(0) as u64)
    }

    /// The device index of an agent: its index among GPUs, or (an agent the SDK did not list) the
    /// next free one.
    fn device(&mut self, agent: u64) -> u32 {
        if let Some(d) = self.devices.get(&agent) {
            return *d;
        }
        let next = self.devices.values().max().map_or(0, |m| m + 1);
        self.devices.insert(agent, next);
        next
    }

    /// The row of a stream: the null stream is 0, others numbered from 1 in order of first use.
    fn stream(&mut self, key: Stream) -> u32 {
        if self.last_stream.0 == key {
            return self.last_stream.1;
        }
        let s = match key {
            Stream::Hip(0) => 0,
            _ => {
                let next = self.streams.len() as u32 + 1;
                *self.streams.entry(key).or_insert(next)
            }
        };
        self.last_stream = (key, s);
        s
    }

    /// Hands over the launch calls a dispatch named since the last call (they come before that
    /// dispatch), and with `all` every call still held (a window's flush: no dispatch of theirs
    /// is coming for it).
    pub fn take_released(&mut self, all: bool, emit: &mut dyn FnMut(&Activity)) {
        for a in self.released.drain(..) {
            emit(&a);
        }
        if all {
            for (_, a) in self.held.drain(..) {
                emit(&a);
            }
        }
    }

    /// Calls held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// `function` launches `name`: remember it, and release the held calls that launched it.
    fn learn(&mut self, function: u64, name: NameId) {
        if self.functions.insert(function, name).is_some() || self.held.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 == function {
                let (_, mut a) = self.held.remove(i);
                if let Detail::Runtime(ApiCall {
                    args: CallArgs::HipLaunch { kernel, .. },
                    ..
                }) = &mut a.detail
                {
                    *kernel = Some(name);
                }
                self.released.push(a);
            } else {
                i += 1;
            }
        }
    }

    /// What the trace shows of a call's arguments.
    fn call_args(&self, args: RawArgs) -> CallArgs {
        match args {
            RawArgs::None => CallArgs::Hip,
            RawArgs::Launch {
                function,
                stream,
                grid,
                block,
                shared,
            } => CallArgs::HipLaunch {
                kernel: self.functions.get(&function).copied(),
                stream,
                grid,
                block,
                shared_memory: shared,
            },
            RawArgs::Copy {
                stream,
                src,
                dst,
                size,
                kind,
            } => CallArgs::HipCopy {
                stream,
                src,
                dst,
                size,
                kind,
            },
            RawArgs::Malloc { ptr, size } => CallArgs::HipMalloc { ptr, size },
        }
    }

    /// Maps one record. `kernel_name` looks a kernel id up in the code-object map; `call` gives
    /// what the API callback remembered of a correlation id's call (`External id`, stream,
    /// function). `None` for calls left out as noise.
    pub fn decode(
        &mut self,
        raw: &Raw,
        kernel_name: impl FnOnce(u64) -> Option<String>,
        call: impl FnOnce(u64) -> Option<CallInfo>,
    ) -> Option<Activity> {
        Some(match *raw {
            Raw::Api {
                operation,
                correlation,
                tid,
                start,
                end,
                external: ext,
                args,
            } => {
                let name = match self.hip.get(&operation) {
                    Some(n) => *n,
                    None => {
                        // An operation the SDK did not list: named by its number, once.
                        let n = ApiName {
                            name: intern(&format!("hip_api_{operation}")),
                            launches_work: false,
                            noise: false,
                        };
                        self.hip.insert(operation, n);
                        n
                    }
                };
                if name.noise && !self.keep_noise {
                    return None;
                }
                let a = Activity {
                    start: self.time(start),
                    end: self.time(end),
                    correlation: Some(correlation),
                    external_id: (ext != 0).then_some(ext),
                    detail: Detail::Runtime(ApiCall {
                        name: name.name,
                        cbid: Some(operation),
                        pid: self.pid,
                        tid,
                        launches_work: name.launches_work,
                        args: self.call_args(args),
                    }),
                };
                // A launch of a function no dispatch has named yet waits for its dispatch, which
                // names the kernel (kinetrace does not call HIP's hipKernelNameRefByPtr).
                if let (Some(f), Detail::Runtime(c)) = (args.function(), &a.detail) {
                    if matches!(c.args, CallArgs::HipLaunch { kernel: None, .. })
                        && self.held.len() < MAX_HELD
                    {
                        self.held.push((f, a));
                        return None;
                    }
                }
                a
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
                let name = if self.last_kernel.0 == kernel_id {
                    self.last_kernel.1
                } else {
                    let n = match self.kernels.get(&kernel_id) {
                        Some(n) => *n,
                        // A name registered later is looked up again next time.
                        None => match kernel_name(kernel_id) {
                            Some(s) => {
                                let n = intern(&s);
                                self.kernels.insert(kernel_id, n);
                                n
                            }
                            None => self.unknown_kernel,
                        },
                    };
                    if n != self.unknown_kernel {
                        self.last_kernel = (kernel_id, n);
                    }
                    n
                };
                // AQL grid sizes are in work-items; Kineto's grid is in work-groups.
                let blocks = |g: u32, w: u32| if w == 0 { g } else { g.div_ceil(w) };
                let info = call(correlation).unwrap_or_default();
                if let Some(f) = info.function {
                    if name != self.unknown_kernel {
                        self.learn(f, name);
                    }
                }
                let stream = self.stream(info.stream.map_or(Stream::Queue(queue), Stream::Hip));
                Activity {
                    start: self.time(start),
                    end: self.time(end),
                    correlation: Some(correlation),
                    external_id: (info.external != 0).then_some(info.external),
                    detail: Detail::Kernel(Kernel {
                        name,
                        device: self.device(agent),
                        context: None,
                        stream,
                        grid: Some([
                            blocks(grid[0], workgroup[0]),
                            blocks(grid[1], workgroup[1]),
                            blocks(grid[2], workgroup[2]),
                        ]),
                        block: Some(workgroup),
                        registers_per_thread: None,
                        shared_memory: Some(u64::from(group_segment)),
                        queued: None,
                        graph_id: None,
                        kind_arg: true,
                        graph_node_id: None,
                    }),
                }
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
                let kind = self
                    .copies
                    .get(&operation)
                    .copied()
                    .unwrap_or(MemcpyKind::Unknown);
                // The SDK does not say pageable or pinned: Kineto's `Host`.
                let side = |host: bool| {
                    if host {
                        MemoryKind::Host
                    } else {
                        MemoryKind::Device
                    }
                };
                let (src_host, dst_host) = match kind {
                    MemcpyKind::HtoD => (true, false),
                    MemcpyKind::DtoH => (false, true),
                    MemcpyKind::HtoH => (true, true),
                    _ => (false, false),
                };
                // The copy is drawn on its GPU end, on its call's stream (Kineto's SDK path: 0).
                let gpu_agent = if dst_host { src_agent } else { dst_agent };
                let info = call(correlation).unwrap_or_default();
                let stream = info.stream.map_or(0, |s| self.stream(Stream::Hip(s)));
                Activity {
                    start: self.time(start),
                    end: self.time(end),
                    correlation: Some(correlation),
                    external_id: (info.external != 0).then_some(info.external),
                    detail: Detail::Memcpy(Memcpy {
                        kind,
                        src_kind: side(src_host),
                        dst_kind: side(dst_host),
                        bytes,
                        device: self.device(gpu_agent),
                        context: None,
                        stream,
                        kind_arg: true,
                        peer: None,
                    }),
                }
            }
            Raw::Op {
                correlation,
                start,
                end,
                device,
                queue,
                op,
                kind,
                value,
            } => {
                // roctracer (Kineto's roctracer path): the device is the KFD node id, the stream
                // the HIP stream's queue index, both as the record gives them.
                let info = call(correlation).unwrap_or_default();
                let device = device.max(0) as u32;
                let stream = queue.min(u64::from(u32::MAX)) as u32;
                let detail = match op {
                    ROCTRACER_DISPATCH => Detail::Kernel(Kernel {
                        name: NameId(value as u32),
                        device,
                        context: None,
                        stream,
                        grid: None,
                        block: None,
                        registers_per_thread: None,
                        shared_memory: None,
                        queued: None,
                        graph_id: None,
                        kind_arg: true,
                        graph_node_id: None,
                    }),
                    _ if kind == ROCCLR_FILL_BUFFER => Detail::Memset(Memset {
                        memory_kind: MemoryKind::Device,
                        bytes: value,
                        device,
                        context: None,
                        stream,
                    }),
                    _ => {
                        let (kind, src_kind, dst_kind) = match kind {
                            0x11F3 => (MemcpyKind::DtoH, MemoryKind::Device, MemoryKind::Host),
                            0x11F4 => (MemcpyKind::HtoD, MemoryKind::Host, MemoryKind::Device),
                            0x11F5 => (MemcpyKind::DtoD, MemoryKind::Device, MemoryKind::Device),
                            _ => (
                                MemcpyKind::Unknown,
                                MemoryKind::Unknown,
                                MemoryKind::Unknown,
                            ),
                        };
                        Detail::Memcpy(Memcpy {
                            kind,
                            src_kind,
                            dst_kind,
                            bytes: value,
                            device,
                            context: None,
                            stream,
                            kind_arg: true,
                            peer: None,
                        })
                    }
                };
                Activity {
                    start: self.time(start),
                    end: self.time(end),
                    correlation: Some(correlation),
                    external_id: (info.external != 0).then_some(info.external),
                    detail,
                }
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
                let free = self.frees.get(&operation).copied().unwrap_or(false);
                Activity {
                    start: self.time(start),
                    end: self.time(start),
                    correlation: Some(correlation),
                    external_id: call(correlation)
                        .and_then(|c| (c.external != 0).then_some(c.external)),
                    detail: Detail::Memory(Memory {
                        op: if free {
                            MemoryOp::Free
                        } else {
                            MemoryOp::Alloc
                        },
                        device: Some(self.device(agent)),
                        address,
                        bytes,
                        total_allocated: None,
                        total_reserved: None,
                        pid: self.pid,
                        tid,
                    }),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder() -> Decoder {
        Decoder::new(
            &[
                (214, "hipLaunchKernel".into()),
                (120, "hipGetDevice".into()),
            ],
            &[
                (2, "MEMORY_COPY_HOST_TO_DEVICE".into()),
                (3, "MEMORY_COPY_DEVICE_TO_HOST".into()),
            ],
            HashMap::from([(0x200, 0), (0x300, 1)]),
            1_000,
            false,
        )
    }

    #[test]
    fn kernel_maps_like_kineto() {
        let mut d = decoder();
        let raw = Raw::Kernel {
            correlation: 7,
            start: 100,
            end: 150,
            agent: 0x300,
            queue: 0xabc,
            kernel_id: 3,
            workgroup: [256, 1, 1],
            grid: [4096, 1, 1],
            group_segment: 128,
        };
        let a = d
            .decode(
                &raw,
                |id| (id == 3).then(|| "axpy".to_owned()),
                |c| {
                    (c == 7).then_some(CallInfo {
                        external: 42,
                        stream: Some(0),
                        function: Some(0x7e00),
                    })
                },
            )
            .unwrap();
        assert_eq!((a.start.0, a.end.0), (1_100, 1_150));
        assert_eq!((a.correlation, a.external_id), (Some(7), Some(42)));
        let Detail::Kernel(k) = a.detail else {
            panic!("{a:?}")
        };
        assert_eq!(k.device, 1);
        // The launch's null stream is row 0.
        assert_eq!(k.stream, 0);
        assert_eq!(k.grid, Some([16, 1, 1]));
        assert_eq!(k.block, Some([256, 1, 1]));
        assert_eq!(k.shared_memory, Some(128));
        assert_eq!(&*kinetrace_core::intern::resolve(k.name), "axpy");
        // A record whose call named no stream is placed by its HSA queue, after the HIP streams;
        // an unknown kernel id keeps Kineto's placeholder.
        let raw2 = Raw::Kernel {
            correlation: 8,
            start: 200,
            end: 250,
            agent: 0x300,
            queue: 0xdef,
            kernel_id: 9,
            workgroup: [64, 1, 1],
            grid: [64, 1, 1],
            group_segment: 0,
        };
        let b = d.decode(&raw2, |_| None, |_| None).unwrap();
        let Detail::Kernel(k) = b.detail else {
            panic!("{b:?}")
        };
        assert_eq!(k.stream, 1);
        assert_eq!(&*kinetrace_core::intern::resolve(k.name), UNKNOWN_KERNEL);
        // A later launch of the same function names its kernel; a non-null stream is the next row.
        let launch = Raw::Api {
            operation: 214,
            correlation: 9,
            tid: 1,
            start: 300,
            end: 310,
            external: 0,
            args: RawArgs::Launch {
                function: 0x7e00,
                stream: 0x5555_0000,
                grid: [16, 1, 1],
                block: [256, 1, 1],
                shared: 0,
            },
        };
        let c = d.decode(&launch, |_| None, |_| None).unwrap();
        assert_eq!(d.held(), 0, "the function is known: not held");
        let Detail::Runtime(call) = c.detail else {
            panic!("{c:?}")
        };
        let CallArgs::HipLaunch { kernel, stream, .. } = call.args else {
            panic!("{call:?}")
        };
        assert_eq!(
            kernel
                .map(|k| kinetrace_core::intern::resolve(k).to_string())
                .as_deref(),
            Some("axpy")
        );
        assert_eq!(stream, 0x5555_0000);
        let on_stream = Raw::Kernel {
            correlation: 9,
            start: 320,
            end: 330,
            agent: 0x300,
            queue: 0xabc,
            kernel_id: 3,
            workgroup: [256, 1, 1],
            grid: [4096, 1, 1],
            group_segment: 0,
        };
        let info = CallInfo {
            external: 0,
            stream: Some(0x5555_0000),
            function: Some(0x7e00),
        };
        let e = d.decode(&on_stream, |_| None, |_| Some(info)).unwrap();
        let Detail::Kernel(k) = e.detail else {
            panic!("{e:?}")
        };
        assert_eq!((k.stream, e.external_id), (2, None));
    }

    #[test]
    fn a_launch_waits_for_the_dispatch_that_names_its_kernel() {
        let mut d = decoder();
        let launch = |correlation, function| Raw::Api {
            operation: 214,
            correlation,
            tid: 1,
            start: 10,
            end: 20,
            external: 0,
            args: RawArgs::Launch {
                function,
                stream: 0,
                grid: [1, 1, 1],
                block: [64, 1, 1],
                shared: 0,
            },
        };
        assert!(d.decode(&launch(1, 0xf1), |_| None, |_| None).is_none());
        assert!(d.decode(&launch(2, 0xf2), |_| None, |_| None).is_none());
        assert_eq!(d.held(), 2);
        let dispatch = Raw::Kernel {
            correlation: 1,
            start: 30,
            end: 40,
            agent: 0x200,
            queue: 0xa,
            kernel_id: 5,
            workgroup: [64, 1, 1],
            grid: [64, 1, 1],
            group_segment: 0,
        };
        let info = |f| CallInfo {
            external: 0,
            stream: Some(0),
            function: Some(f),
        };
        let k = d.decode(&dispatch, |_| Some("gemm".into()), |_| Some(info(0xf1)));
        assert!(k.is_some());
        let mut out = Vec::new();
        d.take_released(false, &mut |a| out.push(*a));
        assert_eq!(out.len(), 1);
        let kernel_of = |a: &Activity| match a.detail {
            Detail::Runtime(ApiCall {
                args: CallArgs::HipLaunch { kernel, .. },
                ..
            }) => kernel.map(|k| kinetrace_core::intern::resolve(k).to_string()),
            _ => panic!("{a:?}"),
        };
        assert_eq!(
            (out[0].correlation, kernel_of(&out[0]).as_deref()),
            (Some(1), Some("gemm"))
        );
        // The window's flush hands over what no dispatch named, without a kernel.
        out.clear();
        d.take_released(true, &mut |a| out.push(*a));
        assert_eq!((out.len(), kernel_of(&out[0])), (1, None));
        assert_eq!(d.held(), 0);
    }

    #[test]
    fn api_calls_and_noise() {
        let mut d = decoder();
        let call = |op| Raw::Api {
            operation: op,
            correlation: 5,
            tid: 77,
            start: 10,
            end: 20,
            external: 9,
            args: RawArgs::None,
        };
        let a = d.decode(&call(214), |_| None, |_| None).unwrap();
        let Detail::Runtime(c) = a.detail else {
            panic!("{a:?}")
        };
        assert!(c.launches_work);
        assert_eq!((c.tid, c.cbid, a.external_id), (77, Some(214), Some(9)));
        assert_eq!(
            c.args,
            CallArgs::Hip,
            "a HIP call: its id is written as cid"
        );
        assert!(d.decode(&call(120), |_| None, |_| None).is_none());
        let odd = d.decode(&call(999), |_| None, |_| None).unwrap();
        let Detail::Runtime(c) = odd.detail else {
            panic!()
        };
        assert_eq!(&*kinetrace_core::intern::resolve(c.name), "hip_api_999");
    }

    #[test]
    fn copies_sit_on_their_gpu_end() {
        let mut d = decoder();
        let copy = |op, src, dst| Raw::Copy {
            correlation: 1,
            operation: op,
            start: 0,
            end: 5,
            src_agent: src,
            dst_agent: dst,
            bytes: 4096,
        };
        let a = d
            .decode(&copy(2, 0x100, 0x300), |_| None, |_| None)
            .unwrap();
        let Detail::Memcpy(m) = a.detail else {
            panic!()
        };
        assert_eq!((m.kind, m.device, m.bytes), (MemcpyKind::HtoD, 1, 4096));
        assert_eq!(
            (m.src_kind, m.dst_kind),
            (MemoryKind::Host, MemoryKind::Device)
        );
        let b = d
            .decode(&copy(3, 0x200, 0x100), |_| None, |_| None)
            .unwrap();
        let Detail::Memcpy(m) = b.detail else {
            panic!()
        };
        assert_eq!((m.kind, m.device), (MemcpyKind::DtoH, 0));
    }
}
