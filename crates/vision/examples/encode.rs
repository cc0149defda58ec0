//! Encodes one image with an mmproj and prints the timing (and optionally
//! writes the rows): the hearth side of the encode benchmark in BENCHMARKS.md.
//!
//! cargo run --release -p hearth-vision --example encode -- MMPROJ IMAGE|WxH [--threads N] [--reps N] [--llama-rules [--isa avx2|avx512]] [--out FILE.f32] [--prep]
//!
//! `--llama-rules`: llama.cpp's grid, position and arithmetic rules, in the
//! order of the native build of this machine or of `--isa`.
//!
//! `WxH` encodes the spec's synthetic test pattern of that size.

use std::time::Instant;

#[path = "../tests/common/pattern.rs"]
mod pattern;

use pattern::pattern;

use hearth_kernels::cpu::ggml_order::activations::RefIsa;
use hearth_kernels::pool::ThreadPool;
use hearth_vision::{ImageLimits, MmProj, Numerics, RgbImage, Rules};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let (mmproj, image) = (&args[0], &args[1]);
    let threads: usize = flag("--threads").map_or(2, |s| s.parse().unwrap());
    let reps: usize = flag("--reps").map_or(1, |s| s.parse().unwrap());
    let rules = if args.iter().any(|a| a == "--llama-rules") {
        let isa = flag("--isa").map(|s| match s.as_str() {
            "avx2" => RefIsa::Avx2,
            "avx512" => RefIsa::Avx512,
            other => panic!("--isa {other}: avx2 or avx512"),
        });
        Rules {
            numerics: Numerics::LlamaCpp(isa),
            ..Rules::LLAMA_CPP
        }
    } else {
        Rules::REFERENCE
    };
    hearth_kernels::pool::tune_allocator();
    let pool = ThreadPool::new(threads);
    let t = Instant::now();
    let mm = MmProj::load(mmproj, None)?;
    eprintln!(
        "loaded {mmproj} in {:.2} s: {:?}",
        t.elapsed().as_secs_f64(),
        mm.config
    );
    let img = match image
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
    {
        Some((w, h)) => pattern(w, h),
        None => RgbImage::decode(&std::fs::read(image)?, &ImageLimits::default())?,
    };
    if args.iter().any(|a| a == "--prep") {
        // The host-side part a device tower waits for: preprocessing and
        // the tower inputs (positions, RoPE angles, windows, shuffle).
        let t = Instant::now();
        let p = mm.preprocess(&img, rules);
        let t1 = t.elapsed().as_secs_f64() * 1e3;
        let m = mm.config.merge;
        let _ = mm.tower_inputs(&p.patches, p.grid.nph * m, p.grid.npw * m, rules.pos);
        let t2 = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "host prep: preprocess {t1:.1} ms, tower inputs {:.1} ms",
            t2 - t1
        );
        return Ok(());
    }
    for rep in 0..reps {
        let t = Instant::now();
        let e = mm.encode_in(&pool, &img, rules);
        let s = t.elapsed().as_secs_f64();
        println!(
            "encode {}x{} -> grid {}x{} = {} tokens x {}: {:.1} ms ({} threads, rep {rep})",
            img.width,
            img.height,
            e.grid.nph,
            e.grid.npw,
            e.n_tokens,
            e.dim,
            s * 1e3,
            threads
        );
        if let (Some(out), 0) = (flag("--out"), rep) {
            let bytes: Vec<u8> = e.rows.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(out, bytes)?;
        }
    }
    Ok(())
}
