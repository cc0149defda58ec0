//! Where each patch token sits (spec `vision.md` §6–8): the position-table
//! interpolation, the 2-D RoPE angles, the windowed ("sparse") attention
//! order and the pixel-shuffle groups.

/// How the learned position table is resampled to the patch grid (§6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PosRule {
    /// The model's reference: a `[grid_w][grid_h]` flattening (transposed
    /// for non-square grids), zero padding outside the table, computed in
    /// f64 and stored f32 (the reference then rounds to bf16, as it does
    /// every activation; hearth keeps f32 activations).
    #[default]
    Reference,
    /// llama.cpp 11434 (`ggml_interpolate` bilinear, half-pixel centres):
    /// natural orientation, edge clamping, f32; the table itself when the
    /// grid is the table's size.
    LlamaCpp,
}

/// The patch grid of one image and the token orders derived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenLayout {
    /// Patches along the height / width.
    pub grid_h: usize,
    pub grid_w: usize,
    /// Window side of the sparse attention (the position table's side: 32
    /// for Muse Glimmer, as llama.cpp derives it).
    pub window: usize,
    /// `perm[i]`: the row-major token at windowed position i (§8).
    pub perm: Vec<usize>,
    /// Window sizes in windowed order (empty windows omitted).
    pub windows: Vec<usize>,
}

impl TokenLayout {
    pub fn new(grid_h: usize, grid_w: usize, window: usize) -> TokenLayout {
        let mut perm = Vec::with_capacity(grid_h * grid_w);
        let mut windows = Vec::new();
        for wy in 0..grid_h.div_ceil(window) {
            for wx in 0..grid_w.div_ceil(window) {
                let start = perm.len();
                for y in wy * window..((wy + 1) * window).min(grid_h) {
                    for x in wx * window..((wx + 1) * window).min(grid_w) {
                        perm.push(y * grid_w + x);
                    }
                }
                if perm.len() > start {
                    windows.push(perm.len() - start);
                }
            }
        }
        TokenLayout {
            grid_h,
            grid_w,
            window,
            perm,
            windows,
        }
    }

    pub fn n_patches(&self) -> usize {
        self.grid_h * self.grid_w
    }

    /// Pixel-shuffle groups (§9 step 8): for output token g = oh·(grid_w/m) + ow,
    /// its `m²` members (row-major tokens) in order k = m·iy + ix.
    pub fn shuffle_groups(&self, merge: usize) -> Vec<usize> {
        let (oh, ow) = (self.grid_h / merge, self.grid_w / merge);
        let mut out = Vec::with_capacity(oh * ow * merge * merge);
        for y in 0..oh {
            for x in 0..ow {
                for iy in 0..merge {
                    for ix in 0..merge {
                        out.push((y * merge + iy) * self.grid_w + x * merge + ix);
                    }
                }
            }
        }
        out
    }

    /// RoPE angles (§7), `[n_patches, head_dim / 2]` in windowed order:
    /// pair j < head_dim/4 turns by `(col+1)·ω_j`, the rest by
    /// `(row+1)·ω_{j − head_dim/4}`, `ω_i = θ^(−4i/head_dim)`; cos and sin
    /// computed in f64, stored f32.
    pub fn rope(&self, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
        let (pairs, quarter) = (head_dim / 2, head_dim / 4);
        let omega: Vec<f64> = (0..pairs - quarter)
            .map(|i| theta.powf(-(2.0 * i as f64) / pairs as f64))
            .collect();
        // cos/sin of pos·ω_i for every position 1..=max(grid) (each computed once).
        let max_pos = self.grid_h.max(self.grid_w);
        let mut table = vec![(0f32, 0f32); (max_pos + 1) * omega.len()];
        for pos in 1..=max_pos {
            for (i, &w) in omega.iter().enumerate() {
                let phi = pos as f64 * w;
                table[pos * omega.len() + i] = (phi.cos() as f32, phi.sin() as f32);
            }
        }
        let mut cos = Vec::with_capacity(self.perm.len() * pairs);
        let mut sin = Vec::with_capacity(self.perm.len() * pairs);
        for &t in &self.perm {
            let (r, c) = (t / self.grid_w, t % self.grid_w);
            for j in 0..pairs {
                let (pos, i) = if j < quarter {
                    (c + 1, j)
                } else {
                    (r + 1, j - quarter)
                };
                let (cv, sv) = table[pos * omega.len() + i];
                cos.push(cv);
                sin.push(sv);
            }
        }
        (cos, sin)
    }
}

/// The position embeddings for a `grid_h × grid_w` patch grid, `[n_patches,
/// dim]` in row-major token order, from a `side × side` table (`[side²,
/// dim]`, row `y·side + x` is cell (y, x)).
pub fn position_embeddings(
    table: &[f32],
    side: usize,
    dim: usize,
    grid_h: usize,
    grid_w: usize,
    rule: PosRule,
) -> Vec<f32> {
    let order: Vec<usize> = (0..grid_h * grid_w).collect();
    position_embeddings_of(table, side, dim, grid_h, grid_w, rule, &order)
}

/// [`position_embeddings`] of the tokens `order` (row-major token indices),
/// in that order: `[order.len(), dim]`.
pub fn position_embeddings_of(
    table: &[f32],
    side: usize,
    dim: usize,
    grid_h: usize,
    grid_w: usize,
    rule: PosRule,
    order: &[usize],
) -> Vec<f32> {
    assert_eq!(
        table.len(),
        side * side * dim,
        "position table is not [side², dim]"
    );
    let mut out = vec![0f32; order.len() * dim];
    let row = |yy: usize, xx: usize| &table[(yy * side + xx) * dim..][..dim];
    match rule {
        PosRule::LlamaCpp if grid_h == side && grid_w == side => {
            for (dst, &t) in out.chunks_exact_mut(dim).zip(order) {
                dst.copy_from_slice(row(t / grid_w, t % grid_w));
            }
        }
        PosRule::LlamaCpp => {
            // ggml_compute_forward_upscale_f32, GGML_SCALE_MODE_BILINEAR.
            let (sf_x, sf_y) = (grid_w as f32 / side as f32, grid_h as f32 / side as f32);
            let axis = |i: usize, sf: f32| {
                let s = (i as f32 + 0.5) / sf - 0.5;
                let lo = s.floor() as i64;
                let (i0, i1) = (
                    lo.clamp(0, side as i64 - 1) as usize,
                    (lo + 1).clamp(0, side as i64 - 1) as usize,
                );
                let d = (s - i0 as f32).clamp(0.0, 1.0);
                (i0, i1, d)
            };
            for (dst, &t) in out.chunks_exact_mut(dim).zip(order) {
                let (y, x) = (t / grid_w, t % grid_w);
                let (y0, y1, dy) = axis(y, sf_y);
                let (x0, x1, dx) = axis(x, sf_x);
                let (a, b, c, d) = (row(y0, x0), row(y0, x1), row(y1, x0), row(y1, x1));
                // `a·(1−dx)·(1−dy) + b·dx·(1−dy) + c·(1−dx)·dy + d·dx·dy` as GCC
                // contracts it (-O3, fp-contract=fast): the first two products
                // into one fma, each later one fused onto the running sum
                // (bit-exact against llama.cpp's UPSCALE output).
                for e in 0..dim {
                    let ab = (a[e] * (1.0 - dx)).mul_add(1.0 - dy, b[e] * dx * (1.0 - dy));
                    dst[e] = (d[e] * dx).mul_add(dy, (c[e] * (1.0 - dx)).mul_add(dy, ab));
                }
            }
        }
        PosRule::Reference => {
            // Output row t: (a, b) = (t div grid_h, t mod grid_h); a grid_w-point
            // linspace drives the table's row axis, a grid_h-point one its columns.
            let half = side as f64 / 2.0;
            let coord = |k: usize, g: usize| {
                let ny = if g == 1 {
                    0.0
                } else {
                    -1.0 + 1.0 / g as f64 + k as f64 * (2.0 - 2.0 / g as f64) / (g as f64 - 1.0)
                };
                (ny + 1.0) * half - 0.5
            };
            // A table row, or None outside the table (zero padding).
            let cell = |y: i64, x: i64| -> Option<&[f32]> {
                (y >= 0 && x >= 0 && y < side as i64 && x < side as i64)
                    .then(|| row(y as usize, x as usize))
            };
            let at = |r: Option<&[f32]>, e: usize| r.map_or(0.0, |r| r[e] as f64);
            for (dst, &t) in out.chunks_exact_mut(dim).zip(order) {
                let (a, b) = (t / grid_h, t % grid_h);
                let (sy, sx) = (coord(a, grid_w), coord(b, grid_h));
                let (y0, x0) = (sy.floor(), sx.floor());
                let (wy, wx) = (sy - y0, sx - x0);
                let (y0, x0) = (y0 as i64, x0 as i64);
                let (r00, r01) = (cell(y0, x0), cell(y0, x0 + 1));
                let (r10, r11) = (cell(y0 + 1, x0), cell(y0 + 1, x0 + 1));
                for (e, o) in dst.iter_mut().enumerate() {
                    let top = at(r00, e) * (1.0 - wx) + at(r01, e) * wx;
                    let bottom = at(r10, e) * (1.0 - wx) + at(r11, e) * wx;
                    *o = (top * (1.0 - wy) + bottom * wy) as f32;
                }
            }
        }
    }
    out
}

/// The blocks that attend globally (§9 step 5): every `factor`-th and the last.
pub fn is_global_block(i: usize, n_blocks: usize, factor: usize) -> bool {
    i + 1 == n_blocks || (i + 1) % factor == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §12.6.
    #[test]
    fn sparse_permutation() {
        let l = TokenLayout::new(8, 8, 32);
        assert_eq!(l.perm, (0..64).collect::<Vec<_>>());
        assert_eq!(l.windows, [64]);
        assert_eq!(TokenLayout::new(64, 64, 32).windows, [1024; 4]);
        let l = TokenLayout::new(40, 48, 32);
        assert_eq!(l.windows, [1024, 512, 256, 128]);
        let mut seen = l.perm.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..40 * 48).collect::<Vec<_>>());
        // Window 0 is rows 0..32 of columns 0..32, row-major.
        assert_eq!(&l.perm[..3], &[0, 1, 2]);
        assert_eq!(l.perm[32], 48);
        assert_eq!(l.perm[1024], 32);
    }

    /// Spec §12.7: the pixel permutation.
    #[test]
    fn shuffle_groups() {
        assert_eq!(
            TokenLayout::new(2, 4, 32).shuffle_groups(2),
            [0, 1, 4, 5, 2, 3, 6, 7]
        );
        // grid 6x8: the (3, 2, 4, 2) -> (0, 2, 1, 3) transpose of arange(48).
        let g = TokenLayout::new(6, 8, 32).shuffle_groups(2);
        let mut want = Vec::new();
        for a in 0..3 {
            for c in 0..4 {
                for b in 0..2 {
                    for d in 0..2 {
                        want.push(a * 16 + b * 8 + c * 2 + d);
                    }
                }
            }
        }
        assert_eq!(g, want);
    }

    /// Spec §12.5.
    #[test]
    fn rope_angles() {
        let l = TokenLayout::new(3, 5, 32);
        let (cos, sin) = l.rope(96, 10000.0);
        assert_eq!(cos.len(), 15 * 48);
        // ω_1 and ω_23 from token (0, 0): angle 1·ω in both halves.
        let w1 = 10000f64.powf(-2.0 / 48.0);
        assert!((w1 - 0.681_292_07).abs() < 1e-8);
        assert!((10000f64.powf(-46.0 / 48.0) - 1.467_799_3e-4).abs() < 1e-11);
        assert_eq!(sin[1], (w1.sin()) as f32);
        assert_eq!(sin[25], (w1.sin()) as f32);
        // Token 7 = (row 1, col 2): columns first.
        assert_eq!(sin[7 * 48 + 1], ((3.0 * w1).sin()) as f32);
        assert_eq!(sin[7 * 48 + 25], ((2.0 * w1).sin()) as f32);
        assert!(cos.iter().chain(&sin).all(|v| v.abs() <= 1.0));
    }

    /// Spec §12.4: the table's own size reproduces it (both rules), and an
    /// 8×8 grid gives 64 rows.
    #[test]
    fn position_table_interpolation() {
        let (side, dim) = (32, 3);
        let table: Vec<f32> = (0..side * side * dim)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        for rule in [PosRule::Reference, PosRule::LlamaCpp] {
            assert_eq!(position_embeddings(&table, side, dim, 32, 32, rule), table);
            assert_eq!(
                position_embeddings(&table, side, dim, 8, 8, rule).len(),
                64 * dim
            );
        }
        // Downsampled square grids: both rules sample the same points.
        let r = position_embeddings(&table, side, dim, 8, 8, PosRule::Reference);
        let l = position_embeddings(&table, side, dim, 8, 8, PosRule::LlamaCpp);
        for (a, b) in r.iter().zip(&l) {
            assert!((a - b).abs() <= 1e-2 * (1.0 + b.abs()), "{a} vs {b}");
        }
        // A non-square grid transposes in the reference rule: row t = (a, b)
        // with a = t div grid_h samples table row (2a+1)·16/grid_w − 0.5.
        let r = position_embeddings(&table, side, dim, 2, 4, PosRule::Reference);
        // t = 1: a = 0, b = 1: sy = 16/4 − 0.5 = 3.5, sx = 16·3/2 − 0.5 = 23.5.
        let want = (0..dim).map(|e| {
            let v = |y: usize, x: usize| table[(y * side + x) * dim + e] as f64;
            (0.25 * (v(3, 23) + v(3, 24) + v(4, 23) + v(4, 24))) as f32
        });
        assert!(r[dim..2 * dim].iter().copied().eq(want));
    }

    #[test]
    fn global_blocks() {
        let g: Vec<usize> = (0..50).filter(|&i| is_global_block(i, 50, 4)).collect();
        assert_eq!(g, [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 49]);
    }
}
