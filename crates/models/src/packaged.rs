//! Where the packaged models live on this machine (tests and tools load them
//! by file name): `$HEARTH_HOME/models`, default `~/.cache/hearth/models`,
//! filled by `scripts/fetch_models.py` or `hearth pull`.

use std::path::PathBuf;

/// The path of packaged model file `file`; panics with the command that
/// fetches it when it is missing (for tests, where that is the clearest
/// failure).
pub fn model_path(file: &str) -> PathBuf {
    let dir = match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("models"),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/hearth/models"),
    };
    let p = dir.join(file);
    assert!(
        p.is_file(),
        "{} missing: run `python3 scripts/fetch_models.py all`",
        p.display()
    );
    p
}
