//! The reader's limits on hostile input: a value longer than [`ReadOptions::max_value_bytes`] is a
//! `ReadError` naming the file and the value's offset on every path an input can take (the fast
//! event scanner, the serde_json fallback, top-level keys and values, raw events; plain and gzip,
//! inline and pipelined), a long string costs linear time however it arrives, and the raw-event
//! stream hands over each event's text. The gzip bombs themselves (GiBs, peak memory measured) are
//! in `crates/analysis/tests/hostile.rs`.

use std::io::{Cursor, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use flate2::write::GzEncoder;
use flate2::Compression;
use kinetrace_export::reader::{ReadError, ReadOptions, Trace, DEFAULT_MAX_VALUE_BYTES};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Every way of reading `doc` with `opts`: (what, result). Gzip both as one member and split into
/// two members at the middle.
fn every_path(doc: &[u8], opts: ReadOptions) -> Vec<(String, Result<Trace, ReadError>)> {
    let gz = gzip(doc);
    let mut two = gzip(&doc[..doc.len() / 2]);
    two.extend_from_slice(&gzip(&doc[doc.len() / 2..]));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.json.gz");
    std::fs::write(&file, &two).unwrap();
    let name = Path::new("t.json");
    let mut out = Vec::new();
    for (what, bytes) in [
        ("plain", doc),
        ("gzip", &gz[..]),
        ("two gzip members", &two[..]),
    ] {
        out.push((
            format!("inline {what}"),
            opts.read_trace_from_reader(name, bytes),
        ));
        out.push((
            format!("pipelined {what}"),
            opts.for_each_event_pipelined(name, Cursor::new(bytes), |_, _| {}),
        ));
        out.push((
            format!("raw {what}"),
            opts.for_each_raw_event(name, Cursor::new(bytes), |text| {
                serde_json::from_slice::<serde_json::Value>(text).map(drop)
            }),
        ));
    }
    out.push(("file".into(), opts.read_trace(&file)));
    out
}

/// The cases: a document with one long value, the long value's text, and whether it is the
/// element of `traceEvents` that holds it (then the limit applies to the whole event).
fn cases(n: usize) -> Vec<(&'static str, String, String)> {
    let long = "a".repeat(n);
    let mut v = Vec::new();
    let ev =
        |name: &str| format!(r#"{{"ph": "X", "cat": "k", "name": "{name}", "ts": 1, "dur": 2}}"#);
    // The fast path's interned name.
    let e = ev(&long);
    v.push(("a long name", e.clone(), e));
    // An escape in a kept string: the serde_json fallback.
    let e = ev(&format!("\\u0041{long}"));
    v.push(("a long name with an escape", e.clone(), e));
    // A skipped arg.
    let e = format!(r#"{{"ph": "i", "name": "m", "ts": 1, "args": {{"note": "{long}"}}}}"#);
    v.push(("a long skipped arg", e.clone(), e));
    // Whitespace inside an event counts: it is held with the event.
    let e = format!(r#"{{"ph": "i", "name": "m",{} "ts": 1}}"#, " ".repeat(n));
    v.push(("whitespace inside an event", e.clone(), e));
    // Top level: a value and a key.
    v.push((
        "a long top-level value",
        format!("\"{long}\""),
        String::new(),
    ));
    v.push((
        "a long top-level key",
        format!("\"k{long}\""),
        String::new(),
    ));
    v
}

fn doc_with(case: &str, value: &str) -> String {
    let small = r#"{"ph": "X", "cat": "k", "name": "short", "ts": 0, "dur": 1}"#;
    match case {
        "a long top-level value" => {
            format!(r#"{{"x": {value}, "traceEvents": [{small}], "y": 1}}"#)
        }
        "a long top-level key" => format!(r#"{{{value}: 1, "traceEvents": [{small}]}}"#),
        _ => format!(r#"{{"traceEvents": [{small}, {value}, {small}], "y": 1}}"#),
    }
}

/// A value of exactly the limit is read on every path; one byte more is a `ReadError` that names
/// the file, the value's first byte and the limit, on every path. Limits below and above the
/// read window's 256 KiB (the window never holds more than the limit plus one read).
#[test]
fn a_value_over_the_limit_is_an_error_at_its_offset_on_every_path() {
    for n in [40 * 1024, 700 * 1024] {
        for (case, value, _) in cases(n) {
            let doc = doc_with(case, &value);
            let at = doc.find(&value).unwrap() as u64;
            let limit = value.len();
            for (what, r) in every_path(
                doc.as_bytes(),
                ReadOptions {
                    max_value_bytes: limit,
                },
            ) {
                if let Err(e) = r {
                    panic!("{case}, {what}: a value of exactly the limit ({limit}) refused: {e}");
                }
            }
            let tight = ReadOptions {
                max_value_bytes: limit - 1,
            };
            for (what, r) in every_path(doc.as_bytes(), tight) {
                let e = match r {
                    Ok(_) => panic!("{case}, {what}: a value over the limit was read"),
                    Err(e) => e,
                };
                let text = e.to_string();
                assert_eq!(e.offset, Some(at), "{case}, {what}: {text}");
                assert!(
                    text.contains("t.json")
                        && text.contains("limit of")
                        && text.contains("--max-value-size"),
                    "{case}, {what}: {text}"
                );
                if !case.contains("top-level") {
                    assert!(text.contains("traceEvents[1]"), "{case}, {what}: {text}");
                }
            }
        }
    }
}

#[test]
fn the_default_limit_is_64_mib() {
    assert_eq!(DEFAULT_MAX_VALUE_BYTES, 64 << 20);
    assert_eq!(ReadOptions::default().max_value_bytes, 64 << 20);
}

/// A 64 MiB string read through gzip takes time linear in its length: it used to be rescanned from
/// its start on every fill of the read window (320 KiB at a time through the inflate pipe, a few
/// KiB when the compressed bytes arrive slowly). A complexity check, not a speed target: the
/// deadline is ten times the same document's plain-JSON read in this test plus two seconds, so a
/// loaded machine does not make it flaky. The exact regression (bytes examined) is also checked
/// by `reader::tests::a_long_string_is_scanned_once_across_fills`.
#[test]
fn a_long_string_through_gzip_reads_in_linear_time() {
    let n = 64 << 20;
    let mut doc = Vec::with_capacity(n + 64);
    doc.extend_from_slice(b"{\"x\": \"");
    doc.resize(doc.len() + n, b'a');
    doc.extend_from_slice(b"\", \"traceEvents\": []}");
    let gz = gzip(&doc);
    let opts = ReadOptions {
        max_value_bytes: n + 2,
    };
    let name = Path::new("long.json");
    let timed = |f: &mut dyn FnMut() -> Result<Trace, ReadError>| {
        let t = Instant::now();
        let trace = f().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(trace.metadata_value("x").map(str::len), Some(n + 2));
        t.elapsed()
    };
    let plain = timed(&mut || opts.read_trace_from_reader(name, &doc[..]));
    drop(doc);
    let deadline = plain * 10 + Duration::from_secs(2);
    let piped = timed(&mut || opts.for_each_event_pipelined(name, Cursor::new(&gz), |_, _| {}));
    // The compressed stream 16 bytes at a time (a pipe, a slow disk): each read inflates to a
    // few KiB, so the string arrives in thousands of pieces.
    let trickled = timed(&mut || opts.read_trace_from_reader(name, Trickle(&gz[..])));
    eprintln!(
        "64 MiB string: plain {plain:?}, gzip pipelined {piped:?}, gzip 16 bytes a read {trickled:?}"
    );
    for (what, took) in [("pipelined", piped), ("16 bytes a read", trickled)] {
        assert!(
            took < deadline,
            "gzip {what} took {took:?}, plain JSON {plain:?}: not linear"
        );
    }
}

/// A reader that gives at most 16 bytes per read.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(16).min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// `for_each_raw_event` hands over each element of `traceEvents` as its text, in order, whatever
/// the input's form; an error the callback returns ends the read at that event's offset.
#[test]
fn raw_events_are_each_events_text_in_order() {
    let doc = r#"{"baseTimeNanoseconds": 5, "traceEvents": [ {"ph": "X", "name": "a", "ts": 1.5, "args": {"k": [1, {"x": "}"}]}} ,
        {"ph": "i", "name": "b\"", "ts": 2}, 3, "s" ], "distributedInfo": {"rank": 2}}"#;
    let want: Vec<serde_json::Value> = serde_json::from_str::<serde_json::Value>(doc).unwrap()
        ["traceEvents"]
        .as_array()
        .unwrap()
        .clone();
    let mut two = gzip(&doc.as_bytes()[..40]);
    two.extend_from_slice(&gzip(&doc.as_bytes()[40..]));
    for bytes in [doc.as_bytes().to_vec(), two] {
        let mut got = Vec::new();
        let t = ReadOptions::default()
            .for_each_raw_event(Path::new("r.json"), Cursor::new(bytes), |text| {
                got.push(serde_json::from_slice::<serde_json::Value>(text)?);
                Ok(())
            })
            .unwrap();
        assert_eq!(got, want);
        assert_eq!((t.base_time_ns, t.rank), (Some(5), Some(2)));
        assert!(t.events.is_empty() && t.strings.is_empty());
    }
    let at = doc.find("{\"ph\": \"i\"").unwrap() as u64;
    let e = ReadOptions::default()
        .for_each_raw_event(Path::new("r.json"), Cursor::new(doc), |text| {
            let v: serde_json::Value = serde_json::from_slice(text)?;
            if v["name"] == "b\"" {
                return Err(serde::de::Error::custom("refused"));
            }
            Ok(())
        })
        .unwrap_err();
    assert_eq!(e.offset, Some(at), "{e}");
    assert!(
        e.message.contains("refused") && e.message.contains("traceEvents[1]"),
        "{e}"
    );
}
