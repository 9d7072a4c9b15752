//! dynolog's IPC framing, as libkineto speaks it (`dynolog/src/ipcfabric/FabricManager.h`,
//! `Utils.h`): one datagram is a 40-byte native-endian header `{ size_t size; char type[32]; }`
//! followed by `size` payload bytes. Pure functions over bytes, so they are tested without sockets.

use std::fmt;

/// Bytes in the header: an 8-byte size and a 32-byte NUL-padded type name.
pub const HEADER_LEN: usize = 8 + TYPE_LEN;
/// Bytes of the header's type field.
pub const TYPE_LEN: usize = 32;
/// The message type of a poll and of its reply.
pub const REQ: &str = "req";
/// The `type` bit of a poll asking for activity (trace) requests.
pub const ACTIVITIES: i32 = 2;

/// One datagram: the header, then the payload.
pub fn encode(kind: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u64).to_ne_bytes());
    let mut ty = [0u8; TYPE_LEN];
    // At most 31 bytes: the field is a C string.
    let n = kind.len().min(TYPE_LEN - 1);
    ty[..n].copy_from_slice(&kind.as_bytes()[..n]);
    out.extend_from_slice(&ty);
    out.extend_from_slice(payload);
    out
}

/// A poll's payload, `LibkinetoRequest { int32 type; int32 n; int64 jobid; int32 pids[n]; }`.
pub fn request_payload(kind: i32, job_id: i64, pids: &[i32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 4 * pids.len());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&(pids.len() as i32).to_ne_bytes());
    out.extend_from_slice(&job_id.to_ne_bytes());
    for p in pids {
        out.extend_from_slice(&p.to_ne_bytes());
    }
    out
}

/// Why a datagram is not a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than a header.
    Short(usize),
    /// The header's size disagrees with the bytes that follow it.
    Size {
        /// The header's size field.
        said: u64,
        /// Payload bytes received.
        got: usize,
    },
    /// The type field is not a NUL-terminated name.
    Type,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short(n) => write!(f, "{n} bytes, less than the {HEADER_LEN}-byte header"),
            WireError::Size { said, got } => {
                write!(f, "the header says {said} payload bytes, {got} came")
            }
            WireError::Type => f.write_str("the header's type is not a NUL-terminated name"),
        }
    }
}

impl std::error::Error for WireError {}

/// Splits a datagram into its type name and payload.
pub fn decode(datagram: &[u8]) -> Result<(&str, &[u8]), WireError> {
    if datagram.len() < HEADER_LEN {
        return Err(WireError::Short(datagram.len()));
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&datagram[..8]);
    let said = u64::from_ne_bytes(size);
    let payload = &datagram[HEADER_LEN..];
    if said != payload.len() as u64 {
        return Err(WireError::Size {
            said,
            got: payload.len(),
        });
    }
    let ty = &datagram[8..HEADER_LEN];
    let end = ty.iter().position(|&b| b == 0).ok_or(WireError::Type)?;
    let kind = std::str::from_utf8(&ty[..end]).map_err(|_| WireError::Type)?;
    Ok((kind, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_is_a_40_byte_header_and_the_request_struct() {
        let d = encode(REQ, &request_payload(ACTIVITIES, 42, &[100, 7]));
        assert_eq!(d.len(), 40 + 16 + 8);
        assert_eq!(&d[..8], &24u64.to_ne_bytes());
        assert_eq!(&d[8..12], b"req\0");
        assert!(d[12..40].iter().all(|&b| b == 0));
        assert_eq!(&d[40..44], &2i32.to_ne_bytes());
        assert_eq!(&d[44..48], &2i32.to_ne_bytes());
        assert_eq!(&d[48..56], &42i64.to_ne_bytes());
        assert_eq!(&d[56..60], &100i32.to_ne_bytes());
        assert_eq!(&d[60..64], &7i32.to_ne_bytes());
    }

    #[test]
    fn replies_decode_and_garbage_is_named() {
        let d = encode(REQ, b"A=1\n");
        assert_eq!(decode(&d), Ok(("req", &b"A=1\n"[..])));
        assert_eq!(decode(&encode(REQ, b"")), Ok(("req", &b""[..])));
        assert_eq!(decode(b"hello"), Err(WireError::Short(5)));
        let mut bad = encode(REQ, b"xy");
        bad[0] = 9;
        assert_eq!(decode(&bad), Err(WireError::Size { said: 9, got: 2 }));
        let mut untyped = encode(REQ, b"");
        untyped[8..40].fill(b'a');
        assert_eq!(decode(&untyped), Err(WireError::Type));
    }
}
