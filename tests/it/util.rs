use std::sync::{Mutex, MutexGuard};

pub use kinetrace_test_support::trace::{
    events, load_json as load, step_names, trace_files, x_events,
};

/// Profilers are process-wide (rings and the on/off word), so tests that record run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `cmd` to completion with its output captured; past `deadline` it is killed and the test fails
/// with what it printed so far (a hung child must not hang the test run).
pub fn output_within(
    mut cmd: std::process::Command,
    deadline: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            buf
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    let end = std::time::Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(status) => std::process::Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "{what} did not finish within {deadline:?}; it printed:\n{}\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}
