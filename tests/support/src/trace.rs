//! Finding and reading written traces, with serde_json, independently of kinetrace's own reader
//! (which [`Trace::load`] also runs, so every trace a test reads is one the shipped reader takes).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Every file under `dir`, recursively (none if it does not exist).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Whether `p` is a finished trace: `*.pt.trace.json[.gz]`, not a hidden temporary.
pub fn is_trace(p: &Path) -> bool {
    let name = p
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    !name.starts_with('.')
        && (name.ends_with(".pt.trace.json") || name.ends_with(".pt.trace.json.gz"))
}

/// Every finished trace under `dir` (recursively), sorted.
pub fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(dir).into_iter().filter(|p| is_trace(p)).collect();
    v.sort();
    v
}

/// The finished traces directly in `dir`, sorted.
pub fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    v.retain(|p| is_trace(p));
    v.sort();
    v
}

/// A trace file's text, plain or gzip (told by its first bytes).
pub fn read_text(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        s
    } else {
        String::from_utf8(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// Parses a trace file, plain or gzip (told by its first bytes), with serde_json.
pub fn load_json(path: &Path) -> Value {
    let text = read_text(path);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The keys of a JSON document's top-level object, in the order the text has them (repeats
/// included): what a streaming reader meets first.
pub fn top_level_keys(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut string = String::new();
    // The last string that closed at depth 1, until the next non-space character says whether it
    // was a key (`:`) or not.
    let mut candidate: Option<String> = None;
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
                string.push(c);
            } else if c == '\\' {
                escaped = true;
                string.push(c);
            } else if c == '"' {
                in_string = false;
                if depth == 1 {
                    candidate = Some(std::mem::take(&mut string));
                }
            } else {
                string.push(c);
            }
            continue;
        }
        if c.is_whitespace() {
            continue;
        }
        if c == ':' {
            keys.extend(candidate.take());
            continue;
        }
        candidate = None;
        match c {
            '"' => {
                in_string = true;
                string.clear();
            }
            '{' | '[' => depth += 1,
            '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    keys
}

/// [`top_level_keys`] of the one trace under `dir` (recursively).
pub fn only_trace_keys(dir: &Path) -> Vec<String> {
    let files = traces_in(dir);
    assert_eq!(
        files.len(),
        1,
        "expected one trace in {}: {files:?}",
        dir.display()
    );
    top_level_keys(&read_text(&files[0]))
}

/// Where `key` is among the `keys` ([`top_level_keys`]): its one position, failing if it is
/// missing or repeated.
pub fn key_position(keys: &[String], key: &str) -> usize {
    let at: Vec<usize> = keys
        .iter()
        .enumerate()
        .filter(|(_, k)| *k == key)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{key} once among the top-level keys: {keys:?}");
    at[0]
}

/// The one trace under `dir` (recursively), parsed; fails if there is not exactly one.
pub fn load_only_trace(dir: &Path) -> Value {
    let files = traces_in(dir);
    assert_eq!(
        files.len(),
        1,
        "expected one trace in {}: {files:?}",
        dir.display()
    );
    load_json(&files[0])
}

/// The `traceEvents` array.
pub fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents array")
}

/// The complete (`"ph": "X"`) events of category `cat`.
pub fn x<'a>(trace: &'a Value, cat: &'a str) -> Vec<&'a Value> {
    x_events(trace, cat).collect()
}

/// [`x`] as an iterator.
pub fn x_events<'a>(trace: &'a Value, cat: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events(trace)
        .iter()
        .filter(move |e| e["ph"] == "X" && e["cat"] == cat)
}

/// The `ProfilerStep#N` annotation names, sorted.
pub fn step_names(trace: &Value) -> Vec<String> {
    let mut v: Vec<String> = x_events(trace, "user_annotation")
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("ProfilerStep#"))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// A parsed trace file.
pub struct Trace {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its JSON.
    pub json: Value,
}

impl Trace {
    /// Parses `path` (plain or gzip), after checking that kinetrace's own reader accepts it.
    pub fn load(path: &Path) -> Trace {
        kinetrace_export::read_trace(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Trace {
            path: path.to_path_buf(),
            json: load_json(path),
        }
    }

    /// The `traceEvents` array.
    pub fn events(&self) -> &Vec<Value> {
        events(&self.json)
    }

    fn names(&self, cat: &str) -> Vec<String> {
        x_events(&self.json, cat)
            .map(|e| e["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// The `ProfilerStep#N` numbers, ascending.
    pub fn steps(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .names("user_annotation")
            .iter()
            .filter_map(|n| n.strip_prefix("ProfilerStep#")?.parse().ok())
            .collect();
        v.sort();
        v
    }

    /// The step each kernel came from (kernels named `step<N>_kernel<K>`), ascending, deduplicated.
    pub fn kernel_steps(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .names("kernel")
            .iter()
            .filter_map(|n| n.strip_prefix("step")?.split('_').next()?.parse().ok())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// How many kernels.
    pub fn kernels(&self) -> usize {
        self.names("kernel").len()
    }

    /// Every kernel's correlation id has a runtime call with the same id.
    pub fn assert_correlated(&self) {
        let runtime: HashSet<i64> = self
            .events()
            .iter()
            .filter(|e| e["cat"] == "cuda_runtime")
            .filter_map(|e| e["args"]["correlation"].as_i64())
            .collect();
        for e in self.events().iter().filter(|e| e["cat"] == "kernel") {
            let c = e["args"]["correlation"]
                .as_i64()
                .expect("kernel correlation");
            assert!(
                runtime.contains(&c),
                "kernel {} has no runtime call",
                e["name"]
            );
        }
    }

    /// `distributedInfo.rank`.
    pub fn rank(&self) -> Option<i64> {
        self.json["distributedInfo"]["rank"].as_i64()
    }

    /// A top-level string key (trace metadata).
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.json[key].as_str()
    }
}

/// Checks Kineto's `ac2g` links the way a viewer draws them: every GPU record (`kernel`,
/// `gpu_memcpy`, `gpu_memset`) whose call (the `cuda_runtime` or `cuda_driver` event with its
/// `correlation`) is in the trace gets exactly one flow: exactly one flow start (`ph: "s"`) with
/// that id in the whole trace, on the call's row at the call's time, and exactly one flow end
/// (`ph: "f"`, `bp: "e"`) with that id on the record's own row at its own time. Returns how many
/// GPU records had their call in the trace (so a test can check the count is what it launched).
pub fn assert_one_flow_per_gpu_record(trace: &Value) -> usize {
    use std::collections::HashMap;
    let evs = events(trace);
    let corr = |e: &Value| e["args"]["correlation"].as_u64();
    let mut calls: HashMap<u64, Vec<&Value>> = HashMap::new();
    for e in evs
        .iter()
        .filter(|e| e["ph"] == "X" && (e["cat"] == "cuda_runtime" || e["cat"] == "cuda_driver"))
    {
        if let Some(c) = corr(e) {
            calls.entry(c).or_default().push(e);
        }
    }
    let mut flows: HashMap<(u64, &str), Vec<&Value>> = HashMap::new();
    for f in evs.iter().filter(|e| e["cat"] == "ac2g") {
        let (Some(id), Some(ph)) = (f["id"].as_u64(), f["ph"].as_str()) else {
            panic!("an ac2g event without an id or ph: {f}");
        };
        flows.entry((id, ph)).or_default().push(f);
    }
    let at =
        |a: &Value, b: &Value| a["pid"] == b["pid"] && a["tid"] == b["tid"] && a["ts"] == b["ts"];
    let mut checked = 0;
    for g in evs.iter().filter(|e| {
        e["ph"] == "X"
            && (e["cat"] == "kernel" || e["cat"] == "gpu_memcpy" || e["cat"] == "gpu_memset")
    }) {
        let Some(c) = corr(g) else {
            panic!("a GPU record without a correlation: {g}");
        };
        let Some(call) = calls.get(&c) else {
            continue;
        };
        assert_eq!(call.len(), 1, "one call per correlation id {c}: {call:?}");
        let starts = flows.get(&(c, "s")).map(Vec::as_slice).unwrap_or(&[]);
        assert_eq!(
            starts.len(),
            1,
            "exactly one flow start for {} {} (call {}): {starts:?}",
            g["cat"],
            g["name"],
            call[0]["name"]
        );
        assert!(
            at(starts[0], call[0]),
            "the start sits on its call: {} vs {}",
            starts[0],
            call[0]
        );
        let ends: Vec<&&Value> = flows
            .get(&(c, "f"))
            .map(|v| v.iter().filter(|f| at(f, g)).collect())
            .unwrap_or_default();
        assert_eq!(
            ends.len(),
            1,
            "exactly one flow end on {} {} (call {}): {ends:?}",
            g["cat"],
            g["name"],
            call[0]["name"]
        );
        assert_eq!(ends[0]["bp"], "e", "{}", ends[0]);
        checked += 1;
    }
    checked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_keys_in_text_order() {
        let text = r#"{"b": 1, "a": {"x": [1, {"y": "z:"}]}, "s": "q\\\"k\":", "traceEvents": [{"k": 2}], "b": []}"#;
        assert_eq!(top_level_keys(text), ["b", "a", "s", "traceEvents", "b"]);
    }
}
