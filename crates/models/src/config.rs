//! Model hyperparameters read from GGUF metadata (`{arch}.*` keys), with the
//! per-architecture conventions llama.cpp applies, and the Muse Glimmer spec
//! defaults (its GGUFs carry few keys; docs/spec/muse-glimmer-model.md §1).

use hearth_gguf::{GgufFile, Metadata};

use crate::forward::MAX_CHUNK;
use crate::kv_cache::KvDtype;

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
            "muse_glimmer" => Architecture::MuseGlimmer,
            _ => return None,
        })
    }

    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Gemma3 => "gemma3",
            Architecture::MuseGlimmer => "muse_glimmer",
        }
    }
}

/// How RoPE pairs dimensions within a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (x[2j], x[2j+1]): ggml "NORMAL" (llama, muse_glimmer).
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
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, gemma3, muse_glimmer)")]
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
    /// Values taken from defaults because the GGUF did not carry them.
    pub defaults_used: Vec<&'static str>,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ConfigError> {
        let arch_name = file.architecture().ok_or(ConfigError::NoArchitecture)?;
        let arch = Architecture::from_gguf_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArchitecture(arch_name.to_string()))?;
        let vocab_from_tensor = file
            .tensor_info("token_embd.weight")
            .map(|t| t.shape.get(1).copied().unwrap_or(0) as usize);
        match arch {
            Architecture::MuseGlimmer => Ok(Self::muse_glimmer(file, vocab_from_tensor)),
            _ => Self::from_metadata(arch, file.metadata(), vocab_from_tensor),
        }
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
        let context_length = md
            .get_u64(&key("context_length"))
            .map(|v| v as usize)
            .unwrap_or_else(|| {
                defaults_used.push("context_length = 4096");
                4096
            });
        let norm_eps = md
            .get_f64(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5) as f32;
        let rope_theta = md.get_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32;
        let window = md
            .get_u64(&key("attention.sliding_window"))
            .map(|v| v as usize);

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
            Architecture::MuseGlimmer => unreachable!("handled by muse_glimmer()"),
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
            defaults_used,
        })
    }

    /// Muse Glimmer: the spec fixes the hyperparameters and reads none from
    /// metadata (§1). Shapes are taken from the tensors so that small synthetic
    /// models work; everything else is the spec's constant.
    fn muse_glimmer(file: &GgufFile, vocab_from_tensor: Option<usize>) -> ModelConfig {
        let md = file.metadata();
        let mut defaults_used = Vec::new();
        let shape = |name: &str, axis: usize| {
            file.tensor_info(name)
                .and_then(|t| t.shape.get(axis).copied())
                .map(|v| v as usize)
        };
        let n_layers = (0..)
            .take_while(|i| {
                file.tensor_info(&format!("blk.{i}.attn_norm.weight"))
                    .is_some()
            })
            .count();
        let n_layers = if n_layers == 0 { 52 } else { n_layers };
        let dim = shape("token_embd.weight", 0).unwrap_or(6656);
        let head_dim = md
            .get_u64("muse_glimmer.attention.key_length")
            .map(|v| v as usize)
            .unwrap_or_else(|| {
                defaults_used.push("head_dim = 128");
                128
            });
        let q_dim = shape("blk.0.attn_q.weight", 1).unwrap_or(4096);
        let kv_dim = shape("blk.0.attn_k.weight", 1).unwrap_or(256);
        let ffn_dim = shape("blk.0.ffn_gate.weight", 1).unwrap_or(19968);
        let window = md
            .get_u64("muse_glimmer.attention.sliding_window")
            .map(|v| v as usize)
            .unwrap_or_else(|| {
                defaults_used.push("sliding_window = 2048");
                2048
            });
        defaults_used.extend([
            "norm_eps = 1e-5",
            "rope_theta = 500000",
            "attention pattern [W, W, W, global]",
            "attn_scale = 0.3420629053992187",
            "output soft-cap 20, multiplier 0.19611613513",
        ]);
        let layers = muse_glimmer_layers(n_layers, window);
        ModelConfig {
            arch: Architecture::MuseGlimmer,
            n_layers,
            dim,
            n_heads: q_dim / head_dim,
            n_kv_heads: kv_dim / head_dim,
            head_dim,
            ffn_dim,
            vocab_size: vocab_from_tensor.unwrap_or(202048),
            context_length: 131072,
            norm_eps: 1e-5,
            rope_theta: 500000.0,
            rope_theta_sliding: 500000.0,
            rope_layout: RopeLayout::Interleaved,
            attn_scale: 0.342_062_9,
            layers,
            defaults_used,
        }
    }

    /// Bytes of KV cache a state for `max_ctx` positions holds (what
    /// `State::with_ring_slack(model, max_ctx, ring_slack)` allocates), computed
    /// without allocating, so a size can be refused before it is attempted.
    /// Saturates at `u64::MAX` for sizes no machine has.
    pub fn kv_cache_bytes(&self, dtype: KvDtype, max_ctx: usize, ring_slack: usize) -> u64 {
        // K and V: [n_kv_heads, slots, head_dim] each.
        let per_slot = 2 * (self.n_kv_heads * self.head_dim * dtype.bytes()) as u128;
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

/// Muse Glimmer's iRoPE schedule (spec §2): pattern [W, W, W, global] aligned
/// so the last layer is global; `window(i) = pattern[(i + 4 - n mod 4) mod 4]`,
/// and a layer uses RoPE exactly when it slides.
pub fn muse_glimmer_layers(n_layers: usize, window: usize) -> Vec<LayerKind> {
    let pattern = [window, window, window, 0];
    (0..n_layers)
        .map(|i| match pattern[(i + 4 - (n_layers % 4)) % 4] {
            0 => LayerKind::Global { rope: false },
            w => LayerKind::Sliding {
                window: w,
                rope: true,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §8.1: for 52 layers exactly 3, 7, ..., 51 are global and NoPE;
    /// the 8-layer toy has globals {3, 7}; use_rope(i) = ((n - i - 1) mod 4) != 0.
    #[test]
    fn muse_glimmer_layer_schedule_matches_spec() {
        for (n, globals) in [
            (52usize, (0..13).map(|k| 4 * k + 3).collect::<Vec<_>>()),
            (8, vec![3, 7]),
        ] {
            let layers = muse_glimmer_layers(n, 16);
            let got: Vec<usize> = (0..n).filter(|&i| !layers[i].is_sliding()).collect();
            assert_eq!(got, globals);
            for (i, l) in layers.iter().enumerate() {
                assert_eq!(l.uses_rope(), (n - i - 1) % 4 != 0, "layer {i}");
                assert_eq!(l.uses_rope(), l.is_sliding());
            }
        }
    }
}
