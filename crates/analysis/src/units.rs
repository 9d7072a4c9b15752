//! Small value types shared by the analyses' outputs.

use serde::{Serialize, Serializer};

/// A time in µs. Serialised as a JSON integer when it is a whole number (as every HTA time is once
/// HTA has rounded the trace), as a float otherwise, and as `null` when not finite.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default)]
pub struct Us(pub f64);

impl Us {
    /// From ns.
    pub fn from_ns(ns: i64) -> Us {
        Us(ns as f64 / 1000.0)
    }
}

impl Serialize for Us {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ser_number(self.0, s)
    }
}

/// A ratio or percentage that may be undefined (HTA's NaN, from 0/0): `null` in JSON.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default)]
pub struct Num(pub f64);

impl Num {
    /// `a / b`, NaN when `b == 0`.
    pub fn ratio(a: f64, b: f64) -> Num {
        if b == 0.0 {
            Num(f64::NAN)
        } else {
            Num(a / b)
        }
    }
    /// The value, `None` when NaN or infinite.
    pub fn get(self) -> Option<f64> {
        self.0.is_finite().then_some(self.0)
    }
}

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else {
            s.serialize_none()
        }
    }
}

fn ser_number<S: Serializer>(v: f64, s: S) -> Result<S::Ok, S::Error> {
    if !v.is_finite() {
        s.serialize_none()
    } else if v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0 {
        s.serialize_i64(v as i64)
    } else {
        s.serialize_f64(v)
    }
}

/// A duration in µs for messages, with a unit that keeps 3–4 significant digits: `812 µs`,
/// `3.21 ms`, `1.250 s`.
pub fn fmt_us(us: f64) -> String {
    if !us.is_finite() {
        return "-".into();
    }
    let us = us + 0.0;
    let a = us.abs();
    if a < 1_000.0 {
        if us.fract() == 0.0 {
            format!("{us:.0} µs")
        } else {
            format!("{us:.1} µs")
        }
    } else if a < 1_000_000.0 {
        format!("{:.2} ms", us / 1_000.0)
    } else {
        format!("{:.3} s", us / 1_000_000.0)
    }
}

/// Bytes in binary units for messages: `512 B`, `69.5 KiB`, `1.2 MiB`, `2.00 GiB`.
pub fn fmt_bytes(b: i64) -> String {
    let a = b.unsigned_abs() as f64;
    let sign = if b < 0 { "-" } else { "" };
    if a < 1024.0 {
        format!("{b} B")
    } else if a < 1024.0 * 1024.0 {
        format!("{sign}{:.1} KiB", a / 1024.0)
    } else if a < 1024.0 * 1024.0 * 1024.0 {
        format!("{sign}{:.1} MiB", a / (1024.0 * 1024.0))
    } else {
        format!("{sign}{:.2} GiB", a / (1024.0 * 1024.0 * 1024.0))
    }
}
