//! A job ended by SIGINT (Ctrl-C), SIGTERM or SIGHUP keeps the trace of what was recorded, and ends
//! as it would have without kinetrace: by the same signal, or through its own handler. Driven on a
//! Rust stand-in (`examples/fake_train.rs`), a C++ stand-in compiled here with `c++` (the compiler
//! the test suite needs anyway, README), and Python without torch (the real-PyTorch case is in
//! tests/preload/test_torch_first_hour.py).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn kill(pid: u32, signal: i32) {
    // SAFETY: (test) signalling a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill {pid}");
}

/// The stand-in job recording the whole run, stepping every 5 ms, printing each step.
fn endless_train(w: &World, extra: &[&str], env: &[(&str, &str)]) -> Job {
    let mut args = vec!["100000", "--cuda", "--sleep-ms", "5", "--progress"];
    args.extend_from_slice(extra);
    let mut c = w.preloaded(fake_train(), &args);
    c.env("KINETRACE_WHOLE_RUN", "1");
    c.envs(env.iter().copied());
    Job::spawn(c).show(&w.log)
}

fn wait_for_step(job: &mut Job, prefix: &str, step: u64) {
    let line = format!("{prefix}: step {step}\n");
    job.wait_until(&line.clone(), |j| j.stdout_so_far().contains(&line));
}

/// The last `PREFIX: step N` line a job printed.
fn last_step(out: &str, prefix: &str) -> u64 {
    out.lines()
        .filter_map(|l| {
            l.strip_prefix(prefix)?
                .strip_prefix(": step ")?
                .parse()
                .ok()
        })
        .next_back()
        .unwrap_or_else(|| panic!("no step line in {out:?}"))
}

/// One trace whose steps run without a gap up to at least `last` (the step the job was in when the
/// signal came), and nothing unfinished beside it.
fn assert_saved(w: &World, what: &str, last: u64) -> Trace {
    let traces = w.traces();
    assert_eq!(
        traces.len(),
        1,
        "{what}: expected one trace, got {traces:?}; leftovers {:?}; log:\n{}",
        w.leftovers(),
        w.log_text()
    );
    let t = Trace::load(&traces[0]);
    let steps = t.steps();
    assert!(
        !steps.is_empty()
            && steps.windows(2).all(|p| p[1] == p[0] + 1)
            && *steps.last().unwrap() >= last,
        "{what}: steps {steps:?}, want consecutive steps up to {last} at least"
    );
    assert!(w.leftovers().is_empty(), "{what}: {:?}", w.leftovers());
    t
}

#[test]
fn a_rust_job_ended_by_sigint_sigterm_or_sighup_keeps_its_trace_and_dies_of_the_signal() {
    for (signal, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let w = World::new();
        let mut job = endless_train(&w, &[], &[]);
        wait_for_step(&mut job, "fake_train", 3);
        kill(job.id(), signal);
        let o = job.wait();
        let out = text(&o.stdout);
        assert_eq!(o.status.signal(), Some(signal), "{name}: {:?}", o.status);
        assert_eq!(text(&o.stderr), "", "{name}");
        let last = last_step(&out, "fake_train");
        let t = assert_saved(&w, name, last);
        // Kernels are named by the loop's index: every step the job printed has its kernels.
        let kernels = t.kernel_steps();
        assert_eq!(
            &kernels[..=last as usize],
            &(0..=last).collect::<Vec<_>>()[..],
            "{name}"
        );
        assert_eq!(w.log_text(), "", "{name}: nothing to report");
    }
}

#[test]
fn a_job_with_its_own_sigint_handler_keeps_its_behaviour_and_its_trace() {
    let w = World::new();
    let mut job = endless_train(&w, &["--on-sigint-exit", "7"], &[]);
    wait_for_step(&mut job, "fake_train", 3);
    kill(job.id(), libc::SIGINT);
    let o = job.wait();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(7), "the job's handler decided");
    assert!(out.ends_with("fake_train: interrupted\n"), "{out}");
    assert_saved(&w, "own handler", last_step(&out, "fake_train"));
}

/// A child forked from a profiling job (a DataLoader worker) and ended by SIGTERM dies of it at
/// once, and the parent's capture goes on: the child's copy of the handler must not reach the
/// parent's signal thread through the pipe they share.
#[test]
fn a_forked_child_ended_by_a_signal_dies_of_it_and_the_parent_records_on() {
    let w = World::new();
    let mut c = w.preloaded(
        fake_train(),
        &[
            "6",
            "--cuda",
            "--sleep-ms",
            "2000",
            "--fork-at",
            "1",
            "--progress",
        ],
    );
    c.env("KINETRACE_WHOLE_RUN", "1");
    let mut job = Job::spawn(c).show(&w.log);
    job.wait_until("the child", |j| j.stdout_so_far().contains(" started\n"));
    let out = job.stdout_so_far();
    let child: u32 = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("fake_train: child ")?
                .strip_suffix(" started")
        })
        .unwrap()
        .parse()
        .unwrap();
    kill(child, libc::SIGTERM);
    let o = job.wait();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    // waitpid's raw status: killed by signal 15, no core.
    assert!(out.contains("fake_train: child status 15\n"), "{out}");
    assert!(out.ends_with("fake_train: done 6 steps\n"), "{out}");
    let t = assert_saved(&w, "parent", 5);
    // Every step's kernels, the ones after the child's signal included.
    assert_eq!(t.kernel_steps(), vec![0, 1, 2, 3, 4, 5]);
}

/// A save that cannot finish in the exit budget: the job still dies of the signal soon after the
/// budget, and leaves no trace and no unfinished file, as the line says.
#[test]
fn a_signal_whose_save_passes_the_budget_ends_the_job_without_a_partial_trace() {
    let w = World::new();
    let mut job = endless_train(&w, &[], &[("_KINETRACE_TEST_EXIT_DELAY_MS", "30000")]);
    wait_for_step(&mut job, "fake_train", 2);
    let sent = Instant::now();
    kill(job.id(), libc::SIGTERM);
    let o = job.wait();
    let took = sent.elapsed();
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{:?}", o.status);
    // Not a speed check: the save was held back for 30 s, so an end well before that means the
    // budget cut it short.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let log = w.log_text();
    assert!(
        log.contains("gave up saving the capture in progress after 2 s on SIGTERM"),
        "{log}"
    );
    assert!(w.traces().is_empty(), "{:?}", w.traces());
    assert!(w.leftovers().is_empty(), "{:?}", w.leftovers());
}

/// The C++ stand-in: reports steps through `kinetrace_step` (found in the global scope, as the
/// Python module finds it), with a worker thread beside the loop. `sigwait` mode: after the first
/// step (profiling has started) it blocks SIGTERM in the main thread (the worker blocks it from its
/// start) and takes it in a thread of its own with `sigwait`, then exits with code 3, as servers
/// do.
const CPP_JOB: &str = r#"
#include <dlfcn.h>
#include <signal.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

static std::atomic<bool> stop{false};

int main(int argc, char** argv) {
    int steps = std::atoi(argv[1]);
    bool use_sigwait = argc > 2 && std::strcmp(argv[2], "sigwait") == 0;
    auto step = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "kinetrace_step"));
    std::thread worker([use_sigwait] {
        if (use_sigwait) {
            sigset_t set;
            sigemptyset(&set);
            sigaddset(&set, SIGTERM);
            pthread_sigmask(SIG_BLOCK, &set, nullptr);
        }
        volatile double x = 0;
        while (!stop.load()) { x = x + 1; std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
    });
    for (int i = 0; i < steps; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (step) step();
        if (use_sigwait && i == 0) {
            sigset_t set;
            sigemptyset(&set);
            sigaddset(&set, SIGTERM);
            pthread_sigmask(SIG_BLOCK, &set, nullptr);
            std::thread([set] {
                int sig = 0;
                sigwait(&set, &sig);
                std::printf("cpp_train: sigwait got %d\n", sig);
                std::fflush(stdout);
                std::exit(3);
            }).detach();
        }
        std::printf("cpp_train: step %d\n", i);
        std::fflush(stdout);
    }
    stop = true;
    worker.join();
    std::printf("cpp_train: done\n");
    return 0;
}
"#;

/// Compiles the C++ stand-in into `dir`.
fn cpp_job(dir: &Path) -> PathBuf {
    let src = dir.join("cpp_train.cpp");
    let exe = dir.join("cpp_train");
    std::fs::write(&src, CPP_JOB).unwrap();
    let mut c = Command::new("c++");
    c.args(["-std=c++17", "-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl");
    let o = run(c);
    assert!(
        o.status.success(),
        "compiling the C++ stand-in failed (the test suite needs `c++`, see README): {}",
        text(&o.stderr)
    );
    exe
}

fn cpp_run(w: &World, exe: &Path, mode: &str) -> Job {
    let mut c = w.preloaded(exe, &["100000", mode]);
    c.env("KINETRACE_WHOLE_RUN", "1");
    Job::spawn(c).show(&w.log)
}

#[test]
fn a_cpp_job_ended_by_sigint_or_sigterm_keeps_its_trace_and_dies_of_the_signal() {
    let build = tempfile::tempdir().unwrap();
    let exe = cpp_job(build.path());
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let w = World::new();
        let mut job = cpp_run(&w, &exe, "plain");
        wait_for_step(&mut job, "cpp_train", 3);
        kill(job.id(), signal);
        let o = job.wait();
        let out = text(&o.stdout);
        assert_eq!(o.status.signal(), Some(signal), "{name}: {:?}", o.status);
        assert_eq!(text(&o.stderr), "", "{name}");
        // The kinetrace_step after the last printed step may have begun one more.
        assert_saved(&w, name, last_step(&out, "cpp_train") + 1);
    }
}

/// The job blocks SIGTERM and takes it with `sigwait` in a thread of its own: kinetrace's threads
/// (started before the job blocked it) must not take it instead, so the job's thread gets it,
/// exits with its code, and the exit handler saves the trace.
#[test]
fn a_cpp_job_taking_sigterm_with_sigwait_still_gets_it() {
    let build = tempfile::tempdir().unwrap();
    let exe = cpp_job(build.path());
    let w = World::new();
    let mut job = cpp_run(&w, &exe, "sigwait");
    wait_for_step(&mut job, "cpp_train", 3);
    kill(job.id(), libc::SIGTERM);
    let o = job.wait();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{:?}: {out}", o.status);
    let (before, _) = out
        .split_once("cpp_train: sigwait got 15\n")
        .unwrap_or_else(|| panic!("{out}"));
    // The main thread steps on while the exit runs; the steps before the signal are saved.
    assert_saved(&w, "sigwait", last_step(before, "cpp_train") + 1);
}

/// Python without torch: `kinetrace.step()` in a loop, the `sitecustomize` on the path as
/// `kinetrace record` puts it. Ctrl-C raises KeyboardInterrupt; unhandled, Python finalises, then
/// kills itself with SIGINT (so the shell sees 130), past C's exit handlers: the save happens in
/// Python's `atexit`.
#[test]
fn a_python_job_ended_by_ctrl_c_keeps_its_trace_and_dies_of_sigint() {
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let w = World::new();
        let script = "import time, kinetrace\ni = 0\nwhile True:\n    time.sleep(0.005)\n    kinetrace.step()\n    print(f'py_train: step {i}', flush=True)\n    i += 1\n";
        let mut c = w.preloaded("python3", &["-c", script]);
        c.env("KINETRACE_WHOLE_RUN", "1")
            .env("PYTHONPATH", repo().join("python"))
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let mut job = Job::spawn(c).show(&w.log);
        wait_for_step(&mut job, "py_train", 3);
        kill(job.id(), signal);
        let o = job.wait();
        let out = text(&o.stdout);
        assert_eq!(o.status.signal(), Some(signal), "{name}: {:?}", o.status);
        if signal == libc::SIGINT {
            assert!(
                text(&o.stderr).contains("KeyboardInterrupt"),
                "Python's own traceback: {}",
                text(&o.stderr)
            );
        }
        assert_saved(&w, name, last_step(&out, "py_train") + 1);
    }
}

/// A job that starts `kinetrace.profile`'s in-process runtime the way `_profile.py` does (the shim
/// loaded with ctypes, configuration as text, whole run, never stopped), steps every 5 ms and
/// prints each step. With `sigwait`, the main thread blocks SIGTERM once profiling runs and polls
/// for it with `sigtimedwait`, then stops the profiler and exits 3.
const EMBEDDED_JOB: &str = r#"
import ctypes, signal, sys, time
shim, out, mode = sys.argv[1:4]
lib = ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
lib.kinetrace_profile_start.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
lib.kinetrace_profile_stop.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
msg = ctypes.create_string_buffer(512)
config = "KINETRACE_OUTPUT_DIR=%s\nKINETRACE_WHOLE_RUN=1\nKINETRACE_CONTROL=0\nKINETRACE_ACTIVITIES=cpu_op,user_annotation\n" % out
assert lib.kinetrace_profile_start(config.encode(), msg, 512) == 0, msg.value
if mode == "sigwait":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
i = 0
while True:
    # Sleeping with SIGTERM blocked, then polling: while a thread waits in sigtimedwait the kernel
    # counts the signal as unblocked there, so waiting in it would hide a thread that takes it.
    time.sleep(0.005)
    if mode == "sigwait":
        got = signal.sigtimedwait({signal.SIGTERM}, 0)
        if got is not None:
            print("py_embedded: sigwait got %d" % got.si_signo, flush=True)
            lib.kinetrace_profile_stop(msg, 512)
            sys.exit(3)
    lib.kinetrace_profile_step()
    print("py_embedded: step %d" % i, flush=True)
    i += 1
"#;

fn embedded_run(w: &World, mode: &str) -> Job {
    let mut c = w.command(
        "python3",
        &[
            "-c",
            EMBEDDED_JOB,
            &w.shim.to_string_lossy(),
            &w.out.to_string_lossy(),
            mode,
        ],
    );
    // Only what the job hands over configures the runtime.
    for k in [
        "KINETRACE_OUTPUT_DIR",
        "KINETRACE_LOG",
        "KINETRACE_CUPTI_PATH",
    ] {
        c.env_remove(k);
    }
    Job::spawn(c).show(&w.log)
}

/// `kinetrace.profile` never stopped when SIGTERM or SIGHUP ends the job (Python leaves both at
/// their default): the capture is saved by the same exit path as the preloaded shim's, and the job
/// dies of the signal.
#[test]
fn a_kinetrace_profile_job_ended_by_sigterm_or_sighup_keeps_its_trace_and_dies_of_the_signal() {
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let w = World::new();
        let mut job = embedded_run(&w, "steps");
        wait_for_step(&mut job, "py_embedded", 3);
        kill(job.id(), signal);
        let o = job.wait();
        let out = text(&o.stdout);
        assert_eq!(
            o.status.signal(),
            Some(signal),
            "{name}: {:?} {}",
            o.status,
            text(&o.stderr)
        );
        assert_saved(&w, name, last_step(&out, "py_embedded") + 1);
    }
}

/// The job blocks SIGTERM after starting `kinetrace.profile` and takes it with `sigtimedwait`:
/// the runtime's threads (started before the job blocked it) must not take it instead.
#[test]
fn a_kinetrace_profile_job_taking_sigterm_with_sigwait_still_gets_it() {
    let w = World::new();
    let mut job = embedded_run(&w, "sigwait");
    wait_for_step(&mut job, "py_embedded", 3);
    kill(job.id(), libc::SIGTERM);
    let o = job.wait();
    let out = text(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{:?}: {out} {}",
        o.status,
        text(&o.stderr)
    );
    let (before, _) = out
        .split_once("py_embedded: sigwait got 15\n")
        .unwrap_or_else(|| panic!("{out}"));
    assert_saved(&w, "sigwait", last_step(before, "py_embedded") + 1);
}
