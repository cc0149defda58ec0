//! Dot products of F16 and BF16 weight rows with activations converted to
//! the same type (their `vec_dot_type`), and of F32 rows with f32
//! activations, in the summation orders of llama.cpp's AVX-512 CPU build
//! (the reference build's ISA):
//!
//! - one activation row (decode): `ggml_vec_dot_f16` / `ggml_vec_dot_bf16`
//!   (ggml-cpu vec.cpp);
//! - two or more rows, when the matrix has a multiple of 4 rows: llamafile's
//!   `tinyBLAS` (sgemm.cpp), one accumulator vector per output, reduced at
//!   the end.
//!
//! Products of two f16 (11-bit significands) or two bf16 (8-bit) values are
//! exact in f32, so only the order of the additions decides the rounding.

use half::{bf16, f16};

use super::activations::RefIsa;

/// `_mm512_reduce_add_ps` as GCC expands it: halves added pairwise (+8, +4, +2, +1).
pub(crate) fn reduce_add_16(mut v: [f32; 16]) -> f32 {
    let mut width = 8;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

/// Dot product of two f16-valued rows (held as f32) in the summation order
/// of `ggml_vec_dot_f16` on AVX-512: 4 accumulators of 16 lanes over steps
/// of 64, folded 0+2, 1+3, 0+1, then `_mm512_reduce_add_ps`'s halving tree
/// (`GGML_F32x16_REDUCE`); the tail past a multiple of 64 added product by
/// product in f64.
pub(crate) fn dot_f16_ggml(a: &[f32], b: &[f32]) -> f32 {
    dot_f16_lanes::<16>(a, b, reduce_add_16)
}

/// [`dot_f16_ggml`] in the order of llama.cpp's AVX2 build: 4 accumulators
/// of 8 lanes over steps of 32, the same fold (`GGML_F32x8_REDUCE`), the 8
/// lanes then as `t[i] = x[i] + x[i+4]`, `(t0 + t1) + (t2 + t3)` (two
/// `hadd`s); the tail past a multiple of 32 product by product in f64.
pub(crate) fn dot_f16_ggml_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_f16_lanes::<8>(a, b, |v| {
        let t: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
        (t[0] + t[1]) + (t[2] + t[3])
    })
}

/// `ggml_vec_dot_f16` with vectors of `L` lanes: 4 accumulators over steps
/// of `4L`, folded 0+2, 1+3, 0+1, the lanes reduced by `reduce`, the tail
/// added in f64.
fn dot_f16_lanes<const L: usize>(a: &[f32], b: &[f32], reduce: impl Fn([f32; L]) -> f32) -> f32 {
    let step = 4 * L;
    let np = a.len() - a.len() % step;
    let mut acc = [[0.0f32; L]; 4];
    // Fixed-size chunks so the lanes compile to vector multiplies and adds.
    for (ac, bc) in a[..np].chunks_exact(step).zip(b[..np].chunks_exact(step)) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            let aa: &[f32; L] = ac[j * L..(j + 1) * L].try_into().expect("L lanes");
            let bb: &[f32; L] = bc[j * L..(j + 1) * L].try_into().expect("L lanes");
            for l in 0..L {
                lanes[l] += aa[l] * bb[l];
            }
        }
    }
    let v: [f32; L] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let mut sum = reduce(v) as f64;
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += (x * y) as f64;
    }
    sum as f32
}

/// `ggml_vec_dot_f16`'s order of the given llama.cpp x86 build.
pub fn dot_f16_isa(a: &[f32], b: &[f32], isa: RefIsa) -> f32 {
    match isa {
        RefIsa::Avx512 => dot_f16_ggml(a, b),
        RefIsa::Avx2 => dot_f16_ggml_avx2(a, b),
    }
}

fn f16_row(w: &[u8]) -> Vec<f32> {
    w.chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

fn bf16_row(w: &[u8]) -> Vec<f32> {
    w.chunks_exact(2)
        .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// `ggml_vec_dot_f16` (AVX-512) of an F16 weight row with f16 activations.
pub fn vec_dot_f16_x86(w: &[u8], y: &[f16]) -> f32 {
    let y: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    dot_f16_ggml(&f16_row(w), &y)
}

/// One output of llamafile's `tinyBLAS<16, __m512, __m512, ggml_fp16_t,
/// ggml_fp16_t, float>`: 16 lanes, lane `l` a sequential fma chain over
/// elements `16c + l` (the last chunk zero-padded), then `hsum`
/// (`_mm512_reduce_add_ps`).
pub fn dot_f16_tinyblas(w: &[u8], y: &[f16]) -> f32 {
    let w = f16_row(w);
    let mut lanes = [0.0f32; 16];
    for (c, wc) in w.chunks(16).enumerate() {
        for (l, &wv) in wc.iter().enumerate() {
            lanes[l] = wv.mul_add(y[16 * c + l].to_f32(), lanes[l]);
        }
    }
    reduce_add_16(lanes)
}

/// `x` with a subnormal value flushed to (signed) zero.
#[inline]
fn ftz(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// One lane of `vdpbf16ps` (Intel SDM): the odd pair's product added first,
/// then the even pair's, each an f32 fma (the products are exact) with
/// round-to-nearest-even, subnormal inputs read as zero and subnormal results
/// flushed to zero.
#[inline]
fn dpbf16_lane(acc: f32, a: [f32; 2], b: [f32; 2]) -> f32 {
    let (a, b) = ([ftz(a[0]), ftz(a[1])], [ftz(b[0]), ftz(b[1])]);
    let acc = ftz(a[1].mul_add(b[1], ftz(acc)));
    ftz(a[0].mul_add(b[0], acc))
}

/// `_mm512_dpbf16_ps(acc, a, b)` over 32 bf16 values (held as f32; a short
/// slice reads as zero-padded).
fn dpbf16_512(acc: &mut [f32; 16], a: &[f32], b: &[f32]) {
    let at = |s: &[f32], i: usize| s.get(i).copied().unwrap_or(0.0);
    for (l, lane) in acc.iter_mut().enumerate() {
        *lane = dpbf16_lane(
            *lane,
            [at(a, 2 * l), at(a, 2 * l + 1)],
            [at(b, 2 * l), at(b, 2 * l + 1)],
        );
    }
}

/// `ggml_vec_dot_bf16` with AVX512_BF16 of a BF16 weight row with bf16
/// activations: two 16-lane `vdpbf16ps` accumulators over steps of 64
/// (the first 32 values into one, the next 32 into the other), each
/// reduced by `_mm512_reduce_add_ps` and added to an f64 sum, then the tail
/// past a multiple of 64 product by product in f64.
pub fn vec_dot_bf16_x86(w: &[u8], y: &[bf16]) -> f32 {
    let w = bf16_row(w);
    let y: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    let np = w.len() & !63;
    let (mut c1, mut c2) = ([0.0f32; 16], [0.0f32; 16]);
    for i in (0..np).step_by(64) {
        dpbf16_512(&mut c1, &w[i..i + 32], &y[i..i + 32]);
        dpbf16_512(&mut c2, &w[i + 32..i + 64], &y[i + 32..i + 64]);
    }
    let mut sum = 0.0f64;
    sum += reduce_add_16(c1) as f64;
    sum += reduce_add_16(c2) as f64;
    for (x, v) in w[np..].iter().zip(&y[np..]) {
        sum += (x * v) as f64;
    }
    sum as f32
}

/// One output of llamafile's `tinyBLAS<32, __m512, __m512bh, ggml_bf16_t,
/// ggml_bf16_t, float>` (AVX512_BF16): one `vdpbf16ps` accumulator over
/// chunks of 32 values (the last one zero-padded), then `hsum`.
pub fn dot_bf16_tinyblas(w: &[u8], y: &[bf16]) -> f32 {
    let w = bf16_row(w);
    let y: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    let mut acc = [0.0f32; 16];
    for (wc, yc) in w.chunks(32).zip(y.chunks(32)) {
        dpbf16_512(&mut acc, wc, yc);
    }
    reduce_add_16(acc)
}

/// One output of llamafile's `tinyBLAS<16, __m512, __m512, float, float,
/// float>` (F32 weights, two or more f32 activation rows): 16 lanes of fma
/// chains over chunks of 16 (the last zero-padded), then `hsum`.
pub fn dot_f32_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    for (ac, bc) in a.chunks(16).zip(b.chunks(16)) {
        for (l, (&x, &y)) in ac.iter().zip(bc).enumerate() {
            lanes[l] = x.mul_add(y, lanes[l]);
        }
    }
    reduce_add_16(lanes)
}

/// llamafile's `hsum` of one accumulator vector of the given build: the
/// AVX-512 halving tree, or for AVX2 the 128-bit halves added, then
/// `movehl` and `movehdup` steps: `(w0 + w2) + (w1 + w3)`, `w_i = v_{i+4} + v_i`.
pub fn hsum_isa(v: &[f32], isa: RefIsa) -> f32 {
    match isa {
        RefIsa::Avx512 => reduce_add_16(v.try_into().expect("16 lanes")),
        RefIsa::Avx2 => {
            let w: [f32; 4] = std::array::from_fn(|i| v[i + 4] + v[i]);
            (w[0] + w[2]) + (w[1] + w[3])
        }
    }
}

/// One output of llamafile's `tinyBLAS` on the given x86 build for f32
/// operands (f16 or bf16 ones enter converted, which is exact): one fma chain
/// per lane over chunks of the build's width (16 or 8; the last chunk
/// zero-padded, `load_partial`), then [`hsum_isa`]. On x86 every `k` takes
/// this path.
pub fn dot_tinyblas_isa(a: &[f32], b: &[f32], isa: RefIsa) -> f32 {
    let width = isa.lanes();
    let mut lanes = [0.0f32; 16];
    for (ac, bc) in a.chunks(width).zip(b.chunks(width)) {
        for (l, (&x, &y)) in ac.iter().zip(bc).enumerate() {
            lanes[l] = x.mul_add(y, lanes[l]);
        }
    }
    hsum_isa(&lanes[..width], isa)
}

/// `ggml_vec_dot_f32` of the given x86 build (one activation row): on
/// AVX-512 [`vec_dot_f32_ggml`]; on AVX2 4 accumulators of 8 lanes over
/// steps of 32, folded (0+2, 1+3), (0+1), then `GGML_F32x8_REDUCE`'s
/// 128-bit halves added and two `hadd`s, then the tail added product by
/// product (as the AVX-512 one).
pub fn vec_dot_f32_isa(a: &[f32], b: &[f32], isa: RefIsa) -> f32 {
    if isa == RefIsa::Avx512 {
        return vec_dot_f32_ggml(a, b);
    }
    let np = a.len() & !31;
    let mut acc = [[0.0f32; 8]; 4];
    for (ac, bc) in a[..np].chunks_exact(32).zip(b[..np].chunks_exact(32)) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for l in 0..8 {
                lanes[l] = ac[8 * j + l].mul_add(bc[8 * j + l], lanes[l]);
            }
        }
    }
    let v: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += x * y;
    }
    sum
}

/// `ggml_vec_dot_f32` on AVX-512 (one activation row): 4 accumulators of 16
/// lanes over steps of 64 (`GGML_F32x16_REDUCE`), then the tail past a
/// multiple of 64 as a sequential f32 fma chain.
pub fn vec_dot_f32_ggml(a: &[f32], b: &[f32]) -> f32 {
    let np = a.len() & !63;
    let mut acc = [[0.0f32; 16]; 4];
    for (ac, bc) in a[..np].chunks_exact(64).zip(b[..np].chunks_exact(64)) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for l in 0..16 {
                lanes[l] = ac[16 * j + l].mul_add(bc[16 * j + l], lanes[l]);
            }
        }
    }
    let v: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let mut sum = reduce_add_16(v);
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every order computes the same sum as an f64 reference, up to f32
    /// rounding; the orders themselves differ (so they are not the same
    /// function under another name).
    #[test]
    fn half_orders_track_the_exact_sum() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut differ = 0;
        for n in [32usize, 96, 160, 256, 300] {
            for _ in 0..20 {
                let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let b: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let wh: Vec<u8> = a
                    .iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect();
                let wb: Vec<u8> = a
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect();
                let yh: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
                let yb: Vec<bf16> = b.iter().map(|&v| bf16::from_f32(v)).collect();
                let exact = |w: &[u8], y: &[f32], f: fn([u8; 2]) -> f32| -> f64 {
                    w.chunks_exact(2)
                        .zip(y)
                        .map(|(c, &v)| f([c[0], c[1]]) as f64 * v as f64)
                        .sum()
                };
                let yhf: Vec<f32> = yh.iter().map(|v| v.to_f32()).collect();
                let ybf: Vec<f32> = yb.iter().map(|v| v.to_f32()).collect();
                let eh = exact(&wh, &yhf, |c| f16::from_le_bytes(c).to_f32());
                let eb = exact(&wb, &ybf, |c| bf16::from_le_bytes(c).to_f32());
                let tol = 1e-5 * (n as f64).sqrt();
                for (got, want) in [
                    (vec_dot_f16_x86(&wh, &yh), eh),
                    (dot_f16_tinyblas(&wh, &yh), eh),
                    (vec_dot_bf16_x86(&wb, &yb), eb),
                    (dot_bf16_tinyblas(&wb, &yb), eb),
                ] {
                    assert!((got as f64 - want).abs() < tol, "n={n}: {got} vs {want}");
                }
                differ += (vec_dot_f16_x86(&wh, &yh) != dot_f16_tinyblas(&wh, &yh)) as usize;
                differ += (vec_dot_bf16_x86(&wb, &yb) != dot_bf16_tinyblas(&wb, &yb)) as usize;
            }
        }
        assert!(differ > 0, "the vec_dot and tinyBLAS orders never differed");
    }

    /// `vdpbf16ps` adds the odd product before the even one: with
    /// acc = 1, odd = 2^-24 and even = 2^-24, the two roundings lose both
    /// (1 + 2^-24 rounds to 1, twice), where a single rounding of the pair
    /// sum (2^-23) would not.
    #[test]
    fn dpbf16_rounds_after_each_product() {
        let tiny = 2f32.powi(-12);
        assert_eq!(dpbf16_lane(1.0, [tiny, tiny], [tiny, tiny]), 1.0);
        assert_eq!(dpbf16_lane(0.0, [tiny, 0.0], [tiny, 0.0]), 2f32.powi(-24));
    }
}
