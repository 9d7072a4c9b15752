//! Framework ops' args texts: checked before they are interned ([`kinetrace_core::op_args`]) and
//! written into traces as they are.
//!
//! The compiled PyTorch recorder hands over each distinct set of args once, as JSON members
//! (`"Input Dims":[[4, 8], []],"Input type":["float", "Scalar"],"Concrete Inputs":["", "1"]`,
//! then a collective's `"Collective name":"allreduce",…`). The exporter copies them into an op's
//! `args` without parsing, so here they must be exactly that: members with known keys whose values
//! are numbers, strings or arrays of them (nested at most four deep), in valid UTF-8. Anything
//! else is refused and its op goes without args.

use kinetrace_core::op_args::{self, ArgsId};

/// The keys an op's args may have: torch.profiler's for ops (`Input Dims`, …) and for collectives
/// (its `record_param_comms` args), and for `python_function` ranges (`CallFrom`, `Python module
/// id`).
const KEYS: &[&str] = &[
    "Input Dims",
    "Input type",
    "Input Strides",
    "Concrete Inputs",
    "Collective name",
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "In split size",
    "Out split size",
    "Global rank start",
    "Global rank stride",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
    "Rank",
    "Src Rank",
    "Dst Rank",
    "Seq",
    "Input Tensors start",
    "Output Tensors start",
    "Is asynchronized op",
    "Comms Id",
    "CallFrom",
    "Python module id",
];

/// Deepest array nesting accepted (a TensorList's strides: `[[[4, 1], [1]]]` is three).
const MAX_DEPTH: usize = 4;

/// The id of an args text after checking it (see the module docs); `None` if it is not such a
/// text or the table is full.
pub fn intern(text: &[u8]) -> Option<ArgsId> {
    let text = std::str::from_utf8(text).ok()?;
    if !valid(text.as_bytes()) {
        return None;
    }
    op_args::intern(text)
}

/// The args table's generation: ids are good while it stays the same (see
/// [`kinetrace_core::op_args`]).
pub fn generation() -> u32 {
    op_args::generation()
}

/// Whether `text` is one or more `"key":value` members separated by commas (spaces allowed around
/// the punctuation), each key from [`KEYS`] and each value a number, a string or an array of them.
pub fn valid(text: &[u8]) -> bool {
    let mut p = Parser { b: text, i: 0 };
    loop {
        p.space();
        let Some(key) = p.string() else {
            return false;
        };
        if !KEYS.iter().any(|k| k.as_bytes() == key) {
            return false;
        }
        p.space();
        if !p.eat(b':') {
            return false;
        }
        p.space();
        if !p.value(0) {
            return false;
        }
        p.space();
        if p.i == p.b.len() {
            return true;
        }
        if !p.eat(b',') {
            return false;
        }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn space(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    /// A string's contents (between the quotes), escapes checked.
    fn string(&mut self) -> Option<&[u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        loop {
            let c = self.peek()?;
            self.i += 1;
            match c {
                b'"' => return Some(&self.b[start..self.i - 1]),
                b'\\' => {
                    let e = self.peek()?;
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            let hex = self.b.get(self.i..self.i + 4)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 4;
                        }
                        _ => return None,
                    }
                }
                0..=0x1f => return None,
                _ => {}
            }
        }
    }

    /// `-?digits(.digits)?([eE][+-]?digits)?`
    fn number(&mut self) -> bool {
        self.eat(b'-');
        if !self.digits() {
            return false;
        }
        if self.eat(b'.') && !self.digits() {
            return false;
        }
        if self.eat(b'e') || self.eat(b'E') {
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            return self.digits();
        }
        true
    }

    fn digits(&mut self) -> bool {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.i > start
    }

    fn value(&mut self, depth: usize) -> bool {
        match self.peek() {
            Some(b'"') => self.string().is_some(),
            Some(b'[') => {
                if depth >= MAX_DEPTH {
                    return false;
                }
                self.i += 1;
                self.space();
                if self.eat(b']') {
                    return true;
                }
                loop {
                    if !self.value(depth + 1) {
                        return false;
                    }
                    self.space();
                    if self.eat(b']') {
                        return true;
                    }
                    if !self.eat(b',') {
                        return false;
                    }
                    self.space();
                }
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_recorder_writes_is_accepted() {
        for good in [
            r#""Input Dims":[[32, 64], [128, 64], [128]]"#,
            r#""Input Dims":[[[26378], [26378]], []],"Input type":["TensorList", ""]"#,
            r#""Input Strides":[[[1], [1]], []],"Concrete Inputs":["", "[64, 128]", "-0.01", "1e-05", "True"]"#,
            r#""Input Dims":[], "Input type":[]"#,
            r#""Collective name":"allreduce","In msg nelems":2049000,"Process Group Ranks":"[0, 1]""#,
            r#""Process Group Description":"my \"group\" \\ \u00e9""#,
            r#""Global rank start":-1,"In msg nelems":1.5e3"#,
        ] {
            assert!(valid(good.as_bytes()), "{good}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            r#""Input Dims""#,
            r#""Input Dims":"#,
            r#""Input Dims":[[1]"#,
            r#""Input Dims":[[1],]"#,
            r#""Input Dims":[[1]],"#,
            r#""Input Dims":[[1]]}"#,
            r#"{"Input Dims":[[1]]}"#,
            r#""Evil":1"#,
            r#""Input Dims":{"a":1}"#,
            r#""Input Dims":true"#,
            r#""Input Dims":[[[[[1]]]]]"#,
            r#""Input type":["a"b"]"#,
            "\"Input type\":[\"a\nb\"]",
            r#""Input type":["\x"]"#,
            r#""Input type":["\u12"]"#,
            r#""Input Dims":[1.]"#,
            r#""Input Dims":[-]"#,
            r#""Input Dims":[1] "Input type":[]"#,
        ] {
            assert!(!valid(bad.as_bytes()), "{bad}");
        }
        assert_eq!(intern(b"\"Input type\":[\"\xff\"]"), None);
    }
}
