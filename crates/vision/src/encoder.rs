//! The Muse Glimmer vision tower on the CPU (spec `vision.md` §9; llama.cpp
//! `tools/mtmd/models/muse-glimmer.cpp`): patch embedding, position table,
//! pre-LayerNorm ViT blocks with 2-D RoPE and windowed/global attention,
//! pixel shuffle, the 3-layer projector.
//!
//! Activations are f32 throughout (as llama.cpp keeps them); weights are
//! dequantized inside the GEMM, so no activation is rounded to a weight's
//! 8- or 16-bit partner format. The reference rounds every step to bf16;
//! these numerics are closer to the exact math than either.

use std::sync::atomic::{AtomicUsize, Ordering};

use hearth_kernels::cpu::gemm::{gemm, gemm_single, BMatrix, GemmScratch, Kernel};
use hearth_kernels::pool::{SendPtr, ThreadPool};

use hearth_kernels::cpu::ggml_order::activations::RefIsa;

use crate::mmproj::{Block, Linear, MmProj, Weight};
use crate::ops::{
    add_bias, bias_gelu, layer_norm, layer_norm_into, rope, softmax_rows_unnormalized,
};
use crate::{Numerics, Rules};

/// Rows of the MLP computed at a time (bounds the `[rows, n_ff]` buffer).
const MLP_CHUNK: usize = 4096;
/// Queries per attention task.
const ATTN_QUERIES: usize = 120;

impl MmProj {
    fn linear(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        l: &Linear,
        out: &mut [f32],
        accumulate: bool,
    ) {
        self.matmul(pool, x, n, &l.w, out, accumulate);
        if let Some(b) = &l.b {
            add_bias(pool, out, b);
        }
    }

    fn matmul(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        w: &Weight,
        out: &mut [f32],
        accumulate: bool,
    ) {
        let m = BMatrix::Quant(w.matrix(&self.file));
        gemm(
            pool, x, w.cols, n, w.cols, m, w.rows, out, w.rows, accumulate,
        );
    }

    /// The tower on a patch grid: `patches` `[grid_h·grid_w, 3·patch²]`
    /// (row-major tokens, see [`crate::preprocess::patchify`]) → projector
    /// output rows `[n_tokens, projection_dim]`, in pixel-shuffle group
    /// order, before any RMSNorm. `rules.pos` picks the position table,
    /// `rules.numerics` the arithmetic.
    pub fn encode_patches(
        &self,
        pool: &ThreadPool,
        patches: &[f32],
        grid_h: usize,
        grid_w: usize,
        rules: Rules,
    ) -> Vec<f32> {
        let c = &self.config;
        let d = c.n_embd;
        let folded = 3 * c.patch_size * c.patch_size;
        // Patches and positions in the windowed order (row-wise steps up to
        // the pixel shuffle commute with it), RoPE angles, windows, shuffle.
        let inp = self.tower_inputs(patches, grid_h, grid_w, rules.pos);
        if let Numerics::LlamaCpp(isa) = rules.numerics {
            return self.encode_ggml(
                pool,
                &inp,
                grid_h,
                grid_w,
                isa.unwrap_or_else(RefIsa::native),
            );
        }
        let n_patch = inp.n_patches;

        // 1. Patch embedding (the folded kernel, or both temporal halves).
        let mut x = vec![0f32; n_patch * d];
        if self.patch.w.cols == folded {
            self.linear(pool, &inp.patches, n_patch, &self.patch, &mut x, false);
        } else {
            let doubled: Vec<f32> = inp
                .patches
                .chunks_exact(folded)
                .flat_map(|p| p.iter().chain(p))
                .copied()
                .collect();
            self.linear(pool, &doubled, n_patch, &self.patch, &mut x, false);
        }
        // 2. + position embeddings, 4. LN_pre.
        x.iter_mut().zip(&inp.pos).for_each(|(v, p)| *v += p);
        layer_norm(pool, &mut x, d, &self.pre_ln.w, &self.pre_ln.b, c.eps);

        // 5. The blocks.
        let everything = 0..n_patch;
        let global = std::slice::from_ref(&everything);
        let mut s = BlockScratch::new(n_patch, d, c.n_ff);
        for (b, &is_global) in self.blocks.iter().zip(&inp.global) {
            let segments = if is_global { global } else { &inp.windows[..] };
            self.block(
                pool, b, &mut x, n_patch, &inp.cos, &inp.sin, segments, &mut s,
            );
        }

        // 7. LN_post (row-wise, in the windowed order).
        layer_norm(pool, &mut x, d, &self.post_ln.w, &self.post_ln.b, c.eps);

        // 8. Pixel shuffle.
        let u = pixel_shuffle(&x, &inp.shuffle, d, c.merge * c.merge);
        drop(x);
        let n_out = n_patch / (c.merge * c.merge);

        // 9. The projector: GELU(mm.0) → GELU(mm.1) → mm.2 (no biases).
        let [w0, w1, w2] = &self.projector;
        let mut z1 = vec![0f32; n_out * w0.rows];
        self.matmul(pool, &u, n_out, w0, &mut z1, false);
        bias_gelu(pool, &mut z1, w0.rows, None);
        let mut z2 = vec![0f32; n_out * w1.rows];
        self.matmul(pool, &z1, n_out, w1, &mut z2, false);
        bias_gelu(pool, &mut z2, w1.rows, None);
        let mut out = vec![0f32; n_out * w2.rows];
        self.matmul(pool, &z2, n_out, w2, &mut out, false);
        out
    }

    /// One pre-LN block on `x` (`[n, d]`, windowed order):
    /// `x += Attn(LN_1(x)); x += W_down·GELU(W_up·LN_2(x) + b) + b`.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        pool: &ThreadPool,
        b: &Block,
        x: &mut [f32],
        n: usize,
        cos: &[f32],
        sin: &[f32],
        segments: &[std::ops::Range<usize>],
        s: &mut BlockScratch,
    ) {
        let c = &self.config;
        let d = c.n_embd;
        layer_norm_into(pool, x, &mut s.h, d, &b.ln1.w, &b.ln1.b, c.eps);
        self.linear(pool, &s.h, n, &b.q, &mut s.q, false);
        self.linear(pool, &s.h, n, &b.k, &mut s.k, false);
        self.linear(pool, &s.h, n, &b.v, &mut s.v, false);
        rope(pool, &mut s.q, c.n_head, c.head_dim, cos, sin);
        rope(pool, &mut s.k, c.n_head, c.head_dim, cos, sin);
        attention(
            pool, &s.q, &s.k, &s.v, n, c.n_head, c.head_dim, segments, &mut s.vt, &mut s.h,
        );
        // x += attn·W_oᵀ, then + b_o.
        self.matmul(pool, &s.h, n, &b.o.w, x, true);
        add_bias(pool, x, b.o.b.as_deref().expect("loaded with a bias"));

        layer_norm_into(pool, x, &mut s.h, d, &b.ln2.w, &b.ln2.b, c.eps);
        for r0 in (0..n).step_by(MLP_CHUNK) {
            let rows = MLP_CHUNK.min(n - r0);
            let hidden = &mut s.ffn[..rows * c.n_ff];
            self.matmul(
                pool,
                &s.h[r0 * d..(r0 + rows) * d],
                rows,
                &b.up.w,
                hidden,
                false,
            );
            bias_gelu(pool, hidden, c.n_ff, b.up.b.as_deref());
            let xr = &mut x[r0 * d..(r0 + rows) * d];
            self.matmul(pool, hidden, rows, &b.down.w, xr, true);
            add_bias(pool, xr, b.down.b.as_deref().expect("loaded with a bias"));
        }
    }
}

/// The pixel shuffle, channel-major: `u_g[m²·ch + k] = x[member_k][ch]` for
/// the `mm` members of each group (`shuffle`, in group order).
pub(crate) fn pixel_shuffle(x: &[f32], shuffle: &[u32], d: usize, mm: usize) -> Vec<f32> {
    let mut u = vec![0f32; shuffle.len() * d];
    for (g, members) in shuffle.chunks_exact(mm).enumerate() {
        let dst = &mut u[g * mm * d..(g + 1) * mm * d];
        for (k, &t) in members.iter().enumerate() {
            let t = t as usize;
            for (ch, &v) in x[t * d..(t + 1) * d].iter().enumerate() {
                dst[ch * mm + k] = v;
            }
        }
    }
    u
}

/// Per-encode activation buffers shared by all blocks.
struct BlockScratch {
    /// `[n, d]`: normed input, then the attention output.
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[n_head, head_dim, n]`: V transposed per head.
    vt: Vec<f32>,
    /// `[MLP_CHUNK, n_ff]`
    ffn: Vec<f32>,
}

impl BlockScratch {
    fn new(n: usize, d: usize, n_ff: usize) -> BlockScratch {
        BlockScratch {
            h: vec![0.0; n * d],
            q: vec![0.0; n * d],
            k: vec![0.0; n * d],
            v: vec![0.0; n * d],
            vt: vec![0.0; n * d],
            ffn: vec![0.0; MLP_CHUNK.min(n) * n_ff],
        }
    }
}

/// Multi-head attention without a causal mask, each query attending to the
/// keys of its own segment (a window, or everything for a global block):
/// `out = softmax(q·kᵀ/√head_dim)·v`, heads side by side. q, k, v, out:
/// `[n, n_head·head_dim]`; `vt`: scratch of the same size.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    n_head: usize,
    head_dim: usize,
    segments: &[std::ops::Range<usize>],
    vt: &mut [f32],
    out: &mut [f32],
) {
    let d = n_head * head_dim;
    // V per head, transposed: vt[h][e][t] = v[t][h·head_dim + e].
    let vtp = SendPtr(vt.as_mut_ptr());
    pool.run(|t, nt| {
        for h in (t..n_head).step_by(nt) {
            // SAFETY: each thread writes only its heads' slices of vt.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(vtp.get().add(h * head_dim * n), head_dim * n)
            };
            for (i, row) in v.chunks_exact(d).enumerate() {
                for (e, &val) in row[h * head_dim..(h + 1) * head_dim].iter().enumerate() {
                    dst[e * n + i] = val;
                }
            }
        }
    });
    let vt = &*vt;
    // Tasks: (head, segment, block of queries), taken from a shared counter.
    let mut tasks = Vec::new();
    for h in 0..n_head {
        for seg in segments {
            for q0 in (seg.start..seg.end).step_by(ATTN_QUERIES) {
                tasks.push((h, seg.clone(), q0..(q0 + ATTN_QUERIES).min(seg.end)));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let outp = SendPtr(out.as_mut_ptr());
    let scale = 1.0 / (head_dim as f32).sqrt();
    let kernel = Kernel::detect();
    pool.run(|_, _| {
        let mut scratch = GemmScratch::default();
        let (mut scores, mut tile, mut inv) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((h, seg, qs)) = tasks.get(i) else {
                break;
            };
            let (m, len) = (qs.len(), seg.len());
            scores.resize(m * len, 0.0);
            tile.resize(m * head_dim, 0.0);
            inv.resize(m, 0.0);
            let a = &q[qs.start * d + h * head_dim..];
            let keys = BMatrix::F32 {
                data: &k[seg.start * d + h * head_dim..],
                ld: d,
            };
            gemm_single(
                kernel,
                a,
                d,
                m,
                head_dim,
                keys,
                len,
                &mut scores,
                len,
                false,
                &mut scratch,
            );
            softmax_rows_unnormalized(&mut scores, len, scale, &mut inv);
            let values = BMatrix::F32 {
                data: &vt[h * head_dim * n + seg.start..],
                ld: n,
            };
            gemm_single(
                kernel,
                &scores,
                len,
                m,
                len,
                values,
                head_dim,
                &mut tile,
                head_dim,
                false,
                &mut scratch,
            );
            for (r, row) in tile.chunks_exact(head_dim).enumerate() {
                // SAFETY: (query rows, head columns) regions of distinct tasks are disjoint.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        outp.get().add((qs.start + r) * d + h * head_dim),
                        head_dim,
                    )
                };
                for (o, &val) in dst.iter_mut().zip(row) {
                    *o = val * inv[r];
                }
            }
        }
    });
}
