//! Reference dequantization against the `gguf` Python package (and, through the fixture
//! script's own check, ggml's `dequantize_row_*`): bit-exact, on blocks from the packaged
//! models and on random blocks. Fixtures: tests/fixtures/quant, written by
//! scripts/fixtures/make_quant_fixtures.py.

use std::collections::BTreeSet;
use std::path::PathBuf;

use hearth_gguf::GgmlType;
use hearth_kernels::quant::{self, DEQUANTIZE_TYPES};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

fn index() -> Value {
    let path = fixture_dir().join("index.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("index.json parses")
}

fn read(rel: &str) -> Vec<u8> {
    let path = fixture_dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_f32_bits(rel: &str) -> Vec<u32> {
    read(rel)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Bit equality. x86 is where the fixtures were made; elsewhere the NaN that `inf * 0` and
/// friends produce has a different sign/payload (ARM's default NaN is positive), so there
/// any NaN matches any NaN.
fn same_bits(got: u32, want: u32) -> bool {
    let x86 = cfg!(any(target_arch = "x86_64", target_arch = "x86"));
    got == want || (!x86 && f32::from_bits(got).is_nan() && f32::from_bits(want).is_nan())
}

struct Case {
    ty: GgmlType,
    source: String,
    blocks: Vec<u8>,
    expected: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let index = index();
    let entries = index["dequantize"].as_array().expect("dequantize list");
    entries
        .iter()
        .map(|e| {
            let name = e["type"].as_str().unwrap();
            let case = Case {
                ty: GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}")),
                source: e["source"].as_str().unwrap().to_string(),
                blocks: read(e["blocks"].as_str().unwrap()),
                expected: read_f32_bits(e["expected"].as_str().unwrap()),
            };
            assert_eq!(case.expected.len() as u64, e["n_values"].as_u64().unwrap());
            case
        })
        .collect()
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut failures = Vec::new();
    for case in cases() {
        let mut got = vec![0.0f32; case.expected.len()];
        quant::dequantize(case.ty, &case.blocks, &mut got).unwrap();
        let bad: Vec<usize> = (0..got.len())
            .filter(|&i| !same_bits(got[i].to_bits(), case.expected[i]))
            .collect();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{} {}: {} of {} values differ; first at {i}: got {:#010x} ({}), want {:#010x} ({})",
                case.ty,
                case.source,
                bad.len(),
                got.len(),
                got[i].to_bits(),
                got[i],
                case.expected[i],
                f32::from_bits(case.expected[i]),
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn every_dequantize_type_has_random_and_listed_real_fixtures() {
    let cases = cases();
    let with = |source: &str| -> BTreeSet<GgmlType> {
        cases
            .iter()
            .filter(|c| c.source.starts_with(source))
            .map(|c| c.ty)
            .collect()
    };
    let random = with("random");
    for ty in DEQUANTIZE_TYPES {
        assert!(random.contains(&ty), "no random fixture for {ty}");
    }
    // The types that occur in the packaged models.
    use GgmlType::*;
    let real = with("real");
    for ty in [F32, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K] {
        assert!(real.contains(&ty), "no real-model fixture for {ty}");
    }
}

/// The random fixtures must exercise the special values they were built to cover.
#[test]
fn random_fixtures_include_nan_and_infinity() {
    for case in cases().iter().filter(|c| c.source == "random") {
        let nan = case
            .expected
            .iter()
            .filter(|&&b| f32::from_bits(b).is_nan())
            .count();
        let inf = case
            .expected
            .iter()
            .filter(|&&b| f32::from_bits(b).is_infinite())
            .count();
        assert!(
            nan > 0 && inf > 0,
            "{} random: {nan} NaN, {inf} inf",
            case.ty
        );
    }
}

/// Row-wise dequantization of a real tensor slice equals the matching part of the whole.
#[test]
fn dequantize_row_agrees_with_whole_tensor() {
    for case in cases().iter().filter(|c| c.source.starts_with("real")) {
        let n_cols = 2 * case.ty.block_size().max(128);
        let row_bytes = quant::row_size(case.ty, n_cols).unwrap();
        let n_rows = case.blocks.len() / row_bytes;
        let tensor = &case.blocks[..n_rows * row_bytes];
        let mut row = vec![0.0f32; n_cols];
        for r in [0, n_rows / 2, n_rows - 1] {
            quant::dequantize_row(case.ty, tensor, n_cols, r, &mut row).unwrap();
            let want = &case.expected[r * n_cols..(r + 1) * n_cols];
            assert!(
                row.iter()
                    .zip(want)
                    .all(|(g, &w)| same_bits(g.to_bits(), w)),
                "{} {} row {r}",
                case.ty,
                case.source
            );
        }
    }
}
