//! HolisticTraceAnalysis's rank discovery, copied.

use super::*;

/// The rank HolisticTraceAnalysis would assign to this file, or `None` where HTA falls back to
/// rank 0 (with a warning).
///
/// HTA (`create_rank_to_trace_dict`) reads the file line by line and takes the first match of
/// the regex `"rank":\s+(\d+)`: there must be at least one whitespace character after the colon,
/// so compact `"rank":1` is not found, and a negative rank does not match. This copies it:
/// gzip input (detected by magic bytes here; HTA goes by the `.gz` name) is split into lines at
/// `\n` only, plain input at `\n`, `\r` and `\r\n` (Python's text mode); `\s` is Python's
/// Unicode whitespace. Differences: only ASCII digits count as `\d`, a rank that does not fit in
/// an `i64` and an unreadable file give `None` (HTA would raise), invalid UTF-8 does not stop the
/// search, and a read error (truncated gzip) ends it with `None` unless a match was read before.
///
/// The search streams: a match is found across read boundaries by a small state machine, and
/// no line is ever held, so a file that is one long line (or a gzip bomb of whitespace) costs a
/// 64 KiB buffer, not the line.
pub fn rank_like_hta(path: &Path) -> Option<i64> {
    rank_like_hta_from_reader(File::open(path).ok()?)
}

/// [`rank_like_hta`] over any byte stream, plain or gzip (by magic bytes).
pub fn rank_like_hta_from_reader<R: Read>(reader: R) -> Option<i64> {
    let (mut source, gzip) = decoded_stream(reader).ok()??;
    let mut search = RankSearch::new(gzip);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match source.read(&mut buf) {
            Ok(0) => return search.finish(),
            Ok(n) => {
                if let Some(rank) = search.feed(&buf[..n]) {
                    return rank;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A read error part-way (truncated gzip) ends the search, as HTA's exception would.
            Err(_) => return None,
        }
    }
}

/// `"rank":`, the text the regex starts with.
const KEY: &[u8] = b"\"rank\":";

/// Where [`RankSearch`] is in a possible match.
#[derive(Clone, Copy, Debug)]
enum RankState {
    /// This many bytes of [`KEY`] matched.
    Key(usize),
    /// After the key, in `\s+`: whether a whitespace character was seen, and the bytes so far of
    /// a multi-byte UTF-8 character (`len` of `need`).
    Space {
        seen: bool,
        partial: [u8; 4],
        len: u8,
        need: u8,
    },
    /// In `\d+`: the value so far (`None` once it overflows an `i64`).
    Digits(Option<i64>),
}

/// The first match of `"rank":\s+(\d+)` within one line, found incrementally over a stream.
pub(super) struct RankSearch {
    state: RankState,
    /// Plain input: `\r` ends a line too (Python's universal newlines).
    plain: bool,
}

impl RankSearch {
    pub(super) fn new(gzip: bool) -> RankSearch {
        RankSearch {
            state: RankState::Key(0),
            plain: !gzip,
        }
    }

    /// The end of the input: a match whose digits run to the end counts.
    pub(super) fn finish(&self) -> Option<i64> {
        match self.state {
            RankState::Digits(value) => value,
            _ => None,
        }
    }

    /// Scans `data`; `Some(rank)` once a match ends (`Some(None)` when its digits overflow).
    pub(super) fn feed(&mut self, data: &[u8]) -> Option<Option<i64>> {
        let mut i = 0;
        while i < data.len() {
            if let RankState::Key(0) = self.state {
                // Nothing matched: jump to the next quote.
                match memchr::memchr(b'"', &data[i..]) {
                    Some(k) => i += k,
                    None => return None,
                }
            }
            if let Some(found) = self.step(data[i]) {
                return Some(found);
            }
            i += 1;
        }
        None
    }

    /// One byte; `Some` when it ends a match.
    fn step(&mut self, b: u8) -> Option<Option<i64>> {
        self.state = match self.state {
            RankState::Key(k) => key_step(k, b),
            RankState::Digits(value) => {
                if b.is_ascii_digit() {
                    let d = i64::from(b - b'0');
                    RankState::Digits(value.and_then(|v| v.checked_mul(10)?.checked_add(d)))
                } else {
                    return Some(value);
                }
            }
            RankState::Space {
                seen,
                mut partial,
                len,
                need,
            } => {
                if len > 0 {
                    // Inside a multi-byte character.
                    if b & 0xc0 != 0x80 {
                        // Not a continuation byte: the character is invalid (not whitespace),
                        // and this byte may start a new key.
                        key_step(0, b)
                    } else {
                        partial[len as usize] = b;
                        let len = len + 1;
                        if len < need {
                            RankState::Space {
                                seen,
                                partial,
                                len,
                                need,
                            }
                        } else {
                            match std::str::from_utf8(&partial[..len as usize])
                                .ok()
                                .and_then(|s| s.chars().next())
                            {
                                Some(c) if python_isspace(c) => RankState::Space {
                                    seen: true,
                                    partial,
                                    len: 0,
                                    need: 0,
                                },
                                // None of its bytes is a quote: nothing to restart from.
                                _ => RankState::Key(0),
                            }
                        }
                    }
                } else if b == b'\n' || (self.plain && b == b'\r') {
                    // The line ends before any digit.
                    RankState::Key(0)
                } else if b < 0x80 {
                    if python_isspace(char::from(b)) {
                        RankState::Space {
                            seen: true,
                            partial,
                            len: 0,
                            need: 0,
                        }
                    } else if seen && b.is_ascii_digit() {
                        RankState::Digits(Some(i64::from(b - b'0')))
                    } else {
                        key_step(0, b)
                    }
                } else {
                    let need = match b {
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        0xf0..=0xf7 => 4,
                        _ => 0,
                    };
                    if need == 0 {
                        RankState::Key(0)
                    } else {
                        partial[0] = b;
                        RankState::Space {
                            seen,
                            partial,
                            len: 1,
                            need,
                        }
                    }
                }
            }
        };
        None
    }
}

/// The state after `b` when `k` bytes of [`KEY`] are matched (Knuth–Morris–Pratt: after
/// `"rank"` a mismatch may still leave its last `"` matched).
fn key_step(k: usize, b: u8) -> RankState {
    if b == KEY[k] {
        return if k + 1 == KEY.len() {
            RankState::Space {
                seen: false,
                partial: [0; 4],
                len: 0,
                need: 0,
            }
        } else {
            RankState::Key(k + 1)
        };
    }
    match (k, b) {
        (6, b'r') => RankState::Key(2),
        (_, b'"') => RankState::Key(1),
        _ => RankState::Key(0),
    }
}

/// The first match of `"rank":\s+(\d+)` in one line: `Some(parsed)` on a match (`Some(None)`
/// when the digits overflow an `i64`), `None` when there is no match. The line-by-line search
/// the streaming [`RankSearch`] is checked against.
#[cfg(test)]
pub(super) fn find_rank(line: &[u8]) -> Option<Option<i64>> {
    const KEY: &[u8] = b"\"rank\":";
    let mut from = 0;
    while let Some(i) = find_bytes(&line[from..], KEY) {
        let mut j = from + i + KEY.len();
        let mut spaces = 0;
        while let Some((c, len)) = decode_char(&line[j..]) {
            if !python_isspace(c) {
                break;
            }
            j += len;
            spaces += 1;
        }
        let digits = line[j..].iter().take_while(|b| b.is_ascii_digit()).count();
        if spaces > 0 && digits > 0 {
            let text = std::str::from_utf8(&line[j..j + digits]).ok()?;
            return Some(text.parse::<i64>().ok());
        }
        from += i + 1;
    }
    None
}

#[cfg(test)]
pub(super) fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        let k = hay[i..=hay.len() - needle.len()]
            .iter()
            .position(|&b| b == first)?;
        i += k;
        if hay[i..].starts_with(needle) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The UTF-8 character at the start of `bytes` and its length; `None` at the end or on an
/// invalid sequence.
#[cfg(test)]
pub(super) fn decode_char(bytes: &[u8]) -> Option<(char, usize)> {
    let b0 = *bytes.first()?;
    let len = match b0 {
        0x00..=0x7f => return Some((char::from(b0), 1)),
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return None,
    };
    let s = std::str::from_utf8(bytes.get(..len)?).ok()?;
    s.chars().next().map(|c| (c, len))
}

/// Python's `str.isspace` (what `\s` matches in a `str` regex).
pub(super) fn python_isspace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\x1c'..='\x20'
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}
