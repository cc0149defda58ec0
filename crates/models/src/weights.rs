//! `Model`: immutable weights, straight from the GGUF mapping. Quantized
//! matrices stay in the mmap (no dequantization at load); only small F32
//! vectors (norm gains, biases) are copied out.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hearth_gguf::{GgmlType, GgufError, GgufFile, TensorInfo};
use hearth_kernels::cpu::ggml_order::activations::RefIsa;
use hearth_kernels::cpu::interleaved::PackedMatrix;
use hearth_kernels::cpu::kv_cache::{KvDtype, KvTypes};
use hearth_kernels::{Activations, QMatrix};

use crate::arch::names::{self, Blk};
use crate::arch::{ArchSpec, QkNorm};
use crate::config::{Architecture, ConfigError, ModelConfig};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    /// A tensor the architecture's layout (llama.cpp's) has no place for:
    /// llama.cpp refuses such a file too ("wrong number of tensors").
    #[error("unexpected tensor '{name}': not part of llama.cpp's {arch} layout")]
    UnexpectedTensor { name: String, arch: &'static str },
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?} (ggml order)")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("tensor '{name}' has type {ty}, which hearth cannot compute with")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("embedding rows of {len} values are not whole rows of the model's width {dim}")]
    BadRows { len: usize, dim: usize },
    #[error("context full: position {pos} + {n} tokens exceeds the context of {ctx}")]
    ContextFull { pos: usize, n: usize, ctx: usize },
    #[error("cannot continue at position {pos}: the sliding-window cache was rolled back further than its slack")]
    RolledBackTooFar { pos: usize },
    #[error("empty token list")]
    Empty,
    /// A saved session state that does not fit this model or is damaged.
    #[error("{0}")]
    SavedState(String),
    /// A backend cannot do what was asked (e.g. hidden-state taps on the GPU).
    #[error("the {backend} backend does not support {what}")]
    Unsupported { backend: &'static str, what: String },
    /// A device error from a non-CPU backend (its own typed error inside).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

/// A weight matrix of logical shape [rows, cols] (GGUF `ne` = [cols, rows]),
/// located by its byte range in the file.
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
    /// Per-tensor scale multiplied into the product (`*.scale`, llama.cpp's
    /// `build_lora_mm(w, x, w_s)`).
    pub scale: Option<f32>,
    /// The rows repacked for the SIMD kernels (see [`Model::pack_weights`]).
    pub packed: Option<Arc<PackedMatrix>>,
}

impl Linear {
    /// Rows `r` of this matrix as a matrix of their own (a view of the same
    /// bytes, same scale): the q, k and v parts of a fused `attn_qkv`.
    pub fn rows_view(&self, r: Range<usize>) -> Linear {
        let row_bytes = self.range.len() / self.rows;
        let start = self.range.start + r.start * row_bytes;
        Linear {
            name: format!("{}[{}..{}]", self.name, r.start, r.end),
            ty: self.ty,
            rows: r.len(),
            cols: self.cols,
            range: start..start + r.len() * row_bytes,
            scale: self.scale,
            packed: None,
        }
    }
}

/// Per-layer weights. Optional fields exist for some architectures only.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// With a fused `attn_qkv`, views of its row ranges.
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    /// A fused `attn_qkv` ([q_dim + 2·kv_dim, dim]), computed as one product
    /// on the CPU (llama.cpp chooses its kernels by the whole matrix).
    pub wqkv: Option<Linear>,
    pub wo: Linear,
    /// q/k/v biases (qwen2; a fused `attn_qkv.bias` split into its parts).
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Learned per-head QK-norm gains (gemma3, muse-glimmer).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// muse-glimmer: sigmoid output gate projection.
    pub attn_gate: Option<Linear>,
    /// Sandwich norms (gemma3, muse-glimmer).
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn_gate: Linear,
    pub ffn_up: Linear,
    pub ffn_down: Linear,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Gate and up packed together for the fused gated-unit pass (then the
    /// two `Linear`s keep no packed copy of their own).
    pub ffn_gate_up: Option<Arc<PackedMatrix>>,
}

/// Which numerics a model computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// The reference implementation's arithmetic: llama.cpp's CPU backend
    /// (activations converted to each weight type's `vec_dot_type` before
    /// the matmuls, f16 KV cache, its kernels' summation orders).
    Reference,
    /// Exact f32 everywhere: f32 activations and KV cache, no bf16 rounding.
    /// For checking the math against f32 references.
    F32,
}

impl Numerics {
    /// The KV cache types used under these numerics unless chosen with
    /// [`Model::set_kv_types`] (known before loading, so cache sizes can be
    /// checked first): f16 as llama.cpp's default, or f32.
    pub fn kv_types(self) -> KvTypes {
        match self {
            Numerics::F32 => KvTypes::same(KvDtype::F32),
            Numerics::Reference => KvTypes::same(KvDtype::F16),
        }
    }
}

pub struct Model {
    pub config: ModelConfig,
    /// What each layer computes (both backends read it).
    pub arch: ArchSpec,
    pub numerics: Numerics,
    /// Storage types of the KV cache of states made from now on.
    pub kv_types: KvTypes,
    /// Which llama.cpp x86 build the Reference numerics follow where they
    /// differ ([`RefIsa`]): [`RefIsa::native`] unless set.
    pub ref_isa: RefIsa,
    file: Arc<GgufFile>,
    /// [vocab, dim]
    pub tok_embd: Linear,
    pub output_norm: Vec<f32>,
    /// [vocab, dim]; the embedding matrix when tied.
    pub output: Linear,
    pub layers: Vec<Layer>,
    /// Where forward passes dump their intermediates (see [`Model::set_dump_dir`]).
    pub(crate) dump_dir: Option<PathBuf>,
}

/// Types the CPU matmul can compute with.
pub fn matmul_supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

struct Loader<'a> {
    file: &'a GgufFile,
    /// Every tensor name looked up (present or not).
    seen: RefCell<BTreeSet<String>>,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.seen.borrow_mut().insert(name.to_string());
        self.file
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn has(&self, name: &str) -> bool {
        self.seen.borrow_mut().insert(name.to_string());
        self.file.tensor_info(name).is_some()
    }

    /// A tensor llama.cpp loads for this layout and never applies: accepted,
    /// not used.
    fn accept_unused(&self, name: &str) {
        self.seen.borrow_mut().insert(name.to_string());
    }

    /// The first tensor of the file that no lookup asked for.
    fn unexpected(&self) -> Option<String> {
        let seen = self.seen.borrow();
        self.file
            .tensors()
            .iter()
            .find(|t| !seen.contains(&t.name))
            .map(|t| t.name.clone())
    }

    /// A `{1}`-shaped per-tensor scale, if the file has it.
    fn opt_scale(&self, name: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.opt_vector(name, 1)?.map(|v| v[0]))
    }

    fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        let t = self.info(name)?;
        let expected = vec![cols as u64, rows as u64];
        if t.shape != expected {
            return Err(ModelError::BadShape {
                name: name.into(),
                expected,
                got: t.shape.clone(),
            });
        }
        if !matmul_supported(t.ty) {
            return Err(ModelError::UnsupportedType {
                name: name.into(),
                ty: t.ty,
            });
        }
        let start = (self.file.data_offset() + t.offset) as usize;
        Ok(Linear {
            name: name.into(),
            ty: t.ty,
            rows,
            cols,
            range: start..start + t.n_bytes() as usize,
            scale: None,
            packed: None,
        })
    }

    fn opt_linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Linear>, ModelError> {
        match self.has(name) {
            false => Ok(None),
            true => self.linear(name, rows, cols).map(Some),
        }
    }

    /// A 1-D vector, dequantized to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.info(name)?;
        if t.shape != [len as u64] {
            return Err(ModelError::BadShape {
                name: name.into(),
                expected: vec![len as u64],
                got: t.shape.clone(),
            });
        }
        let mut out = vec![0.0; len];
        let data = self.file.tensor(name)?.data;
        hearth_kernels::dequantize(t.ty, data, &mut out).map_err(|_| {
            ModelError::UnsupportedType {
                name: name.into(),
                ty: t.ty,
            }
        })?;
        Ok(out)
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        match self.has(name) {
            false => Ok(None),
            true => self.vector(name, len).map(Some),
        }
    }
}

impl Model {
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Self::from_gguf(Arc::new(GgufFile::open(path)?))
    }

    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let mut model = Self::from_gguf_unpacked(file)?;
        model.pack_weights();
        Ok(model)
    }

    /// Opens a model without the CPU kernels' repacked copy of the weights:
    /// for a GPU backend, which copies the file's blocks to the device itself
    /// (packing a 20 GB model would double its host memory for nothing). The
    /// CPU forward pass still works on it, reading the file's layout.
    pub fn load_unpacked(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Self::from_gguf_unpacked(Arc::new(GgufFile::open(path)?))
    }

    fn from_gguf_unpacked(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let arch = ArchSpec::of(&config);
        let ld = Loader {
            file: &file,
            seen: RefCell::default(),
        };
        let c = &config;
        let muse = c.arch == Architecture::MuseGlimmer;
        let (dim, q_dim, kv_dim) = (c.dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let tok_embd = ld.linear(names::TOKEN_EMBD, c.vocab_size, dim)?;
        // muse-glimmer requires its own LM head (muse-glimmer.cpp:25); the
        // others may tie it to the embeddings.
        let output = match muse {
            true => ld.linear(names::OUTPUT, c.vocab_size, dim)?,
            false => ld
                .opt_linear(names::OUTPUT, c.vocab_size, dim)?
                .unwrap_or_else(|| tok_embd.clone()),
        };
        let output_norm = ld.vector(names::OUTPUT_NORM, dim)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for (i, spec) in arch.layers.iter().enumerate() {
            let lin = |t: Blk, rows, cols| -> Result<Linear, ModelError> {
                let mut l = ld.linear(&t.of(i), rows, cols)?;
                l.scale = ld.opt_scale(&t.scale_of(i))?;
                Ok(l)
            };
            let vec = |t: Blk, len| ld.vector(&t.of(i), len);
            let opt_vec = |t: Blk, len| ld.opt_vector(&t.of(i), len);
            let (post_attn_norm, post_ffn_norm) = match spec.post_norm_eps {
                Some(_) => (
                    Some(vec(Blk::PostAttnNorm, dim)?),
                    Some(vec(Blk::PostFfnNorm, dim)?),
                ),
                None => (None, None),
            };
            let (q_norm, k_norm) = match spec.qk_norm {
                QkNorm::Gains => (
                    Some(vec(Blk::AttnQNorm, c.head_dim)?),
                    Some(vec(Blk::AttnKNorm, c.head_dim)?),
                ),
                QkNorm::None => (None, None),
            };
            let attn_gate = match spec.output_gate {
                true => Some(ld.linear(&Blk::AttnGate.of(i), q_dim, dim)?),
                false => None,
            };
            // Fused or separate q/k/v (llama.cpp create_tensor_qkv and
            // build_qkv, llama-graph.cpp:1697-1737): with a fused matrix the
            // separate biases apply only when all three exist.
            let (wq, wk, wv, wqkv, bq, bk, bv) = if ld.has(&Blk::AttnQkv.of(i)) {
                let w = lin(Blk::AttnQkv, q_dim + 2 * kv_dim, dim)?;
                let parts = [
                    0..q_dim,
                    q_dim..q_dim + kv_dim,
                    q_dim + kv_dim..q_dim + 2 * kv_dim,
                ];
                let split = |b: Vec<f32>| parts.clone().map(|r| Some(b[r].to_vec()));
                let [bq, bk, bv] = match opt_vec(Blk::AttnQkvBias, q_dim + 2 * kv_dim)? {
                    Some(b) => split(b),
                    None => match (
                        opt_vec(Blk::AttnQBias, q_dim)?,
                        opt_vec(Blk::AttnKBias, kv_dim)?,
                        opt_vec(Blk::AttnVBias, kv_dim)?,
                    ) {
                        (Some(q), Some(k), Some(v)) => [Some(q), Some(k), Some(v)],
                        _ => [None, None, None],
                    },
                };
                let [rq, rk, rv] = parts;
                (
                    w.rows_view(rq),
                    w.rows_view(rk),
                    w.rows_view(rv),
                    Some(w),
                    bq,
                    bk,
                    bv,
                )
            } else {
                (
                    lin(Blk::AttnQ, q_dim, dim)?,
                    lin(Blk::AttnK, kv_dim, dim)?,
                    lin(Blk::AttnV, kv_dim, dim)?,
                    None,
                    opt_vec(Blk::AttnQBias, q_dim)?,
                    opt_vec(Blk::AttnKBias, kv_dim)?,
                    opt_vec(Blk::AttnVBias, kv_dim)?,
                )
            };
            // Created by llama.cpp's generic pass, never applied by these graphs.
            for t in [Blk::AttnGate, Blk::FfnGate, Blk::FfnUp, Blk::FfnDown] {
                ld.accept_unused(&t.scale_of(i));
            }
            for t in [
                Blk::AttnQ,
                Blk::AttnK,
                Blk::AttnV,
                Blk::AttnQkv,
                Blk::AttnOutput,
                Blk::AttnGate,
                Blk::FfnGate,
                Blk::FfnUp,
                Blk::FfnDown,
            ] {
                ld.accept_unused(&t.scale_of(i).replace(".scale", ".input_scale"));
            }
            layers.push(Layer {
                attn_norm: vec(Blk::AttnNorm, dim)?,
                wq,
                wk,
                wv,
                wqkv,
                wo: lin(Blk::AttnOutput, dim, q_dim)?,
                bq,
                bk,
                bv,
                q_norm,
                k_norm,
                attn_gate,
                post_attn_norm,
                ffn_norm: vec(Blk::FfnNorm, dim)?,
                ffn_gate: ld.linear(&Blk::FfnGate.of(i), c.ffn_dim, dim)?,
                ffn_up: ld.linear(&Blk::FfnUp.of(i), c.ffn_dim, dim)?,
                ffn_down: ld.linear(&Blk::FfnDown.of(i), dim, c.ffn_dim)?,
                post_ffn_norm,
                ffn_gate_up: None,
            });
        }
        // llama.cpp refuses a file with tensors its layout has no place for
        // (done_getting_tensors); so does hearth, for the architecture whose
        // files it must read exactly as llama.cpp does.
        if muse {
            if let Some(name) = ld.unexpected() {
                return Err(ModelError::UnexpectedTensor {
                    name,
                    arch: c.arch.gguf_name(),
                });
            }
        }
        let mut model = Model {
            config,
            arch,
            numerics: Numerics::Reference,
            kv_types: KvTypes::same(KvDtype::F16),
            ref_isa: RefIsa::native(),
            file,
            tok_embd,
            output_norm,
            output,
            layers,
            dump_dir: None,
        };
        model.set_numerics(Numerics::Reference);
        Ok(model)
    }

    /// Repacks every matrix the quantized-activation matmuls read (layers
    /// and LM head) into the interleaved layout of the SIMD kernels. The
    /// embedding table stays in the file (lookups read single rows).
    /// Architectures whose matmuls take f32 activations are left as they are.
    fn pack_weights(&mut self) {
        if self.activations() != Activations::Quantized {
            return;
        }
        let bytes = self.file.raw_bytes();
        let mat = |l: &Linear| QMatrix {
            ty: l.ty,
            rows: l.rows,
            cols: l.cols,
            data: &bytes[l.range.clone()],
        };
        let pack = |l: &mut Linear| l.packed = PackedMatrix::pack(&mat(l)).map(Arc::new);
        for layer in &mut self.layers {
            match &mut layer.wqkv {
                Some(w) => pack(w),
                None => [&mut layer.wq, &mut layer.wk, &mut layer.wv]
                    .into_iter()
                    .for_each(pack),
            }
            pack(&mut layer.wo);
            pack(&mut layer.ffn_down);
            layer.ffn_gate_up =
                PackedMatrix::pack_pair(&mat(&layer.ffn_gate), &mat(&layer.ffn_up)).map(Arc::new);
            if layer.ffn_gate_up.is_none() {
                pack(&mut layer.ffn_gate);
                pack(&mut layer.ffn_up);
            }
            if let Some(g) = &mut layer.attn_gate {
                pack(g);
            }
        }
        pack(&mut self.output);
    }

    /// Switches numerics (before creating states: it sets the KV types to
    /// the numerics' own).
    pub fn set_numerics(&mut self, numerics: Numerics) {
        self.numerics = numerics;
        self.kv_types = numerics.kv_types();
    }

    /// Chooses the KV cache's storage types for states made from now on
    /// (llama.cpp's `-ctk`/`-ctv`): f16, q8_0 or q4_0 for each of K and V.
    pub fn set_kv_types(&mut self, types: KvTypes) -> Result<(), String> {
        types.check(self.config.head_dim)?;
        self.kv_types = types;
        Ok(())
    }

    /// Dumps every named intermediate of later forward passes into `dir`
    /// (a debug aid for diffing against llama.cpp; fused passes then run
    /// unfused so every intermediate exists). `None` turns it off.
    pub fn set_dump_dir(&mut self, dir: Option<PathBuf>) {
        self.dump_dir = dir;
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// A borrowed view of a weight matrix for the kernels.
    pub fn mat(&self, l: &Linear) -> QMatrix<'_> {
        QMatrix {
            ty: l.ty,
            rows: l.rows,
            cols: l.cols,
            data: &self.file.raw_bytes()[l.range.clone()],
        }
    }

    /// Bytes of weights read per decoded token (every matrix once).
    pub fn weight_bytes(&self) -> usize {
        let lin = |l: &Linear| l.range.len();
        let per_layer: usize = self
            .layers
            .iter()
            .map(|l| {
                lin(&l.wq)
                    + lin(&l.wk)
                    + lin(&l.wv)
                    + lin(&l.wo)
                    + lin(&l.ffn_gate)
                    + lin(&l.ffn_up)
                    + lin(&l.ffn_down)
                    + l.attn_gate.as_ref().map_or(0, lin)
            })
            .sum();
        per_layer + lin(&self.output)
    }
}
