//! Shared by the vision tests: the fixtures of tests/fixtures/vision, the
//! spec's test image and the per-row error measure.
#![allow(dead_code)] // each test binary uses its own part

pub mod pattern;

use std::path::{Path, PathBuf};

use hearth_vision::{ImageLimits, RgbImage};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use pattern::pattern;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision")
}

/// The JSON fixture `name`.
pub fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

/// The little-endian f32 array in the fixture file `name`.
pub fn f32_fixture(name: &str) -> Vec<f32> {
    std::fs::read(fixtures().join(name))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fixture input: `pattern:WxH` (the spec's image) or an image file.
pub fn input(name: &str) -> RgbImage {
    match name.strip_prefix("pattern:") {
        Some(size) => {
            let (w, h) = size.split_once('x').unwrap();
            pattern(w.parse().unwrap(), h.parse().unwrap())
        }
        None => RgbImage::decode(
            &std::fs::read(fixtures().join(name)).unwrap(),
            &ImageLimits::default(),
        )
        .unwrap(),
    }
}

/// Relative L2 error per row: ‖h − r‖ / ‖r‖.
pub fn row_errors(h: &[f32], r: &[f32], dim: usize) -> Vec<f64> {
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
        .collect()
}

/// The largest of [`row_errors`].
pub fn max_row_error(h: &[f32], r: &[f32], dim: usize) -> f64 {
    row_errors(h, r, dim).into_iter().fold(0.0, f64::max)
}

/// The llama.cpp build a fixture was made with (its `system_info`): the
/// AVX-512 one where it reports `AVX512 = 1`, else the AVX2 one.
pub fn fixture_isa(fx: &Value) -> hearth_vision::RefIsa {
    let info = fx["system_info"].as_str().expect("system_info");
    if info.contains("AVX512 = 1") {
        hearth_vision::RefIsa::Avx512
    } else {
        hearth_vision::RefIsa::Avx2
    }
}

/// llama.cpp's rules in the arithmetic of the fixture's build.
pub fn llama_rules_of(fx: &Value) -> hearth_vision::Rules {
    hearth_vision::Rules {
        numerics: hearth_vision::Numerics::LlamaCpp(Some(fixture_isa(fx))),
        ..hearth_vision::Rules::LLAMA_CPP
    }
}
