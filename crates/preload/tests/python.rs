//! The Python side: `kinetrace.step()` and the optimizer hook `sitecustomize` installs, against a
//! stand-in `torch.optim` (the real torch is not needed to check the mechanism: it calls the same
//! `register_optimizer_step_post_hook` API with the same hook signature).

mod common;

use common::*;

/// A minimal `torch` package: `torch.optim.Optimizer.step()` runs the global post-hooks the way
/// torch/optim/optimizer.py does.
fn fake_torch(w: &World) -> std::path::PathBuf {
    let root = w.tmp.path().join("site");
    let optim = root.join("torch/optim");
    std::fs::create_dir_all(&optim).unwrap();
    std::fs::write(root.join("torch/__init__.py"), "").unwrap();
    std::fs::write(
        optim.join("__init__.py"),
        "from .optimizer import Optimizer\n",
    )
    .unwrap();
    std::fs::write(
        optim.join("optimizer.py"),
        "_global_optimizer_post_hooks = {}\n\
         def register_optimizer_step_post_hook(hook):\n\
         \x20   _global_optimizer_post_hooks[len(_global_optimizer_post_hooks)] = hook\n\
         class Optimizer:\n\
         \x20   def step(self):\n\
         \x20       for hook in list(_global_optimizer_post_hooks.values()):\n\
         \x20           hook(self, (), {})\n",
    )
    .unwrap();
    root
}

fn python(w: &World, script: &str, pythonpath: &str) -> std::process::Command {
    let mut c = w.preloaded("python3", &["-c", script]);
    c.env("PYTHONPATH", pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    c
}

#[test]
fn the_optimizer_hook_counts_iterations_without_code_changes() {
    let w = World::new();
    let site = fake_torch(&w);
    // The job's own sitecustomize must still run.
    let other = w.tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(
        other.join("sitecustomize.py"),
        "print('other sitecustomize ran')\n",
    )
    .unwrap();
    let pythonpath = format!(
        "{}:{}:{}",
        repo().join("python").display(),
        other.display(),
        site.display()
    );
    let script = "import torch.optim as optim\nopt = optim.Optimizer()\nfor _ in range(6):\n    opt.step()\nprint('trained')";
    let mut c = python(&w, script, &pythonpath);
    c.env("KINETRACE_ITERATIONS", "2")
        .env("KINETRACE_START_ITERATION", "2");
    let o = run(c);
    assert_eq!(text(&o.stdout), "other sitecustomize ran\ntrained\n");
    assert_eq!(text(&o.stderr), "");
    assert_eq!(o.status.code(), Some(0));
    let traces = w.traces();
    assert_eq!(traces.len(), 1, "log:\n{}", w.log_text());
    let t = Trace::load(&traces[0]);
    assert_eq!(
        t.steps(),
        vec![2, 3],
        "a CPU-only trace of iterations 2 and 3"
    );
    // The no-driver path: one line saying so, and (this stand-in torch has no profiler to turn
    // on) one line saying the ops are not recorded; nothing else.
    let log = w.log_text();
    assert_eq!(log.lines().count(), 2, "{log}");
    assert!(
        log.contains("no CUDA driver in this process: profiling CPU activity only"),
        "{log}"
    );
    assert!(
        log.contains("python: cannot record PyTorch ops (AttributeError: module 'torch' has no attribute 'autograd'); traces hold GPU activity and steps only"),
        "{log}"
    );

    // KINETRACE_OPTIMIZER_HOOK=0: no hook, no steps, no profiling at all (no CUDA either).
    let w = World::new();
    let site = fake_torch(&w);
    let pythonpath = format!("{}:{}", repo().join("python").display(), site.display());
    let mut c = python(&w, script, &pythonpath);
    c.env("KINETRACE_ITERATIONS", "2")
        .env("KINETRACE_OPTIMIZER_HOOK", "0");
    let o = run(c);
    assert_eq!(text(&o.stdout), "trained\n");
    assert!(!w.out.exists());
}

#[test]
fn explicit_steps_from_python() {
    let w = World::new();
    let pythonpath = repo().join("python").display().to_string();
    let script = "import kinetrace\nassert not kinetrace.is_active()\nfor _ in range(5):\n    kinetrace.step()\nprint(kinetrace.is_active())";
    let mut c = python(&w, script, &pythonpath);
    c.env("KINETRACE_STEPS", "1-3");
    let o = run(c);
    assert_eq!(text(&o.stdout), "True\n", "{}", text(&o.stderr));
    let traces = w.traces();
    assert_eq!(traces.len(), 1);
    assert_eq!(Trace::load(&traces[0]).steps(), vec![1, 2, 3]);

    // Without the shim the module is a no-op.
    let w = World::new();
    let mut c = w.command("python3", &["-c", script]);
    c.env("PYTHONPATH", &pythonpath);
    let o = run(c);
    assert_eq!(text(&o.stdout), "False\n");
    assert!(!w.out.exists());
}

#[test]
fn sitecustomize_alone_costs_no_torch_import() {
    let w = World::new();
    let pythonpath = repo().join("python").display().to_string();
    let mut c = python(
        &w,
        "import sys; print('torch' in sys.modules, 'kinetrace' in sys.modules)",
        &pythonpath,
    );
    c.env("KINETRACE_WHOLE_RUN", "1");
    let o = run(c);
    assert_eq!(text(&o.stdout), "False False\n");
    assert!(!w.out.exists(), "no step, no CUDA: dormant");
}
