//! The engine thread: the only owner of the model and of every session's KV
//! state. It round-robins one step per active request (a prefill chunk or one
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
use hearth_engine::session::{Acquire, Lease, Resume, SessionStore};
use hearth_models::{Logits, Model};
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

/// Starts the engine thread.
pub fn spawn(
    model: Model,
    tokenizer: Arc<Tokenizer>,
    store: SessionStore,
    metrics: Arc<Metrics>,
) -> (EngineHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("hearth-engine".into())
        .spawn(move || {
            Engine {
                model: &model,
                tokenizer: &tokenizer,
                store,
                metrics,
                rx,
            }
            .run()
        })
        .expect("spawning the engine thread");
    (EngineHandle { tx }, thread)
}

struct Engine<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    store: SessionStore,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<Command>,
}

/// One admitted request.
struct Active<'t> {
    job: Job,
    lease: Lease,
    resume: Resume,
    sampler: Sampler,
    /// Next prompt index to prefill; `prompt.len()` once prefill is done.
    next: usize,
    /// The last forward pass's logits row, once prefill is done.
    logits: Option<Vec<f32>>,
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

impl<'a> Engine<'a> {
    fn run(mut self) {
        self.metrics
            .session_capacity
            .store(self.store.capacity() as u64, Ordering::Relaxed);
        let mut active: Vec<Active<'a>> = Vec::new();
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
    fn admit(&mut self, waiting: &mut Vec<Job>, active: &mut Vec<Active<'a>>) {
        let mut still = Vec::new();
        for job in waiting.drain(..) {
            if job.events.is_closed() {
                continue;
            }
            match self.store.acquire(self.model, job.session.as_deref()) {
                Ok(Acquire::Busy) => still.push(job),
                Err(e) => {
                    let _ = job
                        .events
                        .send(Event::Failed(ApiError::capacity(e.to_string())));
                }
                Ok(Acquire::Ready(mut lease)) => {
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

    /// One prefill chunk or one decode token.
    fn step(&self, a: &mut Active<'a>, slice: usize) -> Step {
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
            let out = match self.model.forward(&mut session.state, chunk, want) {
                Ok(l) => l,
                Err(e) => return Step::Failed(e.to_string()),
            };
            a.prefill_time += t.elapsed();
            session.push_fed(chunk);
            a.next = end;
            if want == Logits::Last {
                a.logits = Some(out);
            }
            return Step::Continue;
        };

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
        if a.generated >= a.job.max_tokens || session.state.pos >= session.state.max_ctx {
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

    fn finish(&mut self, mut a: Active<'a>, outcome: Step) {
        let prompt_tokens = a.job.prompt.len();
        let finish = match outcome {
            Step::Finished(f) => {
                if f != FinishReason::Stop {
                    let rest = a.stops.push(&a.decoder.finish()).0 + &a.stops.finish();
                    if !rest.is_empty() {
                        let _ = a.job.events.send(Event::Text(rest));
                    }
                }
                let _ = a.job.events.send(Event::Done(Summary {
                    finish: f,
                    prompt_tokens,
                    cached_tokens: a.resume.reused,
                    completion_tokens: a.generated,
                }));
                f.as_str()
            }
            Step::Cancelled => "cancelled",
            Step::Failed(e) => {
                // The state may be half-written: start this session over.
                a.lease.session.reset();
                let _ = a.job.events.send(Event::Failed(ApiError::server(e)));
                "error"
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
        self.store.release(a.lease);
    }
}
