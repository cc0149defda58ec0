//! The Q8_K activation quantizers on AVX2 registers: the same bytes, sums and
//! scales as the scalar quantizers they stand for (llama.cpp's reference
//! `quantize_row_q8_K_ref`, [`quantize_row_q8_k_ref`], and its x86 4-row
//! `quantize_mat_q8_K_4x8`, [`quantize_row_q8_k_mat_x86_ref`]), eight values
//! per instruction. A block holding a NaN or an infinity, or whose scale
//! overflows (|x| below ~3.7e-37), takes the scalar quantizer (its `max` and
//! integer conversions decide what such a block holds).
//!
//! Why the values agree: |x| maxima are exact in any order; the scale is the
//! same scalar division; each product `iscale * x` is one f32 multiplication
//! either way, rounded to nearest even by `vroundps` as `round_ties_even` and
//! ggml's `nearest_int` (exact for |v| < 2^22; here |v| <= 127) round it; the
//! packs saturate to [-128, 127] as the scalar clamp does; the 16-value sums
//! are integer sums.

use super::repack_q4_k::quantize_row_q8_k_mat_x86_ref;
use crate::quant::blocks::{BlockQ8K, QK_K};
use crate::quant::quantize_row_q8_k_ref;

/// [`quantize_row_q8_k_ref`] with AVX2 where the CPU has it.
pub fn quantize_row_q8_k_x86(src: &[f32], dst: &mut [BlockQ8K]) {
    quantize_row::<true>(src, dst);
}

/// [`quantize_row_q8_k_mat_x86_ref`] with AVX2 where the CPU has it.
pub fn quantize_row_q8_k_mat_x86(src: &[f32], dst: &mut [BlockQ8K]) {
    quantize_row::<false>(src, dst);
}

/// FIRST: the reference quantizer's scale (-127 over the first value of
/// largest magnitude); else the 4-row quantizer's (negative when +amax occurs).
fn quantize_row<const FIRST: bool>(src: &[f32], dst: &mut [BlockQ8K]) {
    assert_eq!(
        src.len(),
        dst.len() * QK_K,
        "Q8_K: {} values for {} blocks",
        src.len(),
        dst.len()
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { avx2::quantize_row::<FIRST>(src, dst) };
    }
    scalar::<FIRST>(src, dst);
}

/// The scalar quantizer `quantize_row::<FIRST>` stands for.
fn scalar<const FIRST: bool>(src: &[f32], dst: &mut [BlockQ8K]) {
    if FIRST {
        quantize_row_q8_k_ref(src, dst);
    } else {
        quantize_row_q8_k_mat_x86_ref(src, dst);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::vec_dot::x86_q8_0::hmax;
    use super::*;
    use std::arch::x86_64::*;

    /// [`super::quantize_row`] on AVX2 registers.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_row<const FIRST: bool>(src: &[f32], dst: &mut [BlockQ8K]) {
        let sign = _mm256_set1_ps(-0.0);
        for (x, y) in src.chunks_exact(QK_K).zip(dst.iter_mut()) {
            let p = x.as_ptr();
            let mut m = _mm256_setzero_ps();
            let mut unordered = _mm256_setzero_ps();
            for i in 0..QK_K / 8 {
                let v = _mm256_loadu_ps(p.add(8 * i));
                m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
                unordered = _mm256_or_ps(unordered, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            }
            let amax = hmax(m);
            if _mm256_movemask_ps(unordered) != 0 || !amax.is_finite() {
                scalar::<FIRST>(x, std::slice::from_mut(y));
                continue;
            }
            if amax == 0.0 {
                *y = BlockQ8K::default();
                continue;
            }
            let av = _mm256_set1_ps(amax);
            let iscale = if FIRST {
                // The first value whose magnitude is amax.
                let mut max = amax;
                for i in 0..QK_K / 8 {
                    let v = _mm256_loadu_ps(p.add(8 * i));
                    let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                        _mm256_andnot_ps(sign, v),
                        av,
                    ));
                    if hit != 0 {
                        max = x[8 * i + hit.trailing_zeros() as usize];
                        break;
                    }
                }
                -127.0 / max
            } else {
                let mut hit = 0;
                for i in 0..QK_K / 8 {
                    let v = _mm256_loadu_ps(p.add(8 * i));
                    hit |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, av));
                }
                if hit != 0 {
                    -127.0 / amax
                } else {
                    127.0 / amax
                }
            };
            if !iscale.is_finite() {
                // amax below ~3.7e-37: the scale overflows and the scalar
                // conversions of infinite products decide the bytes.
                scalar::<FIRST>(x, std::slice::from_mut(y));
                continue;
            }
            let is = _mm256_set1_ps(iscale);
            let q = y.qs.as_mut_ptr();
            for g in 0..QK_K / 16 {
                let round = |o: usize| {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(16 * g + o)), is);
                    _mm256_cvtps_epi32(_mm256_round_ps::<
                        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                    >(v))
                };
                // 16 values: i32 -> i16 (saturating) -> i8 (saturating).
                let w = _mm256_packs_epi32(round(0), round(8)); // lanes 0-3 8-11 | 4-7 12-15
                let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(w); // values 0..15 in order
                let b =
                    _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
                _mm_storeu_si128(q.add(16 * g) as *mut __m128i, b);
                // The sum of the 16 stored bytes (sign-extended).
                let s = _mm256_madd_epi16(_mm256_cvtepi8_epi16(b), _mm256_set1_epi16(1));
                let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
                y.bsums[g] = _mm_cvtsi128_si32(s1) as i16;
            }
            y.d = 1.0 / iscale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn check(name: &str, x: &[f32]) {
        let n = x.len() / QK_K;
        for first in [true, false] {
            let (mut want, mut got) = (vec![BlockQ8K::default(); n], vec![BlockQ8K::default(); n]);
            if first {
                quantize_row_q8_k_ref(x, &mut want);
                quantize_row_q8_k_x86(x, &mut got);
            } else {
                quantize_row_q8_k_mat_x86_ref(x, &mut want);
                quantize_row_q8_k_mat_x86(x, &mut got);
            }
            for (b, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    (w.d.to_bits(), w.qs, w.bsums),
                    (g.d.to_bits(), g.qs, g.bsums),
                    "{name}, block {b}, first-extreme scale {first}"
                );
            }
        }
    }

    /// Bit for bit the scalar quantizers, on random rows of many scales and on
    /// the cases where the scale's sign or the fallback decides: ties of +amax
    /// and -amax in either order, all-zero blocks, subnormals, NaN and infinity.
    #[test]
    fn q8_k_avx2_quantizers_equal_the_scalar_ones() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for scale in [1e-30f32, 1e-6, 0.01, 1.0, 37.5, 1e4, 1e30] {
            let x: Vec<f32> = (0..8 * QK_K)
                .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
                .collect();
            check(&format!("random x {scale}"), &x);
        }
        let mut x: Vec<f32> = (0..12 * QK_K)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        // Block 0: -2 before +2; block 1: +2 before -2; block 2: +2 only, at the end.
        x[5] = -2.0;
        x[200] = 2.0;
        x[QK_K + 17] = 2.0;
        x[QK_K + 18] = -2.0;
        x[3 * QK_K - 1] = 2.0;
        // Block 3: zeros (and a negative zero); block 4: subnormals.
        for v in &mut x[3 * QK_K..4 * QK_K] {
            *v = 0.0;
        }
        x[3 * QK_K + 9] = -0.0;
        for (i, v) in x[4 * QK_K..5 * QK_K].iter_mut().enumerate() {
            *v = f32::from_bits(1 + i as u32) * if i % 3 == 0 { -1.0 } else { 1.0 };
        }
        // Blocks 5-8: NaN, +inf, -inf, both infinities.
        x[5 * QK_K + 100] = f32::NAN;
        x[6 * QK_K + 3] = f32::INFINITY;
        x[7 * QK_K + 250] = f32::NEG_INFINITY;
        x[8 * QK_K] = f32::INFINITY;
        x[8 * QK_K + 1] = f32::NEG_INFINITY;
        // Block 9: values that round at exactly .5 after scaling (amax 127).
        for (i, v) in x[9 * QK_K..10 * QK_K].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) + 0.5;
        }
        x[9 * QK_K] = 127.0;
        check("special blocks", &x);
    }
}
