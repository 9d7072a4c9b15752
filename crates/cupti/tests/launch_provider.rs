//! Kernels launched on a server thread, not on the thread whose range issued them (cubecl's
//! device server): the driver-API enter callback asks the registered launch provider, which pairs
//! the launch with the queued (External id, kernel name) of the issuing stream. Through the fake
//! libcupti, whose driver launches carry the kernel's `symbolName` as CUPTI's do.

mod common;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::path::Path;
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use common::*;
use kinetrace_core::launch::{set_launch_provider, LaunchQueues};
use kinetrace_core::{recorder, ActivitySet};
use kinetrace_cupti::{CuptiConfig, CuptiSource};

fn config(lib: &Path) -> CuptiConfig {
    CuptiConfig {
        library: Some(lib.to_path_buf()),
        driver: Some(lib.to_path_buf()),
        late_buffer_wait: Duration::from_millis(500),
        ..CuptiConfig::default()
    }
}

static QUEUES: OnceLock<LaunchQueues> = OnceLock::new();

thread_local! {
    /// The stream the simulated server is launching for (cubecl sets the issuer's stream id
    /// around each task it runs).
    static SERVING: Cell<u64> = const { Cell::new(u64::MAX - 1) };
}

fn prefix(kernel: &'static str, symbol: &[u8]) -> bool {
    symbol.starts_with(kernel.as_bytes())
}

fn provider(symbol: Option<&CStr>) -> Option<u64> {
    let stream = SERVING.with(Cell::get);
    QUEUES
        .get()?
        .pop(stream, symbol.map(CStr::to_bytes), prefix)
}

fn run() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_as(dir.path(), "libcupti.so.12");
    let fake = Fake::open(&lib);
    let out = dir.path().join("traces");
    let log = Log::default();
    let session = trace_session(
        vec![Box::new(CuptiSource::new(config(&lib)))],
        ActivitySet::all(),
        &out,
        &log,
    );
    let queues = QUEUES.get_or_init(|| LaunchQueues::new(8, 64));
    assert!(set_launch_provider(provider));

    // (issuing stream, kernel) in the order the server receives them.
    let (tx, rx) = mpsc::channel::<(u64, String)>();
    let mut issued: HashMap<String, u64> = HashMap::new();
    std::thread::scope(|scope| {
        let server = scope.spawn(|| {
            assert_eq!(
                recorder::current_external_id(),
                None,
                "the server has no range"
            );
            for (stream, kernel) in rx {
                SERVING.with(|s| s.set(stream));
                // The driver symbol carries a hash suffix, as cubecl's do.
                fake.driver_kernel(&format!("{kernel}_0badf00d"), 3);
            }
            // A launch nothing issued: no External id.
            SERVING.with(|s| s.set(9));
            fake.driver_kernel("orphan_12345678", 3);
        });
        let issuers: Vec<_> = ["a", "b"]
            .into_iter()
            .enumerate()
            .map(|(stream, who)| {
                let tx = tx.clone();
                scope.spawn(move || {
                    let range = annotation(if who == "a" { "issue_a" } else { "issue_b" });
                    let id = range.id().expect("recording");
                    let mut mine = Vec::new();
                    for i in 0..3 {
                        let kernel: &'static str = Box::leak(format!("k{who}{i}").into_boxed_str());
                        assert!(queues.push(stream as u64, id, kernel));
                        tx.send((stream as u64, kernel.to_string())).unwrap();
                        mine.push((kernel.to_string(), id));
                    }
                    mine
                })
            })
            .collect();
        drop(tx);
        for t in issuers {
            issued.extend(t.join().unwrap());
        }
        server.join().unwrap();
    });
    // A launch on a thread with its own range and nothing queued: the thread's id, as before.
    let direct = {
        let range = annotation("direct");
        fake.driver_kernel("direct_kernel_00000000", 3);
        range.id().unwrap()
    };
    session.stop();

    let trace = load_trace(&out);
    let kernels = x(&trace, "kernel");
    assert_eq!(kernels.len(), 8, "{kernels:?}");
    let ext = |name: &str| -> Option<u64> {
        let k = kernels
            .iter()
            .find(|k| k["name"] == name)
            .unwrap_or_else(|| panic!("no kernel {name}"));
        k["args"]["External id"].as_u64()
    };
    for (kernel, id) in &issued {
        assert_eq!(
            ext(&format!("{kernel}_0badf00d")),
            Some(*id),
            "{kernel} carries the id of the range that issued it"
        );
    }
    assert_eq!(ext("orphan_12345678"), None, "nothing issued it");
    assert_eq!(ext("direct_kernel_00000000"), Some(direct));
    // The ranges themselves are in the trace under those ids.
    for name in ["issue_a", "issue_b", "direct"] {
        let a = x(&trace, "user_annotation");
        assert!(
            a.iter().any(|e| e["name"] == name),
            "annotation {name} missing"
        );
    }
    let s = queues.stats();
    assert_eq!((s.pushed, s.paired, s.skipped), (6, 6, 0), "{s:?}");
    assert!(s.unpaired >= 2, "orphan and direct found no entry: {s:?}");
}

#[test]
fn server_thread_launches_carry_the_issuing_range() {
    in_child(
        "server_thread_launches_carry_the_issuing_range",
        &[NVTX_SET],
        run,
    );
}
