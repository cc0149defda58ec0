//! [`Simd`] for aarch64 Advanced SIMD: a unit is four 128-bit registers (two
//! rows each); dot products widen to 16 bits (`smull`) and add pairwise.

use std::arch::aarch64::*;

use half::f16;

use super::Simd;

#[derive(Clone, Copy)]
pub struct Neon;

macro_rules! neon {
    ($($f:item)*) => {
        $(
            #[inline]
            #[target_feature(enable = "neon")]
            $f
        )*
    };
}

macro_rules! each {
    ($f:expr, $($a:expr),*) => {
        [$f($($a[0]),*), $f($($a[1]),*), $f($($a[2]),*), $f($($a[3]),*)]
    };
}

impl Neon {
    /// Sums of 4 products per lane for one register (rows 2k, 2k + 1).
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn dot4(acc: int32x4_t, w: int8x16_t, a: int8x8_t) -> int32x4_t {
        let p0 = vpaddlq_s16(vmull_s8(vget_low_s8(w), a));
        let p1 = vpaddlq_s16(vmull_s8(vget_high_s8(w), a));
        vaddq_s32(acc, vpaddq_s32(p0, p1))
    }
}

impl Simd for Neon {
    type U = [uint8x16_t; 4];
    type I = [int32x4_t; 4];
    type F = [float32x4_t; 4];
    type P = [int32x4_t; 4];

    neon! {
        unsafe fn load(p: *const u8) -> [uint8x16_t; 4] {
            [vld1q_u8(p), vld1q_u8(p.add(16)), vld1q_u8(p.add(32)), vld1q_u8(p.add(48))]
        }
        unsafe fn nib_lo(u: [uint8x16_t; 4]) -> [uint8x16_t; 4] {
            let m = vdupq_n_u8(0x0f);
            each!(|x| vandq_u8(x, m), u)
        }
        unsafe fn nib_hi(u: [uint8x16_t; 4]) -> [uint8x16_t; 4] {
            each!(|x| vshrq_n_u8::<4>(x), u)
        }
        unsafe fn set_bit4(u: [uint8x16_t; 4], bits: u64) -> [uint8x16_t; 4] {
            let mask = vcombine_u8(vcreate_u8(0x8040201008040201), vcreate_u8(0x8040201008040201));
            let sixteen = vdupq_n_u8(16);
            let f = |k: usize, x: uint8x16_t| {
                let b = (bits >> (16 * k)) as u16;
                let v = vcombine_u8(vdup_n_u8(b as u8), vdup_n_u8((b >> 8) as u8));
                vaddq_u8(x, vandq_u8(vtstq_u8(v, mask), sixteen))
            };
            [f(0, u[0]), f(1, u[1]), f(2, u[2]), f(3, u[3])]
        }
        unsafe fn q6(lo: [uint8x16_t; 4], hi: [uint8x16_t; 4], shift: u32) -> [uint8x16_t; 4] {
            let (s, three) = (vdupq_n_s8(-(shift as i8)), vdupq_n_u8(3));
            each!(|l, h| vorrq_u8(l, vshlq_n_u8::<4>(vandq_u8(vshlq_u8(h, s), three))), lo, hi)
        }
        unsafe fn izero() -> [int32x4_t; 4] {
            [vdupq_n_s32(0); 4]
        }
        unsafe fn pzero() -> [int32x4_t; 4] {
            Self::izero()
        }
        unsafe fn pdot(acc: [int32x4_t; 4], w: [uint8x16_t; 4], a: u64) -> [int32x4_t; 4] {
            Self::dot_u8(acc, w, a)
        }
        unsafe fn pscales<const SIGNED: bool>(p: *const u8) -> [int32x4_t; 4] {
            Self::rows_bytes::<SIGNED>(p, p)
        }
        unsafe fn pscale(acc: [int32x4_t; 4], s: [int32x4_t; 4]) -> [int32x4_t; 4] {
            Self::mul(acc, s)
        }
        unsafe fn dot_u8(acc: [int32x4_t; 4], w: [uint8x16_t; 4], a: u64) -> [int32x4_t; 4] {
            // Weights are at most 127, so reading them as signed is exact.
            let a = vcreate_s8(a);
            each!(|c, x| Self::dot4(c, vreinterpretq_s8_u8(x), a), acc, w)
        }
        unsafe fn dot_i8(acc: [int32x4_t; 4], w: [uint8x16_t; 4], a: u64) -> [int32x4_t; 4] {
            let a = vcreate_s8(a);
            each!(|c, x| Self::dot4(c, vreinterpretq_s8_u8(x), a), acc, w)
        }
        unsafe fn add(a: [int32x4_t; 4], b: [int32x4_t; 4]) -> [int32x4_t; 4] {
            each!(|x, y| vaddq_s32(x, y), a, b)
        }
        unsafe fn sub(a: [int32x4_t; 4], b: [int32x4_t; 4]) -> [int32x4_t; 4] {
            each!(|x, y| vsubq_s32(x, y), a, b)
        }
        unsafe fn mul(a: [int32x4_t; 4], b: [int32x4_t; 4]) -> [int32x4_t; 4] {
            each!(|x, y| vmulq_s32(x, y), a, b)
        }
        unsafe fn madd16(a: [int32x4_t; 4], b: [int32x4_t; 4]) -> [int32x4_t; 4] {
            each!(|x, y| {
                let p = vmull_s16(vmovn_s32(x), vmovn_s32(y));
                let q = vmull_s16(vshrn_n_s32::<16>(x), vshrn_n_s32::<16>(y));
                vaddq_s32(p, q)
            }, a, b)
        }
        unsafe fn pack16(lo: [int32x4_t; 4], hi: [int32x4_t; 4]) -> [int32x4_t; 4] {
            let low = vdupq_n_s32(0xffff);
            each!(|l, h| vorrq_s32(vandq_s32(l, low), vshlq_n_s32::<16>(h)), lo, hi)
        }
        unsafe fn shl(a: [int32x4_t; 4], n: u32) -> [int32x4_t; 4] {
            let s = vdupq_n_s32(n as i32);
            each!(|x| vshlq_s32(x, s), a)
        }
        unsafe fn splat2(lo: i32, hi: i32) -> [int32x4_t; 4] {
            let v = vreinterpretq_s32_u64(vdupq_n_u64(((hi as u32 as u64) << 32) | lo as u32 as u64));
            [v; 4]
        }
        unsafe fn rows_bytes<const SIGNED: bool>(p0: *const u8, p1: *const u8) -> [int32x4_t; 4] {
            let (x0, x1) = (vld1_u8(p0), vld1_u8(p1));
            let (z0, z1) = (vzip1_u8(x0, x1), vzip2_u8(x0, x1));
            if SIGNED {
                let (w0, w1) = (vmovl_s8(vreinterpret_s8_u8(z0)), vmovl_s8(vreinterpret_s8_u8(z1)));
                [vmovl_s16(vget_low_s16(w0)), vmovl_s16(vget_high_s16(w0)), vmovl_s16(vget_low_s16(w1)), vmovl_s16(vget_high_s16(w1))]
            } else {
                let (w0, w1) = (vmovl_u8(z0), vmovl_u8(z1));
                let f = |x: uint16x4_t| vreinterpretq_s32_u32(vmovl_u16(x));
                [f(vget_low_u16(w0)), f(vget_high_u16(w0)), f(vget_low_u16(w1)), f(vget_high_u16(w1))]
            }
        }
        unsafe fn pair_sum(a: [int32x4_t; 4]) -> [int32x4_t; 4] {
            each!(|x| vaddq_s32(x, vrev64q_s32(x)), a)
        }
        unsafe fn cvt(a: [int32x4_t; 4]) -> [float32x4_t; 4] {
            each!(|x| vcvtq_f32_s32(x), a)
        }
        unsafe fn rows_f16(p: *const u8) -> [float32x4_t; 4] {
            let v: [f32; 16] = std::array::from_fn(|l| {
                let r = l / 2;
                f16::from_le_bytes([*p.add(2 * r), *p.add(2 * r + 1)]).to_f32()
            });
            [vld1q_f32(v.as_ptr()), vld1q_f32(v.as_ptr().add(4)), vld1q_f32(v.as_ptr().add(8)), vld1q_f32(v.as_ptr().add(12))]
        }
        unsafe fn fsplat2(lo: f32, hi: f32) -> [float32x4_t; 4] {
            let v = vreinterpretq_f32_u64(vdupq_n_u64(((hi.to_bits() as u64) << 32) | lo.to_bits() as u64));
            [v; 4]
        }
        unsafe fn fsplat(v: f32) -> [float32x4_t; 4] {
            [vdupq_n_f32(v); 4]
        }
        unsafe fn fzero() -> [float32x4_t; 4] {
            [vdupq_n_f32(0.0); 4]
        }
        unsafe fn fadd(a: [float32x4_t; 4], b: [float32x4_t; 4]) -> [float32x4_t; 4] {
            each!(|x, y| vaddq_f32(x, y), a, b)
        }
        unsafe fn fsub(a: [float32x4_t; 4], b: [float32x4_t; 4]) -> [float32x4_t; 4] {
            each!(|x, y| vsubq_f32(x, y), a, b)
        }
        unsafe fn fmul(a: [float32x4_t; 4], b: [float32x4_t; 4]) -> [float32x4_t; 4] {
            each!(|x, y| vmulq_f32(x, y), a, b)
        }
        unsafe fn fma(a: [float32x4_t; 4], b: [float32x4_t; 4], c: [float32x4_t; 4]) -> [float32x4_t; 4] {
            each!(|x, y, z| vfmaq_f32(z, x, y), a, b, c)
        }
        unsafe fn fstore(a: [float32x4_t; 4]) -> [f32; 16] {
            std::mem::transmute(a)
        }
    }
}
