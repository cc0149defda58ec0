//! hearth's vision tower under the model reference's rules against a numpy
//! float64 reference written from the spec (tests/reference/vision_ref.py;
//! fixtures tests/fixtures/vision/reference-vit-a*, made by
//! scripts/make_vision_fixtures.py with Pillow's resize and the reference's
//! grid rule run in CPython). Covers what llama.cpp cannot: a grid tie
//! (225×225 → 8×8 cells) and the transposed, zero-padded position table on
//! non-square and upsampled grids.

use std::path::{Path, PathBuf};

use hearth_kernels::pool::ThreadPool;
use hearth_vision::synth::{write_mmproj, MmprojShape};
use hearth_vision::{MmProj, RgbImage, Rules};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision")
}

fn pattern(w: u32, h: u32) -> RgbImage {
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let g = if x < w / 3 && y < h / 2 { 255 } else { 16 };
            data.extend([
                ((37 * x + 11 * y) % 256) as u8,
                g,
                ((x * x + 3 * y * y) % 256) as u8,
            ]);
        }
    }
    RgbImage::from_raw(w, h, data).unwrap()
}

fn max_row_error(h: &[f32], r: &[f32], dim: usize) -> f64 {
    h.chunks_exact(dim)
        .zip(r.chunks_exact(dim))
        .map(|(a, b)| {
            let num: f64 = a
                .iter()
                .zip(b)
                .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
                .sum();
            let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
            (num / den).sqrt()
        })
        .fold(0.0, f64::max)
}

/// hearth's f32 against float64: measured ≤ 1.4e-6 per row.
const TOLERANCE: f64 = 1e-5;

#[test]
fn reference_rules_match_the_numpy_spec_reference() {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("reference-vit-a.json")).unwrap(),
    )
    .unwrap();
    // vit-a of scripts/make_vision_fixtures.py.
    let mut shape = MmprojShape::tiny();
    shape.projection_dim = 576;
    let path = std::env::temp_dir().join(format!("hearth-vision-ref-{}.gguf", std::process::id()));
    write_mmproj(&shape, 11, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(sha, fx["mmproj_sha256"], "not the fixture's mmproj");
    let mm = MmProj::load(&path, Some(576)).unwrap();
    let _ = std::fs::remove_file(&path);
    let pool = ThreadPool::new(2);
    for rec in fx["images"].as_array().unwrap() {
        let inp = rec["input"].as_str().unwrap();
        let (w, h) = inp
            .strip_prefix("pattern:")
            .unwrap()
            .split_once('x')
            .unwrap();
        let img = pattern(w.parse().unwrap(), h.parse().unwrap());
        let e = mm.encode_in(&pool, &img, Rules::REFERENCE);
        assert_eq!(
            (e.grid.nph as u64, e.grid.npw as u64),
            (rec["nph"].as_u64().unwrap(), rec["npw"].as_u64().unwrap()),
            "{inp}"
        );
        let raw = std::fs::read(fixtures().join(rec["embd"].as_str().unwrap())).unwrap();
        let want: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(e.rows.len(), want.len(), "{inp}");
        let err = max_row_error(&e.rows, &want, e.dim);
        eprintln!(
            "{inp}: grid {}x{}, worst row error {err:.2e}",
            e.grid.nph, e.grid.npw
        );
        assert!(err <= TOLERANCE, "{inp}: {err:.3e} > {TOLERANCE:.0e}");
        // The test can tell the rules apart: llama.cpp's (other grid, or other
        // position table) is far off on these images.
        let l = mm.encode_in(&pool, &img, Rules::LLAMA_CPP);
        if l.rows.len() == want.len() {
            let err = max_row_error(&l.rows, &want, e.dim);
            assert!(
                err > 100.0 * TOLERANCE,
                "{inp}: llama.cpp's rules also within tolerance ({err:.1e})"
            );
        } else {
            assert_ne!(l.grid, e.grid, "{inp}");
        }
    }
}
