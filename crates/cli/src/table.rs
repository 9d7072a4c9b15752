//! Aligned text tables and human units for the terminal.

use std::fmt::Write as _;

/// Column alignment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A titled table: header, rows, per-column alignment.
pub struct Table {
    title: String,
    headers: Vec<&'static str>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
    /// Rows left out of `rows` (shown as a last line).
    pub hidden: usize,
}

impl Table {
    pub fn new(title: impl Into<String>, columns: &[(&'static str, Align)]) -> Table {
        Table {
            title: title.into(),
            headers: columns.iter().map(|c| c.0).collect(),
            align: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
            hidden: 0,
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    /// Keeps the first `n` rows, counting the rest in `hidden`.
    pub fn truncate(&mut self, n: usize) {
        if self.rows.len() > n {
            self.hidden += self.rows.len() - n;
            self.rows.truncate(n);
        }
    }

    pub fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(width(c));
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title);
        let line = |cells: &[&str], out: &mut String| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = widths[i].saturating_sub(width(c));
                match self.align[i] {
                    Align::Left => {
                        s.push_str(c);
                        if i + 1 < cells.len() {
                            s.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                    Align::Right => {
                        s.extend(std::iter::repeat_n(' ', pad));
                        s.push_str(c);
                    }
                }
            }
            let _ = writeln!(out, "  {}", s.trim_end());
        };
        line(&self.headers, &mut out);
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        line(
            &rule.iter().map(String::as_str).collect::<Vec<_>>(),
            &mut out,
        );
        for r in &self.rows {
            line(&r.iter().map(String::as_str).collect::<Vec<_>>(), &mut out);
        }
        if self.rows.is_empty() {
            let _ = writeln!(out, "  (no rows)");
        }
        if self.hidden > 0 {
            let _ = writeln!(out, "  … {} more (--top 0 shows all)", self.hidden);
        }
        out
    }
}

/// A duration given in µs, with a unit that keeps 3–4 significant digits: `812 µs`, `3.21 ms`.
pub fn dur_us(us: f64) -> String {
    if !us.is_finite() {
        return "-".into();
    }
    // `+ 0.0` turns -0.0 (an empty sum of negatives) into 0.0, so it never prints as "-0".
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

/// A percentage with 2 decimals, `-` when undefined.
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.2}%", v + 0.0))
}

/// Bytes in binary units.
pub fn bytes(b: i64) -> String {
    kinetrace_analysis::units::fmt_bytes(b)
}

/// `s` cut to `max` characters with an ellipsis.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(dur_us(812.0), "812 µs");
        assert_eq!(dur_us(2.5), "2.5 µs");
        assert_eq!(dur_us(-0.0), "0 µs");
        assert_eq!(pct(Some(-0.0)), "0.00%");
        assert_eq!(dur_us(3210.0), "3.21 ms");
        assert_eq!(dur_us(12_996_011.0), "12.996 s");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(bytes(-2048), "-2.0 KiB");
        assert_eq!(pct(None), "-");
        assert_eq!(pct(Some(53.5578)), "53.56%");
        assert_eq!(clip("abcdef", 4), "abc…");
    }

    #[test]
    fn columns_align() {
        let mut t = Table::new("T", &[("name", Align::Left), ("time", Align::Right)]);
        t.row(vec!["a".into(), "1 µs".into()]);
        t.row(vec!["longer".into(), "10.00 ms".into()]);
        let s = t.render();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[1], "  name        time");
        assert_eq!(lines[3], "  a           1 µs");
        assert_eq!(lines[4], "  longer  10.00 ms");
    }
}
