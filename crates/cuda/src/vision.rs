//! The Muse Glimmer vision tower on the GPU (`hearth_vision::Tower`): the CPU
//! encoder's steps (`hearth_vision::encoder`) with the matrix products on the
//! tensor-core GEMM (gemm.cu: activations rounded to f16, f32 accumulation),
//! the attention on attention.cu's non-causal mode over f16 K/V, and the
//! small operations in kernels/vision.cu.
//!
//! Shapes. Every activation is f32 rows of a stride rounded up to a multiple
//! of 64 (the GEMM's k tile) whose padding stays zero; a weight whose width
//! is not a multiple of 64 (the 588-wide patch embedding, small synthetic
//! towers) is uploaded widened with zero columns as f32, the others as they
//! are in the file. Heads are padded from head_dim to the attention kernels'
//! size (64, 128 or 256; 96 -> 128 for the released tower) with zeros, which
//! changes no score; the softmax scale stays 1/sqrt(head_dim).
//!
//! Order. The host puts the patches (and their position embeddings) in the
//! windowed token order first (`MmProj::tower_inputs`); the tower runs in that
//! order and the pixel shuffle gathers from it, so nothing is permuted on the
//! device. Each attention window is one launch of the FA kernel over that
//! window's keys.

use std::sync::Arc;

use hearth_kernels::QMatrix;
use hearth_vision::tower::{LinearView, NormView, TowerInputs};
use hearth_vision::{MmProj, Tower};

use crate::driver::{Arg, DevBuf, Gpu};
use crate::error::{CudaError, Result};
use crate::ops::{self, AttnArgs, AttnMode, GpuMatrix, OUT_ADD};
use crate::repack::{split_blocks, split_sizes, WeightKind};

fn pad64(n: usize) -> usize {
    n.div_ceil(64) * 64
}

/// A matrix on the device with its buffers.
struct Mat {
    m: GpuMatrix,
    _body: DevBuf,
    _scales: DevBuf,
}

struct Lin {
    w: Mat,
    b: Option<DevBuf>,
}

struct Nrm {
    w: DevBuf,
    b: DevBuf,
}

/// The q, k and v products of a block: one matrix of their rows stacked
/// (where the three share a type and need no padding: one launch that fills
/// the GPU three times better), or three.
enum Qkv {
    Fused(Lin),
    Apart(Box<[Lin; 3]>),
}

struct GpuBlock {
    ln1: Nrm,
    qkv: Qkv,
    o: Lin,
    ln2: Nrm,
    up: Lin,
    down: Lin,
}

/// The tower's weights resident on the GPU.
pub struct GpuTower {
    gpu: Arc<Gpu>,
    patch: Lin,
    pre_ln: Nrm,
    post_ln: Nrm,
    blocks: Vec<GpuBlock>,
    projector: [Mat; 3],
    /// Bytes held on the device.
    pub resident_bytes: usize,
    /// The last encode's buffers, kept for the next image of the same size
    /// (the lock also serializes encodes).
    scratch: std::sync::Mutex<Option<(usize, Scratch)>>,
}

fn upload_f32(g: &Gpu, v: &[f32], what: &str) -> Result<DevBuf> {
    let b = g.alloc(v.len() * 4, what)?;
    g.upload(b.ptr, v)?;
    Ok(b)
}

/// `w` as stored, or widened to `cols` (>= w.cols, zero columns) as f32;
/// `fold`: the file keeps both temporal halves of the patch kernel
/// (`[rows, 2·c]`), summed here into `[rows, c]`.
fn upload_matrix(g: &Gpu, w: &QMatrix, fold: bool, name: &str) -> Result<Mat> {
    let logical = if fold { w.cols / 2 } else { w.cols };
    let cols = pad64(logical);
    let kind = WeightKind::of(w.ty);
    if let (Some(kind), false) = (kind, fold) {
        if cols == w.cols && w.cols.is_multiple_of(kind.k_multiple()) {
            let n_blocks = w.rows * w.cols / kind.block().0;
            let (nb, ns) = split_sizes(kind, n_blocks);
            let (mut bodies, mut scales) = (vec![0u8; nb], vec![0u8; ns]);
            split_blocks(kind, w.data, &mut bodies, &mut scales);
            let body = g.alloc(nb, name)?;
            g.upload(body.ptr, &bodies)?;
            let sc = g.alloc(ns, name)?;
            g.upload(sc.ptr, &scales)?;
            return Ok(Mat {
                m: GpuMatrix {
                    kind,
                    rows: w.rows,
                    cols: w.cols,
                    body: body.ptr,
                    scales: sc.ptr,
                    tune: Default::default(),
                    scale: None,
                },
                _body: body,
                _scales: sc,
            });
        }
    }
    let mut row = vec![0f32; w.cols];
    let mut wide = vec![0f32; w.rows * cols];
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row);
        let dst = &mut wide[r * cols..r * cols + logical];
        if fold {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = row[i] + row[logical + i];
            }
        } else {
            dst.copy_from_slice(&row);
        }
    }
    let body = upload_f32(g, &wide, name)?;
    Ok(Mat {
        m: GpuMatrix {
            kind: WeightKind::F32,
            rows: w.rows,
            cols,
            body: body.ptr,
            scales: 0,
            tune: Default::default(),
            scale: None,
        },
        _body: body,
        _scales: DevBuf { ptr: 0, bytes: 0 },
    })
}

fn upload_linear(g: &Gpu, l: &LinearView, fold: bool, name: &str) -> Result<Lin> {
    Ok(Lin {
        w: upload_matrix(g, &l.w, fold, name)?,
        b: l.b.map(|b| upload_f32(g, b, name)).transpose()?,
    })
}

fn upload_norm(g: &Gpu, n: &NormView, name: &str) -> Result<Nrm> {
    Ok(Nrm {
        w: upload_f32(g, n.w, name)?,
        b: upload_f32(g, n.b, name)?,
    })
}

fn upload_qkv(g: &Gpu, l: [&LinearView; 3]) -> Result<Qkv> {
    let (q, k, v) = (&l[0].w, &l[1].w, &l[2].w);
    let same = [k, v]
        .iter()
        .all(|m| m.ty == q.ty && m.cols == q.cols && m.rows == q.rows);
    let kind_ok = WeightKind::of(q.ty).is_some_and(|kind| q.cols.is_multiple_of(kind.k_multiple()));
    if !(same && kind_ok && pad64(q.cols) == q.cols) {
        let [a, b, c] = l.map(|x| upload_linear(g, x, false, "v.blk.attn_qkv"));
        return Ok(Qkv::Apart(Box::new([a?, b?, c?])));
    }
    let data: Vec<u8> = [q, k, v]
        .iter()
        .flat_map(|m| m.data.iter().copied())
        .collect();
    let stacked = QMatrix {
        ty: q.ty,
        rows: 3 * q.rows,
        cols: q.cols,
        data: &data,
    };
    let bias = if l.iter().any(|x| x.b.is_some()) {
        let mut b = Vec::with_capacity(3 * q.rows);
        for x in &l {
            match x.b {
                Some(v) => b.extend_from_slice(v),
                None => b.extend(std::iter::repeat_n(0.0, q.rows)),
            }
        }
        Some(upload_f32(g, &b, "v.blk.attn_qkv.bias")?)
    } else {
        None
    };
    Ok(Qkv::Fused(Lin {
        w: upload_matrix(g, &stacked, false, "v.blk.attn_qkv")?,
        b: bias,
    }))
}

/// The attention kernels' head size for `head_dim` (zero-padded up to it).
fn padded_head(head_dim: usize) -> Result<usize> {
    [64, 128, 256]
        .into_iter()
        .find(|&h| head_dim <= h)
        .ok_or_else(|| {
            CudaError::Unsupported(format!(
                "a vision tower with head_dim {head_dim} (the attention kernels take up to 256)"
            ))
        })
}

/// One encode's device buffers.
struct Scratch {
    x: DevBuf,
    h: DevBuf,
    /// `[n, 3·dp]`: q, k and v of each token side by side.
    qkv: DevBuf,
    qh: DevBuf,
    kc: DevBuf,
    vc: DevBuf,
    att: DevBuf,
    ffn: DevBuf,
    xh: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    pos0: DevBuf,
    cos: DevBuf,
    sin: DevBuf,
    /// The patches widened to the patch product's k.
    patches: DevBuf,
    /// Pixel shuffle gather and the projector's activations.
    idx: DevBuf,
    u: DevBuf,
    z1: DevBuf,
    z2: DevBuf,
    out: DevBuf,
}

impl GpuTower {
    /// Copies `mm`'s weights to `gpu`.
    pub fn upload(gpu: Arc<Gpu>, mm: &MmProj) -> Result<GpuTower> {
        let c = &mm.config;
        padded_head(c.head_dim)?;
        gpu.bind()?;
        let g = &*gpu;
        let w = mm.weights();
        let fold = w.patch.w.cols == 2 * 3 * c.patch_size * c.patch_size;
        let patch = upload_linear(g, &w.patch, fold, "v.patch_embd")?;
        let pre_ln = upload_norm(g, &w.pre_ln, "v.pre_ln")?;
        let post_ln = upload_norm(g, &w.post_ln, "v.post_ln")?;
        let mut blocks = Vec::with_capacity(w.blocks.len());
        for b in &w.blocks {
            let lin = |l: &LinearView| upload_linear(g, l, false, "v.blk");
            blocks.push(GpuBlock {
                ln1: upload_norm(g, &b.ln1, "v.blk.ln1")?,
                qkv: upload_qkv(g, [&b.q, &b.k, &b.v])?,
                o: lin(&b.o)?,
                ln2: upload_norm(g, &b.ln2, "v.blk.ln2")?,
                up: lin(&b.up)?,
                down: lin(&b.down)?,
            });
        }
        let [p0, p1, p2] = &w.projector;
        let projector = [
            upload_matrix(g, p0, false, "mm.0")?,
            upload_matrix(g, p1, false, "mm.1")?,
            upload_matrix(g, p2, false, "mm.2")?,
        ];
        let mut resident = 0;
        let mut count = |m: &Mat| resident += m._body.bytes + m._scales.bytes;
        count(&patch.w);
        for b in &blocks {
            match &b.qkv {
                Qkv::Fused(l) => count(&l.w),
                Qkv::Apart(ls) => ls.iter().for_each(|l| count(&l.w)),
            }
            for l in [&b.o, &b.up, &b.down] {
                count(&l.w);
            }
        }
        projector.iter().for_each(&mut count);
        Ok(GpuTower {
            gpu,
            patch,
            pre_ln,
            post_ln,
            blocks,
            projector,
            resident_bytes: resident,
            scratch: Default::default(),
        })
    }

    fn scratch(&self, mm: &MmProj, inp: &TowerInputs) -> Result<Scratch> {
        let g = &*self.gpu;
        let c = &mm.config;
        let n = inp.n_patches;
        let dp = pad64(c.n_embd);
        let hdp = padded_head(c.head_dim)?;
        let f = |floats: usize| g.alloc_zeroed(floats * 4, "vision tower activations");
        let widest = [
            self.patch.w.m.cols,
            dp,
            pad64(c.n_ff),
            self.projector[0].m.cols,
            self.projector[1].m.cols,
            self.projector[2].m.cols,
        ]
        .into_iter()
        .max()
        .unwrap_or(dp);
        let longest = if inp.global.iter().any(|&g| g) {
            n
        } else {
            inp.windows.iter().map(|w| w.len()).max().unwrap_or(n)
        };
        let pos0 = g.alloc_zeroed(4, "vision tower")?;
        let n_out = n / (c.merge * c.merge);
        let [w0, w1, w2] = &self.projector;
        Ok(Scratch {
            x: f(n * dp)?,
            h: f(n * dp)?,
            qkv: f(n * 3 * dp)?,
            qh: f(n * c.n_head * hdp)?,
            kc: g.alloc(n * c.n_head * hdp * 2, "vision tower K")?,
            vc: g.alloc(n * c.n_head * hdp * 2, "vision tower V")?,
            att: f(n * c.n_head * hdp)?,
            ffn: f(n * pad64(c.n_ff))?,
            xh: g.alloc(n * widest * 2, "vision tower activations")?,
            part_o: f(longest * c.n_head * hdp)?,
            part_ml: f(longest * c.n_head * 2)?,
            pos0,
            cos: f(inp.cos.len())?,
            sin: f(inp.sin.len())?,
            patches: f(n * self.patch.w.m.cols)?,
            idx: g.alloc(inp.shuffle.len() * 4, "vision tower shuffle")?,
            u: f(n_out * w0.m.cols)?,
            z1: f(n_out * w1.m.cols)?,
            z2: f(n_out * w2.m.cols)?,
            out: f(n_out * w2.m.rows)?,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        w: &Mat,
        x: u64,
        xh: u64,
        n: usize,
        y: u64,
        stride: usize,
        bias: u64,
        flags: i32,
    ) -> Result<()> {
        crate::gemm::gemm(&self.gpu, &w.m, x, xh, n, y, stride, bias, flags, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        l: &Lin,
        x: u64,
        xh: u64,
        n: usize,
        y: u64,
        stride: usize,
        flags: i32,
    ) -> Result<()> {
        self.gemm(
            &l.w,
            x,
            xh,
            n,
            y,
            stride,
            l.b.as_ref().map_or(0, |b| b.ptr),
            flags,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: u64,
        out: u64,
        n: &Nrm,
        rows: usize,
        width: usize,
        stride: usize,
        eps: f32,
    ) -> Result<()> {
        self.gpu.launch(
            "vit_layer_norm",
            (rows as u32, 1, 1),
            256,
            &[
                Arg::Ptr(x),
                Arg::Ptr(out),
                Arg::Ptr(n.w.ptr),
                Arg::Ptr(n.b.ptr),
                Arg::I32(width as i32),
                Arg::I32(stride as i32),
                Arg::F32(eps),
            ],
        )
    }

    fn gelu(&self, x: u64, n: usize) -> Result<()> {
        self.gpu.launch(
            "vit_gelu",
            (grid(n), 1, 1),
            256,
            &[Arg::Ptr(x), Arg::Ptr(n as u64)],
        )
    }

    /// The projector rows of one image (see [`Tower::encode`]).
    pub fn encode_inputs(&self, mm: &MmProj, inp: &TowerInputs) -> Result<Vec<f32>> {
        let g = &*self.gpu;
        g.bind()?;
        let c = &mm.config;
        let n = inp.n_patches;
        let (d, dp, fp) = (c.n_embd, pad64(c.n_embd), pad64(c.n_ff));
        let hdp = padded_head(c.head_dim)?;
        let mut cache = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if cache.as_ref().is_none_or(|(key, _)| *key != n) {
            *cache = None; // free the old buffers first
            *cache = Some((n, self.scratch(mm, inp)?));
        }
        let s = &cache.as_ref().expect("set above").1;
        g.upload(s.cos.ptr, &inp.cos)?;
        g.upload(s.sin.ptr, &inp.sin)?;

        // 1-2. x = pos; x += patches · W_pᵀ + b_p (windowed order).
        let kp = self.patch.w.m.cols;
        let folded = inp.patches.len() / n.max(1);
        if kp == folded {
            g.upload(s.patches.ptr, &inp.patches)?;
        } else {
            let mut wide = vec![0f32; n * kp];
            for (dst, src) in wide
                .chunks_exact_mut(kp)
                .zip(inp.patches.chunks_exact(folded))
            {
                dst[..folded].copy_from_slice(src);
            }
            g.upload(s.patches.ptr, &wide)?;
        }
        if dp == d {
            g.upload(s.x.ptr, &inp.pos)?;
        } else {
            let mut pos = vec![0f32; n * dp];
            for (dst, src) in pos.chunks_exact_mut(dp).zip(inp.pos.chunks_exact(d)) {
                dst[..d].copy_from_slice(src);
            }
            g.upload(s.x.ptr, &pos)?;
        }
        self.linear(
            &self.patch,
            s.patches.ptr,
            s.xh.ptr,
            n,
            s.x.ptr,
            dp,
            OUT_ADD,
        )?;
        // 4. LN_pre.
        self.layer_norm(s.x.ptr, s.x.ptr, &self.pre_ln, n, d, dp, c.eps)?;

        // 5. The blocks.
        let attn = AttnArgs {
            n_heads: c.n_head,
            n_kv: c.n_head,
            head_dim: hdp,
            slots: n,
            window: 0,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            kv: ops::KvKind::F16,
        };
        let everything = 0..n;
        for (b, &global) in self.blocks.iter().zip(&inp.global) {
            self.layer_norm(s.x.ptr, s.h.ptr, &b.ln1, n, d, dp, c.eps)?;
            let part = |i: usize| s.qkv.ptr + (i * dp * 4) as u64;
            match &b.qkv {
                Qkv::Fused(l) => self.linear(l, s.h.ptr, s.xh.ptr, n, s.qkv.ptr, 3 * dp, 0)?,
                Qkv::Apart(ls) => {
                    for (i, l) in ls.iter().enumerate() {
                        self.linear(l, s.h.ptr, s.xh.ptr, n, part(i), 3 * dp, 0)?;
                    }
                }
            }
            g.launch(
                "vit_heads",
                (grid(n * c.n_head * hdp / 2), 1, 1),
                256,
                &[
                    Arg::Ptr(part(0)),
                    Arg::Ptr(part(1)),
                    Arg::Ptr(part(2)),
                    Arg::Ptr(s.cos.ptr),
                    Arg::Ptr(s.sin.ptr),
                    Arg::I32(n as i32),
                    Arg::I32(c.n_head as i32),
                    Arg::I32(c.head_dim as i32),
                    Arg::I32(hdp as i32),
                    Arg::I32((3 * dp) as i32),
                    Arg::Ptr(s.qh.ptr),
                    Arg::Ptr(s.kc.ptr),
                    Arg::Ptr(s.vc.ptr),
                ],
            )?;
            let segments = if global {
                std::slice::from_ref(&everything)
            } else {
                &inp.windows[..]
            };
            for seg in segments {
                let t = seg.len();
                let row = (seg.start * c.n_head * hdp * 4) as u64;
                let key = (seg.start * hdp * 2) as u64;
                ops::attention_mode(
                    g,
                    &attn,
                    AttnMode::Full,
                    t,
                    1,
                    (s.qh.ptr + row, s.kc.ptr + key, s.vc.ptr + key, s.pos0.ptr),
                    (s.part_o.ptr, s.part_ml.ptr),
                    s.att.ptr + row,
                    0,
                    None,
                )?;
            }
            g.launch(
                "vit_unpad",
                (grid(n * d), 1, 1),
                256,
                &[
                    Arg::Ptr(s.att.ptr),
                    Arg::Ptr(s.h.ptr),
                    Arg::I32(n as i32),
                    Arg::I32(c.n_head as i32),
                    Arg::I32(c.head_dim as i32),
                    Arg::I32(hdp as i32),
                    Arg::I32(dp as i32),
                ],
            )?;
            // x += attn · W_oᵀ + b_o
            self.linear(&b.o, s.h.ptr, s.xh.ptr, n, s.x.ptr, dp, OUT_ADD)?;
            self.layer_norm(s.x.ptr, s.h.ptr, &b.ln2, n, d, dp, c.eps)?;
            self.linear(&b.up, s.h.ptr, s.xh.ptr, n, s.ffn.ptr, fp, 0)?;
            self.gelu(s.ffn.ptr, n * fp)?;
            self.linear(&b.down, s.ffn.ptr, s.xh.ptr, n, s.x.ptr, dp, OUT_ADD)?;
        }

        // 7. LN_post (row-wise: in windowed order), 8. pixel shuffle.
        self.layer_norm(s.x.ptr, s.x.ptr, &self.post_ln, n, d, dp, c.eps)?;
        let mm2 = c.merge * c.merge;
        let n_out = n / mm2;
        let [w0, w1, w2] = &self.projector;
        let shuffle: Vec<i32> = inp.shuffle.iter().map(|&i| i as i32).collect();
        g.upload(s.idx.ptr, &shuffle)?;
        let (u, z1, z2, out) = (&s.u, &s.z1, &s.z2, &s.out);
        g.launch(
            "vit_shuffle",
            (grid(n_out * mm2 * d), 1, 1),
            256,
            &[
                Arg::Ptr(s.x.ptr),
                Arg::Ptr(u.ptr),
                Arg::Ptr(s.idx.ptr),
                Arg::I32(n_out as i32),
                Arg::I32(mm2 as i32),
                Arg::I32(d as i32),
                Arg::I32(dp as i32),
                Arg::I32(w0.m.cols as i32),
            ],
        )?;
        // 9. GELU(mm.0) -> GELU(mm.1) -> mm.2.
        self.gemm(w0, u.ptr, s.xh.ptr, n_out, z1.ptr, w1.m.cols, 0, 0)?;
        self.gelu(z1.ptr, n_out * w1.m.cols)?;
        self.gemm(w1, z1.ptr, s.xh.ptr, n_out, z2.ptr, w2.m.cols, 0, 0)?;
        self.gelu(z2.ptr, n_out * w2.m.cols)?;
        self.gemm(w2, z2.ptr, s.xh.ptr, n_out, out.ptr, w2.m.rows, 0, 0)?;
        let mut rows = vec![0f32; n_out * w2.m.rows];
        g.download(&mut rows, out.ptr)?;
        Ok(rows)
    }
}

/// Blocks of 256 threads for `n` items (grid-stride loops cap it).
fn grid(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 65535) as u32
}

impl Tower for GpuTower {
    fn name(&self) -> &'static str {
        "CUDA"
    }

    fn encode(&self, mm: &MmProj, inputs: &TowerInputs) -> std::result::Result<Vec<f32>, String> {
        self.encode_inputs(mm, inputs).map_err(|e| e.to_string())
    }
}
