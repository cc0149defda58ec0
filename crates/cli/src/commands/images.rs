//! `hearth run --mmproj FILE --image IMG`: the projector, the images and the
//! prompt they make (llama-mtmd-cli's habits: a media marker per image,
//! prepended to the prompt when it has none; `hearth_vision::prompt` frames
//! them as libmtmd does).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hearth_chat::prompter::ChatRuns;
use hearth_engine::prompt::Prompt;
use hearth_models::Model;
use hearth_tokenizer::Tokenizer;
use hearth_vision::prompt::{ImageInput, MEDIA_MARKER};
use hearth_vision::{ImageLimits, MmProj, RgbImage, Rules};
use serde_json::{json, Value};

/// Which rules the tower follows where the model's reference and llama.cpp
/// differ (grid ties, position-table resampling; docs/vision.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageRules {
    /// The model's reference (what the weights were trained with).
    Reference,
    /// llama.cpp 11434's libmtmd grid and position rules, in hearth's f32
    /// arithmetic (within ~1e-3 of llama.cpp's rows).
    #[value(name = "llama-cpp")]
    LlamaCpp,
    /// llama.cpp's rules and, on the CPU tower, its arithmetic too: the rows
    /// of a native llama.cpp build, bit for bit (for F32/F16/Q8_0 towers);
    /// a slower encode.
    #[value(name = "llama-cpp-exact")]
    LlamaCppExact,
}

impl ImageRules {
    pub fn rules(self) -> Rules {
        match self {
            ImageRules::Reference => Rules::REFERENCE,
            ImageRules::LlamaCpp => Rules::LLAMA_CPP.f32_numerics(),
            ImageRules::LlamaCppExact => Rules::LLAMA_CPP,
        }
    }
}

/// Loads the projector for `model` (its output width must be the model's).
pub fn load_mmproj(
    path: &Path,
    model: &Model,
    rules: ImageRules,
    tokenizer: &Tokenizer,
) -> Result<ImageInput> {
    let mm = MmProj::load(path, Some(model.config.dim))
        .with_context(|| format!("--mmproj {}", path.display()))?;
    Ok(ImageInput::new(mm, rules.rules(), tokenizer))
}

/// Reads and decodes the `--image` files (limits checked from the header).
pub fn read_images(paths: &[PathBuf]) -> Result<Vec<RgbImage>> {
    paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).with_context(|| format!("--image {}", p.display()))?;
            RgbImage::decode(&bytes, &ImageLimits::default())
                .with_context(|| format!("--image {}", p.display()))
        })
        .collect()
}

/// The prompt text with one media marker per image: as given when it has
/// markers (their count must match), else the markers prepended
/// (llama-mtmd-cli's single-turn mode).
pub fn with_markers(text: &str, n_images: usize) -> Result<String> {
    let found = text.matches(MEDIA_MARKER).count();
    if found == 0 {
        return Ok(MEDIA_MARKER.repeat(n_images) + text);
    }
    if found != n_images {
        bail!("the prompt has {found} {MEDIA_MARKER} markers for {n_images} --image files");
    }
    Ok(text.to_string())
}

/// Encodes the images (stderr: one line each) and frames them between the
/// token runs. Returns the prompt and a JSON summary per image.
pub fn encode_into_prompt(
    input: &ImageInput,
    images: &[RgbImage],
    paths: &[PathBuf],
    runs: &ChatRuns,
) -> Result<(Prompt, Vec<Value>)> {
    if runs.runs.len() != images.len() + 1 {
        bail!(
            "the rendered prompt has {} media markers for {} images",
            runs.runs.len() - 1,
            images.len()
        );
    }
    let mut rows = Vec::new();
    let mut stats = Vec::new();
    for (img, path) in images.iter().zip(paths) {
        let grid = input.mmproj.grid_for(img.width, img.height, input.rules);
        eprintln!(
            "image {}: {}x{} -> {}x{} cells, {} tokens: encoding on the {}...",
            path.display(),
            img.width,
            img.height,
            grid.npw,
            grid.nph,
            grid.n_tokens(),
            input.device()
        );
        let e = input
            .encode(img)
            .map_err(|e| anyhow::anyhow!("--image {}: {e}", path.display()))?;
        let ms = e.time.as_secs_f64() * 1e3;
        eprintln!("image {}: encoded in {ms:.1} ms", path.display());
        stats.push(json!({
            "path": path,
            "width": img.width,
            "height": img.height,
            "tokens": e.rows.n,
            "encode_ms": ms,
        }));
        rows.push(Arc::clone(&e.rows));
    }
    Ok((input.place(runs, &rows), stats))
}
