//! Whole turns in one call, for drivers that need nothing between steps
//! (tests, examples, benchmarks): prefill a prompt into a state and step the
//! [`Turn`] machine until it ends. `hearth run` and the server's scheduler
//! step the same machine themselves.

use hearth_models::Backend;
use hearth_tokenizer::Tokenizer;

use crate::sampler::Sampler;
use crate::spec::{Drafter, SpecError, SpecStats};
pub use crate::turn::{FinishReason, Flow, StopMatcher, TurnError, TurnStats};
use crate::turn::{Turn, TurnParams};

#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    pub max_tokens: usize,
    /// Generation ends when any of these appears; the text stops before it.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Prefills `prompt` at the state's current position (in one pass) and
/// generates, one token per step, or speculatively with `drafter` and K =
/// `n_draft` (the state must then hold exactly the drafter's committed
/// context, and its rings `n_draft` slots of slack). `on_text` receives text
/// as it is produced. Any backend (the CPU `Model`, the GPU one).
#[allow(clippy::too_many_arguments)]
pub fn run_turn<B: Backend>(
    model: &B,
    state: &mut B::State,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    mut drafter: Option<&mut dyn Drafter>,
    n_draft: usize,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> Flow,
) -> Result<TurnStats, TurnError> {
    let turn_params = TurnParams {
        max_tokens: params.max_tokens,
        stop: params.stop.clone(),
        ignore_eos: params.ignore_eos,
        n_draft,
        render_special: false,
        logprobs: None,
    };
    let mut turn = Turn::new(tokenizer, prompt.to_vec(), 0, sampler.clone(), turn_params);
    while turn.finished().is_none() {
        turn.step(
            model,
            state,
            drafter.as_mut().map(|d| &mut **d as &mut dyn Drafter),
            usize::MAX,
            &mut on_text,
        )?;
    }
    let (stats, s) = turn.into_parts();
    *sampler = s;
    Ok(stats)
}

/// [`run_turn`] without speculation.
pub fn generate<B: Backend>(
    model: &B,
    state: &mut B::State,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: impl FnMut(&str) -> Flow,
) -> Result<TurnStats, TurnError> {
    run_turn(
        model, state, tokenizer, sampler, None, 0, prompt, params, on_text,
    )
}

/// Run-time knobs of speculation.
#[derive(Clone, Copy, Debug)]
pub struct SpecParams {
    /// Most draft tokens per cycle (K). 0 turns drafting off (plain decoding
    /// through the same machine).
    pub n_draft: usize,
}

/// [`run_turn`] with a drafter: returns the usual statistics and the
/// acceptance statistics of this generation.
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
    on_text: impl FnMut(&str) -> Flow,
) -> Result<(TurnStats, SpecStats), SpecError> {
    let stats = run_turn(
        model,
        state,
        tokenizer,
        sampler,
        Some(drafter),
        spec.n_draft,
        prompt,
        params,
        on_text,
    )
    .map_err(|e| match e {
        TurnError::Model(e) => SpecError::Model(e),
        TurnError::Spec(e) => e,
        TurnError::Constraint(e) => SpecError::Model(hearth_models::ModelError::Unsupported {
            backend: "speculative",
            what: format!("constrained output ({e})"),
        }),
    })?;
    let spec_stats = stats.spec.clone().unwrap_or_default();
    Ok((stats, spec_stats))
}
