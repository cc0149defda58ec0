//! Speculative decoding: a drafter proposes K tokens, the target scores the
//! pending token plus all K in one forward pass, and [`verify`] keeps the
//! longest prefix the target agrees with (greedy) or would have sampled
//! (rejection sampling), plus one token of its own. Output is the target's
//! distribution exactly; only the number of target passes changes.
//!
//! - [`verify`]: the acceptance math, independent of the drafter.
//! - [`factory`]: a [`factory::SpecConfig`] in, drafters out.
//! - [`Drafter`]: what every drafter implements; [`ngram`] (prompt lookup),
//!   [`draft_model`] (a small model with the same vocabulary), [`dflash`]
//!   (block diffusion drafter on the target's hidden states).
//! - the cycle itself (draft, verify, roll back) is a step of the one turn
//!   machine, [`crate::turn::Turn`].
//! - [`adaptive`]: the draft length per cycle from recent acceptance, and
//!   plain steps while drafting does not pay.
//! - [`SpecStats`]: acceptance per draft position, mean accepted length.

pub mod adaptive;
pub mod dflash;
pub mod draft_model;
pub mod factory;
pub mod ngram;
pub mod verify;

use hearth_models::ModelError;

pub use crate::generate::{generate_speculative, SpecParams};

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("draft model: {0}")]
    Draft(ModelError),
    #[error("speculative decoding: {0}")]
    Config(String),
}

/// Which drafter proposes tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecKind {
    #[default]
    None,
    Dflash,
    Draft,
    Ngram,
}

impl SpecKind {
    pub fn parse(s: &str) -> Option<SpecKind> {
        Some(match s {
            "none" => SpecKind::None,
            "dflash" => SpecKind::Dflash,
            "draft" => SpecKind::Draft,
            "ngram" => SpecKind::Ngram,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SpecKind::None => "none",
            SpecKind::Dflash => "dflash",
            SpecKind::Draft => "draft",
            SpecKind::Ngram => "ngram",
        }
    }
}

/// A proposal of tokens to follow the context.
#[derive(Clone, Debug, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// For a drafter that samples: the distribution (over the vocabulary)
    /// each token was drawn from. `None`: deterministic (one-hot q).
    pub probs: Option<Vec<Vec<f32>>>,
}

/// A source of draft tokens. The generation loop calls, per cycle,
/// [`Drafter::propose`] and then [`Drafter::commit`] with what the target
/// kept; a drafter with its own state rolls back to the committed tokens.
pub trait Drafter {
    /// Target layers whose input hidden states the drafter reads (DFlash);
    /// empty for drafters that only see tokens.
    fn taps(&self) -> &[usize] {
        &[]
    }

    /// Up to `k` tokens to follow `context`: every token committed to the
    /// target's cache, then the pending token (sampled, not yet fed) last.
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Draft, SpecError>;

    /// The target fed and kept `tokens` (the prompt at prefill; the pending
    /// token plus the accepted drafts after a cycle). `hidden`: their tapped
    /// rows, [tokens.len(), taps.len() * dim] (empty without taps).
    fn commit(&mut self, tokens: &[u32], hidden: &[f32]) -> Result<(), SpecError>;

    /// Forget everything (a new conversation).
    fn reset(&mut self);

    /// The target's state was rolled back to `pos` committed positions (a
    /// session resuming from a common prefix): forget anything past it.
    fn rollback(&mut self, pos: usize);

    /// The sampling configuration of the next generation (a drafter that
    /// samples its drafts follows the target's temperature and filters).
    fn set_sampling(&mut self, _config: &crate::sampler::SamplerConfig) -> Result<(), SpecError> {
        Ok(())
    }
}

impl<D: Drafter + ?Sized> Drafter for Box<D> {
    fn taps(&self) -> &[usize] {
        (**self).taps()
    }
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Draft, SpecError> {
        (**self).propose(context, k)
    }
    fn commit(&mut self, tokens: &[u32], hidden: &[f32]) -> Result<(), SpecError> {
        (**self).commit(tokens, hidden)
    }
    fn reset(&mut self) {
        (**self).reset()
    }
    fn rollback(&mut self, pos: usize) {
        (**self).rollback(pos)
    }
    fn set_sampling(&mut self, config: &crate::sampler::SamplerConfig) -> Result<(), SpecError> {
        (**self).set_sampling(config)
    }
}

/// Acceptance statistics over one or more generations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Verify passes of the target (one per cycle).
    pub target_forwards: u64,
    /// Tokens produced by those passes (accepted drafts + one per cycle).
    pub tokens: u64,
    /// Draft tokens proposed and accepted, in total.
    pub drafted: u64,
    pub accepted: u64,
    /// Per draft position i (0-based): cycles that drafted a token there, and
    /// cycles where it was accepted.
    pub drafted_at: Vec<u64>,
    pub accepted_at: Vec<u64>,
    /// Time spent in the drafter and in the target's verify passes.
    pub draft_secs: f64,
    pub verify_secs: f64,
}

impl SpecStats {
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.target_forwards += 1;
        self.tokens += accepted as u64 + 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        if self.drafted_at.len() < drafted {
            self.drafted_at.resize(drafted, 0);
            self.accepted_at.resize(drafted, 0);
        }
        self.drafted_at[..drafted].iter_mut().for_each(|n| *n += 1);
        self.accepted_at[..accepted]
            .iter_mut()
            .for_each(|n| *n += 1);
    }

    pub fn merge(&mut self, o: &SpecStats) {
        self.target_forwards += o.target_forwards;
        self.tokens += o.tokens;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        let n = self.drafted_at.len().max(o.drafted_at.len());
        self.drafted_at.resize(n, 0);
        self.accepted_at.resize(n, 0);
        for i in 0..o.drafted_at.len() {
            self.drafted_at[i] += o.drafted_at[i];
            self.accepted_at[i] += o.accepted_at[i];
        }
        self.draft_secs += o.draft_secs;
        self.verify_secs += o.verify_secs;
    }

    /// Mean number of draft tokens accepted per verify pass.
    pub fn mean_accepted(&self) -> f64 {
        self.accepted as f64 / (self.target_forwards.max(1)) as f64
    }

    /// Tokens committed per target forward (mean accepted + 1).
    pub fn tokens_per_forward(&self) -> f64 {
        self.tokens as f64 / (self.target_forwards.max(1)) as f64
    }

    /// Verify passes that carried no draft: plain target steps (an adaptive
    /// pause, a drafter with nothing to propose, the last token of a budget).
    pub fn undrafted(&self) -> u64 {
        self.target_forwards - self.drafted_at.first().copied().unwrap_or(0)
    }

    /// Fraction of drafted tokens accepted, over all positions.
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / (self.drafted.max(1)) as f64
    }

    /// P(accepted | drafted) per draft position.
    pub fn acceptance_by_position(&self) -> Vec<f64> {
        self.drafted_at
            .iter()
            .zip(&self.accepted_at)
            .map(|(&d, &a)| if d == 0 { 0.0 } else { a as f64 / d as f64 })
            .collect()
    }
}
