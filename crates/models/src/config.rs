//! Model hyperparameters read from GGUF metadata (`{arch}.*` keys), with the
//! per-architecture conventions, defaults and required keys of llama.cpp
//! 11434 (the reference build; docs/muse-glimmer-llamacpp.md §1.1 for
//! `muse-glimmer`).

use hearth_gguf::{GgufFile, Metadata};

use crate::forward::MAX_CHUNK;
use crate::kv_cache::KvTypes;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Gemma3,
    MuseGlimmer,
}

impl Architecture {
    pub fn from_gguf_name(name: &str) -> Option<Architecture> {
        Some(match name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "gemma3" => Architecture::Gemma3,
            "muse-glimmer" => Architecture::MuseGlimmer,
            _ => return None,
        })
    }

    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Gemma3 => "gemma3",
            Architecture::MuseGlimmer => "muse-glimmer",
        }
    }
}

/// How RoPE pairs dimensions within a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (x[2j], x[2j+1]): ggml "NORMAL" (llama, muse-glimmer).
    Interleaved,
    /// Halves (x[j], x[j + d/2]): ggml "NEOX" (qwen2, gemma3).
    Neox,
}

/// Attention span of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Attends to every earlier position; uses a flat KV cache.
    Global { rope: bool },
    /// Attends to the last `window` positions (self included); uses a ring cache.
    Sliding { window: usize, rope: bool },
}

impl LayerKind {
    pub fn is_sliding(self) -> bool {
        matches!(self, LayerKind::Sliding { .. })
    }

    pub fn uses_rope(self) -> bool {
        match self {
            LayerKind::Global { rope } | LayerKind::Sliding { rope, .. } => rope,
        }
    }

    /// KV cache slots this layer keeps in a state for `max_ctx` positions:
    /// every position for a global layer; the window plus `ring_slack` (at
    /// most the context) for a sliding one.
    pub fn kv_slots(self, max_ctx: usize, ring_slack: usize) -> usize {
        match self {
            LayerKind::Global { .. } => max_ctx,
            LayerKind::Sliding { window, .. } => window.saturating_add(ring_slack).min(max_ctx),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, gemma3, muse-glimmer)")]
    UnsupportedArchitecture(String),
    #[error("GGUF has no 'general.architecture'")]
    NoArchitecture,
    #[error("missing or invalid metadata key '{0}'")]
    MissingKey(String),
    #[error("{0}")]
    Invalid(String),
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub n_layers: usize,
    /// Residual stream width.
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub context_length: usize,
    pub norm_eps: f32,
    /// RoPE base for global (or all) layers.
    pub rope_theta: f32,
    /// RoPE base for sliding-window layers, where it differs (gemma3: 10000).
    pub rope_theta_sliding: f32,
    pub rope_layout: RopeLayout,
    /// Multiplier on q·k (replaces 1/sqrt(head_dim) where an architecture says so).
    pub attn_scale: f32,
    pub layers: Vec<LayerKind>,
    /// Multiplier on the output logits (`logit_scale`; Muse Glimmer).
    pub logit_scale: Option<f32>,
    /// Final logit soft-cap `c·tanh(z/c)` (`final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    /// Values taken from defaults because the GGUF did not carry them.
    pub defaults_used: Vec<&'static str>,
}

impl ModelConfig {
    /// (layers, dim, heads, kv heads, head dim, ffn, vocab).
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

    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ConfigError> {
        let arch_name = file.architecture().ok_or(ConfigError::NoArchitecture)?;
        let arch = Architecture::from_gguf_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArchitecture(arch_name.to_string()))?;
        let vocab_from_tensor = file
            .tensor_info("token_embd.weight")
            .map(|t| t.shape.get(1).copied().unwrap_or(0) as usize);
        Self::from_metadata(arch, file.metadata(), vocab_from_tensor)
    }

    fn from_metadata(
        arch: Architecture,
        md: &Metadata,
        vocab_from_tensor: Option<usize>,
    ) -> Result<ModelConfig, ConfigError> {
        let a = arch.gguf_name();
        let key = |k: &str| format!("{a}.{k}");
        let req = |k: &str| {
            md.get_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ConfigError::MissingKey(key(k)))
        };
        let n_layers = req("block_count")?;
        let dim = req("embedding_length")?;
        let n_heads = req("attention.head_count")?;
        if n_heads == 0 || n_layers == 0 || dim == 0 {
            return Err(ConfigError::Invalid(format!(
                "{a}: zero layers, heads or width"
            )));
        }
        let mut defaults_used = Vec::new();
        let n_kv_heads = md
            .get_u64(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or_else(|| {
                defaults_used.push("attention.head_count_kv = head_count");
                n_heads
            });
        let head_dim = md
            .get_u64(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(dim / n_heads);
        let ffn_dim = req("feed_forward_length")?;
        let vocab_size = md
            .get_u64(&key("vocab_size"))
            .map(|v| v as usize)
            .or_else(|| md.get_array("tokenizer.ggml.tokens").map(|t| t.len()))
            .or(vocab_from_tensor)
            .ok_or_else(|| ConfigError::MissingKey(key("vocab_size")))?;
        let muse = arch == Architecture::MuseGlimmer;
        // llama.cpp requires context_length for every architecture; hearth
        // has defaulted it for the others and keeps doing so.
        let context_length = match md.get_u64(&key("context_length")) {
            Some(v) => v as usize,
            None if muse => return Err(ConfigError::MissingKey(key("context_length"))),
            None => {
                defaults_used.push("context_length = 4096");
                4096
            }
        };
        let req_f = |k: &str| {
            md.get_f64(&key(k))
                .map(|v| v as f32)
                .ok_or_else(|| ConfigError::MissingKey(key(k)))
        };
        let norm_eps = match muse {
            true => req_f("attention.layer_norm_rms_epsilon")?,
            false => md
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
        };
        let rope_theta = md.get_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32;
        let window = md
            .get_u64(&key("attention.sliding_window"))
            .map(|v| v as usize);

        let (mut logit_scale, mut final_logit_softcap) = (None, None);
        let (rope_layout, rope_theta_sliding, layers) = match arch {
            Architecture::Llama => (
                RopeLayout::Interleaved,
                rope_theta,
                vec![LayerKind::Global { rope: true }; n_layers],
            ),
            Architecture::Qwen2 => (
                RopeLayout::Neox,
                rope_theta,
                vec![LayerKind::Global { rope: true }; n_layers],
            ),
            Architecture::Gemma3 => {
                // Gemma 3: five sliding-window layers, then one global layer (llama.cpp's swa pattern 6);
                // local layers use RoPE base 10000.
                let window = window.unwrap_or_else(|| {
                    defaults_used.push("attention.sliding_window = 512");
                    512
                });
                let layers = (0..n_layers)
                    .map(|i| {
                        if i % 6 < 5 {
                            LayerKind::Sliding { window, rope: true }
                        } else {
                            LayerKind::Global { rope: true }
                        }
                    })
                    .collect();
                (RopeLayout::Neox, 10000.0, layers)
            }
            Architecture::MuseGlimmer => {
                // llama.cpp muse-glimmer.cpp:3-13.
                let window = req("attention.sliding_window")?;
                if window == 0 {
                    return Err(ConfigError::Invalid(format!(
                        "{a}.attention.sliding_window must be positive"
                    )));
                }
                logit_scale = Some(req_f("logit_scale")?);
                // Absent: llama.cpp's default 30; 0 disables the cap.
                let cap = md
                    .get_f64(&key("final_logit_softcapping"))
                    .unwrap_or_else(|| {
                        defaults_used.push("final_logit_softcapping = 30");
                        30.0
                    }) as f32;
                final_logit_softcap = (cap != 0.0).then_some(cap);
                let theta_swa = md
                    .get_f64(&key("rope.freq_base_swa"))
                    .map_or(rope_theta, |v| v as f32);
                muse_glimmer_checks(md, a, head_dim)?;
                let sliding =
                    sliding_pattern(md, &key("attention.sliding_window_pattern"), n_layers, 4)?;
                // RoPE on the sliding layers only (NoPE on the full ones).
                let layers = sliding
                    .into_iter()
                    .map(|s| match s {
                        true => LayerKind::Sliding { window, rope: true },
                        false => LayerKind::Global { rope: false },
                    })
                    .collect();
                (RopeLayout::Interleaved, theta_swa, layers)
            }
        };
        Ok(ModelConfig {
            arch,
            n_layers,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
            norm_eps,
            rope_theta,
            rope_theta_sliding,
            rope_layout,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            layers,
            logit_scale,
            final_logit_softcap,
            defaults_used,
        })
    }

    /// Bytes of KV cache a state for `max_ctx` positions holds (what
    /// `State::with_ring_slack(model, max_ctx, ring_slack)` allocates), computed
    /// without allocating, so a size can be refused before it is attempted.
    /// Saturates at `u64::MAX` for sizes no machine has.
    pub fn kv_cache_bytes(&self, types: KvTypes, max_ctx: usize, ring_slack: usize) -> u64 {
        // K and V: [n_kv_heads, slots, head_dim] each.
        let per_slot = types.slot_bytes(self.n_kv_heads, self.head_dim) as u128;
        let total: u128 = self
            .layers
            .iter()
            .map(|l| l.kv_slots(max_ctx, ring_slack) as u128 * per_slot)
            .sum();
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    /// An upper bound on the CPU forward pass's transient buffers (f32) for
    /// one chunk of up to `MAX_CHUNK` tokens: the residual stream and its
    /// normed copy, Q/K/V, the attention output and its projection, the MLP's
    /// gate, up and down rows, and one row of logits. Attention scores are
    /// per query and grow with the tokens written, not with `max_ctx`.
    pub fn forward_scratch_bytes(&self, max_ctx: usize) -> u64 {
        let t = MAX_CHUNK.min(max_ctx.max(1)) as u64;
        let q_dim = (self.n_heads * self.head_dim) as u64;
        let kv_dim = (self.n_kv_heads * self.head_dim) as u64;
        let (dim, ffn) = (self.dim as u64, self.ffn_dim as u64);
        let per_token = 4 * dim + 2 * q_dim + 2 * kv_dim + 3 * ffn;
        4 * (t * per_token + self.vocab_size as u64)
    }

    pub fn n_sliding_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.is_sliding()).count()
    }

    /// Sliding window shared by the sliding layers, if any.
    pub fn sliding_window(&self) -> Option<usize> {
        self.layers.iter().find_map(|l| match l {
            LayerKind::Sliding { window, .. } => Some(*window),
            _ => None,
        })
    }
}

/// Which layers slide, from `key` (llama.cpp `load_swa_pattern`,
/// llama-model.cpp:3451 and llama-hparams.cpp:8): a per-layer bool (or
/// integer) array, or a period `n` (absent: `default_period`) under which
/// layer `il` slides iff `n == 0 || il % n < n - 1`, counted from the first
/// layer.
pub fn sliding_pattern(
    md: &Metadata,
    key: &str,
    n_layers: usize,
    default_period: usize,
) -> Result<Vec<bool>, ConfigError> {
    if let Some(arr) = md.get_array(key) {
        if arr.len() != n_layers {
            return Err(ConfigError::Invalid(format!(
                "{key} has {} entries for {n_layers} layers",
                arr.len()
            )));
        }
        return arr
            .iter()
            .map(|v| v.as_bool().or_else(|| v.as_u64().map(|x| x != 0)))
            .collect::<Option<Vec<bool>>>()
            .ok_or_else(|| ConfigError::Invalid(format!("{key} is not a bool or integer array")));
    }
    let n = match md.get(key) {
        None => default_period,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| ConfigError::Invalid(format!("{key} is not an integer or an array")))?
            as usize,
    };
    Ok((0..n_layers).map(|il| n == 0 || il % n < n - 1).collect())
}

/// Muse Glimmer files that llama.cpp would read differently from what
/// hearth computes are refused here, naming the key.
fn muse_glimmer_checks(md: &Metadata, a: &str, head_dim: usize) -> Result<(), ConfigError> {
    let key = |k: &str| format!("{a}.{k}");
    let unsupported = |k: String, why: String| Err(ConfigError::Invalid(format!("{k}: {why}")));
    for k in [
        "attention.value_length",
        "rope.dimension_count",
        "attention.key_length_swa",
        "attention.value_length_swa",
        "rope.dimension_count_swa",
    ] {
        if let Some(v) = md.get_u64(&key(k)) {
            if v as usize != head_dim {
                return unsupported(
                    key(k),
                    format!("{v} differs from the head size {head_dim} (hearth rotates and attends over whole heads)"),
                );
            }
        }
    }
    for k in [
        "attention.head_count",
        "attention.head_count_kv",
        "feed_forward_length",
    ] {
        if md.get_array(&key(k)).is_some() {
            return unsupported(key(k), "per-layer values are not supported".into());
        }
    }
    if let Some(t) = md.get_str(&key("rope.scaling.type")) {
        if !matches!(t, "none" | "linear") {
            // Linear scaling never reaches the sliding layers, the only ones
            // with RoPE (llama.cpp reads no freq_scale_swa for this arch).
            return unsupported(key("rope.scaling.type"), format!("'{t}' is not supported"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&str, hearth_gguf::Value)]) -> Metadata {
        let mut m = Metadata::new();
        for (k, v) in pairs {
            m.insert(*k, v.clone());
        }
        m
    }

    /// llama.cpp's default period-4 pattern counts from the first layer:
    /// 6 layers give S S S F S S, 8 give S S S F S S S F.
    #[test]
    fn sliding_pattern_follows_llama_cpp() {
        let k = "muse-glimmer.attention.sliding_window_pattern";
        let p = |m: &Metadata, n| sliding_pattern(m, k, n, 4).unwrap();
        let none = md(&[]);
        assert_eq!(p(&none, 6), [true, true, true, false, true, true]);
        assert_eq!(
            p(&none, 8),
            [true, true, true, false, true, true, true, false]
        );
        let period2 = md(&[(k, hearth_gguf::Value::U32(2))]);
        assert_eq!(p(&period2, 4), [true, false, true, false]);
        let zero = md(&[(k, hearth_gguf::Value::U32(0))]);
        assert_eq!(p(&zero, 3), [true, true, true]);
        use hearth_gguf::Value::Bool;
        let arr = md(&[(
            k,
            hearth_gguf::Value::Array(hearth_gguf::ValueType::Bool, vec![Bool(false), Bool(true)]),
        )]);
        assert_eq!(p(&arr, 2), [false, true]);
        assert!(sliding_pattern(&arr, k, 3, 4).is_err(), "length must match");
    }
}
