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
                LayerKvCache::new(layout, model.kv_types, c.n_kv_heads, c.head_dim, slots)
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

    /// The layers' shapes, which a saved state must match.
    fn shape(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.max_ctx as u64).to_le_bytes());
        out.extend_from_slice(&(self.caches.len() as u64).to_le_bytes());
        for c in &self.caches {
            let window = match c.layout {
                CacheLayout::Flat => 0u64,
                CacheLayout::Ring { window } => window as u64 + 1,
            };
            for v in [
                window,
                c.types.code(),
                c.n_kv_heads as u64,
                c.head_dim as u64,
                c.slots as u64,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// Everything the positions `0..pos` need, as bytes ([`State::load`]).
    pub fn save(&self) -> Vec<u8> {
        let shape = self.shape();
        // One allocation of the exact size: the caches' bytes are copied once.
        let len = 16
            + shape.len()
            + self
                .caches
                .iter()
                .map(|c| c.saved_len(self.pos))
                .sum::<usize>();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(shape.len() as u64).to_le_bytes());
        out.extend_from_slice(&shape);
        out.extend_from_slice(&(self.pos as u64).to_le_bytes());
        for c in &self.caches {
            c.save(self.pos, &mut out);
        }
        debug_assert_eq!(out.len(), len);
        out
    }

    /// Replaces this state with a saved one of the same shape (the same
    /// model, context and cache types); an error names what differs.
    pub fn load(&mut self, data: &[u8]) -> Result<(), String> {
        let word = |at: usize| -> Result<usize, String> {
            data.get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
                .ok_or_else(|| "the saved state is truncated".to_string())
        };
        let n = word(0)?;
        let shape = data
            .get(8..8 + n)
            .ok_or_else(|| "the saved state is truncated".to_string())?;
        if shape != self.shape() {
            return Err("the saved state has other cache shapes (another model, context size, cache type or --ring-slack)".into());
        }
        let pos = word(8 + n)?;
        if pos > self.max_ctx {
            return Err(format!(
                "the saved state holds {pos} positions, over the context of {}",
                self.max_ctx
            ));
        }
        let mut at = 16 + n;
        for c in &mut self.caches {
            at += c
                .load(pos, &data[at..])
                .ok_or_else(|| "the saved state is truncated".to_string())?;
        }
        if at != data.len() {
            return Err("the saved state has trailing bytes".into());
        }
        self.pos = pos;
        Ok(())
    }

    /// A copy of the sliding-window rings at the current position (`None`
    /// when there are none): with it, [`State::restore`] can come back to
    /// this position after the rings moved on past their slack.
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        let rings: Vec<(usize, LayerKvCache)> = self
            .caches
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.layout, CacheLayout::Ring { .. }))
            .map(|(i, c)| (i, c.clone()))
            .collect();
        (!rings.is_empty()).then_some(Checkpoint {
            pos: self.pos,
            rings,
        })
    }

    /// A checkpoint at `pos` from [`Checkpoint::save`]'s bytes, for this
    /// state's rings (the same model, context and cache types: the error
    /// names what differs). Each of this state's rings must be in it once.
    pub fn load_checkpoint(&self, pos: usize, data: &[u8]) -> Result<Checkpoint, String> {
        let truncated = || "the saved checkpoint is truncated".to_string();
        let word = |at: usize| -> Result<u64, String> {
            data.get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(truncated)
        };
        if pos == 0 || pos > self.max_ctx {
            return Err(format!(
                "the saved checkpoint's position {pos} is outside the context of {}",
                self.max_ctx
            ));
        }
        let ring_layers: Vec<usize> = (0..self.caches.len())
            .filter(|&i| matches!(self.caches[i].layout, CacheLayout::Ring { .. }))
            .collect();
        if word(0)? != ring_layers.len() as u64 {
            return Err("the saved checkpoint has another number of sliding-window layers".into());
        }
        let mut at = 8;
        let mut rings = Vec::with_capacity(ring_layers.len());
        for &want in &ring_layers {
            if word(at)? != want as u64 {
                return Err(format!(
                    "the saved checkpoint's rings are not this model's (layer {want} expected)"
                ));
            }
            at += 8;
            let mut ring = self.caches[want].clone();
            at += ring.load(pos, &data[at..]).ok_or_else(truncated)?;
            rings.push((want, ring));
        }
        if at != data.len() {
            return Err("the saved checkpoint has trailing bytes".into());
        }
        Ok(Checkpoint { pos, rings })
    }

    /// Back to a checkpoint's position: flat caches roll back, rings are
    /// copied back. The positions before the checkpoint must hold what they
    /// held when it was taken (the caller's bookkeeping).
    pub fn restore(&mut self, cp: &Checkpoint) {
        for (i, ring) in &cp.rings {
            self.caches[*i].clone_from(ring);
        }
        self.pos = cp.pos;
    }
}

/// Sliding-window rings saved at a position ([`State::checkpoint`]).
pub struct Checkpoint {
    pub pos: usize,
    rings: Vec<(usize, LayerKvCache)>,
}

impl Checkpoint {
    pub fn bytes(&self) -> usize {
        self.rings.iter().map(|(_, c)| c.bytes()).sum()
    }

    /// The rings as bytes, for a session file ([`State::load_checkpoint`]):
    /// the ring count, then per ring its layer index and its every slot.
    /// The position is the caller's to keep.
    pub fn save(&self) -> Vec<u8> {
        let len = 8 + self
            .rings
            .iter()
            .map(|(_, c)| 8 + c.saved_len(self.pos))
            .sum::<usize>();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(self.rings.len() as u64).to_le_bytes());
        for (i, c) in &self.rings {
            out.extend_from_slice(&(*i as u64).to_le_bytes());
            c.save(self.pos, &mut out);
        }
        debug_assert_eq!(out.len(), len);
        out
    }
}
