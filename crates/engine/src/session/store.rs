//! The session store: many sessions on one model load, leased to running
//! generations, matched by key or shared prefix, evicted and spilled.

use std::collections::{HashMap, HashSet};

use hearth_models::Backend;

use super::*;

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
    fn put(&mut self, id: &str, saved: SavedSession) -> Result<(), String>;
    /// Takes back session `id`'s saved form (`None`: none is kept); an error
    /// says why a kept one could not be read.
    fn take(&mut self, id: &str) -> Option<Result<SavedSession, String>>;
    /// Drops session `id`'s saved form; false when none was kept.
    fn forget(&mut self, id: &str) -> bool;
    /// Drops every kept form; how many there were.
    fn forget_all(&mut self) -> usize;
    /// Whether anonymous sessions are kept ([`Self::put_anonymous`]); the
    /// default keeps none (and their state is then never saved for it).
    fn keeps_anonymous(&self) -> bool {
        false
    }
    /// Keeps an anonymous session of tenant `salt` (no id: it is found
    /// again by its tokens, [`Self::take_anonymous`]). Called only when
    /// [`Self::keeps_anonymous`].
    fn put_anonymous(&mut self, _salt: Option<&str>, _saved: SavedSession) -> Result<(), String> {
        Err("anonymous sessions are not kept".into())
    }
    /// The kept anonymous session of tenant `salt` whose ids share the
    /// longest prefix with `ids`, when that prefix is at least
    /// [`ANONYMOUS_SIMILARITY`] of its own length (`None`: none is).
    fn take_anonymous(
        &mut self,
        _salt: Option<&str>,
        _ids: &[u32],
    ) -> Option<Result<SavedSession, String>> {
        None
    }
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
    /// Every session is kept in the spill as its turn ends
    /// ([`Self::keep_every_turn`]).
    persist_on_release: bool,
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
pub fn display_id(key: Option<&str>) -> std::borrow::Cow<'_, str> {
    match key {
        None => "<scratch>".into(),
        // Each anonymous conversation by its number, so a log tells them apart.
        Some(k) => match k.strip_prefix(ANONYMOUS) {
            Some(n) => format!("<anonymous-{n}>").into(),
            None => k.into(),
        },
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
            persist_on_release: false,
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
            None => {
                let mut s = self.allocate_from(model, true)?;
                // Not resident here: a conversation another replica (or
                // this one, before an eviction) kept in the session dir.
                let restored =
                    prompt.images.is_empty() && self.unspill_anonymous(&mut s, prompt, salt);
                (s, !restored)
            }
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

    /// Restores into `session` the kept anonymous conversation of `salt`
    /// that `prompt` continues, if the spill has one; whether it did.
    fn unspill_anonymous(
        &mut self,
        session: &mut Session<S>,
        prompt: &Prompt,
        salt: Option<&str>,
    ) -> bool {
        let Some(taken) = self
            .spill
            .as_mut()
            .and_then(|s| s.take_anonymous(salt, &prompt.ids))
        else {
            return false;
        };
        let restored = taken.and_then(|saved| session.restore(saved));
        match restored {
            Ok(n) => {
                self.unspilled += 1;
                session.cache_salt = salt.map(str::to_string);
                eprintln!(
                    "session restored: an anonymous conversation of {n} tokens from --session-dir"
                );
                true
            }
            Err(e) => {
                session.reset();
                eprintln!("an anonymous conversation kept in --session-dir could not be restored ({e}); it is prefilled");
                false
            }
        }
    }

    /// Keeps `s` (idle, session `key`) in the spill; whether it was kept.
    fn spill_one(&mut self, key: Option<&str>, s: &Session<S>) -> bool {
        let Some(spill) = self.spill.as_mut() else {
            return false;
        };
        if s.resident.is_empty() || key.is_none() {
            return false;
        }
        let anonymous = is_anonymous(key);
        if anonymous && (!spill.keeps_anonymous() || !s.images.is_empty()) {
            return false;
        }
        let put = s.save().and_then(|saved| match anonymous {
            true => spill.put_anonymous(s.cache_salt.as_deref(), saved),
            false => spill.put(key.expect("named"), saved),
        });
        match put {
            Ok(()) => {
                self.spilled += 1;
                true
            }
            Err(e) => {
                eprintln!(
                    "session {}: keeping its state on disk failed: {e}",
                    display_id(key)
                );
                false
            }
        }
    }

    /// From now on every session is kept in the spill as each turn ends
    /// (replicas sharing a session dir: whichever replica gets a
    /// conversation's next turn continues it from there).
    pub fn keep_every_turn(&mut self) {
        self.persist_on_release = true;
    }

    /// New states get `slack` extra slots in their sliding-window rings, so a
    /// speculative verify pass of up to `slack` rejected drafts rolls back.
    pub fn set_ring_slack(&mut self, slack: usize) {
        self.ring_slack = slack;
    }

    /// The context of every state.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Positions held by the idle sessions' KV.
    pub fn idle_tokens(&self) -> usize {
        self.idle.values().map(|s| s.resident.len()).sum()
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
        if self.persist_on_release {
            self.spill_one(id.as_deref(), &session);
        }
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
                let kept = match self.spill_one(k.as_deref(), &s) {
                    true => ", kept in --session-dir",
                    false => "",
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
