//! Gemma 3 decoder layer: sandwich norms around attention and MLP, learned
//! per-head QK-norm, NeoX RoPE (base 10000 on sliding layers, the model's base
//! on global ones), GeGLU MLP. Norm gains in GGUF already include Gemma's +1
//! (added by the converter), so they are used as absolute gains.

use crate::blocks::{self, attention, gelu_f16_table, glu, rmsnorm, round_to_cache, AttnShape, Rope};
use crate::config::LayerKind;
use crate::kv_cache::LayerKvCache;
use crate::weights::Model;

pub(crate) fn layer(m: &Model, li: usize, x: &mut [f32], cache: &mut LayerKvCache, p0: usize) {
    let c = &m.config;
    let l = &m.layers[li];
    let (hd, t) = (c.head_dim, x.len() / c.dim);

    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.attn_norm), c.norm_eps);
    let mut q = m.linear(&l.wq, &h);
    let mut k = m.linear(&l.wk, &h);
    let v = m.linear(&l.wv, &h);
    rmsnorm(&mut q, hd, l.q_norm.as_deref(), c.norm_eps);
    rmsnorm(&mut k, hd, l.k_norm.as_deref(), c.norm_eps);
    let theta = match c.layers[li] {
        LayerKind::Sliding { .. } => c.rope_theta_sliding,
        LayerKind::Global { .. } => c.rope_theta,
    };
    let rope = Rope { theta, layout: c.rope_layout, n_rot: hd, iterative: true };
    for i in 0..t {
        rope.apply(&mut q[i * c.n_heads * hd..(i + 1) * c.n_heads * hd], hd, p0 + i);
        rope.apply(&mut k[i * c.n_kv_heads * hd..(i + 1) * c.n_kv_heads * hd], hd, p0 + i);
    }
    // The query is scaled before attention (as the reference graph does).
    q.iter_mut().for_each(|v| *v *= c.attn_scale);
    let mut v = v;
    round_to_cache(&mut k, cache.dtype);
    round_to_cache(&mut v, cache.dtype);
    let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: hd, scale: 1.0 };
    let mut att = vec![0.0f32; t * c.n_heads * hd];
    attention(&q, &k, &v, cache, p0, shape, &mut att);
    cache.write(p0, &k, &v);
    let mut o = m.linear(&l.wo, &att);
    rmsnorm(&mut o, c.dim, l.post_attn_norm.as_deref(), c.norm_eps);
    blocks::add(x, &o);

    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.ffn_norm), c.norm_eps);
    let mut g = m.linear(&l.ffn_gate, &h);
    glu(&mut g, &m.linear(&l.ffn_up, &h), gelu_f16_table);
    let mut d = m.linear(&l.ffn_down, &g);
    rmsnorm(&mut d, c.dim, l.post_ffn_norm.as_deref(), c.norm_eps);
    blocks::add(x, &d);
}
