//! Weights resident on the GPU: every matrix a forward pass multiplies by is
//! copied once from the GGUF mapping into one device allocation (with a
//! progress bar), in the layout the kernels read (repack.rs). The token
//! embedding stays in the mapping: the few rows a step needs are dequantized
//! on the host and uploaded with the step.

use std::sync::Arc;

use hearth_models::{Architecture, LayerKind, Linear, Model};
use indicatif::{ProgressBar, ProgressStyle};

use crate::driver::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
use crate::ops::{self, GpuMatrix};
use crate::repack::{split_blocks, split_sizes, WeightKind};

/// Device addresses of one decoder layer's weights (0 = absent).
pub struct GpuLayer {
    pub kind: LayerKind,
    pub attn_norm: u64,
    pub wq: GpuMatrix,
    pub wk: GpuMatrix,
    pub wv: GpuMatrix,
    pub wo: GpuMatrix,
    pub bq: u64,
    pub bk: u64,
    pub bv: u64,
    pub attn_gate: Option<GpuMatrix>,
    pub post_attn_norm: u64,
    pub ffn_norm: u64,
    pub ffn_gate: GpuMatrix,
    pub ffn_up: GpuMatrix,
    pub ffn_down: GpuMatrix,
    pub post_ffn_norm: u64,
}

/// A model whose weights live on the GPU. Shared by every session (`GpuState`).
pub struct GpuModel {
    pub gpu: Arc<Gpu>,
    /// The host model: config, and the embedding rows read on the host.
    pub model: Arc<Model>,
    pub layers: Vec<GpuLayer>,
    pub output: GpuMatrix,
    pub output_norm: u64,
    /// Bytes of matrices read per decoded token (as `Model::weight_bytes`).
    pub weight_bytes: usize,
    /// Bytes held on the device by the weights.
    pub resident_bytes: usize,
    /// The GEMV variant chosen for each matrix shape (see tune.rs).
    pub tune_report: Vec<String>,
    _arena: DevBuf,
}

const ALIGN: usize = 256;

enum Piece<'a> {
    Mat {
        kind: WeightKind,
        data: &'a [u8],
        body: usize,
        scales: usize,
    },
    Vector {
        data: &'a [f32],
        at: usize,
    },
}

struct Layout<'a> {
    size: usize,
    pieces: Vec<Piece<'a>>,
}

impl<'a> Layout<'a> {
    fn reserve(&mut self, bytes: usize) -> usize {
        let at = self.size;
        self.size += bytes.div_ceil(ALIGN) * ALIGN;
        at
    }

    fn matrix(
        &mut self,
        m: &'a Model,
        l: &Linear,
    ) -> Result<(WeightKind, usize, usize, usize, usize)> {
        let kind = WeightKind::of(l.ty).ok_or_else(|| CudaError::UnsupportedType {
            name: l.name.clone(),
            ty: l.ty,
        })?;
        if l.cols % kind.k_multiple() != 0 {
            return Err(CudaError::Unsupported(format!(
                "'{}': {} columns, not a multiple of {}",
                l.name,
                l.cols,
                kind.k_multiple()
            )));
        }
        let data = m.mat(l).data;
        let n_blocks = l.rows * l.cols / kind.block().0;
        let (nb, ns) = split_sizes(kind, n_blocks);
        let body = self.reserve(nb);
        let scales = if ns > 0 { self.reserve(ns) } else { usize::MAX };
        self.pieces.push(Piece::Mat {
            kind,
            data,
            body,
            scales,
        });
        Ok((kind, l.rows, l.cols, body, scales))
    }

    fn vector(&mut self, v: &'a [f32]) -> usize {
        let at = self.reserve(v.len() * 4);
        self.pieces.push(Piece::Vector { data: v, at });
        at
    }
}

/// Resolves reserved offsets to device addresses once the arena exists.
struct Resolve(u64);

impl Resolve {
    fn mat(
        &self,
        (kind, rows, cols, body, scales): (WeightKind, usize, usize, usize, usize),
    ) -> GpuMatrix {
        GpuMatrix {
            kind,
            rows,
            cols,
            body: self.0 + body as u64,
            scales: if scales == usize::MAX {
                0
            } else {
                self.0 + scales as u64
            },
            tune: Default::default(),
        }
    }

    fn at(&self, off: Option<usize>) -> u64 {
        off.map_or(0, |o| self.0 + o as u64)
    }
}

impl GpuModel {
    /// Copies `model`'s weights to the GPU. `progress` shows a bar on stderr.
    pub fn upload(gpu: Arc<Gpu>, model: Arc<Model>, progress: bool) -> Result<GpuModel> {
        let c = &model.config;
        match c.arch {
            Architecture::Llama | Architecture::Qwen2 | Architecture::MuseGlimmer => {}
            a => {
                return Err(CudaError::Unsupported(format!(
                    "the {} architecture (supported: llama, qwen2, muse_glimmer)",
                    a.gguf_name()
                )))
            }
        }
        ops::check_attn_shape(c.n_heads, c.n_kv_heads, c.head_dim)?;
        if c.dim % 32 != 0 || c.ffn_dim % 32 != 0 {
            return Err(CudaError::Unsupported(format!(
                "dim {} / ffn {} not multiples of 32",
                c.dim, c.ffn_dim
            )));
        }
        gpu.bind()?;
        let m: &Model = &model;
        let mut lay = Layout {
            size: 0,
            pieces: Vec::new(),
        };
        type Mat = (WeightKind, usize, usize, usize, usize);
        struct L {
            attn_norm: usize,
            wq: Mat,
            wk: Mat,
            wv: Mat,
            wo: Mat,
            bq: Option<usize>,
            bk: Option<usize>,
            bv: Option<usize>,
            gate: Option<Mat>,
            post_attn: Option<usize>,
            ffn_norm: usize,
            fg: Mat,
            fu: Mat,
            fd: Mat,
            post_ffn: Option<usize>,
        }
        let mut ls = Vec::new();
        for l in &m.layers {
            ls.push(L {
                attn_norm: lay.vector(&l.attn_norm),
                wq: lay.matrix(m, &l.wq)?,
                wk: lay.matrix(m, &l.wk)?,
                wv: lay.matrix(m, &l.wv)?,
                wo: lay.matrix(m, &l.wo)?,
                bq: l.bq.as_deref().map(|b| lay.vector(b)),
                bk: l.bk.as_deref().map(|b| lay.vector(b)),
                bv: l.bv.as_deref().map(|b| lay.vector(b)),
                gate: l.attn_gate.as_ref().map(|g| lay.matrix(m, g)).transpose()?,
                post_attn: l.post_attn_norm.as_deref().map(|v| lay.vector(v)),
                ffn_norm: lay.vector(&l.ffn_norm),
                fg: lay.matrix(m, &l.ffn_gate)?,
                fu: lay.matrix(m, &l.ffn_up)?,
                fd: lay.matrix(m, &l.ffn_down)?,
                post_ffn: l.post_ffn_norm.as_deref().map(|v| lay.vector(v)),
            });
        }
        let out = lay.matrix(m, &m.output)?;
        let out_norm = lay.vector(&m.output_norm);

        let free = gpu.free_mem()?;
        if lay.size > free {
            return Err(CudaError::OutOfMemory {
                what: "the model's weights".into(),
                need: lay.size,
                free,
            });
        }
        let arena = gpu.alloc(lay.size, "the model's weights")?;
        let bar = if progress {
            ProgressBar::new(lay.size as u64).with_style(
                ProgressStyle::with_template(
                    "upload [{bar:30}] {bytes:>10}/{total_bytes:10} {bytes_per_sec:>12}  eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            )
        } else {
            ProgressBar::hidden()
        };
        let mut staging_body = Vec::new();
        let mut staging_scales = Vec::new();
        for p in &lay.pieces {
            match *p {
                Piece::Mat {
                    kind,
                    data,
                    body,
                    scales,
                } => {
                    if kind.is_split() {
                        let n_blocks = data.len() / kind.block().1;
                        let (nb, ns) = split_sizes(kind, n_blocks);
                        staging_body.resize(nb, 0);
                        staging_scales.resize(ns, 0);
                        split_blocks(kind, data, &mut staging_body, &mut staging_scales);
                        gpu.upload(arena.at(body), &staging_body)?;
                        gpu.upload(arena.at(scales), &staging_scales)?;
                    } else {
                        gpu.upload(arena.at(body), data)?;
                    }
                    bar.inc(data.len() as u64);
                }
                Piece::Vector { data, at } => {
                    gpu.upload(arena.at(at), data)?;
                    bar.inc(data.len() as u64 * 4);
                }
            }
        }
        bar.finish_and_clear();
        let r = Resolve(arena.ptr);
        let layers = ls
            .into_iter()
            .zip(&c.layers)
            .map(|(l, &kind)| GpuLayer {
                kind,
                attn_norm: r.at(Some(l.attn_norm)),
                wq: r.mat(l.wq),
                wk: r.mat(l.wk),
                wv: r.mat(l.wv),
                wo: r.mat(l.wo),
                bq: r.at(l.bq),
                bk: r.at(l.bk),
                bv: r.at(l.bv),
                attn_gate: l.gate.map(|g| r.mat(g)),
                post_attn_norm: r.at(l.post_attn),
                ffn_norm: r.at(Some(l.ffn_norm)),
                ffn_gate: r.mat(l.fg),
                ffn_up: r.mat(l.fu),
                ffn_down: r.mat(l.fd),
                post_ffn_norm: r.at(l.post_ffn),
            })
            .collect();
        let mut output = r.mat(out);
        let mut layers: Vec<GpuLayer> = layers;
        let report = crate::tune::tune_model(&gpu, &mut layers, &mut output)?;
        Ok(GpuModel {
            tune_report: report,
            output,
            output_norm: r.at(Some(out_norm)),
            layers,
            weight_bytes: model.weight_bytes(),
            resident_bytes: lay.size,
            gpu,
            model,
            _arena: arena,
        })
    }
}
