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

/// Storage type of cached keys or values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// llama.cpp's default cache type.
    F16,
    /// The Muse Glimmer spec's cache type (§3.7).
    Bf16,
    /// Exact (for checking against f32 references).
    F32,
    /// llama.cpp's `-ctk/-ctv q8_0`: blocks of 32 values, an f16 scale and
    /// 8-bit quants (34 bytes per 32 values).
    Q8_0,
    /// llama.cpp's `-ctk/-ctv q4_0`: blocks of 32 values, an f16 scale and
    /// 4-bit quants (18 bytes per 32 values).
    Q4_0,
}

impl KvDtype {
    /// `x` rounded to this precision and widened back. Block-quantized
    /// types round whole blocks, not single values: they return `x` (their
    /// rows are quantized where they are stored and read).
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvDtype::F16 => f16::from_f32(x).to_f32(),
            KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
            KvDtype::F32 | KvDtype::Q8_0 | KvDtype::Q4_0 => x,
        }
    }

    /// Whether values are stored in blocks of 32 with a shared scale.
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }

    /// Bytes `n` values take (`n` a multiple of 32 for the block types).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            KvDtype::F16 | KvDtype::Bf16 => 2 * n,
            KvDtype::F32 => 4 * n,
            KvDtype::Q8_0 => n / 32 * 34,
            KvDtype::Q4_0 => n / 32 * 18,
        }
    }

    /// llama.cpp's name for the type (`--cache-type-k` values).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::F32 => "f32",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// The type a `--cache-type-k`/`-v` value names.
    pub fn parse(name: &str) -> Option<KvDtype> {
        [
            KvDtype::F16,
            KvDtype::Bf16,
            KvDtype::F32,
            KvDtype::Q8_0,
            KvDtype::Q4_0,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    /// A number for the type in saved states.
    fn code(self) -> u64 {
        match self {
            KvDtype::F16 => 1,
            KvDtype::Bf16 => 2,
            KvDtype::F32 => 3,
            KvDtype::Q8_0 => 4,
            KvDtype::Q4_0 => 5,
        }
    }
}

/// The storage types of a cache's keys and of its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvDtype,
    pub v: KvDtype,
}

impl KvTypes {
    /// Keys and values both of type `t`.
    pub const fn same(t: KvDtype) -> KvTypes {
        KvTypes { k: t, v: t }
    }

    /// Bytes of K and V for one position of one layer.
    pub fn slot_bytes(self, n_kv_heads: usize, head_dim: usize) -> usize {
        self.k.bytes_for(n_kv_heads * head_dim) + self.v.bytes_for(n_kv_heads * head_dim)
    }

    /// Whether a cache of these types can hold heads of `head_dim` values.
    /// Block types need whole blocks per head (as llama.cpp needs them).
    pub fn check(self, head_dim: usize) -> Result<(), String> {
        for (what, t) in [("K", self.k), ("V", self.v)] {
            if t.is_quantized() && !head_dim.is_multiple_of(32) {
                return Err(format!(
                    "a {} {what} cache needs a head size that is a multiple of 32 (this model's is {head_dim})",
                    t.name()
                ));
            }
        }
        if (self.k.is_quantized() || self.v.is_quantized())
            && (matches!(self.k, KvDtype::Bf16 | KvDtype::F32)
                || matches!(self.v, KvDtype::Bf16 | KvDtype::F32))
        {
            return Err(format!(
                "K {} with V {}: a quantized cache pairs with f16, q8_0 or q4_0 (as llama.cpp's)",
                self.k.name(),
                self.v.name()
            ));
        }
        Ok(())
    }

    /// The Walsh-Hadamard rotations llama.cpp applies with a quantized cache
    /// (llama-kv-cache.cpp, `attn_rot_k`/`attn_rot_v`): `(n_rot_k, n_rot_v)`.
    /// A quantized K with a head size that is a multiple of 64 rotates Q and
    /// K in chunks of the largest power-of-two multiple of 64 dividing the
    /// head size; a quantized V rotates V, and the attention output back, in
    /// chunks of 64. Rotating spreads outliers across a block, so its one
    /// scale fits better; Q·K and the output are unchanged in exact arithmetic.
    pub fn rotations(self, head_dim: usize) -> (Option<usize>, Option<usize>) {
        let k = (self.k.is_quantized() && head_dim.is_multiple_of(64)).then(|| {
            let mut n = 64;
            while head_dim.is_multiple_of(2 * n) {
                n *= 2;
            }
            n
        });
        let v = (self.v.is_quantized() && head_dim.is_multiple_of(64)).then_some(64);
        (k, v)
    }

    /// A number for the pair in saved states; the old one-type value (the
    /// element size) for the unquantized types, so older files still load.
    pub fn code(self) -> u64 {
        match (self.k, self.v) {
            (KvDtype::F16, KvDtype::F16) | (KvDtype::Bf16, KvDtype::Bf16) => 2,
            (KvDtype::F32, KvDtype::F32) => 4,
            (k, v) => 0x100 + 16 * k.code() + v.code(),
        }
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k.name())
        } else {
            write!(f, "K {}, V {}", self.k.name(), self.v.name())
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
    F16 {
        k: Vec<f16>,
        v: Vec<f16>,
    },
    Bf16 {
        k: Vec<bf16>,
        v: Vec<bf16>,
    },
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    /// Any pair with a block-quantized type: each head's row of each slot
    /// as GGML row bytes (K in `types.k`, V in `types.v`), `[n_kv_heads,
    /// slots]` rows.
    Rows {
        k: Vec<u8>,
        v: Vec<u8>,
    },
}

/// Which positions a layer's cache holds and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// Position p in slot p; `slots` = context length.
    Flat,
    /// Position p in slot p % slots; attends to the last `window` positions.
    Ring { window: usize },
}

/// K and V of one layer: `[n_kv_heads, slots, head_dim]` each, in `types`.
#[derive(Clone)]
pub struct LayerKvCache {
    pub layout: CacheLayout,
    pub types: KvTypes,
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
        types: KvTypes,
        n_kv_heads: usize,
        head_dim: usize,
        slots: usize,
    ) -> Self {
        let n = n_kv_heads * slots * head_dim;
        let uniform = (types.k == types.v).then_some(types.k);
        let data = match uniform {
            Some(KvDtype::F16) => KvData::F16 {
                k: vec![f16::ZERO; n],
                v: vec![f16::ZERO; n],
            },
            Some(KvDtype::Bf16) => KvData::Bf16 {
                k: vec![bf16::ZERO; n],
                v: vec![bf16::ZERO; n],
            },
            Some(KvDtype::F32) => KvData::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
            _ => KvData::Rows {
                k: vec![0; types.k.bytes_for(n)],
                v: vec![0; types.v.bytes_for(n)],
            },
        };
        LayerKvCache {
            layout,
            types,
            n_kv_heads,
            head_dim,
            slots,
            data,
            oldest_intact: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.slots * self.types.slot_bytes(self.n_kv_heads, self.head_dim)
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
            KvData::Rows { k: dk, v: dv } => {
                let (kb, vb) = (self.types.k.bytes_for(hd), self.types.v.bytes_for(hd));
                for &(src, dst) in &offsets {
                    let row = dst / hd;
                    encode_row(self.types.k, &k[src..src + hd], &mut dk[row * kb..][..kb]);
                    encode_row(self.types.v, &v[src..src + hd], &mut dv[row * vb..][..vb]);
                }
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

    /// Rows per head that [`LayerKvCache::save`] writes for `pos`.
    fn saved_rows(&self, pos: usize) -> usize {
        match self.layout {
            CacheLayout::Flat => pos.min(self.slots),
            CacheLayout::Ring { .. } => self.slots,
        }
    }

    /// The number of bytes [`LayerKvCache::save`] appends for `pos`.
    pub fn saved_len(&self, pos: usize) -> usize {
        8 + self.n_kv_heads * self.saved_rows(pos) * self.types.slot_bytes(1, self.head_dim)
    }

    /// The entries positions `0..pos` need, as little-endian bytes: a flat
    /// cache's first `pos` rows per head, a ring's every slot (with the
    /// lowest intact position first). [`LayerKvCache::load`] reads it back
    /// into a cache of the same shape. Each head's rows are one contiguous
    /// run of the cache, copied as a whole.
    pub fn save(&self, pos: usize, out: &mut Vec<u8>) {
        out.reserve(self.saved_len(pos));
        out.extend_from_slice(&(self.oldest_intact as u64).to_le_bytes());
        let rows = self.saved_rows(pos);
        let (n_kv, slots, hd) = (self.n_kv_heads, self.slots, self.head_dim);
        fn put<E: PlainElem>(out: &mut Vec<u8>, x: &[E], dims: (usize, usize, usize, usize)) {
            let (n_kv, slots, hd, rows) = dims;
            for h in 0..n_kv {
                put_le(out, &x[h * slots * hd..][..rows * hd]);
            }
        }
        let dims = (n_kv, slots, hd, rows);
        match &self.data {
            KvData::F16 { k, v } => [k, v].into_iter().for_each(|x| put(out, x, dims)),
            KvData::Bf16 { k, v } => [k, v].into_iter().for_each(|x| put(out, x, dims)),
            KvData::F32 { k, v } => [k, v].into_iter().for_each(|x| put(out, x, dims)),
            KvData::Rows { k, v } => {
                for (x, t) in [(k, self.types.k), (v, self.types.v)] {
                    let rb = t.bytes_for(hd);
                    for h in 0..n_kv {
                        out.extend_from_slice(&x[h * slots * rb..][..rows * rb]);
                    }
                }
            }
        }
    }

    /// Reads what [`LayerKvCache::save`] wrote for `pos`; returns the bytes
    /// consumed, or `None` when `data` is too short.
    pub fn load(&mut self, pos: usize, data: &[u8]) -> Option<usize> {
        let oldest = u64::from_le_bytes(data.get(..8)?.try_into().ok()?) as usize;
        let rows = self.saved_rows(pos);
        let need = self.saved_len(pos);
        if data.len() < need {
            return None;
        }
        let (n_kv, slots, hd) = (self.n_kv_heads, self.slots, self.head_dim);
        let mut at = 8;
        fn get<E: PlainElem>(
            x: &mut [E],
            data: &[u8],
            at: &mut usize,
            dims: (usize, usize, usize, usize),
        ) {
            let (n_kv, slots, hd, rows) = dims;
            let n = rows * hd * std::mem::size_of::<E>();
            for h in 0..n_kv {
                get_le(&mut x[h * slots * hd..][..rows * hd], &data[*at..*at + n]);
                *at += n;
            }
        }
        let dims = (n_kv, slots, hd, rows);
        match &mut self.data {
            KvData::F16 { k, v } => [k, v].into_iter().for_each(|x| get(x, data, &mut at, dims)),
            KvData::Bf16 { k, v } => [k, v].into_iter().for_each(|x| get(x, data, &mut at, dims)),
            KvData::F32 { k, v } => [k, v].into_iter().for_each(|x| get(x, data, &mut at, dims)),
            KvData::Rows { k, v } => {
                for (x, t) in [(k, self.types.k), (v, self.types.v)] {
                    let rb = t.bytes_for(hd);
                    for h in 0..n_kv {
                        x[h * slots * rb..][..rows * rb].copy_from_slice(&data[at..at + rows * rb]);
                        at += rows * rb;
                    }
                }
            }
        }
        debug_assert_eq!(at, need);
        self.oldest_intact = oldest;
        Some(at)
    }
}

/// The unquantized cache elements, saved as their little-endian bytes.
///
/// # Safety
/// Implementors are plain data: no padding, and every byte pattern of
/// `size_of::<Self>()` bytes is a valid value (so their memory can be viewed
/// and filled as bytes).
unsafe trait PlainElem: Copy {
    fn to_le(self, out: &mut [u8]);
    fn from_le(b: &[u8]) -> Self;
}

macro_rules! plain_elem {
    ($($t:ty => $bits:ty),*) => {$(
        // SAFETY: f16, bf16 (a u16) and f32 (a u32) have no padding and no
        // invalid bit patterns.
        unsafe impl PlainElem for $t {
            #[inline]
            fn to_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_bits().to_le_bytes());
            }
            #[inline]
            fn from_le(b: &[u8]) -> Self {
                <$t>::from_bits(<$bits>::from_le_bytes(b.try_into().expect("element bytes")))
            }
        }
    )*};
}
plain_elem!(f16 => u16, bf16 => u16, f32 => u32);

/// Appends the little-endian bytes of `x` (on little-endian machines its
/// memory as it is, one copy).
fn put_le<E: PlainElem>(out: &mut Vec<u8>, x: &[E]) {
    if cfg!(target_endian = "little") {
        // SAFETY: `PlainElem` types have no padding, so all
        // `size_of_val(x)` bytes of `x` are initialized.
        let bytes = unsafe {
            std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x))
        };
        out.extend_from_slice(bytes);
    } else {
        let n = std::mem::size_of::<E>();
        let at = out.len();
        out.resize(at + std::mem::size_of_val(x), 0);
        for (e, b) in x.iter().zip(out[at..].chunks_exact_mut(n)) {
            e.to_le(b);
        }
    }
}

/// Fills `x` from the little-endian bytes of as many elements (`data.len()
/// == size_of_val(x)`).
fn get_le<E: PlainElem>(x: &mut [E], data: &[u8]) {
    if cfg!(target_endian = "little") {
        // SAFETY: `PlainElem` types accept every byte pattern and have no
        // padding, so `x` may be written as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(x))
        };
        bytes.copy_from_slice(data);
    } else {
        let n = std::mem::size_of::<E>();
        for (e, b) in x.iter_mut().zip(data.chunks_exact(n)) {
            *e = E::from_le(b);
        }
    }
}

/// Rounds K or V rows to the cache precision (in place), so the chunk's own
/// keys are seen exactly as later chunks will read them from the cache.
/// Block-quantized rows are left as they are (attention quantizes them).
pub fn round_to_cache(x: &mut [f32], dtype: KvDtype) {
    if dtype.is_quantized() {
        return;
    }
    x.iter_mut().for_each(|v| *v = dtype.round(*v));
}

/// The orthonormal Walsh-Hadamard transform of every chunk of `n` values
/// of `x` (`n` a power of two), as ggml's CPU backend computes it for a
/// matmul by a Hadamard matrix (`ggml_compute_forward_fwht`): the values
/// scaled by `1 / sqrt(n)` first (in f32), then butterflies `(u + v, u - v)`
/// over strides 1, 2, 4, … `n / 2`. The transform is its own inverse.
pub fn fwht(x: &mut [f32], n: usize) {
    assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    let scale = 1.0 / (n as f32).sqrt();
    for row in x.chunks_exact_mut(n) {
        row.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in i..i + len {
                    let (u, v) = (row[j], row[j + len]);
                    row[j] = u + v;
                    row[j + len] = u - v;
                }
            }
            len *= 2;
        }
    }
}

/// One head row of `x.len()` values as `t`'s GGML row bytes, as llama.cpp's
/// CPU backend stores a row into its cache (`set_rows` with the type's
/// `from_float`: q8_0 in its x86 rounding, q4_0 in the reference one).
pub fn encode_row(t: KvDtype, x: &[f32], out: &mut [u8]) {
    use crate::cpu::ggml_order::vec_dot::quantize_row_q8_0_x86;
    use crate::quant::blocks::as_blocks_mut;
    use crate::quant::quantize::*;
    match t {
        KvDtype::F16 => quantize_row_f16_ref(x, out),
        KvDtype::Bf16 => quantize_row_bf16_ref(x, out),
        KvDtype::F32 => {
            crate::quant::quantize(hearth_gguf::GgmlType::F32, x, out).expect("a row of f32 values")
        }
        KvDtype::Q8_0 => quantize_row_q8_0_x86(x, as_blocks_mut(out).expect("whole q8_0 blocks")),
        KvDtype::Q4_0 => quantize_row_q4_0_ref(x, as_blocks_mut(out).expect("whole q4_0 blocks")),
    }
}

/// A row written by [`encode_row`] back as values.
pub fn decode_row(t: KvDtype, row: &[u8], out: &mut [f32]) {
    use crate::quant::blocks::as_blocks;
    use crate::quant::dequant::*;
    match t {
        KvDtype::F16 => dequantize_row_f16_ref(row, out),
        KvDtype::Bf16 => dequantize_row_bf16_ref(row, out),
        KvDtype::F32 => dequantize_row_f32_ref(row, out),
        KvDtype::Q8_0 => dequantize_row_q8_0_ref(as_blocks(row).expect("whole blocks"), out),
        KvDtype::Q4_0 => dequantize_row_q4_0_ref(as_blocks(row).expect("whole blocks"), out),
    }
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

    /// Head `h`'s K and V rows at `p`, as values.
    fn rows_at(c: &LayerKvCache, h: usize, p: usize) -> (Vec<f32>, Vec<f32>) {
        let (hd, o) = (c.head_dim, c.row_offset(h, p));
        let mut k = vec![0.0; hd];
        let mut v = vec![0.0; hd];
        match &c.data {
            KvData::F16 { k: kc, v: vc } => {
                (0..hd).for_each(|j| (k[j], v[j]) = (kc[o + j].to_f32(), vc[o + j].to_f32()))
            }
            KvData::Bf16 { k: kc, v: vc } => {
                (0..hd).for_each(|j| (k[j], v[j]) = (kc[o + j].to_f32(), vc[o + j].to_f32()))
            }
            KvData::F32 { k: kc, v: vc } => {
                k.copy_from_slice(&kc[o..o + hd]);
                v.copy_from_slice(&vc[o..o + hd]);
            }
            KvData::Rows { k: kc, v: vc } => {
                let (kb, vb) = (c.types.k.bytes_for(hd), c.types.v.bytes_for(hd));
                let row = o / hd;
                decode_row(c.types.k, &kc[row * kb..][..kb], &mut k);
                decode_row(c.types.v, &vc[row * vb..][..vb], &mut v);
            }
        }
        (k, v)
    }

    #[test]
    fn saved_bytes_are_each_heads_rows_element_by_element_little_endian() {
        // The session file format: oldest intact position, then K's rows head
        // by head, then V's, each element's little-endian bits.
        let hd = 8;
        for t in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32] {
            let mut c = LayerKvCache::new(CacheLayout::Flat, KvTypes::same(t), 2, hd, 5);
            let k: Vec<f32> = (0..3 * 2 * hd).map(|x| x as f32 * 0.37 - 2.0).collect();
            let v: Vec<f32> = k.iter().map(|x| x * 1.5).collect();
            c.write(0, &k, &v);
            let mut expected = 0u64.to_le_bytes().to_vec();
            for x in [&k, &v] {
                for h in 0..2 {
                    for p in 0..3 {
                        for &e in &x[(p * 2 + h) * hd..][..hd] {
                            match t {
                                KvDtype::F16 => expected
                                    .extend_from_slice(&f16::from_f32(e).to_bits().to_le_bytes()),
                                KvDtype::Bf16 => expected
                                    .extend_from_slice(&bf16::from_f32(e).to_bits().to_le_bytes()),
                                _ => expected.extend_from_slice(&e.to_bits().to_le_bytes()),
                            }
                        }
                    }
                }
            }
            let mut bytes = Vec::new();
            c.save(3, &mut bytes);
            assert_eq!(bytes, expected, "{t:?}");
            assert_eq!(bytes.len(), c.saved_len(3));
        }
    }

    #[test]
    fn save_and_load_round_trip_what_the_positions_need() {
        // A flat cache of 6 slots holding 5 positions; a ring of 6 slots
        // (window 4) that has seen 9. Two heads of 32 values.
        let types = [
            KvTypes::same(KvDtype::F16),
            KvTypes::same(KvDtype::Bf16),
            KvTypes::same(KvDtype::F32),
            KvTypes::same(KvDtype::Q8_0),
            KvTypes::same(KvDtype::Q4_0),
            KvTypes {
                k: KvDtype::Q8_0,
                v: KvDtype::F16,
            },
            KvTypes {
                k: KvDtype::F16,
                v: KvDtype::Q4_0,
            },
        ];
        let hd = 32;
        for (layout, pos) in [(CacheLayout::Flat, 5), (CacheLayout::Ring { window: 4 }, 9)] {
            for t in types {
                let mut c = LayerKvCache::new(layout, t, 2, hd, 6);
                let k: Vec<f32> = (0..pos * 2 * hd)
                    .map(|x| (x % 97) as f32 * 0.25 - 3.0)
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                c.write(0, &k, &v);
                let mut bytes = Vec::new();
                c.save(pos, &mut bytes);
                let mut d = LayerKvCache::new(layout, t, 2, hd, 6);
                assert!(d.load(pos, &bytes[..bytes.len() - 1]).is_none());
                assert_eq!(d.load(pos, &bytes), Some(bytes.len()));
                let first = pos.saturating_sub(6);
                for h in 0..2 {
                    for p in first..pos {
                        assert_eq!(
                            rows_at(&c, h, p),
                            rows_at(&d, h, p),
                            "{layout:?} {t} head {h} pos {p}"
                        );
                        // What was stored is the written row in the cache's types.
                        let src = (p * 2 + h) * hd;
                        let (mut kw, mut vw) =
                            (vec![0u8; t.k.bytes_for(hd)], vec![0u8; t.v.bytes_for(hd)]);
                        encode_row(t.k, &k[src..src + hd], &mut kw);
                        encode_row(t.v, &v[src..src + hd], &mut vw);
                        let (mut ke, mut ve) = (vec![0.0; hd], vec![0.0; hd]);
                        decode_row(t.k, &kw, &mut ke);
                        decode_row(t.v, &vw, &mut ve);
                        assert_eq!(
                            rows_at(&c, h, p),
                            (ke, ve),
                            "{layout:?} {t} head {h} pos {p}"
                        );
                    }
                }
                for q in 0..pos {
                    assert_eq!(c.can_serve(q), d.can_serve(q));
                }
                assert_eq!(c.bytes(), 6 * t.slot_bytes(2, hd));
            }
        }
    }

    /// The FWHT is the product with ggml's Hadamard matrix (llama-kv-cache.cpp
    /// `ggml_gen_hadamard`: H[0][0] = 1/sqrt(n), each doubling [[H, H], [H, -H]]),
    /// and its own inverse; the rotation sizes follow llama.cpp's rules.
    #[test]
    fn fwht_is_the_hadamard_matrix_product() {
        for n in [64usize, 128, 256] {
            let mut h = vec![0.0f32; n * n];
            h[0] = 1.0 / (n as f32).sqrt();
            let mut s = 1;
            while s < n {
                for i in 0..s {
                    for j in 0..s {
                        let val = h[i * n + j];
                        h[(i + s) * n + j] = val;
                        h[i * n + j + s] = val;
                        h[(i + s) * n + j + s] = -val;
                    }
                }
                s *= 2;
            }
            let x: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let mut y = x.clone();
            fwht(&mut y, n);
            for (xr, yr) in x.chunks(n).zip(y.chunks(n)) {
                for i in 0..n {
                    let want: f64 = (0..n).map(|j| h[i * n + j] as f64 * xr[j] as f64).sum();
                    assert!(
                        (yr[i] as f64 - want).abs() < 1e-4,
                        "n {n} row {i}: {} vs {want}",
                        yr[i]
                    );
                }
            }
            fwht(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-4);
            }
        }
        let q8 = KvTypes::same(KvDtype::Q8_0);
        assert_eq!(q8.rotations(64), (Some(64), Some(64)));
        assert_eq!(q8.rotations(128), (Some(128), Some(64)));
        assert_eq!(q8.rotations(256), (Some(256), Some(64)));
        assert_eq!(q8.rotations(192), (Some(64), Some(64)));
        assert_eq!(q8.rotations(96), (None, None));
        assert_eq!(KvTypes::same(KvDtype::F16).rotations(64), (None, None));
        assert_eq!(
            KvTypes {
                k: KvDtype::F16,
                v: KvDtype::Q4_0
            }
            .rotations(128),
            (None, Some(64))
        );
    }

    #[test]
    fn kv_type_names_and_checks() {
        for t in ["f16", "bf16", "f32", "q8_0", "q4_0"] {
            assert_eq!(KvDtype::parse(t).unwrap().name(), t);
        }
        assert!(KvDtype::parse("q5_1").is_none());
        assert_eq!(KvDtype::Q8_0.bytes_for(64), 68);
        assert_eq!(KvDtype::Q4_0.bytes_for(64), 36);
        assert!(KvTypes::same(KvDtype::Q8_0).check(64).is_ok());
        assert!(KvTypes::same(KvDtype::Q8_0).check(80).is_err());
        assert!(KvTypes {
            k: KvDtype::Q8_0,
            v: KvDtype::Bf16
        }
        .check(64)
        .is_err());
        assert_eq!(KvTypes::same(KvDtype::F16).code(), 2);
        assert_ne!(
            KvTypes::same(KvDtype::Q8_0).code(),
            KvTypes::same(KvDtype::Q4_0).code()
        );
    }

    #[test]
    fn ring_keeps_the_last_slots_positions() {
        let mut c = LayerKvCache::new(
            CacheLayout::Ring { window: 4 },
            KvTypes::same(KvDtype::F32),
            1,
            2,
            6,
        );
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
        let mut c = LayerKvCache::new(
            CacheLayout::Ring { window: 4 },
            KvTypes::same(KvDtype::F32),
            1,
            1,
            6,
        );
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
