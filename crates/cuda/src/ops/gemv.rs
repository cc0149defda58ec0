//! GEMV launches: quantizing the activations to 8 bits, the warp kernels
//! (one token, several tokens), and the int8 tensor-core kernels for small
//! token blocks.

use super::*;

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

/// The int8 tensor-core kernels of a weight type (1 and 2 tiles of 8 tokens), gemv_mma.cu `gemv_mma`.
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
