//! The register-activation GEMVs (`gemv_<t>_x*`): launches over output
//! segments, and the variants the tuner times.

use super::*;

/// The single-token GEMV variants the tuner tries on a GPU of `sm_count`
/// multiprocessors: 1, 2 or 4 items in flight per lane, with one warp per
/// row or a grid of 2, 4 or 8 blocks per multiprocessor streaming the rows.
pub fn gemv_variants(sm_count: u32) -> Vec<GemvTune> {
    let mut v = Vec::new();
    for u in [1u8, 2, 4] {
        for per_sm in [0u32, 2, 4, 8] {
            v.push(GemvTune {
                u,
                blocks: per_sm * sm_count,
                r: 1,
                x: false,
            });
        }
    }
    for r in [2u8, 4] {
        for per_sm in [0u32, 2, 4, 8] {
            v.push(GemvTune {
                u: 1,
                blocks: per_sm * sm_count,
                r,
                x: false,
            });
        }
    }
    v
}

/// The register-activation variants for `w` (empty when its type or width has none).
pub fn gemv_x_variants(w: &GpuMatrix, sm_count: u32) -> Vec<GemvTune> {
    let Some((_, ipt)) = x_geometry(w.kind, w.cols) else {
        return Vec::new();
    };
    let rs: &[u8] = match (w.kind.is_k_quant(), ipt) {
        (true, _) => &[1, 2, 4],
        (false, 1) => &[1, 2, 4, 8],
        (false, _) => &[2, 4],
    };
    let mut v = Vec::new();
    for &r in rs {
        // One block per tile, about 2-16 blocks per SM, and grids that give
        // every block the same number of tiles (no tail of half-idle SMs).
        let tiles = w.rows.div_ceil(r as usize) as u32;
        let mut grids: Vec<u32> = [0u32, 2, 4, 8, 16].iter().map(|k| k * sm_count).collect();
        grids.extend(
            [2u32, 3, 4, 6]
                .iter()
                .map(|k| tiles.div_ceil(*k))
                .filter(|&b| b >= sm_count),
        );
        grids.dedup();
        for blocks in grids {
            v.push(GemvTune {
                u: 1,
                blocks,
                r,
                x: true,
            });
        }
    }
    v
}

/// One output range of a (possibly fused) matrix: `rows` consecutive rows
/// written densely to `y` ([n_tokens, rows]), with an optional bias.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub y: u64,
    pub bias: u64,
    pub rows: usize,
}

/// Threads per block and items per thread of the register-activation GEMV
/// for rows of `cols` values, if it takes them (blocks of at most 512 threads).
fn x_geometry(kind: WeightKind, cols: usize) -> Option<(u32, usize)> {
    let per_item = match kind {
        WeightKind::Q4K | WeightKind::Q5K | WeightKind::Q6K => 64,
        WeightKind::Q8_0 | WeightKind::Q4_0 | WeightKind::Q5_0 => 32,
        _ => return None,
    };
    let items = cols / per_item;
    let ipt = items.div_ceil(512);
    if ipt > if kind.is_k_quant() { 1 } else { 2 } {
        return None;
    }
    let threads = items.div_ceil(ipt).div_ceil(32) * 32;
    Some((threads as u32, ipt))
}

fn gemv_x_name(kind: WeightKind, nt: usize, r: u8, ipt: usize) -> Option<&'static str> {
    macro_rules! names {
        ($($k:ident => $s:literal),*) => {
            match (kind, nt, r, ipt) {
                $( (WeightKind::$k, 1, 1, 1) => Some(concat!("gemv_", $s, "_x1_r1_i1")),
                   (WeightKind::$k, 1, 2, 1) => Some(concat!("gemv_", $s, "_x1_r2_i1")),
                   (WeightKind::$k, 1, 4, 1) => Some(concat!("gemv_", $s, "_x1_r4_i1")),
                   (WeightKind::$k, 2, 2, 1) => Some(concat!("gemv_", $s, "_x2_r2_i1")), )*
                _ => None,
            }
        };
    }
    macro_rules! names32 {
        ($($k:ident => $s:literal),*) => {
            match (kind, nt, r, ipt) {
                $( (WeightKind::$k, 1, 8, 1) => Some(concat!("gemv_", $s, "_x1_r8_i1")),
                   (WeightKind::$k, 1, 2, 2) => Some(concat!("gemv_", $s, "_x1_r2_i2")),
                   (WeightKind::$k, 1, 4, 2) => Some(concat!("gemv_", $s, "_x1_r4_i2")),
                   (WeightKind::$k, 2, 2, 2) => Some(concat!("gemv_", $s, "_x2_r2_i2")), )*
                _ => None,
            }
        };
    }
    names!(Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0", Q4K => "q4_k", Q5K => "q5_k", Q6K => "q6_k")
        .or_else(|| names32!(Q8_0 => "q8_0", Q4_0 => "q4_0", Q5_0 => "q5_0"))
}

/// One register-activation GEMV launch for `nt` tokens (1 or 2) into up to four segments.
pub fn gemv_x(
    g: &Gpu,
    w: &GpuMatrix,
    tune: GemvTune,
    x: Q8,
    nt: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    gemv_x_grid(g, w, tune, x, nt, 1, segs, flags)
}

/// [`gemv_x`] over `groups` grid rows of `nt` tokens each (each group as its own launch).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv_x_grid(
    g: &Gpu,
    w: &GpuMatrix,
    tune: GemvTune,
    x: Q8,
    nt: usize,
    groups: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    let (threads, ipt) = x_geometry(w.kind, w.cols).ok_or_else(|| {
        CudaError::Unsupported(format!(
            "register GEMV of {:?} with {} columns",
            w.kind, w.cols
        ))
    })?;
    // Two-token launches use the one tile height compiled for them.
    let r = if nt == 1 { tune.r } else { 2 };
    let name = gemv_x_name(w.kind, nt, r, ipt).ok_or_else(|| {
        CudaError::Unsupported(format!(
            "register GEMV {:?} nt {nt} r {r} ipt {ipt}",
            w.kind
        ))
    })?;
    if segs.is_empty() || segs.len() > 4 || segs.iter().map(|s| s.rows).sum::<usize>() != w.rows {
        return Err(CudaError::Unsupported(format!(
            "GEMV segments {:?} for {} rows",
            segs.iter().map(|s| s.rows).collect::<Vec<_>>(),
            w.rows
        )));
    }
    let mut bounds = [w.rows as i32; 3];
    let mut acc = 0;
    for (i, s) in segs.iter().take(3).enumerate() {
        acc += s.rows;
        bounds[i] = acc as i32;
    }
    let seg = |i: usize| {
        segs.get(i).copied().unwrap_or(Segment {
            y: 0,
            bias: 0,
            rows: 0,
        })
    };
    let tiles = w.rows.div_ceil(r as usize) as u32;
    let blocks = if tune.blocks > 0 && nt == 1 {
        tiles.min(tune.blocks)
    } else {
        tiles
    };
    let mut args = gemv_head_args(w, x);
    args.extend([
        Arg::I32(flags),
        Arg::I32(bounds[0]),
        Arg::I32(bounds[1]),
        Arg::I32(bounds[2]),
        Arg::Ptr(seg(0).y),
        Arg::Ptr(seg(1).y),
        Arg::Ptr(seg(2).y),
        Arg::Ptr(seg(3).y),
        Arg::Ptr(seg(0).bias),
        Arg::Ptr(seg(1).bias),
        Arg::Ptr(seg(2).bias),
        Arg::Ptr(seg(3).bias),
    ]);
    g.launch(name, (blocks, groups as u32, 1), threads, &args)
}

/// `n_tokens` tokens through the register-activation GEMV, in launches of
/// 2 and 1 tokens (each reads the weights once), into `segs`.
pub fn gemv_segments(
    g: &Gpu,
    w: &GpuMatrix,
    x: Q8,
    n_tokens: usize,
    segs: &[Segment],
    flags: i32,
) -> Result<()> {
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(2);
        let moved: Vec<Segment> = segs
            .iter()
            .map(|s| Segment {
                y: s.y + (t0 * s.rows * 4) as u64,
                ..*s
            })
            .collect();
        gemv_x(g, w, w.tune, x.offset(t0, w.cols), nt, &moved, flags)?;
        t0 += nt;
    }
    Ok(())
}
