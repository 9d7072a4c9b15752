//! The one evaluator of the model table: an op's args (as the reader kept them) in, its FLOPs,
//! bytes and compute precision out.

use serde_json::Value;

use super::models::{dtype, Formula, Layout, Model, NormKind, Precision, Transposed, SCALAR_TYPES};

/// One input of an op, as `Input Dims` and `Input type` describe it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Input {
    /// A tensor: its dims (none for a 0-d tensor) and dtype name.
    Tensor { dims: Vec<i64>, dtype: String },
    /// A tensor list: each tensor's dims (torch writes no dtype for the elements).
    List(Vec<Vec<i64>>),
    /// Not a tensor (a scalar, an int list, `None`).
    Other,
}

/// An op's inputs, from `Input Dims`, `Input type`, `Input Strides` and `Concrete Inputs`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct OpArgs {
    pub inputs: Vec<Input>,
    /// `Input Strides` per input (`None` where absent or not a tensor): an input with a 0
    /// stride is read once per distinct element.
    pub strides: Vec<Option<Vec<i64>>>,
    /// `Concrete Inputs` (empty when the trace has none).
    pub concrete: Vec<String>,
}

fn int_list(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(Value::as_i64).collect()
}

impl OpArgs {
    /// Parses the reader's kept args (a compact JSON object). `None` without `Input Dims`.
    pub fn parse(text: &str) -> Option<OpArgs> {
        let v: Value = serde_json::from_str(text).ok()?;
        let dims = v.get("Input Dims")?.as_array()?;
        let empty = Vec::new();
        let types = v
            .get("Input type")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        let inputs = dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let ty = types.get(i).and_then(Value::as_str).unwrap_or("");
                if ty == "TensorList"
                    || d.as_array()
                        .and_then(|a| a.first())
                        .is_some_and(Value::is_array)
                {
                    let list: Option<Vec<Vec<i64>>> = d
                        .as_array()
                        .map(|a| a.iter().filter_map(int_list).collect());
                    return list.map_or(Input::Other, Input::List);
                }
                match int_list(d) {
                    Some(dims)
                        if dtype(ty).is_some() || (!dims.is_empty() && !is_scalar_type(ty)) =>
                    {
                        Input::Tensor {
                            dims,
                            dtype: ty.to_owned(),
                        }
                    }
                    _ => Input::Other,
                }
            })
            .collect();
        let strides = match v.get("Input Strides").and_then(Value::as_array) {
            Some(s) => s.iter().map(int_list).collect(),
            None => Vec::new(),
        };
        let concrete = v
            .get("Concrete Inputs")
            .and_then(Value::as_array)
            .map(|c| {
                c.iter()
                    .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Some(OpArgs {
            inputs,
            strides,
            concrete,
        })
    }

    fn tensor(&self, i: u8) -> Option<(&[i64], &str)> {
        match self.inputs.get(usize::from(i))? {
            Input::Tensor { dims, dtype } => Some((dims, dtype)),
            _ => None,
        }
    }

    fn concrete(&self, i: u8) -> Option<&str> {
        self.concrete
            .get(usize::from(i))
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// The bytes reading input `i` costs: its distinct elements (an expanded input, with a 0 in
    /// its `Input Strides`, repeats one element along that dim) times its dtype's size.
    fn read_bytes(&self, i: usize) -> Option<f64> {
        let Some(Input::Tensor { dims, dtype: t }) = self.inputs.get(i) else {
            return Some(0.0);
        };
        let size = f64::from(dtype(t)?.0);
        let distinct: f64 = match self.strides.get(i) {
            Some(Some(st)) if st.len() == dims.len() => dims
                .iter()
                .zip(st)
                .filter(|(_, &s)| s != 0)
                .map(|(&d, _)| d.max(0) as f64)
                .product(),
            _ => numel(dims),
        };
        Some(distinct * size)
    }

    /// Bytes of every tensor input read once (tensor lists need a dtype, which torch does not
    /// write).
    fn input_bytes(&self) -> Option<f64> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Input::Tensor { .. } => self.read_bytes(i),
                Input::List(l) if l.is_empty() => Some(0.0),
                Input::List(_) => None,
                Input::Other => Some(0.0),
            })
            .sum()
    }

    /// The tensor inputs, for display: `5×128, 128×128, 128` and their dtypes.
    pub fn shapes_text(&self) -> (String, String) {
        let mut shapes = Vec::new();
        let mut types: Vec<&str> = Vec::new();
        for x in &self.inputs {
            match x {
                Input::Tensor { dims, dtype } => {
                    shapes.push(if dims.is_empty() {
                        "scalar".to_owned()
                    } else {
                        dims.iter()
                            .map(i64::to_string)
                            .collect::<Vec<_>>()
                            .join("×")
                    });
                    let short = dtype.strip_prefix("c10::").unwrap_or(dtype);
                    if !types.contains(&short) {
                        types.push(short);
                    }
                }
                Input::List(l) => shapes.push(format!("{} tensors", l.len())),
                Input::Other => {}
            }
        }
        (shapes.join(", "), types.join(", "))
    }
}

fn is_scalar_type(ty: &str) -> bool {
    matches!(
        ty,
        "" | "Scalar" | "ScalarList" | "GenericList" | "None" | "Device" | "Layout"
    )
}

fn numel(dims: &[i64]) -> f64 {
    dims.iter().map(|&d| d.max(0) as f64).product()
}

fn tensor_bytes(dims: &[i64], dtype_name: &str) -> Option<f64> {
    dtype(dtype_name).map(|(size, _)| numel(dims) * f64::from(size))
}

fn precision_of(dtype_name: &str) -> Precision {
    dtype(dtype_name).map_or(Precision::Fp32, |(_, p)| p)
}

/// `"[2, 2]"`, `"2"` or `"[]"` as ints.
fn parse_ints(s: &str) -> Option<Vec<i64>> {
    let t = s.trim();
    let inner = t.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
    match inner {
        Some(body) if body.trim().is_empty() => Some(Vec::new()),
        Some(body) => body.split(',').map(|x| x.trim().parse().ok()).collect(),
        None => t.parse().ok().map(|v| vec![v]),
    }
}

/// `"[True, False, True]"` as bools.
fn parse_bools(s: &str) -> Option<Vec<bool>> {
    let body = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    body.split(',')
        .map(|x| match x.trim() {
            "True" | "true" | "1" => Some(true),
            "False" | "false" | "0" => Some(false),
            _ => None,
        })
        .collect()
}

/// A flag: `True`/`False`, or a number (non-zero is true: `custom_mask_type` 1 and 2 are causal).
fn parse_flag(s: &str) -> Option<bool> {
    match s.trim() {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        t => t.parse::<f64>().ok().map(|v| v != 0.0),
    }
}

/// numpy-style broadcast of two shapes.
fn broadcast(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let at = |s: &[i64], i: usize| -> i64 {
        let k = n - i;
        if k <= s.len() {
            s[s.len() - k]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            match (x, y) {
                _ if x == y => Some(x),
                (1, _) => Some(y),
                (_, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// What an op computed: the result of a model.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Work {
    pub flops: f64,
    /// `None` when a tensor's size is unknown (a tensor list, an unknown dtype).
    pub bytes: Option<f64>,
    /// The precision its math runs in.
    pub precision: Precision,
    /// The parameters beyond the shapes: `M=5 N=128 K=128`, `stride [2, 2]`, `causal`.
    pub label: String,
    /// A GEMM's `[B, M, N, K]`.
    pub gemm: Option<[i64; 4]>,
}

/// Evaluates `model` on an op called `name` with `args`; `Err` says why it cannot.
pub(crate) fn evaluate(model: &Model, name: &str, args: &OpArgs) -> Result<Work, &'static str> {
    match model.formula {
        Formula::Gemm {
            a,
            b,
            bias,
            b_nk,
            out,
        } => gemm(args, a, b, bias, b_nk, out),
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
        } => {
            let transposed = match transposed {
                Transposed::No => false,
                Transposed::Yes => true,
                Transposed::At(i) => args
                    .concrete(i)
                    .and_then(parse_flag)
                    .ok_or("no Concrete Inputs (stride, padding, dilation, groups)")?,
            };
            conv(
                args,
                x,
                w,
                bias,
                [stride, padding, dilation],
                transposed,
                output_padding,
                groups,
            )
        }
        Formula::ConvBackward {
            grad,
            x,
            w,
            transposed,
            groups,
            mask,
        } => conv_backward(args, grad, x, w, transposed, groups, mask),
        Formula::Attention {
            q,
            k,
            v,
            layout,
            causal,
            backward,
        } => attention(args, [q, k, v], layout, causal, backward),
        Formula::Elementwise { ops, bool_out } => elementwise(args, name, ops, bool_out),
        Formula::Fill => {
            let (dims, dt) = args.tensor(0).ok_or("no tensor input")?;
            Ok(Work {
                flops: 0.0,
                bytes: tensor_bytes(dims, dt),
                precision: precision_of(dt),
                label: String::new(),
                gemm: None,
            })
        }
        Formula::Copy { src, dst } => {
            let (sd, st) = args.tensor(src).ok_or("no source tensor")?;
            let written = match dst.and_then(|d| args.tensor(d)) {
                Some((dd, dt)) => tensor_bytes(dd, dt),
                None => tensor_bytes(sd, st),
            };
            Ok(Work {
                flops: 0.0,
                bytes: args
                    .read_bytes(usize::from(src))
                    .zip(written)
                    .map(|(r, w)| r + w),
                precision: precision_of(st),
                label: String::new(),
                gemm: None,
            })
        }
        Formula::Reduction { ops, dims } => {
            if args.tensor(1).is_some() {
                // `max(a, b)`, `min(a, b)`: the pointwise overloads.
                return elementwise(args, name, 1, false);
            }
            reduction(args, ops, dims)
        }
        Formula::RowWise { ops } => {
            let (dims, dt) = args.tensor(0).ok_or("no tensor input")?;
            let e = numel(dims);
            Ok(Work {
                flops: f64::from(ops) * e,
                bytes: args
                    .input_bytes()
                    .zip(tensor_bytes(dims, dt))
                    .map(|(r, w)| r + w),
                precision: vector_precision(dt),
                label: String::new(),
                gemm: None,
            })
        }
        Formula::Norm {
            kind,
            x,
            shape,
            weight,
            bias,
            ops,
            training,
            eval_ops,
            stats,
        } => norm(
            args,
            kind,
            x,
            shape,
            [weight, bias],
            [ops, eval_ops, stats],
            training,
        ),
        Formula::NormBackward {
            x,
            weight,
            mask,
            input_ops,
            weight_ops,
        } => norm_backward(args, x, weight, mask, input_ops, weight_ops),
        Formula::Foreach { ops } => {
            let Some(Input::List(list)) = args.inputs.first() else {
                return Err("no tensor list input");
            };
            let e: f64 = list.iter().map(|d| numel(d)).sum();
            Ok(Work {
                flops: f64::from(ops) * e,
                // Torch writes no dtype for a tensor list's elements.
                bytes: None,
                precision: Precision::Fp32,
                label: format!("{} tensors", list.len()),
                gemm: None,
            })
        }
        Formula::None => Err("no model for this op (category only)"),
    }
}

/// Elementwise ops compute in fp32 (fp64 for doubles) whatever the storage dtype.
fn vector_precision(dt: &str) -> Precision {
    if precision_of(dt) == Precision::Fp64 {
        Precision::Fp64
    } else {
        Precision::Fp32
    }
}

fn gemm(
    args: &OpArgs,
    a: u8,
    b: u8,
    bias: Option<u8>,
    b_nk: bool,
    out: Option<u8>,
) -> Result<Work, &'static str> {
    let (ad, at) = args.tensor(a).ok_or("no tensor A")?;
    let (bd, _) = args.tensor(b).ok_or("no tensor B")?;
    let (a_batch, m, k) = match ad {
        [] => return Err("A is a scalar"),
        [k] => (&[][..], 1, *k),
        [batch @ .., m, k] => (batch, *m, *k),
    };
    let (b_batch, kb, n) = match (bd, b_nk) {
        ([], _) => return Err("B is a scalar"),
        ([k], _) => (&[][..], *k, 1),
        ([batch @ .., n, k], true) => (batch, *k, *n),
        ([batch @ .., k, n], false) => (batch, *k, *n),
    };
    if k != kb {
        return Err("the inner dims of A and B differ");
    }
    let batch_dims = broadcast(a_batch, b_batch).ok_or("the batch dims do not broadcast")?;
    let batch = numel(&batch_dims);
    let has_bias = bias.and_then(|i| args.tensor(i)).is_some();
    let outputs = batch * m as f64 * n as f64;
    let flops = 2.0 * outputs * k as f64 + if has_bias { outputs } else { 0.0 };
    let out_dtype = out
        .and_then(|i| args.concrete(i))
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| SCALAR_TYPES.iter().find(|(v, _)| *v == n).map(|&(_, t)| t))
        .unwrap_or(at);
    let written = dtype(out_dtype).map(|(size, _)| outputs * f64::from(size));
    let b_total = batch as i64;
    let label = if b_total > 1 {
        format!("B={b_total} M={m} N={n} K={k}")
    } else {
        format!("M={m} N={n} K={k}")
    };
    Ok(Work {
        flops,
        bytes: args.input_bytes().zip(written).map(|(r, w)| r + w),
        precision: precision_of(at),
        label,
        gemm: Some([b_total, m, n, k]),
    })
}

/// Stride, padding and dilation per spatial dim (a single value applies to all).
fn spatial_params(args: &OpArgs, at: u8, spatial: usize, default: i64) -> Option<Vec<i64>> {
    let v = match args.concrete(at) {
        Some(s) => parse_ints(s)?,
        None => return None,
    };
    Some(match v.len() {
        0 => vec![default; spatial],
        1 => vec![v[0]; spatial],
        n if n == spatial => v,
        _ => return None,
    })
}

#[allow(clippy::too_many_arguments)]
fn conv(
    args: &OpArgs,
    x: u8,
    w: u8,
    bias: Option<u8>,
    [stride, padding, dilation]: [u8; 3],
    transposed: bool,
    output_padding: Option<u8>,
    groups: u8,
) -> Result<Work, &'static str> {
    let (xd, xt) = args.tensor(x).ok_or("no input tensor")?;
    let (wd, _) = args.tensor(w).ok_or("no weight tensor")?;
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err("input and weight dims do not fit a convolution");
    }
    let sp = xd.len() - 2;
    const MISSING: &str = "no Concrete Inputs (stride, padding, dilation, groups)";
    let s = spatial_params(args, stride, sp, 1).ok_or(MISSING)?;
    let p = spatial_params(args, padding, sp, 0).ok_or(MISSING)?;
    let d = spatial_params(args, dilation, sp, 1).ok_or(MISSING)?;
    let g = args
        .concrete(groups)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .ok_or(MISSING)?;
    let op = match output_padding.and_then(|i| args.concrete(i)) {
        Some(v) => match parse_ints(v) {
            Some(l) if l.len() == sp => l,
            Some(l) if l.len() == 1 => vec![l[0]; sp],
            _ => vec![0; sp],
        },
        None => vec![0; sp],
    };
    if s.iter().chain(&d).any(|&v| v <= 0) || g <= 0 {
        return Err("a stride, dilation or group count is not positive");
    }
    let input_spatial = &xd[2..];
    let kernel = &wd[2..];
    // Saturating: a damaged trace must give no model, not an overflow.
    let out_spatial: Vec<i64> = (0..sp)
        .map(|i| {
            let reach = d[i].saturating_mul(kernel[i].saturating_sub(1));
            if transposed {
                input_spatial[i]
                    .saturating_sub(1)
                    .saturating_mul(s[i])
                    .saturating_sub(p[i].saturating_mul(2))
                    .saturating_add(reach)
                    .saturating_add(op[i])
                    .saturating_add(1)
            } else {
                input_spatial[i]
                    .saturating_add(p[i].saturating_mul(2))
                    .saturating_sub(reach)
                    .saturating_sub(1)
                    / s[i]
                    + 1
            }
        })
        .collect();
    if out_spatial.iter().any(|&o| o <= 0) {
        return Err("the convolution's output would be empty");
    }
    let c_out = if transposed {
        wd[1].saturating_mul(g)
    } else {
        wd[0]
    };
    let n = xd[0] as f64;
    let macs_spatial = if transposed {
        numel(input_spatial)
    } else {
        numel(&out_spatial)
    };
    let outputs = n * c_out as f64 * numel(&out_spatial);
    let has_bias = bias.and_then(|i| args.tensor(i)).is_some();
    let flops = 2.0 * n * numel(wd) * macs_spatial + if has_bias { outputs } else { 0.0 };
    let mut label = format!("stride {s:?} pad {p:?}");
    if d.iter().any(|&v| v != 1) {
        label.push_str(&format!(" dilation {d:?}"));
    }
    if g != 1 {
        label.push_str(&format!(" groups {g}"));
    }
    if transposed {
        label.push_str(" transposed");
    }
    Ok(Work {
        flops,
        bytes: args
            .input_bytes()
            .zip(tensor_bytes(&[outputs as i64], xt))
            .map(|(r, w)| r + w),
        precision: precision_of(xt),
        label: label.replace(", ", ","),
        gemm: None,
    })
}

fn conv_backward(
    args: &OpArgs,
    grad: u8,
    x: u8,
    w: u8,
    transposed: u8,
    groups: u8,
    mask: u8,
) -> Result<Work, &'static str> {
    let (gd, _) = args.tensor(grad).ok_or("no grad_output tensor")?;
    let (xd, xt) = args.tensor(x).ok_or("no input tensor")?;
    let (wd, wt) = args.tensor(w).ok_or("no weight tensor")?;
    if xd.len() < 3 || wd.len() != xd.len() || gd.len() != xd.len() {
        return Err("grad, input and weight dims do not fit a convolution");
    }
    let mut label = String::new();
    let transposed = args
        .concrete(transposed)
        .and_then(parse_flag)
        .unwrap_or(false);
    let m = match args.concrete(mask).and_then(parse_bools) {
        Some(m) if m.len() == 3 => [m[0], m[1], m[2]],
        _ => {
            label.push_str("output_mask not in the trace: all three gradients counted");
            [true; 3]
        }
    };
    let g = args
        .concrete(groups)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(1);
    let n = xd[0] as f64;
    // grad_output has the forward output's shape; a transposed conv's MACs run over its input.
    let macs_spatial = if transposed {
        numel(&xd[2..])
    } else {
        numel(&gd[2..])
    };
    let pass = 2.0 * n * numel(wd) * macs_spatial;
    let outputs = numel(gd);
    let flops = pass * (f64::from(u8::from(m[0])) + f64::from(u8::from(m[1])))
        + if m[2] { outputs } else { 0.0 };
    let c_out = gd[1];
    let written = [
        (m[0], tensor_bytes(xd, xt)),
        (m[1], tensor_bytes(wd, wt)),
        (m[2], tensor_bytes(&[c_out], wt)),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|&(_, b)| b)
    .sum::<Option<f64>>();
    if label.is_empty() {
        let names: Vec<&str> = ["input", "weight", "bias"]
            .iter()
            .zip(m)
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect();
        label = format!("grad {}", names.join("+"));
        if g != 1 {
            label.push_str(&format!(" groups {g}"));
        }
        if transposed {
            label.push_str(" transposed");
        }
    }
    Ok(Work {
        flops,
        bytes: args.input_bytes().zip(written).map(|(r, w)| r + w),
        precision: precision_of(xt),
        label,
        gemm: None,
    })
}

fn attention(
    args: &OpArgs,
    [q, k, v]: [u8; 3],
    layout: Layout,
    causal: Option<u8>,
    backward: bool,
) -> Result<Work, &'static str> {
    let (qd, qt) = args.tensor(q).ok_or("no query tensor")?;
    let (kd, kt) = args.tensor(k).ok_or("no key tensor")?;
    let (vd, vt) = args.tensor(v).ok_or("no value tensor")?;
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return Err("q, k, v are not 4-D (variable-length attention is not modelled)");
    }
    // (batch, heads, sequence, head dim)
    let bhnd = |d: &[i64]| match layout {
        Layout::Bhnd => (d[0], d[1], d[2], d[3]),
        Layout::Bnhd => (d[0], d[2], d[1], d[3]),
    };
    let (b, h, nq, dqk) = bhnd(qd);
    let (_, hk, nk, _) = bhnd(kd);
    let (_, _, _, dv) = bhnd(vd);
    let is_causal = causal
        .and_then(|i| args.concrete(i))
        .and_then(parse_flag)
        .unwrap_or(false);
    let mut flops = 2.0 * b as f64 * h as f64 * nq as f64 * nk as f64 * (dqk as f64 + dv as f64);
    if is_causal {
        flops /= 2.0;
    }
    if backward {
        flops *= 2.5;
    }
    let written = if backward {
        [(qd, qt), (kd, kt), (vd, vt)]
            .iter()
            .map(|(d, t)| tensor_bytes(d, t))
            .sum::<Option<f64>>()
    } else {
        tensor_bytes(&[b, h, nq, dv], qt)
    };
    let mut label = format!("B={b} H={h} N={nq}");
    if nk != nq {
        label.push_str(&format!("/{nk}"));
    }
    label.push_str(&format!(" d={dqk}"));
    if dv != dqk {
        label.push_str(&format!(" dv={dv}"));
    }
    if hk != h {
        label.push_str(&format!(" Hkv={hk}"));
    }
    if is_causal {
        label.push_str(" causal");
    }
    Ok(Work {
        flops,
        bytes: args.input_bytes().zip(written).map(|(r, w)| r + w),
        precision: precision_of(qt),
        label,
        gemm: None,
    })
}

fn elementwise(args: &OpArgs, name: &str, ops: u8, bool_out: bool) -> Result<Work, &'static str> {
    let tensors: Vec<(&[i64], &str)> = args
        .inputs
        .iter()
        .filter_map(|x| match x {
            Input::Tensor { dims, dtype } => Some((&dims[..], dtype.as_str())),
            _ => None,
        })
        .collect();
    let (&(first_dims, first_type), rest) = tensors.split_first().ok_or("no tensor input")?;
    let mut shape = first_dims.to_vec();
    for (d, _) in rest {
        shape = broadcast(&shape, d).ok_or("the inputs do not broadcast")?;
    }
    let e = numel(&shape);
    // The output's dtype: in place, the first input's; else the widest (floats over ints).
    let rank = |t: &str| {
        dtype(t).map_or((false, 0), |(size, p)| {
            (!matches!(p, Precision::Int | Precision::Int8), size)
        })
    };
    let out_size = if bool_out {
        Some(1.0)
    } else if name.ends_with('_') {
        dtype(first_type).map(|(s, _)| f64::from(s))
    } else {
        tensors
            .iter()
            .map(|(_, t)| *t)
            .max_by_key(|t| rank(t))
            .and_then(dtype)
            .map(|(s, _)| f64::from(s))
    };
    let widest = tensors
        .iter()
        .map(|(_, t)| *t)
        .max_by_key(|t| rank(t))
        .unwrap_or(first_type);
    Ok(Work {
        flops: f64::from(ops) * e,
        bytes: args.input_bytes().zip(out_size).map(|(r, s)| r + e * s),
        precision: vector_precision(widest),
        label: String::new(),
        gemm: None,
    })
}

fn reduction(args: &OpArgs, ops: u8, dims: Option<u8>) -> Result<Work, &'static str> {
    let (xd, xt) = args.tensor(0).ok_or("no tensor input")?;
    let e = numel(xd);
    let reduced: Vec<usize> = match dims.and_then(|i| args.concrete(i)).and_then(parse_ints) {
        Some(list) if !list.is_empty() => list
            .iter()
            .map(|&d| {
                let r = xd.len() as i64;
                (if d < 0 { d + r } else { d }) as usize
            })
            .collect(),
        _ => (0..xd.len()).collect(),
    };
    let kept: f64 = xd
        .iter()
        .enumerate()
        .filter(|(i, _)| !reduced.contains(i))
        .map(|(_, &d)| d.max(0) as f64)
        .product();
    Ok(Work {
        flops: f64::from(ops) * e,
        bytes: tensor_bytes(xd, xt)
            .zip(dtype(xt))
            .map(|(r, (s, _))| r + kept * f64::from(s)),
        precision: vector_precision(xt),
        label: if reduced.len() == xd.len() {
            "all dims".into()
        } else {
            format!("dims {reduced:?}")
        },
        gemm: None,
    })
}

fn norm(
    args: &OpArgs,
    kind: NormKind,
    x: u8,
    shape: Option<u8>,
    [weight, bias]: [Option<u8>; 2],
    [ops, eval_ops, stats]: [u8; 3],
    training: Option<u8>,
) -> Result<Work, &'static str> {
    let (xd, xt) = args.tensor(x).ok_or("no input tensor")?;
    let e = numel(xd);
    let has = |i: Option<u8>| i.and_then(|i| args.tensor(i)).is_some();
    let (w, b) = (has(weight), has(bias));
    let eval_mode = training
        .and_then(|i| args.concrete(i))
        .and_then(parse_flag)
        .is_some_and(|t| !t);
    let per_element = if eval_mode { eval_ops } else { ops } + u8::from(w) + u8::from(b);
    // Rows of statistics (fp32) the forward writes.
    let rows = match kind {
        NormKind::Layer | NormKind::Rms => {
            let normalized = shape
                .and_then(|i| args.concrete(i))
                .and_then(parse_ints)
                .filter(|l| !l.is_empty())
                .map(|l| numel(&l))
                .or_else(|| weight.and_then(|i| args.tensor(i)).map(|(d, _)| numel(d)))
                .unwrap_or_else(|| xd.last().map_or(1.0, |&d| d as f64));
            e / normalized.max(1.0)
        }
        NormKind::Batch if eval_mode => 0.0,
        NormKind::Batch => xd.get(1).map_or(0.0, |&c| c as f64),
        NormKind::Group => {
            let groups = shape
                .and_then(|i| args.concrete(i))
                .and_then(|s| s.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            xd.first().map_or(0.0, |&n| n as f64) * groups
        }
    };
    let written = tensor_bytes(xd, xt).map(|o| o + rows * f64::from(stats) * 4.0);
    Ok(Work {
        flops: f64::from(per_element) * e,
        bytes: args.input_bytes().zip(written).map(|(r, w)| r + w),
        precision: vector_precision(xt),
        label: if eval_mode {
            "eval".into()
        } else {
            String::new()
        },
        gemm: None,
    })
}

fn norm_backward(
    args: &OpArgs,
    x: u8,
    weight: Option<u8>,
    mask: Option<u8>,
    input_ops: u8,
    weight_ops: u8,
) -> Result<Work, &'static str> {
    let (xd, xt) = args.tensor(x).ok_or("no input tensor")?;
    let e = numel(xd);
    let w = weight.and_then(|i| args.tensor(i));
    let m = match mask.and_then(|i| args.concrete(i)).and_then(parse_bools) {
        Some(m) if m.len() == 3 => [m[0], m[1] && w.is_some(), m[2] && w.is_some()],
        _ => [true, w.is_some(), w.is_some()],
    };
    let flops = e
        * (f64::from(input_ops) * f64::from(u8::from(m[0]))
            + f64::from(weight_ops) * f64::from(u8::from(m[1]))
            + f64::from(u8::from(m[2])));
    let wb = w.and_then(|(d, t)| tensor_bytes(d, t)).unwrap_or(0.0);
    let written = tensor_bytes(xd, xt).map(|xb| {
        xb * f64::from(u8::from(m[0]))
            + wb * (f64::from(u8::from(m[1])) + f64::from(u8::from(m[2])))
    });
    Ok(Work {
        flops,
        bytes: args.input_bytes().zip(written).map(|(r, w)| r + w),
        precision: vector_precision(xt),
        label: String::new(),
        gemm: None,
    })
}
