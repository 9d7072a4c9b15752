//! `--plot`: the temporal breakdown per rank (stacked bars) and the memory timeline (lines), as
//! a hand-written SVG file.

use std::fmt::Write as _;

use kinetrace_analysis::Report;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const BAR: f64 = 22.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis step (1, 2 or 5 × 10^k) giving about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    mag * if f < 1.5 {
        1.0
    } else if f < 3.5 {
        2.0
    } else if f < 7.5 {
        5.0
    } else {
        10.0
    }
}

/// The whole picture.
pub fn render(report: &Report) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let mut body = String::new();
    let mut y = 20.0;

    // Temporal breakdown.
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{y}" class="title">GPU time per rank: compute / non-compute / idle (HTA temporal breakdown)</text>"#
    );
    y += 14.0;
    let parts = [
        ("compute", "#2ca02c"),
        ("non-compute", "#ff7f0e"),
        ("idle", "#b0b0b0"),
    ];
    let mut lx = LEFT;
    for (name, color) in parts {
        let _ = writeln!(
            body,
            r#"<rect x="{lx}" y="{y}" width="10" height="10" fill="{color}"/><text x="{}" y="{}" class="small">{name}</text>"#,
            lx + 14.0,
            y + 9.0
        );
        lx += 110.0;
    }
    y += 20.0;
    if report.temporal_breakdown.is_empty() {
        let _ = writeln!(
            body,
            r#"<text x="{LEFT}" y="{}" class="small">no rank has GPU kernels</text>"#,
            y + 12.0
        );
        y += 24.0;
    }
    for t in &report.temporal_breakdown {
        let vals = [
            t.compute_time_pctg.get().unwrap_or(0.0),
            t.non_compute_time_pctg.get().unwrap_or(0.0),
            t.idle_time_pctg.get().unwrap_or(0.0),
        ];
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" class="label" text-anchor="end">rank {}</text>"#,
            LEFT - 8.0,
            y + BAR * 0.7,
            t.rank
        );
        let mut x = LEFT;
        for ((name, color), v) in parts.iter().zip(vals) {
            let w = (v.max(0.0) / 100.0 * plot_w).min(LEFT + plot_w - x);
            let _ = writeln!(
                body,
                r#"<rect x="{x:.2}" y="{y}" width="{w:.2}" height="{BAR}" fill="{color}"><title>rank {}: {name} {v:.2}%</title></rect>"#,
                t.rank
            );
            if w > 44.0 {
                let _ = writeln!(
                    body,
                    r#"<text x="{:.2}" y="{}" class="inbar" text-anchor="middle">{v:.1}%</text>"#,
                    x + w / 2.0,
                    y + BAR * 0.7
                );
            }
            x += w;
        }
        y += BAR + 6.0;
    }
    y += 30.0;

    // Memory timeline.
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{y}" class="title">Memory allocated over time (ms since each rank's first event)</text>"#
    );
    y += 10.0;
    let series: Vec<_> = report
        .memory
        .iter()
        .filter(|m| !m.timeline.is_empty())
        .collect();
    let plot_h = 240.0;
    if series.is_empty() {
        let _ = writeln!(
            body,
            r#"<text x="{LEFT}" y="{}" class="small">no [memory] events in the traces (record with profile_memory=True)</text>"#,
            y + 20.0
        );
        y += 40.0;
    } else {
        let t_max = series
            .iter()
            .flat_map(|m| m.timeline.iter().map(|p| p.t_ms))
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let b_max = series
            .iter()
            .flat_map(|m| m.timeline.iter().map(|p| p.allocated))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let mib = 1024.0 * 1024.0;
        let top = y + 10.0;
        let bottom = top + plot_h;
        let sx = |t: f64| LEFT + t / t_max * plot_w;
        let sy = |b: f64| bottom - b / b_max * plot_h;
        let _ = writeln!(
            body,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>"##
        );
        let step = nice_step(b_max / mib, 5.0);
        let mut v = 0.0;
        while v * mib <= b_max * 1.0001 {
            let yy = sy(v * mib);
            let _ = writeln!(
                body,
                r##"<line x1="{LEFT}" y1="{yy:.2}" x2="{}" y2="{yy:.2}" stroke="#ddd"/><text x="{}" y="{:.2}" class="small" text-anchor="end">{} MiB</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                yy + 4.0,
                v
            );
            v += step;
        }
        let tstep = nice_step(t_max, 8.0);
        let mut t = 0.0;
        while t <= t_max * 1.0001 {
            let xx = sx(t);
            let _ = writeln!(
                body,
                r#"<text x="{xx:.2}" y="{}" class="small" text-anchor="middle">{t}</text>"#,
                bottom + 14.0
            );
            t += tstep;
        }
        for (i, m) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<String> = m
                .timeline
                .iter()
                .map(|p| format!("{:.2},{:.2}", sx(p.t_ms), sy(p.allocated as f64)))
                .collect();
            let dev = if m.device < 0 {
                "cpu".to_owned()
            } else {
                format!("gpu {}", m.device)
            };
            let _ = writeln!(
                body,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"><title>rank {} {}</title></polyline>"#,
                points.join(" "),
                m.rank,
                esc(&dev)
            );
            let _ = writeln!(
                body,
                r#"<rect x="{}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{}" class="small">rank {} {} (peak {:.1} MiB)</text>"#,
                LEFT + 10.0,
                top + 8.0 + 14.0 * i as f64,
                LEFT + 24.0,
                top + 17.0 + 14.0 * i as f64,
                m.rank,
                esc(&dev),
                m.peak_allocated_bytes as f64 / mib
            );
        }
        y = bottom + 40.0;
    }
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" viewBox="0 0 {WIDTH} {y}" font-family="sans-serif">
<style>.title{{font-size:14px;font-weight:bold}} .label{{font-size:12px}} .small{{font-size:11px;fill:#333}} .inbar{{font-size:11px;fill:#fff}}</style>
<rect width="100%" height="100%" fill="#fff"/>
{body}</svg>
"##
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 7.0), 1.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
    }

    #[test]
    fn escapes() {
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
