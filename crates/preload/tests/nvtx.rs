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
