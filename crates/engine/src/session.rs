//! Sessions: one conversation's KV state plus the token ids resident in it, and
//! a store that hosts many of them on one model load.
//!
//! Resume is decided on token ids (server-api.md §7) and, at image positions,
//! on the image's digest ([`crate::prompt`]): a new prompt keeps
//! the longest common prefix of the resident ids, the state rolls back to it
//! when the cache allows (flat caches always; sliding-window rings only within
//! their slack), and only the rest is prefilled. Anything else resets.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hearth_models::{Backend, BackendState, ModelError};

pub use crate::prompt::common_prefix;
use crate::prompt::{ImageRows, ImageSpan, Prompt, IMAGE_ID};
use crate::spec::Drafter;

/// An image a saved session holds: its positions `start..start + n` (which
/// hold [`IMAGE_ID`] in the ids) and the digest of its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedImage {
    pub start: usize,
    pub n: usize,
    pub digest: [u8; 32],
}

/// A ring checkpoint a saved session holds: its position and the backend's
/// bytes for it ([`BackendState::save_checkpoint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedCheckpoint {
    pub pos: usize,
    pub state: Vec<u8>,
}

/// A session as a file holds it: resident ids, its images, its ring
/// checkpoints (oldest first), the state bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedSession {
    pub ids: Vec<u32>,
    pub images: Vec<SavedImage>,
    pub checkpoints: Vec<SavedCheckpoint>,
    pub state: Vec<u8>,
}

/// Why a prompt reused what it did (logged per turn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeReason {
    /// Nothing was resident.
    New,
    /// The prompt extends the resident ids: only the suffix is prefilled.
    ExactPrefix,
    /// The prompt diverges from the resident ids; the state was rolled back to
    /// the common prefix.
    CommonPrefix,
    /// The prompt equals the resident ids (or is a prefix of them); the last
    /// prompt token is re-fed to get its logits.
    Equal,
    /// Nothing in common: full reset.
    Mismatch,
    /// The rings had moved past their slack, but a checkpoint taken after an
    /// earlier prompt brought the state back to its position.
    Checkpoint,
    /// The prompt's prefix was copied from another session's state.
    SharedPrefix,
    /// A common prefix existed but the cache could not roll back to it (a
    /// sliding-window ring had overwritten entries): full reset.
    RollbackFailed,
}

impl ResumeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeReason::New => "new",
            ResumeReason::ExactPrefix => "exact_prefix",
            ResumeReason::CommonPrefix => "common_prefix",
            ResumeReason::Equal => "equal",
            ResumeReason::Mismatch => "mismatch",
            ResumeReason::Checkpoint => "checkpoint",
            ResumeReason::SharedPrefix => "shared_prefix",
            ResumeReason::RollbackFailed => "rollback_failed",
        }
    }
}

/// How much of a prompt is already in the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    /// Prompt tokens whose KV is reused; prefill `prompt[reused..]`.
    pub reused: usize,
    pub reason: ResumeReason,
}

/// One conversation: its KV state (any backend's) and the ids in it.
pub struct Session<S> {
    pub state: S,
    /// The session's speculative drafter, kept in step with `resident`
    /// (reset and rolled back with it); `None` without speculation.
    pub drafter: Option<Box<dyn Drafter + Send>>,
    /// The ids whose keys and values are in `state`, in order. Invariant:
    /// `resident.len() == state.pos()`.
    resident: Vec<u32>,
    /// The images of the last prepared prompt; those starting before
    /// `resident.len()` are (partly) in the state.
    images: Vec<ImageSpan>,
    /// Ring checkpoints (position, state's checkpoint), oldest first; each
    /// valid while the ids before its position are unchanged.
    checkpoints: Vec<(usize, Box<dyn std::any::Any + Send>)>,
    /// The `cache_salt` of the session's last request: prefixes are shared
    /// only between sessions of the same salt.
    pub cache_salt: Option<String>,
    /// When and how many ring checkpoints this session takes.
    pub checkpoint_policy: CheckpointPolicy,
    last_used: u64,
}

/// Ring checkpoints kept per session by default (the last prompts' ends).
pub const MAX_CHECKPOINTS: usize = 3;

/// When a session snapshots its sliding-window rings, and how many
/// snapshots it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Also snapshot after any step (prefill chunk or decode token) that ends
    /// `every` or more positions past the newest checkpoint; 0: only at the
    /// end of each prompt's prefill.
    pub every: usize,
    /// Most checkpoints kept (at least 1). Past it the one whose removal
    /// leaves the smallest gap between neighbours goes (never the newest),
    /// so the kept ones stay spread over the context.
    pub max: usize,
}

impl CheckpointPolicy {
    /// How many checkpoints are kept: `max`, at least 1.
    pub fn kept(&self) -> usize {
        self.max.max(1)
    }
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every: 0,
            max: MAX_CHECKPOINTS,
        }
    }
}

impl<S: BackendState> Session<S> {
    pub fn new(state: S) -> Session<S> {
        let mut state = state;
        state.reset();
        Session {
            state,
            drafter: None,
            resident: Vec::new(),
            images: Vec::new(),
            checkpoints: Vec::new(),
            cache_salt: None,
            checkpoint_policy: CheckpointPolicy::default(),
            last_used: 0,
        }
    }

    /// An interval checkpoint ([`CheckpointPolicy::every`]) if one is due.
    pub fn interval_checkpoint(&mut self) {
        let every = self.checkpoint_policy.every;
        if every == 0 {
            return;
        }
        // Checkpoints are kept in position order: the last is the newest.
        let newest = self.checkpoints.last().map_or(0, |(p, _)| *p);
        if self.state.pos() >= newest + every {
            self.checkpoint();
        }
    }

    /// Drops checkpoints past the policy's maximum: each time the one (not
    /// the newest) whose removal leaves the smallest gap between its
    /// neighbours (position 0 before the first; the older one on a tie), so
    /// the kept ones stay spread from the start of the context to its end.
    fn thin_checkpoints(&mut self) {
        while self.checkpoints.len() > self.checkpoint_policy.kept() {
            let n = self.checkpoints.len();
            let pos = |i: usize| self.checkpoints[i].0;
            let gap = |i: usize| pos(i + 1) - if i == 0 { 0 } else { pos(i - 1) };
            let victim = (0..n - 1).min_by_key(|&i| (gap(i), i)).unwrap_or(0);
            self.checkpoints.remove(victim);
        }
    }

    /// Takes a ring checkpoint at the current position (the end of a
    /// prompt's prefill: where a later prompt most often diverges, e.g. at a
    /// re-rendered assistant message). Nothing for states without rings.
    pub fn checkpoint(&mut self) {
        let pos = self.state.pos();
        if pos == 0 || self.checkpoints.iter().any(|(p, _)| *p == pos) {
            return;
        }
        if let Some(cp) = self.state.checkpoint() {
            // Positions ascend: a later prompt that parted earlier dropped
            // the checkpoints past its divergence.
            let at = self.checkpoints.partition_point(|(p, _)| *p < pos);
            self.checkpoints.insert(at, (pos, cp));
            self.thin_checkpoints();
        }
    }

    /// Positions of the checkpoints held.
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|(p, _)| *p).collect()
    }

    /// The resident ids, the images among them and the state as bytes (a
    /// session file's payload).
    pub fn save(&self) -> Result<SavedSession, String> {
        let state = self.state.save().map_err(|e| e.to_string())?;
        let images = self
            .images
            .iter()
            .filter(|s| s.end() <= self.resident.len())
            .map(|s| SavedImage {
                start: s.start,
                n: s.image.n,
                digest: s.image.digest,
            })
            .collect();
        // A backend that cannot save its checkpoints still saves the session
        // (it only rolls back less far after the restore).
        let checkpoints = self
            .checkpoints
            .iter()
            .filter_map(|(pos, cp)| {
                let state = self.state.save_checkpoint(&**cp)?;
                Some(SavedCheckpoint { pos: *pos, state })
            })
            .collect();
        Ok(SavedSession {
            ids: self.resident.clone(),
            images,
            checkpoints,
            state,
        })
    }

    /// Replaces the session with a saved one; the number of tokens restored.
    /// Its images come back as their digests (their positions are in the
    /// state; a later prompt reuses them when it holds the same images at
    /// the same places).
    pub fn restore(&mut self, saved: SavedSession) -> Result<usize, String> {
        let SavedSession {
            ids,
            images,
            checkpoints,
            state: bytes,
        } = saved;
        if self.drafter.is_some() {
            return Err("sessions cannot be restored while speculative decoding is on".into());
        }
        let mut end = 0;
        for im in &images {
            let span = im.start..im.start.saturating_add(im.n);
            if im.n == 0
                || im.start < end
                || span.end > ids.len()
                || ids[span.clone()].iter().any(|&t| t != IMAGE_ID)
            {
                return Err(format!(
                    "the session file's image at {}..{} is not a run of image positions in its {} ids",
                    span.start,
                    span.end,
                    ids.len()
                ));
            }
            end = span.end;
        }
        self.reset();
        if let Err(e) = self.state.load(&bytes) {
            self.reset();
            return Err(e.to_string());
        }
        if self.state.pos() != ids.len() {
            self.reset();
            return Err(format!(
                "the session file lists {} tokens but its state holds {} positions",
                ids.len(),
                self.state.pos()
            ));
        }
        let mut last = 0;
        for c in &checkpoints {
            if c.pos <= last || c.pos > ids.len() {
                self.reset();
                return Err(format!(
                    "the session file's checkpoint at {} is not after the one before ({last}) and within its {} ids",
                    c.pos,
                    ids.len()
                ));
            }
            last = c.pos;
        }
        let skip = checkpoints
            .len()
            .saturating_sub(self.checkpoint_policy.kept());
        for c in &checkpoints[skip..] {
            match self.state.load_checkpoint(c.pos, &c.state) {
                Ok(cp) => self.checkpoints.push((c.pos, cp)),
                Err(e) => {
                    self.reset();
                    return Err(format!("the session file's checkpoint at {}: {e}", c.pos));
                }
            }
        }
        self.resident = ids;
        self.images = images
            .into_iter()
            .map(|im| ImageSpan {
                start: im.start,
                // Only the digest is compared: the rows are in the state.
                image: Arc::new(ImageRows {
                    digest: im.digest,
                    rows: Vec::new(),
                    n: im.n,
                }),
            })
            .collect();
        Ok(self.resident.len())
    }

    pub fn resident(&self) -> &[u32] {
        &self.resident
    }

    /// Forgets everything (keeps the allocation).
    pub fn reset(&mut self) {
        self.state.reset();
        self.resident.clear();
        self.images.clear();
        self.checkpoints.clear();
        if let Some(d) = self.drafter.as_mut() {
            d.reset();
        }
    }

    /// Positions the state for `prompt` (non-empty): keeps the longest common
    /// prefix of the resident ids and `prompt`, at most `prompt.len() - 1`
    /// (the last prompt token must be fed to produce logits).
    pub fn prepare(&mut self, prompt: &[u32]) -> Resume {
        self.prepare_prompt(&Prompt::from(prompt.to_vec()))
    }

    /// [`Session::prepare`] for a prompt with images: an image position is
    /// shared only when the same image (digest) starts at the same place.
    pub fn prepare_prompt(&mut self, prompt: &Prompt) -> Resume {
        let resume = self.resume(prompt);
        self.images = prompt.images.clone();
        resume
    }

    fn resume(&mut self, prompt: &Prompt) -> Resume {
        assert!(!prompt.is_empty(), "prepare: empty prompt");
        debug_assert_eq!(self.resident.len(), self.state.pos());
        if self.resident.is_empty() {
            self.reset();
            return Resume {
                reused: 0,
                reason: ResumeReason::New,
            };
        }
        let common = prompt.common_prefix(&self.resident, &self.images);
        let keep = common.min(prompt.len() - 1);
        let reason = if keep == 0 {
            ResumeReason::Mismatch
        } else if keep == self.resident.len() {
            ResumeReason::ExactPrefix
        } else if common == prompt.len() {
            ResumeReason::Equal
        } else {
            ResumeReason::CommonPrefix
        };
        if keep == 0 {
            self.reset();
            return Resume { reused: 0, reason };
        }
        if keep < self.resident.len() {
            if self.state.rollback(keep).is_err() {
                return self.resume_at_checkpoint(keep);
            }
            self.resident.truncate(keep);
            self.checkpoints.retain(|(p, _)| *p <= keep);
            if let Some(d) = self.drafter.as_mut() {
                d.rollback(keep);
            }
        }
        Resume {
            reused: keep,
            reason,
        }
    }

    /// A rollback to `keep` failed (the rings moved on): the latest checkpoint
    /// at or before `keep` brings the state back, else everything resets.
    fn resume_at_checkpoint(&mut self, keep: usize) -> Resume {
        let at = self
            .checkpoints
            .iter()
            .rposition(|(p, _)| *p <= keep && *p > 0)
            .filter(|_| self.drafter.is_none());
        if let Some(i) = at {
            let pos = self.checkpoints[i].0;
            if self.state.restore(&*self.checkpoints[i].1) {
                self.checkpoints.truncate(i + 1);
                self.resident.truncate(pos);
                return Resume {
                    reused: pos,
                    reason: ResumeReason::Checkpoint,
                };
            }
        }
        self.reset();
        Resume {
            reused: 0,
            reason: ResumeReason::RollbackFailed,
        }
    }

    /// Records ids just fed through the model (the state advanced past them).
    pub fn push_fed(&mut self, ids: &[u32]) {
        self.resident.extend_from_slice(ids);
        debug_assert_eq!(self.resident.len(), self.state.pos());
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// Every state is held by a running generation: nothing can be evicted.
    #[error("Session capacity exhausted ({capacity} sessions, all generating); retry later.")]
    CapacityExhausted { capacity: usize },
    /// The backend could not allocate a session state (e.g. out of GPU memory).
    #[error("allocating a session state: {0}")]
    Allocation(String),
}

/// Why a session could not be saved or restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("no such session")]
    NotFound,
    #[error("the session is generating; try again when it is idle")]
    Busy,
    #[error("{0}")]
    Invalid(String),
}

/// A session checked out of the store for one generation.
pub struct Lease<S> {
    /// `None`: the scratch session (or a transient one).
    pub id: Option<String>,
    pub session: Session<S>,
    /// A one-request session (the scratch session was busy): dropped on release.
    transient: bool,
    /// Whether the session was created (or re-created after eviction) for this lease.
    pub fresh: bool,
}

/// What [`SessionStore::acquire`] found.
pub enum Acquire<S> {
    Ready(Lease<S>),
    /// The session is generating for another request; try again later.
    Busy,
}

/// Deferred operations on sessions that are checked out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    Reset,
    Close,
}

/// Where evicted sessions go (`hearth serve --session-dir`): an evicted named
/// session is kept here in its saved form and comes back on its next request.
pub trait SessionSpill: Send {
    /// Keeps session `id`'s saved form; an error says why it was not kept.
    fn put(&mut self, id: &str, saved: &SavedSession) -> Result<(), String>;
    /// Takes back session `id`'s saved form (`None`: none is kept); an error
    /// says why a kept one could not be read.
    fn take(&mut self, id: &str) -> Option<Result<SavedSession, String>>;
    /// Drops session `id`'s saved form; false when none was kept.
    fn forget(&mut self, id: &str) -> bool;
    /// Drops every kept form; how many there were.
    fn forget_all(&mut self) -> usize;
}

/// Many sessions on one model load. Named sessions live until closed or
/// evicted (least recently used first, idle ones only). Requests without an
/// id continue the anonymous session of their tenant (`cache_salt`) whose
/// resident prompt they share the most of, as llama-server's `cache_prompt`
/// does ([`SessionStore::acquire_anonymous`]); with `anonymous_reuse` off
/// they share one scratch session, reset for every request, or get a
/// transient one while it is busy. The
/// number of live states is bounded by `capacity` (a session count and a KV
/// byte budget, whichever is smaller).
pub struct SessionStore<S> {
    idle: HashMap<Option<String>, Session<S>>,
    busy: HashSet<Option<String>>,
    pending: HashMap<Option<String>, Pending>,
    /// States allocated: idle + checked out.
    live: usize,
    capacity: usize,
    max_ctx: usize,
    clock: u64,
    /// Evictions so far (for metrics).
    pub evictions: u64,
    /// Extra ring slots per sliding-window cache (speculative rollback).
    ring_slack: usize,
    /// Named sessions may start from another named session's prefix.
    pub prefix_sharing: bool,
    /// Every session's ring checkpoint policy.
    pub checkpoint_policy: CheckpointPolicy,
    /// Evicted named sessions are kept here and come back on their next
    /// request (`None`: eviction forgets them).
    spill: Option<Box<dyn SessionSpill>>,
    /// Sessions spilled and brought back so far (for metrics).
    pub spilled: u64,
    pub unspilled: u64,
    /// Requests without a session id continue the best-matching anonymous
    /// session of their tenant (else: the scratch session, reset each time).
    pub anonymous_reuse: bool,
    /// Anonymous sessions named so far.
    anonymous_seq: u64,
}

/// Anonymous sessions' keys begin with this control character, which no
/// client session id may hold (ids are printable ASCII): a client can
/// neither name, reset nor guess one.
const ANONYMOUS: char = '\u{1}';

/// Whether a store key is an anonymous session's.
pub fn is_anonymous(key: Option<&str>) -> bool {
    key.is_some_and(|k| k.starts_with(ANONYMOUS))
}

/// A session key as logs show it.
pub fn display_id(key: Option<&str>) -> &str {
    match key {
        None => "<scratch>",
        Some(k) if k.starts_with(ANONYMOUS) => "<anonymous>",
        Some(k) => k,
    }
}

/// The least share of an anonymous session's resident prompt that a new
/// request must repeat to continue it (llama-server's default
/// `--slot-prompt-similarity` is 0.5): below it, the request gets a new
/// session and the old conversation stays resident for its next turn.
pub const ANONYMOUS_SIMILARITY: f64 = 0.5;

/// Fewest prompt tokens worth copying from another session.
pub const MIN_SHARED_PREFIX: usize = 64;

impl<S: BackendState> SessionStore<S> {
    /// `max_sessions` counts every state, the scratch one included;
    /// `kv_budget` (bytes) further bounds it by `state_bytes` per state.
    pub fn new(
        max_sessions: usize,
        kv_budget: Option<usize>,
        state_bytes: usize,
        max_ctx: usize,
    ) -> SessionStore<S> {
        let by_budget = kv_budget.map_or(usize::MAX, |b| b / state_bytes.max(1));
        SessionStore {
            idle: HashMap::new(),
            busy: HashSet::new(),
            pending: HashMap::new(),
            live: 0,
            capacity: max_sessions.min(by_budget).max(1),
            max_ctx,
            clock: 0,
            evictions: 0,
            ring_slack: 0,
            prefix_sharing: true,
            checkpoint_policy: CheckpointPolicy::default(),
            spill: None,
            spilled: 0,
            unspilled: 0,
            anonymous_reuse: true,
            anonymous_seq: 0,
        }
    }

    /// Checks out the session an anonymous request (no session id) of
    /// tenant `salt` continues: the idle anonymous session of the same salt
    /// that shares the longest prefix with `prompt`, if that is at least
    /// [`ANONYMOUS_SIMILARITY`] of its resident prompt; else a new anonymous
    /// session (which the shared prefix cache may then seed). Sessions of
    /// another salt are never considered, so a request learns nothing of
    /// another tenant's prompts.
    pub fn acquire_anonymous<B: Backend<State = S>>(
        &mut self,
        model: &B,
        prompt: &Prompt,
        salt: Option<&str>,
    ) -> Result<Acquire<S>, SessionError> {
        if !self.anonymous_reuse {
            return self.acquire(model, None);
        }
        let best = self
            .idle
            .iter()
            .filter(|(k, d)| is_anonymous(k.as_deref()) && d.cache_salt.as_deref() == salt)
            .map(|(k, d)| {
                let n = match d.resident.is_empty() {
                    true => 0,
                    false => prompt.common_prefix(&d.resident, &d.images),
                };
                (k, n, d.resident.len())
            })
            .filter(|&(_, n, len)| n > 0 && n as f64 >= ANONYMOUS_SIMILARITY * len as f64)
            .max_by_key(|&(_, n, _)| n)
            .map(|(k, _, _)| k.clone());
        let key = match best {
            Some(k) => k,
            None => {
                self.anonymous_seq += 1;
                Some(format!("{ANONYMOUS}{}", self.anonymous_seq))
            }
        };
        let (session, fresh) = match self.idle.remove(&key) {
            Some(s) => (s, false),
            None => (self.allocate_from(model, true)?, true),
        };
        self.busy.insert(key.clone());
        Ok(Acquire::Ready(Lease {
            id: key,
            session,
            transient: false,
            fresh,
        }))
    }

    /// Evicted named sessions go to `spill` and come back from it on their
    /// next request (or save, restore, reset, close).
    pub fn set_spill(&mut self, spill: Box<dyn SessionSpill>) {
        self.spill = Some(spill);
    }

    /// Brings session `id` back from the spill into the idle set, if it was
    /// spilled; an unreadable spill is logged and dropped (the session then
    /// starts over, as it would without a spill).
    fn unspill<B: Backend<State = S>>(&mut self, model: &B, id: &str) -> Result<(), SessionError> {
        let key = Some(id.to_string());
        if self.idle.contains_key(&key) || self.busy.contains(&key) {
            return Ok(());
        }
        let Some(taken) = self.spill.as_mut().and_then(|s| s.take(id)) else {
            return Ok(());
        };
        let saved = match taken {
            Ok(saved) => saved,
            Err(e) => {
                eprintln!(
                    "session {id}: its evicted state could not be read back ({e}); it starts over"
                );
                return Ok(());
            }
        };
        let mut session = self.allocate(model)?;
        if let Err(e) = session.restore(saved) {
            eprintln!(
                "session {id}: its evicted state could not be restored ({e}); it starts over"
            );
        }
        self.unspilled += 1;
        self.clock += 1;
        session.last_used = self.clock;
        self.idle.insert(key, session);
        Ok(())
    }

    /// New states get `slack` extra slots in their sliding-window rings, so a
    /// speculative verify pass of up to `slack` rejected drafts rolls back.
    pub fn set_ring_slack(&mut self, slack: usize) {
        self.ring_slack = slack;
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// States currently allocated.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Checks out session `id` (`None` = scratch), creating it if needed and
    /// evicting the least recently used idle session when the store is full.
    pub fn acquire<B: Backend<State = S>>(
        &mut self,
        model: &B,
        id: Option<&str>,
    ) -> Result<Acquire<S>, SessionError> {
        let key = id.map(str::to_string);
        if self.busy.contains(&key) {
            if key.is_some() {
                return Ok(Acquire::Busy);
            }
            // Scratch is busy: a transient session serves this request.
            let session = self.allocate(model)?;
            return Ok(Acquire::Ready(Lease {
                id: None,
                session,
                transient: true,
                fresh: true,
            }));
        }
        if let Some(id) = id {
            self.unspill(model, id)?;
        }
        let (mut session, fresh) = match self.idle.remove(&key) {
            Some(s) => (s, false),
            None => (self.allocate(model)?, true),
        };
        if key.is_none() {
            // Anonymous requests never reuse KV (docs/spec/server-api.md,
            // "Scratch"): the scratch state starts over, so `cached_tokens`
            // tells a client nothing about another client's prompt.
            session.reset();
        }
        self.busy.insert(key.clone());
        Ok(Acquire::Ready(Lease {
            id: key,
            session,
            transient: false,
            fresh,
        }))
    }

    /// Returns a lease; applies a reset or close requested while it was out.
    pub fn release(&mut self, lease: Lease<S>) {
        let Lease {
            id,
            mut session,
            transient,
            ..
        } = lease;
        if transient {
            self.live -= 1;
            return;
        }
        self.busy.remove(&id);
        match self.pending.remove(&id) {
            Some(Pending::Close) => {
                self.live -= 1;
                return;
            }
            Some(Pending::Reset) => session.reset(),
            None => {}
        }
        self.clock += 1;
        session.last_used = self.clock;
        self.idle.insert(id, session);
    }

    /// Clears a session's context, keeping its slot (deferred while it
    /// generates). False when no session has that id.
    pub fn reset(&mut self, id: &str) -> bool {
        let key = Some(id.to_string());
        if let Some(s) = self.idle.get_mut(&key) {
            s.reset();
        } else if self.busy.contains(&key) {
            self.pending.entry(key).or_insert(Pending::Reset);
        } else {
            // A spilled session resets to nothing: its next request starts over.
            return self.spill.as_mut().is_some_and(|s| s.forget(id));
        }
        true
    }

    /// Frees a session (deferred while it generates). False when no session
    /// has that id.
    pub fn close(&mut self, id: &str) -> bool {
        let key = Some(id.to_string());
        if self.idle.remove(&key).is_some() {
            self.live -= 1;
        } else if self.busy.contains(&key) {
            self.pending.insert(key, Pending::Close);
        } else {
            return self.spill.as_mut().is_some_and(|s| s.forget(id));
        }
        true
    }

    /// Frees every session: idle ones now (their KV memory goes), busy
    /// ones when their turn ends, spilled ones from the spill. The number
    /// of sessions it frees or will free.
    pub fn clear(&mut self) -> usize {
        let idle = self.idle.len();
        self.live -= idle;
        self.idle.clear();
        let mut n = idle;
        for key in &self.busy {
            self.pending.insert(key.clone(), Pending::Close);
            n += 1;
        }
        n + self.spill.as_mut().map_or(0, |s| s.forget_all())
    }

    /// The shared prefix cache: when another named idle session holds a
    /// longer prefix of `prompt` than `session` does (by at least
    /// [`MIN_SHARED_PREFIX`] tokens), `session` becomes a copy of it rolled
    /// back to that prefix; returns the tokens shared. Only sessions of the
    /// same `salt` (the requests' `cache_salt`) share. Named and anonymous
    /// sessions give and take (the scratch session does neither); prompts
    /// with images and sessions with drafters are left alone.
    pub fn share_prefix(
        &self,
        session: &mut Session<S>,
        prompt: &Prompt,
        salt: Option<&str>,
    ) -> Option<usize> {
        if !self.prefix_sharing || session.drafter.is_some() || !prompt.images.is_empty() {
            return None;
        }
        let limit = prompt.len().checked_sub(1)?;
        let own = match session.resident.is_empty() {
            true => 0,
            false => prompt.common_prefix(&session.resident, &session.images),
        };
        let (donor, n) = self
            .idle
            .iter()
            .filter(|(k, d)| {
                k.is_some()
                    && d.images.is_empty()
                    && d.drafter.is_none()
                    && d.cache_salt.as_deref() == salt
            })
            .map(|(_, d)| (d, common_prefix(&d.resident, &prompt.ids).min(limit)))
            .max_by_key(|(_, n)| *n)?;
        if n < own.saturating_add(MIN_SHARED_PREFIX) || !session.state.copy_from(&donor.state) {
            return None;
        }
        session.resident = donor.resident.clone();
        session.images.clear();
        session.checkpoints.clear();
        let mut n = n;
        if session.state.rollback(n).is_err() {
            // The donor's rings moved on past `n`: its latest checkpoint at
            // or before `n` (a sliding-window model), if that still shares
            // enough.
            let cp = donor
                .checkpoints
                .iter()
                .rev()
                .find(|(p, _)| *p <= n && *p >= own.saturating_add(MIN_SHARED_PREFIX));
            match cp {
                Some((p, cp)) if session.state.restore(&**cp) => n = *p,
                _ => {
                    session.reset();
                    return None;
                }
            }
        }
        session.resident.truncate(n);
        Some(n)
    }

    /// Session `id`'s resident ids and state bytes (idle sessions only; a
    /// spilled one is brought back first).
    pub fn save<B: Backend<State = S>>(
        &mut self,
        model: &B,
        id: &str,
    ) -> Result<SavedSession, StoreError> {
        self.unspill(model, id)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let key = Some(id.to_string());
        if self.busy.contains(&key) {
            return Err(StoreError::Busy);
        }
        let s = self.idle.get(&key).ok_or(StoreError::NotFound)?;
        s.save().map_err(StoreError::Invalid)
    }

    /// Creates or replaces session `id` from saved ids and state bytes (it
    /// may evict the least recently used idle session); the tokens restored.
    pub fn restore<B: Backend<State = S>>(
        &mut self,
        model: &B,
        id: &str,
        saved: SavedSession,
    ) -> Result<usize, StoreError> {
        let key = Some(id.to_string());
        if self.busy.contains(&key) {
            return Err(StoreError::Busy);
        }
        // What was spilled under this id is replaced.
        if let Some(s) = self.spill.as_mut() {
            s.forget(id);
        }
        let mut session = match self.idle.remove(&key) {
            Some(s) => s,
            None => self
                .allocate(model)
                .map_err(|e| StoreError::Invalid(e.to_string()))?,
        };
        let out = session.restore(saved);
        self.clock += 1;
        session.last_used = self.clock;
        self.idle.insert(key, session);
        out.map_err(StoreError::Invalid)
    }

    /// A fresh state: a new allocation while under capacity, else the state of
    /// the least recently used idle session.
    fn allocate<B: Backend<State = S>>(&mut self, model: &B) -> Result<Session<S>, SessionError> {
        self.allocate_from(model, false)
    }

    /// [`Self::allocate`]; with `anonymous_first`, the least recently used
    /// idle anonymous session is evicted before any named one (a client
    /// that names its session asked for it to stay).
    fn allocate_from<B: Backend<State = S>>(
        &mut self,
        model: &B,
        anonymous_first: bool,
    ) -> Result<Session<S>, SessionError> {
        if self.live < self.capacity {
            let state = model
                .new_state(self.max_ctx, self.ring_slack)
                .map_err(|e: ModelError| SessionError::Allocation(e.to_string()))?;
            self.live += 1;
            let mut s = Session::new(state);
            s.checkpoint_policy = self.checkpoint_policy;
            return Ok(s);
        }
        let lru = |anonymous_only: bool| {
            self.idle
                .iter()
                .filter(|(k, _)| !anonymous_only || is_anonymous(k.as_deref()))
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
        };
        let victim = match anonymous_first {
            true => lru(true).or_else(|| lru(false)),
            false => lru(false),
        };
        match victim {
            Some(k) => {
                let s = self.idle.remove(&k).expect("victim is idle");
                self.evictions += 1;
                let kept = match (&k, self.spill.as_mut()) {
                    (Some(id), Some(spill))
                        if !s.resident.is_empty() && !is_anonymous(Some(id)) =>
                    {
                        let put = s.save().and_then(|saved| spill.put(id, &saved));
                        match put {
                            Ok(()) => {
                                self.spilled += 1;
                                ", kept in --session-dir"
                            }
                            Err(e) => {
                                eprintln!("session {id}: keeping its state on disk failed: {e}");
                                ""
                            }
                        }
                    }
                    _ => "",
                };
                eprintln!(
                    "session evicted: {} (least recently used; capacity {}{kept})",
                    display_id(k.as_deref()),
                    self.capacity
                );
                // The state and the drafter are reused, both emptied.
                let mut fresh = Session::new(s.state);
                fresh.checkpoint_policy = self.checkpoint_policy;
                fresh.drafter = s.drafter;
                if let Some(d) = fresh.drafter.as_mut() {
                    d.reset();
                }
                Ok(fresh)
            }
            None => Err(SessionError::CapacityExhausted {
                capacity: self.capacity,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_counts_matching_ids() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2]), 2);
    }
}
