//! Plain Rust implementation of [`Simd`]: the fallback and the reference the
//! vector implementations are tested against.

use half::f16;

use super::Simd;

#[derive(Clone, Copy)]
pub struct Scalar;

fn lanes<T: Copy + Default, const N: usize>(f: impl Fn(usize) -> T) -> [T; N] {
    std::array::from_fn(f)
}

impl Simd for Scalar {
    type U = [u8; 64];
    type I = [i32; 16];
    type F = [f32; 16];
    type P = [i32; 16];

    unsafe fn load(p: *const u8) -> [u8; 64] {
        std::ptr::read_unaligned(p as *const [u8; 64])
    }
    unsafe fn nib_lo(u: [u8; 64]) -> [u8; 64] {
        u.map(|b| b & 0x0f)
    }
    unsafe fn nib_hi(u: [u8; 64]) -> [u8; 64] {
        u.map(|b| b >> 4)
    }
    unsafe fn set_bit4(u: [u8; 64], bits: u64) -> [u8; 64] {
        lanes(|j| u[j] + (((bits >> j) & 1) as u8) * 16)
    }
    unsafe fn q6(lo: [u8; 64], hi: [u8; 64], shift: u32) -> [u8; 64] {
        lanes(|j| lo[j] | (((hi[j] >> shift) & 3) << 4))
    }
    unsafe fn izero() -> [i32; 16] {
        [0; 16]
    }
    unsafe fn pzero() -> [i32; 16] {
        [0; 16]
    }
    unsafe fn pdot(acc: [i32; 16], w: [u8; 64], a: u64) -> [i32; 16] {
        Self::dot_u8(acc, w, a)
    }
    unsafe fn pscales<const SIGNED: bool>(p: *const u8) -> [i32; 16] {
        Self::rows_bytes::<SIGNED>(p, p)
    }
    unsafe fn pscale(acc: [i32; 16], s: [i32; 16]) -> [i32; 16] {
        Self::mul(acc, s)
    }
    unsafe fn dot_u8(acc: [i32; 16], w: [u8; 64], a: u64) -> [i32; 16] {
        dot4(acc, w, a, |b| b as i32)
    }
    unsafe fn dot_i8(acc: [i32; 16], w: [u8; 64], a: u64) -> [i32; 16] {
        dot4(acc, w, a, |b| b as i8 as i32)
    }
    unsafe fn add(a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        lanes(|l| a[l].wrapping_add(b[l]))
    }
    unsafe fn sub(a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        lanes(|l| a[l].wrapping_sub(b[l]))
    }
    unsafe fn mul(a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        lanes(|l| a[l].wrapping_mul(b[l]))
    }
    unsafe fn madd16(a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        let h = |v: i32, k: u32| (v >> (16 * k)) as i16 as i32;
        lanes(|l| h(a[l], 0) * h(b[l], 0) + h(a[l], 1) * h(b[l], 1))
    }
    unsafe fn pack16(lo: [i32; 16], hi: [i32; 16]) -> [i32; 16] {
        lanes(|l| (lo[l] & 0xffff) | (hi[l] << 16))
    }
    unsafe fn shl(a: [i32; 16], n: u32) -> [i32; 16] {
        a.map(|v| v << n)
    }
    unsafe fn splat2(lo: i32, hi: i32) -> [i32; 16] {
        lanes(|l| if l % 2 == 0 { lo } else { hi })
    }
    unsafe fn rows_bytes<const SIGNED: bool>(p0: *const u8, p1: *const u8) -> [i32; 16] {
        lanes(|l| {
            let b = *[p0, p1][l % 2].add(l / 2);
            if SIGNED {
                b as i8 as i32
            } else {
                b as i32
            }
        })
    }
    unsafe fn pair_sum(a: [i32; 16]) -> [i32; 16] {
        lanes(|l| a[l & !1].wrapping_add(a[l | 1]))
    }
    unsafe fn cvt(a: [i32; 16]) -> [f32; 16] {
        a.map(|v| v as f32)
    }
    unsafe fn rows_f16(p: *const u8) -> [f32; 16] {
        lanes(|l| {
            let r = l / 2;
            f16::from_le_bytes([*p.add(2 * r), *p.add(2 * r + 1)]).to_f32()
        })
    }
    unsafe fn fsplat2(lo: f32, hi: f32) -> [f32; 16] {
        lanes(|l| if l % 2 == 0 { lo } else { hi })
    }
    unsafe fn fsplat(v: f32) -> [f32; 16] {
        [v; 16]
    }
    unsafe fn fzero() -> [f32; 16] {
        [0.0; 16]
    }
    unsafe fn fadd(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        lanes(|l| a[l] + b[l])
    }
    unsafe fn fsub(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        lanes(|l| a[l] - b[l])
    }
    unsafe fn fmul(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        lanes(|l| a[l] * b[l])
    }
    unsafe fn fma(a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        lanes(|l| a[l].mul_add(b[l], c[l]))
    }
    unsafe fn fstore(a: [f32; 16]) -> [f32; 16] {
        a
    }
}

/// `acc` plus, in each 32-bit lane, the sum of four products of a weight byte
/// (read by `weight`: unsigned or signed) and a signed byte of `a` (lane l:
/// row l/2, half l%2 of the 8-byte groups).
fn dot4(acc: [i32; 16], w: [u8; 64], a: u64, weight: impl Fn(u8) -> i32) -> [i32; 16] {
    let a = a.to_le_bytes();
    lanes(|l| {
        let (r, h) = (l / 2, l % 2);
        acc[l]
            + (0..4)
                .map(|i| weight(w[8 * r + 4 * h + i]) * a[4 * h + i] as i8 as i32)
                .sum::<i32>()
    })
}
