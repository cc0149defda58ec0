//! Model architectures supported by hearth: the config each implies from GGUF
//! metadata, one description of what each architecture computes (`arch`),
//! immutable weights, per-session state with the hybrid KV cache, and the CPU
//! forward pass (one decoder layer that walks the description).

pub mod arch;
pub mod backend;
pub mod blocks;
pub mod config;
pub mod dflash;
mod forward;
mod layer;
pub mod packaged;
mod state;
pub mod synth;
pub mod synth_dflash;
mod weights;

pub use arch::{ArchSpec, FfnAct, LayerSpec, LogitSpec, QkNorm, RopeSpec};
pub use backend::{Backend, BackendState};
pub use config::{Architecture, ConfigError, LayerKind, ModelConfig, RopeLayout};
pub use forward::{BatchItem, Input, Logits, MAX_CHUNK};
pub use hearth_kernels::cpu::ggml_order::activations::RefIsa;
pub use hearth_kernels::cpu::kv_cache::{
    self, CacheLayout, KvData, KvDtype, KvTypes, LayerKvCache,
};
pub use state::{Checkpoint, State};
pub use weights::{Layer, Linear, Model, ModelError, Numerics};
