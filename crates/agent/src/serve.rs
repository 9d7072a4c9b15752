//! Serving the running profiler: the control thread polls the control socket and the SIGUSR2
//! flag, and turns requests into captures confined to the trace root.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use kinetrace::{
    CaptureLength, CapturePlan, CaptureRefused, CaptureRequest, CaptureStart, TraceOutput,
};
use kinetrace_export::TraceDir;

use crate::control::{confine, open_inside, ConfineError, ControlServer, Reply, Request};
use crate::log::on_panic_forever;
use crate::process::{Running, PROCESS};

/// Why a capture request was not taken.
#[derive(Debug)]
pub enum SubmitError {
    /// Its output directory is not under the trace root.
    Confine(ConfineError),
    /// The profiler refused it.
    Refused(CaptureRefused),
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::Confine(e) => e.fmt(f),
            SubmitError::Refused(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SubmitError {}

/// Starts the control thread: it listens on the socket (if `KINETRACE_CONTROL` is on) and takes
/// the SIGUSR2 flag (if `KINETRACE_SIGNAL` is), until exit.
pub(crate) fn start_control(r: &'static Running) {
    let server = if r.config.control {
        let dir = r.config.control_dir_or_default();
        match ControlServer::bind(
            &dir,
            std::process::id(),
            PROCESS.embedding.peer_uid.get().copied(),
        ) {
            Ok(s) => {
                PROCESS.listener_fd.store(s.raw_fd(), Ordering::Relaxed);
                *r.control_path.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(s.path().to_path_buf());
                Some(s)
            }
            Err(e) => {
                (r.log)(&format!("on-demand control is off: {e}"));
                None
            }
        }
    } else {
        None
    };
    let stop = r.stop.clone();
    let spawned = std::thread::Builder::new()
        .name("kinetrace-control".into())
        .spawn(move || {
            on_panic_forever("on-demand capture stops in this process");
            let handler = |q: Request| handle(r, q);
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = &server {
                    s.poll(&handler);
                }
                if PROCESS.sigusr2.swap(false, Ordering::Relaxed) {
                    if r.config.flight.span.is_some() && r.config.flight.signal {
                        let trigger = kinetrace::FlightTrigger::Signal("SIGUSR2".into());
                        if let Err(e) = r.profiler.flight_dump(trigger) {
                            (r.log)(&format!("SIGUSR2: no flight dump: {e}"));
                        }
                    } else if let Some(length) = r.config.signal {
                        match submit(r, length, None, None, None, None) {
                            Ok((plan, dir)) => (r.log)(&format!(
                                "SIGUSR2: capturing {} into {}",
                                describe(&plan),
                                dir.display()
                            )),
                            Err(e) => (r.log)(&format!("SIGUSR2: capture refused: {e}")),
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            // Removes the socket.
            drop(server);
        });
    if spawned.is_err() {
        (r.log)("cannot start the control thread; on-demand capture is off");
    }
}

/// A plan in words, for log lines.
fn describe(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps {first}..={last}"),
        CapturePlan::Time { delay, duration } if delay.is_zero() => {
            format!("{} ms", duration.as_millis())
        }
        CapturePlan::Time { delay, duration } => format!(
            "{} ms starting in {} ms",
            duration.as_millis(),
            delay.as_millis()
        ),
    }
}

/// A plan as a reply field.
fn plan_field(plan: &CapturePlan) -> String {
    match plan {
        CapturePlan::Steps { first, last } => format!("steps:{first}-{last}"),
        CapturePlan::Time { delay, duration } => {
            format!("time:{}+{}ms", delay.as_millis(), duration.as_millis())
        }
    }
}

type Done = Sender<Result<TraceOutput, String>>;

/// Asks the profiler for a capture into `out` (under the trace root).
fn submit(
    r: &Running,
    length: CaptureLength,
    start_step: Option<u64>,
    delay: Option<Duration>,
    out: Option<&Path>,
    done: Option<Done>,
) -> Result<(CapturePlan, PathBuf), SubmitError> {
    let dir = confine(&r.root, out).map_err(SubmitError::Confine)?;
    // Opened now, made (where missing) when the capture starts, below what was opened now: the
    // directory checked here is the one written into.
    let place = open_inside(&r.root, &dir).map_err(SubmitError::Confine)?;
    let start = match (start_step, delay) {
        (Some(s), _) => CaptureStart::AtStep(s),
        (None, Some(d)) => CaptureStart::After(d),
        (None, None) => CaptureStart::NextStep,
    };
    let mut req = CaptureRequest::new(start, length);
    let mut sinks = TraceDir::at(place);
    sinks.worker = r.worker.clone();
    sinks.gzip = r.config.gzip;
    req.sinks = Some(Box::new(sinks));
    if let Some(tx) = done {
        req.on_done = Some(Box::new(move |result| {
            let _ = tx.send(result);
        }));
    }
    let plan = r
        .profiler
        .request_capture(req)
        .map_err(SubmitError::Refused)?;
    Ok((plan, dir))
}

/// Answers one request: the first reply, and for a `wait` capture where the final one will come.
fn handle(r: &Running, request: Request) -> (Reply, Option<Receiver<Reply>>) {
    let pid = std::process::id().to_string();
    match request {
        Request::Status => {
            let s = r.profiler.status();
            let capture = s
                .capture
                .as_ref()
                .map(plan_field)
                .unwrap_or_else(|| "none".into());
            let mut fields = vec![
                ("pid", pid.clone()),
                ("step", s.step_num.to_string()),
                ("action", s.action.as_str().to_string()),
                ("capture", capture),
                ("traces", s.traces.to_string()),
                ("root", r.root.display().to_string()),
            ];
            if let Some(why) = s.stepped_aside {
                fields.push(("off", why));
            }
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            (Reply::new("status", &fields), None)
        }
        Request::Dump => {
            let trigger = kinetrace::FlightTrigger::Request("kinetrace trigger --dump".into());
            match r.profiler.flight_dump(trigger) {
                Ok(()) => (
                    Reply::new(
                        "accepted",
                        &[
                            ("pid", &pid),
                            ("dir", &r.root.display().to_string()),
                            ("plan", "dump"),
                        ],
                    ),
                    None,
                ),
                Err(e) => (
                    Reply::new("refused", &[("pid", &pid), ("reason", &e.to_string())]),
                    None,
                ),
            }
        }
        Request::Capture(spec) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let done = spec.wait.then_some(tx);
            match submit(
                r,
                spec.length,
                spec.start_step,
                spec.delay,
                spec.out.as_deref(),
                done,
            ) {
                Ok((plan, dir)) => {
                    (r.log)(&format!(
                        "on-demand capture of {} into {}",
                        describe(&plan),
                        dir.display()
                    ));
                    let first = Reply::new(
                        "accepted",
                        &[
                            ("pid", &pid),
                            ("dir", &dir.display().to_string()),
                            ("plan", &plan_field(&plan)),
                        ],
                    );
                    if !spec.wait {
                        return (first, None);
                    }
                    (first, Some(final_reply(pid, rx)))
                }
                Err(reason) => (
                    Reply::new("refused", &[("pid", &pid), ("reason", &reason.to_string())]),
                    None,
                ),
            }
        }
    }
}

/// The `done` / `failed` reply of a `wait` capture, once its outcome arrives on `rx` (on a thread
/// of its own: the capture may take long).
fn final_reply(pid: String, rx: Receiver<Result<TraceOutput, String>>) -> Receiver<Reply> {
    let (reply_tx, reply_rx) = std::sync::mpsc::channel();
    let _ = std::thread::Builder::new()
        .name("kinetrace-wait".into())
        .spawn(move || {
            let reply = match rx.recv() {
                Ok(Ok(out)) => Reply::new(
                    "done",
                    &[
                        ("pid", &pid),
                        (
                            "path",
                            &out.path
                                .map(|p| p.display().to_string())
                                .unwrap_or_default(),
                        ),
                        ("events", &out.events.to_string()),
                    ],
                ),
                Ok(Err(e)) => Reply::new("failed", &[("pid", &pid), ("reason", &e)]),
                Err(_) => Reply::new(
                    "failed",
                    &[("pid", &pid), ("reason", "the process ended the capture")],
                ),
            };
            let _ = reply_tx.send(reply);
        });
    reply_rx
}
