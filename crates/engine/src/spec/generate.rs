//! The speculative generation loop. Same contract as
//! [`crate::generate::generate`] (prefill, stream text, stop on EOS / stop
//! string / budget), but each decode step is a cycle:
//!
//! 1. the drafter proposes `d_1..d_K` after the pending token `a` (sampled by
//!    the target, not yet fed; it sits at position F = `state.pos`);
//! 2. the target runs `[a, d_1..d_K]` at F..F+K in one pass, all logits rows;
//! 3. [`verify_block`] accepts a prefix `d_1..d_k` and picks the next pending
//!    token (correction or bonus);
//! 4. the target state rolls back to F+k+1: the K−k rejected positions are
//!    stale and overwritten by the next pass (flat caches hide them behind the
//!    causal mask; rings keep `slack ≥ K` extra slots so nothing still inside
//!    the window was overwritten, see `Backend::new_state`).

use std::time::Instant;

use hearth_models::{Backend, BackendState, Logits};
use hearth_tokenizer::Tokenizer;

use super::verify::verify_block;
use super::{Drafter, SpecError, SpecStats};
use crate::generate::{FinishReason, Flow, GenerateParams, GenerationStats, StopMatcher};
use crate::sampler::Sampler;

/// Run-time knobs of speculation.
#[derive(Clone, Copy, Debug)]
pub struct SpecParams {
    /// Most draft tokens per cycle (K). 0 turns drafting off (plain decoding
    /// through the same loop).
    pub n_draft: usize,
}

/// Prefills `prompt` (the state must be empty or hold exactly the drafter's
/// committed context) and generates speculatively. Returns the usual stats and
/// the acceptance statistics of this generation.
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative<B: Backend>(
    model: &B,
    state: &mut B::State,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    params: &GenerateParams,
    spec: SpecParams,
    mut on_text: impl FnMut(&str) -> Flow,
) -> Result<(GenerationStats, SpecStats), SpecError> {
    let vocab = model.config().vocab_size;
    let taps = drafter.taps().to_vec();
    let width = taps.len() * model.config().dim;
    let t0 = Instant::now();
    let mut hidden = Vec::new();
    let logits = model.forward_tapped(state, prompt, Logits::Last, &taps, &mut hidden)?;
    drafter.commit(prompt, &hidden)?;
    let prefill_time = t0.elapsed();

    let mut history: Vec<u32> = prompt.to_vec();
    let mut decoder = tokenizer.stream_decoder(false);
    let mut stops = StopMatcher::new(params.stop.clone());
    let mut tokens: Vec<u32> = Vec::new();
    let mut stats = SpecStats::default();
    let t1 = Instant::now();

    // Emits one token; Some(reason) ends the generation.
    let mut emit = |t: u32, tokens: &mut Vec<u32>| -> Option<FinishReason> {
        if tokenizer.is_eog(t) && !params.ignore_eos {
            return Some(FinishReason::Stop);
        }
        tokens.push(t);
        let (text, hit) = stops.push(&decoder.push(t));
        if !text.is_empty() && on_text(&text) == Flow::Stop {
            return Some(FinishReason::Cancelled);
        }
        if hit {
            return Some(FinishReason::Stop);
        }
        None
    };

    let mut finish = FinishReason::Length;
    if params.max_tokens > 0 {
        let mut pending = sampler.sample(&logits);
        sampler.accept(pending);
        'gen: loop {
            if let Some(f) = emit(pending, &mut tokens) {
                finish = f;
                break;
            }
            let remaining = params.max_tokens - tokens.len();
            let room = state.max_ctx() - state.pos();
            if remaining == 0 || room == 0 {
                break;
            }
            // A cycle commits up to K+1 tokens and writes K+1 positions.
            let k = spec.n_draft.min(remaining - 1).min(room - 1);
            let td = Instant::now();
            let draft = if k > 0 {
                history.push(pending);
                let d = drafter.propose(&history, k);
                history.pop();
                let mut d = d?;
                d.tokens.truncate(k);
                d
            } else {
                Default::default()
            };
            stats.draft_secs += td.elapsed().as_secs_f64();

            let tv = Instant::now();
            let f = state.pos();
            let mut block = Vec::with_capacity(draft.tokens.len() + 1);
            block.push(pending);
            block.extend_from_slice(&draft.tokens);
            let mut hid = Vec::new();
            let rows = model.forward_verify(state, &block, Logits::All, &taps, &mut hid)?;
            let probs = draft.probs.as_deref();
            let out = verify_block(sampler, &rows, vocab, &draft.tokens, probs);
            let kept = out.accepted + 1;
            state.rollback(f + kept)?;
            stats.verify_secs += tv.elapsed().as_secs_f64();
            stats.record(draft.tokens.len(), out.accepted);

            drafter.commit(&block[..kept], &hid[..kept * width])?;
            history.extend_from_slice(&block[..kept]);
            for &d in &draft.tokens[..out.accepted] {
                if let Some(f) = emit(d, &mut tokens) {
                    finish = f;
                    break 'gen;
                }
                if tokens.len() == params.max_tokens {
                    break 'gen;
                }
            }
            pending = out.next;
        }
    }
    if finish != FinishReason::Stop {
        let rest = stops.push(&decoder.finish()).0 + &stops.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    let gen = GenerationStats {
        prompt_tokens: prompt.len(),
        prefill_time,
        generated_tokens: tokens.len(),
        decode_time: t1.elapsed(),
        finish,
        tokens,
    };
    Ok((gen, stats))
}
