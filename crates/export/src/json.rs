//! Small, allocation-free JSON formatting helpers for the writer.

/// Appends `s` as a JSON string literal (with quotes), escaping quotes, backslashes and control bytes.
pub fn push_str_literal(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_escaped(out, s);
    out.push(b'"');
}

/// Appends the escaped content of `s` (without quotes).
pub fn push_escaped(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Appends an unsigned integer.
#[inline]
pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends a signed integer.
#[inline]
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends nanoseconds as microseconds with exactly three decimals (`1234.005`).
#[inline]
pub fn push_us3(out: &mut Vec<u8>, ns: u64) {
    push_u64(out, ns / 1000);
    let frac = (ns % 1000) as u16;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Appends a finite float in a form JSON accepts (shortest round trip); non-finite values as 0.
pub fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        use std::io::Write;
        let _ = write!(out, "{v}");
        if v.fract() == 0.0 && v.abs() < 1e15 {
            out.extend_from_slice(b".0");
        }
    } else {
        out.push(b'0');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> String {
        let mut v = Vec::new();
        push_str_literal(&mut v, s);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn escapes_round_trip_through_serde() {
        for s in [
            "plain",
            "q\"uote",
            "back\\slash",
            "new\nline\ttab\r",
            "\u{1}\u{1f}\u{7f}",
            "void k<float>(float*, int) [with T=\"x\"]",
            "ünïcødé ✓ 🚀",
        ] {
            let json = lit(s);
            let back: String = serde_json::from_str(&json).unwrap();
            assert_eq!(back, s, "{json}");
        }
    }

    #[test]
    fn three_decimals() {
        let mut v = Vec::new();
        push_us3(&mut v, 1_234_005);
        v.push(b' ');
        push_us3(&mut v, 7);
        v.push(b' ');
        push_us3(&mut v, 4_458_676_983_543_183);
        assert_eq!(
            String::from_utf8(v).unwrap(),
            "1234.005 0.007 4458676983543.183"
        );
    }

    #[test]
    fn floats_are_json() {
        let mut v = Vec::new();
        push_f64(&mut v, 2.0);
        v.push(b' ');
        push_f64(&mut v, 0.125);
        v.push(b' ');
        push_f64(&mut v, f64::INFINITY);
        assert_eq!(String::from_utf8(v).unwrap(), "2.0 0.125 0");
    }
}
