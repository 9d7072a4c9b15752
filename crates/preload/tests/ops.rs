//! The entry points of kinetrace's compiled PyTorch recorder (`kinetrace_op_begin` /
//! `kinetrace_op_end`), driven by `examples/op_app.rs` the way the recorder's RecordFunction
//! callbacks call them (the real recorder under real torch: tests/preload/test_torch_record.py).

mod common;

use common::*;
use serde_json::Value;

fn op_app() -> std::path::PathBuf {
    let p = profile_dir().join("examples/op_app");
    assert!(p.exists(), "{} not built", p.display());
    p
}

#[test]
fn recorded_ops_have_their_names_categories_and_args() {
    let w = World::new();
    let mut c = w.preloaded(op_app(), &["6"]);
    c.env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "2");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "op_app: done 6 steps\n");
    let traces = w.traces();
    assert_eq!(traces.len(), 1, "log:\n{}", w.log_text());
    let t = Trace::load(&traces[0]);
    assert_eq!(t.steps(), vec![2, 3, 4]);
    let xs: Vec<&Value> = t
        .events()
        .iter()
        .filter(|e| e["ph"] == "X" && (e["cat"] == "cpu_op" || e["cat"] == "user_annotation"))
        .filter(|e| !e["name"].as_str().unwrap().starts_with("ProfilerStep#"))
        .collect();
    let count = |name: &str, cat: &str| {
        xs.iter()
            .filter(|e| e["name"] == name && e["cat"] == cat)
            .count()
    };
    // Two names written one after the other at the same address stay two names.
    for name in [
        "aten::linear",
        "aten::addmm",
        "AddmmBackward0",
        "ReluBackward0",
        "aten::mul",
        "aten::add",
    ] {
        assert_eq!(count(name, "cpu_op"), 3, "{name}: {xs:#?}");
    }
    // The annotation flag (a record_function scope) makes a user_annotation.
    assert_eq!(count("my_block", "user_annotation"), 3);
    for name in ["AddmmBackward0", "ReluBackward0"] {
        let eval = format!("autograd::engine::evaluate_function: {name}");
        assert_eq!(count(&eval, "cpu_op"), 3, "{eval}");
    }
    assert_eq!(xs.len(), 27, "{xs:#?}");
    // Sequence numbers (non-negative only) and shapes pass through.
    let addmm: Vec<u64> = xs
        .iter()
        .filter(|e| e["name"] == "aten::addmm")
        .map(|e| e["args"]["Sequence number"].as_u64().unwrap())
        .collect();
    // The loop's iteration s runs in step s + 1 (its kinetrace_step() ends step s).
    assert_eq!(addmm, vec![1, 2, 3]);
    assert!(xs
        .iter()
        .filter(|e| e["name"] == "aten::linear")
        .all(|e| e["args"].get("Sequence number").is_none()));
    // The args text, whole, as the recorder handed it over.
    for e in xs.iter().filter(|e| e["name"] == "aten::add") {
        let args = &e["args"];
        assert_eq!(args["Input Dims"], serde_json::json!([[1], [1], []]), "{e}");
        assert_eq!(
            args["Input type"],
            serde_json::json!(["float", "float", "Scalar"]),
            "{e}"
        );
        assert_eq!(
            args["Input Strides"],
            serde_json::json!([[1], [1], []]),
            "{e}"
        );
        assert_eq!(
            args["Concrete Inputs"],
            serde_json::json!(["", "", "1"]),
            "{e}"
        );
    }
    // autograd's evaluate_function ranges take the sequence number of the backward function they
    // run, as torch.profiler gives them.
    let evals: Vec<u64> = xs
        .iter()
        .filter(|e| e["name"] == "autograd::engine::evaluate_function: ReluBackward0")
        .map(|e| e["args"]["Sequence number"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, vec![1, 2, 3]);
    // aten::addmm nests in aten::linear; the op that ended out of order still ended.
    let span = |e: &Value| {
        let ts = e["ts"].as_f64().unwrap();
        (ts, ts + e["dur"].as_f64().unwrap())
    };
    let linear: Vec<_> = xs
        .iter()
        .filter(|e| e["name"] == "aten::linear")
        .map(|e| span(e))
        .collect();
    for e in xs.iter().filter(|e| e["name"] == "aten::addmm") {
        let (a, b) = span(e);
        assert!(linear.iter().any(|&(la, lb)| la <= a && b <= lb), "{e}");
    }
    // Forward ops link to backward functions with their sequence number.
    let flows = t
        .events()
        .iter()
        .filter(|e| e["cat"] == "fwdbwd" && e["ph"] == "s")
        .count();
    assert_eq!(flows, 6, "AddmmBackward0 and ReluBackward0 of each step");
}

/// With `with_stack` / `profile_memory` on: Python frames become `python_function` ranges with
/// their parent and `CallFrom`, a frame left open across a step boundary ends at it (and does not
/// hold the boundary back), and allocator events become `[memory]` events with their totals.
#[test]
fn python_frames_and_allocator_events_reach_the_trace() {
    let w = World::new();
    let mut c = w.preloaded(op_app(), &["6"]);
    c.env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "2")
        .env("KINETRACE_WITH_STACK", "1")
        .env("KINETRACE_PROFILE_MEMORY", "1");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let traces = w.traces();
    assert_eq!(traces.len(), 1, "log:\n{}", w.log_text());
    let t = Trace::load(&traces[0]);
    assert_eq!(t.steps(), vec![2, 3, 4]);
    let span = |e: &Value| {
        let ts = e["ts"].as_f64().unwrap();
        (ts, ts + e["dur"].as_f64().unwrap())
    };
    let steps: Vec<(f64, f64)> = t
        .events()
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("ProfilerStep#"))
        })
        .map(span)
        .collect();
    let frames: Vec<&Value> = t
        .events()
        .iter()
        .filter(|e| e["cat"] == "python_function")
        .collect();
    let named =
        |n: &str| -> Vec<&Value> { frames.iter().copied().filter(|e| e["name"] == n).collect() };
    let (train, forward) = (named("train.py(10): train"), named("model.py(5): forward"));
    assert_eq!((train.len(), forward.len()), (3, 3), "{frames:#?}");
    for e in &frames {
        assert_eq!(e["args"]["CallFrom"], "train.py:12", "{e}");
        assert!(e["args"].get("External id").is_none(), "{e}");
        // Each lies within one step: the boundary ended the frame left open across it.
        let (a, b) = span(e);
        assert!(
            steps
                .iter()
                .any(|&(sa, sb)| sa - 0.002 <= a && b <= sb + 0.002),
            "{e} crosses a step boundary: {steps:?}"
        );
    }
    for f in &forward {
        let (a, b) = span(f);
        let parent = train
            .iter()
            .find(|t| {
                let (ta, tb) = span(t);
                ta <= a && b <= tb
            })
            .expect("forward nests in train");
        assert_eq!(f["args"]["Python parent id"], parent["args"]["Python id"]);
    }
    assert!(train
        .iter()
        .all(|e| e["args"].get("Python parent id").is_none()));
    // Frames do not become the ops' External id: aten::linear keeps its own.
    let memory: Vec<&Value> = t
        .events()
        .iter()
        .filter(|e| e["name"] == "[memory]")
        .collect();
    assert_eq!(memory.len(), 6, "{memory:#?}");
    let bytes: Vec<i64> = memory
        .iter()
        .map(|e| e["args"]["Bytes"].as_i64().unwrap())
        .collect();
    assert_eq!(bytes, [4096, -4096, 4096, -4096, 4096, -4096]);
    let totals: Vec<u64> = memory
        .iter()
        .map(|e| e["args"]["Total Allocated"].as_u64().unwrap())
        .collect();
    // Iterations 1, 2, 3 run in steps 2, 3, 4.
    assert_eq!(totals, [12288, 8192, 16384, 12288, 20480, 16384]);
    for e in &memory {
        assert_eq!(e["args"]["Device Type"], 0, "{e}");
        assert_eq!(e["args"]["Device Id"], -1, "{e}");
        assert_eq!(e["args"]["Addr"], 0x5000, "{e}");
    }
    let head = &t.json;
    assert_eq!(
        (head["with_stack"].as_u64(), head["profile_memory"].as_u64()),
        (Some(1), Some(1))
    );
}

#[test]
fn without_the_switches_no_memory_events_are_kept() {
    let w = World::new();
    let mut c = w.preloaded(op_app(), &["6"]);
    c.env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "2");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let traces = w.traces();
    assert_eq!(traces.len(), 1, "log:\n{}", w.log_text());
    let t = Trace::load(&traces[0]);
    assert!(!t.events().iter().any(|e| e["name"] == "[memory]"));
    assert!(t.json.get("profile_memory").is_none());
}

#[test]
fn outside_a_window_nothing_is_recorded() {
    // No window opens (iterations far ahead): the calls are paired and dropped, nothing is written.
    let w = World::new();
    let mut c = w.preloaded(op_app(), &["4"]);
    c.env("KINETRACE_ITERATIONS", "3")
        .env("KINETRACE_START_ITERATION", "100");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "op_app: done 4 steps\n");
    assert!(w.traces().is_empty(), "log:\n{}", w.log_text());
}
