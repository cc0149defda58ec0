//! CPU kernels: reference dot products of quantized weights with quantized
//! activations (`vec_dot`), and the multi-threaded matmul built on them.

pub mod matmul;
pub mod packed;
pub mod repack;
pub mod simd;
pub mod tiled;
pub mod vec_dot;
