//! `--plot`: the temporal breakdown per rank (stacked bars on a 0–100 % axis) and the memory
//! timeline (one panel per rank and device: allocated and reserved as step functions, the steps
//! and their forward / backward / optimizer phases shaded, the peak marked with what ran), as a
//! hand-written SVG file.
//!
//! Elements carry classes (`alloc`, `reserved`, `phase forward`, `step-line`, `ytick`, `peak`)
//! so tests can check the structure.

use std::fmt::Write as _;

use kinetrace_analysis::memory::{MemoryDevice, PhaseKind, PhaseSpan};
use kinetrace_analysis::steps::StepRow;
use kinetrace_analysis::units::fmt_bytes;
use kinetrace_analysis::Report;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const BAR: f64 = 22.0;
const PANEL_H: f64 = 200.0;
/// Memory panels drawn at most; the rest are named in one line.
const MAX_PANELS: usize = 8;
const ALLOC: &str = "#1f4e9c";
const RESERVED: &str = "#c0392b";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `s` cut to `max` characters with an ellipsis.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
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

/// Ticks `0, step, 2·step, …` up to the first at or above `max`, each computed as `i · step` (no
/// accumulated float error) and formatted with just the decimals the step needs, so `0.3` never
/// prints as `0.30000000000000004`.
fn ticks(max: f64, n: f64) -> Vec<(f64, String)> {
    let step = nice_step(max, n);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let count = (max / step * 0.9999).ceil() as i64;
    (0..=count.clamp(0, 100))
        .map(|i| {
            let v = i as f64 * step;
            (v, format!("{v:.decimals$}"))
        })
        .collect()
}

/// The binary unit (name, bytes) that keeps a maximum of `max` bytes at 1 or more.
fn byte_unit(max: f64) -> (&'static str, f64) {
    [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find(|&(_, u)| max >= u as f64)
        .map_or(("B", 1.0), |(n, u)| (n, u as f64))
}

fn phase_color(k: PhaseKind) -> &'static str {
    match k {
        PhaseKind::Forward => "#4e79a7",
        PhaseKind::Backward => "#f28e2b",
        PhaseKind::Optimizer => "#59a14f",
    }
}

fn device_name(device: i64) -> String {
    if device < 0 {
        "cpu".to_owned()
    } else {
        format!("gpu {device}")
    }
}

/// The whole picture.
pub fn render(report: &Report) -> String {
    let mut body = String::new();
    let mut y = 20.0;
    temporal(&mut body, &mut y, report);
    y += 36.0;
    memory(&mut body, &mut y, report);
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" viewBox="0 0 {WIDTH} {y}" font-family="sans-serif">
<style>.title{{font-size:14px;font-weight:bold}} .label{{font-size:12px}} .small{{font-size:11px;fill:#333}} .inbar{{font-size:11px;fill:#fff}} .note{{font-size:11px;fill:#555;font-style:italic}}</style>
<rect width="100%" height="100%" fill="#fff"/>
{body}</svg>
"##
    )
}

/// Stacked bars per rank on a 0–100 % axis, with the GPU span each bar stands for.
fn temporal(body: &mut String, y: &mut f64, report: &Report) {
    let plot_w = WIDTH - LEFT - RIGHT - 110.0;
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{y}" class="title">GPU time per rank over its kernel span: compute / non-compute / idle (HTA temporal breakdown)</text>"#
    );
    *y += 16.0;
    let parts = [
        ("compute", "#2ca02c"),
        ("non-compute (comm, memcpy, memset)", "#ff7f0e"),
        ("idle", "#b0b0b0"),
    ];
    let mut lx = LEFT;
    for (name, color) in parts {
        let _ = writeln!(
            body,
            r#"<rect x="{lx}" y="{y}" width="10" height="10" fill="{color}"/><text x="{}" y="{}" class="small">{}</text>"#,
            lx + 14.0,
            *y + 9.0,
            esc(name)
        );
        lx += 30.0 + 6.6 * name.len() as f64;
    }
    *y += 22.0;
    if report.temporal_breakdown.is_empty() {
        let _ = writeln!(
            body,
            r#"<text x="{LEFT}" y="{}" class="small">no rank has GPU kernels</text>"#,
            *y + 12.0
        );
        *y += 24.0;
        return;
    }
    for t in &report.temporal_breakdown {
        let vals = [
            t.compute_time_pctg.get().unwrap_or(0.0),
            t.non_compute_time_pctg.get().unwrap_or(0.0),
            t.idle_time_pctg.get().unwrap_or(0.0),
        ];
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" class="label" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            *y + BAR * 0.7,
            who(report, t.rank, t.cycle)
        );
        let mut x = LEFT;
        for ((name, color), v) in parts.iter().zip(vals) {
            let w = (v.max(0.0) / 100.0 * plot_w).min(LEFT + plot_w - x);
            let _ = writeln!(
                body,
                r#"<rect class="bar" x="{x:.2}" y="{y}" width="{w:.2}" height="{BAR}" fill="{color}"><title>{}: {} {v:.2}%</title></rect>"#,
                who(report, t.rank, t.cycle),
                esc(name)
            );
            if w > 44.0 {
                let _ = writeln!(
                    body,
                    r#"<text x="{:.2}" y="{}" class="inbar" text-anchor="middle">{v:.1}%</text>"#,
                    x + w / 2.0,
                    *y + BAR * 0.7
                );
            }
            x += w;
        }
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" class="small">of {}</text>"#,
            LEFT + plot_w + 8.0,
            *y + BAR * 0.7,
            kinetrace_analysis::units::fmt_us(t.kernel_time_us.0)
        );
        *y += BAR + 6.0;
    }
    let bottom = *y - 6.0;
    for (v, label) in ticks(100.0, 4.0) {
        let xx = LEFT + v / 100.0 * plot_w;
        let _ = writeln!(
            body,
            r##"<line x1="{xx:.2}" y1="{bottom}" x2="{xx:.2}" y2="{}" stroke="#888"/><text x="{xx:.2}" y="{}" class="small xtick" text-anchor="middle">{label}%</text>"##,
            bottom + 4.0,
            bottom + 16.0
        );
    }
    let _ = writeln!(
        body,
        r##"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#888"/>"##,
        LEFT + plot_w
    );
    *y = bottom + 22.0;
}

/// One panel per rank and device.
fn memory(body: &mut String, y: &mut f64, report: &Report) {
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{y}" class="title">Memory per rank and device (step functions; ms since the rank's first event)</text>"#
    );
    *y += 16.0;
    let series: Vec<&MemoryDevice> = report
        .memory
        .iter()
        .filter(|m| !m.timeline.is_empty())
        .collect();
    if series.is_empty() {
        let _ = writeln!(
            body,
            r#"<text x="{LEFT}" y="{}" class="small">no [memory] events in the traces: record PyTorch's allocator with kinetrace record --profile-memory (torch.profiler: profile_memory=True), or the CUDA driver's allocations with --memory</text>"#,
            *y + 12.0
        );
        *y += 24.0;
        return;
    }
    // Legend.
    let mut lx = LEFT;
    let key = |body: &mut String, swatch: String, name: &str, lx: &mut f64| {
        let _ = writeln!(
            body,
            r#"{swatch}<text x="{}" y="{}" class="small">{name}</text>"#,
            *lx + 24.0,
            *y + 9.0
        );
        *lx += 34.0 + 6.2 * name.len() as f64;
    };
    key(
        body,
        format!(
            r#"<line x1="{lx}" y1="{}" x2="{}" y2="{0}" stroke="{ALLOC}" stroke-width="2"/>"#,
            *y + 5.0,
            lx + 18.0
        ),
        "allocated",
        &mut lx,
    );
    key(
        body,
        format!(
            r#"<line x1="{lx}" y1="{}" x2="{}" y2="{0}" stroke="{RESERVED}" stroke-width="2" stroke-dasharray="5,3"/>"#,
            *y + 5.0,
            lx + 18.0
        ),
        "reserved",
        &mut lx,
    );
    for k in [
        PhaseKind::Forward,
        PhaseKind::Backward,
        PhaseKind::Optimizer,
    ] {
        key(
            body,
            format!(
                r#"<rect x="{lx}" y="{y}" width="18" height="10" fill="{}" fill-opacity="0.25"/>"#,
                phase_color(k)
            ),
            k.as_str(),
            &mut lx,
        );
    }
    *y += 30.0;
    for m in series.iter().take(MAX_PANELS) {
        // A cycle's times count from its own trace's first event.
        let steps: Vec<&StepRow> = report
            .steps
            .iter()
            .filter(|s| (s.rank, s.cycle) == (m.rank, m.cycle))
            .collect();
        let phases: Vec<&PhaseSpan> = report
            .phases
            .iter()
            .filter(|p| (p.rank, p.cycle) == (m.rank, m.cycle))
            .collect();
        panel(body, y, &who(report, m.rank, m.cycle), m, &steps, &phases);
    }
    if series.len() > MAX_PANELS {
        let rest: Vec<String> = series[MAX_PANELS..]
            .iter()
            .map(|m| format!("{} {}", who(report, m.rank, m.cycle), device_name(m.device)))
            .collect();
        let _ = writeln!(
            body,
            r#"<text x="{LEFT}" y="{}" class="small">not drawn ({} more; see memory_timeline.csv): {}</text>"#,
            *y + 4.0,
            rest.len(),
            esc(&clip(&rest.join(", "), 120))
        );
        *y += 20.0;
    }
}

/// `M x0,y0 H x1 V y1 H x2 …`: the level holds until the next sample, then jumps; the last one
/// holds to `x_end`.
fn step_path(pts: &[(f64, f64)], x_end: f64) -> String {
    let mut d = String::new();
    for (i, &(x, y)) in pts.iter().enumerate() {
        if i == 0 {
            let _ = write!(d, "M{x:.2},{y:.2}");
        } else {
            let _ = write!(d, " H{x:.2} V{y:.2}");
        }
    }
    let _ = write!(d, " H{x_end:.2}");
    d
}

/// "rank 0", or "rank 0 cycle 1" when some rank has cycles.
fn who(report: &Report, rank: i64, cycle: u32) -> String {
    if report.has_cycles() {
        format!("rank {rank} cycle {cycle}")
    } else {
        format!("rank {rank}")
    }
}

fn panel(
    body: &mut String,
    y: &mut f64,
    who: &str,
    m: &MemoryDevice,
    steps: &[&StepRow],
    phases: &[&PhaseSpan],
) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let dev = device_name(m.device);
    // Title: what peaked, when, where.
    let mut title = format!(
        "{who} {dev}: peak {} allocated at {:.2} ms",
        fmt_bytes(m.peak_allocated_bytes),
        m.peak_at_ms
    );
    if m.peak_reserved_bytes > 0 {
        let _ = write!(
            title,
            ", peak reserved {}",
            fmt_bytes(m.peak_reserved_bytes)
        );
    }
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{y}" class="label">{}</text>"#,
        esc(&title)
    );
    *y += 18.0;
    let t_lo = m.timeline.first().map_or(0.0, |p| p.t_ms).min(
        steps
            .iter()
            .map(|s| s.start_ms)
            .fold(f64::INFINITY, f64::min),
    );
    let t_hi = m.timeline.last().map_or(0.0, |p| p.t_ms).max(
        steps
            .iter()
            .map(|s| s.start_ms + s.step_time_us.0 / 1000.0)
            .fold(f64::NEG_INFINITY, f64::max),
    );
    // The axis starts at a tick at or below the first event, so labels read as round numbers.
    let span = (t_hi - t_lo).max(1e-3);
    let tstep = nice_step(span, 8.0);
    let x0 = (t_lo / tstep).floor() * tstep;
    let x1 = t_hi.max(x0 + 1e-3);
    let b_max = m
        .timeline
        .iter()
        .map(|p| p.allocated.max(p.reserved))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let (unit, ub) = byte_unit(b_max);
    // The top tick is the first round value at or above the highest level, 5% headroom kept for
    // the peak's label.
    let yt = ticks(b_max / ub * 1.05, 5.0);
    let y_top_v = yt.last().map_or(b_max / ub, |t| t.0).max(b_max / ub) * ub;
    let top = *y;
    let bottom = top + PANEL_H;
    let sx = |t: f64| LEFT + (t - x0) / (x1 - x0) * plot_w;
    let sy = |b: f64| bottom - b / y_top_v * PANEL_H;
    // Phases behind everything.
    for p in phases {
        let (a, b) = (sx(p.start_ms.max(x0)), sx(p.end_ms.min(x1)));
        if b > a {
            let _ = writeln!(
                body,
                r#"<rect class="phase {k}" x="{a:.2}" y="{top}" width="{:.2}" height="{PANEL_H}" fill="{}" fill-opacity="0.18"><title>step {} {k}: {:.2}–{:.2} ms</title></rect>"#,
                b - a,
                phase_color(p.kind),
                p.step,
                p.start_ms,
                p.end_ms,
                k = p.kind.as_str()
            );
        }
    }
    let _ = writeln!(
        body,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#888"/>"##
    );
    for (v, label) in &yt {
        let yy = sy(v * ub);
        let _ = writeln!(
            body,
            r##"<line x1="{LEFT}" y1="{yy:.2}" x2="{}" y2="{yy:.2}" stroke="#000" stroke-opacity="0.08"/><text x="{}" y="{:.2}" class="small ytick" text-anchor="end">{label} {unit}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    for (v, label) in ticks(x1 - x0, 8.0) {
        let xx = sx(x0 + v);
        if xx > LEFT + plot_w - 12.0 {
            break;
        }
        let shown = format!("{:.*}", label.split('.').nth(1).map_or(0, str::len), x0 + v);
        let _ = writeln!(
            body,
            r##"<line x1="{xx:.2}" y1="{bottom}" x2="{xx:.2}" y2="{}" stroke="#888"/><text x="{xx:.2}" y="{}" class="small xtick" text-anchor="middle">{shown}</text>"##,
            bottom + 4.0,
            bottom + 15.0
        );
    }
    // Step boundaries, labelled at the top of each step.
    let mut last_end = None;
    for s in steps {
        let end = s.start_ms + s.step_time_us.0 / 1000.0;
        for t in [s.start_ms, end] {
            if last_end == Some(t) || t < x0 || t > x1 {
                continue;
            }
            let xx = sx(t);
            let _ = writeln!(
                body,
                r##"<line class="step-line" x1="{xx:.2}" y1="{top}" x2="{xx:.2}" y2="{bottom}" stroke="#333" stroke-dasharray="3,3"/>"##
            );
        }
        last_end = Some(end);
        let w = sx(end.min(x1)) - sx(s.start_ms.max(x0));
        if w > 50.0 {
            let _ = writeln!(
                body,
                r#"<text x="{:.2}" y="{}" class="small" text-anchor="middle">step {}</text>"#,
                sx(s.start_ms.max(x0)) + w / 2.0,
                top + 12.0,
                s.step
            );
        }
    }
    let pts = |f: fn(&kinetrace_analysis::memory::MemPoint) -> i64| -> Vec<(f64, f64)> {
        m.timeline
            .iter()
            .map(|p| (sx(p.t_ms), sy(f(p) as f64)))
            .collect()
    };
    let x_end = sx(x1);
    if m.timeline.iter().any(|p| p.reserved > 0) {
        let _ = writeln!(
            body,
            r#"<path class="reserved" d="{}" fill="none" stroke="{RESERVED}" stroke-width="1.5" stroke-dasharray="5,3"><title>reserved</title></path>"#,
            step_path(&pts(|p| p.reserved), x_end)
        );
    }
    let alloc = step_path(&pts(|p| p.allocated), x_end);
    let _ = writeln!(
        body,
        r#"<text x="{}" y="{}" class="small" text-anchor="end">ms</text>"#,
        LEFT + plot_w,
        bottom + 15.0
    );
    let _ = writeln!(
        body,
        r#"<path class="alloc" d="{alloc}" fill="none" stroke="{ALLOC}" stroke-width="1.8"><title>allocated</title></path>"#
    );
    // The peak, with what was running.
    let (px, py) = (sx(m.peak_at_ms), sy(m.peak_allocated_bytes as f64));
    let mut what = format!("peak {}", fmt_bytes(m.peak_allocated_bytes));
    match (m.peak_step, m.peak_phase) {
        (Some(s), Some(k)) => {
            let _ = write!(what, " in step {s} {}", k.as_str());
        }
        (Some(s), None) => {
            let _ = write!(what, " in step {s}");
        }
        _ => {}
    }
    if let Some(ops) = &m.peak_ops {
        let _ = write!(what, ": {}", clip(ops, 60));
    }
    let right = px > LEFT + plot_w * 0.6;
    let (tx, anchor) = if right {
        (px - 8.0, "end")
    } else {
        (px + 8.0, "start")
    };
    let _ = writeln!(
        body,
        r##"<circle class="peak" cx="{px:.2}" cy="{py:.2}" r="4" fill="#fff" stroke="#000" stroke-width="1.5"/><text x="{tx:.2}" y="{:.2}" class="small" text-anchor="{anchor}" font-weight="bold">{}</text>"##,
        (py - 6.0).max(top + 24.0),
        esc(&what)
    );
    *y = bottom + 30.0;
    if let Some(note) = &m.first_step_note {
        // One line per clause: the whole note is wider than the picture.
        for (i, part) in note.split("; ").enumerate() {
            let lead = if i == 0 { "first step: " } else { "" };
            let _ = writeln!(
                body,
                r#"<text x="{LEFT}" y="{}" class="note">{lead}{}</text>"#,
                *y - 4.0,
                esc(&clip(part, 140))
            );
            *y += 14.0;
        }
    }
    *y += 14.0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinetrace_analysis::{analyze_sources, Options, TraceSource};
    use serde_json::{json, Value};

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

    #[test]
    fn ticks_are_round_numbers() {
        // 0.1 steps accumulate to 0.30000000000000004 when summed; computed as i·step they print
        // as written.
        let t: Vec<String> = ticks(0.55, 5.0).into_iter().map(|t| t.1).collect();
        assert_eq!(t, ["0.0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6"]);
        let t: Vec<String> = ticks(1000.0, 5.0).into_iter().map(|t| t.1).collect();
        assert_eq!(t, ["0", "200", "400", "600", "800", "1000"]);
        assert_eq!(byte_unit(3.0 * 1024.0 * 1024.0), ("MiB", 1048576.0));
        assert_eq!(byte_unit(100.0), ("B", 1.0));
    }

    const MIB: i64 = 1 << 20;

    /// A constructed training run on one GPU: three steps of forward (allocating activations),
    /// backward (freeing them, allocating gradients) and optimizer; the caching allocator reserves
    /// its segments during step 1 and reuses them after.
    pub(crate) fn training_trace() -> Vec<u8> {
        let mut ev: Vec<Value> = Vec::new();
        let x = |cat: &str, name: &str, tid: i64, ts: i64, dur: i64| json!({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}});
        let mut reserved = 0i64;
        let mut allocated = 200 * MIB; // weights
        let mut mem = |ev: &mut Vec<Value>, ts: i64, delta: i64, reserved: &mut i64, warm: bool| {
            allocated += delta;
            if warm {
                // Segments of 64 MiB, never given back.
                while *reserved < allocated {
                    *reserved += 64 * MIB;
                }
            }
            ev.push(
                json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                "pid": 1, "tid": 1, "ts": ts, "args": {"Total Reserved": *reserved,
                "Total Allocated": allocated, "Bytes": delta, "Device Id": 0, "Device Type": 1}}),
            );
        };
        for step in 0..3i64 {
            let s = 1000 + step * 10_000;
            let warm = step == 0;
            ev.push(x(
                "user_annotation",
                &format!("ProfilerStep#{}", step + 1),
                1,
                s,
                9_800,
            ));
            ev.push(x(
                "user_annotation",
                "Optimizer.zero_grad#AdamW.zero_grad",
                1,
                s + 100,
                200,
            ));
            mem(
                &mut ev,
                s + 150,
                -40 * MIB * i64::from(step > 0),
                &mut reserved,
                warm,
            );
            for l in 0..4 {
                let t = s + 400 + l * 800;
                ev.push(x("cpu_op", "aten::linear", 1, t, 700));
                ev.push(x("cpu_op", "aten::addmm", 1, t + 100, 500));
                mem(&mut ev, t + 200, 120 * MIB, &mut reserved, warm);
                if warm {
                    // A one-off workspace while the first step picks its algorithms.
                    mem(&mut ev, t + 250, 150 * MIB, &mut reserved, warm);
                    mem(&mut ev, t + 300, -150 * MIB, &mut reserved, warm);
                }
            }
            for l in 0..4 {
                let t = s + 4_000 + l * 900;
                ev.push(x(
                    "cpu_op",
                    "autograd::engine::evaluate_function: AddmmBackward0",
                    2,
                    t,
                    800,
                ));
                ev.push(x("cpu_op", "aten::mm", 2, t + 100, 500));
                mem(&mut ev, t + 200, -120 * MIB, &mut reserved, warm);
                mem(&mut ev, t + 600, 10 * MIB, &mut reserved, warm);
            }
            ev.push(x(
                "user_annotation",
                "Optimizer.step#AdamW.step",
                1,
                s + 8_000,
                1_500,
            ));
            // Step 1 also creates the optimizer state.
            mem(
                &mut ev,
                s + 8_200,
                if warm { 80 * MIB } else { 0 },
                &mut reserved,
                warm,
            );
        }
        serde_json::to_vec(&json!({"schemaVersion": 1, "traceEvents": ev})).unwrap()
    }

    fn report_of(bytes: Vec<u8>) -> Report {
        let src = [TraceSource::Memory {
            name: "train.json".into(),
            bytes,
        }];
        analyze_sources(&src, Vec::new(), &Options::default(), &|_| {})
    }

    /// The `d` attribute of every `<path class="{class}" …>`.
    fn paths<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
        let tag = format!(r#"<path class="{class}" d=""#);
        svg.match_indices(&tag)
            .map(|(i, _)| {
                let rest = &svg[i + tag.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect()
    }

    /// The text of every `<text … class="small ytick" …>`.
    fn texts<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
        let tag = format!(r#"class="{class}""#);
        svg.match_indices(&tag)
            .map(|(i, _)| {
                let rest = &svg[i..];
                let s = rest.find('>').unwrap() + 1;
                &rest[s..rest.find("</text>").unwrap()]
            })
            .collect()
    }

    #[test]
    fn memory_panel_is_a_step_function_with_phases() {
        let report = report_of(training_trace());
        let svg = render(&report);
        if let Some(dir) = std::env::var_os("KINETRACE_SVG_OUT") {
            std::fs::write(std::path::Path::new(&dir).join("training.svg"), &svg).unwrap();
        }
        let alloc = paths(&svg, "alloc");
        assert_eq!(alloc.len(), 1, "{svg}");
        // Only moves, horizontal and vertical segments: no sloped line between samples.
        let cmds: Vec<char> = alloc[0]
            .split_whitespace()
            .map(|c| c.chars().next().unwrap())
            .collect();
        assert_eq!(cmds[0], 'M');
        assert!(
            cmds[1..].iter().all(|&c| c == 'H' || c == 'V'),
            "{}",
            alloc[0]
        );
        // One H and one V per sample after the first, and the hold to the end.
        let samples = report.memory[0].timeline.len();
        assert_eq!(cmds.len(), 1 + 2 * (samples - 1) + 1);
        assert_eq!(paths(&svg, "reserved").len(), 1);
        // Y ticks: round numbers in one unit, never a float artefact.
        let yt = texts(&svg, "small ytick");
        assert!(yt.len() >= 3, "{yt:?}");
        for t in &yt {
            let (num, unit) = t.split_once(' ').unwrap();
            assert_eq!(unit, "MiB", "{t}");
            assert!(num.len() <= 6 && num.parse::<f64>().is_ok(), "{t}");
        }
        assert_eq!(yt[0], "0 MiB");
        // Three steps, each with its three phases.
        for k in ["forward", "backward", "optimizer"] {
            let n = svg.matches(&format!(r#"class="phase {k}""#)).count();
            assert!(n >= 3, "{k}: {n}");
        }
        // Three steps with gaps between them: a start and an end line each.
        assert_eq!(svg.matches(r#"class="step-line""#).count(), 6);
        // The peak: step 1's last forward layer (weights + 4 activations + the workspace), under
        // the linear layer.
        assert!(
            svg.contains("peak 830.0 MiB in step 1 forward: aten::linear &gt; aten::addmm"),
            "{svg}"
        );
        // The warm-up, stated.
        let m = &report.memory[0];
        let note = m.first_step_note.as_deref().unwrap();
        assert!(
            note.starts_with("caching-allocator warm-up in step 1"),
            "{note}"
        );
        assert!(svg.contains("first step: caching-allocator warm-up in step 1"));
    }

    #[test]
    fn temporal_axis_and_empty_memory() {
        let mut ev = Vec::new();
        for (i, (name, dur)) in [("sgemm_kernel", 600), ("ncclKernel_AllReduce", 300)]
            .into_iter()
            .enumerate()
        {
            let c = 10 + i as i64;
            let t = 100 + i as i64 * 1000;
            ev.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t, "dur": 5, "args": {"correlation": c}}));
            ev.push(json!({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t + 10, "dur": dur, "args": {"stream": 7, "correlation": c, "device": 0}}));
        }
        let report = report_of(serde_json::to_vec(&json!({"traceEvents": ev})).unwrap());
        let svg = render(&report);
        let xt = texts(&svg, "small xtick");
        assert_eq!(xt, ["0%", "20%", "40%", "60%", "80%", "100%"]);
        assert!(svg.contains("no [memory] events"));
        assert!(svg.contains(r#"class="bar""#));
    }
}
