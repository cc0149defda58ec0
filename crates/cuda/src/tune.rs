//! Picks the single-token GEMV variant for each weight-matrix shape of a
//! model by timing every variant on the uploaded weights (a few launches
//! each, well under a second for a 30B model). Which variant streams fastest
//! depends on the row length and type (registers against loads in flight),
//! and measuring it on the device beats guessing. HEARTH_CUDA_TUNE=0 skips
//! the tuning (default variant everywhere).

use std::collections::HashMap;

use crate::driver::Gpu;
use crate::error::Result;
use crate::layer_weights::GpuLayer;
use crate::ops::{self, GemvTune, GpuMatrix, Q8};
use crate::repack::WeightKind;

type Shape = (WeightKind, usize, usize);

/// Median microseconds of `reps` launches after two warm-ups.
fn time_us(g: &Gpu, reps: usize, f: impl FnMut() -> Result<()>) -> Result<f64> {
    Ok(g.median_ms(reps, f)? * 1e3)
}

/// Tunes every matrix of the model in place; returns one report line per
/// shape. `warps_only`: only the one-warp-per-row kernels (whose arithmetic
/// the persistent decode kernel shares), so fused projections stay unfused.
pub fn tune_model(
    g: &Gpu,
    layers: &mut [GpuLayer],
    output: &mut GpuMatrix,
    warps_only: bool,
) -> Result<Vec<String>> {
    if std::env::var("HEARTH_CUDA_TUNE").is_ok_and(|v| v == "0") {
        return Ok(vec!["GEMV tuning off (HEARTH_CUDA_TUNE=0)".into()]);
    }
    let fused: Vec<Shape> = layers
        .iter()
        .flat_map(|l| [&l.attn_in, &l.ffn_in])
        .filter(|f| f.parts.len() > 1)
        .map(|f| (f.m.kind, f.m.rows, f.m.cols))
        .collect();
    let mut mats: Vec<&mut GpuMatrix> = Vec::new();
    for l in layers.iter_mut() {
        mats.extend([
            &mut l.wq,
            &mut l.wk,
            &mut l.wv,
            &mut l.wo,
            &mut l.ffn_gate,
            &mut l.ffn_up,
            &mut l.ffn_down,
        ]);
        if let Some(gate) = l.attn_gate.as_mut() {
            mats.push(gate);
        }
        for f in [&mut l.attn_in, &mut l.ffn_in] {
            if f.parts.len() > 1 {
                mats.push(&mut f.m);
            }
        }
    }
    mats.push(output);
    let shape = |m: &GpuMatrix| -> Shape { (m.kind, m.rows, m.cols) };
    let max_cols = mats.iter().map(|m| m.cols).max().unwrap_or(32);
    let max_rows = mats.iter().map(|m| m.rows).max().unwrap_or(1);
    // Pseudo-random activations (never zeros), quantized like the real ones.
    let x = g.alloc(max_cols * 4, "GEMV tuning")?;
    g.fill_random(x.ptr, max_cols * 2, 17, true)?;
    let aq = g.alloc(max_cols, "GEMV tuning")?;
    let ad = g.alloc(max_cols / 32 * 4, "GEMV tuning")?;
    let as_ = g.alloc(max_cols / 32 * 4, "GEMV tuning")?;
    let a8 = Q8 {
        q: aq.ptr,
        d: ad.ptr,
        s: as_.ptr,
    };
    ops::quantize_q8(g, x.ptr, a8, max_cols)?;
    let y = g.alloc(max_rows * 4, "GEMV tuning")?;
    let variants = ops::gemv_variants(g.info.sm_count as u32);
    let mut chosen: HashMap<Shape, GemvTune> = HashMap::new();
    let mut report = Vec::new();
    for m in mats.iter() {
        let key = shape(m);
        if chosen.contains_key(&key) {
            continue;
        }
        let mut times = Vec::new();
        // Fused matrices have several outputs: only the register kernels write those.
        let mut cands = if fused.contains(&key) {
            Vec::new()
        } else {
            variants.clone()
        };
        if !warps_only {
            cands.extend(ops::gemv_x_variants(m, g.info.sm_count as u32));
        }
        if cands.is_empty() {
            continue;
        }
        for &v in &cands {
            times.push((
                time_us(g, 5, || ops::gemv_single(g, m, v, a8, y.ptr, m.rows, 0, 0))?,
                v,
            ));
        }
        let (best_us, best) = times
            .iter()
            .copied()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("variants");
        let default_us = times[0].0;
        let bytes = (m.rows * m.cols / m.kind.block().0 * m.kind.block().1) as f64;
        report.push(format!(
            "{:?} {}x{}: {} r{} u{} blocks {} {:.1} us ({:.0} GB/s; first variant {:.1} us)",
            m.kind,
            m.rows,
            m.cols,
            if best.x { "x" } else { "warp" },
            best.r,
            best.u,
            best.blocks,
            best_us,
            bytes / (best_us * 1e-6) / 1e9,
            default_us
        ));
        chosen.insert(key, best);
    }
    for m in mats {
        if let Some(&t) = chosen.get(&shape(m)) {
            m.tune = t;
        }
    }
    // Row norm of one token (decode): block size against the reduction's
    // latency. The persistent kernel's blocks have 256 threads: fewer
    // virtual warps to emulate there.
    let dim = layers.first().map_or(0, |l| l.wq.cols);
    if warps_only {
        g.norm_threads
            .store(256, std::sync::atomic::Ordering::Relaxed);
        report.push("rmsnorm: 256 threads (the persistent kernel's blocks)".into());
    } else if dim > 0 {
        let gain = g.alloc(dim * 4, "norm tuning")?;
        g.fill_random(gain.ptr, dim * 2, 3, true)?;
        let mut best = (f64::INFINITY, 1024u32);
        let mut line = format!("rmsnorm of {dim}:");
        for threads in [128u32, 256, 512, 1024] {
            g.norm_threads
                .store(threads, std::sync::atomic::Ordering::Relaxed);
            let us = time_us(g, 9, || {
                ops::rmsnorm(g, x.ptr, y.ptr, gain.ptr, 1, dim, 1e-5, 0, Some(a8))
            })?;
            line += &format!(" {threads} threads {us:.1} us;");
            if us < best.0 {
                best = (us, threads);
            }
        }
        g.norm_threads
            .store(best.1, std::sync::atomic::Ordering::Relaxed);
        report.push(format!("{line} using {}", best.1));
    }
    Ok(report)
}
