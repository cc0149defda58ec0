//! Synthetic DFlash and DFlash2 drafts (`hearth synth --arch dflash|dflash2
//! --target FILE`): `dflash` GGUFs in llama.cpp 11434's layout (the keys
//! and tensors its loader reads, docs/muse-glimmer-llamacpp.md §2.1-2.2),
//! seeded random weights, matched to a target's width, depth and vocabulary,
//! with the target's tokenizer copied in (llama.cpp's draft context reads its
//! own vocabulary and mask token). Written through the same streaming writer
//! as [`crate::synth`].

use hearth_gguf::{GgmlType, GgufFile, Value, ValueType};

use crate::arch::names::{self, Blk};
use crate::config::ModelConfig;
use crate::synth::{Init, SynthError, SynthPlan, SynthShape, TensorPlan, QK_K};

/// DFlash2's convolutions and selector.
#[derive(Clone, Debug, PartialEq)]
pub struct Dflash2Shape {
    pub conv_kernel: usize,
    pub conv_group: usize,
    pub selector_rank: usize,
    pub top_k: usize,
    /// Logit scale and soft-cap of the draft logits (the selector's unary terms).
    pub logit_scale: f32,
    pub softcap: f32,
}

impl Default for Dflash2Shape {
    fn default() -> Self {
        Dflash2Shape {
            conv_kernel: 3,
            conv_group: 32,
            selector_rank: 16,
            top_k: 4,
            logit_scale: 0.2,
            softcap: 20.0,
        }
    }
}

/// The draft's own dimensions; the width comes from the target.
#[derive(Clone, Debug, PartialEq)]
pub struct DflashShape {
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub block_size: usize,
    /// Tapped target layers (inputs of these target layers), in the order
    /// their hidden states are concatenated.
    pub target_layers: Vec<usize>,
    pub mask_token: u32,
    /// Every layer sliding with this window; `None`: all full.
    pub window: Option<usize>,
    /// Post-attention and post-MLP norms.
    pub post_norms: bool,
    /// A DFlash2 draft.
    pub dflash2: Option<Dflash2Shape>,
    /// `tokenizer.*` keys (and `{arch}.vocab_size`, as `dflash.vocab_size`)
    /// copied from the target ([`target_tokenizer`]).
    pub tokenizer: Vec<(String, Value)>,
}

impl DflashShape {
    /// Defaults for a target: 2 layers with the target's head layout and FFN
    /// width, block 16, up to 5 taps spread evenly over layers 1..=L−2 (the
    /// paper's "layer 1 to L−3" stored +1, spec §3), the last vocabulary id
    /// as MASK, no tokenizer (see [`target_tokenizer`]).
    pub fn for_target(t: &ModelConfig) -> DflashShape {
        let n_taps = 5.min(t.n_layers.saturating_sub(2)).max(1);
        let (lo, hi) = (1.min(t.n_layers - 1), t.n_layers.saturating_sub(2).max(1));
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
            post_norms: false,
            dflash2: None,
            tokenizer: Vec::new(),
        }
    }
}

/// The target's `tokenizer.*` keys, and its `{arch}.vocab_size` renamed to
/// `dflash.vocab_size` (a `no_vocab` tokenizer needs it).
pub fn target_tokenizer(file: &GgufFile) -> Vec<(String, Value)> {
    let arch = file.architecture().unwrap_or("");
    let vocab_key = format!("{arch}.vocab_size");
    file.metadata()
        .iter()
        .filter_map(|(k, v)| {
            if k.starts_with("tokenizer.") && k != "tokenizer.ggml.mask_token_id" {
                Some((k.to_string(), v.clone()))
            } else if k == vocab_key {
                Some(("dflash.vocab_size".to_string(), v.clone()))
            } else {
                None
            }
        })
        .collect()
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
    if s.target_layers.is_empty() || s.target_layers.iter().any(|&l| l >= target.n_layers) {
        return bad(format!(
            "target layers {:?} must be within 0..{} (inputs of the target's layers)",
            s.target_layers, target.n_layers
        ));
    }
    if s.mask_token as usize >= target.vocab_size {
        return bad(format!(
            "mask token {} outside the target vocabulary {}",
            s.mask_token, target.vocab_size
        ));
    }
    if s.window == Some(0) {
        return bad("the sliding window must be positive".into());
    }
    let (d, q, kv, f, hd) = (
        target.dim as u64,
        (s.n_heads * s.head_dim) as u64,
        (s.n_kv_heads * s.head_dim) as u64,
        s.ffn_dim as u64,
        s.head_dim as u64,
    );
    if let Some(d2) = &s.dflash2 {
        if d2.conv_kernel == 0 || d2.conv_group == 0 || d2.selector_rank == 0 || d2.top_k == 0 {
            return bad(format!("DFlash2 sizes must be positive: {d2:?}"));
        }
        if !target.dim.is_multiple_of(d2.conv_group) {
            return bad(format!(
                "width {} is not a multiple of the conv group {}",
                target.dim, d2.conv_group
            ));
        }
        if target.dim < d2.top_k * (d2.top_k + 1) {
            return bad(format!(
                "width {} is too small for a top-{} selector lattice",
                target.dim, d2.top_k
            ));
        }
    }
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
        if let Some(d2) = &s.dflash2 {
            let proj = (2 * d2.conv_kernel * (target.dim / d2.conv_group)) as u64;
            mat(format!("blk.{i}.attn_conv_proj.weight"), d, proj);
            mat(format!("blk.{i}.ffn_conv_proj.weight"), d, proj);
        }
    }
    let mut vec = |name: String, shape: Vec<u64>, init: Init| {
        t.push(TensorPlan {
            name,
            ty: GgmlType::F32,
            shape,
            init,
        })
    };
    vec(names::DFLASH_HIDDEN_NORM.into(), vec![d], gain);
    vec(names::OUTPUT_NORM.into(), vec![d], gain);
    for i in 0..s.n_layers {
        vec(Blk::AttnNorm.of(i), vec![d], gain);
        vec(Blk::AttnQNorm.of(i), vec![hd], gain);
        vec(Blk::AttnKNorm.of(i), vec![hd], gain);
        vec(Blk::FfnNorm.of(i), vec![d], gain);
        if s.post_norms {
            vec(Blk::PostAttnNorm.of(i), vec![d], gain);
            vec(Blk::PostFfnNorm.of(i), vec![d], gain);
        }
        if let Some(d2) = &s.dflash2 {
            let base = Init::Normal { std: 0.3 };
            let shape = vec![d, d2.conv_kernel as u64, 2];
            vec(format!("blk.{i}.attn_conv_base"), shape.clone(), base);
            vec(format!("blk.{i}.ffn_conv_base"), shape, base);
        }
    }
    if let Some(d2) = &s.dflash2 {
        let (r, v) = (d2.selector_rank as u64, target.vocab_size as u64);
        vec(
            "selector_predecessor.weight".into(),
            vec![r, v],
            Init::Normal { std: 1.0 },
        );
        vec(
            "selector_successor.weight".into(),
            vec![r, v],
            Init::Normal { std: 1.0 },
        );
        vec("selector_hidden.weight".into(), vec![d, r], linear(d));
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
                "synthetic {} {}L d{} (random weights)",
                if s.dflash2.is_some() {
                    "dflash2"
                } else {
                    "dflash"
                },
                s.n_layers,
                d
            )),
        ),
        ("dflash.context_length".into(), u(target.context_length)),
        ("dflash.embedding_length".into(), u(target.dim)),
        ("dflash.block_count".into(), u(s.n_layers)),
        ("dflash.feed_forward_length".into(), u(s.ffn_dim)),
        ("dflash.attention.head_count".into(), u(s.n_heads)),
        ("dflash.attention.head_count_kv".into(), u(s.n_kv_heads)),
        ("dflash.attention.key_length".into(), u(s.head_dim)),
        ("dflash.attention.value_length".into(), u(s.head_dim)),
        (
            "dflash.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-6),
        ),
        ("dflash.block_size".into(), u(s.block_size)),
        (
            // The converter writes python ints: an i32 array.
            "dflash.target_layers".into(),
            Value::Array(
                ValueType::I32,
                s.target_layers
                    .iter()
                    .map(|&l| Value::I32(l as i32))
                    .collect(),
            ),
        ),
    ];
    if let Some(w) = s.window {
        m.push(("dflash.attention.sliding_window".into(), u(w)));
        m.push((
            "dflash.attention.sliding_window_pattern".into(),
            Value::Array(ValueType::Bool, vec![Value::Bool(true); s.n_layers]),
        ));
    }
    if let Some(d2) = &s.dflash2 {
        m.extend([
            ("dflash.conv_kernel_size".into(), u(d2.conv_kernel)),
            ("dflash.conv_group_size".into(), u(d2.conv_group)),
            ("dflash.selector_rank".into(), u(d2.selector_rank)),
            ("dflash.selector_top_k".into(), u(d2.top_k)),
            ("dflash.logit_scale".into(), Value::F32(d2.logit_scale)),
            (
                "dflash.final_logit_softcapping".into(),
                Value::F32(d2.softcap),
            ),
        ]);
    }
    m.extend(s.tokenizer.iter().cloned());
    m.push((
        "tokenizer.ggml.mask_token_id".into(),
        u(s.mask_token as usize),
    ));
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
