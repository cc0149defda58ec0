//! Weights resident on the GPU: every matrix a forward pass multiplies by is
//! copied once from the GGUF mapping into one device allocation (with a
//! progress bar), in the layout the kernels read (repack.rs). The token
//! embedding stays in the mapping: the few rows a step needs are dequantized
//! on the host and uploaded with the step.

use std::sync::Arc;

use hearth_models::{Linear, Model};
use indicatif::{ProgressBar, ProgressStyle};

use crate::driver::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
pub use crate::layer_weights::{Fused, GpuLayer, Proj};
use crate::ops::{self, GpuMatrix};
use crate::repack::{split_blocks, split_sizes, WeightKind};

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
    /// Decode steps run as one persistent kernel (persistent.rs; opt-in,
    /// HEARTH_CUDA_PERSISTENT=1: slower than the CUDA graphs so far,
    /// BENCHMARKS.md). Its products then use the one-warp-per-row GEMV
    /// kernels only (the persistent kernel computes their arithmetic) and
    /// row norms 256 threads, so kernel-by-kernel passes (verify, batches)
    /// give the same bits as its steps.
    pub persistent: bool,
    _arena: DevBuf,
}

/// Whether the persistent kernel runs the products of `layers`/`output`:
/// quantized weights without a per-tensor scale.
fn persistent_can_run(layers: &[GpuLayer], output: &GpuMatrix) -> bool {
    let ok = |m: &GpuMatrix| {
        m.scale.is_none()
            && matches!(
                m.kind,
                WeightKind::Q8_0
                    | WeightKind::Q4_0
                    | WeightKind::Q5_0
                    | WeightKind::Q4K
                    | WeightKind::Q5K
                    | WeightKind::Q6K
            )
    };
    let all = layers.iter().all(|l| {
        [
            &l.wq,
            &l.wk,
            &l.wv,
            &l.wo,
            &l.ffn_gate,
            &l.ffn_up,
            &l.ffn_down,
        ]
        .into_iter()
        .chain(l.attn_gate.as_ref())
        .all(ok)
    }) && ok(output);
    all
}

const ALIGN: usize = 256;

/// A matrix placement in the arena: type, rows, cols, body offset, scales offset (MAX = none).
type Mat = (WeightKind, usize, usize, usize, usize);
/// A fused group's members in row order and its placement as one matrix.
type Group = (Vec<Proj>, Mat);

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

    fn matrix(&mut self, m: &'a Model, l: &Linear) -> Result<Mat> {
        let (kind,) = self.check(l)?;
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

    /// Reserves the members of `list` that share the first one's type and
    /// width back to back (bodies together, scales together); the others
    /// alone. Returns each member's placement and the fused group's.
    fn group(
        &mut self,
        m: &'a Model,
        list: &[(Proj, &Linear)],
    ) -> Result<(Vec<(Proj, Mat)>, Group)> {
        let kind_of = |l: &Linear| WeightKind::of(l.ty);
        let first = list[0].1;
        let together: Vec<&(Proj, &Linear)> = list
            .iter()
            .filter(|(_, l)| {
                kind_of(l).is_some() && kind_of(l) == kind_of(first) && l.cols == first.cols
            })
            .collect();
        let mut out = Vec::new();
        for (p, l) in list {
            if !together.iter().any(|(q, _)| q == p) {
                out.push((*p, self.matrix(m, l)?));
            }
        }
        // Validate the members and size the shared reservation.
        let mut sizes = Vec::new();
        for (_, l) in &together {
            let (kind, ..) = self.check(l)?;
            sizes.push(split_sizes(kind, l.rows * l.cols / kind.block().0));
        }
        let kind = kind_of(first).expect("checked");
        let body = self.reserve(sizes.iter().map(|s| s.0).sum());
        let total_s: usize = sizes.iter().map(|s| s.1).sum();
        let scales = if total_s > 0 {
            self.reserve(total_s)
        } else {
            usize::MAX
        };
        let (mut ob, mut os) = (0, 0);
        let mut rows = 0;
        for ((p, l), (nb, ns)) in together.iter().zip(&sizes) {
            let at_s = if scales == usize::MAX {
                usize::MAX
            } else {
                scales + os
            };
            self.pieces.push(Piece::Mat {
                kind,
                data: m.mat(l).data,
                body: body + ob,
                scales: at_s,
            });
            out.push((*p, (kind, l.rows, l.cols, body + ob, at_s)));
            ob += nb;
            os += ns;
            rows += l.rows;
        }
        let parts = together.iter().map(|(p, _)| *p).collect();
        Ok((out, (parts, (kind, rows, first.cols, body, scales))))
    }

    /// The kernel type of `l`, checked against the kernels' width rule.
    fn check(&self, l: &Linear) -> Result<(WeightKind,)> {
        let kind = WeightKind::of(l.ty).ok_or_else(|| CudaError::UnsupportedType {
            name: l.name.clone(),
            ty: l.ty,
        })?;
        if !l.cols.is_multiple_of(kind.k_multiple()) {
            return Err(CudaError::Unsupported(format!(
                "'{}': {} columns, not a multiple of {}",
                l.name,
                l.cols,
                kind.k_multiple()
            )));
        }
        Ok((kind,))
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
    fn mat(&self, (kind, rows, cols, body, scales): Mat) -> GpuMatrix {
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
            scale: None,
        }
    }

    fn at(&self, off: Option<usize>) -> u64 {
        off.map_or(0, |o| self.0 + o as u64)
    }
}

impl GpuModel {
    /// Copies `model`'s weights to the GPU. `progress` shows a bar on stderr.
    /// Decode steps run kernel by kernel unless HEARTH_CUDA_PERSISTENT=1
    /// asks for the persistent kernel ([`GpuModel::persistent`]).
    pub fn upload(gpu: Arc<Gpu>, model: Arc<Model>, progress: bool) -> Result<GpuModel> {
        let setting = std::env::var("HEARTH_CUDA_PERSISTENT").is_ok_and(|v| v == "1");
        Self::upload_with(gpu, model, progress, setting)
    }

    /// [`GpuModel::upload`], with decode steps as the persistent kernel when
    /// `persistent` is set and the model's weights are of the types it runs.
    pub fn upload_with(
        gpu: Arc<Gpu>,
        model: Arc<Model>,
        progress: bool,
        persistent: bool,
    ) -> Result<GpuModel> {
        let c = &model.config;
        ops::check_attn_shape(c.n_heads, c.n_kv_heads, c.head_dim)?;
        if !c.dim.is_multiple_of(32) || !c.ffn_dim.is_multiple_of(32) {
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
        struct L {
            attn_norm: usize,
            attn: Vec<(Proj, Mat)>,
            attn_fused: Group,
            wo: Mat,
            bq: Option<usize>,
            bk: Option<usize>,
            bv: Option<usize>,
            q_norm: Option<usize>,
            k_norm: Option<usize>,
            post_attn: Option<usize>,
            ffn_norm: usize,
            ffn: Vec<(Proj, Mat)>,
            ffn_fused: Group,
            fd: Mat,
            post_ffn: Option<usize>,
        }
        let mut ls = Vec::new();
        for l in &m.layers {
            let attn_norm = lay.vector(&l.attn_norm);
            let mut list = vec![(Proj::Q, &l.wq), (Proj::K, &l.wk), (Proj::V, &l.wv)];
            if let Some(g) = &l.attn_gate {
                list.push((Proj::Gate, g));
            }
            let (attn, attn_fused) = lay.group(m, &list)?;
            let wo = lay.matrix(m, &l.wo)?;
            let bq = l.bq.as_deref().map(|b| lay.vector(b));
            let bk = l.bk.as_deref().map(|b| lay.vector(b));
            let bv = l.bv.as_deref().map(|b| lay.vector(b));
            let q_norm = l.q_norm.as_deref().map(|g| lay.vector(g));
            let k_norm = l.k_norm.as_deref().map(|g| lay.vector(g));
            let post_attn = l.post_attn_norm.as_deref().map(|v| lay.vector(v));
            let ffn_norm = lay.vector(&l.ffn_norm);
            let (ffn, ffn_fused) =
                lay.group(m, &[(Proj::FfnGate, &l.ffn_gate), (Proj::FfnUp, &l.ffn_up)])?;
            let fd = lay.matrix(m, &l.ffn_down)?;
            let post_ffn = l.post_ffn_norm.as_deref().map(|v| lay.vector(v));
            ls.push(L {
                attn_norm,
                attn,
                attn_fused,
                wo,
                bq,
                bk,
                bv,
                q_norm,
                k_norm,
                post_attn,
                ffn_norm,
                ffn,
                ffn_fused,
                fd,
                post_ffn,
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
            .zip(&m.layers)
            .map(|((l, &kind), host)| {
                let get = |list: &[(Proj, Mat)], p: Proj| {
                    list.iter().find(|(q, _)| *q == p).map(|(_, m)| r.mat(*m))
                };
                let scaled = |mut g: GpuMatrix, h: &Linear| {
                    g.scale = h.scale;
                    g
                };
                let fused = |(parts, m): Group| Fused { m: r.mat(m), parts };
                GpuLayer {
                    kind,
                    attn_norm: r.at(Some(l.attn_norm)),
                    wq: scaled(get(&l.attn, Proj::Q).expect("q"), &host.wq),
                    wk: scaled(get(&l.attn, Proj::K).expect("k"), &host.wk),
                    wv: scaled(get(&l.attn, Proj::V).expect("v"), &host.wv),
                    wo: scaled(r.mat(l.wo), &host.wo),
                    bq: r.at(l.bq),
                    bk: r.at(l.bk),
                    bv: r.at(l.bv),
                    q_norm: r.at(l.q_norm),
                    k_norm: r.at(l.k_norm),
                    attn_gate: get(&l.attn, Proj::Gate),
                    post_attn_norm: r.at(l.post_attn),
                    ffn_norm: r.at(Some(l.ffn_norm)),
                    ffn_gate: get(&l.ffn, Proj::FfnGate).expect("ffn gate"),
                    ffn_up: get(&l.ffn, Proj::FfnUp).expect("ffn up"),
                    ffn_down: r.mat(l.fd),
                    post_ffn_norm: r.at(l.post_ffn),
                    attn_in: fused(l.attn_fused),
                    ffn_in: fused(l.ffn_fused),
                }
            })
            .collect();
        let mut output = r.mat(out);
        let mut layers: Vec<GpuLayer> = layers;
        let persistent = persistent && persistent_can_run(&layers, &output);
        let report = crate::tune::tune_model(&gpu, &mut layers, &mut output, persistent)?;
        Ok(GpuModel {
            tune_report: report,
            persistent,
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
