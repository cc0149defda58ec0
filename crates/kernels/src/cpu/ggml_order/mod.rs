//! Reference kernels that reproduce llama.cpp's x86 CPU arithmetic step by
//! step (summation orders, activation quantizers, rounding points), kept
//! plain: they are what the fast kernels in [`super::interleaved`] are tested
//! against bit for bit, and what makes hearth's logits equal llama.cpp's.
//!
//! - [`vec_dot`]: per-row dot products of quantized weights with 8-bit
//!   activations (`ggml_vec_dot_*`), and the x86 activation quantizers.
//! - [`repack_q4_k`]: the orders of llama.cpp's load-time repacked Q4_K
//!   matmul (`q4_K_8x8` gemm/gemv).
//! - [`tiled`]: the orders of llama.cpp's tiled K-quant matmul (8+ rows).
//! - [`flash_attn`]: llama.cpp's CPU flash-attention paths over an f16 cache
//!   (`flash_tile_avx512`: its tiled path's tile on AVX-512 registers).
//! - [`half_dot`]: F16/BF16 dot products (`ggml_vec_dot_{f16,bf16}` and
//!   llamafile's tinyBLAS) in the AVX-512 orders.
//! - [`activations`]: ggml's vector exp (SwiGLU) and f16 GELU table.

pub mod activations;
pub mod flash_attn;
#[cfg(target_arch = "x86_64")]
mod flash_tile_avx512;
pub mod half_dot;
pub mod q8_k_x86;
pub mod repack_q4_k;
pub mod tiled;
pub mod vec_dot;
