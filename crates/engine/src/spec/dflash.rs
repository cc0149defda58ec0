//! The DFlash / DFlash2 drafter (../shared/spec/dflash.md §6–§8, llama.cpp
//! common/speculative.cpp's dflash driver): keeps the backlog of target
//! hidden rows not yet in the draft context cache (invariant
//! `C + rows(Hq) = F`), and per cycle runs one draft forward over
//! `[anchor, MASK × (B−1)]` that first writes the backlog, then reads the
//! drafts: argmax of block rows 1..=K (DFlash1) or the greedy walk of the
//! selector lattice (DFlash2). Block length B is a run-time knob
//! (2 ≤ B ≤ the draft's trained block size), as is K ≤ B−1.

use std::sync::Arc;

use hearth_models::dflash::{CpuRunner, DflashError, DflashModel, DraftRunner};
use hearth_models::Model;

use super::{Draft, Drafter, SpecError};

impl From<DflashError> for SpecError {
    fn from(e: DflashError) -> Self {
        SpecError::Config(e.to_string())
    }
}

pub struct DflashDrafter {
    draft: Arc<DflashModel>,
    /// The draft forward and its context cache, on the CPU or a GPU.
    runner: Box<dyn DraftRunner>,
    /// Hidden rows of committed positions C..F−1, [rows, n_taps · dim].
    backlog: Vec<f32>,
    block_length: usize,
    /// Run each draft forward on a block of just the K+1 positions asked
    /// for (at most `block_length`) instead of the whole block: set by the
    /// adaptive length ([`super::adaptive`]), so a short draft costs a short
    /// draft forward.
    block_follows_draft: bool,
    taps: Vec<usize>,
}

impl DflashDrafter {
    /// `block_length`: B, in 2..=block_size (default: the trained block size).
    pub fn new(
        draft: Arc<DflashModel>,
        target: Arc<Model>,
        max_ctx: usize,
        block_length: Option<usize>,
    ) -> Result<Self, SpecError> {
        // Room for the block's positions past the context.
        let bmax = draft.config.block_size;
        let runner = Box::new(CpuRunner::new(draft.clone(), target, max_ctx + bmax));
        Self::with_runner(draft, runner, block_length)
    }

    /// A drafter whose forward runs on `runner` (sized for the session's
    /// context plus one block).
    pub fn with_runner(
        draft: Arc<DflashModel>,
        runner: Box<dyn DraftRunner>,
        block_length: Option<usize>,
    ) -> Result<Self, SpecError> {
        let bmax = draft.config.block_size;
        let b = block_length.unwrap_or(bmax);
        if !(2..=bmax).contains(&b) {
            return Err(SpecError::Config(format!(
                "--block-length {b} must be in 2..={bmax} (the draft's trained block size)"
            )));
        }
        let taps = draft.config.target_layers.clone();
        Ok(DflashDrafter {
            draft,
            runner,
            backlog: Vec::new(),
            block_length: b,
            block_follows_draft: false,
            taps,
        })
    }

    /// Changes B without reloading (takes effect at the next proposal).
    pub fn set_block_length(&mut self, b: usize) -> Result<(), SpecError> {
        let bmax = self.draft.config.block_size;
        if !(2..=bmax).contains(&b) {
            return Err(SpecError::Config(format!(
                "block length {b} must be in 2..={bmax}"
            )));
        }
        self.block_length = b;
        Ok(())
    }

    pub fn block_length(&self) -> usize {
        self.block_length
    }

    /// Whether a proposal of K < B−1 tokens runs a block of K+1 positions
    /// (true) or of the full B (false, the default: llama.cpp's behaviour).
    pub fn set_block_follows_draft(&mut self, on: bool) {
        self.block_follows_draft = on;
    }

    /// Context positions written to the draft cache (C).
    pub fn cached_context(&self) -> usize {
        self.runner.ctx_len()
    }

    /// Rows waiting to be written (rows(Hq)).
    pub fn backlog_rows(&self) -> usize {
        self.backlog.len() / self.draft.hidden_width()
    }
}

impl Drafter for DflashDrafter {
    fn taps(&self) -> &[usize] {
        &self.taps
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Result<Draft, SpecError> {
        let f = context.len() - 1;
        if self.cached_context() + self.backlog_rows() != f {
            return Err(SpecError::Config(format!(
                "DFlash bookkeeping: {} cached + {} backlog rows != {f} committed positions",
                self.cached_context(),
                self.backlog_rows()
            )));
        }
        let n = k.min(self.block_length - 1);
        if n == 0 {
            return Ok(Draft::default());
        }
        let b = match self.block_follows_draft {
            true => n + 1,
            false => self.block_length,
        };
        let mut block = vec![self.draft.config.mask_token; b];
        block[0] = context[f];
        let tokens = self.runner.draft(&self.backlog, &block, n)?;
        self.backlog.clear();
        Ok(Draft {
            tokens,
            probs: None,
        })
    }

    fn commit(&mut self, tokens: &[u32], hidden: &[f32]) -> Result<(), SpecError> {
        let width = self.draft.hidden_width();
        if hidden.len() != tokens.len() * width {
            return Err(SpecError::Config(format!(
                "DFlash: {} hidden values for {} tokens of width {width}",
                hidden.len(),
                tokens.len()
            )));
        }
        self.backlog.extend_from_slice(hidden);
        // §7.4: with an all-sliding draft, rows older than W_d are never seen.
        let w = self.draft.config.draft_sliding_window();
        let rows = self.backlog_rows();
        if w > 0 && rows > w {
            let drop = rows - w;
            self.runner.skip_context(drop)?;
            self.backlog.drain(..drop * width);
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.runner.truncate(0);
        self.backlog.clear();
    }

    /// Spec §7.2: keep only the backlog rows below `pos`; context K/V past it
    /// are simply rewritten later (the cache is indexed by position).
    fn rollback(&mut self, pos: usize) {
        let width = self.draft.hidden_width();
        let c = self.runner.ctx_len();
        if pos <= c {
            self.runner.truncate(pos);
            self.backlog.clear();
        } else {
            self.backlog.truncate((pos - c) * width);
        }
    }
}
