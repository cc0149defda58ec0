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
//!
//! Parts: [`pack`] (the packed layout, built at load), [`acts`] (activations
//! quantized per matmul), [`kernels`] (one group of 8 rows against a block of
//! tokens, generic over the ISA); this file holds the types and the
//! per-ISA entry points.

use hearth_gguf::GgmlType;

use super::ggml_order::q8_k_x86::quantize_row_q8_k_x86;
use super::ggml_order::repack_q4_k::quantize_row_q8_k_mat_x86;
use super::ggml_order::vec_dot::{quantize_row_q8_0_x86, quantize_row_q8_1_ref, BlockQ8_1};
use super::matmul::{matmul_rows, QMatrix};
use super::simd::{scalar::Scalar, Isa, Simd};
use super::RowOrder;
use crate::pool::{self, SendPtr};
use crate::quant::blocks::*;

mod acts;
mod kernels;
mod pack;
#[cfg(test)]
mod tests;

use acts::quantize_acts;
pub use kernels::GluAct;
use kernels::{run_work, Work};

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
