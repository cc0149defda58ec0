//! The small set of vector operations the packed matmul kernels are written
//! in, implemented once per instruction set, and the one place that decides
//! which instruction set runs.
//!
//! The kernels work on *units*: 64 bytes holding 8 bytes of quants for each
//! of 8 weight rows (byte `8r + i` is byte `i` of row `r`). Integer vectors
//! have 16 `i32` lanes; lane `2r + h` belongs to row `r` and covers bytes
//! `4h..4h + 4` of that row's 8 (so a dot product lane sums 4 products, like
//! llama.cpp's x86 kernels). Float vectors use the same lanes. Integer work
//! is exact in any order; every float operation is lane-wise (convert, mul,
//! fused multiply-add, add), so all instruction sets give bit-identical
//! results, equal to the scalar implementation.

use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// An instruction set the kernels can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL + VNNI (and AVX2/FMA/F16C).
    Avx512,
    /// AVX-512 plus AMX-INT8 tiles for the batched Q4_K products, where the
    /// CPU has them and the OS grants this process their state
    /// ([`crate::cpu::amx::granted`]).
    Amx,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        Some(match s.to_ascii_lowercase().as_str() {
            "scalar" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avx512" => Isa::Avx512,
            "amx" => Isa::Amx,
            "neon" => Isa::Neon,
            _ => return None,
        })
    }

    /// Whether this machine can run it.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.supported() && crate::cpu::amx::granted(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every instruction set this machine supports, best last.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    /// The best supported instruction set.
    pub fn detect() -> Isa {
        *Isa::available().last().expect("scalar is always available")
    }
}

/// The instruction set kernels use: the best detected one, or the one named
/// by `HEARTH_ISA` (scalar|avx2|avx512|amx|neon). Decided once per process; an
/// unsupported or unknown name is an error printed once, and detection wins.
pub fn active() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| match std::env::var("HEARTH_ISA") {
        Ok(name) => match Isa::parse(&name) {
            Some(isa) if isa.supported() => isa,
            Some(isa) => {
                eprintln!(
                    "hearth: HEARTH_ISA={name}: {} is not supported on this machine; using {}",
                    isa.name(),
                    Isa::detect().name()
                );
                Isa::detect()
            }
            None => {
                eprintln!(
                    "hearth: HEARTH_ISA={name}: unknown (scalar|avx2|avx512|amx|neon); using {}",
                    Isa::detect().name()
                );
                Isa::detect()
            }
        },
        Err(_) => Isa::detect(),
    })
}

/// Vector operations over units (see the module docs).
///
/// # Safety
///
/// All functions are `unsafe`: the caller guarantees the instruction set is
/// available and that pointers are valid for the bytes read.
#[allow(clippy::missing_safety_doc)]
pub trait Simd: Copy {
    /// 64 bytes: a unit.
    type U: Copy;
    /// 16 × i32, lane `2r + h`.
    type I: Copy;
    /// 16 × f32, lane `2r + h`.
    type F: Copy;

    /// Hints that the 64 bytes at `p` will be read soon (no-op where unsupported).
    unsafe fn prefetch(_p: *const u8) {}
    /// Loads a unit from `p` (64 bytes, unaligned).
    unsafe fn load(p: *const u8) -> Self::U;
    /// Low nibble of every byte.
    unsafe fn nib_lo(u: Self::U) -> Self::U;
    /// High nibble of every byte.
    unsafe fn nib_hi(u: Self::U) -> Self::U;
    /// Adds 16 to byte `j` where bit `j` of `bits` is set (the fifth bit of
    /// Q5 quants; the byte must be below 16).
    unsafe fn set_bit4(u: Self::U, bits: u64) -> Self::U;
    /// `lo | (((hi >> shift) & 3) << 4)` per byte (Q6_K quants); `lo` < 16.
    unsafe fn q6(lo: Self::U, hi: Self::U, shift: u32) -> Self::U;

    /// Partial sums for [`Simd::pdot`]: where a narrower exact form is
    /// cheaper (AVX2: the 16-bit sums `maddubs` gives), that; elsewhere the
    /// `I` lanes themselves.
    type P: Copy;

    unsafe fn izero() -> Self::I;
    unsafe fn pzero() -> Self::P;
    /// `acc` plus the products of [`Simd::dot_u8`] (unsigned weights).
    unsafe fn pdot(acc: Self::P, w: Self::U, a: u64) -> Self::P;
    /// Per-row multipliers for [`Simd::pscale`]: row `r`'s is byte `r` at
    /// `p` (`SIGNED`: sign-extended).
    unsafe fn pscales<const SIGNED: bool>(p: *const u8) -> Self::I;
    /// Each `I` lane's sum of the partial products times its row's
    /// multiplier. Exact when every lane's partial sum fits 16 bits (AVX2
    /// keeps 16-bit pairs, AVX-512 multiplies the low half of each 32-bit
    /// lane of 4 products): a chain of `k` `pdot`s over weights at most
    /// `wmax` needs `k · 4 · wmax · 128 <= 32767`.
    unsafe fn pscale(acc: Self::P, s: Self::I) -> Self::I;
    /// `acc + pscale(p, s)` (AVX-512: one `vpdpwssd`).
    unsafe fn pscale_acc(acc: Self::I, p: Self::P, s: Self::I) -> Self::I {
        Self::add(acc, Self::pscale(p, s))
    }
    /// `acc[2r+h] += Σ_{i<4} w[8r+4h+i] · a[4h+i]` with `w` unsigned, at most
    /// 127 (so no 16-bit saturation on AVX2), and `a` the 8 signed bytes of
    /// the activation packed little-endian into a u64.
    unsafe fn dot_u8(acc: Self::I, w: Self::U, a: u64) -> Self::I;
    /// The same with signed weights (and activations in -127..=127).
    unsafe fn dot_i8(acc: Self::I, w: Self::U, a: u64) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mul(a: Self::I, b: Self::I) -> Self::I;
    /// Each lane as two signed 16-bit halves: `lo(a)·lo(b) + hi(a)·hi(b)`.
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    /// `acc + madd16(a, b)` (AVX-512: one `vpdpwssd`).
    unsafe fn madd16_acc(acc: Self::I, a: Self::I, b: Self::I) -> Self::I {
        Self::add(acc, Self::madd16(a, b))
    }
    /// Each lane: the low 16 bits of `lo`'s lane below the low 16 bits of
    /// `hi`'s (the two signed halves [`Simd::madd16`] multiplies).
    unsafe fn pack16(lo: Self::I, hi: Self::I) -> Self::I;
    unsafe fn shl(a: Self::I, n: u32) -> Self::I;
    /// Lane `2r + h` = `[lo, hi][h]`.
    unsafe fn splat2(lo: i32, hi: i32) -> Self::I;
    /// Lane `2r + h` = `[p0, p1][h][r]`, bytes zero-extended (`SIGNED`: sign-extended).
    unsafe fn rows_bytes<const SIGNED: bool>(p0: *const u8, p1: *const u8) -> Self::I;
    /// Both lanes of a row get the row's sum: lanes `2r`, `2r + 1` = `a[2r] + a[2r+1]`.
    unsafe fn pair_sum(a: Self::I) -> Self::I;
    /// Two tokens' row sums in one vector: lane `2r + h` = `t[2r] + t[2r + 1]`
    /// with `t` = `[a, b][h]`.
    unsafe fn pair_sums2(a: Self::I, b: Self::I) -> Self::I {
        Self::add(
            Self::mul(Self::pair_sum(a), Self::splat2(1, 0)),
            Self::mul(Self::pair_sum(b), Self::splat2(0, 1)),
        )
    }

    /// Exact conversion (round to nearest even, as `as f32`).
    unsafe fn cvt(a: Self::I) -> Self::F;
    /// Lane `2r + h` = f16 `p[r]` (8 little-endian f16 at `p`) as f32.
    unsafe fn rows_f16(p: *const u8) -> Self::F;
    unsafe fn fsplat(v: f32) -> Self::F;
    /// Lane `2r + h` = `[lo, hi][h]`.
    unsafe fn fsplat2(lo: f32, hi: f32) -> Self::F;
    unsafe fn fzero() -> Self::F;
    unsafe fn fadd(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fsub(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fmul(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, one rounding.
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn fstore(a: Self::F) -> [f32; 16];
}
