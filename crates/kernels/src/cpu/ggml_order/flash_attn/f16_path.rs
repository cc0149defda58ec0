//! The f16 path (`flash_attn_ext_f16_one_chunk`): one key at a time, q
//! rounded to f16, Σ p·v kept in f16; and the split-KV form of one decode row.

use super::*;

/// One f16 flash-attention pass (`flash_attn_ext_f16_one_chunk`) over the
/// given positions in order, for query rows that share a KV head and the
/// positions they see: returns each row's (M, S, Σ p·v) with the sum
/// unnormalized. `qvs` are already rounded to f16. Each position's key and
/// value are converted once for all rows; every row's arithmetic is exactly
/// the one-row pass (rows only share the loads).
fn f16_chunk(
    qvs: &[Vec<f32>],
    src: &KvSource,
    positions: impl Iterator<Item = usize>,
    scale: f32,
    isa: RefIsa,
) -> Vec<(f32, f32, Vec<f32>)> {
    let hd = qvs[0].len();
    // Σ p·v is kept in f16 (as ggml keeps VKQ16): held here as f32 values
    // that are exactly f16, rounded after every update with the slice
    // conversions (vector F16C; the same round-to-nearest-even as one value
    // at a time).
    let mut acc = vec![vec![0.0f32; hd]; qvs.len()];
    let mut sum = vec![0.0f32; qvs.len()];
    let mut max = vec![f32::NEG_INFINITY; qvs.len()];
    // Positions go in blocks: first every row's scores against the block's
    // keys (independent dot products, which the core overlaps), then the
    // updates position by position (the rows' updates of one position are
    // independent of each other) — per row the same sequence of operations
    // as one position at a time.
    const BLOCK: usize = 16;
    // 64-byte aligned rows (a 64-byte vector load that splits cache lines
    // costs twice).
    let (mut kbuf, mut vbuf) = (vec![0.0f32; BLOCK * hd + 16], vec![0.0f32; BLOCK * hd + 16]);
    let (kb, vb) = (aligned_64(&mut kbuf), aligned_64(&mut vbuf));
    let mut scores = vec![0.0f32; qvs.len() * BLOCK];
    let mut block = [0usize; BLOCK];
    let mut positions = positions.peekable();
    while positions.peek().is_some() {
        let mut n = 0;
        for pos in positions.by_ref().take(BLOCK) {
            block[n] = pos;
            n += 1;
        }
        for (j, &pos) in block[..n].iter().enumerate() {
            src.load(pos, true, &mut kb[j * hd..(j + 1) * hd]);
            src.load(pos, false, &mut vb[j * hd..(j + 1) * hd]);
        }
        for (r, qv) in qvs.iter().enumerate() {
            for j in 0..n {
                scores[r * BLOCK + j] = dot_f16_isa(qv, &kb[j * hd..(j + 1) * hd], isa) * scale;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if avx512::usable(hd) {
            for (r, acc) in acc.iter_mut().enumerate() {
                let sc = &scores[r * BLOCK..r * BLOCK + n];
                // SAFETY: `usable` checked the CPU and the head dimension.
                unsafe { avx512::update_row(acc, vb, sc, &mut max[r], &mut sum[r]) };
            }
            continue;
        }
        for j in 0..n {
            for (r, acc) in acc.iter_mut().enumerate() {
                let sc = scores[r * BLOCK + j];
                let (mut ms, mut vs) = (1.0f32, 1.0f32);
                if sc > max[r] {
                    ms = (max[r] - sc).exp();
                    max[r] = sc;
                    scale_round_f16(acc, ms);
                } else {
                    vs = (sc - max[r]).exp();
                }
                fma_round_f16(acc, &vb[j * hd..(j + 1) * hd], vs);
                sum[r] = sum[r].mul_add(ms, vs);
            }
        }
    }
    acc.into_iter()
        .enumerate()
        .map(|(r, a)| (max[r], sum[r], a))
        .collect()
}

/// One query row of llama.cpp's f16 flash-attention path
/// (`flash_attn_ext_f16_one_chunk`) over `keys` and `values` visited in the
/// given order (already f16-valued), with an optional attention-sink logit
/// (applied after the keys, as ggml does on the first KV chunk): q rounded
/// to f16, scores by `ggml_vec_dot_f16` times `scale`, Σ p·v kept in f16,
/// sums in f32. Returns the head_dim outputs. For attention with masks the
/// cache-walking callers do not express (a drafter's non-causal block).
pub fn f16_attend_row<'a>(
    q: &[f32],
    kv: impl Iterator<Item = (&'a [f32], &'a [f32])>,
    scale: f32,
    sink: Option<f32>,
    isa: RefIsa,
) -> Vec<f32> {
    let q = round_f16(q);
    let hd = q.len();
    let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
    let mut acc = vec![0.0f32; hd];
    for (k, v) in kv {
        let sc = dot_f16_isa(&q, k, isa) * scale;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sc > m {
            ms = (m - sc).exp();
            m = sc;
            scale_round_f16(&mut acc, ms);
        } else {
            vs = (sc - m).exp();
        }
        fma_round_f16(&mut acc, v, vs);
        s = s.mul_add(ms, vs);
    }
    if let Some(sink) = sink {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sink > m {
            ms = (m - sink).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
        } else {
            vs = (sink - m).exp();
        }
        s = s.mul_add(ms, vs);
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    acc.iter_mut().for_each(|a| *a *= inv);
    acc
}

/// The f16 path for query rows (the heads of one token that share a KV head;
/// fewer than 64 rows in the batch, or a decode step over fewer than 512
/// cells): positions `lo..=qpos` in KV-cell order once positions `..=last`
/// are written (after a sliding ring wraps, a batch's later positions sit in
/// the first cells).
#[allow(clippy::too_many_arguments)]
pub(crate) fn f16_rows(
    qs: &[&[f32]],
    src: &KvSource,
    cells: Cells,
    last: usize,
    lo: usize,
    qpos: usize,
    scale: f32,
    isa: RefIsa,
    outs: &mut [&mut [f32]],
) {
    let qvs: Vec<Vec<f32>> = qs.iter().map(|q| round_f16(q)).collect();
    let positions = (0..cells.n_kv(last))
        .filter_map(|c| cells.pos(c, last))
        .filter(|&p| p >= lo && p <= qpos);
    for ((_, sum, acc), out) in f16_chunk(&qvs, src, positions, scale, isa)
        .into_iter()
        .zip(outs.iter_mut())
    {
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        out.iter_mut().zip(&acc).for_each(|(d, a)| *d = a * inv);
    }
}

/// Whether a decode step at `qpos` takes the split-KV path.
pub(crate) fn use_split_kv(cells: Cells, qpos: usize) -> bool {
    cells.n_kv(qpos) >= SPLIT_KV_MIN_CELLS
}

/// The split-KV decode path for query rows of one token sharing a KV head:
/// `n_kv` cells cut into `REF_THREADS` contiguous chunks, each an
/// [`f16_chunk`] over its valid cells, merged per row as
/// `acc = fma(acc, e^(M-M'), acc_c·e^(M_c-M'))`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn split_kv_rows(
    qs: &[&[f32]],
    src: &KvSource,
    cells: Cells,
    lo: usize,
    qpos: usize,
    scale: f32,
    isa: RefIsa,
    outs: &mut [&mut [f32]],
) {
    let qvs: Vec<Vec<f32>> = qs.iter().map(|q| round_f16(q)).collect();
    let n_kv = cells.n_kv(qpos);
    let chunk = n_kv.div_ceil(REF_THREADS);
    let hd = qs[0].len();
    let mut m = vec![f32::NEG_INFINITY; qs.len()];
    let mut s = vec![0.0f32; qs.len()];
    let mut acc = vec![vec![0.0f32; hd]; qs.len()];
    for c0 in (0..n_kv).step_by(chunk) {
        let positions = (c0..(c0 + chunk).min(n_kv))
            .filter_map(|c| cells.pos(c, qpos))
            .filter(|&p| p >= lo && p <= qpos);
        for (r, (mc, sc, vc)) in f16_chunk(&qvs, src, positions, scale, isa)
            .into_iter()
            .enumerate()
        {
            if sc == 0.0 {
                continue;
            }
            let mn = m[r].max(mc);
            let (so, sn) = ((m[r] - mn).exp(), (mc - mn).exp());
            acc[r]
                .iter_mut()
                .zip(&vc)
                .for_each(|(a, &v)| *a = a.mul_add(so, v * sn));
            s[r] = s[r].mul_add(so, sc * sn);
            m[r] = mn;
        }
    }
    for (r, out) in outs.iter_mut().enumerate() {
        let inv = if s[r] == 0.0 { 0.0 } else { 1.0 / s[r] };
        out.iter_mut().zip(&acc[r]).for_each(|(d, a)| *d = a * inv);
    }
}
