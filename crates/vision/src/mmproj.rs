//! The mmproj GGUF (llama.cpp's `clip` architecture, projector type
//! `muse-glimmer`): hyper-parameters from the metadata, every tensor checked
//! for presence, shape and a type the CPU can compute with. Keys, names and
//! defaults follow llama.cpp 11434 (`tools/mtmd/clip.cpp`, `clip-impl.h`);
//! unknown keys and tensors are ignored.

use std::ops::Range;
use std::path::{Path, PathBuf};

use hearth_gguf::{GgmlType, GgufFile, TensorView};
use hearth_kernels::{dequantize, QMatrix};

use crate::error::VisionError;

/// `clip.projector_type` of the Muse Glimmer tower.
pub const PROJECTOR_MUSE_GLIMMER: &str = "muse-glimmer";

/// The tower's dimensions and preprocessing constants.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    /// ViT width (`clip.vision.embedding_length`).
    pub n_embd: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// MLP width.
    pub n_ff: usize,
    pub n_layer: usize,
    /// Width of the projector's output rows (the text model's embedding width).
    pub projection_dim: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// Patch side in pixels (14).
    pub patch_size: usize,
    /// Pixel-shuffle factor (`clip.vision.spatial_merge_size`, default 2).
    pub merge: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// Side of the learned position table (32), also the attention window.
    pub pos_side: usize,
    /// Output widths of `mm.0` and `mm.1`.
    pub adapter_dims: [usize; 2],
    /// Most output tokens per image (llama.cpp: 4096 for this projector).
    pub max_tokens: usize,
    /// 2-D RoPE base (fixed by llama.cpp for this projector).
    pub rope_theta: f64,
    /// Every `sparse_factor`-th block (and the last) attends globally.
    pub sparse_factor: usize,
}

impl VisionConfig {
    /// Pixels per output cell: `patch_size · merge` (28).
    pub fn cell(&self) -> usize {
        self.patch_size * self.merge
    }
}

/// A weight matrix of logical shape [rows, cols], located by its bytes in the file.
#[derive(Clone, Debug)]
pub(crate) struct Weight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
}

impl Weight {
    pub fn matrix<'a>(&self, file: &'a GgufFile) -> QMatrix<'a> {
        QMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: &file.raw_bytes()[self.range.clone()],
        }
    }
}

/// A linear layer: `y = x·Wᵀ (+ b)`.
#[derive(Clone, Debug)]
pub(crate) struct Linear {
    pub w: Weight,
    /// `[rows]`
    pub b: Option<Vec<f32>>,
}

/// LayerNorm gain and bias, `[n_embd]` each.
#[derive(Clone, Debug)]
pub(crate) struct Norm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub ln1: Norm,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub ln2: Norm,
    pub up: Linear,
    pub down: Linear,
}

/// A loaded mmproj: the file (mapped; big matrices are read from it in
/// place) and the small tensors decoded to f32.
pub struct MmProj {
    pub(crate) file: GgufFile,
    pub config: VisionConfig,
    /// `[n_embd, 3·patch²]` (the folded kernel), or `[n_embd, 2·3·patch²]`
    /// when the file keeps both temporal halves.
    pub(crate) patch: Linear,
    /// `[pos_side², n_embd]`
    pub(crate) pos_table: Vec<f32>,
    pub(crate) pre_ln: Norm,
    pub(crate) post_ln: Norm,
    pub(crate) blocks: Vec<Block>,
    /// `mm.0`, `mm.1`, `mm.2`.
    pub(crate) projector: [Weight; 3],
}

struct Loader<'a> {
    file: &'a GgufFile,
    path: PathBuf,
}

impl Loader<'_> {
    fn missing_key(&self, key: &str) -> VisionError {
        VisionError::MissingKey {
            path: self.path.clone(),
            key: key.into(),
        }
    }

    fn bad_key(&self, key: &str, problem: String) -> VisionError {
        VisionError::BadKey {
            path: self.path.clone(),
            key: key.into(),
            problem,
        }
    }

    fn uint(&self, key: &str) -> Result<Option<usize>, VisionError> {
        match self.file.metadata().get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 && n < 1 << 31 => Ok(Some(n as usize)),
                _ => Err(self.bad_key(key, format!("expected a positive integer, found {v}"))),
            },
        }
    }

    fn req_uint(&self, key: &str) -> Result<usize, VisionError> {
        self.uint(key)?.ok_or_else(|| self.missing_key(key))
    }

    fn triple(&self, key: &str) -> Result<[f32; 3], VisionError> {
        let arr = self
            .file
            .metadata()
            .get_array(key)
            .ok_or_else(|| self.missing_key(key))?;
        let vals: Option<Vec<f32>> = arr.iter().map(|v| v.as_f64().map(|x| x as f32)).collect();
        match vals {
            Some(v) if v.len() >= 3 => Ok([v[0], v[1], v[2]]),
            _ => Err(self.bad_key(
                key,
                format!("expected 3 numbers, found {} values", arr.len()),
            )),
        }
    }

    fn view(&self, name: &str) -> Result<TensorView<'_>, VisionError> {
        self.file
            .get_tensor(name)
            .ok_or_else(|| VisionError::MissingTensor {
                path: self.path.clone(),
                name: name.into(),
            })
    }

    fn shape_err(&self, name: &str, found: &[u64], expected: String) -> VisionError {
        VisionError::TensorShape {
            path: self.path.clone(),
            name: name.into(),
            found: found.to_vec(),
            expected,
        }
    }

    /// A float vector of `n` values (any type `dequantize` handles).
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, VisionError> {
        let t = self.view(name)?;
        if t.info.shape != [n as u64] {
            return Err(self.shape_err(name, &t.info.shape, format!("[{n}]")));
        }
        self.decode(name, &t)
    }

    fn decode(&self, name: &str, t: &TensorView) -> Result<Vec<f32>, VisionError> {
        let mut out = vec![0f32; t.info.n_elements() as usize];
        dequantize(t.info.ty, t.data, &mut out).map_err(|_| VisionError::TensorType {
            path: self.path.clone(),
            name: name.into(),
            ty: t.info.ty,
            allowed: "hearth cannot dequantize it",
        })?;
        Ok(out)
    }

    fn norm(&self, prefix: &str, n: usize) -> Result<Norm, VisionError> {
        Ok(Norm {
            w: self.vector(&format!("{prefix}.weight"), n)?,
            b: self.vector(&format!("{prefix}.bias"), n)?,
        })
    }

    /// A matrix whose ggml shape must be `[cols, rows]`.
    fn weight(&self, name: &str, cols: usize, rows: usize) -> Result<Weight, VisionError> {
        let t = self.view(name)?;
        if t.info.shape != [cols as u64, rows as u64] {
            return Err(self.shape_err(name, &t.info.shape, format!("[{cols}, {rows}]")));
        }
        self.checked_weight(name, &t, rows, cols)
    }

    fn checked_weight(
        &self,
        name: &str,
        t: &TensorView,
        rows: usize,
        cols: usize,
    ) -> Result<Weight, VisionError> {
        let ty = t.info.ty;
        let type_err = |allowed| VisionError::TensorType {
            path: self.path.clone(),
            name: name.into(),
            ty,
            allowed,
        };
        if cols % ty.block_size() != 0 || 256 % ty.block_size() != 0 {
            return Err(type_err("its blocks do not tile the rows"));
        }
        // One row through the dequantizer: refuses types it does not know.
        let row_bytes = t.data.len() / rows;
        let mut row = vec![0f32; cols];
        dequantize(ty, &t.data[..row_bytes], &mut row)
            .map_err(|_| type_err("hearth cannot dequantize it"))?;
        let start = t.data.as_ptr() as usize - self.file.raw_bytes().as_ptr() as usize;
        Ok(Weight {
            ty,
            rows,
            cols,
            range: start..start + t.data.len(),
        })
    }

    fn linear(&self, prefix: &str, cols: usize, rows: usize) -> Result<Linear, VisionError> {
        Ok(Linear {
            w: self.weight(&format!("{prefix}.weight"), cols, rows)?,
            b: Some(self.vector(&format!("{prefix}.bias"), rows)?),
        })
    }

    /// The first of `names` present (the canonical one when none is).
    fn first_present<'n>(&self, names: &[&'n str]) -> &'n str {
        names
            .iter()
            .find(|n| self.file.tensor_info(n).is_some())
            .unwrap_or(&names[0])
    }
}

impl MmProj {
    /// Opens and checks an mmproj. `text_dim`: the text model's embedding
    /// width, which the projector's output rows must have (`None` skips the
    /// check, as llama.cpp does without a text model).
    pub fn load(path: impl AsRef<Path>, text_dim: Option<usize>) -> Result<MmProj, VisionError> {
        let file = GgufFile::open(path.as_ref())?;
        Self::from_file(file, text_dim)
    }

    pub fn from_file(file: GgufFile, text_dim: Option<usize>) -> Result<MmProj, VisionError> {
        let l = Loader {
            file: &file,
            path: file.path().to_path_buf(),
        };
        let path = l.path.clone();
        let md = file.metadata();
        match file.architecture() {
            Some("clip") => {}
            other => {
                return Err(VisionError::NotClip {
                    path,
                    found: other.map(str::to_string),
                })
            }
        }
        if md.get_bool("clip.has_vision_encoder") != Some(true) {
            return Err(VisionError::NoVisionEncoder { path });
        }
        let proj = md
            .get_str("clip.projector_type")
            .or_else(|| md.get_str("clip.vision.projector_type"))
            .ok_or_else(|| l.missing_key("clip.projector_type"))?;
        if proj != PROJECTOR_MUSE_GLIMMER {
            return Err(VisionError::UnsupportedProjector {
                path,
                found: proj.into(),
            });
        }

        let n_embd = l.req_uint("clip.vision.embedding_length")?;
        let n_head = l.req_uint("clip.vision.attention.head_count")?;
        let head_dim = match l.uint("clip.vision.attention.head_dim")? {
            Some(d) => d,
            None => n_embd / n_head,
        };
        if head_dim * n_head != n_embd || head_dim % 4 != 0 {
            return Err(l.bad_key(
                "clip.vision.attention.head_count",
                format!("{n_head} heads of {head_dim} do not make a width of {n_embd} with head_dim a multiple of 4 (2-D RoPE)"),
            ));
        }
        if let Some(kv) = l.uint("clip.vision.attention.head_count_kv")? {
            if kv != n_head {
                return Err(l.bad_key(
                    "clip.vision.attention.head_count_kv",
                    format!("{kv} KV heads for {n_head} query heads (this tower has no grouped attention)"),
                ));
            }
        }
        let eps_key = "clip.vision.attention.layer_norm_epsilon";
        let eps = md.get_f64(eps_key).ok_or_else(|| l.missing_key(eps_key))? as f32;
        if !(eps.is_finite() && eps > 0.0) {
            return Err(l.bad_key(eps_key, format!("{eps} is not a positive number")));
        }
        let merge = l.uint("clip.vision.spatial_merge_size")?.unwrap_or(2);
        let config_proj_dim = l.req_uint("clip.vision.projection_dim")?;
        let patch_size = l.req_uint("clip.vision.patch_size")?;
        let mut config = VisionConfig {
            n_embd,
            n_head,
            head_dim,
            n_ff: l.req_uint("clip.vision.feed_forward_length")?,
            n_layer: l.req_uint("clip.vision.block_count")?,
            projection_dim: 0,
            eps,
            patch_size,
            merge,
            image_mean: l.triple("clip.vision.image_mean")?,
            image_std: l.triple("clip.vision.image_std")?,
            pos_side: 0,
            adapter_dims: [0, 0],
            max_tokens: 4096,
            rope_theta: 10000.0,
            sparse_factor: 4,
        };
        if config.image_std.contains(&0.0) {
            return Err(l.bad_key("clip.vision.image_std", "a standard deviation of 0".into()));
        }

        // Patch embedding: the folded conv kernel [p, p, 3, D] (llama.cpp's
        // converter sums the two temporal slabs) or the unfolded [2·3·p², D].
        let name = "v.patch_embd.weight";
        let t = l.view(name)?;
        let folded = 3 * patch_size * patch_size;
        let p = patch_size as u64;
        let shape = t.info.shape.as_slice();
        let cols = if shape == [p, p, 3, n_embd as u64] {
            folded
        } else if shape == [2 * folded as u64, n_embd as u64] {
            2 * folded
        } else {
            return Err(l.shape_err(
                name,
                shape,
                format!("[{p}, {p}, 3, {n_embd}] or [{}, {n_embd}]", 2 * folded),
            ));
        };
        if !matches!(t.info.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(VisionError::TensorType {
                path,
                name: name.into(),
                ty: t.info.ty,
                allowed: "the patch embedding must be F32, F16 or BF16",
            });
        }
        let patch = Linear {
            w: l.checked_weight(name, &t, n_embd, cols)?,
            b: match file.get_tensor("v.patch_embd.bias") {
                Some(_) => Some(l.vector("v.patch_embd.bias", n_embd)?),
                None => None,
            },
        };

        let name = "v.position_embd.weight";
        let t = l.view(name)?;
        let rows = t.info.n_rows() as usize;
        let side = (rows as f64).sqrt().round() as usize;
        if t.info.shape.len() != 2
            || t.info.shape[0] != n_embd as u64
            || side * side != rows
            || side == 0
        {
            return Err(l.shape_err(name, &t.info.shape, format!("[{n_embd}, side²]")));
        }
        config.pos_side = side;
        let pos_table = l.decode(name, &t)?;

        let (d, f) = (n_embd, config.n_ff);
        let blocks = (0..config.n_layer)
            .map(|i| {
                let p = |s: &str| format!("v.blk.{i}.{s}");
                Ok(Block {
                    ln1: l.norm(&p("ln1"), d)?,
                    q: l.linear(&p("attn_q"), d, d)?,
                    k: l.linear(&p("attn_k"), d, d)?,
                    v: l.linear(&p("attn_v"), d, d)?,
                    o: l.linear(&p("attn_out"), d, d)?,
                    ln2: l.norm(&p("ln2"), d)?,
                    up: l.linear(&p("ffn_up"), d, f)?,
                    down: l.linear(&p("ffn_down"), f, d)?,
                })
            })
            .collect::<Result<Vec<_>, VisionError>>()?;

        // The projector: mm.0 [merge²·D → A0], mm.1 [A0 → A1], mm.2 [A1 → out].
        let mm = |i: usize, alias: &str| {
            l.first_present(&[&format!("mm.{i}.weight"), alias])
                .to_string()
        };
        let (n0, n1, n2) = (
            mm(0, "mm.adapter_fc.weight"),
            mm(1, "mm.adapter_proj.weight"),
            mm(2, "mm.vision_proj.weight"),
        );
        let rows_of = |name: &str| -> Result<usize, VisionError> {
            let t = l.view(name)?;
            match t.info.shape.as_slice() {
                [_, r] => Ok(*r as usize),
                s => Err(l.shape_err(name, s, "[in, out]".into())),
            }
        };
        let a0 = rows_of(&n0)?;
        let a1 = rows_of(&n1)?;
        let out = rows_of(&n2)?;
        let projector = [
            l.weight(&n0, merge * merge * d, a0)?,
            l.weight(&n1, a0, a1)?,
            l.weight(&n2, a1, out)?,
        ];
        config.adapter_dims = [a0, a1];
        if config_proj_dim != out {
            return Err(l.bad_key(
                "clip.vision.projection_dim",
                format!("{config_proj_dim}, but {n2} writes rows of {out}"),
            ));
        }
        config.projection_dim = out;
        if let Some(text) = text_dim {
            if text != out {
                return Err(VisionError::ProjectionDim {
                    path,
                    mmproj: out,
                    text,
                });
            }
        }
        let pre_ln = l.norm("v.pre_ln", d)?;
        let post_ln = l.norm("v.post_ln", d)?;
        drop(l);
        Ok(MmProj {
            file,
            config,
            patch,
            pos_table,
            pre_ln,
            post_ln,
            blocks,
            projector,
        })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Bytes of weights the encoder reads per image.
    pub fn weight_bytes(&self) -> u64 {
        let lin = |l: &Linear| l.w.range.len() as u64;
        let blocks: u64 = self
            .blocks
            .iter()
            .map(|b| lin(&b.q) + lin(&b.k) + lin(&b.v) + lin(&b.o) + lin(&b.up) + lin(&b.down))
            .sum();
        blocks
            + lin(&self.patch)
            + self
                .projector
                .iter()
                .map(|w| w.range.len() as u64)
                .sum::<u64>()
    }
}
