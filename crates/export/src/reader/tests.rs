//! Unit tests of the reader's pieces.

use super::rank::{find_bytes, find_rank};
use super::*;

#[test]
fn float_us_rounds_to_nearest_ns() {
    assert_eq!(
        RawNum::Float(4458676983543.183).us_to_ns(),
        4_458_676_983_543_183
    );
    assert_eq!(RawNum::Float(1.0005).us_to_ns(), 1_000); // the f64 is just below 1.0005
    assert_eq!(RawNum::Float(1.0015).us_to_ns(), 1_002); // the f64 is just above 1.0015
    assert_eq!(RawNum::Float(-2.5).us_to_ns(), -2_500);
    assert_eq!(RawNum::Float(0.0004).us_to_ns(), 0);
    assert_eq!(
        RawNum::Int(1_682_725_898_236_567).us_to_ns(),
        1_682_725_898_236_567_000
    );
    assert_eq!(RawNum::Float(f64::NAN).us_to_ns(), 0);
    assert_eq!(RawNum::Float(1e300).us_to_ns(), i64::MAX);
    assert_eq!(RawNum::Int(i64::MIN).us_to_ns(), i64::MIN);
}

#[test]
fn rank_regex() {
    assert_eq!(find_rank(br#"{"rank": 3,"#), Some(Some(3)));
    assert_eq!(find_rank(br#"{"rank":3,"#), None);
    assert_eq!(find_rank(br#"{"rank": -3,"#), None);
    assert_eq!(
        find_rank(br#"{"rank":3, "x": {"rank":  17}"#),
        Some(Some(17))
    );
    assert_eq!(find_rank("\"rank\":\u{a0}\t 42".as_bytes()), Some(Some(42)));
    assert_eq!(find_rank(b"\"rank\":\x1f5"), Some(Some(5)));
    assert_eq!(find_rank(b"\"rank\": 99999999999999999999"), Some(None));
    assert_eq!(find_rank(b"\"rank\": \n"), None);
}

#[test]
fn find_bytes_works() {
    assert_eq!(find_bytes(b"aab", b"ab"), Some(1));
    assert_eq!(find_bytes(b"a", b"ab"), None);
    assert_eq!(find_bytes(b"", b"ab"), None);
    assert_eq!(find_bytes(b"xxab", b"ab"), Some(2));
}
