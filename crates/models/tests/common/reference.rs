//! The numpy references of tests/reference/ (independent re-implementations
//! of llama.cpp 11434's math): running one on a GGUF and comparing logits.

use std::path::Path;
use std::process::Command;

use super::muse_synth::root;

/// Reads a little-endian f32, C-order `.npy` file: (shape, data).
pub fn read_npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(
        header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"),
        "{header}"
    );
    let shape_txt = &header[header.find("'shape': (").unwrap() + 10..];
    let shape: Vec<usize> = shape_txt[..shape_txt.find(')').unwrap()]
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let data = bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (shape, data)
}

/// Runs `tests/reference/<script>` on `ggufs` for `tokens`, with the extra
/// `args`, and returns the array it writes to `out`: (shape, data).
pub fn numpy_reference(
    script: &str,
    ggufs: &[&Path],
    tokens: &[u32],
    args: &[&str],
    out: &Path,
) -> (Vec<usize>, Vec<f32>) {
    let list = tokens
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let status = Command::new("python3")
        .arg(root().join("tests/reference").join(script))
        .args(ggufs)
        .args(["--tokens", &list])
        .args(args)
        .arg("--out")
        .arg(out)
        .status()
        .expect("python3 (with numpy and gguf: pip install -r scripts/requirements.txt)");
    assert!(status.success(), "tests/reference/{script} failed");
    read_npy_f32(out)
}

/// Every |got − want| is within `1e-3` of the largest |want| (both printed,
/// prefixed by `what`).
pub fn assert_within_1e3_of_largest(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let max_abs = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("{what}: max |logit| {max_abs}, max |diff| {max_diff}");
    assert!(
        max_diff <= 1e-3 * max_abs,
        "{what}: max |diff| {max_diff} > 1e-3 * {max_abs}"
    );
}
