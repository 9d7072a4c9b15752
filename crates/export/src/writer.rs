//! The streaming Kineto writer.
//!
//! Events are serialized as they arrive into a spool file beside the target, so memory does not grow
//! with the trace. When the window ends the header (which needs facts only known then: drop counts,
//! devices) is written to `<target>.tmp`, the spooled events are copied after it, the per-row metadata
//! events and `Record Window End` close the array, and the temporary file is renamed over the target.
//! A crash at any point leaves no half-written trace under the final name.

use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kinetrace_core::activity::*;
use kinetrace_core::intern::NameId;
use kinetrace_core::{Sink, SinkFactory, TraceMeta, TraceOutput, UnixNanos};

use crate::json::{push_escaped, push_f64, push_i64, push_str_literal, push_u64, push_us3};

/// Kineto's "3-month" bucket for `baseTimeNanoseconds`: 3 × 2,629,746 s.
pub const BASE_TIME_BUCKET_NS: u64 = 7_889_238_000_000_000;

/// `sort_index` Kineto gives GPU rows: device + this.
const GPU_SORT_BASE: u64 = 5_000_000;

/// This process's `baseTimeNanoseconds`: computed once, so every trace of a process (and every
/// process started in the same 3-month bucket) shares a zero point.
pub fn process_base_time_ns() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(|| base_time_for(UnixNanos::now()))
}

/// The bucket start for `t`.
pub fn base_time_for(t: UnixNanos) -> u64 {
    t.0 / BASE_TIME_BUCKET_NS * BASE_TIME_BUCKET_NS
}

/// Turns [`Activity`] records into Kineto JSON text. Holds the per-trace state: the zero point, the
/// escaped-name cache and the rows used (for the metadata events at the end).
pub struct TraceEncoder {
    base_ns: u64,
    names: Vec<Option<Box<[u8]>>>,
    cpu_rows: HashSet<(u32, u32)>,
    gpu_rows: HashSet<(u32, u32)>,
    devices: BTreeSet<u32>,
    device_rows: BTreeSet<u32>,
    overhead: bool,
    last_cpu_row: Option<(u32, u32)>,
    events: u64,
    wrote_any: bool,
}

impl TraceEncoder {
    /// An encoder writing `ts` relative to `base_ns`.
    pub fn new(base_ns: u64) -> Self {
        TraceEncoder {
            base_ns,
            names: Vec::new(),
            cpu_rows: HashSet::new(),
            gpu_rows: HashSet::new(),
            devices: BTreeSet::new(),
            device_rows: BTreeSet::new(),
            overhead: false,
            last_cpu_row: None,
            events: 0,
            wrote_any: false,
        }
    }

    /// Records encoded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    fn rel(&self, t: UnixNanos) -> u64 {
        // Kineto clamps negative relative times to 0.
        t.0.saturating_sub(self.base_ns)
    }

    fn name(&mut self, id: NameId, out: &mut Vec<u8>) {
        let i = id.0 as usize;
        if i >= self.names.len() {
            self.names.resize(i + 1, None);
        }
        let cached = self.names[i].get_or_insert_with(|| {
            let mut v = Vec::new();
            push_str_literal(&mut v, &id.resolve());
            v.into_boxed_slice()
        });
        out.extend_from_slice(cached);
    }

    fn sep(&mut self, out: &mut Vec<u8>) {
        if self.wrote_any {
            out.extend_from_slice(b",\n  ");
        } else {
            out.extend_from_slice(b"\n  ");
            self.wrote_any = true;
        }
    }

    fn cpu_row(&mut self, pid: u32, tid: u32) {
        if self.last_cpu_row != Some((pid, tid)) {
            self.cpu_rows.insert((pid, tid));
            self.last_cpu_row = Some((pid, tid));
        }
    }

    fn x_head(&mut self, out: &mut Vec<u8>, cat: &str, name: NameId) {
        self.sep(out);
        out.extend_from_slice(b"{\"ph\":\"X\",\"cat\":\"");
        out.extend_from_slice(cat.as_bytes());
        out.extend_from_slice(b"\",\"name\":");
        self.name(name, out);
    }

    fn pid_tid_ts_dur(&self, out: &mut Vec<u8>, pid: i64, tid: i64, a: &Activity) {
        out.extend_from_slice(b",\"pid\":");
        push_i64(out, pid);
        out.extend_from_slice(b",\"tid\":");
        push_i64(out, tid);
        out.extend_from_slice(b",\"ts\":");
        push_us3(out, self.rel(a.start));
        out.extend_from_slice(b",\"dur\":");
        push_us3(out, a.dur_ns());
    }

    fn flow(&mut self, out: &mut Vec<u8>, start: bool, id: u64, pid: i64, tid: i64, ts: UnixNanos) {
        self.sep(out);
        out.extend_from_slice(if start {
            b"{\"ph\":\"s\",\"id\":"
        } else {
            b"{\"ph\":\"f\",\"id\":"
        });
        push_u64(out, id);
        out.extend_from_slice(b",\"pid\":");
        push_i64(out, pid);
        out.extend_from_slice(b",\"tid\":");
        push_i64(out, tid);
        out.extend_from_slice(b",\"ts\":");
        push_us3(out, self.rel(ts));
        out.extend_from_slice(b",\"cat\":\"ac2g\",\"name\":\"ac2g\"");
        if !start {
            out.extend_from_slice(b",\"bp\":\"e\"");
        }
        out.push(b'}');
    }

    /// Appends the JSON for one record (and its flow event, if it has one) to `out`.
    pub fn event(&mut self, a: &Activity, out: &mut Vec<u8>) {
        self.events += 1;
        match &a.detail {
            Detail::CpuOp(s) | Detail::UserAnnotation(s) => {
                let cat = if matches!(a.detail, Detail::CpuOp(_)) {
                    "cpu_op"
                } else {
                    "user_annotation"
                };
                self.cpu_row(s.pid, s.tid);
                self.x_head(out, cat, s.name);
                self.pid_tid_ts_dur(out, s.pid as i64, s.tid as i64, a);
                if let Some(id) = a.external_id {
                    out.extend_from_slice(b",\"args\":{\"External id\":");
                    push_u64(out, id);
                    out.push(b'}');
                }
                out.push(b'}');
            }
            Detail::Runtime(c) | Detail::Driver(c) => {
                let cat = if matches!(a.detail, Detail::Runtime(_)) {
                    "cuda_runtime"
                } else {
                    "cuda_driver"
                };
                self.cpu_row(c.pid, c.tid);
                self.x_head(out, cat, c.name);
                self.pid_tid_ts_dur(out, c.pid as i64, c.tid as i64, a);
                let mut args = Args::open(out);
                args.ext(a.external_id);
                if let Some(cbid) = c.cbid {
                    args.u64("cbid", cbid as u64);
                }
                if let Some(corr) = a.correlation {
                    args.u64("correlation", corr);
                }
                args.close();
                out.push(b'}');
                if let Some(corr) = a.correlation {
                    self.flow(
                        out,
                        c.launches_work,
                        corr,
                        c.pid as i64,
                        c.tid as i64,
                        a.start,
                    );
                }
            }
            Detail::Kernel(k) => {
                self.gpu_row(k.device, k.stream);
                self.x_head(out, "kernel", k.name);
                self.pid_tid_ts_dur(out, k.device as i64, k.stream as i64, a);
                let mut args = Args::open(out);
                args.ext(a.external_id);
                if let Some(q) = k.queued {
                    args.key("queued");
                    push_us3(args.out, self.rel(q));
                }
                args.u64("device", k.device as u64);
                args.opt_u64("context", k.context.map(u64::from));
                args.u64("stream", k.stream as u64);
                args.opt_u64("correlation", a.correlation);
                args.opt_u64(
                    "registers per thread",
                    k.registers_per_thread.map(u64::from),
                );
                args.opt_u64("shared memory", k.shared_memory);
                if let Some(g) = k.grid {
                    args.dim3("grid", g);
                }
                if let Some(b) = k.block {
                    args.dim3("block", b);
                }
                args.opt_u64("graph id", k.graph_id.map(u64::from));
                args.opt_u64("graph node id", k.graph_node_id);
                args.close();
                out.push(b'}');
                self.gpu_flow(out, a, k.device, k.stream as i64);
            }
            Detail::Memcpy(m) => {
                self.gpu_row(m.device, m.stream);
                self.sep(out);
                out.extend_from_slice(b"{\"ph\":\"X\",\"cat\":\"gpu_memcpy\",\"name\":\"Memcpy ");
                out.extend_from_slice(m.kind.as_str().as_bytes());
                out.extend_from_slice(b" (");
                out.extend_from_slice(m.src_kind.as_str().as_bytes());
                out.extend_from_slice(b" -> ");
                out.extend_from_slice(m.dst_kind.as_str().as_bytes());
                out.extend_from_slice(b")\"");
                self.pid_tid_ts_dur(out, m.device as i64, m.stream as i64, a);
                let mut args = Args::open(out);
                args.ext(a.external_id);
                match m.peer {
                    Some(p) => {
                        args.u64("fromDevice", p.src_device as u64);
                        args.u64("inDevice", m.device as u64);
                        args.u64("toDevice", p.dst_device as u64);
                        args.opt_u64("fromContext", p.src_context.map(u64::from));
                        args.opt_u64("inContext", m.context.map(u64::from));
                        args.opt_u64("toContext", p.dst_context.map(u64::from));
                    }
                    None => {
                        args.u64("device", m.device as u64);
                        args.opt_u64("context", m.context.map(u64::from));
                    }
                }
                args.u64("stream", m.stream as u64);
                args.opt_u64("correlation", a.correlation);
                args.u64("bytes", m.bytes);
                args.bandwidth(m.bytes, a.dur_ns());
                args.close();
                out.push(b'}');
                self.gpu_flow(out, a, m.device, m.stream as i64);
            }
            Detail::Memset(m) => {
                self.gpu_row(m.device, m.stream);
                self.sep(out);
                out.extend_from_slice(b"{\"ph\":\"X\",\"cat\":\"gpu_memset\",\"name\":\"Memset (");
                out.extend_from_slice(m.memory_kind.as_str().as_bytes());
                out.extend_from_slice(b")\"");
                self.pid_tid_ts_dur(out, m.device as i64, m.stream as i64, a);
                let mut args = Args::open(out);
                args.ext(a.external_id);
                args.u64("device", m.device as u64);
                args.opt_u64("context", m.context.map(u64::from));
                args.u64("stream", m.stream as u64);
                args.opt_u64("correlation", a.correlation);
                args.u64("bytes", m.bytes);
                args.bandwidth(m.bytes, a.dur_ns());
                args.close();
                out.push(b'}');
                self.gpu_flow(out, a, m.device, m.stream as i64);
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
                self.sep(out);
                out.extend_from_slice(b"{\"ph\":\"X\",\"cat\":\"cuda_sync\",\"name\":\"");
                out.extend_from_slice(s.kind.as_str().as_bytes());
                out.push(b'"');
                self.pid_tid_ts_dur(out, device as i64, tid, a);
                let mut args = Args::open(out);
                args.ext(a.external_id);
                args.u64("cuda_sync_kind", s.kind.code() as u64);
                if matches!(s.kind, SyncKind::EventSync | SyncKind::StreamWaitEvent) {
                    args.i64("wait_on_stream", s.wait_on_stream.map_or(-1, i64::from));
                    args.i64(
                        "wait_on_cuda_event_record_corr_id",
                        s.wait_on_event_record_correlation.map_or(-1, |c| c as i64),
                    );
                    args.i64("wait_on_cuda_event_id", s.event_id.map_or(-1, i64::from));
                }
                args.i64("stream", s.stream.map_or(-1, i64::from));
                args.opt_u64("correlation", a.correlation);
                args.u64("device", device as u64);
                args.opt_u64("context", s.context.map(u64::from));
                args.close();
                out.push(b'}');
                self.gpu_flow(out, a, device, tid);
            }
            Detail::Memory(m) => {
                self.cpu_row(m.pid, m.tid);
                self.sep(out);
                out.extend_from_slice(
                    b"{\"ph\":\"i\",\"cat\":\"cpu_instant_event\",\"s\":\"t\",\"name\":\"[memory]\",\"pid\":",
                );
                push_u64(out, m.pid as u64);
                out.extend_from_slice(b",\"tid\":");
                push_u64(out, m.tid as u64);
                out.extend_from_slice(b",\"ts\":");
                push_us3(out, self.rel(a.start));
                let mut args = Args::open(out);
                if let Some(r) = m.total_reserved {
                    args.u64("Total Reserved", r);
                }
                if let Some(t) = m.total_allocated {
                    args.u64("Total Allocated", t);
                }
                let signed = m.bytes.min(i64::MAX as u64) as i64;
                args.i64(
                    "Bytes",
                    if m.op == MemoryOp::Free {
                        -signed
                    } else {
                        signed
                    },
                );
                args.i64("Device Id", m.device.map_or(-1, i64::from));
                args.u64("Device Type", if m.device.is_some() { 1 } else { 0 });
                args.u64("Addr", m.address);
                args.close();
                out.push(b'}');
            }
            Detail::Marker(m) => {
                self.cpu_row(m.pid, m.tid);
                if a.end > a.start {
                    self.x_head(out, "user_annotation", m.name);
                    self.pid_tid_ts_dur(out, m.pid as i64, m.tid as i64, a);
                } else {
                    self.sep(out);
                    out.extend_from_slice(
                        b"{\"ph\":\"i\",\"cat\":\"user_annotation\",\"s\":\"t\",\"name\":",
                    );
                    self.name(m.name, out);
                    out.extend_from_slice(b",\"pid\":");
                    push_u64(out, m.pid as u64);
                    out.extend_from_slice(b",\"tid\":");
                    push_u64(out, m.tid as u64);
                    out.extend_from_slice(b",\"ts\":");
                    push_us3(out, self.rel(a.start));
                }
                if let Some(d) = m.domain {
                    out.extend_from_slice(b",\"args\":{\"domain\":");
                    self.name(d, out);
                    out.push(b'}');
                }
                out.push(b'}');
            }
            Detail::Overhead(o) => {
                self.overhead = true;
                self.sep(out);
                out.extend_from_slice(b"{\"ph\":\"X\",\"cat\":\"overhead\",\"name\":\"");
                out.extend_from_slice(o.kind.as_str().as_bytes());
                out.push(b'"');
                self.pid_tid_ts_dur(out, -1, 0, a);
                out.push(b'}');
            }
        }
    }

    fn gpu_row(&mut self, device: u32, stream: u32) {
        self.devices.insert(device);
        self.gpu_rows.insert((device, stream));
    }

    fn gpu_flow(&mut self, out: &mut Vec<u8>, a: &Activity, device: u32, tid: i64) {
        if let Some(corr) = a.correlation {
            self.flow(out, false, corr, device as i64, tid, a.start);
        }
    }

    /// Appends the document head up to and including `"traceEvents": [`.
    pub fn header(&self, meta: &TraceMeta, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [");
        for (i, d) in meta.devices.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n    {" } else { b",\n    {" });
            device_json(d, out);
            out.push(b'}');
        }
        if !meta.devices.is_empty() {
            out.extend_from_slice(b"\n  ");
        }
        out.extend_from_slice(b"],\n");
        let mut kv = |k: &str, v: &str| {
            out.extend_from_slice(b"  ");
            push_str_literal(out, k);
            out.extend_from_slice(b": ");
            push_str_literal(out, v);
            out.extend_from_slice(b",\n");
        };
        kv("kinetrace_version", env!("CARGO_PKG_VERSION"));
        kv("trace_id", &meta.trace_id);
        kv("host_name", &meta.host_name);
        for (k, v) in &meta.metadata {
            // Keys HTA's rank regex or the format itself own are not user metadata.
            if is_reserved_key(k) {
                continue;
            }
            kv(k, v);
        }
        out.extend_from_slice(b"  \"dropped_events\": {");
        for (i, (k, n)) in meta.dropped.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b", ");
            }
            push_str_literal(out, k);
            out.extend_from_slice(b": ");
            push_u64(out, *n);
        }
        out.extend_from_slice(b"},\n");
        if let Some(rank) = meta.rank {
            // `"rank": N` with a space: HTA finds the rank with the regex `"rank":\s+(\d+)`.
            out.extend_from_slice(b"  \"distributedInfo\": {\"rank\": ");
            push_u64(out, rank as u64);
            if let Some(ws) = meta.world_size {
                out.extend_from_slice(b", \"world_size\": ");
                push_u64(out, ws as u64);
            }
            out.extend_from_slice(b"},\n");
        }
        out.extend_from_slice(b"  \"displayTimeUnit\": \"ms\",\n  \"baseTimeNanoseconds\": ");
        push_u64(out, self.base_ns);
        out.extend_from_slice(b",\n  \"traceEvents\": [");
    }

    /// Appends the metadata events for every row used, the span row, `Record Window End`, and the
    /// document tail.
    pub fn footer(&mut self, meta: &TraceMeta, trace_name: &str, out: &mut Vec<u8>) {
        let ts = self.rel(meta.window_start);
        let pid = meta.pid;
        let mut m =
            |enc: &mut Self, name: &str, pid: i64, tid: i64, key: &str, value: MetaValue| {
                enc.sep(out);
                out.extend_from_slice(b"{\"ph\":\"M\",\"name\":\"");
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b"\",\"ts\":");
                push_us3(out, ts);
                out.extend_from_slice(b",\"pid\":");
                push_i64(out, pid);
                out.extend_from_slice(b",\"tid\":");
                push_i64(out, tid);
                out.extend_from_slice(b",\"args\":{\"");
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(b"\":");
                match value {
                    MetaValue::Str(s) => push_str_literal(out, s),
                    MetaValue::Int(i) => push_i64(out, i),
                }
                out.extend_from_slice(b"}}");
            };
        let mut pids: BTreeSet<u32> = self.cpu_rows.iter().map(|(p, _)| *p).collect();
        pids.insert(pid);
        for p in pids {
            m(
                self,
                "process_name",
                p as i64,
                0,
                "name",
                MetaValue::Str(&meta.process_name),
            );
            m(
                self,
                "process_labels",
                p as i64,
                0,
                "labels",
                MetaValue::Str("CPU"),
            );
            m(
                self,
                "process_sort_index",
                p as i64,
                0,
                "sort_index",
                MetaValue::Int(p as i64),
            );
        }
        let mut cpu_rows: Vec<(u32, u32)> = self.cpu_rows.iter().copied().collect();
        cpu_rows.sort_unstable();
        for (p, tid) in cpu_rows {
            let tname = meta
                .thread_names
                .iter()
                .find(|(t, _)| *t == tid)
                .map(|(_, n)| n.as_str())
                .filter(|n| !n.is_empty())
                .unwrap_or(&meta.process_name);
            let label = format!("thread {tid} ({tname})");
            m(
                self,
                "thread_name",
                p as i64,
                tid as i64,
                "name",
                MetaValue::Str(&label),
            );
            m(
                self,
                "thread_sort_index",
                p as i64,
                tid as i64,
                "sort_index",
                MetaValue::Int(tid as i64),
            );
        }
        let devices: Vec<u32> = self.devices.iter().copied().collect();
        for d in devices {
            let label = format!("GPU {d}");
            m(
                self,
                "process_name",
                d as i64,
                0,
                "name",
                MetaValue::Str(&meta.process_name),
            );
            m(
                self,
                "process_labels",
                d as i64,
                0,
                "labels",
                MetaValue::Str(&label),
            );
            let sort = d as u64 + GPU_SORT_BASE;
            m(
                self,
                "process_sort_index",
                d as i64,
                0,
                "sort_index",
                MetaValue::Int(sort as i64),
            );
        }
        let mut gpu_rows: Vec<(u32, u32)> = self.gpu_rows.iter().copied().collect();
        gpu_rows.sort_unstable();
        for (d, s) in gpu_rows {
            let label = format!("stream {s} ");
            m(
                self,
                "thread_name",
                d as i64,
                s as i64,
                "name",
                MetaValue::Str(&label),
            );
            m(
                self,
                "thread_sort_index",
                d as i64,
                s as i64,
                "sort_index",
                MetaValue::Int(s as i64),
            );
        }
        let device_rows: Vec<u32> = self.device_rows.iter().copied().collect();
        for d in device_rows {
            let label = format!("Device {d}");
            m(
                self,
                "thread_name",
                d as i64,
                1,
                "name",
                MetaValue::Str(&label),
            );
        }
        if self.overhead {
            m(
                self,
                "process_name",
                -1,
                0,
                "name",
                MetaValue::Str("CUPTI Overhead"),
            );
            m(
                self,
                "process_sort_index",
                -1,
                0,
                "sort_index",
                MetaValue::Int(0x100000A),
            );
        }
        // The span row viewers show for the whole window. Named as Kineto names it: torch-tb-profiler
        // takes the trace's extent from the event called `PyTorch Profiler (0)`.
        self.sep(out);
        out.extend_from_slice(b"{\"ph\":\"X\",\"cat\":\"Trace\",\"name\":\"PyTorch Profiler (");
        push_u64(out, meta.cycle as u64);
        out.extend_from_slice(b")\",\"pid\":\"Spans\",\"tid\":\"PyTorch Profiler\",\"ts\":");
        push_us3(out, ts);
        out.extend_from_slice(b",\"dur\":");
        push_us3(out, meta.window_end.saturating_sub(meta.window_start));
        out.extend_from_slice(b",\"args\":{\"Op count\":0}}");
        self.sep(out);
        out.extend_from_slice(b"{\"ph\":\"M\",\"name\":\"process_sort_index\",\"ts\":");
        push_us3(out, ts);
        out.extend_from_slice(b",\"pid\":\"Spans\",\"tid\":0,\"args\":{\"sort_index\":536870912}}");
        self.sep(out);
        out.extend_from_slice(b"{\"ph\":\"i\",\"s\":\"g\",\"name\":\"Iteration Start: PyTorch Profiler\",\"pid\":\"Traces\",\"tid\":\"Trace PyTorch Profiler\",\"ts\":");
        push_us3(out, ts);
        out.push(b'}');
        self.sep(out);
        out.extend_from_slice(b"{\"ph\":\"i\",\"s\":\"g\",\"name\":\"Record Window End\",\"pid\":\"\",\"tid\":\"\",\"ts\":");
        push_us3(out, self.rel(meta.window_end));
        out.extend_from_slice(b"}\n  ],\n  \"traceName\": ");
        push_str_literal(out, trace_name);
        out.extend_from_slice(b"\n}\n");
    }
}

enum MetaValue<'a> {
    Str(&'a str),
    Int(i64),
}

fn is_reserved_key(k: &str) -> bool {
    matches!(
        k,
        "schemaVersion"
            | "deviceProperties"
            | "distributedInfo"
            | "displayTimeUnit"
            | "baseTimeNanoseconds"
            | "traceEvents"
            | "traceName"
            | "rank"
            | "trace_id"
            | "host_name"
            | "kinetrace_version"
            | "dropped_events"
    )
}

fn device_json(d: &DeviceProperties, out: &mut Vec<u8>) {
    out.extend_from_slice(b"\"id\": ");
    push_u64(out, d.id as u64);
    out.extend_from_slice(b", \"name\": ");
    push_str_literal(out, &d.name);
    let mut field = |k: &str, v: u64| {
        out.extend_from_slice(b", \"");
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b"\": ");
        push_u64(out, v);
    };
    field("totalGlobalMem", d.total_global_mem);
    field("computeMajor", d.compute_major as u64);
    field("computeMinor", d.compute_minor as u64);
    field("maxThreadsPerBlock", d.max_threads_per_block as u64);
    field(
        "maxThreadsPerMultiprocessor",
        d.max_threads_per_multiprocessor as u64,
    );
    field("regsPerBlock", d.regs_per_block as u64);
    field("warpSize", d.warp_size as u64);
    field("sharedMemPerBlock", d.shared_mem_per_block);
    field("numSms", d.num_sms as u64);
    if let Some(v) = d.regs_per_multiprocessor {
        field("regsPerMultiprocessor", v as u64);
    }
    if let Some(v) = d.shared_mem_per_block_optin {
        field("sharedMemPerBlockOptin", v);
    }
    if let Some(v) = d.shared_mem_per_multiprocessor {
        field("sharedMemPerMultiprocessor", v);
    }
}

/// Writes an `args` object, adding commas between keys and omitting it entirely when empty.
struct Args<'a> {
    out: &'a mut Vec<u8>,
    any: bool,
}

impl<'a> Args<'a> {
    fn open(out: &'a mut Vec<u8>) -> Self {
        Args { out, any: false }
    }

    fn key(&mut self, k: &str) {
        self.out
            .extend_from_slice(if self.any { b",\"" } else { b",\"args\":{\"" });
        self.any = true;
        push_escaped(self.out, k);
        self.out.extend_from_slice(b"\":");
    }

    fn u64(&mut self, k: &str, v: u64) {
        self.key(k);
        push_u64(self.out, v);
    }

    fn i64(&mut self, k: &str, v: i64) {
        self.key(k);
        push_i64(self.out, v);
    }

    fn opt_u64(&mut self, k: &str, v: Option<u64>) {
        if let Some(v) = v {
            self.u64(k, v);
        }
    }

    fn ext(&mut self, id: Option<u64>) {
        // Only linked records carry an External id: writing one for unlinked records mis-links them.
        self.opt_u64("External id", id);
    }

    fn dim3(&mut self, k: &str, d: [u32; 3]) {
        self.key(k);
        self.out.push(b'[');
        push_u64(self.out, d[0] as u64);
        self.out.push(b',');
        push_u64(self.out, d[1] as u64);
        self.out.push(b',');
        push_u64(self.out, d[2] as u64);
        self.out.push(b']');
    }

    fn bandwidth(&mut self, bytes: u64, dur_ns: u64) {
        // Bytes per ns is GB/s. Kineto HEAD omits the key for zero durations.
        if dur_ns > 0 {
            self.key("memory bandwidth (GB/s)");
            push_f64(self.out, bytes as f64 / dur_ns as f64);
        }
    }

    fn close(self) {
        if self.any {
            self.out.push(b'}');
        }
    }
}

/// Renders a whole trace in memory (for tests, golden files and small exports).
pub fn render_trace(
    meta: &TraceMeta,
    activities: &[Activity],
    base_ns: u64,
    trace_name: &str,
) -> Vec<u8> {
    let mut enc = TraceEncoder::new(base_ns);
    let mut body = Vec::new();
    for a in activities {
        enc.event(a, &mut body);
    }
    let mut out = Vec::new();
    enc.header(meta, &mut out);
    out.extend_from_slice(&body);
    enc.footer(meta, trace_name, &mut out);
    out
}

/// How trace files are named and where they go, like PyTorch's `tensorboard_trace_handler`:
/// `{dir}/{worker}.{time_ns}.pt.trace.json[.gz]`.
#[derive(Clone, Debug)]
pub struct TraceDir {
    /// The run directory holding every rank's files.
    pub dir: PathBuf,
    /// Worker name; defaults to `{hostname}_{pid}`.
    pub worker: String,
    /// Gzip the output.
    pub gzip: bool,
}

impl TraceDir {
    /// A trace directory with the default worker name.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TraceDir {
            dir: dir.into(),
            worker: default_worker_name(),
            gzip: false,
        }
    }
}

/// `{hostname}_{pid}`, the worker name `tensorboard_trace_handler` uses.
pub fn default_worker_name() -> String {
    format!(
        "{}_{}",
        kinetrace_core::session::host_name(),
        std::process::id()
    )
}

impl SinkFactory for TraceDir {
    fn open(&mut self, cycle: u32) -> io::Result<Box<dyn Sink>> {
        Ok(Box::new(KinetoSink::create(self.clone(), cycle)?))
    }
}

/// A [`Sink`] that streams one window into a Kineto trace file.
pub struct KinetoSink {
    target: TraceDir,
    encoder: TraceEncoder,
    spool_path: PathBuf,
    spool: BufWriter<File>,
    scratch: Vec<u8>,
}

impl KinetoSink {
    /// Opens the spool for cycle `cycle` in `target.dir` (creating the directory).
    pub fn create(target: TraceDir, cycle: u32) -> io::Result<Self> {
        fs::create_dir_all(&target.dir)
            .map_err(|e| with_path(e, &target.dir, "create directory"))?;
        let spool_path = target.dir.join(format!(
            ".{}.{}.{}.events.tmp",
            target.worker,
            std::process::id(),
            cycle
        ));
        let spool = File::create(&spool_path).map_err(|e| with_path(e, &spool_path, "create"))?;
        Ok(KinetoSink {
            target,
            encoder: TraceEncoder::new(process_base_time_ns()),
            spool_path,
            spool: BufWriter::with_capacity(1 << 20, spool),
            scratch: Vec::with_capacity(4096),
        })
    }

    fn publish(mut self, meta: &TraceMeta) -> io::Result<TraceOutput> {
        self.spool.flush()?;
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut name = format!("{}.{}.pt.trace.json", self.target.worker, now_ns);
        if self.target.gzip {
            name.push_str(".gz");
        }
        let final_path = self.target.dir.join(&name);
        let tmp_path = self.target.dir.join(format!(".{name}.tmp"));
        let result = (|| {
            let file = File::create(&tmp_path).map_err(|e| with_path(e, &tmp_path, "create"))?;
            let mut w: Box<dyn Write> = if self.target.gzip {
                Box::new(flate2::write::GzEncoder::new(
                    BufWriter::with_capacity(1 << 20, file),
                    flate2::Compression::fast(),
                ))
            } else {
                Box::new(BufWriter::with_capacity(1 << 20, file))
            };
            let mut head = Vec::new();
            self.encoder.header(meta, &mut head);
            w.write_all(&head)?;
            let mut spool = File::open(&self.spool_path)?;
            copy(&mut spool, &mut w)?;
            let mut tail = Vec::new();
            self.encoder
                .footer(meta, &final_path.to_string_lossy(), &mut tail);
            w.write_all(&tail)?;
            w.flush()?;
            drop(w);
            fs::rename(&tmp_path, &final_path).map_err(|e| with_path(e, &final_path, "rename into"))
        })();
        let _ = fs::remove_file(&self.spool_path);
        if result.is_err() {
            let _ = fs::remove_file(&tmp_path);
        }
        result?;
        Ok(TraceOutput {
            path: Some(final_path),
            events: self.encoder.events(),
            cycle: meta.cycle,
        })
    }
}

fn copy(from: &mut File, to: &mut dyn Write) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

fn with_path(e: io::Error, path: &Path, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
}

impl Sink for KinetoSink {
    fn record(&mut self, activity: &Activity) -> io::Result<()> {
        self.scratch.clear();
        self.encoder.event(activity, &mut self.scratch);
        self.spool.write_all(&self.scratch)
    }

    fn finish(self: Box<Self>, meta: &TraceMeta) -> io::Result<TraceOutput> {
        self.publish(meta)
    }

    fn discard(self: Box<Self>) {
        let path = self.spool_path.clone();
        drop(self);
        let _ = fs::remove_file(path);
    }
}

/// Interns a name that arrived as bytes (a C string from a vendor library), replacing invalid UTF-8
/// with U+FFFD so the trace stays valid JSON.
pub fn intern_lossy(bytes: &[u8]) -> NameId {
    kinetrace_core::intern::intern_bytes(bytes)
}
