//! Gemma 3 decoder layer: sandwich norms around attention and MLP, learned
//! per-head QK-norm, NeoX RoPE (base 10000 on sliding layers, the model's base
//! on global ones), GeGLU MLP. Norm gains in GGUF already include Gemma's +1
//! (added by the converter), so they are used as absolute gains.

use crate::blocks::{
    self, attention, gelu_f16_table, glu, rmsnorm, round_to_cache, AttnShape, Rope,
};
use crate::config::LayerKind;
use crate::kv_cache::LayerKvCache;
use crate::weights::Model;

pub(crate) fn layer(m: &Model, li: usize, x: &mut [f32], cache: &mut LayerKvCache, p0: usize) {
    let c = &m.config;
    let l = &m.layers[li];
    let (hd, t) = (c.head_dim, x.len() / c.dim);

    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.attn_norm), c.norm_eps);
    blocks::dump("attn_norm", li, &h);
    let mut q = m.linear(&l.wq, &h);
    let mut k = m.linear(&l.wk, &h);
    let v = m.linear(&l.wv, &h);
    rmsnorm(&mut q, hd, l.q_norm.as_deref(), c.norm_eps);
    rmsnorm(&mut k, hd, l.k_norm.as_deref(), c.norm_eps);
    blocks::dump("Qcur_normed", li, &q);
    blocks::dump("Kcur_normed", li, &k);
    blocks::dump("Vcur", li, &v);
    let theta = match c.layers[li] {
        LayerKind::Sliding { .. } => c.rope_theta_sliding,
        LayerKind::Global { .. } => c.rope_theta,
    };
    let rope = Rope {
        theta,
        layout: c.rope_layout,
        n_rot: hd,
        iterative: true,
    };
    rope.apply_tokens(&mut q, c.n_heads, hd, p0);
    rope.apply_tokens(&mut k, c.n_kv_heads, hd, p0);
    blocks::dump("Qcur", li, &q);
    blocks::dump("Kcur", li, &k);
    // The query is scaled before attention (as the reference graph does).
    q.iter_mut().for_each(|v| *v *= c.attn_scale);
    let mut v = v;
    round_to_cache(&mut k, cache.dtype);
    round_to_cache(&mut v, cache.dtype);
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
        scale: 1.0,
    };
    let mut att = vec![0.0f32; t * c.n_heads * hd];
    attention(&q, &k, &v, cache, p0, shape, &mut att);
    cache.write(p0, &k, &v);
    blocks::dump("kqv_out", li, &att);
    let mut o = m.linear(&l.wo, &att);
    blocks::dump("attn_out", li, &o);
    rmsnorm(&mut o, c.dim, l.post_attn_norm.as_deref(), c.norm_eps);
    blocks::dump("attn_post_norm", li, &o);
    blocks::add(x, &o);
    blocks::dump("sa_out", li, x);

    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.ffn_norm), c.norm_eps);
    blocks::dump("ffn_norm", li, &h);
    let g = match m.fused_gate_up(l) {
        Some(gate_up) => m.glu(gate_up, &h, &|_, x, y| gelu_f16_table(x) * y),
        _ => {
            let mut g = m.linear(&l.ffn_gate, &h);
            blocks::dump("ffn_gate", li, &g);
            let up = m.linear(&l.ffn_up, &h);
            blocks::dump("ffn_up", li, &up);
            glu(&mut g, &up, gelu_f16_table);
            g
        }
    };
    blocks::dump("ffn_geglu", li, &g);
    let mut d = m.linear(&l.ffn_down, &g);
    blocks::dump("ffn_out", li, &d);
    rmsnorm(&mut d, c.dim, l.post_ffn_norm.as_deref(), c.norm_eps);
    blocks::dump("ffn_post_norm", li, &d);
    blocks::add(x, &d);
    blocks::dump("l_out", li, x);
}
