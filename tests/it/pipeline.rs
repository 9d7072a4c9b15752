//! The whole pipeline through the simulated GPU: rings → session → exporter → files.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kinetrace::{record_function, Profiler, Schedule, SimulatedGpu};

use crate::util::*;

fn workload(gpu: &SimulatedGpu) {
    let _fwd = record_function("forward");
    gpu.launch_kernel("gemm", 7, 10_000);
    gpu.launch_kernel("relu", 7, 2_000);
}

#[test]
fn schedule_cycles_write_one_file_each_with_the_right_steps() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    // The callback records the step number the loop is moving to when it fires (torch fires
    // on_trace_ready inside the step() call that leaves the last active step).
    let moving_to = Arc::new(AtomicU64::new(0));
    let fired: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (m2, f2) = (moving_to.clone(), fired.clone());
    let schedule = Schedule::new(1, 1, 2).unwrap().with_repeat(2).with_skip_first(1);
    let prof = Profiler::builder()
        .schedule(schedule)
        .output_dir(dir.path())
        .source(gpu.clone())
        .rank(3)
        .on_trace_ready(move |_| f2.lock().unwrap().push(m2.load(Ordering::SeqCst)))
        .start()
        .unwrap();
    for step in 0..12u64 {
        workload(&gpu);
        moving_to.store(step + 1, Ordering::SeqCst);
        prof.step();
    }
    assert_eq!(*fired.lock().unwrap(), vec![5, 9]);
    let outputs = prof.stop();
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    let files = trace_files(dir.path());
    assert_eq!(files.len(), 2);
    let mut steps: Vec<Vec<String>> = outputs
        .iter()
        .map(|o| step_names(&load(o.path.as_ref().unwrap())))
        .collect();
    steps.sort();
    assert_eq!(steps, vec![vec!["ProfilerStep#3", "ProfilerStep#4"], vec!["ProfilerStep#7", "ProfilerStep#8"]]);
    for o in &outputs {
        let t = load(o.path.as_ref().unwrap());
        // Two steps, two kernels and two launches each.
        assert_eq!(x_events(&t, "kernel").count(), 4);
        assert_eq!(x_events(&t, "cuda_runtime").count(), 4);
        assert_eq!(x_events(&t, "user_annotation").filter(|e| e["name"] == "forward").count(), 2);
        assert_eq!(t["distributedInfo"]["rank"], 3);
    }
}
