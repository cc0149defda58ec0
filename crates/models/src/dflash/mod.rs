//! DFlash and DFlash2 block-diffusion drafters in llama.cpp 11434's `dflash`
//! layout (src/models/dflash.cpp, driver common/speculative.cpp;
//! docs/muse-glimmer-llamacpp.md §2): a small transformer conditioned on
//! hidden states tapped from the target, which proposes a block of tokens
//! from one forward over `[anchor, MASK × (B−1)]`.
//!
//! - Context (KV injection): the target's tapped rows `f` ([n_taps · dim] per
//!   token, taps in file order) become `g = RMSNorm(fc · f) · enc.output_norm`;
//!   each layer stores `K = RoPE(k_norm(W_k g))` and `V = W_v g` (or, without
//!   `attn_v`, the gainless RMSNorm of `W_k g`) at the tokens' positions.
//! - Block: token embeddings (the draft's own `token_embd` or the target's,
//!   `× embedding_scale`), pre-norm layers with per-head q/k norms and NeoX
//!   RoPE (base `rope.freq_base`, default 10000, `rope_freqs` factors),
//!   attention over the context plus every block row (causal only with
//!   `attention.causal`), per query on sliding layers: row t at position
//!   C + t sees context positions p with C + t − p < W. Optional post-norms,
//!   attention sinks, value scale, layer output scale, GELU MLP, per-tensor
//!   scales. Logits from the draft's own head or the target's, scattered
//!   through `d2t` to the target vocabulary.
//! - DFlash2 (`selector_hidden.weight` present): grouped dynamic causal
//!   convolutions at four sites per layer, logit scale and soft-cap on the
//!   draft logits, and a top-k candidate selector whose lattice is walked
//!   greedily (selector.rs).
//!
//! Numerics: the target's activation mode for every matmul (8-bit
//! activations as llama.cpp quantizes them, or exact f32), keys, values and
//! queries rounded to f16 where llama.cpp's f16 cache and flash attention
//! hold them, f32 softmax. Not bit-identical to llama.cpp (its attention sums
//! in another order): the drafter only moves the acceptance rate, never the
//! output, which verification keeps exactly the target's.

mod config;
mod forward;
mod runner;
mod selector;

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use hearth_gguf::{GgmlType, GgufFile};
use hearth_kernels::cpu::interleaved::PackedMatrix;
use hearth_kernels::QMatrix;

pub use config::{Dflash2Config, DflashConfig, FfnActivation};
pub use forward::DraftOutput;
pub use runner::{CpuRunner, DraftMatrix, DraftRunner, PlainDraft, PlainLayer};
pub use selector::walk_lattice;

use crate::arch::names::{self, Blk};
use crate::weights::{matmul_supported, Model, ModelError};

#[derive(Debug, thiserror::Error)]
pub enum DflashError {
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
    #[error("not a DFlash draft: general.architecture is '{0}', expected \"dflash\"")]
    NotDflash(String),
    #[error("DFlash draft: key not found in model: {0}")]
    MissingKey(String),
    #[error("DFlash draft: missing tensor '{0}'")]
    MissingTensor(String),
    #[error("DFlash draft: unexpected tensor '{0}': not part of llama.cpp's dflash layout")]
    UnexpectedTensor(String),
    #[error("DFlash draft: tensor '{name}' has shape {got:?}, expected {expected:?} (ggml order)")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("DFlash draft: tensor '{name}' has type {ty}, which hearth cannot compute with")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("DFlash draft: {0} is not supported by hearth")]
    Unsupported(String),
    #[error("DFlash draft does not match the target: {0}")]
    Mismatch(String),
    #[error("DFlash draft: {0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A weight matrix of logical shape [rows, cols] in the draft file.
#[derive(Clone, Debug)]
pub(crate) struct Mat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub range: Range<usize>,
    /// The rows repacked for the SIMD kernels, where the type has a packed form.
    pub packed: Option<Arc<PackedMatrix>>,
    /// Per-tensor scale (`*.scale`), multiplied into the product.
    pub scale: Option<f32>,
}

/// DFlash2's convolution weights of one layer.
pub(crate) struct ConvLayer {
    /// [2 sides, K taps, dim] base kernels (`attn_conv_base`, ggml {dim, K, 2}).
    pub attn_base: Vec<f32>,
    /// dim -> 2·K·(dim / group) dynamic coefficients.
    pub attn_proj: Mat,
    pub ffn_base: Vec<f32>,
    pub ffn_proj: Mat,
}

pub(crate) struct DraftLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Mat,
    pub wk: Mat,
    /// Absent: V is the gainless RMSNorm of the un-normed K (shared K/V).
    pub wv: Option<Mat>,
    pub wo: Mat,
    /// [head_dim] each, used as stored.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// `layer_output_scale`: multiplies the layer's output (the residual stream).
    pub out_scale: Option<f32>,
    /// Per-head attention sink logits [n_heads].
    pub sinks: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub gate: Mat,
    pub up: Mat,
    pub down: Mat,
    pub conv: Option<ConvLayer>,
}

/// DFlash2's selector: token embeddings of rank R for predecessors and
/// successors, and the projection of the hidden state to R gates.
pub(crate) struct Selector {
    /// [vocab, R]
    pub prev: Vec<f32>,
    /// [vocab, R]
    pub next: Vec<f32>,
    /// [R, dim]
    pub hidden: Vec<f32>,
}

/// Draft weights. Token embeddings and LM head are the draft's own when it
/// has them, else the target's.
pub struct DflashModel {
    pub config: DflashConfig,
    pub(crate) file: Arc<GgufFile>,
    /// [dim, n_taps · dim]
    pub(crate) fc: Mat,
    pub(crate) hidden_norm: Vec<f32>,
    pub(crate) output_norm: Vec<f32>,
    pub(crate) tok_embd: Option<Mat>,
    /// [draft vocab, dim]
    pub(crate) output: Option<Mat>,
    /// Draft vocabulary row -> target token id (`d2t`).
    pub(crate) d2t: Option<Vec<u32>>,
    /// RoPE frequency divisors [head_dim / 2] (`rope_freqs.weight`).
    pub(crate) rope_freqs: Option<Vec<f32>>,
    pub(crate) layers: Vec<DraftLayer>,
    pub(crate) selector: Option<Selector>,
}

/// The draft's context cache: per layer K and V `[n_kv_heads, max_ctx,
/// head_dim]` (f16-rounded values held as f32), position c in slot c.
/// Sliding layers mask by position, so one layout serves both kinds.
pub struct DflashState {
    /// Context positions whose K/V are written (C).
    pub ctx_len: usize,
    pub max_ctx: usize,
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
}

impl DflashState {
    pub fn reset(&mut self) {
        self.ctx_len = 0;
    }
}

struct Loader<'a> {
    file: &'a GgufFile,
    seen: std::cell::RefCell<BTreeSet<String>>,
}

impl Loader<'_> {
    fn has(&self, name: &str) -> bool {
        self.seen.borrow_mut().insert(name.to_string());
        self.file.tensor_info(name).is_some()
    }

    /// A matrix and, for the ones llama.cpp creates a `*.scale` for (fc, q, k,
    /// v, o and the MLP's), its per-tensor scale.
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat, DflashError> {
        let scaled = !name.contains("conv_proj") && name.starts_with(['b', 'f']);
        self.mat_with(name, rows, cols, scaled)
    }

    fn mat_with(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        scaled: bool,
    ) -> Result<Mat, DflashError> {
        self.seen.borrow_mut().insert(name.to_string());
        let ti = self
            .file
            .tensor_info(name)
            .ok_or_else(|| DflashError::MissingTensor(name.into()))?;
        let expected = vec![cols as u64, rows as u64];
        if ti.shape != expected {
            return Err(DflashError::BadShape {
                name: name.into(),
                expected,
                got: ti.shape.clone(),
            });
        }
        if !matmul_supported(ti.ty) {
            return Err(DflashError::UnsupportedType {
                name: name.into(),
                ty: ti.ty,
            });
        }
        let start = (self.file.data_offset() + ti.offset) as usize;
        let range = start..start + ti.n_bytes() as usize;
        let m = QMatrix {
            ty: ti.ty,
            rows,
            cols,
            data: &self.file.raw_bytes()[range.clone()],
        };
        let packed = PackedMatrix::pack(&m).map(Arc::new);
        let stem = name.trim_end_matches(".weight");
        let scale = match scaled {
            true => self
                .opt_vector(&format!("{stem}.scale"), &[1])?
                .map(|v| v[0]),
            false => None,
        };
        if scaled {
            // Created by llama.cpp's generic pass, never applied.
            self.seen.borrow_mut().insert(format!("{stem}.input_scale"));
        }
        Ok(Mat {
            ty: ti.ty,
            rows,
            cols,
            range,
            packed,
            scale,
        })
    }

    fn opt_mat(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Mat>, DflashError> {
        match self.has(name) {
            false => Ok(None),
            true => self.mat(name, rows, cols).map(Some),
        }
    }

    /// The LM head or embeddings: no per-tensor scale (llama.cpp creates
    /// `output.scale` only for NVFP4 heads).
    fn opt_head(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Mat>, DflashError> {
        match self.has(name) {
            false => Ok(None),
            true => self.mat_with(name, rows, cols, false).map(Some),
        }
    }

    /// A tensor of ggml shape `shape`, dequantized to f32.
    fn vector(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>, DflashError> {
        self.seen.borrow_mut().insert(name.to_string());
        let ti = self
            .file
            .tensor_info(name)
            .ok_or_else(|| DflashError::MissingTensor(name.into()))?;
        if ti.shape != shape {
            return Err(DflashError::BadShape {
                name: name.into(),
                expected: shape.to_vec(),
                got: ti.shape.clone(),
            });
        }
        let mut out = vec![0.0; ti.n_elements() as usize];
        hearth_kernels::dequantize(ti.ty, self.file.tensor(name)?.data, &mut out).map_err(
            |_| DflashError::UnsupportedType {
                name: name.into(),
                ty: ti.ty,
            },
        )?;
        Ok(out)
    }

    fn opt_vector(&self, name: &str, shape: &[u64]) -> Result<Option<Vec<f32>>, DflashError> {
        match self.has(name) {
            false => Ok(None),
            true => self.vector(name, shape).map(Some),
        }
    }
}

impl DflashModel {
    /// Loads a `dflash` draft GGUF and checks it against its `target`.
    pub fn load(path: impl AsRef<Path>, target: &Model) -> Result<DflashModel, DflashError> {
        let file = Arc::new(GgufFile::open(path)?);
        let arch = file.architecture();
        if arch != Some("dflash") {
            return Err(DflashError::NotDflash(
                arch.unwrap_or("(missing)").to_string(),
            ));
        }
        let config = DflashConfig::from_gguf(&file)?;
        let c = &config;
        let t = &target.config;
        if c.dim != t.dim {
            return Err(DflashError::Mismatch(format!(
                "draft width {} differs from the target's {}",
                c.dim, t.dim
            )));
        }
        // t_layer_inp[j] exists for the target's layers 0..L-1 (the input of layer j).
        if let Some(&l) = c.target_layers.iter().find(|&&l| l >= t.n_layers) {
            return Err(DflashError::Mismatch(format!(
                "target layer {l} is past the target's {} layers",
                t.n_layers
            )));
        }
        if c.mask_token as usize >= t.vocab_size {
            return Err(DflashError::Mismatch(format!(
                "mask token {} is outside the target vocabulary of {}",
                c.mask_token, t.vocab_size
            )));
        }
        let ld = Loader {
            file: &file,
            seen: Default::default(),
        };
        let (d, q, kv, f, hd) = (
            c.dim,
            c.n_heads * c.head_dim,
            c.n_kv_heads * c.head_dim,
            c.ffn_dim,
            c.head_dim,
        );
        let vocab = t.vocab_size;
        let dv = |n: usize| [n as u64];
        // Reduced draft vocabulary: d2t maps its rows to target ids.
        let d2t = match ld.has("d2t") {
            false => None,
            true => {
                let ti = file.tensor_info("d2t").expect("present");
                if ti.ty != GgmlType::I64 || ti.shape.len() != 1 {
                    return Err(DflashError::Invalid(format!(
                        "d2t must be a 1-D I64 tensor, got {} {:?}",
                        ti.ty, ti.shape
                    )));
                }
                let ids: Vec<u32> = file
                    .tensor("d2t")?
                    .data
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                    .map(|id| u32::try_from(id).ok().filter(|&i| (i as usize) < vocab))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        DflashError::Mismatch(
                            "d2t maps to ids outside the target vocabulary".into(),
                        )
                    })?;
                Some(ids)
            }
        };
        let draft_vocab = d2t.as_ref().map_or(vocab, |m| m.len());
        let tok_embd = ld.opt_head(names::TOKEN_EMBD, vocab, d)?;
        let output = match ld.opt_head(names::OUTPUT, draft_vocab, d)? {
            Some(o) => Some(o),
            None => tok_embd.clone(),
        };
        if output.is_none() && d2t.is_some() {
            return Err(DflashError::MissingTensor(
                "output.weight (a draft with d2t needs its own head)".into(),
            ));
        }
        let fc = ld.mat(names::DFLASH_FC, d, c.target_layers.len() * d)?;
        let hidden_norm = ld.vector(names::DFLASH_HIDDEN_NORM, &dv(d))?;
        let output_norm = ld.vector(names::OUTPUT_NORM, &dv(d))?;
        let rope_freqs = ld.opt_vector("rope_freqs.weight", &dv(hd / 2))?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let mat = |b: Blk, rows, cols| ld.mat(&b.of(i), rows, cols);
            let vector = |b: Blk, n: usize| ld.vector(&b.of(i), &dv(n));
            let opt_vector = |b: Blk, n: usize| ld.opt_vector(&b.of(i), &dv(n));
            let conv = match &c.dflash2 {
                None => None,
                Some(d2) => {
                    let proj = 2 * d2.conv_kernel * (d / d2.conv_group);
                    let base_shape = [d as u64, d2.conv_kernel as u64, 2];
                    Some(ConvLayer {
                        attn_base: ld.vector(&format!("blk.{i}.attn_conv_base"), &base_shape)?,
                        attn_proj: ld.mat(&format!("blk.{i}.attn_conv_proj.weight"), proj, d)?,
                        ffn_base: ld.vector(&format!("blk.{i}.ffn_conv_base"), &base_shape)?,
                        ffn_proj: ld.mat(&format!("blk.{i}.ffn_conv_proj.weight"), proj, d)?,
                    })
                }
            };
            layers.push(DraftLayer {
                attn_norm: vector(Blk::AttnNorm, d)?,
                wq: mat(Blk::AttnQ, q, d)?,
                wk: mat(Blk::AttnK, kv, d)?,
                wv: ld.opt_mat(&Blk::AttnV.of(i), kv, d)?,
                wo: mat(Blk::AttnOutput, d, q)?,
                q_norm: vector(Blk::AttnQNorm, hd)?,
                k_norm: vector(Blk::AttnKNorm, hd)?,
                post_attn_norm: opt_vector(Blk::PostAttnNorm, d)?,
                post_ffn_norm: opt_vector(Blk::PostFfnNorm, d)?,
                out_scale: ld
                    .opt_vector(&format!("blk.{i}.layer_output_scale.weight"), &[1])?
                    .map(|v| v[0]),
                sinks: ld.opt_vector(&format!("blk.{i}.attn_sinks.weight"), &dv(c.n_heads))?,
                ffn_norm: vector(Blk::FfnNorm, d)?,
                gate: mat(Blk::FfnGate, f, d)?,
                up: mat(Blk::FfnUp, f, d)?,
                down: mat(Blk::FfnDown, d, f)?,
                conv,
            });
        }
        let selector = match &c.dflash2 {
            None => None,
            Some(d2) => {
                let r = d2.selector_rank as u64;
                Some(Selector {
                    prev: ld.vector("selector_predecessor.weight", &[r, vocab as u64])?,
                    next: ld.vector("selector_successor.weight", &[r, vocab as u64])?,
                    hidden: ld.vector("selector_hidden.weight", &[d as u64, r])?,
                })
            }
        };
        if let Some(t) = file
            .tensors()
            .iter()
            .find(|t| !ld.seen.borrow().contains(&t.name))
        {
            return Err(DflashError::UnexpectedTensor(t.name.clone()));
        }
        Ok(DflashModel {
            config,
            file: file.clone(),
            fc,
            hidden_norm,
            output_norm,
            tok_embd,
            output,
            d2t,
            rope_freqs,
            layers,
            selector,
        })
    }

    pub fn new_state(&self, max_ctx: usize) -> DflashState {
        let c = &self.config;
        let n = c.n_kv_heads * max_ctx * c.head_dim;
        DflashState {
            ctx_len: 0,
            max_ctx,
            k: (0..c.n_layers).map(|_| vec![0.0; n]).collect(),
            v: (0..c.n_layers).map(|_| vec![0.0; n]).collect(),
        }
    }

    /// Width of one tapped hidden row (n_taps · dim).
    pub fn hidden_width(&self) -> usize {
        self.config.target_layers.len() * self.config.dim
    }

    /// Whether this is a DFlash2 drafter (selector lattice).
    pub fn is_dflash2(&self) -> bool {
        self.selector.is_some()
    }

    /// Skips the context positions `[st.ctx_len, st.ctx_len + n)` without
    /// writing them (rows no sliding window will ever see).
    pub fn skip_context(&self, st: &mut DflashState, n: usize) -> Result<(), DflashError> {
        if st.ctx_len + n > st.max_ctx {
            return Err(DflashError::Invalid(format!(
                "context position {} exceeds the draft cache of {}",
                st.ctx_len + n,
                st.max_ctx
            )));
        }
        st.ctx_len += n;
        Ok(())
    }
}
