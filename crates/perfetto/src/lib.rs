/*!
Perfetto's native trace format for Kineto traces: `.pftrace` files (`Trace` = repeated
`TracePacket`) that the Perfetto UI and trace processor load without their JSON importer, which
mis-nests or drops slices that overlap on one thread or stream and struggles with large files.

The design decision: a hand-written encoder of the few messages needed (`TracePacket`,
`TrackDescriptor` with process and thread descriptors, `TrackEvent`, `InternedData`,
`DebugAnnotation`), about 200 lines, instead of a generated schema: the official `perfetto-sdk`
crate builds Perfetto's C library, and the protobuf schema crates are heavy or need `protoc`. Field
numbers are those of `perfetto_trace.proto`; the compatibility test decodes every file with
Perfetto's own Python schema.

Files: `proto.rs` (the encoder and field numbers), `read.rs` (the trace, streamed through
`kinetrace-export`'s reader and its limits, into compact records), `convert.rs` (records →
packets: tracks, lanes for overlapping slices, flows, annotations, counters, memory curves).
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod convert;
pub mod proto;
mod read;

use std::path::Path;

use kinetrace_files::{Dir, Replace};

pub use convert::{convert, convert_reader, ConvertError, Stats};
pub use kinetrace_export::reader::ReadOptions;

/// Reads a Kineto trace (`.json` or `.json.gz`) and writes it as `.pftrace` to `output` (through a
/// temporary file renamed into place; see [`write_output`] for what an existing `output` gets),
/// with the reader's default limits.
pub fn convert_file(input: &Path, output: &Path) -> Result<Stats, ConvertError> {
    convert_file_with(input, output, &ReadOptions::default())
}

/// [`convert_file`] within the reader's limits `read`. The input is streamed (plain or gzip by
/// its first bytes, whatever its name; concatenated gzip members too), never held whole.
pub fn convert_file_with(
    input: &Path,
    output: &Path,
    read: &ReadOptions,
) -> Result<Stats, ConvertError> {
    let err = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        ConvertError(format!("cannot {what} {}: {e}", p.display()))
    };
    let file = std::fs::File::open(input).map_err(|e| err("open", input, &e))?;
    // Errors name the file and the byte offset.
    let (bytes, stats) = convert_reader(input, file, read)?;
    write_output(output, &bytes)?;
    Ok(stats)
}

/// Writes `bytes` to `output` through `kinetrace-files`: its directory (which must exist) is opened
/// once without following another user's symlink, the bytes go to a new 0600 temporary file there,
/// and that is renamed to `output`. An existing `output` is replaced only when it is a regular file
/// of this process's user (running a conversion twice); a symlink or another user's file there is
/// left alone and the conversion fails saying so.
pub fn write_output(output: &Path, bytes: &[u8]) -> Result<(), ConvertError> {
    let fail =
        |e: &dyn std::fmt::Display| ConvertError(format!("cannot write {}: {e}", output.display()));
    let name = output
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| fail(&"the output names no file (or not in UTF-8)"))?;
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = Dir::open(parent).map_err(|e| fail(&e))?;
    kinetrace_files::write_new(&dir, name, bytes, Replace::OwnFile).map_err(|e| fail(&e))?;
    Ok(())
}
