//! The efficiency and collectives sections as terminal tables and CSV files.

use kinetrace_analysis::collectives::Collectives;
use kinetrace_analysis::efficiency::{Bound, Efficiency};
use kinetrace_analysis::Report;

use crate::csv::{field, num};
use crate::table::{clip, dur_us, Align, Table};

/// A rate with about three significant digits.
fn rate(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(0.0) => "0".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) if v >= 1.0 => format!("{v:.2}"),
        Some(v) if v >= 0.001 => format!("{v:.4}"),
        Some(v) => format!("{v:.2e}"),
    }
}

/// Bytes in decimal units (as TB/s and GB/s are decimal).
fn dec_bytes(b: Option<f64>) -> String {
    match b {
        None => "?".into(),
        Some(b) if b < 1e3 => format!("{b:.0} B"),
        Some(b) if b < 1e6 => format!("{:.1} kB", b / 1e3),
        Some(b) if b < 1e9 => format!("{:.1} MB", b / 1e6),
        Some(b) => format!("{:.2} GB", b / 1e9),
    }
}

fn share(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// The device line(s): which table row each trace's device matched, and its peaks.
fn devices(e: &Efficiency) -> String {
    let mut lines: Vec<String> = Vec::new();
    for d in &e.devices {
        let Some(p) = &d.peaks else { continue };
        let line = format!(
            "device: {} → {} (peaks: fp32 {} / matrix {}, tf32 {}, bf16 {}, fp16 {}, fp8 {} TFLOP/s; {} TB/s{}){}",
            d.name.as_deref().unwrap_or("?"),
            p.name,
            rate(Some(p.fp32)),
            rate(Some(p.fp32_matrix)),
            rate(Some(p.tf32)),
            rate(Some(p.bf16)),
            rate(Some(p.fp16)),
            rate(Some(p.fp8)),
            rate(Some(p.bandwidth)),
            d.bandwidth_tb_s
                .filter(|b| *b != p.bandwidth)
                .map_or(String::new(), |b| format!("; --peak-bandwidth {b}")),
            d.peak_tflops_override
                .map_or(String::new(), |t| format!(", --peak-tflops {t} for every op")),
        );
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    if lines.is_empty() {
        if let Some(d) = e
            .devices
            .iter()
            .find(|d| d.peak_tflops_override.is_some() && d.bandwidth_tb_s.is_some())
        {
            lines.push(format!(
                "peaks from the command line: {} TFLOP/s for every op, {} TB/s",
                rate(d.peak_tflops_override),
                rate(d.bandwidth_tb_s)
            ));
        }
    }
    let mut out = String::new();
    for l in lines {
        out.push_str(&format!("  {l}\n"));
    }
    for n in &e.notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    out
}

/// The efficiency section: categories, then op groups against the roofline.
pub fn efficiency_text(r: &Report, top: usize) -> String {
    let e = &r.efficiency;
    let mut out = String::new();
    if !e.categories.is_empty() {
        let mut t = Table::new(
            "\nGPU time by category, all ranks (summed durations of kernels, copies and sets; a \
             kernel counts in its op's category)",
            &[
                ("category", Align::Left),
                ("time", Align::Right),
                ("share", Align::Right),
                ("GPU rows", Align::Right),
            ],
        );
        for c in &e.categories {
            t.row(vec![
                c.category.as_str().into(),
                dur_us(c.time_us.0),
                share(c.share.get()),
                c.rows.to_string(),
            ]);
        }
        out.push_str(&t.render());
    }
    if e.ops.is_empty() {
        let why = if e.unmodelled.iter().any(|u| u.why.starts_with("no shapes")) {
            "the traces have no shapes (record with record_shapes=True, or `kinetrace record \
             --record-shapes`)"
        } else {
            "no op with a model ran"
        };
        out.push_str(&format!(
            "\nOps against the roofline: none modelled: {why}\n"
        ));
        out.push_str(&devices(e));
        return out;
    }
    let on_gpu = e.ops.iter().any(|o| o.on_gpu);
    let mut t = Table::new(
        if on_gpu {
            "\nOps against the roofline, all ranks (most kernel time first; FLOPs and bytes from \
             each op's shapes; rates are totals over kernel time)"
        } else {
            "\nOps' FLOPs and bytes, all ranks (CPU time: the traces have no GPU rows)"
        },
        &[
            ("op", Align::Left),
            ("shapes", Align::Left),
            ("dtype", Align::Left),
            ("params", Align::Left),
            ("calls", Align::Right),
            ("time", Align::Right),
            ("TFLOP/s", Align::Right),
            ("TB/s", Align::Right),
            ("FLOP/B", Align::Right),
            ("bound", Align::Left),
            ("of roofline", Align::Right),
        ],
    );
    for o in &e.ops {
        t.row(vec![
            clip(&o.op, 48),
            clip(&o.shapes, 40),
            clip(&o.dtypes, 16),
            clip(&o.params, 32),
            o.calls.to_string(),
            dur_us(o.time_us.0),
            rate(o.tflops_per_s.get()),
            rate(o.tb_per_s.get()),
            rate(o.intensity.get()),
            match o.bound {
                Some(Bound::Compute) => "compute".into(),
                Some(Bound::Memory) => "memory".into(),
                None => "-".into(),
            },
            share(o.roofline_fraction.get()),
        ]);
    }
    t.truncate(top);
    out.push_str(&t.render());
    out.push_str(&devices(e));
    if let Some(m) = e.modelled_share.get() {
        let mut line = format!(
            "  modelled ops hold {} of the ops' GPU time",
            share(Some(m))
        );
        let rest: Vec<String> = e
            .unmodelled
            .iter()
            .take(5)
            .map(|u| format!("{} {} ({})", clip(&u.op, 50), dur_us(u.time_us.0), u.why))
            .collect();
        if !rest.is_empty() {
            line.push_str(&format!("; not modelled: {}", rest.join("; ")));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The collectives section: rows by kind, group, dtype and size; waits per rank.
pub fn collectives_text(r: &Report, top: usize) -> String {
    let c = &r.collectives;
    let mut out = String::new();
    let mut t = Table::new(
        "\nCollectives, all ranks (size S and bus bandwidth as nccl-tests define them; GB/s = \
         10⁹ B/s; transfer = the shortest rank's time of each matched instance)",
        &[
            ("kind", Align::Left),
            ("group", Align::Left),
            ("dtype", Align::Left),
            ("size", Align::Right),
            ("n", Align::Right),
            ("algorithm", Align::Left),
            ("calls", Align::Right),
            ("time", Align::Right),
            ("algbw GB/s", Align::Right),
            ("busbw GB/s", Align::Right),
            ("matched", Align::Right),
            ("transfer", Align::Right),
            ("transfer busbw", Align::Right),
        ],
    );
    for x in &c.rows {
        t.row(vec![
            x.kind.into(),
            clip(&x.group, 24),
            x.dtype.clone().unwrap_or_else(|| "?".into()),
            dec_bytes(x.bytes),
            x.group_size.map_or("?".into(), |n| n.to_string()),
            x.algorithm.clone().unwrap_or_else(|| "-".into()),
            x.calls.to_string(),
            dur_us(x.time_us.0),
            rate(x.algbw_gb_s.get()),
            rate(x.busbw_gb_s.get()),
            x.matched.to_string(),
            if x.matched > 0 {
                dur_us(x.transfer_us.0)
            } else {
                "-".into()
            },
            rate(x.transfer_busbw_gb_s.get()),
        ]);
    }
    t.truncate(top);
    out.push_str(&t.render());
    if !c.waits.is_empty() {
        let mut w = Table::new(
            "\nWaiting in collectives per rank (a matched kernel's time beyond the shortest \
             rank's: the wait for the last rank to arrive)",
            &[
                ("rank", Align::Right),
                ("cycle", Align::Right),
                ("collectives", Align::Right),
                ("matched", Align::Right),
                ("wait", Align::Right),
                ("per step", Align::Right),
                ("of step", Align::Right),
                ("waited for", Align::Right),
                ("last to arrive", Align::Right),
                ("others' wait", Align::Right),
            ],
        );
        for x in &c.waits {
            w.row(vec![
                x.rank.to_string(),
                x.cycle.to_string(),
                x.collectives.to_string(),
                x.matched.to_string(),
                dur_us(x.wait_us.0),
                dur_us(x.wait_per_step_us.0),
                share(x.wait_share.get()),
                x.waited_for.map_or("-".into(), |r| format!("rank {r}")),
                x.last_count.to_string(),
                dur_us(x.caused_wait_us.0),
            ]);
        }
        w.truncate(top);
        out.push_str(&w.render());
    }
    if let Some(s) = &c.straggler {
        out.push_str(&format!(
            "  rank {} arrives last in {} of its {} matched collectives: the other ranks wait a \
             median {} per step for it ({} of their step)\n",
            s.rank,
            s.last_count,
            s.matched,
            dur_us(s.others_wait_per_step_us.0),
            share(s.others_wait_share.get())
        ));
    }
    for n in &c.notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    out
}

fn line(cells: &[String]) -> String {
    let mut s = cells.iter().map(|c| field(c)).collect::<Vec<_>>().join(",");
    s.push('\n');
    s
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, num)
}

/// `(file name, CSV text)` of the efficiency section.
pub fn efficiency_csv(e: &Efficiency) -> Vec<(&'static str, String)> {
    let mut ops = String::from(
        "op,shapes,dtypes,params,category,precision,calls,on_gpu,time_us,flops,bytes,tflops_per_s,\
         tb_per_s,intensity,roofline_us,roofline_fraction,bound,no_roofline,ranks\n",
    );
    for o in &e.ops {
        ops.push_str(&line(&[
            o.op.clone(),
            o.shapes.clone(),
            o.dtypes.clone(),
            o.params.clone(),
            o.category.as_str().into(),
            o.precision.as_str().into(),
            o.calls.to_string(),
            o.on_gpu.to_string(),
            num(o.time_us.0),
            num(o.flops),
            opt(o.bytes),
            opt(o.tflops_per_s.get()),
            opt(o.tb_per_s.get()),
            opt(o.intensity.get()),
            opt(o.roofline_us.map(|u| u.0)),
            opt(o.roofline_fraction.get()),
            match o.bound {
                Some(Bound::Compute) => "compute".into(),
                Some(Bound::Memory) => "memory".into(),
                None => String::new(),
            },
            o.no_roofline.clone().unwrap_or_default(),
            o.ranks
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ]));
    }
    let mut cats = String::from("category,time_us,share,gpu_rows\n");
    for c in &e.categories {
        cats.push_str(&line(&[
            c.category.as_str().into(),
            num(c.time_us.0),
            opt(c.share.get()),
            c.rows.to_string(),
        ]));
    }
    let mut devs = String::from(
        "rank,cycle,name,matched,peak_fp32_tflops,peak_bf16_tflops,peak_tflops_override,\
         bandwidth_tb_s,no_roofline\n",
    );
    for d in &e.devices {
        devs.push_str(&line(&[
            d.rank.to_string(),
            d.cycle.to_string(),
            d.name.clone().unwrap_or_default(),
            d.matched.unwrap_or("").into(),
            opt(d.peaks.map(|p| p.fp32)),
            opt(d.peaks.map(|p| p.bf16)),
            opt(d.peak_tflops_override),
            opt(d.bandwidth_tb_s),
            d.no_roofline.clone().unwrap_or_default(),
        ]));
    }
    let mut un = String::from("op,category,calls,time_us,why\n");
    for u in &e.unmodelled {
        un.push_str(&line(&[
            u.op.clone(),
            u.category.as_str().into(),
            u.calls.to_string(),
            num(u.time_us.0),
            u.why.clone(),
        ]));
    }
    vec![
        ("efficiency_ops.csv", ops),
        ("efficiency_categories.csv", cats),
        ("efficiency_devices.csv", devs),
        ("efficiency_unmodelled.csv", un),
    ]
}

/// `(file name, CSV text)` of the collectives section.
pub fn collectives_csv(c: &Collectives) -> Vec<(&'static str, String)> {
    let mut rows = String::from(
        "kind,group,dtype,bytes,group_size,algorithm,source,calls,time_us,algbw_gb_s,busbw_gb_s,\
         matched,transfer_us,transfer_algbw_gb_s,transfer_busbw_gb_s,ranks\n",
    );
    for x in &c.rows {
        rows.push_str(&line(&[
            x.kind.into(),
            x.group.clone(),
            x.dtype.clone().unwrap_or_default(),
            opt(x.bytes),
            x.group_size.map_or_else(String::new, |n| n.to_string()),
            x.algorithm.clone().unwrap_or_default(),
            format!("{:?}", x.source).to_lowercase(),
            x.calls.to_string(),
            num(x.time_us.0),
            opt(x.algbw_gb_s.get()),
            opt(x.busbw_gb_s.get()),
            x.matched.to_string(),
            num(x.transfer_us.0),
            opt(x.transfer_algbw_gb_s.get()),
            opt(x.transfer_busbw_gb_s.get()),
            x.ranks
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ]));
    }
    let mut waits = String::from(
        "rank,cycle,collectives,matched,wait_us,wait_per_step_us,wait_share,waited_for,\
         last_count,caused_wait_us\n",
    );
    for w in &c.waits {
        waits.push_str(&line(&[
            w.rank.to_string(),
            w.cycle.to_string(),
            w.collectives.to_string(),
            w.matched.to_string(),
            num(w.wait_us.0),
            num(w.wait_per_step_us.0),
            opt(w.wait_share.get()),
            w.waited_for.map_or_else(String::new, |r| r.to_string()),
            w.last_count.to_string(),
            num(w.caused_wait_us.0),
        ]));
    }
    vec![("collectives.csv", rows), ("collective_waits.csv", waits)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_decimal_and_rates_keep_three_digits() {
        assert_eq!(dec_bytes(Some(71168.0)), "71.2 kB");
        assert_eq!(dec_bytes(Some(8_196_000.0)), "8.2 MB");
        assert_eq!(dec_bytes(None), "?");
        assert_eq!(rate(Some(312.0)), "312");
        assert_eq!(rate(Some(0.006719)), "0.0067");
        assert_eq!(rate(Some(1.234)), "1.23");
        assert_eq!(rate(None), "-");
    }
}
