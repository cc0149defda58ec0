//! Model architectures supported by hearth: the config each implies from GGUF
//! metadata, and (per architecture) its forward pass.

pub mod config;

pub use config::{Architecture, ConfigError, LayerKind, ModelConfig, RopeLayout};
