//! One draft forward (llama.cpp dflash.cpp:608-862): the new context rows
//! written to the cache, then the noise block `[anchor, MASK, ...]`.

use half::f16;
use hearth_kernels::cpu::ggml_order::activations::RefIsa;
use hearth_kernels::cpu::ggml_order::flash_attn::f16_attend_row;
use hearth_kernels::cpu::interleaved::matmul_packed;
use hearth_kernels::cpu::simd;
use hearth_kernels::{matmul, Activations, QMatrix, RowOrder};

use super::FfnActivation;
use super::{selector, DflashError, DflashModel, DflashState, DraftLayer, Mat};
use crate::blocks::{add, gelu_tanh, rmsnorm, silu};
use crate::forward::Pass;
use crate::weights::{Model, ModelError, Numerics};

/// Exact attention of one query row: scores, f32 softmax with the sink
/// logit (if any) in the denominator, Σ p·v.
fn softmax_attend_row<'a>(
    q: &[f32],
    kv: impl Iterator<Item = (&'a [f32], &'a [f32])>,
    scale: f32,
    sink: Option<f32>,
) -> Vec<f32> {
    let kv: Vec<_> = kv.collect();
    let scores: Vec<f32> = kv
        .iter()
        .map(|(k, _)| q.iter().zip(*k).map(|(a, b)| a * b).sum::<f32>() * scale)
        .collect();
    let max = scores
        .iter()
        .copied()
        .chain(sink)
        .fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f32 = p.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - max).exp());
    let mut out = vec![0.0f32; q.len()];
    for (&pj, (_, v)) in p.iter().zip(&kv) {
        let w = pj / sum;
        out.iter_mut().zip(*v).for_each(|(a, b)| *a += w * b);
    }
    out
}

/// What one draft forward returns.
#[derive(Clone, Debug)]
pub struct DraftOutput {
    /// Draft logits over the target vocabulary of the requested block rows,
    /// [rows.len(), vocab] (−inf outside a reduced draft vocabulary).
    pub logits: Vec<f32>,
    /// DFlash2: the selector lattice of block rows 0..B, [B, dim] (row 0 zero;
    /// see selector.rs for the row layout).
    pub lattice: Option<Vec<f32>>,
}

/// f32 rounded to f16 and back: what llama.cpp's f16 KV cache and flash
/// attention hold (not in exact numerics).
fn f16_round(exact: bool, x: &mut [f32]) {
    if !exact {
        x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
    }
}

impl DflashModel {
    /// `(x @ W^T) · scale` with the target's activation mode.
    pub(crate) fn linear(&self, mode: Activations, w: &Mat, x: &[f32]) -> Vec<f32> {
        let n = x.len() / w.cols;
        let mut out = vec![0.0f32; n * w.rows];
        let m = QMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: &self.file.raw_bytes()[w.range.clone()],
        };
        match (&w.packed, mode) {
            (Some(p), Activations::Quantized) => {
                matmul_packed(simd::active(), p, &m, x, n, &mut out, RowOrder::Batched)
            }
            _ => matmul(&m, x, n, &mut out, mode, RowOrder::Batched),
        }
        if let Some(s) = w.scale {
            out.iter_mut().for_each(|v| *v *= s);
        }
        out
    }

    /// NeoX RoPE of `x` ([T, heads, head_dim]) at positions `p0..`: ggml's
    /// iterative frequencies θ_{i+1} = θ_i · base^(−2/d), divided by the
    /// `rope_freqs` factors when the draft has them.
    fn rope(&self, x: &mut [f32], heads: usize, p0: usize) {
        let hd = self.config.head_dim;
        let half = hd / 2;
        let theta_scale = self.config.rope_theta.powf(-2.0 / hd as f32);
        for (t, row) in x.chunks_exact_mut(heads * hd).enumerate() {
            let mut theta = (p0 + t) as f32;
            let cs: Vec<(f32, f32)> = (0..half)
                .map(|i| {
                    let ff = self.rope_freqs.as_ref().map_or(1.0, |f| f[i]);
                    let a = theta / ff;
                    theta *= theta_scale;
                    (a.cos(), a.sin())
                })
                .collect();
            for head in row.chunks_exact_mut(hd) {
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (x0, x1) = (head[i], head[i + half]);
                    // ggml's rotate_pairs as GCC contracts it (fp-contract=fast).
                    head[i] = x0.mul_add(c, -(x1 * s));
                    head[i + half] = x0.mul_add(s, x1 * c);
                }
            }
        }
    }

    /// K and V of rows `g` ([T, dim], the layer's input) for layer `l`:
    /// `K = k_norm(W_k g)` (per head, with gains; RoPE by the caller),
    /// `V = W_v g`, or the gainless RMSNorm of `W_k g` without `attn_v`.
    fn kv(&self, mode: Activations, l: &DraftLayer, g: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (hd, eps) = (self.config.head_dim, self.config.eps);
        let raw_k = self.linear(mode, &l.wk, g);
        let mut k = raw_k.clone();
        rmsnorm(&mut k, hd, Some(&l.k_norm), eps);
        let v = match &l.wv {
            Some(wv) => self.linear(mode, wv, g),
            None => {
                let mut v = raw_k;
                rmsnorm(&mut v, hd, None, eps);
                v
            }
        };
        (k, v)
    }

    /// One draft forward. `hidden`: new context rows [n_new, n_taps · dim]
    /// for positions `st.ctx_len..` (the target's tapped rows, taps in file
    /// order), written to the cache first (C advances by n_new). `block`:
    /// [anchor, MASK, …] at positions C.., 2 ≤ B ≤ block_size. Returns the
    /// logits of block rows `rows` and, for DFlash2, the selector lattice.
    pub fn forward(
        &self,
        target: &Model,
        st: &mut DflashState,
        hidden: &[f32],
        block: &[u32],
        rows: std::ops::Range<usize>,
    ) -> Result<DraftOutput, DflashError> {
        let c = &self.config;
        let (d, hd, nh, nkv) = (c.dim, c.head_dim, c.n_heads, c.n_kv_heads);
        let b = block.len();
        if b < 2 || b > c.block_size {
            return Err(DflashError::Invalid(format!(
                "block length {b} must be in 2..={}",
                c.block_size
            )));
        }
        if rows.end > b {
            return Err(DflashError::Invalid(format!(
                "draft rows {rows:?} requested from a block of {b}"
            )));
        }
        let width = self.hidden_width();
        if !hidden.len().is_multiple_of(width) {
            return Err(DflashError::Invalid(format!(
                "hidden rows of {} values are not multiples of {width}",
                hidden.len()
            )));
        }
        let vocab = target.config.vocab_size;
        if let Some(&bad) = block.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { token: bad, vocab }.into());
        }
        let c1 = st.ctx_len + hidden.len() / width;
        if c1 + b > st.max_ctx {
            return Err(DflashError::Invalid(format!(
                "draft positions up to {} exceed the draft cache of {}",
                c1 + b,
                st.max_ctx
            )));
        }
        self.inject(target, st, hidden)?;
        let mode = target.activations();

        // Block input: token embeddings (the draft's own or the target's).
        let mut x = vec![0.0f32; b * d];
        match &self.tok_embd {
            Some(e) => {
                let m = self.qmat(e);
                for (row, &t) in x.chunks_exact_mut(d).zip(block) {
                    m.dequantize_row(t as usize, row);
                }
            }
            None => {
                let e = target.mat(&target.tok_embd);
                for (row, &t) in x.chunks_exact_mut(d).zip(block) {
                    e.dequantize_row(t as usize, row);
                }
            }
        }
        if let Some(s) = c.embedding_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }

        for (li, l) in self.layers.iter().enumerate() {
            let mut h = x.clone();
            rmsnorm(&mut h, d, Some(&l.attn_norm), c.eps);
            let attn_dyn = l.conv.as_ref().map(|cv| {
                let dynamic = self.linear(mode, &cv.attn_proj, &h);
                h = selector::conv(self, &h, &dynamic, &cv.attn_base, 0);
                dynamic
            });
            let mut q = self.linear(mode, &l.wq, &h);
            rmsnorm(&mut q, hd, Some(&l.q_norm), c.eps);
            let (mut kb, mut vb) = self.kv(mode, l, &h);
            self.rope(&mut q, nh, c1);
            self.rope(&mut kb, nkv, c1);
            let exact = target.numerics == Numerics::F32;
            f16_round(exact, &mut q);
            f16_round(exact, &mut kb);
            f16_round(exact, &mut vb);
            let att = self.attend(exact, target.ref_isa, li, l, &q, &kb, &vb, st, c1, b);
            let mut y = self.linear(mode, &l.wo, &att);
            if let Some(s) = c.value_scale {
                y.iter_mut().for_each(|v| *v *= s);
            }
            if let (Some(cv), Some(dynamic)) = (&l.conv, &attn_dyn) {
                y = selector::conv(self, &y, dynamic, &cv.attn_base, 1);
            }
            if let Some(g) = &l.post_attn_norm {
                rmsnorm(&mut y, d, Some(g), c.eps);
            }
            add(&mut x, &y);

            let mut h = x.clone();
            rmsnorm(&mut h, d, Some(&l.ffn_norm), c.eps);
            let ffn_dyn = l.conv.as_ref().map(|cv| {
                let dynamic = self.linear(mode, &cv.ffn_proj, &h);
                h = selector::conv(self, &h, &dynamic, &cv.ffn_base, 0);
                dynamic
            });
            let mut g = self.linear(mode, &l.gate, &h);
            let u = self.linear(mode, &l.up, &h);
            let act: fn(f32) -> f32 = match c.act {
                FfnActivation::Silu => silu,
                FfnActivation::Gelu => gelu_tanh,
            };
            g.iter_mut()
                .zip(&u)
                .for_each(|(gi, ui)| *gi = act(*gi) * ui);
            let mut m = self.linear(mode, &l.down, &g);
            if let (Some(cv), Some(dynamic)) = (&l.conv, &ffn_dyn) {
                m = selector::conv(self, &m, dynamic, &cv.ffn_base, 1);
            }
            if let Some(g) = &l.post_ffn_norm {
                rmsnorm(&mut m, d, Some(g), c.eps);
            }
            add(&mut x, &m);
            if let Some(s) = l.out_scale {
                x.iter_mut().for_each(|v| *v *= s);
            }
        }

        // Output norm (the selector's hidden state), LM head, DFlash2's logit
        // transforms, d2t scatter.
        rmsnorm(&mut x, d, Some(&self.output_norm), c.eps);
        let need = match self.selector {
            Some(_) => 0..b,
            None => rows.clone(),
        };
        let logits = self.head(target, &x[need.start * d..need.end * d]);
        let lattice = self
            .selector
            .as_ref()
            .map(|s| selector::lattice(self, s, &logits, &x, block[0], vocab));
        let logits = match self.selector {
            Some(_) => logits[rows.start * vocab..rows.end * vocab].to_vec(),
            None => logits,
        };
        Ok(DraftOutput { logits, lattice })
    }

    /// Writes the K/V of new context rows `hidden` ([n_new, n_taps · dim],
    /// the target's tapped rows, taps in file order) at positions
    /// `st.ctx_len..` and advances C by n_new (llama.cpp's embeddings-batch
    /// graph, dflash.cpp:608-675): `g = RMSNorm(fc · f) · enc.output_norm`,
    /// then per layer `K = RoPE(k_norm(W_k g))`, `V = W_v g`.
    pub fn inject(
        &self,
        target: &Model,
        st: &mut DflashState,
        hidden: &[f32],
    ) -> Result<(), DflashError> {
        let c = &self.config;
        let (d, hd, nkv) = (c.dim, c.head_dim, c.n_kv_heads);
        let width = self.hidden_width();
        if !hidden.len().is_multiple_of(width) {
            return Err(DflashError::Invalid(format!(
                "hidden rows of {} values are not multiples of {width}",
                hidden.len()
            )));
        }
        let n_new = hidden.len() / width;
        let c0 = st.ctx_len;
        if c0 + n_new > st.max_ctx {
            return Err(DflashError::Invalid(format!(
                "context position {} exceeds the draft cache of {}",
                c0 + n_new,
                st.max_ctx
            )));
        }
        if n_new == 0 {
            return Ok(());
        }
        let mode = target.activations();
        let mut g = self.linear(mode, &self.fc, hidden);
        rmsnorm(&mut g, d, Some(&self.hidden_norm), c.eps);
        for (li, l) in self.layers.iter().enumerate() {
            let (mut k, mut v) = self.kv(mode, l, &g);
            self.rope(&mut k, nkv, c0);
            let exact = target.numerics == Numerics::F32;
            f16_round(exact, &mut k);
            f16_round(exact, &mut v);
            let (ck, cv) = (&mut st.k[li], &mut st.v[li]);
            for r in 0..n_new {
                for h in 0..nkv {
                    let src = (r * nkv + h) * hd;
                    let dst = (h * st.max_ctx + c0 + r) * hd;
                    ck[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                    cv[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
                }
            }
        }
        st.ctx_len = c0 + n_new;
        Ok(())
    }

    fn qmat(&self, m: &Mat) -> QMatrix<'_> {
        QMatrix {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data: &self.file.raw_bytes()[m.range.clone()],
        }
    }

    /// LM head of normed rows `x` -> [n, target vocab].
    fn head(&self, target: &Model, x: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let mode = target.activations();
        let mut z = match &self.output {
            Some(o) => self.linear(mode, o, x),
            None => target.linear(&Pass::plain(), &target.output, x),
        };
        if self.selector.is_some() {
            if let Some(s) = c.logit_scale {
                z.iter_mut().for_each(|v| *v *= s);
            }
            if let Some(cap) = c.softcap {
                z.iter_mut()
                    .for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
            }
        }
        match &self.d2t {
            None => z,
            Some(map) => {
                let vocab = target.config.vocab_size;
                let n = z.len() / map.len();
                let mut full = vec![f32::NEG_INFINITY; n * vocab];
                for (row, out) in z.chunks_exact(map.len()).zip(full.chunks_exact_mut(vocab)) {
                    for (&v, &id) in row.iter().zip(map) {
                        out[id as usize] = v;
                    }
                }
                full
            }
        }
    }

    /// Attention of the B block queries of layer `li` over the context in
    /// the cache and the block's own keys, then nothing else (W_o is the
    /// caller's). Row t (position c1 + t) sees every context position on a
    /// full layer, those p with c1 + t − p < W on a sliding one, and every
    /// block row (only rows ≤ t when causal), in position order, with
    /// llama.cpp's f16 flash-attention rounding (`exact`: a plain f32
    /// softmax) and the sink logit (if any) in the denominator. Returns
    /// [B, n_heads · hd].
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        exact: bool,
        isa: RefIsa,
        li: usize,
        l: &DraftLayer,
        q: &[f32],
        kb: &[f32],
        vb: &[f32],
        st: &DflashState,
        c1: usize,
        b: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let group = nh / nkv;
        let (kc, vc, slots) = (&st.k[li], &st.v[li], st.max_ctx);
        let mut y = vec![0.0f32; b * nh * hd];
        for t in 0..b {
            let lo = match c.windows[li] {
                // c1 + t − p < W  <=>  p > c1 + t − W
                Some(w) => (c1 + t + 1).saturating_sub(w).min(c1),
                None => 0,
            };
            let n_blk = if c.causal { t + 1 } else { b };
            for h in 0..nh {
                let kvh = h / group;
                let qv = &q[(t * nh + h) * hd..][..hd];
                let key = |j: usize| -> &[f32] {
                    match j < c1 - lo {
                        true => &kc[(kvh * slots + lo + j) * hd..][..hd],
                        false => &kb[((j - (c1 - lo)) * nkv + kvh) * hd..][..hd],
                    }
                };
                let val = |j: usize| -> &[f32] {
                    match j < c1 - lo {
                        true => &vc[(kvh * slots + lo + j) * hd..][..hd],
                        false => &vb[((j - (c1 - lo)) * nkv + kvh) * hd..][..hd],
                    }
                };
                let keys = (0..c1 - lo + n_blk).map(|j| (key(j), val(j)));
                let sink = l.sinks.as_ref().map(|s| s[h]);
                let o = match exact {
                    false => f16_attend_row(qv, keys, c.attn_scale, sink, isa),
                    true => softmax_attend_row(qv, keys, c.attn_scale, sink),
                };
                y[(t * nh + h) * hd..][..hd].copy_from_slice(&o);
            }
        }
        y
    }
}
