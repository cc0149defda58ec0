//! Launches of the tensor-core GEMM (kernels/gemm.cu) for blocks of many
//! tokens (prefill): weights are dequantized per 128 x 64 tile into shared
//! memory and multiplied with 128 tokens at once, so the weight bytes are read
//! once per 128 tokens instead of once per 8.

use crate::driver::{Arg, Gpu};
use crate::error::Result;
use crate::ops::GpuMatrix;
use crate::repack::WeightKind;

/// Whether the GEMM kernels take this matrix (its width must be a multiple of the 64-wide k tile).
pub fn supported(w: &GpuMatrix) -> bool {
    w.cols % 64 == 0
}

fn name(kind: WeightKind, bf16: bool) -> &'static str {
    macro_rules! names {
        ($($k:ident => $s:literal),*) => {
            match (kind, bf16) {
                $( (WeightKind::$k, false) => concat!("gemm_", $s, "_f16"),
                   (WeightKind::$k, true) => concat!("gemm_", $s, "_bf16"), )*
            }
        };
    }
    names!(F32 => "f32", F16 => "f16", Bf16 => "bf16", Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0", Q4K => "q4_k", Q5K => "q5_k", Q6K => "q6_k")
}

/// y[t, :] (op)= W · x[t, :] for t < n_tokens with x as f32 [n_tokens, cols];
/// the tile products run in bf16 (`bf16`) or f16 with f32 accumulation.
/// `xh` is scratch for x in that type (n_tokens * cols 16-bit values).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    g: &Gpu,
    w: &GpuMatrix,
    x: u64,
    xh: u64,
    n_tokens: usize,
    y: u64,
    y_stride: usize,
    bias: u64,
    flags: i32,
    bf16: bool,
) -> Result<()> {
    let n = n_tokens * w.cols;
    // The kernel indexes the activations with 32-bit offsets.
    debug_assert!(n < 1 << 32, "gemm: {n_tokens} tokens x {} too large", w.cols);
    g.launch(
        "to_half",
        ((n.div_ceil(256)).min(4096) as u32, 1, 1),
        256,
        &[
            Arg::Ptr(x),
            Arg::Ptr(xh),
            Arg::I32(n as i32),
            Arg::I32(bf16 as i32),
        ],
    )?;
    g.launch(
        name(w.kind, bf16),
        // x: 128-token tiles, y: 128-row tiles (blocks sharing a weight tile run together).
        (n_tokens.div_ceil(128) as u32, w.rows.div_ceil(128) as u32, 1),
        256,
        &[
            Arg::Ptr(w.body),
            Arg::Ptr(w.scales),
            Arg::I32(w.rows as i32),
            Arg::I32(w.cols as i32),
            Arg::Ptr(xh),
            Arg::I32(n_tokens as i32),
            Arg::Ptr(y),
            Arg::I32(y_stride as i32),
            Arg::Ptr(bias),
            Arg::I32(flags),
        ],
    )
}
