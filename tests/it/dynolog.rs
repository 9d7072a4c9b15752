//! dynolog's `dyno gputrace` reaching a Rust-API process: a fake daemon (test support) hands out
//! requests over the IPC channel and the profiler's polling thread turns them into captures. Each
//! test runs in a fresh child process (the profiler and the variables it reads are process-wide)
//! with a daemon name of its own, so parallel tests never share a socket.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kinetrace::{CaptureLength, CaptureRequest, CaptureStart, Profiler};
use kinetrace_test_support::dynolog::{Answer, FakeDynolog};
use kinetrace_test_support::process::{in_child, wait_until};
use kinetrace_test_support::trace::Trace;

/// A unique daemon name for `test` (abstract names are per network namespace, shared by every
/// process of the machine).
fn daemon_name(test: &str) -> String {
    format!("kinetrace-it-{}-{test}", std::process::id())
}

/// The environment a child needs: its daemon's name, its trace directory, and the opt-ins.
fn child_env<'a>(
    name: &'a str,
    dir: &'a Path,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("_KINETRACE_TEST_DYNOLOG_NAME", name),
        ("KINETO_ONDEMAND_TRACE_DIR", dir.to_str().unwrap()),
        ("KINETO_USE_DAEMON", "1"),
        ("KINETRACE_DYNOLOG", "1"),
        ("KINETO_IPC_SOCKET_DIR", ""),
        ("SLURM_JOB_ID", ""),
    ];
    env.extend_from_slice(extra);
    env
}

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The profiler's log lines.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    fn with(&self, part: &str) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|l| l.contains(part))
            .collect()
    }
}

/// An on-demand profiler polling every 50 ms (the rest from the environment), and its log.
fn profiler(lines: &Lines) -> Profiler {
    let l = lines.clone();
    Profiler::builder()
        .on_demand()
        .cpu_only()
        .output_dir(PathBuf::from(var("KINETO_ONDEMAND_TRACE_DIR")).join("root"))
        .dynolog_interval(Duration::from_millis(50))
        .log(move |m| l.0.lock().unwrap().push(m.to_string()))
        .start()
        .expect("profiler starts")
}

/// Runs `body` while a training loop steps `profiler` every 5 ms (each step a `train_step` span).
fn training<R>(profiler: &Profiler, body: impl FnOnce() -> R) -> R {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Relaxed: a flag with no data attached.
            while !stop.load(Ordering::Relaxed) {
                let _g = kinetrace::record_function("train_step");
                std::thread::sleep(Duration::from_millis(5));
                drop(_g);
                profiler.step();
            }
        });
        // Stops the loop however `body` ends: a failed assertion must not leave the scope waiting.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        body()
    })
}

fn wait_for_trace(path: &Path, daemon: &FakeDynolog, lines: &Lines) -> Trace {
    wait_until(
        &format!("the requested trace {}", path.display()),
        || path.exists(),
        || format!("daemon: {}; log: {:?}", daemon.seen(), lines.all()),
    );
    Trace::load(path)
}

#[test]
fn a_duration_request_is_captured_into_the_requested_file() {
    let name = daemon_name("duration");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::a_duration_request_is_captured_into_the_requested_file",
        &child_env(&name, dir.path(), &[]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            // KINETRACE_DYNOLOG=1 from the environment: the builder is not told.
            let p = profiler(&lines);
            assert!(p.polls_dynolog(), "{:?}", lines.all());
            let pid = std::process::id();
            daemon.queue(
                0,
                0,
                &format!(
                    "\n    ACTIVITIES_LOG_FILE={dir}/run/trace.json\nPROFILE_START_TIME={}\n\
                     ACTIVITIES_DURATION_MSECS=300\nPROFILE_REPORT_INPUT_SHAPES=true\n\
                     PROFILE_WITH_STACK=true\nPROFILE_WITH_FLOPS=false\nPROFILE_WITH_MODULES=false\n\
                     \x20   REQUEST_TRACE_ID=4f2a\n",
                    now_ms()
                ),
            );
            let path = PathBuf::from(format!("{dir}/run/trace_{pid}.json"));
            let trace = training(&p, || wait_for_trace(&path, &daemon, &lines));
            assert!(
                trace.steps().len() >= 2,
                "a 300 ms capture of 5 ms steps: {:?}",
                trace.steps()
            );
            assert_eq!(trace.meta("kinetrace_trigger"), Some("dynolog"));
            assert_eq!(trace.meta("dynolog_request_trace_id"), Some("4f2a"));
            let not_applied = trace.meta("dynolog_not_applied").unwrap_or("");
            assert!(
                not_applied.contains("PROFILE_WITH_FLOPS=false")
                    && !not_applied.contains("PROFILE_WITH_STACK")
                    && !not_applied.contains("PROFILE_REPORT_INPUT_SHAPES"),
                "{not_applied}"
            );
            // So was its with_stack (the head says so; this job has no Python to record).
            assert_eq!(
                trace.json["with_stack"],
                1,
                "the head of {}",
                path.display()
            );
            // The request's input shapes were applied to its capture (the profiler's own: off).
            assert_eq!(
                trace.json["record_shapes"],
                1,
                "the head of {}",
                path.display()
            );
            let polls = daemon.polls();
            let first = &polls[0];
            assert_eq!((first.kind, first.job_id), (2, 0), "{polls:?}");
            assert_eq!(first.pids[0], pid as i32);
            assert_eq!(first.pids[1] as u32, std::os::unix::process::parent_id());
            assert!(daemon.problems().is_empty(), "{}", daemon.seen());
            assert_eq!(
                lines.with("dynolog: capturing").len(),
                1,
                "{:?}",
                lines.all()
            );
            p.stop();
        },
    );
}

#[test]
fn an_iteration_request_records_whole_steps_from_a_round_up() {
    let name = daemon_name("iterations");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::an_iteration_request_records_whole_steps_from_a_round_up",
        &child_env(&name, dir.path(), &[]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            let p = profiler(&lines);
            daemon.queue(
                0,
                0,
                &format!(
                    "ACTIVITIES_LOG_FILE={dir}/it.json\nPROFILE_START_ITERATION=0\n\
                     PROFILE_START_ITERATION_ROUNDUP=10\nACTIVITIES_ITERATIONS=3\n"
                ),
            );
            let path = PathBuf::from(format!("{dir}/it_{}.json", std::process::id()));
            let trace = training(&p, || wait_for_trace(&path, &daemon, &lines));
            let steps = trace.steps();
            assert_eq!(steps.len(), 3, "{steps:?}");
            assert_eq!(
                steps[0] % 10,
                0,
                "starts at a multiple of the round-up: {steps:?}"
            );
            assert_eq!(steps, vec![steps[0], steps[0] + 1, steps[0] + 2]);
            p.stop();
        },
    );
}

#[test]
fn a_busy_process_polls_with_type_0_and_takes_the_request_when_idle() {
    let name = daemon_name("busy");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::a_busy_process_polls_with_type_0_and_takes_the_request_when_idle",
        &child_env(&name, dir.path(), &[]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            let p = profiler(&lines);
            // A capture asked for another way (kinetrace trigger, the API) keeps it busy for 2 s.
            p.request_capture(CaptureRequest::new(
                CaptureStart::Now,
                CaptureLength::Duration(Duration::from_secs(2)),
            ))
            .unwrap();
            // A poll that read the status before the capture began may still be on its way: wait
            // for one that saw it busy before queueing.
            let busy_since = |from: usize| daemon.polls()[from..].iter().any(|q| q.kind == 0);
            wait_until("a poll while busy", || busy_since(0), || daemon.seen());
            daemon.queue(
                0,
                0,
                &format!("ACTIVITIES_LOG_FILE={dir}/b.json\nACTIVITIES_DURATION_MSECS=100\nPROFILE_START_TIME={}", now_ms() + 2500),
            );
            let queued_at = daemon.polls().len();
            let path = PathBuf::from(format!("{dir}/b_{}.json", std::process::id()));
            let trace = training(&p, || {
                wait_until(
                    "a poll while busy after the request",
                    || busy_since(queued_at),
                    || daemon.seen(),
                );
                assert_eq!(
                    daemon.pending(),
                    1,
                    "handed out while busy: {}",
                    daemon.seen()
                );
                wait_for_trace(&path, &daemon, &lines)
            });
            assert!(!trace.steps().is_empty());
            let polls = daemon.polls();
            assert!(
                polls.iter().all(|q| !(q.handed_out && q.kind != 2)),
                "{polls:?}"
            );
            assert_eq!(polls.iter().filter(|q| q.handed_out).count(), 1);
            p.stop();
        },
    );
}

#[test]
fn a_request_for_another_job_or_process_is_not_taken_but_an_ancestor_matches() {
    let name = daemon_name("jobs");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::a_request_for_another_job_or_process_is_not_taken_but_an_ancestor_matches",
        &child_env(&name, dir.path(), &[("SLURM_JOB_ID", "4242")]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            let p = profiler(&lines);
            let req = |f: &str| {
                format!("ACTIVITIES_LOG_FILE={dir}/{f}.json\nACTIVITIES_DURATION_MSECS=50\nPROFILE_START_TIME={}", now_ms())
            };
            daemon.queue(7, 0, &req("other_job"));
            daemon.queue(4242, 999_999_999, &req("other_pid"));
            let n = daemon.polls().len();
            wait_until(
                "three more polls",
                || daemon.polls().len() >= n + 3,
                || daemon.seen(),
            );
            assert!(
                daemon.polls().iter().all(|q| q.job_id == 4242),
                "{}",
                daemon.seen()
            );
            assert_eq!(daemon.pending(), 2, "{}", daemon.seen());
            assert!(lines.with("dynolog:").is_empty(), "{:?}", lines.all());
            // `dyno gputrace --pids <launcher>` reaches its workers: the parent is in every poll.
            let parent = std::os::unix::process::parent_id() as i32;
            daemon.queue(4242, parent, &req("parent"));
            let path = PathBuf::from(format!("{dir}/parent_{}.json", std::process::id()));
            training(&p, || wait_for_trace(&path, &daemon, &lines));
            assert_eq!(daemon.pending(), 2);
            p.stop();
        },
    );
}

#[test]
fn the_filesystem_socket_variant_works_through_a_directory() {
    let name = daemon_name("fs");
    let dir = tempfile::tempdir().unwrap();
    let sockets = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::the_filesystem_socket_variant_works_through_a_directory",
        &child_env(
            &name,
            dir.path(),
            &[("KINETO_IPC_SOCKET_DIR", sockets.path().to_str().unwrap())],
        ),
        || {
            let sockets = PathBuf::from(var("KINETO_IPC_SOCKET_DIR"));
            let daemon = FakeDynolog::in_dir(&sockets, &var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            let p = profiler(&lines);
            daemon.queue(0, 0, &format!("ACTIVITIES_LOG_FILE={dir}/fs.json\nACTIVITIES_DURATION_MSECS=100\nPROFILE_START_TIME={}", now_ms()));
            let path = PathBuf::from(format!("{dir}/fs_{}.json", std::process::id()));
            training(&p, || wait_for_trace(&path, &daemon, &lines));
            let client = |d: &Path| {
                std::fs::read_dir(d)
                    .unwrap()
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("dynoconfigclient")
                    })
                    .count()
            };
            assert_eq!(
                client(&sockets),
                1,
                "the client's own socket is in the directory"
            );
            p.stop();
            assert_eq!(client(&sockets), 0, "stopping removes the client's socket");
        },
    );
}

#[test]
fn without_a_daemon_nothing_happens_but_one_line() {
    let name = daemon_name("absent");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::without_a_daemon_nothing_happens_but_one_line",
        &child_env(&name, dir.path(), &[]),
        || {
            let lines = Lines::default();
            let p = profiler(&lines);
            training(&p, || std::thread::sleep(Duration::from_millis(600)));
            let said = lines.with("dynolog");
            assert_eq!(said.len(), 1, "{:?}", lines.all());
            assert!(
                said[0].starts_with("dynolog: no daemon at @kinetrace-it-"),
                "{said:?}"
            );
            assert!(p.step_num() > 10, "the job stepped on: {}", p.step_num());
            assert!(p.stop().is_empty());
        },
    );
}

#[test]
fn a_daemon_sending_garbage_is_ignored_with_one_line() {
    let name = daemon_name("garbage");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::a_daemon_sending_garbage_is_ignored_with_one_line",
        &child_env(&name, dir.path(), &[]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            daemon.answer(Answer::Garbage);
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            let p = profiler(&lines);
            daemon.queue(0, 0, &format!("ACTIVITIES_LOG_FILE={dir}/g.json\nACTIVITIES_DURATION_MSECS=100\nPROFILE_START_TIME={}", now_ms() + 500));
            let path = PathBuf::from(format!("{dir}/g_{}.json", std::process::id()));
            training(&p, || {
                wait_until(
                    "five garbage replies",
                    || daemon.polls().len() >= 5,
                    || daemon.seen(),
                );
                let said = lines.with("dynolog");
                assert_eq!(said.len(), 1, "{:?}", lines.all());
                assert!(
                    said[0].starts_with("dynolog: ignored a malformed reply"),
                    "{said:?}"
                );
                // The job and the profiler are unaffected; a sane daemon is answered again.
                daemon.answer(Answer::Normally);
                wait_for_trace(&path, &daemon, &lines)
            });
            p.stop();
        },
    );
}

#[test]
fn malformed_requests_and_missing_opt_ins_are_one_line_each() {
    let name = daemon_name("malformed");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::malformed_requests_and_missing_opt_ins_are_one_line_each",
        &child_env(&name, dir.path(), &[]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let lines = Lines::default();
            let p = profiler(&lines);
            daemon.queue(
                0,
                0,
                "ACTIVITIES_LOG_FILE=/etc/cron.d/x.json\nACTIVITIES_DURATION_MSECS=100",
            );
            daemon.queue(0, 0, "ACTIVITIES_DURATION_MSECS=soon");
            training(&p, || {
                wait_until(
                    "both requests answered",
                    || lines.with("request ignored").len() == 2,
                    || format!("{}; log {:?}", daemon.seen(), lines.all()),
                )
            });
            let said = lines.with("request ignored");
            assert!(said[0].contains("ACTIVITIES_LOG_FILE: `/etc/cron.d/x.json` is not allowed (outside the on-demand directory); expected a path under"), "{said:?}");
            assert_eq!(
                said[1],
                "dynolog: request ignored: ACTIVITIES_DURATION_MSECS: `soon` is not an integer number of milliseconds >= 1, such as 500"
            );
            assert!(p.stop().is_empty());
            // Without KINETO_USE_DAEMON (and no libkineto here): off, one line.
            std::env::remove_var("KINETO_USE_DAEMON");
            let lines = Lines::default();
            let p = profiler(&lines);
            assert!(!p.polls_dynolog());
            assert_eq!(lines.with("dynolog").len(), 1, "{:?}", lines.all());
            assert!(lines.all()[0].contains("KINETO_USE_DAEMON is not set"));
            p.stop();
            // A malformed switch fails start(), naming it.
            std::env::set_var("KINETRACE_DYNOLOG", "maybe");
            let e = Profiler::builder()
                .cpu_only()
                .start()
                .err()
                .expect("refused");
            assert_eq!(
                e.to_string(),
                "invalid `KINETRACE_DYNOLOG`: `maybe` is not a switch; expected 1, 0, true or false"
            );
        },
    );
}

/// A request naming its file through a symlinked directory, through a directory other users may
/// write to, or with a name that does not end in `.json` / `.json.gz` is refused with one line, and
/// nothing is written there; a proper request after them is captured.
#[test]
fn requests_through_a_symlink_an_open_directory_or_to_a_non_json_name_are_refused() {
    let test =
        "dynolog::requests_through_a_symlink_an_open_directory_or_to_a_non_json_name_are_refused";
    let name = daemon_name("paths");
    let dir = tempfile::tempdir().unwrap();
    in_child(test, &child_env(&name, dir.path(), &[]), || {
        use std::os::unix::fs::PermissionsExt;
        let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
        let dir = PathBuf::from(var("KINETO_ONDEMAND_TRACE_DIR"));
        let victim = dir.join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("link")).unwrap();
        std::fs::create_dir(dir.join("shared")).unwrap();
        std::fs::set_permissions(dir.join("shared"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        let lines = Lines::default();
        let p = profiler(&lines);
        for f in ["link/t.json", "shared/t.json", "bashrc"] {
            daemon.queue(
                0,
                0,
                &format!(
                    "ACTIVITIES_LOG_FILE={}/{f}\nPROFILE_START_ITERATION=0\nACTIVITIES_ITERATIONS=1",
                    dir.display()
                ),
            );
        }
        daemon.queue(
            0,
            0,
            &format!(
                "ACTIVITIES_LOG_FILE={}/fine/t.json\nPROFILE_START_ITERATION=0\nACTIVITIES_ITERATIONS=1",
                dir.display()
            ),
        );
        let good = dir.join(format!("fine/t_{}.json", std::process::id()));
        training(&p, || wait_for_trace(&good, &daemon, &lines));
        let refused = lines.with("ACTIVITIES_LOG_FILE");
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(refused[0].contains("link is a symlink"), "{refused:?}");
        assert!(
            refused[1].contains("shared is writable by other users"),
            "{refused:?}"
        );
        assert!(
            refused[2].contains("must end in .json or .json.gz"),
            "{refused:?}"
        );
        for d in [&victim, &dir.join("shared")] {
            let written: Vec<_> = std::fs::read_dir(d).unwrap().collect();
            assert!(
                written.is_empty(),
                "written into {}: {written:?}",
                d.display()
            );
        }
        let mut top: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        assert_eq!(top, ["fine", "link", "shared", "victim"]);
        p.stop();
    });
}

/// Set in the second user's copy of this binary: it plays a hostile daemon.
const HOSTILE: &str = "_KINETRACE_TEST_HOSTILE_DYNOLOG";

/// As the second user: binds the daemon's name, answers every poll with the request in
/// `_KINETRACE_TEST_HOSTILE_CONFIG` until the file `_KINETRACE_TEST_HOSTILE_STOP` exists.
fn play_hostile_daemon() {
    use std::io::Write;
    let daemon = FakeDynolog::abstract_name(&var(HOSTILE));
    let config = var("_KINETRACE_TEST_HOSTILE_CONFIG");
    for _ in 0..1000 {
        daemon.queue(0, 0, &config);
    }
    println!("bound as uid {}", kinetrace_test_support::users::euid());
    let _ = std::io::stdout().flush();
    let stop = PathBuf::from(var("_KINETRACE_TEST_HOSTILE_STOP"));
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while !stop.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("answered {} polls", daemon.polls().len());
}

/// Another local user binds the abstract name `dynolog` before the daemon (not started yet, or
/// restarting) and answers the job's poll with a request: the root job drops it with one line and
/// writes nothing, however well-formed the request. Only with `KINETRACE_DYNOLOG_UID` naming that
/// user is the same reply taken.
#[test]
fn a_reply_from_another_user_holding_the_daemon_name_is_dropped() {
    let test = "dynolog::a_reply_from_another_user_holding_the_daemon_name_is_dropped";
    if std::env::var_os(HOSTILE).is_some() {
        return play_hostile_daemon();
    }
    let in_job = kinetrace_test_support::process::is_child(test);
    let job = || {
        let dir = PathBuf::from(var("KINETO_ONDEMAND_TRACE_DIR"));
        let other: u32 = var("_KINETRACE_TEST_OTHER_UID").parse().unwrap();
        let allowed = !var("KINETRACE_DYNOLOG_UID").is_empty();
        let lines = Lines::default();
        let p = profiler(&lines);
        let trace = dir.join(format!("fine/t_{}.json", std::process::id()));
        if allowed {
            training(&p, || wait_for_trace_alone(&trace, &lines));
            p.stop();
            return;
        }
        training(&p, || {
            wait_until(
                "the stranger's reply dropped (or, wrongly, taken)",
                || !lines.with("dropped a reply").is_empty() || dir.join("fine").exists(),
                || format!("log {:?}", lines.all()),
            );
            // Polls go on every 50 ms and each gets the request: a second chance to take it.
            std::thread::sleep(Duration::from_millis(1000));
        });
        p.stop();
        let dropped = lines.with("dropped a reply");
        assert_eq!(dropped.len(), 1, "one line: {:?}", lines.all());
        assert!(
            dropped[0].contains(&format!("from uid {other} ")),
            "{dropped:?}"
        );
        assert!(!dir.join("fine").exists(), "{:?}", lines.all());
        assert!(lines.with("capturing").is_empty(), "{:?}", lines.all());
    };
    if in_job {
        return job();
    }
    let Some(other) = kinetrace_test_support::users::other_user(test) else {
        return;
    };
    let name = daemon_name("hostile");
    let dir = tempfile::tempdir().unwrap();
    let shared = other.world_dir();
    let stop = shared.path().join("stop");
    let (_stage, exe) = other.stage(&std::env::current_exe().unwrap());
    let config = format!(
        "ACTIVITIES_LOG_FILE={}/fine/t.json\nPROFILE_START_ITERATION=0\nACTIVITIES_ITERATIONS=1\n\
         REQUEST_TRACE_ID=4f2a",
        dir.path().display()
    );
    let mut c = other.command(&exe);
    c.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(HOSTILE, &name)
        .env("_KINETRACE_TEST_HOSTILE_CONFIG", &config)
        .env("_KINETRACE_TEST_HOSTILE_STOP", &stop)
        .current_dir(shared.path())
        .stdin(std::process::Stdio::null());
    let mut hostile = kinetrace_test_support::process::Job::spawn(c);
    hostile.wait_until("the hostile daemon bound", |j| {
        j.stdout_so_far().contains("bound as uid")
    });
    let uid = other.uid.to_string();
    for allowed in ["", uid.as_str()] {
        let mut env = child_env(&name, dir.path(), &[("_KINETRACE_TEST_OTHER_UID", &uid)]);
        env.push(("KINETRACE_DYNOLOG_UID", allowed));
        in_child(test, &env, || unreachable!("the child runs `job`"));
    }
    std::fs::write(&stop, "").unwrap();
    let out = hostile.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_for_trace_alone(path: &Path, lines: &Lines) -> Trace {
    wait_until(
        &format!("the requested trace {}", path.display()),
        || path.exists(),
        || format!("log: {:?}", lines.all()),
    );
    Trace::load(path)
}

/// A flight recorder answers `dyno gputrace` with a dump of the span it keeps, into the requested
/// file (its polls do not say busy, though it always records).
#[test]
fn a_flight_recorder_answers_a_request_with_a_dump() {
    let name = daemon_name("flight");
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "dynolog::a_flight_recorder_answers_a_request_with_a_dump",
        &child_env(&name, dir.path(), &[]),
        || {
            let daemon = FakeDynolog::abstract_name(&var("_KINETRACE_TEST_DYNOLOG_NAME"));
            let dir = var("KINETO_ONDEMAND_TRACE_DIR");
            let lines = Lines::default();
            let l = lines.clone();
            let p = Profiler::builder()
                .flight_recorder(kinetrace::FlightSpan::Steps(5))
                .flight_slow_step(None)
                .cpu_only()
                .output_dir(PathBuf::from(&dir).join("root"))
                .dynolog_interval(Duration::from_millis(50))
                .log(move |m| l.0.lock().unwrap().push(m.to_string()))
                .start()
                .expect("profiler starts");
            let pid = std::process::id();
            let path = PathBuf::from(format!("{dir}/run/trace_{pid}.json"));
            let trace = training(&p, || {
                // Some steps first, so the span holds whole ones; then the request.
                std::thread::sleep(Duration::from_millis(100));
                daemon.queue(
                    0,
                    0,
                    &format!(
                        "ACTIVITIES_LOG_FILE={dir}/run/trace.json\nPROFILE_START_TIME={}\n\
                         ACTIVITIES_DURATION_MSECS=300\nREQUEST_TRACE_ID=77aa\n",
                        now_ms()
                    ),
                );
                wait_for_trace(&path, &daemon, &lines)
            });
            assert_eq!(trace.meta("flight_trigger"), Some("request"));
            assert_eq!(trace.meta("flight_requested_by"), Some("dynolog"));
            assert_eq!(trace.meta("kinetrace_trigger"), Some("dynolog"));
            assert_eq!(trace.meta("dynolog_request_trace_id"), Some("77aa"));
            assert!(trace.steps().len() >= 2, "{:?}", trace.steps());
            let polls = daemon.polls();
            assert!(
                polls.iter().any(|p| p.kind != 0),
                "a flight recorder is not busy: {polls:?}"
            );
            assert_eq!(
                lines.with("dynolog: flight dump into").len(),
                1,
                "{:?}",
                lines.all()
            );
            p.stop();
        },
    );
}
