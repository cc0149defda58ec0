//! Typed launches of the kernels in `crates/cuda/kernels`: one function per
//! kernel family, taking device addresses and shapes, checking the shapes the
//! kernels rely on.

use crate::driver::{Arg, Gpu};
use crate::error::{CudaError, Result};
use crate::repack::WeightKind;

/// Every kernel name the host launches (checked against the sources by a host test).
pub const KERNEL_NAMES: &[&str] = &[
    "quantize_q8",
    "rmsnorm",
    "prepare_heads",
    "glu_q8",
    "fa_attn_64_f16_d",
    "fa_attn_64_bf16_d",
    "fa_attn_128_f16_d",
    "fa_attn_128_bf16_d",
    "fa_attn_64_f16_b",
    "fa_attn_64_bf16_b",
    "fa_attn_128_f16_b",
    "fa_attn_128_bf16_b",
    "fa_attn_256_f16_d",
    "fa_attn_256_f16_b",
    "fa_attn_64_q8_d",
    "fa_attn_128_q8_d",
    "fa_attn_256_q8_d",
    "fa_attn_64_q8_b",
    "fa_attn_128_q8_b",
    "fa_attn_256_q8_b",
    "fa_attn_64_q4_d",
    "fa_attn_128_q4_d",
    "fa_attn_256_q4_d",
    "fa_attn_64_q4_b",
    "fa_attn_128_q4_b",
    "fa_attn_256_q4_b",
    "attn_combine",
    "mk_decode",
    "gemv_q4_k_1_u1",
    "gemv_q4_k_1_u4",
    "gemv_q6_k_1_r4",
    "gemv_q6_k_8",
    "gemv_q4_k_x1_r4_i1",
    "gemv_q8_0_x2_r2_i2",
    "gemm_q4_k_f16",
    "gemm_q6_k_bf16",
    "fill_random_kv",
    "to_half",
    "scale_bias",
    "logit_transform",
    "argmax_rows",
    "gemv_q8_0_1_r2_t8",
    "gemv_q6_k_1_r4_t8",
    "gemv_q4_k_mma1",
    "gemv_q4_k_mma2",
    "gemv_q6_k_mma1",
    "gemv_q6_k_mma2",
    "vit_layer_norm",
    "vit_gelu",
    "vit_heads",
    "vit_unpad",
    "vit_shuffle",
];

/// Whether a kernel is written for programmatic dependent launch (it calls
/// PDL_WAIT before touching memory other kernels write; common.cuh).
pub fn uses_pdl(name: &str) -> bool {
    name.starts_with("gemv_")
        || matches!(
            name,
            "quantize_q8"
                | "rmsnorm"
                | "prepare_heads"
                | "glu_q8"
                | "fill_random_kv"
                | "scale_bias"
                | "logit_transform"
        )
}

// Flags shared with the kernels (kernels/common.cuh, gemv.cu, layer_ops.cu).
pub const OUT_BF16: i32 = 1;
pub const OUT_ADD: i32 = 2;
pub const NORM_BF16_GAIN: i32 = 8;
pub const HEAD_QK_RMS: i32 = 1;
pub const HEAD_ROPE: i32 = 2;
pub const HEAD_NEOX: i32 = 4;
pub const HEAD_BF16: i32 = 8;
pub const HEAD_ROT_K: i32 = 32;
pub const HEAD_ROT_V: i32 = 64;
pub const HEAD_KV_Q8: i32 = 128;
pub const HEAD_KV_Q4: i32 = 256;
pub const OUT_ROT64: i32 = 4;
pub const HEAD_KV_BF16: i32 = 16;
pub const GLU_SWIGLU: i32 = 0;
pub const GLU_GATE: i32 = 1;
pub const GLU_GELU: i32 = 2;

/// A weight matrix [rows, cols] resident on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct GpuMatrix {
    pub kind: WeightKind,
    pub rows: usize,
    pub cols: usize,
    /// Block bodies (or whole blocks).
    pub body: u64,
    /// f16 scales of split kinds, else 0.
    pub scales: u64,
    /// Single-token GEMV variant (chosen by `tune::tune_gemv` on the device).
    pub tune: GemvTune,
    /// Per-tensor scale of the product (`*.scale`), applied before the bias.
    pub scale: Option<f32>,
}

/// A variant of the single-token GEMV: `u` items' loads issued together per
/// lane (1, 2 or 4), and the grid: one warp per row (`blocks` = 0) or at most
/// `blocks` blocks of 8 warps that each stream several rows. With `x`, the
/// register-activation kernels (`gemv_<t>_x*` in gemv.cu): `r` rows per tile,
/// one thread per item of a row, `blocks` = 0 one block per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvTune {
    pub u: u8,
    pub blocks: u32,
    /// Rows per warp (1, or 2 / 4: activations loaded once for all of them; then `u` is 1).
    pub r: u8,
    pub x: bool,
}

impl Default for GemvTune {
    fn default() -> Self {
        GemvTune {
            u: 1,
            blocks: 0,
            r: 1,
            x: false,
        }
    }
}

/// 8-bit activations: `q` [T, K] int8, `d` and `s` [T, K/32] f32.
#[derive(Clone, Copy, Debug)]
pub struct Q8 {
    pub q: u64,
    pub d: u64,
    pub s: u64,
}

impl Q8 {
    /// The view starting at token `t` of rows of width `k`.
    pub fn offset(self, t: usize, k: usize) -> Q8 {
        Q8 {
            q: self.q + (t * k) as u64,
            d: self.d + (t * k / 32 * 4) as u64,
            s: self.s + (t * k / 32 * 4) as u64,
        }
    }
}

/// The arguments every GEMV kernel starts with: the weights, their shape and
/// the 8-bit activations (gemv.cu's `w, wd, rows, K, xq, xd, xs`).
fn gemv_head_args(w: &GpuMatrix, x: Q8) -> Vec<Arg> {
    vec![
        Arg::Ptr(w.body),
        Arg::Ptr(w.scales),
        Arg::I32(w.rows as i32),
        Arg::I32(w.cols as i32),
        Arg::Ptr(x.q),
        Arg::Ptr(x.d),
        Arg::Ptr(x.s),
    ]
}

/// [`gemv_head_args`] then one dense output (`y, y_stride, bias, flags`).
fn gemv_args(w: &GpuMatrix, x: Q8, y: u64, y_stride: usize, bias: u64, flags: i32) -> Vec<Arg> {
    let mut a = gemv_head_args(w, x);
    a.extend([
        Arg::Ptr(y),
        Arg::I32(y_stride as i32),
        Arg::Ptr(bias),
        Arg::I32(flags),
    ]);
    a
}

fn grid1(n: usize, per_block: usize) -> (u32, u32, u32) {
    (n.div_ceil(per_block) as u32, 1, 1)
}

/// Quantizes x [n] (n % 32 == 0) into `a`.
pub fn quantize_q8(g: &Gpu, x: u64, a: Q8, n: usize) -> Result<()> {
    if !n.is_multiple_of(32) {
        return Err(CudaError::Unsupported(format!(
            "activation width {n} (must be a multiple of 32)"
        )));
    }
    let blocks = n / 32;
    g.launch(
        "quantize_q8",
        grid1(blocks, 8),
        256,
        &[
            Arg::Ptr(x),
            Arg::Ptr(a.q),
            Arg::Ptr(a.d),
            Arg::Ptr(a.s),
            Arg::I32(blocks as i32),
        ],
    )
}

fn gemv_name(kind: WeightKind, nt: usize, u: u8, r: u8) -> &'static str {
    macro_rules! names {
        ($($k:ident => $s:literal),*) => {
            match (kind, nt, if nt == 1 { r } else { 1 }, u) {
                $( (WeightKind::$k, 1, 2, _) => concat!("gemv_", $s, "_1_r2"),
                   (WeightKind::$k, 1, 4, _) => concat!("gemv_", $s, "_1_r4"),
                   (WeightKind::$k, 1, _, 1) => concat!("gemv_", $s, "_1_u1"),
                   (WeightKind::$k, 1, _, 2) => concat!("gemv_", $s, "_1_u2"),
                   (WeightKind::$k, 1, _, _) => concat!("gemv_", $s, "_1_u4"),
                   (WeightKind::$k, 2, _, _) => concat!("gemv_", $s, "_2"),
                   (WeightKind::$k, 4, _, _) => concat!("gemv_", $s, "_4"),
                   (WeightKind::$k, _, _, _) => concat!("gemv_", $s, "_8"), )*
            }
        };
    }
    names!(F32 => "f32", F16 => "f16", Bf16 => "bf16", Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0", Q4K => "q4_k", Q5K => "q5_k", Q6K => "q6_k")
}

/// The multi-token form of the one-token `gemv_<t>_1_r<r>` kernel (gemv.cu
/// `gemv_rows_t`), for the quantized types.
fn gemv_rows_t_name(kind: WeightKind, r: u8) -> Option<&'static str> {
    macro_rules! names {
        ($($k:ident => $s:literal),*) => {
            match (kind, r) {
                $( (WeightKind::$k, 2) => Some(concat!("gemv_", $s, "_1_r2_t8")),
                   (WeightKind::$k, 4) => Some(concat!("gemv_", $s, "_1_r4_t8")), )*
                _ => None,
            }
        };
    }
    names!(Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0", Q4K => "q4_k", Q5K => "q5_k", Q6K => "q6_k")
}

/// The grid of a GEMV launch over `rows` rows (8 rows per block of 256 threads).
fn gemv_grid(rows: usize, tune: GemvTune) -> (u32, u32, u32) {
    let full = rows.div_ceil(8 * tune.r.max(1) as usize) as u32;
    (
        if tune.blocks > 0 {
            full.min(tune.blocks)
        } else {
            full
        },
        1,
        1,
    )
}

/// One single-token GEMV launch with the given variant (tuning, benchmarks).
#[allow(clippy::too_many_arguments)]
pub fn gemv_single(
    g: &Gpu,
    w: &GpuMatrix,
    tune: GemvTune,
    x: Q8,
    y: u64,
    y_stride: usize,
    bias: u64,
    flags: i32,
) -> Result<()> {
    if tune.x {
        let seg = [Segment {
            y,
            bias,
            rows: w.rows,
        }];
        return gemv_x(g, w, tune, x, 1, &seg, flags);
    }
    g.launch(
        gemv_name(w.kind, 1, tune.u, tune.r),
        gemv_grid(w.rows, tune),
        256,
        &gemv_args(w, x, y, y_stride, bias, flags),
    )
}

/// y[t, :] (op)= W · x[t, :] for t < n_tokens, x given quantized; `y_stride`
/// is the distance between the rows of y in elements. `bias` (0 = none) has `rows` values.
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    g: &Gpu,
    w: &GpuMatrix,
    x: Q8,
    n_tokens: usize,
    y: u64,
    y_stride: usize,
    bias: u64,
    flags: i32,
) -> Result<()> {
    // The register kernels win at one and two tokens; from three the
    // tensor-core kernels (Q4_K, Q6_K; 27648 x 5120 Q4_K at 4 tokens 44 us
    // against the warp kernels' 113, BENCHMARKS.md), the warp kernels'
    // multi-token variants for the other types.
    if w.tune.x && y_stride == w.rows && n_tokens <= 2 {
        let seg = [Segment {
            y,
            bias,
            rows: w.rows,
        }];
        return gemv_segments(g, w, x, n_tokens, &seg, flags);
    }
    if n_tokens >= MMA_MIN_TOKENS && mma_enabled() && has_tensor_core_gemv(w.kind) {
        return gemv_tensor_cores(g, w, x, n_tokens, y, y_stride, bias, flags);
    }
    gemv_warps(g, w, x, n_tokens, y, y_stride, bias, flags)
}

/// [`gemv`] on the warp kernels only (one warp per row, up to 8 tokens per launch).
#[allow(clippy::too_many_arguments)]
pub fn gemv_warps(
    g: &Gpu,
    w: &GpuMatrix,
    x: Q8,
    n_tokens: usize,
    y: u64,
    y_stride: usize,
    bias: u64,
    flags: i32,
) -> Result<()> {
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = match n_tokens - t0 {
            n if n >= 8 => 8,
            n if n >= 4 => 4,
            n if n >= 2 => 2,
            _ => 1,
        };
        let xa = x.offset(t0, w.cols);
        g.launch(
            gemv_name(w.kind, nt, w.tune.u, w.tune.r),
            if nt == 1 {
                gemv_grid(w.rows, w.tune)
            } else {
                grid1(w.rows, 8)
            },
            256,
            &gemv_args(w, xa, y + (t0 * y_stride * 4) as u64, y_stride, bias, flags),
        )?;
        t0 += nt;
    }
    Ok(())
}

/// From this many tokens [`gemv`] takes the tensor-core kernels where the
/// weight type has them (the warp kernels re-read every token's activations
/// per row; BENCHMARKS.md "small token blocks").
pub const MMA_MIN_TOKENS: usize = 3;

/// `HEARTH_CUDA_MMV=0` keeps small token blocks on the warp kernels (for A/B runs).
fn mma_enabled() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("HEARTH_CUDA_MMV").map_or(true, |v| v != "0"))
}

/// Whether weights of this type have the tensor-core GEMV ([`gemv_tensor_cores`]).
pub fn has_tensor_core_gemv(kind: WeightKind) -> bool {
    gemv_mma_names(kind).is_some()
}

/// The int8 tensor-core kernels of a weight type (1 and 2 tiles of 8 tokens), gemv.cu `gemv_mma`.
fn gemv_mma_names(kind: WeightKind) -> Option<[&'static str; 2]> {
    match kind {
        WeightKind::Q4K => Some(["gemv_q4_k_mma1", "gemv_q4_k_mma2"]),
        WeightKind::Q6K => Some(["gemv_q6_k_mma1", "gemv_q6_k_mma2"]),
        _ => None,
    }
}

/// [`gemv`] on the tensor cores, where `w`'s type has the kernels: launches
/// of up to 16 tokens, 16 rows per block.
#[allow(clippy::too_many_arguments)]
pub fn gemv_tensor_cores(
    g: &Gpu,
    w: &GpuMatrix,
    x: Q8,
    n_tokens: usize,
    y: u64,
    y_stride: usize,
    bias: u64,
    flags: i32,
) -> Result<()> {
    let names = gemv_mma_names(w.kind).ok_or_else(|| {
        CudaError::Unsupported(format!("tensor-core GEMV of {:?} weights", w.kind))
    })?;
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(16);
        let xa = x.offset(t0, w.cols);
        g.launch(
            names[usize::from(nt > 8)],
            (w.rows.div_ceil(16) as u32, 1, 1),
            128,
            &[
                gemv_args(w, xa, y + (t0 * y_stride * 4) as u64, y_stride, bias, flags),
                vec![Arg::I32(nt as i32)],
            ]
            .concat(),
        )?;
        t0 += nt;
    }
    Ok(())
}

/// y[t, :] (op)= W · x[t, :] for t < n_tokens, each token computed bit for
/// bit as the one-token launch of `w`'s tuned variant computes it (the
/// kernels take grid row y as a token of its own): a batch-invariant product
/// for verify passes. Reads the weights once per token (from L2 where they fit).
pub fn gemv_tokens(
    g: &Gpu,
    w: &GpuMatrix,
    x: Q8,
    n_tokens: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    if w.tune.x {
        return gemv_x_grid(g, w, w.tune, x, 1, n_tokens, segs, flags);
    }
    let [seg] = segs else {
        return Err(CudaError::Unsupported(
            "segmented outputs of a warp GEMV".into(),
        ));
    };
    let (grid, _, _) = gemv_grid(w.rows, w.tune);
    // Several rows per warp: 8 tokens per grid row (the weights read once
    // for them); otherwise a grid row per token.
    let rows_t = gemv_rows_t_name(w.kind, w.tune.r);
    let (name, grid_y) = match rows_t {
        Some(name) => (name, n_tokens.div_ceil(8)),
        None => (gemv_name(w.kind, 1, w.tune.u, w.tune.r), n_tokens),
    };
    let mut args = gemv_args(w, x, seg.y, seg.rows, seg.bias, flags);
    if rows_t.is_some() {
        args.push(Arg::I32(n_tokens as i32));
    }
    g.launch(name, (grid, grid_y as u32, 1), 256, &args)
}

/// RMSNorm of `rows` rows of width `dim` from x into out (see the kernel for
/// flags); `gain` 0 = scaleless; `q8` also quantizes the result.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    g: &Gpu,
    x: u64,
    out: u64,
    gain: u64,
    rows: usize,
    dim: usize,
    eps: f32,
    flags: i32,
    q8: Option<Q8>,
) -> Result<()> {
    let a = q8.unwrap_or(Q8 { q: 0, d: 0, s: 0 });
    g.launch(
        "rmsnorm",
        (rows as u32, 1, 1),
        g.norm_threads.load(std::sync::atomic::Ordering::Relaxed),
        &[
            Arg::Ptr(x),
            Arg::Ptr(out),
            Arg::Ptr(gain),
            Arg::I32(dim as i32),
            Arg::F32(eps),
            Arg::I32(flags),
            Arg::Ptr(a.q),
            Arg::Ptr(a.d),
            Arg::Ptr(a.s),
        ],
    )
}

/// out = y · s (+ bias[i % width]) (+ out with OUT_ADD) over n values.
#[allow(clippy::too_many_arguments)]
pub fn scale_bias(
    g: &Gpu,
    y: u64,
    out: u64,
    n: usize,
    width: usize,
    s: f32,
    bias: u64,
    flags: i32,
) -> Result<()> {
    g.launch(
        "scale_bias",
        (n.div_ceil(256).clamp(1, 65535) as u32, 1, 1),
        256,
        &[
            Arg::Ptr(y),
            Arg::Ptr(out),
            Arg::I32(n as i32),
            Arg::I32(width as i32),
            Arg::F32(s),
            Arg::Ptr(bias),
            Arg::I32(flags),
        ],
    )
}

/// z = z · scale, then cap · tanh(z / cap) when cap > 0, over n logits.
pub fn logit_transform(g: &Gpu, z: u64, n: usize, scale: f32, cap: f32) -> Result<()> {
    g.launch(
        "logit_transform",
        (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
        256,
        &[
            Arg::Ptr(z),
            Arg::I32(n as i32),
            Arg::F32(scale),
            Arg::F32(cap),
        ],
    )
}

/// out[r] (i32) = argmax of row r of x ([rows, n]; the lowest index on a tie).
pub fn argmax_rows(g: &Gpu, x: u64, rows: usize, n: usize, out: u64) -> Result<()> {
    g.launch(
        "argmax_rows",
        (rows as u32, 1, 1),
        1024,
        &[Arg::Ptr(x), Arg::I32(n as i32), Arg::Ptr(out)],
    )
}

/// Shapes and RoPE/norm settings for `prepare_heads`.
#[derive(Clone, Copy, Debug)]
pub struct HeadPrep {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub theta: f32,
    pub eps: f32,
    pub flags: i32,
}

/// Norms/rotates q and k of `n_tokens` tokens and writes k, v into the cache.
#[allow(clippy::too_many_arguments)]
pub fn prepare_heads(
    g: &Gpu,
    p: &HeadPrep,
    n_tokens: usize,
    q: u64,
    k: u64,
    v: u64,
    gains: (u64, u64),
    pos: u64,
    k_cache: u64,
    v_cache: u64,
    slots: usize,
) -> Result<()> {
    let blocks = n_tokens * (p.n_heads + 2 * p.n_kv);
    g.launch(
        "prepare_heads",
        (blocks as u32, 1, 1),
        (p.head_dim / 2) as u32,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::Ptr(gains.0),
            Arg::Ptr(gains.1),
            Arg::I32(p.n_heads as i32),
            Arg::I32(p.n_kv as i32),
            Arg::I32(p.head_dim as i32),
            Arg::Ptr(pos),
            Arg::F32(p.theta),
            Arg::F32(p.eps),
            Arg::I32(p.flags),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::I32(slots as i32),
        ],
    )
}

/// out = glu(a, b) over n values, quantized into `q8` (and stored as f32 in `out` unless 0).
#[allow(clippy::too_many_arguments)]
pub fn glu_q8(
    g: &Gpu,
    a: u64,
    b: u64,
    n: usize,
    mode: i32,
    flags: i32,
    out: u64,
    q8: Q8,
) -> Result<()> {
    g.launch(
        "glu_q8",
        grid1(n / 32, 8),
        256,
        &[
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::I32(n as i32),
            Arg::I32(mode),
            Arg::I32(flags),
            Arg::Ptr(out),
            Arg::Ptr(q8.q),
            Arg::Ptr(q8.d),
            Arg::Ptr(q8.s),
        ],
    )
}

/// Attention shapes for one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub slots: usize,
    /// 0 = global (flat cache).
    pub window: usize,
    pub scale: f32,
    pub kv: KvKind,
}

/// What a GPU KV cache stores (attention.cu's FA_16 / FA_Q8 / FA_Q4 and
/// prepare_heads' HEAD_KV_* flags). A block type's layer buffer holds every
/// row's quants first ([n_kv, slots, hd] bytes for q8_0, hd / 2 for q4_0),
/// then every row's f16 block scales ([n_kv, slots, hd / 32]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvKind {
    F16,
    Bf16,
    Q8_0,
    Q4_0,
}

impl KvKind {
    /// The kind of a cache of `types` (K and V of one type on the GPU), or
    /// why the CUDA kernels cannot hold it.
    pub fn of(types: hearth_models::KvTypes) -> Result<KvKind> {
        use hearth_models::KvDtype;
        if types.k != types.v {
            return Err(CudaError::Unsupported(format!(
                "a KV cache of K {} with V {} (the CUDA kernels take one type for both: f16, q8_0 or q4_0)",
                types.k.name(),
                types.v.name()
            )));
        }
        match types.k {
            KvDtype::F16 => Ok(KvKind::F16),
            KvDtype::Bf16 => Ok(KvKind::Bf16),
            KvDtype::Q8_0 => Ok(KvKind::Q8_0),
            KvDtype::Q4_0 => Ok(KvKind::Q4_0),
            t => Err(CudaError::Unsupported(format!(
                "a {} KV cache (the CUDA kernels take f16, q8_0 or q4_0)",
                t.name()
            ))),
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, KvKind::Q8_0 | KvKind::Q4_0)
    }

    /// Bytes of one head's row of `head_dim` values: (quants or values, scales).
    pub fn row_bytes(self, head_dim: usize) -> (usize, usize) {
        match self {
            KvKind::F16 | KvKind::Bf16 => (head_dim * 2, 0),
            KvKind::Q8_0 => (head_dim, head_dim / 16),
            KvKind::Q4_0 => (head_dim / 2, head_dim / 16),
        }
    }

    /// Bytes of a layer's K (or V) buffer.
    pub fn buffer_bytes(self, n_kv: usize, slots: usize, head_dim: usize) -> usize {
        let (q, s) = self.row_bytes(head_dim);
        n_kv * slots * (q + s)
    }

    /// prepare_heads' flags for writing this cache: its storage and
    /// llama.cpp's rotations of a quantized cache (every head size the
    /// kernels take is a multiple of 64, so both K and V rotate).
    pub fn head_flags(self) -> i32 {
        match self {
            KvKind::F16 => 0,
            KvKind::Bf16 => HEAD_KV_BF16,
            KvKind::Q8_0 => HEAD_KV_Q8 | HEAD_ROT_K | HEAD_ROT_V,
            KvKind::Q4_0 => HEAD_KV_Q4 | HEAD_ROT_K | HEAD_ROT_V,
        }
    }

    /// attn_combine's flag for reading this cache's attention output:
    /// rotated back from a quantized V's basis.
    pub fn combine_flags(self) -> i32 {
        if self.is_quantized() {
            OUT_ROT64
        } else {
            0
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvKind::F16 => "f16",
            KvKind::Bf16 => "bf16",
            KvKind::Q8_0 => "q8_0",
            KvKind::Q4_0 => "q4_0",
        }
    }
}

/// Dynamic shared memory of the head-dim-256 attention kernels (attention.cu:
/// 2 stages of a K and a V tile of 32 keys x 256 halves); the others use
/// static shared memory.
fn fa_dyn_smem_bytes(head_dim: usize, kv: KvKind) -> u32 {
    const FA_BK: usize = 32;
    let tiles = 2 * FA_BK * head_dim * 2; // a K and a V tile of 16-bit values
    let (q, s) = kv.row_bytes(head_dim);
    match (head_dim, kv.is_quantized()) {
        (256, false) => (2 * tiles) as u32,
        // 2 stages of staged quants and scales, then the f16 tile pair.
        (256, true) => (2 * 2 * FA_BK * (q + s) + tiles) as u32,
        _ => 0,
    }
}

/// Checks that the attention kernels support these shapes.
pub fn check_attn_shape(n_heads: usize, n_kv: usize, head_dim: usize) -> Result<()> {
    if !matches!(head_dim, 64 | 128 | 256) {
        return Err(CudaError::Unsupported(format!(
            "head_dim {head_dim} (the attention kernels take 64, 128 or 256)"
        )));
    }
    if n_kv == 0 || !n_heads.is_multiple_of(n_kv) || n_heads / n_kv > 16 {
        return Err(CudaError::Unsupported(format!(
            "{n_heads} query heads over {n_kv} kv heads (at most 16 per kv head)"
        )));
    }
    Ok(())
}

/// Query rows (token, head of the group) per block of the `_b` attention
/// kernels (4 warps of 16); at most 16 rows go to the `_d` kernel (one 16-row
/// tile, two warps splitting each key tile).
pub const ATTN_BLOCK_ROWS: usize = 64;

/// Blocks of the attention kernel per split for `n_tokens` tokens: one for a
/// decode-sized group of rows (G * T <= 16), else one per 64 rows.
pub fn attn_row_blocks(a: &AttnArgs, n_tokens: usize) -> usize {
    let rows = a.n_heads / a.n_kv * n_tokens;
    if rows <= 16 {
        1
    } else {
        rows.div_ceil(ATTN_BLOCK_ROWS)
    }
}

/// Which keys the rows of a pass see (attention.cu's masking modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMode {
    /// Token t at position pos + t sees positions up to its own (prefill, decode).
    Causal = 0,
    /// Causal, each token computed exactly as a one-token decode pass at its
    /// position computes it (decode kernel, decode splits): a batch-invariant
    /// verify pass. Needs n_heads / n_kv <= 16.
    PerToken = 1,
    /// Every token sees every position up to the pass's last (the DFlash
    /// drafter's non-causal block over its context).
    Full = 2,
}

/// out [T, n_heads, hd] = attention of q [T, n_heads, hd] over the cache, in
/// `splits` splits of the keys per (kv head, block of query rows), through the
/// partial buffers ([T, n_heads, splits] rows) and `attn_combine`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    g: &Gpu,
    a: &AttnArgs,
    n_tokens: usize,
    splits: usize,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    pos: u64,
    part_o: u64,
    part_ml: u64,
    out: u64,
    out_flags: i32,
    q8: Option<Q8>,
) -> Result<()> {
    attention_mode(
        g,
        a,
        AttnMode::Causal,
        n_tokens,
        splits,
        (q, k_cache, v_cache, pos),
        (part_o, part_ml),
        out,
        out_flags,
        q8,
    )
}

/// [`attention`] with a masking mode. `io`: (q, k_cache, v_cache, pos);
/// `parts`: (part_o, part_ml).
#[allow(clippy::too_many_arguments)]
pub fn attention_mode(
    g: &Gpu,
    a: &AttnArgs,
    mode: AttnMode,
    n_tokens: usize,
    splits: usize,
    (q, k_cache, v_cache, pos): (u64, u64, u64, u64),
    (part_o, part_ml): (u64, u64),
    out: u64,
    out_flags: i32,
    q8: Option<Q8>,
) -> Result<()> {
    let q8 = q8.unwrap_or(Q8 { q: 0, d: 0, s: 0 });
    let group = a.n_heads / a.n_kv;
    if mode == AttnMode::PerToken && group > 16 {
        return Err(CudaError::Unsupported(format!(
            "batch-invariant attention with {group} query heads per kv head (at most 16)"
        )));
    }
    let decode = match mode {
        AttnMode::PerToken => true,
        _ => group * n_tokens <= 16,
    };
    let row_blocks = match mode {
        AttnMode::PerToken => n_tokens,
        _ => attn_row_blocks(a, n_tokens),
    };
    let name = match (a.head_dim, a.kv, decode) {
        (64, KvKind::F16, true) => "fa_attn_64_f16_d",
        (64, KvKind::Bf16, true) => "fa_attn_64_bf16_d",
        (128, KvKind::F16, true) => "fa_attn_128_f16_d",
        (128, KvKind::Bf16, true) => "fa_attn_128_bf16_d",
        (256, KvKind::F16, true) => "fa_attn_256_f16_d",
        (64, KvKind::F16, false) => "fa_attn_64_f16_b",
        (64, KvKind::Bf16, false) => "fa_attn_64_bf16_b",
        (128, KvKind::F16, false) => "fa_attn_128_f16_b",
        (128, KvKind::Bf16, false) => "fa_attn_128_bf16_b",
        (256, KvKind::F16, false) => "fa_attn_256_f16_b",
        (64, KvKind::Q8_0, true) => "fa_attn_64_q8_d",
        (128, KvKind::Q8_0, true) => "fa_attn_128_q8_d",
        (256, KvKind::Q8_0, true) => "fa_attn_256_q8_d",
        (64, KvKind::Q8_0, false) => "fa_attn_64_q8_b",
        (128, KvKind::Q8_0, false) => "fa_attn_128_q8_b",
        (256, KvKind::Q8_0, false) => "fa_attn_256_q8_b",
        (64, KvKind::Q4_0, true) => "fa_attn_64_q4_d",
        (128, KvKind::Q4_0, true) => "fa_attn_128_q4_d",
        (256, KvKind::Q4_0, true) => "fa_attn_256_q4_d",
        (64, KvKind::Q4_0, false) => "fa_attn_64_q4_b",
        (128, KvKind::Q4_0, false) => "fa_attn_128_q4_b",
        (256, KvKind::Q4_0, false) => "fa_attn_256_q4_b",
        (hd, kv, _) => {
            return Err(CudaError::Unsupported(format!(
                "attention over a {} KV cache with head_dim {hd}",
                kv.name()
            )))
        }
    };
    g.launch_smem(
        name,
        (row_blocks as u32, a.n_kv as u32, splits as u32),
        if decode { 64 } else { 128 },
        fa_dyn_smem_bytes(a.head_dim, a.kv),
        &[
            Arg::Ptr(q),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(pos),
            Arg::I32(n_tokens as i32),
            Arg::I32(a.n_heads as i32),
            Arg::I32(a.n_kv as i32),
            Arg::I32(a.slots as i32),
            Arg::I32(a.window as i32),
            Arg::F32(a.scale),
            Arg::Ptr(part_o),
            Arg::Ptr(part_ml),
            Arg::I32(mode as i32),
        ],
    )?;
    g.launch(
        "attn_combine",
        (a.n_heads as u32, n_tokens as u32, 1),
        a.head_dim as u32,
        &[
            Arg::Ptr(part_o),
            Arg::Ptr(part_ml),
            Arg::I32(splits as i32),
            Arg::I32(a.head_dim as i32),
            Arg::I32(out_flags),
            Arg::Ptr(out),
            Arg::Ptr(q8.q),
            Arg::Ptr(q8.d),
            Arg::Ptr(q8.s),
        ],
    )
}

/// The single-token GEMV variants the tuner tries on a GPU of `sm_count`
/// multiprocessors: 1, 2 or 4 items in flight per lane, with one warp per
/// row or a grid of 2, 4 or 8 blocks per multiprocessor streaming the rows.
pub fn gemv_variants(sm_count: u32) -> Vec<GemvTune> {
    let mut v = Vec::new();
    for u in [1u8, 2, 4] {
        for per_sm in [0u32, 2, 4, 8] {
            v.push(GemvTune {
                u,
                blocks: per_sm * sm_count,
                r: 1,
                x: false,
            });
        }
    }
    for r in [2u8, 4] {
        for per_sm in [0u32, 2, 4, 8] {
            v.push(GemvTune {
                u: 1,
                blocks: per_sm * sm_count,
                r,
                x: false,
            });
        }
    }
    v
}

/// The register-activation variants for `w` (empty when its type or width has none).
pub fn gemv_x_variants(w: &GpuMatrix, sm_count: u32) -> Vec<GemvTune> {
    let Some((_, ipt)) = x_geometry(w.kind, w.cols) else {
        return Vec::new();
    };
    let rs: &[u8] = match (w.kind.is_k_quant(), ipt) {
        (true, _) => &[1, 2, 4],
        (false, 1) => &[1, 2, 4, 8],
        (false, _) => &[2, 4],
    };
    let mut v = Vec::new();
    for &r in rs {
        // One block per tile, about 2-16 blocks per SM, and grids that give
        // every block the same number of tiles (no tail of half-idle SMs).
        let tiles = w.rows.div_ceil(r as usize) as u32;
        let mut grids: Vec<u32> = [0u32, 2, 4, 8, 16].iter().map(|k| k * sm_count).collect();
        grids.extend(
            [2u32, 3, 4, 6]
                .iter()
                .map(|k| tiles.div_ceil(*k))
                .filter(|&b| b >= sm_count),
        );
        grids.dedup();
        for blocks in grids {
            v.push(GemvTune {
                u: 1,
                blocks,
                r,
                x: true,
            });
        }
    }
    v
}

/// One output range of a (possibly fused) matrix: `rows` consecutive rows
/// written densely to `y` ([n_tokens, rows]), with an optional bias.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub y: u64,
    pub bias: u64,
    pub rows: usize,
}

/// Threads per block and items per thread of the register-activation GEMV
/// for rows of `cols` values, if it takes them (blocks of at most 512 threads).
fn x_geometry(kind: WeightKind, cols: usize) -> Option<(u32, usize)> {
    let per_item = match kind {
        WeightKind::Q4K | WeightKind::Q5K | WeightKind::Q6K => 64,
        WeightKind::Q8_0 | WeightKind::Q4_0 | WeightKind::Q5_0 => 32,
        _ => return None,
    };
    let items = cols / per_item;
    let ipt = items.div_ceil(512);
    if ipt > if kind.is_k_quant() { 1 } else { 2 } {
        return None;
    }
    let threads = items.div_ceil(ipt).div_ceil(32) * 32;
    Some((threads as u32, ipt))
}

fn gemv_x_name(kind: WeightKind, nt: usize, r: u8, ipt: usize) -> Option<&'static str> {
    macro_rules! names {
        ($($k:ident => $s:literal),*) => {
            match (kind, nt, r, ipt) {
                $( (WeightKind::$k, 1, 1, 1) => Some(concat!("gemv_", $s, "_x1_r1_i1")),
                   (WeightKind::$k, 1, 2, 1) => Some(concat!("gemv_", $s, "_x1_r2_i1")),
                   (WeightKind::$k, 1, 4, 1) => Some(concat!("gemv_", $s, "_x1_r4_i1")),
                   (WeightKind::$k, 2, 2, 1) => Some(concat!("gemv_", $s, "_x2_r2_i1")), )*
                _ => None,
            }
        };
    }
    macro_rules! names32 {
        ($($k:ident => $s:literal),*) => {
            match (kind, nt, r, ipt) {
                $( (WeightKind::$k, 1, 8, 1) => Some(concat!("gemv_", $s, "_x1_r8_i1")),
                   (WeightKind::$k, 1, 2, 2) => Some(concat!("gemv_", $s, "_x1_r2_i2")),
                   (WeightKind::$k, 1, 4, 2) => Some(concat!("gemv_", $s, "_x1_r4_i2")),
                   (WeightKind::$k, 2, 2, 2) => Some(concat!("gemv_", $s, "_x2_r2_i2")), )*
                _ => None,
            }
        };
    }
    names!(Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0", Q4K => "q4_k", Q5K => "q5_k", Q6K => "q6_k")
        .or_else(|| names32!(Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0"))
}

/// One register-activation GEMV launch for `nt` tokens (1 or 2) into up to four segments.
pub fn gemv_x(
    g: &Gpu,
    w: &GpuMatrix,
    tune: GemvTune,
    x: Q8,
    nt: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    gemv_x_grid(g, w, tune, x, nt, 1, segs, flags)
}

/// [`gemv_x`] over `groups` grid rows of `nt` tokens each (each group as its own launch).
#[allow(clippy::too_many_arguments)]
fn gemv_x_grid(
    g: &Gpu,
    w: &GpuMatrix,
    tune: GemvTune,
    x: Q8,
    nt: usize,
    groups: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    let (threads, ipt) = x_geometry(w.kind, w.cols).ok_or_else(|| {
        CudaError::Unsupported(format!(
            "register GEMV of {:?} with {} columns",
            w.kind, w.cols
        ))
    })?;
    // Two-token launches use the one tile height compiled for them.
    let r = if nt == 1 { tune.r } else { 2 };
    let name = gemv_x_name(w.kind, nt, r, ipt).ok_or_else(|| {
        CudaError::Unsupported(format!(
            "register GEMV {:?} nt {nt} r {r} ipt {ipt}",
            w.kind
        ))
    })?;
    if segs.is_empty() || segs.len() > 4 || segs.iter().map(|s| s.rows).sum::<usize>() != w.rows {
        return Err(CudaError::Unsupported(format!(
            "GEMV segments {:?} for {} rows",
            segs.iter().map(|s| s.rows).collect::<Vec<_>>(),
            w.rows
        )));
    }
    let mut bounds = [w.rows as i32; 3];
    let mut acc = 0;
    for (i, s) in segs.iter().take(3).enumerate() {
        acc += s.rows;
        bounds[i] = acc as i32;
    }
    let seg = |i: usize| {
        segs.get(i).copied().unwrap_or(Segment {
            y: 0,
            bias: 0,
            rows: 0,
        })
    };
    let tiles = w.rows.div_ceil(r as usize) as u32;
    let blocks = if tune.blocks > 0 && nt == 1 {
        tiles.min(tune.blocks)
    } else {
        tiles
    };
    let mut args = gemv_head_args(w, x);
    args.extend([
        Arg::I32(flags),
        Arg::I32(bounds[0]),
        Arg::I32(bounds[1]),
        Arg::I32(bounds[2]),
        Arg::Ptr(seg(0).y),
        Arg::Ptr(seg(1).y),
        Arg::Ptr(seg(2).y),
        Arg::Ptr(seg(3).y),
        Arg::Ptr(seg(0).bias),
        Arg::Ptr(seg(1).bias),
        Arg::Ptr(seg(2).bias),
        Arg::Ptr(seg(3).bias),
    ]);
    g.launch(name, (blocks, groups as u32, 1), threads, &args)
}

/// `n_tokens` tokens through the register-activation GEMV, in launches of
/// 2 and 1 tokens (each reads the weights once), into `segs`.
pub fn gemv_segments(
    g: &Gpu,
    w: &GpuMatrix,
    x: Q8,
    n_tokens: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(2);
        let moved: Vec<Segment> = segs
            .iter()
            .map(|s| Segment {
                y: s.y + (t0 * s.rows * 4) as u64,
                ..*s
            })
            .collect();
        gemv_x(g, w, w.tune, x.offset(t0, w.cols), nt, &moved, flags)?;
        t0 += nt;
    }
    Ok(())
}
