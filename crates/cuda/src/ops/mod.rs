//! Typed launches of the kernels in `crates/cuda/kernels`: one function per
//! kernel family, taking device addresses and shapes, checking the shapes the
//! kernels rely on.
//!
//! By family: [`gemv`] (activation quantization and the warp, multi-token
//! and tensor-core GEMVs), [`gemv_x`] (the register-activation GEMVs and the
//! tuner's variants), [`layer_ops`] (norms, head preparation, the gated
//! activation, logits), [`attention`]. This file holds the kernel names, the
//! flags shared with the kernels and the types every family takes.

use crate::driver::{Arg, Gpu};
use crate::error::{CudaError, Result};
use crate::repack::WeightKind;

mod attention;
mod gemv;
mod gemv_x;
mod layer_ops;

pub use attention::*;
pub use gemv::*;
pub use gemv_x::*;
pub use layer_ops::*;

pub use crate::kernel_names::{uses_pdl, KERNEL_NAMES};

// Flags shared with the kernels (kernels/common.cuh, gemv*.cu, layer_ops.cu).
pub const OUT_BF16: i32 = 1;
pub const OUT_ADD: i32 = 2;
pub const NORM_BF16_GAIN: i32 = 8;
pub const HEAD_QK_RMS: i32 = 1;
pub const HEAD_ROPE: i32 = 2;
pub const HEAD_NEOX: i32 = 4;
pub const HEAD_BF16: i32 = 8;
pub const HEAD_ROT_K: i32 = 32;
pub const HEAD_ROT_V: i32 = 64;
pub const HEAD_KV_Q8: i32 = 128;
pub const HEAD_KV_Q4: i32 = 256;
pub const OUT_ROT64: i32 = 4;
pub const HEAD_KV_BF16: i32 = 16;
pub const GLU_SWIGLU: i32 = 0;
pub const GLU_GATE: i32 = 1;
pub const GLU_GELU: i32 = 2;

/// A weight matrix [rows, cols] resident on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct GpuMatrix {
    pub kind: WeightKind,
    pub rows: usize,
    pub cols: usize,
    /// Block bodies (or whole blocks).
    pub body: u64,
    /// f16 scales of split kinds, else 0.
    pub scales: u64,
    /// Single-token GEMV variant (chosen by `tune::tune_gemv` on the device).
    pub tune: GemvTune,
    /// Per-tensor scale of the product (`*.scale`), applied before the bias.
    pub scale: Option<f32>,
}

/// A variant of the single-token GEMV: `u` items' loads issued together per
/// lane (1, 2 or 4), and the grid: one warp per row (`blocks` = 0) or at most
/// `blocks` blocks of 8 warps that each stream several rows. With `x`, the
/// register-activation kernels (`gemv_<t>_x*` in gemv_x.cu): `r` rows per tile,
/// one thread per item of a row, `blocks` = 0 one block per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvTune {
    pub u: u8,
    pub blocks: u32,
    /// Rows per warp (1, or 2 / 4: activations loaded once for all of them; then `u` is 1).
    pub r: u8,
    pub x: bool,
}

impl Default for GemvTune {
    fn default() -> Self {
        GemvTune {
            u: 1,
            blocks: 0,
            r: 1,
            x: false,
        }
    }
}

/// 8-bit activations: `q` [T, K] int8, `d` and `s` [T, K/32] f32.
#[derive(Clone, Copy, Debug)]
pub struct Q8 {
    pub q: u64,
    pub d: u64,
    pub s: u64,
}

impl Q8 {
    /// The view starting at token `t` of rows of width `k`.
    pub fn offset(self, t: usize, k: usize) -> Q8 {
        Q8 {
            q: self.q + (t * k) as u64,
            d: self.d + (t * k / 32 * 4) as u64,
            s: self.s + (t * k / 32 * 4) as u64,
        }
    }
}

/// The arguments every GEMV kernel starts with: the weights, their shape and
/// the 8-bit activations (gemv*.cu's `w, wd, rows, K, xq, xd, xs`).
fn gemv_head_args(w: &GpuMatrix, x: Q8) -> Vec<Arg> {
    vec![
        Arg::Ptr(w.body),
        Arg::Ptr(w.scales),
        Arg::I32(w.rows as i32),
        Arg::I32(w.cols as i32),
        Arg::Ptr(x.q),
        Arg::Ptr(x.d),
        Arg::Ptr(x.s),
    ]
}

/// [`gemv_head_args`] then one dense output (`y, y_stride, bias, flags`).
fn gemv_args(w: &GpuMatrix, x: Q8, y: u64, y_stride: usize, bias: u64, flags: i32) -> Vec<Arg> {
    let mut a = gemv_head_args(w, x);
    a.extend([
        Arg::Ptr(y),
        Arg::I32(y_stride as i32),
        Arg::Ptr(bias),
        Arg::I32(flags),
    ]);
    a
}

fn grid1(n: usize, per_block: usize) -> (u32, u32, u32) {
    (n.div_ceil(per_block) as u32, 1, 1)
}
