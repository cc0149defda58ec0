//! Image → patches (spec `vision.md` §3–5): the grid of cells, Pillow-exact
//! Lanczos resize onto it, normalization with the file's mean/std, patchify.

use crate::image::RgbImage;

/// How ties between candidate grids are broken (§3 step 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GridRule {
    /// The model's reference: scan the candidates in CPython set order and
    /// keep the first of equal cost (225×225 → 8×8).
    #[default]
    Reference,
    /// llama.cpp 11434 (`muse_glimmer_grid_size`): product order, and on
    /// equal cost the candidate with more tokens (225×225 → 9×9).
    LlamaCpp,
}

/// The cell grid of one image: `nph × npw` output tokens, each a `merge ×
/// merge` block of patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grid {
    /// Cells along the height.
    pub nph: usize,
    /// Cells along the width.
    pub npw: usize,
}

impl Grid {
    /// Output tokens (soft tokens): `nph · npw`.
    pub fn n_tokens(&self) -> usize {
        self.nph * self.npw
    }
}

/// Chooses the grid for a `width × height` image with cells of `cell`
/// pixels and at most `max_tokens` cells (§3). All arithmetic in f64.
pub fn select_grid(
    width: u32,
    height: u32,
    cell: usize,
    max_tokens: usize,
    rule: GridRule,
) -> Grid {
    let (w, h, m) = (width as f64, height as f64, max_tokens as f64);
    let mut ih = h / cell as f64;
    let mut iw = w / cell as f64;
    let ratio = if ih > 0.0 { iw / ih } else { 1.0 };
    if ih * iw > m {
        ih = (m / ratio).sqrt();
        iw = ih * ratio;
    }
    let (fh, ch) = (ih.floor() as usize, ih.ceil() as usize);
    let (fw, cw) = (iw.floor() as usize, iw.ceil() as usize);
    let product = [(fh, fw), (fh, cw), (ch, fw), (ch, cw)];
    let target = h / w;
    let cost = |(a, b): (usize, usize)| (a as f64 / b as f64 - target).abs();
    let fits = |&(a, b): &(usize, usize)| a >= 1 && b >= 1 && a * b <= max_tokens;
    let best = match rule {
        GridRule::Reference => {
            let mut best: Option<(usize, usize)> = None;
            for c in cpython_set_order(product).into_iter().filter(fits) {
                if best.is_none_or(|b| cost(c) < cost(b)) {
                    best = Some(c);
                }
            }
            best.unwrap_or_else(|| (round_half_even(ih).max(1), round_half_even(iw).max(1)))
        }
        GridRule::LlamaCpp => {
            let mut best: Option<(usize, usize)> = None;
            for c in product.into_iter().filter(fits) {
                let better = best.is_none_or(|b| {
                    cost(c) < cost(b) || (cost(c) == cost(b) && c.0 * c.1 > b.0 * b.1)
                });
                if better {
                    best = Some(c);
                }
            }
            // lround: halves away from zero.
            best.unwrap_or_else(|| ((ih.round() as usize).max(1), (iw.round() as usize).max(1)))
        }
    };
    Grid {
        nph: best.0,
        npw: best.1,
    }
}

fn round_half_even(x: f64) -> usize {
    let r = x.round();
    let r = if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    };
    r.max(0.0) as usize
}

/// The iteration order of a CPython (≥ 3.8) set of 2-tuples of small
/// non-negative ints built by inserting `items` in order (§3.1): the tuple
/// hash, open addressing in an 8-slot table, slots visited in index order.
fn cpython_set_order(items: [(usize, usize); 4]) -> Vec<(usize, usize)> {
    const P1: u64 = 11400714785074694791;
    const P2: u64 = 14029467366897019727;
    const P5: u64 = 2870177450012600261;
    let hash = |(a, b): (usize, usize)| {
        let mut acc = P5;
        for v in [a as u64, b as u64] {
            acc = acc.wrapping_add(v.wrapping_mul(P2));
            acc = acc.rotate_left(31);
            acc = acc.wrapping_mul(P1);
        }
        acc = acc.wrapping_add(2 ^ (P5 ^ 3527539));
        if acc == u64::MAX {
            1546275796
        } else {
            acc
        }
    };
    let mut slots: [Option<(usize, usize)>; 8] = [None; 8];
    for item in items {
        let mut perturb = hash(item);
        let mut i = (perturb & 7) as usize;
        loop {
            match slots[i] {
                None => {
                    slots[i] = Some(item);
                    break;
                }
                Some(t) if t == item => break,
                Some(_) => {
                    perturb >>= 5;
                    i = ((5 * i as u64 + 1 + perturb) & 7) as usize;
                }
            }
        }
    }
    slots.into_iter().flatten().collect()
}

/// Pillow's resampling coefficients for one axis (§4): per output index the
/// first input index and the 22-bit fixed-point weights of its taps.
struct Coeffs {
    bounds: Vec<(usize, usize)>,
    weights: Vec<Vec<i64>>,
}

const PRECISION_BITS: u32 = 22;

fn lanczos(t: f64) -> f64 {
    fn sinc(t: f64) -> f64 {
        if t == 0.0 {
            1.0
        } else {
            let p = std::f64::consts::PI * t;
            p.sin() / p
        }
    }
    if t == 0.0 {
        1.0
    } else if t.abs() >= 3.0 {
        0.0
    } else {
        sinc(t) * sinc(t / 3.0)
    }
}

fn coeffs(n_in: usize, n_out: usize) -> Coeffs {
    let scale = n_in as f64 / n_out as f64;
    let fs = scale.max(1.0);
    let support = 3.0 * fs;
    let mut bounds = Vec::with_capacity(n_out);
    let mut weights = Vec::with_capacity(n_out);
    for o in 0..n_out {
        let center = (o as f64 + 0.5) * scale;
        let lo = ((center - support + 0.5).trunc() as i64).max(0) as usize;
        let hi = ((center + support + 0.5).trunc() as i64).min(n_in as i64) as usize;
        let w: Vec<f64> = (lo..hi)
            .map(|x| lanczos((x as f64 - center + 0.5) / fs))
            .collect();
        let sum: f64 = w.iter().sum();
        let k = w
            .iter()
            .map(|&v| {
                let v = if sum != 0.0 { v / sum } else { v };
                let s = v * (1u64 << PRECISION_BITS) as f64;
                (if s < 0.0 { s - 0.5 } else { s + 0.5 }) as i64
            })
            .collect();
        bounds.push((lo, hi));
        weights.push(k);
    }
    Coeffs { bounds, weights }
}

fn clamp8(acc: i64) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes with Pillow's `Image.LANCZOS`, bit-exact (§4): a horizontal pass
/// over every source row, then a vertical pass, each in 22-bit fixed point.
/// An axis whose size does not change is not resampled (Pillow's rule; the
/// pass would be the identity).
pub fn resize_lanczos(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    let (w0, h0) = (img.width as usize, img.height as usize);
    let (w1, h1) = (width as usize, height as usize);
    let mut cur = img.data.clone();
    if w1 != w0 {
        let c = coeffs(w0, w1);
        let mut out = vec![0u8; w1 * h0 * 3];
        for y in 0..h0 {
            let src = &cur[y * w0 * 3..(y + 1) * w0 * 3];
            for (x, ((lo, hi), k)) in c.bounds.iter().zip(&c.weights).enumerate() {
                for ch in 0..3 {
                    let mut acc = 1i64 << (PRECISION_BITS - 1);
                    for (i, &kv) in (*lo..*hi).zip(k) {
                        acc += src[i * 3 + ch] as i64 * kv;
                    }
                    out[(y * w1 + x) * 3 + ch] = clamp8(acc);
                }
            }
        }
        cur = out;
    }
    if h1 != h0 {
        let c = coeffs(h0, h1);
        let row = w1 * 3;
        let mut out = vec![0u8; row * h1];
        let mut acc = vec![0i64; row];
        for (y, ((lo, hi), k)) in c.bounds.iter().zip(&c.weights).enumerate() {
            acc.fill(1i64 << (PRECISION_BITS - 1));
            for (i, &kv) in (*lo..*hi).zip(k) {
                for (a, &s) in acc.iter_mut().zip(&cur[i * row..(i + 1) * row]) {
                    *a += s as i64 * kv;
                }
            }
            for (o, &a) in out[y * row..(y + 1) * row].iter_mut().zip(&acc) {
                *o = clamp8(a);
            }
        }
        cur = out;
    }
    RgbImage {
        width,
        height,
        data: cur,
    }
}

/// Normalizes and cuts a (resized) image into `patch × patch` patches in
/// row-major patch order (§5): token `t = py·(W/patch) + px` holds
/// `3·patch²` values, element `ch·patch² + dy·patch + dx` =
/// `(byte/255 − mean[ch]) / std[ch]` of pixel (py·patch + dy, px·patch + dx),
/// in f32. (The reference's second temporal half is the same values; the
/// folded patch embedding takes them once.)
///
/// Returns `[n_patches, 3·patch²]`.
pub fn patchify(img: &RgbImage, patch: usize, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let (w, h) = (img.width as usize, img.height as usize);
    assert!(
        w % patch == 0 && h % patch == 0,
        "patchify: {w}x{h} is not whole patches of {patch}"
    );
    let (gw, gh) = (w / patch, h / patch);
    let per = 3 * patch * patch;
    let mut out = vec![0f32; gw * gh * per];
    for (t, dst) in out.chunks_exact_mut(per).enumerate() {
        let (py, px) = (t / gw, t % gw);
        for ch in 0..3 {
            for dy in 0..patch {
                for dx in 0..patch {
                    let (y, x) = (py * patch + dy, px * patch + dx);
                    let b = img.data[(y * w + x) * 3 + ch];
                    dst[ch * patch * patch + dy * patch + dx] =
                        (b as f32 / 255.0 - mean[ch]) / std[ch];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §12.1 (the reference rule), every row of the table.
    #[test]
    fn grid_golden_vectors() {
        let cases = [
            (1440, 1440, 52, 52),
            (225, 225, 8, 8),
            (512, 512, 19, 19),
            (1024, 1024, 37, 37),
            (200, 203, 8, 8),
            (24, 60, 3, 1),
            (700, 700, 25, 25),
            (336, 336, 12, 12),
            (1000, 2500, 90, 36),
            (6000, 6000, 64, 64),
            (1, 1, 1, 1),
            (27, 27, 1, 1),
            (28, 28, 1, 1),
            (1, 10000, 358, 1),
            (640, 480, 17, 23),
            (1920, 1080, 39, 69),
            (800, 600, 21, 28),
            (100, 800, 29, 4),
        ];
        for (w, h, nph, npw) in cases {
            let g = select_grid(w, h, 28, 4096, GridRule::Reference);
            assert_eq!((g.nph, g.npw), (nph, npw), "{w}x{h}");
        }
    }

    /// The two rules differ exactly on ties (issue 16: 225×225 gives 9×9 in
    /// llama.cpp; 783 of the square sizes 1..1999 differ).
    #[test]
    fn grid_rules_differ_on_ties_only() {
        let g = select_grid(225, 225, 28, 4096, GridRule::LlamaCpp);
        assert_eq!((g.nph, g.npw), (9, 9));
        let g = select_grid(1440, 1440, 28, 4096, GridRule::LlamaCpp);
        assert_eq!((g.nph, g.npw), (52, 52));
        let differ = (1..2000)
            .filter(|&s| {
                select_grid(s, s, 28, 4096, GridRule::Reference)
                    != select_grid(s, s, 28, 4096, GridRule::LlamaCpp)
            })
            .count();
        assert_eq!(differ, 783);
        for w in (1..3000).step_by(37) {
            for h in (1..3000).step_by(41) {
                for rule in [GridRule::Reference, GridRule::LlamaCpp] {
                    let g = select_grid(w, h, 28, 4096, rule);
                    assert!(
                        g.nph >= 1 && g.npw >= 1 && g.n_tokens() <= 4096,
                        "{w}x{h} {rule:?}"
                    );
                }
            }
        }
    }

    fn synthetic(w: u32, h: u32) -> RgbImage {
        let mut data = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let r = (37 * x + 11 * y) % 256;
                let g = if x < w / 3 && y < h / 2 { 255 } else { 16 };
                let b = (x * x + 3 * y * y) % 256;
                data.extend([r as u8, g, b as u8]);
            }
        }
        RgbImage {
            width: w,
            height: h,
            data,
        }
    }

    /// Spec §12.2 resize goldens.
    #[test]
    fn resize_golden_vectors() {
        let out = resize_lanczos(&synthetic(9, 7), 5, 4);
        let want: [u8; 60] = [
            19, 255, 1, 83, 189, 6, 161, 0, 17, 182, 20, 35, 26, 16, 59, 38, 190, 13, 102, 134, 18,
            179, 4, 29, 213, 19, 47, 46, 16, 71, 58, 0, 46, 120, 5, 51, 208, 17, 62, 123, 16, 80,
            54, 16, 104, 77, 20, 95, 138, 19, 100, 231, 16, 111, 95, 16, 129, 68, 16, 153,
        ];
        assert_eq!(out.data, want);
        let out = resize_lanczos(&synthetic(4, 3), 7, 6);
        assert_eq!(out.pixel(0, 0), [0, 255, 0]);
        assert_eq!(out.pixel(6, 5), [137, 16, 22]);
        let out = resize_lanczos(&synthetic(16, 16), 8, 8);
        assert_eq!(out.pixel(0, 0), [25, 250, 1]);
        assert_eq!(out.pixel(7, 7), [184, 16, 99]);
    }

    /// Spec §12.3.
    #[test]
    fn patchify_layout_and_values() {
        let mut img = synthetic(56, 56);
        img.data[0] = 0;
        img.data[1] = 255;
        img.data[2] = 128;
        let p = patchify(&img, 14, [0.5; 3], [0.5; 3]);
        assert_eq!(p.len(), 16 * 588);
        assert_eq!(p[0], -1.0);
        assert_eq!(p[196], 1.0);
        assert!((p[2 * 196] - 0.003_921_6).abs() < 1e-7);
        // Token 5 = (py 1, px 1), channel 2, dy 3, dx 4.
        let (y, x) = (14 + 3, 14 + 4);
        let b = img.data[(y * 56 + x) * 3 + 2];
        assert_eq!(
            p[5 * 588 + 2 * 196 + 3 * 14 + 4],
            (b as f32 / 255.0 - 0.5) / 0.5
        );
    }
}
