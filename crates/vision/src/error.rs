//! Typed errors: loading an mmproj ([`VisionError`]) and reading an image
//! ([`ImageError`]). Every message names what was wrong and where.

use std::path::PathBuf;

use hearth_gguf::{GgmlType, GgufError};

/// A problem with an mmproj file or with its fit to the text model.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: general.architecture is {found:?}; an mmproj file has \"clip\"")]
    NotClip {
        path: PathBuf,
        found: Option<String>,
    },
    #[error("{path}: clip.has_vision_encoder is not true (no vision tower in this mmproj)")]
    NoVisionEncoder { path: PathBuf },
    #[error("{path}: projector type {found:?} is not supported (supported: \"muse-glimmer\")")]
    UnsupportedProjector { path: PathBuf, found: String },
    #[error("{path}: missing metadata key {key}")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key {key}: {problem}")]
    BadKey {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error(
        "{path}: the projector writes rows of {mmproj} values but the text model's embedding width is {text}"
    )]
    ProjectionDim {
        path: PathBuf,
        mmproj: usize,
        text: usize,
    },
    #[error("{path}: missing tensor {name}")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor {name} has shape {found:?}, expected {expected} (ggml order)")]
    TensorShape {
        path: PathBuf,
        name: String,
        found: Vec<u64>,
        expected: String,
    },
    #[error("{path}: tensor {name} has type {ty}; {allowed}")]
    TensorType {
        path: PathBuf,
        name: String,
        ty: GgmlType,
        allowed: &'static str,
    },
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// A problem with an input image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("image is empty (0 bytes)")]
    Empty,
    #[error("image is {n} bytes, over the limit of {max} bytes")]
    TooManyBytes { n: usize, max: usize },
    #[error("not a PNG, JPEG, WebP or GIF image (starts with {magic})")]
    UnknownFormat { magic: String },
    #[error("{format} image could not be decoded: {message}")]
    Decode {
        format: &'static str,
        message: String,
    },
    #[error("image is {width}x{height}: zero-size images have nothing to encode")]
    ZeroSize { width: u32, height: u32 },
    #[error(
        "image is {width}x{height}: over the limit ({max_side} pixels per side, {max_pixels} pixels in all)"
    )]
    TooLarge {
        width: u32,
        height: u32,
        max_side: u32,
        max_pixels: u64,
    },
    #[error("bad base64 at character {at}: {problem}")]
    Base64 { at: usize, problem: &'static str },
    #[error("RGB buffer of {len} bytes does not hold a {width}x{height} image ({expected} bytes)")]
    BadBuffer {
        width: u32,
        height: u32,
        len: usize,
        expected: usize,
    },
}
