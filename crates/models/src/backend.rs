//! The narrow interface the engine and the server run a model through, so the
//! same generation, session and speculation code drives the CPU model and the
//! GPU one (hearth-cuda implements it for its `GpuModel`).
//!
//! A backend is shared read-only by every session (`Send + Sync`); each
//! session owns a [`Backend::State`] (KV caches, position, scratch), which
//! moves to the engine thread that runs it (`Send`).

use crate::config::ModelConfig;
use crate::forward::{BatchItem, Input, Logits};
use crate::state::State;
use crate::weights::{Model, ModelError};
use hearth_kernels::RowOrder;

/// Per-session state of a backend: the position and the KV caches behind it.
pub trait BackendState: Send {
    /// Positions written (the next token goes at `pos`).
    fn pos(&self) -> usize;
    /// The context this state was sized for.
    fn max_ctx(&self) -> usize;
    /// Moves the position back to `pos <= self.pos()`; an error when a
    /// sliding-window ring has overwritten entries the position still needs.
    fn rollback(&mut self, pos: usize) -> Result<(), ModelError>;
    /// Forgets everything (keeps the allocation).
    fn reset(&mut self);
    /// Bytes held by the KV caches.
    fn kv_bytes(&self) -> usize;
    /// The state as bytes, for a session file ([`BackendState::load`]).
    fn save(&self) -> Result<Vec<u8>, ModelError> {
        Err(ModelError::Unsupported {
            backend: "this",
            what: "saving session states".into(),
        })
    }
    /// Replaces the state with a saved one of the same shape.
    fn load(&mut self, _data: &[u8]) -> Result<(), ModelError> {
        Err(ModelError::Unsupported {
            backend: "this",
            what: "restoring session states".into(),
        })
    }
    /// Becomes a copy of `other` (a state of the same shape): a new session
    /// starts from another's prefix. False when the backend cannot.
    fn copy_from(&mut self, _other: &Self) -> bool
    where
        Self: Sized,
    {
        false
    }
    /// A checkpoint of the sliding-window rings at the current position
    /// (`None`: nothing to keep, or the backend cannot).
    fn checkpoint(&self) -> Option<Box<dyn std::any::Any + Send>> {
        None
    }
    /// Back to a checkpoint's position; false when it is not this backend's.
    fn restore(&mut self, _checkpoint: &(dyn std::any::Any + Send)) -> bool {
        false
    }
    /// A checkpoint of this state as bytes, for a session file (`None`: not
    /// this backend's, or it cannot save them).
    fn save_checkpoint(&self, _checkpoint: &(dyn std::any::Any + Send)) -> Option<Vec<u8>> {
        None
    }
    /// A checkpoint at `pos` from [`BackendState::save_checkpoint`]'s bytes.
    fn load_checkpoint(
        &self,
        _pos: usize,
        _data: &[u8],
    ) -> Result<Box<dyn std::any::Any + Send>, ModelError> {
        Err(ModelError::Unsupported {
            backend: "this",
            what: "restoring ring checkpoints".into(),
        })
    }
}

/// A loaded model on some device, computing forward passes for states it made.
pub trait Backend: Send + Sync {
    type State: BackendState;

    /// The model's shape (vocabulary, width, layers).
    fn config(&self) -> &ModelConfig;

    /// A state for contexts up to `max_ctx` tokens whose sliding-window rings
    /// keep `ring_slack` extra slots, so up to `ring_slack` positions roll
    /// back (speculative verify passes).
    fn new_state(&self, max_ctx: usize, ring_slack: usize) -> Result<Self::State, ModelError>;

    /// Runs `tokens` at positions `state.pos()..`, advancing the position.
    /// Returns [vocab] for `Last`, [n, vocab] for `All`, nothing for `None`.
    fn forward(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError>;

    /// [`Backend::forward`] that also appends, for every token, the residual
    /// stream entering each layer in `taps` to `hidden` ([T, taps.len() * dim];
    /// DFlash's target hidden states). A backend that cannot tap returns
    /// [`ModelError::Unsupported`] for non-empty `taps`.
    fn forward_tapped(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError>;

    /// [`Backend::forward_tapped`] over tokens or embedding rows (an
    /// image's rows, [`Input::Rows`]). A backend that cannot take rows
    /// returns [`ModelError::Unsupported`] for them (the default).
    fn forward_input(
        &self,
        state: &mut Self::State,
        input: Input,
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        match input {
            Input::Tokens(tokens) => self.forward_tapped(state, tokens, want, taps, hidden),
            Input::Rows(_) => Err(ModelError::Unsupported {
                backend: self.name(),
                what: "embedding-row input (images)".into(),
            }),
        }
    }

    /// One step of several sequences ([`Model::forward_batch`]: each item's
    /// input at its own state's positions, its taps into its
    /// [`BatchItem::hidden`]). With `invariant`, each row must come out as it
    /// would alone (a batch of single-token steps equals those steps run one
    /// by one). By default the items run one after another, which is
    /// trivially invariant; a backend that batches overrides it.
    fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, Self::State>],
        invariant: bool,
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let _ = invariant;
        items
            .iter_mut()
            .map(|it| self.forward_input(it.state, it.input, it.want, it.taps, &mut it.hidden))
            .collect()
    }

    /// Whether [`Backend::forward_batch`] with `invariant` computes a
    /// speculative verify block (all logits rows, tapped) exactly as
    /// [`Backend::forward_verify`] does, so a scheduler may put speculating
    /// sessions' verify blocks in its batched passes. Backends that do not
    /// (the default) get those sessions' cycles one by one.
    fn batches_verify(&self) -> bool {
        false
    }

    /// The backend's name in messages ("cpu", "cuda").
    fn name(&self) -> &'static str {
        "this"
    }

    /// [`Backend::forward_verify`] for a greedy sampler: only each row's
    /// argmax (the lowest id among equal maxima, NaN skipped), which a
    /// backend can compute where the logits are instead of handing every
    /// row over.
    fn verify_argmax(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<u32>, ModelError> {
        let rows = self.forward_verify(state, tokens, Logits::All, taps, hidden)?;
        let vocab = self.config().vocab_size;
        Ok(rows.chunks_exact(vocab).map(first_argmax).collect())
    }

    /// A speculative verify pass over `[pending, drafts...]` (taps as in
    /// [`Backend::forward_tapped`]). Where the backend can, every row is
    /// computed as a one-token decode step would compute it, so greedy
    /// speculative output equals plain greedy output; by default it is an
    /// ordinary multi-token pass.
    fn forward_verify(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_tapped(state, tokens, want, taps, hidden)
    }
}

/// The index of the largest value (the first of equal maxima; NaN skipped).
pub fn first_argmax(values: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in values.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

impl BackendState for State {
    fn pos(&self) -> usize {
        self.pos
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    fn rollback(&mut self, pos: usize) -> Result<(), ModelError> {
        State::rollback(self, pos)
    }

    fn reset(&mut self) {
        State::reset(self)
    }

    fn kv_bytes(&self) -> usize {
        State::kv_bytes(self)
    }

    fn save(&self) -> Result<Vec<u8>, ModelError> {
        Ok(State::save(self))
    }

    fn load(&mut self, data: &[u8]) -> Result<(), ModelError> {
        State::load(self, data).map_err(ModelError::SavedState)
    }

    fn checkpoint(&self) -> Option<Box<dyn std::any::Any + Send>> {
        State::checkpoint(self).map(|c| Box::new(c) as _)
    }

    fn copy_from(&mut self, other: &Self) -> bool {
        if self.max_ctx != other.max_ctx || self.caches.len() != other.caches.len() {
            return false;
        }
        self.caches.clone_from(&other.caches);
        self.pos = other.pos;
        true
    }

    fn restore(&mut self, checkpoint: &(dyn std::any::Any + Send)) -> bool {
        match checkpoint.downcast_ref::<crate::state::Checkpoint>() {
            Some(c) => {
                State::restore(self, c);
                true
            }
            None => false,
        }
    }

    fn save_checkpoint(&self, checkpoint: &(dyn std::any::Any + Send)) -> Option<Vec<u8>> {
        checkpoint
            .downcast_ref::<crate::state::Checkpoint>()
            .map(crate::state::Checkpoint::save)
    }

    fn load_checkpoint(
        &self,
        pos: usize,
        data: &[u8],
    ) -> Result<Box<dyn std::any::Any + Send>, ModelError> {
        State::load_checkpoint(self, pos, data)
            .map(|c| Box::new(c) as _)
            .map_err(ModelError::SavedState)
    }
}

/// The CPU model: every method is the inherent one of the same name.
impl Backend for Model {
    type State = State;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_state(&self, max_ctx: usize, ring_slack: usize) -> Result<State, ModelError> {
        Ok(State::with_ring_slack(self, max_ctx, ring_slack))
    }

    #[inline]
    fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        Model::forward(self, state, tokens, want)
    }

    #[inline]
    fn forward_tapped(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_ordered(state, tokens, want, taps, hidden, RowOrder::Batched)
    }

    #[inline]
    fn forward_input(
        &self,
        state: &mut State,
        input: Input,
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_input_ordered(state, input, want, taps, hidden, RowOrder::Batched)
    }

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, State>],
        invariant: bool,
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let order = if invariant {
            RowOrder::Invariant
        } else {
            RowOrder::Batched
        };
        Model::forward_batch(self, items, order)
    }

    /// Verify passes run [`RowOrder::Invariant`], which is what a batched
    /// pass with `invariant` runs too.
    fn batches_verify(&self) -> bool {
        true
    }

    #[inline]
    fn forward_verify(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        // Batch-invariant rows: the K+1 rows equal K+1 single-token decode
        // steps bit for bit, so greedy speculative output is plain greedy
        // output ([`RowOrder::Invariant`]).
        self.forward_ordered(state, tokens, want, taps, hidden, RowOrder::Invariant)
    }
}

/// A second backend for tests of code generic over [`Backend`] on machines
/// without a GPU: the CPU model behind the CUDA backend's contract (its own
/// state type, verify passes that are plain multi-row passes rather than
/// batch-invariant, no hidden-state taps). Its output must equal the CPU
/// model's wherever multi-row passes compute each row as a one-row pass.
#[doc(hidden)]
pub mod testing {
    use std::sync::Arc;

    use super::{Backend, BackendState};
    use crate::{Logits, Model, ModelConfig, ModelError, State};

    pub struct GpuLike {
        pub model: Arc<Model>,
    }

    pub struct GpuLikeState {
        pub inner: State,
        /// Forward passes run on this state (proves the wrapper was used).
        pub forwards: usize,
    }

    impl BackendState for GpuLikeState {
        fn pos(&self) -> usize {
            self.inner.pos
        }
        fn max_ctx(&self) -> usize {
            self.inner.max_ctx
        }
        fn rollback(&mut self, pos: usize) -> Result<(), ModelError> {
            self.inner.rollback(pos)
        }
        fn reset(&mut self) {
            self.inner.reset()
        }
        fn kv_bytes(&self) -> usize {
            self.inner.kv_bytes()
        }
    }

    impl Backend for GpuLike {
        type State = GpuLikeState;

        fn config(&self) -> &ModelConfig {
            &self.model.config
        }
        fn new_state(&self, max_ctx: usize, ring_slack: usize) -> Result<GpuLikeState, ModelError> {
            Ok(GpuLikeState {
                inner: State::with_ring_slack(&self.model, max_ctx, ring_slack),
                forwards: 0,
            })
        }
        fn forward(
            &self,
            st: &mut GpuLikeState,
            tokens: &[u32],
            want: Logits,
        ) -> Result<Vec<f32>, ModelError> {
            st.forwards += 1;
            self.model.forward(&mut st.inner, tokens, want)
        }
        fn forward_tapped(
            &self,
            st: &mut GpuLikeState,
            tokens: &[u32],
            want: Logits,
            taps: &[usize],
            _hidden: &mut Vec<f32>,
        ) -> Result<Vec<f32>, ModelError> {
            if !taps.is_empty() {
                return Err(ModelError::Unsupported {
                    backend: "test",
                    what: "hidden-state taps".into(),
                });
            }
            self.forward(st, tokens, want)
        }
    }
}
