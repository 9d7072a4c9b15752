//! The streaming Kineto writer.
//!
//! Events are serialized as they arrive into a spool file beside the target, so memory does not grow
//! with the trace. When the window ends the header (which needs facts only known then: drop counts,
//! devices) is written to `<target>.tmp`, the spooled events are copied after it, the per-row metadata
//! events and `Record Window End` close the array, and the temporary file is renamed over the target.
//! A crash at any point leaves no half-written trace under the final name.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kinetrace_core::activity::Activity;
use kinetrace_core::intern::NameId;
use kinetrace_core::{Sink, SinkFactory, TraceMeta, TraceOutput, UnixNanos};

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
    fn open(&mut self, cycle: u32) -> io::Result<Box<dyn Sink>> {
        Ok(Box::new(KinetoSink::create(self.clone(), cycle)?))
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
        let spool_path = target.dir.join(format!(
            ".{}.{}.{}.events.tmp",
            target.worker,
            std::process::id(),
            cycle
        ));
        let spool = File::create(&spool_path).map_err(|e| with_path(e, &spool_path, "create"))?;
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
            // A full disk: leave nothing behind.
            let _ = fs::remove_file(&self.spool_path);
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
        let tmp_path = self.target.dir.join(format!(".{name}.tmp"));
        let result = (|| {
            let mut head = Vec::new();
            self.encoder.header(meta, &mut head);
            let mut tail = Vec::new();
            self.encoder
                .footer(meta, &final_path.to_string_lossy(), &mut tail);
            let mut file =
                File::create(&tmp_path).map_err(|e| with_path(e, &tmp_path, "create"))?;
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
            fs::rename(&tmp_path, &final_path).map_err(|e| with_path(e, &final_path, "rename into"))
        })();
        let _ = fs::remove_file(&self.spool_path);
        if result.is_err() {
            let _ = fs::remove_file(&tmp_path);
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
        let path = self.spool_path.clone();
        drop(self);
        let _ = fs::remove_file(path);
    }
}

/// Interns a name that arrived as bytes (a C string from a vendor library), replacing invalid UTF-8
/// with U+FFFD so the trace stays valid JSON.
pub fn intern_lossy(bytes: &[u8]) -> NameId {
    kinetrace_core::intern::intern_bytes(bytes)
}
