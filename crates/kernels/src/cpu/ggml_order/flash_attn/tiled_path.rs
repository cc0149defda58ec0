//! The tiled f32 path (`flash_attn_ext_tiled`, 64+ query rows), and the
//! vision towers' cache-less attention over segments.

use super::*;

/// The tiled f32 path (`flash_attn_ext_tiled`) for a set of query rows that
/// share one KV head: q stays f32; per tile of 64 cells, scores are
/// sequential fma chains over the head dimension times `scale`; the running
/// max M moves once per tile (rescaling Σ p·v and S by libm `expf`); p =
/// ggml's vector exp of s - M (the build's, `isa`), summed per vector of the
/// build's width (16 lanes: halving tree; 8: its SSE reduction) into an f64
/// tile sum added to S; Σ p·v is a sequential fma chain over the cells.
///
/// Each tile's keys and values are converted once for all rows; the 64
/// scores of a row are computed side by side (one fma chain per lane, the
/// same chain as one score at a time). `rows[i] = (qrow, qpos, lo)`: the
/// query (head_dim values), its position and the first position it sees.
/// Returns the outputs, `rows.len() × head_dim`.
pub(crate) fn tiled_rows(
    rows: &[(&[f32], usize, usize)],
    src: &KvSource,
    cells: Cells,
    last: usize,
    scale: f32,
    isa: RefIsa,
) -> Vec<f32> {
    let kv = CacheCells { src, cells, last };
    tiled_rows_in(rows, &kv, scale, isa, true)
}

/// What the tiled path walks: KV cells in order, each holding a position
/// (or nothing), whose key and value rows it loads.
pub(super) trait TileCells {
    fn head_dim(&self) -> usize;
    /// Cells attended over (`nek1`).
    fn n_kv(&self) -> usize;
    /// The position cell `c` holds.
    fn pos(&self, c: usize) -> Option<usize>;
    /// The key (`key`) or value row of position `pos`, as f32.
    fn load(&self, pos: usize, key: bool, out: &mut [f32]);
}

/// An f16 KV cache after positions `..=last` were written.
struct CacheCells<'a, 'b> {
    src: &'a KvSource<'b>,
    cells: Cells,
    last: usize,
}

impl TileCells for CacheCells<'_, '_> {
    fn head_dim(&self) -> usize {
        self.src.hd()
    }
    fn n_kv(&self) -> usize {
        self.cells.n_kv(self.last)
    }
    fn pos(&self, c: usize) -> Option<usize> {
        self.cells.pos(c, self.last)
    }
    fn load(&self, pos: usize, key: bool, out: &mut [f32]) {
        self.src.load(pos, key, out)
    }
}

/// [`tiled_rows`] over any [`TileCells`]; `fast`: on the AVX-512 tile where
/// it applies (the same bits; false only to test it against this one).
pub(super) fn tiled_rows_in(
    rows: &[(&[f32], usize, usize)],
    src: &impl TileCells,
    scale: f32,
    isa: RefIsa,
    fast: bool,
) -> Vec<f32> {
    let hd = src.head_dim();
    #[cfg(target_arch = "x86_64")]
    if fast && crate::cpu::ggml_order::flash_tile_avx512::usable(hd, isa) {
        // SAFETY: the features were detected.
        return unsafe { tiled_rows_avx512(rows, src, scale) };
    }
    let _ = fast;
    let n_kv = src.n_kv();
    let mut vkq = vec![0.0f32; rows.len() * hd];
    let mut ms = vec![(f32::NEG_INFINITY, 0.0f32); rows.len()];
    let mut kt = vec![0.0f32; hd * KV_TILE];
    let mut vt = vec![0.0f32; KV_TILE * hd];
    let mut kbuf = vec![0.0f32; hd];
    let mut tile_pos = [None::<usize>; KV_TILE];
    let max_qpos = rows.iter().map(|r| r.1).max().unwrap_or(0);
    let min_lo = rows.iter().map(|r| r.2).min().unwrap_or(0);
    for c0 in (0..n_kv).step_by(KV_TILE) {
        let mut any = false;
        for (i, tp) in tile_pos.iter_mut().enumerate() {
            *tp = (c0 + i < n_kv)
                .then(|| src.pos(c0 + i))
                .flatten()
                .filter(|&p| p >= min_lo && p <= max_qpos);
            if let Some(p) = *tp {
                any = true;
                src.load(p, true, &mut kbuf);
                for (d, &k) in kbuf.iter().enumerate() {
                    kt[d * KV_TILE + i] = k;
                }
                src.load(p, false, &mut vt[i * hd..(i + 1) * hd]);
            }
        }
        if !any {
            continue;
        }
        // Two query rows at a time: each key (value) row loaded once feeds
        // both rows' accumulators, which also gives the fma units twice the
        // independent chains. Every score and output value is still the
        // same sequential chain as one row at a time.
        let mut ri = 0;
        while ri < rows.len() {
            if ri + 1 < rows.len() {
                let (o0, o1) = vkq[ri * hd..(ri + 2) * hd].split_at_mut(hd);
                let (m0, m1) = ms[ri..ri + 2].split_at_mut(1);
                tile_rows::<2>(
                    [rows[ri], rows[ri + 1]],
                    [&mut m0[0], &mut m1[0]],
                    [o0, o1],
                    &kt,
                    &vt,
                    &tile_pos,
                    scale,
                    isa,
                );
                ri += 2;
            } else {
                let o0 = &mut vkq[ri * hd..(ri + 1) * hd];
                tile_rows::<1>(
                    [rows[ri]],
                    [&mut ms[ri]],
                    [o0],
                    &kt,
                    &vt,
                    &tile_pos,
                    scale,
                    isa,
                );
                ri += 1;
            }
        }
    }
    for (out, &(_, s)) in vkq.chunks_exact_mut(hd).zip(&ms) {
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        out.iter_mut().for_each(|a| *a *= inv);
    }
    vkq
}

/// [`tiled_rows_in`] with each tile's keys transposed and its rows computed
/// on AVX-512 registers ([`crate::cpu::ggml_order::flash_tile_avx512`]), the same walk.
///
/// # Safety
/// `flash_tile_avx512::usable` is true for this head dimension.
#[cfg(target_arch = "x86_64")]
unsafe fn tiled_rows_avx512(
    rows: &[(&[f32], usize, usize)],
    src: &impl TileCells,
    scale: f32,
) -> Vec<f32> {
    use crate::cpu::ggml_order::flash_tile_avx512::{tile_rows, transpose_keys};
    let hd = src.head_dim();
    let n_kv = src.n_kv();
    let mut vkq = vec![0.0f32; rows.len() * hd];
    let mut ms = vec![(f32::NEG_INFINITY, 0.0f32); rows.len()];
    let mut kr = vec![0.0f32; KV_TILE * hd];
    let mut kt = vec![0.0f32; hd * KV_TILE];
    let mut vt = vec![0.0f32; KV_TILE * hd];
    let mut tile_pos = [None::<usize>; KV_TILE];
    let max_qpos = rows.iter().map(|r| r.1).max().unwrap_or(0);
    let min_lo = rows.iter().map(|r| r.2).min().unwrap_or(0);
    for c0 in (0..n_kv).step_by(KV_TILE) {
        let mut any = false;
        for (i, tp) in tile_pos.iter_mut().enumerate() {
            *tp = (c0 + i < n_kv)
                .then(|| src.pos(c0 + i))
                .flatten()
                .filter(|&p| p >= min_lo && p <= max_qpos);
            if let Some(p) = *tp {
                any = true;
                src.load(p, true, &mut kr[i * hd..(i + 1) * hd]);
                src.load(p, false, &mut vt[i * hd..(i + 1) * hd]);
            }
        }
        if !any {
            continue;
        }
        transpose_keys(&kr, hd, &mut kt);
        let mut ri = 0;
        while ri < rows.len() {
            if ri + 1 < rows.len() {
                let (o0, o1) = vkq[ri * hd..(ri + 2) * hd].split_at_mut(hd);
                let (m0, m1) = ms[ri..ri + 2].split_at_mut(1);
                tile_rows::<2>(
                    [rows[ri], rows[ri + 1]],
                    [&mut m0[0], &mut m1[0]],
                    [o0, o1],
                    &kt,
                    &vt,
                    &tile_pos,
                    scale,
                );
                ri += 2;
            } else {
                let o0 = &mut vkq[ri * hd..(ri + 1) * hd];
                tile_rows::<1>([rows[ri]], [&mut ms[ri]], [o0], &kt, &vt, &tile_pos, scale);
                ri += 1;
            }
        }
    }
    for (out, &(_, s)) in vkq.chunks_exact_mut(hd).zip(&ms) {
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        out.iter_mut().for_each(|a| *a *= inv);
    }
    vkq
}

/// One tile of [`tiled_rows_in`] for `N` query rows `(q, qpos, lo)`, with
/// their running (max, sum) and outputs: scores, masking, the online softmax
/// and Σ p·v, each row exactly as on its own. A row that sees no cell of the
/// tile is left as it was.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile_rows<const N: usize>(
    rows: [(&[f32], usize, usize); N],
    ms: [&mut (f32, f32); N],
    outs: [&mut [f32]; N],
    kt: &[f32],
    vt: &[f32],
    tile_pos: &[Option<usize>; KV_TILE],
    scale: f32,
    isa: RefIsa,
) {
    let hd = rows[0].0.len();
    let valid: [[bool; KV_TILE]; N] = std::array::from_fn(|r| {
        let (_, qpos, lo) = rows[r];
        std::array::from_fn(|i| tile_pos[i].is_some_and(|p| p >= lo && p <= qpos))
    });
    let live: [bool; N] = std::array::from_fn(|r| valid[r].iter().any(|&v| v));
    if !live.iter().any(|&l| l) {
        return;
    }
    // 32 keys at a time, so the accumulators stay in registers.
    let mut kq = [[0.0f32; KV_TILE]; N];
    for kb in 0..KV_TILE / 32 {
        let mut a = [[0.0f32; 32]; N];
        for d in 0..hd {
            let krow: &[f32; 32] = kt[d * KV_TILE + 32 * kb..][..32].try_into().unwrap();
            for r in 0..N {
                let qd = rows[r].0[d];
                for j in 0..32 {
                    a[r][j] = qd.mul_add(krow[j], a[r][j]);
                }
            }
        }
        for r in 0..N {
            kq[r][32 * kb..32 * (kb + 1)].copy_from_slice(&a[r]);
        }
    }
    for r in 0..N {
        let kq = &mut kq[r];
        if !live[r] {
            // No cell of this tile for this row: nothing changes.
            kq.fill(0.0);
            continue;
        }
        for (score, &ok) in kq.iter_mut().zip(&valid[r]) {
            *score = if ok {
                *score * scale
            } else {
                f32::NEG_INFINITY
            };
        }
        let (m, s) = &mut *ms[r];
        let out = &mut *outs[r];
        let tile_max = kq
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        let mn = m.max(tile_max);
        if mn > *m {
            let scale_old = (*m - mn).exp();
            out.iter_mut().for_each(|v| *v *= scale_old);
            *s *= scale_old;
        }
        *m = mn;
        // ggml_vec_soft_max_f32: whole vectors of the build's width, each
        // vector's sum in its own reduction order.
        let mut tile_sum = 0.0f64;
        let width = isa.lanes();
        for group in kq.chunks_exact_mut(width) {
            for x in group.iter_mut() {
                *x = isa.expf_v(*x - *m);
            }
            tile_sum += match isa {
                RefIsa::Avx512 => reduce_add_16(group.try_into().expect("16 lanes")),
                // hi + lo halves, then (w0 + w2) + (w1 + w3).
                RefIsa::Avx2 => {
                    let w: [f32; 4] = std::array::from_fn(|i| group[i + 4] + group[i]);
                    (w[0] + w[2]) + (w[1] + w[3])
                }
            } as f64;
        }
        *s = (*s as f64 + tile_sum) as f32;
    }
    // Σ p·v, 32 output values at a time over all cells (each value's chain
    // still runs over the cells in order; a zero p adds nothing, as in
    // ggml, so it is skipped).
    let whole = hd - hd % 32;
    for dc in (0..whole).step_by(32) {
        let mut a: [[f32; 32]; N] =
            std::array::from_fn(|r| outs[r][dc..dc + 32].try_into().unwrap());
        for i in 0..KV_TILE {
            let v: &[f32; 32] = vt[i * hd + dc..][..32].try_into().unwrap();
            for r in 0..N {
                let p = kq[r][i];
                if p != 0.0 {
                    for j in 0..32 {
                        a[r][j] = p.mul_add(v[j], a[r][j]);
                    }
                }
            }
        }
        for r in 0..N {
            outs[r][dc..dc + 32].copy_from_slice(&a[r]);
        }
    }
    if whole < hd {
        for r in 0..N {
            for (i, &p) in kq[r].iter().enumerate() {
                if p != 0.0 {
                    outs[r][whole..]
                        .iter_mut()
                        .zip(&vt[i * hd + whole..(i + 1) * hd])
                        .for_each(|(a, &v)| *a = p.mul_add(v, *a));
                }
            }
        }
    }
}

/// One KV head of a batch's own f16-valued K and V (`[n, n_head·head_dim]`):
/// cell `c` holds position `c`.
pub(super) struct BatchHead<'a> {
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) n: usize,
    pub(super) width: usize,
    pub(super) head: usize,
    pub(super) hd: usize,
}

impl TileCells for BatchHead<'_> {
    fn head_dim(&self) -> usize {
        self.hd
    }
    fn n_kv(&self) -> usize {
        self.n
    }
    fn pos(&self, c: usize) -> Option<usize> {
        Some(c)
    }
    fn load(&self, pos: usize, key: bool, out: &mut [f32]) {
        let src = if key { self.k } else { self.v };
        let off = pos * self.width + self.head * self.hd;
        out.copy_from_slice(&src[off..off + self.hd]);
    }
}

/// Query rows per task of [`attend_segments`].
const SEGMENT_TASK_ROWS: usize = 64;

/// llama.cpp's CPU `ggml_flash_attn_ext` as its vision towers call it
/// (clip.cpp `build_attn` with flash attention on, mtmd's default on the
/// CPU): one batch of `n` tokens and no cache, q/k/v `[n, n_head·head_dim]`
/// f32, K and V cast to f16, and an f16 block-diagonal mask that lets a
/// token see the keys of its own segment (`segments` partition `0..n` in
/// order; one segment of everything for global attention). Fewer than 64
/// tokens take the one-key-at-a-time f16 path ([`f16_attend_row`]: q rounded
/// to f16, Σ p·v kept in f16), 64 or more the tiled f32 path. Keys are
/// visited in order, masked ones skipped. `out`: `[n, n_head·head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_segments(
    pool: &crate::pool::ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    n_head: usize,
    head_dim: usize,
    segments: &[std::ops::Range<usize>],
    scale: f32,
    isa: RefIsa,
    out: &mut [f32],
) {
    let width = n_head * head_dim;
    assert!(q.len() == n * width && k.len() == n * width && v.len() == n * width);
    assert_eq!(out.len(), n * width);
    let (k16, v16) = (round_f16(k), round_f16(v));
    // segment of each token
    let mut seg_of = vec![0..0; n];
    for seg in segments {
        for t in seg.clone() {
            seg_of[t] = seg.clone();
        }
    }
    assert!(seg_of.iter().all(|s| !s.is_empty()), "segments cover 0..n");
    let tasks: Vec<(usize, usize)> = (0..n_head)
        .flat_map(|h| (0..n).step_by(SEGMENT_TASK_ROWS).map(move |r| (h, r)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outp = crate::pool::SendPtr(out.as_mut_ptr());
    pool.run(|_, _| loop {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(&(h, r0)) = tasks.get(i) else {
            break;
        };
        let rows = r0..(r0 + SEGMENT_TASK_ROWS).min(n);
        let head = |t: usize| t * width + h * head_dim..t * width + (h + 1) * head_dim;
        let results: Vec<Vec<f32>> = if n >= TILED_MIN_ROWS {
            let src = BatchHead {
                k: &k16,
                v: &v16,
                n,
                width,
                head: h,
                hd: head_dim,
            };
            let qs: Vec<(&[f32], usize, usize)> = rows
                .clone()
                .map(|t| (&q[head(t)], seg_of[t].end - 1, seg_of[t].start))
                .collect();
            tiled_rows_in(&qs, &src, scale, isa, true)
                .chunks_exact(head_dim)
                .map(<[f32]>::to_vec)
                .collect()
        } else {
            rows.clone()
                .map(|t| {
                    let kv = seg_of[t].clone().map(|j| (&k16[head(j)], &v16[head(j)]));
                    f16_attend_row(&q[head(t)], kv, scale, None, isa)
                })
                .collect()
        };
        for (t, row) in rows.zip(results) {
            // SAFETY: tasks write disjoint (token, head) slices of `out`.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(outp.get().add(t * width + h * head_dim), head_dim)
            };
            dst.copy_from_slice(&row);
        }
    });
}
