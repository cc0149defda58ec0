//! Shared by the engine's tests that load a packaged model.

use std::path::PathBuf;

/// A model file fetched by scripts/fetch_models.py (`$HEARTH_HOME/models`,
/// default `~/.cache/hearth/models`); fails with the command to fetch it.
pub fn model_path(file: &str) -> PathBuf {
    let dir = match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("models"),
        _ => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hearth/models"),
    };
    let p = dir.join(file);
    assert!(
        p.is_file(),
        "{} missing: run `python3 scripts/fetch_models.py all`",
        p.display()
    );
    p
}
