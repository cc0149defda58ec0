//! llama and qwen2 decoder layers: pre-norm attention (qwen2 adds q/k/v biases)
//! and a SwiGLU MLP. RoPE layout differs (llama: interleaved pairs; qwen2:
//! NeoX halves) and comes from the config.

use crate::blocks::{self, attention, glu, rmsnorm, silu, round_to_cache, AttnShape, Rope};
use crate::kv_cache::LayerKvCache;
use crate::weights::Model;

pub(crate) fn layer(m: &Model, li: usize, x: &mut [f32], cache: &mut LayerKvCache, p0: usize) {
    let c = &m.config;
    let l = &m.layers[li];
    let (hd, t) = (c.head_dim, x.len() / c.dim);

    // Attention block: x += Wo · attn(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv)
    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.attn_norm), c.norm_eps);
    let mut q = m.linear(&l.wq, &h);
    let mut k = m.linear(&l.wk, &h);
    let mut v = m.linear(&l.wv, &h);
    for (y, b) in [(&mut q, &l.bq), (&mut k, &l.bk), (&mut v, &l.bv)] {
        if let Some(b) = b {
            y.chunks_exact_mut(b.len()).for_each(|row| blocks::add(row, b));
        }
    }
    let rope = Rope { theta: c.rope_theta, layout: c.rope_layout, n_rot: hd, iterative: true };
    for i in 0..t {
        rope.apply(&mut q[i * c.n_heads * hd..(i + 1) * c.n_heads * hd], hd, p0 + i);
        rope.apply(&mut k[i * c.n_kv_heads * hd..(i + 1) * c.n_kv_heads * hd], hd, p0 + i);
    }
    let mut v = v;
    round_to_cache(&mut k, cache.dtype);
    round_to_cache(&mut v, cache.dtype);
    let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: hd, scale: c.attn_scale };
    let mut att = vec![0.0f32; t * c.n_heads * hd];
    attention(&q, &k, &v, cache, p0, shape, &mut att);
    cache.write(p0, &k, &v);
    blocks::add(x, &m.linear(&l.wo, &att));

    // MLP block: x += W_down · (silu(W_gate h) ⊙ W_up h)
    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.ffn_norm), c.norm_eps);
    let mut g = m.linear(&l.ffn_gate, &h);
    glu(&mut g, &m.linear(&l.ffn_up, &h), silu);
    blocks::add(x, &m.linear(&l.ffn_down, &g));
}
