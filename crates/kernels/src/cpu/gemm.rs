//! A tiled f32 GEMM for many-row products (vision towers, prefill-sized
//! batches): `C[m, n] (+)= Σ_k A[m, k] · B[n, k]`, with A f32 activations and
//! B either f32 rows or a GGUF weight matrix of any type [`dequantize`]
//! handles (F16, BF16, Q8_0, K-quants, ...).
//!
//! Blocking follows the usual GotoBLAS/BLIS scheme: B is packed, `KC`
//! columns at a time, into panels of [`NR`] rows stored k-major (`NR`
//! consecutive values per k), dequantizing as it goes; every weight value is
//! therefore decoded once per call, not once per activation row. A micro
//! kernel then keeps an [`MR`]×[`NR`] tile of C in registers while it walks k,
//! reading A in place (row-major, any row stride).
//!
//! Numerics: per output, products are accumulated in k order with one fused
//! multiply-add per step, `KC` columns at a time into C. The SIMD kernel and
//! the scalar one ([`Kernel::Scalar`], `f32::mul_add`) therefore agree bit for
//! bit; unlike [`super::matmul`] nothing is quantized on the activation side.

use std::ops::Range;

use super::matmul::QMatrix;
use super::simd::{active, Isa};
use crate::pool::{share, SendPtr, ThreadPool};
use crate::quant::dequantize;

/// Rows of a micro tile (activation rows).
pub const MR: usize = 6;
/// Columns of a micro tile (B rows): two 8-lane vectors.
pub const NR: usize = 16;
/// Depth of a packed panel; a multiple of every GGUF block size (32, 256).
const KC: usize = 256;
/// A rows per pass over a packed block of B (its A rows stay in L2).
const MC: usize = 96;
/// B rows packed at a time (`NC × KC` f32 = 256 KiB).
const NC: usize = 256;

/// The B operand: `n` rows of `k` values.
#[derive(Clone, Copy, Debug)]
pub enum BMatrix<'a> {
    /// f32 rows; row `j` starts at `data[j * ld]`.
    F32 { data: &'a [f32], ld: usize },
    /// A GGUF matrix ([rows, cols] = [n, k]), decoded panel by panel.
    Quant(QMatrix<'a>),
}

impl BMatrix<'_> {
    fn check(&self, n: usize, k: usize) {
        match self {
            BMatrix::F32 { data, ld } => {
                assert!(*ld >= k, "gemm: B row stride {ld} < k {k}");
                assert!(
                    n == 0 || data.len() >= (n - 1) * ld + k,
                    "gemm: B is not [n, k]"
                );
            }
            BMatrix::Quant(q) => {
                assert_eq!((q.rows, q.cols), (n, k), "gemm: B is not [n, k]");
            }
        }
    }

    /// Writes rows `rows` (at most [`NR`]), columns `k0..k0 + kc`, into
    /// `dst` as `kc` groups of `NR` values (missing rows are zero).
    fn pack_panel(
        &self,
        rows: Range<usize>,
        k0: usize,
        kc: usize,
        dst: &mut [f32],
        tmp: &mut [f32],
    ) {
        debug_assert!(rows.len() <= NR && dst.len() >= kc * NR);
        let tmp = &mut tmp[..kc];
        for (jj, j) in rows.clone().enumerate() {
            let src: &[f32] = match self {
                BMatrix::F32 { data, ld } => &data[j * ld + k0..j * ld + k0 + kc],
                BMatrix::Quant(q) => {
                    let (bs, ts) = (q.ty.block_size(), q.ty.type_size());
                    let bytes = &q.row(j)[k0 / bs * ts..(k0 + kc) / bs * ts];
                    dequantize(q.ty, bytes, tmp).expect("weight types are validated at load");
                    tmp
                }
            };
            for (kk, &v) in src.iter().enumerate() {
                dst[kk * NR + jj] = v;
            }
        }
        for jj in rows.len()..NR {
            for kk in 0..kc {
                dst[kk * NR + jj] = 0.0;
            }
        }
    }
}

/// Which micro kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Portable; the reference for the SIMD kernel (bit-identical).
    Scalar,
    /// AVX2 + FMA (x86_64).
    Avx2,
    /// AVX-512F (x86_64): 12×16 tiles, one 16-lane accumulator per row.
    Avx512,
}

impl Kernel {
    /// The kernel for the active instruction set ([`active`]).
    pub fn detect() -> Kernel {
        match active() {
            Isa::Avx512 | Isa::Amx => Kernel::Avx512,
            Isa::Avx2 => Kernel::Avx2,
            _ => Kernel::Scalar,
        }
    }
}

/// Panels per micro tile of the AVX-512 kernel: 6 rows × 4 vectors of 16
/// columns, 24 accumulators; per k 4 loads of B and 6 broadcasts of A for 24
/// FMAs (the 6×16 AVX2 tile needs 8 loads for 12 FMAs of half the width).
#[cfg(target_arch = "x86_64")]
const WIDE512: usize = 4;

/// Per-thread packing buffers, reusable across calls.
#[derive(Default)]
pub struct GemmScratch {
    packed: Vec<f32>,
    tmp: Vec<f32>,
}

/// `C = A·Bᵀ` (or `C += A·Bᵀ` with `accumulate`) on the pool's threads, which
/// split the columns of C. A: `m` rows of `k` with stride `lda`; C: `m` rows
/// of `n` with stride `ldc`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    pool: &ThreadPool,
    a: &[f32],
    lda: usize,
    m: usize,
    k: usize,
    b: BMatrix,
    n: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check(a, lda, m, k, &b, n, c, ldc);
    let kernel = Kernel::detect();
    let cp = SendPtr(c.as_mut_ptr());
    // Split on whole panels so no two threads share a micro tile.
    let panels = n.div_ceil(NR);
    pool.run(|t, nt| {
        let p = share(panels, t, nt);
        let cols = p.start * NR..(p.end * NR).min(n);
        if cols.is_empty() {
            return;
        }
        let mut scratch = GemmScratch::default();
        // SAFETY: `check` validated every extent; threads write disjoint columns.
        unsafe {
            gemm_cols(
                kernel,
                a,
                lda,
                m,
                k,
                &b,
                cols,
                cp.get(),
                ldc,
                accumulate,
                &mut scratch,
            )
        };
    });
}

/// [`gemm`] on the calling thread only (for use inside a pool job).
#[allow(clippy::too_many_arguments)]
pub fn gemm_single(
    kernel: Kernel,
    a: &[f32],
    lda: usize,
    m: usize,
    k: usize,
    b: BMatrix,
    n: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut GemmScratch,
) {
    check(a, lda, m, k, &b, n, c, ldc);
    // SAFETY: `check` validated every extent and `c` is exclusively borrowed.
    unsafe {
        gemm_cols(
            kernel,
            a,
            lda,
            m,
            k,
            &b,
            0..n,
            c.as_mut_ptr(),
            ldc,
            accumulate,
            scratch,
        )
    };
}

/// The reference: a plain triple loop with an f64 accumulator per output.
#[allow(clippy::too_many_arguments)]
pub fn gemm_ref(
    a: &[f32],
    lda: usize,
    m: usize,
    k: usize,
    b: BMatrix,
    n: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check(a, lda, m, k, &b, n, c, ldc);
    let mut row = vec![0f32; k];
    for j in 0..n {
        match b {
            BMatrix::F32 { data, ld } => row.copy_from_slice(&data[j * ld..j * ld + k]),
            BMatrix::Quant(q) => q.dequantize_row(j, &mut row),
        }
        for i in 0..m {
            let ar = &a[i * lda..i * lda + k];
            let s: f64 = ar
                .iter()
                .zip(&row)
                .map(|(&x, &y)| x as f64 * y as f64)
                .sum();
            let out = &mut c[i * ldc + j];
            *out = if accumulate {
                (*out as f64 + s) as f32
            } else {
                s as f32
            };
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check(a: &[f32], lda: usize, m: usize, k: usize, b: &BMatrix, n: usize, c: &[f32], ldc: usize) {
    assert!(
        lda >= k && ldc >= n,
        "gemm: strides ({lda}, {ldc}) below (k {k}, n {n})"
    );
    assert!(
        m == 0 || a.len() >= (m - 1) * lda + k,
        "gemm: A is not [m, k]"
    );
    assert!(
        m == 0 || c.len() >= (m - 1) * ldc + n,
        "gemm: C is not [m, n]"
    );
    b.check(n, k);
    if let BMatrix::Quant(q) = b {
        assert!(
            KC.is_multiple_of(q.ty.block_size()) && k.is_multiple_of(q.ty.block_size()),
            "gemm: {} rows of {k} are not whole blocks",
            q.ty
        );
    }
}

/// Columns `cols` of C. Caller: extents validated, no other writer of these
/// columns.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_cols(
    kernel: Kernel,
    a: &[f32],
    lda: usize,
    m: usize,
    k: usize,
    b: &BMatrix,
    cols: Range<usize>,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    scratch: &mut GemmScratch,
) {
    if m == 0 || cols.is_empty() {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in cols.clone() {
                    *c.add(i * ldc + j) = 0.0;
                }
            }
        }
        return;
    }
    let nc_max = NC.min(cols.len().div_ceil(NR) * NR);
    scratch.packed.resize(nc_max * KC, 0.0);
    scratch.tmp.resize(KC, 0.0);
    for n0 in cols.clone().step_by(NC) {
        let n1 = (n0 + NC).min(cols.end);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            // Pack this block of B: panel p holds rows n0 + p·NR ..
            for (p, j0) in (n0..n1).step_by(NR).enumerate() {
                let dst = &mut scratch.packed[p * NR * kc..(p + 1) * NR * kc];
                b.pack_panel(j0..(j0 + NR).min(n1), k0, kc, dst, &mut scratch.tmp);
            }
            let load_c = accumulate || k0 > 0;
            for m0 in (0..m).step_by(MC) {
                let m1 = (m0 + MC).min(m);
                #[cfg(target_arch = "x86_64")]
                if kernel == Kernel::Avx512 {
                    // Groups of WIDE512 panels side by side (their packed
                    // buffers are consecutive, kc·NR apart).
                    let n_panels = (n1 - n0).div_ceil(NR);
                    for g0 in (0..n_panels).step_by(WIDE512) {
                        let j0 = n0 + g0 * NR;
                        let bp = scratch.packed[g0 * NR * kc..].as_ptr();
                        for i0 in (m0..m1).step_by(MR) {
                            let tile = Tile {
                                a: a.as_ptr().add(i0 * lda + k0),
                                lda,
                                b: bp,
                                kc,
                                c: c.add(i0 * ldc + j0),
                                ldc,
                                mr: MR.min(m1 - i0),
                                nr: (WIDE512 * NR).min(n1 - j0),
                                load_c,
                            };
                            micro_avx512(&tile);
                        }
                    }
                    continue;
                }
                for (p, j0) in (n0..n1).step_by(NR).enumerate() {
                    let bp = scratch.packed[p * NR * kc..].as_ptr();
                    let nr = NR.min(n1 - j0);
                    for i0 in (m0..m1).step_by(MR) {
                        let mr = MR.min(m1 - i0);
                        let ap = a.as_ptr().add(i0 * lda + k0);
                        let cp = c.add(i0 * ldc + j0);
                        let tile = Tile {
                            a: ap,
                            lda,
                            b: bp,
                            kc,
                            c: cp,
                            ldc,
                            mr,
                            nr,
                            load_c,
                        };
                        match kernel {
                            #[cfg(target_arch = "x86_64")]
                            Kernel::Avx2 => micro_avx2(&tile),
                            _ => micro_scalar(&tile),
                        }
                    }
                }
            }
        }
    }
}

/// One micro tile: `mr`×`nr` (at most [`MR`]×[`NR`], or [`WIDE512`]·[`NR`]
/// columns for the AVX-512 kernel) outputs at `c`, A rows at `a` (stride `lda`), a packed
/// B panel at `b`, depth `kc`.
#[derive(Clone, Copy)]
struct Tile {
    a: *const f32,
    lda: usize,
    b: *const f32,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    load_c: bool,
}

impl Tile {
    /// Row pointers of A; rows past `mr` repeat the last one (their results
    /// are discarded).
    unsafe fn rows(&self) -> [*const f32; MR] {
        std::array::from_fn(|r| self.a.add(r.min(self.mr - 1) * self.lda))
    }

    unsafe fn load(&self, acc: &mut [[f32; NR]; MR]) {
        for (r, row) in acc.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = if self.load_c && r < self.mr && j < self.nr {
                    *self.c.add(r * self.ldc + j)
                } else {
                    0.0
                };
            }
        }
    }

    unsafe fn store(&self, acc: &[[f32; NR]; MR]) {
        for (r, row) in acc.iter().enumerate().take(self.mr) {
            for (j, &v) in row.iter().enumerate().take(self.nr) {
                *self.c.add(r * self.ldc + j) = v;
            }
        }
    }
}

unsafe fn micro_scalar(t: &Tile) {
    // Tiles of up to MR rows (the AVX-512 driver's are taller: done in parts;
    // each output's sum is independent of the tiling).
    for r0 in (0..t.mr).step_by(MR) {
        let part = Tile {
            a: t.a.add(r0 * t.lda),
            c: t.c.add(r0 * t.ldc),
            mr: MR.min(t.mr - r0),
            ..*t
        };
        let rows = part.rows();
        let mut acc = [[0f32; NR]; MR];
        part.load(&mut acc);
        for kk in 0..part.kc {
            let bk = std::slice::from_raw_parts(part.b.add(kk * NR), NR);
            for (r, row) in acc.iter_mut().enumerate() {
                let av = *rows[r].add(kk);
                for (v, &bv) in row.iter_mut().zip(bk) {
                    *v = av.mul_add(bv, *v);
                }
            }
        }
        part.store(&acc);
    }
}

/// 6 rows × 4 panels of 16 columns (`t.nr` up to 64; the panels' packed
/// buffers `kc·NR` apart): per k four loads of B and six broadcasts of A
/// (folded into the FMAs). Each output is the same chain of FMAs over k as in
/// the scalar and AVX2 kernels, so all three agree bit for bit. Edges (fewer
/// rows or columns) use lane masks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro_avx512(t: &Tile) {
    use std::arch::x86_64::*;
    let masks: [__mmask16; WIDE512] = std::array::from_fn(|q| {
        let cols = t.nr.saturating_sub(q * NR).min(NR);
        if cols == NR {
            0xffff
        } else {
            (1u16 << cols) - 1
        }
    });
    let rows = t.rows();
    let mut acc = [[_mm512_setzero_ps(); WIDE512]; MR];
    if t.load_c {
        for (r, v) in acc.iter_mut().enumerate().take(t.mr) {
            for (q, x) in v.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_ps(masks[q], t.c.add(r * t.ldc + q * NR));
            }
        }
    }
    let stride = t.kc * NR;
    let panels: [*const f32; WIDE512] = std::array::from_fn(|q| {
        // A panel past the tile's columns is never read (its mask is 0):
        // point it at the first one.
        if masks[q] == 0 {
            t.b
        } else {
            t.b.add(q * stride)
        }
    });
    for kk in 0..t.kc {
        let b: [__m512; WIDE512] =
            std::array::from_fn(|q| _mm512_maskz_loadu_ps(masks[q], panels[q].add(kk * NR)));
        for (v, p) in acc.iter_mut().zip(&rows) {
            let av = _mm512_set1_ps(*p.add(kk));
            for (x, bq) in v.iter_mut().zip(&b) {
                *x = _mm512_fmadd_ps(av, *bq, *x);
            }
        }
    }
    for (r, v) in acc.iter().enumerate().take(t.mr) {
        for (q, x) in v.iter().enumerate() {
            _mm512_mask_storeu_ps(t.c.add(r * t.ldc + q * NR), masks[q], *x);
        }
    }
}

/// The hot loop: 12 accumulators (6 rows × 2 vectors), per k two loads of B
/// and six broadcasts of A.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn micro_avx2(t: &Tile) {
    use std::arch::x86_64::*;
    let rows = t.rows();
    let full = t.mr == MR && t.nr == NR;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    if full {
        if t.load_c {
            for (r, v) in acc.iter_mut().enumerate() {
                let p = t.c.add(r * t.ldc);
                *v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))];
            }
        }
    } else {
        let mut tmp = [[0f32; NR]; MR];
        t.load(&mut tmp);
        for (v, row) in acc.iter_mut().zip(&tmp) {
            *v = [
                _mm256_loadu_ps(row.as_ptr()),
                _mm256_loadu_ps(row.as_ptr().add(8)),
            ];
        }
    }
    let [r0, r1, r2, r3, r4, r5] = rows;
    let mut b = t.b;
    for kk in 0..t.kc {
        let b0 = _mm256_loadu_ps(b);
        let b1 = _mm256_loadu_ps(b.add(8));
        b = b.add(NR);
        macro_rules! row {
            ($i:expr, $p:expr) => {{
                let av = _mm256_broadcast_ss(&*$p.add(kk));
                acc[$i][0] = _mm256_fmadd_ps(av, b0, acc[$i][0]);
                acc[$i][1] = _mm256_fmadd_ps(av, b1, acc[$i][1]);
            }};
        }
        row!(0, r0);
        row!(1, r1);
        row!(2, r2);
        row!(3, r3);
        row!(4, r4);
        row!(5, r5);
    }
    if full {
        for (r, v) in acc.iter().enumerate() {
            let p = t.c.add(r * t.ldc);
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
        }
    } else {
        let mut tmp = [[0f32; NR]; MR];
        for (v, row) in acc.iter().zip(tmp.iter_mut()) {
            _mm256_storeu_ps(row.as_mut_ptr(), v[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), v[1]);
        }
        t.store(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_to_vec;
    use hearth_gguf::GgmlType;
    use rand::{Rng, SeedableRng};

    fn rand_vec(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    /// Every kernel against the f64 reference on odd shapes (partial tiles,
    /// several KC blocks, row strides), and the SIMD kernel bit for bit
    /// against the scalar one.
    #[test]
    fn kernels_match_the_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let pool = ThreadPool::new(3);
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 17, 5),
            (13, 40, 300),
            (96 + 7, 16 * 17 + 3, 513),
            (6, 16, 256),
            (12, 16, 100),
            (25, 33, 70),
            (7, 64, 40),
            (13, 16 * 9 + 5, 260),
        ] {
            let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
            let a = rand_vec(&mut rng, m * lda);
            let bdata = rand_vec(&mut rng, n * ldb);
            let b = BMatrix::F32 {
                data: &bdata,
                ld: ldb,
            };
            let c0 = rand_vec(&mut rng, m * ldc);
            for accumulate in [false, true] {
                let mut want = c0.clone();
                gemm_ref(&a, lda, m, k, b, n, &mut want, ldc, accumulate);
                let mut outs = Vec::new();
                let mut kernels = vec![Kernel::Scalar];
                #[cfg(target_arch = "x86_64")]
                {
                    if Isa::Avx2.supported() {
                        kernels.push(Kernel::Avx2);
                    }
                    if Isa::Avx512.supported() {
                        kernels.push(Kernel::Avx512);
                    }
                }
                for &kernel in &kernels {
                    let mut got = c0.clone();
                    let mut s = GemmScratch::default();
                    gemm_single(
                        kernel, &a, lda, m, k, b, n, &mut got, ldc, accumulate, &mut s,
                    );
                    outs.push(got);
                }
                let mut pooled = c0.clone();
                gemm(&pool, &a, lda, m, k, b, n, &mut pooled, ldc, accumulate);
                outs.push(pooled);
                for got in &outs {
                    for i in 0..m {
                        for j in 0..ldc {
                            let (g, w) = (got[i * ldc + j], want[i * ldc + j]);
                            if j >= n {
                                assert_eq!(
                                    g.to_bits(),
                                    c0[i * ldc + j].to_bits(),
                                    "padding written"
                                );
                            } else {
                                assert!(
                                    (g - w).abs() <= 1e-5 * (k as f32).sqrt() * 4.0,
                                    "({m},{n},{k}) [{i},{j}]: {g} vs {w}"
                                );
                            }
                        }
                    }
                }
                let pooled = outs.pop().expect("pushed last");
                for (kernel, got) in kernels.iter().zip(&outs) {
                    assert_eq!(
                        &outs[0], got,
                        "{kernel:?} kernel differs from the scalar one"
                    );
                }
                assert_eq!(
                    outs[0], pooled,
                    "pooled gemm differs from the single-thread one"
                );
            }
        }
    }

    /// Quantized B: the product equals the reference over the dequantized rows.
    #[test]
    fn quantized_weights_match_the_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let pool = ThreadPool::new(2);
        for ty in [
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::F32,
        ] {
            let (m, n, k) = (11, 37, 512);
            let w = rand_vec(&mut rng, n * k);
            let bytes = quantize_to_vec(ty, &w).unwrap();
            let q = QMatrix {
                ty,
                rows: n,
                cols: k,
                data: &bytes,
            };
            let a = rand_vec(&mut rng, m * k);
            let mut want = vec![0f32; m * n];
            gemm_ref(&a, k, m, k, BMatrix::Quant(q), n, &mut want, n, false);
            let mut got = vec![0f32; m * n];
            gemm(&pool, &a, k, m, k, BMatrix::Quant(q), n, &mut got, n, false);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "{ty}: {g} vs {w}");
            }
        }
    }
}
