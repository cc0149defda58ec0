//! Packing a weight matrix into groups of 8 interleaved rows (see the parent
//! module for the layout).

use super::*;

impl PackedMatrix {
    /// Packs `m`, or `None` if its type has no packed kernels, it has fewer
    /// than 8 rows, or (Q4_K) llama.cpp would not repack it (then the plain
    /// `vec_dot` order applies to every row).
    pub fn pack(m: &QMatrix) -> Option<PackedMatrix> {
        let pb = packed_block_bytes(m.ty)?;
        if m.rows < GROUP
            || (m.ty == GgmlType::Q4_K
                && !crate::cpu::ggml_order::repack_q4_k::is_repacked_q4_k(m.rows))
        {
            return None;
        }
        let (groups, blocks) = (m.rows / GROUP, m.cols / m.ty.block_size());
        let mut data = HugeBuf::zeroed(groups * blocks * pb);
        let ts = m.ty.type_size();
        let fill = |g: usize, out: &mut [u8]| {
            for b in 0..blocks {
                let src: [&[u8]; GROUP] = std::array::from_fn(|r| {
                    let row = m.row(g * GROUP + r);
                    &row[b * ts..(b + 1) * ts]
                });
                pack_block(m.ty, &src, &mut out[b * pb..(b + 1) * pb]);
            }
        };
        let chunk = blocks * pb;
        let pool = pool::global();
        let ptr = SendPtr(data.as_mut_ptr());
        pool.run(|i, n| {
            for g in pool::share(groups, i, n) {
                // SAFETY: each group's bytes are written by one thread only.
                let out =
                    unsafe { std::slice::from_raw_parts_mut(ptr.get().add(g * chunk), chunk) };
                fill(g, out);
            }
        });
        Some(PackedMatrix {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            groups,
            blocks,
            block_bytes: pb,
            data,
        })
    }

    /// Packs two matrices of one type and shape (an MLP's gate and up
    /// projections) into one whose groups alternate: group `2i` is `a`'s group
    /// `i`, group `2i + 1` is `b`'s. For [`matmul_packed_glu`]. `None` unless
    /// both pack and have whole groups only.
    pub fn pack_pair(a: &QMatrix, b: &QMatrix) -> Option<PackedMatrix> {
        if (a.ty, a.rows, a.cols) != (b.ty, b.rows, b.cols) || !a.rows.is_multiple_of(GROUP) {
            return None;
        }
        let (pa, pb) = (Self::pack(a)?, Self::pack(b)?);
        let chunk = pa.blocks * pa.block_bytes;
        let mut data = HugeBuf::zeroed(2 * pa.groups * chunk);
        for g in 0..pa.groups {
            // SAFETY: both sources hold `groups * chunk` bytes, the destination twice that.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    pa.group(g),
                    data.as_mut_ptr().add(2 * g * chunk),
                    chunk,
                );
                std::ptr::copy_nonoverlapping(
                    pb.group(g),
                    data.as_mut_ptr().add((2 * g + 1) * chunk),
                    chunk,
                );
            }
        }
        Some(PackedMatrix {
            rows: 2 * a.rows,
            groups: 2 * pa.groups,
            data,
            ..pa
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub(super) fn group(&self, g: usize) -> *const u8 {
        assert!(g < self.groups);
        // SAFETY: in bounds (groups * blocks * block_bytes bytes).
        unsafe { self.data.as_ptr().add(g * self.blocks * self.block_bytes) }
    }
}

/// Writes `dst[8r + i] = src[r][off + i]` for i < 8: one unit.
fn unit(src: &[&[u8]; GROUP], off: usize, dst: &mut [u8]) {
    for (r, s) in src.iter().enumerate() {
        dst[8 * r..8 * r + 8].copy_from_slice(&s[off..off + 8]);
    }
}

/// Writes the 8 rows' f16 at byte `off` of their blocks.
fn f16s(src: &[&[u8]; GROUP], off: usize, dst: &mut [u8]) {
    for (r, s) in src.iter().enumerate() {
        dst[2 * r..2 * r + 2].copy_from_slice(&s[off..off + 2]);
    }
}

/// Packs one block of 8 rows (`src[r]`: row r's GGUF block bytes).
fn pack_block(ty: GgmlType, src: &[&[u8]; GROUP], dst: &mut [u8]) {
    use GgmlType::*;
    match ty {
        Q8_0 => {
            f16s(src, 0, &mut dst[..16]);
            for u in 0..4 {
                unit(src, 2 + 8 * u, &mut dst[16 + 64 * u..]);
            }
        }
        Q4_0 => {
            f16s(src, 0, &mut dst[..16]);
            for u in 0..2 {
                unit(src, 2 + 8 * u, &mut dst[16 + 64 * u..]);
            }
        }
        Q5_0 => {
            f16s(src, 0, &mut dst[..16]);
            // BlockQ5_0: d (2), qh (4), qs (16).
            for k in 0..4 {
                for (r, s) in src.iter().enumerate() {
                    dst[16 + 8 * k + r] = s[2 + k];
                }
            }
            for u in 0..2 {
                unit(src, 6 + 8 * u, &mut dst[48 + 64 * u..]);
            }
        }
        Q4_1 => {
            f16s(src, 0, &mut dst[..16]);
            f16s(src, 2, &mut dst[16..32]);
            for u in 0..2 {
                unit(src, 4 + 8 * u, &mut dst[32 + 64 * u..]);
            }
        }
        Q4_K => {
            // BlockQ4K: d (2), dmin (2), scales (12), qs (128).
            f16s(src, 0, &mut dst[..16]);
            f16s(src, 2, &mut dst[16..32]);
            for (r, s) in src.iter().enumerate() {
                let scales: &[u8; 12] = s[4..16].try_into().unwrap();
                for j in 0..8 {
                    let (sc, m) = scale_min_k4(j, scales);
                    dst[layout::Q4_K_SC + 8 * j + r] = sc;
                    dst[layout::Q4_K_MN + 8 * j + r] = m;
                }
            }
            for p in 0..4 {
                for u in 0..4 {
                    unit(
                        src,
                        16 + 32 * p + 8 * u,
                        &mut dst[layout::Q4_K_QS + 64 * (4 * p + u)..],
                    );
                }
            }
        }
        Q6_K => {
            // BlockQ6K: ql (128), qh (64), scales (16 i8), d (2).
            f16s(src, 208, &mut dst[..16]);
            for (r, s) in src.iter().enumerate() {
                for g in 0..16 {
                    dst[layout::Q6_K_SC + 8 * g + r] = s[192 + g];
                }
            }
            for n in 0..2 {
                for h in 0..2 {
                    for u in 0..4 {
                        unit(
                            src,
                            64 * n + 32 * h + 8 * u,
                            &mut dst[layout::Q6_K_QL + 64 * (8 * n + 4 * h + u)..],
                        );
                    }
                }
                for u in 0..4 {
                    unit(
                        src,
                        128 + 32 * n + 8 * u,
                        &mut dst[layout::Q6_K_QH + 64 * (4 * n + u)..],
                    );
                }
            }
        }
        _ => unreachable!("packed_block_bytes admits only the types above"),
    }
}
