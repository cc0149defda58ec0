//! [`Simd`] for x86-64: AVX-512 (one unit per zmm register, VNNI dot
//! products) and AVX2 (a unit is two ymm registers, rows 0-3 and 4-7; dot
//! products through `maddubs`/`madd`).

use std::arch::x86_64::*;

use super::Simd;

#[derive(Clone, Copy)]
pub struct Avx512;

macro_rules! avx512 {
    ($($f:item)*) => {
        $(
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            $f
        )*
    };
}

impl Simd for Avx512 {
    type U = __m512i;
    type I = __m512i;
    type F = __m512;
    type P = __m512i;

    avx512! {
        unsafe fn prefetch(p: *const u8) {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
        }
        unsafe fn load(p: *const u8) -> __m512i {
            _mm512_loadu_si512(p as *const _)
        }
        unsafe fn nib_lo(u: __m512i) -> __m512i {
            _mm512_and_si512(u, _mm512_set1_epi8(0x0f))
        }
        unsafe fn nib_hi(u: __m512i) -> __m512i {
            _mm512_and_si512(_mm512_srli_epi16::<4>(u), _mm512_set1_epi8(0x0f))
        }
        unsafe fn set_bit4(u: __m512i, bits: u64) -> __m512i {
            _mm512_mask_add_epi8(u, bits, u, _mm512_set1_epi8(16))
        }
        unsafe fn q6(lo: __m512i, hi: __m512i, shift: u32) -> __m512i {
            // Bits shift..shift + 2 moved to bits 4..6 in one 16-bit shift (as
            // in the AVX2 version), then `lo | (h & 0x30)` in one ternary logic op.
            let h = match shift {
                0 => _mm512_slli_epi16::<4>(hi),
                2 => _mm512_slli_epi16::<2>(hi),
                4 => hi,
                _ => _mm512_srli_epi16::<2>(hi),
            };
            debug_assert!(matches!(shift, 0 | 2 | 4 | 6));
            _mm512_ternarylogic_epi32::<0xf8>(lo, h, _mm512_set1_epi8(0x30))
        }
        unsafe fn izero() -> __m512i {
            _mm512_setzero_si512()
        }
        unsafe fn pzero() -> __m512i {
            _mm512_setzero_si512()
        }
        unsafe fn pdot(acc: __m512i, w: __m512i, a: u64) -> __m512i {
            Self::dot_u8(acc, w, a)
        }
        unsafe fn pscales<const SIGNED: bool>(p: *const u8) -> __m512i {
            // The multiplier in the low 16 bits of its lane, zero above, so
            // `madd` multiplies the lane's (16-bit) partial sum by it: one
            // uop where `mullo` takes two.
            _mm512_and_si512(Self::rows_bytes::<SIGNED>(p, p), _mm512_set1_epi32(0xffff))
        }
        unsafe fn pscale(acc: __m512i, s: __m512i) -> __m512i {
            _mm512_madd_epi16(acc, s)
        }
        unsafe fn dot_u8(acc: __m512i, w: __m512i, a: u64) -> __m512i {
            _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi64(a as i64))
        }
        unsafe fn dot_i8(acc: __m512i, w: __m512i, a: u64) -> __m512i {
            let a = _mm512_set1_epi64(a as i64);
            let neg = _mm512_movepi8_mask(w);
            let signed_a = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
            _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(w), signed_a)
        }
        unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(a, b)
        }
        unsafe fn sub(a: __m512i, b: __m512i) -> __m512i {
            _mm512_sub_epi32(a, b)
        }
        unsafe fn mul(a: __m512i, b: __m512i) -> __m512i {
            _mm512_mullo_epi32(a, b)
        }
        unsafe fn madd16(a: __m512i, b: __m512i) -> __m512i {
            _mm512_madd_epi16(a, b)
        }
        unsafe fn pscale_acc(acc: __m512i, p: __m512i, s: __m512i) -> __m512i {
            Self::madd16_acc(acc, p, s)
        }
        unsafe fn madd16_acc(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            // In asm: LLVM splits `_mm512_dpwssd_epi32` chains back into
            // `vpmaddwd` + `vpaddd` (two uops) for CPUs it does not know to
            // have a fast `vpdpwssd`.
            let mut acc = acc;
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
            acc
        }
        unsafe fn pack16(lo: __m512i, hi: __m512i) -> __m512i {
            _mm512_mask_blend_epi16(0xaaaa_aaaa, lo, _mm512_slli_epi32::<16>(hi))
        }
        unsafe fn shl(a: __m512i, n: u32) -> __m512i {
            _mm512_sll_epi32(a, _mm_cvtsi32_si128(n as i32))
        }
        unsafe fn splat2(lo: i32, hi: i32) -> __m512i {
            _mm512_set1_epi64((((hi as u32 as u64) << 32) | lo as u32 as u64) as i64)
        }
        unsafe fn rows_bytes<const SIGNED: bool>(p0: *const u8, p1: *const u8) -> __m512i {
            let il = _mm_unpacklo_epi8(_mm_loadl_epi64(p0 as *const _), _mm_loadl_epi64(p1 as *const _));
            if SIGNED {
                _mm512_cvtepi8_epi32(il)
            } else {
                _mm512_cvtepu8_epi32(il)
            }
        }
        unsafe fn pair_sum(a: __m512i) -> __m512i {
            _mm512_add_epi32(a, _mm512_shuffle_epi32::<_MM_PERM_CDAB>(a))
        }
        unsafe fn cvt(a: __m512i) -> __m512 {
            _mm512_cvtepi32_ps(a)
        }
        unsafe fn rows_f16(p: *const u8) -> __m512 {
            let x = _mm_loadu_si128(p as *const _);
            _mm512_cvtph_ps(_mm256_set_m128i(_mm_unpackhi_epi16(x, x), _mm_unpacklo_epi16(x, x)))
        }
        unsafe fn fsplat2(lo: f32, hi: f32) -> __m512 {
            _mm512_castsi512_ps(_mm512_set1_epi64((((hi.to_bits() as u64) << 32) | lo.to_bits() as u64) as i64))
        }
        unsafe fn pair_sums2(a: __m512i, b: __m512i) -> __m512i {
            // [a0 b1 a2 b3 ...] + [a1 b0 a3 b2 ...]
            let idx = _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
            _mm512_add_epi32(_mm512_mask_blend_epi32(0xaaaa, a, b), _mm512_permutex2var_epi32(a, idx, b))
        }
        unsafe fn fsplat(v: f32) -> __m512 {
            _mm512_set1_ps(v)
        }
        unsafe fn fzero() -> __m512 {
            _mm512_setzero_ps()
        }
        unsafe fn fadd(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(a, b)
        }
        unsafe fn fsub(a: __m512, b: __m512) -> __m512 {
            _mm512_sub_ps(a, b)
        }
        unsafe fn fmul(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }
        unsafe fn fstore(a: __m512) -> [f32; 16] {
            std::mem::transmute(a)
        }
    }
}

#[derive(Clone, Copy)]
pub struct Avx2;

macro_rules! avx2 {
    ($($f:item)*) => {
        $(
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            $f
        )*
    };
}

/// Applies a per-256-bit-half operation to both halves.
macro_rules! halves {
    ($f:expr, $($a:expr),*) => {
        [$f($($a[0]),*), $f($($a[1]),*)]
    };
}

impl Avx2 {
    /// 32 bits -> 32 bytes, 16 where the bit is set.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bits_to_16(b: u32) -> __m256i {
        let v = _mm256_set1_epi32(b as i32);
        let shuf = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let m = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
        let x = _mm256_and_si256(_mm256_shuffle_epi8(v, shuf), m);
        _mm256_and_si256(_mm256_cmpeq_epi8(x, m), _mm256_set1_epi8(16))
    }
}

impl Simd for Avx2 {
    type U = [__m256i; 2];
    type I = [__m256i; 2];
    type F = [__m256; 2];
    /// 16-bit lanes: `maddubs` pairs, summed without widening.
    type P = [__m256i; 2];

    avx2! {
        unsafe fn prefetch(p: *const u8) {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
        }
        unsafe fn load(p: *const u8) -> [__m256i; 2] {
            [_mm256_loadu_si256(p as *const _), _mm256_loadu_si256(p.add(32) as *const _)]
        }
        unsafe fn nib_lo(u: [__m256i; 2]) -> [__m256i; 2] {
            let m = _mm256_set1_epi8(0x0f);
            [_mm256_and_si256(u[0], m), _mm256_and_si256(u[1], m)]
        }
        unsafe fn nib_hi(u: [__m256i; 2]) -> [__m256i; 2] {
            let m = _mm256_set1_epi8(0x0f);
            [_mm256_and_si256(_mm256_srli_epi16::<4>(u[0]), m), _mm256_and_si256(_mm256_srli_epi16::<4>(u[1]), m)]
        }
        unsafe fn set_bit4(u: [__m256i; 2], bits: u64) -> [__m256i; 2] {
            [
                _mm256_add_epi8(u[0], Self::bits_to_16(bits as u32)),
                _mm256_add_epi8(u[1], Self::bits_to_16((bits >> 32) as u32)),
            ]
        }
        unsafe fn q6(lo: [__m256i; 2], hi: [__m256i; 2], shift: u32) -> [__m256i; 2] {
            // Bits shift..shift + 2 of each byte moved to bits 4..6 in one
            // 16-bit shift (no bit crosses into the masked bits of the other
            // byte for these shifts), then masked.
            let f = |l: __m256i, h: __m256i| {
                let h = match shift {
                    0 => _mm256_slli_epi16::<4>(h),
                    2 => _mm256_slli_epi16::<2>(h),
                    4 => h,
                    _ => _mm256_srli_epi16::<2>(h),
                };
                _mm256_or_si256(l, _mm256_and_si256(h, _mm256_set1_epi8(0x30)))
            };
            debug_assert!(matches!(shift, 0 | 2 | 4 | 6));
            [f(lo[0], hi[0]), f(lo[1], hi[1])]
        }
        unsafe fn izero() -> [__m256i; 2] {
            [_mm256_setzero_si256(); 2]
        }
        unsafe fn pzero() -> [__m256i; 2] {
            [_mm256_setzero_si256(); 2]
        }
        unsafe fn pdot(acc: [__m256i; 2], w: [__m256i; 2], a: u64) -> [__m256i; 2] {
            let a = _mm256_set1_epi64x(a as i64);
            halves!(|c, x| _mm256_add_epi16(c, _mm256_maddubs_epi16(x, a)), acc, w)
        }
        unsafe fn pscales<const SIGNED: bool>(p: *const u8) -> [__m256i; 2] {
            // The multiplier in both 16-bit halves of its 32-bit lane, so
            // `madd` multiplies each 16-bit partial sum by it and adds the pair.
            let (low, s) = (_mm256_set1_epi32(0xffff), Self::rows_bytes::<SIGNED>(p, p));
            halves!(|x| _mm256_or_si256(_mm256_and_si256(x, low), _mm256_slli_epi32::<16>(x)), s)
        }
        unsafe fn pscale(acc: [__m256i; 2], s: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x, y| _mm256_madd_epi16(x, y), acc, s)
        }
        unsafe fn dot_u8(acc: [__m256i; 2], w: [__m256i; 2], a: u64) -> [__m256i; 2] {
            let (a, ones) = (_mm256_set1_epi64x(a as i64), _mm256_set1_epi16(1));
            let f = |acc: __m256i, w: __m256i| _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones));
            [f(acc[0], w[0]), f(acc[1], w[1])]
        }
        unsafe fn dot_i8(acc: [__m256i; 2], w: [__m256i; 2], a: u64) -> [__m256i; 2] {
            let (a, ones) = (_mm256_set1_epi64x(a as i64), _mm256_set1_epi16(1));
            let f = |acc: __m256i, w: __m256i| {
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
                _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones))
            };
            [f(acc[0], w[0]), f(acc[1], w[1])]
        }
        unsafe fn add(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x, y| _mm256_add_epi32(x, y), a, b)
        }
        unsafe fn sub(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x, y| _mm256_sub_epi32(x, y), a, b)
        }
        unsafe fn mul(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x, y| _mm256_mullo_epi32(x, y), a, b)
        }
        unsafe fn madd16(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x, y| _mm256_madd_epi16(x, y), a, b)
        }
        unsafe fn pack16(lo: [__m256i; 2], hi: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x, y| _mm256_blend_epi16::<0xaa>(x, _mm256_slli_epi32::<16>(y)), lo, hi)
        }
        unsafe fn shl(a: [__m256i; 2], n: u32) -> [__m256i; 2] {
            let s = _mm_cvtsi32_si128(n as i32);
            halves!(|x| _mm256_sll_epi32(x, s), a)
        }
        unsafe fn splat2(lo: i32, hi: i32) -> [__m256i; 2] {
            [_mm256_set1_epi64x((((hi as u32 as u64) << 32) | lo as u32 as u64) as i64); 2]
        }
        unsafe fn rows_bytes<const SIGNED: bool>(p0: *const u8, p1: *const u8) -> [__m256i; 2] {
            let il = _mm_unpacklo_epi8(_mm_loadl_epi64(p0 as *const _), _mm_loadl_epi64(p1 as *const _));
            let hi = _mm_srli_si128::<8>(il);
            if SIGNED {
                [_mm256_cvtepi8_epi32(il), _mm256_cvtepi8_epi32(hi)]
            } else {
                [_mm256_cvtepu8_epi32(il), _mm256_cvtepu8_epi32(hi)]
            }
        }
        unsafe fn pair_sum(a: [__m256i; 2]) -> [__m256i; 2] {
            halves!(|x| _mm256_add_epi32(x, _mm256_shuffle_epi32::<0xB1>(x)), a)
        }
        unsafe fn cvt(a: [__m256i; 2]) -> [__m256; 2] {
            halves!(|x| _mm256_cvtepi32_ps(x), a)
        }
        unsafe fn rows_f16(p: *const u8) -> [__m256; 2] {
            let x = _mm_loadu_si128(p as *const _);
            [_mm256_cvtph_ps(_mm_unpacklo_epi16(x, x)), _mm256_cvtph_ps(_mm_unpackhi_epi16(x, x))]
        }
        unsafe fn fsplat2(lo: f32, hi: f32) -> [__m256; 2] {
            [_mm256_castsi256_ps(_mm256_set1_epi64x((((hi.to_bits() as u64) << 32) | lo.to_bits() as u64) as i64)); 2]
        }
        unsafe fn pair_sums2(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            // [a0 b1 a2 b3 ...] + [a1 b0 a3 b2 ...]
            halves!(|x, y| {
                let swapped = _mm256_blend_epi32::<0xaa>(_mm256_shuffle_epi32::<0xb1>(x), _mm256_shuffle_epi32::<0xb1>(y));
                _mm256_add_epi32(_mm256_blend_epi32::<0xaa>(x, y), swapped)
            }, a, b)
        }
        unsafe fn fsplat(v: f32) -> [__m256; 2] {
            [_mm256_set1_ps(v); 2]
        }
        unsafe fn fzero() -> [__m256; 2] {
            [_mm256_setzero_ps(); 2]
        }
        unsafe fn fadd(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
            halves!(|x, y| _mm256_add_ps(x, y), a, b)
        }
        unsafe fn fsub(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
            halves!(|x, y| _mm256_sub_ps(x, y), a, b)
        }
        unsafe fn fmul(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
            halves!(|x, y| _mm256_mul_ps(x, y), a, b)
        }
        unsafe fn fma(a: [__m256; 2], b: [__m256; 2], c: [__m256; 2]) -> [__m256; 2] {
            [_mm256_fmadd_ps(a[0], b[0], c[0]), _mm256_fmadd_ps(a[1], b[1], c[1])]
        }
        unsafe fn fstore(a: [__m256; 2]) -> [f32; 16] {
            std::mem::transmute(a)
        }
    }
}
