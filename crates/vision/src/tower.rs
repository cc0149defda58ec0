//! The tower on another device: what a backend (hearth-cuda's `GpuTower`)
//! needs from the CPU side — the weights as they lie in the file, and the
//! host-computed inputs of one image (patches and position embeddings in the
//! windowed token order, RoPE angles, the attention segments of each block,
//! the pixel-shuffle gather) — and the [`Tower`] trait that [`MmProj::encode_on`]
//! and [`crate::prompt::ImageInput`] call.
//!
//! Both the CPU encoder (`encoder.rs`) and device towers run from
//! [`TowerInputs`]: the tokens are put in windowed order *before* the patch
//! embedding (every step up to the pixel shuffle is row-wise or works within
//! the windows), and the pixel shuffle gathers straight from that order, so
//! no rows are permuted on the way.

use std::ops::Range;

use hearth_kernels::QMatrix;

use crate::layout::{is_global_block, position_embeddings_of, PosRule, TokenLayout};
use crate::mmproj::{Linear, MmProj, Norm};
use crate::{Embeddings, Rules};

/// A device that runs the tower ([`MmProj::encode_on`]).
pub trait Tower: Send + Sync {
    /// Shown in messages ("CUDA").
    fn name(&self) -> &'static str;
    /// The projector rows of one image, as [`MmProj::encode_patches`]
    /// returns them (`[n_tokens, projection_dim]`, pixel-shuffle group
    /// order, before any RMSNorm).
    fn encode(&self, mm: &MmProj, inputs: &TowerInputs) -> Result<Vec<f32>, String>;
}

/// A linear layer as stored in the file: `y = x·Wᵀ (+ b)`.
pub struct LinearView<'a> {
    pub w: QMatrix<'a>,
    pub b: Option<&'a [f32]>,
}

/// LayerNorm gain and bias, `[n_embd]` each.
pub struct NormView<'a> {
    pub w: &'a [f32],
    pub b: &'a [f32],
}

pub struct BlockView<'a> {
    pub ln1: NormView<'a>,
    pub q: LinearView<'a>,
    pub k: LinearView<'a>,
    pub v: LinearView<'a>,
    pub o: LinearView<'a>,
    pub ln2: NormView<'a>,
    pub up: LinearView<'a>,
    pub down: LinearView<'a>,
}

/// Every weight of the tower, borrowed from the mapped file.
pub struct TowerWeights<'a> {
    /// `[n_embd, 3·patch²]`, or `[n_embd, 2·3·patch²]` when the file keeps
    /// both temporal halves (`x·[W₁ W₂]ᵀ` for a patch repeated twice, i.e.
    /// `x·(W₁ + W₂)ᵀ`).
    pub patch: LinearView<'a>,
    pub pre_ln: NormView<'a>,
    pub post_ln: NormView<'a>,
    pub blocks: Vec<BlockView<'a>>,
    /// `mm.0`, `mm.1`, `mm.2` (no biases).
    pub projector: [QMatrix<'a>; 3],
}

/// One image's host-side inputs to the tower, tokens in windowed order.
#[derive(Clone, Debug)]
pub struct TowerInputs {
    pub n_patches: usize,
    /// `[n_patches, 3·patch²]`
    pub patches: Vec<f32>,
    /// `[n_patches, n_embd]`: the position embeddings.
    pub pos: Vec<f32>,
    /// `[n_patches, head_dim / 2]`: RoPE angles.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    /// The attention windows (consecutive ranges covering every token).
    pub windows: Vec<Range<usize>>,
    /// Per block: attends globally (else within `windows`).
    pub global: Vec<bool>,
    /// `[n_tokens · merge²]`: for output row g, the windowed positions of
    /// its members k = 0..merge² (channel-major shuffle:
    /// `u_g[merge²·ch + k] = x[shuffle[g·merge² + k]][ch]`).
    pub shuffle: Vec<u32>,
}

fn linear<'a>(mm: &'a MmProj, l: &'a Linear) -> LinearView<'a> {
    LinearView {
        w: l.w.matrix(&mm.file),
        b: l.b.as_deref(),
    }
}

fn norm(n: &Norm) -> NormView<'_> {
    NormView { w: &n.w, b: &n.b }
}

impl MmProj {
    /// The tower's weights, for uploading to a device.
    pub fn weights(&self) -> TowerWeights<'_> {
        TowerWeights {
            patch: linear(self, &self.patch),
            pre_ln: norm(&self.pre_ln),
            post_ln: norm(&self.post_ln),
            blocks: self
                .blocks
                .iter()
                .map(|b| BlockView {
                    ln1: norm(&b.ln1),
                    q: linear(self, &b.q),
                    k: linear(self, &b.k),
                    v: linear(self, &b.v),
                    o: linear(self, &b.o),
                    ln2: norm(&b.ln2),
                    up: linear(self, &b.up),
                    down: linear(self, &b.down),
                })
                .collect(),
            projector: self.projector.each_ref().map(|w| w.matrix(&self.file)),
        }
    }

    /// The host-side inputs for `patches` (`[grid_h·grid_w, 3·patch²]`,
    /// row-major, [`crate::preprocess::patchify`]).
    pub fn tower_inputs(
        &self,
        patches: &[f32],
        grid_h: usize,
        grid_w: usize,
        pos_rule: PosRule,
    ) -> TowerInputs {
        let c = &self.config;
        let (d, n) = (c.n_embd, grid_h * grid_w);
        let folded = 3 * c.patch_size * c.patch_size;
        assert_eq!(patches.len(), n * folded, "patches are not [{n}, {folded}]");
        assert!(
            grid_h % c.merge == 0 && grid_w % c.merge == 0,
            "grid {grid_h}x{grid_w} is not whole merge cells"
        );
        let layout = TokenLayout::new(grid_h, grid_w, c.pos_side);
        let pos = position_embeddings_of(
            &self.pos_table,
            c.pos_side,
            d,
            grid_h,
            grid_w,
            pos_rule,
            &layout.perm,
        );
        let mut wp = Vec::with_capacity(n * folded);
        // windowed position of each row-major token
        let mut at = vec![0u32; n];
        for (i, &t) in layout.perm.iter().enumerate() {
            wp.extend_from_slice(&patches[t * folded..(t + 1) * folded]);
            at[t] = i as u32;
        }
        let (cos, sin) = layout.rope(c.head_dim, c.rope_theta);
        let mut windows = Vec::new();
        let mut start = 0;
        for &len in &layout.windows {
            windows.push(start..start + len);
            start += len;
        }
        let shuffle = layout
            .shuffle_groups(c.merge)
            .iter()
            .map(|&t| at[t])
            .collect();
        TowerInputs {
            n_patches: n,
            patches: wp,
            pos,
            cos,
            sin,
            windows,
            global: (0..c.n_layer)
                .map(|i| is_global_block(i, c.n_layer, c.sparse_factor))
                .collect(),
            shuffle,
        }
    }

    /// [`MmProj::encode`] on `tower` (the CPU when `None`). A device tower
    /// follows `rules.grid` and `rules.pos` but computes in its own
    /// arithmetic (`rules.numerics` is the CPU tower's).
    pub fn encode_on(
        &self,
        tower: Option<&dyn Tower>,
        img: &crate::RgbImage,
        rules: Rules,
    ) -> Result<Embeddings, String> {
        let Some(tower) = tower else {
            return Ok(self.encode(img, rules));
        };
        let c = &self.config;
        let p = self.preprocess(img, rules);
        let (gh, gw) = (p.grid.nph * c.merge, p.grid.npw * c.merge);
        let inputs = self.tower_inputs(&p.patches, gh, gw, rules.pos);
        let rows = tower.encode(self, &inputs)?;
        let n_tokens = p.grid.n_tokens();
        if rows.len() != n_tokens * c.projection_dim {
            return Err(format!(
                "the {} tower returned {} values for {n_tokens} rows of {}",
                tower.name(),
                rows.len(),
                c.projection_dim
            ));
        }
        Ok(Embeddings {
            rows,
            n_tokens,
            dim: c.projection_dim,
            grid: p.grid,
        })
    }
}
