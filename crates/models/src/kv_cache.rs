//! Hybrid KV cache: a flat cache for global layers (one slot per position up to
//! the context length) and a ring cache for sliding-window layers (sized from
//! the window, not the context).
//!
//! Attention for a chunk of new tokens at positions p0..p0+T reads keys older
//! than p0 from the cache and the chunk's own keys from the fresh K/V rows, and
//! only then are the fresh rows written. So a ring needs just `window` slots
//! for exact results at any chunk size (no W + C - 1 sizing, spec §5.3), plus a
//! small `slack` so that a speculative rollback of up to `slack + 1` positions
//! never loses an entry still inside the window.

use half::{bf16, f16};

/// Storage precision of cached keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// llama.cpp's default cache type.
    F16,
    /// The Muse Glimmer spec's cache type (§3.7).
    Bf16,
}

impl KvDtype {
    #[inline]
    pub fn round(self, x: f32) -> u16 {
        match self {
            KvDtype::F16 => f16::from_f32(x).to_bits(),
            KvDtype::Bf16 => bf16::from_f32(x).to_bits(),
        }
    }

    #[inline]
    pub fn widen(self, bits: u16) -> f32 {
        match self {
            KvDtype::F16 => f16::from_bits(bits).to_f32(),
            KvDtype::Bf16 => bf16::from_bits(bits).to_f32(),
        }
    }
}

/// Which positions a layer's cache holds and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// Position p in slot p; `slots` = context length.
    Flat,
    /// Position p in slot p % slots; attends to the last `window` positions.
    Ring { window: usize },
}

/// K and V of one layer: `[n_kv_heads, slots, head_dim]` each, stored as 16-bit
/// floats of `dtype`.
pub struct LayerKvCache {
    pub layout: CacheLayout,
    pub dtype: KvDtype,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub slots: usize,
    /// [n_kv_heads, slots, head_dim]
    k: Vec<u16>,
    /// [n_kv_heads, slots, head_dim]
    v: Vec<u16>,
    /// Lowest position whose entry is still intact (ring overwrites older ones).
    oldest_intact: usize,
}

impl LayerKvCache {
    pub fn new(layout: CacheLayout, dtype: KvDtype, n_kv_heads: usize, head_dim: usize, slots: usize) -> Self {
        let n = n_kv_heads * slots * head_dim;
        LayerKvCache { layout, dtype, n_kv_heads, head_dim, slots, k: vec![0; n], v: vec![0; n], oldest_intact: 0 }
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }

    #[inline]
    fn slot(&self, pos: usize) -> usize {
        match self.layout {
            CacheLayout::Flat => pos,
            CacheLayout::Ring { .. } => pos % self.slots,
        }
    }

    /// Cached key and value rows of `head` at `pos`, as 16-bit floats.
    #[inline]
    pub fn kv_row(&self, head: usize, pos: usize) -> (&[u16], &[u16]) {
        let off = (head * self.slots + self.slot(pos)) * self.head_dim;
        (&self.k[off..off + self.head_dim], &self.v[off..off + self.head_dim])
    }

    /// Stores already-rounded rows for positions `p0..p0+T`. `k`, `v`: [T, n_kv_heads, head_dim].
    pub fn write(&mut self, p0: usize, k: &[u16], v: &[u16]) {
        let row = self.n_kv_heads * self.head_dim;
        let t = k.len() / row;
        // Only the last `slots` positions of a long chunk survive in a ring.
        let first = t.saturating_sub(self.slots);
        for i in first..t {
            let slot = self.slot(p0 + i);
            for h in 0..self.n_kv_heads {
                let src = i * row + h * self.head_dim;
                let dst = (h * self.slots + slot) * self.head_dim;
                self.k[dst..dst + self.head_dim].copy_from_slice(&k[src..src + self.head_dim]);
                self.v[dst..dst + self.head_dim].copy_from_slice(&v[src..src + self.head_dim]);
            }
        }
        let end = p0 + t;
        if let CacheLayout::Ring { .. } = self.layout {
            self.oldest_intact = self.oldest_intact.max(end.saturating_sub(self.slots));
        }
    }

    /// First position a query at `q` attends to.
    #[inline]
    pub fn window_start(&self, q: usize) -> usize {
        match self.layout {
            CacheLayout::Flat => 0,
            CacheLayout::Ring { window } => (q + 1).saturating_sub(window),
        }
    }

    /// Whether a query at `q` can still be answered exactly from this cache
    /// (false after rolling a ring back further than its slack allows).
    pub fn can_serve(&self, q: usize) -> bool {
        self.window_start(q) >= self.oldest_intact
    }

    pub fn reset(&mut self) {
        self.oldest_intact = 0;
    }
}

/// Default extra ring slots beyond the window: enough to roll back a rejected
/// speculative block of up to 16 drafted tokens.
pub const RING_SLACK: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn pos_row(p: usize, n: usize) -> Vec<u16> {
        vec![p as u16; n]
    }

    #[test]
    fn ring_keeps_the_last_slots_positions() {
        let mut c = LayerKvCache::new(CacheLayout::Ring { window: 4 }, KvDtype::F16, 1, 2, 6);
        for p in 0..10 {
            c.write(p, &pos_row(p, 2), &pos_row(p, 2));
        }
        for p in 4..10 {
            assert_eq!(c.kv_row(0, p).0, &[p as u16, p as u16]);
        }
        assert_eq!(c.window_start(9), 6);
        assert!(c.can_serve(10));
    }

    #[test]
    fn long_chunk_writes_only_its_tail_and_rollback_limit_is_tracked() {
        let mut c = LayerKvCache::new(CacheLayout::Ring { window: 4 }, KvDtype::F16, 1, 1, 6);
        let rows: Vec<u16> = (0..20).collect();
        c.write(0, &rows, &rows);
        for p in 14..20 {
            assert_eq!(c.kv_row(0, p).0, &[p as u16]);
        }
        // Rolled back to 17 (3 positions): query 17 needs 14..=17, all intact.
        assert!(c.can_serve(17));
        // Rolled back to 15: query 15 needs 12..=15 but 12 and 13 were overwritten.
        assert!(!c.can_serve(15));
    }
}
