//! Turns records into Kineto JSON event text, one record at a time, with no allocation per record
//! once a name has been seen (escaped names are cached by id).

use std::collections::{BTreeSet, HashSet};

use kinetrace_core::activity::*;
use kinetrace_core::intern::NameId;
use kinetrace_core::UnixNanos;

use crate::json::{push_f64, push_i64, push_str_literal, push_u64, push_us3};

/// Turns [`Activity`] records into Kineto JSON text. Holds the per-trace state: the zero point, the
/// escaped-name cache and the rows used (for the metadata events at the end).
pub struct TraceEncoder {
    pub(crate) base_ns: u64,
    pub(crate) names: Vec<Option<Box<[u8]>>>,
    pub(crate) cpu_rows: HashSet<(u32, u32)>,
    pub(crate) gpu_rows: HashSet<(u32, u32)>,
    pub(crate) devices: BTreeSet<u32>,
    pub(crate) device_rows: BTreeSet<u32>,
    pub(crate) overhead: bool,
    pub(crate) last_cpu_row: Option<(u32, u32)>,
    pub(crate) last_gpu_row: Option<(u32, u32)>,
    pub(crate) events: u64,
    pub(crate) wrote_any: bool,
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
            last_gpu_row: None,
            events: 0,
            wrote_any: false,
        }
    }

    /// Records encoded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub(crate) fn rel(&self, t: UnixNanos) -> u64 {
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

    pub(crate) fn sep(&mut self, out: &mut Vec<u8>) {
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
        // Consecutive records mostly share a row; skip the set lookups then.
        if self.last_gpu_row != Some((device, stream)) {
            self.devices.insert(device);
            self.gpu_rows.insert((device, stream));
            self.last_gpu_row = Some((device, stream));
        }
    }

    fn gpu_flow(&mut self, out: &mut Vec<u8>, a: &Activity, device: u32, tid: i64) {
        if let Some(corr) = a.correlation {
            self.flow(out, false, corr, device as i64, tid, a.start);
        }
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

    /// Starts the value for key `k`. Keys are this module's own literals and need no escaping.
    fn key(&mut self, k: &str) {
        self.out
            .extend_from_slice(if self.any { b",\"" } else { b",\"args\":{\"" });
        self.any = true;
        debug_assert!(!k.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20));
        self.out.extend_from_slice(k.as_bytes());
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
