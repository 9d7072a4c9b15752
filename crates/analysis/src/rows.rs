//! One rank's events in the compact form the analyses work on.
//!
//! Only what HTA keeps becomes a [`Row`]: events with a `dur` and a `cat`, except `cat == "Trace"`
//! (HTA drops the rest with `dropna(subset=["dur", "cat"])`; the phase is never looked at).
//! `[memory]` instant events become [`MemSample`]s. Each row carries two clocks:
//!
//! - HTA's: when any event of the file has a float `ts` (pandas then holds the whole `ts` column
//!   as float64), HTA rounds every row inward to whole µs: `ts = ceil(ts)`,
//!   `end = floor(ts + dur)` (an f64 sum), `dur = end − ts`, so a sub-µs event can get
//!   `dur = −1 µs`. Otherwise the values are used as written.
//! - The exact one: ns since the Unix epoch, from the reader.

use std::io::Read;
use std::path::Path;

use crate::fastmap::FastMap;
use kinetrace_export::reader::{Phase, RawNum, ReadError, ReadOptions, RowId, TraceEvent};

/// One HTA row (an event with `dur` and `cat`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    /// Position in `traceEvents` (HTA's `index` column).
    pub index: u32,
    /// Interned `name`.
    pub name: u32,
    /// Interned `cat`.
    pub cat: u32,
    /// Interned `(pid, tid)`.
    pub thread: u32,
    /// `args.stream`, −1 when absent or not an integer.
    pub stream: i64,
    /// `args.correlation`, −1 when absent.
    pub corr: i64,
    /// `args["External id"]`, −1 when absent.
    pub ext: i64,
    /// Start on HTA's clock, ns (a whole number of µs when HTA rounds).
    pub hts: i64,
    /// Duration on HTA's clock, ns (may be −1000 after HTA's rounding).
    pub hdur: i64,
    /// Exact start, ns since the Unix epoch.
    pub ts: i64,
    /// Exact duration, ns.
    pub dur: i64,
}

impl Row {
    /// End on HTA's clock.
    pub fn hend(&self) -> i64 {
        self.hts + self.hdur
    }
    /// Exact end.
    pub fn end(&self) -> i64 {
        self.ts.saturating_add(self.dur)
    }
    /// HTA's GPU-row test without the sync-name part: `stream >= 0 and correlation >= 0`.
    pub fn on_stream_with_corr(&self) -> bool {
        self.stream >= 0 && self.corr >= 0
    }
}

/// One `[memory]` instant event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemSample {
    /// Exact time, ns since the Unix epoch.
    pub ts: i64,
    /// `args["Device Id"]` (−1: CPU).
    pub device: i64,
    /// `args["Total Allocated"]`, bytes.
    pub allocated: i64,
    /// `args["Total Reserved"]`, bytes.
    pub reserved: i64,
    /// `args["Bytes"]`: allocated (> 0) or freed (< 0) by this event.
    pub bytes: i64,
    /// The thread it happened on (as [`Row::thread`]).
    pub thread: u32,
}

/// A rank file reduced to rows.
pub(crate) struct Rows {
    /// Interned `cat`/`name` strings (the reader's table).
    pub strings: Vec<Box<str>>,
    /// HTA rows in file order.
    pub rows: Vec<Row>,
    /// `[memory]` samples in file order.
    pub mem: Vec<MemSample>,
    /// Whether HTA rounds this file's timestamps.
    pub rounded: bool,
    /// `distributedInfo.rank`.
    pub rank: Option<i64>,
    /// Number of events in `traceEvents`.
    pub events: u64,
    /// `baseTimeNanoseconds` (then `ts` values in the file are relative to it).
    pub base_ns: Option<i64>,
    /// Top-level keys other than `traceEvents`, as compact JSON text.
    pub metadata: Vec<(String, String)>,
    /// The integer `pid` of the first host row (`cpu_op`, `user_annotation`, `python_function`,
    /// runtime call): the process that wrote the trace.
    pub host_pid: Option<i64>,
    /// `(row position, interned args)` of the rows with `op_args` ([`TraceEvent::op_args`]) (shapes, dtypes,
    /// concrete inputs, collective parameters), in row order.
    pub op_args: Vec<(u32, u32)>,
}

impl Rows {
    /// The text of an interned string.
    pub fn str(&self, id: u32) -> &str {
        &self.strings[id as usize]
    }

    /// The interned args (a compact JSON object) of the row at `pos`, if it has any.
    pub fn op_args(&self, pos: u32) -> Option<u32> {
        self.op_args
            .binary_search_by_key(&pos, |&(p, _)| p)
            .ok()
            .map(|k| self.op_args[k].1)
    }
}

/// HTA's rounding: `(ceil(ts), floor(ts + dur) − ceil(ts))` in µs, as ns.
fn hta_rounded(ts: RawNum, dur: RawNum) -> (i64, i64) {
    let t = ts.as_f64();
    let end = (t + dur.as_f64()).floor();
    let start = t.ceil();
    let to_ns = |us: f64| -> i64 {
        if us.is_finite() {
            (us as i64).saturating_mul(1000)
        } else {
            0
        }
    };
    let s = to_ns(start);
    (s, to_ns(end).saturating_sub(s))
}

/// Reads a trace (plain or gzip, inflated on a second thread) into [`Rows`], streaming: the
/// reader's events are not kept.
/// `path` names the input in errors; `read` holds the reader's limits.
pub(crate) fn load_rows<R: Read + Send>(
    path: &Path,
    input: R,
    read: &ReadOptions,
) -> Result<Rows, ReadError> {
    // Rows are built as events arrive, with HTA's rounded clock and the exact one (without the
    // base time, which may come after `traceEvents`); one pass at the end picks the clock HTA
    // uses and adds the base. No second copy of the rows is made.
    let mut rows: Vec<Row> = Vec::new();
    let mut threads: FastMap<(RowId, RowId), u32> = FastMap::default();
    // Events come in runs from one thread: the last (pid, tid) saves most lookups.
    let mut last_thread: Option<(RowId, RowId, u32)> = None;
    let mut any_float_ts = false;
    let mut count: u64 = 0;
    let mut raw_mem: Vec<(RawNum, i64, i64, i64, i64, u32)> = Vec::new();
    let mut host_pid: Option<i64> = None;
    let mut op_args: Vec<(u32, u32)> = Vec::new();
    let trace =
        read.for_each_event_pipelined(path, input, |ev: TraceEvent, strings: &[Box<str>]| {
            let index = count as u32;
            count += 1;
            any_float_ts |= ev.ts.is_float();
            let text = |id: u32| -> &str { strings.get(id as usize).map_or("", |s| s) };
            let mut thread_of = |pid: RowId, tid: RowId| -> u32 {
                match &last_thread {
                    Some((p, t, id)) if *p == pid && *t == tid => *id,
                    _ => {
                        let next = threads.len() as u32;
                        let id = *threads.entry((pid.clone(), tid.clone())).or_insert(next);
                        last_thread = Some((pid, tid, id));
                        id
                    }
                }
            };
            if ev.ph == Phase::Instant && text(ev.name.0) == "[memory]" {
                let thread = thread_of(ev.pid, ev.tid);
                raw_mem.push((
                    ev.ts,
                    ev.mem_device.unwrap_or(-1),
                    ev.total_allocated.unwrap_or(0),
                    ev.total_reserved.unwrap_or(0),
                    ev.mem_bytes.unwrap_or(0),
                    thread,
                ));
                return;
            }
            let (Some(cat), Some(dur)) = (ev.cat, ev.dur) else {
                return;
            };
            if text(cat.0) == "Trace" {
                return;
            }
            if host_pid.is_none()
                && matches!(
                    text(cat.0),
                    "cpu_op"
                        | "user_annotation"
                        | "python_function"
                        | "cuda_runtime"
                        | "cuda_driver"
                )
            {
                if let RowId::Int(pid) = &ev.pid {
                    host_pid = Some(*pid);
                }
            }
            let thread = thread_of(ev.pid, ev.tid);
            let (hts, hdur) = hta_rounded(ev.ts, dur);
            if let Some(a) = ev.op_args {
                op_args.push((rows.len() as u32, a.0));
            }
            rows.push(Row {
                index,
                name: ev.name.0,
                cat: cat.0,
                thread,
                stream: ev.stream.unwrap_or(-1),
                corr: ev.correlation.unwrap_or(-1),
                ext: ev.external_id.unwrap_or(-1),
                hts,
                hdur,
                ts: ev.ts.us_to_ns(),
                dur: dur.us_to_ns(),
            });
        })?;
    let base = trace.base_time_ns.unwrap_or(0);
    let mem = raw_mem
        .into_iter()
        .map(
            |(ts, device, allocated, reserved, bytes, thread)| MemSample {
                ts: ts.us_to_ns().saturating_add(base),
                device,
                allocated,
                reserved,
                bytes,
                thread,
            },
        )
        .collect();
    for r in &mut rows {
        if !any_float_ts {
            // HTA uses the values as written: the exact clock before the base is added.
            (r.hts, r.hdur) = (r.ts, r.dur);
        }
        r.ts = r.ts.saturating_add(base);
    }
    Ok(Rows {
        strings: trace.strings,
        rows,
        mem,
        rounded: any_float_ts,
        rank: trace.rank,
        events: count,
        base_ns: trace.base_time_ns,
        metadata: trace.metadata,
        host_pid,
        op_args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_inward_and_can_go_negative() {
        assert_eq!(
            hta_rounded(RawNum::Float(10.2), RawNum::Float(2.5)),
            (11_000, 1_000)
        );
        // Sub-µs event: ceil(10.9) = 11, floor(10.95) = 10 -> dur = -1 µs.
        assert_eq!(
            hta_rounded(RawNum::Float(10.9), RawNum::Float(0.05)),
            (11_000, -1_000)
        );
        assert_eq!(hta_rounded(RawNum::Int(5), RawNum::Int(3)), (5_000, 3_000));
        // Epoch-scale float µs: the sum is an f64 sum, as in pandas.
        let (ts, dur) = hta_rounded(RawNum::Float(1712195495406752.8), RawNum::Float(3.456));
        assert_eq!(ts, 1712195495406753 * 1000);
        assert_eq!(dur, 3_000);
    }
}
