//! One description of each architecture, read by every backend (the CPU
//! forward in `layer.rs`, the GPU one in hearth-cuda) and by the loader:
//! what the embedding does, what each decoder layer computes, how logits are
//! made, and the GGUF tensor names. Derived once from the [`ModelConfig`];
//! differences between architectures live here as data, nowhere else.

use crate::config::{Architecture, LayerKind, ModelConfig, RopeLayout};

/// RoPE of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub layout: RopeLayout,
    /// ggml's frequencies (θ_{i+1} = θ_i · base^(-2/n), rotation with fused
    /// multiply-adds) rather than the direct 1/base^(2i/n).
    pub ggml_frequencies: bool,
}

/// Per-head RMSNorm of q and k before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// With learned gains (`attn_q_norm`, `attn_k_norm`; gemma3, Muse
    /// Glimmer, whose converter stores `qk_scale_factor` in the q gain).
    Gains,
}

/// The gated MLP's activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation, through an f16 table as ggml evaluates it (GeGLU).
    GeluF16,
}

/// What one decoder layer computes:
///
/// ```text
/// h = norm(x);  q, k, v (, gate) = W h (+ b)
/// q, k = qk_norm(q, k);  q, k = rope(q, k)
/// a = attention(q, k, v) over `kind`'s span  [· sigmoid(gate)]
/// x += post_norm(Wo a)
/// x += post_norm(W_down · act(W_gate norm(x)) ⊙ W_up norm(x))
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    /// Global (flat cache) or sliding window (ring cache).
    pub kind: LayerKind,
    /// `None`: no positional encoding in this layer (NoPE).
    pub rope: Option<RopeSpec>,
    pub qk_norm: QkNorm,
    /// Multiplier on q·k.
    pub attn_scale: f32,
    /// Apply `attn_scale` to q before attention (gemma3's graph) instead of
    /// inside the softmax; the two round differently.
    pub scale_q_first: bool,
    /// The attention output is gated by sigmoid(W_gate h) (Muse Glimmer).
    pub output_gate: bool,
    /// RMSNorm (learned gain, this epsilon) on the attention and MLP outputs
    /// before each residual add: sandwich norms (gemma3, Muse Glimmer).
    pub post_norm_eps: Option<f32>,
    pub ffn_act: FfnAct,
}

/// How token embeddings enter the first layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbedSpec {
    /// Multiplier on the looked-up rows (gemma3: sqrt(dim)).
    pub scale: Option<f32>,
    /// A gainless RMSNorm of the looked-up rows (Muse Glimmer §3.2).
    pub rms_norm: bool,
}

/// What happens to the LM head's output (llama.cpp muse-glimmer.cpp:185-193):
/// `z · scale`, then the soft-cap `c · tanh(z / c)` as three f32 steps
/// (`· (1/c)`, `tanh`, `· c`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitSpec {
    pub scale: Option<f32>,
    pub softcap: Option<f32>,
}

impl LogitSpec {
    pub fn apply(self, z: f32) -> f32 {
        let mut z = z;
        if let Some(s) = self.scale {
            z *= s;
        }
        if let Some(c) = self.softcap {
            z = (z * (1.0 / c)).tanh() * c;
        }
        z
    }

    pub fn is_identity(self) -> bool {
        self.scale.is_none() && self.softcap.is_none()
    }
}

/// The whole model's computation as data.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchSpec {
    pub embed: EmbedSpec,
    pub layers: Vec<LayerSpec>,
    pub logits: LogitSpec,
}

/// Muse Glimmer's post-attention and post-MLP norm epsilon, fixed in
/// llama.cpp's graph (muse-glimmer.cpp:63), not the metadata epsilon.
const MUSE_POST_NORM_EPS: f32 = 1e-8;

impl ArchSpec {
    pub fn of(c: &ModelConfig) -> ArchSpec {
        let arch = c.arch;
        let layers = c
            .layers
            .iter()
            .map(|&kind| {
                // Sliding layers have their own base where an architecture
                // says so (gemma3: 10000; muse-glimmer: rope.freq_base_swa).
                let theta = match kind.is_sliding() {
                    true => c.rope_theta_sliding,
                    false => c.rope_theta,
                };
                let rope = RopeSpec {
                    theta,
                    layout: c.rope_layout,
                    ggml_frequencies: true,
                };
                let base = LayerSpec {
                    kind,
                    rope: kind.uses_rope().then_some(rope),
                    qk_norm: QkNorm::None,
                    attn_scale: c.attn_scale,
                    scale_q_first: false,
                    output_gate: false,
                    post_norm_eps: None,
                    ffn_act: FfnAct::Silu,
                };
                match arch {
                    Architecture::Llama | Architecture::Qwen2 => base,
                    Architecture::Gemma3 => LayerSpec {
                        qk_norm: QkNorm::Gains,
                        scale_q_first: true,
                        post_norm_eps: Some(c.norm_eps),
                        ffn_act: FfnAct::GeluF16,
                        ..base
                    },
                    Architecture::MuseGlimmer => LayerSpec {
                        qk_norm: QkNorm::Gains,
                        output_gate: true,
                        post_norm_eps: Some(MUSE_POST_NORM_EPS),
                        ..base
                    },
                }
            })
            .collect();
        ArchSpec {
            embed: EmbedSpec {
                scale: (arch == Architecture::Gemma3).then(|| (c.dim as f32).sqrt()),
                rms_norm: arch == Architecture::MuseGlimmer,
            },
            layers,
            logits: LogitSpec {
                scale: c.logit_scale,
                softcap: c.final_logit_softcap,
            },
        }
    }
}

/// GGUF tensor names (llama.cpp's), the one table the loader, the
/// synthesizer and the DFlash drafter name tensors from.
pub mod names {
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    pub const OUTPUT_NORM: &str = "output_norm.weight";
    pub const OUTPUT: &str = "output.weight";
    /// The LM head's per-tensor scale (llama.cpp creates it only for an
    /// NVFP4 `output.weight`).
    pub const OUTPUT_SCALE: &str = "output.scale";
    /// DFlash drafters: the projection of the tapped target hidden states
    /// and its norm (docs/spec/dflash.md §4).
    pub const DFLASH_FC: &str = "fc.weight";
    pub const DFLASH_HIDDEN_NORM: &str = "enc.output_norm.weight";

    /// A tensor of decoder layer i: `blk.{i}.{suffix}`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Blk {
        AttnNorm,
        AttnQ,
        AttnK,
        AttnV,
        /// Fused q, k and v rows (`[q_dim + 2·kv_dim, dim]`).
        AttnQkv,
        AttnOutput,
        AttnQBias,
        AttnKBias,
        AttnVBias,
        AttnQkvBias,
        AttnQNorm,
        AttnKNorm,
        /// Muse Glimmer's output gate projection.
        AttnGate,
        PostAttnNorm,
        FfnNorm,
        FfnGate,
        FfnUp,
        FfnDown,
        PostFfnNorm,
    }

    impl Blk {
        pub fn suffix(self) -> &'static str {
            match self {
                Blk::AttnNorm => "attn_norm.weight",
                Blk::AttnQ => "attn_q.weight",
                Blk::AttnK => "attn_k.weight",
                Blk::AttnV => "attn_v.weight",
                Blk::AttnQkv => "attn_qkv.weight",
                Blk::AttnOutput => "attn_output.weight",
                Blk::AttnQBias => "attn_q.bias",
                Blk::AttnKBias => "attn_k.bias",
                Blk::AttnVBias => "attn_v.bias",
                Blk::AttnQkvBias => "attn_qkv.bias",
                Blk::AttnQNorm => "attn_q_norm.weight",
                Blk::AttnKNorm => "attn_k_norm.weight",
                Blk::AttnGate => "attn_gate.weight",
                Blk::PostAttnNorm => "post_attention_norm.weight",
                Blk::FfnNorm => "ffn_norm.weight",
                Blk::FfnGate => "ffn_gate.weight",
                Blk::FfnUp => "ffn_up.weight",
                Blk::FfnDown => "ffn_down.weight",
                Blk::PostFfnNorm => "post_ffw_norm.weight",
            }
        }

        /// The tensor's name in layer `layer`.
        pub fn of(self, layer: usize) -> String {
            format!("blk.{layer}.{}", self.suffix())
        }

        /// The name of the per-tensor scale of this weight in layer `layer`
        /// (`blk.{i}.attn_q.scale`; llama.cpp's generic `*.scale` pass).
        pub fn scale_of(self, layer: usize) -> String {
            let stem = self.suffix().trim_end_matches(".weight");
            format!("blk.{layer}.{stem}.scale")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(arch: Architecture, layers: Vec<LayerKind>) -> ModelConfig {
        ModelConfig {
            arch,
            n_layers: layers.len(),
            dim: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn_dim: 128,
            vocab_size: 100,
            context_length: 4096,
            norm_eps: 1e-6,
            rope_theta: 1e6,
            rope_theta_sliding: 1e4,
            rope_layout: RopeLayout::Neox,
            attn_scale: 0.25,
            layers,
            logit_scale: None,
            final_logit_softcap: None,
            defaults_used: vec![],
        }
    }

    /// The descriptions say what llama.cpp's graphs compute per layer.
    #[test]
    fn layer_descriptions_follow_the_architectures() {
        let g = |rope: bool| LayerKind::Global { rope };
        let s = LayerKind::Sliding {
            window: 8,
            rope: true,
        };
        let qwen = ArchSpec::of(&config(Architecture::Qwen2, vec![g(true); 2]));
        assert!(qwen.layers.iter().all(|l| l.qk_norm == QkNorm::None
            && l.post_norm_eps.is_none()
            && l.rope.unwrap().theta == 1e6));
        assert_eq!(qwen.embed.scale, None);
        assert!(qwen.logits.is_identity());

        let gemma = ArchSpec::of(&config(Architecture::Gemma3, vec![s, g(true)]));
        assert_eq!(
            gemma.layers[0].rope.unwrap().theta,
            1e4,
            "local layers: base 10000"
        );
        assert_eq!(gemma.layers[1].rope.unwrap().theta, 1e6);
        assert!(gemma.layers.iter().all(|l| l.scale_q_first
            && l.qk_norm == QkNorm::Gains
            && l.ffn_act == FfnAct::GeluF16));
        assert_eq!(gemma.embed.scale, Some(8.0));

        // muse-glimmer.cpp: RoPE (base freq_base_swa) on sliding layers only,
        // gained QK norms, sigmoid output gate, post norms with eps 1e-8.
        let mut c = config(Architecture::MuseGlimmer, vec![s, s, s, g(false)]);
        c.logit_scale = Some(0.5);
        c.final_logit_softcap = Some(30.0);
        let muse = ArchSpec::of(&c);
        for (i, l) in muse.layers.iter().enumerate() {
            assert_eq!(l.rope.is_some(), l.kind.is_sliding(), "layer {i}: iRoPE");
            assert!(l.output_gate && l.qk_norm == QkNorm::Gains);
            assert_eq!(l.post_norm_eps, Some(1e-8));
        }
        assert_eq!(muse.layers[0].rope.unwrap().theta, 1e4);
        assert!(muse.embed.rms_norm);
        assert_eq!(
            muse.logits,
            LogitSpec {
                scale: Some(0.5),
                softcap: Some(30.0)
            }
        );
    }

    /// The soft-cap keeps |z| below c and is close to the identity near 0.
    #[test]
    fn logit_soft_cap() {
        let l = LogitSpec {
            scale: Some(0.5),
            softcap: Some(20.0),
        };
        assert_eq!(l.apply(0.0), 0.0);
        assert!((l.apply(0.2) - 0.1).abs() < 1e-6);
        assert!((l.apply(2000.0) - 20.0).abs() < 1e-5);
        assert!((l.apply(-80.0) - (-20.0 * 2f32.tanh())).abs() < 1e-5);
    }
}
