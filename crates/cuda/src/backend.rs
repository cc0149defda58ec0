//! `GpuModel` as an engine [`Backend`], so generation, sessions, the server's
//! scheduler and speculative decoding run on the GPU through the same code as
//! on the CPU. Only `GpuModel`'s and `GpuState`'s public API is used here.
//!
//! What differs from the CPU backend:
//! - verify passes of up to 16 tokens are batch-invariant
//!   ([`GpuModel::forward_verify`]): greedy speculative output is plain
//!   greedy output; longer ones are ordinary multi-token passes;
//! - rings always keep `GPU_CHUNK` spare slots, so any `ring_slack` up to it
//!   needs no extra memory.

use hearth_models::{Backend, BackendState, BatchItem, Input, Logits, ModelConfig, ModelError};

use crate::error::CudaError;
use crate::forward::{GpuState, DECODE_BATCH, GPU_CHUNK};
use crate::model::GpuModel;
use crate::saved::GpuCheckpoint;

// SAFETY: a `GpuState` owns device allocations and a captured graph, which
// are plain driver handles, not tied to the thread that created them. Every
// use goes through `GpuModel::forward` / `new_state`, which make the model's
// context current on the calling thread first; `Gpu` is `Send + Sync` on the
// same grounds. The engine moves a state to its thread and uses it there only
// (`Send`, not `Sync`).
unsafe impl Send for GpuState {}

/// A device error as a model error: errors that are model errors stay so
/// (context full, bad token, rolled back too far), the rest keep their type.
fn model_error(e: CudaError) -> ModelError {
    match e {
        CudaError::Model(m) => m,
        other => ModelError::Backend(Box::new(other)),
    }
}

impl BackendState for GpuState {
    fn pos(&self) -> usize {
        self.pos
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    fn rollback(&mut self, pos: usize) -> Result<(), ModelError> {
        GpuState::rollback(self, pos).map_err(model_error)
    }

    fn reset(&mut self) {
        GpuState::reset(self)
    }

    fn kv_bytes(&self) -> usize {
        GpuState::kv_bytes(self)
    }

    fn save(&self) -> Result<Vec<u8>, ModelError> {
        GpuState::save(self).map_err(model_error)
    }

    fn load(&mut self, data: &[u8]) -> Result<(), ModelError> {
        GpuState::load(self, data).map_err(model_error)
    }

    fn copy_from(&mut self, other: &Self) -> bool {
        match GpuState::copy_from(self, other) {
            Ok(copied) => copied,
            Err(e) => {
                eprintln!("copying a session's KV on the GPU failed: {e}");
                false
            }
        }
    }

    fn checkpoint(&self) -> Option<Box<dyn std::any::Any + Send>> {
        match GpuState::checkpoint(self) {
            Ok(cp) => cp.map(|c| Box::new(c) as _),
            Err(e) => {
                eprintln!("taking a ring checkpoint on the GPU failed: {e}");
                None
            }
        }
    }

    fn restore(&mut self, checkpoint: &(dyn std::any::Any + Send)) -> bool {
        let Some(cp) = checkpoint.downcast_ref::<GpuCheckpoint>() else {
            return false;
        };
        match GpuState::restore(self, cp) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("restoring a ring checkpoint on the GPU failed: {e}");
                false
            }
        }
    }

    fn save_checkpoint(&self, checkpoint: &(dyn std::any::Any + Send)) -> Option<Vec<u8>> {
        checkpoint
            .downcast_ref::<GpuCheckpoint>()
            .map(GpuCheckpoint::save)
    }

    fn load_checkpoint(
        &self,
        pos: usize,
        data: &[u8],
    ) -> Result<Box<dyn std::any::Any + Send>, ModelError> {
        GpuState::load_checkpoint(self, pos, data)
            .map(|c| Box::new(c) as _)
            .map_err(model_error)
    }
}

impl Backend for GpuModel {
    type State = GpuState;

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn new_state(&self, max_ctx: usize, ring_slack: usize) -> Result<GpuState, ModelError> {
        if ring_slack > GPU_CHUNK {
            return Err(ModelError::Unsupported {
                backend: "CUDA",
                what: format!(
                    "rolling back {ring_slack} positions (at most {GPU_CHUNK}: lower --n-draft)"
                ),
            });
        }
        GpuModel::new_state(self, max_ctx).map_err(model_error)
    }

    fn name(&self) -> &'static str {
        "CUDA"
    }

    fn forward(
        &self,
        state: &mut GpuState,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        GpuModel::forward(self, state, tokens, want).map_err(model_error)
    }

    fn forward_tapped(
        &self,
        state: &mut GpuState,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        GpuModel::forward_tapped(self, state, tokens, want, taps, hidden).map_err(model_error)
    }

    /// Tokens or embedding rows (images).
    fn forward_input(
        &self,
        state: &mut GpuState,
        input: Input,
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        GpuModel::forward_input(self, state, input, want, taps, hidden).map_err(model_error)
    }

    /// The items that are one decode token each go through batched decode
    /// passes of up to [`DECODE_BATCH`] states ([`GpuModel::forward_decode_batch`]:
    /// each weight read once for all of them); the rest (prefill chunks,
    /// image rows, a lone decode token, which replays its CUDA graph) run
    /// one by one. With `invariant`, every row is what it is alone.
    fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, GpuState>],
        invariant: bool,
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let mut out: Vec<Option<Result<Vec<f32>, ModelError>>> =
            items.iter().map(|_| None).collect();
        let decode: Vec<usize> = (0..items.len())
            .filter(|&i| {
                matches!(items[i].input, Input::Tokens(t) if t.len() == 1)
                    && items[i].want == Logits::Last
                    && items[i].taps.is_empty()
            })
            .collect();
        if decode.len() >= 2 {
            for group in decode.chunks(DECODE_BATCH) {
                let tokens: Vec<u32> = group
                    .iter()
                    .map(|&i| match items[i].input {
                        Input::Tokens(t) => t[0],
                        Input::Rows(_) => unreachable!("decode items are tokens"),
                    })
                    .collect();
                // Each state once: the group's items are distinct sessions.
                let mut states: Vec<&mut GpuState> = Vec::with_capacity(group.len());
                let mut rest: &mut [BatchItem<'_, GpuState>] = items;
                let mut base = 0;
                for &i in group {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - base);
                    let (first, tail) = tail.split_first_mut().expect("index in range");
                    states.push(&mut *first.state);
                    rest = tail;
                    base = i + 1;
                }
                // A failed pass (checked before any work: a full context, a
                // bad token) leaves the states as they were; its items then
                // run one by one, each with its own outcome.
                if let Ok(rows) = self.forward_decode_batch(&mut states, &tokens, invariant) {
                    for (&i, logits) in group.iter().zip(rows) {
                        out[i] = Some(Ok(logits));
                    }
                }
            }
        }
        items
            .iter_mut()
            .zip(out)
            .map(|(it, done)| {
                done.unwrap_or_else(|| {
                    GpuModel::forward_input(
                        self,
                        it.state,
                        it.input,
                        it.want,
                        it.taps,
                        &mut it.hidden,
                    )
                    .map_err(model_error)
                })
            })
            .collect()
    }

    /// Blocks of up to 16 tokens batch-invariant (each row as a decode step
    /// computes it), longer ones as ordinary passes.
    fn forward_verify(
        &self,
        state: &mut GpuState,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        if want != Logits::All || tokens.len() > 16 {
            return GpuModel::forward_tapped(self, state, tokens, want, taps, hidden)
                .map_err(model_error);
        }
        GpuModel::forward_verify(self, state, tokens, taps, hidden).map_err(model_error)
    }

    /// The argmax of each row found on the GPU (blocks of up to 16 tokens).
    fn verify_argmax(
        &self,
        state: &mut GpuState,
        tokens: &[u32],
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<u32>, ModelError> {
        if tokens.len() > 16 {
            let rows = Backend::forward_verify(self, state, tokens, Logits::All, taps, hidden)?;
            let vocab = self.model.config.vocab_size;
            return Ok(rows
                .chunks_exact(vocab)
                .map(hearth_models::backend::first_argmax)
                .collect());
        }
        GpuModel::forward_verify_argmax(self, state, tokens, taps, hidden).map_err(model_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}
    fn assert_backend<B: Backend>() {}

    /// The engine thread owns states and shares the model: checked at compile time.
    #[test]
    fn gpu_model_is_a_backend_whose_state_moves_between_threads() {
        assert_send::<GpuState>();
        assert_backend::<GpuModel>();
    }

    #[test]
    fn model_errors_pass_through_device_errors_keep_their_message() {
        let e = model_error(CudaError::Model(ModelError::Empty));
        assert!(matches!(e, ModelError::Empty));
        let e = model_error(CudaError::Unavailable("no driver".into()));
        assert_eq!(e.to_string(), "CUDA is not available: no driver");
    }
}
