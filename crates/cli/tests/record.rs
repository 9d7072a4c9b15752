//! `kinetrace record` and `kinetrace trigger` as processes, on the stand-in CUDA job of the preload
//! crate (`crates/preload/examples/fake_train.rs`) with the fake libcupti. The shim and the job are
//! built on first use with `cargo build -p kinetrace-preload --examples`. Every wait on a process
//! has a deadline (`common`).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{output, Watched, RUN};
use serde_json::Value;

struct Built {
    shim: PathBuf,
    train: PathBuf,
    cupti: PathBuf,
}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_kinetrace"));
        let profile = bin.parent().unwrap().to_path_buf();
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q", "-p", "kinetrace-preload", "--examples"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        // A cold build on a loaded 2-core machine takes minutes; this only bounds a hang.
        let o = output(&mut c, Duration::from_secs(1800));
        assert!(
            o.status.success(),
            "building kinetrace-preload failed: {}",
            text(&o.stderr)
        );
        Built {
            shim: profile.join("examples/libkinetrace.so"),
            train: profile.join("examples/fake_train"),
            cupti: profile.join("deps/libkinetrace_fake_cupti.so"),
        }
    })
}

struct World {
    tmp: tempfile::TempDir,
    libs: PathBuf,
}

impl World {
    fn new() -> World {
        let b = built();
        let tmp = tempfile::tempdir().unwrap();
        let libs = tmp.path().join("libs");
        std::fs::create_dir(&libs).unwrap();
        for n in ["libcuda.so.1", "libcupti.so.12"] {
            std::os::unix::fs::symlink(&b.cupti, libs.join(n)).unwrap();
        }
        World { tmp, libs }
    }

    fn ctl(&self) -> PathBuf {
        self.tmp.path().join("ctl")
    }

    fn kinetrace(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kinetrace"));
        c.args(args).current_dir(self.tmp.path());
        for (k, _) in std::env::vars() {
            if k.starts_with("KINETRACE_")
                || k.starts_with("KINETO_")
                || k == "LD_PRELOAD"
                || k == "CUDA_INJECTION64_PATH"
            {
                c.env_remove(k);
            }
        }
        c.env("KINETRACE_PRELOAD_PATH", &built().shim)
            .env("KINETRACE_CONTROL_DIR", self.ctl())
            .env("KINETRACE_CUPTI_PATH", self.libs.join("libcupti.so.12"))
            .env("LD_LIBRARY_PATH", &self.libs)
            .stdin(Stdio::null());
        c
    }

    fn record(&self, opts: &[&str], job: &[&str]) -> Output {
        let train = built().train.to_str().unwrap().to_string();
        let mut args = vec!["record", "-o", "traces"];
        args.extend_from_slice(opts);
        args.push("--");
        args.push(&train);
        args.extend_from_slice(job);
        output(&mut self.kinetrace(&args), RUN)
    }

    fn traces(&self) -> Vec<PathBuf> {
        let mut v = walk(&self.tmp.path().join("traces"));
        v.retain(|p| p.to_string_lossy().ends_with(".pt.trace.json"));
        v.sort();
        v
    }
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// (ProfilerStep numbers, steps the kernels came from) of a trace.
fn steps(path: &Path) -> (Vec<u64>, Vec<u64>) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let mut s: Vec<u64> = ev
        .iter()
        .filter(|e| e["cat"] == "user_annotation")
        .filter_map(|e| {
            e["name"]
                .as_str()?
                .strip_prefix("ProfilerStep#")?
                .parse()
                .ok()
        })
        .collect();
    let mut k: Vec<u64> = ev
        .iter()
        .filter(|e| e["cat"] == "kernel")
        .filter_map(|e| {
            e["name"]
                .as_str()?
                .strip_prefix("step")?
                .split('_')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    s.sort();
    k.sort();
    k.dedup();
    (s, k)
}

#[test]
fn record_each_window_mode_and_pass_the_exit_code_through() {
    let cases: Vec<(Vec<&str>, Vec<u64>)> = vec![
        (
            vec!["--iterations", "3", "--start-iteration", "2"],
            vec![2, 3, 4],
        ),
        (vec!["--steps", "4-5"], vec![4, 5]),
        (
            vec!["--schedule", "wait=1,warmup=1,active=2,repeat=1"],
            vec![2, 3],
        ),
    ];
    for (opts, want) in cases {
        let w = World::new();
        let o = w.record(&opts, &["8", "--cuda", "--exit-code", "3"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{opts:?}: {err}");
        assert_eq!(
            text(&o.stdout),
            "fake_train: done 8 steps\n",
            "the command's stdout, and nothing else"
        );
        let traces = w.traces();
        assert_eq!(traces.len(), 1, "{opts:?}: {err}");
        assert_eq!(steps(&traces[0]), (want.clone(), want), "{opts:?}");
        assert!(err.contains("kinetrace: 1 trace(s) in "), "{err}");
        assert!(
            err.contains(&traces[0].display().to_string()),
            "the listing names the file: {err}"
        );
        assert!(
            err.contains("Steps per rank"),
            "the summary, on stderr: {err}"
        );
    }
    // A timed window and the whole run (the default).
    let w = World::new();
    let o = w.record(
        &["--duration", "150ms", "--no-summary"],
        &["30", "--cuda", "--sleep-ms", "20"],
    );
    assert_eq!(o.status.code(), Some(0));
    let (s, k) = steps(&w.traces()[0]);
    assert!(
        !s.is_empty() && s.len() < 30 && s.windows(2).all(|p| p[1] == p[0] + 1),
        "{s:?}"
    );
    assert!(!k.is_empty());
    let w = World::new();
    let o = w.record(&["--no-summary"], &["4", "--cuda"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(steps(&w.traces()[0]).1, vec![0, 1, 2, 3]);
    assert!(!text(&o.stderr).contains("Steps per rank"));
}

#[test]
fn the_cycles_of_a_schedule_are_one_rank_to_the_summary_analyze_doctor_and_diff() {
    let w = World::new();
    let o = w.record(
        &["--schedule", "wait=1,warmup=1,active=2,repeat=2"],
        &["10", "--cuda"],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let traces = w.traces();
    assert_eq!(traces.len(), 2, "{err}");
    assert!(!err.contains("duplicate rank"), "{err}");
    assert!(
        err.contains("1 rank analysed (0), 2 traces: rank 0 in cycles 0–1"),
        "the summary: {err}"
    );
    let dir = w.tmp.path().join("traces");
    let run = |args: &[&str]| {
        let o = output(&mut w.kinetrace(args), RUN);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        assert!(
            !text(&o.stderr).contains("skipped"),
            "{args:?}: {}",
            text(&o.stderr)
        );
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let d = dir.to_str().unwrap();
    let a = run(&["analyze", "--json", d]);
    let cycles: Vec<(i64, i64, i64)> = a["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["rank"].as_i64().unwrap(),
                r["cycle"].as_i64().unwrap(),
                r["cycles"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(cycles, [(0, 0, 2), (0, 1, 2)]);
    let steps: Vec<(i64, i64)> = a["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["cycle"].as_i64().unwrap(), s["step"].as_i64().unwrap()))
        .collect();
    assert_eq!(steps, [(0, 2), (0, 3), (1, 6), (1, 7)]);
    let doc = run(&["doctor", "--json", d]);
    let read: Vec<(i64, i64)> = doc["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["rank"].as_i64().unwrap(), r["cycle"].as_i64().unwrap()))
        .collect();
    assert_eq!(read.len(), 2);
    assert!(read.contains(&(0, 0)) && read.contains(&(0, 1)), "{read:?}");
    let diff = run(&["diff", "--json", d, d]);
    let c = &diff["comparisons"][0];
    assert_eq!(
        (c["base_traces"].as_i64(), c["new_traces"].as_i64()),
        (Some(2), Some(2))
    );
    assert_eq!(c["base_steps"], 4);
}

#[test]
fn record_then_trigger_mid_run() {
    let w = World::new();
    let ready = w.tmp.path().join("ready");
    let train = built().train.to_str().unwrap().to_string();
    let mut c = w.kinetrace(&[
        "record",
        "--on-demand",
        "--no-summary",
        "-o",
        "traces",
        "--",
        &train,
        "80",
        "--cuda",
        "--sleep-ms",
        "20",
        "--ready-file",
        ready.to_str().unwrap(),
    ]);
    let record = Watched::spawn(&mut c);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(w.ctl()).map(|d| d.count()).unwrap_or(0) == 0 {
        if Instant::now() > deadline {
            record.fail("no control socket");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = output(
        &mut w.kinetrace(&[
            "trigger",
            "--iterations",
            "3",
            "--out",
            "incident",
            "--wait",
        ]),
        RUN,
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains(": accepted: steps ") && lines[0].contains("/traces/incident"),
        "{out}"
    );
    let range = lines[0]
        .split("steps ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let (a, b) = range.split_once("..=").unwrap();
    let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
    let path = lines[1]
        .split("wrote ")
        .nth(1)
        .unwrap()
        .split(" (")
        .next()
        .unwrap();
    let want: Vec<u64> = (a..=b).collect();
    assert_eq!(steps(Path::new(path)), (want.clone(), want));
    let st = output(&mut w.kinetrace(&["trigger", "--status"]), RUN);
    assert!(
        text(&st.stdout).contains("1 trace(s) written"),
        "{}",
        text(&st.stdout)
    );
    let r = record.finish(RUN);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    assert_eq!(w.traces().len(), 1, "on-demand: only the triggered capture");
    // Nothing is listening any more.
    let o = output(
        &mut w.kinetrace(&["trigger", "--all", "--iterations", "1"]),
        RUN,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("no kinetrace-enabled process found"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_malformed_option_stops_before_the_job_and_a_malformed_environment_runs_it_unprofiled() {
    let w = World::new();
    // Typed at the keyboard: nothing runs, exit 2, the flag is named.
    let o = w.record(&["--iterations", "0"], &["3", "--cuda", "--exit-code", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(text(&o.stdout), "", "the job did not run");
    assert_eq!(
        text(&o.stderr),
        "kinetrace: --iterations: `0` is 0; expected an integer >= 1, such as 3; nothing was run\n"
    );
    // Inherited from the environment (a production job's configuration): the job runs, unprofiled.
    let mut c = w.kinetrace(&["record", "-o", "traces", "--"]);
    c.arg(&built().train)
        .args(["3", "--cuda", "--exit-code", "5"])
        .env("KINETRACE_ITERATIONS", "many");
    let o = output(&mut c, RUN);
    assert_eq!(o.status.code(), Some(5));
    assert_eq!(text(&o.stdout), "fake_train: done 3 steps\n");
    assert_eq!(
        text(&o.stderr),
        "kinetrace: KINETRACE_ITERATIONS: `many` is not an integer; expected an integer >= 1, such as 3; running the command without profiling\n"
    );
    assert!(!w.tmp.path().join("traces").exists());
    let o = output(
        &mut w.kinetrace(&["record", "--", "/nonexistent/program"]),
        RUN,
    );
    assert_eq!(o.status.code(), Some(127));
    assert!(
        text(&o.stderr).contains("could not find an executable with the name /nonexistent/program")
    );
    // The command without `--`: clap's refusal, with the line to type instead.
    let o = output(&mut w.kinetrace(&["record", "python", "train.py"]), RUN);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains(
            "tip: the command to record goes after `--`: kinetrace record -- python train.py"
        ),
        "{}",
        text(&o.stderr)
    );
}

fn send(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// `kinetrace record --no-summary -- sh -c SCRIPT`, not yet waited for.
///
/// Started through `env --default-signal`: a runner that starts jobs in the background without job
/// control makes them ignore SIGINT and SIGQUIT, `nohup` makes them ignore SIGHUP, and an ignored
/// signal stays ignored by record and, inherited, by the job (which cannot even trap it). Every
/// signal starts at its default here, as from a terminal, whatever this test inherited.
fn record_sh(w: &World, script: &str) -> Watched {
    let c = w.kinetrace(&[]);
    let mut wrapped = Command::new("env");
    wrapped
        .arg("--default-signal")
        .arg(c.get_program())
        .args([
            "record",
            "--no-summary",
            "-o",
            "traces",
            "--",
            "sh",
            "-c",
            script,
        ])
        .current_dir(w.tmp.path())
        .stdin(Stdio::null());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    Watched::spawn(&mut wrapped)
}

/// The pids of live processes whose command line contains `tag`; they are killed, so a failing
/// test leaves nothing behind.
fn reap_tagged(tag: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(tag.len()).any(|w| w == tag.as_bytes()) {
            found.push(pid);
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
    found
}

#[test]
fn signals_sent_to_record_reach_the_command() {
    let w = World::new();
    let r = record_sh(
        &w,
        "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.01; done",
    )
    .wait_for_stdout("ready\n", RUN);
    send(r.id(), rustix::process::Signal::TERM);
    let o = r.finish(RUN);
    assert_eq!(text(&o.stdout), "ready\ngot TERM\n", "{}", text(&o.stderr));
    assert_eq!(o.status.code(), Some(42));
}

#[test]
fn sigint_sighup_and_sigquit_sent_to_record_alone_reach_the_command() {
    use rustix::process::Signal;
    for (sig, name, code) in [
        (Signal::INT, "INT", 43),
        (Signal::HUP, "HUP", 44),
        (Signal::QUIT, "QUIT", 45),
    ] {
        let w = World::new();
        let script = format!(
            "trap 'echo got {name}; exit {code}' {name}; echo ready; while :; do sleep 0.01; done"
        );
        let r = record_sh(&w, &script).wait_for_stdout("ready\n", RUN);
        // To record's pid alone, as `kill -INT PID` does (not to the process group).
        send(r.id(), sig);
        let o = r.finish(RUN);
        assert_eq!(
            text(&o.stdout),
            format!("ready\ngot {name}\n"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(o.status.code(), Some(code), "SIG{name}");
    }
}

#[test]
fn sigterm_at_any_moment_after_start_reaches_the_command_and_leaves_no_orphan() {
    let w = World::new();
    let runs: u64 = 24;
    for i in 0..runs {
        // Spread over 0-50 ms after spawning record: before it installs anything, while it
        // prepares the command, right after the command starts, once the job's trap is set.
        let delay = Duration::from_micros(50_000 * i / (runs - 1));
        let tag = format!("kinetrace-sigterm-{}-{i}", std::process::id());
        let r = record_sh(
            &w,
            &format!(": {tag}; trap 'exit 42' TERM; while :; do sleep 0.01; done"),
        );
        std::thread::sleep(delay);
        send(r.id(), rustix::process::Signal::TERM);
        // Fails (and kills the group) if record hangs or the job outlives it holding the pipes.
        let o = r.finish(RUN);
        let orphans = reap_tagged(&tag);
        assert!(
            orphans.is_empty(),
            "run {i} ({delay:?}): the job outlived record: pids {orphans:?}; record {:?}, stderr {}",
            o.status,
            text(&o.stderr)
        );
        // The job's trap ran (42), or the job died of TERM and record died the same way, or
        // record died of it before it started anything.
        let how = (o.status.code(), o.status.signal());
        assert!(
            how == (Some(42), None) || how == (None, Some(15)),
            "run {i} ({delay:?}): record ended with {:?}: {}",
            o.status,
            text(&o.stderr)
        );
    }
}

#[test]
fn record_dies_of_the_signal_that_killed_the_command() {
    let w = World::new();
    let o = record_sh(&w, "kill -USR1 $$").finish(RUN);
    assert_eq!(o.status.signal(), Some(10), "{:?}", o.status);
    let o = record_sh(&w, "exit 9").finish(RUN);
    assert_eq!(o.status.code(), Some(9));
}

/// `kinetrace record` of the stand-in job for the whole run (steps every 5 ms, printed), every
/// signal at its default as from a terminal (see [`record_sh`]), not yet waited for.
fn record_endless_train(w: &World) -> Watched {
    let c = w.kinetrace(&[]);
    let mut wrapped = Command::new("env");
    wrapped
        .arg("--default-signal")
        .arg(c.get_program())
        .args(["record", "-o", "traces", "--"])
        .arg(&built().train)
        .args(["100000", "--cuda", "--sleep-ms", "5", "--progress"])
        .current_dir(w.tmp.path())
        .stdin(Stdio::null());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    Watched::spawn(&mut wrapped)
}

/// Ctrl-C on a whole-run recording, sent to `record` alone (forwarded to the job) and to the whole
/// process group (the job gets it directly and, forwarded, a second time): the job dies of SIGINT,
/// the trace of what was recorded is written, `record` says so in its last lines (no "removed
/// incomplete files", no "no process reported a step") and dies of SIGINT too (130 in a shell).
#[test]
fn ctrl_c_on_a_whole_run_recording_keeps_the_trace_and_says_so() {
    for group in [false, true] {
        let w = World::new();
        let r = record_endless_train(&w).wait_for_stdout("fake_train: step 3\n", RUN);
        let pid = rustix::process::Pid::from_raw(r.id() as i32).unwrap();
        if group {
            rustix::process::kill_process_group(pid, rustix::process::Signal::INT).unwrap();
        } else {
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        }
        let o = r.finish(RUN);
        let err = text(&o.stderr);
        assert_eq!(
            o.status.signal(),
            Some(2),
            "group {group}: {:?}: {err}",
            o.status
        );
        let traces = w.traces();
        assert_eq!(traces.len(), 1, "group {group}: {err}");
        let (steps, kernels) = steps(&traces[0]);
        assert!(
            kernels.contains(&3) && steps.contains(&3),
            "{steps:?} {kernels:?}"
        );
        let last = steps.last().unwrap();
        assert!(
            err.contains(&format!(
                "kinetrace: the job was interrupted (SIGINT) in step {last}; 1 trace(s) of what was recorded in "
            )),
            "group {group}: {err}"
        );
        assert!(!err.contains("incomplete file"), "{err}");
        assert!(!err.contains("no traces"), "{err}");
        assert!(
            err.contains("Steps per rank"),
            "the summary still comes: {err}"
        );
    }
}

/// The `n` pids the kernel is likely to hand out after `last`, wrapping at `pid_max` (to 300 in
/// the first pid namespace, lower in others: the low ones are all included).
fn next_pids(last: u32, n: u32) -> Vec<u32> {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304);
    let mut v: Vec<u32> = (last + 1..=last + n).filter(|p| *p < max).collect();
    if last + n >= max {
        v.extend(1..=(last + n - max) + 300);
    }
    v
}

/// Plants, for each pid record is likely to get next, what another local user could put at the
/// old predictable `$TMPDIR/kinetrace-python-<pid>` path: a symlink to a directory of the victim,
/// or a directory holding their own `sitecustomize.py`.
#[test]
fn the_python_directory_is_fresh_private_and_ignores_planted_paths() {
    // Other tests spawn processes meanwhile (cargo runs them in parallel): plant well ahead.
    const AHEAD: u32 = 3000;
    const PLANTED_SITE: &str = "raise SystemExit('planted')\n";
    let me = rustix::process::geteuid().as_raw();
    for kind in ["symlink", "directory"] {
        let mut tries = 0;
        loop {
            tries += 1;
            let w = World::new();
            let tmpdir = w.tmp.path().join("tmp");
            let victim = w.tmp.path().join("victim");
            std::fs::create_dir(&tmpdir).unwrap();
            std::fs::create_dir(&victim).unwrap();
            std::fs::write(victim.join("keep"), "the victim's").unwrap();
            // Pids are handed out in order: the next ones follow this probe's.
            let probe = Watched::spawn(&mut Command::new("true"));
            let pids = next_pids(probe.id(), AHEAD);
            probe.finish(RUN);
            for &pid in &pids {
                let p = tmpdir.join(format!("kinetrace-python-{pid}"));
                if kind == "symlink" {
                    std::os::unix::fs::symlink(&victim, &p).unwrap();
                } else {
                    std::fs::create_dir_all(p.join("python/kinetrace")).unwrap();
                    std::fs::write(p.join("python/sitecustomize.py"), PLANTED_SITE).unwrap();
                }
            }
            let go = w.tmp.path().join("go");
            let r = Watched::spawn(
                w.kinetrace(&[
                    "record",
                    "--no-summary",
                    "-o",
                    "traces",
                    "--",
                    "sh",
                    "-c",
                    "echo \"pp=$PYTHONPATH\"; while [ ! -e \"$GO\" ]; do sleep 0.01; done",
                ])
                .env("TMPDIR", &tmpdir)
                .env("GO", &go)
                .env_remove("PYTHONPATH"),
            );
            let pid = r.id();
            let r = r.wait_for_stdout("\n", RUN);
            let out = r.stdout();
            let dir = PathBuf::from(out.trim().strip_prefix("pp=").unwrap_or(""));
            // While the job runs: a directory of ours, private, not one of the planted paths.
            let meta = std::fs::symlink_metadata(&dir);
            std::fs::write(&go, "").unwrap();
            let o = r.finish(RUN);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
            // Nothing planted was touched.
            let mut kept: Vec<_> = std::fs::read_dir(&victim)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            kept.sort();
            assert_eq!(
                kept,
                ["keep"],
                "{kind}: the victim's directory was written to"
            );
            if kind == "directory" {
                for p in &pids {
                    let d = tmpdir.join(format!("kinetrace-python-{p}/python"));
                    assert_eq!(
                        std::fs::read_to_string(d.join("sitecustomize.py"))
                            .unwrap_or_else(|e| format!("({e})")),
                        PLANTED_SITE,
                        "the planted sitecustomize of pid {p} was rewritten or removed"
                    );
                    assert_eq!(
                        std::fs::read_dir(d.join("kinetrace"))
                            .map(|d| d.count())
                            .ok(),
                        Some(0),
                        "the planted directory of pid {p} was written to or removed"
                    );
                }
            }
            assert_eq!(
                std::fs::read_dir(&tmpdir).unwrap().count(),
                pids.len(),
                "{kind}: only the planted entries are left"
            );
            assert_eq!(dir.parent(), Some(tmpdir.as_path()), "{out}");
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let planted = name
                .strip_prefix("kinetrace-python-")
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| pids.contains(&n));
            assert!(
                !planted,
                "{kind}: record used the planted {}",
                dir.display()
            );
            let meta = meta.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            assert!(
                meta.is_dir(),
                "{kind}: {} is not a directory",
                dir.display()
            );
            assert_eq!(meta.mode() & 0o7777, 0o700, "{kind}: {}", dir.display());
            assert_eq!(meta.uid(), me);
            assert!(!dir.exists(), "{kind}: {} is left behind", dir.display());
            if pids.contains(&pid) {
                break;
            }
            // record's pid fell outside the planted range (pid wrap-around, a burst of other
            // processes): the planted paths were not where the old code would have looked.
            assert!(
                tries < 10,
                "record's pid {pid} was never among the {} planted",
                pids.len()
            );
        }
    }
}

#[test]
fn record_names_the_shim_as_a_rocprofiler_sdk_tool() {
    let w = World::new();
    let shim = built().shim.display().to_string();
    for (old, want) in [
        (None, shim.clone()),
        (Some("/t/libtool.so"), format!("/t/libtool.so:{shim}:")),
    ] {
        let mut c = w.kinetrace(&[
            "record",
            "--no-summary",
            "-o",
            "traces",
            "--",
            "sh",
            "-c",
            "echo \"rtl=$ROCP_TOOL_LIBRARIES\"",
        ]);
        match old {
            Some(v) => c.env("ROCP_TOOL_LIBRARIES", v),
            None => c.env_remove("ROCP_TOOL_LIBRARIES"),
        };
        let o = output(&mut c, RUN);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(
            text(&o.stdout),
            format!("rtl={want}\n"),
            "{}",
            text(&o.stderr)
        );
    }
}

#[test]
fn an_unusable_tmpdir_runs_the_command_without_the_python_hook() {
    let w = World::new();
    let file = w.tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    // Root may write anywhere but /proc; others cannot write into a 0500 directory.
    let unwritable = if rustix::process::geteuid().is_root() {
        PathBuf::from("/proc")
    } else {
        let d = w.tmp.path().join("read-only");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o500)).unwrap();
        d
    };
    for tmpdir in [file, w.tmp.path().join("missing/dir"), unwritable] {
        let o = output(
            w.kinetrace(&[
                "record",
                "--no-summary",
                "-o",
                "traces",
                "--",
                "sh",
                "-c",
                "echo \"pp=$PYTHONPATH\"; case \"$LD_PRELOAD\" in *libkinetrace.so*) echo preloaded;; esac; exit 7",
            ])
            .env("TMPDIR", &tmpdir)
            .env_remove("PYTHONPATH"),
            RUN,
        );
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(7), "{}: {err}", tmpdir.display());
        assert_eq!(
            text(&o.stdout),
            "pp=\npreloaded\n",
            "{}: profiled, without the Python directory: {err}",
            tmpdir.display()
        );
        let said: Vec<&str> = err.lines().filter(|l| l.contains("Python hook")).collect();
        assert_eq!(said.len(), 1, "{}: {err}", tmpdir.display());
        assert!(
            said[0].starts_with("kinetrace: ") && said[0].contains(&*tmpdir.to_string_lossy()),
            "{}",
            said[0]
        );
    }
}

/// A profiled process that outlives `record` (started in the background) keeps its unfinished
/// files: `record` removes only those of processes that are gone, so that process's trace still
/// appears when it ends.
#[test]
fn record_leaves_the_files_of_a_process_that_outlives_it() {
    let w = World::new();
    let train = built().train.to_str().unwrap().to_string();
    let ready = w.tmp.path().join("bg-ready");
    let go = w.tmp.path().join("bg-go");
    let tag = format!("bg-outlives-{}", std::process::id());
    let script = format!(
        "{train} 5 --cuda --ready-file {ready} --wait-file {go} --tag {tag} >/dev/null 2>&1 </dev/null & \
         while [ ! -s {ready} ]; do sleep 0.01; done",
        ready = ready.display(),
        go = go.display(),
    );
    let o = record_sh(&w, &script).finish(RUN);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let bg: u32 = std::fs::read_to_string(&ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The background job is alive and recording; now let it finish.
    std::fs::write(&go, "").unwrap();
    let end = Instant::now() + RUN;
    while w.traces().is_empty() {
        if Instant::now() > end {
            let left = reap_tagged(&tag);
            panic!(
                "the background job ({bg}) never wrote its trace (still running: {left:?}); record said:\n{}",
                text(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(w.traces().len(), 1);
}

/// The head keys and the (ProfilerStep numbers, kernel steps) of a flight dump.
fn flight_dump(path: &Path) -> (Value, Vec<u64>, Vec<u64>) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (s, k) = steps(path);
    (v, s, k)
}

/// Waits until `n` traces are in the trace root (a dump is written by the job's collector while
/// the job runs on), or fails with what `r` printed.
fn wait_traces(w: &World, n: usize, r: Watched) -> (Watched, Vec<PathBuf>) {
    let end = Instant::now() + RUN;
    loop {
        let t = w.traces();
        if t.len() >= n {
            return (r, t);
        }
        if Instant::now() > end {
            r.fail(&format!("{} traces after {RUN:?}, wanted {n}", t.len()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `record --flight`: a slow step writes one dump of the span before it, stating the slow step's
/// time and the median; the job's output and exit code are its own; nothing else is written.
#[test]
fn flight_a_slow_step_dumps_the_steps_before_it() {
    let w = World::new();
    let o = output(
        w.kinetrace(&[])
            // A step the loaded machine stretched by chance must not hold back the injected one.
            .env("KINETRACE_FLIGHT_SLOW_INTERVAL", "0s")
            .args([
                "record",
                "--flight",
                "8steps",
                "--no-summary",
                "-o",
                "traces",
                "--",
            ])
            .arg(&built().train)
            .args(["40", "--cuda", "--sleep-ms", "5", "--slow-step", "30"])
            .args(["--slow-ms", "600", "--exit-code", "3"]),
        RUN,
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        text(&o.stdout).contains("fake_train: done 40 steps"),
        "{err}"
    );
    let dumps: Vec<_> = w.traces().iter().map(|p| flight_dump(p)).collect();
    let (head, steps, kernels) = dumps
        .iter()
        .find(|(v, _, _)| v["flight_slow_step"] == "30")
        .unwrap_or_else(|| panic!("no dump of step 30 among {}: {err}", dumps.len()));
    assert_eq!(head["flight_trigger"], "slow_step");
    let slow: u64 = head["flight_slow_step_ns"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let median: u64 = head["flight_median_step_ns"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        slow >= 600_000_000 && slow > 3 * median,
        "{slow} vs {median}"
    );
    // The span as it stood when step 30 ended: the 8 steps before it and step 30 itself; then
    // what followed until the collector wrote it (step 31 in progress, or more on a loaded
    // machine); their kernels.
    assert_eq!(steps[0], 22, "{head}");
    assert!(steps.windows(2).all(|p| p[1] == p[0] + 1), "{steps:?}");
    let last = *steps.last().unwrap();
    assert!(last >= 31, "{steps:?}");
    assert!(
        kernels.contains(&30) && kernels.contains(&22),
        "{kernels:?}"
    );
    assert!(kernels.iter().all(|k| steps.contains(k)), "{kernels:?}");
    assert_eq!(head["flight_first_step"], "22");
    assert_eq!(head["kinetrace_partial_step"], last.to_string().as_str());
    assert!(err.contains("flight dump (step 30 took"), "{err}");
    // doctor starts from the trigger: the slow step against the steps before it.
    let slow_file = w
        .traces()
        .into_iter()
        .find(|p| flight_dump(p).0["flight_slow_step"] == "30")
        .unwrap();
    let o = output(
        &mut w.kinetrace(&["doctor", slow_file.to_str().unwrap()]),
        RUN,
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(
        out.starts_with("Flight dump, rank 0 (slow_step): step 30 took"),
        "{out}"
    );
    assert!(
        out.contains("the slow step against the steps before it"),
        "{out}"
    );
    assert!(out.contains("ProfilerStep#*"), "{out}");
    // The same from --json: the trigger, the step against the median, the comparison.
    let o = output(
        &mut w.kinetrace(&["doctor", "--json", slow_file.to_str().unwrap()]),
        RUN,
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &v["flight"][0];
    assert_eq!(d["trigger"], "slow_step", "{v:#}");
    assert_eq!(d["slow"]["step"], 30);
    assert_eq!(d["slow"]["dur_ns"].as_u64(), Some(slow));
    assert_eq!(d["slow"]["median_ns"].as_u64(), Some(median));
    assert_eq!(d["slow_step"]["new_step"], 30);
    assert_eq!(d["steps"][0], 22);
    assert!(d["span_end_ns"].as_i64().unwrap() > d["span_start_ns"].as_i64().unwrap());
}

/// `kinetrace trigger --dump` asks a running flight recorder for its span; the job goes on, and a
/// second dump later holds later steps.
#[test]
fn flight_trigger_dump_writes_the_kept_steps_and_recording_goes_on() {
    let w = World::new();
    let stop = w.tmp.path().join("stop");
    let r = Watched::spawn(
        w.kinetrace(&[])
            .env("KINETRACE_FLIGHT_SLOW_STEP", "off")
            .args([
                "record",
                "--flight",
                "5steps",
                "--no-summary",
                "-o",
                "traces",
                "--",
            ])
            .arg(&built().train)
            .args(["100000", "--cuda", "--sleep-ms", "5", "--progress"])
            .arg("--stop-file")
            .arg(&stop),
    )
    .wait_for_stdout("fake_train: step 20\n", RUN);
    let o = output(&mut w.kinetrace(&["trigger", "--dump"]), RUN);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(out.contains(": accepted: flight dump into "), "{out}");
    let (r, first) = wait_traces(&w, 1, r);
    let (head, steps, kernels) = flight_dump(&first[0]);
    assert_eq!(head["flight_trigger"], "request", "{head}");
    assert_eq!(head["flight_span"], "5steps");
    // The five whole steps before the request and the one in progress then, plus what the job
    // did until the collector wrote the dump (more steps on a loaded machine); consecutive,
    // with their kernels.
    assert!(steps.len() >= 6, "{steps:?}");
    assert!(steps.windows(2).all(|p| p[1] == p[0] + 1), "{steps:?}");
    // Asked after step 20 ended: the span then began at step 16 or later.
    assert!(steps[0] >= 16, "{steps:?}");
    assert_eq!(
        head["kinetrace_partial_step"],
        steps.last().unwrap().to_string().as_str()
    );
    assert!(
        kernels.iter().all(|k| steps.contains(k)),
        "{kernels:?} {steps:?}"
    );
    let last = *steps.last().unwrap();
    let r = r.wait_for_stdout(&format!("fake_train: step {}\n", last + 10), RUN);
    let o = output(&mut w.kinetrace(&["trigger", "--dump", "--all"]), RUN);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    let (r, both) = wait_traces(&w, 2, r);
    let later = both.iter().find(|p| **p != first[0]).unwrap();
    let (_, later_steps, _) = flight_dump(later);
    assert!(later_steps[0] > last, "{later_steps:?} after {steps:?}");
    std::fs::write(&stop, "").unwrap();
    let o = r.finish(RUN);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        w.traces().len(),
        2,
        "a flight recorder writes nothing at exit"
    );
}

/// `record --flight-after 1s`: a requested dump goes on recording for a second after the request
/// (the steps that follow are in it, the step running at its end partial) and ends exactly there;
/// a malformed value stops before the job, naming the flag.
#[test]
fn flight_after_holds_the_steps_that_follow_the_trigger() {
    let w = World::new();
    let o = output(
        w.kinetrace(&["record", "--flight", "60s", "--flight-after", "soon", "--"])
            .arg(&built().train)
            .arg("3"),
        RUN,
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(text(&o.stdout), "", "the job did not run");
    assert!(
        text(&o.stderr).starts_with("kinetrace: --flight-after: `soon` is not a duration"),
        "{}",
        text(&o.stderr)
    );
    let stop = w.tmp.path().join("stop");
    let r = Watched::spawn(
        w.kinetrace(&[])
            .env("KINETRACE_FLIGHT_SLOW_STEP", "off")
            .args(["record", "--flight", "5steps", "--flight-after", "1s"])
            .args(["--no-summary", "-o", "traces", "--"])
            .arg(&built().train)
            .args(["100000", "--cuda", "--sleep-ms", "5", "--progress"])
            .arg("--stop-file")
            .arg(&stop),
    )
    .wait_for_stdout("fake_train: step 20\n", RUN);
    let o = output(&mut w.kinetrace(&["trigger", "--dump"]), RUN);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let (r, t) = wait_traces(&w, 1, r);
    std::fs::write(&stop, "").unwrap();
    let o = r.finish(RUN);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let (head, steps, _) = flight_dump(&t[0]);
    let ns = |k: &str| -> u64 { head[k].as_str().unwrap().parse().unwrap() };
    assert_eq!(ns("flight_after_ns"), 1_000_000_000, "{head}");
    assert_eq!(ns("flight_end_ns"), ns("flight_trigger_ns") + 1_000_000_000);
    assert!(head.get("flight_after_cut_by").is_none(), "{head}");
    assert!(steps[0] >= 16, "{steps:?}");
    assert!(steps.windows(2).all(|p| p[1] == p[0] + 1), "{steps:?}");
    // Steps that began well after the request are in it, up to the end of the period.
    let base = head["baseTimeNanoseconds"].as_u64().unwrap();
    let step_starts: Vec<u64> = head["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("ProfilerStep#"))
        })
        .map(|e| base + (e["ts"].as_f64().unwrap() * 1000.0) as u64)
        .collect();
    let late = ns("flight_trigger_ns") + 500_000_000;
    assert!(step_starts.iter().any(|&s| s > late), "{steps:?}");
    assert!(
        step_starts.iter().all(|&s| s <= ns("flight_end_ns") + 1000),
        "{steps:?}"
    );
    assert_eq!(
        head["kinetrace_partial_step"],
        steps.last().unwrap().to_string().as_str()
    );
}

/// SIGINT ending the job dumps the span (the exit path's budget), and the job still dies of it;
/// SIGUSR2 dumps only where KINETRACE_FLIGHT_SIGNAL asks for it.
#[test]
fn flight_sigusr2_and_the_ending_signal_dump() {
    let w = World::new();
    let ready = w.tmp.path().join("ready");
    let r = Watched::spawn(
        w.kinetrace(&[])
            .env("KINETRACE_FLIGHT_SIGNAL", "1")
            .env("KINETRACE_FLIGHT_SLOW_STEP", "off")
            .args([
                "record",
                "--flight",
                "30s",
                "--no-summary",
                "-o",
                "traces",
                "--",
            ])
            .arg(&built().train)
            .args(["100000", "--cuda", "--sleep-ms", "5", "--progress"])
            .arg("--ready-file")
            .arg(&ready),
    )
    .wait_for_stdout("fake_train: step 10\n", RUN);
    let job: u32 = std::fs::read_to_string(&ready).unwrap().parse().unwrap();
    send(job, rustix::process::Signal::USR2);
    let (r, t) = wait_traces(&w, 1, r);
    let (head, steps, _) = flight_dump(&t[0]);
    assert_eq!(head["flight_trigger"], "signal", "{head}");
    assert_eq!(head["flight_signal"], "SIGUSR2");
    assert!(
        steps.contains(&5),
        "a 30 s span holds every step so far: {steps:?}"
    );
    let r = r.wait_for_stdout(
        &format!("fake_train: step {}\n", steps.last().unwrap() + 5),
        RUN,
    );
    send(job, rustix::process::Signal::TERM);
    let o = r.finish(RUN);
    assert_eq!(o.status.signal(), Some(15), "{}", text(&o.stderr));
    let t = w.traces();
    assert_eq!(t.len(), 2, "{}", text(&o.stderr));
    let last = t
        .iter()
        .map(|p| flight_dump(p))
        .find(|(v, _, _)| v["flight_trigger"] == "exit")
        .unwrap_or_else(|| panic!("no exit dump: {}", text(&o.stderr)));
    assert_eq!(last.0["flight_signal"], "SIGTERM");
    assert!(last.1.len() > steps.len(), "{:?}", last.1);
}

/// Many ranks dumping at once (`trigger --dump --all`) into one trace root: one whole trace per
/// rank, each its own file with its own rank in its head.
#[test]
fn flight_many_ranks_dump_at_once() {
    let w = World::new();
    let stop = w.tmp.path().join("stop");
    let ranks = 4;
    let mut jobs: Vec<Watched> = (0..ranks)
        .map(|rank| {
            Watched::spawn(
                w.kinetrace(&[])
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", ranks.to_string())
                    .env("KINETRACE_FLIGHT_SLOW_STEP", "off")
                    .args([
                        "record",
                        "--flight",
                        "60s",
                        "--no-summary",
                        "-o",
                        "traces",
                        "--",
                    ])
                    .arg(&built().train)
                    .args(["100000", "--cuda", "--sleep-ms", "5", "--progress"])
                    .arg("--stop-file")
                    .arg(&stop),
            )
        })
        .collect();
    jobs = jobs
        .into_iter()
        .map(|j| j.wait_for_stdout("fake_train: step 5\n", RUN))
        .collect();
    let o = output(&mut w.kinetrace(&["trigger", "--dump", "--all"]), RUN);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert_eq!(
        out.matches(": accepted: flight dump").count(),
        ranks,
        "{out}"
    );
    let (first, traces) = wait_traces(&w, ranks, jobs.remove(0));
    jobs.insert(0, first);
    std::fs::write(&stop, "").unwrap();
    for j in jobs {
        let o = j.finish(RUN);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    let mut seen: Vec<u64> = traces
        .iter()
        .map(|p| {
            let (head, steps, kernels) = flight_dump(p);
            assert_eq!(head["flight_trigger"], "request");
            assert!(
                steps.contains(&5) && kernels.contains(&5),
                "{steps:?} {kernels:?}"
            );
            head["distributedInfo"]["rank"].as_u64().unwrap()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, (0..ranks as u64).collect::<Vec<_>>());
    assert_eq!(w.traces().len(), ranks);
}
