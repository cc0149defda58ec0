//! The numerics of llama.cpp's tiled K-quant matmul on x86 (ggml-cpu/tiled,
//! AVX-512 VNNI microkernel), which it takes for batches of 8 or more
//! activation rows against Q4_K/Q5_K/Q6_K weights that were not repacked.
//!
//! Per output and per 256-value super-block, the integer sums are exact; the
//! block's value is `isum·d` (Q6_K) or `fma(-dmin, msum, isum·d)` (Q4_K,
//! Q5_K), which then enters `acc = fma(block, dy, acc)` in block order.

use crate::quant::blocks::*;

/// The type-independent part: `Σ_b fma(block(b), dy_b, ·)` in block order.
fn accumulate<B>(x: &[B], y: &[BlockQ8K], block: impl Fn(&B, &BlockQ8K) -> f32) -> f32 {
    x.iter()
        .zip(y)
        .fold(0.0f32, |acc, (bx, by)| block(bx, by).mul_add(by.d, acc))
}

/// Integer sums of a Q4_K/Q5_K-style block: `(Σ_j sc_j·Σ q·a, Σ_j m_j·bsum_j)`
/// over eight 32-value sub-blocks, `q(j, l)` the unsigned quant.
fn k_sums(scales: &[u8; 12], by: &BlockQ8K, q: impl Fn(usize, usize) -> i32) -> (i32, i32) {
    let (mut isum, mut msum) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        let g: i32 = (0..32).map(|l| q(j, l) * by.qs[32 * j + l] as i32).sum();
        isum += sc as i32 * g;
        msum += m as i32 * (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32);
    }
    (isum, msum)
}

/// Q4_K · Q8_K in the tiled kernel's order.
pub fn vec_dot_q4_k_q8_k_tiled(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    accumulate(x, y, |bx, by| {
        let (isum, msum) = k_sums(&bx.scales, by, |j, l| {
            let byte = bx.qs[32 * (j / 2) + l];
            (if j % 2 == 1 { byte >> 4 } else { byte & 0x0f }) as i32
        });
        (-bx.dmin.to_f32()).mul_add(msum as f32, isum as f32 * bx.d.to_f32())
    })
}

/// Q5_K · Q8_K in the tiled kernel's order.
pub fn vec_dot_q5_k_q8_k_tiled(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    accumulate(x, y, |bx, by| {
        let (isum, msum) = k_sums(&bx.scales, by, |j, l| {
            let byte = bx.qs[32 * (j / 2) + l];
            let low = (if j % 2 == 1 { byte >> 4 } else { byte & 0x0f }) as i32;
            low | ((((bx.qh[l] >> j) & 1) as i32) << 4)
        });
        (-bx.dmin.to_f32()).mul_add(msum as f32, isum as f32 * bx.d.to_f32())
    })
}

/// Q6_K · Q8_K in the tiled kernel's order.
pub fn vec_dot_q6_k_q8_k_tiled(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    accumulate(x, y, |bx, by| {
        let mut isum = 0i32;
        for n in 0..2 {
            let (ql, qh) = (&bx.ql[64 * n..64 * n + 64], &bx.qh[32 * n..32 * n + 32]);
            for l in 0..32 {
                let q = [
                    (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    let idx = 128 * n + 32 * k + l;
                    isum += bx.scales[idx / 16] as i32 * (qk as i32 - 32) * by.qs[idx] as i32;
                }
            }
        }
        isum as f32 * bx.d.to_f32()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ggml_order::vec_dot::{vec_dot_q4_k_q8_k_ref, vec_dot_q6_k_q8_k_ref};
    use crate::quant::{quantize, quantize_row_q8_k_ref};
    use hearth_gguf::GgmlType;
    use rand::{Rng, SeedableRng};

    /// The tiled orders compute the reference's sums up to f32 rounding.
    #[test]
    fn tiled_orders_match_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let n = 3 * QK_K;
        let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut y = vec![BlockQ8K::default(); n / QK_K];
        quantize_row_q8_k_ref(&a, &mut y);
        let close =
            |p: f32, q: f32| assert!((p - q).abs() <= 1e-4 * q.abs().max(1.0), "{p} vs {q}");
        let wq = |ty: GgmlType| {
            let mut b = vec![0u8; n / QK_K * ty.type_size()];
            quantize(ty, &w, &mut b).unwrap();
            b
        };
        let (b4, b6) = (wq(GgmlType::Q4_K), wq(GgmlType::Q6_K));
        close(
            vec_dot_q4_k_q8_k_tiled(as_blocks(&b4).unwrap(), &y),
            vec_dot_q4_k_q8_k_ref(as_blocks(&b4).unwrap(), &y),
        );
        close(
            vec_dot_q6_k_q8_k_tiled(as_blocks(&b6).unwrap(), &y),
            vec_dot_q6_k_q8_k_ref(as_blocks(&b6).unwrap(), &y),
        );
    }
}
