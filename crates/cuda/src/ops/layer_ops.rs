//! The per-layer element-wise and row kernels (layer_ops.cu): RMSNorm, scale
//! and bias, logit transform, argmax, head preparation, the gated activation.

use super::*;

/// RMSNorm of `rows` rows of width `dim` from x into out (see the kernel for
/// flags); `gain` 0 = scaleless; `q8` also quantizes the result.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    g: &Gpu,
    x: u64,
    out: u64,
    gain: u64,
    rows: usize,
    dim: usize,
    eps: f32,
    flags: i32,
    q8: Option<Q8>,
) -> Result<()> {
    let a = q8.unwrap_or(Q8 { q: 0, d: 0, s: 0 });
    g.launch(
        "rmsnorm",
        (rows as u32, 1, 1),
        g.norm_threads.load(std::sync::atomic::Ordering::Relaxed),
        &[
            Arg::Ptr(x),
            Arg::Ptr(out),
            Arg::Ptr(gain),
            Arg::I32(dim as i32),
            Arg::F32(eps),
            Arg::I32(flags),
            Arg::Ptr(a.q),
            Arg::Ptr(a.d),
            Arg::Ptr(a.s),
        ],
    )
}

/// out = y · s (+ bias[i % width]) (+ out with OUT_ADD) over n values.
#[allow(clippy::too_many_arguments)]
pub fn scale_bias(
    g: &Gpu,
    y: u64,
    out: u64,
    n: usize,
    width: usize,
    s: f32,
    bias: u64,
    flags: i32,
) -> Result<()> {
    g.launch(
        "scale_bias",
        (n.div_ceil(256).clamp(1, 65535) as u32, 1, 1),
        256,
        &[
            Arg::Ptr(y),
            Arg::Ptr(out),
            Arg::I32(n as i32),
            Arg::I32(width as i32),
            Arg::F32(s),
            Arg::Ptr(bias),
            Arg::I32(flags),
        ],
    )
}

/// z = z · scale, then cap · tanh(z / cap) when cap > 0, over n logits.
pub fn logit_transform(g: &Gpu, z: u64, n: usize, scale: f32, cap: f32) -> Result<()> {
    g.launch(
        "logit_transform",
        (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
        256,
        &[
            Arg::Ptr(z),
            Arg::I32(n as i32),
            Arg::F32(scale),
            Arg::F32(cap),
        ],
    )
}

/// out[r] (i32) = argmax of row r of x ([rows, n]; the lowest index on a tie).
pub fn argmax_rows(g: &Gpu, x: u64, rows: usize, n: usize, out: u64) -> Result<()> {
    g.launch(
        "argmax_rows",
        (rows as u32, 1, 1),
        1024,
        &[Arg::Ptr(x), Arg::I32(n as i32), Arg::Ptr(out)],
    )
}

/// Shapes and RoPE/norm settings for `prepare_heads`.
#[derive(Clone, Copy, Debug)]
pub struct HeadPrep {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub theta: f32,
    pub eps: f32,
    pub flags: i32,
}

/// Norms/rotates q and k of `n_tokens` tokens and writes k, v into the cache.
#[allow(clippy::too_many_arguments)]
pub fn prepare_heads(
    g: &Gpu,
    p: &HeadPrep,
    n_tokens: usize,
    q: u64,
    k: u64,
    v: u64,
    gains: (u64, u64),
    pos: u64,
    k_cache: u64,
    v_cache: u64,
    slots: usize,
) -> Result<()> {
    let blocks = n_tokens * (p.n_heads + 2 * p.n_kv);
    g.launch(
        "prepare_heads",
        (blocks as u32, 1, 1),
        (p.head_dim / 2) as u32,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::Ptr(gains.0),
            Arg::Ptr(gains.1),
            Arg::I32(p.n_heads as i32),
            Arg::I32(p.n_kv as i32),
            Arg::I32(p.head_dim as i32),
            Arg::Ptr(pos),
            Arg::F32(p.theta),
            Arg::F32(p.eps),
            Arg::I32(p.flags),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::I32(slots as i32),
        ],
    )
}

/// out = glu(a, b) over n values, quantized into `q8` (and stored as f32 in `out` unless 0).
#[allow(clippy::too_many_arguments)]
pub fn glu_q8(
    g: &Gpu,
    a: u64,
    b: u64,
    n: usize,
    mode: i32,
    flags: i32,
    out: u64,
    q8: Q8,
) -> Result<()> {
    g.launch(
        "glu_q8",
        grid1(n / 32, 8),
        256,
        &[
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::I32(n as i32),
            Arg::I32(mode),
            Arg::I32(flags),
            Arg::Ptr(out),
            Arg::Ptr(q8.q),
            Arg::Ptr(q8.d),
            Arg::Ptr(q8.s),
        ],
    )
}
