//! hearth's CUDA backend. The driver and NVRTC are loaded at run time
//! (`cudarc` with dynamic loading), so this crate builds, and its host-side
//! tests run, on machines without CUDA; there `Gpu::open` returns
//! `CudaError::Unavailable`.
//!
//! - `libs`: finding the driver and NVRTC libraries at run time.
//! - `kernel_names`: the kernels the host launches (and which use PDL).
//! - `compile`: NVRTC compilation of `kernels/*.cu` for the device's arch, cached on disk.
//! - `driver`: context, stream, device buffers, launches, graphs, events.
//! - `repack`: the weights' GPU layout.
//! - `model`: weights resident on the GPU (`GpuModel::upload`); `layer_weights`: one layer's.
//! - `forward`: KV caches and the forward pass (`GpuModel::forward`), decode graphs.
//! - `ops`, `gemm`: typed kernel launches.
//! - `persistent`: a decode step as one persistent kernel (small models).
//! - `backend`: `GpuModel` as the engine's `Backend` (sessions, server, speculation).
//! - `dflash`: the DFlash drafter on the GPU, next to its target.
//! - `vision`: the Muse Glimmer vision tower (`hearth_vision::Tower`).

mod backend;
pub mod compile;
pub mod dflash;
pub mod driver;
pub mod error;
pub mod forward;
pub mod gemm;
pub mod kbench;
pub mod kernel_names;
pub mod layer_weights;
mod libs;
pub mod model;
pub mod ops;
pub mod persistent;
pub mod repack;
pub mod saved;
pub mod tune;
pub mod vision;

pub use driver::{DeviceInfo, Gpu};
pub use error::{CudaError, Result};
pub use forward::{GpuState, GPU_CHUNK};
pub use model::GpuModel;
pub use vision::GpuTower;
