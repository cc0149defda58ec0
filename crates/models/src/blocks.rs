//! Building blocks shared by every architecture's forward pass. Activations are
//! row-major `[n_tokens, width]` f32 slices.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::config::RopeLayout;
use crate::flash_attn_ggml as fa;
use crate::kv_cache::{KvData, KvDtype, KvElem, LayerKvCache};

/// RMSNorm of every row of `x` (row length = `dim`), in place:
/// x * rsqrt(mean(x²) + eps) * w (no weight: scaleless).
///
/// The squares (f32) are summed in f64 and the mean taken in f64 before
/// rounding to f32, as ggml's `rms_norm` does: an f32 running sum moves the
/// output by an ulp often enough to flip 8-bit activation roundings downstream.
pub fn rmsnorm(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    for row in x.chunks_exact_mut(dim) {
        let sum: f64 = row.iter().map(|v| (v * v) as f64).sum();
        let mean_sq = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        match weight {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, g)| *v = *v * scale * g),
            None => row.iter_mut().for_each(|v| *v *= scale),
        }
    }
}

/// Debug aid: when `HEARTH_DUMP=DIR` is set, writes `x` as raw little-endian
/// f32 to `DIR/<name>-<layer>.bin`, named like llama.cpp's graph tensors
/// (attn_norm, Qcur, kqv_out, l_out, ...) so intermediates can be diffed
/// against a dump of the reference.
/// Whether intermediate tensors are being dumped (`HEARTH_DUMP`): fused
/// passes then run unfused so every intermediate exists.
pub fn dumping() -> bool {
    std::env::var_os("HEARTH_DUMP").is_some()
}

pub fn dump(name: &str, layer: usize, x: &[f32]) {
    if let Some(dir) = std::env::var_os("HEARTH_DUMP") {
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let path = std::path::Path::new(&dir).join(format!("{name}-{layer}.bin"));
        let _ = std::fs::write(path, bytes);
    }
}

/// Rounds every element to bfloat16 (round to nearest even), in place.
pub fn round_bf16(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
}

/// How RoPE frequencies are computed for one layer.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub theta: f32,
    pub layout: RopeLayout,
    /// Number of leading dimensions of each head that rotate (= head_dim here).
    pub n_rot: usize,
    /// ggml computes θ_i by repeated multiplication θ_{i+1} = θ_i · base^(-2/n);
    /// the Muse Glimmer spec computes inv_freq_i = 1/base^(2i/n) directly.
    /// The ggml style also rotates with ggml's fused multiply-adds.
    pub iterative: bool,
}

impl Rope {
    /// Rotates `x` ([T, n_heads, head_dim]) for positions `p0..p0+T`.
    pub fn apply_tokens(&self, x: &mut [f32], n_heads: usize, head_dim: usize, p0: usize) {
        for (i, row) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
            self.apply(row, head_dim, p0 + i);
        }
    }

    /// Rotates each of the `n_heads` heads in `x` ([n_heads, head_dim]) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.n_rot / 2;
        let mut cs = [(0.0f32, 0.0f32); 256];
        let scale = self.theta.powf(-2.0 / self.n_rot as f32);
        let mut theta = pos as f32;
        for (i, c) in cs.iter_mut().take(half).enumerate() {
            let t = if self.iterative {
                let t = theta;
                theta *= scale;
                t
            } else {
                pos as f32 * (1.0 / self.theta.powf(2.0 * i as f32 / self.n_rot as f32))
            };
            *c = (t.cos(), t.sin());
        }
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in cs.iter().take(half).enumerate() {
                let (a, b) = match self.layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                if self.iterative {
                    // ggml's rotate_pairs as GCC contracts it (-O3, fp-contract=fast).
                    head[a] = x0.mul_add(cos, -(x1 * sin));
                    head[b] = x0.mul_add(sin, x1 * cos);
                } else {
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x0 * sin + x1 * cos;
                }
            }
        }
    }
}

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier on q·k.
    pub scale: f32,
}

/// Causal attention for a chunk of `T` new tokens at positions `p0..p0+T`.
///
/// `q`: [T, n_heads, head_dim] (already normed/rotated); `k_new`, `v_new`:
/// [T, n_kv_heads, head_dim], already rounded to the cache precision. Keys
/// older than `p0` are read from `cache` in place (ring or flat); the chunk's
/// own keys from `k_new`/`v_new`. Query head h uses KV head h / (n_heads /
/// n_kv_heads). Writes [T, n_heads, head_dim] into `out`.
pub fn attention(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    p0: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    match &cache.data {
        KvData::F16 { k, v } => attention_f16_flash(q, k_new, v_new, cache, k, v, p0, s, out),
        KvData::Bf16 { k, v } => attention_in(q, k_new, v_new, cache, k, v, p0, s, out),
        KvData::F32 { k, v } => attention_in(q, k_new, v_new, cache, k, v, p0, s, out),
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_in<E: KvElem>(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    kc: &[E],
    vc: &[E],
    p0: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let dtype = cache.dtype;
    let kv_row = s.n_kv_heads * hd;
    // One work item per (token, head): [T * n_heads] rows of head_dim.
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / s.n_heads, idx % s.n_heads);
        let kvh = h / group;
        let qpos = p0 + t;
        // The reference kernels read q in the cache's precision.
        let qv: Vec<f32> = q[idx * hd..(idx + 1) * hd]
            .iter()
            .map(|&x| dtype.round(x))
            .collect();
        let lo = cache.window_start(qpos);
        let mut scores = Vec::with_capacity(qpos + 1 - lo);
        let mut max = f32::NEG_INFINITY;
        // The hot loop: q·k over the window, old keys from the cache in place.
        for pos in lo..=qpos {
            let dot: f32 = if pos >= p0 {
                let off = (pos - p0) * kv_row + kvh * hd;
                qv.iter()
                    .zip(&k_new[off..off + hd])
                    .map(|(a, b)| a * b)
                    .sum()
            } else {
                let off = cache.row_offset(kvh, pos);
                qv.iter()
                    .zip(&kc[off..off + hd])
                    .map(|(a, b)| a * b.to_f32())
                    .sum()
            };
            let sc = dot * s.scale;
            max = max.max(sc);
            scores.push(sc);
        }
        let mut sum = 0.0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        o.fill(0.0);
        for (i, pos) in (lo..=qpos).enumerate() {
            let p = scores[i] / sum;
            if pos >= p0 {
                let off = (pos - p0) * kv_row + kvh * hd;
                o.iter_mut()
                    .zip(&v_new[off..off + hd])
                    .for_each(|(acc, b)| *acc += p * b);
            } else {
                let off = cache.row_offset(kvh, pos);
                o.iter_mut()
                    .zip(&vc[off..off + hd])
                    .for_each(|(acc, b)| *acc += p * b.to_f32());
            }
        }
    });
}

/// Attention over an f16 cache with llama.cpp's CPU flash-attention rounding:
/// the f16 path, the split-KV decode path or the tiled f32 path, chosen as
/// llama.cpp chooses them (see `flash_attn_ggml`). Same shapes as [`attention`].
#[allow(clippy::too_many_arguments)]
fn attention_f16_flash(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    cache: &LayerKvCache,
    kc: &[f16],
    vc: &[f16],
    p0: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let t_len = q.len() / (s.n_heads * hd);
    let cells = fa::Cells::of(cache);
    let kv_row = s.n_kv_heads * hd;
    let source = |kvh: usize| fa::KvSource {
        k_new,
        v_new,
        kc,
        vc,
        cache,
        p0,
        kv_row,
        kvh,
    };
    let invariant = hearth_kernels::cpu::packed::batch_invariant();
    if t_len >= fa::TILED_MIN_ROWS && !invariant {
        // Rows sharing a KV head go together (its tiles are converted once),
        // in chunks so that both threads have work.
        const ROWS_PER_TASK: usize = 32;
        let tasks: Vec<(usize, Vec<usize>)> = (0..s.n_kv_heads)
            .flat_map(|kvh| {
                let idx: Vec<usize> = (0..t_len)
                    .flat_map(|t| (kvh * group..(kvh + 1) * group).map(move |h| t * s.n_heads + h))
                    .collect();
                idx.chunks(ROWS_PER_TASK)
                    .map(|c| (kvh, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Tasks are taken dynamically by the threads of the forward pass's pool.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<Vec<f32>>> =
            tasks.iter().map(|_| Default::default()).collect();
        hearth_kernels::pool::global().run(|_, _| loop {
            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((kvh, idx)) = tasks.get(k) else {
                break;
            };
            let rows: Vec<(&[f32], usize, usize)> = idx
                .iter()
                .map(|&i| {
                    let qpos = p0 + i / s.n_heads;
                    (&q[i * hd..(i + 1) * hd], qpos, cache.window_start(qpos))
                })
                .collect();
            *slots[k].lock().unwrap() =
                fa::tiled_rows(&rows, &source(*kvh), cells, p0 + t_len - 1, s.scale);
        });
        let results: Vec<Vec<f32>> = slots.into_iter().map(|m| m.into_inner().unwrap()).collect();
        for ((_, idx), res) in tasks.iter().zip(&results) {
            for (&i, row) in idx.iter().zip(res.chunks_exact(hd)) {
                out[i * hd..(i + 1) * hd].copy_from_slice(row);
            }
        }
        return;
    }
    // One work item per (token, KV head, part of its heads): the heads of a
    // token that share a KV head read each key and value once. A group is
    // cut into parts only when there are fewer groups than threads.
    let pool = hearth_kernels::pool::global();
    let groups = t_len * s.n_kv_heads;
    let parts = pool.n_threads().div_ceil(groups).clamp(1, group);
    let per_part = group.div_ceil(parts);
    let items = groups * parts;
    let out_ptr = hearth_kernels::pool::SendPtr(out.as_mut_ptr());
    pool.run(|i, n| {
        for item in hearth_kernels::pool::share(items, i, n) {
            let (g, part) = (item / parts, item % parts);
            let (t, kvh) = (g / s.n_kv_heads, g % s.n_kv_heads);
            let first = kvh * group + part * per_part;
            let heads = first..(first + per_part).min((kvh + 1) * group);
            if heads.is_empty() {
                continue;
            }
            // SAFETY: the rows of (t, heads) are written by this thread only.
            let mut outs: Vec<&mut [f32]> = heads
                .clone()
                .map(|h| unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get().add((t * s.n_heads + h) * hd), hd)
                })
                .collect();
            let qs: Vec<&[f32]> = heads
                .map(|h| &q[(t * s.n_heads + h) * hd..][..hd])
                .collect();
            let src = source(kvh);
            let qpos = p0 + t;
            let lo = cache.window_start(qpos);
            if (t_len == 1 || invariant) && fa::use_split_kv(cells, qpos) {
                fa::split_kv_rows(&qs, &src, cells, lo, qpos, s.scale, &mut outs);
            } else {
                fa::f16_rows(&qs, &src, lo, qpos, s.scale, &mut outs);
            }
        }
    });
}

/// Rounds K or V rows to the cache precision (in place), so the chunk's own
/// keys are seen exactly as later chunks will read them from the cache.
pub fn round_to_cache(x: &mut [f32], dtype: KvDtype) {
    x.iter_mut().for_each(|v| *v = dtype.round(*v));
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// exp(x) as ggml's AVX-512 `ggml_v_expf` computes it (ARM's optimized
/// routine: n = round(x·log2 e), a degree-5 polynomial in the reduced
/// argument, scaled by 2^n), not libm's `expf`. Past |n| > 192 it gives 0
/// for n <= 0 and +inf otherwise (so exp(-inf) = 0).
#[inline(always)]
pub fn expf_ggml_v(x: f32) -> f32 {
    // Branch-free (select at the end) so loops over it vectorize.
    const R: f32 = 12582912.0; // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8aa3b), R); // log2(e)
    let n = z - R;
    let b = (-n).mul_add(f32::from_bits(0x3f317200), x); // ln2 high
    let b = (-n).mul_add(f32::from_bits(0x35bfbe8e), b); // ln2 low
    let u = b * b;
    let p_hi = f32::from_bits(0x3c072010).mul_add(b, f32::from_bits(0x3d2b9f17));
    let p_mid = f32::from_bits(0x3e2aaf33).mul_add(b, f32::from_bits(0x3efffedb));
    let p_lo = f32::from_bits(0x3f7ffff6).mul_add(b, 1.0);
    let j = p_hi.mul_add(u, p_mid).mul_add(u, p_lo);
    // _mm512_scalef_ps: j · 2^n with one rounding (exact in f64, then to f32);
    // 2^n is exact in f64 for |n| <= 192.
    let nc = n.clamp(-192.0, 192.0);
    let r = (j as f64 * f64::from_bits(((nc as i64 + 1023) as u64) << 52)) as f32;
    let special = if n <= 0.0 { 0.0 } else { f32::INFINITY };
    if n.abs() > 192.0 {
        special
    } else {
        r
    }
}

/// SwiGLU as ggml's `ggml_vec_swiglu_f32` evaluates it on AVX-512, per row
/// of `row` values: `silu(a) * b` with silu = a / (1 + expf_ggml_v(-a)) for
/// whole groups of 16, libm `expf` for a row's tail.
pub fn swiglu_ggml(a: &mut [f32], b: &[f32], row: usize) {
    for (ra, rb) in a.chunks_exact_mut(row).zip(b.chunks_exact(row)) {
        let vec_len = row & !15;
        for (x, y) in ra[..vec_len].iter_mut().zip(&rb[..vec_len]) {
            *x = *x / (1.0 + expf_ggml_v(0.0 - *x)) * y;
        }
        glu(&mut ra[vec_len..], &rb[vec_len..], silu);
    }
}

/// GELU, tanh approximation (as used by Gemma).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

/// [`gelu_tanh`] as GCC compiles ggml's `ggml_gelu_f32` (-O3, fp-contract=fast):
/// `1 + a·x·x` becomes one fused multiply-add.
fn gelu_tanh_fma(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (0.044715 * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// GELU as llama.cpp's CPU backend evaluates it: the input rounded to f16,
/// looked up in a table of f16 results (`GGML_GELU_FP16`), so exactly
/// f16(gelu(f16(x))) inside (-10, 10). Gemma's parity with the reference
/// depends on matching this rounding.
#[inline]
pub fn gelu_f16_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        // ggml's table: one entry per f16 input.
        static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
        let table = TABLE.get_or_init(|| {
            (0..=u16::MAX)
                .map(|bits| {
                    half::f16::from_f32(gelu_tanh_fma(half::f16::from_bits(bits).to_f32())).to_f32()
                })
                .collect()
        });
        table[half::f16::from_f32(x).to_bits() as usize]
    }
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `a[i] = act(a[i]) * b[i]`: the gated-linear-unit product of an MLP.
pub fn glu(a: &mut [f32], b: &[f32], act: fn(f32) -> f32) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x = act(*x) * y);
}

/// `x += y` elementwise.
pub fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §8.4: inv_freq_1 = 0.8146172, inv_freq_63 = 2.455141e-6 for base 500000, d=128.
    #[test]
    fn rope_frequencies_match_spec() {
        let inv = |i: f32| 1.0 / 500000f32.powf(2.0 * i / 128.0);
        assert!((inv(1.0) - 0.8146172).abs() < 1e-6);
        assert!((inv(63.0) - 2.455141e-6).abs() < 1e-11);
        let mut x: Vec<f32> = (0..128).map(|i| i as f32).collect();
        let orig = x.clone();
        Rope {
            theta: 500000.0,
            layout: RopeLayout::Interleaved,
            n_rot: 128,
            iterative: false,
        }
        .apply(&mut x, 128, 0);
        assert_eq!(x, orig, "position 0 leaves q and k unchanged");
    }
}
