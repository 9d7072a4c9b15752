//! Hostile trace files against everything that reads traces (the reader, `analyze`, `doctor`,
//! `diff`, `convert`): gzip bombs of several GiB, generated as they are read (a 1 MiB filler
//! compressed once into a ~1 KB gzip member and repeated; a few MB on disk where a file is
//! needed, never GiBs). Each case runs in a child process (this test binary run again for that
//! test) that reads its own peak resident memory (`VmHWM` in `/proc/self/status`) at the end and
//! asserts a bound, and whose address space is capped at 2 GiB, so a regression fails the test
//! instead of taking the machine's memory.

use std::io::{self, Cursor, Read, Write};
use std::path::Path;
use std::time::Duration;

use flate2::write::GzEncoder;
use flate2::Compression;
use kinetrace::export::reader::{rank_like_hta_from_reader, ReadOptions, DEFAULT_MAX_VALUE_BYTES};
use kinetrace_analysis::{DiffOptions, DoctorOptions, Options};
use kinetrace_test_support::process::in_child_within;

const MIB: usize = 1 << 20;
/// GiBs of filler in a bomb.
const BOMB_GIB: u64 = 4;
/// The longest a child may take: it inflates GiBs several times on a loaded 2-core machine.
const CHILD: Duration = Duration::from_secs(600);

fn gzip_member(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// A gzip stream of `head`, then `mib` MiB of the byte `fill`, then `tail`, made as it is read:
/// concatenated members, the filler's one member (1 MiB of `fill`, about 1 KB compressed) repeated.
struct Bomb {
    head: Cursor<Vec<u8>>,
    filler: Vec<u8>,
    at: usize,
    left: u64,
    tail: Cursor<Vec<u8>>,
}

impl Bomb {
    fn new(head: &[u8], fill: u8, mib: u64, tail: &[u8]) -> Bomb {
        Bomb {
            head: Cursor::new(gzip_member(head)),
            filler: gzip_member(&vec![fill; MIB]),
            at: 0,
            left: mib,
            tail: Cursor::new(gzip_member(tail)),
        }
    }

    /// The whole stream, for a file (a few MB for GiBs of filler).
    fn bytes(mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_to_end(&mut out).unwrap();
        out
    }
}

impl Read for Bomb {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.head.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        while self.left > 0 {
            if self.at == self.filler.len() {
                self.at = 0;
                self.left -= 1;
                continue;
            }
            let n = buf.len().min(self.filler.len() - self.at);
            buf[..n].copy_from_slice(&self.filler[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.tail.read(buf)
    }
}

/// 4 GiB of spaces between two events, on one line (the whole file is one line), and a rank only
/// HTA's regex finds, after them.
fn whitespace_bomb() -> Bomb {
    Bomb::new(
        br#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2},"#,
        b' ',
        BOMB_GIB * 1024,
        br#"{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 2}], "meta": {"rank": 5}}"#,
    )
}

/// Where the string bomb's event starts.
const STRING_EVENT_AT: u64 = 17;

/// One event whose name is a 4 GiB string.
fn string_bomb() -> Bomb {
    let head = br#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 2, "name": ""#;
    assert_eq!(&head[STRING_EVENT_AT as usize..][..1], b"{");
    Bomb::new(head, b'a', BOMB_GIB * 1024, br#""}]}"#)
}

/// In the child: caps the address space at 2 GiB (a regression then fails here instead of using
/// the machine's memory).
fn cap_address_space() {
    cap_address_space_at(2 << 30);
}

fn cap_address_space_at(bytes: u64) {
    rustix::process::setrlimit(
        rustix::process::Resource::As,
        rustix::process::Rlimit {
            current: Some(bytes),
            maximum: Some(bytes),
        },
    )
    .expect("setrlimit(RLIMIT_AS)");
}

/// This process's peak resident memory, from `/proc/self/status`.
fn peak_rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb * 1024
}

fn assert_peak_below(bound: usize, what: &str) {
    let peak = peak_rss_bytes();
    println!(
        "{what}: peak RSS {} MiB (bound {} MiB)",
        peak / MIB,
        bound / MIB
    );
    assert!(
        peak < bound,
        "{what}: peak RSS {} MiB, bound {} MiB",
        peak / MIB,
        bound / MIB
    );
}

fn one_job() -> Options {
    Options {
        jobs: 1,
        ..Options::default()
    }
}

/// 4 GiB of whitespace in a few MB of gzip, one line: the reader skips it keeping nothing, and
/// HTA's rank search streams it (it held the line: 4.2 GB resident). Peak memory stays under
/// 64 MiB, the default value limit (nothing of the whitespace is a value).
#[test]
fn a_whitespace_gzip_bomb_is_read_and_searched_in_bounded_memory() {
    in_child_within(
        "a_whitespace_gzip_bomb_is_read_and_searched_in_bounded_memory",
        &[],
        CHILD,
        || {
            cap_address_space();
            let mut names = Vec::new();
            let t = ReadOptions::default()
                .for_each_event_pipelined(Path::new("bomb.json.gz"), whitespace_bomb(), |e, s| {
                    names.push(s[e.name.0 as usize].to_string())
                })
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names, ["a", "b"]);
            assert_eq!(t.rank, None);
            assert_eq!(rank_like_hta_from_reader(whitespace_bomb()), Some(5));
            assert_peak_below(DEFAULT_MAX_VALUE_BYTES, "reader and rank search");
        },
    );
}

/// `analyze` on the whitespace bomb (a file of a few MB): read, then the rank found by HTA's regex
/// after the 4 GiB, in bounded memory.
#[test]
fn analyze_reads_a_whitespace_gzip_bomb_in_bounded_memory() {
    in_child_within(
        "analyze_reads_a_whitespace_gzip_bomb_in_bounded_memory",
        &[],
        CHILD,
        || {
            cap_address_space();
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("bomb.json.gz");
            std::fs::write(&file, whitespace_bomb().bytes()).unwrap();
            let r = kinetrace_analysis::analyze(&[file], Vec::new(), &one_job(), &|_| {});
            assert!(r.problems.is_empty(), "{:?}", r.problems);
            assert_eq!(r.ranks.len(), 1);
            assert_eq!(r.ranks[0].rank, 5);
            assert_peak_below(DEFAULT_MAX_VALUE_BYTES, "analyze");
        },
    );
}

/// `convert` streams the whitespace bomb through the reader too (it read the whole input into
/// memory: 2.1 GB for a 2 MB file).
#[test]
fn convert_streams_a_whitespace_gzip_bomb_in_bounded_memory() {
    in_child_within(
        "convert_streams_a_whitespace_gzip_bomb_in_bounded_memory",
        &[],
        CHILD,
        || {
            cap_address_space();
            let (_, stats) = kinetrace_perfetto::convert_reader(
                Path::new("bomb.json.gz"),
                whitespace_bomb(),
                &ReadOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(stats.slices, 2);
            assert_peak_below(DEFAULT_MAX_VALUE_BYTES, "convert");
        },
    );
}

/// A 4 GiB string (it aborted the process: `memory allocation of 4294967296 bytes failed` in
/// the interner) is a `ReadError` naming the file, the event's offset and the limit, for the
/// reader, `analyze`, `doctor`, `diff` and `convert`; the window stops at the 64 MiB limit, so
/// the peak stays under the limit plus 64 MiB.
#[test]
fn a_string_gzip_bomb_is_refused_at_its_offset_in_bounded_memory() {
    in_child_within(
        "a_string_gzip_bomb_is_refused_at_its_offset_in_bounded_memory",
        &[],
        CHILD,
        || {
            cap_address_space();
            let name = Path::new("bomb.json.gz");
            let check = |what: &str, offset: Option<u64>, text: &str| {
                assert_eq!(offset, Some(STRING_EVENT_AT), "{what}: {text}");
                assert!(
                    text.contains("bomb.json.gz") && text.contains("limit of 64 MiB"),
                    "{what}: {text}"
                );
            };
            let opts = ReadOptions::default();
            let e = opts
                .for_each_event_pipelined(name, string_bomb(), |_, _| {})
                .unwrap_err();
            check("reader, pipelined", e.offset, &e.to_string());
            let e = opts
                .read_trace_from_reader(name, string_bomb())
                .unwrap_err();
            check("reader, inline", e.offset, &e.to_string());
            let e = kinetrace_perfetto::convert_reader(name, string_bomb(), &opts).unwrap_err();
            assert!(
                e.0.contains(&format!("at byte {STRING_EVENT_AT}:")),
                "convert: {e}"
            );
            check("convert", Some(STRING_EVENT_AT), &e.0);
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("bomb.json.gz");
            std::fs::write(&file, string_bomb().bytes()).unwrap();
            let small = dir.path().join("small.json");
            std::fs::write(
                &small,
                br#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}"#,
            )
            .unwrap();
            let files = [file.clone()];
            let r = kinetrace_analysis::analyze(&files, Vec::new(), &one_job(), &|_| {});
            check("analyze", r.problems[0].offset, &r.problems[0].to_string());
            let doctor = DoctorOptions {
                jobs: 1,
                ..DoctorOptions::default()
            };
            let r = kinetrace_analysis::doctor(&files, Vec::new(), &doctor, &|_| {});
            check("doctor", r.problems[0].offset, &r.problems[0].to_string());
            let diff = DiffOptions {
                jobs: 1,
                ..DiffOptions::default()
            };
            let r = kinetrace_analysis::diff(&files, &[small], Vec::new(), &diff, &|_| {});
            check("diff", r.problems[0].offset, &r.problems[0].to_string());
            assert_peak_below(DEFAULT_MAX_VALUE_BYTES + 64 * MIB, "string bomb");
        },
    );
}

/// Memory running out while reading is a `ReadError` at the value being read, never an abort:
/// with the value limit raised past what the process may map (a 384 MiB address-space cap here),
/// the 4 GiB string makes the read window's growth (`try_reserve`) fail, and the read says so.
#[test]
fn running_out_of_memory_is_a_read_error_not_an_abort() {
    in_child_within(
        "running_out_of_memory_is_a_read_error_not_an_abort",
        &[],
        CHILD,
        || {
            cap_address_space_at(384 << 20);
            let opts = ReadOptions {
                max_value_bytes: 1 << 40,
            };
            let e = opts
                .for_each_event_pipelined(Path::new("bomb.json.gz"), string_bomb(), |_, _| {})
                .unwrap_err();
            let text = e.to_string();
            assert_eq!(e.offset, Some(STRING_EVENT_AT), "{text}");
            assert!(
                text.contains("bomb.json.gz")
                    && text.contains("out of memory")
                    && text.contains("the read window"),
                "{text}"
            );
        },
    );
}
