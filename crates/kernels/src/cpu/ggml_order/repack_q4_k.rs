//! The numerics of llama.cpp's repacked ("CPU_REPACK") matmuls on x86.
//!
//! At load, llama.cpp's CPU backend interleaves some weight matrices so that
//! eight rows are processed together (ggml-cpu/repack.cpp): on x86 with AVX2,
//! Q4_K matrices whose row count is a multiple of 8 become `q4_K_8x8`. Their
//! matmul then accumulates differently from the plain `vec_dot`:
//! - batches of 4+ activation rows (`gemm`): the first `n - n % 4` rows are
//!   quantized four at a time (`quantize_mat_q8_K_4x8`) and every 64-value
//!   half of a super-block enters its own fused multiply-add;
//! - the remaining rows (and single-token decode, `gemv`) use the ordinary
//!   Q8_K quantizer and one fused multiply-add per 256-value super-block.
//!
//! In both, the scale part and the min part go to separate f32 accumulators,
//! subtracted at the end. Integer partial sums are exact, so only these
//! groupings decide the rounding.

pub use super::q8_k_x86::quantize_row_q8_k_mat_x86;
use crate::quant::blocks::*;

/// Whether llama.cpp repacks a weight matrix of this type and row count on
/// x86 (AVX2), so that its matmul follows the orders in this module.
pub fn is_repacked_q4_k(rows: usize) -> bool {
    rows.is_multiple_of(8)
}

/// Quantizes one row to Q8_K as llama.cpp's x86 `quantize_mat_q8_K_4x8` does
/// for the gemm rows: the same values as the reference quantizer except for
/// the sign of the scale when both +amax and -amax occur (here any +amax makes
/// the scale negative; the reference follows the first extreme). One value at
/// a time; [`quantize_row_q8_k_mat_x86`] is the same on AVX2 registers.
pub fn quantize_row_q8_k_mat_x86_ref(src: &[f32], dst: &mut [BlockQ8K]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.iter_mut()) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            *y = BlockQ8K::default();
            continue;
        }
        let iscale = if x.contains(&amax) {
            -127.0 / amax
        } else {
            127.0 / amax
        };
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = (iscale * v).round_ties_even().clamp(-128.0, 127.0) as i8;
        }
        for (sum, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *sum = q.iter().map(|&q| q as i32).sum::<i32>() as i16;
        }
        y.d = 1.0 / iscale;
    }
}

/// Integer parts of one Q4_K super-block against one Q8_K block, per pair of
/// 32-value sub-blocks `(2p, 2p + 1)`: `(Σ scale·q·a, Σ min·bsum)`.
fn q4_k_pair_sums(bx: &BlockQ4K, by: &BlockQ8K) -> [(i32, i32); 4] {
    std::array::from_fn(|p| {
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in [2 * p, 2 * p + 1] {
            let (sc, m) = scale_min_k4(j, &bx.scales);
            let upper = j % 2 == 1;
            let mut g = 0i32;
            for l in 0..32 {
                let byte = bx.qs[32 * p + l];
                let q = if upper { byte >> 4 } else { byte & 0x0f } as i32;
                g += q * by.qs[32 * j + l] as i32;
            }
            isum += sc as i32 * g;
            msum += m as i32 * (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32);
        }
        (isum, msum)
    })
}

/// Q4_K · Q8_K in the order of llama.cpp's x86 `ggml_gemv_q4_K_8x8_q8_K`
/// (decode, and batch rows past the last multiple of 4): one
/// `fma(Σ, d·dy, acc)` per super-block for the scales and one
/// `fma(Σ, dmin·dy, acc_m)` for the mins; the result is `acc - acc_m`.
pub fn vec_dot_q4_k_q8_k_gemv_x86(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for (bx, by) in x.iter().zip(y) {
        let sums = q4_k_pair_sums(bx, by);
        let isum: i32 = sums.iter().map(|s| s.0).sum();
        let msum: i32 = sums.iter().map(|s| s.1).sum();
        acc = (isum as f32).mul_add(bx.d.to_f32() * by.d, acc);
        acc_m = (msum as f32).mul_add(bx.dmin.to_f32() * by.d, acc_m);
    }
    acc - acc_m
}

/// Q4_K · Q8_K in the order of llama.cpp's x86 `ggml_gemm_q4_K_8x8_q8_K`
/// (prompt batches, rows quantized by [`quantize_row_q8_k_mat_x86`]): like
/// the gemv, but one fused multiply-add per 64-value half of a super-block.
pub fn vec_dot_q4_k_q8_k_gemm_x86(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for (bx, by) in x.iter().zip(y) {
        let (d, dmin) = (bx.d.to_f32() * by.d, bx.dmin.to_f32() * by.d);
        for (isum, msum) in q4_k_pair_sums(bx, by) {
            acc = (isum as f32).mul_add(d, acc);
            acc_m = (msum as f32).mul_add(dmin, acc_m);
        }
    }
    acc - acc_m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ggml_order::vec_dot::vec_dot_q4_k_q8_k_ref;
    use crate::quant::{quantize, quantize_row_q8_k_ref};
    use hearth_gguf::GgmlType;
    use rand::{Rng, SeedableRng};

    /// The repacked orders compute the reference's sum up to f32 rounding, and
    /// the 4-row quantizer matches the reference quantizer when the row's
    /// extreme is unique.
    #[test]
    fn repacked_q4_k_orders_match_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let n = 3 * QK_K;
        let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut wq = vec![0u8; n / QK_K * GgmlType::Q4_K.type_size()];
        quantize(GgmlType::Q4_K, &w, &mut wq).unwrap();
        let x: &[BlockQ4K] = as_blocks(&wq).unwrap();
        let (mut y, mut ym) = (
            vec![BlockQ8K::default(); n / QK_K],
            vec![BlockQ8K::default(); n / QK_K],
        );
        quantize_row_q8_k_ref(&a, &mut y);
        quantize_row_q8_k_mat_x86(&a, &mut ym);
        for (p, q) in y.iter().zip(&ym) {
            assert_eq!((p.d, p.qs, p.bsums), (q.d, q.qs, q.bsums));
        }
        let r = vec_dot_q4_k_q8_k_ref(x, &y);
        for v in [
            vec_dot_q4_k_q8_k_gemv_x86(x, &y),
            vec_dot_q4_k_q8_k_gemm_x86(x, &ym),
        ] {
            assert!((v - r).abs() <= 1e-4 * r.abs().max(1.0), "{v} vs {r}");
        }
    }
}
