//! One tile of the tiled flash attention (`flash_attn::tile_rows`) written
//! for AVX-512: the same per-value chains in 16-lane registers, blocked so
//! that 8 accumulators are in flight (64 keys × 2 rows for the scores, 64
//! output values × 2 rows for Σ p·v), the tile's keys transposed by 16×16
//! register transposes instead of one scalar store per value, and the
//! softmax's exp on vectors (ggml's AVX-512 `ggml_v_expf`). Every score,
//! probability, sum and output is the generic tile's value bit for bit
//! (tested against it in `flash_attn`).

use std::arch::x86_64::*;

use super::activations::RefIsa;

/// KV cells per tile (`flash_attn::KV_TILE`).
const TILE: usize = 64;

/// Whether [`tile_rows`] applies: the CPU has AVX-512 (F, DQ), the reference
/// is llama.cpp's AVX-512 build, and the head dimension is whole vectors of 64.
pub(crate) fn usable(hd: usize, isa: RefIsa) -> bool {
    isa == RefIsa::Avx512
        && hd.is_multiple_of(TILE)
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("fma")
}

/// `kt[d · 64 + i] = rows[i · hd + d]` for the tile's 64 rows of `hd` values.
///
/// # Safety
/// [`usable`] returned true for `hd`.
#[target_feature(enable = "avx512f,avx512dq,fma")]
pub(crate) unsafe fn transpose_keys(rows: &[f32], hd: usize, kt: &mut [f32]) {
    assert!(rows.len() >= TILE * hd && kt.len() >= TILE * hd && hd.is_multiple_of(16));
    for i0 in (0..TILE).step_by(16) {
        for d0 in (0..hd).step_by(16) {
            transpose16(
                rows.as_ptr().add(i0 * hd + d0),
                hd,
                kt.as_mut_ptr().add(d0 * TILE + i0),
                TILE,
            );
        }
    }
}

/// Writes the transpose of the 16×16 block at `src` (row stride `ss`) to
/// `dst` (row stride `ds`): `dst[j · ds + i] = src[i · ss + j]`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,fma")]
unsafe fn transpose16(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    let mut r = [_mm512_setzero_ps(); 16];
    for (i, v) in r.iter_mut().enumerate() {
        *v = _mm512_loadu_ps(src.add(i * ss));
    }
    // t[2i], t[2i + 1]: rows 2i, 2i + 1 interleaved (per 128-bit lane k:
    // columns 4k, 4k + 1, then 4k + 2, 4k + 3).
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c], lane k: column 4k + c of rows 4g..4g + 4.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (a, b) = (_mm512_castps_pd(t[4 * g]), _mm512_castps_pd(t[4 * g + 2]));
        let (c, d) = (
            _mm512_castps_pd(t[4 * g + 1]),
            _mm512_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for c in 0..4 {
        let a_lo = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let a_hi = _mm512_shuffle_f32x4::<0xdd>(u[c], u[4 + c]);
        let b_lo = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let b_hi = _mm512_shuffle_f32x4::<0xdd>(u[8 + c], u[12 + c]);
        _mm512_storeu_ps(dst.add(c * ds), _mm512_shuffle_f32x4::<0x88>(a_lo, b_lo));
        _mm512_storeu_ps(
            dst.add((4 + c) * ds),
            _mm512_shuffle_f32x4::<0x88>(a_hi, b_hi),
        );
        _mm512_storeu_ps(
            dst.add((8 + c) * ds),
            _mm512_shuffle_f32x4::<0xdd>(a_lo, b_lo),
        );
        _mm512_storeu_ps(
            dst.add((12 + c) * ds),
            _mm512_shuffle_f32x4::<0xdd>(a_hi, b_hi),
        );
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512dq,fma")]
unsafe fn c(bits: u32) -> __m512 {
    _mm512_set1_ps(f32::from_bits(bits))
}

/// `ggml_v_expf` (AVX-512), as `activations::expf_ggml_v` emulates it.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,fma")]
unsafe fn expf16(x: __m512) -> __m512 {
    let r = _mm512_set1_ps(12582912.0); // 0x1.8p23
    let z = _mm512_fmadd_ps(x, c(0x3fb8aa3b), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, c(0x35bfbe8e), _mm512_fnmadd_ps(n, c(0x3f317200), x));
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(c(0x3c072010), b, c(0x3d2b9f17)),
            u,
            _mm512_fmadd_ps(c(0x3e2aaf33), b, c(0x3efffedb)),
        ),
        u,
        _mm512_fmadd_ps(c(0x3f7ffff6), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    if d == 0 {
        return res;
    }
    let zero = _mm512_setzero_ps();
    let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero);
    let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), zero);
    _mm512_mask_blend_ps(d, res, alt)
}

/// `half_dot::reduce_add_16`'s halving tree: lanes `l + 8`, then `l + 4`,
/// `l + 2`, `l + 1` added onto lane `l`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,fma")]
unsafe fn reduce_add_16(v: __m512) -> f32 {
    let v8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps::<1>(v2, v2)))
}

/// `flash_attn::tile_rows::<N>` (N = 1 or 2) for a head dimension that is a
/// multiple of 64, with the reference's AVX-512 exp and sums: `kt` the
/// tile's keys transposed (`kt[d · 64 + i]`), `vt` its values by cell.
///
/// # Safety
/// [`usable`] returned true for the rows' head dimension.
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512dq,fma")]
pub(crate) unsafe fn tile_rows<const N: usize>(
    rows: [(&[f32], usize, usize); N],
    ms: [&mut (f32, f32); N],
    outs: [&mut [f32]; N],
    kt: &[f32],
    vt: &[f32],
    tile_pos: &[Option<usize>; TILE],
    scale: f32,
) {
    let hd = rows[0].0.len();
    assert!(hd.is_multiple_of(TILE) && kt.len() >= TILE * hd && vt.len() >= TILE * hd);
    assert!(rows.iter().all(|r| r.0.len() == hd) && outs.iter().all(|o| o.len() == hd));
    // Bit i: cell i is a position row r sees.
    let mut valid = [0u64; N];
    for r in 0..N {
        let (_, qpos, lo) = rows[r];
        for (i, p) in tile_pos.iter().enumerate() {
            if p.is_some_and(|p| p >= lo && p <= qpos) {
                valid[r] |= 1 << i;
            }
        }
    }
    if valid.iter().all(|&v| v == 0) {
        return;
    }
    // Scores: one fma chain over the head dimension per (row, cell).
    let mut acc = [[_mm512_setzero_ps(); 4]; N];
    let (ktp, vtp) = (kt.as_ptr(), vt.as_ptr());
    for d in 0..hd {
        let mut k = [_mm512_setzero_ps(); 4];
        for j in 0..4 {
            k[j] = _mm512_loadu_ps(ktp.add(d * TILE + 16 * j));
        }
        for r in 0..N {
            let q = _mm512_set1_ps(*rows[r].0.get_unchecked(d));
            for j in 0..4 {
                acc[r][j] = _mm512_fmadd_ps(q, k[j], acc[r][j]);
            }
        }
    }
    // Softmax update per row; p (the exps) replace the scores.
    let mut p = [[0.0f32; TILE]; N];
    for r in 0..N {
        if valid[r] == 0 {
            // No cell of this tile for this row: nothing changes.
            continue;
        }
        let mut s = [_mm512_setzero_ps(); 4];
        let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
        for j in 0..4 {
            let mask = (valid[r] >> (16 * j)) as u16;
            s[j] = _mm512_mask_mul_ps(
                _mm512_set1_ps(f32::NEG_INFINITY),
                mask,
                acc[r][j],
                _mm512_set1_ps(scale),
            );
            // NaN scores are passed over (the second operand wins), as by the fold.
            vmax = _mm512_max_ps(s[j], vmax);
        }
        let tile_max = _mm512_reduce_max_ps(vmax);
        let (m, sum) = &mut *ms[r];
        let mn = m.max(tile_max);
        if mn > *m {
            let scale_old = (*m - mn).exp();
            let so = _mm512_set1_ps(scale_old);
            let o = outs[r].as_mut_ptr();
            for c in (0..hd).step_by(16) {
                _mm512_storeu_ps(o.add(c), _mm512_mul_ps(_mm512_loadu_ps(o.add(c)), so));
            }
            *sum *= scale_old;
        }
        *m = mn;
        let mut tile_sum = 0.0f64;
        for j in 0..4 {
            let e = expf16(_mm512_sub_ps(s[j], _mm512_set1_ps(mn)));
            _mm512_storeu_ps(p[r].as_mut_ptr().add(16 * j), e);
            tile_sum += reduce_add_16(e) as f64;
        }
        *sum = (*sum as f64 + tile_sum) as f32;
    }
    // Σ p·v, 64 output values at a time over all cells in order (a zero p
    // adds nothing and is skipped, as in ggml).
    for dc in (0..hd).step_by(TILE) {
        let mut a = [[_mm512_setzero_ps(); 4]; N];
        for r in 0..N {
            for j in 0..4 {
                a[r][j] = _mm512_loadu_ps(outs[r].as_ptr().add(dc + 16 * j));
            }
        }
        for i in 0..TILE {
            let mut v = [_mm512_setzero_ps(); 4];
            for j in 0..4 {
                v[j] = _mm512_loadu_ps(vtp.add(i * hd + dc + 16 * j));
            }
            for r in 0..N {
                let pi = p[r][i];
                if pi != 0.0 {
                    let pv = _mm512_set1_ps(pi);
                    for j in 0..4 {
                        a[r][j] = _mm512_fmadd_ps(pv, v[j], a[r][j]);
                    }
                }
            }
        }
        for r in 0..N {
            for j in 0..4 {
                _mm512_storeu_ps(outs[r].as_mut_ptr().add(dc + 16 * j), a[r][j]);
            }
        }
    }
}
