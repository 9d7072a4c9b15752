//! The parts of a Kineto document around the events.
//!
//! A trace is written in one pass, so each top-level key goes where it is known:
//!
//! - the **head**, written when the window opens: `schemaVersion`, `deviceProperties` when the
//!   sources know their devices by then (CUPTI and rocprofiler-sdk do; Kineto writes it here, and
//!   streaming readers take it from the head), `distributedInfo` (HTA reads the rank with a regex
//!   from the start of the file, so it comes before anything long), `kinetrace_version`,
//!   `host_name`, `displayTimeUnit` (Perfetto honours it only near the start) and
//!   `baseTimeNanoseconds`, then `"traceEvents": [`;
//! - the **events**, streamed;
//! - the **footer** events: metadata events for every row used, the span row, `Record Window End`;
//! - the **tail**, known only when the window has ended: `deviceProperties` when the head had none
//!   (devices first seen during the window, or `[]` without a GPU), `trace_id`, the sources' and
//!   the user's metadata, `dropped_events`, and `traceName` last.
//!
//! A device first seen after the head listed others (a second GPU backend added mid-window) makes
//! the tail write the whole list again under the same key: readers that keep the last value of a
//! key (Python's `json`, serde_json, ours) get every device, streaming readers the head's.
//!
//! Kineto itself writes `distributedInfo` after `traceEvents` for on-demand traces, and HTA,
//! torch-tb-profiler, Perfetto and our reader all load keys from either side of the array.

use std::collections::BTreeSet;

use kinetrace_core::activity::DeviceProperties;
use kinetrace_core::{DistributedInfo, TraceMeta, WindowInfo};

use crate::encoder::{Events, TraceEncoder};
use crate::json::{
    key, member, Array, Compact, Inline, Key, Lines, Member, NestedRows, Object, OpenArray,
    OpenObject, Rows,
};

/// `sort_index` Kineto gives GPU rows: device + this.
const GPU_SORT_BASE: u64 = 5_000_000;

/// Writes the head, up to and including `"traceEvents": [`.
pub(crate) fn head(
    window: &WindowInfo,
    base_ns: u64,
    out: &mut Vec<u8>,
) -> OpenArray<Rows, OpenObject<Lines>> {
    let mut doc = OpenObject::<Lines>::begin(out);
    doc.members(out, |d| {
        d.u64(key!("schemaVersion"), 1);
        if !window.devices.is_empty() {
            device_properties(d, &window.devices);
        }
        // `"rank": N` with a space: HTA finds the rank with the regex `"rank":\s+(\d+)`.
        if let Some(info) = &window.distributed {
            d.object::<Inline>(key!("distributedInfo"), |i| distributed(info, i));
        } else if let Some(rank) = window.rank {
            d.object::<Inline>(key!("distributedInfo"), |i| {
                i.u64(key!("rank"), rank as u64);
                if let Some(ws) = window.world_size {
                    i.u64(key!("world_size"), ws as u64);
                }
            });
        }
        d.str(key!("kinetrace_version"), env!("CARGO_PKG_VERSION"));
        // torch.profiler's switches, `1` when on, in the order it writes them.
        let f = window.framework;
        for (on, k) in [
            (f.with_stack, key!("with_stack")),
            (f.profile_memory, key!("profile_memory")),
            (f.record_shapes, key!("record_shapes")),
        ] {
            if on {
                d.u64(k, 1);
            }
        }
        d.str(key!("host_name"), &window.host_name);
        d.str(key!("displayTimeUnit"), "ms");
        d.u64(key!("baseTimeNanoseconds"), base_ns);
    });
    doc.begin_array::<Rows>(out, key!("traceEvents"))
}

/// `distributedInfo` as torch.profiler writes it (its keys, in its order).
fn distributed(info: &DistributedInfo, i: &mut Object<'_, Inline>) {
    if let Some(b) = &info.backend {
        i.str(key!("backend"), b);
    }
    i.u64(key!("rank"), u64::from(info.rank));
    if let Some(ws) = info.world_size {
        i.u64(key!("world_size"), u64::from(ws));
    }
    if let Some(n) = info.pg_count {
        i.u64(key!("pg_count"), n);
    }
    if let Some(groups) = &info.pg_config {
        i.array::<Inline>(key!("pg_config"), |a| {
            for g in groups {
                a.object::<Inline>(|o| {
                    o.str(key!("pg_name"), &g.pg_name);
                    o.str(key!("pg_desc"), &g.pg_desc);
                    o.str(key!("backend_config"), &g.backend_config);
                    o.u64(key!("pg_size"), g.pg_size);
                    o.array::<Inline>(key!("ranks"), |r| {
                        for rank in &g.ranks {
                            r.u64(*rank);
                        }
                    });
                });
            }
        });
    }
    if let Some(v) = &info.nccl_version {
        i.str(key!("nccl_version"), v);
    }
}

impl TraceEncoder {
    /// Ends the document: the metadata events for every row used, the span row and
    /// `Record Window End`, then `]`, the keys known only now, and `}`. `trace_name` becomes
    /// `traceName` (Kineto writes the output path there).
    pub fn finish(self, meta: &TraceMeta, trace_name: &str, out: &mut Vec<u8>) {
        let TraceEncoder {
            ev,
            mut doc,
            head_devices,
        } = self;
        doc.elements(out, |events| footer(&ev, meta, events));
        let mut doc = doc.end(out);
        doc.members(out, |d| tail(meta, &head_devices, trace_name, d));
        doc.end(out);
        out.push(b'\n');
    }
}

/// `"deviceProperties": [...]`, one device per line.
fn device_properties(d: &mut Object<'_, Lines>, devices: &[DeviceProperties]) {
    d.array::<NestedRows>(key!("deviceProperties"), |a| {
        for dev in devices {
            a.object::<Inline>(|o| device(dev, o));
        }
    });
}

/// The keys known only at the end. `head_devices`: the ids the head listed.
fn tail(meta: &TraceMeta, head_devices: &[u32], trace_name: &str, d: &mut Object<'_, Lines>) {
    let late = meta
        .devices
        .iter()
        .any(|dev| !head_devices.contains(&dev.id));
    if head_devices.is_empty() || late {
        device_properties(d, &meta.devices);
    }
    d.str(key!("trace_id"), &meta.trace_id);
    for (k, v) in &meta.metadata {
        // Keys HTA's rank regex or the format itself own are not user metadata.
        if !is_reserved_key(k) {
            d.str(Key::escaped(k), v);
        }
    }
    d.object::<Inline>(key!("dropped_events"), |o| {
        for (k, n) in &meta.dropped {
            o.u64(Key::escaped(k), *n);
        }
    });
    d.str(key!("traceName"), trace_name);
}

/// The metadata events Kineto writes for rows, each with its one argument.
#[derive(Clone, Copy)]
enum Meta {
    ProcessName,
    ProcessLabels,
    ProcessSortIndex,
    ThreadName,
    ThreadSortIndex,
}

impl Meta {
    /// The event's `name` member and its argument's key.
    fn parts(self) -> (Member, Key<'static>) {
        match self {
            Meta::ProcessName => (member!("name", "process_name"), key!("name")),
            Meta::ProcessLabels => (member!("name", "process_labels"), key!("labels")),
            Meta::ProcessSortIndex => (member!("name", "process_sort_index"), key!("sort_index")),
            Meta::ThreadName => (member!("name", "thread_name"), key!("name")),
            Meta::ThreadSortIndex => (member!("name", "thread_sort_index"), key!("sort_index")),
        }
    }
}

enum MetaValue<'a> {
    Str(&'a str),
    Int(i64),
}

/// `{"ph":"M","name":…,"ts":…,"pid":…,"tid":…,"args":{key: value}}`.
fn meta_event(
    events: &mut Array<'_, Rows>,
    ts: u64,
    kind: Meta,
    (pid, tid): (i64, i64),
    value: MetaValue<'_>,
) {
    let (name, key) = kind.parts();
    events.object::<Compact>(|e| {
        e.member(member!("ph", "M"));
        e.member(name);
        e.us3(key!("ts"), ts);
        e.i64(key!("pid"), pid);
        e.i64(key!("tid"), tid);
        e.object::<Compact>(key!("args"), |args| match value {
            MetaValue::Str(s) => args.str(key, s),
            MetaValue::Int(i) => args.i64(key, i),
        });
    });
}

/// The metadata events for every row used, the span row viewers show for the whole window, and
/// `Record Window End`.
fn footer(ev: &Events, meta: &TraceMeta, events: &mut Array<'_, Rows>) {
    use Meta::*;
    use MetaValue::{Int, Str};
    let ts = ev.rel(meta.window_start);
    let mut m = |kind, row, value: MetaValue<'_>| meta_event(events, ts, kind, row, value);
    let mut pids: BTreeSet<u32> = ev.cpu_rows.iter().map(|(p, _)| *p).collect();
    pids.insert(meta.pid);
    for p in pids {
        let row = (p as i64, 0);
        m(ProcessName, row, Str(&meta.process_name));
        m(ProcessLabels, row, Str("CPU"));
        m(ProcessSortIndex, row, Int(p as i64));
    }
    let mut cpu_rows: Vec<(u32, u32)> = ev.cpu_rows.iter().copied().collect();
    cpu_rows.sort_unstable();
    for (p, tid) in cpu_rows {
        let tname = meta
            .thread_names
            .iter()
            .find(|(t, _)| *t == tid)
            .map(|(_, n)| n.as_str())
            .filter(|n| !n.is_empty())
            .unwrap_or(&meta.process_name);
        let row = (p as i64, tid as i64);
        m(ThreadName, row, Str(&format!("thread {tid} ({tname})")));
        m(ThreadSortIndex, row, Int(tid as i64));
    }
    for &d in &ev.devices {
        let row = (d as i64, 0);
        m(ProcessName, row, Str(&meta.process_name));
        m(ProcessLabels, row, Str(&format!("GPU {d}")));
        m(
            ProcessSortIndex,
            row,
            Int((d as u64 + GPU_SORT_BASE) as i64),
        );
    }
    let mut gpu_rows: Vec<(u32, u32)> = ev.gpu_rows.iter().copied().collect();
    gpu_rows.sort_unstable();
    for (d, s) in gpu_rows {
        let row = (d as i64, s as i64);
        // The trailing space is Kineto's.
        m(ThreadName, row, Str(&format!("stream {s} ")));
        m(ThreadSortIndex, row, Int(s as i64));
    }
    for &d in &ev.device_rows {
        m(ThreadName, (d as i64, 1), Str(&format!("Device {d}")));
    }
    if ev.overhead {
        m(ProcessName, (-1, 0), Str("CUPTI Overhead"));
        m(ProcessSortIndex, (-1, 0), Int(0x100000A));
    }
    // Named as Kineto names it: torch-tb-profiler takes the trace's extent from the event called
    // `PyTorch Profiler (0)`.
    events.object::<Compact>(|e| {
        e.member(member!("ph", "X"));
        e.member(member!("cat", "Trace"));
        e.str_parts(
            key!("name"),
            &["PyTorch Profiler (", &meta.cycle.to_string(), ")"],
        );
        e.member(member!("pid", "Spans"));
        e.member(member!("tid", "PyTorch Profiler"));
        e.us3(key!("ts"), ts);
        e.us3(
            key!("dur"),
            meta.window_end.saturating_sub(meta.window_start),
        );
        e.object::<Compact>(key!("args"), |args| args.u64(key!("Op count"), 0));
    });
    events.object::<Compact>(|e| {
        e.member(member!("ph", "M"));
        e.member(member!("name", "process_sort_index"));
        e.us3(key!("ts"), ts);
        e.member(member!("pid", "Spans"));
        e.u64(key!("tid"), 0);
        e.object::<Compact>(key!("args"), |args| {
            args.u64(key!("sort_index"), 0x2000_0000)
        });
    });
    events.object::<Compact>(|e| {
        e.member(member!("ph", "i"));
        e.member(member!("s", "g"));
        e.member(member!("name", "Iteration Start: PyTorch Profiler"));
        e.member(member!("pid", "Traces"));
        e.member(member!("tid", "Trace PyTorch Profiler"));
        e.us3(key!("ts"), ts);
    });
    events.object::<Compact>(|e| {
        e.member(member!("ph", "i"));
        e.member(member!("s", "g"));
        e.member(member!("name", "Record Window End"));
        e.member(member!("pid", ""));
        e.member(member!("tid", ""));
        e.us3(key!("ts"), ev.rel(meta.window_end));
    });
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
            | "with_stack"
            | "profile_memory"
            | "record_shapes"
    )
}

fn device(d: &DeviceProperties, o: &mut Object<'_, Inline>) {
    o.u64(key!("id"), d.id as u64);
    o.str(key!("name"), &d.name);
    o.u64(key!("totalGlobalMem"), d.total_global_mem);
    o.u64(key!("computeMajor"), d.compute_major as u64);
    o.u64(key!("computeMinor"), d.compute_minor as u64);
    o.u64(key!("maxThreadsPerBlock"), d.max_threads_per_block as u64);
    let per_mp = d.max_threads_per_multiprocessor as u64;
    o.u64(key!("maxThreadsPerMultiprocessor"), per_mp);
    o.u64(key!("regsPerBlock"), d.regs_per_block as u64);
    o.u64(key!("warpSize"), d.warp_size as u64);
    o.u64(key!("sharedMemPerBlock"), d.shared_mem_per_block);
    o.u64(key!("numSms"), d.num_sms as u64);
    if let Some(v) = d.regs_per_multiprocessor {
        o.u64(key!("regsPerMultiprocessor"), v as u64);
    }
    if let Some(v) = d.shared_mem_per_block_optin {
        o.u64(key!("sharedMemPerBlockOptin"), v);
    }
    if let Some(v) = d.shared_mem_per_multiprocessor {
        o.u64(key!("sharedMemPerMultiprocessor"), v);
    }
}
