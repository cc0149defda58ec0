//! A drafter's hyperparameters from its `dflash.*` metadata, with llama.cpp
//! 11434's defaults and required keys (src/models/dflash.cpp:7-105, the
//! driver common/speculative.cpp:1039-1056; docs/muse-glimmer-llamacpp.md
//! §2.1). What llama.cpp reads and hearth does not implement is refused by
//! name, never ignored.

use hearth_gguf::{GgufFile, Metadata, Value};

use super::DflashError;

/// The gated MLP's activation (`dflash.hidden_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    Silu,
    /// `gelu` / `gelu_pytorch_tanh` (the tanh approximation).
    Gelu,
}

/// DFlash2's convolutions and candidate selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dflash2Config {
    /// Taps of each grouped dynamic causal convolution (`conv_kernel_size`).
    pub conv_kernel: usize,
    /// Channels sharing one dynamic coefficient (`conv_group_size`).
    pub conv_group: usize,
    /// Width of the selector's token embeddings (`selector_rank`).
    pub selector_rank: usize,
    /// Candidates per block position (`selector_top_k`).
    pub top_k: usize,
}

/// Hyperparameters of a `dflash` GGUF.
#[derive(Clone, Debug, PartialEq)]
pub struct DflashConfig {
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    /// Trained block length (the driver's default 16 when the key is absent).
    pub block_size: usize,
    /// Target layers whose input hidden states are concatenated, in file
    /// order (llama.cpp keeps it; `n_taps · dim` features per token).
    pub target_layers: Vec<usize>,
    pub rope_theta: f32,
    pub eps: f32,
    /// The noise token filling the block after the anchor.
    pub mask_token: u32,
    /// Per layer: `Some(W)` for a sliding layer, `None` for a full one.
    pub windows: Vec<Option<usize>>,
    /// Multiplier on the looked-up token embeddings (`embedding_scale`).
    pub embedding_scale: Option<f32>,
    /// q·k multiplier (`attention.scale`, else 1/sqrt(head_dim)).
    pub attn_scale: f32,
    /// Multiplier on the attention output after W_o (`attention.value_scale`).
    pub value_scale: Option<f32>,
    pub act: FfnActivation,
    /// Causal attention inside the block (`attention.causal` = true); by
    /// default every block row sees every block row.
    pub causal: bool,
    /// DFlash2 only: `logit_scale` and the soft-cap on the draft logits.
    pub logit_scale: Option<f32>,
    pub softcap: Option<f32>,
    /// Set for a DFlash2 file (one with `selector_hidden.weight`).
    pub dflash2: Option<Dflash2Config>,
}

const A: &str = "dflash";

fn key(k: &str) -> String {
    format!("{A}.{k}")
}

fn int(md: &Metadata, k: &str) -> Result<Option<usize>, DflashError> {
    match md.get(&key(k)) {
        None => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
            DflashError::Invalid(format!("metadata '{}' is not an integer", key(k)))
        }),
    }
}

fn float(md: &Metadata, k: &str) -> Result<Option<f32>, DflashError> {
    match md.get(&key(k)) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| DflashError::Invalid(format!("metadata '{}' is not a number", key(k)))),
    }
}

fn required<T>(v: Option<T>, k: &str) -> Result<T, DflashError> {
    v.ok_or_else(|| DflashError::MissingKey(key(k)))
}

/// A key the driver reads as a string (`llama_model_meta_val_str`): a bool
/// key reads "true"/"false".
fn truthy(md: &Metadata, k: &str) -> bool {
    match md.get(&key(k)) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true",
        _ => false,
    }
}

impl DflashConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<DflashConfig, DflashError> {
        let md = file.metadata();
        let unsupported = |what: String| Err(DflashError::Unsupported(what));
        // Drafter variants llama.cpp runs and hearth does not.
        if int(md, "hyper_connection_count")?.unwrap_or(0) > 0 {
            return unsupported(
                "dflash.hyper_connection_count: DeepSeek-V4 DSpark drafters".into(),
            );
        }
        if file.tensor_info("markov_w1.weight").is_some() {
            return unsupported("tensor 'markov_w1.weight': DSpark Markov-head drafters".into());
        }
        if md.get(&key("rope.dimension_sections")).is_some() {
            return unsupported("dflash.rope.dimension_sections: M-RoPE drafters".into());
        }
        for k in ["rope.scaling.type"] {
            if let Some(t) = md.get_str(&key(k)) {
                if !matches!(t, "none" | "linear") {
                    return unsupported(format!("{} = '{t}'", key(k)));
                }
            }
        }
        if let Some(f) = float(md, "rope.scaling.factor")? {
            if f != 1.0 && f != 0.0 {
                return unsupported(format!("dflash.rope.scaling.factor = {f}"));
            }
        }

        let n_layers = required(int(md, "block_count")?, "block_count")?;
        let dim = required(int(md, "embedding_length")?, "embedding_length")?;
        let n_heads = required(int(md, "attention.head_count")?, "attention.head_count")?;
        if n_layers == 0 || dim == 0 || n_heads == 0 {
            return Err(DflashError::Invalid("zero layers, width or heads".into()));
        }
        let n_kv_heads = int(md, "attention.head_count_kv")?.unwrap_or(n_heads);
        let head_dim = int(md, "attention.key_length")?.unwrap_or(dim / n_heads);
        for k in ["attention.value_length", "rope.dimension_count"] {
            if let Some(v) = int(md, k)? {
                if v != head_dim {
                    return unsupported(format!(
                        "{} = {v} differs from the head size {head_dim}",
                        key(k)
                    ));
                }
            }
        }
        let ffn_dim = required(int(md, "feed_forward_length")?, "feed_forward_length")?;
        let eps = required(
            float(md, "attention.layer_norm_rms_epsilon")?,
            "attention.layer_norm_rms_epsilon",
        )?;
        let target_layers = match md.get_array(&key("target_layers")) {
            None => {
                return Err(DflashError::Invalid(
                    "DFlash model requires 'target_layers' in GGUF metadata".into(),
                ))
            }
            Some(a) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    DflashError::Invalid("dflash.target_layers is not an integer array".into())
                })?,
        };
        let window = int(md, "attention.sliding_window")?.unwrap_or(0);
        let windows = if window > 0 {
            let k = key("attention.sliding_window_pattern");
            let arr = md.get_array(&k).ok_or_else(|| {
                DflashError::Invalid(format!(
                    "array key not found in model: {k} (required with a sliding window)"
                ))
            })?;
            if arr.len() != n_layers {
                return Err(DflashError::Invalid(format!(
                    "{k} has {} entries for {n_layers} layers",
                    arr.len()
                )));
            }
            arr.iter()
                .map(|v| {
                    v.as_bool()
                        .or_else(|| v.as_u64().map(|x| x != 0))
                        .map(|s| s.then_some(window))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| DflashError::Invalid(format!("{k} is not a bool array")))?
        } else {
            vec![None; n_layers]
        };
        let act = match md.get_str(&key("hidden_activation")) {
            None | Some("silu") => FfnActivation::Silu,
            Some("gelu" | "gelu_pytorch_tanh") => FfnActivation::Gelu,
            Some(other) => {
                return Err(DflashError::Invalid(format!(
                    "unsupported DFlash hidden activation: {other}"
                )))
            }
        };
        let nonzero = |v: Option<f32>| v.filter(|&x| x != 0.0);
        let attn_scale =
            nonzero(float(md, "attention.scale")?).unwrap_or(1.0 / (head_dim as f32).sqrt());
        let dflash2 = match file.tensor_info("selector_hidden.weight") {
            None => None,
            Some(_) => {
                let get = |k| int(md, k).map(|v| v.unwrap_or(0));
                let c = Dflash2Config {
                    conv_kernel: get("conv_kernel_size")?,
                    conv_group: get("conv_group_size")?,
                    selector_rank: get("selector_rank")?,
                    top_k: get("selector_top_k")?,
                };
                if c.conv_kernel == 0
                    || c.conv_group == 0
                    || c.selector_rank == 0
                    || c.top_k == 0
                    || int(md, "block_size")?.unwrap_or(0) == 0
                {
                    return Err(DflashError::Invalid(
                        "DFlash2 model is missing conv/selector metadata".into(),
                    ));
                }
                if dim % c.conv_group != 0 {
                    return Err(DflashError::Invalid(
                        "DFlash2 hidden size must be divisible by conv_group_size".into(),
                    ));
                }
                if dim < c.top_k * (c.top_k + 1) {
                    return Err(DflashError::Invalid(
                        "DFlash2 hidden size is too small for the selector lattice".into(),
                    ));
                }
                Some(c)
            }
        };
        let mask_token = md
            .get_u64("tokenizer.ggml.mask_token_id")
            .ok_or_else(|| DflashError::MissingKey("tokenizer.ggml.mask_token_id".into()))?
            as u32;
        let c = DflashConfig {
            dim,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            block_size: int(md, "block_size")?.filter(|&b| b > 0).unwrap_or(16),
            target_layers,
            rope_theta: float(md, "rope.freq_base")?.unwrap_or(10000.0),
            eps,
            mask_token,
            windows,
            embedding_scale: nonzero(float(md, "embedding_scale")?),
            attn_scale,
            value_scale: nonzero(float(md, "attention.value_scale")?),
            act,
            causal: truthy(md, "attention.causal"),
            logit_scale: nonzero(float(md, "logit_scale")?),
            softcap: float(md, "final_logit_softcapping")?.filter(|&c| c > 0.0),
            dflash2,
        };
        if c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
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
        if c.target_layers.is_empty() {
            return Err(DflashError::Invalid("dflash.target_layers is empty".into()));
        }
        Ok(c)
    }

    /// W when every layer slides with window W, else 0: context rows older
    /// than W positions before a block can never be seen by it (block row t
    /// sees the W−1−t context positions before the block), so they need not
    /// be written.
    pub fn draft_sliding_window(&self) -> usize {
        match self.windows.first() {
            Some(&Some(w)) if self.windows.iter().all(|x| *x == Some(w)) => w,
            _ => 0,
        }
    }
}
