//! The streaming Kineto writer.
//!
//! Every byte is written once: when a window opens, the sink creates a hidden temporary file beside
//! the target and writes the document head (what is known then, `distributedInfo` first); events are
//! encoded into 1 MiB buffers that a writer thread writes (or gzips) while the next one fills; when
//! the window ends the metadata events, `]` and the keys known only then (devices, drop counts,
//! metadata) close the document, and the temporary file is renamed into place. A crash or a write
//! error at any point leaves no half-written trace under the final name. Memory stays bounded by
//! the three buffers.
//!
//! Files go through `kinetrace-files`: the directory is opened once per window (or was opened when
//! a request naming it was checked, [`TraceDir::place`]), the temporary file is created new
//! (`O_EXCL|O_NOFOLLOW`, mode 0600, a random part in its name) relative to it, and the finished
//! file is published with `renameat2(RENAME_NOREPLACE)`: a symlink or file planted in a shared
//! directory is never written through or replaced.
//!
//! Unfinished files are hidden (`.` first) and their names end with
//! `@{host}@{pid namespace}@{pid}.tmp` (the random part comes before it), so that what a killed process left can be told apart from a
//! live one's, even in a trace directory shared over NFS by several nodes: [`remove_abandoned`]
//! removes only files of this host (and pid namespace) whose process is gone. The files a process
//! has open are also listed here, so that an exit that cannot wait for a save can remove them
//! ([`abandon_unfinished`]).
//!
//! The finished file is not fsynced before the rename, as Kineto does not: a crash of the process
//! cannot expose a partial file (the rename comes after the last write), and durability against a
//! power loss is not worth making every save (and an exit that waits for one) wait for the disk.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use kinetrace_core::activity::Activity;
use kinetrace_core::intern::NameId;
use kinetrace_core::{Sink, SinkFactory, TraceMeta, TraceOutput, UnixNanos, WindowInfo};
use kinetrace_files::{Dir, Place, Replace, Temp};

pub use crate::encoder::TraceEncoder;

/// Kineto's "3-month" bucket for `baseTimeNanoseconds`: 3 × 2,629,746 s.
pub const BASE_TIME_BUCKET_NS: u64 = 7_889_238_000_000_000;

/// Encoded bytes are written out once this many have gathered: large enough that a write costs
/// little per event, small enough to bound memory (a buffer holds at most this plus one event).
const WRITE_AT: usize = 1 << 20;

/// A buffer's capacity: room for the last event that crosses [`WRITE_AT`] without growing.
const BUFFER_CAPACITY: usize = WRITE_AT + (64 << 10);

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

/// What a trace's head needs from `meta`, for traces rendered after the fact.
pub fn window_of(meta: &TraceMeta) -> WindowInfo {
    WindowInfo {
        cycle: meta.cycle,
        rank: meta.rank,
        world_size: meta.world_size,
        pid: meta.pid,
        host_name: meta.host_name.clone(),
        devices: meta.devices.clone(),
        ..Default::default()
    }
}

/// Renders a whole trace in memory (for tests, golden files and small exports).
pub fn render_trace(
    meta: &TraceMeta,
    activities: &[Activity],
    base_ns: u64,
    trace_name: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = TraceEncoder::begin(&window_of(meta), base_ns, &mut out);
    for a in activities {
        enc.event(a, &mut out);
    }
    enc.finish(meta, trace_name, &mut out);
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
    /// The finished file's exact name in `dir`, instead of `{worker}.{time_ns}.pt.trace.json[.gz]`
    /// (a name a requester chose, such as dynolog's `x_<pid>.json`). An existing file of that name
    /// is replaced only if this process published it; anything else there is left alone and the
    /// trace fails with an error that says so.
    pub file_name: Option<String>,
    /// `dir` as checked when a request named it (opened then, made below that when a window
    /// opens): `kinetrace trigger --out`, a dynolog request. None: `dir` is a path the user named,
    /// opened (and made where missing) when each window opens.
    pub place: Option<Place>,
}

impl TraceDir {
    /// A trace directory with the default worker name.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TraceDir {
            dir: dir.into(),
            worker: default_worker_name(),
            gzip: false,
            file_name: None,
            place: None,
        }
    }

    /// A trace directory checked when a request named it: files go below the directories opened
    /// then, whatever happens to the path meanwhile.
    pub fn at(place: Place) -> Self {
        let mut t = TraceDir::new(place.path());
        t.place = Some(place);
        t
    }

    /// The directory, opened now (and made where missing): see [`kinetrace_files::Dir`] for the
    /// rules on symlinks.
    pub fn open_dir(&self) -> io::Result<Arc<Dir>> {
        match &self.place {
            Some(p) => p.open(),
            None => Dir::create_all(&self.dir),
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
        Ok(Box::new(KinetoSink::create(self.clone(), window)?))
    }
}

/// Where the encoded bytes go: the temporary file, through gzip if asked.
enum Output {
    Plain(File),
    Gzip(Box<flate2::write::GzEncoder<BufWriter<File>>>),
    /// Fails every write after `budget` bytes, as a full disk does (tests only).
    #[cfg(test)]
    Failing {
        file: File,
        budget: usize,
    },
}

impl Output {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::Plain(f) => f.write_all(bytes),
            Output::Gzip(g) => g.write_all(bytes),
            #[cfg(test)]
            Output::Failing { file, budget } => {
                if bytes.len() > *budget {
                    return Err(io::Error::from_raw_os_error(28)); // ENOSPC
                }
                *budget -= bytes.len();
                file.write_all(bytes)
            }
        }
    }

    /// Completes the stream (the gzip trailer) and closes the file.
    fn finish(self) -> io::Result<()> {
        match self {
            Output::Plain(_) => Ok(()),
            Output::Gzip(g) => g.finish()?.flush(),
            #[cfg(test)]
            Output::Failing { .. } => Ok(()),
        }
    }
}

/// Buffers per sink: one filling, the others queued for or being written by the writer thread.
/// Bounds the memory a window's trace takes to this many times [`WRITE_AT`] (plus one event each).
const BUFFERS: usize = 3;

/// How full buffers reach the file.
enum Sending {
    /// A writer thread writes them while the next one fills, so encoding and the kernel's copy into
    /// the page cache (or compression) overlap.
    Thread(WriterThread),
    /// Written by the caller, when no thread could be started.
    Inline(Output),
}

/// The writer thread's ends of two bounded queues: full buffers go to it in order, and each comes
/// back empty once written (or the write error comes back instead). The filling side waits for an
/// empty buffer before handing a full one over, so at most [`BUFFERS`] exist.
struct WriterThread {
    full: SyncSender<Vec<u8>>,
    empty: Receiver<io::Result<Vec<u8>>>,
    handle: JoinHandle<io::Result<()>>,
}

impl WriterThread {
    /// Starts the thread writing to `out`, or gives `out` back if no thread can be started.
    fn start(out: Output) -> Result<Self, Output> {
        let (full, full_rx) = mpsc::sync_channel::<Vec<u8>>(BUFFERS);
        let (empty_tx, empty) = mpsc::sync_channel(BUFFERS);
        for _ in 1..BUFFERS {
            // Cannot fail: the queue has room for every buffer and its receiver is here.
            let _ = empty_tx.send(Ok(Vec::with_capacity(BUFFER_CAPACITY)));
        }
        // `out` is handed over once the thread runs, so that a failed start keeps it.
        let (out_tx, out_rx) = mpsc::sync_channel::<Output>(1);
        let spawned = std::thread::Builder::new()
            .name("kinetrace-writer".into())
            .spawn(move || match out_rx.recv() {
                Ok(out) => write_buffers(out, full_rx, empty_tx),
                Err(_) => Ok(()),
            });
        let Ok(handle) = spawned else {
            return Err(out);
        };
        if let Err(mpsc::SendError(out)) = out_tx.send(out) {
            return Err(out);
        }
        Ok(WriterThread {
            full,
            empty,
            handle,
        })
    }

    /// Hands `buf` over to be written and puts an empty buffer in its place.
    fn hand_off(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        let empty = match self.empty.recv() {
            Ok(r) => r?,
            Err(_) => return Err(self.stopped()),
        };
        let full = std::mem::replace(buf, empty);
        self.full.send(full).map_err(|_| self.stopped())
    }

    /// Why the thread is gone: the write error it sent, if it got that far.
    fn stopped(&self) -> io::Error {
        self.empty
            .try_iter()
            .find_map(Result::err)
            .unwrap_or_else(|| io::Error::other("the trace writer thread stopped"))
    }

    /// Waits until everything handed over is written and the file is complete and closed.
    fn finish(self) -> io::Result<()> {
        // Closing the queue ends the thread once it has written what is queued.
        drop(self.full);
        match self.handle.join() {
            Ok(r) => r,
            Err(_) => Err(io::Error::other("the trace writer thread panicked")),
        }
    }
}

/// The writer thread: writes each full buffer, sends it back empty, and completes the file when the
/// queue closes. A write error is sent back once and ends the thread (the sink then gives up).
fn write_buffers(
    mut out: Output,
    full: Receiver<Vec<u8>>,
    empty: SyncSender<io::Result<Vec<u8>>>,
) -> io::Result<()> {
    for mut buf in full {
        if let Err(e) = out.write_all(&buf) {
            // The receiver may be gone already (a discarded sink): nothing to tell then.
            let _ = empty.send(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
        buf.clear();
        let _ = empty.send(Ok(buf));
    }
    out.finish()
}

/// Gives each sink of this process its own temporary file name (the cycle alone repeats when a
/// profiler is started again).
static SINK_SEQ: AtomicU32 = AtomicU32::new(0);

/// A [`Sink`] that streams one window into a Kineto trace file.
pub struct KinetoSink {
    target: TraceDir,
    /// The unfinished file (removed when dropped, unless published).
    temp: Option<Temp>,
    tmp_path: PathBuf,
    encoder: Option<TraceEncoder>,
    buf: Vec<u8>,
    out: Option<Sending>,
    /// The first write error: later records are refused with it, and `finish` reports it.
    failed: Option<(io::ErrorKind, String)>,
    /// The process that created the sink. A child forked from it holds a copy whose file and
    /// writer thread are the parent's: the copy writes nothing and removes nothing.
    owner: u32,
}

impl KinetoSink {
    /// Creates the temporary file for `window` in `target.dir` (opening the directory, and
    /// creating it where missing), starts its writer thread and writes the trace head.
    pub fn create(target: TraceDir, window: &WindowInfo) -> io::Result<Self> {
        Self::create_with(target, window, true, |out| out)
    }

    /// [`create`](Self::create), with or without a writer thread, and with the output wrapped by
    /// `wrap` (tests put a failing disk there).
    fn create_with(
        target: TraceDir,
        window: &WindowInfo,
        threaded: bool,
        wrap: impl FnOnce(Output) -> Output,
    ) -> io::Result<Self> {
        let dir = target.open_dir()?;
        // Relaxed: only uniqueness matters.
        let seq = SINK_SEQ.fetch_add(1, Ordering::Relaxed);
        let mut stem = format!("{}.{}.{seq}.pt.trace.json", target.worker, window.cycle);
        if target.gzip {
            stem.push_str(".gz");
        }
        let (file, temp) = create_unfinished(&dir, &stem)?;
        let tmp_path = temp.path();
        let out = wrap(if target.gzip {
            Output::Gzip(Box::new(flate2::write::GzEncoder::new(
                BufWriter::with_capacity(256 << 10, file),
                flate2::Compression::fast(),
            )))
        } else {
            Output::Plain(file)
        });
        let out = match threaded {
            true => WriterThread::start(out).map_or_else(Sending::Inline, Sending::Thread),
            false => Sending::Inline(out),
        };
        let mut buf = Vec::with_capacity(BUFFER_CAPACITY);
        let encoder = TraceEncoder::begin(window, process_base_time_ns(), &mut buf);
        let mut sink = KinetoSink {
            target,
            temp: Some(temp),
            tmp_path,
            encoder: Some(encoder),
            buf,
            out: Some(out),
            failed: None,
            owner: std::process::id(),
        };
        // The head goes out at once: the unfinished file starts as the trace will (the rank first).
        sink.write_buf()?;
        Ok(sink)
    }

    /// Sends the buffer to the file. After a failure the temporary file is removed at once (a full
    /// disk gets its space back), and the error is kept for every later call.
    fn write_buf(&mut self) -> io::Result<()> {
        if self.failed.is_some() {
            return Err(self.error());
        }
        if std::process::id() != self.owner {
            // Checked here, once a buffer, rather than per record. Waiting on the parent's thread
            // would hang; writing to the shared file would corrupt the parent's trace.
            let e = io::Error::other(format!(
                "this process was forked from {} while it wrote {}: the trace is the parent's",
                self.owner,
                self.tmp_path.display()
            ));
            return Err(self.give_up(e));
        }
        let result = match self.out.as_mut() {
            Some(Sending::Thread(w)) => w.hand_off(&mut self.buf),
            Some(Sending::Inline(out)) => {
                let r = out.write_all(&self.buf);
                self.buf.clear();
                r
            }
            None => Ok(()),
        };
        result.map_err(|e| self.fail(e))
    }

    /// Gives up on the trace after `e`: stops the writer, removes the temporary file, and keeps the
    /// error (with the file's name) for every later call.
    fn fail(&mut self, e: io::Error) -> io::Error {
        let e = with_path(e, &self.tmp_path, "write");
        let e = self.give_up(e);
        self.remove_temp();
        e
    }

    /// Removes the unfinished file (if still there) and forgets it.
    fn remove_temp(&mut self) {
        if let Some(t) = self.temp.take() {
            remove_unfinished(t);
        }
    }

    /// Stops the sink for good with `e`, kept for every later call.
    fn give_up(&mut self, e: io::Error) -> io::Error {
        // Dropping the writer closes its queue: its thread ends after the write in progress.
        self.out = None;
        self.encoder = None;
        self.buf = Vec::new();
        self.failed = Some((e.kind(), e.to_string()));
        e
    }

    /// Why nothing more can be written: the write error that stopped the sink.
    fn error(&self) -> io::Error {
        match &self.failed {
            Some((kind, msg)) => io::Error::new(*kind, msg.clone()),
            None => io::Error::other(format!("{} is already finished", self.tmp_path.display())),
        }
    }

    fn publish(mut self, meta: &TraceMeta) -> io::Result<TraceOutput> {
        let Some(encoder) = self.encoder.take() else {
            return Err(self.error());
        };
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let (worker, gzip) = (self.target.worker.clone(), self.target.gzip);
        let auto_name = move |ns: u128| {
            let mut name = format!("{worker}.{ns}.pt.trace.json");
            if gzip {
                name.push_str(".gz");
            }
            name
        };
        let name = match &self.target.file_name {
            Some(n) => n.clone(),
            None => auto_name(now_ns),
        };
        let final_path = self.target.dir.join(&name);
        let events = encoder.events();
        encoder.finish(meta, &final_path.to_string_lossy(), &mut self.buf);
        self.write_buf()?;
        let completed = match self.out.take() {
            Some(Sending::Thread(w)) => w.finish(),
            Some(Sending::Inline(out)) => out.finish(),
            None => Ok(()),
        };
        completed.map_err(|e| self.fail(e))?;
        // Dropping `self` on an error here removes the temporary file.
        let Some(temp) = self.temp.as_mut() else {
            return Err(self.error());
        };
        let published = match &self.target.file_name {
            // A name someone asked for: replaced only if this process published it.
            Some(n) => finish_unfinished(temp, n, Replace::PublishedHere),
            None => {
                // Never replaced: a name taken (planted by someone who guessed the time) moves the
                // trace to the next nanosecond's name.
                let mut r = finish_unfinished(temp, &name, Replace::Never);
                let mut ns = now_ns;
                for _ in 0..PUBLISH_TRIES {
                    match &r {
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        _ => break,
                    }
                    ns += 1;
                    r = finish_unfinished(temp, &auto_name(ns), Replace::Never);
                }
                r
            }
        };
        let final_path = published?;
        self.temp = None;
        Ok(TraceOutput {
            path: Some(final_path),
            events,
            cycle: meta.cycle,
        })
    }
}

fn with_path(e: io::Error, path: &Path, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
}

impl Sink for KinetoSink {
    #[inline]
    fn record(&mut self, activity: &Activity) -> io::Result<()> {
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(self.error());
        };
        encoder.event(activity, &mut self.buf);
        if self.buf.len() >= WRITE_AT {
            self.write_buf()?;
        }
        Ok(())
    }

    fn finish(self: Box<Self>, meta: &TraceMeta) -> io::Result<TraceOutput> {
        self.publish(meta)
    }

    fn discard(self: Box<Self>) {
        // Dropping removes the temporary file.
        drop(self);
    }
}

impl Drop for KinetoSink {
    fn drop(&mut self) {
        // However the sink ends (discarded, failed, dropped while unwinding), its unfinished file
        // goes; a published one is no longer listed, so this leaves it alone. A forked child's copy
        // leaves the parent's file alone.
        if std::process::id() == self.owner {
            self.remove_temp();
        } else if let Some(t) = self.temp.take() {
            // The parent's file: left alone, its handle forgotten (two descriptors stay open in
            // this copy, as the file's own does).
            std::mem::forget(t);
        }
    }
}

/// How many other automatic names publishing tries when the first is taken.
const PUBLISH_TRIES: usize = 8;

/// This process's unfinished files (directory and name), and whether exit gave up on them.
struct Unfinished {
    abandoned: bool,
    files: Vec<(Arc<Dir>, String)>,
}

static UNFINISHED: Mutex<Unfinished> = Mutex::new(Unfinished {
    abandoned: false,
    files: Vec::new(),
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
/// Sinks put a random part at the end of `stem`, so the name cannot be guessed ahead.
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

/// Creates an unfinished file `.{stem}.{random}@{host}@{pid namespace}@{pid}.tmp` in `dir` and
/// lists it (refused once exit has given up).
fn create_unfinished(dir: &Arc<Dir>, stem: &str) -> io::Result<(File, Temp)> {
    let mut u = unfinished();
    if u.abandoned {
        return Err(io::Error::other(format!(
            "cannot create a trace in {}: the process is exiting",
            dir.path().display()
        )));
    }
    let (file, temp) = dir.create_temp(|r| unfinished_name(&format!("{stem}.{r}")))?;
    u.files.push((dir.clone(), temp.name().to_string()));
    Ok((file, temp))
}

/// Publishes a finished temporary file as `name` (refused once exit has given up, so that a trace
/// cannot appear after [`abandon_unfinished`] said none would). On failure the file stays listed.
fn finish_unfinished(temp: &mut Temp, name: &str, replace: Replace) -> io::Result<PathBuf> {
    let mut u = unfinished();
    if u.abandoned {
        return Err(io::Error::other(format!(
            "{} not renamed into place: the process is exiting",
            temp.path().display()
        )));
    }
    let path = temp.publish(name, replace)?;
    forget(&mut u, temp);
    Ok(path)
}

fn forget(u: &mut Unfinished, temp: &Temp) {
    if let Some(i) = u
        .files
        .iter()
        .position(|(d, n)| Arc::ptr_eq(d, temp.dir()) && n == temp.name())
    {
        u.files.swap_remove(i);
    }
}

/// Removes an unfinished file (if still there) and forgets it.
fn remove_unfinished(temp: Temp) {
    let mut u = unfinished();
    forget(&mut u, &temp);
    temp.discard();
}

/// For process exit when a save in progress cannot be waited for: removes every unfinished file of
/// this process (the temporary traces being written; removing an open file is fine) and
/// makes every later create or rename fail, so no trace appears after this returns. Returns how
/// many files were removed.
pub fn abandon_unfinished() -> usize {
    let mut u = unfinished();
    u.abandoned = true;
    let files = std::mem::take(&mut u.files);
    files.iter().filter(|(d, n)| d.remove(n).is_ok()).count()
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
    fn a_sink_leaves_no_unfinished_file_however_it_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = TraceDir::new(tmp.path());
        dir.worker = "w".into();
        let sink = KinetoSink::create(dir.clone(), &WindowInfo::default()).unwrap();
        let unfinished = sink.tmp_path.clone();
        assert!(unfinished.exists());
        // Private until published, and not guessable.
        assert_eq!(fs::metadata(&unfinished).unwrap().mode() & 0o777, 0o600);
        assert_eq!(
            unfinished_owner_here(&unfinished.file_name().unwrap().to_string_lossy()),
            Some(std::process::id())
        );
        drop(sink);
        assert!(!unfinished.exists(), "a dropped sink removes its file");
        let sink: Box<dyn Sink> =
            Box::new(KinetoSink::create(dir, &WindowInfo::default()).unwrap());
        sink.discard();
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
    #[test]
    fn a_planted_final_name_is_neither_followed_nor_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, "secret").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
        let out = tmp.path().join("out");
        fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&victim, out.join("x_1.json")).unwrap();
        let mut target = TraceDir::new(&out);
        target.file_name = Some("x_1.json".into());
        let sink = KinetoSink::create(target.clone(), &WindowInfo::default()).unwrap();
        let e = Box::new(sink).finish(&TraceMeta::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert!(e.to_string().contains("not replaced"), "{e}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "secret");
        assert_eq!(fs::metadata(&victim).unwrap().mode() & 0o777, 0o600);
        // Only the planted link is left: the unfinished file went with the failed sink.
        assert_eq!(fs::read_dir(&out).unwrap().count(), 1);
        // A name this process published itself is replaced by the next trace of that name.
        target.file_name = Some("y_1.json".into());
        for _ in 0..2 {
            let sink = KinetoSink::create(target.clone(), &WindowInfo::default()).unwrap();
            Box::new(sink).finish(&TraceMeta::default()).unwrap();
        }
        assert_eq!(fs::read_dir(&out).unwrap().count(), 2);
    }
}

#[cfg(test)]
mod single_pass_tests {
    use super::*;
    use kinetrace_core::activity::{CpuSpan, Detail};
    use std::os::unix::fs::MetadataExt;

    fn hidden(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_file_written_while_recording_is_the_one_renamed_into_place() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = TraceDir::new(tmp.path());
        dir.worker = "w".into();
        let window = WindowInfo {
            rank: Some(3),
            world_size: Some(4),
            ..Default::default()
        };
        let mut sink = KinetoSink::create(dir, &window).unwrap();
        let name = kinetrace_core::intern("aten::mm");
        // Far more than any write buffer holds, so bytes reach the disk before the window ends.
        for i in 0..50_000u64 {
            let a = Activity {
                start: UnixNanos(1_790_857_026_000_000_000 + i * 1000),
                end: UnixNanos(1_790_857_026_000_000_000 + i * 1000 + 500),
                correlation: None,
                external_id: Some(i),
                detail: Detail::CpuOp(CpuSpan {
                    name,
                    pid: 1,
                    tid: 2,
                    args: Default::default(),
                }),
            };
            sink.record(&a).unwrap();
        }
        // One unfinished file, and it starts as the finished trace starts: the head went first.
        let files = hidden(tmp.path());
        assert_eq!(files.len(), 1, "{files:?}");
        let so_far = fs::read(&files[0]).unwrap();
        let want_head =
            b"{\n  \"schemaVersion\": 1,\n  \"distributedInfo\": {\"rank\": 3, \"world_size\": 4},";
        assert!(
            so_far.starts_with(want_head),
            "the unfinished file starts with {:?}",
            String::from_utf8_lossy(&so_far[..so_far.len().min(120)])
        );
        let inode = fs::metadata(&files[0]).unwrap().ino();
        let meta = TraceMeta {
            rank: Some(3),
            world_size: Some(4),
            ..Default::default()
        };
        let out = Box::new(sink).finish(&meta).unwrap();
        let path = out.path.unwrap();
        // Renamed, not copied: the finished trace is the very file the events streamed into.
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
        let done = fs::read(&path).unwrap();
        assert!(done.starts_with(&so_far));
        let v: serde_json::Value = serde_json::from_slice(&done).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        assert_eq!(
            events.iter().filter(|e| e["cat"] == "cpu_op").count(),
            50_000
        );
        assert_eq!(events.last().unwrap()["name"], "Record Window End");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    fn cpu_op(i: u64) -> Activity {
        Activity {
            start: UnixNanos(1_790_857_026_000_000_000 + i * 1000),
            end: UnixNanos(1_790_857_026_000_000_000 + i * 1000 + 500),
            correlation: None,
            external_id: Some(i),
            detail: Detail::CpuOp(CpuSpan {
                name: kinetrace_core::intern("aten::mm"),
                pid: 1,
                tid: 2,
                args: Default::default(),
            }),
        }
    }

    /// A sink (with or without its writer thread) whose disk fills up after `budget` bytes.
    fn filling_sink(dir: &Path, budget: usize, threaded: bool) -> io::Result<KinetoSink> {
        let mut target = TraceDir::new(dir);
        target.worker = "w".into();
        let window = WindowInfo::default();
        KinetoSink::create_with(target, &window, threaded, |out| match out {
            Output::Plain(file) => Output::Failing { file, budget },
            other => other,
        })
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }

    #[test]
    fn a_write_error_while_recording_leaves_nothing_and_says_where() {
        for threaded in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let mut sink = filling_sink(tmp.path(), 3 << 20, threaded).unwrap();
            let unfinished = sink.tmp_path.clone();
            let failed = (0..1_000_000u64).find_map(|i| sink.record(&cpu_op(i)).err());
            let e = failed.expect("the disk filled up");
            let msg = e.to_string();
            assert!(msg.contains(&*unfinished.to_string_lossy()), "{msg}");
            assert!(msg.contains("No space left on device"), "{msg}");
            // The space comes back at once, and the sink stays failed.
            assert_eq!(
                entries(tmp.path()),
                Vec::<PathBuf>::new(),
                "threaded: {threaded}"
            );
            assert_eq!(sink.record(&cpu_op(0)).unwrap_err().to_string(), msg);
            let r = Box::new(sink).finish(&TraceMeta::default());
            assert_eq!(r.unwrap_err().to_string(), msg);
            assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
        }
    }

    #[test]
    fn a_write_error_at_the_end_leaves_nothing() {
        for threaded in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let mut sink = filling_sink(tmp.path(), 1000, threaded).unwrap();
            for i in 0..10 {
                sink.record(&cpu_op(i)).unwrap();
            }
            let e = Box::new(sink)
                .finish(&TraceMeta::default())
                .expect_err("the tail does not fit");
            assert!(e.to_string().starts_with("cannot write "), "{e}");
            assert_eq!(
                entries(tmp.path()),
                Vec::<PathBuf>::new(),
                "threaded: {threaded}"
            );
        }
    }

    #[test]
    fn no_room_for_the_head_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        // Written here, the head fails at once.
        let e = filling_sink(tmp.path(), 0, false).err().expect("no room");
        assert!(e.to_string().starts_with("cannot write "), "{e}");
        assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
        // Written by the thread, the failure comes back at the next hand-over: here the end.
        let sink = filling_sink(tmp.path(), 0, true).unwrap();
        let e = Box::new(sink).finish(&TraceMeta::default()).unwrap_err();
        assert!(e.to_string().starts_with("cannot write "), "{e}");
        assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_forked_copy_writes_nothing_and_leaves_the_parents_file() {
        for threaded in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let mut target = TraceDir::new(tmp.path());
            target.worker = "w".into();
            let window = WindowInfo::default();
            let mut sink = KinetoSink::create_with(target, &window, threaded, |o| o).unwrap();
            let unfinished = sink.tmp_path.clone();
            // As a child forked from the creator sees its copy.
            sink.owner = std::process::id().wrapping_add(1);
            let failed = (0..1_000_000u64).find_map(|i| sink.record(&cpu_op(i)).err());
            let e = failed.expect("refused at the first full buffer");
            assert!(e.to_string().contains("forked"), "{e}");
            assert!(Box::new(sink).finish(&TraceMeta::default()).is_err());
            // The parent's unfinished file is still there and holds only what the parent wrote:
            // the head (its writer thread may still be writing it, hence the wait).
            let mut head = Vec::new();
            let _ = TraceEncoder::begin(&window, process_base_time_ns(), &mut head);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let got = fs::read(&unfinished).unwrap();
                if got == head {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "threaded: {threaded}: the file holds {:?}",
                    String::from_utf8_lossy(&got)
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }

    #[test]
    fn without_a_writer_thread_the_trace_is_the_same() {
        let tmp = tempfile::tempdir().unwrap();
        let mut texts = Vec::new();
        for threaded in [true, false] {
            let mut target = TraceDir::new(tmp.path());
            target.worker = format!("w{threaded}");
            let window = WindowInfo {
                rank: Some(1),
                ..Default::default()
            };
            let mut sink = KinetoSink::create_with(target, &window, threaded, |o| o).unwrap();
            for i in 0..20_000 {
                sink.record(&cpu_op(i)).unwrap();
            }
            let path = Box::new(sink)
                .finish(&TraceMeta::default())
                .unwrap()
                .path
                .unwrap();
            let text = fs::read_to_string(&path).unwrap();
            // Only `traceName` (the file's own name) differs.
            texts.push(text.replace(&*path.to_string_lossy(), "NAME"));
        }
        assert_eq!(texts[0], texts[1]);
        serde_json::from_str::<serde_json::Value>(&texts[0]).unwrap();
    }

    #[test]
    fn a_gzip_trace_streams_through_the_encoder_with_the_rank_first() {
        let tmp = tempfile::tempdir().unwrap();
        let mut target = TraceDir::new(tmp.path());
        target.worker = "w".into();
        target.gzip = true;
        let window = WindowInfo {
            rank: Some(5),
            world_size: Some(8),
            ..Default::default()
        };
        let mut sink = KinetoSink::create(target, &window).unwrap();
        for i in 0..30_000 {
            sink.record(&cpu_op(i)).unwrap();
        }
        let meta = TraceMeta {
            rank: Some(5),
            world_size: Some(8),
            ..Default::default()
        };
        let path = Box::new(sink).finish(&meta).unwrap().path.unwrap();
        assert!(
            path.to_string_lossy().ends_with(".pt.trace.json.gz"),
            "{path:?}"
        );
        let mut text = String::new();
        io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(File::open(&path).unwrap()),
            &mut text,
        )
        .unwrap();
        // HTA reads gzip traces line by line for `"rank": N`.
        let third = text.lines().nth(2).unwrap();
        assert_eq!(
            third,
            "  \"distributedInfo\": {\"rank\": 5, \"world_size\": 8},"
        );
        let trace = crate::read_trace(&path).unwrap();
        assert_eq!((trace.rank, trace.world_size), (Some(5), Some(8)));
        let cpu_op = |e: &&crate::TraceEvent| e.cat.is_some_and(|c| trace.str(c) == "cpu_op");
        let ops = trace.events.iter().filter(cpu_op);
        assert_eq!(ops.count(), 30_000);
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}
