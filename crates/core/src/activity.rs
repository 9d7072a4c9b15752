//! The one record type every source produces and every sink consumes.
//!
//! An [`Activity`] is `Copy` and holds no heap data: names are [`NameId`]s, so records can sit in
//! fixed-size ring slots and be produced without allocating. Fields a backend cannot fill are `None`
//! (they are left out of the trace), never a made-up zero.

use crate::clock::UnixNanos;
use crate::intern::NameId;

/// One thing that happened, on the CPU or on a GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activity {
    /// Start, in the Unix-nanosecond domain.
    pub start: UnixNanos,
    /// End; equal to `start` for instant events.
    pub end: UnixNanos,
    /// The backend's correlation id: shared by a runtime/driver call and the GPU records it launched.
    pub correlation: Option<u64>,
    /// The id of the CPU span this record belongs to. A span's own id for CPU spans; the enclosing
    /// span's id for API calls and GPU records launched inside it; `None` when not linked.
    pub external_id: Option<u64>,
    /// What kind of record, with its kind-specific fields.
    pub detail: Detail,
}

impl Activity {
    /// `end - start` in nanoseconds, 0 when the backend reported `end < start`.
    pub fn dur_ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// The broad class of this record, as used for activity selection.
    pub fn activity_type(&self) -> ActivityType {
        self.detail.activity_type()
    }

    /// The OS thread a host record happened on (`None` for device records).
    pub fn thread(&self) -> Option<u32> {
        match &self.detail {
            Detail::CpuOp(s) | Detail::UserAnnotation(s) => Some(s.tid),
            Detail::PythonFunction(p) => Some(p.span.tid),
            Detail::Runtime(a) | Detail::Driver(a) => Some(a.tid),
            Detail::Memory(m) => Some(m.tid),
            Detail::Marker(m) => Some(m.tid),
            _ => None,
        }
    }
}

/// Kind-specific fields.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Detail {
    /// An operator on a CPU thread (Kineto `cpu_op`).
    CpuOp(CpuSpan),
    /// A named user range, including `ProfilerStep#N` (Kineto `user_annotation`).
    UserAnnotation(CpuSpan),
    /// A Python frame (Kineto `python_function`, torch.profiler's `with_stack`): its `Python id`
    /// is the activity's `external_id`.
    PythonFunction(PythonSpan),
    /// A CUDA/HIP runtime API call (Kineto `cuda_runtime`).
    Runtime(ApiCall),
    /// A driver API call (Kineto `cuda_driver`).
    Driver(ApiCall),
    /// A kernel execution on a GPU.
    Kernel(Kernel),
    /// A memory copy on a GPU.
    Memcpy(Memcpy),
    /// A memory set on a GPU.
    Memset(Memset),
    /// A synchronization (Kineto `cuda_sync`).
    Sync(Sync),
    /// A memory allocation or free (Kineto `[memory]` instant events).
    Memory(Memory),
    /// A marker (NVTX/roctx), instant or range.
    Marker(Marker),
    /// Time the profiling backend itself spent (Kineto `overhead`).
    Overhead(Overhead),
}

impl Detail {
    /// The broad class of this record.
    pub fn activity_type(&self) -> ActivityType {
        match self {
            Detail::CpuOp(_) => ActivityType::CpuOp,
            // Selected with the annotations: Kineto's ACTIVITY_TYPES has no switch of its own for
            // it in kinetrace (`--with-stack` decides whether any are recorded).
            Detail::UserAnnotation(_) | Detail::PythonFunction(_) => ActivityType::UserAnnotation,
            Detail::Runtime(_) => ActivityType::Runtime,
            Detail::Driver(_) => ActivityType::Driver,
            Detail::Kernel(_) => ActivityType::Kernel,
            Detail::Memcpy(_) => ActivityType::Memcpy,
            Detail::Memset(_) => ActivityType::Memset,
            Detail::Sync(_) => ActivityType::Sync,
            Detail::Memory(_) => ActivityType::Memory,
            Detail::Marker(_) => ActivityType::Marker,
            Detail::Overhead(_) => ActivityType::Overhead,
        }
    }
}

/// A range on a CPU thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSpan {
    /// The span's name.
    pub name: NameId,
    /// OS process id.
    pub pid: u32,
    /// OS (system) thread id.
    pub tid: u32,
    /// What a framework op says beyond its name (none for plain ranges).
    pub args: OpArgs,
}

/// A Python frame's range on a CPU thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonSpan {
    /// Its name (`file.py(line): func`, `nn.Module: Linear_0`), thread and args (the interned
    /// `CallFrom` / `Python module id` text).
    pub span: CpuSpan,
    /// The `Python id` of the frame it was called from, when that one is recorded too.
    pub parent: Option<u64>,
}

/// What PyTorch says of an op beyond its name: its args (`Input Dims`, `Input type`, `Input
/// Strides`, `Concrete Inputs`, a collective's sizes and group, as one interned text: see
/// [`crate::op_args`]), its autograd sequence number (`Sequence number`, shared by a forward op
/// and its backward function) and its part in autograd's backward pass. Eight bytes, so it fits in
/// a ring slot beside a span's begin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpArgs {
    /// The interned args text, or [`OpArgs::NONE_ID`].
    args: u32,
    /// The sequence number in the low 30 bits ([`OpArgs::NO_SEQUENCE`]: none), the
    /// [`AutogradRole`] in the top two.
    sequence: u32,
}

/// An op's part in autograd's backward pass, which decides where its sequence number comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutogradRole {
    /// Neither of the two below.
    None,
    /// `autograd::engine::evaluate_function: …`: PyTorch records it without a sequence number and
    /// torch.profiler gives it the one of the backward function it runs (the op that begins next
    /// on its thread, if that is one); the collector does the same.
    EvaluateFunction,
    /// A backward function (`AddmmBackward0`), PyTorch's `BACKWARD_FUNCTION` scope.
    BackwardFunction,
}

impl Default for OpArgs {
    fn default() -> Self {
        OpArgs::NONE
    }
}

impl OpArgs {
    const NONE_ID: u32 = 0;
    const NO_SEQUENCE: u32 = (1 << 30) - 1;
    const ROLE_SHIFT: u32 = 30;
    /// Nothing beyond the name.
    pub const NONE: OpArgs = OpArgs {
        args: Self::NONE_ID,
        sequence: Self::NO_SEQUENCE,
    };

    /// Args with an interned args text and a sequence number, each optional. A sequence number
    /// of 2^30 - 1 or more is not kept (a thread records that many autograd ops after about a
    /// billion of them).
    pub fn new(args: Option<crate::op_args::ArgsId>, sequence: Option<u64>) -> OpArgs {
        OpArgs {
            // Generations start at 1, so no valid id is 0.
            args: args.map_or(Self::NONE_ID, |a| a.0),
            sequence: sequence
                .filter(|s| *s < u64::from(Self::NO_SEQUENCE))
                .map_or(Self::NO_SEQUENCE, |s| s as u32),
        }
    }

    /// The same args with `role`.
    pub fn with_role(self, role: AutogradRole) -> OpArgs {
        let bits = match role {
            AutogradRole::None => 0,
            AutogradRole::EvaluateFunction => 1,
            AutogradRole::BackwardFunction => 2,
        };
        OpArgs {
            args: self.args,
            sequence: (self.sequence & Self::NO_SEQUENCE) | (bits << Self::ROLE_SHIFT),
        }
    }

    /// The same args (and role) with the sequence number `sequence`.
    pub fn with_sequence(self, sequence: Option<u64>) -> OpArgs {
        OpArgs::new(self.args(), sequence).with_role(self.role())
    }

    /// The interned args text.
    pub fn args(self) -> Option<crate::op_args::ArgsId> {
        (self.args != Self::NONE_ID).then_some(crate::op_args::ArgsId(self.args))
    }

    /// The autograd sequence number.
    pub fn sequence(self) -> Option<u64> {
        let s = self.sequence & Self::NO_SEQUENCE;
        (s != Self::NO_SEQUENCE).then_some(u64::from(s))
    }

    /// The op's part in autograd's backward pass.
    pub fn role(self) -> AutogradRole {
        match self.sequence >> Self::ROLE_SHIFT {
            1 => AutogradRole::EvaluateFunction,
            2 => AutogradRole::BackwardFunction,
            _ => AutogradRole::None,
        }
    }
}

/// A runtime or driver API call, timed on the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiCall {
    /// The API name without `_v1234` version suffixes, e.g. `cudaLaunchKernel`.
    pub name: NameId,
    /// The backend's callback id (`cbid` for CUPTI, `cid` for ROCm).
    pub cbid: Option<u32>,
    /// OS process id.
    pub pid: u32,
    /// OS (system) thread id.
    pub tid: u32,
    /// Whether this call launches GPU work (or waits for it), so the trace draws a flow from it.
    pub launches_work: bool,
    /// Which backend's call it is and what of its arguments the trace shows.
    pub args: CallArgs,
}

/// The arguments of a runtime call the trace shows, and whose call it is: Kineto writes a CUDA
/// call's id as `cbid` and a HIP call's as `cid`, with the launch, copy and allocation arguments of
/// HIP calls (its ROCm path's `cuda_runtime` args). Every variant but [`CallArgs::None`] is a HIP
/// call. Values are as the call received them: addresses and streams are the pointers' values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CallArgs {
    /// A CUDA (CUPTI) call: nothing beyond the callback id (`cbid`).
    #[default]
    None,
    /// A HIP call (`cid`) with no argument the trace shows (or none the SDK gave).
    Hip,
    /// A HIP kernel launch: `kernel` (when known), `stream`, `grid`, `block`, `shared memory`.
    HipLaunch {
        /// The kernel's name, when kinetrace knows the launched function.
        kernel: Option<NameId>,
        /// The `hipStream_t` (0: the null stream).
        stream: u64,
        /// The grid as the call gave it (`numBlocks`, `gridDim*`, `globalWorkSize*`).
        grid: [u32; 3],
        /// The block as the call gave it (`dimBlocks`, `blockDim*`, `localWorkSize*`).
        block: [u32; 3],
        /// Dynamic LDS bytes (`sharedMemBytes`).
        shared_memory: u32,
    },
    /// A HIP copy: `stream` (calls that take one), `src`, `dst`, `size`, `kind` (`hipMemcpyKind`).
    HipCopy {
        /// The `hipStream_t`, for the calls that take one.
        stream: Option<u64>,
        /// Source address.
        src: u64,
        /// Destination address.
        dst: u64,
        /// `sizeBytes`.
        size: u64,
        /// `hipMemcpyKind` as a number (0 HtoH, 1 HtoD, 2 DtoH, 3 DtoD, 4 default).
        kind: u32,
    },
    /// `hipMalloc` / `hipFree`: `ptr`, and for an allocation its `size`.
    HipMalloc {
        /// The block (hipMalloc: the one returned; hipFree: the one freed).
        ptr: u64,
        /// Bytes asked for (hipMalloc only).
        size: Option<u64>,
    },
}

impl CallArgs {
    /// Whether this is a HIP call (Kineto's ROCm path names its id `cid`).
    pub fn is_hip(&self) -> bool {
        !matches!(self, CallArgs::None)
    }
}

/// A kernel execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The (demangled) kernel name.
    pub name: NameId,
    /// Device index.
    pub device: u32,
    /// Context id.
    pub context: Option<u32>,
    /// Stream id.
    pub stream: u32,
    /// Grid dimensions.
    pub grid: Option<[u32; 3]>,
    /// Block dimensions.
    pub block: Option<[u32; 3]>,
    /// Registers per thread.
    pub registers_per_thread: Option<u32>,
    /// Static plus dynamic shared memory per block, in bytes.
    pub shared_memory: Option<u64>,
    /// When the launch was queued, if the backend measured it.
    pub queued: Option<UnixNanos>,
    /// The CUDA graph the kernel ran in.
    pub graph_id: Option<u32>,
    /// The node within that graph.
    pub graph_node_id: Option<u64>,
    /// Write Kineto's ROCm `kind` arg (`Dispatch Kernel`): its ROCm events have it, its CUDA ones
    /// do not.
    pub kind_arg: bool,
}

/// Direction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum MemcpyKind {
    HtoD,
    DtoH,
    HtoA,
    AtoH,
    AtoA,
    AtoD,
    DtoA,
    DtoD,
    HtoH,
    PtoP,
    Unknown,
}

impl MemcpyKind {
    /// The spelling Kineto uses in copy names.
    pub fn as_str(self) -> &'static str {
        match self {
            MemcpyKind::HtoD => "HtoD",
            MemcpyKind::DtoH => "DtoH",
            MemcpyKind::HtoA => "HtoA",
            MemcpyKind::AtoH => "AtoH",
            MemcpyKind::AtoA => "AtoA",
            MemcpyKind::AtoD => "AtoD",
            MemcpyKind::DtoA => "DtoA",
            MemcpyKind::DtoD => "DtoD",
            MemcpyKind::HtoH => "HtoH",
            MemcpyKind::PtoP => "PtoP",
            MemcpyKind::Unknown => "Unknown",
        }
    }
}

/// Where the memory a copy or set touches lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum MemoryKind {
    Pageable,
    Pinned,
    /// Host memory of a kind the backend does not tell (ROCm copies: Kineto's `Host`).
    Host,
    Device,
    Array,
    Managed,
    DeviceStatic,
    ManagedStatic,
    Unknown,
}

impl MemoryKind {
    /// The spelling Kineto uses in copy and set names.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Pageable => "Pageable",
            MemoryKind::Pinned => "Pinned",
            MemoryKind::Host => "Host",
            MemoryKind::Device => "Device",
            MemoryKind::Array => "Array",
            MemoryKind::Managed => "Managed",
            MemoryKind::DeviceStatic => "Device Static",
            MemoryKind::ManagedStatic => "Managed Static",
            MemoryKind::Unknown => "Unknown",
        }
    }
}

/// A memory copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memcpy {
    /// Direction.
    pub kind: MemcpyKind,
    /// Source memory kind.
    pub src_kind: MemoryKind,
    /// Destination memory kind.
    pub dst_kind: MemoryKind,
    /// Bytes copied.
    pub bytes: u64,
    /// Device the copy ran on.
    pub device: u32,
    /// Context id.
    pub context: Option<u32>,
    /// Stream id.
    pub stream: u32,
    /// Write Kineto's ROCm `kind` arg (the direction, `HtoD`): its ROCm events have it, its CUDA
    /// ones do not.
    pub kind_arg: bool,
    /// Source and destination of a peer-to-peer copy.
    pub peer: Option<PeerCopy>,
}

/// The two ends of a peer-to-peer copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCopy {
    /// Source device.
    pub src_device: u32,
    /// Destination device.
    pub dst_device: u32,
    /// Source context.
    pub src_context: Option<u32>,
    /// Destination context.
    pub dst_context: Option<u32>,
}

/// A memory set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memset {
    /// Kind of memory set.
    pub memory_kind: MemoryKind,
    /// Bytes set.
    pub bytes: u64,
    /// Device.
    pub device: u32,
    /// Context id.
    pub context: Option<u32>,
    /// Stream id.
    pub stream: u32,
}

/// What a synchronization waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncKind {
    /// `cudaEventSynchronize`.
    EventSync,
    /// `cudaStreamWaitEvent`.
    StreamWaitEvent,
    /// `cudaStreamSynchronize`.
    StreamSync,
    /// `cudaDeviceSynchronize` / context synchronize.
    ContextSync,
    /// A kind this build does not know.
    Unknown,
}

impl SyncKind {
    /// The event name Kineto writes.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncKind::EventSync => "Event Sync",
            SyncKind::StreamWaitEvent => "Stream Wait Event",
            SyncKind::StreamSync => "Stream Sync",
            SyncKind::ContextSync => "Context Sync",
            SyncKind::Unknown => "Unknown Sync",
        }
    }

    /// Kineto's `cuda_sync_kind` arg value (the CUPTI enum value).
    pub fn code(self) -> u32 {
        match self {
            SyncKind::Unknown => 0,
            SyncKind::EventSync => 1,
            SyncKind::StreamWaitEvent => 2,
            SyncKind::StreamSync => 3,
            SyncKind::ContextSync => 4,
        }
    }
}

/// A synchronization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sync {
    /// What was waited for.
    pub kind: SyncKind,
    /// Device (looked up from the context by the backend).
    pub device: Option<u32>,
    /// Context id.
    pub context: Option<u32>,
    /// The stream involved, if any.
    pub stream: Option<u32>,
    /// The CUDA event involved, if any.
    pub event_id: Option<u32>,
    /// For event waits: the stream the awaited event was recorded on.
    pub wait_on_stream: Option<u32>,
    /// For event waits: the correlation id of the `cudaEventRecord` that recorded it.
    pub wait_on_event_record_correlation: Option<u64>,
}

/// Whether memory was allocated or freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryOp {
    /// Allocation.
    Alloc,
    /// Free.
    Free,
}

/// A memory allocation or free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Allocation or free.
    pub op: MemoryOp,
    /// Device index; `None` for host memory.
    pub device: Option<u32>,
    /// Address of the block.
    pub address: u64,
    /// Size of the block in bytes.
    pub bytes: u64,
    /// Bytes allocated on this device after the operation, if known.
    pub total_allocated: Option<u64>,
    /// Bytes reserved by the allocator on this device after the operation, if known.
    pub total_reserved: Option<u64>,
    /// OS process id of the allocating process.
    pub pid: u32,
    /// OS thread id of the allocating thread.
    pub tid: u32,
}

/// An NVTX/roctx marker: a range (`start < end`) or an instant (`start == end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    /// Marker message.
    pub name: NameId,
    /// Marker domain, if any.
    pub domain: Option<NameId>,
    /// OS process id.
    pub pid: u32,
    /// OS thread id.
    pub tid: u32,
}

/// What the backend's overhead was spent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum OverheadKind {
    DriverCompiler,
    BufferFlush,
    Instrumentation,
    Resource,
    RuntimeTriggeredModuleLoading,
    LazyFunctionLoading,
    CommandBufferFull,
    ActivityBufferRequest,
    Unknown,
}

impl OverheadKind {
    /// The event name Kineto writes.
    pub fn as_str(self) -> &'static str {
        match self {
            OverheadKind::DriverCompiler => "Driver Compiler",
            OverheadKind::BufferFlush => "Buffer Flush",
            OverheadKind::Instrumentation => "Instrumentation",
            OverheadKind::Resource => "Resource",
            OverheadKind::RuntimeTriggeredModuleLoading => "Runtime Triggered Module Loading",
            OverheadKind::LazyFunctionLoading => "Lazy Function Loading",
            OverheadKind::CommandBufferFull => "Command Buffer Full",
            OverheadKind::ActivityBufferRequest => "Activity Buffer Request",
            OverheadKind::Unknown => "Unknown",
        }
    }
}

/// Profiler overhead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overhead {
    /// What it was spent on.
    pub kind: OverheadKind,
}

/// The classes of activity a profiler can be asked to record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ActivityType {
    CpuOp,
    UserAnnotation,
    Runtime,
    Driver,
    Kernel,
    Memcpy,
    Memset,
    Sync,
    Memory,
    Marker,
    Overhead,
}

impl ActivityType {
    /// Every type, in a fixed order.
    pub const ALL: [ActivityType; 11] = [
        ActivityType::CpuOp,
        ActivityType::UserAnnotation,
        ActivityType::Runtime,
        ActivityType::Driver,
        ActivityType::Kernel,
        ActivityType::Memcpy,
        ActivityType::Memset,
        ActivityType::Sync,
        ActivityType::Memory,
        ActivityType::Marker,
        ActivityType::Overhead,
    ];

    /// Whether records of this type happen on a host thread (spans, API calls, markers,
    /// allocations, tracing overhead) rather than on a device queue. A window keeps host records
    /// that start before its end; device records launched inside it may run past it.
    pub fn on_host(self) -> bool {
        !matches!(
            self,
            ActivityType::Kernel | ActivityType::Memcpy | ActivityType::Memset | ActivityType::Sync
        )
    }

    /// The Kineto `cat` name (also the `ACTIVITY_TYPES` config spelling).
    pub fn kineto_name(self) -> &'static str {
        match self {
            ActivityType::CpuOp => "cpu_op",
            ActivityType::UserAnnotation => "user_annotation",
            ActivityType::Runtime => "cuda_runtime",
            ActivityType::Driver => "cuda_driver",
            ActivityType::Kernel => "kernel",
            ActivityType::Memcpy => "gpu_memcpy",
            ActivityType::Memset => "gpu_memset",
            ActivityType::Sync => "cuda_sync",
            ActivityType::Memory => "cpu_instant_event",
            ActivityType::Marker => "marker",
            ActivityType::Overhead => "overhead",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A set of [`ActivityType`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActivitySet(u32);

impl ActivitySet {
    /// No types.
    pub const fn empty() -> Self {
        ActivitySet(0)
    }

    /// Every type.
    pub fn all() -> Self {
        ActivityType::ALL
            .iter()
            .fold(Self::empty(), |s, t| s.with(*t))
    }

    /// What Kineto records by default: everything but memory and markers.
    pub fn default_set() -> Self {
        Self::all()
            .without(ActivityType::Memory)
            .without(ActivityType::Marker)
    }

    /// Only CPU-side types (spans and annotations).
    pub fn cpu() -> Self {
        Self::empty()
            .with(ActivityType::CpuOp)
            .with(ActivityType::UserAnnotation)
    }

    /// Only GPU-side types and the API calls that link them.
    pub fn gpu() -> Self {
        Self::all()
            .without(ActivityType::CpuOp)
            .without(ActivityType::UserAnnotation)
            .without(ActivityType::Memory)
            .without(ActivityType::Marker)
    }

    /// This set plus `t`.
    pub const fn with(self, t: ActivityType) -> Self {
        ActivitySet(self.0 | (1 << (t as u32)))
    }

    /// This set without `t`.
    pub fn without(self, t: ActivityType) -> Self {
        ActivitySet(self.0 & !t.bit())
    }

    /// The union of two sets.
    pub fn union(self, other: ActivitySet) -> Self {
        ActivitySet(self.0 | other.0)
    }

    /// Whether `t` is in the set.
    pub fn contains(self, t: ActivityType) -> bool {
        self.0 & t.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The members, in [`ActivityType::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = ActivityType> {
        ActivityType::ALL
            .into_iter()
            .filter(move |t| self.contains(*t))
    }
}

impl Default for ActivitySet {
    fn default() -> Self {
        Self::default_set()
    }
}

/// Static properties of one GPU, for the trace's `deviceProperties`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct DeviceProperties {
    pub id: u32,
    pub name: String,
    pub total_global_mem: u64,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub max_threads_per_block: u32,
    pub max_threads_per_multiprocessor: u32,
    pub regs_per_block: u32,
    pub warp_size: u32,
    pub shared_mem_per_block: u64,
    pub num_sms: u32,
    /// CUDA only.
    pub regs_per_multiprocessor: Option<u32>,
    /// CUDA only.
    pub shared_mem_per_block_optin: Option<u64>,
    /// CUDA only.
    pub shared_mem_per_multiprocessor: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_stay_small() {
        // Ring slots hold Activities by value; keep them within three cache lines (a kernel record
        // with every optional field is the largest variant).
        assert!(
            std::mem::size_of::<Activity>() <= 192,
            "{}",
            std::mem::size_of::<Activity>()
        );
    }

    #[test]
    fn op_args_keep_sequence_and_role_apart() {
        let id = crate::op_args::ArgsId(7 << 24);
        let a = OpArgs::new(Some(id), Some(27)).with_role(AutogradRole::BackwardFunction);
        assert_eq!(
            (a.args(), a.sequence(), a.role()),
            (Some(id), Some(27), AutogradRole::BackwardFunction)
        );
        let e = OpArgs::new(None, None).with_role(AutogradRole::EvaluateFunction);
        assert_eq!((e.args(), e.sequence()), (None, None));
        let e = e.with_sequence(Some(27));
        assert_eq!(
            (e.sequence(), e.role()),
            (Some(27), AutogradRole::EvaluateFunction)
        );
        assert_eq!(OpArgs::NONE.role(), AutogradRole::None);
        // The largest kept, and the first not kept.
        assert_eq!(
            OpArgs::new(None, Some((1 << 30) - 2)).sequence(),
            Some((1 << 30) - 2)
        );
        assert_eq!(OpArgs::new(None, Some((1 << 30) - 1)).sequence(), None);
        assert_eq!(std::mem::size_of::<OpArgs>(), 8);
    }

    #[test]
    fn activity_set_ops() {
        let s = ActivitySet::empty().with(ActivityType::Kernel);
        assert!(s.contains(ActivityType::Kernel));
        assert!(!s.contains(ActivityType::Memcpy));
        assert!(!ActivitySet::default_set().contains(ActivityType::Memory));
        assert_eq!(ActivitySet::all().iter().count(), ActivityType::ALL.len());
        assert!(ActivitySet::cpu()
            .union(ActivitySet::gpu())
            .contains(ActivityType::Runtime));
    }
}
