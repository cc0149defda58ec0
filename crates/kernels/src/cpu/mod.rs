//! CPU kernels.
//!
//! - [`interleaved`]: hearth's own weight layout (8 rows interleaved, repacked
//!   at load) and its SIMD matmuls, bit-identical to the references.
//! - [`ggml_order`]: reference kernels reproducing llama.cpp's x86 orders.
//! - [`gemm`]: a tiled f32 GEMM over f32 or dequantized weights (vision
//!   towers and other many-row products with f32 activations).
//! - [`matmul`]: the per-row reference matmul over GGUF blocks as stored
//!   (types without interleaved kernels, and the tests' reference).
//! - [`attention`] over the hybrid [`kv_cache`] (flat and ring caches).
//! - [`simd`]: the vector interface and the one runtime ISA dispatch point.
//! - [`amx`]: Intel AMX-INT8 tiles for the batched Q4_K products.
//! - [`bandwidth`]: the memory read bandwidth (the decode roofline).

pub mod amx;
pub mod attention;
pub mod bandwidth;
pub mod gemm;
pub mod ggml_order;
pub mod interleaved;
pub mod kv_cache;
pub mod matmul;
pub mod simd;

/// How the rows of a multi-row call (several tokens) are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowOrder {
    /// llama.cpp's batched orders (prompt prefill): a row of a batch may
    /// round differently from the same row computed alone.
    #[default]
    Batched,
    /// Every row exactly as a one-row call computes it (Q4_K gemv order,
    /// Q6_K `vec_dot` order, per-row decode attention): a speculative verify
    /// pass over K+1 tokens then equals K+1 decode steps bit for bit.
    Invariant,
}
