//! The whole pipeline through the simulated GPU: rings → session → exporter → files.

use std::sync::{Arc, Mutex};

use kinetrace::{record_function, Profiler, Schedule};
use kinetrace_test_support::SimulatedGpu;

use crate::util::*;

/// One training step's work: a `forward` range launching two kernels (12 µs of simulated GPU time).
/// The step then lasts until its kernels are done, as a real step that reads a result does, so
/// every kernel starts within the step that launched it (windows keep device work by start time).
fn workload(gpu: &SimulatedGpu) {
    {
        let _fwd = record_function("forward");
        gpu.launch_kernel("gemm", 7, 10_000);
        gpu.launch_kernel("relu", 7, 2_000);
    }
    std::thread::sleep(std::time::Duration::from_micros(100));
}

#[test]
fn schedule_cycles_write_one_file_each_with_the_right_steps() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    // The callback runs on the collector thread once each trace is written (torch calls it inside
    // the step() that leaves the last active step; kinetrace does not make the step wait for it).
    let fired: Arc<Mutex<Vec<u32>>> = Arc::default();
    let f2 = fired.clone();
    let schedule = Schedule::new(1, 1, 2)
        .unwrap()
        .with_repeat(2)
        .with_skip_first(1);
    let prof = Profiler::builder()
        .schedule(schedule)
        .output_dir(dir.path())
        .source(gpu.clone())
        .rank(3)
        .on_trace_ready(move |t| f2.lock().unwrap().push(t.cycle))
        .start()
        .unwrap();
    for _ in 0..12u64 {
        workload(&gpu);
        prof.step();
    }
    let outputs = prof.stop();
    assert_eq!(*fired.lock().unwrap(), vec![0, 1]);
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    let files = trace_files(dir.path());
    assert_eq!(files.len(), 2);
    let mut steps: Vec<Vec<String>> = outputs
        .iter()
        .map(|o| step_names(&load(o.path.as_ref().unwrap())))
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        vec![
            vec!["ProfilerStep#3", "ProfilerStep#4"],
            vec!["ProfilerStep#7", "ProfilerStep#8"]
        ]
    );
    for o in &outputs {
        let t = load(o.path.as_ref().unwrap());
        // Two steps, two kernels and two launches each.
        assert_eq!(x_events(&t, "kernel").count(), 4);
        assert_eq!(x_events(&t, "cuda_runtime").count(), 4);
        assert_eq!(
            x_events(&t, "user_annotation")
                .filter(|e| e["name"] == "forward")
                .count(),
            2
        );
        assert_eq!(t["distributedInfo"]["rank"], 3);
    }
}

fn logged() -> (
    Arc<Mutex<Vec<String>>>,
    impl Fn(&str) + Send + Sync + 'static,
) {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let l2 = lines.clone();
    (lines, move |m: &str| l2.lock().unwrap().push(m.to_owned()))
}

#[test]
fn stopping_during_record_saves_the_partial_cycle_and_during_warmup_saves_nothing() {
    let _g = serial();
    // wait=1, warmup=1, active=3: steps 0 NONE, 1 WARMUP, 2..4 RECORD.
    let schedule = Schedule::new(1, 1, 3).unwrap().with_repeat(1);
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .schedule(schedule)
        .output_dir(dir.path())
        .source(gpu.clone())
        .start()
        .unwrap();
    for _ in 0..3 {
        workload(&gpu);
        prof.step();
    }
    // Now at step 3 (RECORD), cycle incomplete.
    let out = prof.stop();
    assert_eq!(out.len(), 1);
    let t = load(out[0].path.as_ref().unwrap());
    assert_eq!(step_names(&t), vec!["ProfilerStep#2", "ProfilerStep#3"]);

    let dir = tempfile::tempdir().unwrap();
    let prof = Profiler::builder()
        .schedule(schedule)
        .output_dir(dir.path())
        .source(gpu.clone())
        .start()
        .unwrap();
    workload(&gpu);
    prof.step(); // step 1: WARMUP
    workload(&gpu);
    assert_eq!(prof.action(), kinetrace::ProfilerAction::Warmup);
    assert!(prof.stop().is_empty());
    assert!(trace_files(dir.path()).is_empty());
    // No spool or temp files are left behind either.
    assert_eq!(
        std::fs::read_dir(dir.path())
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

#[test]
fn step_range_records_exactly_those_steps() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .step_range(4, 6)
        .output_dir(dir.path())
        .source(gpu.clone())
        .gzip(true)
        .start()
        .unwrap();
    for _ in 0..10 {
        workload(&gpu);
        prof.step();
    }
    let out = prof.stop();
    assert_eq!(out.len(), 1);
    let path = out[0].path.clone().unwrap();
    assert!(path.to_string_lossy().ends_with(".pt.trace.json.gz"));
    let t = load(&path);
    assert_eq!(
        step_names(&t),
        vec!["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    );
    assert_eq!(x_events(&t, "kernel").count(), 6);
}

#[test]
fn time_window_records_a_span_of_wall_time() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .time_window(
            std::time::Duration::from_millis(30),
            std::time::Duration::from_millis(60),
        )
        .output_dir(dir.path())
        .source(gpu.clone())
        .start()
        .unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_millis(250) {
        workload(&gpu);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let out = prof.stop();
    assert_eq!(out.len(), 1, "{out:?}");
    let t = load(out[0].path.as_ref().unwrap());
    let kernels: Vec<f64> = x_events(&t, "kernel")
        .map(|e| e["ts"].as_f64().unwrap())
        .collect();
    assert!(!kernels.is_empty());
    // Everything recorded lies inside a window of about 60 ms (scheduling slack aside).
    let span_us = kernels.iter().cloned().fold(f64::MIN, f64::max)
        - kernels.iter().cloned().fold(f64::MAX, f64::min);
    assert!(span_us < 120_000.0, "records span {span_us} us");
}

#[test]
fn every_gpu_record_links_to_its_launch_and_inherits_the_external_id() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .output_dir(dir.path())
        .source(gpu.clone())
        .start()
        .unwrap();
    // Without a schedule, step annotations start with the first step() call (ProfilerStep#1).
    prof.step();
    let outer_id;
    {
        let outer = record_function("outer");
        outer_id = outer.id().unwrap();
        gpu.launch_kernel("k_outer", 7, 1_000);
        {
            let _inner = record_function("inner");
            gpu.launch_kernel("k_inner", 9, 1_000);
            gpu.memcpy(
                kinetrace::activity::MemcpyKind::DtoH,
                kinetrace::activity::MemoryKind::Device,
                kinetrace::activity::MemoryKind::Pageable,
                4096,
                9,
                500,
            );
        }
        gpu.launch_kernel("k_outer2", 7, 1_000);
    }
    // Outside any span of its own, a launch links to the enclosing ProfilerStep (as in torch)...
    gpu.launch_kernel("k_in_step", 7, 1_000);
    // ...and on a thread with no open span at all it is unlinked.
    let g2 = gpu.clone();
    std::thread::spawn(move || g2.launch_kernel("k_unlinked", 7, 1_000))
        .join()
        .unwrap();
    let out = prof.stop();
    let t = load(out[0].path.as_ref().unwrap());
    let ev = events(&t);
    let by_name = |n: &str| {
        ev.iter()
            .find(|e| e["name"] == n && e["ph"] == "X")
            .unwrap()
            .clone()
    };
    let inner_id = by_name("inner")["args"]["External id"].as_u64().unwrap();
    assert_eq!(
        by_name("outer")["args"]["External id"].as_u64().unwrap(),
        outer_id
    );
    assert_eq!(
        by_name("k_outer")["args"]["External id"].as_u64(),
        Some(outer_id)
    );
    assert_eq!(
        by_name("k_outer2")["args"]["External id"].as_u64(),
        Some(outer_id)
    );
    assert_eq!(
        by_name("k_inner")["args"]["External id"].as_u64(),
        Some(inner_id)
    );
    assert_eq!(
        by_name("Memcpy DtoH (Device -> Pageable)")["args"]["External id"].as_u64(),
        Some(inner_id)
    );
    assert_eq!(
        by_name("k_in_step")["args"]["External id"],
        by_name("ProfilerStep#1")["args"]["External id"]
    );
    assert!(by_name("k_unlinked")["args"].get("External id").is_none());

    // ac2g: one `s` per launch at the runtime event, one `f` (bp=e) per GPU record, same id.
    let gpu_records: Vec<&serde_json::Value> = ev
        .iter()
        .filter(|e| {
            e["ph"] == "X"
                && matches!(
                    e["cat"].as_str(),
                    Some("kernel" | "gpu_memcpy" | "gpu_memset")
                )
        })
        .collect();
    assert_eq!(gpu_records.len(), 6);
    for g in gpu_records {
        let corr = &g["args"]["correlation"];
        let runtime = ev
            .iter()
            .find(|e| e["cat"] == "cuda_runtime" && e["args"]["correlation"] == *corr)
            .expect("runtime call with the same correlation");
        let s = ev
            .iter()
            .find(|e| e["ph"] == "s" && e["id"] == *corr)
            .expect("flow start");
        let f = ev
            .iter()
            .find(|e| e["ph"] == "f" && e["id"] == *corr)
            .expect("flow end");
        assert_eq!(
            (s["ts"].clone(), s["tid"].clone()),
            (runtime["ts"].clone(), runtime["tid"].clone())
        );
        assert_eq!(
            (f["ts"].clone(), f["tid"].clone(), f["bp"].clone()),
            (g["ts"].clone(), g["tid"].clone(), "e".into())
        );
        assert_eq!(s["cat"], "ac2g");
    }
    // CPU-side events never carry a non-negative stream (HTA would count them as GPU work).
    for e in ev.iter().filter(|e| {
        matches!(
            e["cat"].as_str(),
            Some("cpu_op" | "user_annotation" | "cuda_runtime")
        )
    }) {
        assert!(e["args"].get("stream").is_none(), "{e}");
    }
}

#[test]
fn full_rings_drop_and_count_and_the_trace_says_so() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (lines, log) = logged();
    let prof = Profiler::builder()
        .output_dir(dir.path())
        .ring_capacity(64)
        .log(log)
        .start()
        .unwrap();
    // A fresh thread gets a ring of the configured size; 10,000 spans between drains overflow it.
    std::thread::spawn(|| {
        for _ in 0..10_000 {
            let _s = record_function("tiny");
        }
    })
    .join()
    .unwrap();
    let out = prof.stop();
    let t = load(out[0].path.as_ref().unwrap());
    let dropped = t["dropped_events"]["cpu_ring"].as_u64().unwrap();
    let kept = x_events(&t, "user_annotation")
        .filter(|e| e["name"] == "tiny")
        .count() as u64;
    assert!(dropped > 0, "nothing dropped");
    assert_eq!(dropped + kept, 10_000);
    let lines = lines.lock().unwrap();
    assert_eq!(
        lines.iter().filter(|l| l.contains("dropped")).count(),
        1,
        "{lines:?}"
    );
}

#[test]
fn an_unwritable_output_dir_is_one_message_and_the_job_goes_on() {
    let _g = serial();
    let file = tempfile::NamedTempFile::new().unwrap();
    // A directory below a regular file cannot be created.
    let bad = file.path().join("traces");
    let (lines, log) = logged();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .output_dir(&bad)
        .source(gpu.clone())
        .log(log)
        .start()
        .unwrap();
    workload(&gpu);
    prof.step();
    assert!(prof.stop().is_empty());
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("cannot open the trace output") && lines[0].contains("traces"),
        "{lines:?}"
    );
}

#[test]
fn a_failing_source_is_reported_and_cpu_recording_continues() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (lines, log) = logged();
    let gpu = SimulatedGpu::new(0);
    gpu.fail_enable("no CUDA driver (libcuda.so.1 not found)");
    let prof = Profiler::builder()
        .output_dir(dir.path())
        .source(gpu.clone())
        .log(log)
        .start()
        .unwrap();
    workload(&gpu);
    let out = prof.stop();
    let t = load(out[0].path.as_ref().unwrap());
    assert_eq!(x_events(&t, "kernel").count(), 0);
    assert_eq!(
        x_events(&t, "user_annotation")
            .filter(|e| e["name"] == "forward")
            .count(),
        1
    );
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].contains("simulated_gpu: no CUDA driver"),
        "{lines:?}"
    );
}

#[test]
fn one_profiler_at_a_time_and_bad_config_names_the_key() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = Profiler::builder().output_dir(dir.path()).start().unwrap();
    let second = Profiler::builder().output_dir(dir.path()).start();
    assert!(matches!(second, Err(kinetrace::Error::Session(_))));
    drop(p);
    let e = Profiler::builder()
        .step_range(5, 2)
        .start()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("end"), "{e}");
    let e = Profiler::builder()
        .schedule(Schedule {
            skip_first: 0,
            skip_first_wait: false,
            wait: 1,
            warmup: 1,
            active: 0,
            repeat: 0,
        })
        .start()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("active"), "{e}");
    let e = Profiler::builder()
        .time_window(std::time::Duration::ZERO, std::time::Duration::ZERO)
        .start()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("duration"), "{e}");
    // A new profiler can start once the first is gone.
    Profiler::builder()
        .output_dir(dir.path())
        .start()
        .unwrap()
        .stop();
}

#[test]
fn a_panicking_callback_does_not_reach_the_caller() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (lines, log) = logged();
    let prof = Profiler::builder()
        .output_dir(dir.path())
        .on_trace_ready(|_| panic!("user bug"))
        .log(log)
        .start()
        .unwrap();
    let out = prof.stop();
    assert_eq!(out.len(), 1);
    assert!(lines.lock().unwrap().iter().any(|l| l.contains("panicked")));
}

#[test]
fn dropping_the_profiler_writes_the_trace() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    {
        let _prof = Profiler::builder()
            .output_dir(dir.path())
            .source(gpu.clone())
            .start()
            .unwrap();
        workload(&gpu);
    }
    let files = trace_files(dir.path());
    assert_eq!(files.len(), 1);
    let t = load(&files[0]);
    assert_eq!(x_events(&t, "kernel").count(), 2);
    // Only the trace is left: no spool or temporary file.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn recording_threads_get_named_rows() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let prof = Profiler::builder().output_dir(dir.path()).start().unwrap();
    let tid = std::thread::Builder::new()
        .name("data-loader-3".into())
        .spawn(|| {
            let _s = record_function("load");
            kinetrace_core::recorder::current_tid()
        })
        .unwrap()
        .join()
        .unwrap();
    let out = prof.stop();
    let t = load(out[0].path.as_ref().unwrap());
    let want = format!("thread {tid} (data-loader-3)");
    assert!(
        events(&t).iter().any(|e| e["ph"] == "M"
            && e["name"] == "thread_name"
            && e["args"]["name"] == want.as_str()),
        "no thread_name row {want:?}"
    );
}

/// What the injected runtime uses, as a library user gets it: an on-demand profiler that counts
/// steps from the program's own first step, captures when asked (into sinks of the request's
/// choosing), reports its status, steps aside for another profiler and closes without joining.
#[test]
fn on_demand_captures_start_where_the_program_is_and_stop_after_a_step_aside() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .on_demand()
        .first_step(10)
        .output_dir(dir.path())
        .source(gpu.clone())
        .start()
        .unwrap();
    assert_eq!(prof.step_num(), 10);
    workload(&gpu);
    prof.step();
    assert!(
        trace_files(dir.path()).is_empty(),
        "on demand records nothing by itself"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let mut request = kinetrace::CaptureRequest::new(
        kinetrace::CaptureStart::NextStep,
        kinetrace::CaptureLength::Steps(2),
    );
    request.on_done = Some(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    let plan = prof.request_capture(request).unwrap();
    assert_eq!(
        plan,
        kinetrace::CapturePlan::Steps {
            first: 12,
            last: 13
        }
    );
    assert_eq!(prof.status().capture, Some(plan));
    for _ in 0..4 {
        workload(&gpu);
        prof.step();
    }
    let written = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the capture ends within the deadline")
        .expect("the capture wrote a trace");
    let t = load(written.path.as_ref().unwrap());
    assert_eq!(step_names(&t), vec!["ProfilerStep#12", "ProfilerStep#13"]);
    prof.step_aside("another profiler took over");
    let again = kinetrace::CaptureRequest::new(
        kinetrace::CaptureStart::NextStep,
        kinetrace::CaptureLength::Steps(1),
    );
    assert!(matches!(
        prof.request_capture(again),
        Err(kinetrace::CaptureRefused::SteppedAside(_))
    ));
    assert_eq!(
        prof.status().stepped_aside.as_deref(),
        Some("another profiler took over")
    );
    assert_eq!(prof.close().len(), 1);
    assert_eq!(prof.stop().len(), 1);
}

#[test]
fn a_perfetto_twin_is_written_beside_each_trace() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(0);
    let prof = Profiler::builder()
        .step_range(1, 2)
        .output_dir(dir.path())
        .source(gpu.clone())
        .perfetto(true)
        .start()
        .unwrap();
    for _ in 0..4 {
        workload(&gpu);
        prof.step();
    }
    let written = prof.stop();
    assert_eq!(written.len(), 1);
    let json = written[0].path.clone().unwrap();
    let name = json.file_name().unwrap().to_string_lossy().into_owned();
    let twin = json.with_file_name(name.replace(".pt.trace.json", ".pt.trace.pftrace"));
    let bytes = std::fs::read(&twin).unwrap_or_else(|e| panic!("{}: {e}", twin.display()));
    // A Trace: packets (field 1, length-delimited), holding the steps' names.
    assert_eq!(bytes[0], 0x0a);
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("ProfilerStep#1") && text.contains("ProfilerStep#2"));
    assert!(!text.contains("ProfilerStep#3"));
}
