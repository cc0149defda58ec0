//! Scalar reference dequantization, one function per type. Kept forever: faster kernels
//! are tested against these.
//!
//! Each function reproduces ggml's `dequantize_row_*` (ggml-quants.c) bit for bit: the same
//! f32 products in the same order (for example Q4_K is `(d * sc) * q - dmin * m`, Q6_K is
//! `(d * sc) * q`), which is also the order the `gguf` Python package uses. Rust never fuses
//! a multiply and an add on its own, so plain expressions give the same roundings.
//!
//! The functions take typed blocks; [`super::dequantize`] checks lengths and views bytes as
//! blocks. Each panics if `dst` does not hold exactly `blocks * block_size` values.

use super::blocks::*;

fn check_len(n_blocks: usize, block_size: usize, dst: &[f32]) {
    assert_eq!(
        n_blocks * block_size,
        dst.len(),
        "dst must hold exactly {n_blocks} blocks"
    );
}

/// F32: little-endian bytes, copied bit for bit (NaN payloads included).
pub fn dequantize_row_f32_ref(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 4 * dst.len());
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// F16: exact widening; signaling NaNs become quiet (see [`F16Le::to_f32`]).
pub fn dequantize_row_f16_ref(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len());
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = F16Le([b[0], b[1]]).to_f32();
    }
}

/// BF16: the top half of an f32, so widening is a shift (NaN payloads kept, as in ggml).
pub fn dequantize_row_bf16_ref(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len());
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

pub fn dequantize_row_q4_0_ref(blocks: &[BlockQ4_0], dst: &mut [f32]) {
    check_len(blocks.len(), QK, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub fn dequantize_row_q4_1_ref(blocks: &[BlockQ4_1], dst: &mut [f32]) {
    check_len(blocks.len(), QK, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        let m = b.m.to_f32();
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = (q & 0xF) as f32 * d + m;
            y[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

/// Value `j` of a Q5_0/Q5_1 block as an unsigned 5-bit level.
fn q5_level(qs: &[u8; QK / 2], qh: u32, j: usize) -> i32 {
    let low = if j < QK / 2 {
        qs[j] & 0xF
    } else {
        qs[j - QK / 2] >> 4
    };
    (low as u32 | (((qh >> j) & 1) << 4)) as i32
}

pub fn dequantize_row_q5_0_ref(blocks: &[BlockQ5_0], dst: &mut [f32]) {
    check_len(blocks.len(), QK, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        let qh = u32::from_le_bytes(b.qh);
        for (j, y) in y.iter_mut().enumerate() {
            *y = (q5_level(&b.qs, qh, j) - 16) as f32 * d;
        }
    }
}

pub fn dequantize_row_q5_1_ref(blocks: &[BlockQ5_1], dst: &mut [f32]) {
    check_len(blocks.len(), QK, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        let m = b.m.to_f32();
        let qh = u32::from_le_bytes(b.qh);
        for (j, y) in y.iter_mut().enumerate() {
            *y = q5_level(&b.qs, qh, j) as f32 * d + m;
        }
    }
}

pub fn dequantize_row_q8_0_ref(blocks: &[BlockQ8_0], dst: &mut [f32]) {
    check_len(blocks.len(), QK, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Q2_K. Values come in two halves of 128; in each, shift `s` (0, 2, 4, 6) of the 32 `qs`
/// bytes gives groups `2s'` (bytes 0..16) and `2s' + 1` (bytes 16..32), s' = s / 2.
pub fn dequantize_row_q2_k_ref(blocks: &[BlockQ2K], dst: &mut [f32]) {
    check_len(blocks.len(), QK_K, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let dmin = b.dmin.to_f32();
        for (g, y) in y.chunks_exact_mut(16).enumerate() {
            let sc = b.scales[g];
            let dl = d * (sc & 0xF) as f32;
            let ml = dmin * (sc >> 4) as f32;
            let (half, shift, part) = (g / 8, 2 * ((g % 8) / 2), g % 2);
            let q = &b.qs[32 * half + 16 * part..][..16];
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * ((q >> shift) & 3) as f32 - ml;
            }
        }
    }
}

/// Q3_K. Same group walk as Q2_K; the high bit of group `g`'s values is bit `g / 2` of
/// `hmask` (over all 8 bit positions), and a clear high bit subtracts 4.
pub fn dequantize_row_q3_k_ref(blocks: &[BlockQ3K], dst: &mut [f32]) {
    check_len(blocks.len(), QK_K, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let scales = q3k_scales(&b.scales);
        for (g, y) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * scales[g] as f32;
            let (half, shift, part) = (g / 8, 2 * ((g % 8) / 2), g % 2);
            let hbit = 1u8 << (g / 2);
            let q = &b.qs[32 * half + 16 * part..][..16];
            let hm = &b.hmask[16 * part..][..16];
            for ((y, &q), &hm) in y.iter_mut().zip(q).zip(hm) {
                let level = ((q >> shift) & 3) as i32 - if hm & hbit != 0 { 0 } else { 4 };
                *y = dl * level as f32;
            }
        }
    }
}

/// Q4_K. Chunk `c` of 64 values uses `qs[32c..32c+32]`: low nibbles are group `2c`, high
/// nibbles group `2c + 1`.
pub fn dequantize_row_q4_k_ref(blocks: &[BlockQ4K], dst: &mut [f32]) {
    check_len(blocks.len(), QK_K, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let dmin = b.dmin.to_f32();
        for (g, y) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(g, &b.scales);
            let dl = d * sc as f32;
            let ml = dmin * m as f32;
            let shift = 4 * (g % 2);
            for (y, &q) in y.iter_mut().zip(&b.qs[32 * (g / 2)..][..32]) {
                *y = dl * ((q >> shift) & 0xF) as f32 - ml;
            }
        }
    }
}

/// Q5_K. As Q4_K, plus bit `g` of `qh[l]` is the fifth bit of value `l` of group `g`.
pub fn dequantize_row_q5_k_ref(blocks: &[BlockQ5K], dst: &mut [f32]) {
    check_len(blocks.len(), QK_K, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let dmin = b.dmin.to_f32();
        for (g, y) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(g, &b.scales);
            let dl = d * sc as f32;
            let ml = dmin * m as f32;
            let shift = 4 * (g % 2);
            let ql = &b.qs[32 * (g / 2)..][..32];
            for ((y, &ql), &qh) in y.iter_mut().zip(ql).zip(&b.qh) {
                let level = ((ql >> shift) & 0xF) | (((qh >> g) & 1) << 4);
                *y = dl * level as f32 - ml;
            }
        }
    }
}

/// Q6_K. Half `h` of 128 values uses `ql[64h..64h+64]` and `qh[32h..32h+32]`. Value `l` of
/// quarter `k` (32 values each) has its low 4 bits in `ql[32 * (k % 2) + l]` (low nibble for
/// k < 2, high nibble otherwise) and its top 2 bits at bit `2k` of `qh[l]`. Each 16
/// consecutive values share one scale.
pub fn dequantize_row_q6_k_ref(blocks: &[BlockQ6K], dst: &mut [f32]) {
    check_len(blocks.len(), QK_K, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (i, y) in y.iter_mut().enumerate() {
            let (half, quarter, l) = (i / 128, (i % 128) / 32, i % 32);
            // Quarters 0 and 2 use ql[l], 1 and 3 use ql[l + 32]; 2 and 3 the high nibble.
            let ql = b.ql[64 * half + 32 * (quarter % 2) + l];
            let low = if quarter < 2 { ql & 0xF } else { ql >> 4 };
            let high = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
            let level = (low | (high << 4)) as i32 - 32;
            let sc = b.scales[i / 16];
            *y = d * sc as f32 * level as f32;
        }
    }
}

pub fn dequantize_row_q8_k_ref(blocks: &[BlockQ8K], dst: &mut [f32]) {
    check_len(blocks.len(), QK_K, dst);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = b.d * q as f32;
        }
    }
}
