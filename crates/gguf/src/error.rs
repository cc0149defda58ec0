//! Typed errors for reading and writing GGUF. Every format error names the file,
//! the field being read and the byte offset where the problem was found.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{path}: {field} at byte {offset}: {problem}")]
    Format {
        path: PathBuf,
        field: String,
        offset: u64,
        problem: Problem,
    },

    #[error("{path}: no tensor named '{name}'")]
    NoSuchTensor { path: PathBuf, name: String },

    #[error("GGUF writer: {0}")]
    Write(String),
}

/// What was wrong with the bytes at a given field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("file truncated: needs {needed} more bytes, only {available} left")]
    Truncated { needed: u64, available: u64 },
    #[error("bad magic {0:#010x} (expected \"GGUF\")")]
    BadMagic(u32),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnknownVersion(u32),
    #[error("unknown tensor type id {0}")]
    UnknownTensorType(u32),
    #[error("unknown metadata value type id {0}")]
    UnknownValueType(u32),
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    #[error("count {count} cannot fit in the {available} bytes left")]
    CountTooLarge { count: u64, available: u64 },
    #[error("arrays nested deeper than {0} levels")]
    TooDeep(usize),
    #[error("{0}")]
    Invalid(String),
    #[error("tensor data [{start}, {end}) lies outside the data section of {len} bytes")]
    OutOfRange { start: u64, end: u64, len: u64 },
    #[error("duplicate {0}")]
    Duplicate(String),
}
