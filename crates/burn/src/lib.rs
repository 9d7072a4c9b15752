/*!
Kernel attribution for burn's CubeCL backends (burn-cuda → cubecl-cuda 0.11.3).

cubecl issues a launch on the user's thread (`ComputeClient::launch_inner`) and calls
`cuLaunchKernel` later, on the device's server thread, so the thread-local External id kinetrace's
CUPTI callback reads there is not the user's range. [`install`] bridges the two:

- a cubecl [`LaunchObserver`], called synchronously on the issuing thread before the submit,
  queues `(current External id, kernel name)` under that thread's cubecl [`StreamId`]
  (only while kinetrace is recording, and not for a dry run's launches, which never reach the
  driver);
- a [`kinetrace_core::launch`] provider, asked by the CUPTI driver enter callback for every kernel
  launch on any thread, pops the queue of [`StreamId::current`] (cubecl runs each task under the
  issuer's stream id, `StreamId::executes`) and checks the launched symbol against the queued
  kernel name ([`symbol_matches`]).

Exact with burn's fusion off; with fusion on the launches are issued from the fusion server
thread, where no range of the user's is open (see docs/frameworks.md). Unproven on hardware
until `scripts/gpu-check.sh`'s burn-cuda step passes.
*/

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use cubecl_environment::stream::StreamId;
use cubecl_runtime::logging::{LaunchObservation, LaunchObserver};
use kinetrace_core::launch::{self, LaunchQueueStats, LaunchQueues};
use kinetrace_core::recorder;

/// Streams tracked (cubecl gives each issuing thread its own stream id).
const STREAMS: usize = 64;
/// Launches queued per stream before the oldest is dropped: far more than a server thread lags
/// behind its issuers (the submit queue is flushed at every read-back).
const PER_STREAM: usize = 4096;

fn queues() -> &'static LaunchQueues {
    static QUEUES: OnceLock<LaunchQueues> = OnceLock::new();
    QUEUES.get_or_init(|| LaunchQueues::new(STREAMS, PER_STREAM))
}

/// Attribution installed by [`install`]; dropping it stops observing launches (cubecl's
/// observation guard puts back what it replaced) and stops the provider.
#[must_use = "attribution stops when this is dropped"]
pub struct Attribution {
    _observation: LaunchObservation,
}

impl Attribution {
    /// What the pairing saw so far (pushed, paired, skipped, unpaired, ...).
    pub fn stats(&self) -> LaunchQueueStats {
        queues().stats()
    }
}

impl Drop for Attribution {
    fn drop(&mut self) {
        launch::disable_launch_provider();
    }
}

/// Installs the launch observer and registers the provider. `None` when another launch provider
/// is already registered in this process (one per process).
pub fn install() -> Option<Attribution> {
    if !launch::set_launch_provider(provider) {
        return None;
    }
    Some(Attribution {
        _observation: LaunchObservation::new(Arc::new(Observer)),
    })
}

/// The cubecl observer: runs inside cubecl's launch path, so it only reads thread-locals and
/// pushes into a preallocated FIFO.
struct Observer;

impl LaunchObserver for Observer {
    fn launched(&self, kernel: &'static str) {
        observe(kernel);
    }
}

/// What the observer does for a launch of `kernel` issued on this thread.
fn observe(kernel: &'static str) {
    if !recorder::is_active() || cubecl_runtime::dry_run::launch_mode().is_skipped() {
        return;
    }
    let id = recorder::current_external_id().unwrap_or(0);
    queues().push(StreamId::current().value, id, kernel);
}

/// The provider the CUPTI callback asks on the launching thread.
fn provider(symbol: Option<&CStr>) -> Option<u64> {
    queues().pop(
        StreamId::current().value,
        symbol.map(CStr::to_bytes),
        symbol_matches,
    )
}

/// Whether the CUDA symbol cubecl launched (`<kernel fn>[_<type suffixes>]_<8 hex>`) belongs to
/// the kernel the observer was told about (`core::any::type_name` of the kernel's struct, which
/// `#[cube(launch)]` generates as `<path>::<kernel fn>::<KernelFn><generics>`). Matches when the
/// symbol starts with the module segment (the kernel fn's name), or, ignoring case and `_`, with
/// the struct's name. Allocation-free.
pub fn symbol_matches(kernel: &'static str, symbol: &[u8]) -> bool {
    let path = kernel.split('<').next().unwrap_or(kernel);
    let mut segments = path.rsplit("::");
    let last = segments.next().unwrap_or("");
    if let Some(module) = segments.next() {
        let m = module.as_bytes();
        if !m.is_empty()
            && symbol.starts_with(m)
            && matches!(symbol.get(m.len()), None | Some(b'_'))
        {
            return true;
        }
    }
    !last.is_empty() && folded_prefix(last.as_bytes(), symbol)
}

/// `prefix` is a prefix of `s` ignoring ASCII case and underscores, ending in `s` at a `_` or at
/// the end (so `UnaryFloat` matches `unary_float_f32_…`, not `unary_float2_…`).
fn folded_prefix(prefix: &[u8], s: &[u8]) -> bool {
    let mut at = 0;
    for &p in prefix.iter().filter(|&&b| b != b'_') {
        while s.get(at) == Some(&b'_') {
            at += 1;
        }
        match s.get(at) {
            Some(c) if c.eq_ignore_ascii_case(&p) => at += 1,
            _ => return false,
        }
    }
    matches!(s.get(at), None | Some(b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_match_the_kernels_cube_launch_generates() {
        let k = "burn_cubecl::kernel::unary_float::unary_float::UnaryFloat<f32, cubecl_cuda::runtime::CudaRuntime>";
        assert!(symbol_matches(k, b"unary_float_f32_1a2b3c4d"));
        assert!(symbol_matches(k, b"unary_float_0badf00d"));
        assert!(!symbol_matches(k, b"unary_int_f32_1a2b3c4d"));
        assert!(
            !symbol_matches(k, b"unary_float2_f32_1a2b3c4d"),
            "module name must end at a _ or the end"
        );
        // A hand-written KernelMetadata whose struct name is the symbol in CamelCase.
        assert!(symbol_matches(
            "my::MatmulTiled",
            b"matmul_tiled_f16_00000000"
        ));
        assert!(!symbol_matches(
            "my::MatmulTiled",
            b"matmul_simple_f16_00000000"
        ));
        // No path at all.
        assert!(symbol_matches("Reduce", b"reduce_0000ffff"));
        assert!(!symbol_matches("", b"x"));
    }

    /// The observer on issuing threads and the provider on a server thread running each task
    /// under the issuer's stream id (what cubecl's channel device handle does), through cubecl's
    /// real `StreamId`.
    #[test]
    fn server_thread_pairs_under_the_issuers_stream() {
        recorder::set_active(true);
        let kernel = "burn_cubecl::kernel::add::add::Add<f32>";
        let (tx, rx) = std::sync::mpsc::channel::<(StreamId, u64)>();
        let issuers: Vec<_> = (1..=3u64)
            .map(|n| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let id = n * 1000 + i;
                        let previous = recorder::push_external_id(id);
                        observe(kernel);
                        recorder::restore_external_id(previous);
                        tx.send((StreamId::current(), id)).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let server = std::thread::spawn(move || {
            let mut wrong = Vec::new();
            for (stream, id) in rx {
                let got = stream.executes(|| provider(Some(c"add_f32_12345678")));
                if got != Some(id) {
                    wrong.push((stream, id, got));
                }
            }
            // A launch on the server's own stream, which nothing issued.
            let own = provider(Some(c"add_f32_12345678"));
            (wrong, own)
        });
        for t in issuers {
            t.join().unwrap();
        }
        let (wrong, own) = server.join().unwrap();
        assert!(wrong.is_empty(), "{:?}", &wrong[..wrong.len().min(4)]);
        assert_eq!(own, None);
        recorder::set_active(false);
        // Not recording: nothing is queued.
        observe(kernel);
        assert_eq!(queues().pending(StreamId::current().value), 0);
    }

    #[test]
    fn install_registers_once_and_drop_stops_the_provider() {
        let a = install().expect("first install");
        assert!(a.stats().pushed <= queues().stats().pushed);
        drop(a);
        assert_eq!(
            launch::provided_external_id(Some(c"x")),
            None,
            "off after drop"
        );
        let again = install().expect("same provider again");
        drop(again);
    }
}
