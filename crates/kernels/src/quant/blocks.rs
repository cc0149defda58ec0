//! Block layouts of the GGML quantization formats (ggml-common.h), one struct per type.
//!
//! Weight blocks come straight from a memory-mapped GGUF, where nothing guarantees more
//! than byte alignment. So every weight block is built from byte arrays only (alignment 1,
//! no padding, every bit pattern valid) and its f16 scales are stored as little-endian bytes
//! ([`F16Le`]). That lets [`as_blocks`] view any byte slice of the right length as blocks
//! without copying. Q8_K is an activation format that we create ourselves, so
//! [`BlockQ8K`] keeps its natural `f32`/`i16` fields and lives in aligned `Vec`s.

use std::mem::{align_of, size_of};

use half::f16;
use hearth_gguf::GgmlType;

use super::QuantError;

/// Values per block of the 32-wide formats (Q4_0 .. Q8_0).
pub const QK: usize = 32;
/// Values per super-block of the k-quant formats (Q2_K .. Q8_K).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K (and of the 6-bit scales in Q3_K).
pub const K_SCALE_SIZE: usize = 12;

/// An IEEE binary16 value stored as two little-endian bytes (no alignment requirement).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    pub fn from_bits(bits: u16) -> F16Le {
        F16Le(bits.to_le_bytes())
    }

    pub fn to_bits(self) -> u16 {
        u16::from_le_bytes(self.0)
    }

    /// Exact widening. A signaling NaN comes back quiet with its payload kept, as ggml's
    /// `GGML_FP16_TO_FP32` (both its F16C and its portable path) and IEEE 754 do.
    pub fn to_f32(self) -> f32 {
        f16::from_bits(self.to_bits()).to_f32()
    }

    /// Round to nearest, ties to even (ggml's `GGML_FP32_TO_FP16` for finite values).
    pub fn from_f32(x: f32) -> F16Le {
        F16Le::from_bits(f16::from_f32(x).to_bits())
    }
}

/// Q4_0: 32 values `d * (q - 8)`, q 4-bit. Low nibbles hold values 0..16, high nibbles 16..32.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Le,
    pub qs: [u8; QK / 2],
}

/// Q4_1: 32 values `d * q + m`, q 4-bit, nibbles as in Q4_0.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qs: [u8; QK / 2],
}

/// Q5_0: 32 values `d * (q - 16)`, q 5-bit: low 4 bits in nibbles as in Q4_0, bit 4 of
/// value `i` is bit `i` of the little-endian u32 `qh`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: 32 values `d * q + m`, q 5-bit packed as in Q5_0.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: 32 values `d * q`, q signed 8-bit.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Le,
    pub qs: [i8; QK],
}

/// Q2_K: 256 values in 16 groups of 16, `d * sc * q - dmin * m`, q 2-bit, each `scales`
/// byte holding a 4-bit scale (low nibble) and 4-bit min (high nibble).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16Le,
    pub dmin: F16Le,
}

/// Q3_K: 256 values in 16 groups of 16, `d * (sc - 32) * (q - 4 * !hbit)`, q 2-bit low part
/// plus a high bit in `hmask`, 6-bit scales packed in 12 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; K_SCALE_SIZE],
    pub d: F16Le,
}

/// Q4_K: 256 values in 8 groups of 32, `d * sc * q - dmin * m`, q 4-bit, 6-bit scales and
/// mins packed in 12 bytes (see `scale_min_k4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as Q4_K with a fifth bit per value in `qh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 values in 16 groups of 16, `d * sc * (q - 32)`, q 6-bit (low 4 bits in `ql`,
/// high 2 in `qh`), scales signed 8-bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16Le,
}

/// Q8_K: 256 activation values `d * q`, with `bsums[g]` the sum of `qs` over group `g` of 16
/// (used by the k-quant dot products). Aligned to 4; only ever held in our own buffers.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ2K {
    fn default() -> Self {
        BlockQ2K {
            scales: [0; 16],
            qs: [0; 64],
            d: F16Le::default(),
            dmin: F16Le::default(),
        }
    }
}

impl Default for BlockQ3K {
    fn default() -> Self {
        BlockQ3K {
            hmask: [0; 32],
            qs: [0; 64],
            scales: [0; 12],
            d: F16Le::default(),
        }
    }
}

impl Default for BlockQ4K {
    fn default() -> Self {
        BlockQ4K {
            d: F16Le::default(),
            dmin: F16Le::default(),
            scales: [0; 12],
            qs: [0; 128],
        }
    }
}

impl Default for BlockQ5K {
    fn default() -> Self {
        BlockQ5K {
            d: F16Le::default(),
            dmin: F16Le::default(),
            scales: [0; 12],
            qh: [0; 32],
            qs: [0; 128],
        }
    }
}

impl Default for BlockQ6K {
    fn default() -> Self {
        BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: F16Le::default(),
        }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        }
    }
}

impl BlockQ8K {
    /// Size of the serialized block, as in GGUF.
    pub const BYTES: usize = 292;

    /// Parses the GGUF byte layout (little-endian `d`, `qs`, `bsums`).
    pub fn from_bytes(bytes: &[u8; Self::BYTES]) -> BlockQ8K {
        let mut block = BlockQ8K {
            d: f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            ..BlockQ8K::default()
        };
        for (q, &b) in block.qs.iter_mut().zip(&bytes[4..4 + QK_K]) {
            *q = b as i8;
        }
        for (s, b) in block
            .bsums
            .iter_mut()
            .zip(bytes[4 + QK_K..].chunks_exact(2))
        {
            *s = i16::from_le_bytes([b[0], b[1]]);
        }
        block
    }

    /// Writes the GGUF byte layout.
    pub fn write_bytes(&self, out: &mut [u8; Self::BYTES]) {
        out[0..4].copy_from_slice(&self.d.to_le_bytes());
        for (b, &q) in out[4..4 + QK_K].iter_mut().zip(&self.qs) {
            *b = q as u8;
        }
        for (b, s) in out[4 + QK_K..].chunks_exact_mut(2).zip(&self.bsums) {
            b.copy_from_slice(&s.to_le_bytes());
        }
    }
}

// Layouts are part of the file format: pin sizes, and alignment 1 for the byte blocks that
// `as_blocks` may place at any address.
macro_rules! assert_byte_block {
    ($($block:ty => $size:expr),* $(,)?) => {
        $(
            const _: () = assert!(size_of::<$block>() == $size);
            const _: () = assert!(align_of::<$block>() == 1);
        )*
    };
}

assert_byte_block! {
    F16Le => 2,
    BlockQ4_0 => 18,
    BlockQ4_1 => 20,
    BlockQ5_0 => 22,
    BlockQ5_1 => 24,
    BlockQ8_0 => 34,
    BlockQ2K => 84,
    BlockQ3K => 110,
    BlockQ4K => 144,
    BlockQ5K => 176,
    BlockQ6K => 210,
}
const _: () = assert!(size_of::<BlockQ8K>() == BlockQ8K::BYTES);

/// A weight block that is plain bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]` with alignment 1 and no padding, and built only from
/// `u8`/`i8` arrays and [`F16Le`], so that every byte pattern of `size_of::<Self>()` bytes
/// is a valid value. The `assert_byte_block!` list above checks size and alignment.
pub unsafe trait ByteBlock: Copy + 'static {
    /// The GGML type this block encodes.
    const TYPE: GgmlType;
}

// SAFETY: each type below is repr(C), made of u8/i8 arrays and F16Le only, and is checked
// to have alignment 1 and its exact GGML size (so no padding) by `assert_byte_block!`.
unsafe impl ByteBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
}
unsafe impl ByteBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
}
unsafe impl ByteBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
}
unsafe impl ByteBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
}
unsafe impl ByteBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
}
unsafe impl ByteBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
}
unsafe impl ByteBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
}
unsafe impl ByteBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
}
unsafe impl ByteBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
}
unsafe impl ByteBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
}

fn check_whole_blocks<B: ByteBlock>(len: usize) -> Result<usize, QuantError> {
    let type_size = size_of::<B>();
    if !len.is_multiple_of(type_size) {
        return Err(QuantError::PartialBlock {
            ty: B::TYPE,
            n_bytes: len,
            type_size,
        });
    }
    Ok(len / type_size)
}

/// Views `bytes` (any alignment, e.g. a tensor in a mapped GGUF) as a slice of blocks,
/// without copying. Fails if the length is not a whole number of blocks.
pub fn as_blocks<B: ByteBlock>(bytes: &[u8]) -> Result<&[B], QuantError> {
    let n_blocks = check_whole_blocks::<B>(bytes.len())?;
    // SAFETY: `ByteBlock` guarantees B has alignment 1, no padding and no invalid bit
    // patterns, so `n_blocks * size_of::<B>()` initialized bytes at any address form a valid
    // `[B]`; the returned slice borrows `bytes`, so it cannot outlive or alias a writer.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), n_blocks) })
}

/// Mutable form of [`as_blocks`], for quantizing straight into an output byte buffer.
pub fn as_blocks_mut<B: ByteBlock>(bytes: &mut [u8]) -> Result<&mut [B], QuantError> {
    let n_blocks = check_whole_blocks::<B>(bytes.len())?;
    // SAFETY: as in `as_blocks`; additionally every value written through the result is a
    // valid B, whose bytes (no padding) are all valid u8, so `bytes` stays valid.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n_blocks) })
}

/// The 6-bit scale and min of group `j` (0..8) of a Q4_K/Q5_K block.
///
/// Bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 mins 0..4; groups 4..8 keep
/// their low 4 bits in the nibbles of bytes 8..12 and their top 2 bits in the top 2 bits of
/// bytes 0..8.
pub fn scale_min_k4(j: usize, scales: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// The 16 signed scales of a Q3_K block (already offset by -32).
///
/// Scale `i` has its low 4 bits in a nibble of bytes 0..8 (low nibbles for 0..8, high nibbles
/// for 8..16) and its top 2 bits in byte `8 + i % 4` at bit `2 * (i / 4)`.
pub fn q3k_scales(scales: &[u8; K_SCALE_SIZE]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 {
            scales[i] & 0xF
        } else {
            scales[i - 8] >> 4
        };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_the_gguf_type_table() {
        let sizes = [
            (GgmlType::Q4_0, size_of::<BlockQ4_0>()),
            (GgmlType::Q4_1, size_of::<BlockQ4_1>()),
            (GgmlType::Q5_0, size_of::<BlockQ5_0>()),
            (GgmlType::Q5_1, size_of::<BlockQ5_1>()),
            (GgmlType::Q8_0, size_of::<BlockQ8_0>()),
            (GgmlType::Q2_K, size_of::<BlockQ2K>()),
            (GgmlType::Q3_K, size_of::<BlockQ3K>()),
            (GgmlType::Q4_K, size_of::<BlockQ4K>()),
            (GgmlType::Q5_K, size_of::<BlockQ5K>()),
            (GgmlType::Q6_K, size_of::<BlockQ6K>()),
            (GgmlType::Q8_K, size_of::<BlockQ8K>()),
        ];
        for (ty, size) in sizes {
            assert_eq!(ty.type_size(), size, "{ty}");
        }
    }

    #[test]
    fn as_blocks_accepts_any_alignment_and_rejects_partial_blocks() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1 + 2 * 144).collect();
        let blocks = as_blocks::<BlockQ4K>(&bytes[1..]).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].d.0, [145, 146]);
        assert_eq!(blocks[1].qs[127], ((1 + 144 + 143) % 256) as u8);
        assert_eq!(
            as_blocks::<BlockQ4K>(&bytes[..100]).unwrap_err(),
            QuantError::PartialBlock {
                ty: GgmlType::Q4_K,
                n_bytes: 100,
                type_size: 144
            }
        );
    }

    #[test]
    fn q8k_bytes_round_trip() {
        let mut block = BlockQ8K {
            d: -1.5e-3,
            ..BlockQ8K::default()
        };
        block.qs = std::array::from_fn(|i| (i as i32 - 128) as i8);
        block.bsums = std::array::from_fn(|i| i as i16 * -300);
        let mut bytes = [0u8; BlockQ8K::BYTES];
        block.write_bytes(&mut bytes);
        assert_eq!(BlockQ8K::from_bytes(&bytes), block);
    }

    #[test]
    fn q3k_scales_unpack_each_field() {
        // Scale 5: low nibble 0x7 in the low nibble of byte 5, top bits 0b10 in byte 9 at bit 2.
        let mut packed = [0u8; 12];
        packed[5] = 0x07;
        packed[9] = 0b10 << 2;
        // Scale 13: low nibble 0xC in the high nibble of byte 5, top bits 0b11 in byte 9 at bit 6.
        packed[5] |= 0xC0;
        packed[9] |= 0b11 << 6;
        let s = q3k_scales(&packed);
        assert_eq!(s[5], 0b10_0111 - 32);
        assert_eq!(s[13], 0b11_1100 - 32);
        assert_eq!(s[0], -32);
    }
}
