//! The CUDA backend's errors, grouped by where they arise.

use hearth_gguf::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver library, no device, or the driver refused to start.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("NVRTC could not compile hearth's kernels for {arch}:\n{log}")]
    Compile { arch: String, log: String },
    #[error("CUDA call {call} failed: {msg}")]
    Driver { call: &'static str, msg: String },
    #[error("tensor '{name}' has type {ty}, which the CUDA backend cannot compute with")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("the CUDA backend does not support {0}")]
    Unsupported(String),
    #[error("out of GPU memory: {what} needs {need} bytes, {free} free")]
    OutOfMemory {
        what: String,
        need: usize,
        free: usize,
    },
    #[error(transparent)]
    Model(#[from] hearth_models::ModelError),
    #[error("kernel cache {path}: {err}")]
    Cache { path: String, err: std::io::Error },
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver {
            call: "driver",
            msg: format!("{e:?}"),
        }
    }
}

pub type Result<T> = std::result::Result<T, CudaError>;

/// Adds the name of the failing call to a driver error.
pub(crate) trait Context<T> {
    fn ctx(self, call: &'static str) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, call: &'static str) -> Result<T> {
        self.map_err(|e| CudaError::Driver {
            call,
            msg: format!("{e:?}"),
        })
    }
}
