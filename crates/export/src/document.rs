//! The parts of a Kineto document around the events: the header (device properties, metadata,
//! `distributedInfo`, `baseTimeNanoseconds`) and the footer (metadata events for every row used,
//! the span row, `Record Window End`).

use std::collections::BTreeSet;

use kinetrace_core::activity::DeviceProperties;
use kinetrace_core::TraceMeta;

use crate::encoder::TraceEncoder;
use crate::json::{push_i64, push_str_literal, push_u64, push_us3};

/// `sort_index` Kineto gives GPU rows: device + this.
const GPU_SORT_BASE: u64 = 5_000_000;

impl TraceEncoder {
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
