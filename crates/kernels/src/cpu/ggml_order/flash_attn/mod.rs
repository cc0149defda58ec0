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
//!
//! One file per path: [`f16_path`] (one key at a time, and split KV),
//! [`tiled_path`] (f32 tiles; also the vision towers' segment attention),
//! [`quant_path`] (block-quantized K or V). This file holds what they share:
//! the KV sources, the cell order and the f16 rounding steps.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::activations::RefIsa;
use super::half_dot::{dot_f16_isa, reduce_add_16};
use super::vec_dot::quantize_row_q8_0_x86;
use crate::cpu::kv_cache::{decode_row, CacheLayout, KvDtype, LayerKvCache};
use crate::quant::blocks::{as_blocks, BlockQ4_0, BlockQ8_0, QK};

mod f16_path;
mod quant_path;
#[cfg(test)]
mod tests;
mod tiled_path;

pub use f16_path::f16_attend_row;
pub(crate) use f16_path::{f16_rows, split_kv_rows, use_split_kv};
pub(crate) use quant_path::{quant_rows, RowSource};
pub use tiled_path::attend_segments;
pub(crate) use tiled_path::tiled_rows;

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

fn round_f16(q: &[f32]) -> Vec<f32> {
    q.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}
