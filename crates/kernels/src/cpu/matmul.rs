//! Matrix multiplication straight from quantized weights: `out = x · Wᵀ` for
//! `n` activation rows. Activations are quantized once per call to the 8-bit
//! format that pairs with the weight type (as llama.cpp does), then every
//! weight row is dotted with every activation row. Output rows are split
//! across threads.

use std::ops::Range;

use half::{bf16, f16};
use hearth_gguf::GgmlType;
use rayon::prelude::*;

use super::ggml_order::half_dot::*;
use super::ggml_order::q8_k_x86::quantize_row_q8_k_x86;
use super::ggml_order::repack_q4_k::*;
use super::ggml_order::tiled::*;
use super::ggml_order::vec_dot::*;
use super::RowOrder;
use crate::quant::blocks::*;
use crate::quant::dequantize;

/// A borrowed weight matrix of logical shape [rows, cols] in GGML format
/// (each row `cols` values, contiguous).
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl QMatrix<'_> {
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize(self.ty, self.row(r), out).expect("weight types are validated at load");
    }
}

/// How activations enter a matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activations {
    /// Quantized to the weight type's 8-bit partner (Q8_K, Q8_0, Q8_1, or
    /// f16/bf16 for half-precision weights): llama.cpp's numerics.
    Quantized,
    /// Kept in f32; weights are dequantized block by block.
    F32,
}

/// One activation row in the format its weight type's dot product needs.
enum QRow {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
    Q8_1(Vec<BlockQ8_1>),
    Q8K(Vec<BlockQ8K>),
    /// Q8_K rows of a repacked matmul's gemm part (see `repack`).
    Q8KMat(Vec<BlockQ8K>),
}

fn quantize_activation(ty: GgmlType, x: &[f32], mode: Activations) -> QRow {
    use GgmlType::*;
    if mode == Activations::F32 {
        return QRow::F32(x.to_vec());
    }
    match ty {
        F32 => QRow::F32(x.to_vec()),
        F16 => QRow::F16(x.iter().map(|&v| f16::from_f32(v)).collect()),
        BF16 => QRow::Bf16(x.iter().map(|&v| bf16::from_f32(v)).collect()),
        Q4_0 | Q5_0 | Q8_0 => {
            let mut b = vec![BlockQ8_0::default(); x.len() / QK];
            quantize_row_q8_0_x86(x, &mut b);
            QRow::Q8_0(b)
        }
        Q4_1 | Q5_1 => {
            let mut b = vec![BlockQ8_1::default(); x.len() / QK];
            quantize_row_q8_1_ref(x, &mut b);
            QRow::Q8_1(b)
        }
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => {
            let mut b = vec![
                BlockQ8K {
                    d: 0.0,
                    qs: [0; QK_K],
                    bsums: [0; QK_K / 16]
                };
                x.len() / QK_K
            ];
            quantize_row_q8_k_x86(x, &mut b);
            QRow::Q8K(b)
        }
        other => panic!("matmul: unsupported weight type {other} (validated at load)"),
    }
}

fn blocks<B: ByteBlock>(row: &[u8]) -> &[B] {
    as_blocks(row).expect("row is whole blocks")
}

/// Dot product of one weight row with one prepared activation row;
/// `path`: which of llama.cpp's x86 matmul kernels this product follows.
fn dot(ty: GgmlType, path: Path, w: &[u8], a: &QRow) -> f32 {
    use GgmlType::*;
    let (repacked, tiled) = (path == Path::Repacked, path == Path::Tiled);
    match (ty, a) {
        (Q4_K, QRow::Q8K(y)) if tiled => vec_dot_q4_k_q8_k_tiled(blocks(w), y),
        (Q5_K, QRow::Q8K(y)) if tiled => vec_dot_q5_k_q8_k_tiled(blocks(w), y),
        (Q6_K, QRow::Q8K(y)) if tiled => vec_dot_q6_k_q8_k_tiled(blocks(w), y),
        (Q4_K, QRow::Q8KMat(y)) => vec_dot_q4_k_q8_k_gemm_x86(blocks(w), y),
        (Q4_K, QRow::Q8K(y)) if repacked => vec_dot_q4_k_q8_k_gemv_x86(blocks(w), y),
        (F32, QRow::F32(x)) => {
            let w: Vec<f32> = w
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            vec_dot_f32_ref(&w, x)
        }
        (F16, QRow::F16(x)) if path == Path::TinyBlas => dot_f16_tinyblas(w, x),
        (BF16, QRow::Bf16(x)) if path == Path::TinyBlas => dot_bf16_tinyblas(w, x),
        (F16, QRow::F16(x)) => vec_dot_f16_x86(w, x),
        (BF16, QRow::Bf16(x)) => vec_dot_bf16_x86(w, x),
        (Q4_0, QRow::Q8_0(y)) => vec_dot_q4_0_q8_0_x86(blocks(w), y),
        (Q5_0, QRow::Q8_0(y)) => vec_dot_q5_0_q8_0_x86(blocks(w), y),
        (Q8_0, QRow::Q8_0(y)) => vec_dot_q8_0_q8_0_x86(blocks(w), y),
        (Q4_1, QRow::Q8_1(y)) => vec_dot_q4_1_q8_1_avx2_order(blocks(w), y),
        (Q5_1, QRow::Q8_1(y)) => vec_dot_q5_1_q8_1_ref(blocks(w), y),
        (Q2_K, QRow::Q8K(y)) => vec_dot_q2_k_q8_k_ref(blocks(w), y),
        (Q3_K, QRow::Q8K(y)) => vec_dot_q3_k_q8_k_ref(blocks(w), y),
        (Q4_K, QRow::Q8K(y)) => vec_dot_q4_k_q8_k_x86(blocks(w), y),
        (Q5_K, QRow::Q8K(y)) => vec_dot_q5_k_q8_k_ref(blocks(w), y),
        (Q6_K, QRow::Q8K(y)) => vec_dot_q6_k_q8_k_x86(blocks(w), y),
        _ => unreachable!("activation format chosen from the weight type"),
    }
}

/// Which of llama.cpp's x86 CPU matmul kernels a product follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `vec_dot` per output (and llamafile's tinyBLAS for Q8_0/Q4_0/Q5_0 batches).
    VecDot,
    /// The repacked gemm/gemv of weights interleaved at load (`repack`).
    Repacked,
    /// The tiled K-quant matmul for batches of 8+ rows (`tiled`).
    Tiled,
    /// llamafile's tinyBLAS for F16/BF16 batches of 2+ rows against a
    /// matrix of a multiple of 4 rows (`half_dot`).
    TinyBlas,
}

/// Output rows computed per task.
const ROWS_PER_TASK: usize = 16;

/// `out[t, r] = Σ_c x[t, c] · W[r, c]` for `n` rows of `x` ([n, cols]) into `out` ([n, rows]).
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    mode: Activations,
    order: RowOrder,
) {
    assert_eq!(out.len(), n * w.rows, "matmul: out is not [n, rows]");
    let part = matmul_rows_mode(w, x, n, 0..w.rows, mode, order);
    out.copy_from_slice(&part);
}

/// Rows `rows` of the quantized-activation matmul, `[n, rows.len()]`, with
/// the per-row reference kernels (the orders are those the whole matrix
/// would use).
pub(crate) fn matmul_rows(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    rows: Range<usize>,
    order: RowOrder,
) -> Vec<f32> {
    matmul_rows_mode(w, x, n, rows, Activations::Quantized, order)
}

fn matmul_rows_mode(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    rows: Range<usize>,
    mode: Activations,
    order: RowOrder,
) -> Vec<f32> {
    assert_eq!(x.len(), n * w.cols, "matmul: x is not [n, cols]");
    // llama.cpp repacks Q4_K matrices of 8k rows: rows of x below the last
    // multiple of 4 go through its gemm (own quantizer), the rest its gemv.
    let invariant = order == RowOrder::Invariant;
    let repacked =
        mode == Activations::Quantized && w.ty == GgmlType::Q4_K && is_repacked_q4_k(w.rows);
    let n_gemm = if repacked && !invariant { n - n % 4 } else { 0 };
    let path = if repacked {
        Path::Repacked
    } else if mode == Activations::Quantized
        && n >= 8
        && !invariant
        && matches!(w.ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
    {
        Path::Tiled
    } else if mode == Activations::Quantized
        && n >= 2
        && !invariant
        && w.rows.is_multiple_of(4)
        && matches!(w.ty, GgmlType::F16 | GgmlType::BF16)
    {
        Path::TinyBlas
    } else {
        Path::VecDot
    };
    let acts: Vec<QRow> = x
        .chunks_exact(w.cols)
        .enumerate()
        .map(|(t, row)| {
            if t < n_gemm {
                let mut b = vec![BlockQ8K::default(); row.len() / QK_K];
                quantize_row_q8_k_mat_x86(row, &mut b);
                QRow::Q8KMat(b)
            } else {
                quantize_activation(w.ty, row, mode)
            }
        })
        .collect();
    let n_rows = rows.len();
    let parts: Vec<(usize, Vec<f32>)> = (0..n_rows.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .map(|task| {
            let r0 = rows.start + task * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(rows.end);
            let mut scratch = Vec::new();
            // [rows in task, n]
            let mut part = Vec::with_capacity((r1 - r0) * n);
            for r in r0..r1 {
                let wrow = w.row(r);
                if mode == Activations::F32 {
                    // Exact f32: the weight row dequantized once for all rows of x.
                    scratch.resize(w.cols, 0.0);
                    dequantize(w.ty, wrow, &mut scratch).expect("validated type");
                    part.extend(acts.iter().map(|a| match a {
                        QRow::F32(x) => vec_dot_f32_lanes(&scratch, x),
                        _ => unreachable!("f32 activations in f32 mode"),
                    }));
                    continue;
                }
                part.extend(acts.iter().map(|a| dot(w.ty, path, wrow, a)));
            }
            (r0 - rows.start, part)
        })
        .collect();
    let mut out = vec![0.0f32; n * n_rows];
    for (r0, part) in parts {
        let nr = part.len() / n;
        for i in 0..nr {
            for t in 0..n {
                out[t * n_rows + r0 + i] = part[i * n + t];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize;
    use rand::{Rng, SeedableRng};

    /// The quantized-activation matmul agrees with the dequantized f32 product
    /// to within the 8-bit activation rounding, for every weight type.
    #[test]
    fn quantized_matmul_tracks_f32_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (rows, cols, n) = (7, 512, 3);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let wf: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut wq = vec![0u8; rows * cols / ty.block_size() * ty.type_size()];
            quantize(ty, &wf, &mut wq).unwrap();
            let m = QMatrix {
                ty,
                rows,
                cols,
                data: &wq,
            };
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (mut a, mut b) = (vec![0.0; n * rows], vec![0.0; n * rows]);
            matmul(&m, &x, n, &mut a, Activations::Quantized, RowOrder::Batched);
            matmul(&m, &x, n, &mut b, Activations::F32, RowOrder::Batched);
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() < 0.05 * (cols as f32).sqrt() / 10.0,
                    "{ty}: {p} vs {q}"
                );
            }
        }
    }
}
