//! hearth's compute kernels.
//!
//! [`quant`]: the GGML quantization formats (block layouts, scalar reference
//! dequantization and quantization).

// `usize::is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
#![allow(clippy::manual_is_multiple_of)]

pub mod cpu;
pub mod pool;
pub mod quant;

pub use quant::{dequantize, dequantize_row, quantize, row_size, QuantError};

pub use cpu::matmul::{matmul, Activations, QMatrix};
pub use cpu::RowOrder;
