//! The wire protocol: one request line and one or two reply lines, each a verb followed by
//! space-separated `key=value` fields, values percent-encoded.
//!
//! ```text
//! → capture steps=3 out=run2 wait=1          (or duration_ms=500, delay_ms=, start_step=)
//! ← accepted pid=4242 dir=/traces/run2 plan=steps:11-13
//! ← done pid=4242 path=/traces/run2/host_4242.1700000000.pt.trace.json events=5120
//! → status
//! ← status pid=4242 step=10 action=NONE capture=none traces=0
//! ← refused pid=4242 reason=busy:%20...
//! → dump                                     (the flight recorder writes its span)
//! ← accepted pid=4242 dir=/traces
//! ```

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use kinetrace::CaptureLength;

/// Why a request line cannot be served (sent back as a `refused` reply's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// Not `verb key=value...` with valid percent-encoding.
    NotARequestLine,
    /// A numeric field is not an integer.
    NotAnInteger {
        /// The field.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// `steps=` does not fit 32 bits.
    StepsTooLarge,
    /// Neither or both of `steps=` and `duration_ms=`.
    LengthNotOne,
    /// A verb other than `capture` and `status`.
    UnknownRequest(String),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::NotARequestLine => f.write_str("not a request line"),
            ProtocolError::NotAnInteger { key, value } => {
                write!(f, "{key}=`{value}` is not an integer")
            }
            ProtocolError::StepsTooLarge => f.write_str("steps is too large"),
            ProtocolError::LengthNotOne => {
                f.write_str("give exactly one of steps= and duration_ms=")
            }
            ProtocolError::UnknownRequest(verb) => write!(f, "unknown request `{verb}`"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// A request line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Capture now.
    Capture(CaptureSpec),
    /// Report the process's state.
    Status,
    /// Write a flight-recorder dump now (`kinetrace trigger --dump`).
    Dump,
}

/// What to capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSpec {
    /// Steps or wall time.
    pub length: CaptureLength,
    /// Start at this step (steps) instead of the next one.
    pub start_step: Option<u64>,
    /// Start after this delay (time).
    pub delay: Option<Duration>,
    /// A directory under the trace root (relative to it, or absolute inside it).
    pub out: Option<PathBuf>,
    /// Keep the connection open and send `done`/`failed` when the trace is written.
    pub wait: bool,
}

/// A reply line: a verb and its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// `accepted`, `refused`, `done`, `failed` or `status`.
    pub verb: String,
    /// The fields, in order.
    pub fields: Vec<(String, String)>,
}

impl Reply {
    /// A reply with `verb` and `fields`.
    pub fn new(verb: &str, fields: &[(&str, &str)]) -> Reply {
        Reply {
            verb: verb.to_string(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The value of field `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The wire form (without the newline).
    pub fn encode(&self) -> String {
        encode_line(&self.verb, &self.fields)
    }

    /// Parses a wire line.
    pub fn decode(line: &str) -> Option<Reply> {
        let (verb, fields) = decode_line(line)?;
        Some(Reply { verb, fields })
    }
}

impl Request {
    /// The wire form (without the newline).
    pub fn encode(&self) -> String {
        match self {
            Request::Status => "status".into(),
            Request::Dump => "dump".into(),
            Request::Capture(c) => {
                let mut f: Vec<(String, String)> = Vec::new();
                match c.length {
                    CaptureLength::Steps(n) => f.push(("steps".into(), n.to_string())),
                    CaptureLength::Duration(d) => {
                        f.push(("duration_ms".into(), d.as_millis().to_string()))
                    }
                }
                if let Some(s) = c.start_step {
                    f.push(("start_step".into(), s.to_string()));
                }
                if let Some(d) = c.delay {
                    f.push(("delay_ms".into(), d.as_millis().to_string()));
                }
                if let Some(o) = &c.out {
                    f.push(("out".into(), o.to_string_lossy().into_owned()));
                }
                if c.wait {
                    f.push(("wait".into(), "1".into()));
                }
                encode_line("capture", &f)
            }
        }
    }

    /// Parses a wire line; the error says what is wrong.
    pub fn decode(line: &str) -> Result<Request, ProtocolError> {
        let (verb, fields) = decode_line(line).ok_or(ProtocolError::NotARequestLine)?;
        let get = |k: &str| fields.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        let num = |k: &'static str| -> Result<Option<u64>, ProtocolError> {
            get(k)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| ProtocolError::NotAnInteger {
                        key: k,
                        value: v.to_string(),
                    })
                })
                .transpose()
        };
        match verb.as_str() {
            "status" => Ok(Request::Status),
            "dump" => Ok(Request::Dump),
            "capture" => {
                let length = match (num("steps")?, num("duration_ms")?) {
                    (Some(n), None) => CaptureLength::Steps(
                        u32::try_from(n).map_err(|_| ProtocolError::StepsTooLarge)?,
                    ),
                    (None, Some(ms)) => CaptureLength::Duration(Duration::from_millis(ms)),
                    _ => return Err(ProtocolError::LengthNotOne),
                };
                Ok(Request::Capture(CaptureSpec {
                    length,
                    start_step: num("start_step")?,
                    delay: num("delay_ms")?.map(Duration::from_millis),
                    out: get("out").map(PathBuf::from),
                    wait: get("wait") == Some("1"),
                }))
            }
            other => Err(ProtocolError::UnknownRequest(other.to_string())),
        }
    }
}

fn encode_line(verb: &str, fields: &[(String, String)]) -> String {
    let mut s = verb.to_string();
    for (k, v) in fields {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || b"._/:+,-@".contains(&b) {
                s.push(b as char);
            } else {
                s.push_str(&format!("%{b:02X}"));
            }
        }
    }
    s
}

fn decode_line(line: &str) -> Option<(String, Vec<(String, String)>)> {
    let mut parts = line.split_ascii_whitespace();
    let verb = parts.next()?.to_string();
    let mut fields = Vec::new();
    for p in parts {
        let (k, v) = p.split_once('=')?;
        fields.push((k.to_string(), percent_decode(v)?));
    }
    Some((verb, fields))
}

fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let r = Request::Capture(CaptureSpec {
            length: CaptureLength::Steps(3),
            start_step: Some(10),
            delay: None,
            out: Some(PathBuf::from("run 2/ünï=%")),
            wait: true,
        });
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let r = Request::Capture(CaptureSpec {
            length: CaptureLength::Duration(Duration::from_millis(500)),
            start_step: None,
            delay: Some(Duration::from_secs(1)),
            out: None,
            wait: false,
        });
        assert_eq!(r.encode(), "capture duration_ms=500 delay_ms=1000");
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        assert_eq!(Request::decode("status").unwrap(), Request::Status);
        assert_eq!(
            Request::decode(&Request::Dump.encode()).unwrap(),
            Request::Dump
        );
        assert_eq!(
            Request::decode("capture steps=1 duration_ms=3").unwrap_err(),
            ProtocolError::LengthNotOne
        );
        assert!(Request::decode("capture").is_err());
        assert_eq!(
            Request::decode("rm -rf").unwrap_err().to_string(),
            "not a request line"
        );
        assert_eq!(
            Request::decode("capture steps=x").unwrap_err().to_string(),
            "steps=`x` is not an integer"
        );
        let reply = Reply::new("refused", &[("pid", "1"), ("reason", "busy: a b\nc")]);
        assert_eq!(Reply::decode(&reply.encode()).unwrap(), reply);
        assert!(!reply.encode().contains('\n'));
    }
}
