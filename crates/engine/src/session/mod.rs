//! Sessions: one conversation's KV state plus the token ids resident in it, and
//! a store that hosts many of them on one model load.
//!
//! Resume is decided on token ids (server-api.md §7) and, at image positions,
//! on the image's digest ([`crate::prompt`]): a new prompt keeps
//! the longest common prefix of the resident ids, the state rolls back to it
//! when the cache allows (flat caches always; sliding-window rings only within
//! their slack), and only the rest is prefilled. Anything else resets.
//!
//! This file holds one session ([`Session`]: resume, rollback, checkpoints);
//! [`store`] the store of many (leases, shared prefixes, eviction, spill).

use std::sync::Arc;

use hearth_models::{BackendState, ModelError};

pub use crate::prompt::common_prefix;
use crate::prompt::{ImageRows, ImageSpan, Prompt, IMAGE_ID};
use crate::spec::Drafter;

mod store;

pub use store::{
    display_id, is_anonymous, Acquire, Lease, SessionError, SessionSpill, SessionStore, StoreError,
    ANONYMOUS_SIMILARITY, MIN_SHARED_PREFIX,
};

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
