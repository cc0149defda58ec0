//! Typed errors for building a tokenizer. Metadata errors name the GGUF key.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    // --- GGUF metadata ---
    #[error("tokenizer metadata: missing key '{key}'")]
    MissingKey { key: &'static str },

    #[error("tokenizer metadata: key '{key}': {problem}")]
    InvalidKey { key: &'static str, problem: String },

    #[error("tokenizer.ggml.model = '{0}' is not supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")]
    UnsupportedModel(String),

    #[error("tokenizer.ggml.pre = '{0}' is unknown; llama.cpp refuses to load such a model too")]
    UnknownPreTokenizer(String),

    #[error("tokenizer.ggml.pre = '{0}' is known to llama.cpp but hearth does not implement it")]
    UnsupportedPreTokenizer(String),

    #[error("pre-tokenizer regex {regex:?} does not compile: {message}")]
    Regex { regex: String, message: String },

    // --- Hugging Face tokenizer.json ---
    #[error("{path}: {message}")]
    HfJson { path: PathBuf, message: String },

    #[error("tokenizer.json encoding failed: {0}")]
    Encode(String),

    // --- opening a GGUF file for its tokenizer ---
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
}
