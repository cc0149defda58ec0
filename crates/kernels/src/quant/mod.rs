//! GGML quantization formats: block layouts, reference dequantization and quantization.
//!
//! [`dequantize()`] and [`quantize()`] are the checked entry points over raw GGUF bytes; the
//! per-type `*_ref` functions in [`dequant`] and [`quantize`](mod@quantize) are the scalar
//! reference kernels that faster kernels are tested against.

pub mod blocks;
pub mod dequant;
pub mod quantize;

use hearth_gguf::GgmlType;
use thiserror::Error;

pub use blocks::{
    as_blocks, as_blocks_mut, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, ByteBlock, F16Le, QK, QK_K,
};
pub use dequant::*;
pub use quantize::*;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantError {
    #[error("{op} is not implemented for tensor type {ty}")]
    Unsupported { ty: GgmlType, op: &'static str },
    #[error("{ty}: {n_bytes} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        n_bytes: usize,
        type_size: usize,
    },
    #[error("{ty}: {n_values} values is not a whole number of {block_size}-value blocks")]
    PartialBlockValues {
        ty: GgmlType,
        n_values: usize,
        block_size: usize,
    },
    #[error("{ty}: destination holds {actual} {unit}, the source needs {expected}")]
    DestinationLength {
        ty: GgmlType,
        expected: usize,
        actual: usize,
        unit: &'static str,
    },
    #[error("{ty}: row {row} is out of range for a tensor of {n_rows} rows of {n_cols} values")]
    RowOutOfRange {
        ty: GgmlType,
        row: usize,
        n_rows: usize,
        n_cols: usize,
    },
}

/// Types [`dequantize`] accepts.
pub const DEQUANTIZE_TYPES: [GgmlType; 14] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    ]
};

/// Types [`quantize()`] accepts.
pub const QUANTIZE_TYPES: [GgmlType; 9] = {
    use GgmlType::*;
    [F32, F16, BF16, Q4_0, Q8_0, Q8_K, Q4_K, Q5_K, Q6_K]
};

/// Dequantizes `src` (whole blocks of `ty`, as stored in GGUF, any alignment) into `dst`,
/// which must hold exactly the number of values encoded.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !DEQUANTIZE_TYPES.contains(&ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "dequantization",
        });
    }
    if !src.len().is_multiple_of(ty.type_size()) {
        return Err(QuantError::PartialBlock {
            ty,
            n_bytes: src.len(),
            type_size: ty.type_size(),
        });
    }
    let n_values = src.len() / ty.type_size() * ty.block_size();
    check_destination(ty, n_values, dst.len(), "values")?;
    match ty {
        F32 => dequantize_row_f32_ref(src, dst),
        F16 => dequantize_row_f16(src, dst),
        BF16 => dequantize_row_bf16_ref(src, dst),
        Q4_0 => dequantize_row_q4_0_ref(as_blocks(src)?, dst),
        Q4_1 => dequantize_row_q4_1_ref(as_blocks(src)?, dst),
        Q5_0 => dequantize_row_q5_0_ref(as_blocks(src)?, dst),
        Q5_1 => dequantize_row_q5_1_ref(as_blocks(src)?, dst),
        Q8_0 => dequantize_row_q8_0_ref(as_blocks(src)?, dst),
        Q2_K => dequantize_row_q2_k_ref(as_blocks(src)?, dst),
        Q3_K => dequantize_row_q3_k_ref(as_blocks(src)?, dst),
        Q4_K => dequantize_row_q4_k_ref(as_blocks(src)?, dst),
        Q5_K => dequantize_row_q5_k_ref(as_blocks(src)?, dst),
        Q6_K => dequantize_row_q6_k_ref(as_blocks(src)?, dst),
        Q8_K => {
            // Q8_K blocks are 4-aligned structs, so parse each one instead of viewing bytes.
            let bytes = src.chunks_exact(BlockQ8K::BYTES);
            for (b, y) in bytes.zip(dst.chunks_exact_mut(QK_K)) {
                let block = BlockQ8K::from_bytes(b.try_into().expect("chunk of BYTES"));
                dequantize_row_q8_k_ref(std::slice::from_ref(&block), y);
            }
        }
        _ => unreachable!("checked against DEQUANTIZE_TYPES"),
    }
    Ok(())
}

/// `dst` must hold exactly `expected` `unit`s.
fn check_destination(
    ty: GgmlType,
    expected: usize,
    actual: usize,
    unit: &'static str,
) -> Result<(), QuantError> {
    if actual != expected {
        return Err(QuantError::DestinationLength {
            ty,
            expected,
            actual,
            unit,
        });
    }
    Ok(())
}

/// [`quantize`] into a new buffer of exactly the encoded size.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let n = ty
        .bytes_for(src.len() as u64)
        .ok_or(QuantError::PartialBlockValues {
            ty,
            n_values: src.len(),
            block_size: ty.block_size(),
        })? as usize;
    let mut dst = vec![0u8; n];
    quantize(ty, src, &mut dst)?;
    Ok(dst)
}

/// Quantizes `src` (a whole number of `ty` blocks of values) into `dst`, which must hold
/// exactly the encoded bytes (GGUF layout).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !QUANTIZE_TYPES.contains(&ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "quantization",
        });
    }
    let block_size = ty.block_size();
    if !src.len().is_multiple_of(block_size) {
        return Err(QuantError::PartialBlockValues {
            ty,
            n_values: src.len(),
            block_size,
        });
    }
    let n_bytes = src.len() / block_size * ty.type_size();
    check_destination(ty, n_bytes, dst.len(), "bytes")?;
    match ty {
        F32 => {
            for (b, x) in dst.chunks_exact_mut(4).zip(src) {
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
        F16 => quantize_row_f16_ref(src, dst),
        BF16 => quantize_row_bf16_ref(src, dst),
        Q4_0 => quantize_row_q4_0_ref(src, as_blocks_mut(dst)?),
        Q8_0 => quantize_row_q8_0_ref(src, as_blocks_mut(dst)?),
        Q4_K => quantize_row_q4_k_ref(src, as_blocks_mut(dst)?),
        Q5_K => quantize_row_q5_k_ref(src, as_blocks_mut(dst)?),
        Q6_K => quantize_row_q6_k_ref(src, as_blocks_mut(dst)?),
        Q8_K => {
            let mut block = [BlockQ8K::default()];
            for (x, b) in src
                .chunks_exact(QK_K)
                .zip(dst.chunks_exact_mut(BlockQ8K::BYTES))
            {
                quantize_row_q8_k_ref(x, &mut block);
                block[0].write_bytes(b.try_into().expect("chunk of BYTES"));
            }
        }
        _ => unreachable!("checked against QUANTIZE_TYPES"),
    }
    Ok(())
}

/// Bytes of one row of `n_cols` values of type `ty`.
pub fn row_size(ty: GgmlType, n_cols: usize) -> Result<usize, QuantError> {
    let block_size = ty.block_size();
    if !n_cols.is_multiple_of(block_size) {
        return Err(QuantError::PartialBlockValues {
            ty,
            n_values: n_cols,
            block_size,
        });
    }
    Ok(n_cols / block_size * ty.type_size())
}

/// Dequantizes row `row` of a row-major 2-D tensor `[n_rows, n_cols]` whose bytes are
/// `tensor` (for example one token's embedding) into `dst` (`n_cols` values).
pub fn dequantize_row(
    ty: GgmlType,
    tensor: &[u8],
    n_cols: usize,
    row: usize,
    dst: &mut [f32],
) -> Result<(), QuantError> {
    let row_bytes = row_size(ty, n_cols)?;
    if row_bytes == 0 || !tensor.len().is_multiple_of(row_bytes) {
        return Err(QuantError::PartialBlock {
            ty,
            n_bytes: tensor.len(),
            type_size: row_bytes,
        });
    }
    let n_rows = tensor.len() / row_bytes;
    if row >= n_rows {
        return Err(QuantError::RowOutOfRange {
            ty,
            row,
            n_rows,
            n_cols,
        });
    }
    dequantize(ty, &tensor[row * row_bytes..(row + 1) * row_bytes], dst)
}

/// F16 widening with F16C where the CPU has it (`vcvtph2ps` is exact and
/// quiets signaling NaNs, as [`dequantize_row_f16_ref`] does; the dequant
/// fixtures include NaN and infinity), else the reference loop.
fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        let n = dst.len() / 8 * 8;
        // SAFETY: F16C and AVX checked; 8 values (16 bytes) per step within both slices.
        unsafe { widen_f16c(&src[..2 * n], &mut dst[..n]) };
        dequantize_row_f16_ref(&src[2 * n..], &mut dst[n..]);
        return;
    }
    dequantize_row_f16_ref(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(16)) {
        let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
        _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_types_are_named_in_the_error() {
        let err = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0.0; 256]).unwrap_err();
        assert_eq!(
            err,
            QuantError::Unsupported {
                ty: GgmlType::IQ2_XXS,
                op: "dequantization"
            }
        );
        assert!(err.to_string().contains("IQ2_XXS"), "{err}");
        let err = quantize(GgmlType::Q3_K, &[0.0; 256], &mut [0; 110]).unwrap_err();
        assert!(err.to_string().contains("Q3_K"), "{err}");
    }

    #[test]
    fn length_mismatches_are_errors() {
        use GgmlType::*;
        assert_eq!(
            dequantize(Q4_K, &[0; 145], &mut [0.0; 256]).unwrap_err(),
            QuantError::PartialBlock {
                ty: Q4_K,
                n_bytes: 145,
                type_size: 144
            }
        );
        assert_eq!(
            dequantize(Q8_0, &[0; 68], &mut [0.0; 63]).unwrap_err(),
            QuantError::DestinationLength {
                ty: Q8_0,
                expected: 64,
                actual: 63,
                unit: "values"
            }
        );
        assert_eq!(
            quantize(Q6_K, &[0.0; 255], &mut [0; 210]).unwrap_err(),
            QuantError::PartialBlockValues {
                ty: Q6_K,
                n_values: 255,
                block_size: 256
            }
        );
        assert_eq!(
            quantize(Q8_K, &[0.0; 256], &mut [0; 291]).unwrap_err(),
            QuantError::DestinationLength {
                ty: Q8_K,
                expected: 292,
                actual: 291,
                unit: "bytes"
            }
        );
    }

    #[test]
    fn dequantize_row_picks_the_requested_row() {
        use GgmlType::*;
        // 3 rows of 64 values in Q8_0: row r has d = 1 and q = r + 1 everywhere.
        let mut tensor = Vec::new();
        for r in 0..3u8 {
            for _ in 0..2 {
                tensor.extend_from_slice(&F16Le::from_f32(1.0).0);
                tensor.extend_from_slice(&[r + 1; 32]);
            }
        }
        let mut row = [0.0f32; 64];
        dequantize_row(Q8_0, &tensor, 64, 2, &mut row).unwrap();
        assert!(row.iter().all(|&v| v == 3.0));
        assert_eq!(
            dequantize_row(Q8_0, &tensor, 64, 3, &mut row).unwrap_err(),
            QuantError::RowOutOfRange {
                ty: Q8_0,
                row: 3,
                n_rows: 3,
                n_cols: 64
            }
        );
        assert!(matches!(
            dequantize_row(Q8_0, &tensor, 48, 0, &mut row),
            Err(QuantError::PartialBlockValues { .. })
        ));
    }
}
