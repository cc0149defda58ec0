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
    /// Exact (for checking against f32 references).
    F32,
}

impl KvDtype {
    /// `x` rounded to this precision and widened back.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvDtype::F16 => f16::from_f32(x).to_f32(),
            KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
            KvDtype::F32 => x,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
        }
    }
}

/// An element type a cache can store.
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

/// The half-precision types: their own rounding conversions.
macro_rules! half_kv_elem {
    ($($t:ty),*) => {$(
        impl KvElem for $t {
            #[inline]
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            #[inline]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
        }
    )*};
}

half_kv_elem!(f16, bf16);

impl KvElem for f32 {
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

/// Cached K and V values in their storage type.
#[derive(Clone)]
pub enum KvData {
    F16 { k: Vec<f16>, v: Vec<f16> },
    Bf16 { k: Vec<bf16>, v: Vec<bf16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// Which positions a layer's cache holds and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// Position p in slot p; `slots` = context length.
    Flat,
    /// Position p in slot p % slots; attends to the last `window` positions.
    Ring { window: usize },
}

/// K and V of one layer: `[n_kv_heads, slots, head_dim]` each, in `dtype`.
#[derive(Clone)]
pub struct LayerKvCache {
    pub layout: CacheLayout,
    pub dtype: KvDtype,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub slots: usize,
    /// K and V, each [n_kv_heads, slots, head_dim].
    pub data: KvData,
    /// Lowest position whose entry is still intact (ring overwrites older ones).
    oldest_intact: usize,
}

impl LayerKvCache {
    pub fn new(
        layout: CacheLayout,
        dtype: KvDtype,
        n_kv_heads: usize,
        head_dim: usize,
        slots: usize,
    ) -> Self {
        let n = n_kv_heads * slots * head_dim;
        let data = match dtype {
            KvDtype::F16 => KvData::F16 {
                k: vec![f16::ZERO; n],
                v: vec![f16::ZERO; n],
            },
            KvDtype::Bf16 => KvData::Bf16 {
                k: vec![bf16::ZERO; n],
                v: vec![bf16::ZERO; n],
            },
            KvDtype::F32 => KvData::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
        };
        LayerKvCache {
            layout,
            dtype,
            n_kv_heads,
            head_dim,
            slots,
            data,
            oldest_intact: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        2 * self.n_kv_heads * self.slots * self.head_dim * self.dtype.bytes()
    }

    #[inline]
    pub fn slot(&self, pos: usize) -> usize {
        match self.layout {
            CacheLayout::Flat => pos,
            CacheLayout::Ring { .. } => pos % self.slots,
        }
    }

    /// Offset of the row of `head` at `pos` in K or V.
    #[inline]
    pub fn row_offset(&self, head: usize, pos: usize) -> usize {
        (head * self.slots + self.slot(pos)) * self.head_dim
    }

    /// Stores rows for positions `p0..p0+T`. `k`, `v`: [T, n_kv_heads, head_dim].
    pub fn write(&mut self, p0: usize, k: &[f32], v: &[f32]) {
        let row = self.n_kv_heads * self.head_dim;
        let t = k.len() / row;
        // Only the last `slots` positions of a long chunk survive in a ring.
        let first = t.saturating_sub(self.slots);
        let (hd, n_kv) = (self.head_dim, self.n_kv_heads);
        let offsets: Vec<(usize, usize)> = (first..t)
            .flat_map(|i| (0..n_kv).map(move |h| (i, h)))
            .map(|(i, h)| (i * row + h * hd, self.row_offset(h, p0 + i)))
            .collect();
        fn store<E: KvElem>(
            dst_k: &mut [E],
            dst_v: &mut [E],
            k: &[f32],
            v: &[f32],
            offs: &[(usize, usize)],
            hd: usize,
        ) {
            for &(src, dst) in offs {
                for j in 0..hd {
                    dst_k[dst + j] = E::from_f32(k[src + j]);
                    dst_v[dst + j] = E::from_f32(v[src + j]);
                }
            }
        }
        match &mut self.data {
            KvData::F16 { k: dk, v: dv } => store(dk, dv, k, v, &offsets, hd),
            KvData::Bf16 { k: dk, v: dv } => store(dk, dv, k, v, &offsets, hd),
            KvData::F32 { k: dk, v: dv } => store(dk, dv, k, v, &offsets, hd),
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

    /// The entries positions `0..pos` need, as little-endian bytes: a flat
    /// cache's first `pos` rows per head, a ring's every slot (with the
    /// lowest intact position first). [`LayerKvCache::load`] reads it back
    /// into a cache of the same shape.
    pub fn save(&self, pos: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.oldest_intact as u64).to_le_bytes());
        let rows = match self.layout {
            CacheLayout::Flat => pos.min(self.slots),
            CacheLayout::Ring { .. } => self.slots,
        };
        // Little-endian bytes of each element, `N` per element, head by head.
        fn put<E: Copy, const N: usize>(
            out: &mut Vec<u8>,
            x: &[E],
            c: &LayerKvCache,
            rows: usize,
            le: fn(E) -> [u8; N],
        ) {
            out.reserve(c.n_kv_heads * rows * c.head_dim * N);
            for h in 0..c.n_kv_heads {
                let at = h * c.slots * c.head_dim;
                out.extend(x[at..at + rows * c.head_dim].iter().flat_map(|&e| le(e)));
            }
        }
        match &self.data {
            KvData::F16 { k, v } => {
                for x in [k, v] {
                    put(out, x, self, rows, |e| e.to_bits().to_le_bytes());
                }
            }
            KvData::Bf16 { k, v } => {
                for x in [k, v] {
                    put(out, x, self, rows, |e| e.to_bits().to_le_bytes());
                }
            }
            KvData::F32 { k, v } => {
                for x in [k, v] {
                    put(out, x, self, rows, |e| e.to_bits().to_le_bytes());
                }
            }
        }
    }

    /// Reads what [`LayerKvCache::save`] wrote for `pos`; returns the bytes
    /// consumed, or `None` when `data` is too short.
    pub fn load(&mut self, pos: usize, data: &[u8]) -> Option<usize> {
        let oldest = u64::from_le_bytes(data.get(..8)?.try_into().ok()?) as usize;
        let rows = match self.layout {
            CacheLayout::Flat => pos.min(self.slots),
            CacheLayout::Ring { .. } => self.slots,
        };
        let (n_kv, slots, hd) = (self.n_kv_heads, self.slots, self.head_dim);
        let per = self.dtype.bytes();
        let need = 8 + 2 * n_kv * rows * hd * per;
        if data.len() < need {
            return None;
        }
        let mut at = 8;
        fn get<E: Copy>(
            x: &mut [E],
            data: &[u8],
            at: &mut usize,
            dims: (usize, usize, usize, usize),
            per: usize,
            from: fn(&[u8]) -> E,
        ) {
            let (n_kv, slots, hd, rows) = dims;
            for h in 0..n_kv {
                let base = h * slots * hd;
                for e in &mut x[base..base + rows * hd] {
                    *e = from(&data[*at..*at + per]);
                    *at += per;
                }
            }
        }
        let dims = (n_kv, slots, hd, rows);
        match &mut self.data {
            KvData::F16 { k, v } => {
                for x in [k, v] {
                    get(x, data, &mut at, dims, per, |b| {
                        f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
                    });
                }
            }
            KvData::Bf16 { k, v } => {
                for x in [k, v] {
                    get(x, data, &mut at, dims, per, |b| {
                        bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
                    });
                }
            }
            KvData::F32 { k, v } => {
                for x in [k, v] {
                    get(x, data, &mut at, dims, per, |b| {
                        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
                    });
                }
            }
        }
        self.oldest_intact = oldest;
        Some(at)
    }
}

/// Rounds K or V rows to the cache precision (in place), so the chunk's own
/// keys are seen exactly as later chunks will read them from the cache.
pub fn round_to_cache(x: &mut [f32], dtype: KvDtype) {
    x.iter_mut().for_each(|v| *v = dtype.round(*v));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_at(c: &LayerKvCache, p: usize) -> f32 {
        match &c.data {
            KvData::F32 { k, .. } => k[c.row_offset(0, p)],
            _ => unreachable!(),
        }
    }

    #[test]
    fn save_and_load_round_trip_what_the_positions_need() {
        // A flat cache of 6 slots holding 5 positions; a ring of 6 slots
        // (window 4) that has seen 9.
        for (layout, pos) in [(CacheLayout::Flat, 5), (CacheLayout::Ring { window: 4 }, 9)] {
            for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32] {
                let mut c = LayerKvCache::new(layout, dtype, 2, 3, 6);
                let k: Vec<f32> = (0..pos * 6).map(|x| x as f32 * 0.25 - 3.0).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                c.write(0, &k, &v);
                let mut bytes = Vec::new();
                c.save(pos, &mut bytes);
                let mut d = LayerKvCache::new(layout, dtype, 2, 3, 6);
                assert!(d.load(pos, &bytes[..bytes.len() - 1]).is_none());
                assert_eq!(d.load(pos, &bytes), Some(bytes.len()));
                let get = |x: &LayerKvCache, o: usize| match &x.data {
                    KvData::F16 { k, v } => (k[o].to_f32(), v[o].to_f32()),
                    KvData::Bf16 { k, v } => (k[o].to_f32(), v[o].to_f32()),
                    KvData::F32 { k, v } => (k[o], v[o]),
                };
                let first = pos.saturating_sub(6);
                for h in 0..2 {
                    for p in first..pos {
                        let o = c.row_offset(h, p);
                        assert_eq!(
                            get(&c, o),
                            get(&d, o),
                            "{layout:?} {dtype:?} head {h} pos {p}"
                        );
                    }
                }
                for q in 0..pos {
                    assert_eq!(c.can_serve(q), d.can_serve(q));
                }
            }
        }
    }

    #[test]
    fn ring_keeps_the_last_slots_positions() {
        let mut c = LayerKvCache::new(CacheLayout::Ring { window: 4 }, KvDtype::F32, 1, 2, 6);
        for p in 0..10 {
            c.write(p, &[p as f32; 2], &[p as f32; 2]);
        }
        for p in 4..10 {
            assert_eq!(key_at(&c, p), p as f32);
        }
        assert_eq!(c.window_start(9), 6);
        assert!(c.can_serve(10));
    }

    #[test]
    fn long_chunk_writes_only_its_tail_and_rollback_limit_is_tracked() {
        let mut c = LayerKvCache::new(CacheLayout::Ring { window: 4 }, KvDtype::F32, 1, 1, 6);
        let rows: Vec<f32> = (0..20).map(|x| x as f32).collect();
        c.write(0, &rows, &rows);
        for p in 14..20 {
            assert_eq!(key_at(&c, p), p as f32);
        }
        // Rolled back to 17 (3 positions): query 17 needs 14..=17, all intact.
        assert!(c.can_serve(17));
        // Rolled back to 15: query 15 needs 12..=15 but 12 and 13 were overwritten.
        assert!(!c.can_serve(15));
    }
}
