//! Driver-API launches, as candle makes them (cudarc's `cuLaunchKernel` on the calling thread; cuBLAS
//! likewise), and runtime calls that reach the driver inside them: every kernel carries the External
//! id of the range open on the launching thread when it was launched, and a nested runtime→driver
//! pair pushes that id once. The real pipeline against the fake libcupti, in a child process.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use kinetrace_core::ActivitySet;
use kinetrace_cupti::{CuptiConfig, CuptiSource};
use serde_json::Value;

fn config(lib: &Path) -> CuptiConfig {
    CuptiConfig {
        library: Some(lib.to_path_buf()),
        driver: Some(lib.to_path_buf()),
        buffer_size: 4096,
        late_buffer_wait: Duration::from_millis(500),
        ..CuptiConfig::default()
    }
}

/// Events of categories `cats` by their `correlation` arg.
fn by_corr<'a>(trace: &'a Value, cats: &[&str]) -> HashMap<u64, &'a Value> {
    events(trace)
        .iter()
        .filter(|ev| ev["ph"] == "X" && cats.contains(&ev["cat"].as_str().unwrap_or("")))
        .map(|ev| (ev["args"]["correlation"].as_u64().unwrap(), ev))
        .collect()
}

fn external(ev: &Value) -> Option<u64> {
    ev["args"]["External id"].as_u64()
}

#[test]
fn driver_launches_carry_the_range_that_launched_them() {
    in_child(
        "driver_launches_carry_the_range_that_launched_them",
        &[NVTX_SET],
        || {
            let dir = tempfile::tempdir().unwrap();
            let lib = fake_as(dir.path(), "libcupti.so.12");
            let fake = Fake::open(&lib);
            let out = dir.path().join("traces");
            let log = Log::default();
            let source = CuptiSource::new(config(&lib));
            let profiler = trace_session(vec![Box::new(source)], ActivitySet::all(), &out, &log);
            let pushes_before = fake.external_pushes();

            // Outside any range: nothing to link to.
            let bare = fake.driver_kernel("outside", 7);
            // As a candle forward: one range, three `linear` enters each launching a gemm and a bias
            // add through the driver API, then an activation in the forward range itself, then a
            // runtime launch that reaches the driver inside it.
            let mut in_linear = Vec::new();
            let (relu, nested_runtime, nested_driver);
            {
                let _forward = annotation("forward");
                for enter in 0..3 {
                    let _linear = annotation("linear");
                    in_linear.push((fake.driver_kernel("gemm", 7), enter));
                    in_linear.push((fake.driver_kernel("bias_add", 7), enter));
                    assert_eq!(fake.external_depth(), 0, "popped after each call");
                }
                relu = fake.driver_kernel("relu", 7);
                (nested_runtime, nested_driver) = fake.kernel_via_driver("softmax", 7);
            }
            let pushes = fake.external_pushes() - pushes_before;
            assert_eq!(fake.external_depth(), 0, "nothing left on CUPTI's stack");
            profiler.stop();
            assert!(log.lines().is_empty(), "messages: {:?}", log.lines());
            // One push per outermost call inside a range: 6 + relu + the runtime call (not its
            // driver call as well).
            assert_eq!(pushes, 8, "external-correlation pushes");

            let trace = load_trace(&out);
            let ranges = x(&trace, "user_annotation");
            let forward = ranges
                .iter()
                .find(|r| r["name"] == "forward")
                .and_then(|r| external(r))
                .expect("forward range with an External id");
            let linear: Vec<u64> = ranges
                .iter()
                .filter(|r| r["name"] == "linear")
                .map(|r| external(r).expect("linear range with an External id"))
                .collect();
            assert_eq!(linear.len(), 3, "one range per enter: {ranges:?}");
            assert!(
                linear[0] != linear[1] && linear[1] != linear[2] && linear[0] != linear[2],
                "one External id per enter: {linear:?}"
            );

            let kernels = by_corr(&trace, &["kernel"]);
            assert_eq!(kernels.len(), 9, "kernels: {kernels:?}");
            for (corr, enter) in &in_linear {
                let k = kernels[&(*corr as u64)];
                assert_eq!(external(k), Some(linear[*enter]), "{k}");
            }
            assert_eq!(external(kernels[&(relu as u64)]), Some(forward));
            let softmax = kernels[&(nested_runtime as u64)];
            assert_eq!(softmax["name"], "softmax");
            assert_eq!(external(softmax), Some(forward), "{softmax}");
            assert_eq!(external(kernels[&(bare as u64)]), None, "outside any range");

            // The API events: both halves of the nested pair carry the range's id, the driver one
            // inside the runtime one on the same thread.
            let runtime = by_corr(&trace, &["cuda_runtime"]);
            let driver = by_corr(&trace, &["cuda_driver"]);
            assert_eq!(driver.len(), 9, "driver calls: {driver:?}");
            let (outer, inner) = (
                runtime[&(nested_runtime as u64)],
                driver[&(nested_driver as u64)],
            );
            assert_eq!(external(outer), Some(forward), "{outer}");
            assert_eq!(external(inner), Some(forward), "{inner}");
            assert_eq!(outer["tid"], inner["tid"]);
            let (o_ts, i_ts) = (outer["ts"].as_f64().unwrap(), inner["ts"].as_f64().unwrap());
            let end = |e: &Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
            assert!(
                o_ts <= i_ts && end(inner) <= end(outer) + 1e-3,
                "{outer} / {inner}"
            );
            for (corr, enter) in &in_linear {
                assert_eq!(external(driver[&(*corr as u64)]), Some(linear[*enter]));
            }
            assert_eq!(external(driver[&(bare as u64)]), None);
        },
    );
}
