//! The one generation machine: a turn of a conversation, advanced step by
//! step by whoever drives it (`hearth run`, the speculative and plain
//! [`crate::generate`] helpers, the server's [`crate::scheduler`]).
//!
//! A step is one of:
//! - a prefill chunk of the prompt (the driver picks the chunk size, so a
//!   scheduler can interleave a long prompt with other sessions' decoding);
//! - one decode token: sample from the last logits, emit, feed it;
//! - one speculative cycle (with a drafter and `n_draft > 0`): emit the
//!   pending token, draft K after it, verify `[pending, drafts]` in one pass,
//!   roll the state back to what was kept, emit the accepted drafts.
//!
//! Emitting a token applies the rules every driver shares: end-of-generation
//! tokens, stop strings (text held back while it may still become one), the
//! token budget and the context, streaming detokenization. The driver checks
//! for cancellation between steps ([`Turn::cancel`]); a text sink returning
//! [`Flow::Stop`] cancels from inside a step.

use std::time::{Duration, Instant};

use hearth_models::{Backend, BackendState, Input, Logits};
use hearth_tokenizer::{StreamDecoder, Tokenizer};

use crate::prompt::Prompt;
use crate::sampler::Sampler;
use crate::spec::verify::{verify_block, verify_greedy_ids};
use crate::spec::{Draft, Drafter, SpecError, SpecStats};

/// Why a turn ended.
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

/// What the consumer of streamed text wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// A turn's rules.
#[derive(Clone, Debug, Default)]
pub struct TurnParams {
    /// Most tokens to generate (an end-of-generation token counts).
    pub max_tokens: usize,
    /// Generation ends when any of these appears; the text stops before it.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Speculative decoding: most draft tokens per verify pass (K); 0, or no
    /// drafter given to [`Turn::step`], decodes one token per step.
    pub n_draft: usize,
    /// Render special tokens in the text (tool-call and channel markers the
    /// server's output parser must see).
    pub render_special: bool,
    /// Record each generated token's log-probability and this many
    /// alternatives (`Some(0)`: the token's own only). Logprobs are of the
    /// model's distribution (log-softmax of the raw logits, before penalties,
    /// temperature and filters), as vLLM reports them.
    pub logprobs: Option<usize>,
}

/// A rule on which tokens may come next (a grammar: JSON schema, tool-call
/// syntax). A turn with one decodes one token per step (no speculation):
/// before sampling it forbids tokens, after sampling it is told the token.
pub trait TokenConstraint: Send {
    /// Sets the logit of every token the rule forbids now to −∞.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Advances the rule by the sampled token.
    fn commit(&mut self, token: u32) -> Result<(), String>;
}

/// One generated token's log-probability, with the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The `top` most likely tokens at this step (highest first).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of `logits` at `token`, and the `n` best alternatives.
pub fn token_logprob(logits: &[f32], token: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |i: usize| (logits[i] as f64 - log_z) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n);
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = n.min(idx.len());
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        idx.select_nth_unstable_by(k - 1, by_logit);
        idx.truncate(k);
        idx.sort_by(by_logit);
        top = idx.into_iter().map(|i| (i, lp(i as usize))).collect();
    }
    TokenLogprob {
        token,
        logprob: lp(token as usize),
        top,
    }
}

/// What a turn did, for logs, usage and `--stats-json`.
#[derive(Clone, Debug, Default)]
pub struct TurnStats {
    pub prompt_tokens: usize,
    /// Prompt tokens already in the state when the turn began (not prefilled).
    pub reused_tokens: usize,
    pub prefill_time: Duration,
    /// Tokens sampled, an end-of-generation token included (usage's
    /// completion tokens).
    pub sampled: usize,
    /// The generated ids, end-of-generation excluded.
    pub tokens: Vec<u32>,
    /// Time in decode steps (or speculative cycles) after the prefill.
    pub decode_time: Duration,
    pub finish: Option<FinishReason>,
    /// Acceptance statistics, when the turn speculated.
    pub spec: Option<SpecStats>,
    /// Per generated token (end-of-generation included), when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Time spent in the token constraint (masks and commits).
    pub constraint_time: Duration,
    /// The stop string that ended the turn, if one did.
    pub stop_sequence: Option<String>,
}

impl TurnStats {
    pub fn prefill_tok_s(&self) -> f64 {
        (self.prompt_tokens - self.reused_tokens) as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Decode rate over the tokens after the first (which comes from the prefill).
    pub fn decode_tok_s(&self) -> f64 {
        self.sampled.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Model(#[from] hearth_models::ModelError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("output constraint: {0}")]
    Constraint(String),
}

/// Holds back text that might be the start of a stop string, and finds stops.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    /// The stop string that ended the text, once one has.
    pub matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// Adds text; returns (text safe to emit, whether a stop string was hit).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some((at, stop)) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at)
        {
            self.matched = Some(stop.clone());
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

/// One step's effect on the state, for the session's bookkeeping.
#[derive(Debug, Default)]
pub struct StepOut {
    /// Ids fed through the model and kept in the state, in order.
    pub fed: Vec<u32>,
    /// `Some` when the turn ended in this step.
    pub finished: Option<FinishReason>,
}

/// The forward pass of a step ([`Turn::begin_step`]).
pub struct Feed {
    what: Fed,
    /// The logits the step needs back.
    pub want: Logits,
    began: Instant,
}

enum Fed {
    /// Prompt positions `start..end`.
    Prompt(usize, usize),
    /// The token just sampled.
    Token(u32),
    /// A speculative verify block `[pending, d_1..d_K]`, fed at `at..`.
    Verify {
        block: Vec<u32>,
        draft: Draft,
        at: usize,
        draft_secs: f64,
        verify_began: Instant,
    },
}

impl Feed {
    /// Whether this is a prefill chunk (not a decode token or verify block).
    pub fn is_prefill(&self) -> bool {
        matches!(self.what, Fed::Prompt(..))
    }

    /// The tokens of a speculative verify block (all of its logits rows are
    /// wanted, each as a one-token step would compute it where the backend
    /// can), or `None` for a prefill chunk or a decode token.
    pub fn verify_block(&self) -> Option<&[u32]> {
        match &self.what {
            Fed::Verify { block, .. } => Some(block),
            _ => None,
        }
    }

    /// Positions (rows of the pass) it takes.
    pub fn rows(&self) -> usize {
        match &self.what {
            Fed::Prompt(start, end) => end - start,
            Fed::Token(_) => 1,
            Fed::Verify { block, .. } => block.len(),
        }
    }
}

/// What a step's forward pass gave back ([`Turn::end_step`]).
pub enum Scored {
    /// The logits rows [`Feed::want`] asked for.
    Logits(Vec<f32>),
    /// Each row's argmax only (a verify block of a greedy turn without
    /// penalties: [`Turn::wants_argmax_only`]).
    Argmax(Vec<u32>),
}

/// How [`Turn::begin_step`] left a step.
pub enum Begin {
    /// Run this pass, then [`Turn::end_step`].
    Feed(Feed),
    /// The step ended without a pass (the turn finished).
    Done(StepOut),
}

/// One generation turn. `prompt[start..]` still has to be prefilled into the
/// state the turn is stepped with (`prompt[..start]` is already there);
/// `prompt` followed by the generated tokens is the context a drafter sees.
/// A prompt may hold images ([`Prompt`]); their rows are fed in their own
/// forward passes.
pub struct Turn<'t> {
    tokenizer: &'t Tokenizer,
    prompt: Prompt,
    /// Next prompt index to prefill; `prompt.len()` once the prefill is done.
    next: usize,
    params: TurnParams,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    /// The last forward pass's logits row, once the prefill is done.
    logits: Option<Vec<f32>>,
    /// Speculation: the token sampled by the target and not yet fed.
    pending: Option<u32>,
    constraint: Option<Box<dyn TokenConstraint + 't>>,
    /// Tokens that end the turn as an end-of-generation token does.
    end_tokens: Vec<u32>,
    stats: TurnStats,
}

impl<'t> Turn<'t> {
    pub fn new(
        tokenizer: &'t Tokenizer,
        prompt: impl Into<Prompt>,
        start: usize,
        sampler: Sampler,
        params: TurnParams,
    ) -> Turn<'t> {
        let prompt = prompt.into();
        assert!(
            start < prompt.len(),
            "a turn feeds at least one prompt token"
        );
        Turn {
            tokenizer,
            decoder: tokenizer.stream_decoder(params.render_special),
            stops: StopMatcher::new(params.stop.clone()),
            stats: TurnStats {
                prompt_tokens: prompt.len(),
                reused_tokens: start,
                ..TurnStats::default()
            },
            next: start,
            prompt,
            params,
            sampler,
            logits: None,
            pending: None,
            constraint: None,
            end_tokens: Vec::new(),
        }
    }

    /// Generates under `constraint` (one token per step: a drafter given to
    /// [`Turn::step`] is not used).
    pub fn constrained(mut self, constraint: Box<dyn TokenConstraint + 't>) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Also ends the turn, without their text, on these tokens (a chat
    /// template's turn opener, as `<|im_start|>`: a model that starts a new
    /// turn has ended its own; Ollama stops on them too).
    pub fn ending_on(mut self, tokens: Vec<u32>) -> Self {
        self.end_tokens = tokens;
        self
    }

    /// Whether [`Turn::step`] would speculate with a drafter (no constraint,
    /// no logprobs, `n_draft > 0`).
    pub fn speculates(&self) -> bool {
        self.params.n_draft > 0 && self.constraint.is_none() && self.params.logprobs.is_none()
    }

    /// Prompt tokens in the state so far (reused and prefilled).
    pub fn prompt_fed(&self) -> usize {
        self.next
    }

    /// Whether the prompt is still being prefilled.
    pub fn prefilling(&self) -> bool {
        self.logits.is_none()
    }

    pub fn stats(&self) -> &TurnStats {
        &self.stats
    }

    /// The statistics, and the sampler (its penalty window and RNG moved on).
    pub fn into_parts(self) -> (TurnStats, Sampler) {
        (self.stats, self.sampler)
    }

    /// The turn's finish, once it has ended.
    pub fn finished(&self) -> Option<FinishReason> {
        self.stats.finish
    }

    /// Ends the turn because its consumer is gone (held-back text is dropped).
    pub fn cancel(&mut self) {
        self.stats.finish.get_or_insert(FinishReason::Cancelled);
    }

    /// Advances the turn by one step on `state` (which holds exactly the ids
    /// fed so far), with `drafter` (kept in step with the state) when
    /// speculating. Prefill chunks hold at most `prefill_chunk` tokens. Text
    /// goes to `sink` as it becomes final.
    pub fn step<B: Backend>(
        &mut self,
        model: &B,
        state: &mut B::State,
        mut drafter: Option<&mut dyn Drafter>,
        prefill_chunk: usize,
        sink: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<StepOut, TurnError> {
        let (pos, max_ctx) = (state.pos(), state.max_ctx());
        let d = drafter.as_mut().map(|d| &mut **d as &mut dyn Drafter);
        let feed = match self.begin_step(pos, max_ctx, prefill_chunk, d, sink)? {
            Begin::Feed(f) => f,
            Begin::Done(out) => return Ok(out),
        };
        let taps = drafter
            .as_ref()
            .map(|d| d.taps().to_vec())
            .unwrap_or_default();
        let mut hidden = Vec::new();
        let scored = match feed.verify_block() {
            Some(block) if self.wants_argmax_only() => {
                Scored::Argmax(model.verify_argmax(state, block, &taps, &mut hidden)?)
            }
            Some(block) => Scored::Logits(model.forward_verify(
                state,
                block,
                Logits::All,
                &taps,
                &mut hidden,
            )?),
            None => {
                let input = self.feed_input(&feed, model.config().dim);
                Scored::Logits(model.forward_input(state, input, feed.want, &taps, &mut hidden)?)
            }
        };
        self.end_step(feed, scored, &hidden, state, drafter, sink)
    }

    /// Whether a verify block of this turn needs only each row's argmax
    /// (greedy, no penalties), which a backend may find where the logits are.
    pub fn wants_argmax_only(&self) -> bool {
        self.sampler.is_greedy() && !self.sampler.has_penalties()
    }

    /// The first half of a step, for a driver that runs the passes of several
    /// turns together: samples and emits the next token (a decode step), or
    /// with `drafter` (when the turn speculates) emits the pending token and
    /// drafts after it, and says what to feed, or how the step ended without
    /// a pass. The driver runs [`Turn::feed_input`] at the state's position
    /// (`pos`, of a context of `max_ctx`) with [`Feed::want`] — a verify
    /// block ([`Feed::verify_block`]) with every row as a one-token step
    /// computes it, tapping the drafter's layers — and hands the result to
    /// [`Turn::end_step`].
    pub fn begin_step(
        &mut self,
        pos: usize,
        max_ctx: usize,
        prefill_chunk: usize,
        drafter: Option<&mut dyn Drafter>,
        sink: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<Begin, TurnError> {
        assert!(self.stats.finish.is_none(), "step of a finished turn");
        let began = Instant::now();
        if self.logits.is_none() {
            let end = self.next.saturating_add(prefill_chunk.max(1));
            // Where the chunk really ends (an image's rows go in their own pass).
            let end = self.prompt.chunk_end(self.next, end);
            let want = if end == self.prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            return Ok(Begin::Feed(Feed {
                what: Fed::Prompt(self.next, end),
                want,
                began,
            }));
        }
        // A drafter that does not draft this turn (a constrained turn,
        // logprobs) still sees every fed token, so it stays in step with
        // the session for the turns after.
        if let Some(d) = drafter.filter(|_| self.speculates()) {
            return self.begin_spec(pos, max_ctx, d, began, sink);
        }
        let next = self.sample_next()?;
        let finished = match self.emit(next, sink) {
            Some(f) => Some(f),
            None => (pos >= max_ctx).then_some(FinishReason::Length),
        };
        if let Some(f) = finished {
            self.stats.decode_time += began.elapsed();
            return Ok(self.done(f, vec![], sink));
        }
        Ok(Begin::Feed(Feed {
            what: Fed::Token(next),
            want: Logits::Last,
            began,
        }))
    }

    /// What `feed` runs through the model (for a model of width `dim`).
    pub fn feed_input<'s>(&'s self, feed: &'s Feed, dim: usize) -> Input<'s> {
        match &feed.what {
            Fed::Prompt(start, end) => self.prompt.input(*start, *end, dim).0,
            Fed::Token(t) => Input::Tokens(std::slice::from_ref(t)),
            Fed::Verify { block, .. } => Input::Tokens(block),
        }
    }

    /// The ids `feed` puts in the state (a verify block: all of them, before
    /// the rejected ones are rolled back).
    pub fn feed_ids<'s>(&'s self, feed: &'s Feed) -> &'s [u32] {
        match &feed.what {
            Fed::Prompt(start, end) => &self.prompt.ids[*start..*end],
            Fed::Token(t) => std::slice::from_ref(t),
            Fed::Verify { block, .. } => block,
        }
    }

    /// The second half of a step ([`Turn::begin_step`]): what the pass
    /// scored, and `hidden`, the drafter's tapped rows of the fed positions
    /// ([rows, taps.len() * dim]; empty without taps). A verify block rolls
    /// `state` back to what was kept and commits that to `drafter`; the other
    /// steps commit what they fed.
    pub fn end_step<S: BackendState + ?Sized>(
        &mut self,
        feed: Feed,
        scored: Scored,
        hidden: &[f32],
        state: &mut S,
        drafter: Option<&mut dyn Drafter>,
        sink: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<StepOut, TurnError> {
        if feed.verify_block().is_some() {
            return self.end_spec(feed, scored, hidden, state, drafter, sink);
        }
        let Scored::Logits(logits) = scored else {
            unreachable!("argmax-only scores are for verify blocks")
        };
        if let Some(d) = drafter {
            d.commit(self.feed_ids(&feed), hidden)?;
        }
        let fed = self.feed_ids(&feed).to_vec();
        let mut finished = None;
        match feed.what {
            Fed::Prompt(_, end) => {
                self.next = end;
                if feed.want == Logits::Last {
                    self.logits = Some(logits);
                    if self.params.max_tokens == 0 {
                        finished = Some(FinishReason::Length);
                    }
                }
                self.stats.prefill_time += feed.began.elapsed();
            }
            Fed::Token(_) => {
                self.logits = Some(logits);
                self.stats.decode_time += feed.began.elapsed();
            }
            Fed::Verify { .. } => unreachable!("verify blocks end in end_spec"),
        }
        Ok(self.conclude(StepOut { fed, finished }, sink))
    }

    /// A step that ended without a pass.
    fn done(
        &mut self,
        f: FinishReason,
        fed: Vec<u32>,
        sink: &mut dyn FnMut(&str) -> Flow,
    ) -> Begin {
        let out = StepOut {
            fed,
            finished: Some(f),
        };
        Begin::Done(self.conclude(out, sink))
    }

    /// Records how a step ended; a turn that ends other than by a stop
    /// flushes the text it held back.
    fn conclude(&mut self, out: StepOut, sink: &mut dyn FnMut(&str) -> Flow) -> StepOut {
        if let Some(f) = out.finished {
            self.stats.finish = Some(f);
            if f != FinishReason::Stop {
                // The text held back (a partial character or stop string) is plain text.
                let rest = self.stops.push(&self.decoder.finish()).0 + &self.stops.finish();
                if !rest.is_empty() && f != FinishReason::Cancelled {
                    sink(&rest);
                }
            }
        }
        out
    }

    /// Applies the shared rules to one generated token; `Some` ends the turn.
    fn emit(&mut self, token: u32, sink: &mut dyn FnMut(&str) -> Flow) -> Option<FinishReason> {
        self.stats.sampled += 1;
        if (self.tokenizer.is_eog(token) || self.end_tokens.contains(&token))
            && !self.params.ignore_eos
        {
            return Some(FinishReason::Stop);
        }
        self.stats.tokens.push(token);
        let (text, hit) = self.stops.push(&self.decoder.push(token));
        if !text.is_empty() && sink(&text) == Flow::Stop {
            return Some(FinishReason::Cancelled);
        }
        if hit {
            self.stats.stop_sequence = self.stops.matched.clone();
            return Some(FinishReason::Stop);
        }
        (self.stats.sampled >= self.params.max_tokens).then_some(FinishReason::Length)
    }

    /// Samples the next token from the last logits under the constraint (and
    /// tells the constraint), recording its logprob when asked.
    fn sample_next(&mut self) -> Result<u32, TurnError> {
        let logits = self.logits.as_ref().expect("decode after prefill");
        let next = match self.constraint.as_mut() {
            None => self.sampler.sample(logits),
            Some(c) => {
                // The constraint's whole cost per token: the copy, the mask, the commit.
                let t = Instant::now();
                let mut masked = logits.clone();
                c.mask(&mut masked).map_err(TurnError::Constraint)?;
                self.stats.constraint_time += t.elapsed();
                if masked.iter().all(|l| *l == f32::NEG_INFINITY) {
                    return Err(TurnError::Constraint(
                        "no token is allowed next (the grammar cannot continue)".into(),
                    ));
                }
                let next = self.sampler.sample(&masked);
                let t = Instant::now();
                c.commit(next).map_err(TurnError::Constraint)?;
                self.stats.constraint_time += t.elapsed();
                next
            }
        };
        self.sampler.accept(next);
        if let Some(n) = self.params.logprobs {
            self.stats.logprobs.push(token_logprob(logits, next, n));
        }
        Ok(next)
    }

    /// The first half of a speculative cycle:
    /// 1. the pending token `a` (sampled by the target, not yet fed; it goes
    ///    at position F = `pos`) is emitted;
    /// 2. the drafter proposes `d_1..d_K` after it;
    /// 3. the target is to run `[a, d_1..d_K]` at F..F+K in one pass, all
    ///    logits rows (a verify pass: each row as a one-token step would
    ///    compute it, where the backend can) — the feed this returns.
    fn begin_spec(
        &mut self,
        pos: usize,
        max_ctx: usize,
        drafter: &mut dyn Drafter,
        began: Instant,
        sink: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<Begin, TurnError> {
        let pending = match self.pending.take() {
            Some(t) => t,
            None => {
                let logits = self.logits.as_ref().expect("decode after prefill");
                let t = self.sampler.sample(logits);
                self.sampler.accept(t);
                t
            }
        };
        let finished = match self.emit(pending, sink) {
            Some(f) => Some(f),
            None => (pos >= max_ctx).then_some(FinishReason::Length),
        };
        if let Some(f) = finished {
            self.stats.decode_time += began.elapsed();
            return Ok(self.done(f, vec![], sink));
        }
        // A cycle commits up to K+1 tokens and writes K+1 positions.
        let remaining = self.params.max_tokens - self.stats.sampled;
        let k = self
            .params
            .n_draft
            .min(remaining.saturating_sub(1))
            .min(max_ctx - pos - 1);
        let draft = if k > 0 {
            let mut context = self.prompt.ids.clone();
            context.extend_from_slice(&self.stats.tokens);
            let mut d = drafter.propose(&context, k)?;
            d.tokens.truncate(k);
            d
        } else {
            Draft::default()
        };
        let draft_secs = began.elapsed().as_secs_f64();
        let mut block = Vec::with_capacity(draft.tokens.len() + 1);
        block.push(pending);
        block.extend_from_slice(&draft.tokens);
        Ok(Begin::Feed(Feed {
            what: Fed::Verify {
                block,
                draft,
                at: pos,
                draft_secs,
                verify_began: Instant::now(),
            },
            want: Logits::All,
            began,
        }))
    }

    /// The second half of a speculative cycle:
    /// 4. [`verify_block`] accepts a prefix `d_1..d_k` and picks the next
    ///    pending token (correction or bonus);
    /// 5. the state rolls back to F+k+1: the K−k rejected positions are stale
    ///    and overwritten by the next pass (flat caches hide them behind the
    ///    causal mask; rings keep `slack ≥ K` extra slots so nothing still
    ///    inside the window was overwritten, see `Backend::new_state`);
    /// 6. the accepted drafts are emitted.
    fn end_spec<S: BackendState + ?Sized>(
        &mut self,
        feed: Feed,
        scored: Scored,
        hidden: &[f32],
        state: &mut S,
        drafter: Option<&mut dyn Drafter>,
        sink: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<StepOut, TurnError> {
        let Fed::Verify {
            block,
            draft,
            at,
            draft_secs,
            verify_began,
        } = feed.what
        else {
            unreachable!("end_spec of a verify block")
        };
        let out = match scored {
            Scored::Argmax(ids) => verify_greedy_ids(&mut self.sampler, &ids, &draft.tokens),
            Scored::Logits(rows) => verify_block(
                &mut self.sampler,
                &rows,
                rows.len() / block.len(),
                &draft.tokens,
                draft.probs.as_deref(),
            ),
        };
        let kept = out.accepted + 1;
        state.rollback(at + kept)?;
        if let Some(d) = drafter {
            let width = hidden.len() / block.len();
            d.commit(&block[..kept], &hidden[..kept * width])?;
        }
        let spec = self.stats.spec.get_or_insert_with(SpecStats::default);
        spec.draft_secs += draft_secs;
        spec.verify_secs += verify_began.elapsed().as_secs_f64();
        spec.record(draft.tokens.len(), out.accepted);
        self.stats.decode_time += feed.began.elapsed();

        let fed = block[..kept].to_vec();
        for &d in &draft.tokens[..out.accepted] {
            if let Some(f) = self.emit(d, sink) {
                let out = StepOut {
                    fed,
                    finished: Some(f),
                };
                return Ok(self.conclude(out, sink));
            }
        }
        self.pending = Some(out.next);
        Ok(StepOut {
            fed,
            finished: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_of_the_raw_logits() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let want = |i: usize| ((logits[i] as f64).exp() / z).ln() as f32;
        let lp = token_logprob(&logits, 4, 3);
        assert_eq!(lp.token, 4);
        assert!((lp.logprob - want(4)).abs() < 1e-6);
        // Highest first, ties by lower id.
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 0]);
        for (id, l) in lp.top {
            assert!((l - want(id as usize)).abs() < 1e-6);
        }
        assert!(token_logprob(&logits, 2, 0).top.is_empty());
    }

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
