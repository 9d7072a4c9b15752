//! `docs/analyze.md`'s model and peaks tables, generated from [`MODELS`] and [`DEVICES`] (a test
//! checks the page; `KINETRACE_BLESS=1 cargo test -p kinetrace-analysis --lib efficiency`
//! rewrites it).

use super::models::{Formula, Layout, Transposed, KERNEL_CATEGORIES, MODELS};
use super::peaks::DEVICES;

fn pos(i: u8) -> String {
    format!("#{i}")
}

fn opt(i: Option<u8>) -> String {
    i.map_or("–".into(), pos)
}

/// What a formula computes, with the argument positions it reads.
fn describe(f: &Formula) -> String {
    match *f {
        Formula::Gemm {
            a,
            b,
            bias,
            b_nk,
            out,
        } => format!(
            "GEMM: A {}, B {}{}, bias {}{}. FLOPs 2·B·M·N·K (+ B·M·N with a bias)",
            pos(a),
            pos(b),
            if b_nk { " as [N, K]" } else { "" },
            opt(bias),
            out.map_or(String::new(), |o| format!(", out dtype {}", pos(o)))
        ),
        Formula::Conv {
            x,
            w,
            bias,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
        } => format!(
            "conv: x {}, w {}, bias {}, stride {}, padding {}, dilation {}, transposed {}, \
             output padding {}, groups {}. FLOPs 2·N·prod(w)·prod(out spatial) (input spatial when \
             transposed) + outputs with a bias",
            pos(x),
            pos(w),
            opt(bias),
            pos(stride),
            pos(padding),
            pos(dilation),
            match transposed {
                Transposed::No => "no".into(),
                Transposed::Yes => "yes".into(),
                Transposed::At(i) => pos(i),
            },
            opt(output_padding),
            pos(groups)
        ),
        Formula::ConvBackward {
            grad,
            x,
            w,
            transposed,
            groups,
            mask,
        } => format!(
            "conv backward: grad {}, x {}, w {}, transposed {}, groups {}, output_mask {}. FLOPs \
             the forward's per grad_input and grad_weight asked for, + outputs for grad_bias",
            pos(grad),
            pos(x),
            pos(w),
            pos(transposed),
            pos(groups),
            pos(mask)
        ),
        Formula::Attention {
            q,
            k,
            v,
            layout,
            causal,
            backward,
        } => format!(
            "attention{}: q {}, k {}, v {} in {}, causal {}. FLOPs 2·B·H·N_q·N_kv·(d + d_v), ½ \
             causal{}",
            if backward { " backward" } else { "" },
            pos(q),
            pos(k),
            pos(v),
            match layout {
                Layout::Bhnd => "[B, H, N, d]",
                Layout::Bnhd => "[B, N, H, d]",
            },
            opt(causal),
            if backward { ", × 2.5" } else { "" }
        ),
        Formula::Elementwise { ops, bool_out } => format!(
            "pointwise: {ops} FLOP per element of the broadcast output{}",
            if bool_out { ", written as bool" } else { "" }
        ),
        Formula::Fill => "fill: writes input #0, no FLOPs".into(),
        Formula::Copy { src, dst } => format!(
            "copy: reads {}, writes {}; no FLOPs",
            pos(src),
            dst.map_or("a tensor like it".into(), pos)
        ),
        Formula::Reduction { ops, dims } => format!(
            "reduction of #0 over the dims at {} (all when empty): {ops} FLOP(s) per input element",
            opt(dims)
        ),
        Formula::RowWise { ops } => {
            format!(
                "row-wise: {ops} FLOPs per element; reads the tensor inputs, writes one like #0"
            )
        }
        Formula::Norm {
            x,
            weight,
            bias,
            ops,
            eval_ops,
            stats,
            training,
            ..
        } => format!(
            "norm: x {}, weight {}, bias {}{}. FLOPs {ops} per element (+1 per weight, bias{}); \
             writes the output and {stats} fp32 statistic(s) per row/channel/group",
            pos(x),
            opt(weight),
            opt(bias),
            training.map_or(String::new(), |t| format!(", training {}", pos(t))),
            if training.is_some() {
                format!("; {eval_ops} in eval mode")
            } else {
                String::new()
            }
        ),
        Formula::NormBackward {
            x,
            weight,
            mask,
            input_ops,
            weight_ops,
        } => format!(
            "norm backward: x {}, weight {}, output_mask {}. FLOPs per element {input_ops} (grad \
             input) + {weight_ops} (grad weight) + 1 (grad bias), as the mask asks",
            pos(x),
            opt(weight),
            opt(mask)
        ),
        Formula::Foreach { ops } => {
            format!("foreach: {ops} FLOP per element of the first tensor list (bytes unknown: no dtype)")
        }
        Formula::None => "category only".into(),
    }
}

/// The model table as Markdown.
pub fn models_markdown() -> String {
    let mut out = String::from(
        "| ops | category | formula (argument positions in `Input Dims` / `Concrete Inputs`) | source |\n|---|---|---|---|\n",
    );
    for m in MODELS {
        let ops: Vec<String> = m.ops.iter().map(|o| format!("`{o}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            ops.join(", "),
            m.category.as_str(),
            describe(&m.formula).replace('|', "\\|"),
            m.source
        ));
    }
    out.push_str(
        "\nKernels without a modelled op take the category of the first of these substrings their \
         lower-cased name contains: ",
    );
    let pats: Vec<String> = KERNEL_CATEGORIES
        .iter()
        .map(|(p, c)| format!("`{p}` {}", c.as_str()))
        .collect();
    out.push_str(&pats.join(", "));
    out.push_str("; otherwise other.\n");
    out
}

/// The peaks table as Markdown.
pub fn peaks_markdown() -> String {
    let mut out = String::from(
        "| device | `deviceProperties` | fp64 | fp64 matrix | fp32 | fp32 matrix | tf32 | fp16 | bf16 | fp8 | int8 | fp4 | TB/s | source |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let n = |v: f64| {
        if v == 0.0 {
            "–".to_owned()
        } else {
            format!("{v}")
        }
    };
    for d in DEVICES {
        let m = &d.matches;
        let mut how = m
            .names
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(" or ");
        if !m.not.is_empty() {
            how.push_str(&format!(
                ", not {}",
                m.not
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(s) = m.sms {
            how.push_str(&format!(", {s} SMs/CUs"));
        }
        if m.mem_gib != (0.0, f64::INFINITY) {
            if m.mem_gib.1.is_finite() {
                how.push_str(&format!(", {}–{} GiB", m.mem_gib.0, m.mem_gib.1));
            } else {
                how.push_str(&format!(", ≥ {} GiB", m.mem_gib.0));
            }
        }
        let p = &d.peaks;
        out.push_str(&format!(
            "| {} | {how} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            p.name,
            n(p.fp64),
            n(p.fp64_matrix),
            n(p.fp32),
            n(p.fp32_matrix),
            n(p.tf32),
            n(p.fp16),
            n(p.bf16),
            n(p.fp8),
            n(p.int8),
            n(p.fp4),
            n(p.bandwidth),
            d.source
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Checks (or with `KINETRACE_BLESS` rewrites) the text between `begin` and `end`.
    fn check(text: &mut String, name: &str, table: &str) -> bool {
        let begin = format!(
            "<!-- BEGIN {name} (generated from crates/analysis/src/efficiency: KINETRACE_BLESS=1 cargo test -p kinetrace-analysis --lib efficiency) -->\n"
        );
        let end = format!("<!-- END {name} -->");
        let (Some(a), Some(b)) = (text.find(&begin), text.find(&end)) else {
            panic!("docs/analyze.md lacks the {name} markers");
        };
        if &text[a + begin.len()..b] == table {
            return true;
        }
        *text = format!("{}{begin}{table}{}", &text[..a], &text[b..]);
        false
    }

    #[test]
    fn docs_analyze_md_matches_the_tables() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/analyze.md");
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        let ok = check(&mut text, "MODEL TABLE", &models_markdown())
            & check(&mut text, "PEAKS TABLE", &peaks_markdown());
        if !ok {
            if std::env::var_os("KINETRACE_BLESS").is_some() {
                std::fs::write(&path, text).unwrap();
                return;
            }
            panic!(
                "docs/analyze.md is out of date with the model or peaks table; run \
                 KINETRACE_BLESS=1 cargo test -p kinetrace-analysis --lib efficiency"
            );
        }
    }
}
