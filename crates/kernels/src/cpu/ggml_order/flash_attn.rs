//! Attention over an f16 KV cache with the rounding of llama.cpp's CPU flash
//! attention (ggml-cpu ops.cpp), which takes one of three paths:
//! - fewer than 64 query rows: one key at a time, q rounded to f16, the
//!   running Σ p·v kept in f16 ([`f16_chunk`]);
//! - one query row against 512+ KV cells: the cells split in two halves (one
//!   per thread, `n_threads = 2`), each half an [`f16_chunk`], merged
//!   ([`split_kv_row`]);
//! - 64+ query rows: f32 tiles of 64 KV cells with an online softmax per tile
//!   ([`tiled_row`]).
//!
//! Keys are visited in KV-cell order. llama.cpp pads the number of cells it
//! attends over (`n_kv`) to a multiple of 256; masked cells contribute
//! nothing, but the padding decides where the split-KV halves start.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::activations::RefIsa;
use super::half_dot::{dot_f16_isa, reduce_add_16};
use super::vec_dot::quantize_row_q8_0_x86;
use crate::cpu::kv_cache::{decode_row, CacheLayout, KvDtype, LayerKvCache};
use crate::quant::blocks::{as_blocks, BlockQ4_0, BlockQ8_0, QK};

/// KV cells per tile of the tiled path (`GGML_FA_TILE_KV`).
const KV_TILE: usize = 64;
/// Query rows from which llama.cpp takes the tiled path (`GGML_FA_TILE_Q`).
pub(crate) const TILED_MIN_ROWS: usize = 64;
/// KV cells from which single-row decode takes the split-KV path.
const SPLIT_KV_MIN_CELLS: usize = 512;
/// Threads the reference runs with (the split-KV path makes one chunk per thread).
const REF_THREADS: usize = 2;
/// llama.cpp's micro-batch, which sizes its sliding-window cache.
const REF_UBATCH: usize = 512;

/// Where the keys and values of one KV head come from: the chunk's own rows
/// (positions `p0..`, already rounded to f16) or the cache.
pub(crate) struct KvSource<'a> {
    pub k_new: &'a [f32],
    pub v_new: &'a [f32],
    pub kc: &'a [f16],
    pub vc: &'a [f16],
    pub cache: &'a LayerKvCache,
    pub p0: usize,
    /// Width of one token's K or V row: n_kv_heads * head_dim.
    pub kv_row: usize,
    pub kvh: usize,
}

impl KvSource<'_> {
    fn hd(&self) -> usize {
        self.kv_row / self.cache.n_kv_heads
    }

    fn load(&self, pos: usize, key: bool, out: &mut [f32]) {
        let hd = out.len();
        if pos >= self.p0 {
            let off = (pos - self.p0) * self.kv_row + self.kvh * hd;
            let src = if key { self.k_new } else { self.v_new };
            out.copy_from_slice(&src[off..off + hd]);
        } else {
            let off = self.cache.row_offset(self.kvh, pos);
            let src = if key { self.kc } else { self.vc };
            src[off..off + hd].convert_to_f32_slice(out);
        }
    }
}

/// llama.cpp's KV cells for one layer: how many there are, and which position
/// each holds after positions `..=last` were written.
#[derive(Clone, Copy)]
pub(crate) struct Cells {
    /// Cells the cache has (sliding-window caches are small rings).
    size: Option<usize>,
}

impl Cells {
    pub(crate) fn of(cache: &LayerKvCache) -> Self {
        match cache.layout {
            CacheLayout::Flat => Cells { size: None },
            // llama.cpp sizes a sliding-window cache as window + ubatch, padded to 256.
            CacheLayout::Ring { window } => Cells {
                size: Some((window + REF_UBATCH).next_multiple_of(256)),
            },
        }
    }

    /// Cells attended over (`get_n_kv`): the used cells padded to 256.
    fn n_kv(&self, last: usize) -> usize {
        let used = match self.size {
            Some(size) if last + 1 > size => size,
            _ => last + 1,
        };
        let n = used.next_multiple_of(256).max(256);
        self.size.map_or(n, |s| n.min(s))
    }

    /// The position cell `c` holds once positions `..=last` are written
    /// (a ring reuses cells in order; this is a model of llama.cpp's slot search).
    fn pos(&self, c: usize, last: usize) -> Option<usize> {
        match self.size {
            None => (c <= last).then_some(c),
            Some(size) => {
                if c > last {
                    return None;
                }
                Some(last - (last - c) % size)
            }
        }
    }
}

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

/// [`f16_chunk`]'s per-row updates with the row's f16 sum held in AVX-512
/// registers across a block of positions (the same multiplies, fmas and
/// round-to-nearest-even f16 conversions, element by element, as
/// [`scale_round_f16`] and [`fma_round_f16`]; only the loads and stores of
/// the sum between positions are gone).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Whether [`update_row`] runs here for head dimension `hd`.
    pub(super) fn usable(hd: usize) -> bool {
        matches!(hd, 64 | 128 | 256) && std::is_x86_feature_detected!("avx512f")
    }

    /// The updates of one row over the block's positions in order: `sc` its
    /// scores, `vb` the block's value rows (`sc.len()` rows of `acc.len()`).
    ///
    /// # Safety
    /// The CPU has AVX-512F and `acc.len()` is 64, 128 or 256.
    pub(super) unsafe fn update_row(
        acc: &mut [f32],
        vb: &[f32],
        sc: &[f32],
        max: &mut f32,
        sum: &mut f32,
    ) {
        match acc.len() {
            64 => rows::<4>(acc, vb, sc, max, sum),
            128 => rows::<8>(acc, vb, sc, max, sum),
            256 => rows::<16>(acc, vb, sc, max, sum),
            n => unreachable!("head dimension {n}"),
        }
    }

    #[inline(always)]
    unsafe fn round_f16(x: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(x))
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const C: usize>(
        acc: &mut [f32],
        vb: &[f32],
        sc: &[f32],
        max: &mut f32,
        sum: &mut f32,
    ) {
        let hd = 16 * C;
        assert!(acc.len() == hd && vb.len() >= sc.len() * hd);
        let mut a: [__m512; C] = std::array::from_fn(|c| _mm512_loadu_ps(acc.as_ptr().add(16 * c)));
        for (j, &s) in sc.iter().enumerate() {
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if s > *max {
                ms = (*max - s).exp();
                *max = s;
                let m = _mm512_set1_ps(ms);
                for x in a.iter_mut() {
                    *x = round_f16(_mm512_mul_ps(*x, m));
                }
            } else {
                vs = (s - *max).exp();
            }
            let m = _mm512_set1_ps(vs);
            let v = vb.as_ptr().add(j * hd);
            for (c, x) in a.iter_mut().enumerate() {
                *x = round_f16(_mm512_fmadd_ps(_mm512_loadu_ps(v.add(16 * c)), m, *x));
            }
            *sum = sum.mul_add(ms, vs);
        }
        for (c, x) in a.iter().enumerate() {
            _mm512_storeu_ps(acc.as_mut_ptr().add(16 * c), *x);
        }
    }
}

/// `b` less its last 16 values, starting at a 64-byte boundary.
fn aligned_64(b: &mut [f32]) -> &mut [f32] {
    let off = b.as_ptr().align_offset(64).min(16);
    let len = b.len() - 16;
    &mut b[off..off + len]
}

/// `acc[i] = f16(acc[i] * s)`: ggml's `ggml_vec_scale_f16` on the f16 sum.
#[inline(always)]
fn scale_round_f16(acc: &mut [f32], s: f32) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx",
        target_feature = "f16c"
    ))]
    if acc.len().is_multiple_of(8) {
        use std::arch::x86_64::*;
        // SAFETY: the target features are enabled at compile time; loads and
        // stores stay inside `acc` (whole chunks of 8).
        unsafe {
            let sv = _mm256_set1_ps(s);
            for a in acc.chunks_exact_mut(8) {
                let x = _mm256_mul_ps(_mm256_loadu_ps(a.as_ptr()), sv);
                // Round to nearest even, as f16::from_f32 does.
                _mm256_storeu_ps(a.as_mut_ptr(), _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(x)));
            }
        }
        return;
    }
    acc.iter_mut()
        .for_each(|a| *a = f16::from_f32(*a * s).to_f32());
}

/// `acc[i] = f16(fma(v[i], s, acc[i]))`: ggml's `ggml_vec_mad_f16` on the f16 sum.
#[inline(always)]
fn fma_round_f16(acc: &mut [f32], v: &[f32], s: f32) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if acc.len().is_multiple_of(8) && v.len() == acc.len() {
        use std::arch::x86_64::*;
        // SAFETY: as in scale_round_f16; `v` has `acc`'s length.
        unsafe {
            let sv = _mm256_set1_ps(s);
            for (a, b) in acc.chunks_exact_mut(8).zip(v.chunks_exact(8)) {
                let x =
                    _mm256_fmadd_ps(_mm256_loadu_ps(b.as_ptr()), sv, _mm256_loadu_ps(a.as_ptr()));
                _mm256_storeu_ps(a.as_mut_ptr(), _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(x)));
            }
        }
        return;
    }
    acc.iter_mut()
        .zip(v)
        .for_each(|(a, &x)| *a = f16::from_f32(x.mul_add(s, *a)).to_f32());
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

fn round_f16(q: &[f32]) -> Vec<f32> {
    q.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
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
trait TileCells {
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
fn tiled_rows_in(
    rows: &[(&[f32], usize, usize)],
    src: &impl TileCells,
    scale: f32,
    isa: RefIsa,
    fast: bool,
) -> Vec<f32> {
    let hd = src.head_dim();
    #[cfg(target_arch = "x86_64")]
    if fast && super::flash_tile_avx512::usable(hd, isa) {
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
/// on AVX-512 registers ([`super::flash_tile_avx512`]), the same walk.
///
/// # Safety
/// `flash_tile_avx512::usable` is true for this head dimension.
#[cfg(target_arch = "x86_64")]
unsafe fn tiled_rows_avx512(
    rows: &[(&[f32], usize, usize)],
    src: &impl TileCells,
    scale: f32,
) -> Vec<f32> {
    use super::flash_tile_avx512::{tile_rows, transpose_keys};
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
struct BatchHead<'a> {
    k: &'a [f32],
    v: &'a [f32],
    n: usize,
    width: usize,
    head: usize,
    hd: usize,
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

/// Where one KV head's rows come from in a cache that stores GGML row bytes
/// (a block-quantized K or V): the chunk's own rows (positions `p0..`,
/// encoded as the cache stores them) or the cache.
pub(crate) struct RowSource<'a> {
    /// `[T, n_kv_heads]` rows of K, then of V, in the cache's types.
    pub k_new: &'a [u8],
    pub v_new: &'a [u8],
    pub kc: &'a [u8],
    pub vc: &'a [u8],
    pub cache: &'a LayerKvCache,
    pub p0: usize,
    pub kvh: usize,
}

impl RowSource<'_> {
    fn row<'b>(&'b self, pos: usize, new: &'b [u8], cached: &'b [u8], t: KvDtype) -> &'b [u8] {
        let c = self.cache;
        let rb = t.bytes_for(c.head_dim);
        let row = if pos >= self.p0 {
            (pos - self.p0) * c.n_kv_heads + self.kvh
        } else {
            c.row_offset(self.kvh, pos) / c.head_dim
        };
        let src = if pos >= self.p0 { new } else { cached };
        &src[row * rb..(row + 1) * rb]
    }

    fn k(&self, pos: usize) -> &[u8] {
        self.row(pos, self.k_new, self.kc, self.cache.types.k)
    }

    fn v(&self, pos: usize) -> &[u8] {
        self.row(pos, self.v_new, self.vc, self.cache.types.v)
    }
}

/// A query row converted to what K's dot product takes (`vec_dot_type`):
/// f16 values for an f16 K, Q8_0 blocks (x86 rounding) for a q8_0 or q4_0 K.
enum QueryAs {
    F16(Vec<f32>),
    Q8(Vec<BlockQ8_0>),
}

/// llama.cpp's `flash_attn_ext_f16_one_chunk` for caches with a
/// block-quantized K or V — the only path it takes for them (its split-KV
/// and tiled paths need f16/f32 K and V of one type): per query row, q
/// converted to K's `vec_dot_type`; per visible cell in cell order, the score
/// by K's `vec_dot` times `scale`; an online softmax in f32 whose Σ p·v is
/// kept in f16 (`VKQ16`) when V is f16, else in f32 (`VKQ32`, V rows
/// dequantized, `fma(v, p, acc)`); the sum scaled by 1/S at the end.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quant_rows(
    qs: &[&[f32]],
    src: &RowSource,
    cells: Cells,
    last: usize,
    lo: usize,
    qpos: usize,
    scale: f32,
    isa: RefIsa,
    outs: &mut [&mut [f32]],
) {
    let types = src.cache.types;
    let hd = qs[0].len();
    let queries: Vec<QueryAs> = qs
        .iter()
        .map(|q| match types.k {
            KvDtype::F16 => QueryAs::F16(round_f16(q)),
            _ => {
                let mut b = vec![BlockQ8_0::default(); hd / QK];
                quantize_row_q8_0_x86(q, &mut b);
                QueryAs::Q8(b)
            }
        })
        .collect();
    let v_f16 = types.v == KvDtype::F16;
    let (mut kbuf, mut vbuf) = (vec![0.0f32; hd], vec![0.0f32; hd]);
    let mut acc = vec![vec![0.0f32; hd]; qs.len()];
    let mut sum = vec![0.0f32; qs.len()];
    let mut max = vec![f32::NEG_INFINITY; qs.len()];
    let positions = (0..cells.n_kv(last))
        .filter_map(|c| cells.pos(c, last))
        .filter(|&p| p >= lo && p <= qpos);
    // The hot loop: one key and one value per visible cell.
    for pos in positions {
        let krow = src.k(pos);
        if types.k == KvDtype::F16 {
            decode_row(KvDtype::F16, krow, &mut kbuf);
        }
        decode_row(types.v, src.v(pos), &mut vbuf);
        for (r, q) in queries.iter().enumerate() {
            let dot = match q {
                QueryAs::F16(q) => dot_f16_isa(q, &kbuf, isa),
                QueryAs::Q8(q) => match types.k {
                    KvDtype::Q8_0 => dot_q8_0(as_blocks(krow).expect("whole blocks"), q),
                    KvDtype::Q4_0 => dot_q4_0(as_blocks(krow).expect("whole blocks"), q),
                    t => unreachable!("K type {t:?} takes f16 queries"),
                },
            };
            let sc = dot * scale;
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            let acc = &mut acc[r];
            if sc > max[r] {
                ms = (max[r] - sc).exp();
                max[r] = sc;
                if v_f16 {
                    scale_round_f16(acc, ms);
                } else {
                    acc.iter_mut().for_each(|a| *a *= ms);
                }
            } else {
                vs = (sc - max[r]).exp();
            }
            if v_f16 {
                fma_round_f16(acc, &vbuf, vs);
            } else {
                acc.iter_mut()
                    .zip(&vbuf)
                    .for_each(|(a, &v)| *a = v.mul_add(vs, *a));
            }
            sum[r] = sum[r].mul_add(ms, vs);
        }
    }
    for ((a, s), out) in acc.iter().zip(&sum).zip(outs.iter_mut()) {
        let inv = if *s == 0.0 { 0.0 } else { 1.0 / s };
        out.iter_mut().zip(a).for_each(|(d, a)| *d = a * inv);
    }
}

/// `vec_dot_q8_0_q8_0` in llama.cpp's AVX2 form (the same value as
/// `vec_dot_q8_0_q8_0_x86`, which the tests compare it with).
#[inline]
fn dot_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the target features are enabled at compile time.
        unsafe { avx2::dot_q8(x.len(), |b| x[b].d.to_f32(), |b| avx2::load_q8(&x[b].qs), y) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    super::vec_dot::vec_dot_q8_0_q8_0_x86(x, y)
}

/// `vec_dot_q4_0_q8_0` in llama.cpp's AVX2 form (the value of
/// `vec_dot_q4_0_q8_0_x86`).
#[inline]
fn dot_q4_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the target features are enabled at compile time.
        unsafe { avx2::dot_q8(x.len(), |b| x[b].d.to_f32(), |b| avx2::load_q4(&x[b].qs), y) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    super::vec_dot::vec_dot_q4_0_q8_0_x86(x, y)
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::cpu::ggml_order::vec_dot::hsum_float_8;
    use crate::quant::blocks::{BlockQ8_0, QK};

    /// 32 signed quants of a q8_0 block.
    #[inline(always)]
    pub(super) unsafe fn load_q8(qs: &[i8; QK]) -> __m256i {
        _mm256_loadu_si256(qs.as_ptr() as *const __m256i)
    }

    /// 32 quants of a q4_0 block minus 8: low nibbles (values 0..16), then high.
    #[inline(always)]
    pub(super) unsafe fn load_q4(qs: &[u8; QK / 2]) -> __m256i {
        let b = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
        let nib = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
        _mm256_sub_epi8(nib, _mm256_set1_epi8(8))
    }

    /// Σ over blocks of fma(d_x·d_y, lanes, acc): lane l holds the integer sum
    /// of elements 4l..4l+4 (`mul_sum_i8_pairs_float`), then `hsum_float_8`.
    #[inline(always)]
    pub(super) unsafe fn dot_q8(
        n: usize,
        d: impl Fn(usize) -> f32,
        q: impl Fn(usize) -> __m256i,
        y: &[BlockQ8_0],
    ) -> f32 {
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for (b, by) in y.iter().enumerate().take(n) {
            let dd = _mm256_set1_ps(d(b) * by.d.to_f32());
            let qx = q(b);
            let qy = load_q8(&by.qs);
            let ax = _mm256_sign_epi8(qx, qx);
            let sy = _mm256_sign_epi8(qy, qx);
            let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
            acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sums), acc);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        hsum_float_8(&lanes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 tile (where this machine has it) gives the generic tile's
    /// outputs bit for bit: head dims 64/128/256, partial last tiles, rows
    /// with sliding windows that skip whole tiles, an odd row count.
    #[test]
    fn avx512_tile_equals_the_generic_tile() {
        let mut seed = 777u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for (hd, n, n_rows) in [(64, 100, 7), (128, 193, 12), (256, 130, 9)] {
            let f16v = |x: f32| f16::from_f32(x).to_f32();
            let k: Vec<f32> = (0..n * hd).map(|_| f16v(next() * 3.0)).collect();
            let v: Vec<f32> = (0..n * hd).map(|_| f16v(next())).collect();
            let q: Vec<f32> = (0..n_rows * hd).map(|_| next() * 2.0).collect();
            let src = BatchHead {
                k: &k,
                v: &v,
                n,
                width: hd,
                head: 0,
                hd,
            };
            let rows: Vec<(&[f32], usize, usize)> = (0..n_rows)
                .map(|r| {
                    let qpos = n - 1 - 7 * r;
                    // Every third row a window that starts past the first tiles.
                    let lo = if r % 3 == 1 {
                        qpos.saturating_sub(70)
                    } else {
                        0
                    };
                    (&q[r * hd..(r + 1) * hd], qpos, lo)
                })
                .collect();
            for scale in [0.125f32, 1.0 / (hd as f32).sqrt()] {
                let want = tiled_rows_in(&rows, &src, scale, RefIsa::Avx512, false);
                let got = tiled_rows_in(&rows, &src, scale, RefIsa::Avx512, true);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "hd {hd} [{i}]: {g} vs {w}");
                }
            }
        }
    }
    use crate::cpu::ggml_order::vec_dot::{vec_dot_q4_0_q8_0_x86, vec_dot_q8_0_q8_0_x86};
    use crate::quant::blocks::F16Le;

    /// The AVX2 dot products are the x86-order references bit for bit, on
    /// blocks with extreme quants (±127, -128 activations excluded as
    /// llama.cpp's quantizer never makes them) and varied scales.
    #[test]
    fn simd_dots_equal_the_x86_order_references() {
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for n in [1usize, 2, 4, 8] {
            for _ in 0..200 {
                let q8 = |next: &mut dyn FnMut() -> u32| BlockQ8_0 {
                    d: F16Le::from_f32((next() % 1000) as f32 * 1e-4 + 1e-5),
                    qs: std::array::from_fn(|_| ((next() % 255) as i32 - 127) as i8),
                };
                let x: Vec<BlockQ8_0> = (0..n).map(|_| q8(&mut next)).collect();
                let y: Vec<BlockQ8_0> = (0..n).map(|_| q8(&mut next)).collect();
                let x4: Vec<BlockQ4_0> = (0..n)
                    .map(|_| BlockQ4_0 {
                        d: F16Le::from_f32((next() % 1000) as f32 * -1e-3),
                        qs: std::array::from_fn(|_| next() as u8),
                    })
                    .collect();
                assert_eq!(
                    dot_q8_0(&x, &y).to_bits(),
                    vec_dot_q8_0_q8_0_x86(&x, &y).to_bits()
                );
                assert_eq!(
                    dot_q4_0(&x4, &y).to_bits(),
                    vec_dot_q4_0_q8_0_x86(&x4, &y).to_bits()
                );
            }
        }
    }
}
