//! Scalar reference dot products between one weight row (GGML block format)
//! and one activation row quantized to the matching 8-bit format, as llama.cpp
//! computes them: integer products within a block, scaled by the block scales
//! in f32. These are the reference kernels that optimized versions are tested
//! against; keep them simple.

use half::f16;

use crate::quant::blocks::*;

/// Q8_1: 32 activation values `d * q` with `s = d * Σq` (both rounded to f16
/// as llama.cpp stores them). Used with Q4_1 and Q5_1 weights.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockQ8_1 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK],
}

/// Quantizes activations to Q8_1 as llama.cpp's CPU backend does on x86
/// (`quantize_row_q8_1` in ggml-cpu/arch/x86/quants.c, the AVX path): the
/// inverse scale is `127 / amax` (not `1 / d`) and products are rounded half to
/// even (`_mm256_round_ps`), unlike the generic reference's `roundf`. Either
/// difference flips a quant now and then, which is visible in the logits.
pub fn quantize_row_q8_1_ref(src: &[f32], dst: &mut [BlockQ8_1]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.iter_mut()) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        b.d = f16::from_f32(d).to_f32();
        b.s = f16::from_f32(d * sum as f32).to_f32();
    }
}

/// Quantizes activations to Q8_0 as llama.cpp's CPU backend does on x86
/// (`quantize_row_q8_0`, AVX path): inverse scale `127 / amax`, round half to
/// even. The generic `quantize_row_q8_0_ref` (used for weights) keeps `roundf`.
/// With AVX2 the blocks go through vectors ([`x86_q8_0::quantize_row`]), the
/// same values as the block-by-block reference [`quantize_block_q8_0_x86`].
pub fn quantize_row_q8_0_x86(src: &[f32], dst: &mut [BlockQ8_0]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { x86_q8_0::quantize_row(src, dst) };
    }
    quantize_row_q8_0_x86_ref(src, dst);
}

/// [`quantize_row_q8_0_x86`] one value at a time (the reference).
pub fn quantize_row_q8_0_x86_ref(src: &[f32], dst: &mut [BlockQ8_0]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.iter_mut()) {
        quantize_block_q8_0_x86(x.try_into().expect("32 values"), b);
    }
}

fn quantize_block_q8_0_x86(x: &[f32; QK], b: &mut BlockQ8_0) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    b.d = F16Le::from_f32(amax / 127.0);
    for (q, v) in b.qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
}

/// The Q8_0 activation quantizer on AVX2 registers, as llama.cpp's AVX2
/// `quantize_row_q8_0` runs it: |x| maximum by `vmaxps`, products rounded
/// to nearest even by `vroundps`, packed with saturation. Blocks holding a
/// NaN or an infinity take the reference (Rust's `as i8` maps NaN to 0).
#[cfg(target_arch = "x86_64")]
pub(super) mod x86_q8_0 {
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_row(src: &[f32], dst: &mut [BlockQ8_0]) {
        let sign = _mm256_set1_ps(-0.0);
        for (x, b) in src.chunks_exact(QK).zip(dst.iter_mut()) {
            let v: [__m256; 4] = [
                _mm256_loadu_ps(x.as_ptr()),
                _mm256_loadu_ps(x.as_ptr().add(8)),
                _mm256_loadu_ps(x.as_ptr().add(16)),
                _mm256_loadu_ps(x.as_ptr().add(24)),
            ];
            let mut m = _mm256_setzero_ps();
            let mut unordered = _mm256_setzero_ps();
            for &vi in &v {
                let a = _mm256_andnot_ps(sign, vi);
                m = _mm256_max_ps(a, m);
                unordered = _mm256_or_ps(unordered, _mm256_cmp_ps::<_CMP_UNORD_Q>(vi, vi));
            }
            let amax = hmax(m);
            if _mm256_movemask_ps(unordered) != 0 || !amax.is_finite() {
                quantize_block_q8_0_x86(x.try_into().expect("32 values"), b);
                continue;
            }
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            b.d = F16Le::from_f32(amax / 127.0);
            let idv = _mm256_set1_ps(id);
            let q: [__m256i; 4] = [
                round(v[0], idv),
                round(v[1], idv),
                round(v[2], idv),
                round(v[3], idv),
            ];
            // packs interleave 128-bit halves; the permute restores the order.
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, p);
        }
    }

    /// The largest of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn hmax(m: __m256) -> f32 {
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn round(v: __m256, id: __m256) -> __m256i {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, id),
        );
        _mm256_cvtps_epi32(r)
    }
}

pub fn vec_dot_q4_0_q8_0_ref(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut isum = 0i32;
        for j in 0..QK / 2 {
            let lo = (bx.qs[j] & 0x0f) as i32 - 8;
            let hi = (bx.qs[j] >> 4) as i32 - 8;
            isum += lo * by.qs[j] as i32 + hi * by.qs[j + QK / 2] as i32;
        }
        sum += isum as f32 * (bx.d.to_f32() * by.d.to_f32());
    }
    sum
}

pub fn vec_dot_q4_1_q8_1_ref(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut isum = 0i32;
        for j in 0..QK / 2 {
            isum += (bx.qs[j] & 0x0f) as i32 * by.qs[j] as i32
                + (bx.qs[j] >> 4) as i32 * by.qs[j + QK / 2] as i32;
        }
        sum += (bx.d.to_f32() * by.d) * isum as f32 + bx.m.to_f32() * by.s;
    }
    sum
}

/// The fifth bit of value j of a Q5_0/Q5_1 block.
#[inline]
/// `vec_dot_q4_1_q8_1_ref` in the summation order of llama.cpp's AVX2 kernel
/// (`ggml_vec_dot_q4_1_q8_1`, arch/x86/quants.c), which the reference CPU
/// build runs: 8 f32 lanes, lane `l` accumulating `fma(dx·dy, Σ_{k<4} qx·qy`
/// over elements `4l..4l+4`), reduced by `hsum_float_8`'s tree, plus the
/// `m·s` terms summed separately (contracted to fma by GCC). Same value as
/// the reference up to f32 rounding, but rounded exactly as llama.cpp rounds.
pub fn vec_dot_q4_1_q8_1_avx2_order(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        summs = bx.m.to_f32().mul_add(by.s, summs);
        let d = bx.d.to_f32() * by.d;
        for (l, a) in acc.iter_mut().enumerate() {
            let mut isum = 0i32;
            for e in 4 * l..4 * l + 4 {
                let q = if e < QK / 2 {
                    bx.qs[e] & 0x0f
                } else {
                    bx.qs[e - QK / 2] >> 4
                };
                isum += q as i32 * by.qs[e] as i32;
            }
            *a = d.mul_add(isum as f32, *a);
        }
    }
    hsum_float_8(&acc) + summs
}

/// The lane order shared by llama.cpp's x86 `*_0 · Q8_0` kernels (AVX2
/// `ggml_vec_dot_q{4,5,8}_0_q8_0` and llamafile's `tinyBLAS_Q0_AVX`, used for
/// prompt batches): lane `l` of 8 accumulates `fma(dx·dy, Σ_{k<4} qx·qy)` over
/// elements `4l..4l+4` of every block, reduced by `hsum_float_8`. `q(b, e)`
/// gives the signed weight quant of element `e` of block `b`.
fn dot_q8_0_lanes(
    n_blocks: usize,
    d: impl Fn(usize) -> f32,
    q: impl Fn(usize, usize) -> i32,
    y: &[BlockQ8_0],
) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b, by) in y.iter().enumerate().take(n_blocks) {
        let d = d(b) * by.d.to_f32();
        for (l, a) in acc.iter_mut().enumerate() {
            let isum: i32 = (4 * l..4 * l + 4).map(|e| q(b, e) * by.qs[e] as i32).sum();
            *a = d.mul_add(isum as f32, *a);
        }
    }
    hsum_float_8(&acc)
}

/// `vec_dot_q4_0_q8_0_ref` in llama.cpp's x86 order ([`dot_q8_0_lanes`]).
pub fn vec_dot_q4_0_q8_0_x86(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let q = |b: usize, e: usize| {
        let byte = x[b].qs[e % (QK / 2)];
        (if e < QK / 2 { byte & 0x0f } else { byte >> 4 }) as i32 - 8
    };
    dot_q8_0_lanes(x.len(), |b| x[b].d.to_f32(), q, y)
}

/// `vec_dot_q5_0_q8_0_ref` in llama.cpp's x86 order ([`dot_q8_0_lanes`]).
pub fn vec_dot_q5_0_q8_0_x86(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let q = |b: usize, e: usize| {
        let byte = x[b].qs[e % (QK / 2)];
        let lo = if e < QK / 2 { byte & 0x0f } else { byte >> 4 } as i32;
        (lo | (q5_high_bit(&x[b].qh, e) << 4)) - 16
    };
    dot_q8_0_lanes(x.len(), |b| x[b].d.to_f32(), q, y)
}

/// `vec_dot_q8_0_q8_0_ref` in llama.cpp's x86 order ([`dot_q8_0_lanes`]).
pub fn vec_dot_q8_0_q8_0_x86(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    dot_q8_0_lanes(x.len(), |b| x[b].d.to_f32(), |b, e| x[b].qs[e] as i32, y)
}

/// `vec_dot_q4_k_q8_k_ref` in the order of llama.cpp's AVX2
/// `ggml_vec_dot_q4_K_q8_K`: per block, 8 integer lanes (lane `l` = elements
/// `4l..4l+4` of each 32-value sub-block, times its scale) enter
/// `fma(d, lane, acc)`; the mins go through 4 lanes (sub-block pairs) with
/// `fma(-dmin·dy, ·, acc_m)`, reduced (0+2, 1+3, then sum) and added last.
pub fn vec_dot_q4_k_q8_k_x86(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 4];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32();
        let dmin = -by.d * bx.dmin.to_f32();
        let sm: [(u8, u8); 8] = std::array::from_fn(|j| scale_min_k4(j, &bx.scales));
        for (k, a) in acc_m.iter_mut().enumerate() {
            let prod: i32 = (2 * k..2 * k + 2)
                .map(|j| sm[j].1 as i32 * (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32))
                .sum();
            *a = dmin.mul_add(prod as f32, *a);
        }
        let mut sumi = [0i32; 8];
        for (j, &(sc, _)) in sm.iter().enumerate() {
            let (chunk, upper) = (j / 2, j % 2 == 1);
            for (l, s) in sumi.iter_mut().enumerate() {
                let mut g = 0i32;
                for e in 4 * l..4 * l + 4 {
                    let byte = bx.qs[32 * chunk + e];
                    let q = if upper { byte >> 4 } else { byte & 0x0f } as i32;
                    g += q * by.qs[32 * j + e] as i32;
                }
                *s += sc as i32 * g;
            }
        }
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    let m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
    hsum_float_8(&acc) + m
}

/// `vec_dot_q6_k_q8_k_ref` in the order of llama.cpp's AVX2
/// `ggml_vec_dot_q6_K_q8_K`: quants stay unsigned (0..64) in 8 integer lanes
/// (lane `l` = elements `4l..4l+4` of each 32-value chunk, times its scale);
/// lane `l` subtracts `32·(bsums·scales)` of groups `2l, 2l+1`; then
/// `fma(d, lane, acc)` and `hsum_float_8`.
pub fn vec_dot_q6_k_q8_k_x86(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32();
        let mut sumi = [0i32; 8];
        for n in 0..2 {
            let (ql, qh) = (&bx.ql[64 * n..64 * n + 64], &bx.qh[32 * n..32 * n + 32]);
            for k in 0..4 {
                for (l, s) in sumi.iter_mut().enumerate() {
                    for b in 4 * l..4 * l + 4 {
                        let q = match k {
                            0 => (ql[b] & 0x0f) | ((qh[b] & 3) << 4),
                            1 => (ql[b + 32] & 0x0f) | (((qh[b] >> 2) & 3) << 4),
                            2 => (ql[b] >> 4) | (((qh[b] >> 4) & 3) << 4),
                            _ => (ql[b + 32] >> 4) | (((qh[b] >> 6) & 3) << 4),
                        };
                        let idx = 128 * n + 32 * k + b;
                        *s += bx.scales[idx / 16] as i32 * q as i32 * by.qs[idx] as i32;
                    }
                }
            }
        }
        for (l, s) in sumi.iter_mut().enumerate() {
            let sub = by.bsums[2 * l] as i32 * bx.scales[2 * l] as i32
                + by.bsums[2 * l + 1] as i32 * bx.scales[2 * l + 1] as i32;
            *s -= sub << 5;
        }
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum_float_8(&acc)
}

/// `hsum_float_8` (arch/x86/quants.c): (x[i] + x[i+4]), then (+ [i+2]), then (+ [1]).
pub(crate) fn hsum_float_8(x: &[f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| x[i + 4] + x[i]);
    let (r0, r1) = (r[0] + r[2], r[1] + r[3]);
    r0 + r1
}

fn q5_high_bit(qh: &[u8; 4], j: usize) -> i32 {
    ((u32::from_le_bytes(*qh) >> j) & 1) as i32
}

pub fn vec_dot_q5_0_q8_0_ref(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut isum = 0i32;
        for j in 0..QK / 2 {
            let lo = ((bx.qs[j] & 0x0f) as i32 | (q5_high_bit(&bx.qh, j) << 4)) - 16;
            let hi = ((bx.qs[j] >> 4) as i32 | (q5_high_bit(&bx.qh, j + QK / 2) << 4)) - 16;
            isum += lo * by.qs[j] as i32 + hi * by.qs[j + QK / 2] as i32;
        }
        sum += isum as f32 * (bx.d.to_f32() * by.d.to_f32());
    }
    sum
}

pub fn vec_dot_q5_1_q8_1_ref(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut isum = 0i32;
        for j in 0..QK / 2 {
            let lo = (bx.qs[j] & 0x0f) as i32 | (q5_high_bit(&bx.qh, j) << 4);
            let hi = (bx.qs[j] >> 4) as i32 | (q5_high_bit(&bx.qh, j + QK / 2) << 4);
            isum += lo * by.qs[j] as i32 + hi * by.qs[j + QK / 2] as i32;
        }
        sum += (bx.d.to_f32() * by.d) * isum as f32 + bx.m.to_f32() * by.s;
    }
    sum
}

pub fn vec_dot_q8_0_q8_0_ref(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let isum: i32 = bx
            .qs
            .iter()
            .zip(&by.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
        sum += isum as f32 * (bx.d.to_f32() * by.d.to_f32());
    }
    sum
}

pub fn vec_dot_q2_k_q8_k_ref(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        // 16 groups of 16; group g = 8 * half + 2 * shift_index + sub.
        let (mut isum, mut msum) = (0i32, 0i32);
        for g in 0..16 {
            let (half, rest) = (g / 8, g % 8);
            let (shift, sub) = (rest / 2, rest % 2);
            let sc = (bx.scales[g] & 0x0f) as i32;
            let m = (bx.scales[g] >> 4) as i32;
            let mut gsum = 0i32;
            for l in 0..16 {
                let q = ((bx.qs[32 * half + 16 * sub + l] >> (2 * shift)) & 3) as i32;
                gsum += q * by.qs[16 * g + l] as i32;
            }
            isum += sc * gsum;
            msum += m * by.bsums[g] as i32;
        }
        sum += by.d * (bx.d.to_f32() * isum as f32 - bx.dmin.to_f32() * msum as f32);
    }
    sum
}

#[allow(clippy::needless_range_loop)]
pub fn vec_dot_q3_k_q8_k_ref(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let scales = q3k_scales(&bx.scales);
        let mut isum = 0i32;
        for g in 0..16 {
            let (half, rest) = (g / 8, g % 8);
            let (shift, sub) = (rest / 2, rest % 2);
            let hbit = 4 * half + shift;
            let mut gsum = 0i32;
            for l in 0..16 {
                let idx = 16 * sub + l;
                let low = ((bx.qs[32 * half + idx] >> (2 * shift)) & 3) as i32;
                let high = if bx.hmask[idx] & (1 << hbit) != 0 {
                    0
                } else {
                    4
                };
                gsum += (low - high) * by.qs[16 * g + l] as i32;
            }
            isum += scales[g] as i32 * gsum;
        }
        sum += bx.d.to_f32() * by.d * isum as f32;
    }
    sum
}

pub fn vec_dot_q4_k_q8_k_ref(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &bx.scales);
            let (chunk, upper) = (j / 2, j % 2 == 1);
            let mut gsum = 0i32;
            for l in 0..32 {
                let byte = bx.qs[32 * chunk + l];
                let q = if upper { byte >> 4 } else { byte & 0x0f } as i32;
                gsum += q * by.qs[32 * j + l] as i32;
            }
            isum += sc as i32 * gsum;
            msum += m as i32 * (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32);
        }
        sum += bx.d.to_f32() * by.d * isum as f32 - bx.dmin.to_f32() * by.d * msum as f32;
    }
    sum
}

pub fn vec_dot_q5_k_q8_k_ref(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &bx.scales);
            let (chunk, upper) = (j / 2, j % 2 == 1);
            let mut gsum = 0i32;
            for l in 0..32 {
                let byte = bx.qs[32 * chunk + l];
                let low = if upper { byte >> 4 } else { byte & 0x0f } as i32;
                let high = ((bx.qh[l] >> j) & 1) as i32;
                gsum += (low | (high << 4)) * by.qs[32 * j + l] as i32;
            }
            isum += sc as i32 * gsum;
            msum += m as i32 * (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32);
        }
        sum += bx.d.to_f32() * by.d * isum as f32 - bx.dmin.to_f32() * by.d * msum as f32;
    }
    sum
}

pub fn vec_dot_q6_k_q8_k_ref(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut isum = 0i32;
        // Two halves of 128 values; in each, value l + 32 * k (k = 0..4) takes
        // its low 4 bits from ql and 2 high bits from qh.
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
                    let sc = bx.scales[idx / 16] as i32;
                    isum += sc * (qk as i32 - 32) * by.qs[idx] as i32;
                }
            }
        }
        sum += bx.d.to_f32() * by.d * isum as f32;
    }
    sum
}

pub fn vec_dot_f32_ref(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// The dot product of the exact-f32 numerics (`Activations::F32`): 16
/// running sums (sum `l` takes the fused products of elements `l`, `l + 16`,
/// …), added pairwise (+8, +4, +2, +1), then the tail past a multiple of 16
/// in order. A fixed order, so a row's result never depends on the other
/// rows of a pass; the 16 independent chains compile to vector FMAs.
pub fn vec_dot_f32_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len()) & !15;
    let mut acc = [0.0f32; 16];
    for (a, b) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = a[l].mul_add(b[l], acc[l]);
        }
    }
    let mut width = 8;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for (a, b) in x[n..].iter().zip(&y[n..]) {
        sum = a.mul_add(*b, sum);
    }
    sum
}

#[cfg(test)]
mod x86_order_tests {
    use super::*;
    use crate::quant::{quantize, quantize_row_q8_k_ref};
    use hearth_gguf::GgmlType;
    use rand::{Rng, SeedableRng};

    /// The vector Q8_0 activation quantizer equals the reference value by
    /// value: random rows at several magnitudes, ties, zeros, blocks with
    /// NaN, infinities and f32::MAX.
    #[test]
    fn q8_0_quantizer_equals_the_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        for round in 0..3000 {
            let scale = [1e-30f32, 1e-3, 1.0, 1e4, 1e30][round % 5];
            let mut a: Vec<f32> = (0..4 * QK)
                .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
                .collect();
            match round % 7 {
                // Halfway cases after scaling by 127 / amax (amax = 127).
                0 => a
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = (i as f32 - 64.0) + 0.5),
                1 => a[3] = f32::NAN,
                2 => a[40] = f32::INFINITY,
                3 => a[70] = f32::MAX,
                4 => a[96..].fill(0.0),
                5 => a[5] = -0.0,
                _ => {}
            }
            let (mut got, mut want) =
                (vec![BlockQ8_0::default(); 4], vec![BlockQ8_0::default(); 4]);
            quantize_row_q8_0_x86(&a, &mut got);
            quantize_row_q8_0_x86_ref(&a, &mut want);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!((g.d.0, g.qs), (w.d.0, w.qs), "round {round}");
            }
        }
    }

    /// The x86-order kernels compute the same sums as the references (up to
    /// f32 rounding), on random rows of several blocks.
    #[test]
    fn x86_order_matches_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let n = 3 * QK_K;
        let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let close =
            |p: f32, q: f32| assert!((p - q).abs() <= 1e-4 * q.abs().max(1.0), "{p} vs {q}");
        let mut y0 = vec![BlockQ8_0::default(); n / QK];
        quantize_row_q8_0_x86(&a, &mut y0);
        let mut yk = vec![
            BlockQ8K {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; QK_K / 16]
            };
            n / QK_K
        ];
        quantize_row_q8_k_ref(&a, &mut yk);
        let wq = |ty: GgmlType| {
            let mut b = vec![0u8; n / ty.block_size() * ty.type_size()];
            if quantize(ty, &w, &mut b).is_err() {
                // No quantizer for this type: random quants, scale 0.01 (leading f16).
                let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(ty as u64);
                for blk in b.chunks_exact_mut(ty.type_size()) {
                    blk.iter_mut().for_each(|v| *v = r.gen());
                    blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
            b
        };
        let (b40, b50, b80, b4k, b6k) = (
            wq(GgmlType::Q4_0),
            wq(GgmlType::Q5_0),
            wq(GgmlType::Q8_0),
            wq(GgmlType::Q4_K),
            wq(GgmlType::Q6_K),
        );
        close(
            vec_dot_q4_0_q8_0_x86(as_blocks(&b40).unwrap(), &y0),
            vec_dot_q4_0_q8_0_ref(as_blocks(&b40).unwrap(), &y0),
        );
        close(
            vec_dot_q5_0_q8_0_x86(as_blocks(&b50).unwrap(), &y0),
            vec_dot_q5_0_q8_0_ref(as_blocks(&b50).unwrap(), &y0),
        );
        close(
            vec_dot_q8_0_q8_0_x86(as_blocks(&b80).unwrap(), &y0),
            vec_dot_q8_0_q8_0_ref(as_blocks(&b80).unwrap(), &y0),
        );
        close(
            vec_dot_q4_k_q8_k_x86(as_blocks(&b4k).unwrap(), &yk),
            vec_dot_q4_k_q8_k_ref(as_blocks(&b4k).unwrap(), &yk),
        );
        close(
            vec_dot_q6_k_q8_k_x86(as_blocks(&b6k).unwrap(), &yk),
            vec_dot_q6_k_q8_k_ref(as_blocks(&b6k).unwrap(), &yk),
        );
    }
}
