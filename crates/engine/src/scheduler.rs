//! The scheduler: one thread that owns the model (any [`Backend`]) and every
//! session's KV state, admits requests to their sessions and round-robins
//! one step of each active turn (a prefill chunk, a decode token or a
//! speculative cycle; [`crate::turn::Turn`]), so generations of different
//! sessions interleave at token granularity.
//!
//! Requests talk to it through a channel: a [`Job`] in, [`Event`]s out
//! through the job's [`EventSink`]. A request whose consumer is gone (a
//! client disconnect) is stopped before its next step, and its session keeps
//! exactly the ids that were fed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hearth_models::{Backend, BackendState, BatchItem};
use hearth_tokenizer::Tokenizer;

use crate::prompt::Prompt;
use crate::sampler::{Sampler, SamplerConfig};
use crate::session::{Acquire, Lease, SessionError, SessionStore, StoreError};
use crate::spec::factory::MakeDrafter;
use crate::spec::{Drafter, SpecStats};
use crate::turn::{
    Begin, Feed, FinishReason, Flow, Scored, StepOut, TokenConstraint, TokenLogprob, Turn,
    TurnParams, TurnStats,
};

/// Prompt tokens prefilled per step while other requests are active (bounds
/// how long one long prompt stalls everyone else's decoding).
const PREFILL_SLICE: usize = 128;
/// Prompt tokens per step when the request runs alone: the forward pass's own
/// chunk (so the numerics are those of one whole-prompt pass), and the most
/// a client that disconnects during its prefill still costs.
const SOLO_PREFILL_SLICE: usize = hearth_models::MAX_CHUNK;

/// The engine thread's stack (only what is touched is ever resident).
pub const ENGINE_STACK_BYTES: usize = 64 << 20;

/// Where a request's events go (the server's channel to its HTTP response).
pub trait EventSink: Send {
    /// Delivers an event; false when the consumer is gone.
    fn send(&self, event: Event) -> bool;
    /// Whether the consumer is gone.
    fn is_closed(&self) -> bool;
}

pub struct Job {
    /// `None`: the scratch session.
    pub session: Option<String>,
    /// Token ids, with encoded images placed among them.
    pub prompt: Prompt,
    pub sampling: SamplerConfig,
    /// Already clamped to the context room.
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Keep generating through end-of-generation tokens (to `max_tokens`).
    pub ignore_eos: bool,
    /// Structured output: the grammar the tokens must follow.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Report each token's logprob and this many alternatives.
    pub logprobs: Option<usize>,
    /// Prefix sharing happens only between sessions of the same salt.
    pub cache_salt: Option<String>,
    /// Send [`Event::Progress`] after each prefill chunk.
    pub progress: bool,
    /// Tokens that end the answer as end-of-generation tokens do (a chat
    /// template's turn opener; [`Turn::ending_on`]).
    pub end_tokens: Vec<u32>,
    pub events: Box<dyn EventSink>,
}

/// How far a prompt's prefill has come (llama-server's `prompt_progress`).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// The prompt's tokens.
    pub total: usize,
    /// Of those, reused from the KV cache (not prefilled).
    pub cache: usize,
    /// In the state so far, the reused ones included.
    pub processed: usize,
    /// Prefill time so far.
    pub time: Duration,
}

#[derive(Debug)]
pub enum Event {
    /// The request holds its session; prefill starts.
    Admitted {
        cached_tokens: usize,
    },
    /// Visible text (stop strings held back and cut).
    Text(String),
    /// Logprobs of the tokens generated since the last such event (only when
    /// the job asked for them), sent after the step's text.
    Logprobs(Vec<TokenLogprob>),
    /// A prefill chunk is done (only when the job asked, [`Job::progress`]).
    Progress(Progress),
    Done(Summary),
    Failed(SchedulerError),
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The stop string (of the job's `stop`) that ended the turn, if one did.
    pub stop_sequence: Option<String>,
    /// Prompt tokens prefilled (not reused) and the time they took.
    pub prefilled_tokens: usize,
    pub prefill_time: std::time::Duration,
    /// Tokens decoded after the first and the time they took.
    pub decoded_tokens: usize,
    pub decode_time: std::time::Duration,
}

/// Why the scheduler could not serve a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// The scheduler has stopped or is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// Every session state is busy generating.
    #[error("{0}")]
    Capacity(String),
    /// The request's sampling settings are invalid.
    #[error("{0}")]
    InvalidSampling(String),
    /// The request's output constraint failed during generation (its
    /// grammar reached a limit of the constraint engine, or allows no
    /// token): the request's own doing, not the server's.
    #[error("{0}")]
    Constraint(String),
    /// A model or drafter failure while serving.
    #[error("{0}")]
    Failed(String),
    /// A panic while serving this request, caught: the other requests and
    /// sessions carry on.
    #[error("{0}")]
    Internal(String),
}

/// Why a turn ended before its finish.
#[derive(Debug)]
enum Failure {
    Constraint(String),
    Model(String),
    Panic(String),
}

impl From<crate::turn::TurnError> for Failure {
    fn from(e: crate::turn::TurnError) -> Failure {
        match e {
            crate::turn::TurnError::Constraint(_) => Failure::Constraint(e.to_string()),
            e => Failure::Model(e.to_string()),
        }
    }
}

impl From<Failure> for SchedulerError {
    fn from(f: Failure) -> SchedulerError {
        match f {
            Failure::Constraint(m) => SchedulerError::Constraint(m),
            Failure::Model(m) => SchedulerError::Failed(m),
            Failure::Panic(m) => SchedulerError::Internal(m),
        }
    }
}

/// The text of a caught panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// Runs `f`, turning a panic into this request's failure: the engine
/// thread, the other requests and their sessions carry on (the failed
/// request's session starts over, [`Scheduler::finish`]).
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Failure::Panic(format!("{what}: {}", panic_message(&*p)))),
    }
}

/// Counters the scheduler keeps for `/metrics`.
#[derive(Default)]
pub struct SchedulerStats {
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Prompt tokens served from a session's resident KV.
    pub reused_prompt_tokens: AtomicU64,
    /// Tokens prefilled and the time spent (µs).
    pub prefill_tokens: AtomicU64,
    pub prefill_us: AtomicU64,
    /// Tokens from decode steps after the first and the time spent (µs).
    pub decode_tokens: AtomicU64,
    pub decode_us: AtomicU64,
    pub live_sessions: AtomicU64,
    pub active_generations: AtomicU64,
    /// Requests waiting for their session (or for room) to start.
    pub waiting_requests: AtomicU64,
    /// Positions held in every session's KV, idle and generating.
    pub kv_tokens: AtomicU64,
    /// Positions the KV states could hold: states x context.
    pub kv_capacity_tokens: AtomicU64,
    pub session_evictions: AtomicU64,
    /// Evicted sessions kept on disk (`--session-dir`) and brought back.
    pub session_spills: AtomicU64,
    pub session_unspills: AtomicU64,
    pub session_capacity: AtomicU64,
    /// Requests stopped because their client went away, and the prompt
    /// tokens that were therefore never prefilled.
    pub cancelled_requests: AtomicU64,
    pub cancelled_prefill_tokens: AtomicU64,
    /// Batched forward passes, the sessions and the rows they carried.
    pub forward_passes: AtomicU64,
    pub forward_pass_sequences: AtomicU64,
    pub forward_pass_rows: AtomicU64,
    /// Prompt tokens a new turn copied from another session's KV.
    pub shared_prefix_tokens: AtomicU64,
    /// Speculative decoding: the drafters' settings when on, and the
    /// acceptance statistics of finished requests.
    pub spec_config: Mutex<Option<SpecInfo>>,
    pub spec: Mutex<SpecStats>,
}

/// What a server's drafters are (for `/metrics`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecInfo {
    pub kind: String,
    /// K: the most draft tokens per verify pass.
    pub n_draft: usize,
    /// Whether the length per cycle adapts to acceptance (up to K).
    pub adaptive: bool,
}

/// Streams a turn's text to its request; `Stop` once the consumer is gone.
fn text_sink(events: &dyn EventSink) -> impl FnMut(&str) -> Flow + '_ {
    move |t: &str| {
        if events.send(Event::Text(t.to_string())) {
            Flow::Continue
        } else {
            Flow::Stop
        }
    }
}

/// A session's drafter as the turn machine takes it.
fn as_drafter(d: &mut Option<Box<dyn Drafter + Send>>) -> Option<&mut dyn Drafter> {
    d.as_deref_mut().map(|d| d as &mut dyn Drafter)
}

/// Runs once a reset or close is applied: true when the session existed.
type Done = Box<dyn FnOnce(bool) + Send>;
/// A saved session: its resident ids and state bytes.
pub use crate::session::SavedSession;
type SaveDone = Box<dyn FnOnce(Result<SavedSession, StoreError>) + Send>;
type RestoreDone = Box<dyn FnOnce(Result<usize, StoreError>) + Send>;
/// Runs once every session is freed: how many were.
type ClearDone = Box<dyn FnOnce(usize) + Send>;

enum Command {
    Submit(Job),
    Reset(String, Done),
    Close(String, Done),
    Save(String, SaveDone),
    Restore(String, SavedSession, RestoreDone),
    Clear(ClearDone),
    Shutdown,
}

/// The requests' side of the scheduler thread.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Command>,
}

fn stopped() -> SchedulerError {
    SchedulerError::Unavailable("The engine has stopped.".into())
}

impl SchedulerHandle {
    pub fn submit(&self, job: Job) -> Result<(), SchedulerError> {
        self.tx.send(Command::Submit(job)).map_err(|_| stopped())
    }

    /// Clears session `id`'s context (deferred while it generates); `done`
    /// runs once it is applied, with false when there is no such session.
    pub fn reset(
        &self,
        id: String,
        done: impl FnOnce(bool) + Send + 'static,
    ) -> Result<(), SchedulerError> {
        self.tx
            .send(Command::Reset(id, Box::new(done)))
            .map_err(|_| stopped())
    }

    /// Frees session `id` (deferred while it generates); `done` runs once it
    /// is applied, with false when there is no such session.
    pub fn close(
        &self,
        id: String,
        done: impl FnOnce(bool) + Send + 'static,
    ) -> Result<(), SchedulerError> {
        self.tx
            .send(Command::Close(id, Box::new(done)))
            .map_err(|_| stopped())
    }

    /// Session `id`'s ids and state (idle sessions only), to `done`.
    pub fn save(
        &self,
        id: String,
        done: impl FnOnce(Result<SavedSession, StoreError>) + Send + 'static,
    ) -> Result<(), SchedulerError> {
        self.tx
            .send(Command::Save(id, Box::new(done)))
            .map_err(|_| stopped())
    }

    /// Creates or replaces session `id` from a saved one.
    pub fn restore(
        &self,
        id: String,
        saved: SavedSession,
        done: impl FnOnce(Result<usize, StoreError>) + Send + 'static,
    ) -> Result<(), SchedulerError> {
        self.tx
            .send(Command::Restore(id, saved, Box::new(done)))
            .map_err(|_| stopped())
    }

    /// Stops every request (they get an error event) and ends the thread.
    /// Frees every session ([`SessionStore::clear`]).
    pub fn clear(&self, done: impl FnOnce(usize) + Send + 'static) -> Result<(), SchedulerError> {
        self.tx
            .send(Command::Clear(Box::new(done)))
            .map_err(|_| stopped())
    }

    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// How the scheduler runs its sessions.
#[derive(Clone, Default)]
pub struct SchedulerConfig {
    /// With drafters every session speculates (its rings need
    /// `drafters.n_draft()` slots of slack: see
    /// [`SessionStore::set_ring_slack`]). Speculating sessions step on
    /// their own, outside the batched pass.
    pub drafters: Option<Arc<dyn MakeDrafter>>,
    /// Batch-invariant numerics: every session's output is what it would be
    /// if it ran alone, whatever else runs. Decode tokens of several
    /// sessions still share one pass (each row computed as a one-row pass
    /// computes it); prefill chunks run in passes of their own. Off, a
    /// step's decode tokens and prefill chunks all share one pass and a row
    /// may round differently than it would alone.
    pub batch_invariant: bool,
}

/// Starts the scheduler thread.
pub fn spawn<B: Backend + 'static>(
    model: Arc<B>,
    tokenizer: Arc<Tokenizer>,
    store: SessionStore<B::State>,
    stats: Arc<SchedulerStats>,
    config: SchedulerConfig,
) -> (SchedulerHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("hearth-engine".into())
        // Output constraints compile (lazy tool-call grammars) and match
        // here; llguidance recurses over a grammar's structure.
        .stack_size(ENGINE_STACK_BYTES)
        .spawn(move || {
            Scheduler {
                model: &*model,
                tokenizer: &tokenizer,
                store,
                stats,
                drafters: config.drafters,
                batch_invariant: config.batch_invariant,
                rx,
            }
            .run()
        })
        .expect("spawning the engine thread");
    (SchedulerHandle { tx }, thread)
}

struct Scheduler<'a, B: Backend> {
    model: &'a B,
    tokenizer: &'a Tokenizer,
    store: SessionStore<B::State>,
    stats: Arc<SchedulerStats>,
    drafters: Option<Arc<dyn MakeDrafter>>,
    batch_invariant: bool,
    rx: mpsc::Receiver<Command>,
}

/// What [`Scheduler::start`] takes of a [`Job`].
struct Start {
    prompt: Prompt,
    sampling: SamplerConfig,
    max_tokens: usize,
    stop: Vec<String>,
    ignore_eos: bool,
    constraint: Option<Box<dyn TokenConstraint>>,
    logprobs: Option<usize>,
    cache_salt: Option<String>,
    end_tokens: Vec<u32>,
}

/// One admitted request: its session and its turn.
struct Active<'t, S> {
    events: Box<dyn EventSink>,
    progress: bool,
    /// Logprob entries already sent.
    logprobs_sent: usize,
    lease: Lease<S>,
    resume_reason: &'static str,
    turn: Turn<'t>,
}

impl<'a, B: Backend> Scheduler<'a, B> {
    fn run(mut self) {
        self.stats
            .session_capacity
            .store(self.store.capacity() as u64, Ordering::Relaxed);
        self.stats.kv_capacity_tokens.store(
            (self.store.capacity() * self.store.max_ctx()) as u64,
            Ordering::Relaxed,
        );
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
                    Command::Reset(id, done) => done(self.store.reset(&id)),
                    Command::Close(id, done) => done(self.store.close(&id)),
                    Command::Save(id, done) => {
                        done(self.store.save(self.model, &id));
                        self.publish_store_counts();
                    }
                    Command::Restore(id, saved, done) => {
                        done(self.store.restore(self.model, &id, saved));
                        self.publish_store_counts();
                    }
                    Command::Clear(done) => {
                        done(self.store.clear());
                        self.publish_store_counts();
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                let bye = || {
                    Event::Failed(SchedulerError::Unavailable(
                        "The server is shutting down.".into(),
                    ))
                };
                for a in active.drain(..) {
                    a.events.send(bye());
                    self.store.release(a.lease);
                }
                for job in waiting.drain(..) {
                    job.events.send(bye());
                }
                break;
            }
            self.admit(&mut waiting, &mut active);

            // One round: one step per active request.
            let slice = if active.len() > 1 {
                PREFILL_SLICE
            } else {
                SOLO_PREFILL_SLICE
            };
            let outcomes = self.round(&mut active, slice);
            for (i, outcome) in outcomes.into_iter().enumerate().rev() {
                match outcome {
                    Ok(false) => {}
                    outcome => {
                        let a = active.swap_remove(i);
                        self.finish(a, outcome.err());
                    }
                }
            }
            self.stats
                .active_generations
                .store(active.len() as u64, Ordering::Relaxed);
            self.stats
                .waiting_requests
                .store(waiting.len() as u64, Ordering::Relaxed);
            let busy: usize = active
                .iter()
                .map(|a| a.lease.session.resident().len())
                .sum();
            self.stats
                .kv_tokens
                .store((self.store.idle_tokens() + busy) as u64, Ordering::Relaxed);
            self.stats
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
            let acquired = match job.session.as_deref() {
                Some(id) => self.store.acquire(self.model, Some(id)),
                None => {
                    self.store
                        .acquire_anonymous(self.model, &job.prompt, job.cache_salt.as_deref())
                }
            };
            match acquired {
                Ok(Acquire::Busy) => still.push(job),
                Err(e @ SessionError::CapacityExhausted { .. }) => {
                    job.events
                        .send(Event::Failed(SchedulerError::Capacity(e.to_string())));
                }
                Err(e) => {
                    job.events
                        .send(Event::Failed(SchedulerError::Failed(e.to_string())));
                }
                Ok(Acquire::Ready(mut lease)) => {
                    let Job {
                        prompt,
                        sampling,
                        max_tokens,
                        stop,
                        ignore_eos,
                        constraint,
                        logprobs,
                        cache_salt,
                        progress,
                        end_tokens,
                        events,
                        ..
                    } = job;
                    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.start(
                            &mut lease,
                            Start {
                                prompt,
                                sampling,
                                max_tokens,
                                stop,
                                ignore_eos,
                                constraint,
                                logprobs,
                                cache_salt,
                                end_tokens,
                            },
                            &*events,
                        )
                    }))
                    .unwrap_or_else(|p| {
                        // A half-prepared session starts over.
                        lease.session.reset();
                        let m = format!("starting the turn: {}", panic_message(&*p));
                        eprintln!("{m}");
                        Err(SchedulerError::Internal(m))
                    });
                    match started {
                        Ok((turn, resume_reason)) => active.push(Active {
                            events,
                            progress,
                            logprobs_sent: 0,
                            lease,
                            resume_reason,
                            turn,
                        }),
                        Err(e) => {
                            events.send(Event::Failed(e));
                            self.store.release(lease);
                        }
                    }
                }
            }
        }
        self.publish_store_counts();
        *waiting = still;
    }

    /// A leased session's turn for a job: the drafter and sampler, the
    /// shared prefix, the prompt's resume point; sends `Admitted`.
    fn start(
        &self,
        lease: &mut Lease<B::State>,
        job: Start,
        events: &dyn EventSink,
    ) -> Result<(Turn<'a>, &'static str), SchedulerError> {
        self.attach_drafter(lease, &job.sampling)
            .map_err(SchedulerError::Failed)?;
        let sampler = Sampler::new(job.sampling)
            .map_err(|e| SchedulerError::InvalidSampling(e.to_string()))?;
        let shared = match lease.id {
            Some(_) => {
                self.store
                    .share_prefix(&mut lease.session, &job.prompt, job.cache_salt.as_deref())
            }
            None => None,
        };
        lease.session.cache_salt = job.cache_salt.clone();
        let mut resume = lease.session.prepare_prompt(&job.prompt);
        if let Some(n) = shared {
            self.stats
                .shared_prefix_tokens
                .fetch_add(n as u64, Ordering::Relaxed);
            resume.reason = crate::session::ResumeReason::SharedPrefix;
        }
        events.send(Event::Admitted {
            cached_tokens: resume.reused,
        });
        let params = TurnParams {
            max_tokens: job.max_tokens,
            stop: job.stop,
            ignore_eos: job.ignore_eos,
            n_draft: self.drafters.as_ref().map_or(0, |d| d.n_draft()),
            // Special tokens are rendered: tool-call and channel markers (Qwen's
            // `<tool_call>`, Harmony's `<|channel|>`) are control tokens the
            // output parser must see. End-of-generation tokens never reach it.
            render_special: true,
            logprobs: job.logprobs,
        };
        let mut turn = Turn::new(self.tokenizer, job.prompt, resume.reused, sampler, params)
            .ending_on(job.end_tokens);
        if let Some(c) = job.constraint {
            turn = turn.constrained(c);
        }
        Ok((turn, resume.reason.as_str()))
    }

    fn publish_store_counts(&self) {
        let s = &self.stats;
        s.session_evictions
            .store(self.store.evictions, Ordering::Relaxed);
        s.session_spills
            .store(self.store.spilled, Ordering::Relaxed);
        s.session_unspills
            .store(self.store.unspilled, Ordering::Relaxed);
    }

    /// With speculation on: gives the session a drafter if it has none (a
    /// new session: nothing resident yet) and tells it the request's sampling.
    fn attach_drafter(
        &self,
        lease: &mut Lease<B::State>,
        sampling: &SamplerConfig,
    ) -> Result<(), String> {
        let Some(drafters) = &self.drafters else {
            return Ok(());
        };
        let session = &mut lease.session;
        if session.drafter.is_none() {
            // A drafter must have seen every resident position.
            session.reset();
            session.drafter = Some(
                drafters
                    .make(session.state.max_ctx(), sampling)
                    .map_err(|e| e.to_string())?,
            );
        }
        let drafter = session.drafter.as_mut().expect("attached above");
        drafter.set_sampling(sampling).map_err(|e| e.to_string())
    }

    /// One step of every active turn; per turn, `Ok(true)` when it has
    /// ended. The turns' forward passes — prefill chunks, decode tokens and,
    /// on a backend that batches them ([`Backend::batches_verify`]),
    /// speculative verify blocks — are gathered into batched passes
    /// ([`Backend::forward_batch`]); on other backends a speculating turn
    /// steps on its own. See [`Scheduler::batches`] for which rows share a
    /// pass.
    fn round(
        &self,
        active: &mut [Active<'a, B::State>],
        slice: usize,
    ) -> Vec<Result<bool, Failure>> {
        let mut outcomes: Vec<Result<bool, Failure>> = Vec::with_capacity(active.len());
        let mut feeds: Vec<Option<Feed>> = Vec::with_capacity(active.len());
        let verify_batched = self.model.batches_verify();
        for a in active.iter_mut() {
            let mut feed = None;
            let outcome = if a.events.is_closed() {
                a.turn.cancel();
                Ok(true)
            } else if a.lease.session.drafter.is_some() && !verify_batched {
                guarded("stepping the turn", || self.solo_step(a, slice))
            } else {
                guarded("stepping the turn", || {
                    let Active {
                        turn,
                        lease,
                        events,
                        ..
                    } = &mut *a;
                    let session = &mut lease.session;
                    let (pos, max_ctx) = (session.state.pos(), session.state.max_ctx());
                    let drafter = as_drafter(&mut session.drafter);
                    let begun =
                        turn.begin_step(pos, max_ctx, slice, drafter, &mut text_sink(&**events))?;
                    Ok(match begun {
                        Begin::Feed(f) => {
                            feed = Some(f);
                            false
                        }
                        Begin::Done(out) => self.after_step(a, out, false),
                    })
                })
            };
            outcomes.push(outcome);
            feeds.push(feed);
        }
        let dim = self.model.config().dim;
        for (batch, invariant) in self.batches(&feeds) {
            // In index order; each member's taps copied out (its drafter is
            // borrowed again after the pass).
            let members: Vec<usize> = (0..active.len()).filter(|i| batch.contains(i)).collect();
            let taps: Vec<Vec<usize>> = members
                .iter()
                .map(|&i| {
                    let drafter = active[i].lease.session.drafter.as_ref();
                    drafter.map(|d| d.taps().to_vec()).unwrap_or_default()
                })
                .collect();
            let mut items: Vec<BatchItem<'_, B::State>> = Vec::with_capacity(members.len());
            let fed = active
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| batch.contains(i));
            for ((i, a), taps) in fed.zip(&taps) {
                let feed = feeds[i].as_ref().expect("a fed member");
                let Active { turn, lease, .. } = a;
                let input = turn.feed_input(feed, dim);
                items.push(BatchItem::new(&mut lease.session.state, input, feed.want).tapped(taps));
            }
            let rows: usize = items.iter().map(|it| it.input.len(dim)).sum();
            // A panic in the pass fails every member (their states may be
            // half-written; each starts over), not the engine.
            let results: Vec<Result<_, Failure>> =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.model.forward_batch(&mut items, invariant)
                })) {
                    Ok(r) => r
                        .into_iter()
                        .map(|r| r.map_err(|e| Failure::Model(e.to_string())))
                        .collect(),
                    Err(p) => {
                        let m = format!("in a forward pass: {}", panic_message(&*p));
                        (0..members.len())
                            .map(|_| Err(Failure::Panic(m.clone())))
                            .collect()
                    }
                };
            let hidden: Vec<Vec<f32>> = items
                .iter_mut()
                .map(|it| std::mem::take(&mut it.hidden))
                .collect();
            drop(items);
            let m = &self.stats;
            m.forward_passes.fetch_add(1, Ordering::Relaxed);
            m.forward_pass_sequences
                .fetch_add(members.len() as u64, Ordering::Relaxed);
            m.forward_pass_rows
                .fetch_add(rows as u64, Ordering::Relaxed);
            for ((i, result), hidden) in members.into_iter().zip(results).zip(hidden) {
                let feed = feeds[i].take().expect("a fed member");
                let a = &mut active[i];
                outcomes[i] = match result {
                    Ok(logits) => guarded("ending the step", || {
                        let was_prefilling = a.turn.prefilling();
                        let Active {
                            turn,
                            lease,
                            events,
                            ..
                        } = &mut *a;
                        let session = &mut lease.session;
                        let drafter = as_drafter(&mut session.drafter);
                        let out = turn.end_step(
                            feed,
                            Scored::Logits(logits),
                            &hidden,
                            &mut session.state,
                            drafter,
                            &mut text_sink(&**events),
                        )?;
                        Ok(self.after_step(a, out, was_prefilling))
                    }),
                    Err(e) => Err(e),
                };
            }
        }
        outcomes
    }

    /// The passes a round's feeds go in (indices into `feeds`), each with
    /// whether it runs batch-invariant:
    /// - decode tokens and verify blocks share passes; those passes are
    ///   invariant with `--batch-invariant` or when a verify block is among
    ///   them (speculation's output is the target's own: every verify row
    ///   as a one-token step computes it);
    /// - prefill chunks: with `--batch-invariant` each in its own invariant
    ///   pass; otherwise packed with the decode tokens (no verify blocks
    ///   in the round) or among themselves, in ordinary passes.
    ///
    /// A pass holds at most [`hearth_models::MAX_CHUNK`] rows (a single
    /// feed may hold more).
    fn batches(&self, feeds: &[Option<Feed>]) -> Vec<(Vec<usize>, bool)> {
        let fed = || {
            feeds
                .iter()
                .enumerate()
                .filter_map(|(i, f)| Some((i, f.as_ref()?)))
        };
        let pack = |feeds: &mut dyn Iterator<Item = (usize, &Feed)>, invariant: bool| {
            let mut batches: Vec<(Vec<usize>, bool)> = Vec::new();
            let mut rows = 0;
            for (i, f) in feeds {
                match batches.last_mut() {
                    Some((b, _)) if rows + f.rows() <= hearth_models::MAX_CHUNK => b.push(i),
                    _ => {
                        batches.push((vec![i], invariant));
                        rows = 0;
                    }
                }
                rows += f.rows();
            }
            batches
        };
        let verifying = fed().any(|(_, f)| f.verify_block().is_some());
        if !self.batch_invariant && !verifying {
            // Decode tokens first, then prefill chunks.
            let mut order: Vec<(usize, &Feed)> = fed().collect();
            order.sort_by_key(|(_, f)| f.is_prefill());
            return pack(&mut order.into_iter(), false);
        }
        let mut batches = pack(&mut fed().filter(|(_, f)| !f.is_prefill()), true);
        if self.batch_invariant {
            batches.extend(
                fed()
                    .filter(|(_, f)| f.is_prefill())
                    .map(|(i, _)| (vec![i], true)),
            );
        } else {
            batches.extend(pack(&mut fed().filter(|(_, f)| f.is_prefill()), false));
        }
        batches
    }

    /// A whole step of a turn on its own (a speculating session's).
    fn solo_step(&self, a: &mut Active<'a, B::State>, slice: usize) -> Result<bool, Failure> {
        let session = &mut a.lease.session;
        let drafter = as_drafter(&mut session.drafter);
        let was_prefilling = a.turn.prefilling();
        let mut sink = text_sink(&*a.events);
        let out = a
            .turn
            .step(self.model, &mut session.state, drafter, slice, &mut sink)?;
        drop(sink);
        Ok(self.after_step(a, out, was_prefilling))
    }

    /// A step's bookkeeping: the session's ids, a checkpoint after the
    /// prefill (and interval ones), the logprobs; true when the turn has ended.
    fn after_step(&self, a: &mut Active<'a, B::State>, out: StepOut, was_prefilling: bool) -> bool {
        let session = &mut a.lease.session;
        session.push_fed(&out.fed);
        if was_prefilling && a.progress {
            let st = a.turn.stats();
            a.events.send(Event::Progress(Progress {
                total: st.prompt_tokens,
                cache: st.reused_tokens,
                processed: a.turn.prompt_fed(),
                time: st.prefill_time,
            }));
        }
        if was_prefilling && !a.turn.prefilling() {
            // Where the next prompt most likely diverges (sliding-window rings).
            session.checkpoint();
        }
        // And every so many positions (serve --checkpoint-every): a later
        // prompt or another session's that parts anywhere in a long context
        // restores a checkpoint near it.
        session.interval_checkpoint();
        let logprobs = &a.turn.stats().logprobs;
        if logprobs.len() > a.logprobs_sent {
            a.events
                .send(Event::Logprobs(logprobs[a.logprobs_sent..].to_vec()));
            a.logprobs_sent = logprobs.len();
        }
        out.finished.is_some()
    }

    fn finish(&mut self, mut a: Active<'a, B::State>, error: Option<Failure>) {
        let s: &TurnStats = a.turn.stats();
        // The turn's last event goes out after its stats line is logged, so a
        // client that has its response finds the turn in the log.
        let prefilled = a.turn.prompt_fed() - s.reused_tokens;
        let decoded = s.sampled.saturating_sub(1) as u64;
        let (finish, last) = match (error, s.finish) {
            (Some(e), _) => {
                // The state may be half-written: start this session over.
                a.lease.session.reset();
                if let Failure::Panic(m) = &e {
                    eprintln!(
                        "session {}: {m}",
                        crate::session::display_id(a.lease.id.as_deref())
                    );
                }
                ("error", Some(Event::Failed(e.into())))
            }
            (None, Some(FinishReason::Cancelled)) => ("cancelled", None),
            (None, Some(f)) => (
                f.as_str(),
                Some(Event::Done(Summary {
                    finish: f,
                    prompt_tokens: s.prompt_tokens,
                    cached_tokens: s.reused_tokens,
                    completion_tokens: s.sampled,
                    stop_sequence: s.stop_sequence.clone(),
                    prefilled_tokens: prefilled,
                    prefill_time: s.prefill_time,
                    decoded_tokens: decoded as usize,
                    decode_time: s.decode_time,
                })),
            ),
            (None, None) => unreachable!("finish of a running turn"),
        };
        let m = &self.stats;
        if s.finish == Some(FinishReason::Cancelled) {
            m.cancelled_requests.fetch_add(1, Ordering::Relaxed);
            m.cancelled_prefill_tokens.fetch_add(
                (s.prompt_tokens - a.turn.prompt_fed()) as u64,
                Ordering::Relaxed,
            );
        }
        m.prompt_tokens
            .fetch_add(s.prompt_tokens as u64, Ordering::Relaxed);
        m.completion_tokens
            .fetch_add(s.sampled as u64, Ordering::Relaxed);
        m.reused_prompt_tokens
            .fetch_add(s.reused_tokens as u64, Ordering::Relaxed);
        m.prefill_tokens
            .fetch_add(prefilled as u64, Ordering::Relaxed);
        m.prefill_us
            .fetch_add(s.prefill_time.as_micros() as u64, Ordering::Relaxed);
        m.decode_tokens.fetch_add(decoded, Ordering::Relaxed);
        m.decode_us
            .fetch_add(s.decode_time.as_micros() as u64, Ordering::Relaxed);
        if self.drafters.is_some() {
            m.spec
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .merge(&s.spec.clone().unwrap_or_default());
        }
        eprintln!(
            "llm_turn_stats session_id={} reason={} prompt_tokens={} reused_prompt_tokens={} prefilled_prompt_tokens={} completion_tokens={} prefill_ms={:.0} decode_tok_s={:.1} constraint_ms={:.1} finish={}",
            crate::session::display_id(a.lease.id.as_deref()),
            a.resume_reason,
            s.prompt_tokens,
            s.reused_tokens,
            prefilled,
            s.sampled,
            s.prefill_time.as_secs_f64() * 1e3,
            decoded as f64 / s.decode_time.as_secs_f64().max(1e-9),
            s.constraint_time.as_secs_f64() * 1e3,
            finish
        );
        if let Some(event) = last {
            a.events.send(event);
        }
        self.store.release(a.lease);
    }
}
