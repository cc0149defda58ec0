//! How weight matrices are laid out on the GPU. K-quant blocks whose size is a
//! multiple of 16 bytes (Q4_K 144, Q5_K 176) and float rows are uploaded as
//! they are in the GGUF. The others (Q8_0 34, Q4_0 18, Q5_0 22, Q6_K 210
//! bytes) would leave most blocks misaligned for 16-byte loads, so they are
//! split into an array of block bodies without the f16 scale and an array of
//! the scales, in the same block order.

use hearth_gguf::GgmlType;

/// Weight types the kernels read; the ids match `WT_*` in kernels/gemv.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightKind {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    Q8_0 = 3,
    Q4_0 = 4,
    Q5_0 = 5,
    Q4K = 6,
    Q5K = 7,
    Q6K = 8,
}

/// Where the f16 scale sits in a split block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScaleAt {
    Start,
    End,
}

impl WeightKind {
    pub fn of(ty: GgmlType) -> Option<WeightKind> {
        Some(match ty {
            GgmlType::F32 => WeightKind::F32,
            GgmlType::F16 => WeightKind::F16,
            GgmlType::BF16 => WeightKind::Bf16,
            GgmlType::Q8_0 => WeightKind::Q8_0,
            GgmlType::Q4_0 => WeightKind::Q4_0,
            GgmlType::Q5_0 => WeightKind::Q5_0,
            GgmlType::Q4_K => WeightKind::Q4K,
            GgmlType::Q5_K => WeightKind::Q5K,
            GgmlType::Q6_K => WeightKind::Q6K,
            _ => return None,
        })
    }

    /// Kernel name suffix (gemv_<name>_<nt>).
    pub fn name(self) -> &'static str {
        match self {
            WeightKind::F32 => "f32",
            WeightKind::F16 => "f16",
            WeightKind::Bf16 => "bf16",
            WeightKind::Q8_0 => "q8_0",
            WeightKind::Q4_0 => "q4_0",
            WeightKind::Q5_0 => "q5_0",
            WeightKind::Q4K => "q4_k",
            WeightKind::Q5K => "q5_k",
            WeightKind::Q6K => "q6_k",
        }
    }

    /// Values per block and bytes per block in the GGUF.
    pub fn block(self) -> (usize, usize) {
        match self {
            WeightKind::F32 => (1, 4),
            WeightKind::F16 | WeightKind::Bf16 => (1, 2),
            WeightKind::Q8_0 => (32, 34),
            WeightKind::Q4_0 => (32, 18),
            WeightKind::Q5_0 => (32, 22),
            WeightKind::Q4K => (256, 144),
            WeightKind::Q5K => (256, 176),
            WeightKind::Q6K => (256, 210),
        }
    }

    fn split(self) -> Option<ScaleAt> {
        match self {
            WeightKind::Q8_0 | WeightKind::Q4_0 | WeightKind::Q5_0 => Some(ScaleAt::Start),
            WeightKind::Q6K => Some(ScaleAt::End),
            _ => None,
        }
    }

    /// Whether the type has 256-value super-blocks (items of 64 values in the GEMV).
    pub fn is_k_quant(self) -> bool {
        matches!(self, WeightKind::Q4K | WeightKind::Q5K | WeightKind::Q6K)
    }

    /// Whether blocks are stored as separate bodies and scales.
    pub fn is_split(self) -> bool {
        self.split().is_some()
    }

    /// The width every row must be a multiple of (the kernels take items of 32 values or K-quant super-blocks).
    pub fn k_multiple(self) -> usize {
        self.block().0.max(32)
    }
}

/// Bytes of the body array and of the scale array for `n_blocks` blocks.
pub fn split_sizes(kind: WeightKind, n_blocks: usize) -> (usize, usize) {
    match kind.split() {
        None => (n_blocks * kind.block().1, 0),
        Some(_) => (n_blocks * (kind.block().1 - 2), n_blocks * 2),
    }
}

/// Splits GGUF blocks `src` into `bodies` and `scales` (see the module doc).
/// For unsplit kinds `bodies` is a copy of `src` and `scales` is empty.
pub fn split_blocks(kind: WeightKind, src: &[u8], bodies: &mut [u8], scales: &mut [u8]) {
    let bb = kind.block().1;
    debug_assert_eq!(src.len() % bb, 0);
    match kind.split() {
        None => bodies.copy_from_slice(src),
        Some(at) => {
            let body = bb - 2;
            for ((blk, b), s) in src
                .chunks_exact(bb)
                .zip(bodies.chunks_exact_mut(body))
                .zip(scales.chunks_exact_mut(2))
            {
                match at {
                    ScaleAt::Start => {
                        s.copy_from_slice(&blk[..2]);
                        b.copy_from_slice(&blk[2..]);
                    }
                    ScaleAt::End => {
                        b.copy_from_slice(&blk[..body]);
                        s.copy_from_slice(&blk[body..]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splitting keeps every byte: bodies + scales reassemble the blocks.
    #[test]
    fn split_blocks_round_trips() {
        for kind in [
            WeightKind::Q8_0,
            WeightKind::Q4_0,
            WeightKind::Q5_0,
            WeightKind::Q6K,
            WeightKind::Q4K,
        ] {
            let (_, bb) = kind.block();
            let n = 7;
            let src: Vec<u8> = (0..n * bb).map(|i| (i * 31 % 251) as u8).collect();
            let (nb, ns) = split_sizes(kind, n);
            let (mut bodies, mut scales) = (vec![0u8; nb], vec![0u8; ns]);
            split_blocks(kind, &src, &mut bodies, &mut scales);
            let mut back = Vec::new();
            if kind.is_split() {
                let body = bb - 2;
                for i in 0..n {
                    let (b, s) = (&bodies[i * body..(i + 1) * body], &scales[i * 2..i * 2 + 2]);
                    if kind == WeightKind::Q6K {
                        back.extend_from_slice(b);
                        back.extend_from_slice(s);
                    } else {
                        back.extend_from_slice(s);
                        back.extend_from_slice(b);
                    }
                }
                // Bodies must be 16-byte multiples or 4-byte (Q5_0) for the kernels' loads.
                assert_eq!(body % 4, 0, "{kind:?}");
            } else {
                back = bodies.clone();
            }
            assert_eq!(back, src, "{kind:?}");
        }
    }

    /// The GGUF block sizes agree with hearth-gguf's (an independent table).
    #[test]
    fn block_sizes_match_ggml() {
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let k = WeightKind::of(ty).unwrap();
            assert_eq!(k.block(), (ty.block_size(), ty.type_size()), "{ty:?}");
        }
        assert!(WeightKind::of(GgmlType::Q2_K).is_none());
    }
}
