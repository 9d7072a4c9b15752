//! `dyno gputrace` reaching an unmodified job: the stand-in job (`examples/fake_train.rs`) runs with
//! the shim preloaded and `KINETRACE_DYNOLOG=1`, and a fake dynolog daemon (test support) in this
//! process hands out requests. Each test uses a daemon name of its own (parallel tests never share a
//! socket) and its own scratch world.

mod common;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use kinetrace_test_support::dynolog::FakeDynolog;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The stand-in job, `steps` steps of 10 ms, opted into dynolog with a 100 ms poll interval, as
/// SLURM job 31337.
fn job(w: &World, test: &str, steps: u64, extra_env: &[(&str, &str)]) -> (Job, String) {
    let name = format!("kinetrace-preload-{}-{test}", std::process::id());
    let steps = steps.to_string();
    let mut c = w.preloaded(&w.train, &[&steps, "--cuda", "--sleep-ms", "10"]);
    c.env("KINETRACE_DYNOLOG", "1")
        .env("KINETRACE_DYNOLOG_INTERVAL", "100ms")
        .env("KINETO_USE_DAEMON", "1")
        .env("KINETO_ONDEMAND_TRACE_DIR", w.tmp.path())
        .env("SLURM_JOB_ID", "31337")
        .env("_KINETRACE_TEST_DYNOLOG_NAME", &name)
        .envs(extra_env.iter().copied());
    (Job::spawn(c).show(&w.log), name)
}

fn wait_for(path: &Path, w: &World, daemon: &FakeDynolog) {
    wait_until(
        &format!("the requested trace {}", path.display()),
        || path.exists(),
        || format!("daemon: {}; log:\n{}", daemon.seen(), w.log_text()),
    );
}

fn dynolog_lines(w: &World) -> Vec<String> {
    w.log_text()
        .lines()
        .filter(|l| l.contains("dynolog"))
        .map(String::from)
        .collect()
}

#[test]
fn a_shimmed_job_answers_a_duration_request_with_gpu_activity() {
    let w = World::new();
    let name = format!("kinetrace-preload-{}-duration", std::process::id());
    let daemon = FakeDynolog::abstract_name(&name);
    let (job, _) = job(&w, "duration", 150, &[]);
    let pid = job.id();
    let dir = w.tmp.path().display().to_string();
    daemon.queue(
        31337,
        pid as i32,
        &format!(
            "ACTIVITIES_LOG_FILE={dir}/gpu.json\nPROFILE_START_TIME={}\n\
             ACTIVITIES_DURATION_MSECS=300\nPROFILE_WITH_FLOPS=true\nREQUEST_TRACE_ID=77\n",
            now_ms()
        ),
    );
    let path = PathBuf::from(format!("{dir}/gpu_{pid}.json"));
    wait_for(&path, &w, &daemon);
    let out = job.wait();
    assert_eq!(out.status.code(), Some(0), "log:\n{}", w.log_text());
    assert_eq!(text(&out.stdout), "fake_train: done 150 steps\n");
    assert_eq!(text(&out.stderr), "");
    let t = Trace::load(&path);
    assert!(t.kernels() > 0, "log:\n{}", w.log_text());
    t.assert_correlated();
    assert!(!t.steps().is_empty());
    assert_eq!(t.meta("dynolog_request_trace_id"), Some("77"));
    assert!(t
        .meta("dynolog_not_applied")
        .is_some_and(|m| m.contains("PROFILE_WITH_FLOPS=true")));
    let polls = daemon.polls();
    assert!(
        polls
            .iter()
            .all(|q| q.job_id == 31337 && q.pids[0] == pid as i32),
        "{polls:?}"
    );
    assert!(daemon.problems().is_empty(), "{}", daemon.seen());
    let said = dynolog_lines(&w);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("dynolog: capturing 300 ms"), "{said:?}");
}

#[test]
fn a_shimmed_job_answers_an_iteration_request_over_filesystem_sockets() {
    let w = World::new();
    let sockets = w.tmp.path().join("ipc");
    std::fs::create_dir(&sockets).unwrap();
    let name = format!("kinetrace-preload-{}-iterations", std::process::id());
    let daemon = FakeDynolog::in_dir(&sockets, &name);
    let (job, _) = job(
        &w,
        "iterations",
        120,
        &[("KINETO_IPC_SOCKET_DIR", sockets.to_str().unwrap())],
    );
    let pid = job.id();
    let dir = w.tmp.path().display().to_string();
    daemon.queue(
        31337,
        0,
        &format!(
            "ACTIVITIES_LOG_FILE={dir}/steps.json\nPROFILE_START_ITERATION=0\n\
             PROFILE_START_ITERATION_ROUNDUP=20\nACTIVITIES_ITERATIONS=4\n"
        ),
    );
    let path = PathBuf::from(format!("{dir}/steps_{pid}.json"));
    wait_for(&path, &w, &daemon);
    let out = job.wait();
    assert_eq!(out.status.code(), Some(0), "log:\n{}", w.log_text());
    let t = Trace::load(&path);
    let steps = t.steps();
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert_eq!(steps[0] % 20, 0, "{steps:?}");
    assert_eq!(t.kernel_steps(), steps);
    let left: Vec<_> = std::fs::read_dir(&sockets)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dynoconfigclient"))
        .collect();
    assert!(
        left.is_empty(),
        "the job's socket stays after exit: {left:?}"
    );
}

#[test]
fn a_shimmed_job_without_a_daemon_runs_on_with_one_line() {
    let w = World::new();
    let (job, _) = job(&w, "absent", 60, &[]);
    let out = job.wait();
    assert_eq!(out.status.code(), Some(0), "log:\n{}", w.log_text());
    assert_eq!(text(&out.stdout), "fake_train: done 60 steps\n");
    let said = dynolog_lines(&w);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("dynolog: no daemon at @kinetrace-preload-"),
        "{said:?}"
    );
    assert!(w.traces().is_empty());
}

/// A copy of a harmless shared library named `libkineto.so`, so that the process's maps show
/// libkineto as a PyTorch process's do.
fn fake_libkineto(w: &World) -> PathBuf {
    let p = w.tmp.path().join("libkineto.so");
    std::fs::copy(fake_cupti(), &p).unwrap();
    p
}

#[test]
fn with_libkineto_polling_kinetrace_steps_back_and_without_it_polls_alone() {
    let w = World::new();
    let name = format!("kinetrace-preload-{}-libkineto", std::process::id());
    let daemon = FakeDynolog::abstract_name(&name);
    let preload = format!("{}:{}", w.shim.display(), fake_libkineto(&w).display());
    // libkineto mapped and KINETO_USE_DAEMON set: libkineto polls, kinetrace does not.
    let (job, _) = job(&w, "libkineto", 40, &[("LD_PRELOAD", &preload)]);
    let out = job.wait();
    assert_eq!(out.status.code(), Some(0), "log:\n{}", w.log_text());
    assert!(daemon.polls().is_empty(), "{}", daemon.seen());
    let said = dynolog_lines(&w);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("libkineto in this process polls the daemon"),
        "{said:?}"
    );
    // libkineto mapped without KINETO_USE_DAEMON (a PyTorch job that did not opt libkineto in):
    // KINETRACE_DYNOLOG=1 alone makes kinetrace poll.
    let w2 = World::new();
    let mut c = w2.preloaded(&w2.train, &["40", "--cuda", "--sleep-ms", "10"]);
    c.env("LD_PRELOAD", &preload)
        .env("KINETRACE_DYNOLOG", "1")
        .env("KINETRACE_DYNOLOG_INTERVAL", "100ms")
        .env("SLURM_JOB_ID", "31337")
        .env("_KINETRACE_TEST_DYNOLOG_NAME", &name);
    let out = Job::spawn(c).show(&w2.log).wait();
    assert_eq!(out.status.code(), Some(0), "log:\n{}", w2.log_text());
    assert!(!daemon.polls().is_empty(), "log:\n{}", w2.log_text());
    assert!(dynolog_lines(&w2).is_empty(), "{:?}", dynolog_lines(&w2));
}
