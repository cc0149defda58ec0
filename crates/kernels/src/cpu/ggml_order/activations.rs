//! Elementwise activations as llama.cpp's x86 CPU backend evaluates them
//! (ggml's vector exp, the f16 GELU table), so gated MLPs round exactly as
//! the reference does.

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// exp(x) as ggml's AVX-512 `ggml_v_expf` computes it (ARM's optimized
/// routine: n = round(x·log2 e), a degree-5 polynomial in the reduced
/// argument, scaled by 2^n), not libm's `expf`. Past |n| > 192 it gives 0
/// for n <= 0 and +inf otherwise (so exp(-inf) = 0).
#[inline(always)]
pub fn expf_ggml_v(x: f32) -> f32 {
    // Branch-free (select at the end) so loops over it vectorize.
    const R: f32 = 12582912.0; // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8aa3b), R); // log2(e)
    let n = z - R;
    let b = (-n).mul_add(f32::from_bits(0x3f317200), x); // ln2 high
    let b = (-n).mul_add(f32::from_bits(0x35bfbe8e), b); // ln2 low
    let u = b * b;
    let p_hi = f32::from_bits(0x3c072010).mul_add(b, f32::from_bits(0x3d2b9f17));
    let p_mid = f32::from_bits(0x3e2aaf33).mul_add(b, f32::from_bits(0x3efffedb));
    let p_lo = f32::from_bits(0x3f7ffff6).mul_add(b, 1.0);
    let j = p_hi.mul_add(u, p_mid).mul_add(u, p_lo);
    // _mm512_scalef_ps: j · 2^n with one rounding (exact in f64, then to f32);
    // 2^n is exact in f64 for |n| <= 192.
    let nc = n.clamp(-192.0, 192.0);
    let r = (j as f64 * f64::from_bits(((nc as i64 + 1023) as u64) << 52)) as f32;
    let special = if n <= 0.0 { 0.0 } else { f32::INFINITY };
    if n.abs() > 192.0 {
        special
    } else {
        r
    }
}

/// exp(x) as ggml's AVX2 `ggml_v_expf` computes it: the same reduction and
/// polynomial coefficients as [`expf_ggml_v`], but evaluated as
/// `k + k·j` with `j` lacking the constant term and `k = 2^n` built in the
/// exponent bits, and a two-factor scaling past |n| > 126. Results differ
/// from the AVX-512 version in the last bit now and then.
#[inline(always)]
pub fn expf_ggml_v_avx2(x: f32) -> f32 {
    const R: f32 = 12582912.0; // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8aa3b), R); // log2(e)
    let n = z - R;
    let b = (-n).mul_add(f32::from_bits(0x3f317200), x); // ln2 high
    let b = (-n).mul_add(f32::from_bits(0x35bfbe8e), b); // ln2 low
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let p_hi = f32::from_bits(0x3c072010).mul_add(b, f32::from_bits(0x3d2b9f17));
    let p_mid = f32::from_bits(0x3e2aaf33).mul_add(b, f32::from_bits(0x3efffedb));
    let j = p_hi
        .mul_add(u, p_mid)
        .mul_add(u, f32::from_bits(0x3f7ffff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// Which of llama.cpp's x86 builds the reference numerics follow where
/// their arithmetic differs (the vector exp of SwiGLU): the AVX-512 build
/// (where hearth's f16 parity fixtures were made) or the AVX2 one. Models
/// load with [`RefIsa::native`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RefIsa {
    #[default]
    Avx512,
    Avx2,
}

impl RefIsa {
    /// The build a native llama.cpp compile on this machine is: AVX-512
    /// where the CPU has it, AVX2 on other x86-64 CPUs. (Elsewhere the
    /// AVX-512 arithmetic, as before; llama.cpp's NEON exp is not modelled.)
    /// `HEARTH_REF_ISA=avx512|avx2` follows that build instead, on any CPU
    /// (a test checking outputs recorded from one build sets it).
    pub fn native() -> RefIsa {
        match std::env::var("HEARTH_REF_ISA").as_deref() {
            Ok("avx512") => return RefIsa::Avx512,
            Ok("avx2") => return RefIsa::Avx2,
            _ => {}
        }
        #[cfg(target_arch = "x86_64")]
        if !is_x86_feature_detected!("avx512f") {
            return RefIsa::Avx2;
        }
        RefIsa::Avx512
    }

    /// How many of a row's `row` values the build's SwiGLU computes in whole
    /// vectors (16 or 8 lanes); the rest use libm's `expf`.
    pub fn vector_len(self, row: usize) -> usize {
        row - row % self.lanes()
    }

    /// f32 lanes of the build's vectors.
    pub fn lanes(self) -> usize {
        match self {
            RefIsa::Avx512 => 16,
            RefIsa::Avx2 => 8,
        }
    }

    /// The build's vector `ggml_v_expf` (one lane).
    #[inline(always)]
    pub fn expf_v(self, x: f32) -> f32 {
        match self {
            RefIsa::Avx512 => expf_ggml_v(x),
            RefIsa::Avx2 => expf_ggml_v_avx2(x),
        }
    }

    /// `silu(x) * y` for a value in the vector part of a row.
    #[inline(always)]
    pub fn swiglu_v(self, x: f32, y: f32) -> f32 {
        let e = match self {
            RefIsa::Avx512 => expf_ggml_v(0.0 - x),
            RefIsa::Avx2 => expf_ggml_v_avx2(0.0 - x),
        };
        x / (1.0 + e) * y
    }

    /// [`RefIsa::swiglu_v`] of 8 values: on a CPU with AVX-512 (F, VL, DQ)
    /// the AVX-512 build's arithmetic runs as ggml writes it (`ggml_v_silu`
    /// with `_mm512_scalef_ps`, on 8 lanes), elsewhere lane by lane. Bit for
    /// bit the same either way.
    #[inline]
    pub fn swiglu_v8(self, x: &[f32; 8], y: &[f32; 8]) -> [f32; 8] {
        #[cfg(target_arch = "x86_64")]
        if self == RefIsa::Avx512 && x86::has_avx512() {
            // SAFETY: the features were detected.
            return unsafe { x86::swiglu8_avx512(x, y) };
        }
        std::array::from_fn(|i| self.swiglu_v(x[i], y[i]))
    }
}

/// ggml's AVX-512 SwiGLU, lane for lane (ggml-cpu vec.h `ggml_v_expf`,
/// `ggml_v_silu`, vec.cpp `ggml_vec_swiglu_f32`).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("fma")
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    fn c(bits: u32) -> __m256 {
        _mm256_set1_ps(f32::from_bits(bits))
    }

    /// `ggml_v_expf` (AVX-512) on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    fn expf8(x: __m256) -> __m256 {
        let r = _mm256_set1_ps(12582912.0); // 0x1.8p23
        let z = _mm256_fmadd_ps(x, c(0x3fb8aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bfbe8e), _mm256_fnmadd_ps(n, c(0x3f317200), x));
        let abs_n = _mm256_and_ps(n, c(0x7fff_ffff));
        let d = _mm256_cmp_ps_mask::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c072010), b, c(0x3d2b9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2aaf33), b, c(0x3efffedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7ffff6), b, _mm256_set1_ps(1.0)),
        );
        let res = _mm256_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm256_setzero_ps();
        let le0 = _mm256_cmp_ps_mask::<_CMP_LE_OQ>(n, zero);
        let alt = _mm256_mask_blend_ps(le0, _mm256_set1_ps(f32::INFINITY), zero);
        _mm256_mask_blend_ps(d, res, alt)
    }

    /// `ggml_v_silu(x) * y` on 8 lanes.
    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    pub unsafe fn swiglu8_avx512(x: &[f32; 8], y: &[f32; 8]) -> [f32; 8] {
        let (xv, yv) = (_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
        let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), xv));
        let s = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(s, yv));
        out
    }
}

/// SwiGLU as ggml's `ggml_vec_swiglu_f32` evaluates it, per row of `row`
/// values: `silu(a) * b` with silu = a / (1 + vector exp(-a)) for whole
/// vectors of the build's width, libm `expf` for a row's tail.
pub fn swiglu_ggml(a: &mut [f32], b: &[f32], row: usize, isa: RefIsa) {
    for (ra, rb) in a.chunks_exact_mut(row).zip(b.chunks_exact(row)) {
        let vec_len = isa.vector_len(row);
        for (x, y) in ra[..vec_len]
            .chunks_exact_mut(8)
            .zip(rb[..vec_len].chunks_exact(8))
        {
            let x: &mut [f32; 8] = x.try_into().expect("8 values");
            *x = isa.swiglu_v8(x, y.try_into().expect("8 values"));
        }
        ra[vec_len..]
            .iter_mut()
            .zip(&rb[vec_len..])
            .for_each(|(x, y)| *x = silu(*x) * y);
    }
}

/// [`gelu_tanh`] as GCC compiles ggml's `ggml_gelu_f32` (-O3, fp-contract=fast):
/// `1 + a·x·x` becomes one fused multiply-add.
fn gelu_tanh_fma(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (0.044715 * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// GELU as llama.cpp's CPU backend evaluates it: the input rounded to f16,
/// looked up in a table of f16 results (`GGML_GELU_FP16`), so exactly
/// f16(gelu(f16(x))) inside (-10, 10). Gemma's parity with the reference
/// depends on matching this rounding.
#[inline]
pub fn gelu_f16_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        // ggml's table: one entry per f16 input.
        static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
        let table = TABLE.get_or_init(|| {
            (0..=u16::MAX)
                .map(|bits| {
                    half::f16::from_f32(gelu_tanh_fma(half::f16::from_bits(bits).to_f32())).to_f32()
                })
                .collect()
        });
        table[half::f16::from_f32(x).to_bits() as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The 8-lane SwiGLU (ggml's AVX-512 instructions where the CPU has
    /// them) equals the lane-by-lane emulation bit for bit, across the
    /// exp's whole range: underflow, overflow, infinities, NaN, zeros.
    #[test]
    fn swiglu_v8_equals_the_scalar_lanes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let special = [
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            88.0,
            -88.0,
            89.0,
            -104.0,
            133.0,
            -133.0,
            200.0,
            -200.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
        ];
        for isa in [RefIsa::Avx512, RefIsa::Avx2] {
            for round in 0..4000 {
                let x: [f32; 8] = std::array::from_fn(|i| match round % 4 {
                    0 => special[(round / 4 + i) % special.len()],
                    1 => rng.gen_range(-300.0f32..300.0),
                    2 => rng.gen_range(-12.0f32..12.0),
                    _ => f32::from_bits(rng.gen()),
                });
                let y: [f32; 8] = std::array::from_fn(|_| rng.gen_range(-4.0f32..4.0));
                let got = isa.swiglu_v8(&x, &y);
                for i in 0..8 {
                    let want = isa.swiglu_v(x[i], y[i]);
                    assert!(
                        got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
                        "{isa:?} x {} y {}: {} vs {}",
                        x[i],
                        y[i],
                        got[i],
                        want
                    );
                }
            }
        }
    }
}
