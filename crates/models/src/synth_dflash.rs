//! Synthetic DFlash drafts (`hearth synth --arch dflash --target FILE`): a
//! `dflash` GGUF with the tensors and metadata of docs/spec/dflash.md §2,
//! seeded random weights, matched to a target's width, depth and vocabulary.
//! Written through the same streaming writer as [`crate::synth`].

use hearth_gguf::{GgmlType, Value};

use crate::arch::names::{self, Blk};
use crate::config::ModelConfig;
use crate::synth::{Init, SynthError, SynthPlan, SynthShape, TensorPlan, QK_K};

/// The draft's own dimensions; the width comes from the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DflashShape {
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub block_size: usize,
    /// Tapped target layers (ascending).
    pub target_layers: Vec<usize>,
    pub mask_token: u32,
    /// Every layer sliding with this window; `None`: all global.
    pub window: Option<usize>,
}

impl DflashShape {
    /// Defaults for a target: 2 layers with the target's head layout and FFN
    /// width, block 16, up to 5 taps spread evenly over layers 2..=L−2 (the
    /// paper's "layer 1 to L−3" stored +1, spec §3), the last vocabulary id as
    /// MASK.
    pub fn for_target(t: &ModelConfig) -> DflashShape {
        let n_taps = 5.min(t.n_layers.saturating_sub(3)).max(1);
        let (lo, hi) = (
            2.min(t.n_layers),
            t.n_layers.saturating_sub(2).max(2.min(t.n_layers)),
        );
        let target_layers = if n_taps == 1 {
            vec![lo]
        } else {
            (0..n_taps)
                .map(|j| lo + (j * (hi - lo) + (n_taps - 1) / 2) / (n_taps - 1))
                .collect()
        };
        DflashShape {
            n_layers: 2,
            n_heads: t.n_heads,
            n_kv_heads: t.n_kv_heads,
            head_dim: t.head_dim,
            ffn_dim: t.ffn_dim,
            block_size: 16,
            target_layers,
            mask_token: (t.vocab_size - 1) as u32,
            window: None,
        }
    }
}

/// Q4_K where rows are whole super-blocks, else Q8_0 (32-value blocks), else F32.
fn weight_type(cols: usize) -> GgmlType {
    if cols.is_multiple_of(QK_K) {
        GgmlType::Q4_K
    } else if cols.is_multiple_of(32) {
        GgmlType::Q8_0
    } else {
        GgmlType::F32
    }
}

/// The plan of a draft for `target` (its config) with shape `s`.
pub fn dflash_plan(target: &ModelConfig, s: &DflashShape) -> Result<SynthPlan, SynthError> {
    let bad = |m: String| Err(SynthError::Shape(m));
    if s.n_layers == 0 || s.n_heads == 0 || s.n_kv_heads == 0 || s.head_dim == 0 || s.ffn_dim == 0 {
        return bad(format!("every draft dimension must be positive: {s:?}"));
    }
    if !s.n_heads.is_multiple_of(s.n_kv_heads) || !s.head_dim.is_multiple_of(2) {
        return bad(format!(
            "heads {} / kv heads {} / head dim {}: heads must share KV heads evenly, head dim even",
            s.n_heads, s.n_kv_heads, s.head_dim
        ));
    }
    if s.block_size < 2 {
        return bad(format!("block size {} must be at least 2", s.block_size));
    }
    if s.target_layers.is_empty()
        || s.target_layers.windows(2).any(|w| w[0] >= w[1])
        || s.target_layers.iter().any(|&l| l > target.n_layers)
    {
        return bad(format!(
            "target layers {:?} must be ascending within 0..={}",
            s.target_layers, target.n_layers
        ));
    }
    if s.mask_token as usize >= target.vocab_size {
        return bad(format!(
            "mask token {} outside the target vocabulary {}",
            s.mask_token, target.vocab_size
        ));
    }
    let (d, q, kv, f, hd) = (
        target.dim as u64,
        (s.n_heads * s.head_dim) as u64,
        (s.n_kv_heads * s.head_dim) as u64,
        s.ffn_dim as u64,
        s.head_dim as u64,
    );
    let n_t = s.target_layers.len() as u64;
    let linear = |fan_in: u64| Init::Normal {
        std: 1.0 / (fan_in as f32).sqrt(),
    };
    let gain = Init::Uniform { lo: 0.8, hi: 1.2 };
    let mut t = Vec::new();
    let mut mat = |name: String, cols: u64, rows: u64| {
        t.push(TensorPlan {
            name,
            ty: weight_type(cols as usize),
            shape: vec![cols, rows],
            init: linear(cols),
        })
    };
    mat(names::DFLASH_FC.into(), n_t * d, d);
    for i in 0..s.n_layers {
        mat(Blk::AttnQ.of(i), d, q);
        mat(Blk::AttnK.of(i), d, kv);
        mat(Blk::AttnV.of(i), d, kv);
        mat(Blk::AttnOutput.of(i), q, d);
        mat(Blk::FfnGate.of(i), d, f);
        mat(Blk::FfnUp.of(i), d, f);
        mat(Blk::FfnDown.of(i), f, d);
    }
    let mut vec = |name: String, len: u64| {
        t.push(TensorPlan {
            name,
            ty: GgmlType::F32,
            shape: vec![len],
            init: gain,
        })
    };
    vec(names::DFLASH_HIDDEN_NORM.into(), d);
    vec(names::OUTPUT_NORM.into(), d);
    for i in 0..s.n_layers {
        vec(Blk::AttnNorm.of(i), d);
        vec(Blk::AttnQNorm.of(i), hd);
        vec(Blk::AttnKNorm.of(i), hd);
        vec(Blk::FfnNorm.of(i), d);
    }

    let u = |v: usize| Value::U32(v as u32);
    let mut m: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String("dflash".into()),
        ),
        (
            "general.name".into(),
            Value::String(format!(
                "synthetic dflash {}L d{} (random weights)",
                s.n_layers, d
            )),
        ),
        ("dflash.embedding_length".into(), u(target.dim)),
        ("dflash.block_count".into(), u(s.n_layers)),
        ("dflash.attention.head_count".into(), u(s.n_heads)),
        ("dflash.attention.head_count_kv".into(), u(s.n_kv_heads)),
        ("dflash.attention.key_length".into(), u(s.head_dim)),
        ("dflash.feed_forward_length".into(), u(s.ffn_dim)),
        ("dflash.block_size".into(), u(s.block_size)),
        (
            "dflash.target_layers".into(),
            Value::Array(
                hearth_gguf::ValueType::U32,
                s.target_layers.iter().map(|&l| u(l)).collect(),
            ),
        ),
        ("dflash.rope.freq_base".into(), Value::F32(500000.0)),
        (
            "dflash.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-5),
        ),
        ("dflash.context_length".into(), u(target.context_length)),
        (
            "tokenizer.ggml.mask_token_id".into(),
            u(s.mask_token as usize),
        ),
    ];
    if let Some(w) = s.window {
        m.push(("dflash.attention.sliding_window".into(), u(w)));
        m.push((
            "dflash.attention.sliding_window_pattern".into(),
            Value::Array(
                hearth_gguf::ValueType::Bool,
                vec![Value::Bool(true); s.n_layers],
            ),
        ));
    }
    // `shape` is descriptive only for a draft: the target's layout.
    let shape = SynthShape {
        arch: target.arch,
        n_layers: s.n_layers,
        dim: target.dim,
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        ffn_dim: s.ffn_dim,
        vocab_size: target.vocab_size,
        window: s.window.unwrap_or(0),
    };
    Ok(SynthPlan {
        shape,
        metadata: m,
        tensors: t,
    })
}
