//! `kinetrace trigger`: ask running kinetrace-enabled processes to capture now, over their control
//! sockets, and report per process whether it accepted (what and where) or refused (and why).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use kinetrace_agent::config::parse_duration;
use kinetrace_agent::control::{
    self, default_control_dir, CaptureLength, CaptureSpec, Reply, Request,
};

pub const TRIGGER_AFTER_HELP: &str = "\
Processes profiled by kinetrace (kinetrace record, LD_PRELOAD or CUDA_INJECTION64_PATH) listen on
<control dir>/<pid>.sock once they have initialised CUDA or reported a step. Only the same user may
connect. Output directories are taken under each process's trace root and may not leave it.

EXIT STATUS: 0 if every process asked accepted (and, with --wait, wrote its trace), 1 otherwise.

EXAMPLES:
  kinetrace trigger --all --iterations 3
  kinetrace trigger --pid 4242 --duration 500ms --out incident-17 --wait
  kinetrace trigger --status
  kinetrace trigger --dump 4242        (a flight recorder writes the span it keeps)
  kinetrace trigger --dump --all";

/// `kinetrace trigger`.
#[derive(Debug, Args)]
#[command(after_help = TRIGGER_AFTER_HELP)]
pub struct TriggerArgs {
    /// Only these processes (repeatable).
    #[arg(long, value_name = "PID", conflicts_with = "all")]
    pub pid: Vec<u32>,
    /// Every process with a control socket (default when there is exactly one).
    #[arg(long)]
    pub all: bool,
    /// Capture N iterations, starting at the next step boundary.
    #[arg(long, value_name = "N", group = "what")]
    pub iterations: Option<u32>,
    /// Capture this much wall time (500ms, 2s, 1m).
    #[arg(long, value_name = "TIME", group = "what")]
    pub duration: Option<String>,
    /// Start at this iteration instead of the next one (with --iterations).
    #[arg(
        long,
        value_name = "I",
        requires = "iterations",
        conflicts_with = "duration"
    )]
    pub start_iteration: Option<u64>,
    /// Start after this delay (with --duration).
    #[arg(
        long,
        value_name = "TIME",
        requires = "duration",
        conflicts_with = "iterations"
    )]
    pub delay: Option<String>,
    /// A directory under each process's trace root for this capture.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Wait until each trace is written and print its path.
    #[arg(long)]
    pub wait: bool,
    /// Report each process's state instead of capturing.
    #[arg(long, group = "what")]
    pub status: bool,
    /// Ask the flight recorder (record --flight, KINETRACE_FLIGHT_RECORDER) of process PID (or
    /// of those chosen with --pid / --all) to write the span it keeps now.
    #[arg(long, value_name = "PID", num_args = 0..=1, group = "what")]
    pub dump: Option<Option<u32>>,
    /// The socket directory (default: $KINETRACE_CONTROL_DIR, else /tmp/kinetrace-<uid>).
    #[arg(long, value_name = "DIR")]
    pub control_dir: Option<PathBuf>,
}

/// A validated trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerPlan {
    /// The request to send.
    pub request: Request,
    /// Explicit pids, or every listening process.
    pub pids: Option<Vec<u32>>,
    /// `--all` was given.
    pub all: bool,
    /// The socket directory.
    pub dir: PathBuf,
}

impl TriggerArgs {
    /// Checks the arguments and builds the request.
    pub fn plan(self) -> Result<TriggerPlan> {
        let mut pid = self.pid;
        let request = if self.status {
            Request::Status
        } else if let Some(dump_pid) = self.dump {
            pid.extend(dump_pid);
            Request::Dump
        } else {
            let length = match (self.iterations, &self.duration) {
                (Some(0), _) => bail!("--iterations must be at least 1"),
                (Some(n), None) => CaptureLength::Steps(n),
                (None, Some(d)) => CaptureLength::Duration(duration("--duration", d)?),
                _ => bail!("say what to capture: --iterations N or --duration TIME (or --status)"),
            };
            if let CaptureLength::Duration(d) = length {
                if d.is_zero() {
                    bail!("--duration must be more than 0");
                }
            }
            Request::Capture(CaptureSpec {
                length,
                start_step: self.start_iteration,
                delay: self
                    .delay
                    .as_deref()
                    .map(|d| duration("--delay", d))
                    .transpose()?,
                out: self.out,
                wait: self.wait,
            })
        };
        let dir = self
            .control_dir
            .or_else(|| std::env::var_os("KINETRACE_CONTROL_DIR").map(PathBuf::from))
            .unwrap_or_else(default_control_dir);
        let pids = (!pid.is_empty()).then_some(pid);
        Ok(TriggerPlan {
            request,
            pids,
            all: self.all,
            dir,
        })
    }
}

fn duration(flag: &str, v: &str) -> Result<Duration> {
    match parse_duration(v) {
        Some(d) => Ok(d),
        None => bail!("{flag} `{v}` is not a duration; give an integer with a unit ms, s or m, such as 500ms or 2s"),
    }
}

/// Sends the request and reports.
pub fn run_trigger(plan: TriggerPlan) -> Result<ExitCode> {
    let sockets = control::list_sockets(&plan.dir);
    let targets: Vec<(u32, PathBuf)> = match &plan.pids {
        Some(pids) => pids
            .iter()
            .map(|p| (*p, control::socket_path(&plan.dir, *p)))
            .collect(),
        None => sockets.clone(),
    };
    if targets.is_empty() {
        bail!(
            "no kinetrace-enabled process found in {} (processes listen once they initialise CUDA or report a step; see --control-dir)",
            plan.dir.display()
        );
    }
    if plan.pids.is_none()
        && targets.len() > 1
        && !matches!(plan.request, Request::Status)
        && !plan.all
    {
        let list: Vec<String> = targets.iter().map(|(p, _)| p.to_string()).collect();
        bail!(
            "{} processes are listening ({}); choose with --pid PID or use --all",
            targets.len(),
            list.join(", ")
        );
    }
    let timeout = Duration::from_secs(if plan.request_waits() { 24 * 3600 } else { 10 });
    let handles: Vec<_> = targets
        .into_iter()
        .map(|(pid, path)| {
            let request = plan.request.clone();
            std::thread::spawn(move || (pid, path.clone(), control::send(&path, &request, timeout)))
        })
        .collect();
    let mut ok = true;
    let mut out = std::io::stdout().lock();
    for h in handles {
        let Ok((pid, path, result)) = h.join() else {
            ok = false;
            continue;
        };
        match result {
            Ok(replies) => {
                for r in &replies {
                    ok &= matches!(r.verb.as_str(), "accepted" | "done" | "status");
                    writeln!(out, "{}", describe(pid, r))?;
                }
                if replies.is_empty() {
                    ok = false;
                    writeln!(out, "pid {pid}: no answer")?;
                }
            }
            Err(e) => {
                ok = false;
                let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
                let msg = match e.kind() {
                    std::io::ErrorKind::PermissionDenied => {
                        format!(
                            "pid {pid}: permission denied ({}): it belongs to another user",
                            path.display()
                        )
                    }
                    std::io::ErrorKind::NotFound => {
                        format!("pid {pid}: no control socket at {}", path.display())
                    }
                    std::io::ErrorKind::ConnectionRefused if !alive => {
                        let _ = std::fs::remove_file(&path);
                        format!("pid {pid}: not running (stale socket removed)")
                    }
                    _ => format!("pid {pid}: {e}"),
                };
                writeln!(out, "{msg}")?;
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

impl TriggerPlan {
    fn request_waits(&self) -> bool {
        matches!(
            self.request,
            Request::Capture(CaptureSpec { wait: true, .. })
        )
    }
}

/// One line per reply.
pub fn describe(pid: u32, r: &Reply) -> String {
    let g = |k: &str| r.get(k).unwrap_or("?").to_string();
    match r.verb.as_str() {
        "accepted" if r.get("plan") == Some("dump") => {
            format!("pid {pid}: accepted: flight dump into {}", g("dir"))
        }
        "accepted" => {
            let plan = g("plan");
            let what = if let Some(s) = plan.strip_prefix("steps:") {
                let (a, b) = s.split_once('-').unwrap_or((s, s));
                format!("steps {a}..={b}")
            } else if let Some(t) = plan.strip_prefix("time:") {
                let (delay, dur) = t.split_once('+').unwrap_or(("0", t));
                if delay == "0" {
                    dur.to_string()
                } else {
                    format!("{dur} starting in {delay} ms")
                }
            } else {
                plan
            };
            format!("pid {pid}: accepted: {what} into {}", g("dir"))
        }
        "done" => format!("pid {pid}: wrote {} ({} events)", g("path"), g("events")),
        "failed" => format!("pid {pid}: failed: {}", g("reason")),
        "refused" => format!("pid {pid}: refused: {}", g("reason")),
        "status" => {
            let mut s = format!(
                "pid {pid}: step {}, {}, capture {}, {} trace(s) written, root {}",
                g("step"),
                g("action"),
                g("capture"),
                g("traces"),
                g("root")
            );
            if let Some(off) = r.get("off") {
                s.push_str(&format!(", off: {off}"));
            }
            s
        }
        other => format!("pid {pid}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn plan(args: &[&str]) -> Result<TriggerPlan> {
        let cli = crate::cli::Cli::try_parse_from(args)?;
        let crate::cli::Command::Trigger(t) = cli.command else {
            panic!("not trigger")
        };
        t.plan()
    }

    #[test]
    fn requests_from_flags() {
        let p = plan(&[
            "kinetrace",
            "trigger",
            "--pid",
            "12",
            "--iterations",
            "3",
            "--out",
            "x",
            "--wait",
            "--control-dir",
            "/c",
        ])
        .unwrap();
        assert_eq!(p.pids, Some(vec![12]));
        assert_eq!(p.dir, PathBuf::from("/c"));
        assert_eq!(
            p.request,
            Request::Capture(CaptureSpec {
                length: CaptureLength::Steps(3),
                start_step: None,
                delay: None,
                out: Some("x".into()),
                wait: true
            })
        );
        let p = plan(&[
            "kinetrace",
            "trigger",
            "--all",
            "--duration",
            "500ms",
            "--delay",
            "1s",
        ])
        .unwrap();
        assert_eq!(p.pids, None);
        assert!(
            matches!(p.request, Request::Capture(CaptureSpec { length: CaptureLength::Duration(d), delay: Some(_), .. }) if d == Duration::from_millis(500))
        );
        assert_eq!(
            plan(&["kinetrace", "trigger", "--status"]).unwrap().request,
            Request::Status
        );
        let p = plan(&["kinetrace", "trigger", "--dump", "77"]).unwrap();
        assert_eq!((p.request, p.pids), (Request::Dump, Some(vec![77])));
        let p = plan(&["kinetrace", "trigger", "--dump", "--all"]).unwrap();
        assert_eq!((p.request, p.pids, p.all), (Request::Dump, None, true));
        assert!(plan(&["kinetrace", "trigger", "--dump", "--iterations", "3"]).is_err());
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(plan(&["kinetrace", "trigger"]).is_err());
        assert!(plan(&[
            "kinetrace",
            "trigger",
            "--iterations",
            "3",
            "--duration",
            "1s"
        ])
        .is_err());
        assert!(plan(&["kinetrace", "trigger", "--iterations", "0"]).is_err());
        let e = plan(&["kinetrace", "trigger", "--duration", "500"]).unwrap_err();
        assert!(e.to_string().contains("ms, s or m"), "{e}");
        assert!(plan(&[
            "kinetrace",
            "trigger",
            "--pid",
            "1",
            "--all",
            "--iterations",
            "1"
        ])
        .is_err());
        assert!(plan(&["kinetrace", "trigger", "--delay", "1s", "--iterations", "1"]).is_err());
    }

    #[test]
    fn replies_read_as_sentences() {
        let r = Reply::new("accepted", &[("plan", "steps:11-13"), ("dir", "/t/run")]);
        assert_eq!(
            describe(7, &r),
            "pid 7: accepted: steps 11..=13 into /t/run"
        );
        let r = Reply::new("refused", &[("reason", "busy: recording")]);
        assert_eq!(describe(7, &r), "pid 7: refused: busy: recording");
        let r = Reply::new("done", &[("path", "/t/a.json"), ("events", "12")]);
        assert_eq!(describe(7, &r), "pid 7: wrote /t/a.json (12 events)");
    }
}
