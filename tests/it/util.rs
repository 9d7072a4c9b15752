use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

/// Profilers are process-wide (rings and the on/off word), so tests that record run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses a trace file (plain or gzip) with serde_json, independently of kinetrace's reader.
pub fn load(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap();
    let text = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s)
            .unwrap();
        s
    } else {
        String::from_utf8(bytes).unwrap()
    };
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents array")
}

pub fn x_events<'a>(trace: &'a Value, cat: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events(trace)
        .iter()
        .filter(move |e| e["ph"] == "X" && e["cat"] == cat)
}

pub fn step_names(trace: &Value) -> Vec<String> {
    let mut v: Vec<String> = x_events(trace, "user_annotation")
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("ProfilerStep#"))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

pub fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    v.retain(|p| {
        let n = p.file_name().unwrap().to_string_lossy();
        n.ends_with(".pt.trace.json") || n.ends_with(".pt.trace.json.gz")
    });
    v.sort();
    v
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
