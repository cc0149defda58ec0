//! Row-wise f32 operations of the encoder, each split over the pool's
//! threads by rows.

use hearth_kernels::cpu::ggml_order::activations::expf_ggml_v;
use hearth_kernels::pool::{share, SendPtr, ThreadPool};

/// Runs `f(row_range, rows)` on disjoint row ranges of `x` (`[n, width]`).
pub fn par_rows(
    pool: &ThreadPool,
    x: &mut [f32],
    width: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let n = x.len() / width;
    let p = SendPtr(x.as_mut_ptr());
    pool.run(|t, nt| {
        let r = share(n, t, nt);
        // SAFETY: threads get disjoint row ranges of `x`.
        let rows = unsafe {
            std::slice::from_raw_parts_mut(p.get().add(r.start * width), r.len() * width)
        };
        f(r.start, rows);
    });
}

/// LayerNorm over rows of `width` (biased variance, statistics in f64):
/// `(x − mean)/sqrt(var + eps)·w + b`.
pub fn layer_norm(pool: &ThreadPool, x: &mut [f32], width: usize, w: &[f32], b: &[f32], eps: f32) {
    par_rows(pool, x, width, |_, rows| {
        for row in rows.chunks_exact_mut(width) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / width as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / width as f64;
            let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
            let mean = mean as f32;
            for ((v, &g), &c) in row.iter_mut().zip(w).zip(b) {
                *v = (*v - mean) * inv * g + c;
            }
        }
    });
}

/// LayerNorm of `src` into `dst` (rows of `width`).
pub fn layer_norm_into(
    pool: &ThreadPool,
    src: &[f32],
    dst: &mut [f32],
    width: usize,
    w: &[f32],
    b: &[f32],
    eps: f32,
) {
    dst.copy_from_slice(src);
    layer_norm(pool, dst, width, w, b, eps);
}

/// Adds `bias` (`[width]`) to every row.
pub fn add_bias(pool: &ThreadPool, x: &mut [f32], bias: &[f32]) {
    let width = bias.len();
    par_rows(pool, x, width, |_, rows| {
        for row in rows.chunks_exact_mut(width) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    });
}

/// erf(x) to within 4e-7 (a few f32 ulps): for |x| ≥ 0.5 Abramowitz & Stegun 7.1.26
/// (`1 − poly(t)·e^(−x²)`, |error| ≤ 1.5e-7, with ggml's vector exp), below
/// it the Maclaurin series to x¹¹ (where 7.1.26 would lose digits to
/// cancellation). Both are evaluated and one selected, so loops over it
/// vectorize.
#[inline(always)]
pub fn erf_fast(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152_1,
        1.061_405_4,
    ];
    // 2/√π · (x − x³/3 + x⁵/10 − x⁷/42 + x⁹/216 − x¹¹/1320)
    const S: [f32; 6] = [
        std::f32::consts::FRAC_2_SQRT_PI,
        -0.376_126_4,
        0.112_837_92,
        -0.026_866_17,
        0.005_223_977_6,
        -8.548_327e-4,
    ];
    let ax = x.abs();
    let t = 1.0 / P.mul_add(ax, 1.0);
    let poly = A[4]
        .mul_add(t, A[3])
        .mul_add(t, A[2])
        .mul_add(t, A[1])
        .mul_add(t, A[0])
        * t;
    let far = 1.0 - poly * expf_ggml_v(-ax * ax);
    let x2 = ax * ax;
    let near = S[5]
        .mul_add(x2, S[4])
        .mul_add(x2, S[3])
        .mul_add(x2, S[2])
        .mul_add(x2, S[1])
        .mul_add(x2, S[0])
        * ax;
    let y = if ax < 0.5 { near } else { far };
    y.copysign(x)
}

/// Exact (erf) GELU: `0.5·x·(1 + erf(x/√2))`.
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_fast(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `x ← gelu(x + bias)` over rows of `bias.len()` (no bias when `None`).
pub fn bias_gelu(pool: &ThreadPool, x: &mut [f32], width: usize, bias: Option<&[f32]>) {
    par_rows(pool, x, width, |_, rows| {
        for row in rows.chunks_exact_mut(width) {
            match bias {
                Some(b) => row
                    .iter_mut()
                    .zip(b)
                    .for_each(|(v, &c)| *v = gelu_erf(*v + c)),
                None => row.iter_mut().for_each(|v| *v = gelu_erf(*v)),
            }
        }
    });
}

/// 2-D RoPE on `x` (`[n, n_head·head_dim]`): every head turns its pairs
/// (2j, 2j+1) by the row's angles (`cos`/`sin` `[n, head_dim/2]`).
pub fn rope(
    pool: &ThreadPool,
    x: &mut [f32],
    n_head: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
) {
    let width = n_head * head_dim;
    let pairs = head_dim / 2;
    par_rows(pool, x, width, |start, rows| {
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            let (c, s) = (
                &cos[(start + i) * pairs..][..pairs],
                &sin[(start + i) * pairs..][..pairs],
            );
            for head in row.chunks_exact_mut(head_dim) {
                for (j, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * c[j] - x1 * s[j];
                    pair[1] = x0 * s[j] + x1 * c[j];
                }
            }
        }
    });
}

/// Softmax of each row of `s` (`[rows, n]`) after scaling by `scale`,
/// left unnormalized; returns nothing but writes `1/Σ` of row r to `inv[r]`.
pub fn softmax_rows_unnormalized(s: &mut [f32], n: usize, scale: f32, inv: &mut [f32]) {
    const LANES: usize = 16;
    for (row, inv) in s.chunks_exact_mut(n).zip(inv) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) * scale;
        // The exponentials in a pass of their own (it vectorizes), then the
        // sum over 16 interleaved partial sums (a single running sum would
        // keep both passes scalar).
        for v in row.iter_mut() {
            *v = expf_ggml_v(v.mul_add(scale, -max));
        }
        let mut acc = [0f32; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        }
        let tail: f32 = chunks.remainder().iter().sum();
        *inv = 1.0 / (acc.iter().sum::<f32>() + tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_libm() {
        let mut worst = 0f32;
        for i in -40000..=40000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((erf_fast(x) - libm::erff(x)).abs());
        }
        assert!(worst <= 4e-7, "worst |erf_fast − erff| = {worst}");
        assert_eq!(erf_fast(0.0), 0.0);
        assert_eq!(erf_fast(30.0), 1.0);
        assert_eq!(erf_fast(-30.0), -1.0);
        assert_eq!(gelu_erf(-20.0), 0.0);
    }

    #[test]
    fn layer_norm_matches_definition() {
        let pool = ThreadPool::new(2);
        let width = 7;
        let mut x: Vec<f32> = (0..3 * width)
            .map(|i| (i as f32 * 0.7).sin() * 3.0)
            .collect();
        let w: Vec<f32> = (0..width).map(|i| 1.0 + i as f32 * 0.1).collect();
        let b: Vec<f32> = (0..width).map(|i| i as f32 * -0.05).collect();
        let want: Vec<f32> = x
            .chunks(width)
            .flat_map(|r| {
                let m = r.iter().sum::<f32>() / width as f32;
                let v = r.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / width as f32;
                r.iter()
                    .enumerate()
                    .map(move |(i, x)| {
                        (x - m) / (v + 1e-5).sqrt() * (1.0 + i as f32 * 0.1) - i as f32 * 0.05
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        layer_norm(&pool, &mut x, width, &w, &b, 1e-5);
        for (g, w) in x.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }
}
