//! Shared by the engine's tests that load a packaged model.

pub use hearth_models::packaged::model_path;
