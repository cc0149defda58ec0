//! llama and qwen2 decoder layers: pre-norm attention (qwen2 adds q/k/v biases)
//! and a SwiGLU MLP. RoPE layout differs (llama: interleaved pairs; qwen2:
//! NeoX halves) and comes from the config.

use crate::blocks::{self, attention, glu, rmsnorm, round_to_cache, silu, AttnShape, Rope};
use crate::kv_cache::LayerKvCache;
use crate::weights::{Model, Numerics};

pub(crate) fn layer(m: &Model, li: usize, x: &mut [f32], cache: &mut LayerKvCache, p0: usize) {
    let c = &m.config;
    let l = &m.layers[li];
    let (hd, t) = (c.head_dim, x.len() / c.dim);

    // Attention block: x += Wo · attn(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv)
    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.attn_norm), c.norm_eps);
    blocks::dump("attn_norm", li, &h);
    let mut q = m.linear(&l.wq, &h);
    let mut k = m.linear(&l.wk, &h);
    let mut v = m.linear(&l.wv, &h);
    for (y, b) in [(&mut q, &l.bq), (&mut k, &l.bk), (&mut v, &l.bv)] {
        if let Some(b) = b {
            y.chunks_exact_mut(b.len())
                .for_each(|row| blocks::add(row, b));
        }
    }
    let rope = Rope {
        theta: c.rope_theta,
        layout: c.rope_layout,
        n_rot: hd,
        iterative: true,
    };
    rope.apply_tokens(&mut q, c.n_heads, hd, p0);
    rope.apply_tokens(&mut k, c.n_kv_heads, hd, p0);
    blocks::dump("Qcur", li, &q);
    blocks::dump("Kcur", li, &k);
    blocks::dump("Vcur", li, &v);
    let mut v = v;
    round_to_cache(&mut k, cache.dtype);
    round_to_cache(&mut v, cache.dtype);
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
        scale: c.attn_scale,
    };
    let mut att = vec![0.0f32; t * c.n_heads * hd];
    attention(&q, &k, &v, cache, p0, shape, &mut att);
    cache.write(p0, &k, &v);
    blocks::dump("kqv_out", li, &att);
    let attn_out = m.linear(&l.wo, &att);
    blocks::dump("attn_out", li, &attn_out);
    blocks::add(x, &attn_out);
    blocks::dump("ffn_inp", li, x);

    // MLP block: x += W_down · (silu(W_gate h) ⊙ W_up h)
    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.ffn_norm), c.norm_eps);
    blocks::dump("ffn_norm", li, &h);
    let g = match m.fused_gate_up(l) {
        Some(gate_up) => {
            // ggml's SwiGLU: its vector exp for whole groups of 16, libm's past them.
            let vec_len = c.ffn_dim & !15;
            let act = |j: usize, x: f32, y: f32| {
                if j < vec_len {
                    x / (1.0 + blocks::expf_ggml_v(0.0 - x)) * y
                } else {
                    silu(x) * y
                }
            };
            m.glu(gate_up, &h, &act)
        }
        _ => {
            let mut g = m.linear(&l.ffn_gate, &h);
            blocks::dump("ffn_gate", li, &g);
            let up = m.linear(&l.ffn_up, &h);
            blocks::dump("ffn_up", li, &up);
            if m.numerics == Numerics::F32 {
                glu(&mut g, &up, silu);
            } else {
                blocks::swiglu_ggml(&mut g, &up, c.ffn_dim);
            }
            g
        }
    };
    blocks::dump("ffn_swiglu", li, &g);
    let down = m.linear(&l.ffn_down, &g);
    blocks::dump("ffn_out", li, &down);
    blocks::add(x, &down);
    blocks::dump("l_out", li, x);
}
