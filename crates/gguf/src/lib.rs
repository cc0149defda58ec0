//! GGUF v3: the container format of llama.cpp models.
//!
//! [`GgufFile`] maps a file and parses its header into [`Metadata`] and a tensor
//! index; tensor bytes are borrowed from the mapping ([`TensorView`]), never
//! copied. [`GgufWriter`] streams a GGUF to disk (synthetic models and fixtures);
//! [`split::join`] joins a split GGUF's parts into one file.

mod error;
mod reader;
pub mod split;
mod types;
mod value;
mod writer;

pub use error::{GgufError, Problem};
pub use reader::{GgufFile, TensorInfo, TensorView, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
pub use types::GgmlType;
pub use value::{Metadata, Value, ValueType};
pub use writer::{GgufWriter, TensorSink};
