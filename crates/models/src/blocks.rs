//! Building blocks shared by every architecture's forward pass. Activations are
//! row-major `[n_tokens, width]` f32 slices.

use half::bf16;

use crate::config::RopeLayout;

/// RMSNorm of every row of `x` (row length = `dim`), in place:
/// x * rsqrt(mean(x²) + eps) * w (no weight: scaleless).
///
/// The squares (f32) are summed in f64 and the mean taken in f64 before
/// rounding to f32, as ggml's `rms_norm` does: an f32 running sum moves the
/// output by an ulp often enough to flip 8-bit activation roundings downstream.
pub fn rmsnorm(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    for row in x.chunks_exact_mut(dim) {
        let sum: f64 = row.iter().map(|v| (v * v) as f64).sum();
        let mean_sq = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        match weight {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, g)| *v = *v * scale * g),
            None => row.iter_mut().for_each(|v| *v *= scale),
        }
    }
}

/// Rounds every element to bfloat16 (round to nearest even), in place.
pub fn round_bf16(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
}

/// How RoPE frequencies are computed for one layer.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub theta: f32,
    pub layout: RopeLayout,
    /// Number of leading dimensions of each head that rotate (= head_dim here).
    pub n_rot: usize,
    /// ggml computes θ_i by repeated multiplication θ_{i+1} = θ_i · base^(-2/n);
    /// the Muse Glimmer spec computes inv_freq_i = 1/base^(2i/n) directly.
    /// The ggml style also rotates with ggml's fused multiply-adds.
    pub iterative: bool,
}

impl Rope {
    /// Rotates `x` ([T, n_heads, head_dim]) for positions `p0..p0+T`.
    pub fn apply_tokens(&self, x: &mut [f32], n_heads: usize, head_dim: usize, p0: usize) {
        for (i, row) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
            self.apply(row, head_dim, p0 + i);
        }
    }

    /// Rotates each of the `n_heads` heads in `x` ([n_heads, head_dim]) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.n_rot / 2;
        let mut cs = [(0.0f32, 0.0f32); 256];
        let scale = self.theta.powf(-2.0 / self.n_rot as f32);
        let mut theta = pos as f32;
        for (i, c) in cs.iter_mut().take(half).enumerate() {
            let t = if self.iterative {
                let t = theta;
                theta *= scale;
                t
            } else {
                pos as f32 * (1.0 / self.theta.powf(2.0 * i as f32 / self.n_rot as f32))
            };
            *c = (t.cos(), t.sin());
        }
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in cs.iter().take(half).enumerate() {
                let (a, b) = match self.layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                if self.iterative {
                    // ggml's rotate_pairs as GCC contracts it (-O3, fp-contract=fast).
                    head[a] = x0.mul_add(cos, -(x1 * sin));
                    head[b] = x0.mul_add(sin, x1 * cos);
                } else {
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x0 * sin + x1 * cos;
                }
            }
        }
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (as used by Gemma).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `a[i] = act(a[i]) * b[i]`: the gated-linear-unit product of an MLP.
pub fn glu(a: &mut [f32], b: &[f32], act: fn(f32) -> f32) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x = act(*x) * y);
}

/// `x += y` elementwise.
pub fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §8.4: inv_freq_1 = 0.8146172, inv_freq_63 = 2.455141e-6 for base 500000, d=128.
    #[test]
    fn rope_frequencies_match_spec() {
        let inv = |i: f32| 1.0 / 500000f32.powf(2.0 * i / 128.0);
        assert!((inv(1.0) - 0.8146172).abs() < 1e-6);
        assert!((inv(63.0) - 2.455141e-6).abs() < 1e-11);
        let mut x: Vec<f32> = (0..128).map(|i| i as f32).collect();
        let orig = x.clone();
        Rope {
            theta: 500000.0,
            layout: RopeLayout::Interleaved,
            n_rot: 128,
            iterative: false,
        }
        .apply(&mut x, 128, 0);
        assert_eq!(x, orig, "position 0 leaves q and k unchanged");
    }
}
