//! Muse Glimmer decoder layer (../shared/spec/muse-glimmer-model.md §3):
//! iRoPE (sliding RoPE layers, global NoPE layers), scaleless QK-norm, sigmoid
//! output gate, sandwich post-norms, bf16 rounding at the spec's points, and
//! the soft-capped output head.

use crate::blocks::{
    self, attention, glu, rmsnorm, round_to_cache, sigmoid, silu, AttnShape, Rope,
};
use crate::config::RopeLayout;
use crate::kv_cache::LayerKvCache;
use crate::weights::{Linear, Model, Numerics};

/// Norm epsilon of the post-attention and post-MLP norms (§1).
const POST_NORM_EPS: f32 = 1e-8;
/// §3.6: logit = 20 · tanh(z · 0.19611613513 / 20).
const OUTPUT_MULTIPLIER: f32 = 0.196_116_14;
const SOFT_CAP: f32 = 20.0;

/// Rounds to bf16 at one of the spec's rounding points (§3.7), unless the
/// model runs with exact f32 numerics.
fn round_bf16(m: &Model, x: &mut [f32]) {
    if m.numerics == Numerics::Reference {
        blocks::round_bf16(x);
    }
}

/// §3.1 weighted RMSNorm: bf16(bf16(u) · bf16(g)).
fn rms_w(m: &Model, x: &mut [f32], g: &[f32], eps: f32) {
    let dim = m.config.dim;
    rmsnorm(x, dim, None, eps);
    round_bf16(m, x);
    let mut g = g.to_vec();
    round_bf16(m, &mut g);
    for row in x.chunks_exact_mut(dim) {
        row.iter_mut().zip(&g).for_each(|(v, w)| *v *= w);
    }
    round_bf16(m, x);
}

/// A linear with bf16 output (§3.7).
fn linear_bf16(m: &Model, w: &Linear, x: &[f32]) -> Vec<f32> {
    let mut y = m.linear(w, x);
    round_bf16(m, &mut y);
    y
}

pub(crate) fn layer(m: &Model, li: usize, x: &mut [f32], cache: &mut LayerKvCache, p0: usize) {
    let c = &m.config;
    let l = &m.layers[li];
    let (hd, t) = (c.head_dim, x.len() / c.dim);

    // §3.4 attention
    let mut h = x.to_vec();
    rms_w(m, &mut h, &l.attn_norm, c.norm_eps);
    let mut q = linear_bf16(m, &l.wq, &h);
    let mut k = linear_bf16(m, &l.wk, &h);
    let v = linear_bf16(m, &l.wv, &h);
    let gate = linear_bf16(
        m,
        l.attn_gate
            .as_ref()
            .expect("muse_glimmer layers have a gate"),
        &h,
    );
    for y in [&mut q, &mut k] {
        rmsnorm(y, hd, None, c.norm_eps);
        round_bf16(m, y);
    }
    if c.layers[li].uses_rope() {
        let rope = Rope {
            theta: c.rope_theta,
            layout: RopeLayout::Interleaved,
            n_rot: hd,
            iterative: false,
        };
        rope.apply_tokens(&mut q, c.n_heads, hd, p0);
        rope.apply_tokens(&mut k, c.n_kv_heads, hd, p0);
        round_bf16(m, &mut q);
        round_bf16(m, &mut k);
    }
    let mut v = v;
    round_to_cache(&mut k, cache.dtype);
    round_to_cache(&mut v, cache.dtype);
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
        scale: c.attn_scale,
    };
    let mut y = vec![0.0f32; t * c.n_heads * hd];
    attention(&q, &k, &v, cache, p0, shape, &mut y);
    cache.write(p0, &k, &v);
    round_bf16(m, &mut y);
    y.iter_mut().zip(&gate).for_each(|(v, o)| *v *= sigmoid(*o));
    round_bf16(m, &mut y);
    let mut a = linear_bf16(m, &l.wo, &y);
    rms_w(
        m,
        &mut a,
        l.post_attn_norm.as_deref().expect("sandwich norm"),
        POST_NORM_EPS,
    );
    blocks::add(x, &a);
    round_bf16(m, x);

    // §3.5 MLP
    let mut h = x.to_vec();
    rms_w(m, &mut h, &l.ffn_norm, c.norm_eps);
    let mut g = linear_bf16(m, &l.ffn_gate, &h);
    glu(&mut g, &linear_bf16(m, &l.ffn_up, &h), silu);
    round_bf16(m, &mut g);
    let mut d = linear_bf16(m, &l.ffn_down, &g);
    rms_w(
        m,
        &mut d,
        l.post_ffn_norm.as_deref().expect("sandwich norm"),
        POST_NORM_EPS,
    );
    blocks::add(x, &d);
    round_bf16(m, x);
}

/// §3.6 output head with soft-cap.
pub(crate) fn head(m: &Model, mut x: Vec<f32>) -> Vec<f32> {
    let c = &m.config;
    rms_w(m, &mut x, &m.output_norm, c.norm_eps);
    let mut z = linear_bf16(m, &m.output, &x);
    z.iter_mut().for_each(|v| *v = soft_cap(*v));
    z
}

pub fn soft_cap(z: f32) -> f32 {
    SOFT_CAP * (z * OUTPUT_MULTIPLIER / SOFT_CAP).tanh()
}

#[cfg(test)]
mod tests {
    /// Spec §8.3 soft-cap table.
    #[test]
    fn soft_cap_table() {
        for (z, want) in [
            (0.0, 0.0),
            (1.0, 0.1961098),
            (10.0, 1.9548997),
            (50.0, 9.0889368),
            (100.0, 15.0663433),
            (-100.0, -15.0663433),
            (1000.0, 19.9999999),
        ] {
            assert!(
                (super::soft_cap(z) - want).abs() < 2e-6,
                "{z}: {}",
                super::soft_cap(z)
            );
        }
    }
}
