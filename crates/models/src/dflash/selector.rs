//! DFlash2's grouped dynamic causal convolution and candidate selector
//! (llama.cpp dflash.cpp:409-565, the walk speculative.cpp:1296-1322;
//! docs/muse-glimmer-llamacpp.md §2.4-2.5).

use hearth_kernels::cpu::ggml_order::half_dot::{dot_f32_tinyblas, vec_dot_f32_ggml};

use super::{DflashModel, Selector};

/// One convolution site over the block rows `x` ([B, dim], one block):
/// `out[t][c] = Σ_{k < min(K, B)} w_k(t)[c] · x[t − k][c]` (rows before the
/// block start read as zero), with the per-channel weight of tap k on side
/// `side` `base[side][k][c] + dynamic[t][group(c), k, side]`, `group(c) = c /
/// conv_group`. `dynamic` ([B, 2·K·groups], laid out group-fastest, then
/// tap, then side) comes from the pre-attention or pre-MLP normed input and
/// serves both sides. Taps are summed in order k = 0, 1, ...
pub(crate) fn conv(
    m: &DflashModel,
    x: &[f32],
    dynamic: &[f32],
    base: &[f32],
    side: usize,
) -> Vec<f32> {
    let c = &m.config;
    let d2 = c.dflash2.as_ref().expect("a DFlash2 layer");
    let (d, k_taps, g_size) = (c.dim, d2.conv_kernel, d2.conv_group);
    let n_groups = d / g_size;
    let b = x.len() / d;
    let proj = 2 * k_taps * n_groups;
    let mut out = vec![0.0f32; b * d];
    for t in 0..b {
        let dy = &dynamic[t * proj..(t + 1) * proj];
        let o = &mut out[t * d..(t + 1) * d];
        for k in 0..k_taps.min(b) {
            if k > t {
                // Left padding inside the block: a zero input adds +0.
                continue;
            }
            let xs = &x[(t - k) * d..(t - k + 1) * d];
            let bs = &base[(side * k_taps + k) * d..(side * k_taps + k + 1) * d];
            for ch in 0..d {
                let w = dy[(side * k_taps + k) * n_groups + ch / g_size] + bs[ch];
                let term = w * xs[ch];
                o[ch] = if k == 0 { term } else { o[ch] + term };
            }
        }
    }
    out
}

/// ggml's `top_k` over one row: the k largest (ties: lower id first), in
/// descending order with the first two swapped (ggml-cpu ops.cpp
/// top_k_f32: "emphasize that the order is not important"). The selector's
/// lattice stores candidates in this order, so its walk depends on it.
pub fn top_k_ggml(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    idx.select_nth_unstable_by(k.saturating_sub(1), |&a, &b| {
        row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
    });
    idx.truncate(k);
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    if k > 1 {
        idx.swap(0, 1);
    }
    idx
}

/// The selector lattice of a block, [B, dim]: row 0 all zeros; row t
/// (1 ≤ t < B) = `[cand_t as f32 (k values), score_t (k·k values,
/// predecessor-major: index p·k + c)]`, zero-padded to dim, where `cand_t` =
/// top-k of the draft logits `z_t`, and `score_t[p][c] = next[cand_t[c]] ·
/// (prev[pred_p] ⊙ gate_t) + z_t[cand_t[c]]` with `gate_t = selector_hidden ·
/// hidden_t`; the predecessors of row 1 are the anchor token (the one score
/// row repeated k times), of row t ≥ 2 the candidates of row t − 1.
/// `logits`: [B, vocab] (after logit scale and soft-cap); `hidden`: the
/// output-normed states [B, dim]. The products follow ggml's F32 matmul
/// kernels: the gates over the B rows and the scores of rows t ≥ 2 (four
/// predecessors) through llamafile's tinyBLAS, the single-predecessor scores
/// of row 1 through `ggml_vec_dot_f32`.
pub(crate) fn lattice(
    m: &DflashModel,
    s: &Selector,
    logits: &[f32],
    hidden: &[f32],
    anchor: u32,
    vocab: usize,
) -> Vec<f32> {
    let c = &m.config;
    let d2 = c.dflash2.as_ref().expect("a DFlash2 drafter");
    let (d, k, r) = (c.dim, d2.top_k, d2.selector_rank);
    let b = hidden.len() / d;
    let block = b.min(c.block_size);
    let mut out = vec![0.0f32; b * d];
    let mut prev_cands: Vec<u32> = Vec::new();
    for t in 1..block {
        let z = &logits[t * vocab..(t + 1) * vocab];
        let cand = top_k_ggml(z, k);
        let h = &hidden[t * d..(t + 1) * d];
        let gate: Vec<f32> = (0..r)
            .map(|i| dot_f32_tinyblas(&s.hidden[i * d..(i + 1) * d], h))
            .collect();
        let preds: Vec<u32> = if t == 1 {
            vec![anchor]
        } else {
            prev_cands.clone()
        };
        let row = &mut out[t * d..(t + 1) * d];
        for (ci, &id) in cand.iter().enumerate() {
            row[ci] = id as f32;
        }
        for p in 0..k {
            let pred = preds[if preds.len() == 1 { 0 } else { p }] as usize;
            let cond: Vec<f32> = (0..r).map(|i| s.prev[pred * r + i] * gate[i]).collect();
            for (ci, &id) in cand.iter().enumerate() {
                let next = &s.next[id as usize * r..(id as usize + 1) * r];
                let dot = match preds.len() {
                    1 => vec_dot_f32_ggml(next, &cond),
                    _ => dot_f32_tinyblas(next, &cond),
                };
                row[k + p * k + ci] = dot + z[id as usize];
            }
        }
        prev_cands = cand;
    }
    out
}

/// The greedy walk of a lattice (`top_k` = k, rows of `dim` values): from
/// predecessor 0, each row t = 1.. picks the best-scoring candidate given the
/// previous pick (first maximum) and emits it; at most `n` tokens.
pub fn walk_lattice(lattice: &[f32], dim: usize, k: usize, n: usize) -> Vec<u32> {
    let mut pred = 0usize;
    let mut out = Vec::new();
    for row in lattice.chunks_exact(dim).skip(1) {
        if out.len() == n {
            break;
        }
        let scores = &row[k + pred * k..k + pred * k + k];
        let mut best = 0;
        for (i, &v) in scores.iter().enumerate() {
            if v > scores[best] {
                best = i;
            }
        }
        pred = best;
        out.push(row[pred] as u32);
    }
    out
}

impl DflashModel {
    /// Draft tokens from a forward's output: the lattice walk (DFlash2) or
    /// each row's argmax (DFlash1, rows 1.. of the block as returned by a
    /// forward whose `rows` started at 1), at most `n`.
    pub fn draft_tokens(&self, out: &super::DraftOutput, vocab: usize, n: usize) -> Vec<u32> {
        match (&out.lattice, &self.config.dflash2) {
            (Some(l), Some(d2)) => walk_lattice(l, self.config.dim, d2.top_k, n),
            _ => out
                .logits
                .chunks_exact(vocab)
                .take(n)
                .map(|row| {
                    let mut best = 0;
                    for (i, &v) in row.iter().enumerate() {
                        if v > row[best] {
                            best = i;
                        }
                    }
                    best as u32
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_order_is_ggmls() {
        let row = [0.5, 3.0, -1.0, 2.0, 3.0, 1.0];
        // Descending with ties by id: 1, 4, 3, 5; then the first two swapped.
        assert_eq!(top_k_ggml(&row, 4), [4, 1, 3, 5]);
        assert_eq!(top_k_ggml(&row, 1), [1]);
    }

    #[test]
    fn walk_follows_the_predecessor_columns() {
        // k = 2, dim = 6: row = [c0, c1, s(p0,c0), s(p0,c1), s(p1,c0), s(p1,c1)].
        let lattice = [
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, // row 0
            10.0, 11.0, 1.0, 2.0, 1.0, 2.0, // row 1: pick c1 (11)
            20.0, 21.0, 9.0, 0.0, 0.0, 5.0, // row 2 given p=1: pick c1 (21), not c0
            30.0, 31.0, 3.0, 3.0, 0.0, 0.0, // row 3 given p=1: tie -> first (30)
        ];
        assert_eq!(walk_lattice(&lattice, 6, 2, 8), [11, 21, 30]);
        assert_eq!(walk_lattice(&lattice, 6, 2, 2), [11, 21]);
    }
}
