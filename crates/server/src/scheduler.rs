//! The engine thread: the only owner of the model (any [`Backend`]: the CPU
//! model or the GPU one) and of every session's KV state. It round-robins one step per active request (a prefill chunk or one
//! decode token), so generations of different sessions interleave at token
//! granularity; a step is also the unit a batched backend would widen later.
//!
//! Requests talk to it through channels: a [`Job`] in, [`Event`]s out. A
//! request whose event receiver is gone (client disconnect) is stopped before
//! its next step, and its session keeps exactly the ids that were fed.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hearth_engine::generate::{FinishReason, StopMatcher};
use hearth_engine::sampler::{Sampler, SamplerConfig};
use hearth_engine::session::{Acquire, Lease, Resume, Session, SessionError, SessionStore};
use hearth_engine::spec::verify::verify_block;
use hearth_engine::spec::{Drafter, SpecStats};
use hearth_models::{Backend, BackendState, Logits};
use hearth_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::error::ApiError;
use crate::metrics::Metrics;

/// Prompt tokens prefilled per step while other requests are active (bounds
/// how long one long prompt stalls everyone else's decoding).
const PREFILL_SLICE: usize = 128;

pub struct Job {
    /// `None`: the scratch session.
    pub session: Option<String>,
    pub prompt: Vec<u32>,
    pub sampling: SamplerConfig,
    /// Already clamped to the context room.
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub events: tmpsc::UnboundedSender<Event>,
}

#[derive(Debug)]
pub enum Event {
    /// The request holds its session; prefill starts.
    Admitted {
        cached_tokens: usize,
    },
    /// Visible text (stop strings held back and cut).
    Text(String),
    Done(Summary),
    Failed(ApiError),
}

#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

enum Command {
    Submit(Job),
    Reset(String, oneshot::Sender<()>),
    Close(String, oneshot::Sender<()>),
    Shutdown,
}

/// The requests' side of the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
}

impl EngineHandle {
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.tx
            .send(Command::Submit(job))
            .map_err(|_| ApiError::unavailable("The engine has stopped."))
    }

    pub async fn reset(&self, id: String) -> Result<(), ApiError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Reset(id, tx))
            .map_err(|_| ApiError::unavailable("The engine has stopped."))?;
        rx.await
            .map_err(|_| ApiError::server("session reset did not complete"))
    }

    pub async fn close(&self, id: String) -> Result<(), ApiError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Close(id, tx))
            .map_err(|_| ApiError::unavailable("The engine has stopped."))?;
        rx.await
            .map_err(|_| ApiError::server("session close did not complete"))
    }

    /// Stops every request (they get an error event) and ends the thread.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// Builds a session's drafter: (context size, the request's sampling).
pub type MakeDrafter =
    Arc<dyn Fn(usize, &SamplerConfig) -> Result<Box<dyn Drafter + Send>, String> + Send + Sync>;

/// Speculative decoding for every session: the drafter kind (for metrics),
/// K, and how to build a session's drafter.
#[derive(Clone)]
pub struct SpecRuntime {
    pub kind: String,
    pub n_draft: usize,
    pub make: MakeDrafter,
}

/// Starts the engine thread.
pub fn spawn<B: Backend + 'static>(
    model: Arc<B>,
    tokenizer: Arc<Tokenizer>,
    store: SessionStore<B::State>,
    metrics: Arc<Metrics>,
    spec: Option<SpecRuntime>,
) -> (EngineHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("hearth-engine".into())
        .spawn(move || {
            Engine {
                model: &*model,
                tokenizer: &tokenizer,
                store,
                metrics,
                spec,
                rx,
            }
            .run()
        })
        .expect("spawning the engine thread");
    (EngineHandle { tx }, thread)
}

struct Engine<'a, B: Backend> {
    model: &'a B,
    tokenizer: &'a Tokenizer,
    store: SessionStore<B::State>,
    metrics: Arc<Metrics>,
    spec: Option<SpecRuntime>,
    rx: mpsc::Receiver<Command>,
}

/// One admitted request.
struct Active<'t, S> {
    job: Job,
    lease: Lease<S>,
    resume: Resume,
    sampler: Sampler,
    /// Next prompt index to prefill; `prompt.len()` once prefill is done.
    next: usize,
    /// The last forward pass's logits row, once prefill is done.
    logits: Option<Vec<f32>>,
    /// Speculation: the token sampled by the target and not yet fed.
    pending: Option<u32>,
    spec: SpecStats,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    generated: usize,
    prefill_time: Duration,
    decode_time: Duration,
}

enum Step {
    Continue,
    Finished(FinishReason),
    /// The client is gone.
    Cancelled,
    Failed(String),
}

impl<'a, B: Backend> Engine<'a, B> {
    fn run(mut self) {
        self.metrics
            .session_capacity
            .store(self.store.capacity() as u64, Ordering::Relaxed);
        let mut active: Vec<Active<'a, B::State>> = Vec::new();
        let mut waiting: Vec<Job> = Vec::new();
        loop {
            // Block only when there is nothing to step.
            let first = if active.is_empty() {
                let timeout = if waiting.is_empty() {
                    Duration::from_secs(3600)
                } else {
                    Duration::from_millis(5)
                };
                match self.rx.recv_timeout(timeout) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                None
            };
            let mut shutdown = false;
            for cmd in first
                .into_iter()
                .chain(std::iter::from_fn(|| self.rx.try_recv().ok()))
            {
                match cmd {
                    Command::Submit(job) => waiting.push(job),
                    Command::Reset(id, done) => {
                        self.store.reset(&id);
                        let _ = done.send(());
                    }
                    Command::Close(id, done) => {
                        self.store.close(&id);
                        let _ = done.send(());
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                for a in active.drain(..) {
                    let _ = a.job.events.send(Event::Failed(ApiError::unavailable(
                        "The server is shutting down.",
                    )));
                    self.store.release(a.lease);
                }
                for job in waiting.drain(..) {
                    let _ = job.events.send(Event::Failed(ApiError::unavailable(
                        "The server is shutting down.",
                    )));
                }
                break;
            }
            self.admit(&mut waiting, &mut active);

            // One round: one step per active request.
            let slice = if active.len() > 1 {
                PREFILL_SLICE
            } else {
                usize::MAX
            };
            let mut i = 0;
            while i < active.len() {
                match self.step(&mut active[i], slice) {
                    Step::Continue => i += 1,
                    outcome => {
                        let a = active.swap_remove(i);
                        self.finish(a, outcome);
                    }
                }
            }
            self.metrics
                .active_generations
                .store(active.len() as u64, Ordering::Relaxed);
            self.metrics
                .live_sessions
                .store(self.store.live() as u64, Ordering::Relaxed);
        }
    }

    /// Admits waiting jobs whose session is free, in arrival order.
    fn admit(&mut self, waiting: &mut Vec<Job>, active: &mut Vec<Active<'a, B::State>>) {
        let mut still = Vec::new();
        for job in waiting.drain(..) {
            if job.events.is_closed() {
                continue;
            }
            match self.store.acquire(self.model, job.session.as_deref()) {
                Ok(Acquire::Busy) => still.push(job),
                Err(e @ SessionError::CapacityExhausted { .. }) => {
                    let _ = job
                        .events
                        .send(Event::Failed(ApiError::capacity(e.to_string())));
                }
                Err(e) => {
                    let _ = job
                        .events
                        .send(Event::Failed(ApiError::server(e.to_string())));
                }
                Ok(Acquire::Ready(mut lease)) => {
                    if let Err(e) = self.attach_drafter(&mut lease, &job.sampling) {
                        let _ = job.events.send(Event::Failed(ApiError::server(e)));
                        self.store.release(lease);
                        continue;
                    }
                    let sampler = match Sampler::new(job.sampling) {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = job.events.send(Event::Failed(ApiError::invalid(
                                "invalid_value",
                                e.to_string(),
                            )));
                            self.store.release(lease);
                            continue;
                        }
                    };
                    let resume = lease.session.prepare(&job.prompt);
                    let _ = job.events.send(Event::Admitted {
                        cached_tokens: resume.reused,
                    });
                    active.push(Active {
                        lease,
                        resume,
                        sampler,
                        next: resume.reused,
                        logits: None,
                        pending: None,
                        spec: SpecStats::default(),
                        // Special tokens are rendered: tool-call and channel markers (Qwen's
                        // `<tool_call>`, Harmony's `<|channel|>`) are control tokens the
                        // output parser must see. End-of-generation tokens never reach it.
                        decoder: self.tokenizer.stream_decoder(true),
                        stops: StopMatcher::new(job.stop.clone()),
                        generated: 0,
                        prefill_time: Duration::ZERO,
                        decode_time: Duration::ZERO,
                        job,
                    });
                }
            }
        }
        self.metrics
            .session_evictions
            .store(self.store.evictions, Ordering::Relaxed);
        *waiting = still;
    }

    /// With speculation on: gives the session a drafter if it has none (a
    /// new session: nothing resident yet) and tells it the request's sampling.
    fn attach_drafter(
        &self,
        lease: &mut Lease<B::State>,
        sampling: &SamplerConfig,
    ) -> Result<(), String> {
        let Some(spec) = &self.spec else {
            return Ok(());
        };
        let session = &mut lease.session;
        if session.drafter.is_none() {
            // A drafter must have seen every resident position.
            session.reset();
            session.drafter = Some((spec.make)(session.state.max_ctx(), sampling)?);
        }
        let drafter = session.drafter.as_mut().expect("attached above");
        drafter.set_sampling(sampling).map_err(|e| e.to_string())
    }

    /// Emits one generated token: end of generation, text, stop strings and
    /// the token budget. `Some` ends the request.
    fn emit(&self, a: &mut Active<'a, B::State>, token: u32) -> Option<Step> {
        a.generated += 1;
        if self.tokenizer.is_eog(token) {
            return Some(Step::Finished(FinishReason::Stop));
        }
        let (text, hit) = a.stops.push(&a.decoder.push(token));
        if !text.is_empty() && a.job.events.send(Event::Text(text)).is_err() {
            return Some(Step::Cancelled);
        }
        if hit {
            return Some(Step::Finished(FinishReason::Stop));
        }
        if a.generated >= a.job.max_tokens {
            return Some(Step::Finished(FinishReason::Length));
        }
        None
    }

    /// One speculative cycle (spec::generate has the same loop for `run`):
    /// emit the pending token, draft K, verify `[pending, drafts]` in one
    /// pass, roll the state back to what was accepted, emit the accepted drafts.
    fn step_spec(&self, a: &mut Active<'a, B::State>, n_draft: usize) -> Step {
        let pending = match a.pending.take() {
            Some(t) => t,
            None => {
                let logits = a.logits.as_ref().expect("decode after prefill");
                let t = a.sampler.sample(logits);
                a.sampler.accept(t);
                t
            }
        };
        if let Some(step) = self.emit(a, pending) {
            return step;
        }
        let session = &mut a.lease.session;
        let (pos, max_ctx) = (session.state.pos(), session.state.max_ctx());
        if pos >= max_ctx {
            return Step::Finished(FinishReason::Length);
        }
        let t = Instant::now();
        let k = n_draft
            .min((a.job.max_tokens - a.generated).saturating_sub(1))
            .min(max_ctx - pos - 1);
        // The drafter is taken out of the session for the cycle and put back.
        let Some(mut drafter) = session.drafter.take() else {
            return Step::Failed("speculation without a drafter".into());
        };
        let cycle = self.cycle(session, drafter.as_mut(), &mut a.sampler, pending, k);
        session.drafter = Some(drafter);
        let (draft, out) = match cycle {
            Ok(c) => c,
            Err(e) => return Step::Failed(e),
        };
        a.decode_time += t.elapsed();
        a.spec.record(draft.tokens.len(), out.accepted);
        for &d in &draft.tokens[..out.accepted] {
            if let Some(step) = self.emit(a, d) {
                return step;
            }
        }
        a.pending = Some(out.next);
        Step::Continue
    }

    /// Draft up to `k` tokens after `pending`, verify them with the target in
    /// one pass, roll back to what was kept and record it in the session.
    fn cycle(
        &self,
        session: &mut Session<B::State>,
        drafter: &mut dyn Drafter,
        sampler: &mut Sampler,
        pending: u32,
        k: usize,
    ) -> Result<
        (
            hearth_engine::spec::Draft,
            hearth_engine::spec::verify::BlockOutcome,
        ),
        String,
    > {
        let draft = if k > 0 {
            let mut context = session.resident().to_vec();
            context.push(pending);
            let mut d = drafter.propose(&context, k).map_err(|e| e.to_string())?;
            d.tokens.truncate(k);
            d
        } else {
            Default::default()
        };
        let taps = drafter.taps().to_vec();
        let width = taps.len() * self.model.config().dim;
        let mut block = vec![pending];
        block.extend_from_slice(&draft.tokens);
        let mut hidden = Vec::new();
        let pos = session.state.pos();
        let rows = self
            .model
            .forward_verify(&mut session.state, &block, Logits::All, &taps, &mut hidden)
            .map_err(|e| e.to_string())?;
        let vocab = self.model.config().vocab_size;
        let out = verify_block(sampler, &rows, vocab, &draft.tokens, draft.probs.as_deref());
        let kept = out.accepted + 1;
        session
            .state
            .rollback(pos + kept)
            .map_err(|e| e.to_string())?;
        session.push_fed(&block[..kept]);
        drafter
            .commit(&block[..kept], &hidden[..kept * width])
            .map_err(|e| e.to_string())?;
        Ok((draft, out))
    }

    /// One prefill chunk or one decode token (or speculative cycle).
    fn step(&self, a: &mut Active<'a, B::State>, slice: usize) -> Step {
        if a.job.events.is_closed() {
            return Step::Cancelled;
        }
        let session = &mut a.lease.session;
        let Some(logits) = a.logits.as_ref() else {
            let end = a.job.prompt.len().min(a.next.saturating_add(slice));
            let chunk = &a.job.prompt[a.next..end];
            let want = if end == a.job.prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            let t = Instant::now();
            let taps = session
                .drafter
                .as_ref()
                .map(|d| d.taps().to_vec())
                .unwrap_or_default();
            let mut hidden = Vec::new();
            let out =
                match self
                    .model
                    .forward_tapped(&mut session.state, chunk, want, &taps, &mut hidden)
                {
                    Ok(l) => l,
                    Err(e) => return Step::Failed(e.to_string()),
                };
            if let Some(d) = session.drafter.as_mut() {
                if let Err(e) = d.commit(chunk, &hidden) {
                    return Step::Failed(e.to_string());
                }
            }
            a.prefill_time += t.elapsed();
            session.push_fed(chunk);
            a.next = end;
            if want == Logits::Last {
                a.logits = Some(out);
            }
            return Step::Continue;
        };

        if let Some(spec) = &self.spec {
            return self.step_spec(a, spec.n_draft);
        }
        let next = a.sampler.sample(logits);
        a.sampler.accept(next);
        a.generated += 1;
        if self.tokenizer.is_eog(next) {
            return Step::Finished(FinishReason::Stop);
        }
        let (text, hit) = a.stops.push(&a.decoder.push(next));
        if !text.is_empty() && a.job.events.send(Event::Text(text)).is_err() {
            return Step::Cancelled;
        }
        if hit {
            return Step::Finished(FinishReason::Stop);
        }
        if a.generated >= a.job.max_tokens || session.state.pos() >= session.state.max_ctx() {
            return Step::Finished(FinishReason::Length);
        }
        let t = Instant::now();
        match self
            .model
            .forward(&mut session.state, &[next], Logits::Last)
        {
            Ok(l) => a.logits = Some(l),
            Err(e) => return Step::Failed(e.to_string()),
        }
        a.decode_time += t.elapsed();
        session.push_fed(&[next]);
        Step::Continue
    }

    fn finish(&mut self, mut a: Active<'a, B::State>, outcome: Step) {
        let prompt_tokens = a.job.prompt.len();
        // The turn's last event goes out after its stats line is logged, so a
        // client that has its response finds the turn in the log.
        let (finish, last) = match outcome {
            Step::Finished(f) => {
                if f != FinishReason::Stop {
                    let rest = a.stops.push(&a.decoder.finish()).0 + &a.stops.finish();
                    if !rest.is_empty() {
                        let _ = a.job.events.send(Event::Text(rest));
                    }
                }
                let done = Event::Done(Summary {
                    finish: f,
                    prompt_tokens,
                    cached_tokens: a.resume.reused,
                    completion_tokens: a.generated,
                });
                (f.as_str(), Some(done))
            }
            Step::Cancelled => ("cancelled", None),
            Step::Failed(e) => {
                // The state may be half-written: start this session over.
                a.lease.session.reset();
                ("error", Some(Event::Failed(ApiError::server(e))))
            }
            Step::Continue => unreachable!("finish of a running request"),
        };
        let prefilled = prompt_tokens - a.resume.reused;
        let decoded = a.generated.saturating_sub(1) as u64;
        let m = &self.metrics;
        m.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        m.completion_tokens
            .fetch_add(a.generated as u64, Ordering::Relaxed);
        m.reused_prompt_tokens
            .fetch_add(a.resume.reused as u64, Ordering::Relaxed);
        m.prefill_tokens
            .fetch_add(prefilled as u64, Ordering::Relaxed);
        m.prefill_us
            .fetch_add(a.prefill_time.as_micros() as u64, Ordering::Relaxed);
        m.decode_tokens.fetch_add(decoded, Ordering::Relaxed);
        m.decode_us
            .fetch_add(a.decode_time.as_micros() as u64, Ordering::Relaxed);
        if self.spec.is_some() {
            m.record_spec(&a.spec);
        }
        eprintln!(
            "llm_turn_stats session_id={} reason={} prompt_tokens={} reused_prompt_tokens={} prefilled_prompt_tokens={} completion_tokens={} prefill_ms={:.0} decode_tok_s={:.1} finish={}",
            a.lease.id.as_deref().unwrap_or("<scratch>"),
            a.resume.reason.as_str(),
            prompt_tokens,
            a.resume.reused,
            prefilled,
            a.generated,
            a.prefill_time.as_secs_f64() * 1e3,
            decoded as f64 / a.decode_time.as_secs_f64().max(1e-9),
            finish
        );
        if let Some(event) = last {
            let _ = a.job.events.send(event);
        }
        self.store.release(a.lease);
    }
}
