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
    w.cols.is_multiple_of(64)
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

/// The split-K variant (clusters of two blocks, each half of k), for the types that have one.
fn name_k2(kind: WeightKind, bf16: bool) -> Option<&'static str> {
    Some(match (kind, bf16) {
        (WeightKind::Q8_0, false) => "gemm_q8_0_f16_k2",
        (WeightKind::Q8_0, true) => "gemm_q8_0_bf16_k2",
        (WeightKind::Q4K, false) => "gemm_q4_k_f16_k2",
        (WeightKind::Q4K, true) => "gemm_q4_k_bf16_k2",
        (WeightKind::Q5K, false) => "gemm_q5_k_f16_k2",
        (WeightKind::Q5K, true) => "gemm_q5_k_bf16_k2",
        (WeightKind::Q6K, false) => "gemm_q6_k_f16_k2",
        (WeightKind::Q6K, true) => "gemm_q6_k_bf16_k2",
        _ => return None,
    })
}

/// Estimated time of `blocks` equal blocks of `work` on `sms` multiprocessors
/// holding two blocks each: a multiprocessor running two blocks takes about
/// 1.3 times as long as for one (measured on an H200: one block alone gets
/// about 77% of the throughput of two).
fn makespan(blocks: usize, work: f64, sms: usize) -> f64 {
    let (full, rem) = (blocks / (2 * sms), blocks % (2 * sms));
    let last = match rem {
        0 => 0.0,
        r if r <= sms => 1.0,
        _ => 1.3,
    };
    work * (full as f64 * 1.3 + last)
}

/// Whether splitting k in two (twice the blocks, half the work each, plus the
/// reduction) beats one block per tile by a clear margin. Only for grids of at
/// most one round: with several rounds the blocks don't run in lockstep and
/// the split measured slower (27648 x 5120 at 512 tokens: 584 against 563 us).
fn split_pays(tiles: usize, sms: usize) -> bool {
    tiles <= 2 * sms && makespan(2 * tiles, 0.5, sms) < 0.93 * makespan(tiles, 1.0, sms)
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
    debug_assert!(
        n < 1 << 32,
        "gemm: {n_tokens} tokens x {} too large",
        w.cols
    );
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
    // x: 128-token tiles, y: 128-row tiles (blocks sharing a weight tile run together).
    let (tt, rt) = (n_tokens.div_ceil(128) as u32, w.rows.div_ceil(128) as u32);
    // Split k in two (a cluster of two blocks per tile, reduced in shared memory)
    // where that shortens the estimated time: see `split_pays`.
    let k2 = match name_k2(w.kind, bf16) {
        Some(n) if w.cols >= 128 && split_pays((tt * rt) as usize, g.info.sm_count as usize) => {
            Some(n)
        }
        _ => None,
    };
    g.launch(
        k2.unwrap_or(name(w.kind, bf16)),
        (tt, rt, if k2.is_some() { 2 } else { 1 }),
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

#[cfg(test)]
mod tests {
    use super::split_pays;

    /// H200 (132 multiprocessors), 128 x 128 tiles at 512 tokens: split for 5120
    /// and 1024 rows (160 and 32 tiles), not for 27648 (864); not for 216 tiles
    /// (27648 rows at 64 tokens), where both take two rounds.
    #[test]
    fn split_policy() {
        assert!(split_pays(160, 132));
        assert!(split_pays(32, 132));
        assert!(!split_pays(864, 132));
        assert!(!split_pays(216, 132));
    }
}
