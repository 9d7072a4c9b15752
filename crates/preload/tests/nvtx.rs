//! NVTX ranges as step boundaries (`KINETRACE_STEP_NVTX`): the shim is an NVTX injection library.
//! `examples/nvtx_app.rs` plays an NVTX v3 instance (the loader side of the protocol the NVTX
//! headers compile into programs) and pushes one step range per iteration.

mod common;

use common::*;

fn nvtx_app() -> std::path::PathBuf {
    let p = profile_dir().join("examples/nvtx_app");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// `nvtx_app 8 ARGS` preloaded with the shim, `KINETRACE_STEP_NVTX=pattern`, iterations 2..=4.
fn run_app(w: &World, pattern: Option<&str>, args: &[&str]) -> std::process::Output {
    let app = nvtx_app();
    let mut all = vec!["8"];
    all.extend_from_slice(args);
    let mut c = w.preloaded(&app, &all);
    c.env_remove("NVTX_INJECTION64_PATH")
        .env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "2");
    if let Some(p) = pattern {
        c.env("KINETRACE_STEP_NVTX", p);
    }
    run(c)
}

#[test]
fn matching_nvtx_ranges_mark_steps_in_every_message_form() {
    for kind in ["a", "w", "ex", "ex-w", "registered", "domain", "start"] {
        let w = World::new();
        let o = run_app(
            &w,
            Some("train_step*"),
            &["--kind", kind, "--name", "train_step_x"],
        );
        assert_eq!(o.status.code(), Some(0), "{kind}: {}", text(&o.stderr));
        assert_eq!(
            text(&o.stdout),
            "nvtx_app: tool attached to 1 instance(s)\nnvtx_app: done 8 steps\n",
            "{kind}"
        );
        assert_eq!(text(&o.stderr), "", "{kind}");
        let traces = w.traces();
        assert_eq!(traces.len(), 1, "{kind}: log:\n{}", w.log_text());
        // The k-th matching range (0-based) begins ProfilerStep#k.
        assert_eq!(Trace::load(&traces[0]).steps(), vec![2, 3, 4], "{kind}");
        let log = w.log_text();
        assert!(
            log.contains("no CUDA driver in this process"),
            "{kind}: {log}"
        );
    }
}

#[test]
fn ranges_from_several_nvtx_instances_all_count() {
    let w = World::new();
    let o = run_app(&w, Some("train_step"), &["--instances", "2"]);
    assert_eq!(
        text(&o.stdout),
        "nvtx_app: tool attached to 2 instance(s)\nnvtx_app: done 8 steps\n"
    );
    let traces = w.traces();
    assert_eq!(traces.len(), 1, "log:\n{}", w.log_text());
    assert_eq!(Trace::load(&traces[0]).steps(), vec![2, 3, 4]);
}

#[test]
fn without_a_match_or_the_key_nothing_is_profiled() {
    // A pattern matching no range: attached, but no step, so the process stays dormant.
    let w = World::new();
    let o = run_app(&w, Some("train_step"), &["--name", "train_step_1"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o.stdout).starts_with("nvtx_app: tool attached to 1 instance(s)\n"),
        "{}",
        text(&o.stdout)
    );
    assert!(w.traces().is_empty());
    assert!(!w.out.exists(), "dormant: writes nothing");
    assert_eq!(w.log_text(), "");

    // No KINETRACE_STEP_NVTX: the shim does not claim NVTX at all.
    let w = World::new();
    let o = run_app(&w, None, &[]);
    assert_eq!(
        text(&o.stdout),
        "nvtx_app: tool attached to 0 instance(s)\nnvtx_app: done 8 steps\n"
    );
    assert!(!w.out.exists());

    // Another tool already holds NVTX_INJECTION64_PATH: left alone (the app loads that one).
    let w = World::new();
    let mut c = w.preloaded(nvtx_app(), &["8"]);
    c.env("KINETRACE_STEP_NVTX", "train_step")
        .env("NVTX_INJECTION64_PATH", "/nonexistent/libother-tool.so");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("nvtx_app: cannot load the injection library"),
        "{}",
        text(&o.stderr)
    );
    assert!(!w.out.exists());
}

#[test]
fn a_malformed_config_is_reported_once_when_nvtx_attaches() {
    let w = World::new();
    let mut c = w.preloaded(nvtx_app(), &["8"]);
    c.env("KINETRACE_STEP_NVTX", "train_step")
        .env("KINETRACE_ITERATIONS", "three");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        text(&o.stdout),
        "nvtx_app: tool attached to 0 instance(s)\nnvtx_app: done 8 steps\n"
    );
    let log = w.log_text();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(
        log.contains("KINETRACE_ITERATIONS: `three` is not an integer"),
        "{log}"
    );
    assert!(!w.out.exists());
}

/// PyTorch's NVTX profiler state as the shim sees it (what the `sitecustomize` turns on inside
/// windows): each pushed range becomes a span, PyTorch's messages are taken apart (name, sequence
/// number, input shapes), kernels link to the innermost op that launched them, forward ops link to
/// their backward functions, and the step boundary reported inside `Optimizer.step` (where the
/// optimizer hook runs) moves to that range's end, so every range nests in its step.
#[test]
fn pytorch_op_ranges_become_linked_cpu_ops_inside_windows() {
    let w = World::new();
    let mut c = w.preloaded(nvtx_app(), &["8", "--torch-ops", "--cuda"]);
    c.env("NVTX_INJECTION64_PATH", &w.shim)
        .env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "2");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "nvtx_app: tool attached to 1 instance(s)\nnvtx_app: done 8 steps\n"
    );
    let traces = w.traces();
    assert_eq!(traces.len(), 1, "log:\n{}", w.log_text());
    let t = Trace::load(&traces[0]);
    assert_eq!(t.steps(), vec![2, 3, 4]);
    let ev = t.events();
    let x = |name: &str| -> Vec<&serde_json::Value> {
        ev.iter()
            .filter(|e| e["ph"] == "X" && e["name"] == name)
            .collect()
    };
    let cat_of = |name: &str| x(name)[0]["cat"].as_str().unwrap().to_string();
    for op in ["aten::linear", "aten::addmm", "AddmmBackward0"] {
        assert_eq!(x(op).len(), 3, "{op}: one per recorded step");
        assert_eq!(cat_of(op), "cpu_op", "{op}");
    }
    assert_eq!(
        cat_of("autograd::engine::evaluate_function: AddmmBackward0"),
        "cpu_op"
    );
    assert_eq!(cat_of("Optimizer.step#SGD.step"), "user_annotation");
    // Name, sequence number and shapes, taken apart.
    let addmm = x("aten::addmm");
    assert_eq!(
        addmm[0]["args"]["Input Dims"],
        serde_json::json!([[16], [4, 8], [8, 16], [], []])
    );
    let seqs: Vec<u64> = addmm
        .iter()
        .map(|e| e["args"]["Sequence number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![20, 30, 40]);
    // Each kernel links (External id) to the op that launched it, in its own step.
    let id_of = |e: &serde_json::Value| e["args"]["External id"].as_u64().unwrap();
    for (kernel_prefix, op) in [("addmm", "aten::addmm"), ("mm", "AddmmBackward0")] {
        for (step, op_event) in (2..=4).zip(x(op)) {
            let kernel = &x(&format!("step{step}_{kernel_prefix}"))[0];
            assert_eq!(kernel["cat"], "kernel");
            assert_eq!(id_of(kernel), id_of(op_event), "step{step}_{kernel_prefix}");
        }
    }
    // Forward op -> backward function, one flow pair per recorded step.
    let flow = |ph: &str| -> Vec<f64> {
        ev.iter()
            .filter(|e| e["cat"] == "fwdbwd" && e["ph"] == ph)
            .map(|e| e["ts"].as_f64().unwrap())
            .collect()
    };
    let ts = |v: Vec<&serde_json::Value>| -> Vec<f64> {
        v.iter().map(|e| e["ts"].as_f64().unwrap()).collect()
    };
    assert_eq!(flow("s"), ts(addmm.clone()), "s at the forward op");
    assert_eq!(
        flow("f"),
        ts(x("AddmmBackward0")),
        "f at the backward function"
    );
    // Every range nests in its step: the boundary waited for Optimizer.step to end.
    let end = |e: &serde_json::Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
    for (step, opt) in (2..=4).zip(x("Optimizer.step#SGD.step")) {
        let s = &x(&format!("ProfilerStep#{step}"))[0];
        let start = s["ts"].as_f64().unwrap();
        assert!(
            start <= opt["ts"].as_f64().unwrap() && end(opt) <= end(s) + 0.001,
            "Optimizer.step of step {step} lies inside ProfilerStep#{step}: {opt} vs {s}"
        );
    }
}

/// Outside windows nothing is recorded, and without the key (`KINETRACE_TORCH_OPS=0`) the ranges are
/// left alone entirely (steps only).
#[test]
fn pytorch_op_ranges_are_left_alone_when_turned_off() {
    let w = World::new();
    let mut c = w.preloaded(nvtx_app(), &["8", "--torch-ops", "--cuda"]);
    c.env("NVTX_INJECTION64_PATH", &w.shim)
        .env("KINETRACE_TORCH_OPS", "0")
        .env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "2");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "nvtx_app: tool attached to 0 instance(s)\nnvtx_app: done 8 steps\n"
    );
    let t = Trace::load(&w.traces()[0]);
    assert_eq!(t.steps(), vec![2, 3, 4]);
    assert_eq!(t.kernels(), 6, "the kernels of steps 2..4");
    assert!(t
        .events()
        .iter()
        .all(|e| e["cat"] != "cpu_op" && e["cat"] != "fwdbwd"));
}
