//! DFlash block-diffusion drafter (docs/spec/dflash.md): a small
//! non-causal transformer conditioned on hidden states tapped from the target.
//! One forward over the block `[anchor, MASK × (B−1)]` proposes B−1 tokens.
//!
//! - Context: `ctx = RMS_w(fc · H)` for new target hidden rows H (§4.1); each
//!   layer stores `RoPE(k_norm(W_k ctx))` and `W_v ctx` at the context
//!   positions (KV injection). Only committed rows are ever written, so the
//!   draft cache never rolls back (§5, §9).
//! - Block: raw target embeddings `E[b]` (no target embedding norm), pre-norm
//!   layers with weighted per-head q/k norms, NeoX RoPE at positions C1+t,
//!   attention over all valid context keys plus all B block keys (no causal
//!   mask), SwiGLU MLP; output norm and the target's lm_head with no
//!   multiplier or soft-cap (§4.3–4.4).
//!
//! Numerics: the target's activation mode for every matmul (8-bit quantized
//! activations through the packed SIMD kernels for llama.cpp-style targets,
//! exact f32 for an f32 or Muse Glimmer target), f32 everywhere else, f32
//! context cache. The spec's bf16 rounding points describe the GPU reference;
//! the drafter's precision only moves the acceptance rate, never the output,
//! which verification keeps exactly the target's.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use hearth_gguf::{GgmlType, GgufFile, Metadata};
use hearth_kernels::cpu::interleaved::{matmul_packed, PackedMatrix};
use hearth_kernels::cpu::simd;
use hearth_kernels::{matmul, Activations, QMatrix, RowOrder};

use crate::arch::names::{self, Blk};
use crate::blocks::{rmsnorm, silu, Rope};
use crate::config::RopeLayout;
use crate::forward::Pass;
use crate::weights::{matmul_supported, Model, ModelError};

#[derive(Debug, thiserror::Error)]
pub enum DflashError {
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
    #[error("not a DFlash draft: general.architecture is '{0}', expected \"dflash\"")]
    NotDflash(String),
    #[error("DFlash draft: missing tensor '{0}' (every draft parameter must be present)")]
    MissingTensor(String),
    #[error("DFlash draft: tensor '{name}' has shape {got:?}, expected {expected:?} (ggml order)")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("DFlash draft: tensor '{name}' has type {ty}, which hearth cannot compute with")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("DFlash draft does not match the target: {0}")]
    Mismatch(String),
    #[error("DFlash draft: {0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Hyperparameters from the `dflash.*` metadata (spec §2.1, with its defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct DflashConfig {
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    /// Trained (maximum) block length B_max.
    pub block_size: usize,
    /// Tapped target layers, ascending: the residual stream entering each.
    pub target_layers: Vec<usize>,
    pub rope_theta: f32,
    pub eps: f32,
    pub mask_token: u32,
    /// Per layer: `Some(W_d)` for a sliding layer (the block sees the last W_d
    /// context positions), `None` for a global one.
    pub windows: Vec<Option<usize>>,
}

impl DflashConfig {
    pub fn from_metadata(md: &Metadata) -> Result<DflashConfig, DflashError> {
        let int = |k: &str, d: usize| -> Result<usize, DflashError> {
            match md.get(k) {
                None => Ok(d),
                Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    DflashError::Invalid(format!("metadata '{k}' is not an integer"))
                }),
            }
        };
        let float = |k: &str, d: f64| -> Result<f32, DflashError> {
            match md.get(k) {
                None => Ok(d as f32),
                Some(v) => v
                    .as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| DflashError::Invalid(format!("metadata '{k}' is not a number"))),
            }
        };
        let target_layers = match md.get_array("dflash.target_layers") {
            None => vec![2, 14, 26, 38, 50],
            Some(a) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    DflashError::Invalid("dflash.target_layers is not an integer array".into())
                })?,
        };
        let n_layers = int("dflash.block_count", 5)?;
        let window = int("dflash.attention.sliding_window", 0)?;
        let windows = match md.get_array("dflash.attention.sliding_window_pattern") {
            None => vec![None; n_layers],
            Some(a) => {
                let pattern = a
                    .iter()
                    .map(|v| v.as_bool())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        DflashError::Invalid(
                            "dflash.attention.sliding_window_pattern is not a bool array".into(),
                        )
                    })?;
                if pattern.len() != n_layers {
                    return Err(DflashError::Invalid(format!(
                        "sliding_window_pattern has {} entries for {n_layers} layers",
                        pattern.len()
                    )));
                }
                if pattern.iter().any(|&s| s) && window == 0 {
                    return Err(DflashError::Invalid(
                        "sliding layers without dflash.attention.sliding_window".into(),
                    ));
                }
                pattern.into_iter().map(|s| s.then_some(window)).collect()
            }
        };
        let c = DflashConfig {
            dim: int("dflash.embedding_length", 6656)?,
            n_layers,
            n_heads: int("dflash.attention.head_count", 32)?,
            n_kv_heads: int("dflash.attention.head_count_kv", 8)?,
            head_dim: int("dflash.attention.key_length", 128)?,
            ffn_dim: int("dflash.feed_forward_length", 19968)?,
            block_size: int("dflash.block_size", 16)?,
            target_layers,
            rope_theta: float("dflash.rope.freq_base", 500000.0)?,
            eps: float("dflash.attention.layer_norm_rms_epsilon", 1e-5)?,
            mask_token: int("tokenizer.ggml.mask_token_id", 201818)? as u32,
            windows,
        };
        if c.n_heads == 0 || c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
            return Err(DflashError::Invalid(format!(
                "{} heads cannot share {} KV heads",
                c.n_heads, c.n_kv_heads
            )));
        }
        if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) || c.head_dim > 512 {
            return Err(DflashError::Invalid(format!(
                "head dim {} must be even and at most 512",
                c.head_dim
            )));
        }
        if c.block_size < 2 {
            return Err(DflashError::Invalid(format!(
                "block size {} must be at least 2",
                c.block_size
            )));
        }
        if c.target_layers.is_empty() || c.target_layers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DflashError::Invalid(format!(
                "target_layers {:?} must be non-empty and ascending",
                c.target_layers
            )));
        }
        Ok(c)
    }

    /// W_d when every layer is sliding, else 0 (spec §2.1 `draft_sliding_window`):
    /// hidden rows older than that can never be seen and need not be written.
    pub fn draft_sliding_window(&self) -> usize {
        match self.windows.first() {
            Some(&Some(w)) if self.windows.iter().all(|x| *x == Some(w)) => w,
            _ => 0,
        }
    }
}

/// A weight matrix of logical shape [rows, cols] in the draft file.
#[derive(Clone, Debug)]
struct Mat {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    range: Range<usize>,
    /// The rows repacked for the SIMD kernels, where the type has a packed form.
    packed: Option<Arc<PackedMatrix>>,
}

struct DraftLayer {
    attn_norm: Vec<f32>,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    wo: Mat,
    /// [head_dim] each, used as stored (no +1).
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Mat,
    up: Mat,
    down: Mat,
}

/// Draft weights; the token embeddings and lm_head come from the target.
pub struct DflashModel {
    pub config: DflashConfig,
    file: Arc<GgufFile>,
    /// [dim, n_taps · dim]
    fc: Mat,
    hidden_norm: Vec<f32>,
    output_norm: Vec<f32>,
    layers: Vec<DraftLayer>,
}

/// The draft's context cache: per layer K and V `[n_kv_heads, max_ctx, head_dim]`,
/// position c in slot c. Sliding layers mask by position, so one layout
/// serves both kinds (equivalent to the spec's 2·W_d ring, §5).
pub struct DflashState {
    /// Context positions whose K/V are written (C).
    pub ctx_len: usize,
    pub max_ctx: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl DflashState {
    pub fn reset(&mut self) {
        self.ctx_len = 0;
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
        let config = DflashConfig::from_metadata(file.metadata())?;
        let c = &config;
        let t = &target.config;
        if c.dim != t.dim {
            return Err(DflashError::Mismatch(format!(
                "draft width {} differs from the target's {}",
                c.dim, t.dim
            )));
        }
        if let Some(&l) = c.target_layers.iter().find(|&&l| l > t.n_layers) {
            return Err(DflashError::Mismatch(format!(
                "tapped layer {l} is past the target's {} layers",
                t.n_layers
            )));
        }
        if c.mask_token as usize >= t.vocab_size {
            return Err(DflashError::Mismatch(format!(
                "mask token {} is outside the target vocabulary of {}",
                c.mask_token, t.vocab_size
            )));
        }
        let (d, q, kv, f, hd) = (
            c.dim,
            c.n_heads * c.head_dim,
            c.n_kv_heads * c.head_dim,
            c.ffn_dim,
            c.head_dim,
        );
        let mat = |name: &str, rows: usize, cols: usize| -> Result<Mat, DflashError> {
            let ti = file
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
            let start = (file.data_offset() + ti.offset) as usize;
            let range = start..start + ti.n_bytes() as usize;
            let m = QMatrix {
                ty: ti.ty,
                rows,
                cols,
                data: &file.raw_bytes()[range.clone()],
            };
            let packed = PackedMatrix::pack(&m).map(Arc::new);
            Ok(Mat {
                ty: ti.ty,
                rows,
                cols,
                range,
                packed,
            })
        };
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, DflashError> {
            let ti = file
                .tensor_info(name)
                .ok_or_else(|| DflashError::MissingTensor(name.into()))?;
            if ti.shape != [len as u64] {
                return Err(DflashError::BadShape {
                    name: name.into(),
                    expected: vec![len as u64],
                    got: ti.shape.clone(),
                });
            }
            let mut out = vec![0.0; len];
            hearth_kernels::dequantize(ti.ty, file.tensor(name)?.data, &mut out).map_err(|_| {
                DflashError::UnsupportedType {
                    name: name.into(),
                    ty: ti.ty,
                }
            })?;
            Ok(out)
        };
        let fc = mat(names::DFLASH_FC, d, c.target_layers.len() * d)?;
        let hidden_norm = vector(names::DFLASH_HIDDEN_NORM, d)?;
        let output_norm = vector(names::OUTPUT_NORM, d)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            layers.push(DraftLayer {
                attn_norm: vector(&Blk::AttnNorm.of(i), d)?,
                wq: mat(&Blk::AttnQ.of(i), q, d)?,
                wk: mat(&Blk::AttnK.of(i), kv, d)?,
                wv: mat(&Blk::AttnV.of(i), kv, d)?,
                wo: mat(&Blk::AttnOutput.of(i), d, q)?,
                q_norm: vector(&Blk::AttnQNorm.of(i), hd)?,
                k_norm: vector(&Blk::AttnKNorm.of(i), hd)?,
                ffn_norm: vector(&Blk::FfnNorm.of(i), d)?,
                gate: mat(&Blk::FfnGate.of(i), f, d)?,
                up: mat(&Blk::FfnUp.of(i), f, d)?,
                down: mat(&Blk::FfnDown.of(i), d, f)?,
            });
        }
        Ok(DflashModel {
            config,
            file,
            fc,
            hidden_norm,
            output_norm,
            layers,
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

    /// `x @ W^T` with the target's activation mode.
    fn linear(&self, mode: Activations, w: &Mat, x: &[f32]) -> Vec<f32> {
        let n = x.len() / w.cols;
        let mut out = vec![0.0f32; n * w.rows];
        let m = QMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: &self.file.raw_bytes()[w.range.clone()],
        };
        match (&w.packed, mode) {
            (Some(p), Activations::Quantized) => {
                matmul_packed(simd::active(), p, &m, x, n, &mut out, RowOrder::Batched)
            }
            _ => matmul(&m, x, n, &mut out, mode, RowOrder::Batched),
        }
        out
    }

    /// Skips the context positions `[st.ctx_len, st.ctx_len + n)` without
    /// writing them (rows that no sliding window will ever see, spec §7.4).
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

    /// One draft forward (spec §4). `hidden`: new context rows
    /// [n_new, n_taps · dim] for positions `st.ctx_len..`, written to the
    /// cache (C advances by n_new). `block`: [anchor, MASK, …], 2 ≤ B ≤
    /// block_size. Returns logits for block rows `1..=n_out` ([n_out, vocab]);
    /// row 0 (the anchor's) is never needed.
    pub fn forward(
        &self,
        target: &Model,
        st: &mut DflashState,
        hidden: &[f32],
        block: &[u32],
        n_out: usize,
    ) -> Result<Vec<f32>, DflashError> {
        let c = &self.config;
        let (d, hd, nh, nkv) = (c.dim, c.head_dim, c.n_heads, c.n_kv_heads);
        let b = block.len();
        if b < 2 || b > c.block_size {
            return Err(DflashError::Invalid(format!(
                "block length {b} must be in 2..={}",
                c.block_size
            )));
        }
        if n_out == 0 || n_out >= b {
            return Err(DflashError::Invalid(format!(
                "{n_out} draft rows requested from a block of {b}"
            )));
        }
        let width = self.hidden_width();
        if !hidden.len().is_multiple_of(width) {
            return Err(DflashError::Invalid(format!(
                "hidden rows of {} values are not multiples of {width}",
                hidden.len()
            )));
        }
        if let Some(&bad) = block
            .iter()
            .find(|&&t| t as usize >= target.config.vocab_size)
        {
            return Err(ModelError::BadToken {
                token: bad,
                vocab: target.config.vocab_size,
            }
            .into());
        }
        let n_new = hidden.len() / width;
        let c0 = st.ctx_len;
        let c1 = c0 + n_new;
        if c1 + b > st.max_ctx {
            return Err(DflashError::Invalid(format!(
                "draft positions up to {} exceed the draft cache of {}",
                c1 + b,
                st.max_ctx
            )));
        }
        let rope = Rope {
            theta: c.rope_theta,
            layout: RopeLayout::Neox,
            n_rot: hd,
            iterative: false,
        };
        let mode = target.activations();

        // §4.1 context features, shared by every layer.
        let mut ctx = self.linear(mode, &self.fc, hidden);
        rmsnorm(&mut ctx, d, Some(&self.hidden_norm), c.eps);
        // §4.2 block input: raw target embedding rows.
        let emb = target.mat(&target.tok_embd);
        let mut x = vec![0.0f32; b * d];
        for (row, &t) in x.chunks_exact_mut(d).zip(block) {
            emb.dequantize_row(t as usize, row);
        }

        for (li, l) in self.layers.iter().enumerate() {
            // §4.3.2 new context K/V, written at positions c0.. (committed rows only).
            if n_new > 0 {
                let mut kc = self.linear(mode, &l.wk, &ctx);
                rmsnorm(&mut kc, hd, Some(&l.k_norm), c.eps);
                rope.apply_tokens(&mut kc, nkv, hd, c0);
                let vc = self.linear(mode, &l.wv, &ctx);
                let (ck, cv) = (&mut st.k[li], &mut st.v[li]);
                for r in 0..n_new {
                    for h in 0..nkv {
                        let src = (r * nkv + h) * hd;
                        let dst = (h * st.max_ctx + c0 + r) * hd;
                        ck[dst..dst + hd].copy_from_slice(&kc[src..src + hd]);
                        cv[dst..dst + hd].copy_from_slice(&vc[src..src + hd]);
                    }
                }
            }
            // §4.3.3 block Q/K/V at positions C1+t.
            let mut h = x.clone();
            rmsnorm(&mut h, d, Some(&l.attn_norm), c.eps);
            let mut q = self.linear(mode, &l.wq, &h);
            let mut kb = self.linear(mode, &l.wk, &h);
            let vb = self.linear(mode, &l.wv, &h);
            rmsnorm(&mut q, hd, Some(&l.q_norm), c.eps);
            rmsnorm(&mut kb, hd, Some(&l.k_norm), c.eps);
            rope.apply_tokens(&mut q, nh, hd, c1);
            rope.apply_tokens(&mut kb, nkv, hd, c1);
            // §4.3.4 visible context: all of [0, C1), or the last W_d for a sliding layer.
            let lo = match c.windows[li] {
                Some(w) => c1.saturating_sub(w),
                None => 0,
            };
            let y = self.attend(&q, &kb, &vb, &st.k[li], &st.v[li], st.max_ctx, lo, c1, b);
            let a = self.linear(mode, &l.wo, &y);
            x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
            // §4.3.6 SwiGLU MLP.
            let mut h2 = x.clone();
            rmsnorm(&mut h2, d, Some(&l.ffn_norm), c.eps);
            let mut g = self.linear(mode, &l.gate, &h2);
            let u = self.linear(mode, &l.up, &h2);
            g.iter_mut()
                .zip(&u)
                .for_each(|(gi, ui)| *gi = silu(*gi) * ui);
            let m = self.linear(mode, &l.down, &g);
            x.iter_mut().zip(&m).for_each(|(xi, mi)| *xi += mi);
        }
        st.ctx_len = c1;

        // §4.4 output norm and the target's lm_head, rows 1..=n_out only.
        let mut out = x[d..(n_out + 1) * d].to_vec();
        rmsnorm(&mut out, d, Some(&self.output_norm), c.eps);
        Ok(target.linear(&Pass::plain(), &target.output, &out))
    }

    /// Non-causal attention of the B block queries over context positions
    /// `lo..c1` (from the cache) and all B block keys. Scale 1/√head_dim,
    /// query head h uses KV head ⌊h / group⌋, f32 softmax. Returns [B, n_heads · hd].
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &[f32],
        kb: &[f32],
        vb: &[f32],
        kc: &[f32],
        vc: &[f32],
        slots: usize,
        lo: usize,
        c1: usize,
        b: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let group = nh / nkv;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut y = vec![0.0f32; b * nh * hd];
        let n_keys = c1 - lo + b;
        let mut scores = vec![0.0f32; n_keys];
        for t in 0..b {
            for h in 0..nh {
                let kvh = h / group;
                let qv = &q[(t * nh + h) * hd..][..hd];
                let key = |j: usize| -> &[f32] {
                    if j < c1 - lo {
                        &kc[(kvh * slots + lo + j) * hd..][..hd]
                    } else {
                        &kb[((j - (c1 - lo)) * nkv + kvh) * hd..][..hd]
                    }
                };
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = qv.iter().zip(key(j)).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let o = &mut y[(t * nh + h) * hd..][..hd];
                for (j, &s) in scores.iter().enumerate() {
                    let p = s / sum;
                    let val = if j < c1 - lo {
                        &vc[(kvh * slots + lo + j) * hd..][..hd]
                    } else {
                        &vb[((j - (c1 - lo)) * nkv + kvh) * hd..][..hd]
                    };
                    o.iter_mut().zip(val).for_each(|(a, v)| *a += p * v);
                }
            }
        }
        y
    }
}
