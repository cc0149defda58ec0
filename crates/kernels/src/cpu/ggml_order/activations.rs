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
    pub fn native() -> RefIsa {
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
}

/// SwiGLU as ggml's `ggml_vec_swiglu_f32` evaluates it, per row of `row`
/// values: `silu(a) * b` with silu = a / (1 + vector exp(-a)) for whole
/// vectors of the build's width, libm `expf` for a row's tail.
pub fn swiglu_ggml(a: &mut [f32], b: &[f32], row: usize, isa: RefIsa) {
    for (ra, rb) in a.chunks_exact_mut(row).zip(b.chunks_exact(row)) {
        let vec_len = isa.vector_len(row);
        for (x, y) in ra[..vec_len].iter_mut().zip(&rb[..vec_len]) {
            *x = isa.swiglu_v(*x, *y);
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
