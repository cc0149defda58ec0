//! Attention launches (attention.cu): shapes, the KV cache kinds, splits of
//! the keys and the masking modes.

use super::*;

/// Attention shapes for one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub slots: usize,
    /// 0 = global (flat cache).
    pub window: usize,
    pub scale: f32,
    pub kv: KvKind,
}

/// What a GPU KV cache stores (attention.cu's FA_16 / FA_Q8 / FA_Q4 and
/// prepare_heads' HEAD_KV_* flags). A block type's layer buffer holds every
/// row's quants first ([n_kv, slots, hd] bytes for q8_0, hd / 2 for q4_0),
/// then every row's f16 block scales ([n_kv, slots, hd / 32]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvKind {
    F16,
    Bf16,
    Q8_0,
    Q4_0,
}

impl KvKind {
    /// The kind of a cache of `types` (K and V of one type on the GPU), or
    /// why the CUDA kernels cannot hold it.
    pub fn of(types: hearth_models::KvTypes) -> Result<KvKind> {
        use hearth_models::KvDtype;
        if types.k != types.v {
            return Err(CudaError::Unsupported(format!(
                "a KV cache of K {} with V {} (the CUDA kernels take one type for both: f16, q8_0 or q4_0)",
                types.k.name(),
                types.v.name()
            )));
        }
        match types.k {
            KvDtype::F16 => Ok(KvKind::F16),
            KvDtype::Bf16 => Ok(KvKind::Bf16),
            KvDtype::Q8_0 => Ok(KvKind::Q8_0),
            KvDtype::Q4_0 => Ok(KvKind::Q4_0),
            t => Err(CudaError::Unsupported(format!(
                "a {} KV cache (the CUDA kernels take f16, q8_0 or q4_0)",
                t.name()
            ))),
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, KvKind::Q8_0 | KvKind::Q4_0)
    }

    /// Bytes of one head's row of `head_dim` values: (quants or values, scales).
    pub fn row_bytes(self, head_dim: usize) -> (usize, usize) {
        match self {
            KvKind::F16 | KvKind::Bf16 => (head_dim * 2, 0),
            KvKind::Q8_0 => (head_dim, head_dim / 16),
            KvKind::Q4_0 => (head_dim / 2, head_dim / 16),
        }
    }

    /// Bytes of a layer's K (or V) buffer.
    pub fn buffer_bytes(self, n_kv: usize, slots: usize, head_dim: usize) -> usize {
        let (q, s) = self.row_bytes(head_dim);
        n_kv * slots * (q + s)
    }

    /// prepare_heads' flags for writing this cache: its storage and
    /// llama.cpp's rotations of a quantized cache (every head size the
    /// kernels take is a multiple of 64, so both K and V rotate).
    pub fn head_flags(self) -> i32 {
        match self {
            KvKind::F16 => 0,
            KvKind::Bf16 => HEAD_KV_BF16,
            KvKind::Q8_0 => HEAD_KV_Q8 | HEAD_ROT_K | HEAD_ROT_V,
            KvKind::Q4_0 => HEAD_KV_Q4 | HEAD_ROT_K | HEAD_ROT_V,
        }
    }

    /// attn_combine's flag for reading this cache's attention output:
    /// rotated back from a quantized V's basis.
    pub fn combine_flags(self) -> i32 {
        if self.is_quantized() {
            OUT_ROT64
        } else {
            0
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvKind::F16 => "f16",
            KvKind::Bf16 => "bf16",
            KvKind::Q8_0 => "q8_0",
            KvKind::Q4_0 => "q4_0",
        }
    }
}

/// Dynamic shared memory of the head-dim-256 attention kernels (attention.cu:
/// 2 stages of a K and a V tile of 32 keys x 256 halves); the others use
/// static shared memory.
fn fa_dyn_smem_bytes(head_dim: usize, kv: KvKind) -> u32 {
    const FA_BK: usize = 32;
    let tiles = 2 * FA_BK * head_dim * 2; // a K and a V tile of 16-bit values
    let (q, s) = kv.row_bytes(head_dim);
    match (head_dim, kv.is_quantized()) {
        (256, false) => (2 * tiles) as u32,
        // 2 stages of staged quants and scales, then the f16 tile pair.
        (256, true) => (2 * 2 * FA_BK * (q + s) + tiles) as u32,
        _ => 0,
    }
}

/// Checks that the attention kernels support these shapes.
pub fn check_attn_shape(n_heads: usize, n_kv: usize, head_dim: usize) -> Result<()> {
    if !matches!(head_dim, 64 | 128 | 256) {
        return Err(CudaError::Unsupported(format!(
            "head_dim {head_dim} (the attention kernels take 64, 128 or 256)"
        )));
    }
    if n_kv == 0 || !n_heads.is_multiple_of(n_kv) || n_heads / n_kv > 16 {
        return Err(CudaError::Unsupported(format!(
            "{n_heads} query heads over {n_kv} kv heads (at most 16 per kv head)"
        )));
    }
    Ok(())
}

/// Query rows (token, head of the group) per block of the `_b` attention
/// kernels (4 warps of 16); at most 16 rows go to the `_d` kernel (one 16-row
/// tile, two warps splitting each key tile).
pub const ATTN_BLOCK_ROWS: usize = 64;

/// Blocks of the attention kernel per split for `n_tokens` tokens: one for a
/// decode-sized group of rows (G * T <= 16), else one per 64 rows.
pub fn attn_row_blocks(a: &AttnArgs, n_tokens: usize) -> usize {
    let rows = a.n_heads / a.n_kv * n_tokens;
    if rows <= 16 {
        1
    } else {
        rows.div_ceil(ATTN_BLOCK_ROWS)
    }
}

/// Which keys the rows of a pass see (attention.cu's masking modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMode {
    /// Token t at position pos + t sees positions up to its own (prefill, decode).
    Causal = 0,
    /// Causal, each token computed exactly as a one-token decode pass at its
    /// position computes it (decode kernel, decode splits): a batch-invariant
    /// verify pass. Needs n_heads / n_kv <= 16.
    PerToken = 1,
    /// Every token sees every position up to the pass's last (the DFlash
    /// drafter's non-causal block over its context).
    Full = 2,
}

/// out [T, n_heads, hd] = attention of q [T, n_heads, hd] over the cache, in
/// `splits` splits of the keys per (kv head, block of query rows), through the
/// partial buffers ([T, n_heads, splits] rows) and `attn_combine`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    g: &Gpu,
    a: &AttnArgs,
    n_tokens: usize,
    splits: usize,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    pos: u64,
    part_o: u64,
    part_ml: u64,
    out: u64,
    out_flags: i32,
    q8: Option<Q8>,
) -> Result<()> {
    attention_mode(
        g,
        a,
        AttnMode::Causal,
        n_tokens,
        splits,
        (q, k_cache, v_cache, pos),
        (part_o, part_ml),
        out,
        out_flags,
        q8,
    )
}

/// [`attention`] with a masking mode. `io`: (q, k_cache, v_cache, pos);
/// `parts`: (part_o, part_ml).
#[allow(clippy::too_many_arguments)]
pub fn attention_mode(
    g: &Gpu,
    a: &AttnArgs,
    mode: AttnMode,
    n_tokens: usize,
    splits: usize,
    (q, k_cache, v_cache, pos): (u64, u64, u64, u64),
    (part_o, part_ml): (u64, u64),
    out: u64,
    out_flags: i32,
    q8: Option<Q8>,
) -> Result<()> {
    let q8 = q8.unwrap_or(Q8 { q: 0, d: 0, s: 0 });
    let group = a.n_heads / a.n_kv;
    if mode == AttnMode::PerToken && group > 16 {
        return Err(CudaError::Unsupported(format!(
            "batch-invariant attention with {group} query heads per kv head (at most 16)"
        )));
    }
    let decode = match mode {
        AttnMode::PerToken => true,
        _ => group * n_tokens <= 16,
    };
    let row_blocks = match mode {
        AttnMode::PerToken => n_tokens,
        _ => attn_row_blocks(a, n_tokens),
    };
    let name = match (a.head_dim, a.kv, decode) {
        (64, KvKind::F16, true) => "fa_attn_64_f16_d",
        (64, KvKind::Bf16, true) => "fa_attn_64_bf16_d",
        (128, KvKind::F16, true) => "fa_attn_128_f16_d",
        (128, KvKind::Bf16, true) => "fa_attn_128_bf16_d",
        (256, KvKind::F16, true) => "fa_attn_256_f16_d",
        (64, KvKind::F16, false) => "fa_attn_64_f16_b",
        (64, KvKind::Bf16, false) => "fa_attn_64_bf16_b",
        (128, KvKind::F16, false) => "fa_attn_128_f16_b",
        (128, KvKind::Bf16, false) => "fa_attn_128_bf16_b",
        (256, KvKind::F16, false) => "fa_attn_256_f16_b",
        (64, KvKind::Q8_0, true) => "fa_attn_64_q8_d",
        (128, KvKind::Q8_0, true) => "fa_attn_128_q8_d",
        (256, KvKind::Q8_0, true) => "fa_attn_256_q8_d",
        (64, KvKind::Q8_0, false) => "fa_attn_64_q8_b",
        (128, KvKind::Q8_0, false) => "fa_attn_128_q8_b",
        (256, KvKind::Q8_0, false) => "fa_attn_256_q8_b",
        (64, KvKind::Q4_0, true) => "fa_attn_64_q4_d",
        (128, KvKind::Q4_0, true) => "fa_attn_128_q4_d",
        (256, KvKind::Q4_0, true) => "fa_attn_256_q4_d",
        (64, KvKind::Q4_0, false) => "fa_attn_64_q4_b",
        (128, KvKind::Q4_0, false) => "fa_attn_128_q4_b",
        (256, KvKind::Q4_0, false) => "fa_attn_256_q4_b",
        (hd, kv, _) => {
            return Err(CudaError::Unsupported(format!(
                "attention over a {} KV cache with head_dim {hd}",
                kv.name()
            )))
        }
    };
    g.launch_smem(
        name,
        (row_blocks as u32, a.n_kv as u32, splits as u32),
        if decode { 64 } else { 128 },
        fa_dyn_smem_bytes(a.head_dim, a.kv),
        &[
            Arg::Ptr(q),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(pos),
            Arg::I32(n_tokens as i32),
            Arg::I32(a.n_heads as i32),
            Arg::I32(a.n_kv as i32),
            Arg::I32(a.slots as i32),
            Arg::I32(a.window as i32),
            Arg::F32(a.scale),
            Arg::Ptr(part_o),
            Arg::Ptr(part_ml),
            Arg::I32(mode as i32),
        ],
    )?;
    g.launch(
        "attn_combine",
        (a.n_heads as u32, n_tokens as u32, 1),
        a.head_dim as u32,
        &[
            Arg::Ptr(part_o),
            Arg::Ptr(part_ml),
            Arg::I32(splits as i32),
            Arg::I32(a.head_dim as i32),
            Arg::I32(out_flags),
            Arg::Ptr(out),
            Arg::Ptr(q8.q),
            Arg::Ptr(q8.d),
            Arg::Ptr(q8.s),
        ],
    )
}
