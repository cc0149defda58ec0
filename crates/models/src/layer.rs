//! The CPU decoder layer, for every architecture: it walks the layer's
//! [`LayerSpec`] (crate::arch), so an architecture is a description, not a
//! copy of this function. Each step reproduces llama.cpp's CPU arithmetic in
//! [`Numerics::Reference`] (the Muse Glimmer spec's bf16 rounding points for
//! that architecture) and exact f32 math in [`Numerics::F32`].

use hearth_kernels::cpu::attention::{attention, AttnShape};
use hearth_kernels::cpu::ggml_order::activations::{expf_ggml_v, gelu_f16_table, swiglu_ggml};
use hearth_kernels::cpu::kv_cache::{round_to_cache, LayerKvCache};

use crate::arch::{FfnAct, LayerSpec, QkNorm};
use crate::blocks::{add, glu, rmsnorm, round_bf16, sigmoid, silu, Rope};
use crate::forward::Pass;
use crate::weights::{Linear, Model, Numerics};

impl Model {
    /// Rounds to bf16 at one of the Muse Glimmer spec's rounding points
    /// (§3.7); a no-op for every other architecture and in exact numerics.
    pub(crate) fn round_point(&self, x: &mut [f32]) {
        if self.arch.bf16_activations && self.numerics == Numerics::Reference {
            round_bf16(x);
        }
    }

    /// RMSNorm of rows of `x` with learned gain `g`; at the bf16 rounding
    /// points, the spec's bf16(bf16(u) · bf16(g)) (§3.1).
    pub(crate) fn norm(&self, x: &mut [f32], g: &[f32], eps: f32) {
        let dim = g.len();
        if !(self.arch.bf16_activations && self.numerics == Numerics::Reference) {
            return rmsnorm(x, dim, Some(g), eps);
        }
        rmsnorm(x, dim, None, eps);
        round_bf16(x);
        let mut g = g.to_vec();
        round_bf16(&mut g);
        for row in x.chunks_exact_mut(dim) {
            row.iter_mut().zip(&g).for_each(|(v, w)| *v *= w);
        }
        round_bf16(x);
    }

    /// A projection `W x`, rounded at the bf16 points.
    pub(crate) fn project(&self, pass: &Pass, w: &Linear, x: &[f32]) -> Vec<f32> {
        let mut y = self.linear(pass, w, x);
        self.round_point(&mut y);
        y
    }
}

/// Layer `li` over the chunk `x` ([T, dim]) at positions `p0..`, in place.
pub(crate) fn layer(
    m: &Model,
    pass: &Pass,
    li: usize,
    x: &mut [f32],
    cache: &mut LayerKvCache,
    p0: usize,
) {
    let c = &m.config;
    let s: &LayerSpec = &m.arch.layers[li];
    let l = &m.layers[li];
    let (hd, t) = (c.head_dim, x.len() / c.dim);

    // Attention block: x += post_norm(Wo · attn(rope(qk_norm(Wq h)), rope(qk_norm(Wk h)), Wv h)).
    let mut h = x.to_vec();
    m.norm(&mut h, &l.attn_norm, c.norm_eps);
    pass.dump("attn_norm", li, &h);
    let mut q = m.project(pass, &l.wq, &h);
    let mut k = m.project(pass, &l.wk, &h);
    let mut v = m.project(pass, &l.wv, &h);
    let gate = l.attn_gate.as_ref().map(|g| m.project(pass, g, &h));
    for (y, b) in [(&mut q, &l.bq), (&mut k, &l.bk), (&mut v, &l.bv)] {
        if let Some(b) = b {
            y.chunks_exact_mut(b.len()).for_each(|row| add(row, b));
        }
    }
    match s.qk_norm {
        QkNorm::None => {}
        QkNorm::Gains => {
            rmsnorm(&mut q, hd, l.q_norm.as_deref(), c.norm_eps);
            rmsnorm(&mut k, hd, l.k_norm.as_deref(), c.norm_eps);
            pass.dump("Qcur_normed", li, &q);
            pass.dump("Kcur_normed", li, &k);
        }
        QkNorm::Scaleless => {
            for y in [&mut q, &mut k] {
                rmsnorm(y, hd, None, c.norm_eps);
                m.round_point(y);
            }
        }
    }
    if let Some(r) = s.rope {
        let rope = Rope {
            theta: r.theta,
            layout: r.layout,
            n_rot: hd,
            iterative: r.ggml_frequencies,
        };
        rope.apply_tokens(&mut q, c.n_heads, hd, p0);
        rope.apply_tokens(&mut k, c.n_kv_heads, hd, p0);
        m.round_point(&mut q);
        m.round_point(&mut k);
    }
    pass.dump("Qcur", li, &q);
    pass.dump("Kcur", li, &k);
    pass.dump("Vcur", li, &v);
    let scale = if s.scale_q_first {
        q.iter_mut().for_each(|v| *v *= s.attn_scale);
        1.0
    } else {
        s.attn_scale
    };
    round_to_cache(&mut k, cache.dtype);
    round_to_cache(&mut v, cache.dtype);
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
        scale,
    };
    let mut att = vec![0.0f32; t * c.n_heads * hd];
    attention(&q, &k, &v, cache, p0, shape, pass.order, &mut att);
    cache.write(p0, &k, &v);
    pass.dump("kqv_out", li, &att);
    if let Some(gate) = gate {
        m.round_point(&mut att);
        att.iter_mut()
            .zip(&gate)
            .for_each(|(v, g)| *v *= sigmoid(*g));
        m.round_point(&mut att);
    }
    let mut o = m.project(pass, &l.wo, &att);
    pass.dump("attn_out", li, &o);
    if let (Some(eps), Some(g)) = (s.post_norm_eps, &l.post_attn_norm) {
        m.norm(&mut o, g, eps);
        pass.dump("attn_post_norm", li, &o);
    }
    add(x, &o);
    m.round_point(x);
    pass.dump("ffn_inp", li, x);

    // MLP block: x += post_norm(W_down · (act(W_gate h) ⊙ W_up h)).
    let mut h = x.to_vec();
    m.norm(&mut h, &l.ffn_norm, c.norm_eps);
    pass.dump("ffn_norm", li, &h);
    let g = match (m.fused_gate_up(pass, l), s.ffn_act) {
        (Some(gate_up), FfnAct::Silu) => {
            // ggml's SwiGLU: its vector exp for whole groups of 16, libm's past them.
            let vec_len = c.ffn_dim & !15;
            let act = |j: usize, x: f32, y: f32| {
                if j < vec_len {
                    x / (1.0 + expf_ggml_v(0.0 - x)) * y
                } else {
                    silu(x) * y
                }
            };
            m.glu(pass, gate_up, &h, &act)
        }
        (Some(gate_up), FfnAct::GeluF16) => {
            m.glu(pass, gate_up, &h, &|_, x, y| gelu_f16_table(x) * y)
        }
        (None, act) => {
            let mut g = m.project(pass, &l.ffn_gate, &h);
            pass.dump("ffn_gate", li, &g);
            let up = m.project(pass, &l.ffn_up, &h);
            pass.dump("ffn_up", li, &up);
            match act {
                // The spec's plain SiLU in exact numerics and at the bf16 points.
                FfnAct::Silu if m.numerics == Numerics::F32 || m.arch.bf16_activations => {
                    glu(&mut g, &up, silu)
                }
                FfnAct::Silu => swiglu_ggml(&mut g, &up, c.ffn_dim),
                FfnAct::GeluF16 => glu(&mut g, &up, gelu_f16_table),
            }
            m.round_point(&mut g);
            g
        }
    };
    pass.dump("ffn_act", li, &g);
    let mut d = m.project(pass, &l.ffn_down, &g);
    pass.dump("ffn_out", li, &d);
    if let (Some(eps), Some(gn)) = (s.post_norm_eps, &l.post_ffn_norm) {
        m.norm(&mut d, gn, eps);
        pass.dump("ffn_post_norm", li, &d);
    }
    add(x, &d);
    m.round_point(x);
    pass.dump("l_out", li, x);
}
