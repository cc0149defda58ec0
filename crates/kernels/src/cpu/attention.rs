//! CPU attention over the hybrid KV cache: causal attention for a chunk of
//! new tokens, old keys read from the cache in place (flat or ring), the
//! chunk's own keys from the fresh rows. An f16 cache follows llama.cpp's CPU
//! flash-attention rounding ([`super::ggml_order::flash_attn`]); bf16 and f32
//! caches use the plain softmax below.

use half::f16;
use rayon::prelude::*;

use super::ggml_order::flash_attn as fa;
use super::kv_cache::{KvData, KvElem, LayerKvCache};
use super::RowOrder;

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier on q·k.
    pub scale: f32,
    /// Which llama.cpp x86 build's vector arithmetic the f16 path follows.
    pub isa: super::ggml_order::activations::RefIsa,
}

/// Causal attention for a chunk of `T` new tokens at positions `p0..p0+T`.
///
/// `q`: [T, n_heads, head_dim] (already normed/rotated); `k_new`, `v_new`:
/// [T, n_kv_heads, head_dim], already rounded to the cache precision. Keys
/// older than `p0` are read from `cache` in place (ring or flat); the chunk's
/// own keys from `k_new`/`v_new`. Query head h uses KV head h / (n_heads /
/// n_kv_heads). Writes [T, n_heads, head_dim] into `out`. With
/// [`RowOrder::Invariant`] every row is computed as a one-token call would.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    p0: usize,
    s: AttnShape,
    order: RowOrder,
    out: &mut [f32],
) {
    match &cache.data {
        KvData::F16 { k, v } => {
            attention_f16_flash(q, k_new, v_new, cache, k, v, p0, s, order, out)
        }
        KvData::Bf16 { k, v } => attention_in(q, k_new, v_new, cache, k, v, p0, s, out),
        KvData::F32 { k, v } => attention_in(q, k_new, v_new, cache, k, v, p0, s, out),
        KvData::Rows { k, v } => attention_rows(q, k_new, v_new, cache, k, v, p0, s, out),
    }
}

/// Attention over a cache with a block-quantized K or V, as llama.cpp's CPU
/// flash attention computes it ([`fa::quant_rows`]); the chunk's own rows
/// are encoded in the cache's types first, as llama.cpp writes them into
/// its cache before attending. Every row is computed as a one-row pass
/// would (this path has no batch-dependent variant).
#[allow(clippy::too_many_arguments)]
fn attention_rows(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    kc: &[u8],
    vc: &[u8],
    p0: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let encode = |x: &[f32], t: super::kv_cache::KvDtype| -> Vec<u8> {
        let rb = t.bytes_for(hd);
        let mut bytes = vec![0u8; x.len() / hd * rb];
        for (row, o) in x.chunks_exact(hd).zip(bytes.chunks_exact_mut(rb)) {
            super::kv_cache::encode_row(t, row, o);
        }
        bytes
    };
    let (kn, vn) = (encode(k_new, cache.types.k), encode(v_new, cache.types.v));
    let t_len = q.len() / (s.n_heads * hd);
    let cells = fa::Cells::of(cache);
    for_each_head_group(q, s, out, |t, kvh, qs, outs| {
        let src = fa::RowSource {
            k_new: &kn,
            v_new: &vn,
            kc,
            vc,
            cache,
            p0,
            kvh,
        };
        let qpos = p0 + t;
        let lo = cache.window_start(qpos);
        fa::quant_rows(
            qs,
            &src,
            cells,
            p0 + t_len - 1,
            lo,
            qpos,
            s.scale,
            s.isa,
            outs,
        );
    });
}

/// Runs `f(t, kvh, queries, outputs)` on the pool for every token `t` and KV
/// head `kvh` of a chunk, with the query heads that share `kvh` (a group is
/// cut into parts only when there are fewer groups than threads).
fn for_each_head_group(
    q: &[f32],
    s: AttnShape,
    out: &mut [f32],
    f: impl Fn(usize, usize, &[&[f32]], &mut [&mut [f32]]) + Sync,
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let t_len = q.len() / (s.n_heads * hd);
    let pool = crate::pool::global();
    let groups = t_len * s.n_kv_heads;
    let parts = pool.n_threads().div_ceil(groups).clamp(1, group);
    let per_part = group.div_ceil(parts);
    let items = groups * parts;
    let out_ptr = crate::pool::SendPtr(out.as_mut_ptr());
    pool.run(|i, n| {
        for item in crate::pool::share(items, i, n) {
            let (g, part) = (item / parts, item % parts);
            let (t, kvh) = (g / s.n_kv_heads, g % s.n_kv_heads);
            let first = kvh * group + part * per_part;
            let heads = first..(first + per_part).min((kvh + 1) * group);
            if heads.is_empty() {
                continue;
            }
            // SAFETY: the rows of (t, heads) are written by this thread only.
            let mut outs: Vec<&mut [f32]> = heads
                .clone()
                .map(|h| unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get().add((t * s.n_heads + h) * hd), hd)
                })
                .collect();
            let qs: Vec<&[f32]> = heads
                .map(|h| &q[(t * s.n_heads + h) * hd..][..hd])
                .collect();
            f(t, kvh, &qs, &mut outs);
        }
    });
}

#[allow(clippy::too_many_arguments)]
fn attention_in<E: KvElem>(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    kc: &[E],
    vc: &[E],
    p0: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let dtype = cache.types.k;
    let kv_row = s.n_kv_heads * hd;
    // One work item per (token, head): [T * n_heads] rows of head_dim.
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / s.n_heads, idx % s.n_heads);
        let kvh = h / group;
        let qpos = p0 + t;
        // The reference kernels read q in the cache's precision.
        let qv: Vec<f32> = q[idx * hd..(idx + 1) * hd]
            .iter()
            .map(|&x| dtype.round(x))
            .collect();
        let lo = cache.window_start(qpos);
        let mut scores = Vec::with_capacity(qpos + 1 - lo);
        let mut max = f32::NEG_INFINITY;
        // The hot loop: q·k over the window, old keys from the cache in place.
        for pos in lo..=qpos {
            let dot: f32 = if pos >= p0 {
                let off = (pos - p0) * kv_row + kvh * hd;
                qv.iter()
                    .zip(&k_new[off..off + hd])
                    .map(|(a, b)| a * b)
                    .sum()
            } else {
                let off = cache.row_offset(kvh, pos);
                qv.iter()
                    .zip(&kc[off..off + hd])
                    .map(|(a, b)| a * b.to_f32())
                    .sum()
            };
            let sc = dot * s.scale;
            max = max.max(sc);
            scores.push(sc);
        }
        let mut sum = 0.0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        o.fill(0.0);
        for (i, pos) in (lo..=qpos).enumerate() {
            let p = scores[i] / sum;
            if pos >= p0 {
                let off = (pos - p0) * kv_row + kvh * hd;
                o.iter_mut()
                    .zip(&v_new[off..off + hd])
                    .for_each(|(acc, b)| *acc += p * b);
            } else {
                let off = cache.row_offset(kvh, pos);
                o.iter_mut()
                    .zip(&vc[off..off + hd])
                    .for_each(|(acc, b)| *acc += p * b.to_f32());
            }
        }
    });
}

/// Attention over an f16 cache with llama.cpp's CPU flash-attention rounding:
/// the f16 path, the split-KV decode path or the tiled f32 path, chosen as
/// llama.cpp chooses them (see [`fa`]). Same shapes as [`attention`].
#[allow(clippy::too_many_arguments)]
fn attention_f16_flash(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    kc: &[f16],
    vc: &[f16],
    p0: usize,
    s: AttnShape,
    order: RowOrder,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let t_len = q.len() / (s.n_heads * hd);
    let cells = fa::Cells::of(cache);
    let kv_row = s.n_kv_heads * hd;
    let source = |kvh: usize| fa::KvSource {
        k_new,
        v_new,
        kc,
        vc,
        cache,
        p0,
        kv_row,
        kvh,
    };
    let invariant = order == RowOrder::Invariant;
    if t_len >= fa::TILED_MIN_ROWS && !invariant {
        // Rows sharing a KV head go together (its tiles are converted once),
        // in chunks so that both threads have work.
        const ROWS_PER_TASK: usize = 32;
        let tasks: Vec<(usize, Vec<usize>)> = (0..s.n_kv_heads)
            .flat_map(|kvh| {
                let idx: Vec<usize> = (0..t_len)
                    .flat_map(|t| (kvh * group..(kvh + 1) * group).map(move |h| t * s.n_heads + h))
                    .collect();
                idx.chunks(ROWS_PER_TASK)
                    .map(|c| (kvh, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Tasks are taken dynamically by the threads of the forward pass's pool.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<Vec<f32>>> =
            tasks.iter().map(|_| Default::default()).collect();
        crate::pool::global().run(|_, _| loop {
            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((kvh, idx)) = tasks.get(k) else {
                break;
            };
            let rows: Vec<(&[f32], usize, usize)> = idx
                .iter()
                .map(|&i| {
                    let qpos = p0 + i / s.n_heads;
                    (&q[i * hd..(i + 1) * hd], qpos, cache.window_start(qpos))
                })
                .collect();
            *slots[k].lock().unwrap() =
                fa::tiled_rows(&rows, &source(*kvh), cells, p0 + t_len - 1, s.scale, s.isa);
        });
        let results: Vec<Vec<f32>> = slots.into_iter().map(|m| m.into_inner().unwrap()).collect();
        for ((_, idx), res) in tasks.iter().zip(&results) {
            for (&i, row) in idx.iter().zip(res.chunks_exact(hd)) {
                out[i * hd..(i + 1) * hd].copy_from_slice(row);
            }
        }
        return;
    }
    // One work item per (token, KV head, part of its heads): the heads of a
    // token that share a KV head read each key and value once.
    for_each_head_group(q, s, out, |t, kvh, qs, outs| {
        let src = source(kvh);
        let qpos = p0 + t;
        let lo = cache.window_start(qpos);
        if (t_len == 1 || invariant) && fa::use_split_kv(cells, qpos) {
            fa::split_kv_rows(qs, &src, cells, lo, qpos, s.scale, s.isa, outs);
        } else {
            fa::f16_rows(
                qs,
                &src,
                cells,
                p0 + t_len - 1,
                lo,
                qpos,
                s.scale,
                s.isa,
                outs,
            );
        }
    });
}
