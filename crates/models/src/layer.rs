//! The CPU decoder layer, for every architecture: it walks the layer's
//! [`LayerSpec`] (crate::arch), so an architecture is a description, not a
//! copy of this function. Each step reproduces llama.cpp's CPU arithmetic in
//! [`Numerics::Reference`] and exact f32 math in [`Numerics::F32`].

use hearth_kernels::cpu::attention::{attention, AttnShape};
use hearth_kernels::cpu::ggml_order::activations::{gelu_f16_table, swiglu_ggml};
use hearth_kernels::cpu::kv_cache::{fwht, round_to_cache, LayerKvCache};

use crate::arch::{FfnAct, LayerSpec, QkNorm};
use crate::blocks::{add, glu, rmsnorm, sigmoid, silu, Rope};
use crate::forward::Pass;
use crate::weights::{Layer, Model, Numerics};

impl Model {
    /// q, k and v ([T, q_dim], [T, kv_dim] twice) of the normed input `h`:
    /// one product over a fused `attn_qkv` or three, then the biases.
    fn qkv(&self, pass: &Pass, l: &Layer, h: &[f32]) -> [Vec<f32>; 3] {
        let mut out = match &l.wqkv {
            Some(w) => {
                let y = self.linear(pass, w, h);
                let widths = [l.wq.rows, l.wk.rows, l.wv.rows];
                let mut parts = widths.map(|n| Vec::with_capacity(n * h.len() / w.cols));
                for row in y.chunks_exact(w.rows) {
                    let mut at = 0;
                    for (p, n) in parts.iter_mut().zip(widths) {
                        p.extend_from_slice(&row[at..at + n]);
                        at += n;
                    }
                }
                parts
            }
            None => [&l.wq, &l.wk, &l.wv].map(|w| self.linear(pass, w, h)),
        };
        for (y, b) in out.iter_mut().zip([&l.bq, &l.bk, &l.bv]) {
            if let Some(b) = b {
                y.chunks_exact_mut(b.len()).for_each(|row| add(row, b));
            }
        }
        out
    }
}

/// One sequence's rows in a layer's input: rows `rows` of `x` sit at
/// positions `p0..` of the sequence whose cache is `cache`.
pub(crate) struct Span<'c> {
    pub cache: &'c mut LayerKvCache,
    pub p0: usize,
    pub rows: std::ops::Range<usize>,
}

/// Layer `li` over `x` ([T, dim]) in place: the rows of one or more
/// sequences (`spans`, in row order, covering `x`). Every step but the
/// position encoding and the attention is row-wise, so the rows of all
/// sequences go through one matmul per weight; each span attends over its
/// own cache. With `keep`, only those rows continue past the attention
/// block (x becomes [keep.len(), dim]): llama.cpp's last layer keeps just
/// the rows whose outputs are wanted (`inp_out_ids`), so its MLP matmuls run
/// over that many rows, which decides their kernels and so their rounding.
pub(crate) fn layer(
    m: &Model,
    pass: &Pass,
    li: usize,
    x: &mut Vec<f32>,
    spans: &mut [Span],
    keep: Option<&[usize]>,
) {
    let c = &m.config;
    let s: &LayerSpec = &m.arch.layers[li];
    let l = &m.layers[li];
    let hd = c.head_dim;
    let (q_row, kv_row) = (c.n_heads * hd, c.n_kv_heads * hd);

    // Attention block: x += post_norm(Wo · attn(rope(qk_norm(Wq h)), rope(qk_norm(Wk h)), Wv h)).
    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.attn_norm), c.norm_eps);
    pass.dump("attn_norm", li, &h);
    let [mut q, mut k, v] = m.qkv(pass, l, &h);
    let gate = l.attn_gate.as_ref().map(|g| m.linear(pass, g, &h));
    if s.qk_norm == QkNorm::Gains {
        rmsnorm(&mut q, hd, l.q_norm.as_deref(), c.norm_eps);
        rmsnorm(&mut k, hd, l.k_norm.as_deref(), c.norm_eps);
        pass.dump("Qcur_normed", li, &q);
        pass.dump("Kcur_normed", li, &k);
    }
    if let Some(r) = s.rope {
        let rope = Rope {
            theta: r.theta,
            layout: r.layout,
            n_rot: hd,
            iterative: r.ggml_frequencies,
        };
        for sp in spans.iter() {
            let (a, b) = (sp.rows.start, sp.rows.end);
            rope.apply_tokens(&mut q[a * q_row..b * q_row], c.n_heads, hd, sp.p0);
            rope.apply_tokens(&mut k[a * kv_row..b * kv_row], c.n_kv_heads, hd, sp.p0);
        }
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
    let mut v = v;
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
        scale,
        isa: m.ref_isa,
    };
    // A quantized cache: llama.cpp's Hadamard rotations of Q, K and V (the
    // same for every span: they share the model's cache types).
    let (rot_k, rot_v) = spans
        .first()
        .map_or((None, None), |sp| sp.cache.types.rotations(hd));
    if let Some(n) = rot_k {
        fwht(&mut q, n);
        fwht(&mut k, n);
    }
    if let Some(n) = rot_v {
        fwht(&mut v, n);
    }
    let mut att = vec![0.0f32; q.len()];
    for sp in spans.iter_mut() {
        let (a, b) = (sp.rows.start, sp.rows.end);
        let (k, v) = (
            &mut k[a * kv_row..b * kv_row],
            &mut v[a * kv_row..b * kv_row],
        );
        round_to_cache(k, sp.cache.types.k);
        round_to_cache(v, sp.cache.types.v);
        let (q, out) = (&q[a * q_row..b * q_row], &mut att[a * q_row..b * q_row]);
        attention(q, &*k, &*v, sp.cache, sp.p0, shape, pass.order, out);
        sp.cache.write(sp.p0, &*k, &*v);
    }
    pass.dump("kqv_out", li, &att);
    if let Some(n) = rot_v {
        // Back from the rotated basis (the transform is its own inverse).
        fwht(&mut att, n);
    }
    if let Some(gate) = gate {
        // muse-glimmer.cpp:132-135: attn_out · sigmoid(gate), before W_o.
        att.iter_mut()
            .zip(&gate)
            .for_each(|(v, g)| *v *= sigmoid(*g));
    }
    let mut o = m.linear(pass, &l.wo, &att);
    pass.dump("attn_out", li, &o);
    if let (Some(eps), Some(g)) = (s.post_norm_eps, &l.post_attn_norm) {
        rmsnorm(&mut o, c.dim, Some(g), eps);
        pass.dump("attn_post_norm", li, &o);
    }
    if let Some(rows) = keep {
        let gather = |y: &[f32]| -> Vec<f32> {
            rows.iter()
                .flat_map(|&r| y[r * c.dim..(r + 1) * c.dim].iter().copied())
                .collect()
        };
        o = gather(&o);
        *x = gather(x);
        if rows.is_empty() {
            return;
        }
    }
    add(x, &o);
    pass.dump("ffn_inp", li, x);

    // MLP block: x += post_norm(W_down · (act(W_gate h) ⊙ W_up h)).
    let mut h = x.to_vec();
    rmsnorm(&mut h, c.dim, Some(&l.ffn_norm), c.norm_eps);
    pass.dump("ffn_norm", li, &h);
    let g = match (m.fused_gate_up(pass, l), s.ffn_act) {
        (Some(gate_up), FfnAct::Silu) => {
            // ggml's SwiGLU: its vector exp for whole groups of 16, libm's past them.
            let isa = m.ref_isa;
            let vec_len = isa.vector_len(c.ffn_dim);
            // (vec_len is a multiple of 16, so a group of 8 is all vector or all tail.)
            let act = |j: usize, x: &[f32; 8], y: &[f32; 8]| {
                if j < vec_len {
                    isa.swiglu_v8(x, y)
                } else {
                    std::array::from_fn(|r| silu(x[r]) * y[r])
                }
            };
            m.glu(pass, gate_up, &h, &act)
        }
        (Some(gate_up), FfnAct::GeluF16) => {
            let act = |_, x: &[f32; 8], y: &[f32; 8]| {
                std::array::from_fn(|r| gelu_f16_table(x[r]) * y[r])
            };
            m.glu(pass, gate_up, &h, &act)
        }
        (None, act) => {
            let mut g = m.linear(pass, &l.ffn_gate, &h);
            pass.dump("ffn_gate", li, &g);
            let up = m.linear(pass, &l.ffn_up, &h);
            pass.dump("ffn_up", li, &up);
            match act {
                FfnAct::Silu if m.numerics == Numerics::F32 => glu(&mut g, &up, silu),
                FfnAct::Silu => swiglu_ggml(&mut g, &up, c.ffn_dim, m.ref_isa),
                FfnAct::GeluF16 => glu(&mut g, &up, gelu_f16_table),
            }
            g
        }
    };
    pass.dump("ffn_act", li, &g);
    let mut d = m.linear(pass, &l.ffn_down, &g);
    pass.dump("ffn_out", li, &d);
    if let (Some(eps), Some(gn)) = (s.post_norm_eps, &l.post_ffn_norm) {
        rmsnorm(&mut d, c.dim, Some(gn), eps);
        pass.dump("ffn_post_norm", li, &d);
    }
    add(x, &d);
    pass.dump("l_out", li, x);
}
