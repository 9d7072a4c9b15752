//! Turns records into Kineto JSON events, one record at a time, with no allocation per record once
//! a name has been seen (escaped names are cached by id).
//!
//! Each record kind is written as a typed view over the JSON writer ([`crate::json`]): members in
//! Kineto's order, containers closed by the writer, so every event is balanced by construction.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use kinetrace_core::activity::*;
use kinetrace_core::intern::NameId;
use kinetrace_core::{op_args, ArgsId, UnixNanos, WindowInfo};

use crate::json::{
    key, member, Array, Compact, JsonStr, Key, Lines, Member, Object, OpenArray, OpenObject, Rows,
};

/// Streams one Kineto trace document: [`begin`](Self::begin) writes what is known when the window
/// opens (ending with `"traceEvents": [`), [`event`](Self::event) appends each record, and
/// [`finish`](Self::finish) writes the per-row metadata events, closes the array and writes what is
/// known only at the end. The output goes to any byte buffer the caller drains as it likes.
pub struct TraceEncoder {
    pub(crate) ev: Events,
    pub(crate) doc: OpenArray<Rows, OpenObject<Lines>>,
    /// The ids of the devices the head listed in `deviceProperties` (empty: the head has no such
    /// key, and the tail writes it).
    pub(crate) head_devices: Vec<u32>,
}

impl TraceEncoder {
    /// Writes the head of the document for `window` into `out`, with `ts` relative to `base_ns`.
    pub fn begin(window: &WindowInfo, base_ns: u64, out: &mut Vec<u8>) -> Self {
        let doc = crate::document::head(window, base_ns, out);
        TraceEncoder {
            ev: Events::new(base_ns),
            doc,
            head_devices: window.devices.iter().map(|d| d.id).collect(),
        }
    }

    /// Appends the JSON for one record (and its flow event, if it has one) to `out`.
    #[inline(always)]
    pub fn event(&mut self, a: &Activity, out: &mut Vec<u8>) {
        let ev = &mut self.ev;
        self.doc.elements(out, |events| ev.event(a, events));
    }

    /// Records encoded so far.
    pub fn events(&self) -> u64 {
        self.ev.count
    }
}

/// The per-trace state of the event writer: the zero point, the escaped-name cache and the rows
/// used (for the metadata events at the end).
pub(crate) struct Events {
    pub(crate) base_ns: u64,
    names: Vec<Option<JsonStr>>,
    /// The last `ProfilerStep#N` name written (see [`NameId::step`]).
    step_name: Option<(NameId, JsonStr)>,
    pub(crate) cpu_rows: HashSet<(u32, u32)>,
    pub(crate) gpu_rows: HashSet<(u32, u32)>,
    pub(crate) devices: BTreeSet<u32>,
    pub(crate) device_rows: BTreeSet<u32>,
    pub(crate) overhead: bool,
    last_cpu_row: Option<(u32, u32)>,
    last_gpu_row: Option<(u32, u32)>,
    /// The last forward op seen per autograd sequence number (its row and start), for the
    /// `fwdbwd` flow to the backward function with the same number; bounded (cleared when full).
    forward_ops: HashMap<u64, ((i64, i64), UnixNanos)>,
    /// Whether a name is a backward function's (`…Backward0`), by name id.
    backward_names: HashMap<NameId, bool>,
    fwdbwd_flows: u64,
    /// Ops' args texts by id, direct-mapped (ops repeat the same few texts).
    args: Vec<Option<(ArgsId, OpArgsText)>>,
    /// The collective members of recent ops that have them, by the op's `External id`: GPU work
    /// launched inside such an op gets them too, as Kineto copies `record_param_comms`' args onto
    /// NCCL kernels. Bounded (cleared when full).
    collectives: HashMap<u64, OpArgsText>,
    count: u64,
}

/// Entries in the args cache (a power of two).
const ARGS_SLOTS: usize = 4096;

/// An op's args text, and where its collective members start (the text's length: none).
#[derive(Clone)]
struct OpArgsText {
    text: Arc<str>,
    collective_at: usize,
}

impl OpArgsText {
    fn new(text: Arc<str>) -> Self {
        // The recorder writes a collective's members last, `"Collective name"` first of them.
        let collective_at =
            memchr::memmem::find(text.as_bytes(), br#""Collective name":"#).unwrap_or(text.len());
        OpArgsText {
            text,
            collective_at,
        }
    }

    fn collective(&self) -> &[u8] {
        &self.text.as_bytes()[self.collective_at..]
    }
}

type Event<'a> = Object<'a, Compact>;

/// The two flow kinds Kineto writes: launch to GPU work, forward op to backward function.
#[derive(Clone, Copy)]
enum Flow {
    Ac2g,
    FwdBwd,
}

/// `"ph":"X","cat":…`: the start of every complete event.
#[inline(always)]
fn complete(e: &mut Event<'_>, cat: Member) {
    e.member(member!("ph", "X"));
    e.member(cat);
}

/// Only linked records carry an `External id`: writing one for unlinked records mis-links them.
#[inline(always)]
fn external_id(args: &mut Event<'_>, id: Option<u64>) {
    if let Some(id) = id {
        args.u64(key!("External id"), id);
    }
}

#[inline(always)]
fn opt_u64(args: &mut Event<'_>, k: Key<'_>, v: Option<u64>) {
    if let Some(v) = v {
        args.u64(k, v);
    }
}

#[inline(always)]
fn dim3(args: &mut Event<'_>, k: Key<'_>, d: Option<[u32; 3]>) {
    if let Some(d) = d {
        args.array::<Compact>(k, |a| {
            for v in d {
                a.u64(v as u64);
            }
        });
    }
}

/// Bytes per ns is GB/s. Kineto HEAD omits the key for zero durations.
#[inline(always)]
fn bandwidth(args: &mut Event<'_>, bytes: u64, dur_ns: u64) {
    if dur_ns > 0 {
        args.f64(
            key!("memory bandwidth (GB/s)"),
            bytes as f64 / dur_ns as f64,
        );
    }
}

impl Events {
    fn new(base_ns: u64) -> Self {
        Events {
            base_ns,
            names: Vec::new(),
            step_name: None,
            cpu_rows: HashSet::new(),
            gpu_rows: HashSet::new(),
            devices: BTreeSet::new(),
            device_rows: BTreeSet::new(),
            overhead: false,
            last_cpu_row: None,
            last_gpu_row: None,
            forward_ops: HashMap::new(),
            backward_names: HashMap::new(),
            fwdbwd_flows: 0,
            args: vec![None; ARGS_SLOTS],
            collectives: HashMap::new(),
            count: 0,
        }
    }

    /// The args text of `id` (none once its generation has passed).
    fn op_args(&mut self, id: ArgsId) -> Option<OpArgsText> {
        let slot = &mut self.args[id.0 as usize % ARGS_SLOTS];
        match slot {
            Some((cached, text)) if *cached == id => Some(text.clone()),
            _ => {
                let text = OpArgsText::new(op_args::resolve(id)?);
                *slot = Some((id, text.clone()));
                Some(text)
            }
        }
    }

    pub(crate) fn rel(&self, t: UnixNanos) -> u64 {
        // Kineto clamps negative relative times to 0.
        t.0.saturating_sub(self.base_ns)
    }

    #[inline(always)]
    fn name(&mut self, id: NameId) -> &JsonStr {
        if id.step_number().is_some() {
            // A step's name is used once: formatted, not cached by id (step ids are not dense).
            if self
                .step_name
                .as_ref()
                .is_none_or(|(cached, _)| *cached != id)
            {
                self.step_name = Some((id, JsonStr::new(&id.resolve())));
            }
            return &self.step_name.as_ref().expect("just set").1;
        }
        let i = id.0 as usize;
        if i >= self.names.len() {
            self.names.resize_with(i + 1, || None);
        }
        self.names[i].get_or_insert_with(|| JsonStr::new(&id.resolve()))
    }

    #[inline(always)]
    fn cpu_row(&mut self, pid: u32, tid: u32) {
        if self.last_cpu_row != Some((pid, tid)) {
            self.cpu_rows.insert((pid, tid));
            self.last_cpu_row = Some((pid, tid));
        }
    }

    #[inline(always)]
    fn gpu_row(&mut self, device: u32, stream: u32) {
        // Consecutive records mostly share a row; skip the set lookups then.
        if self.last_gpu_row != Some((device, stream)) {
            self.devices.insert(device);
            self.gpu_rows.insert((device, stream));
            self.last_gpu_row = Some((device, stream));
        }
    }

    /// `"pid","tid","ts","dur"` of a complete event.
    #[inline(always)]
    fn place(&self, e: &mut Event<'_>, pid: i64, tid: i64, a: &Activity) {
        e.i64(key!("pid"), pid);
        e.i64(key!("tid"), tid);
        e.us3(key!("ts"), self.rel(a.start));
        e.us3(key!("dur"), a.dur_ns());
    }

    /// A `fwdbwd` flow pair, as PyTorch links a forward op to its backward function: `s` at the
    /// forward op with this autograd sequence number that started last, `f` at the backward
    /// function (PyTorch records both with the number; an op's inner ops may share it, and Kineto
    /// links the last of them).
    fn fwdbwd(&mut self, events: &mut Array<'_, Rows>, op: &CpuSpan, a: &Activity) {
        let Some(seq) = op.args.sequence() else {
            return;
        };
        // autograd's evaluate_function range carries its backward function's number, but the
        // flow ends at the function itself, as in torch.profiler's traces.
        if op.args.role() == AutogradRole::EvaluateFunction {
            return;
        }
        let backward = match self.backward_names.get(&op.name) {
            Some(b) => *b,
            None => {
                let b = op.name.resolve().contains("Backward");
                self.backward_names.insert(op.name, b);
                b
            }
        };
        let row = (op.pid as i64, op.tid as i64);
        if !backward {
            if self.forward_ops.len() >= 1 << 20 {
                self.forward_ops.clear();
            }
            // The latest to start wins (records arrive as they end: an op after its inner ops).
            let e = self.forward_ops.entry(seq).or_insert((row, a.start));
            if a.start >= e.1 {
                *e = (row, a.start);
            }
            return;
        }
        let Some((from, at)) = self.forward_ops.get(&seq).copied() else {
            return;
        };
        self.fwdbwd_flows += 1;
        let id = self.fwdbwd_flows;
        self.flow_of(events, Flow::FwdBwd, true, id, from, at);
        self.flow_of(events, Flow::FwdBwd, false, id, row, a.start);
    }

    /// An `ac2g` flow event: `s` at a launch, `f` (bound to the enclosing slice) at everything else.
    #[inline(always)]
    fn flow(
        &self,
        events: &mut Array<'_, Rows>,
        start: bool,
        id: u64,
        row: (i64, i64),
        ts: UnixNanos,
    ) {
        self.flow_of(events, Flow::Ac2g, start, id, row, ts)
    }

    /// A flow event of either kind: `s` (`start`) or `f` with `"bp":"e"`.
    #[inline(always)]
    fn flow_of(
        &self,
        events: &mut Array<'_, Rows>,
        kind: Flow,
        start: bool,
        id: u64,
        (pid, tid): (i64, i64),
        ts: UnixNanos,
    ) {
        events.object::<Compact>(|e| {
            e.member(if start {
                member!("ph", "s")
            } else {
                member!("ph", "f")
            });
            e.u64(key!("id"), id);
            e.i64(key!("pid"), pid);
            e.i64(key!("tid"), tid);
            e.us3(key!("ts"), self.rel(ts));
            match kind {
                Flow::Ac2g => {
                    e.member(member!("cat", "ac2g"));
                    e.member(member!("name", "ac2g"));
                }
                Flow::FwdBwd => {
                    e.member(member!("cat", "fwdbwd"));
                    e.member(member!("name", "fwdbwd"));
                }
            }
            if !start {
                e.member(member!("bp", "e"));
            }
        });
    }

    #[inline(always)]
    fn gpu_flow(&self, events: &mut Array<'_, Rows>, a: &Activity, device: u32, tid: i64) {
        if let Some(corr) = a.correlation {
            self.flow(events, false, corr, (device as i64, tid), a.start);
        }
    }

    /// A runtime call's id, correlation and arguments, in the order and form Kineto writes them:
    /// CUDA's `cbid`; HIP's `cid` with its ROCm path's launch, copy and allocation arguments
    /// (addresses as `"0x…"` strings, a copy's size and kind as strings, as in its traces).
    #[inline(always)]
    fn call_args(&mut self, args: &mut Event<'_>, c: &ApiCall, correlation: Option<u64>) {
        let id = c.cbid.map(u64::from);
        match c.args {
            CallArgs::None => {
                opt_u64(args, key!("cbid"), id);
                opt_u64(args, key!("correlation"), correlation);
            }
            CallArgs::Hip => {
                opt_u64(args, key!("cid"), id);
                opt_u64(args, key!("correlation"), correlation);
            }
            CallArgs::HipLaunch {
                kernel,
                stream,
                grid,
                block,
                shared_memory,
            } => {
                if let Some(k) = kernel {
                    args.json_str(key!("kernel"), self.name(k));
                }
                opt_u64(args, key!("cid"), id);
                opt_u64(args, key!("correlation"), correlation);
                args.hex_str(key!("stream"), stream);
                dim3(args, key!("grid"), Some(grid));
                dim3(args, key!("block"), Some(block));
                args.u64(key!("shared memory"), u64::from(shared_memory));
            }
            CallArgs::HipCopy {
                stream,
                src,
                dst,
                size,
                kind,
            } => {
                if let Some(s) = stream {
                    args.hex_str(key!("stream"), s);
                }
                opt_u64(args, key!("cid"), id);
                opt_u64(args, key!("correlation"), correlation);
                args.hex_str(key!("src"), src);
                args.hex_str(key!("dst"), dst);
                args.u64_str(key!("size"), size);
                args.u64_str(key!("kind"), u64::from(kind));
            }
            CallArgs::HipMalloc { ptr, size } => {
                opt_u64(args, key!("size"), size);
                opt_u64(args, key!("cid"), id);
                opt_u64(args, key!("correlation"), correlation);
                args.hex_str(key!("ptr"), ptr);
            }
        }
    }

    /// Writes one record (and its flow event, if it has one) into the events array.
    pub(crate) fn event(&mut self, a: &Activity, events: &mut Array<'_, Rows>) {
        self.count += 1;
        match &a.detail {
            Detail::CpuOp(s) | Detail::UserAnnotation(s) => {
                let cat = if matches!(a.detail, Detail::CpuOp(_)) {
                    member!("cat", "cpu_op")
                } else {
                    member!("cat", "user_annotation")
                };
                self.cpu_row(s.pid, s.tid);
                events.object::<Compact>(|e| {
                    complete(e, cat);
                    e.json_str(key!("name"), self.name(s.name));
                    self.place(e, s.pid as i64, s.tid as i64, a);
                    let text = s.args.args().and_then(|id| self.op_args(id));
                    e.object_if_any::<Compact>(key!("args"), |args| {
                        external_id(args, a.external_id);
                        opt_u64(args, key!("Sequence number"), s.args.sequence());
                        if let Some(t) = &text {
                            args.raw_members(t.text.as_bytes());
                        }
                    });
                    if let (Some(t), Some(ext)) = (text, a.external_id) {
                        if !t.collective().is_empty() {
                            if self.collectives.len() >= 4096 {
                                self.collectives.clear();
                            }
                            self.collectives.insert(ext, t);
                        }
                    }
                });
                if matches!(a.detail, Detail::CpuOp(_)) {
                    self.fwdbwd(events, s, a);
                }
            }
            Detail::PythonFunction(p) => {
                let s = &p.span;
                self.cpu_row(s.pid, s.tid);
                events.object::<Compact>(|e| {
                    complete(e, member!("cat", "python_function"));
                    e.json_str(key!("name"), self.name(s.name));
                    self.place(e, s.pid as i64, s.tid as i64, a);
                    let text = s.args.args().and_then(|id| self.op_args(id));
                    // torch.profiler's keys, in its order (no `External id`: ops link to frames
                    // by nesting on their thread).
                    e.object::<Compact>(key!("args"), |args| {
                        if let Some(t) = &text {
                            args.raw_members(t.text.as_bytes());
                        }
                        opt_u64(args, key!("Python parent id"), p.parent);
                        opt_u64(args, key!("Python id"), a.external_id);
                    });
                });
            }
            Detail::Runtime(c) | Detail::Driver(c) => {
                let cat = if matches!(a.detail, Detail::Runtime(_)) {
                    member!("cat", "cuda_runtime")
                } else {
                    member!("cat", "cuda_driver")
                };
                self.cpu_row(c.pid, c.tid);
                events.object::<Compact>(|e| {
                    complete(e, cat);
                    e.json_str(key!("name"), self.name(c.name));
                    self.place(e, c.pid as i64, c.tid as i64, a);
                    e.object_if_any::<Compact>(key!("args"), |args| {
                        external_id(args, a.external_id);
                        self.call_args(args, c, a.correlation);
                    });
                });
                if let Some(corr) = a.correlation {
                    let row = (c.pid as i64, c.tid as i64);
                    self.flow(events, c.launches_work, corr, row, a.start);
                }
            }
            Detail::Kernel(k) => {
                self.gpu_row(k.device, k.stream);
                events.object::<Compact>(|e| {
                    complete(e, member!("cat", "kernel"));
                    e.json_str(key!("name"), self.name(k.name));
                    self.place(e, k.device as i64, k.stream as i64, a);
                    e.object_if_any::<Compact>(key!("args"), |args| {
                        external_id(args, a.external_id);
                        if let Some(q) = k.queued {
                            args.us3(key!("queued"), self.rel(q));
                        }
                        args.u64(key!("device"), k.device as u64);
                        opt_u64(args, key!("context"), k.context.map(u64::from));
                        args.u64(key!("stream"), k.stream as u64);
                        opt_u64(args, key!("correlation"), a.correlation);
                        if k.kind_arg {
                            args.str(key!("kind"), "Dispatch Kernel");
                        }
                        let regs = k.registers_per_thread.map(u64::from);
                        opt_u64(args, key!("registers per thread"), regs);
                        opt_u64(args, key!("shared memory"), k.shared_memory);
                        dim3(args, key!("grid"), k.grid);
                        dim3(args, key!("block"), k.block);
                        opt_u64(args, key!("graph id"), k.graph_id.map(u64::from));
                        opt_u64(args, key!("graph node id"), k.graph_node_id);
                        let linked = a.external_id.and_then(|x| self.collectives.get(&x));
                        if let Some(c) = linked {
                            args.raw_members(c.collective());
                        }
                    });
                });
                self.gpu_flow(events, a, k.device, k.stream as i64);
            }
            Detail::Memcpy(m) => {
                self.gpu_row(m.device, m.stream);
                events.object::<Compact>(|e| {
                    complete(e, member!("cat", "gpu_memcpy"));
                    e.str_parts(
                        key!("name"),
                        &[
                            "Memcpy ",
                            m.kind.as_str(),
                            " (",
                            m.src_kind.as_str(),
                            " -> ",
                            m.dst_kind.as_str(),
                            ")",
                        ],
                    );
                    self.place(e, m.device as i64, m.stream as i64, a);
                    e.object_if_any::<Compact>(key!("args"), |args| {
                        external_id(args, a.external_id);
                        match m.peer {
                            Some(p) => {
                                args.u64(key!("fromDevice"), p.src_device as u64);
                                args.u64(key!("inDevice"), m.device as u64);
                                args.u64(key!("toDevice"), p.dst_device as u64);
                                opt_u64(args, key!("fromContext"), p.src_context.map(u64::from));
                                opt_u64(args, key!("inContext"), m.context.map(u64::from));
                                opt_u64(args, key!("toContext"), p.dst_context.map(u64::from));
                            }
                            None => {
                                args.u64(key!("device"), m.device as u64);
                                opt_u64(args, key!("context"), m.context.map(u64::from));
                            }
                        }
                        args.u64(key!("stream"), m.stream as u64);
                        opt_u64(args, key!("correlation"), a.correlation);
                        if m.kind_arg {
                            args.str(key!("kind"), m.kind.as_str());
                        }
                        args.u64(key!("bytes"), m.bytes);
                        bandwidth(args, m.bytes, a.dur_ns());
                    });
                });
                self.gpu_flow(events, a, m.device, m.stream as i64);
            }
            Detail::Memset(m) => {
                self.gpu_row(m.device, m.stream);
                events.object::<Compact>(|e| {
                    complete(e, member!("cat", "gpu_memset"));
                    e.str_parts(key!("name"), &["Memset (", m.memory_kind.as_str(), ")"]);
                    self.place(e, m.device as i64, m.stream as i64, a);
                    e.object_if_any::<Compact>(key!("args"), |args| {
                        external_id(args, a.external_id);
                        args.u64(key!("device"), m.device as u64);
                        opt_u64(args, key!("context"), m.context.map(u64::from));
                        args.u64(key!("stream"), m.stream as u64);
                        opt_u64(args, key!("correlation"), a.correlation);
                        args.u64(key!("bytes"), m.bytes);
                        bandwidth(args, m.bytes, a.dur_ns());
                    });
                });
                self.gpu_flow(events, a, m.device, m.stream as i64);
            }
            Detail::Sync(s) => {
                let device = s.device.unwrap_or(0);
                self.devices.insert(device);
                // Kineto writes the tid as |stream|, so a sync with no stream (-1) lands on row 1.
                let tid = match s.stream {
                    Some(st) => {
                        self.gpu_rows.insert((device, st));
                        st as i64
                    }
                    None => {
                        self.device_rows.insert(device);
                        1
                    }
                };
                events.object::<Compact>(|e| {
                    complete(e, member!("cat", "cuda_sync"));
                    e.str(key!("name"), s.kind.as_str());
                    self.place(e, device as i64, tid, a);
                    e.object_if_any::<Compact>(key!("args"), |args| {
                        external_id(args, a.external_id);
                        args.u64(key!("cuda_sync_kind"), s.kind.code() as u64);
                        if matches!(s.kind, SyncKind::EventSync | SyncKind::StreamWaitEvent) {
                            let stream = s.wait_on_stream.map_or(-1, i64::from);
                            args.i64(key!("wait_on_stream"), stream);
                            let corr = s.wait_on_event_record_correlation.map_or(-1, |c| c as i64);
                            args.i64(key!("wait_on_cuda_event_record_corr_id"), corr);
                            args.i64(
                                key!("wait_on_cuda_event_id"),
                                s.event_id.map_or(-1, i64::from),
                            );
                        }
                        args.i64(key!("stream"), s.stream.map_or(-1, i64::from));
                        opt_u64(args, key!("correlation"), a.correlation);
                        args.u64(key!("device"), device as u64);
                        opt_u64(args, key!("context"), s.context.map(u64::from));
                    });
                });
                self.gpu_flow(events, a, device, tid);
            }
            Detail::Memory(m) => {
                self.cpu_row(m.pid, m.tid);
                events.object::<Compact>(|e| {
                    e.member(member!("ph", "i"));
                    e.member(member!("cat", "cpu_instant_event"));
                    e.member(member!("s", "t"));
                    e.member(member!("name", "[memory]"));
                    e.u64(key!("pid"), m.pid as u64);
                    e.u64(key!("tid"), m.tid as u64);
                    e.us3(key!("ts"), self.rel(a.start));
                    e.object::<Compact>(key!("args"), |args| {
                        opt_u64(args, key!("Total Reserved"), m.total_reserved);
                        opt_u64(args, key!("Total Allocated"), m.total_allocated);
                        let signed = m.bytes.min(i64::MAX as u64) as i64;
                        let freed = m.op == MemoryOp::Free;
                        args.i64(key!("Bytes"), if freed { -signed } else { signed });
                        args.i64(key!("Device Id"), m.device.map_or(-1, i64::from));
                        args.u64(key!("Device Type"), if m.device.is_some() { 1 } else { 0 });
                        args.u64(key!("Addr"), m.address);
                    });
                });
            }
            Detail::Marker(m) => {
                self.cpu_row(m.pid, m.tid);
                events.object::<Compact>(|e| {
                    if a.end > a.start {
                        complete(e, member!("cat", "user_annotation"));
                        e.json_str(key!("name"), self.name(m.name));
                        self.place(e, m.pid as i64, m.tid as i64, a);
                    } else {
                        e.member(member!("ph", "i"));
                        e.member(member!("cat", "user_annotation"));
                        e.member(member!("s", "t"));
                        e.json_str(key!("name"), self.name(m.name));
                        e.u64(key!("pid"), m.pid as u64);
                        e.u64(key!("tid"), m.tid as u64);
                        e.us3(key!("ts"), self.rel(a.start));
                    }
                    if let Some(d) = m.domain {
                        e.object::<Compact>(key!("args"), |args| {
                            args.json_str(key!("domain"), self.name(d));
                        });
                    }
                });
            }
            Detail::Overhead(o) => {
                self.overhead = true;
                events.object::<Compact>(|e| {
                    complete(e, member!("cat", "overhead"));
                    e.str(key!("name"), o.kind.as_str());
                    self.place(e, -1, 0, a);
                });
            }
        }
    }
}
