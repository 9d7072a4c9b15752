//! What a framework's own recorder adds to a window (the switches torch.profiler names
//! `record_shapes`, `with_stack`, `profile_memory`), and what a distributed job says of itself
//! (`distributedInfo`). The session carries both to the trace head; the framework side (the
//! shim's PyTorch hooks) reads the options of the window open now to know what to turn on.

/// The framework recorders' switches for one window. Each one that is on is written in the trace
/// head as torch.profiler writes it (`"record_shapes": 1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameworkOptions {
    /// Ops' input shapes, types, strides and scalar values (`Input Dims`, `Input type`, …).
    pub record_shapes: bool,
    /// Python call stacks (`python_function` events).
    pub with_stack: bool,
    /// The framework allocator's events (`[memory]` instant events).
    pub profile_memory: bool,
}

/// What one capture request changes in the session's [`FrameworkOptions`]: `None` keeps the
/// session's own setting (a dynolog request that does not name the key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameworkOverrides {
    /// Replaces [`FrameworkOptions::record_shapes`].
    pub record_shapes: Option<bool>,
    /// Replaces [`FrameworkOptions::with_stack`].
    pub with_stack: Option<bool>,
    /// Replaces [`FrameworkOptions::profile_memory`].
    pub profile_memory: Option<bool>,
}

impl FrameworkOverrides {
    /// `base` with these changes.
    pub fn apply(self, base: FrameworkOptions) -> FrameworkOptions {
        FrameworkOptions {
            record_shapes: self.record_shapes.unwrap_or(base.record_shapes),
            with_stack: self.with_stack.unwrap_or(base.with_stack),
            profile_memory: self.profile_memory.unwrap_or(base.profile_memory),
        }
    }
}

/// A distributed job's view of itself, as torch.profiler writes it in `distributedInfo`
/// (`torch.distributed`'s backend, rank, world size and process groups).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DistributedInfo {
    /// The default group's backend (`nccl`, `gloo`, `cpu:gloo,cuda:nccl`).
    pub backend: Option<String>,
    /// This process's global rank.
    pub rank: u32,
    /// Processes in the default group.
    pub world_size: Option<u32>,
    /// Process groups created so far.
    pub pg_count: Option<u64>,
    /// Every process group (`pg_config`), when known.
    pub pg_config: Option<Vec<ProcessGroupConfig>>,
    /// The NCCL version (`2.21.5`), for NCCL jobs.
    pub nccl_version: Option<String>,
}

/// One process group of a [`DistributedInfo`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessGroupConfig {
    /// The group's name (`"0"` for the default group).
    pub pg_name: String,
    /// Its description (`default_pg`).
    pub pg_desc: String,
    /// Its backend per device type (`cpu:gloo,cuda:gloo`).
    pub backend_config: String,
    /// Its size.
    pub pg_size: u64,
    /// The global ranks in it.
    pub ranks: Vec<u64>,
}
