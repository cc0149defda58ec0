//! Image input: the Muse Glimmer vision tower read from an mmproj GGUF
//! (llama.cpp's `clip` file, projector type `muse-glimmer`), on the CPU.
//!
//! ```text
//! bytes ──RgbImage::decode──▶ RgbImage ──MmProj::encode──▶ Embeddings [n_tokens, projection_dim]
//!            (image.rs)          │ preprocess.rs: grid, Lanczos resize, normalize, patchify
//!                                │ encoder.rs:    ViT (layout.rs: positions, RoPE, windows), projector
//! ```
//!
//! - [`MmProj::load`]: the file and its checks ([`mmproj`]).
//! - [`RgbImage::decode`]: PNG/JPEG/WebP/GIF with byte and pixel limits ([`image`]).
//! - [`MmProj::encode`]: one image → [`Embeddings`].
//! - [`prompt`]: images into a text model's prompt (framing, digests, an
//!   encode cache), for `hearth run` and `hearth serve`.
//! - [`synth`]: synthetic mmproj files (`hearth synth --arch muse-glimmer-mmproj`).
//! - [`tower`]: the tower on another device ([`Tower`]; hearth-cuda runs it on the GPU).
//!
//! Where the model's reference (spec `vision.md`) and llama.cpp 11434 differ,
//! [`Rules`] selects the behaviour: the grid tie-break ([`GridRule`]) and the
//! position-table resampling ([`PosRule`]). The math otherwise follows the
//! reference; the output rows are the projector's, *before* the scaleless
//! RMSNorm (llama.cpp's framing: the text model's embedding norm normalizes
//! them with the text rows; [`Embeddings::rms_normalized`] gives the
//! reference's normalized rows).

// `usize::is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
#![allow(clippy::manual_is_multiple_of)]

pub mod encoder;
pub mod error;
mod ggml;
pub mod image;
pub mod layout;
pub mod mmproj;
pub mod ops;
pub mod preprocess;
pub mod prompt;
pub mod synth;
pub mod tower;

use hearth_kernels::pool::{self, ThreadPool};

pub use error::{ImageError, VisionError};
pub use hearth_kernels::cpu::ggml_order::activations::RefIsa;
pub use image::{decode_base64, ImageLimits, RgbImage};
pub use layout::PosRule;
pub use mmproj::{MmProj, VisionConfig, PROJECTOR_MUSE_GLIMMER};
pub use preprocess::{Grid, GridRule};
pub use tower::{Tower, TowerInputs, TowerWeights};

/// The behaviours where the reference and llama.cpp differ (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    pub grid: GridRule,
    pub pos: PosRule,
    pub numerics: Numerics,
}

/// How the tower rounds (every step not named here is f32 either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// f32 throughout (closest to the exact math; the default).
    #[default]
    F32,
    /// llama.cpp 11434's CPU graph: the patch embedding is `ggml_conv_2d`,
    /// whose im2col is f16, so the normalized pixels and (unless it is BF16)
    /// the patch kernel are rounded to f16 before an f32-accumulated product;
    /// attention is its flash attention (mtmd's default on the CPU): K and V
    /// cast to f16 and, for fewer than 64 patches, q rounded to f16 and Σ p·v
    /// kept in f16. Every other step is in its CPU kernels' arithmetic order
    /// too (llamafile's tinyBLAS matmuls, `ggml_norm`, ggml's RoPE, glibc's
    /// `erff`), as the given x86 build computes it (`None`: the build a native
    /// compile on this machine makes), so for F32 and F16 weights the rows
    /// are llama.cpp's to the bit (up to libm). The CPU tower only.
    LlamaCpp(Option<RefIsa>),
}

impl Rules {
    /// The model's reference (the default).
    pub const REFERENCE: Rules = Rules {
        grid: GridRule::Reference,
        pos: PosRule::Reference,
        numerics: Numerics::F32,
    };
    /// llama.cpp 11434, its CPU rounding included.
    pub const LLAMA_CPP: Rules = Rules {
        grid: GridRule::LlamaCpp,
        pos: PosRule::LlamaCpp,
        numerics: Numerics::LlamaCpp(None),
    };

    /// These rules with f32 numerics (what a GPU tower computes).
    pub const fn f32_numerics(self) -> Rules {
        Rules {
            numerics: Numerics::F32,
            ..self
        }
    }
}

/// An image ready for the tower.
#[derive(Clone, Debug)]
pub struct Preprocessed {
    pub grid: Grid,
    /// The image resized to `28·npw × 28·nph`.
    pub image: RgbImage,
    /// `[n_patches, 3·patch²]`, row-major patch order.
    pub patches: Vec<f32>,
}

/// The encoded image: one row per image token.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// `[n_tokens, dim]`, in row-major cell order (cell (y, x) at `y·npw + x`).
    pub rows: Vec<f32>,
    pub n_tokens: usize,
    pub dim: usize,
    pub grid: Grid,
}

impl Embeddings {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.dim..(i + 1) * self.dim]
    }

    /// The rows after the reference's final scaleless RMSNorm
    /// (`x / sqrt(mean(x²) + eps)`, spec §9 step 9).
    pub fn rms_normalized(&self, eps: f32) -> Vec<f32> {
        let mut out = self.rows.clone();
        for row in out.chunks_exact_mut(self.dim) {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / self.dim as f64;
            let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
            row.iter_mut().for_each(|v| *v *= inv);
        }
        out
    }
}

impl MmProj {
    /// The grid an image of this size gets (its token count is `grid.n_tokens()`).
    pub fn grid_for(&self, width: u32, height: u32, rules: Rules) -> Grid {
        let c = &self.config;
        preprocess::select_grid(width, height, c.cell(), c.max_tokens, rules.grid)
    }

    /// Grid selection, resize, normalization, patchify.
    pub fn preprocess(&self, img: &RgbImage, rules: Rules) -> Preprocessed {
        let c = &self.config;
        let grid = self.grid_for(img.width, img.height, rules);
        let (w, h) = ((grid.npw * c.cell()) as u32, (grid.nph * c.cell()) as u32);
        let image = if (w, h) == (img.width, img.height) {
            img.clone()
        } else {
            preprocess::resize_lanczos(img, w, h)
        };
        let patches = preprocess::patchify(&image, c.patch_size, c.image_mean, c.image_std);
        Preprocessed {
            grid,
            image,
            patches,
        }
    }

    /// Encodes one image on the process-wide thread pool.
    pub fn encode(&self, img: &RgbImage, rules: Rules) -> Embeddings {
        self.encode_in(pool::global(), img, rules)
    }

    /// Encodes one image on `pool`.
    pub fn encode_in(&self, pool: &ThreadPool, img: &RgbImage, rules: Rules) -> Embeddings {
        let c = &self.config;
        let p = self.preprocess(img, rules);
        let (gh, gw) = (p.grid.nph * c.merge, p.grid.npw * c.merge);
        let rows = self.encode_patches(pool, &p.patches, gh, gw, rules);
        Embeddings {
            rows,
            n_tokens: p.grid.n_tokens(),
            dim: c.projection_dim,
            grid: p.grid,
        }
    }
}
