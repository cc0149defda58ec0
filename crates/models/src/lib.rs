//! Model architectures supported by hearth: the config each implies from GGUF
//! metadata, immutable weights, per-session state with the hybrid KV cache,
//! and one forward function per architecture built from shared blocks.

pub mod backend;
pub mod blocks;
pub mod config;
pub mod dflash;
mod flash_attn_ggml;
mod forward;
mod gemma3;
pub mod kv_cache;
mod llama;
pub mod muse_glimmer;
mod state;
pub mod synth;
pub mod synth_dflash;
mod weights;

pub use backend::{Backend, BackendState};
pub use config::{Architecture, ConfigError, LayerKind, ModelConfig, RopeLayout};
pub use forward::{Logits, MAX_CHUNK};
pub use kv_cache::{CacheLayout, KvData, KvDtype, LayerKvCache};
pub use state::State;
pub use weights::{Layer, Linear, Model, ModelError, Numerics};
