//! The streaming Kineto writer.
//!
//! Events are serialized as they arrive into a spool file beside the target, so memory does not grow
//! with the trace. When the window ends the header (which needs facts only known then: drop counts,
//! devices) is written to a hidden temporary file, the spooled events are copied after it, the
//! per-row metadata events and `Record Window End` close the array, and the temporary file is
//! renamed over the target. A crash at any point leaves no half-written trace under the final name.
//!
//! Unfinished files (spools and temporary traces) are hidden (`.` first) and their names end with
//! `@{host}@{pid namespace}@{pid}.tmp`, so that what a killed process left can be told apart from a
//! live one's, even in a trace directory shared over NFS by several nodes: [`remove_abandoned`]
//! removes only files of this host (and pid namespace) whose process is gone. The files a process
//! has open are also listed here, so that an exit that cannot wait for a save can remove them
//! ([`abandon_unfinished`]).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use kinetrace_core::activity::Activity;
use kinetrace_core::intern::NameId;
use kinetrace_core::{Sink, SinkFactory, TraceMeta, TraceOutput, UnixNanos, WindowInfo};

pub use crate::encoder::TraceEncoder;

/// Kineto's "3-month" bucket for `baseTimeNanoseconds`: 3 × 2,629,746 s.
pub const BASE_TIME_BUCKET_NS: u64 = 7_889_238_000_000_000;

/// This process's `baseTimeNanoseconds`: computed once, so every trace of a process (and every
/// process started in the same 3-month bucket) shares a zero point.
pub fn process_base_time_ns() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(|| base_time_for(UnixNanos::now()))
}

/// The bucket start for `t`.
pub fn base_time_for(t: UnixNanos) -> u64 {
    t.0 / BASE_TIME_BUCKET_NS * BASE_TIME_BUCKET_NS
}

/// Renders a whole trace in memory (for tests, golden files and small exports).
pub fn render_trace(
    meta: &TraceMeta,
    activities: &[Activity],
    base_ns: u64,
    trace_name: &str,
) -> Vec<u8> {
    let mut enc = TraceEncoder::new(base_ns);
    let mut body = Vec::new();
    for a in activities {
        enc.event(a, &mut body);
    }
    let mut out = Vec::new();
    enc.header(meta, &mut out);
    out.extend_from_slice(&body);
    enc.footer(meta, trace_name, &mut out);
    out
}

/// How trace files are named and where they go, like PyTorch's `tensorboard_trace_handler`:
/// `{dir}/{worker}.{time_ns}.pt.trace.json[.gz]`.
#[derive(Clone, Debug)]
pub struct TraceDir {
    /// The run directory holding every rank's files.
    pub dir: PathBuf,
    /// Worker name; defaults to `{hostname}_{pid}`.
    pub worker: String,
    /// Gzip the output.
    pub gzip: bool,
}

impl TraceDir {
    /// A trace directory with the default worker name.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TraceDir {
            dir: dir.into(),
            worker: default_worker_name(),
            gzip: false,
        }
    }
}

/// `{hostname}_{pid}`, the worker name `tensorboard_trace_handler` uses.
pub fn default_worker_name() -> String {
    format!(
        "{}_{}",
        kinetrace_core::session::host_name(),
        std::process::id()
    )
}

impl SinkFactory for TraceDir {
    fn open(&mut self, window: &WindowInfo) -> io::Result<Box<dyn Sink>> {
        Ok(Box::new(KinetoSink::create(self.clone(), window.cycle)?))
    }
}

/// A [`Sink`] that streams one window into a Kineto trace file.
pub struct KinetoSink {
    target: TraceDir,
    encoder: TraceEncoder,
    spool_path: PathBuf,
    spool: BufWriter<File>,
    scratch: Vec<u8>,
}

impl KinetoSink {
    /// Opens the spool for cycle `cycle` in `target.dir` (creating the directory).
    pub fn create(target: TraceDir, cycle: u32) -> io::Result<Self> {
        fs::create_dir_all(&target.dir)
            .map_err(|e| with_path(e, &target.dir, "create directory"))?;
        let spool_path = target.dir.join(unfinished_name(&format!(
            "{}.{}.events",
            target.worker, cycle
        )));
        let spool = create_unfinished(&spool_path)?;
        Ok(KinetoSink {
            target,
            encoder: TraceEncoder::new(process_base_time_ns()),
            spool_path,
            spool: BufWriter::with_capacity(1 << 20, spool),
            scratch: Vec::with_capacity(4096),
        })
    }

    fn publish(mut self, meta: &TraceMeta) -> io::Result<TraceOutput> {
        if let Err(e) = self.spool.flush() {
            // A full disk: leave nothing behind (dropping `self` removes the spool).
            return Err(with_path(e, &self.spool_path, "write"));
        }
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut name = format!("{}.{}.pt.trace.json", self.target.worker, now_ns);
        if self.target.gzip {
            name.push_str(".gz");
        }
        let final_path = self.target.dir.join(&name);
        let tmp_path = self.target.dir.join(unfinished_name(&name));
        let result = (|| {
            let mut head = Vec::new();
            self.encoder.header(meta, &mut head);
            let mut tail = Vec::new();
            self.encoder
                .footer(meta, &final_path.to_string_lossy(), &mut tail);
            let mut file = create_unfinished(&tmp_path)?;
            let mut spool = File::open(&self.spool_path)?;
            if self.target.gzip {
                let mut w = flate2::write::GzEncoder::new(
                    BufWriter::with_capacity(1 << 20, file),
                    flate2::Compression::fast(),
                );
                w.write_all(&head)?;
                io::copy(&mut spool, &mut w)?;
                w.write_all(&tail)?;
                w.finish()?.flush()?;
            } else {
                file.write_all(&head)?;
                // File to file: the kernel copies (copy_file_range) without a trip through userspace.
                io::copy(&mut spool, &mut file)?;
                file.write_all(&tail)?;
                file.flush()?;
            }
            finish_unfinished(&tmp_path, &final_path)
        })();
        remove_unfinished(&self.spool_path);
        if result.is_err() {
            remove_unfinished(&tmp_path);
        }
        result?;
        Ok(TraceOutput {
            path: Some(final_path),
            events: self.encoder.events(),
            cycle: meta.cycle,
        })
    }
}

fn with_path(e: io::Error, path: &Path, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
}

impl Sink for KinetoSink {
    fn record(&mut self, activity: &Activity) -> io::Result<()> {
        self.scratch.clear();
        self.encoder.event(activity, &mut self.scratch);
        self.spool.write_all(&self.scratch)
    }

    fn finish(self: Box<Self>, meta: &TraceMeta) -> io::Result<TraceOutput> {
        self.publish(meta)
    }

    fn discard(self: Box<Self>) {
        // Dropping removes the spool.
        drop(self);
    }
}

impl Drop for KinetoSink {
    fn drop(&mut self) {
        // However the sink ends (published, discarded, dropped while unwinding), its spool goes.
        remove_unfinished(&self.spool_path);
    }
}

/// This process's unfinished files, and whether exit gave up on them.
struct Unfinished {
    abandoned: bool,
    paths: Vec<PathBuf>,
}

static UNFINISHED: Mutex<Unfinished> = Mutex::new(Unfinished {
    abandoned: false,
    paths: Vec::new(),
});

fn unfinished() -> MutexGuard<'static, Unfinished> {
    // The list stays consistent whatever panicked while holding it (each change is one push/remove).
    UNFINISHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `@{host}@{pid namespace}`: where this process runs, as it appears in unfinished files' names.
/// The host name is kept to characters safe in a file name (`@` and `/` never appear).
fn owner_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let host: String = kinetrace_core::session::host_name()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // `pid:[4026531836]`: pids are only comparable within one pid namespace (containers).
        let ns: String = fs::read_link("/proc/self/ns/pid")
            .map(|l| {
                l.to_string_lossy()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect()
            })
            .unwrap_or_default();
        format!("@{host}@{}", if ns.is_empty() { "0" } else { &ns })
    })
}

/// `.{stem}@{host}@{pid namespace}@{pid}.tmp`, the pid read now (a forked child has its own).
fn unfinished_name(stem: &str) -> String {
    format!(".{stem}{}@{}.tmp", owner_tag(), std::process::id())
}

/// The pid in an unfinished file's name, if the file was made on this host (and pid namespace).
pub fn unfinished_owner_here(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (rest, pid) = rest.rsplit_once('@')?;
    if !rest.ends_with(owner_tag()) || rest.len() == owner_tag().len() {
        return None;
    }
    pid.parse().ok()
}

/// Creates an unfinished file and lists it (refused once exit has given up).
fn create_unfinished(path: &Path) -> io::Result<File> {
    let mut u = unfinished();
    if u.abandoned {
        return Err(io::Error::other(format!(
            "cannot create {}: the process is exiting",
            path.display()
        )));
    }
    let file = File::create(path).map_err(|e| with_path(e, path, "create"))?;
    u.paths.push(path.to_path_buf());
    Ok(file)
}

/// Renames a finished temporary file into place (refused once exit has given up, so that a trace
/// cannot appear after [`abandon_unfinished`] said none would).
fn finish_unfinished(tmp: &Path, target: &Path) -> io::Result<()> {
    let mut u = unfinished();
    if u.abandoned {
        return Err(io::Error::other(format!(
            "{} not renamed into place: the process is exiting",
            tmp.display()
        )));
    }
    fs::rename(tmp, target).map_err(|e| with_path(e, target, "rename into"))?;
    u.paths.retain(|p| p != tmp);
    Ok(())
}

/// Removes an unfinished file (if still there) and forgets it.
fn remove_unfinished(path: &Path) {
    let mut u = unfinished();
    if let Some(i) = u.paths.iter().position(|p| p == path) {
        u.paths.swap_remove(i);
        let _ = fs::remove_file(path);
    }
}

/// For process exit when a save in progress cannot be waited for: removes every unfinished file of
/// this process (a spool, the temporary trace being written; removing an open file is fine) and
/// makes every later create or rename fail, so no trace appears after this returns. Returns how
/// many files were removed.
pub fn abandon_unfinished() -> usize {
    let mut u = unfinished();
    u.abandoned = true;
    let paths = std::mem::take(&mut u.paths);
    paths.iter().filter(|p| fs::remove_file(p).is_ok()).count()
}

/// How deep below a trace root [`remove_abandoned`] looks (on-demand captures go to directories
/// under it), and how many directory entries it reads at most: a trace root that turns out to be a
/// large tree costs a bounded walk.
const ABANDONED_DEPTH: usize = 4;
const ABANDONED_ENTRIES: usize = 20_000;

/// Removes the unfinished files that processes of this host (and pid namespace) left in `dir` and
/// the directories below it when they were killed or left with `_exit`: hidden `….tmp` files named
/// by [`KinetoSink`], owned by `uid`, whose pid `is_gone` says has exited. Files of live processes,
/// of other users and of other hosts are left alone; symlinks are not followed. Returns the
/// removed paths.
pub fn remove_abandoned(dir: &Path, uid: u32, is_gone: &dyn Fn(u32) -> bool) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    let mut budget = ABANDONED_ENTRIES;
    let mut todo = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if budget == 0 {
                return removed;
            }
            budget -= 1;
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                if depth < ABANDONED_DEPTH {
                    todo.push((e.path(), depth + 1));
                }
                continue;
            }
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(unfinished_owner_here) else {
                continue;
            };
            if !kind.is_file() || pid == std::process::id() || !is_gone(pid) {
                continue;
            }
            let path = e.path();
            if fs::symlink_metadata(&path).is_ok_and(|m| m.uid() == uid)
                && fs::remove_file(&path).is_ok()
            {
                removed.push(path);
            }
        }
    }
    removed
}

/// Interns a name that arrived as bytes (a C string from a vendor library), replacing invalid UTF-8
/// with U+FFFD so the trace stays valid JSON.
pub fn intern_lossy(bytes: &[u8]) -> NameId {
    kinetrace_core::intern::intern_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn unfinished_names_carry_this_host_and_pid() {
        let name = unfinished_name("host_7.0.events");
        assert!(name.starts_with(".host_7.0.events@"), "{name}");
        assert_eq!(unfinished_owner_here(&name), Some(std::process::id()));
        // Another host's (or another pid namespace's) files are not ours to judge.
        let other = format!(".host_7.0.events@elsewhere@1@{}.tmp", std::process::id());
        assert_eq!(unfinished_owner_here(&other), None);
        assert_eq!(unfinished_owner_here(".trace.json.tmp"), None);
        assert_eq!(unfinished_owner_here("visible.tmp"), None);
    }

    #[test]
    fn only_files_of_gone_processes_of_this_host_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b");
        fs::create_dir_all(&deep).unwrap();
        let tag = owner_tag();
        let dead = |dir: &Path, pid: u32| {
            let p = dir.join(format!(".w_{pid}.1.pt.trace.json{tag}@{pid}.tmp"));
            fs::write(&p, "{").unwrap();
            p
        };
        let gone_top = dead(tmp.path(), 1_000_001);
        let gone_deep = dead(&deep, 1_000_002);
        let alive = dead(tmp.path(), 1_000_003);
        let elsewhere = tmp.path().join(".w.1.events@other-host@1@1000001.tmp");
        fs::write(&elsewhere, "").unwrap();
        let finished = tmp.path().join("w_1000001.1.pt.trace.json");
        fs::write(&finished, "{}").unwrap();
        let uid = fs::metadata(tmp.path()).unwrap().uid();
        // Another user's file is not removed.
        let mut removed = remove_abandoned(tmp.path(), uid.wrapping_add(1), &|_| true);
        assert!(removed.is_empty(), "{removed:?}");
        removed = remove_abandoned(tmp.path(), uid, &|pid| pid != 1_000_003);
        removed.sort();
        let mut want = vec![gone_top.clone(), gone_deep.clone()];
        want.sort();
        assert_eq!(removed, want);
        assert!(!gone_top.exists() && !gone_deep.exists());
        assert!(alive.exists() && elsewhere.exists() && finished.exists());
    }

    #[test]
    fn a_sink_leaves_no_spool_however_it_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = TraceDir::new(tmp.path());
        dir.worker = "w".into();
        let sink = KinetoSink::create(dir.clone(), 0).unwrap();
        let spool = sink.spool_path.clone();
        assert!(spool.exists());
        drop(sink);
        assert!(!spool.exists(), "a dropped sink removes its spool");
        let sink: Box<dyn Sink> = Box::new(KinetoSink::create(dir, 1).unwrap());
        sink.discard();
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
