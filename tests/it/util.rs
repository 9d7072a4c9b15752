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
