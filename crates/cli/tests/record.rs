//! `kinetrace record` and `kinetrace trigger` as processes, on the stand-in CUDA job of the preload
//! crate (`crates/preload/examples/fake_train.rs`) with the fake libcupti. The shim and the job are
//! built on first use with `cargo build -p kinetrace-preload --examples`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
        let st = c.status().expect("run cargo");
        assert!(st.success(), "building kinetrace-preload failed");
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
        self.kinetrace(&args).output().unwrap()
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
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let record = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(w.ctl()).map(|d| d.count()).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = w
        .kinetrace(&[
            "trigger",
            "--iterations",
            "3",
            "--out",
            "incident",
            "--wait",
        ])
        .output()
        .unwrap();
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
    let st = w.kinetrace(&["trigger", "--status"]).output().unwrap();
    assert!(
        text(&st.stdout).contains("1 trace(s) written"),
        "{}",
        text(&st.stdout)
    );
    let r = record.wait_with_output().unwrap();
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    assert_eq!(w.traces().len(), 1, "on-demand: only the triggered capture");
    // Nothing is listening any more.
    let o = w
        .kinetrace(&["trigger", "--all", "--iterations", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("no kinetrace-enabled process found"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_malformed_option_runs_the_command_untouched() {
    let w = World::new();
    let o = w.record(
        &["--iterations", "many"],
        &["3", "--cuda", "--exit-code", "5"],
    );
    assert_eq!(o.status.code(), Some(5));
    assert_eq!(text(&o.stdout), "fake_train: done 3 steps\n");
    assert_eq!(
        text(&o.stderr),
        "kinetrace: KINETRACE_ITERATIONS: `many` is not an integer; expected an integer >= 1, such as 3; running the command without profiling\n"
    );
    assert!(!w.tmp.path().join("traces").exists());
    let o = w
        .kinetrace(&["record", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127));
    assert!(
        text(&o.stderr).contains("could not find an executable with the name /nonexistent/program")
    );
}

#[test]
fn signals_sent_to_record_reach_the_command() {
    let w = World::new();
    let mut c = w.kinetrace(&[
        "record",
        "-o",
        "traces",
        "--",
        "sh",
        "-c",
        "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.01; done",
    ]);
    c.stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    use std::io::Read;
    out.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"ready\n");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "got TERM\n");
    assert_eq!(status.code(), Some(42));
}
