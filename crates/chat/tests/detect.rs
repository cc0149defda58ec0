//! `auto` format detection on the packaged models' real GGUFs (architecture,
//! template and vocabulary as shipped). Fails (not skips) when a model file is
//! missing, like the tokenizer tests.

use std::path::PathBuf;

use hearth_chat::detect::{detect, detect_gguf, OutputFormat};
use hearth_gguf::GgufFile;

fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home).join("models"),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
            .join(".cache/hearth/models"),
    }
}

fn open(name: &str, file: &str) -> GgufFile {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "model file {} is missing: run `python3 scripts/fetch_models.py {name}` (set HEARTH_HOME to use another models dir)",
        path.display()
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn packaged_models() {
    let cases = [
        (
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            OutputFormat::Hermes,
        ),
        (
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            OutputFormat::Hermes,
        ),
        (
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            OutputFormat::Plain,
        ),
        (
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            OutputFormat::Plain,
        ),
    ];
    for (name, file, want) in cases {
        assert_eq!(detect_gguf(&open(name, file)), want, "{name}");
    }
}

/// The Qwen2.5 vocabulary alone (template withheld) still says Hermes: it has
/// `<tool_call>`/`</tool_call>` as single tokens.
#[test]
fn qwen_vocabulary_without_template() {
    let file = open(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    );
    let tokens = file
        .metadata()
        .get_array("tokenizer.ggml.tokens")
        .expect("tokens");
    let has = |t: &str| tokens.iter().any(|x| x.as_str() == Some(t));
    assert_eq!(detect("qwen2", None, has), OutputFormat::Hermes);
}
