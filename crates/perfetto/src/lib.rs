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

use std::io::{Read, Write};
use std::path::Path;

pub use convert::{convert, ConvertError, Stats};

/// Reads a Kineto trace (`.json` or `.json.gz`) and writes it as `.pftrace` to `output` (through a
/// temporary file renamed into place).
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
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = output.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.flush()?;
        std::fs::rename(&tmp, output)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err("write", output, &e)
    })?;
    Ok(stats)
}
