//! Kernel timings on the device (`hearth bench --device cuda --kernels`):
//! the decode GEMV variants, split-K attention at long context, the prefill
//! GEMM and the norm, each against the bytes or FLOPs it must move or do, so
//! that one device run can pick variants and show where decode time goes.

use crate::driver::{DevBuf, Gpu};
use crate::error::Result;
use crate::gemm;
use crate::ops::{self, GpuMatrix, Q8};
use crate::repack::WeightKind;

/// Pseudo-random bytes on the device (never zeros), f16 scale fields made finite.
fn random_matrix(
    g: &Gpu,
    kind: WeightKind,
    rows: usize,
    cols: usize,
    seed: u32,
) -> Result<(GpuMatrix, DevBuf, DevBuf)> {
    let n_blocks = rows * cols / kind.block().0;
    let (nb, ns) = crate::repack::split_sizes(kind, n_blocks);
    let body = g.alloc(nb, "kernel bench")?;
    // Random halves in [-1, 1) as bytes: quant bits look random; K-quant d/dmin
    // fields become small f16 values.
    g.fill_random(body.ptr, nb / 2, seed as i32, false)?;
    let scales = g.alloc(ns.max(2), "kernel bench")?;
    g.fill_random(scales.ptr, ns.max(2) / 2, seed as i32 + 1, false)?;
    let m = GpuMatrix {
        kind,
        rows,
        cols,
        body: body.ptr,
        scales: if ns > 0 { scales.ptr } else { 0 },
        tune: Default::default(),
        scale: None,
    };
    Ok((m, body, scales))
}

/// A flat f16 K and V cache of `ctx` positions filled with random values; returns them and the bytes of each.
fn random_cache(g: &Gpu, nkv: usize, ctx: usize, hd: usize) -> Result<(DevBuf, DevBuf, usize)> {
    let kvb = nkv * ctx * hd * 2;
    let kc = g.alloc(kvb, "kernel bench")?;
    let vc = g.alloc(kvb, "kernel bench")?;
    for b in [&kc, &vc] {
        g.fill_random(b.ptr, kvb / 2, 3, false)?;
    }
    Ok((kc, vc, kvb))
}

/// Head dimension of the attention benchmarks.
const ATT_HD: usize = 128;

/// Times attention for `t` tokens at positions `pos0..` over a random flat f16
/// cache holding `pos0 + t` positions, `heads` = (query heads, kv heads), with
/// `splits` (None: the count the model would pick, GpuModel::attention).
/// Returns milliseconds, the splits used and the bytes of K (or V).
#[allow(clippy::too_many_arguments)]
fn time_attention(
    g: &Gpu,
    reps: usize,
    (nh, nkv): (usize, usize),
    pos0: usize,
    t: usize,
    splits: Option<usize>,
    q: u64,
    out: u64,
) -> Result<(f64, usize, usize)> {
    let ctx = pos0 + t;
    let (kc, vc, kvb) = random_cache(g, nkv, ctx, ATT_HD)?;
    let pos = g.alloc(4, "kernel bench")?;
    g.upload(pos.ptr, &[pos0 as i32])?;
    let args = ops::AttnArgs {
        n_heads: nh,
        n_kv: nkv,
        head_dim: ATT_HD,
        slots: ctx,
        window: 0,
        scale: 0.088,
        kv: ops::KvKind::F16,
    };
    let splits = splits.unwrap_or_else(|| {
        crate::forward::block_splits(ctx, t, nkv * ops::attn_row_blocks(&args, t))
    });
    let part_o = g.alloc(t * nh * splits * ATT_HD * 4, "kernel bench")?;
    let part_ml = g.alloc(t * nh * splits * 2 * 4, "kernel bench")?;
    let ms = g.median_ms(reps, || {
        ops::attention(
            g,
            &args,
            t,
            splits,
            q,
            kc.ptr,
            vc.ptr,
            pos.ptr,
            part_o.ptr,
            part_ml.ptr,
            out,
            0,
            None,
        )
    })?;
    Ok((ms, splits, kvb))
}

/// Runs the kernel benchmarks and returns a report (one line per case).
pub fn run(g: &Gpu) -> Result<String> {
    let mut out = String::new();
    let reps = 30;
    // Activations for K up to 27648 and 512 tokens.
    let kmax = 27648;
    let x = g.alloc(512 * kmax * 4, "kernel bench")?;
    g.fill_random(x.ptr, 512 * kmax * 2, 5, true)?;
    // bf16 bit patterns reinterpreted as f32 pairs are finite; quantize them.
    let aq = g.alloc(512 * kmax, "kernel bench")?;
    let ad = g.alloc(512 * kmax / 32 * 4, "kernel bench")?;
    let as_ = g.alloc(512 * kmax / 32 * 4, "kernel bench")?;
    let a8 = Q8 {
        q: aq.ptr,
        d: ad.ptr,
        s: as_.ptr,
    };
    ops::quantize_q8(g, x.ptr, a8, 512 * kmax)?;
    let y = g.alloc(512 * 152064 * 4, "kernel bench")?;
    let xh = g.alloc(512 * kmax * 2, "kernel bench")?;
    out += "GEMV, one token (weights read once; GB/s = weight bytes / time):\n";
    let cases: [(WeightKind, usize, usize); 8] = [
        (WeightKind::Q4K, 27648, 5120),
        (WeightKind::Q6K, 5120, 27648),
        (WeightKind::Q4K, 6144, 5120),
        (WeightKind::Q4K, 55296, 5120),
        (WeightKind::Q4K, 5120, 27648),
        (WeightKind::Q4K, 5120, 5120),
        (WeightKind::Q6K, 152064, 5120),
        (WeightKind::Q4K, 19968, 6656),
    ];
    // One timing line of a GEMV on `m` (GB/s = weight bytes / time).
    let gemv_line = |label: &str, m: &GpuMatrix, ms: f64| {
        let (kind, rows, cols) = (m.kind, m.rows, m.cols);
        let bytes = (rows * cols / kind.block().0 * kind.block().1) as f64;
        format!(
            "  gemv {label} {:?} {rows:6} x {cols:5}: {:8.1} us {:7.0} GB/s\n",
            kind,
            ms * 1e3,
            bytes / (ms * 1e-3) / 1e9
        )
    };
    // Times the GEMM of `t` tokens on `m`: its line (TFLOP/s).
    let gemm_line = |m: &GpuMatrix, t: usize| -> Result<String> {
        let (kind, rows, cols) = (m.kind, m.rows, m.cols);
        let ms = g.median_ms(10, || {
            gemm::gemm(g, m, x.ptr, xh.ptr, t, y.ptr, rows, 0, 0, false)
        })?;
        let tflops = 2.0 * rows as f64 * cols as f64 * t as f64 / (ms * 1e-3) / 1e12;
        Ok(format!(
            "  gemm {t:3} tokens     {:?} {rows:6} x {cols:5}: {:8.1} us {:7.1} TFLOP/s\n",
            kind,
            ms * 1e3,
            tflops
        ))
    };
    for (kind, rows, cols) in cases {
        let (m, _b, _s) = random_matrix(g, kind, rows, cols, 11)?;
        for tune in ops::gemv_variants(g.info.sm_count as u32) {
            let ms = g.median_ms(reps, || {
                ops::gemv_single(g, &m, tune, a8, y.ptr, rows, 0, 0)
            })?;
            let label = format!("r{} u{} blocks {:5}", tune.r, tune.u, tune.blocks);
            out += &gemv_line(&label, &m, ms);
        }
        let xv = ops::gemv_x_variants(&m, g.info.sm_count as u32);
        for &tune in &xv {
            let ms = g.median_ms(reps, || {
                ops::gemv_single(g, &m, tune, a8, y.ptr, rows, 0, 0)
            })?;
            let label = format!("x r{} blocks {:5} ", tune.r, tune.blocks);
            out += &gemv_line(&label, &m, ms);
        }
        for nt in [2usize, 4, 8, 16] {
            let ms = g.median_ms(reps, || ops::gemv_warps(g, &m, a8, nt, y.ptr, rows, 0, 0))?;
            out += &gemv_line(&format!("{nt} tokens      "), &m, ms);
            if nt >= ops::MMA_MIN_TOKENS && ops::has_tensor_core_gemv(kind) {
                let ms = g.median_ms(reps, || {
                    ops::gemv_tensor_cores(g, &m, a8, nt, y.ptr, rows, 0, 0)
                })?;
                out += &gemv_line(&format!("{nt} tokens mma  "), &m, ms);
            }
            if let Some(&first) = xv.iter().find(|v| v.blocks == 0) {
                let mut mx = m;
                mx.tune = first;
                let ms = g.median_ms(reps, || ops::gemv(g, &mx, a8, nt, y.ptr, rows, 0, 0))?;
                out += &gemv_line(&format!("{nt} tokens x    "), &m, ms);
            }
        }
        for t in [64usize, 512] {
            out += &gemm_line(&m, t)?;
        }
    }
    // Q6_K GEMM shapes of Q4_K_M models (attn_v / ffn_down), multiples of the 128 x 128 tile.
    for (kind, rows, cols) in [
        (WeightKind::Q6K, 5120usize, 27648usize),
        (WeightKind::Q6K, 1024, 5120),
    ] {
        let (m, _b, _s) = random_matrix(g, kind, rows, cols, 12)?;
        out += &gemm_line(&m, 512)?;
    }
    out += "Attention, one token, split-K over a flat f16 cache (GB/s = K+V bytes / time):\n";
    for &(nh, nkv, ctx, splits) in &[
        (40usize, 8usize, 32768usize, 64usize),
        (40, 8, 32768, 128),
        (40, 8, 32768, 32),
        (32, 2, 131072, 256),
        (32, 2, 131072, 128),
    ] {
        let (ms, _, kvb) =
            time_attention(g, reps, (nh, nkv), ctx - 1, 1, Some(splits), x.ptr, y.ptr)?;
        out += &format!(
            "  heads {nh}/{nkv} ctx {ctx:6} splits {splits:3}: {:8.1} us {:7.0} GB/s\n",
            ms * 1e3,
            2.0 * kvb as f64 / (ms * 1e-3) / 1e9
        );
    }
    out += "Attention, a prefill block of 512 tokens over a flat f16 cache, causal (TFLOP/s = 4 hd keys rows / time):\n";
    for &(nh, nkv, depth) in &[(40usize, 8usize, 0usize), (40, 8, 32768)] {
        let t = 512;
        let (ms, splits, _) = time_attention(g, reps, (nh, nkv), depth, t, None, x.ptr, y.ptr)?;
        // Keys seen: token i sees depth + i + 1.
        let keys = (t * depth + t * (t + 1) / 2) as f64;
        out += &format!(
            "  heads {nh}/{nkv} depth {depth:6} splits {splits:3}: {:8.1} us {:7.1} TFLOP/s\n",
            ms * 1e3,
            4.0 * (nh * ATT_HD) as f64 * keys / (ms * 1e-3) / 1e12
        );
    }
    for threads in [128u32, 256, 512, 1024] {
        g.norm_threads
            .store(threads, std::sync::atomic::Ordering::Relaxed);
        let ms = g.median_ms(reps, || {
            ops::rmsnorm(g, x.ptr, y.ptr, x.ptr, 1, 5120, 1e-5, 0, Some(a8))
        })?;
        out += &format!(
            "RMSNorm + q8, one row of 5120, {threads} threads: {:.1} us\n",
            ms * 1e3
        );
    }
    Ok(out)
}
