//! A GPU that exists only in memory: an [`ActivitySource`] that turns calls like
//! [`SimulatedGpu::launch_kernel`] into the records a real backend would produce — a runtime call on
//! the calling thread and a kernel on a per-stream timeline, both delivered when the session polls
//! or flushes, as CUPTI delivers them — so the whole pipeline (sources → session → exporter) runs
//! without a GPU. Used by tests and the demo. Only core's public API is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kinetrace_core::activity::*;
use kinetrace_core::clock::UnixNanos;
use kinetrace_core::intern::{intern, NameId};
use kinetrace_core::recorder;
use kinetrace_core::source::{ActivitySource, SourceError};

/// Most GPU records held between flushes; more are dropped and counted.
pub const MAX_PENDING: usize = 1 << 20;

/// Launch latency: a kernel starts no earlier than this after its launch call returns.
const LAUNCH_LATENCY_NS: u64 = 2_000;

/// A cloneable handle to one simulated device.
#[derive(Clone)]
pub struct SimulatedGpu {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    device: u32,
    enabled: Option<ActivitySet>,
    pending: Vec<Activity>,
    stream_free_at: HashMap<u32, UnixNanos>,
    next_correlation: u64,
    dropped: u64,
    fail_enable: Option<String>,
}

struct Names {
    launch: NameId,
    memcpy: NameId,
    memset: NameId,
    stream_sync: NameId,
}

fn names() -> &'static Names {
    static NAMES: std::sync::OnceLock<Names> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| Names {
        launch: intern("cudaLaunchKernel"),
        memcpy: intern("cudaMemcpyAsync"),
        memset: intern("cudaMemsetAsync"),
        stream_sync: intern("cudaStreamSynchronize"),
    })
}

impl SimulatedGpu {
    /// A simulated device with index `device`.
    pub fn new(device: u32) -> Self {
        SimulatedGpu {
            inner: Arc::new(Mutex::new(Inner {
                device,
                enabled: None,
                pending: Vec::new(),
                stream_free_at: HashMap::new(),
                next_correlation: 1,
                dropped: 0,
                fail_enable: None,
            })),
        }
    }

    /// Makes the next [`ActivitySource::enable`] fail with `message` (fault injection).
    pub fn fail_enable(&self, message: &str) {
        self.lock().fail_enable = Some(message.to_owned());
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the source is producing records now.
    pub fn is_enabled(&self) -> bool {
        self.lock().enabled.is_some()
    }

    /// Launches a kernel of `dur_ns` on `stream`; returns the correlation id when recorded.
    pub fn launch_kernel(&self, name: &str, stream: u32, dur_ns: u64) -> Option<u64> {
        let name = intern(name);
        self.api_call(names().launch, 211, true, stream, dur_ns, |g, dev| {
            Detail::Kernel(Kernel {
                name,
                device: dev,
                context: Some(1),
                stream,
                grid: Some([g.grid, 1, 1]),
                block: Some([128, 1, 1]),
                registers_per_thread: Some(32),
                shared_memory: Some(0),
                queued: None,
                graph_id: None,
                kind_arg: false,
                graph_node_id: None,
            })
        })
    }

    /// An asynchronous copy of `bytes` on `stream` taking `dur_ns`.
    pub fn memcpy(
        &self,
        kind: MemcpyKind,
        src_kind: MemoryKind,
        dst_kind: MemoryKind,
        bytes: u64,
        stream: u32,
        dur_ns: u64,
    ) -> Option<u64> {
        self.api_call(names().memcpy, 41, true, stream, dur_ns, |_, dev| {
            Detail::Memcpy(Memcpy {
                kind,
                src_kind,
                dst_kind,
                bytes,
                device: dev,
                context: Some(1),
                stream,
                kind_arg: false,
                peer: None,
            })
        })
    }

    /// An asynchronous set of `bytes` of device memory on `stream` taking `dur_ns`.
    pub fn memset(&self, bytes: u64, stream: u32, dur_ns: u64) -> Option<u64> {
        self.api_call(names().memset, 51, true, stream, dur_ns, |_, dev| {
            Detail::Memset(Memset {
                memory_kind: MemoryKind::Device,
                bytes,
                device: dev,
                context: Some(1),
                stream,
            })
        })
    }

    /// Waits (in simulated time) for `stream` to drain: a `cudaStreamSynchronize` call and a
    /// `Stream Sync` record covering the wait.
    pub fn synchronize_stream(&self, stream: u32) -> Option<u64> {
        self.api_call(names().stream_sync, 131, true, stream, 0, |_, dev| {
            Detail::Sync(Sync {
                kind: SyncKind::StreamSync,
                device: Some(dev),
                context: Some(1),
                stream: Some(stream),
                event_id: None,
                wait_on_stream: None,
                wait_on_event_record_correlation: None,
            })
        })
    }

    /// Adds a GPU-side record exactly as given (for constructed workloads with known timings).
    pub fn inject(&self, activity: Activity) {
        let mut g = self.lock();
        if g.enabled.is_none() {
            return;
        }
        if g.pending.len() >= MAX_PENDING {
            g.dropped += 1;
            return;
        }
        g.pending.push(activity);
    }

    /// A fresh correlation id, for constructed workloads that inject both ends of a launch.
    pub fn next_correlation(&self) -> u64 {
        let mut g = self.lock();
        let c = g.next_correlation;
        g.next_correlation += 1;
        c
    }

    fn api_call(
        &self,
        api: NameId,
        cbid: u32,
        launches_work: bool,
        stream: u32,
        dur_ns: u64,
        detail: impl FnOnce(&Grid, u32) -> Detail,
    ) -> Option<u64> {
        let call_start = UnixNanos::now();
        let mut g = self.lock();
        let enabled = g.enabled?;
        let correlation = g.next_correlation;
        g.next_correlation += 1;
        let external_id = recorder::current_external_id();
        let call_end = UnixNanos::now();
        let free_at = g.stream_free_at.get(&stream).copied().unwrap_or_default();
        let start = UnixNanos((call_end.0 + LAUNCH_LATENCY_NS).max(free_at.0));
        let detail = detail(&Grid { grid: 64 }, g.device);
        let is_sync = matches!(detail, Detail::Sync(_));
        let (start, end) = if is_sync {
            // A sync spans from the call to the moment the stream drains.
            (call_start, UnixNanos(free_at.0.max(call_end.0)))
        } else {
            (start, UnixNanos(start.0 + dur_ns))
        };
        if !is_sync {
            g.stream_free_at.insert(stream, end);
        }
        let gpu = Activity {
            start,
            end,
            correlation: Some(correlation),
            external_id,
            detail,
        };
        // The API call itself covers the wait for a sync. Like CUPTI, the source reports the call
        // (a host record) along with the device work it launched.
        let api_end = if is_sync { end } else { call_end };
        let api = Activity {
            start: call_start,
            end: api_end,
            correlation: Some(correlation),
            external_id,
            detail: Detail::Runtime(ApiCall {
                name: api,
                cbid: Some(cbid),
                pid: std::process::id(),
                tid: recorder::current_tid(),
                launches_work,
                args: Default::default(),
            }),
        };
        for a in [gpu, api] {
            if enabled.contains(a.activity_type()) {
                if g.pending.len() >= MAX_PENDING {
                    g.dropped += 1;
                } else {
                    g.pending.push(a);
                }
            }
        }
        Some(correlation)
    }
}

struct Grid {
    grid: u32,
}

impl ActivitySource for SimulatedGpu {
    fn name(&self) -> &str {
        "simulated_gpu"
    }

    fn metadata(&self) -> Vec<(String, String)> {
        vec![("simulated_gpu_version".into(), "1".into())]
    }

    fn device_properties(&self) -> Vec<DeviceProperties> {
        let device = self.lock().device;
        vec![DeviceProperties {
            id: device,
            name: "kinetrace Simulated GPU".into(),
            total_global_mem: 80 << 30,
            compute_major: 9,
            compute_minor: 0,
            max_threads_per_block: 1024,
            max_threads_per_multiprocessor: 2048,
            regs_per_block: 65536,
            warp_size: 32,
            shared_mem_per_block: 49152,
            num_sms: 132,
            regs_per_multiprocessor: Some(65536),
            shared_mem_per_block_optin: Some(232448),
            shared_mem_per_multiprocessor: Some(233472),
        }]
    }

    fn enable(&mut self, activities: ActivitySet) -> Result<(), SourceError> {
        let mut g = self.lock();
        if let Some(message) = g.fail_enable.take() {
            return Err(SourceError {
                source: "simulated_gpu".into(),
                message,
            });
        }
        g.enabled = Some(activities);
        Ok(())
    }

    fn disable(&mut self) {
        self.lock().enabled = None;
    }

    fn poll(&mut self, emit: &mut dyn FnMut(&Activity)) {
        // Only records whose end has passed are "complete", as with a real device.
        let now = UnixNanos::now();
        let ready: Vec<Activity> = {
            let mut g = self.lock();
            let (done, later): (Vec<_>, Vec<_>) = g.pending.drain(..).partition(|a| a.end <= now);
            g.pending = later;
            done
        };
        ready.iter().for_each(emit);
    }

    fn flush(&mut self, emit: &mut dyn FnMut(&Activity)) {
        let all = std::mem::take(&mut self.lock().pending);
        all.iter().for_each(emit);
    }

    fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}
