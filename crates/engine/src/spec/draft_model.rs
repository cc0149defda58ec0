//! A small model with the target's vocabulary drafts K tokens autoregressively
//! (qwen2.5-coder-0.5b for qwen2.5-coder-1.5b). It keeps its own KV state and
//! the ids in it; each proposal first rolls that state back to the longest
//! common prefix with the committed context, then feeds the rest.
//!
//! Greedy targets get argmax drafts (one-hot q). A sampling target gets drafts
//! drawn from the draft model's own distribution under the same temperature,
//! top-k, top-p and min-p (no penalties), and q is returned for the
//! min(1, p/q) test; the drafter's RNG is its own, so the target's stream is
//! only used by verification.
//!
//! The draft model runs on any backend: the CPU model by default, or the
//! target's GPU.
//!
//! The draft model has no vision: an image's positions (which hold
//! [`IMAGE_ID`] in the context) reach it as [`IMAGE_STAND_IN`] tokens, so its
//! positions stay the target's; it drafts from the text around the image.

use std::sync::Arc;

use hearth_models::{Backend, BackendState, Logits, Model};

use super::{Draft, Drafter, SpecError};
use crate::prompt::common_prefix;
use crate::prompt::IMAGE_ID;
use crate::sampler::{argmax, Sampler, SamplerConfig};

/// The token a draft model is fed at an image position (id 0: in every
/// vocabulary).
pub const IMAGE_STAND_IN: u32 = 0;

pub struct DraftModelDrafter<B: Backend = Model> {
    model: Arc<B>,
    state: B::State,
    /// Context ids whose K/V are in `state` (`fed.len() == state.pos()`;
    /// [`IMAGE_ID`] where the state holds [`IMAGE_STAND_IN`]).
    fed: Vec<u32>,
    /// `None`: argmax drafting.
    sampler: Option<Sampler>,
}

impl<B: Backend> DraftModelDrafter<B> {
    /// `target_vocab`: the target's vocabulary size (must match). `max_ctx` as
    /// the target's; `n_draft`: the most tokens proposed per cycle (ring slack).
    pub fn new(
        model: Arc<B>,
        target_vocab: usize,
        max_ctx: usize,
        n_draft: usize,
        target_sampling: &SamplerConfig,
    ) -> Result<Self, SpecError> {
        if model.config().vocab_size != target_vocab {
            return Err(SpecError::Config(format!(
                "the draft model's vocabulary ({}) differs from the target's ({target_vocab})",
                model.config().vocab_size
            )));
        }
        let state = model
            .new_state(max_ctx, n_draft + 1)
            .map_err(SpecError::Draft)?;
        let sampler = draft_sampler(target_sampling)?;
        Ok(DraftModelDrafter {
            model,
            state,
            fed: Vec::new(),
            sampler,
        })
    }

    /// Rolls the state back to its common prefix with `context` (keeping at
    /// least one token to feed) and feeds the rest; returns the last row.
    fn sync(&mut self, context: &[u32]) -> Result<Vec<f32>, SpecError> {
        let keep = common_prefix(&self.fed, context).min(context.len() - 1);
        if keep < self.fed.len() {
            if self.state.rollback(keep).is_err() {
                self.state.reset();
                self.fed.clear();
            } else {
                self.fed.truncate(keep);
            }
        }
        let rest = &context[self.fed.len()..];
        let stand_in;
        let feed = match rest.contains(&IMAGE_ID) {
            false => rest,
            true => {
                stand_in = rest
                    .iter()
                    .map(|&t| if t == IMAGE_ID { IMAGE_STAND_IN } else { t })
                    .collect::<Vec<u32>>();
                &stand_in
            }
        };
        let logits = self
            .model
            .forward(&mut self.state, feed, Logits::Last)
            .map_err(SpecError::Draft)?;
        self.fed.extend_from_slice(rest);
        Ok(logits)
    }
}

impl<B: Backend> Drafter for DraftModelDrafter<B> {
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Draft, SpecError> {
        let room = self.state.max_ctx().saturating_sub(context.len());
        let k = k.min(room);
        let mut logits = self.sync(context)?;
        let mut tokens = Vec::with_capacity(k);
        let mut probs = Vec::new();
        for i in 0..k {
            let t = match self.sampler.as_mut() {
                None => argmax(&logits),
                Some(s) => {
                    let q = s.probabilities(&logits);
                    let t = s.sample_from_probs(&q);
                    probs.push(q);
                    t
                }
            };
            tokens.push(t);
            if i + 1 < k {
                logits = self
                    .model
                    .forward(&mut self.state, &[t], Logits::Last)
                    .map_err(SpecError::Draft)?;
                self.fed.push(t);
            }
        }
        let probs = self.sampler.is_some().then_some(probs);
        Ok(Draft { tokens, probs })
    }

    /// Nothing to do: the next proposal rolls back to the committed prefix.
    fn commit(&mut self, _tokens: &[u32], _hidden: &[f32]) -> Result<(), SpecError> {
        Ok(())
    }

    fn reset(&mut self) {
        self.state.reset();
        self.fed.clear();
    }

    /// Nothing to do: the next proposal rolls back to the common prefix.
    fn rollback(&mut self, _pos: usize) {}

    fn set_sampling(&mut self, config: &SamplerConfig) -> Result<(), SpecError> {
        self.sampler = draft_sampler(config)?;
        Ok(())
    }
}

/// The draft's own sampler: `None` (argmax drafts) for a greedy target;
/// otherwise the target's temperature and filters without penalties, with
/// its own RNG stream.
fn draft_sampler(target: &SamplerConfig) -> Result<Option<Sampler>, SpecError> {
    if target.is_greedy() {
        return Ok(None);
    }
    let cfg = SamplerConfig {
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        // Independent of the target's stream, reproducible when seeded.
        seed: if target.seed == 0 {
            0
        } else {
            target.seed.wrapping_add(0x5eed)
        },
        ..*target
    };
    Sampler::new(cfg)
        .map(Some)
        .map_err(|e| SpecError::Config(e.to_string()))
}
