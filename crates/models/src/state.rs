//! Per-session state: the position and one KV cache per layer. A `Model` is
//! shared; each conversation owns a `State`.

use crate::config::LayerKind;
use crate::weights::{Model, ModelError};
use hearth_kernels::cpu::kv_cache::{CacheLayout, LayerKvCache};

pub struct State {
    /// Number of positions written (the next token goes at `pos`).
    pub pos: usize,
    /// Context length this state was sized for.
    pub max_ctx: usize,
    /// One per layer.
    pub caches: Vec<LayerKvCache>,
}

impl State {
    /// A state whose sliding-window rings hold exactly the window.
    pub fn new(model: &Model, max_ctx: usize) -> State {
        Self::with_ring_slack(model, max_ctx, 0)
    }

    /// Rings hold `window + slack` positions, so the state can roll back up to
    /// `slack` positions (speculative decoding) without losing window entries.
    pub fn with_ring_slack(model: &Model, max_ctx: usize, slack: usize) -> State {
        let c = &model.config;
        let caches = c
            .layers
            .iter()
            .map(|kind| {
                let layout = match *kind {
                    LayerKind::Global { .. } => CacheLayout::Flat,
                    LayerKind::Sliding { window, .. } => CacheLayout::Ring { window },
                };
                // The same count `ModelConfig::kv_cache_bytes` sizes before allocating.
                let slots = kind.kv_slots(max_ctx, slack);
                LayerKvCache::new(layout, model.kv_dtype, c.n_kv_heads, c.head_dim, slots)
            })
            .collect();
        State {
            pos: 0,
            max_ctx,
            caches,
        }
    }

    /// Bytes held by the KV caches.
    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(LayerKvCache::bytes).sum()
    }

    /// Moves the position back to `pos` (speculative rollback, or continuing a
    /// conversation from an earlier point). Flat caches need nothing; a ring
    /// that has overwritten entries the new position still needs is an error.
    pub fn rollback(&mut self, pos: usize) -> Result<(), ModelError> {
        assert!(
            pos <= self.pos,
            "rollback forward from {} to {pos}",
            self.pos
        );
        if self.caches.iter().any(|c| !c.can_serve(pos)) {
            return Err(ModelError::RolledBackTooFar { pos });
        }
        self.pos = pos;
        Ok(())
    }

    pub fn reset(&mut self) {
        self.pos = 0;
        self.caches.iter_mut().for_each(LayerKvCache::reset);
    }
}
