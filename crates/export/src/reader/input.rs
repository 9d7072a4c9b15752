//! The byte stream under the parser: gzip detection, the read window, the structural scanner and
//! error positions.

use super::*;

/// Size of the buffer the JSON parser reads from (and of the gzip input buffer).
pub(super) const BUF_SIZE: usize = 256 * 1024;

pub(super) const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

pub(super) type Source<'a> = Box<dyn Read + 'a>;

/// An input whose first bytes were read, put back in front.
pub(super) type Sniffed<R> = io::Chain<io::Take<io::Cursor<[u8; 2]>>, R>;

/// The input with its first bytes read back in front, and whether they are the gzip magic;
/// `None` for an empty input.
pub(super) fn sniff<R: Read>(mut reader: R) -> io::Result<Option<(Sniffed<R>, bool)>> {
    let mut magic = [0u8; 2];
    let mut n = 0;
    while n < magic.len() {
        match reader.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if n == 0 {
        return Ok(None);
    }
    let gzip = magic[..n] == GZIP_MAGIC;
    Ok(Some((
        io::Cursor::new(magic).take(n as u64).chain(reader),
        gzip,
    )))
}

/// The decompressed byte stream and whether it was gzip; `None` for an empty input.
pub(super) fn decoded_stream<'a, R: Read + 'a>(
    reader: R,
) -> io::Result<Option<(Source<'a>, bool)>> {
    Ok(sniff(reader)?.map(|(src, gzip)| -> (Source<'a>, bool) {
        if gzip {
            let decoder = MultiGzDecoder::new(BufReader::with_capacity(BUF_SIZE, src));
            (Box::new(decoder), true)
        } else {
            (Box::new(src), false)
        }
    }))
}

/// Buffers in flight between the inflating thread and the parser: enough that neither waits
/// on the other's jitter, few enough to bound memory (4 × 320 KiB).
const PIPE_BUFFERS: usize = 4;

/// Room the inflating thread leaves at the front of each buffer: the parser moves the unparsed
/// end of its window there and makes the buffer its window, instead of copying every inflated
/// byte out of the pipe (a longer remainder is copied the other way, see [`Input::fill_piped`]).
pub(super) const PIPE_HEAD: usize = 64 * 1024;

/// One message from the inflating thread: a buffer whose data is `buf[PIPE_HEAD..end]` (`end`
/// is less than the buffer's length only at the end of the stream), or the decoder's error.
type Filled = io::Result<(Vec<u8>, usize)>;

/// The parser's end of the inflating pipeline: takes the buffers the inflating thread fills and
/// hands each back once consumed, so the whole run allocates [`PIPE_BUFFERS`] buffers once.
pub(super) struct Piped {
    full: Receiver<Filled>,
    free: SyncSender<Vec<u8>>,
    last: bool,
}

impl Piped {
    /// The next filled buffer and the end of its data (which starts at [`PIPE_HEAD`]); `None`
    /// at the end of the stream (and after an error was returned).
    fn next(&mut self) -> io::Result<Option<(Vec<u8>, usize)>> {
        if self.last {
            return Ok(None);
        }
        match self.full.recv() {
            Ok(Ok((buf, end))) => {
                self.last = end < buf.len();
                Ok(Some((buf, end)))
            }
            Ok(Err(e)) => {
                self.last = true;
                Err(e)
            }
            Err(_) => {
                self.last = true;
                Err(io::Error::other(
                    "the inflating thread stopped before the end of the stream",
                ))
            }
        }
    }

    /// Hands a consumed buffer back to the inflating thread.
    fn give_back(&mut self, buf: Vec<u8>) {
        // Buffers shorter than the head (the window's first, empty one) are of no use there.
        if buf.len() > PIPE_HEAD {
            // The inflating thread may have stopped (error, end); then the buffer is dropped.
            let _ = self.free.try_send(buf);
        }
    }
}

/// The inflating thread's end: fills free buffers from `decoder` until the end of the stream,
/// an error, or the parser hanging up.
pub(super) struct Inflater {
    full: SyncSender<Filled>,
    free: Receiver<Vec<u8>>,
}

impl Inflater {
    pub(super) fn run(self, mut decoder: impl Read) {
        while let Ok(mut buf) = self.free.recv() {
            let mut n = PIPE_HEAD;
            let mut error = None;
            while n < buf.len() {
                match decoder.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            let end = n < buf.len();
            // A short buffer marks the end, so data read before an error goes as a full one.
            if error.is_some() {
                buf.truncate(n);
                if n > PIPE_HEAD && self.full.send(Ok((buf, n))).is_err() {
                    return;
                }
            } else if self.full.send(Ok((buf, n))).is_err() {
                return;
            }
            if let Some(e) = error {
                let _ = self.full.send(Err(e));
                return;
            }
            if end {
                return;
            }
        }
    }
}

/// A connected [`Piped`] / [`Inflater`] pair with its buffers.
pub(super) fn pipeline() -> (Piped, Inflater) {
    let (full_tx, full_rx) = sync_channel(PIPE_BUFFERS);
    let (free_tx, free_rx) = sync_channel(PIPE_BUFFERS);
    for _ in 0..PIPE_BUFFERS {
        let _ = free_tx.send(vec![0; PIPE_HEAD + BUF_SIZE]);
    }
    (
        Piped {
            full: full_rx,
            free: free_tx,
            last: false,
        },
        Inflater {
            full: full_tx,
            free: free_rx,
        },
    )
}

/// The decompressed JSON in a window that always holds the value being parsed whole.
///
/// The parser finds where each JSON value ends with a cheap structural scan (strings, escapes
/// and bracket depth) and then hands exactly that slice to serde_json, whose slice parser is
/// about twice as fast as its `io::Read` one. A value longer than the window grows it; nothing
/// else is kept. A UTF-8 byte-order mark at the very start is skipped (and counted in offsets).
pub(super) struct Input<R> {
    pub(super) inner: R,
    pub(super) buf: Vec<u8>,
    /// Next unparsed byte.
    pub(super) pos: usize,
    /// End of the valid data in `buf`.
    pub(super) end: usize,
    /// Offset of `buf[0]` in the decompressed stream (wrapping: a pipe buffer's head comes
    /// before the stream's first byte).
    pub(super) base: u64,
    pub(super) eof: bool,
    pub(super) started: bool,
    /// The inflating pipeline, read instead of `inner` when present.
    pub(super) piped: Option<Piped>,
    /// The longest value the window may hold ([`ReadOptions::max_value_bytes`]).
    pub(super) max_value: usize,
}

impl<R: Read> Input<R> {
    pub(super) fn new(inner: R, max_value: usize) -> Self {
        Input {
            inner,
            buf: vec![0; BUF_SIZE],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            started: false,
            piped: None,
            max_value,
        }
    }

    /// An input that reads the inflating pipeline's buffers (`inner` is never read).
    pub(super) fn piped(inner: R, piped: Piped, max_value: usize) -> Self {
        Input {
            buf: Vec::new(),
            piped: Some(piped),
            ..Input::new(inner, max_value)
        }
    }

    /// Offset of `buf[pos]`.
    pub(super) fn offset(&self) -> u64 {
        self.base.wrapping_add(self.pos as u64)
    }

    /// Offset just past the data read so far.
    pub(super) fn offset_end(&self) -> u64 {
        self.base.wrapping_add(self.end as u64)
    }

    /// Reads more, keeping `buf[pos..end]` (moved to the front). `false` at the end of input.
    #[cold]
    pub(super) fn fill(&mut self) -> Result<bool, Fail> {
        self.fill_some(1)
    }

    /// [`Input::fill`], reading until at least `min` new bytes are in (or the window is full,
    /// or the input ends): the fast event path restarts an event after a fill, so it asks for
    /// enough that a reader returning a few bytes at a time does not make that quadratic.
    ///
    /// What is kept, `buf[pos..end]`, is always the start of one value that does not end
    /// before its last byte (whitespace is consumed before a fill), so once it is past
    /// [`Input::max_value`] bytes the value is too long: [`Fail::TooLarge`], at the value's
    /// first byte. The window never grows past the limit plus one read, and grows with
    /// `try_reserve` (an allocation that fails is [`Fail::NoMemory`], not an abort).
    #[cold]
    pub(super) fn fill_some(&mut self, min: usize) -> Result<bool, Fail> {
        if self.eof {
            return Ok(false);
        }
        let before = self.end - self.pos;
        if before > self.max_value {
            return Err(Fail::TooLarge {
                at: self.offset(),
                limit: self.max_value,
            });
        }
        // Never more than the value may hold, and one byte to see that it goes on (or where a
        // bare number ends).
        let min = min.min((self.max_value - before).saturating_add(1));
        if self.piped.is_some() {
            return self.fill_piped(min);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base = self.offset();
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.end == self.buf.len() {
            // Here `end` is at most the limit (checked above), so the window grows.
            let len = self.buf.len();
            let grown = len
                .saturating_mul(2)
                .min(self.max_value.saturating_add(1))
                .max(len + 1);
            self.grow(grown)?;
            self.buf.resize(grown, 0);
        }
        // The first fill takes at least 3 bytes (or all there is) to see a BOM.
        let want =
            if self.started { self.end + 1 } else { 3 }.max((self.end + min).min(self.buf.len()));
        let before = self.end;
        while self.end < want {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.skip_bom();
        Ok(self.end > before)
    }

    /// Makes room for `len` bytes in the window (not filled); see [`grow`].
    fn grow(&mut self, len: usize) -> Result<(), Fail> {
        let at = self.offset();
        grow(&mut self.buf, len, self.max_value, at)
    }

    /// On the first data: skips a UTF-8 byte-order mark (still counted in offsets).
    fn skip_bom(&mut self) {
        if !self.started && self.end > self.pos {
            self.started = true;
            if self.buf[self.pos..self.end].starts_with(b"\xEF\xBB\xBF") {
                self.pos += 3;
            }
        }
    }

    /// [`Input::fill_some`] from the inflating pipeline: the next buffer becomes the window, with
    /// the unparsed rest of the current one moved into its head; a rest longer than the head (a
    /// value longer than [`PIPE_HEAD`]) stays and the new data is appended to it instead.
    #[cold]
    fn fill_piped(&mut self, min: usize) -> Result<bool, Fail> {
        let before = self.end - self.pos;
        // As in `fill_some`: the first fill takes at least 3 bytes (or all there is). `min` is
        // only capped by the limit: the fast path asks for as much again as is buffered, so
        // that an event much longer than a buffer is restarted a logarithmic number of times.
        let want = if self.started { before + 1 } else { 3 }.max(before + min);
        while self.end - self.pos < want {
            let keep = self.end - self.pos;
            let offset = self.offset();
            let Some(pipe) = self.piped.as_mut() else {
                break;
            };
            let Some((mut next, end)) = pipe.next()? else {
                self.eof = true;
                break;
            };
            if keep <= PIPE_HEAD {
                let start = PIPE_HEAD - keep;
                next[start..PIPE_HEAD].copy_from_slice(&self.buf[self.pos..self.end]);
                pipe.give_back(std::mem::replace(&mut self.buf, next));
                self.base = offset.wrapping_sub(start as u64);
                (self.pos, self.end) = (start, end);
            } else {
                if self.pos > 0 {
                    self.buf.copy_within(self.pos..self.end, 0);
                    self.base = offset;
                    (self.pos, self.end) = (0, keep);
                }
                let n = end - PIPE_HEAD;
                if self.buf.len() < keep + n {
                    grow(&mut self.buf, keep + n, self.max_value, offset)?;
                    self.buf.resize(keep + n, 0);
                }
                self.buf[keep..keep + n].copy_from_slice(&next[PIPE_HEAD..end]);
                self.end = keep + n;
                pipe.give_back(next);
            }
        }
        self.skip_bom();
        Ok(self.end - self.pos > before)
    }

    /// Skips JSON whitespace; the next byte, or `None` at the end of input.
    #[inline]
    pub(super) fn skip_ws(&mut self) -> Result<Option<u8>, Fail> {
        loop {
            // Between tokens there are a few bytes of whitespace: one at a time, at most 32.
            let stop = self.end.min(self.pos + 32);
            while self.pos < stop {
                let b = self.buf[self.pos];
                if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if self.pos < self.end {
                // A long run (padding, a whitespace bomb): spaces eight at a time.
                while let Some(w) = self.buf[self.pos..self.end].first_chunk::<8>() {
                    if u64::from_ne_bytes(*w) != u64::from_ne_bytes([b' '; 8]) {
                        break;
                    }
                    self.pos += 8;
                }
                continue;
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// The length of the JSON value starting at `buf[pos]` (not whitespace), reading more as
    /// needed; `None` when the input ends inside it. Only structure is checked here. A value
    /// longer than the limit is [`Fail::TooLarge`].
    #[inline]
    pub(super) fn value_len(&mut self) -> Result<Option<usize>, Fail> {
        let mut scan = Scan::new(self.buf[self.pos]);
        let len = loop {
            if let Some(len) = scan.advance(&self.buf[self.pos..self.end]) {
                break Some(len);
            }
            if !self.fill()? {
                break scan.ends_at_eof().then_some(self.end - self.pos);
            }
        };
        if let Some(len) = len {
            self.check_len(len)?;
        }
        Ok(len)
    }

    /// [`Fail::TooLarge`] when a value of `len` bytes at `buf[pos]` is over the limit (one that
    /// happened to fit in the window is refused as one that did not).
    #[inline]
    pub(super) fn check_len(&self, len: usize) -> Result<(), Fail> {
        if len > self.max_value {
            return Err(self.too_large());
        }
        Ok(())
    }

    /// [`Fail::TooLarge`] for the value at `buf[pos]`.
    #[cold]
    #[inline(never)]
    pub(super) fn too_large(&self) -> Fail {
        Fail::TooLarge {
            at: self.offset(),
            limit: self.max_value,
        }
    }

    /// Parses the value at `buf[pos]` with `seed` and moves past it.
    #[inline]
    pub(super) fn parse_value<T, S>(&mut self, seed: S) -> Result<T, Fail>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let Some(len) = self.value_len()? else {
            return Err(Fail::Truncated);
        };
        let slice = &self.buf[self.pos..self.pos + len];
        let mut de = serde_json::Deserializer::from_slice(slice);
        match seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v)) {
            Ok(v) => {
                self.pos += len;
                Ok(v)
            }
            Err(e) => Err(Fail::json(slice, self.offset(), e)),
        }
    }

    /// Lets serde_json describe the value at `buf[pos]` that has the wrong type (or is not
    /// JSON), using `expected` as what should have been there; the offset is the value's.
    pub(super) fn wrong_value(&mut self, expected: &'static str) -> Fail {
        // serde_json rejects it at its first byte, so what is buffered is enough.
        if self.end - self.pos < 64 {
            let _ = self.fill();
        }
        let at = self.offset();
        let slice = &self.buf[self.pos..self.end];
        let mut de = serde_json::Deserializer::from_slice(slice);
        let message = match (&mut de).deserialize_any(Expect(expected)) {
            Ok(()) => format!("invalid JSON: expected {expected}"),
            Err(e) => match Fail::json(slice, at, e) {
                Fail::Syntax { message, .. } => message,
                other => return other,
            },
        };
        Fail::Syntax { at, message }
    }
}

/// Makes room for `len` bytes in a window whose values may be `max_value` long, with
/// `try_reserve`: amortised growth, but never past the limit plus one read. `at` is the offset
/// of the value being read, for the error.
fn grow(buf: &mut Vec<u8>, len: usize, max_value: usize, at: u64) -> Result<(), Fail> {
    if buf.capacity() >= len {
        return Ok(());
    }
    let ceiling = max_value.saturating_add(PIPE_HEAD + BUF_SIZE);
    let target = buf.capacity().saturating_mul(2).min(ceiling).max(len);
    buf.try_reserve_exact(target - buf.len())
        .map_err(|_| Fail::NoMemory {
            at,
            bytes: target,
            what: "the read window",
        })
}

/// Where a JSON value ends: a resumable scan over bytes that tracks strings (with escapes) and
/// bracket depth. It does not validate; serde_json does that on the slice.
pub(super) struct Scan {
    /// Bytes of the value scanned so far.
    pub(super) len: usize,
    pub(super) depth: u32,
    pub(super) in_string: bool,
    pub(super) kind: ScanKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ScanKind {
    Container,
    String,
    Scalar,
}

/// Byte classes outside strings.
pub(super) const QUOTE: u8 = 1;
pub(super) const OPEN: u8 = 2;
pub(super) const CLOSE: u8 = 3;
pub(super) static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'"' as usize] = QUOTE;
    t[b'{' as usize] = OPEN;
    t[b'[' as usize] = OPEN;
    t[b'}' as usize] = CLOSE;
    t[b']' as usize] = CLOSE;
    t
};

impl Scan {
    pub(super) fn new(first: u8) -> Scan {
        let kind = match first {
            b'{' | b'[' => ScanKind::Container,
            b'"' => ScanKind::String,
            _ => ScanKind::Scalar,
        };
        Scan {
            len: 1,
            depth: u32::from(kind == ScanKind::Container),
            in_string: kind == ScanKind::String,
            kind,
        }
    }

    /// Whether a value cut off by the end of input is complete (a bare scalar).
    pub(super) fn ends_at_eof(&self) -> bool {
        self.kind == ScanKind::Scalar
    }

    /// Continues over `data` (the value from its first byte, as far as it is buffered);
    /// `Some(length)` once the value ends.
    #[inline]
    pub(super) fn advance(&mut self, data: &[u8]) -> Option<usize> {
        if self.kind == ScanKind::Scalar {
            while self.len < data.len() {
                if matches!(
                    data[self.len],
                    b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'
                ) {
                    return Some(self.len);
                }
                self.len += 1;
            }
            return None;
        }
        loop {
            if self.in_string {
                let Some(k) = find_quote_or_backslash(&data[self.len..]) else {
                    // Resume after what was scanned: rescanning the string from its start on
                    // every fill made a long string quadratic.
                    self.len = data.len();
                    return None;
                };
                let i = self.len + k;
                if data[i] == b'\\' {
                    if i + 1 >= data.len() {
                        self.len = i; // resume at the backslash
                        return None;
                    }
                    self.len = i + 2;
                } else {
                    self.len = i + 1;
                    self.in_string = false;
                    if self.kind == ScanKind::String {
                        return Some(self.len);
                    }
                }
            } else {
                loop {
                    let b = *data.get(self.len)?;
                    self.len += 1;
                    match CLASS[b as usize] {
                        QUOTE => {
                            self.in_string = true;
                            break;
                        }
                        OPEN => self.depth += 1,
                        CLOSE => {
                            self.depth -= 1;
                            if self.depth == 0 {
                                return Some(self.len);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Index of the first `"` or `\` in `s`, eight bytes at a time.
#[inline]
pub(super) fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut chunks = s.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let w = u64::from_le_bytes(w);
        let m = has_zero(w ^ (ONES * u64::from(b'"'))) | has_zero(w ^ (ONES * u64::from(b'\\')));
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|k| i + k)
}

/// A visitor that accepts nothing, so serde_json reports what it found instead.
pub(super) struct Expect(&'static str);

impl Visitor<'_> for Expect {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A parse failure, turned into a [`ReadError`] by [`Parser::error`].
#[derive(Debug)]
pub(super) enum Fail {
    /// Reading or decompressing failed.
    Io(io::Error),
    /// The input ended inside the JSON.
    Truncated,
    /// The input is empty or whitespace.
    NoJson,
    /// Anything else, at an offset.
    Syntax { at: u64, message: String },
    /// A value longer than the limit starts at `at`.
    TooLarge { at: u64, limit: usize },
    /// Memory for `what` (`bytes` in all) could not be allocated while reading the value at `at`.
    NoMemory {
        at: u64,
        bytes: usize,
        what: &'static str,
    },
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        Fail::Io(e)
    }
}

impl Fail {
    /// A serde_json error on `slice`, which starts at offset `start`.
    pub(super) fn json(slice: &[u8], start: u64, err: serde_json::Error) -> Fail {
        use serde_json::error::Category;
        let (line, column) = (err.line(), err.column());
        let text = err.to_string();
        let position = format!(" at line {line} column {column}");
        let what = text.strip_suffix(&position).unwrap_or(&text);
        let message = match err.classify() {
            Category::Data => format!("not a valid Kineto trace: {what}"),
            _ => format!("invalid JSON: {what}"),
        };
        Fail::Syntax {
            at: start + offset_in(slice, line, column) as u64,
            message,
        }
    }
}

/// The index in `slice` of serde_json's 1-based `line` and `column` (which points at the
/// offending byte).
pub(super) fn offset_in(slice: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    if line > 1 {
        let mut newlines = 0;
        for (i, &b) in slice.iter().enumerate() {
            if b == b'\n' {
                newlines += 1;
                if newlines == line - 1 {
                    start = i + 1;
                    break;
                }
            }
        }
    }
    (start + column.saturating_sub(1)).min(slice.len())
}
