//! The tower in llama.cpp 11434's CPU arithmetic ([`crate::Numerics::LlamaCpp`]):
//! the graph of `tools/mtmd/models/muse-glimmer.cpp` op by op, each op in the
//! order of the ggml CPU kernel that runs it on the given x86 build, so that
//! the rounding is llama.cpp's and not only the math:
//! - `ggml_conv_2d` (patch embedding): im2col in f16, so pixels and kernel
//!   are rounded to f16 (an f32 im2col for a BF16 kernel), then a tinyBLAS product;
//! - `ggml_mul_mat`: llamafile's tinyBLAS for 2+ rows against a matrix of a
//!   multiple of 4 rows, else `ggml_vec_dot_*`; F16 weights take f16
//!   activations; other weight types take hearth's model of llama.cpp's
//!   quantized matmuls (`hearth_kernels::cpu::matmul`, AVX-512 orders);
//! - `ggml_norm` (then the gain and the bias as their own ops), ggml's RoPE
//!   (iterative frequencies, contracted rotations), glibc's `erff` GELU;
//! - flash attention with f16 K/V ([`attend_segments`]);
//! - every `ggml_add` (biases, residuals) as its own f32 add.

use hearth_gguf::GgmlType;
use hearth_kernels::cpu::ggml_order::activations::RefIsa;
use hearth_kernels::cpu::ggml_order::flash_attn::attend_segments;
use hearth_kernels::cpu::ggml_order::half_dot::{
    dot_f16_isa, dot_tinyblas_isa, hsum_isa, vec_dot_f32_isa,
};
use hearth_kernels::pool::ThreadPool;
use hearth_kernels::{matmul, Activations, RowOrder};

use crate::encoder::pixel_shuffle;
use crate::layout::TokenLayout;
use crate::mmproj::{Linear, MmProj, Norm, Weight};
use crate::ops::par_rows;
use crate::tower::TowerInputs;

fn round_f16(x: &mut [f32]) {
    x.iter_mut()
        .for_each(|v| *v = half::f16::from_f32(*v).to_f32());
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn erff(x: f32) -> f32 {
    extern "C" {
        // glibc's libm, which std links on this target (and llama.cpp calls).
        #[link_name = "erff"]
        fn c_erff(x: f32) -> f32;
    }
    // SAFETY: a pure libm function of one float.
    unsafe { c_erff(x) }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn erff(x: f32) -> f32 {
    libm::erff(x)
}

/// `ggml_vec_gelu_erf_f32`: `0.5·x·(1 + erff(x·(1/√2)))`.
fn gelu(pool: &ThreadPool, x: &mut [f32], width: usize) {
    const SQRT_2_INV: f32 = std::f32::consts::FRAC_1_SQRT_2;
    par_rows(pool, x, width, |_, rows| {
        rows.iter_mut()
            .for_each(|v| *v = 0.5 * *v * (1.0 + erff(*v * SQRT_2_INV)));
    });
}

/// `ggml_add` of a row vector to every row (or of a same-shape tensor).
fn add(pool: &ThreadPool, x: &mut [f32], y: &[f32]) {
    let width = y.len().min(x.len());
    par_rows(pool, x, width, |start, rows| {
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            let src = if y.len() == width {
                y
            } else {
                &y[(start + i) * width..(start + i + 1) * width]
            };
            row.iter_mut().zip(src).for_each(|(a, &b)| *a += b);
        }
    });
}

/// `ggml_norm` (`(x − mean)·(1/sqrtf(var + eps))`, mean from a double sum
/// rounded to f32, the variance from `ggml_vec_cvar_f32`'s per-vector sums),
/// then `ggml_mul` by the gain and `ggml_add` of the bias.
fn layer_norm(pool: &ThreadPool, x: &[f32], n: &Norm, eps: f32, isa: RefIsa) -> Vec<f32> {
    let width = n.w.len();
    let mut y = x.to_vec();
    let lanes = isa.lanes();
    par_rows(pool, &mut y, width, |_, rows| {
        for row in rows.chunks_exact_mut(width) {
            let sum = row.iter().map(|&v| v as f64).sum::<f64>() as f32;
            let mean = sum / width as f32;
            let mut var = 0f64;
            let whole = width - width % lanes;
            for chunk in row[..whole].chunks_exact_mut(lanes) {
                let mut sq = [0f32; 16];
                for (i, v) in chunk.iter_mut().enumerate() {
                    *v -= mean;
                    sq[i] = *v * *v;
                }
                var += hsum_isa(&sq[..lanes], isa) as f64;
            }
            for v in &mut row[whole..] {
                *v -= mean;
                var += (*v * *v) as f64;
            }
            let var = (var / width as f64) as f32;
            let scale = 1.0f32 / (var + eps).sqrt();
            for ((v, &g), &b) in row.iter_mut().zip(&n.w).zip(&n.b) {
                *v = *v * scale * g + b;
            }
        }
    });
    y
}

/// ggml's RoPE (mode 0) of the tower: the first half of each head turns its
/// pairs by the patch's column + 1, the second half by its row + 1, with
/// `θ_{i+1} = θ_i · base^(−2/(head_dim/2))` from `θ_0 = pos` in f32, `cosf`/`sinf`,
/// and the rotation as GCC contracts it. `x`: `[n, n_head·head_dim]`, windowed order.
fn rope(
    pool: &ThreadPool,
    x: &mut [f32],
    layout: &TokenLayout,
    n_head: usize,
    hd: usize,
    base: f32,
) {
    let half = hd / 2;
    let scale = base.powf(-2.0 / half as f32);
    let angles = |pos: usize| -> Vec<(f32, f32)> {
        let mut theta = pos as f32;
        (0..half / 2)
            .map(|_| {
                let t = theta;
                theta *= scale;
                (t.cos(), t.sin())
            })
            .collect()
    };
    let max = layout.grid_h.max(layout.grid_w);
    let table: Vec<Vec<(f32, f32)>> = (0..=max).map(angles).collect();
    let width = n_head * hd;
    par_rows(pool, x, width, |start, rows| {
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            let t = layout.perm[start + i];
            let (r, c) = (t / layout.grid_w, t % layout.grid_w);
            for head in row.chunks_exact_mut(hd) {
                for (part, pos) in [(0, c + 1), (half, r + 1)] {
                    for (j, &(cos, sin)) in table[pos].iter().enumerate() {
                        let (a, b) = (part + 2 * j, part + 2 * j + 1);
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0.mul_add(cos, -(x1 * sin));
                        head[b] = x0.mul_add(sin, x1 * cos);
                    }
                }
            }
        }
    });
}

/// `ggml_mul_mat(W, x)` → `[n, rows]` (module docs).
fn mul_mat(
    pool: &ThreadPool,
    mm: &MmProj,
    x: &[f32],
    n: usize,
    w: &Weight,
    isa: RefIsa,
) -> Vec<f32> {
    let m = w.matrix(&mm.file);
    let mut out = vec![0f32; n * w.rows];
    if !matches!(w.ty, GgmlType::F32 | GgmlType::F16) {
        matmul(
            &m,
            x,
            n,
            &mut out,
            Activations::Quantized,
            RowOrder::Batched,
        );
        return out;
    }
    let mut xs = x.to_vec();
    if w.ty == GgmlType::F16 {
        round_f16(&mut xs);
    }
    let tiny = n >= 2 && w.rows % 4 == 0;
    let dot = |a: &[f32], b: &[f32]| match (tiny, w.ty) {
        (true, _) => dot_tinyblas_isa(a, b, isa),
        (false, GgmlType::F32) => vec_dot_f32_isa(a, b, isa),
        (false, _) => dot_f16_isa(a, b, isa),
    };
    products(
        pool,
        &xs,
        n,
        w.cols,
        w.rows,
        |r, row| m.dequantize_row(r, row),
        dot,
        &mut out,
    );
    out
}

/// `out[t][r] = dot(x[t], W[r])` with W's rows produced by `row`, split over
/// the pool by weight rows.
#[allow(clippy::too_many_arguments)]
fn products(
    pool: &ThreadPool,
    x: &[f32],
    n: usize,
    cols: usize,
    rows: usize,
    row: impl Fn(usize, &mut [f32]) + Sync,
    dot: impl Fn(&[f32], &[f32]) -> f32 + Sync,
    out: &mut [f32],
) {
    let p = hearth_kernels::pool::SendPtr(out.as_mut_ptr());
    pool.run(|t, nt| {
        let mut wrow = vec![0f32; cols];
        for r in hearth_kernels::pool::share(rows, t, nt) {
            row(r, &mut wrow);
            for (i, xr) in x.chunks_exact(cols).take(n).enumerate() {
                // SAFETY: each thread writes only its own columns r of `out`.
                unsafe { *p.get().add(i * rows + r) = dot(xr, &wrow) };
            }
        }
    });
}

impl MmProj {
    /// `ggml_mul_mat` then, with a bias, `ggml_add`.
    fn linear_ggml(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        l: &Linear,
        isa: RefIsa,
    ) -> Vec<f32> {
        let mut y = mul_mat(pool, self, x, n, &l.w, isa);
        if let Some(b) = &l.b {
            add(pool, &mut y, b);
        }
        y
    }

    /// `ggml_conv_2d` of the patch kernel over the image, as im2col rows
    /// (`patches`, `[n, cols]`) times the kernel (module docs), then the bias.
    fn patch_embed_ggml(
        &self,
        pool: &ThreadPool,
        patches: &[f32],
        n: usize,
        isa: RefIsa,
    ) -> Vec<f32> {
        let l = &self.patch;
        let w = &l.w;
        let f16 = w.ty != GgmlType::BF16;
        let mut a = patches.to_vec();
        if f16 {
            round_f16(&mut a);
        }
        let m = w.matrix(&self.file);
        let row = |r: usize, out: &mut [f32]| {
            m.dequantize_row(r, out);
            if f16 {
                round_f16(out);
            }
        };
        // The im2col is the matmul's first operand: `m` = patches, a multiple of 4.
        let tiny = w.rows >= 2 && n % 4 == 0;
        let dot = |a: &[f32], b: &[f32]| match (tiny, f16) {
            (true, _) => dot_tinyblas_isa(a, b, isa),
            (false, true) => dot_f16_isa(a, b, isa),
            (false, false) => vec_dot_f32_isa(a, b, isa),
        };
        let mut out = vec![0f32; n * w.rows];
        products(pool, &a, n, w.cols, w.rows, row, dot, &mut out);
        if let Some(b) = &l.b {
            add(pool, &mut out, b);
        }
        out
    }

    /// [`MmProj::encode_patches`] in llama.cpp's arithmetic (module docs).
    pub(crate) fn encode_ggml(
        &self,
        pool: &ThreadPool,
        inp: &TowerInputs,
        grid_h: usize,
        grid_w: usize,
        isa: RefIsa,
    ) -> Vec<f32> {
        let c = &self.config;
        let (d, n, hd) = (c.n_embd, inp.n_patches, c.head_dim);
        let folded = 3 * c.patch_size * c.patch_size;
        let layout = TokenLayout::new(grid_h, grid_w, c.pos_side);
        let patches = if self.patch.w.cols == folded {
            std::borrow::Cow::Borrowed(&inp.patches)
        } else {
            std::borrow::Cow::Owned(
                inp.patches
                    .chunks_exact(folded)
                    .flat_map(|p| p.iter().chain(p))
                    .copied()
                    .collect::<Vec<f32>>(),
            )
        };
        let mut x = self.patch_embed_ggml(pool, &patches, n, isa);
        add(pool, &mut x, &inp.pos);
        let mut x = layer_norm(pool, &x, &self.pre_ln, c.eps, isa);
        let everything = 0..n;
        let scale = 1.0f32 / (hd as f32).sqrt();
        let mut attn = vec![0f32; n * d];
        for (b, &is_global) in self.blocks.iter().zip(&inp.global) {
            let segments = if is_global {
                std::slice::from_ref(&everything)
            } else {
                &inp.windows[..]
            };
            let h = layer_norm(pool, &x, &b.ln1, c.eps, isa);
            let mut q = self.linear_ggml(pool, &h, n, &b.q, isa);
            let mut k = self.linear_ggml(pool, &h, n, &b.k, isa);
            let v = self.linear_ggml(pool, &h, n, &b.v, isa);
            rope(pool, &mut q, &layout, c.n_head, hd, c.rope_theta as f32);
            rope(pool, &mut k, &layout, c.n_head, hd, c.rope_theta as f32);
            attend_segments(
                pool, &q, &k, &v, n, c.n_head, hd, segments, scale, isa, &mut attn,
            );
            let o = self.linear_ggml(pool, &attn, n, &b.o, isa);
            add(pool, &mut x, &o);
            let h = layer_norm(pool, &x, &b.ln2, c.eps, isa);
            let mut u = self.linear_ggml(pool, &h, n, &b.up, isa);
            gelu(pool, &mut u, c.n_ff);
            let dn = self.linear_ggml(pool, &u, n, &b.down, isa);
            add(pool, &mut x, &dn);
        }
        let x = layer_norm(pool, &x, &self.post_ln, c.eps, isa);
        let mm = c.merge * c.merge;
        let u = pixel_shuffle(&x, &inp.shuffle, d, mm);
        let n_out = n / mm;
        let [w0, w1, w2] = &self.projector;
        let mut z = mul_mat(pool, self, &u, n_out, w0, isa);
        gelu(pool, &mut z, w0.rows);
        let mut z = mul_mat(pool, self, &z, n_out, w1, isa);
        gelu(pool, &mut z, w1.rows);
        mul_mat(pool, self, &z, n_out, w2, isa)
    }
}
