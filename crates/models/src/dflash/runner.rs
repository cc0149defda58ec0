//! Where a draft forward runs: [`DraftRunner`] is one session's draft
//! context cache and block pass on some device. [`CpuRunner`] is the CPU one
//! (forward.rs); the CUDA backend has its own (hearth-cuda's `dflash`), built
//! from the weights of [`DflashModel::plain`].

use std::sync::Arc;

use hearth_gguf::GgmlType;

use super::{DflashError, DflashModel, DflashState, Mat};
use crate::weights::Model;

/// One session's drafter state and forward on some device.
pub trait DraftRunner: Send {
    /// Writes the target's tapped rows `hidden` ([n_new, n_taps · dim]) as
    /// new context (C advances by n_new), then runs the block
    /// `[anchor, MASK, …]` at positions C.. and returns at most `n` draft
    /// tokens (rows 1..=n).
    fn draft(&mut self, hidden: &[f32], block: &[u32], n: usize) -> Result<Vec<u32>, DflashError>;
    /// Context positions written (C).
    fn ctx_len(&self) -> usize;
    /// Forgets the context from position `c` on (`c` <= C).
    fn truncate(&mut self, c: usize);
    /// Skips `n` context positions without writing them (rows an all-sliding
    /// draft never sees again).
    fn skip_context(&mut self, n: usize) -> Result<(), DflashError>;
}

/// The CPU draft forward.
pub struct CpuRunner {
    draft: Arc<DflashModel>,
    target: Arc<Model>,
    state: DflashState,
}

impl CpuRunner {
    /// A state for contexts up to `max_ctx` positions (the block's positions
    /// past it included by the caller).
    pub fn new(draft: Arc<DflashModel>, target: Arc<Model>, max_ctx: usize) -> CpuRunner {
        let state = draft.new_state(max_ctx);
        CpuRunner {
            draft,
            target,
            state,
        }
    }
}

impl DraftRunner for CpuRunner {
    fn draft(&mut self, hidden: &[f32], block: &[u32], n: usize) -> Result<Vec<u32>, DflashError> {
        // DFlash1 needs only the logits of rows 1..=n; DFlash2 its lattice.
        let rows = if self.draft.is_dflash2() {
            1..1
        } else {
            1..n + 1
        };
        let out = self
            .draft
            .forward(&self.target, &mut self.state, hidden, block, rows)?;
        Ok(self
            .draft
            .draft_tokens(&out, self.target.config.vocab_size, n))
    }

    fn ctx_len(&self) -> usize {
        self.state.ctx_len
    }

    fn truncate(&mut self, c: usize) {
        self.state.ctx_len = self.state.ctx_len.min(c);
    }

    fn skip_context(&mut self, n: usize) -> Result<(), DflashError> {
        self.draft.skip_context(&mut self.state, n)
    }
}

/// One weight matrix of a draft as the file stores it (ggml block layout).
#[derive(Clone, Copy, Debug)]
pub struct DraftMatrix<'a> {
    pub name: &'static str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// Per-tensor scale of the product.
    pub scale: Option<f32>,
}

/// One layer of a plain draft.
pub struct PlainLayer<'a> {
    pub attn_norm: &'a [f32],
    pub wq: DraftMatrix<'a>,
    pub wk: DraftMatrix<'a>,
    pub wv: DraftMatrix<'a>,
    pub wo: DraftMatrix<'a>,
    pub q_norm: &'a [f32],
    pub k_norm: &'a [f32],
    pub ffn_norm: &'a [f32],
    pub gate: DraftMatrix<'a>,
    pub up: DraftMatrix<'a>,
    pub down: DraftMatrix<'a>,
}

/// The weights of a plain DFlash1 draft (the layout the DFlash paper's
/// drafters and this project's trained ones use): target embeddings and LM
/// head, full non-causal attention with q/k norms and separate V, SwiGLU.
pub struct PlainDraft<'a> {
    pub fc: DraftMatrix<'a>,
    pub hidden_norm: &'a [f32],
    pub output_norm: &'a [f32],
    pub layers: Vec<PlainLayer<'a>>,
}

impl DflashModel {
    fn matrix(&self, name: &'static str, m: &Mat) -> DraftMatrix<'_> {
        DraftMatrix {
            name,
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data: &self.file.raw_bytes()[m.range.clone()],
            scale: m.scale,
        }
    }

    /// This draft's weights if it is a plain DFlash1 draft, else the first
    /// feature it uses that the plain layout lacks (what a backend with only
    /// the plain draft forward cannot run).
    pub fn plain(&self) -> Result<PlainDraft<'_>, String> {
        let c = &self.config;
        let features = [
            (self.selector.is_some(), "DFlash2's selector"),
            (self.tok_embd.is_some(), "its own token embeddings"),
            (self.output.is_some(), "its own LM head"),
            (self.d2t.is_some(), "a reduced draft vocabulary (d2t)"),
            (self.rope_freqs.is_some(), "RoPE frequency factors"),
            (
                c.windows.iter().any(Option::is_some),
                "sliding-window layers",
            ),
            (c.causal, "causal block attention"),
            (c.value_scale.is_some(), "a value scale"),
            (c.act != super::FfnActivation::Silu, "a GELU MLP"),
        ];
        if let Some((_, what)) = features.iter().find(|(on, _)| *on) {
            return Err(format!("a DFlash draft with {what}"));
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let extra = [
                (l.wv.is_none(), "shared K/V (no attn_v)"),
                (
                    l.post_attn_norm.is_some() || l.post_ffn_norm.is_some(),
                    "post-norms",
                ),
                (l.out_scale.is_some(), "layer output scales"),
                (l.sinks.is_some(), "attention sinks"),
                (l.conv.is_some(), "DFlash2's convolutions"),
            ];
            if let Some((_, what)) = extra.iter().find(|(on, _)| *on) {
                return Err(format!("a DFlash draft with {what}"));
            }
            layers.push(PlainLayer {
                attn_norm: &l.attn_norm,
                wq: self.matrix("attn_q", &l.wq),
                wk: self.matrix("attn_k", &l.wk),
                wv: self.matrix("attn_v", l.wv.as_ref().expect("checked above")),
                wo: self.matrix("attn_output", &l.wo),
                q_norm: &l.q_norm,
                k_norm: &l.k_norm,
                ffn_norm: &l.ffn_norm,
                gate: self.matrix("ffn_gate", &l.gate),
                up: self.matrix("ffn_up", &l.up),
                down: self.matrix("ffn_down", &l.down),
            });
        }
        Ok(PlainDraft {
            fc: self.matrix("fc", &self.fc),
            hidden_norm: &self.hidden_norm,
            output_norm: &self.output_norm,
            layers,
        })
    }
}
