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
    /// multiply-adds) rather than the direct 1/base^(2i/n) of the Muse
    /// Glimmer spec.
    pub ggml_frequencies: bool,
}

/// Per-head RMSNorm of q and k before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// With learned gains (`attn_q_norm`, `attn_k_norm`; gemma3).
    Gains,
    /// Without gains (the Muse Glimmer spec's scaleless QK-norm, §4.3).
    Scaleless,
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

/// Final logit soft-cap: `cap · tanh(z · multiplier / cap)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftCap {
    pub multiplier: f32,
    pub cap: f32,
}

impl SoftCap {
    pub fn apply(self, z: f32) -> f32 {
        self.cap * (z * self.multiplier / self.cap).tanh()
    }
}

/// The whole model's computation as data.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchSpec {
    pub embed: EmbedSpec,
    pub layers: Vec<LayerSpec>,
    pub softcap: Option<SoftCap>,
    /// The Muse Glimmer spec's reference numerics round activations to bf16
    /// at its rounding points (§3.7) and keep a bf16 KV cache; everything
    /// else follows llama.cpp's f32 activations and f16 cache.
    pub bf16_activations: bool,
}

/// Muse Glimmer's post-attention and post-MLP norm epsilon (spec §1).
const MUSE_POST_NORM_EPS: f32 = 1e-8;
/// Muse Glimmer's output head (spec §3.6): logit = 20 · tanh(z · 0.19611613513 / 20).
const MUSE_SOFTCAP: SoftCap = SoftCap {
    multiplier: 0.196_116_14,
    cap: 20.0,
};

impl ArchSpec {
    pub fn of(c: &ModelConfig) -> ArchSpec {
        let arch = c.arch;
        let layers = c
            .layers
            .iter()
            .map(|&kind| {
                let rope = |theta: f32, ggml_frequencies: bool| RopeSpec {
                    theta,
                    layout: c.rope_layout,
                    ggml_frequencies,
                };
                let base = LayerSpec {
                    kind,
                    rope: Some(rope(c.rope_theta, true)),
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
                        rope: Some(rope(
                            if kind.is_sliding() {
                                c.rope_theta_sliding
                            } else {
                                c.rope_theta
                            },
                            true,
                        )),
                        qk_norm: QkNorm::Gains,
                        scale_q_first: true,
                        post_norm_eps: Some(c.norm_eps),
                        ffn_act: FfnAct::GeluF16,
                        ..base
                    },
                    Architecture::MuseGlimmer => LayerSpec {
                        rope: kind.uses_rope().then(|| rope(c.rope_theta, false)),
                        qk_norm: QkNorm::Scaleless,
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
            softcap: (arch == Architecture::MuseGlimmer).then_some(MUSE_SOFTCAP),
            bf16_activations: arch == Architecture::MuseGlimmer,
        }
    }
}

/// GGUF tensor names (llama.cpp's), the one table the loader, the
/// synthesizer and the DFlash drafter name tensors from.
pub mod names {
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    pub const OUTPUT_NORM: &str = "output_norm.weight";
    pub const OUTPUT: &str = "output.weight";
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
        AttnOutput,
        AttnQBias,
        AttnKBias,
        AttnVBias,
        AttnQNorm,
        AttnKNorm,
        /// Muse Glimmer's output gate projection.
        AttnGate,
        /// The same, under the name of hearth's earlier synthetic files.
        AttnOutputGate,
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
                Blk::AttnOutput => "attn_output.weight",
                Blk::AttnQBias => "attn_q.bias",
                Blk::AttnKBias => "attn_k.bias",
                Blk::AttnVBias => "attn_v.bias",
                Blk::AttnQNorm => "attn_q_norm.weight",
                Blk::AttnKNorm => "attn_k_norm.weight",
                Blk::AttnGate => "attn_gate.weight",
                Blk::AttnOutputGate => "attn_output_gate.weight",
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::muse_glimmer_layers;

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
            defaults_used: vec![],
        }
    }

    /// The descriptions say what llama.cpp's graphs (and the Muse Glimmer
    /// spec) compute per layer.
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

        let muse = ArchSpec::of(&config(
            Architecture::MuseGlimmer,
            muse_glimmer_layers(8, 16),
        ));
        for (i, l) in muse.layers.iter().enumerate() {
            assert_eq!(l.rope.is_some(), l.kind.is_sliding(), "layer {i}: iRoPE");
            assert!(l.output_gate && l.qk_norm == QkNorm::Scaleless);
        }
        assert!(muse.embed.rms_norm && muse.softcap.is_some() && muse.bf16_activations);
    }

    /// Muse Glimmer spec §8.3 soft-cap table.
    #[test]
    fn muse_glimmer_soft_cap_table() {
        for (z, want) in [
            (0.0, 0.0),
            (1.0, 0.1961098),
            (10.0, 1.9548997),
            (50.0, 9.088_937),
            (100.0, 15.066_343),
            (-100.0, -15.066_343),
            (1000.0, 19.9999999),
        ] {
            let got = MUSE_SOFTCAP.apply(z);
            assert!((got - want).abs() < 2e-6, "{z}: {got}");
        }
    }
}
