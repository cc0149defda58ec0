//! Images in a text model's prompt, as llama.cpp's libmtmd frames them.
//!
//! A chat is rendered with llama.cpp's media marker (`<__media__>`,
//! `mtmd_default_marker`) where each image goes; the text between markers is
//! tokenized run by run (`tools/mtmd/mtmd.cpp`, `mtmd_tokenizer::add_text`:
//! no BOS, special tokens parsed), and each image becomes `<|image_start|>`
//! (its own tokenization, appended to the preceding run), the image's N
//! rows, then `<|image_end|>` (prepended to the following run): `img_beg` /
//! `img_end` of `PROJECTOR_TYPE_MUSE_GLIMMER`, `mtmd.cpp:712-716`.
//!
//! An image's identity is the sha256 of its pixels, its size and the rules
//! it is encoded under; equal digests mean equal rows, so a session's prefix
//! reuse compares images by digest (`hearth_engine::prompt`) and
//! [`ImageInput`] keeps encoded rows per digest.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_chat::prompter::{ChatRuns, ImageFraming};
use hearth_engine::prompt::{ImageRows, Prompt};
use hearth_tokenizer::Tokenizer;
use sha2::{Digest, Sha256};

use crate::{GridRule, MmProj, Numerics, PosRule, RefIsa, RgbImage, Rules, Tower};

/// llama.cpp's media marker (`mtmd_default_marker()`).
pub const MEDIA_MARKER: &str = "<__media__>";
/// What precedes and follows an image's rows (mtmd.cpp, muse-glimmer).
pub const IMAGE_BEGIN: &str = "<|image_start|>";
pub const IMAGE_END: &str = "<|image_end|>";

/// Encoded images kept per digest (least recently used dropped first).
const CACHE_IMAGES: usize = 32;

/// The sha256 of an image's size, pixels and the encoder rules.
pub fn image_digest(img: &RgbImage, rules: Rules) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"hearth-image-v1");
    h.update(img.width.to_le_bytes());
    h.update(img.height.to_le_bytes());
    let grid = match rules.grid {
        GridRule::Reference => 0u8,
        GridRule::LlamaCpp => 1,
    };
    let pos = match rules.pos {
        PosRule::Reference => 0u8,
        PosRule::LlamaCpp => 1,
    };
    h.update([grid, pos]);
    // llama.cpp's arithmetic gives other rows (f32 keeps the earlier digests).
    if let Numerics::LlamaCpp(isa) = rules.numerics {
        let isa = match isa.unwrap_or_else(RefIsa::native) {
            RefIsa::Avx512 => 0u8,
            RefIsa::Avx2 => 1,
        };
        h.update([b'n', isa]);
    }
    h.update(&img.data);
    h.finalize().into()
}

/// One encoded image, and how it was obtained.
pub struct Encoded {
    pub rows: Arc<ImageRows>,
    /// From the cache (not encoded again).
    pub cached: bool,
    pub time: Duration,
}

/// A loaded projector with the text model's framing tokens and an encode
/// cache: turns images into prompt rows.
pub struct ImageInput {
    pub mmproj: MmProj,
    pub rules: Rules,
    /// Where the tower runs (the CPU when `None`).
    tower: Option<Arc<dyn Tower>>,
    begin: Vec<u32>,
    end: Vec<u32>,
    cache: Mutex<EncodeCache>,
}

/// Rows by digest, and the digests from least to most recently used.
type EncodeCache = (HashMap<[u8; 32], Arc<ImageRows>>, VecDeque<[u8; 32]>);

impl ImageInput {
    /// `tokenizer` is the text model's (the framing strings are tokenized
    /// with it, special tokens parsed, as mtmd does).
    pub fn new(mmproj: MmProj, rules: Rules, tokenizer: &Tokenizer) -> ImageInput {
        ImageInput {
            mmproj,
            rules,
            tower: None,
            begin: tokenizer.encode(IMAGE_BEGIN, false, true),
            end: tokenizer.encode(IMAGE_END, false, true),
            cache: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// Runs the tower on `tower` (a GPU) instead of the CPU.
    pub fn with_tower(mut self, tower: Arc<dyn Tower>) -> ImageInput {
        self.tower = Some(tower);
        self
    }

    /// Where the tower runs: "CPU" or the device's name.
    pub fn device(&self) -> &'static str {
        self.tower.as_ref().map_or("CPU", |t| t.name())
    }

    /// Positions an image of this size takes in a prompt (framing included).
    pub fn positions(&self, width: u32, height: u32) -> usize {
        self.begin.len()
            + self.mmproj.grid_for(width, height, self.rules).n_tokens()
            + self.end.len()
    }

    /// The image's rows: from the cache by digest, else encoded (and kept).
    /// Fails only where a device tower fails (out of device memory, say).
    pub fn encode(&self, img: &RgbImage) -> Result<Encoded, String> {
        let t = Instant::now();
        let digest = image_digest(img, self.rules);
        if let Some(rows) = self.lookup(&digest) {
            return Ok(Encoded {
                rows,
                cached: true,
                time: t.elapsed(),
            });
        }
        let e = self
            .mmproj
            .encode_on(self.tower.as_deref(), img, self.rules)
            .map_err(|e| format!("encoding the image on the {}: {e}", self.device()))?;
        let rows = Arc::new(ImageRows {
            digest,
            rows: e.rows,
            n: e.n_tokens,
        });
        let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(digest, rows.clone()).is_none() {
            order.push_back(digest);
        }
        while order.len() > CACHE_IMAGES {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        Ok(Encoded {
            rows,
            cached: false,
            time: t.elapsed(),
        })
    }

    fn lookup(&self, digest: &[u8; 32]) -> Option<Arc<ImageRows>> {
        let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        let rows = map.get(digest)?.clone();
        order.retain(|d| d != digest);
        order.push_back(*digest);
        Some(rows)
    }

    /// The prompt from token runs split at media markers (`runs.len() ==
    /// images.len() + 1`) and the images in marker order, framed as mtmd
    /// frames them.
    pub fn prompt(&self, runs: &[Vec<u32>], images: &[Arc<ImageRows>]) -> Prompt {
        self.assemble(runs, images, true)
    }

    /// The prompt of a rendered conversation ([`ChatRuns`]) and its images in
    /// order, framed as its renderer asks: as mtmd frames them
    /// ([`ImageFraming::Mtmd`]), or each image its rows alone between two
    /// runs that carry every token (the Muse Glimmer reference's bare
    /// `<|patch|>` slots, [`ImageFraming::InRuns`]).
    pub fn place(&self, runs: &ChatRuns, images: &[Arc<ImageRows>]) -> Prompt {
        self.assemble(&runs.runs, images, runs.framing == ImageFraming::Mtmd)
    }

    fn assemble(&self, runs: &[Vec<u32>], images: &[Arc<ImageRows>], mtmd: bool) -> Prompt {
        assert_eq!(runs.len(), images.len() + 1, "one image per marker");
        let mut p = Prompt::default();
        for (run, image) in runs.iter().zip(images) {
            p.push_tokens(run);
            if mtmd {
                p.push_tokens(&self.begin);
            }
            p.push_image(image.clone());
            if mtmd {
                p.push_tokens(&self.end);
            }
        }
        p.push_tokens(&runs[runs.len() - 1]);
        p
    }
}
