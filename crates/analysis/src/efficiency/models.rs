//! The performance models as data: one row per op family (its ops, its category and its formula),
//! the category of a kernel by its name, and the size of each dtype. [`super::eval`] is the one
//! evaluator that reads them; `docs/analyze.md`'s model table is generated from [`MODELS`].
//!
//! Argument positions are those of torch's `Input Dims` / `Input type` / `Concrete Inputs`
//! (the op's schema in `native_functions.yaml`), checked on traces torch 2.15 writes.

use serde::Serialize;

/// Where an op's GPU time goes in the category breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Category {
    /// Matrix multiplications.
    #[serde(rename = "GEMM")]
    Gemm,
    /// Convolutions, forward and backward.
    #[serde(rename = "conv")]
    Conv,
    /// Scaled-dot-product / flash attention, forward and backward.
    #[serde(rename = "attention")]
    Attention,
    /// Pointwise math (never a copy).
    #[serde(rename = "elementwise")]
    Elementwise,
    /// Reductions and softmax.
    #[serde(rename = "reduction")]
    Reduction,
    /// Layer, RMS, batch and group norm, forward and backward.
    #[serde(rename = "norm")]
    Norm,
    /// Collective-communication kernels.
    #[serde(rename = "communication")]
    Communication,
    /// Copies: `gpu_memcpy` rows, copy kernels and copy ops.
    #[serde(rename = "memcpy")]
    Memcpy,
    /// `gpu_memset` rows.
    #[serde(rename = "memset")]
    Memset,
    /// Everything else.
    #[serde(rename = "other")]
    Other,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 10] = [
        Category::Gemm,
        Category::Conv,
        Category::Attention,
        Category::Elementwise,
        Category::Reduction,
        Category::Norm,
        Category::Communication,
        Category::Memcpy,
        Category::Memset,
        Category::Other,
    ];

    /// The name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Gemm => "GEMM",
            Category::Conv => "conv",
            Category::Attention => "attention",
            Category::Elementwise => "elementwise",
            Category::Reduction => "reduction",
            Category::Norm => "norm",
            Category::Communication => "communication",
            Category::Memcpy => "memcpy",
            Category::Memset => "memset",
            Category::Other => "other",
        }
    }

    /// Position in [`Category::ALL`].
    pub(crate) fn index(self) -> usize {
        Category::ALL.iter().position(|&c| c == self).unwrap_or(9)
    }

    /// Whether its ops run on matrix units (tensor/matrix cores) and so get the matrix peak.
    pub(crate) fn is_matrix(self) -> bool {
        matches!(self, Category::Gemm | Category::Conv | Category::Attention)
    }
}

/// The memory layout of attention's q/k/v.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `[batch, heads, sequence, head_dim]` (`scaled_dot_product_*`).
    Bhnd,
    /// `[batch, sequence, heads, head_dim]` (`_flash_attention_*`, `flash_attn::*`).
    Bnhd,
}

/// Whether a convolution is transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transposed {
    /// Never (`conv2d`, `cudnn_convolution`).
    No,
    /// Always (`cudnn_convolution_transpose`).
    Yes,
    /// Read from this `Concrete Inputs` position (`convolution`).
    At(u8),
}

/// What a norm normalises over, which sets its statistics' count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormKind {
    /// Over the trailing `normalized_shape` dims: one mean and rstd per row.
    Layer,
    /// Over the trailing `normalized_shape` dims, no mean: one rstd per row.
    Rms,
    /// Over all but the channel dim (1): one mean and invstd per channel.
    Batch,
    /// Over groups of channels: one mean and rstd per (sample, group).
    Group,
}

/// What an op family computes, as a formula over the op's inputs (positions in `Input Dims`,
/// `Input type` and `Concrete Inputs`). Bytes are always every tensor input read once (its
/// distinct elements, by `Input Strides`) plus every output written once, each in its own dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Formula {
    /// C = A·B over a batch: A `[.., M, K]`, B `[.., K, N]` (`[N, K]` when `b_nk`, as
    /// `linear`'s weight); the batch is the broadcast of the leading dims (`matmul` also takes
    /// 1-D operands). FLOPs = 2·B·M·N·K, + B·M·N with a bias. Output: `[.., M, N]` in A's
    /// dtype (or `out_dtype` at `Concrete Inputs[out]`, a ScalarType number).
    Gemm {
        a: u8,
        b: u8,
        bias: Option<u8>,
        b_nk: bool,
        out: Option<u8>,
    },
    /// Convolution forward. FLOPs = 2·N·prod(w)·prod(output spatial) (prod(input spatial) when
    /// transposed), + output elements with a bias (torch's flop counter). Stride, padding,
    /// dilation and groups from `Concrete Inputs`.
    Conv {
        x: u8,
        w: u8,
        bias: Option<u8>,
        stride: u8,
        padding: u8,
        dilation: u8,
        transposed: Transposed,
        output_padding: Option<u8>,
        groups: u8,
    },
    /// `convolution_backward`: the forward FLOPs (without bias) for each of grad_input and
    /// grad_weight that `output_mask` asks for, + output elements for grad_bias (the spatial
    /// sizes come from grad_output, so stride and padding are not needed).
    ConvBackward {
        grad: u8,
        x: u8,
        w: u8,
        transposed: u8,
        groups: u8,
        mask: u8,
    },
    /// Attention: FLOPs = 2·B·H·N_q·N_kv·(d_qk + d_v) (QKᵀ and PV), halved when causal;
    /// backward 2.5× (five matmuls: S recomputed, dV, dP, dQ, dK). Output O (forward) or
    /// dQ, dK, dV (backward).
    Attention {
        q: u8,
        k: u8,
        v: u8,
        layout: Layout,
        causal: Option<u8>,
        backward: bool,
    },
    /// Pointwise: FLOPs = `ops` per output element (the broadcast of the tensor inputs);
    /// output in the widest input dtype (`bool` for comparisons).
    Elementwise { ops: u8, bool_out: bool },
    /// `fill_`/`zero_`: writes the first tensor, no FLOPs.
    Fill,
    /// A copy: reads `src`, writes `dst` (or a tensor like `src`); no FLOPs.
    Copy { src: u8, dst: Option<u8> },
    /// A reduction of input 0 over the dims at `Concrete Inputs[dims]` (all dims when absent or
    /// empty): FLOPs = `ops` per input element; output = the dims left.
    Reduction { ops: u8, dims: Option<u8> },
    /// Softmax (`ops` per element over `[.., N]`): reads the tensor inputs, writes one tensor
    /// like input 0.
    RowWise { ops: u8 },
    /// Layer/RMS/batch/group norm forward: FLOPs = `ops` per element (+1 each for a weight and
    /// a bias; `eval_ops` for batch norm with `training` false at `Concrete Inputs[training]`);
    /// writes the output and `stats` statistics (fp32) per row (layer, RMS: `normalized_shape`
    /// at `Concrete Inputs[shape]`, else the weight's size), channel (batch) or sample and group
    /// (group: the group count at `Concrete Inputs[shape]`).
    Norm {
        kind: NormKind,
        x: u8,
        shape: Option<u8>,
        weight: Option<u8>,
        bias: Option<u8>,
        ops: u8,
        training: Option<u8>,
        eval_ops: u8,
        stats: u8,
    },
    /// Norm backward: FLOPs per element = `input_ops`·mask[0] + `weight_ops`·mask[1] +
    /// mask[2] (`output_mask` at `Concrete Inputs[mask]`, all true when absent); writes
    /// grad_input like `x`, grad_weight and grad_bias like `weight`.
    NormBackward {
        x: u8,
        weight: Option<u8>,
        mask: Option<u8>,
        input_ops: u8,
        weight_ops: u8,
    },
    /// `_foreach_*`: `ops` per element of the first tensor list; reads every list, writes the
    /// first (in place).
    Foreach { ops: u8 },
    /// Category only: no model.
    None,
}

/// One op family.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Model {
    /// Op names; a name ending in `*` is a prefix.
    pub ops: &'static [&'static str],
    /// Where their GPU time goes.
    pub category: Category,
    /// What they compute.
    pub formula: Formula,
    /// Where the formula comes from (for the docs).
    pub source: &'static str,
}

const GEMM_SRC: &str = "2·M·N·K per multiply-add pair; bias adds one FLOP per output";
const CONV_SRC: &str =
    "torch.utils.flop_counter (conv_flop_count, conv_backward_flop), + one FLOP per output for a bias";
const ATTN_SRC: &str = "Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py: 4·B·N²·H·d, ½ causal, 2.5× backward";
const POINTWISE_SRC: &str = "one operation per output element";
const NORM_SRC: &str = "operations per element of the formula (mean, variance, normalise, affine)";

/// Every modelled op family. Ops not listed here get their category from their kernels.
pub(crate) const MODELS: &[Model] = &[
    // GEMMs. `addmm(bias, A, B, beta, alpha)`, `baddbmm(bias, A, B, beta, alpha)`,
    // `linear(x, w[N, K], bias)`, `_scaled_mm(A, B, scale_a, scale_b, bias, scale_result,
    // out_dtype, use_fast_accum)`.
    Model {
        ops: &["aten::mm", "aten::bmm", "aten::matmul", "aten::_int_mm"],
        category: Category::Gemm,
        formula: Formula::Gemm {
            a: 0,
            b: 1,
            bias: None,
            b_nk: false,
            out: None,
        },
        source: GEMM_SRC,
    },
    Model {
        ops: &["aten::addmm", "aten::baddbmm", "aten::_addmm_activation"],
        category: Category::Gemm,
        formula: Formula::Gemm {
            a: 1,
            b: 2,
            bias: Some(0),
            b_nk: false,
            out: None,
        },
        source: GEMM_SRC,
    },
    Model {
        ops: &["aten::linear"],
        category: Category::Gemm,
        formula: Formula::Gemm {
            a: 0,
            b: 1,
            bias: Some(2),
            b_nk: true,
            out: None,
        },
        source: GEMM_SRC,
    },
    Model {
        ops: &["aten::_scaled_mm"],
        category: Category::Gemm,
        formula: Formula::Gemm {
            a: 0,
            b: 1,
            bias: Some(4),
            b_nk: false,
            out: Some(6),
        },
        source: GEMM_SRC,
    },
    // Convolutions. `conv{1,2,3}d(x, w, bias, stride, padding, dilation, groups)`;
    // `convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)`
    // (`_convolution` the same, then four flags); `cudnn_convolution(x, w, padding, stride,
    // dilation, groups, ..)`; `cudnn_convolution_transpose(x, w, padding, output_padding,
    // stride, dilation, groups, ..)`; `miopen_convolution(x, w, bias, padding, stride,
    // dilation, groups, ..)` and `mkldnn_convolution` the same.
    Model {
        ops: &["aten::conv1d", "aten::conv2d", "aten::conv3d"],
        category: Category::Conv,
        formula: Formula::Conv {
            x: 0,
            w: 1,
            bias: Some(2),
            stride: 3,
            padding: 4,
            dilation: 5,
            transposed: Transposed::No,
            output_padding: None,
            groups: 6,
        },
        source: CONV_SRC,
    },
    Model {
        ops: &["aten::convolution", "aten::_convolution"],
        category: Category::Conv,
        formula: Formula::Conv {
            x: 0,
            w: 1,
            bias: Some(2),
            stride: 3,
            padding: 4,
            dilation: 5,
            transposed: Transposed::At(6),
            output_padding: Some(7),
            groups: 8,
        },
        source: CONV_SRC,
    },
    Model {
        ops: &["aten::cudnn_convolution"],
        category: Category::Conv,
        formula: Formula::Conv {
            x: 0,
            w: 1,
            bias: None,
            stride: 3,
            padding: 2,
            dilation: 4,
            transposed: Transposed::No,
            output_padding: None,
            groups: 5,
        },
        source: CONV_SRC,
    },
    Model {
        ops: &["aten::cudnn_convolution_transpose"],
        category: Category::Conv,
        formula: Formula::Conv {
            x: 0,
            w: 1,
            bias: None,
            stride: 4,
            padding: 2,
            dilation: 5,
            transposed: Transposed::Yes,
            output_padding: Some(3),
            groups: 6,
        },
        source: CONV_SRC,
    },
    Model {
        ops: &["aten::miopen_convolution", "aten::mkldnn_convolution"],
        category: Category::Conv,
        formula: Formula::Conv {
            x: 0,
            w: 1,
            bias: Some(2),
            stride: 4,
            padding: 3,
            dilation: 5,
            transposed: Transposed::No,
            output_padding: None,
            groups: 6,
        },
        source: CONV_SRC,
    },
    // `convolution_backward(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
    // output_padding, groups, output_mask)`.
    Model {
        ops: &["aten::convolution_backward"],
        category: Category::Conv,
        formula: Formula::ConvBackward {
            grad: 0,
            x: 1,
            w: 2,
            transposed: 7,
            groups: 9,
            mask: 10,
        },
        source: CONV_SRC,
    },
    // Attention. `_scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, ..)`;
    // `_scaled_dot_product_flash_attention_for_cpu` the same; `_scaled_dot_product_efficient_
    // attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, ..)` and
    // `_scaled_dot_product_cudnn_attention` (causal also at 6); `_flash_attention_forward(q, k,
    // v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ..)` in [B, N, H, d];
    // `_efficient_attention_forward(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    // max_seqlen_k, dropout_p, custom_mask_type, ..)` in [B, N, H, d] (mask type 1 or 2 is
    // causal); `flash_attn::_flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, ..)`
    // in [B, N, H, d].
    Model {
        ops: &[
            "aten::_scaled_dot_product_flash_attention",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
        ],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 0,
            k: 1,
            v: 2,
            layout: Layout::Bhnd,
            causal: Some(4),
            backward: false,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &[
            "aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_cudnn_attention",
        ],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 0,
            k: 1,
            v: 2,
            layout: Layout::Bhnd,
            causal: Some(6),
            backward: false,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["aten::_flash_attention_forward"],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 0,
            k: 1,
            v: 2,
            layout: Layout::Bnhd,
            causal: Some(8),
            backward: false,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["aten::_efficient_attention_forward"],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 0,
            k: 1,
            v: 2,
            layout: Layout::Bnhd,
            causal: Some(9),
            backward: false,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["flash_attn::_flash_attn_forward"],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 0,
            k: 1,
            v: 2,
            layout: Layout::Bnhd,
            causal: Some(5),
            backward: false,
        },
        source: ATTN_SRC,
    },
    // Backward: `_scaled_dot_product_flash_attention_backward(grad_out, q, k, v, out, lse,
    // cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ..)`; `.._for_cpu_backward(
    // grad_out, q, k, v, out, lse, dropout_p, is_causal, ..)`; `.._efficient_attention_backward(
    // grad_out, q, k, v, attn_bias, out, lse, philox_seed, philox_offset, dropout_p,
    // grad_input_mask, is_causal, ..)`; `.._cudnn_attention_backward(grad_out, q, k, v, out,
    // lse, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
    // dropout_p, is_causal, ..)`; `_flash_attention_backward(grad_out, q, k, v, out, lse,
    // cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ..)`;
    // `_efficient_attention_backward(grad_out, q, k, v, bias, out, cu_seqlens_q, cu_seqlens_k,
    // max_seqlen_q, max_seqlen_k, lse, dropout_p, philox_seed, philox_offset,
    // custom_mask_type, ..)`; `flash_attn::_flash_attn_backward(dout, q, k, v, out, lse, dq,
    // dk, dv, dropout_p, softmax_scale, causal, ..)`.
    Model {
        ops: &[
            "aten::_scaled_dot_product_flash_attention_backward",
            "aten::_scaled_dot_product_efficient_attention_backward",
        ],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 1,
            k: 2,
            v: 3,
            layout: Layout::Bhnd,
            causal: Some(11),
            backward: true,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["aten::_scaled_dot_product_flash_attention_for_cpu_backward"],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 1,
            k: 2,
            v: 3,
            layout: Layout::Bhnd,
            causal: Some(7),
            backward: true,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["aten::_scaled_dot_product_cudnn_attention_backward"],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 1,
            k: 2,
            v: 3,
            layout: Layout::Bhnd,
            causal: Some(14),
            backward: true,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &[
            "aten::_flash_attention_backward",
            "flash_attn::_flash_attn_backward",
        ],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 1,
            k: 2,
            v: 3,
            layout: Layout::Bnhd,
            causal: Some(11),
            backward: true,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["aten::_efficient_attention_backward"],
        category: Category::Attention,
        formula: Formula::Attention {
            q: 1,
            k: 2,
            v: 3,
            layout: Layout::Bnhd,
            causal: Some(14),
            backward: true,
        },
        source: ATTN_SRC,
    },
    Model {
        ops: &["aten::scaled_dot_product_attention", "FlashAttnFunc*"],
        category: Category::Attention,
        formula: Formula::None,
        source: "category only: the kernels run under the ops it calls",
    },
    // Pointwise. In-place variants (trailing `_`) write their first input.
    Model {
        ops: &[
            "aten::add",
            "aten::add_",
            "aten::sub",
            "aten::sub_",
            "aten::rsub",
            "aten::mul",
            "aten::mul_",
            "aten::div",
            "aten::div_",
            "aten::pow",
            "aten::pow_",
            "aten::neg",
            "aten::neg_",
            "aten::abs",
            "aten::abs_",
            "aten::exp",
            "aten::exp_",
            "aten::log",
            "aten::log_",
            "aten::log2",
            "aten::log1p",
            "aten::sqrt",
            "aten::sqrt_",
            "aten::rsqrt",
            "aten::rsqrt_",
            "aten::reciprocal",
            "aten::reciprocal_",
            "aten::sin",
            "aten::cos",
            "aten::tanh",
            "aten::tanh_",
            "aten::sigmoid",
            "aten::sigmoid_",
            "aten::erf",
            "aten::relu",
            "aten::relu_",
            "aten::gelu",
            "aten::gelu_",
            "aten::silu",
            "aten::silu_",
            "aten::clamp",
            "aten::clamp_",
            "aten::clamp_min",
            "aten::clamp_min_",
            "aten::clamp_max",
            "aten::clamp_max_",
            "aten::hardtanh",
            "aten::hardtanh_",
            "aten::leaky_relu",
            "aten::leaky_relu_",
            "aten::threshold",
            "aten::threshold_backward",
            "aten::gelu_backward",
            "aten::silu_backward",
            "aten::sigmoid_backward",
            "aten::tanh_backward",
            "aten::hardtanh_backward",
            "aten::maximum",
            "aten::minimum",
            "aten::where",
            "aten::masked_fill",
            "aten::masked_fill_",
            "aten::addcmul",
            "aten::addcmul_",
            "aten::addcdiv",
            "aten::addcdiv_",
            "aten::lerp",
            "aten::lerp_",
            "aten::mse_loss_backward",
            "aten::nan_to_num",
            "aten::nan_to_num_",
            "aten::logit_backward",
            "aten::native_dropout",
            "aten::native_dropout_backward",
            "aten::square",
            "aten::sign",
            "aten::floor",
            "aten::ceil",
            "aten::round",
        ],
        category: Category::Elementwise,
        formula: Formula::Elementwise {
            ops: 1,
            bool_out: false,
        },
        source: POINTWISE_SRC,
    },
    Model {
        ops: &[
            "aten::eq",
            "aten::ne",
            "aten::gt",
            "aten::ge",
            "aten::lt",
            "aten::le",
            "aten::logical_and",
            "aten::logical_and_",
            "aten::logical_or",
            "aten::logical_or_",
            "aten::logical_not",
            "aten::isnan",
            "aten::isinf",
        ],
        category: Category::Elementwise,
        formula: Formula::Elementwise {
            ops: 1,
            bool_out: true,
        },
        source: POINTWISE_SRC,
    },
    Model {
        ops: &["aten::fill_", "aten::zero_"],
        category: Category::Elementwise,
        formula: Formula::Fill,
        source: "writes the tensor once",
    },
    Model {
        ops: &["aten::_foreach_*"],
        category: Category::Elementwise,
        formula: Formula::Foreach { ops: 1 },
        source: POINTWISE_SRC,
    },
    // Copies: never elementwise. `copy_(self, src, non_blocking)`; `clone(self)`.
    Model {
        ops: &["aten::copy_"],
        category: Category::Memcpy,
        formula: Formula::Copy {
            src: 1,
            dst: Some(0),
        },
        source: "reads the source, writes the destination",
    },
    Model {
        ops: &["aten::clone", "aten::contiguous"],
        category: Category::Memcpy,
        formula: Formula::Copy { src: 0, dst: None },
        source: "reads the source, writes the destination",
    },
    Model {
        ops: &[
            "aten::to",
            "aten::_to_copy",
            "aten::_copy_from",
            "aten::_copy_from_and_resize",
        ],
        category: Category::Memcpy,
        formula: Formula::None,
        source: "category only: a copy (the target dtype is not in the shapes)",
    },
    // Reductions: `sum/mean/amax/amin/max/min/argmax/argmin/prod/logsumexp(self, dim, ..)`,
    // `var/std/var_mean/std_mean(self, dim, ..)`, `norm(self, p, dim, ..)`,
    // `linalg_vector_norm(self, ord, dim, ..)`.
    Model {
        ops: &[
            "aten::sum",
            "aten::mean",
            "aten::amax",
            "aten::amin",
            "aten::max",
            "aten::min",
            "aten::argmax",
            "aten::argmin",
            "aten::prod",
            "aten::logsumexp",
            "aten::any",
            "aten::all",
        ],
        category: Category::Reduction,
        formula: Formula::Reduction {
            ops: 1,
            dims: Some(1),
        },
        source: "one operation per input element",
    },
    Model {
        ops: &["aten::var", "aten::std", "aten::var_mean", "aten::std_mean"],
        category: Category::Reduction,
        formula: Formula::Reduction {
            ops: 3,
            dims: Some(1),
        },
        source: "subtract, square, add per input element",
    },
    Model {
        ops: &["aten::norm", "aten::linalg_vector_norm"],
        category: Category::Reduction,
        formula: Formula::Reduction {
            ops: 2,
            dims: Some(2),
        },
        source: "square and add per input element",
    },
    // Softmax: max, exp, sum, divide (forward); multiply, sum, subtract-multiply (backward).
    Model {
        ops: &["aten::_softmax", "aten::_log_softmax"],
        category: Category::Reduction,
        formula: Formula::RowWise { ops: 4 },
        source: "max, exp, sum, divide per element",
    },
    Model {
        ops: &[
            "aten::_softmax_backward_data",
            "aten::_log_softmax_backward_data",
        ],
        category: Category::Reduction,
        formula: Formula::RowWise { ops: 3 },
        source: "multiply, sum, subtract-multiply per element",
    },
    // Norms. `native_layer_norm(x, normalized_shape, weight, bias, eps)`;
    // `_fused_rms_norm(x, normalized_shape, weight, eps)`; `native_batch_norm(x, weight, bias,
    // running_mean, running_var, training, momentum, eps)`, `cudnn_batch_norm` and
    // `miopen_batch_norm` and `_native_batch_norm_legit` the same; `native_group_norm(x,
    // weight, bias, N, C, HxW, group, eps)`. Forward per element: mean 1, variance 3, normalise
    // 2 (RMS: square-add 2, scale 1); batch norm in eval mode normalises only.
    Model {
        ops: &["aten::native_layer_norm"],
        category: Category::Norm,
        formula: Formula::Norm {
            kind: NormKind::Layer,
            x: 0,
            shape: Some(1),
            weight: Some(2),
            bias: Some(3),
            ops: 6,
            training: None,
            eval_ops: 6,
            stats: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &["aten::_fused_rms_norm"],
        category: Category::Norm,
        formula: Formula::Norm {
            kind: NormKind::Rms,
            x: 0,
            shape: Some(1),
            weight: Some(2),
            bias: None,
            ops: 3,
            training: None,
            eval_ops: 3,
            stats: 1,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &[
            "aten::native_batch_norm",
            "aten::cudnn_batch_norm",
            "aten::miopen_batch_norm",
            "aten::_native_batch_norm_legit",
        ],
        category: Category::Norm,
        formula: Formula::Norm {
            kind: NormKind::Batch,
            x: 0,
            shape: None,
            weight: Some(1),
            bias: Some(2),
            ops: 6,
            training: Some(5),
            eval_ops: 2,
            stats: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &["aten::native_group_norm"],
        category: Category::Norm,
        formula: Formula::Norm {
            kind: NormKind::Group,
            x: 0,
            shape: Some(6),
            weight: Some(1),
            bias: Some(2),
            ops: 6,
            training: None,
            eval_ops: 6,
            stats: 2,
        },
        source: NORM_SRC,
    },
    // Backward: `native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight,
    // bias, output_mask)`; `_fused_rms_norm_backward(grad_out, x, normalized_shape, rstd,
    // weight, output_mask)`; `native_batch_norm_backward(grad_out, x, weight, running_mean,
    // running_var, save_mean, save_invstd, train, eps, output_mask)`;
    // `cudnn_batch_norm_backward(x, grad_out, weight, ..)` (always all three);
    // `native_group_norm_backward(grad_out, x, mean, rstd, weight, N, C, HxW, group,
    // output_mask)`. Per element: grad_input 8 (x̂ again 2, dy·γ 1, two sums 2, combine 3),
    // grad_weight 2, grad_bias 1 (RMS: 6 and 2).
    Model {
        ops: &["aten::native_layer_norm_backward"],
        category: Category::Norm,
        formula: Formula::NormBackward {
            x: 1,
            weight: Some(5),
            mask: Some(7),
            input_ops: 8,
            weight_ops: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &["aten::_fused_rms_norm_backward"],
        category: Category::Norm,
        formula: Formula::NormBackward {
            x: 1,
            weight: Some(4),
            mask: Some(5),
            input_ops: 6,
            weight_ops: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &["aten::native_batch_norm_backward"],
        category: Category::Norm,
        formula: Formula::NormBackward {
            x: 1,
            weight: Some(2),
            mask: Some(9),
            input_ops: 8,
            weight_ops: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &[
            "aten::cudnn_batch_norm_backward",
            "aten::miopen_batch_norm_backward",
        ],
        category: Category::Norm,
        formula: Formula::NormBackward {
            x: 0,
            weight: Some(2),
            mask: None,
            input_ops: 8,
            weight_ops: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &["aten::native_group_norm_backward"],
        category: Category::Norm,
        formula: Formula::NormBackward {
            x: 1,
            weight: Some(4),
            mask: Some(9),
            input_ops: 8,
            weight_ops: 2,
        },
        source: NORM_SRC,
    },
    Model {
        ops: &[
            "aten::layer_norm",
            "aten::batch_norm",
            "aten::group_norm",
            "aten::rms_norm",
            "aten::_batch_norm_impl_index",
            "aten::_batch_norm_impl_index_backward",
        ],
        category: Category::Norm,
        formula: Formula::None,
        source: "category only: the kernels run under the op it calls",
    },
    // Communication ops: their kernels are collectives (the collectives section models them).
    Model {
        ops: &[
            "record_param_comms",
            "c10d::*",
            "nccl:*",
            "c10d_functional::*",
            "_c10d_functional::*",
        ],
        category: Category::Communication,
        formula: Formula::None,
        source: "category only: see the collectives section",
    },
];

/// A kernel's category by its name, for kernels without a modelled op: the first row whose
/// pattern the lower-cased name contains. Conv before GEMM (cuDNN's implicit-GEMM kernels name
/// both), copies before elementwise (`direct_copy_kernel` is an elementwise kernel template).
pub(crate) const KERNEL_CATEGORIES: &[(&str, Category)] = &[
    ("nccl", Category::Communication),
    ("rccl", Category::Communication),
    ("cross_device_reduce", Category::Communication),
    ("memcpy", Category::Memcpy),
    ("memset", Category::Memset),
    ("flash", Category::Attention),
    ("fmha", Category::Attention),
    ("attention", Category::Attention),
    ("attn", Category::Attention),
    ("conv", Category::Conv),
    ("fprop", Category::Conv),
    ("dgrad", Category::Conv),
    ("wgrad", Category::Conv),
    ("winograd", Category::Conv),
    ("igemm", Category::Conv),
    ("gemm", Category::Gemm),
    ("cijk_", Category::Gemm),
    ("cutlass", Category::Gemm),
    ("matmul", Category::Gemm),
    ("nvjet", Category::Gemm),
    ("xmma", Category::Gemm),
    ("wvsplitk", Category::Gemm),
    ("triton_tem", Category::Gemm),
    ("layer_norm", Category::Norm),
    ("layernorm", Category::Norm),
    ("rms_norm", Category::Norm),
    ("rmsnorm", Category::Norm),
    ("batch_norm", Category::Norm),
    ("batchnorm", Category::Norm),
    ("group_norm", Category::Norm),
    ("groupnorm", Category::Norm),
    ("bn_fw", Category::Norm),
    ("bn_bw", Category::Norm),
    ("softmax", Category::Reduction),
    ("reduce", Category::Reduction),
    ("triton_red", Category::Reduction),
    ("triton_per", Category::Reduction),
    ("copy", Category::Memcpy),
    ("elementwise", Category::Elementwise),
    ("multi_tensor_apply", Category::Elementwise),
    ("triton_poi", Category::Elementwise),
    ("fill", Category::Elementwise),
];

/// A dtype as torch's `Input type` (and c10d's `dtype`) spell it: its size and the peak it runs
/// at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 64-bit float.
    Fp64,
    /// 32-bit float.
    Fp32,
    /// 16-bit IEEE float.
    Fp16,
    /// bfloat16.
    Bf16,
    /// 8-bit floats (e4m3, e5m2).
    Fp8,
    /// 4-bit floats (packed two per byte).
    Fp4,
    /// 8-bit integers.
    Int8,
    /// Other integers and bool: no peak of their own.
    Int,
}

impl Precision {
    /// The short name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp64 => "fp64",
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
            Precision::Fp4 => "fp4",
            Precision::Int8 => "int8",
            Precision::Int => "int",
        }
    }

    /// Whether it is half precision or narrower (what tensor cores want).
    pub fn is_reduced(self) -> bool {
        matches!(
            self,
            Precision::Fp16 | Precision::Bf16 | Precision::Fp8 | Precision::Fp4 | Precision::Int8
        )
    }
}

/// `(spelling, bytes per element, precision)`: torch's `Input type` names, c10's ScalarType names
/// (record_param_comms' `dtype`), and short aliases. Sizes of packed fp4 are per stored byte.
pub(crate) const DTYPES: &[(&str, u8, Precision)] = &[
    ("float", 4, Precision::Fp32),
    ("double", 8, Precision::Fp64),
    ("c10::Half", 2, Precision::Fp16),
    ("c10::BFloat16", 2, Precision::Bf16),
    ("c10::Float8_e4m3fn", 1, Precision::Fp8),
    ("c10::Float8_e5m2", 1, Precision::Fp8),
    ("c10::Float8_e4m3fnuz", 1, Precision::Fp8),
    ("c10::Float8_e5m2fnuz", 1, Precision::Fp8),
    ("c10::Float8_e8m0fnu", 1, Precision::Fp8),
    ("c10::Float4_e2m1fn_x2", 1, Precision::Fp4),
    ("c10::complex<float>", 8, Precision::Fp32),
    ("c10::complex<double>", 16, Precision::Fp64),
    ("c10::complex<c10::Half>", 4, Precision::Fp16),
    ("signed char", 1, Precision::Int8),
    ("unsigned char", 1, Precision::Int),
    ("bool", 1, Precision::Int),
    ("short int", 2, Precision::Int),
    ("short", 2, Precision::Int),
    ("int", 4, Precision::Int),
    ("long int", 8, Precision::Int),
    ("long", 8, Precision::Int),
    ("unsigned int", 4, Precision::Int),
    ("unsigned long", 8, Precision::Int),
    // c10 ScalarType names (record_param_comms' `dtype`).
    ("Float", 4, Precision::Fp32),
    ("Double", 8, Precision::Fp64),
    ("Half", 2, Precision::Fp16),
    ("BFloat16", 2, Precision::Bf16),
    ("Float8_e4m3fn", 1, Precision::Fp8),
    ("Float8_e5m2", 1, Precision::Fp8),
    ("Float8_e4m3fnuz", 1, Precision::Fp8),
    ("Float8_e5m2fnuz", 1, Precision::Fp8),
    ("Char", 1, Precision::Int8),
    ("Byte", 1, Precision::Int),
    ("Bool", 1, Precision::Int),
    ("Short", 2, Precision::Int),
    ("Int", 4, Precision::Int),
    ("Long", 8, Precision::Int),
    // Short names other frameworks write.
    ("f64", 8, Precision::Fp64),
    ("f32", 4, Precision::Fp32),
    ("f16", 2, Precision::Fp16),
    ("bf16", 2, Precision::Bf16),
    ("fp32", 4, Precision::Fp32),
    ("fp16", 2, Precision::Fp16),
    ("fp8", 1, Precision::Fp8),
    ("i8", 1, Precision::Int8),
    ("u8", 1, Precision::Int),
    ("i32", 4, Precision::Int),
    ("i64", 8, Precision::Int),
];

/// c10's ScalarType numbers (a `dtype` in `Concrete Inputs`, such as `_scaled_mm`'s
/// `out_dtype`), as names in [`DTYPES`].
pub(crate) const SCALAR_TYPES: &[(i64, &str)] = &[
    (0, "unsigned char"),
    (1, "signed char"),
    (2, "short int"),
    (3, "int"),
    (4, "long int"),
    (5, "c10::Half"),
    (6, "float"),
    (7, "double"),
    (11, "bool"),
    (15, "c10::BFloat16"),
    (23, "c10::Float8_e5m2"),
    (24, "c10::Float8_e4m3fn"),
    (25, "c10::Float8_e5m2fnuz"),
    (26, "c10::Float8_e4m3fnuz"),
];

/// Size and precision of a dtype name.
pub(crate) fn dtype(name: &str) -> Option<(u8, Precision)> {
    DTYPES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, size, p)| (size, p))
}

/// The model of an op name.
pub(crate) fn model_of(name: &str) -> Option<&'static Model> {
    MODELS.iter().find(|m| {
        m.ops.iter().any(|o| match o.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => *o == name,
        })
    })
}

/// A kernel's category by its name.
pub(crate) fn kernel_category(name: &str) -> Category {
    let lower = name.to_ascii_lowercase();
    KERNEL_CATEGORIES
        .iter()
        .find(|(p, _)| lower.contains(p))
        .map_or(Category::Other, |&(_, c)| c)
}
