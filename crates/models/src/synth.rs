//! Synthetic checkpoints: GGUFs with a real model's tensor names, shapes and
//! quantization mix but seeded random weights, for benchmarking and testing
//! models too large (or not yet released) to download.
//!
//! A [`SynthPlan`] lists every tensor (name, ggml type, shape, how its values
//! are drawn) and the metadata; [`write_gguf`] streams it to disk in row
//! chunks, never holding a whole tensor. Every row of every tensor comes from
//! its own ChaCha8 stream, keyed by (seed, tensor name) with the row index as
//! the stream id, so any tensor or row range can be generated on its own and
//! the bytes do not depend on chunking or thread count.
//!
//! Quantization mix: llama.cpp's Q4_K_M rule (src/llama-quant.cpp), which is
//! also the released Muse Glimmer file's mix (docs/spec/muse-glimmer-model.md §4.5):
//! Q4_K by default, Q6_K for `output`, F32 for norms and biases, and Q6_K for
//! `attn_v` and `ffn_down` on the layers where [`q4_k_m_more_bits`] holds.
//!
//! Muse Glimmer files are in llama.cpp 11434's `muse-glimmer` layout (the
//! tensors and keys its loader reads, docs/muse-glimmer-llamacpp.md §1), so
//! llama.cpp loads them too; with a tokenizer copied in (`hearth synth
//! --tokenizer-from`, by default a packaged model's) they take text prompts.

use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::mpsc::sync_channel;

use hearth_gguf::{GgmlType, GgufError, GgufWriter, Value};
use hearth_kernels::QuantError;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::arch::names::{self, Blk};
use crate::config::Architecture;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot synthesize {0}: supported architectures are muse-glimmer and qwen2")]
    UnsupportedArchitecture(&'static str),
    #[error("invalid synthetic shape: {0}")]
    Shape(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("thread pool: {0}")]
    Threads(String),
}

/// K-quant super-block: every matmul input dimension must be a multiple of it.
pub const QK_K: usize = 256;

/// The dimensions of a synthetic model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthShape {
    pub arch: Architecture,
    pub n_layers: usize,
    /// Residual stream width (D).
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// qwen2: always dim / n_heads.
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    /// muse-glimmer, gemma3: sliding window of the sliding layers; unused for qwen2.
    pub window: usize,
}

/// Names accepted by [`SynthShape::preset`].
pub const PRESETS: [&str; 2] = ["muse-glimmer-30b", "qwen2.5-32b"];

impl SynthShape {
    /// A small model that loads and runs in milliseconds (tests, smoke runs).
    pub fn small(arch: Architecture) -> SynthShape {
        SynthShape {
            arch,
            n_layers: 8,
            dim: 256,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            ffn_dim: 512,
            vocab_size: 512,
            window: 16,
        }
    }

    /// Muse Glimmer 30B as in spec §1 (~17 GB at Q4_K_M).
    pub fn muse_glimmer_30b() -> SynthShape {
        SynthShape {
            arch: Architecture::MuseGlimmer,
            n_layers: 52,
            dim: 6656,
            n_heads: 32,
            n_kv_heads: 2,
            head_dim: 128,
            ffn_dim: 19968,
            vocab_size: 202048,
            window: 2048,
        }
    }

    /// The Qwen2.5-32B shape (~19 GB at Q4_K_M).
    pub fn qwen2_5_32b() -> SynthShape {
        SynthShape {
            arch: Architecture::Qwen2,
            n_layers: 64,
            dim: 5120,
            n_heads: 40,
            n_kv_heads: 8,
            head_dim: 128,
            ffn_dim: 27648,
            vocab_size: 152064,
            window: 0,
        }
    }

    pub fn preset(name: &str) -> Option<SynthShape> {
        match name {
            "muse-glimmer-30b" => Some(Self::muse_glimmer_30b()),
            "qwen2.5-32b" => Some(Self::qwen2_5_32b()),
            _ => None,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// (layers, dim, heads, kv heads, head dim, ffn, vocab), in
    /// [`crate::ModelConfig::dims`]'s order.
    pub fn dims(&self) -> [usize; 7] {
        [
            self.n_layers,
            self.dim,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.ffn_dim,
            self.vocab_size,
        ]
    }

    /// One line for progress output: `qwen2: 8 layers, dim 256, 4 heads / 2
    /// kv heads of 64, ffn 512, vocab 512` (and the window where it is used).
    pub fn summary(&self) -> String {
        let [layers, dim, heads, kv, hd, ffn, vocab] = self.dims();
        let window = match self.arch {
            Architecture::MuseGlimmer | Architecture::Gemma3 => format!(", window {}", self.window),
            _ => String::new(),
        };
        format!(
            "{}: {layers} layers, dim {dim}, {heads} heads / {kv} kv heads of {hd}, ffn {ffn}, vocab {vocab}{window}",
            self.arch.gguf_name()
        )
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// muse-glimmer: the q-norm gain that makes the attention scale
    /// `gain / sqrt(head_dim)` the released model's 0.3420629 (43.78 / 128).
    pub fn qk_scale_factor(&self) -> f32 {
        MUSE_ATTN_SCALE * (self.head_dim as f32).sqrt()
    }

    /// Checks the shape is one the loaders and the K-quant matmuls accept.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |m: String| Err(SynthError::Shape(m));
        if !matches!(
            self.arch,
            Architecture::MuseGlimmer | Architecture::Qwen2 | Architecture::Gemma3
        ) {
            return Err(SynthError::UnsupportedArchitecture(self.arch.gguf_name()));
        }
        let s = self;
        if s.dims().contains(&0) {
            return bad(format!("every dimension must be positive: {s:?}"));
        }
        if !s.n_heads.is_multiple_of(s.n_kv_heads) {
            return bad(format!(
                "heads ({}) must be a multiple of kv heads ({})",
                s.n_heads, s.n_kv_heads
            ));
        }
        if !s.head_dim.is_multiple_of(2) {
            return bad(format!("head dim ({}) must be even for RoPE", s.head_dim));
        }
        if s.arch == Architecture::Qwen2 && s.q_dim() != s.dim {
            return bad(format!(
                "qwen2: heads × head dim ({} × {}) must equal dim ({})",
                s.n_heads, s.head_dim, s.dim
            ));
        }
        if matches!(s.arch, Architecture::MuseGlimmer | Architecture::Gemma3) && s.window == 0 {
            return bad(format!(
                "{}: the sliding window must be positive",
                s.arch.gguf_name()
            ));
        }
        // K-quant rows are whole 256-value super-blocks, so every matmul's input
        // dimension (dim, q_dim for attn_output, ffn for ffn_down) must be too.
        for (what, k) in [
            ("dim", s.dim),
            ("heads × head dim", s.q_dim()),
            ("ffn", s.ffn_dim),
        ] {
            if k % QK_K != 0 {
                return bad(format!(
                    "{what} ({k}) must be a multiple of {QK_K} (K-quant blocks)"
                ));
            }
        }
        Ok(())
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)` (src/llama-quant.cpp): the
/// layers on which Q4_K_M stores `attn_v` and `ffn_down` as Q6_K. It picks the
/// first and last eighth of the layers and every third layer in between, with
/// C integer division, so for small models the same formula applies as is
/// (8 layers: {0, 3, 6, 7}; fewer than 8 layers: no leading eighth).
/// For 52 layers it gives 0–5, 8, 11, …, 44, 45–51 (26 layers, spec §4.5).
pub fn q4_k_m_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Approximately N(0, std²): a sum of four uniforms (Irwin–Hall), rescaled
    /// to unit variance. Integer arithmetic plus one multiply, so the values
    /// are bit-identical on every platform (no libm).
    Normal { std: f32 },
    /// Uniform in [lo, hi).
    Uniform { lo: f32, hi: f32 },
    /// All ones (muse-glimmer's k-norm gain, as its converter writes it).
    Ones,
    /// Every value the same (muse-glimmer's q-norm gain: `qk_scale_factor`).
    Const(f32),
}

/// One tensor of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    pub ty: GgmlType,
    /// ggml `ne` order: [cols] or [cols (in), rows (out)].
    pub shape: Vec<u64>,
    pub init: Init,
}

impl TensorPlan {
    pub fn cols(&self) -> usize {
        self.shape[0] as usize
    }

    pub fn rows(&self) -> usize {
        self.shape[1..].iter().product::<u64>() as usize
    }

    pub fn row_bytes(&self) -> usize {
        self.ty.bytes_for(self.shape[0]).expect("validated shape") as usize
    }

    pub fn n_bytes(&self) -> u64 {
        self.row_bytes() as u64 * self.rows() as u64
    }
}

/// Everything that will be written: metadata (in order) and tensors (in order).
#[derive(Clone, Debug)]
pub struct SynthPlan {
    pub shape: SynthShape,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorPlan>,
}

/// The released Muse Glimmer's attention scale (on unit-RMS q and k).
const MUSE_ATTN_SCALE: f32 = 0.342_062_9;
/// Its logit multiplier and final soft-cap.
const MUSE_LOGIT_SCALE: f32 = 0.196_116_14;
const MUSE_SOFTCAP: f32 = 20.0;

/// `general.file_type` of llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M.
pub const FILE_TYPE_Q4_K_M: u32 = 15;

impl SynthPlan {
    pub fn new(shape: &SynthShape) -> Result<SynthPlan, SynthError> {
        shape.validate()?;
        let s = shape;
        let (d, q, kv, f) = (
            s.dim as u64,
            s.q_dim() as u64,
            s.kv_dim() as u64,
            s.ffn_dim as u64,
        );
        let mut t = Vec::new();
        let mut push = |name: String, ty: GgmlType, shape: &[u64], init: Init| {
            t.push(TensorPlan {
                name,
                ty,
                shape: shape.to_vec(),
                init,
            })
        };
        // Linears: unit-variance rows scaled by 1/sqrt(fan_in), so each output
        // has about the variance of its inputs; norm gains near 1.
        let linear = |fan_in: u64| Init::Normal {
            std: 1.0 / (fan_in as f32).sqrt(),
        };
        let gain = Init::Uniform { lo: 0.8, hi: 1.2 };
        let bias = Init::Uniform { lo: -0.1, hi: 0.1 };
        use GgmlType::{F32, Q4_K, Q6_K};

        push(
            names::TOKEN_EMBD.into(),
            Q4_K,
            &[d, s.vocab_size as u64],
            Init::Normal { std: 1.0 },
        );
        for i in 0..s.n_layers {
            let more = if q4_k_m_more_bits(i, s.n_layers) {
                Q6_K
            } else {
                Q4_K
            };
            push(Blk::AttnNorm.of(i), F32, &[d], gain);
            let hd = s.head_dim as u64;
            match s.arch {
                Architecture::MuseGlimmer => {
                    push(Blk::AttnQ.of(i), Q4_K, &[d, q], linear(d));
                    push(Blk::AttnK.of(i), Q4_K, &[d, kv], linear(d));
                    push(Blk::AttnV.of(i), more, &[d, kv], linear(d));
                    push(Blk::AttnGate.of(i), Q4_K, &[d, q], linear(d));
                    push(Blk::AttnOutput.of(i), Q4_K, &[q, d], linear(q));
                    push(Blk::PostAttnNorm.of(i), F32, &[d], gain);
                }
                Architecture::Gemma3 => {
                    // llama.cpp's gemma3 tensors (src/models/gemma3.cpp): no
                    // biases, per-head q/k norms, sandwich norms.
                    push(Blk::AttnQ.of(i), Q4_K, &[d, q], linear(d));
                    push(Blk::AttnK.of(i), Q4_K, &[d, kv], linear(d));
                    push(Blk::AttnV.of(i), more, &[d, kv], linear(d));
                    push(Blk::AttnOutput.of(i), Q4_K, &[q, d], linear(q));
                    push(Blk::AttnQNorm.of(i), F32, &[hd], gain);
                    push(Blk::AttnKNorm.of(i), F32, &[hd], gain);
                    push(Blk::PostAttnNorm.of(i), F32, &[d], gain);
                }
                _ => {
                    push(Blk::AttnQ.of(i), Q4_K, &[d, q], linear(d));
                    push(Blk::AttnQBias.of(i), F32, &[q], bias);
                    push(Blk::AttnK.of(i), Q4_K, &[d, kv], linear(d));
                    push(Blk::AttnKBias.of(i), F32, &[kv], bias);
                    push(Blk::AttnV.of(i), more, &[d, kv], linear(d));
                    push(Blk::AttnVBias.of(i), F32, &[kv], bias);
                    push(Blk::AttnOutput.of(i), Q4_K, &[q, d], linear(q));
                }
            }
            push(Blk::FfnNorm.of(i), F32, &[d], gain);
            push(Blk::FfnGate.of(i), Q4_K, &[d, f], linear(d));
            push(Blk::FfnUp.of(i), Q4_K, &[d, f], linear(d));
            push(Blk::FfnDown.of(i), more, &[f, d], linear(f));
            if s.arch == Architecture::Gemma3 {
                push(Blk::PostFfnNorm.of(i), F32, &[d], gain);
            }
            if s.arch == Architecture::MuseGlimmer {
                push(Blk::PostFfnNorm.of(i), F32, &[d], gain);
                // The converter's gains (conversion/muse_glimmer.py:66-78):
                // qk_scale_factor on q, ones on k.
                push(
                    Blk::AttnQNorm.of(i),
                    F32,
                    &[hd],
                    Init::Const(s.qk_scale_factor()),
                );
                push(Blk::AttnKNorm.of(i), F32, &[hd], Init::Ones);
            }
        }
        push(names::OUTPUT_NORM.into(), F32, &[d], gain);
        // gemma3 ties its LM head to the embeddings (no output.weight).
        if s.arch != Architecture::Gemma3 {
            push(
                names::OUTPUT.into(),
                Q6_K,
                &[d, s.vocab_size as u64],
                linear(d),
            );
        }

        Ok(SynthPlan {
            shape: shape.clone(),
            metadata: metadata(s),
            tensors: t,
        })
    }

    /// Bytes of tensor data (excluding header and alignment padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(TensorPlan::n_bytes).sum()
    }

    pub fn n_parameters(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.shape.iter().product::<u64>())
            .sum()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorPlan> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The GGUF header: the plan's metadata plus `hearth.synth.seed`.
    pub fn gguf_writer(&self, seed: u64) -> Result<GgufWriter, SynthError> {
        let mut w = GgufWriter::new();
        for (k, v) in &self.metadata {
            w.set(k.clone(), v.clone());
        }
        w.set("hearth.synth.seed", Value::U64(seed));
        for t in &self.tensors {
            w.add_tensor(t.name.clone(), t.ty, &t.shape)?;
        }
        Ok(w)
    }
}

/// Metadata that lets hearth, llama.cpp and `gguf` tooling read the file.
/// Integers are u32 and floats f32 because llama.cpp checks key types.
fn metadata(s: &SynthShape) -> Vec<(String, Value)> {
    let a = s.arch.gguf_name();
    let u = |v: usize| Value::U32(v as u32);
    let mut m: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!(
                "synthetic {a} {}L d{} (random weights)",
                s.n_layers, s.dim
            )),
        ),
        ("general.file_type".into(), Value::U32(FILE_TYPE_Q4_K_M)),
        ("general.quantization_version".into(), Value::U32(2)),
    ];
    let (ctx, theta, eps) = match s.arch {
        Architecture::MuseGlimmer => (131072, 500000.0, 1e-5),
        _ => (32768, 1e6, 1e-6),
    };
    let mut k = |key: &str, v: Value| m.push((format!("{a}.{key}"), v));
    k("block_count", u(s.n_layers));
    k("context_length", u(ctx));
    k("embedding_length", u(s.dim));
    k("feed_forward_length", u(s.ffn_dim));
    k("attention.head_count", u(s.n_heads));
    k("attention.head_count_kv", u(s.n_kv_heads));
    k("rope.freq_base", Value::F32(theta));
    k("attention.layer_norm_rms_epsilon", Value::F32(eps));
    k("vocab_size", u(s.vocab_size));
    if s.arch == Architecture::Gemma3 {
        // llama.cpp's gemma3 keys: head size and window (its sliding pattern,
        // five sliding layers then a global one, is fixed).
        k("attention.key_length", u(s.head_dim));
        k("attention.value_length", u(s.head_dim));
        k("attention.sliding_window", u(s.window));
    }
    if s.arch == Architecture::MuseGlimmer {
        // llama.cpp's muse-glimmer keys (muse-glimmer.cpp:3-13): the sliding
        // layers follow the default pattern (period 4: three sliding, one full).
        k("attention.key_length", u(s.head_dim));
        k("attention.value_length", u(s.head_dim));
        k("attention.sliding_window", u(s.window));
        k("rope.freq_base_swa", Value::F32(theta));
        k("logit_scale", Value::F32(MUSE_LOGIT_SCALE));
        k("final_logit_softcapping", Value::F32(MUSE_SOFTCAP));
    }
    // No vocabulary: llama.cpp then makes `{arch}.vocab_size` dummy tokens.
    m.push((
        "tokenizer.ggml.model".into(),
        Value::String("no_vocab".into()),
    ));
    m
}

/// ChaCha8 key of a tensor: four SplitMix64 outputs from the seed mixed with
/// the FNV-1a hash of the tensor name.
fn tensor_key(seed: u64, name: &str) -> [u8; 32] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut s = seed;
    let mut state = splitmix64(&mut s) ^ h;
    let mut key = [0u8; 32];
    for chunk in key.chunks_exact_mut(8) {
        chunk.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    key
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Sum of the four 16-bit lanes of `x`, as (U1+U2+U3+U4 − 2)·√3 with
/// U = (lane + ½)/65536: mean 0, variance 1, range ±√12.
fn irwin_hall4(x: u64) -> f32 {
    const SCALE: f32 = 1.732_050_8 / 65536.0;
    let s = (x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48);
    (s as f32 - 131070.0) * SCALE
}

impl Init {
    /// Values of row `row` of the tensor keyed `key`.
    fn fill(self, key: &[u8; 32], row: u64, out: &mut [f32]) {
        let mut rng = ChaCha8Rng::from_seed(*key);
        rng.set_stream(row);
        match self {
            Init::Ones => out.fill(1.0),
            Init::Const(v) => out.fill(v),
            Init::Uniform { lo, hi } => {
                for v in out {
                    let u = (rng.next_u32() >> 8) as f32 * (1.0 / 16_777_216.0);
                    *v = lo + (hi - lo) * u;
                }
            }
            Init::Normal { std } => {
                for v in out {
                    *v = std * irwin_hall4(rng.next_u64());
                }
            }
        }
    }
}

/// Generates rows `rows` of `t` and encodes them into `out`
/// (`rows.len() × t.row_bytes()` bytes), one rayon task per row.
pub fn fill_rows(
    t: &TensorPlan,
    seed: u64,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<(), SynthError> {
    let rb = t.row_bytes();
    if rows.end > t.rows() || out.len() != rows.len() * rb {
        return Err(SynthError::Shape(format!(
            "{}: rows {rows:?} into {} bytes (tensor has {} rows of {rb} bytes)",
            t.name,
            out.len(),
            t.rows()
        )));
    }
    let key = tensor_key(seed, &t.name);
    let cols = t.cols();
    out.par_chunks_mut(rb).enumerate().try_for_each_init(
        || vec![0.0f32; cols],
        |vals, (i, dst)| {
            t.init.fill(&key, (rows.start + i) as u64, vals);
            hearth_kernels::quantize(t.ty, vals, dst)
        },
    )?;
    Ok(())
}

/// The whole encoded tensor (small tensors and tests; large ones go through
/// [`write_gguf`]).
pub fn tensor_bytes(t: &TensorPlan, seed: u64) -> Result<Vec<u8>, SynthError> {
    let mut out = vec![0u8; t.n_bytes() as usize];
    fill_rows(t, seed, 0..t.rows(), &mut out)?;
    Ok(out)
}

#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub seed: u64,
    /// Target encoded bytes per chunk (rounded to whole rows, at least one row).
    /// Bounds memory: about three chunks are alive at once.
    pub chunk_bytes: usize,
    /// Generation threads; `None` uses rayon's global pool.
    pub threads: Option<usize>,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            seed: 0,
            chunk_bytes: 8 << 20,
            threads: None,
        }
    }
}

/// Like [`fill_rows`], but row r is row (r mod `pool`) of the tensor.
pub fn fill_rows_pooled(
    t: &TensorPlan,
    seed: u64,
    rows: Range<usize>,
    pool: usize,
    out: &mut [u8],
) -> Result<(), SynthError> {
    let rb = t.row_bytes();
    let pool = pool.max(1);
    if rows.len() <= pool {
        for (done, r) in rows.clone().enumerate() {
            let src = r % pool;
            fill_rows(t, seed, src..src + 1, &mut out[done * rb..(done + 1) * rb])?;
        }
        return Ok(());
    }
    let mut distinct = vec![0u8; pool * rb];
    fill_rows(
        t,
        seed,
        0..pool.min(t.rows()),
        &mut distinct[..pool.min(t.rows()) * rb],
    )?;
    for (i, dst) in out.chunks_exact_mut(rb).enumerate() {
        let src = (rows.start + i) % pool;
        dst.copy_from_slice(&distinct[src * rb..(src + 1) * rb]);
    }
    Ok(())
}

/// Streams the plan's GGUF into `w`: chunks of rows are generated and
/// quantized in parallel while a writer thread writes the previous chunk.
/// `progress` receives the tensor-data bytes of each chunk as it is written
/// (they sum to [`SynthPlan::data_bytes`]).
pub fn write_gguf<W: Write + Send>(
    plan: &SynthPlan,
    opts: &SynthOptions,
    w: W,
    progress: impl FnMut(u64) + Send,
) -> Result<W, SynthError> {
    write_gguf_pooled(plan, opts, None, w, progress)
}

/// Writes the model of `plan`, seeded with `seed`, to a new file at `path`
/// (tests and tools; the CLI adds progress and an atomic rename).
pub fn write_gguf_file(plan: &SynthPlan, seed: u64, path: &Path) -> Result<(), SynthError> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let opts = SynthOptions {
        seed,
        ..Default::default()
    };
    write_gguf(plan, &opts, BufWriter::new(file), |_| {})?
        .flush()
        .map_err(io)?;
    Ok(())
}

/// [`write_gguf`], where `row_pool = Some(n)` makes row r of every tensor a
/// copy of row r mod n (n rows are generated and quantized per chunk, the
/// rest copied), which writes a full-size model at disk speed. For speed
/// benchmarks only: the bytes are real quantized random rows, but the model
/// is not the seeded one.
pub fn write_gguf_pooled<W: Write + Send>(
    plan: &SynthPlan,
    opts: &SynthOptions,
    row_pool: Option<usize>,
    w: W,
    mut progress: impl FnMut(u64) + Send,
) -> Result<W, SynthError> {
    let mut sink = plan.gguf_writer(opts.seed)?.begin(w)?;
    // Two chunks in flight: one being written, one queued; a third is generated.
    let (tx, rx) = sync_channel::<(usize, Vec<u8>)>(1);
    std::thread::scope(|s| {
        let writer = s.spawn(move || -> Result<W, SynthError> {
            for (ti, bytes) in rx {
                sink.write(&plan.tensors[ti].name, &bytes)?;
                progress(bytes.len() as u64);
            }
            Ok(sink.finish()?)
        });
        let generated = in_pool(opts.threads, || {
            for (ti, t) in plan.tensors.iter().enumerate() {
                let rows_per_chunk = (opts.chunk_bytes / t.row_bytes()).max(1);
                for start in (0..t.rows()).step_by(rows_per_chunk) {
                    let rows = start..(start + rows_per_chunk).min(t.rows());
                    let mut buf = vec![0u8; rows.len() * t.row_bytes()];
                    match row_pool {
                        Some(pool) => fill_rows_pooled(t, opts.seed, rows, pool, &mut buf)?,
                        None => fill_rows(t, opts.seed, rows, &mut buf)?,
                    }
                    if tx.send((ti, buf)).is_err() {
                        return Ok(()); // the writer failed; its error is reported below
                    }
                }
            }
            Ok(())
        });
        drop(tx);
        let written = writer.join().expect("synth writer thread panicked");
        generated.and(written)
    })
}

fn in_pool<T: Send>(
    threads: Option<usize>,
    f: impl FnOnce() -> Result<T, SynthError> + Send,
) -> Result<T, SynthError> {
    match threads {
        None => f(),
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| SynthError::Threads(e.to_string()))?
            .install(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irwin_hall_is_centered_with_unit_variance() {
        assert_eq!(irwin_hall4(0x7fff_8000_7fff_8000), 0.0);
        let mut rng = ChaCha8Rng::from_seed([7; 32]);
        let xs: Vec<f64> = (0..200_000)
            .map(|_| irwin_hall4(rng.next_u64()) as f64)
            .collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
    }

    /// Regression guard for the benchmark mode: pooled row r is exactly row
    /// r mod n of the seeded tensor, across chunk boundaries.
    #[test]
    fn pooled_rows_repeat_the_first_rows() {
        let plan = SynthPlan::new(&SynthShape::small(Architecture::Qwen2)).unwrap();
        let t = plan.tensors.iter().find(|t| t.rows() > 40).unwrap();
        let rb = t.row_bytes();
        let full = tensor_bytes(t, 3).unwrap();
        for (start, end) in [(0, 5), (5, 40), (37, t.rows())] {
            let mut out = vec![0u8; (end - start) * rb];
            fill_rows_pooled(t, 3, start..end, 7, &mut out).unwrap();
            for (i, row) in out.chunks_exact(rb).enumerate() {
                let src = (start + i) % 7;
                assert_eq!(row, &full[src * rb..(src + 1) * rb], "row {}", start + i);
            }
        }
    }

    #[test]
    fn keys_differ_by_seed_and_name() {
        let a = tensor_key(0, "blk.0.attn_q.weight");
        assert_ne!(a, tensor_key(1, "blk.0.attn_q.weight"));
        assert_ne!(a, tensor_key(0, "blk.0.attn_k.weight"));
        assert_eq!(a, tensor_key(0, "blk.0.attn_q.weight"));
    }
}
