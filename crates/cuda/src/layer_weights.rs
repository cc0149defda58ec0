//! The device addresses of one decoder layer's weights, as the model upload
//! ([`crate::model`]) lays them out and the tuner ([`crate::tune`]) and the
//! forward pass read them.

use hearth_models::LayerKind;

use crate::ops::GpuMatrix;

/// Device addresses of one decoder layer's weights (0 = absent).
pub struct GpuLayer {
    pub kind: LayerKind,
    pub attn_norm: u64,
    pub wq: GpuMatrix,
    pub wk: GpuMatrix,
    pub wv: GpuMatrix,
    pub wo: GpuMatrix,
    pub bq: u64,
    pub bk: u64,
    pub bv: u64,
    /// Per-head QK-norm gains [head_dim] (0 = none).
    pub q_norm: u64,
    pub k_norm: u64,
    pub attn_gate: Option<GpuMatrix>,
    pub post_attn_norm: u64,
    pub ffn_norm: u64,
    pub ffn_gate: GpuMatrix,
    pub ffn_up: GpuMatrix,
    pub ffn_down: GpuMatrix,
    pub post_ffn_norm: u64,
    /// The attention's input projections of one type stored back to back
    /// (q|k|gate, v too when it shares the type): one GEMV launch for all.
    pub attn_in: Fused,
    /// ffn_gate|ffn_up, when they share a type.
    pub ffn_in: Fused,
}

/// Which projection a row range of a fused matrix is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proj {
    Q,
    K,
    V,
    Gate,
    FfnGate,
    FfnUp,
}

/// Matrices of one type and width stored back to back, viewed as one matrix
/// whose rows are the members' rows in `parts` order. With fewer than two
/// parts there is nothing to fuse.
#[derive(Clone, Debug)]
pub struct Fused {
    pub m: GpuMatrix,
    pub parts: Vec<Proj>,
}
