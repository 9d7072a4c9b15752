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

use crate::external::{CallInfo, ExternalIds};
use crate::queue::{Queue, Words};
use crate::record::{ApiRec, CopyRec, KernelRec, MemoryRec, OpRec, Raw, RawArgs, Tag};

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

/// HIP calls Kineto's ROCm path draws an `ac2g` flow from (launches, copies, allocation and graph
/// launch). [`starts_flow`] widens it.
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

/// Launch calls beyond Kineto's ROCm list (its CUDA list has their CUDA twins).
const MORE_LAUNCHES: &[&str] = &[
    "hipLaunchCooperativeKernelMultiDevice",
    "hipExtLaunchMultiKernelMultiDevice",
    "hipModuleLaunchCooperativeKernel",
    "hipModuleLaunchCooperativeKernelMultiDevice",
    "hipLaunchKernelExC",
    "hipDrvLaunchKernelEx",
];

/// Whether a HIP call starts an `ac2g` flow (its GPU records end it): Kineto's ROCm list
/// ([`FLOW_STARTS`]) plus every call that enqueues a GPU record kinetrace writes, so that each
/// GPU record whose call is in the trace has its flow, as Kineto's CUDA path draws one for every
/// `cudaMemcpy*` and `cudaMemset*`: all `hipMemcpy*` and `hipMemset*` calls (a memset's fill
/// dispatches become `gpu_memset`; Kineto's ROCm list has no memset), the other launch calls, and
/// the per-thread-stream (`_spt`) forms of all of these.
pub fn starts_flow(name: &str) -> bool {
    let name = name.strip_suffix("_spt").unwrap_or(name);
    FLOW_STARTS.contains(&name)
        || MORE_LAUNCHES.contains(&name)
        || name.starts_with("hipMemcpy")
        || name.starts_with("hipMemset")
}

/// roctracer's `HIP_OP_ID_DISPATCH`.
const ROCTRACER_DISPATCH: u32 = 0;
/// The ROCclr command of a fill (`FILL_BUFFER`): a memset.
const ROCCLR_FILL_BUFFER: u32 = 0x1207;

/// Launch calls held at most while their kernel's name is unknown; past it they go without one.
pub const MAX_HELD: usize = 4096;

/// The name Kineto gives a dispatch whose kernel symbol was never registered.
pub const UNKNOWN_KERNEL: &str = "<unknown kernel>";

/// Whether a kernel symbol is one of the ROCclr blit kernels a memset dispatches
/// (`__amd_rocclr_fillBufferAligned`, `…2D`, …; the SDK reports them with a `.kd` suffix).
fn is_fill_kernel(symbol: &str) -> bool {
    symbol.starts_with("__amd_rocclr_fillBuffer")
}

/// Work-groups of `w` work-items covering `g` work-items. Work-group sizes are powers of two (and
/// 1 in unused dimensions) almost always: a shift instead of a division, which would be the
/// largest single cost of mapping a dispatch.
#[inline]
fn blocks(g: u32, w: u32) -> u32 {
    if w <= 1 {
        g
    } else if w.is_power_of_two() {
        (g >> w.trailing_zeros()) + u32::from(g & (w - 1) != 0)
    } else {
        g.div_ceil(w)
    }
}

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
    // An enum key's discriminant is hashed as an `isize`, whose default goes through `write`
    // byte by byte.
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A direct-mapped cache of 16 recent lookups in front of a map: a window's records interleave a
/// few streams, kernels and launched functions, which one last-value cache misses every time and a
/// hash-map lookup per field makes the decoder's largest cost. An exact cache: a slot holds its
/// whole key.
#[derive(Clone, Copy, Debug)]
struct Recent<K, V> {
    slots: [Option<(K, V)>; 16],
}

/// A key of a [`Recent`] cache: the word its slot is picked by.
trait CacheKey: Copy + Eq {
    fn word(self) -> u64;
}

impl CacheKey for u64 {
    fn word(self) -> u64 {
        self
    }
}

impl<K: CacheKey, V: Copy> Recent<K, V> {
    const EMPTY: Recent<K, V> = Recent { slots: [None; 16] };

    /// Fibonacci hashing of the key's word: the top four bits of one multiply.
    fn index(key: K) -> usize {
        (key.word().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize
    }

    #[inline]
    fn get(&self, key: K) -> Option<V> {
        match self.slots[Self::index(key)] {
            Some((k, v)) if k == key => Some(v),
            _ => None,
        }
    }

    #[inline]
    fn put(&mut self, key: K, value: V) {
        self.slots[Self::index(key)] = Some((key, value));
    }
}

/// What a GPU record's row is keyed by: the HIP stream of its call, else its HSA queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stream {
    Hip(u64),
    Queue(u64),
}

impl CacheKey for Stream {
    fn word(self) -> u64 {
        match self {
            Stream::Hip(s) => s,
            Stream::Queue(q) => !q,
        }
    }
}

/// Operation numbers under this are looked up by index (the SDK's are in the hundreds).
const DENSE_OPS: usize = 4096;

/// What the decoder knows of each operation number of one kind: a table indexed by the number for
/// the SDK's small numbers, a map for any other.
#[derive(Debug)]
struct OpTable<V> {
    dense: Vec<Option<V>>,
    sparse: FxMap<u32, V>,
}

impl<V: Copy> OpTable<V> {
    fn new(ops: impl IntoIterator<Item = (u32, V)>) -> OpTable<V> {
        let mut t = OpTable {
            dense: Vec::new(),
            sparse: FxMap::default(),
        };
        for (op, v) in ops {
            t.insert(op, v);
        }
        t
    }

    #[inline]
    fn get(&self, op: u32) -> Option<V> {
        match self.dense.get(op as usize) {
            Some(v) => *v,
            None => self.sparse.get(&op).copied(),
        }
    }

    fn insert(&mut self, op: u32, v: V) {
        let i = op as usize;
        if i < DENSE_OPS {
            if self.dense.len() <= i {
                self.dense.resize(i + 1, None);
            }
            self.dense[i] = Some(v);
        } else {
            self.sparse.insert(op, v);
        }
    }
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
    hip: OpTable<ApiName>,
    copies: OpTable<MemcpyKind>,
    /// Memory-allocation operations: whether each frees.
    frees: OpTable<bool>,
    devices: FxMap<u64, u32>,
    streams: FxMap<Stream, u32>,
    /// Kernel id → (name, whether it is a ROCclr fill kernel).
    kernels: FxMap<u64, (NameId, bool)>,
    /// Launched function → kernel name, learned from the dispatches of launches.
    functions: FxMap<u64, NameId>,
    /// Launch calls of functions whose kernel is not known yet, held until a dispatch of theirs
    /// names it (or the window's flush): (function, call).
    held: Vec<(u64, Activity)>,
    /// Held calls whose kernel is now known, for [`Decoder::take_released`].
    released: Vec<Activity>,
    /// Recent (stream, row), (kernel id, name, fill), (function, name) and (agent, device)
    /// lookups.
    recent_streams: Recent<Stream, u32>,
    recent_kernels: Recent<u64, (NameId, bool)>,
    recent_functions: Recent<u64, NameId>,
    last_device: Option<(u64, u32)>,
    /// The call whose fill kernel was last mapped: a memset split into several fill dispatches
    /// counts its bytes once.
    last_fill: u64,
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
            hip: OpTable::new(hip.iter().map(|(op, n)| {
                (
                    *op as u32,
                    ApiName {
                        name: intern(n),
                        launches_work: starts_flow(n),
                        noise: NOISE.contains(&n.as_str()),
                    },
                )
            })),
            copies: OpTable::new(copies.iter().map(|(op, n)| (*op as u32, copy_direction(n)))),
            frees: OpTable::new([]),
            devices: gpus.into_iter().collect(),
            streams: FxMap::default(),
            kernels: FxMap::default(),
            functions: FxMap::default(),
            held: Vec::new(),
            released: Vec::new(),
            recent_streams: Recent::EMPTY,
            recent_kernels: Recent::EMPTY,
            recent_functions: Recent::EMPTY,
            last_device: None,
            last_fill: 0,
            unknown_kernel: intern(UNKNOWN_KERNEL),
            keep_noise,
        }
    }

    /// The memory-allocation operations (number → SDK name): `…FREE` ones free, the others
    /// allocate.
    pub fn with_allocations(mut self, ops: &[(i32, String)]) -> Decoder {
        self.frees = OpTable::new(ops.iter().map(|(op, n)| (*op as u32, n.ends_with("FREE"))));
        self
    }

    fn time(&self, sdk_ns: u64) -> UnixNanos {
        UnixNanos((sdk_ns as i64).saturating_add(self.offset_ns).max(0) as u64)
    }

    /// The device index of an agent: its index among GPUs, or (an agent the SDK did not list) the
    /// next free one.
    #[inline]
    fn device(&mut self, agent: u64) -> u32 {
        if let Some((a, d)) = self.last_device {
            if a == agent {
                return d;
            }
        }
        let d = match self.devices.get(&agent) {
            Some(d) => *d,
            None => {
                let next = self.devices.values().max().map_or(0, |m| m + 1);
                self.devices.insert(agent, next);
                next
            }
        };
        self.last_device = Some((agent, d));
        d
    }

    /// The row of a stream: the null stream is 0, others numbered from 1 in order of first use.
    #[inline]
    fn stream(&mut self, key: Stream) -> u32 {
        if let Some(s) = self.recent_streams.get(key) {
            return s;
        }
        let s = match key {
            Stream::Hip(0) => 0,
            // A lookup first: `entry` costs more, and new streams are rare.
            _ => match self.streams.get(&key) {
                Some(s) => *s,
                None => {
                    let next = self.streams.len() as u32 + 1;
                    self.streams.insert(key, next);
                    next
                }
            },
        };
        self.recent_streams.put(key, s);
        s
    }

    /// The kernel `function` launches, if a dispatch has named it.
    #[inline]
    fn function(&mut self, function: u64) -> Option<NameId> {
        if let Some(n) = self.recent_functions.get(function) {
            return Some(n);
        }
        let n = self.functions.get(&function).copied()?;
        self.recent_functions.put(function, n);
        Some(n)
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
    #[inline]
    fn learn(&mut self, function: u64, name: NameId) {
        // Known already (the usual case): nothing to write.
        if let Some(known) = self.function(function) {
            if known != name {
                self.functions.insert(function, name);
                self.recent_functions.put(function, name);
            }
            return;
        }
        self.functions.insert(function, name);
        if self.held.is_empty() {
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
    #[inline]
    fn call_args(&mut self, args: RawArgs) -> CallArgs {
        match args {
            RawArgs::None => CallArgs::Hip,
            RawArgs::Launch {
                function,
                stream,
                grid,
                block,
                shared,
            } => CallArgs::HipLaunch {
                kernel: self.function(function),
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
            // Kineto writes no arguments for memsets.
            RawArgs::Fill { .. } => CallArgs::Hip,
        }
    }

    /// Maps one record. `kernel_name` looks a kernel id up in the code-object map; `call` gives
    /// what the API callback remembered of a correlation id's call (`External id`, stream,
    /// function). `None` for calls left out as noise (or held, see [`Decoder::take_released`]).
    /// Goes through the record's queue words, as the live path does.
    pub fn decode(
        &mut self,
        raw: &Raw,
        kernel_name: impl FnOnce(u64) -> Option<String>,
        call: impl FnOnce(u64) -> Option<CallInfo>,
    ) -> Option<Activity> {
        self.decode_words(&raw.to_words(), kernel_name, call)
    }

    /// [`Decoder::decode`] of a queue slot's words, read field by field: no [`Raw`] is built on
    /// the way (an enum built in memory and read back at other widths stalls store forwarding on
    /// every record). `None` too for words no `to_words` wrote.
    #[inline]
    pub fn decode_words(
        &mut self,
        w: &Words,
        kernel_name: impl FnOnce(u64) -> Option<String>,
        call: impl FnOnce(u64) -> Option<CallInfo>,
    ) -> Option<Activity> {
        match Tag::of(w)? {
            Tag::Api => self.api(ApiRec::from_words(w)?),
            Tag::Kernel => Some(self.kernel(KernelRec::from_words(w)?, kernel_name, call)),
            Tag::Copy => Some(self.copy(CopyRec::from_words(w)?, call)),
            Tag::Op => Some(self.op(OpRec::from_words(w)?, call)),
            Tag::Memory => Some(self.memory(MemoryRec::from_words(w)?, call)),
        }
    }

    /// A HIP call: `cuda_runtime`, or held until a dispatch names its kernel.
    #[inline]
    fn api(&mut self, r: ApiRec) -> Option<Activity> {
        let ApiRec {
            operation,
            correlation,
            tid,
            start,
            end,
            external: ext,
            args,
        } = r;
        let name = match self.hip.get(operation) {
            Some(n) => n,
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
        Some(a)
    }

    /// A dispatch: a kernel, or a memset for ROCclr's fill kernels.
    #[inline]
    fn kernel(
        &mut self,
        r: KernelRec,
        kernel_name: impl FnOnce(u64) -> Option<String>,
        call: impl FnOnce(u64) -> Option<CallInfo>,
    ) -> Activity {
        let KernelRec {
            correlation,
            start,
            end,
            agent,
            queue,
            kernel_id,
            workgroup,
            grid,
            group_segment,
        } = r;
        let (name, fill) = if let Some(k) = self.recent_kernels.get(kernel_id) {
            k
        } else {
            let (n, fill) = match self.kernels.get(&kernel_id) {
                Some(k) => *k,
                // A name registered later is looked up again next time.
                None => match kernel_name(kernel_id) {
                    Some(s) => {
                        let k = (intern(&s), is_fill_kernel(&s));
                        self.kernels.insert(kernel_id, k);
                        k
                    }
                    None => (self.unknown_kernel, false),
                },
            };
            if n != self.unknown_kernel {
                self.recent_kernels.put(kernel_id, (n, fill));
            }
            (n, fill)
        };
        let info = call(correlation).unwrap_or_default();
        if let Some(f) = info.function {
            if name != self.unknown_kernel {
                self.learn(f, name);
            }
        }
        let stream = self.stream(info.stream.map_or(Stream::Queue(queue), Stream::Hip));
        if fill {
            // A memset's work: Kineto's CUDA memset, with the bytes the call asked for
            // on the first of its fill dispatches (0 on the others, so sums are right;
            // 0 too when the call's arguments were not read).
            let bytes = if self.last_fill == correlation {
                0
            } else {
                info.bytes.unwrap_or(0)
            };
            self.last_fill = correlation;
            return Activity {
                start: self.time(start),
                end: self.time(end),
                correlation: Some(correlation),
                external_id: (info.external != 0).then_some(info.external),
                detail: Detail::Memset(Memset {
                    memory_kind: MemoryKind::Device,
                    bytes,
                    device: self.device(agent),
                    context: None,
                    stream,
                }),
            };
        }
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
                // AQL grid sizes are in work-items; Kineto's grid is in work-groups.
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

    /// A copy, drawn on its GPU end.
    #[inline]
    fn copy(&mut self, r: CopyRec, call: impl FnOnce(u64) -> Option<CallInfo>) -> Activity {
        let CopyRec {
            correlation,
            operation,
            start,
            end,
            src_agent,
            dst_agent,
            bytes,
        } = r;
        let kind = self.copies.get(operation).unwrap_or(MemcpyKind::Unknown);
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

    /// A roctracer HIP_OPS record.
    #[inline]
    fn op(&mut self, r: OpRec, call: impl FnOnce(u64) -> Option<CallInfo>) -> Activity {
        let OpRec {
            correlation,
            start,
            end,
            device,
            queue,
            op,
            kind,
            value,
        } = r;
        // roctracer (Kineto's roctracer path): the device is the KFD node id, the stream
        // the HIP stream's queue index, both as the record gives them.
        let info = call(correlation).unwrap_or_default();
        let device = device.max(0) as u32;
        let stream = queue.min(u64::from(u32::MAX)) as u32;
        if let (ROCTRACER_DISPATCH, Some(f)) = (op, info.function) {
            // The launch's `kernel` argument, as from the SDK's dispatches.
            self.learn(f, NameId(value as u32));
        }
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

    /// A memory allocation or free.
    #[inline]
    fn memory(&mut self, r: MemoryRec, call: impl FnOnce(u64) -> Option<CallInfo>) -> Activity {
        let MemoryRec {
            correlation,
            operation,
            tid,
            start,
            agent,
            address,
            bytes,
        } = r;
        let free = self.frees.get(operation).unwrap_or(false);
        Activity {
            start: self.time(start),
            end: self.time(start),
            correlation: Some(correlation),
            external_id: call(correlation).and_then(|c| (c.external != 0).then_some(c.external)),
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
}

/// Maps every record `queue` holds, in order, and hands each activity to `emit`: the collector's
/// side of both sources (the SDK's and roctracer's). `kernel_name` looks up a kernel id the
/// decoder has not seen (once per kernel); `external` is the table the API callback filled at
/// ENTER. Launch calls held for their kernel's name come out right before the dispatch that
/// named it.
pub fn drain(
    queue: &Queue,
    decoder: &mut Decoder,
    mut kernel_name: impl FnMut(u64) -> Option<String>,
    external: &ExternalIds,
    emit: &mut dyn FnMut(&Activity),
) {
    while let Some(words) = queue.pop() {
        let a = decoder.decode_words(&words, &mut kernel_name, |c| external.call(c));
        if !decoder.released.is_empty() {
            decoder.take_released(false, emit);
        }
        if let Some(a) = a {
            emit(&a);
        }
    }
}

#[cfg(test)]
mod tests;
