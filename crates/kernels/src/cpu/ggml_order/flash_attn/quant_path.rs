//! The f16 path over a cache with a block-quantized K or V (q8_0, q4_0).

use super::*;

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
pub(super) fn dot_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
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
    crate::cpu::ggml_order::vec_dot::vec_dot_q8_0_q8_0_x86(x, y)
}

/// `vec_dot_q4_0_q8_0` in llama.cpp's AVX2 form (the value of
/// `vec_dot_q4_0_q8_0_x86`).
#[inline]
pub(super) fn dot_q4_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
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
    crate::cpu::ggml_order::vec_dot::vec_dot_q4_0_q8_0_x86(x, y)
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
