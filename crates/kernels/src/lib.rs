//! hearth's compute kernels.
//!
//! [`quant`]: the GGML quantization formats (block layouts, scalar reference
//! dequantization and quantization).

pub mod cpu;
pub mod pool;
pub mod quant;

pub use quant::{dequantize, dequantize_row, quantize, quantize_to_vec, row_size, QuantError};

pub use cpu::matmul::{matmul, Activations, QMatrix};
pub use cpu::RowOrder;
