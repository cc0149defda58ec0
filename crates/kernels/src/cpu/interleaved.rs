//! Weight matrices repacked at load for the SIMD kernels, and the matmul over
//! them.
//!
//! Rows are taken eight at a time ("groups"). For each group and each
//! quantization block, the block's quants are stored as *units* (see
//! [`simd`](super::simd)): 64 bytes = 8 consecutive quant bytes of each of the
//! 8 rows, so one vector load feeds eight output rows and one broadcast of 8
//! activation bytes serves them all. Scales are stored beside the units,
//! transposed so that loading "scale j of the 8 rows" is one 8-byte load.
//! Quants keep their packed bit width (nibbles stay nibbles), so decode reads
//! no more bytes than the GGUF holds.
//!
//! Every kernel reproduces, bit for bit, the summation order of the matching
//! reference in `vec_dot`, `repack` or `tiled` (llama.cpp's x86 kernels):
//! integer partial sums are exact in any order, and the float operations are
//! the same lane-wise multiplies and fused multiply-adds in the same order.

use hearth_gguf::GgmlType;

use super::ggml_order::q8_k_x86::quantize_row_q8_k_x86;
use super::ggml_order::repack_q4_k::quantize_row_q8_k_mat_x86;
use super::ggml_order::vec_dot::{quantize_row_q8_0_x86, quantize_row_q8_1_ref, BlockQ8_1};
use super::matmul::{matmul_rows, QMatrix};
use super::simd::{scalar::Scalar, Isa, Simd};
use super::RowOrder;
use crate::pool::{self, SendPtr};
use crate::quant::blocks::*;

/// Rows per group.
pub const GROUP: usize = 8;

/// Byte layout of one packed block (8 rows) per type: offsets of the parts.
mod layout {
    // Q8_0: d[8] f16, 4 units (elements 8u..8u+8, raw signed bytes).
    pub const Q8_0: usize = 16 + 4 * 64;
    // Q4_0: d[8] f16, 2 units (bytes 8u..8u+8 of qs: low nibbles = elements
    // 8u.., high = 16 + 8u..).
    pub const Q4_0: usize = 16 + 2 * 64;
    // Q5_0: d[8], qh as 4 words (word k: byte k of each row's qh), 2 units.
    pub const Q5_0: usize = 16 + 32 + 2 * 64;
    // Q4_1: d[8], m[8], 2 units.
    pub const Q4_1: usize = 32 + 2 * 64;
    // Q4_K: d[8], dmin[8], scales[8][8] (sub-block j, row r), mins[8][8],
    // 16 units (pair p, u: bytes 32p + 8u.. of qs).
    pub const Q4_K: usize = 32 + 64 + 64 + 16 * 64;
    pub const Q4_K_SC: usize = 32;
    pub const Q4_K_MN: usize = 96;
    pub const Q4_K_QS: usize = 160;
    // Q6_K: d[8], scales[16][8] (i8), 16 ql units (half n, h, u: bytes
    // 64n + 32h + 8u.. of ql), 8 qh units (n, u: bytes 32n + 8u.. of qh).
    pub const Q6_K: usize = 16 + 128 + 16 * 64 + 8 * 64;
    pub const Q6_K_SC: usize = 16;
    pub const Q6_K_QL: usize = 144;
    pub const Q6_K_QH: usize = 144 + 16 * 64;
}

/// Bytes of one packed block of 8 rows, or `None` if the type has no packed kernels.
fn packed_block_bytes(ty: GgmlType) -> Option<usize> {
    use GgmlType::*;
    Some(match ty {
        Q8_0 => layout::Q8_0,
        Q4_0 => layout::Q4_0,
        Q5_0 => layout::Q5_0,
        Q4_1 => layout::Q4_1,
        Q4_K => layout::Q4_K,
        Q6_K => layout::Q6_K,
        _ => return None,
    })
}

/// A weight matrix in packed form. Rows past the last multiple of 8 stay in
/// the GGUF layout and go through the per-row kernels.
pub struct PackedMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Whole groups of 8 rows.
    pub groups: usize,
    /// Quantization blocks per row.
    pub blocks: usize,
    block_bytes: usize,
    data: HugeBuf,
}

/// A zeroed byte buffer aligned to 2 MiB and, on Linux, backed by
/// transparent huge pages where the kernel allows (`MADV_HUGEPAGE`):
/// streaming a gigabyte of weights per token through 4 KiB pages costs a
/// TLB miss every 4 KiB.
struct HugeBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

unsafe impl Send for HugeBuf {}
unsafe impl Sync for HugeBuf {}

impl HugeBuf {
    const ALIGN: usize = 2 << 20;

    fn zeroed(len: usize) -> HugeBuf {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), Self::ALIGN).expect("buffer size");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        #[cfg(target_os = "linux")]
        // SAFETY: advice on memory we own; failure is harmless.
        unsafe {
            libc::madvise(
                ptr.as_ptr() as *mut libc::c_void,
                layout.size(),
                libc::MADV_HUGEPAGE,
            );
        }
        // SAFETY: `len` bytes were allocated.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        HugeBuf { ptr, len }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len.max(1), Self::ALIGN).expect("buffer size");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({} [{}, {}], {} bytes)",
            self.ty,
            self.rows,
            self.cols,
            self.data.len()
        )
    }
}

impl PackedMatrix {
    /// Packs `m`, or `None` if its type has no packed kernels, it has fewer
    /// than 8 rows, or (Q4_K) llama.cpp would not repack it (then the plain
    /// `vec_dot` order applies to every row).
    pub fn pack(m: &QMatrix) -> Option<PackedMatrix> {
        let pb = packed_block_bytes(m.ty)?;
        if m.rows < GROUP
            || (m.ty == GgmlType::Q4_K && !super::ggml_order::repack_q4_k::is_repacked_q4_k(m.rows))
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

    fn group(&self, g: usize) -> *const u8 {
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

/// Activations quantized for one matmul, `blocks` blocks per token.
enum Acts {
    /// Q8_0 blocks, per block and group of 4 quants `-off · Σ a` (the
    /// offset correction of unsigned Q4_0/Q5_0 weights; zero for Q8_0), and
    /// per block the scale as f32 (so the kernels do not widen it per group).
    Q8_0(Vec<BlockQ8_0>, Vec<[i32; 8]>, Vec<f32>),
    Q8_1(Vec<BlockQ8_1>),
    /// Q8_K blocks; tokens below `gemm_rows` were quantized by the 4-row
    /// quantizer of llama.cpp's repacked gemm; `tiled`: Q6_K takes the tiled
    /// order (8+ rows, unless batch-invariant); for Q4_K, per block and pair
    /// of 32-value sub-blocks `(2p, 2p + 1)`, their activation sums as the
    /// 16-bit halves of one word (what the mins are multiplied by).
    Q8K(Vec<BlockQ8K>, usize, bool, Vec<[i32; 4]>),
}

/// Which float order a Q4_K/Q6_K product follows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Q4_K repacked gemv / Q6_K `vec_dot` lanes.
    Vec,
    /// Q4_K repacked gemm (per 64-value half) / Q6_K tiled (per block).
    Batch,
}

/// Fills `out` (`n` tokens of `per_token` items) with `f(t, token's items)`,
/// tokens split across the pool.
fn par_tokens<B: Send>(out: &mut [B], n: usize, f: impl Fn(usize, &mut [B]) + Sync) {
    let per_token = out.len() / n.max(1);
    let ptr = SendPtr(out.as_mut_ptr());
    let work = |range: std::ops::Range<usize>| {
        for t in range {
            // SAFETY: token t's items are written by one thread only.
            let items =
                unsafe { std::slice::from_raw_parts_mut(ptr.get().add(t * per_token), per_token) };
            f(t, items);
        }
    };
    let work = &work;
    if n < 4 {
        work(0..n);
    } else {
        pool::global().run(|i, nt| work(pool::share(n, i, nt)));
    }
}

fn quantize_acts(ty: GgmlType, x: &[f32], n: usize, cols: usize, order: RowOrder) -> Acts {
    use GgmlType::*;
    let row = |t: usize| &x[t * cols..(t + 1) * cols];
    match ty {
        Q8_0 | Q4_0 | Q5_0 => {
            let mut b = vec![BlockQ8_0::default(); n * cols / QK];
            par_tokens(&mut b, n, |t, out| quantize_row_q8_0_x86(row(t), out));
            // Unsigned Q4_0/Q5_0 quants carry an offset: Σ (q - off)·a = Σ q·a - off·Σ a.
            let off = match ty {
                Q4_0 => 8,
                Q5_0 => 16,
                _ => 0,
            };
            let corr = b
                .iter()
                .map(|blk| {
                    std::array::from_fn(|g| {
                        -off * blk.qs[4 * g..4 * g + 4]
                            .iter()
                            .map(|&q| q as i32)
                            .sum::<i32>()
                    })
                })
                .collect();
            let dy = b.iter().map(|blk| blk.d.to_f32()).collect();
            Acts::Q8_0(b, corr, dy)
        }
        Q4_1 => {
            let mut b = vec![BlockQ8_1::default(); n * cols / QK];
            par_tokens(&mut b, n, |t, out| quantize_row_q8_1_ref(row(t), out));
            Acts::Q8_1(b)
        }
        Q4_K | Q6_K => {
            let invariant = order == RowOrder::Invariant;
            let gemm_rows = if ty == Q4_K && !invariant {
                n - n % 4
            } else {
                0
            };
            let mut b = vec![BlockQ8K::default(); n * cols / QK_K];
            par_tokens(&mut b, n, |t, out| {
                if t < gemm_rows {
                    quantize_row_q8_k_mat_x86(row(t), out);
                } else {
                    quantize_row_q8_k_x86(row(t), out);
                }
            });
            let pair_sums = if ty == Q4_K {
                b.iter().map(sub_block_sum_pairs).collect()
            } else {
                Vec::new()
            };
            Acts::Q8K(b, gemm_rows, n >= 8 && !invariant, pair_sums)
        }
        _ => unreachable!("packed types only"),
    }
}

/// A Q8_K block's sums of its 32-value sub-blocks `2p` and `2p + 1` as the
/// low and high 16 bits of word `p` (|32 · 128| fits 16 bits).
fn sub_block_sum_pairs(by: &BlockQ8K) -> [i32; 4] {
    let bs = |j: usize| (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32) as u16 as u32;
    std::array::from_fn(|p| (bs(2 * p) | bs(2 * p + 1) << 16) as i32)
}

/// The 8 activation bytes at `off` as a little-endian u64.
#[inline(always)]
fn a64<const N: usize>(qs: &[i8; N], off: usize) -> u64 {
    assert!(off + 8 <= N);
    // SAFETY: in bounds (checked above; `off` is a constant per unrolled loop).
    unsafe { std::ptr::read_unaligned(qs.as_ptr().add(off) as *const u64) }
}

/// Block `b` of token `t`'s row (callers loop `b` below the row length).
#[inline(always)]
unsafe fn yb<'a, B, const NT: usize>(y: &[&'a [B]; NT], t: usize, b: usize) -> &'a B {
    &*(y[t].as_ptr().add(b))
}

/// Prefetches the block two blocks ahead (`pb` bytes per block): decode
/// streams the weights once, and the hardware prefetcher restarts at every
/// matmul.
#[inline(always)]
unsafe fn prefetch_ahead<S: Simd>(blk: *const u8, pb: usize) {
    let ahead = blk.wrapping_add(2 * pb);
    let mut off = 0;
    while off < pb {
        S::prefetch(ahead.wrapping_add(off));
        off += 64;
    }
}

/// `hsum_float_8` of each row's eight lanes, which live in four vectors
/// (vector s holds lanes 2s, 2s + 1): `((x0+x4) + (x2+x6)) + ((x1+x5) + (x3+x7))`.
#[inline(always)]
unsafe fn hsum_rows<S: Simd>(acc: [S::F; 4]) -> [f32; 8] {
    let s = S::fstore(S::fadd(S::fadd(acc[2], acc[0]), S::fadd(acc[3], acc[1])));
    std::array::from_fn(|r| s[2 * r] + s[2 * r + 1])
}

// The kernels below compute one group of 8 rows against `NT` tokens at
// once: every weight unit is loaded and unpacked once and used for all of
// them. Each token's arithmetic is exactly the single-token order. Token
// loops index several per-token arrays at once (`for t in 0..NT`).

/// [`dot_q0`]'s weight types, as const parameters (one straight-line kernel per type).
mod q0 {
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q5_0: u8 = 2;
}

/// Q8_0 / Q4_0 / Q5_0 (`TY`, see [`q0`]) weights · Q8_0 activations.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q0<S: Simd, const NT: usize, const TY: u8>(
    w: *const u8,
    y: [&[BlockQ8_0]; NT],
    sums: [&[[i32; 8]]; NT],
    dy: [&[f32]; NT],
) -> [[f32; 8]; NT] {
    let mut acc = [[S::fzero(); 4]; NT];
    let pb = match TY {
        q0::Q8_0 => layout::Q8_0,
        q0::Q4_0 => layout::Q4_0,
        _ => layout::Q5_0,
    };
    assert!(sums.iter().all(|r| r.len() == y[0].len()));
    assert!(dy.iter().all(|r| r.len() == y[0].len()));
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * pb);
        prefetch_ahead::<S>(blk, pb);
        let dx = S::rows_f16(blk);
        let mut d = [S::fzero(); NT];
        for t in 0..NT {
            d[t] = S::fmul(dx, S::fsplat(*yb(&dy, t, b)));
        }
        if TY == q0::Q8_0 {
            for u in 0..4 {
                let q = S::load(blk.add(16 + 64 * u));
                for t in 0..NT {
                    let i = S::dot_i8(S::izero(), q, a64(&yb(&y, t, b).qs, 8 * u));
                    acc[t][u] = S::fma(d[t], S::cvt(i), acc[t][u]);
                }
            }
            continue;
        }
        let q5 = TY == q0::Q5_0;
        let units = if q5 { blk.add(48) } else { blk.add(16) };
        for u in 0..2 {
            let raw = S::load(units.add(64 * u));
            let (mut lo, mut hi) = (S::nib_lo(raw), S::nib_hi(raw));
            if q5 {
                lo = S::set_bit4(
                    lo,
                    std::ptr::read_unaligned(blk.add(16 + 8 * u) as *const u64),
                );
                hi = S::set_bit4(
                    hi,
                    std::ptr::read_unaligned(blk.add(16 + 8 * (2 + u)) as *const u64),
                );
            }
            for (q, v) in [(lo, u), (hi, 2 + u)] {
                for t in 0..NT {
                    let c = yb(&sums, t, b);
                    let i = S::dot_u8(
                        S::splat2(c[2 * v], c[2 * v + 1]),
                        q,
                        a64(&yb(&y, t, b).qs, 8 * v),
                    );
                    acc[t][v] = S::fma(d[t], S::cvt(i), acc[t][v]);
                }
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        out[t] = hsum_rows::<S>(acc[t]);
    }
    out
}

/// Q4_1 weights · Q8_1 activations.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q4_1<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8_1]; NT],
) -> [[f32; 8]; NT] {
    let (mut acc, mut summs) = ([[S::fzero(); 4]; NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q4_1);
        prefetch_ahead::<S>(blk, layout::Q4_1);
        let (dx, mx) = (S::rows_f16(blk), S::rows_f16(blk.add(16)));
        let mut d = [S::fzero(); NT];
        for t in 0..NT {
            summs[t] = S::fma(mx, S::fsplat(yb(&y, t, b).s), summs[t]);
            d[t] = S::fmul(dx, S::fsplat(yb(&y, t, b).d));
        }
        for u in 0..2 {
            let raw = S::load(blk.add(32 + 64 * u));
            for (q, v) in [(S::nib_lo(raw), u), (S::nib_hi(raw), 2 + u)] {
                for t in 0..NT {
                    let i = S::dot_u8(S::izero(), q, a64(&yb(&y, t, b).qs, 8 * v));
                    acc[t][v] = S::fma(d[t], S::cvt(i), acc[t][v]);
                }
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        let (h, m) = (hsum_rows::<S>(acc[t]), S::fstore(summs[t]));
        for r in 0..8 {
            out[t][r] = h[r] + m[2 * r];
        }
    }
    out
}

/// Q4_K weights · Q8_K activations (llama.cpp's repacked gemv or gemm order).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q4_k<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8K]; NT],
    pair_sums: [&[[i32; 4]]; NT],
    order: Order,
) -> [[f32; 8]; NT] {
    let (mut acc, mut acc_m) = ([S::fzero(); NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    assert!(pair_sums.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q4_K);
        prefetch_ahead::<S>(blk, layout::Q4_K);
        let (dx, dmx) = (S::rows_f16(blk), S::rows_f16(blk.add(16)));
        let (mut d, mut dmin) = ([S::fzero(); NT], [S::fzero(); NT]);
        for t in 0..NT {
            let dy = S::fsplat(yb(&y, t, b).d);
            d[t] = S::fmul(dx, dy);
            dmin[t] = S::fmul(dmx, dy);
        }
        let (sc, mn, qs) = (
            blk.add(layout::Q4_K_SC),
            blk.add(layout::Q4_K_MN),
            blk.add(layout::Q4_K_QS),
        );
        let (mut isum, mut msum) = ([S::izero(); NT], [S::izero(); NT]);
        for p in 0..4 {
            let (j0, j1) = (2 * p, 2 * p + 1);
            let (s0, s1) = (
                S::pscales::<false>(sc.add(8 * j0)),
                S::pscales::<false>(sc.add(8 * j1)),
            );
            // Both sub-blocks' mins (6 bits) as the 16-bit halves of each lane.
            let m01 = S::add(
                S::rows_bytes::<false>(mn.add(8 * j0), mn.add(8 * j0)),
                S::shl(S::rows_bytes::<false>(mn.add(8 * j1), mn.add(8 * j1)), 16),
            );
            // The 4 units of this pair of sub-blocks, unpacked once for all tokens.
            let raw: [S::U; 4] = std::array::from_fn(|u| S::load(qs.add(64 * (4 * p + u))));
            let (lo, hi) = (raw.map(|r| S::nib_lo(r)), raw.map(|r| S::nib_hi(r)));
            for t in 0..NT {
                let by = yb(&y, t, b);
                // 4 pdots of nibbles (<= 15) per chain: 4·4·15·128 = 30720, in pscale's bound.
                let (mut pl, mut ph) = (S::pzero(), S::pzero());
                for u in 0..4 {
                    pl = S::pdot(pl, lo[u], a64(&by.qs, 64 * p + 8 * u));
                    ph = S::pdot(ph, hi[u], a64(&by.qs, 64 * p + 32 + 8 * u));
                }
                let pi = S::pscale_acc(S::pscale(pl, s0), ph, s1);
                let b01 = yb(&pair_sums, t, b)[p];
                let pm = S::madd16(m01, S::splat2(b01, b01));
                if order == Order::Batch {
                    acc[t] = S::fma(S::cvt(S::pair_sum(pi)), d[t], acc[t]);
                    acc_m[t] = S::fma(S::cvt(pm), dmin[t], acc_m[t]);
                } else {
                    isum[t] = S::add(isum[t], pi);
                    msum[t] = S::add(msum[t], pm);
                }
            }
        }
        if order == Order::Vec {
            for t in 0..NT {
                acc[t] = S::fma(S::cvt(S::pair_sum(isum[t])), d[t], acc[t]);
                acc_m[t] = S::fma(S::cvt(msum[t]), dmin[t], acc_m[t]);
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        let v = S::fstore(S::fsub(acc[t], acc_m[t]));
        for r in 0..8 {
            out[t][r] = v[2 * r];
        }
    }
    out
}

/// [`dot_q4_k`] in the gemm order (`Order::Batch`) for an even `NT`, two
/// tokens per float vector: lane `2r + h` of pair `i`'s accumulators is row
/// `r` of token `2i + h`, so each fused multiply-add serves 16 outputs
/// (the one-token form repeats each row's value in both of its lanes).
/// Every output's chain is the same as in [`dot_q4_k`].
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q4_k_gemm<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8K]; NT],
    pair_sums: [&[[i32; 4]]; NT],
) -> [[f32; 8]; NT] {
    assert!(NT.is_multiple_of(2));
    let pairs = NT / 2;
    // Only the first NT / 2 entries are used.
    let (mut acc, mut acc_m) = ([S::fzero(); NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    assert!(pair_sums.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q4_K);
        prefetch_ahead::<S>(blk, layout::Q4_K);
        let (dx, dmx) = (S::rows_f16(blk), S::rows_f16(blk.add(16)));
        let (mut d, mut dmin) = ([S::fzero(); NT], [S::fzero(); NT]);
        for i in 0..pairs {
            let dy = S::fsplat2(yb(&y, 2 * i, b).d, yb(&y, 2 * i + 1, b).d);
            d[i] = S::fmul(dx, dy);
            dmin[i] = S::fmul(dmx, dy);
        }
        let (sc, mn, qs) = (
            blk.add(layout::Q4_K_SC),
            blk.add(layout::Q4_K_MN),
            blk.add(layout::Q4_K_QS),
        );
        for p in 0..4 {
            let (j0, j1) = (2 * p, 2 * p + 1);
            let (s0, s1) = (
                S::pscales::<false>(sc.add(8 * j0)),
                S::pscales::<false>(sc.add(8 * j1)),
            );
            let m01 = S::add(
                S::rows_bytes::<false>(mn.add(8 * j0), mn.add(8 * j0)),
                S::shl(S::rows_bytes::<false>(mn.add(8 * j1), mn.add(8 * j1)), 16),
            );
            let raw: [S::U; 4] = std::array::from_fn(|u| S::load(qs.add(64 * (4 * p + u))));
            let (lo, hi) = (raw.map(|r| S::nib_lo(r)), raw.map(|r| S::nib_hi(r)));
            for i in 0..pairs {
                // (No closures here: they would not inherit the target features.)
                let mut pi = [S::izero(); 2];
                for h in 0..2 {
                    let by = yb(&y, 2 * i + h, b);
                    // 4 pdots of nibbles (<= 15) per chain: 4·4·15·128 = 30720, in pscale's bound.
                    let (mut pl, mut ph) = (S::pzero(), S::pzero());
                    for u in 0..4 {
                        pl = S::pdot(pl, lo[u], a64(&by.qs, 64 * p + 8 * u));
                        ph = S::pdot(ph, hi[u], a64(&by.qs, 64 * p + 32 + 8 * u));
                    }
                    pi[h] = S::pscale_acc(S::pscale(pl, s0), ph, s1);
                }
                let (b0, b1) = (yb(&pair_sums, 2 * i, b)[p], yb(&pair_sums, 2 * i + 1, b)[p]);
                let pm = S::madd16(m01, S::splat2(b0, b1));
                acc[i] = S::fma(S::cvt(S::pair_sums2(pi[0], pi[1])), d[i], acc[i]);
                acc_m[i] = S::fma(S::cvt(pm), dmin[i], acc_m[i]);
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for i in 0..pairs {
        let v = S::fstore(S::fsub(acc[i], acc_m[i]));
        for r in 0..8 {
            out[2 * i][r] = v[2 * r];
            out[2 * i + 1][r] = v[2 * r + 1];
        }
    }
    out
}

/// Q6_K weights · Q8_K activations (`vec_dot` lanes, or the tiled per-block order).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q6_k<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8K]; NT],
    order: Order,
) -> [[f32; 8]; NT] {
    let (mut lanes_acc, mut acc) = ([[S::fzero(); 4]; NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q6_K);
        prefetch_ahead::<S>(blk, layout::Q6_K);
        let (sc, ql, qh) = (
            blk.add(layout::Q6_K_SC),
            blk.add(layout::Q6_K_QL),
            blk.add(layout::Q6_K_QH),
        );
        // The multipliers of the 16 sub-blocks of 16 values.
        let sg: [S::I; 16] = std::array::from_fn(|g| S::pscales::<true>(sc.add(8 * g)));
        let mut l = [[S::izero(); 4]; NT];
        for u in 0..4 {
            for n in 0..2 {
                let h = S::load(qh.add(64 * (4 * n + u)));
                let l0 = S::load(ql.add(64 * (8 * n + u)));
                let l1 = S::load(ql.add(64 * (8 * n + 4 + u)));
                let qs = [
                    S::q6(S::nib_lo(l0), h, 0),
                    S::q6(S::nib_lo(l1), h, 2),
                    S::q6(S::nib_hi(l0), h, 4),
                    S::q6(S::nib_hi(l1), h, 6),
                ];
                for t in 0..NT {
                    let by = yb(&y, t, b);
                    for k in 0..4 {
                        // One pdot per multiplier (quants <= 63): 4·63·128, in pscale's bound.
                        let a = a64(&by.qs, 128 * n + 32 * k + 8 * u);
                        let p = S::pdot(S::pzero(), qs[k], a);
                        // Sub-block (128n + 32k + 8u) / 16.
                        l[t][u] = S::pscale_acc(l[t][u], p, sg[8 * n + 2 * k + u / 2]);
                    }
                }
            }
        }
        // Σ scale·bsum, 16-bit pairs per lane: lane (r, h) of s4[u] holds row
        // r's multipliers of groups 4u + 2h and 4u + 2h + 1, for one madd
        // against the bsums of those two groups.
        let s4: [S::I; 4] = std::array::from_fn(|u| {
            S::pack16(
                S::rows_bytes::<true>(sc.add(8 * (4 * u)), sc.add(8 * (4 * u + 2))),
                S::rows_bytes::<true>(sc.add(8 * (4 * u + 1)), sc.add(8 * (4 * u + 3))),
            )
        });
        let bsums4 = |by: &BlockQ8K, u: usize| {
            let pair = |g: usize| {
                (by.bsums[g] as u16 as u32 | (by.bsums[g + 1] as u16 as u32) << 16) as i32
            };
            S::splat2(pair(4 * u), pair(4 * u + 2))
        };
        let dx = S::rows_f16(blk);
        if order == Order::Vec {
            // Lane l (= 2u + h) subtracts 32·(bsums·scales) of groups 2l, 2l + 1.
            for t in 0..NT {
                let by = yb(&y, t, b);
                let d = S::fmul(S::fsplat(by.d), dx);
                for u in 0..4 {
                    let c = S::madd16(s4[u], bsums4(by, u));
                    let li = S::sub(l[t][u], S::shl(c, 5));
                    lanes_acc[t][u] = S::fma(d, S::cvt(li), lanes_acc[t][u]);
                }
            }
        } else {
            for t in 0..NT {
                let by = yb(&y, t, b);
                let mut c = S::madd16(s4[0], bsums4(by, 0));
                for u in 1..4 {
                    c = S::madd16_acc(c, s4[u], bsums4(by, u));
                }
                let all = S::add(S::add(l[t][0], l[t][1]), S::add(l[t][2], l[t][3]));
                let isum = S::pair_sum(S::sub(all, S::shl(c, 5)));
                let block = S::fmul(S::cvt(isum), dx);
                acc[t] = S::fma(block, S::fsplat(by.d), acc[t]);
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        if order == Order::Vec {
            out[t] = hsum_rows::<S>(lanes_acc[t]);
        } else {
            let v = S::fstore(acc[t]);
            for r in 0..8 {
                out[t][r] = v[2 * r];
            }
        }
    }
    out
}

/// Tokens per tile: a tile's activations stay in cache while every group of
/// the thread's rows passes over them.
const TOKEN_TILE: usize = 32;

/// One group against tokens `t0..t0 + NT`.
#[inline(always)]
unsafe fn group_values<S: Simd, const NT: usize>(
    pm: &PackedMatrix,
    acts: &Acts,
    _n: usize,
    g: usize,
    t0: usize,
) -> [[f32; 8]; NT] {
    let nb = pm.blocks;
    let w = pm.group(g);
    let rows = |t: usize| t * nb..(t + 1) * nb;
    match acts {
        Acts::Q8_0(y, s, dy) => {
            let y = std::array::from_fn(|i| &y[rows(t0 + i)]);
            let s = std::array::from_fn(|i| &s[rows(t0 + i)]);
            let dy = std::array::from_fn(|i| &dy[rows(t0 + i)]);
            match pm.ty {
                GgmlType::Q8_0 => dot_q0::<S, NT, { q0::Q8_0 }>(w, y, s, dy),
                GgmlType::Q4_0 => dot_q0::<S, NT, { q0::Q4_0 }>(w, y, s, dy),
                _ => dot_q0::<S, NT, { q0::Q5_0 }>(w, y, s, dy),
            }
        }
        Acts::Q8_1(y) => dot_q4_1::<S, NT>(w, std::array::from_fn(|i| &y[rows(t0 + i)])),
        Acts::Q8K(y, gemm_rows, tiled, pair_sums) => {
            let ys = std::array::from_fn(|i| &y[rows(t0 + i)]);
            if pm.ty == GgmlType::Q4_K {
                // Token blocks start at multiples of 4, so a block is all gemm or all gemv.
                let sums = std::array::from_fn(|i| &pair_sums[rows(t0 + i)]);
                match (t0 < *gemm_rows, NT.is_multiple_of(2)) {
                    (true, true) => dot_q4_k_gemm::<S, NT>(w, ys, sums),
                    (true, false) => dot_q4_k::<S, NT>(w, ys, sums, Order::Batch),
                    (false, _) => dot_q4_k::<S, NT>(w, ys, sums, Order::Vec),
                }
            } else {
                dot_q6_k::<S, NT>(w, ys, if *tiled { Order::Batch } else { Order::Vec })
            }
        }
    }
}

/// One group against tokens `t0..t0 + NT`, results written to `out`.
#[inline(always)]
unsafe fn group_tokens<S: Simd, const NT: usize>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    g: usize,
    t0: usize,
    out: *mut f32,
) {
    let v = group_values::<S, NT>(pm, acts, n, g, t0);
    for (i, row) in v.iter().enumerate() {
        std::ptr::copy_nonoverlapping(row.as_ptr(), out.add((t0 + i) * pm.rows + g * GROUP), GROUP);
    }
}

/// A gated unit's activation of 8 consecutive columns from `j` (a multiple
/// of 8): `act(j, gate, up)[r]` is the output of column `j + r`. Eight at a
/// time so the activation can run on vectors.
pub type GluAct<'a> = &'a (dyn Fn(usize, &[f32; 8], &[f32; 8]) -> [f32; 8] + Sync);

/// For a [`PackedMatrix::pack_pair`] matrix: pairs of groups `pairs` for
/// `tokens` (starting at a multiple of 4), `out[t, 8i..8i + 8] = act(8i, gate, up)` (`out` is [n, rows / 2]).
#[inline(always)]
unsafe fn run_pairs<S: Simd>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    pairs: std::ops::Range<usize>,
    act: GluAct,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    let half = pm.rows / 2;
    let emit = |i: usize, t: usize, g: &[f32; 8], u: &[f32; 8]| {
        let v = act(i * GROUP, g, u);
        std::ptr::copy_nonoverlapping(v.as_ptr(), out.add(t * half + i * GROUP), GROUP);
    };
    for t0 in tokens.clone().step_by(TOKEN_TILE) {
        let t1 = (t0 + TOKEN_TILE).min(tokens.end);
        for i in pairs.clone() {
            let mut t = t0;
            while t + 4 <= t1 {
                let (g, u) = (
                    group_values::<S, 4>(pm, acts, n, 2 * i, t),
                    group_values::<S, 4>(pm, acts, n, 2 * i + 1, t),
                );
                for k in 0..4 {
                    emit(i, t + k, &g[k], &u[k]);
                }
                t += 4;
            }
            while t < t1 {
                let (g, u) = (
                    group_values::<S, 1>(pm, acts, n, 2 * i, t),
                    group_values::<S, 1>(pm, acts, n, 2 * i + 1, t),
                );
                emit(i, t, &g[0], &u[0]);
                t += 1;
            }
        }
    }
}

/// Computes output rows `groups` (in units of 8) for `tokens` (starting at a
/// multiple of 4).
#[inline(always)]
unsafe fn run_groups<S: Simd>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    groups: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    for t0 in tokens.clone().step_by(TOKEN_TILE) {
        let t1 = (t0 + TOKEN_TILE).min(tokens.end);
        for g in groups.clone() {
            let mut t = t0;
            while t + 4 <= t1 {
                group_tokens::<S, 4>(pm, acts, n, g, t, out);
                t += 4;
            }
            while t < t1 {
                group_tokens::<S, 1>(pm, acts, n, g, t, out);
                t += 1;
            }
        }
    }
}

/// What one pool thread computes: output row groups, or pairs of groups of a
/// gate/up pair matrix through the gated activation.
enum Work<'a> {
    Groups(std::ops::Range<usize>),
    Pairs(std::ops::Range<usize>, GluAct<'a>),
}

#[inline(always)]
unsafe fn run_work<S: Simd>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    work: &Work,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    match work {
        Work::Groups(groups) => run_groups::<S>(pm, acts, n, groups.clone(), tokens, out),
        Work::Pairs(pairs, act) => run_pairs::<S>(pm, acts, n, pairs.clone(), *act, tokens, out),
    }
}

// One entry point per instruction set, so the generic kernels are compiled
// with that set enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn run_avx512(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    work: &Work,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    run_work::<super::simd::x86::Avx512>(pm, acts, n, work, tokens, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    work: &Work,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    run_work::<super::simd::x86::Avx2>(pm, acts, n, work, tokens, out)
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn run_neon(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    work: &Work,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    run_work::<super::simd::neon::Neon>(pm, acts, n, work, tokens, out)
}

/// Runs `work` for `tokens` on `isa` (AMX: its AVX-512 part).
unsafe fn run_isa(
    isa: Isa,
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    work: &Work,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    assert!(
        isa.supported(),
        "{} is not supported on this machine",
        isa.name()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => run_avx512(pm, acts, n, work, tokens, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => run_avx2(pm, acts, n, work, tokens, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => run_neon(pm, acts, n, work, tokens, out),
        _ => run_work::<Scalar>(pm, acts, n, work, tokens, out),
    }
}

/// Leading tokens of a call that AMX tiles compute: Q4_K's batched-order
/// tokens in whole 16-token tiles (the rest run on the vector kernels).
fn amx_tokens(isa: Isa, pm: &PackedMatrix, acts: &Acts) -> usize {
    match acts {
        Acts::Q8K(_, gemm_rows, _, _)
            if isa == Isa::Amx && pm.ty == GgmlType::Q4_K && pm.groups >= 2 =>
        {
            gemm_rows / amx_tile::TOKENS * amx_tile::TOKENS
        }
        _ => 0,
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use super::amx as amx_tile;

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod amx_tile {
    pub const TOKENS: usize = 16;
}

/// Super groups `sgs` (packed groups `2s`, `2s + 1`: 16 columns) of a Q4_K
/// matrix for tokens `0..n_amx` (a multiple of 16) on AMX tiles; `emit(s, t,
/// values)` receives each token's 16 columns.
///
/// # Safety
/// `isa == Isa::Amx` was checked supported; `n_amx` from [`amx_tokens`].
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn run_amx(
    pm: &PackedMatrix,
    acts: &Acts,
    n_amx: usize,
    sgs: std::ops::Range<usize>,
    mut emit: impl FnMut(usize, usize, &[f32; 16]),
) {
    let Acts::Q8K(y, _, _, _) = acts else {
        unreachable!("amx_tokens admits Q4_K only")
    };
    let nb = pm.blocks;
    let mut scr = vec![amx_tile::Line([0; 64]); nb * amx_tile::SCR_BLOCK / 64];
    let scr = scr.as_mut_ptr() as *mut u8;
    amx_tile::configure();
    for sg in sgs {
        amx_tile::unpack_q4_k(
            pm.group(2 * sg),
            pm.group(2 * sg + 1),
            layout::Q4_K,
            nb,
            [layout::Q4_K_SC, layout::Q4_K_MN, layout::Q4_K_QS],
            scr,
        );
        let mut o = [[0.0f32; 16]; 16];
        for t0 in (0..n_amx).step_by(amx_tile::TOKENS) {
            amx_tile::tile_q4_k(scr, nb, y.as_ptr().add(t0 * nb), nb, &mut o);
            for (t, v) in o.iter().enumerate() {
                emit(sg, t0 + t, v);
            }
        }
    }
    amx_tile::release();
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn run_amx(
    _: &PackedMatrix,
    _: &Acts,
    _: usize,
    _: std::ops::Range<usize>,
    _: impl FnMut(usize, usize, &[f32; 16]),
) {
    unreachable!("AMX is never granted here")
}

/// A gated MLP's first half in one pass: `pm` is gate and up packed by
/// [`PackedMatrix::pack_pair`]; `out[t, j] = act(j, gate[t, j], up[t, j])`
/// ([n, rows / 2]). The products are the same as two [`matmul_packed`] calls.
pub fn matmul_packed_glu(
    isa: Isa,
    pm: &PackedMatrix,
    x: &[f32],
    n: usize,
    act: GluAct,
    out: &mut [f32],
    order: RowOrder,
) {
    assert_eq!(x.len(), n * pm.cols, "matmul: x is not [n, cols]");
    assert_eq!(
        out.len(),
        n * pm.rows / 2,
        "matmul: out is not [n, rows / 2]"
    );
    let acts = quantize_acts(pm.ty, x, n, pm.cols, order);
    let n_amx = amx_tokens(isa, pm, &acts);
    let outp = SendPtr(out.as_mut_ptr());
    let half = pm.rows / 2;
    pool::global().run(|i, nt| {
        let pairs = pool::share(pm.groups / 2, i, nt);
        let o = outp.get();
        if n_amx > 0 {
            // A pair's two groups are one super group: 8 gate, then 8 up columns.
            // SAFETY: Amx was checked by amx_tokens; each thread writes only its pairs' columns.
            unsafe {
                run_amx(pm, &acts, n_amx, pairs.clone(), |p, t, v| {
                    let (g, u) = v.split_at(GROUP);
                    let a = act(p * GROUP, g.try_into().unwrap(), u.try_into().unwrap());
                    std::ptr::copy_nonoverlapping(a.as_ptr(), o.add(t * half + p * GROUP), GROUP);
                })
            };
        }
        // SAFETY: the isa is checked in run_isa; each thread writes only its pairs' columns.
        unsafe { run_isa(isa, pm, &acts, n, &Work::Pairs(pairs, act), n_amx..n, o) };
    });
}

/// `out[t, r] = Σ_c x[t, c] · W[r, c]` for `n` rows of `x`, with `pm` the
/// packed form of `m`, on instruction set `isa`, on the global pool, rows
/// in `order`.
pub fn matmul_packed(
    isa: Isa,
    pm: &PackedMatrix,
    m: &QMatrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    order: RowOrder,
) {
    assert_eq!(
        (pm.rows, pm.cols, pm.ty),
        (m.rows, m.cols, m.ty),
        "packed matrix does not match"
    );
    assert_eq!(x.len(), n * m.cols, "matmul: x is not [n, cols]");
    assert_eq!(out.len(), n * m.rows, "matmul: out is not [n, rows]");
    let acts = quantize_acts(m.ty, x, n, m.cols, order);
    let n_amx = amx_tokens(isa, pm, &acts);
    let outp = SendPtr(out.as_mut_ptr());
    let pool = pool::global();
    pool.run(|i, nt| {
        let o = outp.get();
        if n_amx == 0 {
            let groups = pool::share(pm.groups, i, nt);
            // SAFETY: the isa is checked in run_isa; each thread writes only its
            // groups' 8 columns of every output row.
            unsafe { run_isa(isa, pm, &acts, n, &Work::Groups(groups), 0..n, o) };
            return;
        }
        // Whole super groups (16 columns) per thread; an odd last group runs
        // on the vector kernels in the last thread.
        let sgs = pool::share(pm.groups / 2, i, nt);
        let rows = pm.rows;
        // SAFETY: Amx was checked by amx_tokens; each thread writes only its
        // super groups' 16 columns of every output row.
        unsafe {
            run_amx(pm, &acts, n_amx, sgs.clone(), |sg, t, v| {
                std::ptr::copy_nonoverlapping(v.as_ptr(), o.add(t * rows + sg * 2 * GROUP), 16);
            })
        };
        let groups = 2 * sgs.start..2 * sgs.end;
        // SAFETY: as above, for the tokens past the AMX tiles.
        unsafe { run_isa(isa, pm, &acts, n, &Work::Groups(groups), n_amx..n, o) };
        if i + 1 == nt && pm.groups % 2 == 1 {
            let last = pm.groups - 1..pm.groups;
            // SAFETY: the odd last group's columns belong to this thread alone.
            unsafe { run_isa(isa, pm, &acts, n, &Work::Groups(last), 0..n, o) };
        }
    });
    let tail = pm.groups * GROUP..m.rows;
    if !tail.is_empty() {
        let tail_out = matmul_rows(m, x, n, tail.clone(), order);
        for t in 0..n {
            out[t * m.rows + tail.start..(t + 1) * m.rows]
                .copy_from_slice(&tail_out[t * tail.len()..(t + 1) * tail.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::matmul::{matmul, Activations};
    use crate::quant::quantize;
    use rand::{Rng, SeedableRng};

    /// Quants at their extremes (every byte 0xFF, 0x80 or 0x7F, with small
    /// finite scales) against activations that quantize to -128 or 127: the
    /// narrow partial sums (16-bit on AVX2) must not saturate.
    #[test]
    fn extreme_quants_match_the_reference() {
        use GgmlType::*;
        // Byte offsets of each type's f16 fields.
        let halves: [(GgmlType, &[usize]); 6] = [
            (Q8_0, &[0]),
            (Q4_0, &[0]),
            (Q5_0, &[0]),
            (Q4_1, &[0, 2]),
            (Q4_K, &[0, 2]),
            (Q6_K, &[208]),
        ];
        for (ty, fields) in halves {
            for fill in [0xffu8, 0x80, 0x7f] {
                let (rows, cols) = (16, 2 * ty.block_size());
                let mut wq = vec![fill; rows * cols / ty.block_size() * ty.type_size()];
                for blk in wq.chunks_exact_mut(ty.type_size()) {
                    for &o in fields {
                        blk[o..o + 2]
                            .copy_from_slice(&half::f16::from_f32(0.0078125).to_le_bytes());
                    }
                }
                let m = QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &wq,
                };
                let pm = PackedMatrix::pack(&m).unwrap();
                for (n, x) in [(4, -1.0f32), (8, 1.0), (5, -1.0), (16, -1.0), (37, 1.0)] {
                    let x = vec![x; n * cols];
                    assert_packed_bits(&m, &pm, &x, n, &format!("{ty} fill {fill:#x} n {n}"));
                }
            }
        }
    }

    /// Every available ISA's packed product of `n` rows of `x` equals the
    /// reference `matmul` (llama.cpp's x86 order) bit for bit.
    fn assert_packed_bits(m: &QMatrix, pm: &PackedMatrix, x: &[f32], n: usize, what: &str) {
        let mut want = vec![0.0; n * m.rows];
        matmul(
            m,
            x,
            n,
            &mut want,
            Activations::Quantized,
            RowOrder::Batched,
        );
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; n * m.rows];
            matmul_packed(isa, pm, m, x, n, &mut got, RowOrder::Batched);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{what} {} [{i}]: {g} vs {w}",
                    isa.name()
                );
            }
        }
    }

    fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
        let wf: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-1.0f32..1.0) * rng.gen_range(0.0f32..2.0))
            .collect();
        let mut wq = vec![0u8; rows * cols / ty.block_size() * ty.type_size()];
        if quantize(ty, &wf, &mut wq).is_err() {
            // No quantizer for this type here: random quants with small f16 scales.
            for blk in wq.chunks_exact_mut(ty.type_size()) {
                blk.iter_mut().for_each(|v| *v = rng.gen());
                let scale = half::f16::from_f32(rng.gen_range(0.001f32..0.02)).to_le_bytes();
                blk[..2].copy_from_slice(&scale);
                if ty == GgmlType::Q4_1 {
                    let m = half::f16::from_f32(rng.gen_range(-0.1f32..0.1)).to_le_bytes();
                    blk[2..4].copy_from_slice(&m);
                }
            }
        }
        wq
    }

    /// In the invariant order every row of a multi-row matmul equals the
    /// one-row matmul of that row, bit for bit (speculative verify passes),
    /// while the default batched orders do differ somewhere.
    #[test]
    fn batch_invariant_rows_equal_single_rows() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        let mut differed = false;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0] {
            let (rows, cols) = (16, 4 * 256);
            let wq = random_matrix(ty, rows, cols, &mut rng);
            let m = QMatrix {
                ty,
                rows,
                cols,
                data: &wq,
            };
            let pm = PackedMatrix::pack(&m).unwrap();
            for n in [4, 5, 9] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                let mut single = vec![0.0f32; n * rows];
                for t in 0..n {
                    matmul_packed(
                        Isa::detect(),
                        &pm,
                        &m,
                        &x[t * cols..(t + 1) * cols],
                        1,
                        &mut single[t * rows..(t + 1) * rows],
                        RowOrder::Batched,
                    );
                }
                let (mut inv, mut batched) = (vec![0.0f32; n * rows], vec![0.0f32; n * rows]);
                let isa = Isa::detect();
                matmul_packed(isa, &pm, &m, &x, n, &mut inv, RowOrder::Invariant);
                matmul_packed(isa, &pm, &m, &x, n, &mut batched, RowOrder::Batched);
                for (i, (a, b)) in inv.iter().zip(&single).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{ty} n {n} [{i}]");
                }
                differed |= batched
                    .iter()
                    .zip(&single)
                    .any(|(a, b)| a.to_bits() != b.to_bits());
            }
        }
        assert!(
            differed,
            "the batched orders should differ from one-row products somewhere"
        );
    }

    /// The fused gate/up pass gives exactly the two separate products, combined.
    #[test]
    fn glu_pair_matches_separate_matmuls() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for ty in [GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q4_1] {
            let (rows, cols) = (24, 2 * ty.block_size().max(256));
            let (wa, wb) = (
                random_matrix(ty, rows, cols, &mut rng),
                random_matrix(ty, rows, cols, &mut rng),
            );
            let (a, b) = (
                QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &wa,
                },
                QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &wb,
                },
            );
            let pair = PackedMatrix::pack_pair(&a, &b).unwrap();
            let (pa, pb) = (
                PackedMatrix::pack(&a).unwrap(),
                PackedMatrix::pack(&b).unwrap(),
            );
            let act1 = |j: usize, g: f32, u: f32| g * (j as f32 + 0.5) - u;
            let act = |j: usize, g: &[f32; 8], u: &[f32; 8]| {
                std::array::from_fn(|r| act1(j + r, g[r], u[r]))
            };
            for n in [1, 5, 9, 16, 35] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                for isa in Isa::available() {
                    let (mut ga, mut gb, mut fused) = (
                        vec![0.0f32; n * rows],
                        vec![0.0f32; n * rows],
                        vec![0.0f32; n * rows],
                    );
                    matmul_packed(isa, &pa, &a, &x, n, &mut ga, RowOrder::Batched);
                    matmul_packed(isa, &pb, &b, &x, n, &mut gb, RowOrder::Batched);
                    matmul_packed_glu(isa, &pair, &x, n, &act, &mut fused, RowOrder::Batched);
                    for i in 0..n * rows {
                        let want = act1(i % rows, ga[i], gb[i]);
                        assert_eq!(
                            fused[i].to_bits(),
                            want.to_bits(),
                            "{ty} {} n {n} [{i}]",
                            isa.name()
                        );
                    }
                }
            }
        }
    }

    /// Every packed kernel on every instruction set this machine has gives
    /// bit-identical results to the per-row reference kernels, for row
    /// counts with and without a tail, and token counts that hit every
    /// order (gemv, gemm with a gemv remainder, tiled).
    #[test]
    fn packed_matches_reference_bit_for_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
        let types = [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4_1,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            for (rows, blocks) in [(8, 1), (16, 3), (21, 2), (40, 5)] {
                let cols = blocks * ty.block_size();
                let wq = random_matrix(ty, rows, cols, &mut rng);
                let m = QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &wq,
                };
                let Some(pm) = PackedMatrix::pack(&m) else {
                    assert!(
                        ty == GgmlType::Q4_K && rows % 8 != 0,
                        "{ty} {rows} should pack"
                    );
                    continue;
                };
                for n in [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 21, 37] {
                    let x: Vec<f32> = (0..n * cols)
                        .map(|i| {
                            if i % 97 == 5 {
                                0.0
                            } else {
                                rng.gen_range(-3.0f32..3.0)
                            }
                        })
                        .collect();
                    let what = format!("{ty} rows {rows} blocks {blocks} n {n}");
                    assert_packed_bits(&m, &pm, &x, n, &what);
                }
            }
        }
    }
}
