//! `GpuModel` as an engine [`Backend`], so generation, sessions, the server's
//! scheduler and speculative decoding run on the GPU through the same code as
//! on the CPU. Only `GpuModel`'s and `GpuState`'s public API is used here.
//!
//! What differs from the CPU backend:
//! - verify passes are ordinary multi-token passes (`Logits::All`), not
//!   batch-invariant: accepted tokens are the target's, but a greedy
//!   speculative run can differ from plain greedy where two logits are
//!   within rounding of each other;
//! - hidden-state taps (DFlash) are not exposed: a clear `Unsupported` error;
//! - rings always keep `GPU_CHUNK` spare slots, so any `ring_slack` up to it
//!   needs no extra memory.

use hearth_models::{Backend, BackendState, Logits, ModelConfig, ModelError};

use crate::error::CudaError;
use crate::forward::{GpuState, GPU_CHUNK};
use crate::model::GpuModel;

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

fn no_taps(taps: &[usize]) -> Result<(), ModelError> {
    if taps.is_empty() {
        return Ok(());
    }
    Err(ModelError::Unsupported {
        backend: "CUDA",
        what: format!("hidden-state taps (layers {taps:?}; needed by the DFlash drafter)"),
    })
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
        _hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        no_taps(taps)?;
        GpuModel::forward(self, state, tokens, want).map_err(model_error)
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
    fn taps_are_refused_with_a_message_naming_dflash() {
        assert!(no_taps(&[]).is_ok());
        let e = no_taps(&[1, 5]).unwrap_err().to_string();
        assert!(e.contains("CUDA") && e.contains("DFlash"), "{e}");
    }

    #[test]
    fn model_errors_pass_through_device_errors_keep_their_message() {
        let e = model_error(CudaError::Model(ModelError::Empty));
        assert!(matches!(e, ModelError::Empty));
        let e = model_error(CudaError::Unavailable("no driver".into()));
        assert_eq!(e.to_string(), "CUDA is not available: no driver");
    }
}
