//! Scalar reference quantization (ggml's `quantize_row_*_ref`, without importance weights).
//!
//! The arithmetic follows ggml-quants.c operation for operation in f32, so that for finite
//! inputs our bytes equal ggml's (tests/fixtures/quant holds ggml's output to check it):
//! - Q8_0: `d = amax / 127`, `q = round_half_away(x / d)`.
//! - Q8_K: `d = max / -127` with `max` the value of largest magnitude, nearest-even rounding.
//! - Q4_K/Q5_K: per 32-value group a weighted least-squares fit of scale and min over a
//!   small grid of candidate inverse scales (`make_qkx2_quants`), then 6-bit quantized scales
//!   and mins relative to the block maxima.
//! - Q6_K: per 16-value group a symmetric fit weighted by `x^2` (`make_qx_quants`), then
//!   8-bit scales relative to the block's largest scale.
//!
//! Each function panics if `dst` does not hold exactly `src.len() / block_size` blocks;
//! [`super::quantize()`] checks lengths and returns errors instead.

use super::blocks::*;

/// Groups whose largest magnitude is below this are stored as zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, for |x| < 2^22: adding 1.5 * 2^23 leaves the rounded
/// integer in the low mantissa bits. (Outside that range the result is meaningless, as in
/// ggml; callers only pass bounded values.)
fn nearest_int(x: f32) -> i32 {
    let biased = x + 12_582_912.0;
    (biased.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn check_len(src: &[f32], block_size: usize, n_blocks: usize) {
    assert_eq!(
        src.len(),
        n_blocks * block_size,
        "src must hold exactly {n_blocks} blocks"
    );
}

/// F16 by round-to-nearest-even.
pub fn quantize_row_f16_ref(src: &[f32], dst: &mut [u8]) {
    assert_eq!(2 * src.len(), dst.len());
    for (b, &x) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&F16Le::from_f32(x).0);
    }
}

/// BF16 as ggml rounds it: nearest-even on the low 16 bits; NaNs are kept NaN (quiet bit set)
/// rather than rounded into infinity.
pub fn quantize_row_bf16_ref(src: &[f32], dst: &mut [u8]) {
    assert_eq!(2 * src.len(), dst.len());
    for (b, &x) in dst.chunks_exact_mut(2).zip(src) {
        let u = x.to_bits();
        let h = if u & 0x7fff_ffff > 0x7f80_0000 {
            (u >> 16) as u16 | 64
        } else {
            (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
        };
        b.copy_from_slice(&h.to_le_bytes());
    }
}

/// ggml's `quantize_row_q4_0_ref`: per block the value of largest magnitude
/// (the first one on ties) `max` sets `d = max / -8`; each value becomes
/// `min(15, trunc(x / d + 8.5))`, low nibbles the first 16 values.
pub fn quantize_row_q4_0_ref(src: &[f32], dst: &mut [BlockQ4_0]) {
    check_len(src, QK, dst.len());
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = F16Le::from_f32(d);
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..QK / 2 {
            y.qs[j] = q(x[j]) | (q(x[QK / 2 + j]) << 4);
        }
    }
}

pub fn quantize_row_q8_0_ref(src: &[f32], dst: &mut [BlockQ8_0]) {
    check_len(src, QK, dst.len());
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let mut amax = 0.0f32;
        for &v in x {
            // `amax > |v| ? amax : |v|`, as ggml's MAX (a NaN input resets the running max).
            amax = if amax > v.abs() { amax } else { v.abs() };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = F16Le::from_f32(d);
        for (q, &v) in y.qs.iter_mut().zip(x) {
            // f32::round rounds halves away from zero, like C's roundf.
            *q = (v * id).round() as i8;
        }
    }
}

/// Quantizes one super-block of activations to Q8_K.
pub fn quantize_row_q8_k_ref(src: &[f32], dst: &mut [BlockQ8K]) {
    check_len(src, QK_K, dst.len());
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *y = BlockQ8K::default();
            continue;
        }
        // Scale so that the largest-magnitude value maps to -127 (127 below for ties).
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (sum, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *sum = q.iter().map(|&q| q as i32).sum::<i32>() as i16;
        }
        y.d = 1.0 / iscale;
    }
}

/// Fits `x ≈ scale * L - min` with `L` in `0..=nmax` (ggml's `make_qkx2_quants`, squared
/// error). Starts from the min/max fit, then tries inverse scales
/// `(nmax + rmin + rdelta * is) / (max - min)` for `is` in `0..=nstep`, solving the weighted
/// least-squares scale and min for each candidate rounding and keeping the best.
/// Returns `(scale, min)` with `min >= 0`; `levels` receives `L`.
fn fit_scale_min(
    nmax: i32,
    x: &[f32],
    weights: &[f32; 32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }

    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        levels[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }

    let mut trial = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            trial[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        // Normal equations of min over (scale, offset) of sum w (scale * l + offset - x)^2.
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * trial[i] as f32 + this_min - x[i];
                error += weights[i] * (diff * diff);
            }
            if error < best_error {
                levels[..n].copy_from_slice(&trial[..n]);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Fits `x ≈ scale * (L - nmax)` with `L - nmax` in `-nmax..nmax`, weights `x^2`
/// (ggml's `make_qx_quants` with rmse_type 1): start from the scale that maps the
/// largest-magnitude value to `-nmax`, then try 18 nearby inverse scales and keep the one
/// maximizing `sumlx^2 / suml2` (the least-squares gain). Returns the scale; `levels`
/// receives `L`.
fn fit_symmetric_scale(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Weighted sums for one candidate inverse scale: (sum w x l, sum w l^2), w = x^2.
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };

    let mut iscale = -(nmax as f32) / max;
    for (q, &v) in levels.iter_mut().zip(x) {
        *q = (level(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (q, &v) in levels.iter_mut().zip(x) {
                *q = (level(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Scales and mins of the 8 groups of a Q4_K/Q5_K super-block, quantized to 6 bits
/// against the largest of each, and packed as [`scale_min_k4`] reads them. Returns the
/// packed bytes and the f16 super-block scale and min.
fn pack_k4_scales(scales: &[f32; 8], mins: &[f32; 8]) -> ([u8; K_SCALE_SIZE], F16Le, F16Le) {
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for (&s, &m) in scales.iter().zip(mins) {
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        // ggml stores the rounded value in a u8 before clamping (so negatives wrap to 63).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    (
        packed,
        F16Le::from_f32(max_scale / 63.0),
        F16Le::from_f32(max_min / 63.0),
    )
}

/// First pass shared by Q4_K and Q5_K: fit every 32-value group, pack the scales, then
/// requantize each value against the stored (rounded) group scale and min.
/// Returns the packed scales, `d`, `dmin` and the levels `0..=nmax` of all 256 values.
fn quantize_k4_super_block(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> ([u8; K_SCALE_SIZE], F16Le, F16Le, [u8; QK_K]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for (j, (xg, lg)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        // Weight each value by the group RMS plus its own magnitude.
        let mut sum_x2 = 0.0f32;
        for &v in xg {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xg[l].abs());
        (scales[j], mins[j]) = fit_scale_min(nmax, xg, &weights, lg, rmin, 0.1, nstep);
    }
    let (packed, d, dmin) = pack_k4_scales(&scales, &mins);
    for (j, (xg, lg)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let (sc, m) = scale_min_k4(j, &packed);
        let dl = d.to_f32() * sc as f32;
        if dl == 0.0 {
            continue; // keep the levels from the fit; they dequantize to -dmin * m anyway
        }
        let ml = dmin.to_f32() * m as f32;
        for (l, &v) in lg.iter_mut().zip(xg) {
            *l = nearest_int((v + ml) / dl).clamp(0, nmax) as u8;
        }
    }
    (packed, d, dmin, levels)
}

pub fn quantize_row_q4_k_ref(src: &[f32], dst: &mut [BlockQ4K]) {
    check_len(src, QK_K, dst.len());
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        let (scales, d, dmin, levels) = quantize_k4_super_block(x, 15, -1.0, 20);
        y.d = d;
        y.dmin = dmin;
        y.scales = scales;
        // Chunk c of 64 values: first 32 in the low nibbles of qs[32c..], next 32 in the high.
        for (c, l) in levels.chunks_exact(64).enumerate() {
            for i in 0..32 {
                y.qs[32 * c + i] = l[i] | (l[i + 32] << 4);
            }
        }
    }
}

pub fn quantize_row_q5_k_ref(src: &[f32], dst: &mut [BlockQ5K]) {
    check_len(src, QK_K, dst.len());
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        let (scales, d, dmin, levels) = quantize_k4_super_block(x, 31, -0.5, 15);
        y.d = d;
        y.dmin = dmin;
        y.scales = scales;
        y.qh = [0; QK_K / 8];
        // As Q4_K for the low 4 bits; bit 4 of group g's value i goes to bit g of qh[i].
        for (c, l) in levels.chunks_exact(64).enumerate() {
            for i in 0..32 {
                let (lo, hi) = (l[i], l[i + 32]);
                y.qs[32 * c + i] = (lo & 0xF) | ((hi & 0xF) << 4);
                y.qh[i] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}

pub fn quantize_row_q6_k_ref(src: &[f32], dst: &mut [BlockQ6K]) {
    check_len(src, QK_K, dst.len());
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        let mut levels = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for (g, (xg, lg)) in x
            .chunks_exact(16)
            .zip(levels.chunks_exact_mut(16))
            .enumerate()
        {
            scales[g] = fit_symmetric_scale(32, xg, lg);
            if scales[g].abs() > max_abs_scale {
                max_abs_scale = scales[g].abs();
                max_scale = scales[g];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *y = BlockQ6K::default();
            continue;
        }

        // 8-bit group scales, the largest mapped to -128.
        let iscale = -128.0 / max_scale;
        y.d = F16Le::from_f32(1.0 / iscale);
        for (s, &scale) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale).min(127) as i8;
        }
        for (g, (xg, lg)) in x
            .chunks_exact(16)
            .zip(levels.chunks_exact_mut(16))
            .enumerate()
        {
            let dl = y.d.to_f32() * y.scales[g] as f32;
            if dl == 0.0 {
                continue;
            }
            for (l, &v) in lg.iter_mut().zip(xg) {
                *l = (nearest_int(v / dl).clamp(-32, 31) + 32) as u8;
            }
        }

        // Half h of 128 values: quarters 0/1 in the low nibbles of ql[64h..][0..32]/[32..64],
        // quarters 2/3 in the high nibbles; the top 2 bits of quarter k at bit 2k of qh[32h + i].
        for (h, l) in levels.chunks_exact(128).enumerate() {
            for i in 0..32 {
                let q = [l[i], l[i + 32], l[i + 64], l[i + 96]];
                y.ql[64 * h + i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                y.ql[64 * h + i + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                y.qh[32 * h + i] =
                    (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.6, -3),
            (126.4, 126),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        // amax 127 gives d = 1, so x * id is x itself.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut y = [BlockQ8_0::default()];
        quantize_row_q8_0_ref(&x, &mut y);
        assert_eq!(y[0].d.to_f32(), 1.0);
        assert_eq!(&y[0].qs[..3], &[127, 3, -3]);
    }

    #[test]
    fn q8_k_bsums_are_group_sums() {
        let x: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let mut y = [BlockQ8K::default()];
        quantize_row_q8_k_ref(&x, &mut y);
        // -50 is the first value of largest magnitude, so it maps to -127.
        assert_eq!(y[0].qs[0], -127);
        for (g, &sum) in y[0].bsums.iter().enumerate() {
            let want: i32 = y[0].qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(sum as i32, want);
        }
    }
}
