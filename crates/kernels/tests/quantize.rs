//! Reference quantization: byte equality with ggml's `quantize_row_*_ref` (and, for Q8_0,
//! `gguf.quants.quantize`) on the committed fixtures, and round-trip error bounds on random
//! Gaussian data.

use std::path::PathBuf;

use hearth_gguf::GgmlType;
use hearth_kernels::quant::{self, QUANTIZE_TYPES};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

fn read(rel: &str) -> Vec<u8> {
    let path = fixture_dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn encoded_len(ty: GgmlType, n_values: usize) -> usize {
    n_values / ty.block_size() * ty.type_size()
}

#[test]
fn quantize_matches_ggml_reference_bytes() {
    let text = std::fs::read_to_string(fixture_dir().join("index.json")).unwrap();
    let index: Value = serde_json::from_str(&text).unwrap();
    let mut failures = Vec::new();
    let mut n_checked = 0;
    for e in index["quantize"].as_array().unwrap() {
        let ty = GgmlType::from_name(e["type"].as_str().unwrap()).unwrap();
        let input: Vec<f32> = read(e["input"].as_str().unwrap())
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let want = read(e["output"].as_str().unwrap());
        let mut got = vec![0u8; encoded_len(ty, input.len())];
        quant::quantize(ty, &input, &mut got).unwrap();
        n_checked += 1;
        if got != want {
            let size = ty.type_size();
            let bad: Vec<usize> = (0..got.len() / size)
                .filter(|&b| got[b * size..][..size] != want[b * size..][..size])
                .collect();
            failures.push(format!(
                "{ty} on {}: {} of {} blocks differ (first: block {})",
                e["input"],
                bad.len(),
                got.len() / size,
                bad[0]
            ));
        }
    }
    assert_eq!(n_checked, 18, "expected 3 inputs x 6 types");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Standard normal samples (Box-Muller), deterministic.
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.gen();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

fn rms(x: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = x.fold((0.0, 0usize), |(s, n), v| (s + v * v, n + 1));
    (sum / n as f64).sqrt()
}

/// RMS of the round-trip error relative to the RMS of the input.
fn relative_rms_error(ty: GgmlType, x: &[f32]) -> f64 {
    let mut bytes = vec![0u8; encoded_len(ty, x.len())];
    quant::quantize(ty, x, &mut bytes).unwrap();
    let mut y = vec![0.0f32; x.len()];
    quant::dequantize(ty, &bytes, &mut y).unwrap();
    let err = rms(x.iter().zip(&y).map(|(&a, &b)| a as f64 - b as f64));
    err / rms(x.iter().map(|&a| a as f64))
}

/// Bounds sit about 10% above what each format achieves on N(0,1) data, which is what
/// uniform rounding error predicts (step / sqrt(12) relative to an RMS of 1):
/// F16 2.09e-4; BF16 1.65e-3; Q4_0 8.57e-2 (step = |max| of 32 / 8); Q8_0 5.31e-3 (step = amax of 32 / 127 ~ 0.018);
/// Q8_K 6.98e-3 (amax of 256 / 127); Q6_K 1.77e-2 (amax of 16 / 32);
/// Q5_K 3.62e-2 ((max - min) of 32 / 31); Q4_K 7.13e-2 ((max - min) of 32 / 15, a bit
/// below the plain min/max grid thanks to the least-squares search).
#[test]
fn round_trip_error_is_within_format_bounds() {
    use GgmlType::*;
    let bounds = [
        (F32, 0.0),
        (F16, 2.3e-4),
        (BF16, 1.8e-3),
        (Q4_0, 9.4e-2),
        (Q8_0, 5.8e-3),
        (Q8_K, 7.7e-3),
        (Q6_K, 1.95e-2),
        (Q5_K, 4.0e-2),
        (Q4_K, 7.8e-2),
    ];
    assert_eq!(bounds.len(), QUANTIZE_TYPES.len());
    let x = gaussian(256 * 64, 42);
    let mut report = Vec::new();
    let mut ok = true;
    for (ty, bound) in bounds {
        let err = relative_rms_error(ty, &x);
        report.push(format!("{ty}: {err:.3e} (bound {bound:.1e})"));
        ok &= err <= bound;
    }
    assert!(ok, "\n{}", report.join("\n"));
    eprintln!("{}", report.join("\n"));
}

/// Scale invariance: small and large inputs round-trip with the same relative error, as
/// long as the f16 super-block scales stay normal (at 1e-3 Q6_K's `d` ~ 1e-6 is an f16
/// subnormal and its error grows ~20%; that is the format, not a bug).
#[test]
fn round_trip_error_is_scale_invariant() {
    use GgmlType::*;
    let x = gaussian(256 * 8, 7);
    for ty in [Q4_0, Q8_0, Q8_K, Q4_K, Q5_K, Q6_K] {
        let base = relative_rms_error(ty, &x);
        for scale in [1e-2f32, 1e3] {
            let scaled: Vec<f32> = x.iter().map(|&v| v * scale).collect();
            let err = relative_rms_error(ty, &scaled);
            assert!(
                (err - base).abs() <= 0.05 * base,
                "{ty} at scale {scale}: {err} vs {base}"
            );
        }
    }
}

#[test]
fn all_zero_input_quantizes_to_zeros() {
    for ty in QUANTIZE_TYPES {
        let x = vec![0.0f32; 512];
        let mut bytes = vec![0xAAu8; encoded_len(ty, x.len())];
        quant::quantize(ty, &x, &mut bytes).unwrap();
        let mut y = vec![1.0f32; x.len()];
        quant::dequantize(ty, &bytes, &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}
