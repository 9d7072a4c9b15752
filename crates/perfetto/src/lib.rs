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

Files: `proto.rs` (the encoder and field numbers), `convert.rs` (Kineto JSON → packets: tracks,
lanes for overlapping slices, flows, annotations, counters).
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod convert;
pub mod proto;

use std::io::Read;
use std::path::Path;

use kinetrace_files::{Dir, Replace};

pub use convert::{convert, ConvertError, Stats};

/// Reads a Kineto trace (`.json` or `.json.gz`) and writes it as `.pftrace` to `output` (through a
/// temporary file renamed into place; see [`write_output`] for what an existing `output` gets).
pub fn convert_file(input: &Path, output: &Path) -> Result<Stats, ConvertError> {
    let err = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        ConvertError(format!("cannot {what} {}: {e}", p.display()))
    };
    let file = std::fs::File::open(input).map_err(|e| err("open", input, &e))?;
    let mut text = Vec::new();
    let gz = input.extension().is_some_and(|x| x == "gz");
    let read = if gz {
        flate2::read::GzDecoder::new(file).read_to_end(&mut text)
    } else {
        std::io::BufReader::new(file).read_to_end(&mut text)
    };
    read.map_err(|e| err("read", input, &e))?;
    let (bytes, stats) =
        convert(&text).map_err(|e| ConvertError(format!("{}: {e}", input.display())))?;
    drop(text);
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
