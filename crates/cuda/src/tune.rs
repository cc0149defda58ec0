//! Picks the single-token GEMV variant for each weight-matrix shape of a
//! model by timing every variant on the uploaded weights (a few launches
//! each, well under a second for a 30B model). Which variant streams fastest
//! depends on the row length and type (registers against loads in flight),
//! and measuring it on the device beats guessing. HEARTH_CUDA_TUNE=0 skips
//! the tuning (default variant everywhere).
//!
//! The choice must not change from one launch to the next: many variants
//! of a small model's GEMVs take the same 5-6 us, and picking whichever was
//! fastest this time made launches differ by 13%. So each variant is timed
//! over a run of launches, the first variant (in a fixed order) within 3%
//! of the fastest wins, and the choices are kept on disk next to the
//! compiled kernels, keyed by the device, driver, kernel source and shape:
//! every later launch on the machine uses them as they are
//! (HEARTH_CUDA_RETUNE=1 measures again).

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

/// Launches per timed run of one GEMV variant (a 5 us kernel timed alone is
/// mostly event resolution).
const RUN: usize = 8;

/// A variant within this share of the fastest counts as tied with it; the
/// first tied one in candidate order is chosen.
const TIE: f64 = 0.03;

/// The chosen variant among `times` (candidate order): the first within
/// [`TIE`] of the fastest.
pub fn pick(times: &[(f64, GemvTune)]) -> (f64, GemvTune) {
    let best = times.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
    *times
        .iter()
        .find(|t| t.0 <= best * (1.0 + TIE))
        .expect("variants")
}

/// The choices kept on disk: GEMV variants by shape, row-norm threads by width.
#[derive(Default, Debug, PartialEq)]
pub struct Choices {
    pub gemv: HashMap<String, GemvTune>,
    pub norm: HashMap<usize, u32>,
}

fn shape_key(s: &Shape) -> String {
    format!("{:?} {} {}", s.0, s.1, s.2)
}

impl Choices {
    /// `gemv KIND ROWS COLS x r u blocks` and `norm DIM THREADS` lines.
    pub fn parse(text: &str) -> Choices {
        let mut c = Choices::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["gemv", kind, rows, cols, x, r, u, blocks] => {
                    let (Ok(x), Ok(r), Ok(u), Ok(blocks)) =
                        (x.parse(), r.parse(), u.parse(), blocks.parse())
                    else {
                        continue;
                    };
                    c.gemv.insert(
                        format!("{kind} {rows} {cols}"),
                        GemvTune { u, blocks, r, x },
                    );
                }
                ["norm", dim, threads] => {
                    if let (Ok(d), Ok(t)) = (dim.parse(), threads.parse()) {
                        c.norm.insert(d, t);
                    }
                }
                _ => {}
            }
        }
        c
    }

    pub fn render(&self) -> String {
        let mut lines: Vec<String> = self
            .gemv
            .iter()
            .map(|(k, t)| format!("gemv {k} {} {} {} {}", t.x, t.r, t.u, t.blocks))
            .collect();
        lines.extend(self.norm.iter().map(|(d, t)| format!("norm {d} {t}")));
        lines.sort();
        lines.join("\n") + "\n"
    }
}

/// The file of this device's choices (`warps_only` has its own).
fn choices_path(g: &Gpu, warps_only: bool) -> std::path::PathBuf {
    let i = &g.info;
    let h = crate::compile::fnv1a64(&[
        i.name.as_bytes(),
        &i.sm_count.to_le_bytes(),
        &i.driver_version.to_le_bytes(),
        crate::compile::SOURCE.as_bytes(),
        &[warps_only as u8],
    ]);
    crate::compile::cache_dir().join(format!(
        "gemv-choices-sm{}{}-{h:016x}.txt",
        i.arch.0, i.arch.1
    ))
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
    let path = choices_path(g, warps_only);
    let retune = std::env::var("HEARTH_CUDA_RETUNE").is_ok_and(|v| v != "0");
    let mut kept = match retune {
        true => Choices::default(),
        false => std::fs::read_to_string(&path)
            .map(|t| Choices::parse(&t))
            .unwrap_or_default(),
    };
    let mut measured = false;
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
        if let Some(&t) = kept
            .gemv
            .get(&shape_key(&key))
            .filter(|t| cands.contains(t))
        {
            report.push(format!(
                "{:?} {}x{}: {} r{} u{} blocks {} (kept)",
                m.kind,
                m.rows,
                m.cols,
                if t.x { "x" } else { "warp" },
                t.r,
                t.u,
                t.blocks
            ));
            chosen.insert(key, t);
            continue;
        }
        for &v in &cands {
            let us = time_us(g, 7, || {
                for _ in 0..RUN {
                    ops::gemv_single(g, m, v, a8, y.ptr, m.rows, 0, 0)?;
                }
                Ok(())
            })? / RUN as f64;
            times.push((us, v));
        }
        let (best_us, best) = pick(&times);
        measured = true;
        kept.gemv.insert(shape_key(&key), best);
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
    } else if let Some(&t) = kept.norm.get(&dim) {
        g.norm_threads
            .store(t, std::sync::atomic::Ordering::Relaxed);
        report.push(format!("rmsnorm of {dim}: {t} threads (kept)"));
    } else if dim > 0 {
        let gain = g.alloc(dim * 4, "norm tuning")?;
        g.fill_random(gain.ptr, dim * 2, 3, true)?;
        let mut times = Vec::new();
        let mut line = format!("rmsnorm of {dim}:");
        for threads in [1024u32, 512, 256, 128] {
            g.norm_threads
                .store(threads, std::sync::atomic::Ordering::Relaxed);
            let us = time_us(g, 9, || {
                for _ in 0..RUN {
                    ops::rmsnorm(g, x.ptr, y.ptr, gain.ptr, 1, dim, 1e-5, 0, Some(a8))?;
                }
                Ok(())
            })? / RUN as f64;
            line += &format!(" {threads} threads {us:.1} us;");
            times.push((us, threads));
        }
        let fastest = times.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
        let best = times
            .iter()
            .find(|t| t.0 <= fastest * (1.0 + TIE))
            .map_or(1024, |t| t.1);
        g.norm_threads
            .store(best, std::sync::atomic::Ordering::Relaxed);
        kept.norm.insert(dim, best);
        measured = true;
        report.push(format!("{line} using {best}"));
    }
    if measured {
        // A cache that cannot be written only costs a tuning next time.
        if std::fs::create_dir_all(crate::compile::cache_dir()).is_ok() {
            let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
            if std::fs::write(&tmp, kept.render()).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        report.push(format!("GEMV choices kept in {}", path.display()));
    } else {
        report.push(format!("GEMV choices from {}", path.display()));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(u: u8, blocks: u32, r: u8, x: bool) -> GemvTune {
        GemvTune { u, blocks, r, x }
    }

    /// Within 3% of the fastest, the first candidate wins (a stable choice
    /// when several variants take the same time).
    #[test]
    fn ties_go_to_the_first_candidate() {
        let a = t(1, 0, 1, false);
        let b = t(2, 0, 1, false);
        let c = t(1, 0, 2, true);
        assert_eq!(pick(&[(5.10, a), (5.00, b), (5.05, c)]).1, a);
        assert_eq!(pick(&[(5.30, a), (5.00, b), (5.05, c)]).1, b);
        assert_eq!(pick(&[(9.0, a), (8.0, b), (5.0, c)]).1, c);
    }

    #[test]
    fn choices_round_trip_through_their_file() {
        let mut c = Choices::default();
        c.gemv.insert("Q4K 896 896".into(), t(2, 264, 1, false));
        c.gemv.insert("Q6K 151936 896".into(), t(1, 0, 4, true));
        c.norm.insert(896, 256);
        let text = c.render();
        assert_eq!(Choices::parse(&text), c);
        // Damaged lines are skipped, the rest kept.
        let more = format!("{text}gemv Q4K 1 2 maybe 1 1 1\nnonsense\n");
        assert_eq!(Choices::parse(&more), c);
    }
}
