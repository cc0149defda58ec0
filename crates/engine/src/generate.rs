//! The generation loop: prefill a prompt, then sample, stream and feed one
//! token at a time until EOS, a stop string or the token budget.

use std::time::{Duration, Instant};

use hearth_models::{Backend, BackendState, Logits, ModelError};
use hearth_tokenizer::Tokenizer;

use crate::sampler::Sampler;

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token budget (or the context) ran out.
    Length,
    /// The consumer asked to stop (e.g. a client disconnect).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    pub max_tokens: usize,
    /// Generation ends when any of these appears; the text stops before it.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub prefill_time: Duration,
    pub generated_tokens: usize,
    pub decode_time: Duration,
    pub finish: FinishReason,
    /// Generated token ids (EOS excluded).
    pub tokens: Vec<u32>,
}

impl GenerationStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Decode rate over the tokens produced by single-token forward passes
    /// (the first token comes from the prefill).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// What the consumer of streamed text wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Holds back text that might be the start of a stop string, and finds stops.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds text; returns (text safe to emit, whether a stop string was hit).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&k| s.is_char_boundary(k))
                    .map(move |k| &s[..k])
            })
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// End of generation: whatever was held back is plain text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Prefills `prompt` at the state's current position and generates. `on_text`
/// receives text as it is produced. Any backend (the CPU `Model`, the GPU one).
pub fn generate<B: Backend>(
    model: &B,
    state: &mut B::State,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> Flow,
) -> Result<GenerationStats, ModelError> {
    let t0 = Instant::now();
    let mut logits = model.forward(state, prompt, Logits::Last)?;
    let prefill_time = t0.elapsed();
    let mut decoder = tokenizer.stream_decoder(false);
    let mut stops = StopMatcher::new(params.stop.clone());
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    let t1 = Instant::now();
    while tokens.len() < params.max_tokens {
        let next = sampler.sample(&logits);
        sampler.accept(next);
        if tokenizer.is_eog(next) && !params.ignore_eos {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(next);
        let (text, hit) = stops.push(&decoder.push(next));
        if !text.is_empty() && on_text(&text) == Flow::Stop {
            finish = FinishReason::Cancelled;
            break;
        }
        if hit {
            finish = FinishReason::Stop;
            break;
        }
        if tokens.len() == params.max_tokens {
            break;
        }
        if state.pos() >= state.max_ctx() {
            break;
        }
        logits = model.forward(state, &[next], Logits::Last)?;
    }
    if finish != FinishReason::Stop {
        let rest = stops.push(&decoder.finish()).0 + &stops.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        prefill_time,
        generated_tokens: tokens.len(),
        decode_time: t1.elapsed(),
        finish,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_held_back_and_cut() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("hello <"), ("hello ".into(), false));
        assert_eq!(m.push("/en"), ("".into(), false));
        assert_eq!(m.push("d> tail"), ("".into(), true));
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("a <b"), ("a <b".into(), false));
        assert_eq!(m.push("<"), ("".into(), false));
        assert_eq!(m.finish(), "<");
    }
}
