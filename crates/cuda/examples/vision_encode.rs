//! Encodes an image with an mmproj's tower on the GPU and prints each
//! repetition's time (the first includes allocating the activations; the
//! median of the rest is the figure BENCHMARKS.md quotes), and how far the
//! rows are from the CPU tower's when `--check` is given.
//!
//! vision_encode MMPROJ WxH [--reps N] [--check]
//! (with HEARTH_CUDA_PROFILE=1: kernel times per encode, each launch timed alone)
//!
//! `WxH` encodes a synthetic pattern of that size (smooth gradients).

use std::sync::Arc;
use std::time::Instant;

use hearth_cuda::{Gpu, GpuTower};
use hearth_vision::{MmProj, RgbImage, Rules, Tower};

fn pattern(w: u32, h: u32) -> RgbImage {
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            data.extend_from_slice(&[
                ((37 * x + 11 * y) % 256) as u8,
                if x < w / 3 && y < h / 2 { 255 } else { 16 },
                ((x * x + 3 * y * y) % 256) as u8,
            ]);
        }
    }
    RgbImage::from_raw(w, h, data).expect("sized above")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        return Err("usage: vision_encode MMPROJ WxH [--reps N] [--check]".into());
    }
    let reps: usize = args
        .iter()
        .position(|a| a == "--reps")
        .map_or(Ok(5), |i| args[i + 1].parse())?;
    let (w, h) = args[1]
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
        .ok_or("the image is WxH")?;
    let t = Instant::now();
    let mm = MmProj::load(&args[0], None)?;
    let gpu = Arc::new(Gpu::open()?);
    let tower = GpuTower::upload(gpu.clone(), &mm)?;
    eprintln!(
        "{}: {} blocks of width {}, {:.2} GB on the GPU ({:.1} s)",
        args[0],
        mm.config.n_layer,
        mm.config.n_embd,
        tower.resident_bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    let img = pattern(w, h);
    let mut times = Vec::new();
    let mut last = None;
    for rep in 0..reps.max(1) {
        let t = Instant::now();
        let e = mm.encode_on(Some(&tower as &dyn Tower), &img, Rules::REFERENCE)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "gpu encode {w}x{h} -> {}x{} cells = {} tokens x {}: {ms:.1} ms (rep {rep}, preprocessing included)",
            e.grid.nph, e.grid.npw, e.n_tokens, e.dim
        );
        times.push(ms);
        last = Some(e);
    }
    let mut rest = times[1.min(times.len() - 1)..].to_vec();
    rest.sort_by(f64::total_cmp);
    println!("gpu encode median {:.1} ms", rest[rest.len() / 2]);
    if gpu.profiling() {
        // HEARTH_CUDA_PROFILE: each launch timed alone, over all reps.
        let report = gpu.profile_report();
        let total: f64 = report.iter().map(|r| r.2).sum();
        let reps = times.len() as f64;
        println!(
            "kernel time per encode (each launch timed alone): {:.1} ms",
            total / reps
        );
        for (k, n, ms) in report {
            println!(
                "  {k:24} {:>7.0} launches {:>8.2} ms {:>5.1}%",
                n as f64 / reps,
                ms / reps,
                100.0 * ms / total
            );
        }
    }
    if args.iter().any(|a| a == "--check") {
        let t = Instant::now();
        let cpu = mm.encode(&img, Rules::REFERENCE);
        let g = last.expect("one rep");
        let mut worst = 0.0f64;
        for r in 0..cpu.n_tokens {
            let (a, b) = (g.row(r), cpu.row(r));
            let num: f64 = a
                .iter()
                .zip(b)
                .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
                .sum();
            let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
            worst = worst.max((num / den.max(1e-300)).sqrt());
        }
        println!(
            "cpu encode {:.1} ms; worst row rel. L2 gpu vs cpu {worst:.2e}",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
