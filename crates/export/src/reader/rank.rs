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
/// an `i64` and an unreadable file give `None` (HTA would raise), and invalid UTF-8 does not
/// stop the search.
pub fn rank_like_hta(path: &Path) -> Option<i64> {
    rank_like_hta_from_reader(File::open(path).ok()?)
}

/// [`rank_like_hta`] over any byte stream, plain or gzip (by magic bytes).
pub fn rank_like_hta_from_reader<R: Read>(reader: R) -> Option<i64> {
    let (source, gzip) = decoded_stream(reader).ok()??;
    let mut lines = BufReader::with_capacity(64 * 1024, source);
    let mut line = Vec::new();
    loop {
        line.clear();
        // A read error part-way (truncated gzip) ends the search, as HTA's exception would.
        match lines.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if gzip {
            if let Some(rank) = find_rank(&line) {
                return rank;
            }
        } else {
            for segment in line.split(|&b| b == b'\r') {
                if let Some(rank) = find_rank(segment) {
                    return rank;
                }
            }
        }
    }
}

/// The first match of `"rank":\s+(\d+)` in one line: `Some(parsed)` on a match (`Some(None)`
/// when the digits overflow an `i64`), `None` when there is no match.
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
