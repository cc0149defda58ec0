//! The packed kernels: one group of 8 rows against `NT` tokens, generic over
//! the instruction set ([`Simd`]), and the loops over groups and tokens.

use super::*;

/// The 8 activation bytes at `off` as a little-endian u64.
#[inline(always)]
fn a64<const N: usize>(qs: &[i8; N], off: usize) -> u64 {
    assert!(off + 8 <= N);
    // SAFETY: in bounds (checked above; `off` is a constant per unrolled loop).
    unsafe { std::ptr::read_unaligned(qs.as_ptr().add(off) as *const u64) }
}

/// Block `b` of token `t`'s row (callers loop `b` below the row length).
#[inline(always)]
unsafe fn yb<'a, B, const NT: usize>(y: &[&'a [B]; NT], t: usize, b: usize) -> &'a B {
    &*(y[t].as_ptr().add(b))
}

/// Prefetches the block two blocks ahead (`pb` bytes per block): decode
/// streams the weights once, and the hardware prefetcher restarts at every
/// matmul.
#[inline(always)]
unsafe fn prefetch_ahead<S: Simd>(blk: *const u8, pb: usize) {
    let ahead = blk.wrapping_add(2 * pb);
    let mut off = 0;
    while off < pb {
        S::prefetch(ahead.wrapping_add(off));
        off += 64;
    }
}

/// `hsum_float_8` of each row's eight lanes, which live in four vectors
/// (vector s holds lanes 2s, 2s + 1): `((x0+x4) + (x2+x6)) + ((x1+x5) + (x3+x7))`.
#[inline(always)]
unsafe fn hsum_rows<S: Simd>(acc: [S::F; 4]) -> [f32; 8] {
    let s = S::fstore(S::fadd(S::fadd(acc[2], acc[0]), S::fadd(acc[3], acc[1])));
    std::array::from_fn(|r| s[2 * r] + s[2 * r + 1])
}

// The kernels below compute one group of 8 rows against `NT` tokens at
// once: every weight unit is loaded and unpacked once and used for all of
// them. Each token's arithmetic is exactly the single-token order. Token
// loops index several per-token arrays at once (`for t in 0..NT`).

/// [`dot_q0`]'s weight types, as const parameters (one straight-line kernel per type).
mod q0 {
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q5_0: u8 = 2;
}

/// Q8_0 / Q4_0 / Q5_0 (`TY`, see [`q0`]) weights · Q8_0 activations.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q0<S: Simd, const NT: usize, const TY: u8>(
    w: *const u8,
    y: [&[BlockQ8_0]; NT],
    sums: [&[[i32; 8]]; NT],
    dy: [&[f32]; NT],
) -> [[f32; 8]; NT] {
    let mut acc = [[S::fzero(); 4]; NT];
    let pb = match TY {
        q0::Q8_0 => layout::Q8_0,
        q0::Q4_0 => layout::Q4_0,
        _ => layout::Q5_0,
    };
    assert!(sums.iter().all(|r| r.len() == y[0].len()));
    assert!(dy.iter().all(|r| r.len() == y[0].len()));
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * pb);
        prefetch_ahead::<S>(blk, pb);
        let dx = S::rows_f16(blk);
        let mut d = [S::fzero(); NT];
        for t in 0..NT {
            d[t] = S::fmul(dx, S::fsplat(*yb(&dy, t, b)));
        }
        if TY == q0::Q8_0 {
            for u in 0..4 {
                let q = S::load(blk.add(16 + 64 * u));
                for t in 0..NT {
                    let i = S::dot_i8(S::izero(), q, a64(&yb(&y, t, b).qs, 8 * u));
                    acc[t][u] = S::fma(d[t], S::cvt(i), acc[t][u]);
                }
            }
            continue;
        }
        let q5 = TY == q0::Q5_0;
        let units = if q5 { blk.add(48) } else { blk.add(16) };
        for u in 0..2 {
            let raw = S::load(units.add(64 * u));
            let (mut lo, mut hi) = (S::nib_lo(raw), S::nib_hi(raw));
            if q5 {
                lo = S::set_bit4(
                    lo,
                    std::ptr::read_unaligned(blk.add(16 + 8 * u) as *const u64),
                );
                hi = S::set_bit4(
                    hi,
                    std::ptr::read_unaligned(blk.add(16 + 8 * (2 + u)) as *const u64),
                );
            }
            for (q, v) in [(lo, u), (hi, 2 + u)] {
                for t in 0..NT {
                    let c = yb(&sums, t, b);
                    let i = S::dot_u8(
                        S::splat2(c[2 * v], c[2 * v + 1]),
                        q,
                        a64(&yb(&y, t, b).qs, 8 * v),
                    );
                    acc[t][v] = S::fma(d[t], S::cvt(i), acc[t][v]);
                }
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        out[t] = hsum_rows::<S>(acc[t]);
    }
    out
}

/// Q4_1 weights · Q8_1 activations.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q4_1<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8_1]; NT],
) -> [[f32; 8]; NT] {
    let (mut acc, mut summs) = ([[S::fzero(); 4]; NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q4_1);
        prefetch_ahead::<S>(blk, layout::Q4_1);
        let (dx, mx) = (S::rows_f16(blk), S::rows_f16(blk.add(16)));
        let mut d = [S::fzero(); NT];
        for t in 0..NT {
            summs[t] = S::fma(mx, S::fsplat(yb(&y, t, b).s), summs[t]);
            d[t] = S::fmul(dx, S::fsplat(yb(&y, t, b).d));
        }
        for u in 0..2 {
            let raw = S::load(blk.add(32 + 64 * u));
            for (q, v) in [(S::nib_lo(raw), u), (S::nib_hi(raw), 2 + u)] {
                for t in 0..NT {
                    let i = S::dot_u8(S::izero(), q, a64(&yb(&y, t, b).qs, 8 * v));
                    acc[t][v] = S::fma(d[t], S::cvt(i), acc[t][v]);
                }
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        let (h, m) = (hsum_rows::<S>(acc[t]), S::fstore(summs[t]));
        for r in 0..8 {
            out[t][r] = h[r] + m[2 * r];
        }
    }
    out
}

/// Q4_K weights · Q8_K activations (llama.cpp's repacked gemv or gemm order).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q4_k<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8K]; NT],
    pair_sums: [&[[i32; 4]]; NT],
    order: Order,
) -> [[f32; 8]; NT] {
    let (mut acc, mut acc_m) = ([S::fzero(); NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    assert!(pair_sums.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q4_K);
        prefetch_ahead::<S>(blk, layout::Q4_K);
        let (dx, dmx) = (S::rows_f16(blk), S::rows_f16(blk.add(16)));
        let (mut d, mut dmin) = ([S::fzero(); NT], [S::fzero(); NT]);
        for t in 0..NT {
            let dy = S::fsplat(yb(&y, t, b).d);
            d[t] = S::fmul(dx, dy);
            dmin[t] = S::fmul(dmx, dy);
        }
        let (sc, mn, qs) = (
            blk.add(layout::Q4_K_SC),
            blk.add(layout::Q4_K_MN),
            blk.add(layout::Q4_K_QS),
        );
        let (mut isum, mut msum) = ([S::izero(); NT], [S::izero(); NT]);
        for p in 0..4 {
            let (j0, j1) = (2 * p, 2 * p + 1);
            let (s0, s1) = (
                S::pscales::<false>(sc.add(8 * j0)),
                S::pscales::<false>(sc.add(8 * j1)),
            );
            // Both sub-blocks' mins (6 bits) as the 16-bit halves of each lane.
            let m01 = S::add(
                S::rows_bytes::<false>(mn.add(8 * j0), mn.add(8 * j0)),
                S::shl(S::rows_bytes::<false>(mn.add(8 * j1), mn.add(8 * j1)), 16),
            );
            // The 4 units of this pair of sub-blocks, unpacked once for all tokens.
            let raw: [S::U; 4] = std::array::from_fn(|u| S::load(qs.add(64 * (4 * p + u))));
            let (lo, hi) = (raw.map(|r| S::nib_lo(r)), raw.map(|r| S::nib_hi(r)));
            for t in 0..NT {
                let by = yb(&y, t, b);
                // 4 pdots of nibbles (<= 15) per chain: 4·4·15·128 = 30720, in pscale's bound.
                let (mut pl, mut ph) = (S::pzero(), S::pzero());
                for u in 0..4 {
                    pl = S::pdot(pl, lo[u], a64(&by.qs, 64 * p + 8 * u));
                    ph = S::pdot(ph, hi[u], a64(&by.qs, 64 * p + 32 + 8 * u));
                }
                let pi = S::pscale_acc(S::pscale(pl, s0), ph, s1);
                let b01 = yb(&pair_sums, t, b)[p];
                let pm = S::madd16(m01, S::splat2(b01, b01));
                if order == Order::Batch {
                    acc[t] = S::fma(S::cvt(S::pair_sum(pi)), d[t], acc[t]);
                    acc_m[t] = S::fma(S::cvt(pm), dmin[t], acc_m[t]);
                } else {
                    isum[t] = S::add(isum[t], pi);
                    msum[t] = S::add(msum[t], pm);
                }
            }
        }
        if order == Order::Vec {
            for t in 0..NT {
                acc[t] = S::fma(S::cvt(S::pair_sum(isum[t])), d[t], acc[t]);
                acc_m[t] = S::fma(S::cvt(msum[t]), dmin[t], acc_m[t]);
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        let v = S::fstore(S::fsub(acc[t], acc_m[t]));
        for r in 0..8 {
            out[t][r] = v[2 * r];
        }
    }
    out
}

/// [`dot_q4_k`] in the gemm order (`Order::Batch`) for an even `NT`, two
/// tokens per float vector: lane `2r + h` of pair `i`'s accumulators is row
/// `r` of token `2i + h`, so each fused multiply-add serves 16 outputs
/// (the one-token form repeats each row's value in both of its lanes).
/// Every output's chain is the same as in [`dot_q4_k`].
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q4_k_gemm<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8K]; NT],
    pair_sums: [&[[i32; 4]]; NT],
) -> [[f32; 8]; NT] {
    assert!(NT.is_multiple_of(2));
    let pairs = NT / 2;
    // Only the first NT / 2 entries are used.
    let (mut acc, mut acc_m) = ([S::fzero(); NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    assert!(pair_sums.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q4_K);
        prefetch_ahead::<S>(blk, layout::Q4_K);
        let (dx, dmx) = (S::rows_f16(blk), S::rows_f16(blk.add(16)));
        let (mut d, mut dmin) = ([S::fzero(); NT], [S::fzero(); NT]);
        for i in 0..pairs {
            let dy = S::fsplat2(yb(&y, 2 * i, b).d, yb(&y, 2 * i + 1, b).d);
            d[i] = S::fmul(dx, dy);
            dmin[i] = S::fmul(dmx, dy);
        }
        let (sc, mn, qs) = (
            blk.add(layout::Q4_K_SC),
            blk.add(layout::Q4_K_MN),
            blk.add(layout::Q4_K_QS),
        );
        for p in 0..4 {
            let (j0, j1) = (2 * p, 2 * p + 1);
            let (s0, s1) = (
                S::pscales::<false>(sc.add(8 * j0)),
                S::pscales::<false>(sc.add(8 * j1)),
            );
            let m01 = S::add(
                S::rows_bytes::<false>(mn.add(8 * j0), mn.add(8 * j0)),
                S::shl(S::rows_bytes::<false>(mn.add(8 * j1), mn.add(8 * j1)), 16),
            );
            let raw: [S::U; 4] = std::array::from_fn(|u| S::load(qs.add(64 * (4 * p + u))));
            let (lo, hi) = (raw.map(|r| S::nib_lo(r)), raw.map(|r| S::nib_hi(r)));
            for i in 0..pairs {
                // (No closures here: they would not inherit the target features.)
                let mut pi = [S::izero(); 2];
                for h in 0..2 {
                    let by = yb(&y, 2 * i + h, b);
                    // 4 pdots of nibbles (<= 15) per chain: 4·4·15·128 = 30720, in pscale's bound.
                    let (mut pl, mut ph) = (S::pzero(), S::pzero());
                    for u in 0..4 {
                        pl = S::pdot(pl, lo[u], a64(&by.qs, 64 * p + 8 * u));
                        ph = S::pdot(ph, hi[u], a64(&by.qs, 64 * p + 32 + 8 * u));
                    }
                    pi[h] = S::pscale_acc(S::pscale(pl, s0), ph, s1);
                }
                let (b0, b1) = (yb(&pair_sums, 2 * i, b)[p], yb(&pair_sums, 2 * i + 1, b)[p]);
                let pm = S::madd16(m01, S::splat2(b0, b1));
                acc[i] = S::fma(S::cvt(S::pair_sums2(pi[0], pi[1])), d[i], acc[i]);
                acc_m[i] = S::fma(S::cvt(pm), dmin[i], acc_m[i]);
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for i in 0..pairs {
        let v = S::fstore(S::fsub(acc[i], acc_m[i]));
        for r in 0..8 {
            out[2 * i][r] = v[2 * r];
            out[2 * i + 1][r] = v[2 * r + 1];
        }
    }
    out
}

/// Q6_K weights · Q8_K activations (`vec_dot` lanes, or the tiled per-block order).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_q6_k<S: Simd, const NT: usize>(
    w: *const u8,
    y: [&[BlockQ8K]; NT],
    order: Order,
) -> [[f32; 8]; NT] {
    let (mut lanes_acc, mut acc) = ([[S::fzero(); 4]; NT], [S::fzero(); NT]);
    assert!(y.iter().all(|r| r.len() == y[0].len()));
    for b in 0..y[0].len() {
        let blk = w.add(b * layout::Q6_K);
        prefetch_ahead::<S>(blk, layout::Q6_K);
        let (sc, ql, qh) = (
            blk.add(layout::Q6_K_SC),
            blk.add(layout::Q6_K_QL),
            blk.add(layout::Q6_K_QH),
        );
        // The multipliers of the 16 sub-blocks of 16 values.
        let sg: [S::I; 16] = std::array::from_fn(|g| S::pscales::<true>(sc.add(8 * g)));
        let mut l = [[S::izero(); 4]; NT];
        for u in 0..4 {
            for n in 0..2 {
                let h = S::load(qh.add(64 * (4 * n + u)));
                let l0 = S::load(ql.add(64 * (8 * n + u)));
                let l1 = S::load(ql.add(64 * (8 * n + 4 + u)));
                let qs = [
                    S::q6(S::nib_lo(l0), h, 0),
                    S::q6(S::nib_lo(l1), h, 2),
                    S::q6(S::nib_hi(l0), h, 4),
                    S::q6(S::nib_hi(l1), h, 6),
                ];
                for t in 0..NT {
                    let by = yb(&y, t, b);
                    for k in 0..4 {
                        // One pdot per multiplier (quants <= 63): 4·63·128, in pscale's bound.
                        let a = a64(&by.qs, 128 * n + 32 * k + 8 * u);
                        let p = S::pdot(S::pzero(), qs[k], a);
                        // Sub-block (128n + 32k + 8u) / 16.
                        l[t][u] = S::pscale_acc(l[t][u], p, sg[8 * n + 2 * k + u / 2]);
                    }
                }
            }
        }
        // Σ scale·bsum, 16-bit pairs per lane: lane (r, h) of s4[u] holds row
        // r's multipliers of groups 4u + 2h and 4u + 2h + 1, for one madd
        // against the bsums of those two groups.
        let s4: [S::I; 4] = std::array::from_fn(|u| {
            S::pack16(
                S::rows_bytes::<true>(sc.add(8 * (4 * u)), sc.add(8 * (4 * u + 2))),
                S::rows_bytes::<true>(sc.add(8 * (4 * u + 1)), sc.add(8 * (4 * u + 3))),
            )
        });
        let bsums4 = |by: &BlockQ8K, u: usize| {
            let pair = |g: usize| {
                (by.bsums[g] as u16 as u32 | (by.bsums[g + 1] as u16 as u32) << 16) as i32
            };
            S::splat2(pair(4 * u), pair(4 * u + 2))
        };
        let dx = S::rows_f16(blk);
        if order == Order::Vec {
            // Lane l (= 2u + h) subtracts 32·(bsums·scales) of groups 2l, 2l + 1.
            for t in 0..NT {
                let by = yb(&y, t, b);
                let d = S::fmul(S::fsplat(by.d), dx);
                for u in 0..4 {
                    let c = S::madd16(s4[u], bsums4(by, u));
                    let li = S::sub(l[t][u], S::shl(c, 5));
                    lanes_acc[t][u] = S::fma(d, S::cvt(li), lanes_acc[t][u]);
                }
            }
        } else {
            for t in 0..NT {
                let by = yb(&y, t, b);
                let mut c = S::madd16(s4[0], bsums4(by, 0));
                for u in 1..4 {
                    c = S::madd16_acc(c, s4[u], bsums4(by, u));
                }
                let all = S::add(S::add(l[t][0], l[t][1]), S::add(l[t][2], l[t][3]));
                let isum = S::pair_sum(S::sub(all, S::shl(c, 5)));
                let block = S::fmul(S::cvt(isum), dx);
                acc[t] = S::fma(block, S::fsplat(by.d), acc[t]);
            }
        }
    }
    let mut out = [[0.0; 8]; NT];
    for t in 0..NT {
        if order == Order::Vec {
            out[t] = hsum_rows::<S>(lanes_acc[t]);
        } else {
            let v = S::fstore(acc[t]);
            for r in 0..8 {
                out[t][r] = v[2 * r];
            }
        }
    }
    out
}

/// Tokens per tile: a tile's activations stay in cache while every group of
/// the thread's rows passes over them.
const TOKEN_TILE: usize = 32;

/// One group against tokens `t0..t0 + NT`.
#[inline(always)]
unsafe fn group_values<S: Simd, const NT: usize>(
    pm: &PackedMatrix,
    acts: &Acts,
    _n: usize,
    g: usize,
    t0: usize,
) -> [[f32; 8]; NT] {
    let nb = pm.blocks;
    let w = pm.group(g);
    let rows = |t: usize| t * nb..(t + 1) * nb;
    match acts {
        Acts::Q8_0(y, s, dy) => {
            let y = std::array::from_fn(|i| &y[rows(t0 + i)]);
            let s = std::array::from_fn(|i| &s[rows(t0 + i)]);
            let dy = std::array::from_fn(|i| &dy[rows(t0 + i)]);
            match pm.ty {
                GgmlType::Q8_0 => dot_q0::<S, NT, { q0::Q8_0 }>(w, y, s, dy),
                GgmlType::Q4_0 => dot_q0::<S, NT, { q0::Q4_0 }>(w, y, s, dy),
                _ => dot_q0::<S, NT, { q0::Q5_0 }>(w, y, s, dy),
            }
        }
        Acts::Q8_1(y) => dot_q4_1::<S, NT>(w, std::array::from_fn(|i| &y[rows(t0 + i)])),
        Acts::Q8K(y, gemm_rows, tiled, pair_sums) => {
            let ys = std::array::from_fn(|i| &y[rows(t0 + i)]);
            if pm.ty == GgmlType::Q4_K {
                // Token blocks start at multiples of 4, so a block is all gemm or all gemv.
                let sums = std::array::from_fn(|i| &pair_sums[rows(t0 + i)]);
                match (t0 < *gemm_rows, NT.is_multiple_of(2)) {
                    (true, true) => dot_q4_k_gemm::<S, NT>(w, ys, sums),
                    (true, false) => dot_q4_k::<S, NT>(w, ys, sums, Order::Batch),
                    (false, _) => dot_q4_k::<S, NT>(w, ys, sums, Order::Vec),
                }
            } else {
                dot_q6_k::<S, NT>(w, ys, if *tiled { Order::Batch } else { Order::Vec })
            }
        }
    }
}

/// One group against tokens `t0..t0 + NT`, results written to `out`.
#[inline(always)]
unsafe fn group_tokens<S: Simd, const NT: usize>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    g: usize,
    t0: usize,
    out: *mut f32,
) {
    let v = group_values::<S, NT>(pm, acts, n, g, t0);
    for (i, row) in v.iter().enumerate() {
        std::ptr::copy_nonoverlapping(row.as_ptr(), out.add((t0 + i) * pm.rows + g * GROUP), GROUP);
    }
}

/// A gated unit's activation of 8 consecutive columns from `j` (a multiple
/// of 8): `act(j, gate, up)[r]` is the output of column `j + r`. Eight at a
/// time so the activation can run on vectors.
pub type GluAct<'a> = &'a (dyn Fn(usize, &[f32; 8], &[f32; 8]) -> [f32; 8] + Sync);

/// For a [`PackedMatrix::pack_pair`] matrix: pairs of groups `pairs` for
/// `tokens` (starting at a multiple of 4), `out[t, 8i..8i + 8] = act(8i, gate, up)` (`out` is [n, rows / 2]).
#[inline(always)]
unsafe fn run_pairs<S: Simd>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    pairs: std::ops::Range<usize>,
    act: GluAct,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    let half = pm.rows / 2;
    let emit = |i: usize, t: usize, g: &[f32; 8], u: &[f32; 8]| {
        let v = act(i * GROUP, g, u);
        std::ptr::copy_nonoverlapping(v.as_ptr(), out.add(t * half + i * GROUP), GROUP);
    };
    for t0 in tokens.clone().step_by(TOKEN_TILE) {
        let t1 = (t0 + TOKEN_TILE).min(tokens.end);
        for i in pairs.clone() {
            let mut t = t0;
            while t + 4 <= t1 {
                let (g, u) = (
                    group_values::<S, 4>(pm, acts, n, 2 * i, t),
                    group_values::<S, 4>(pm, acts, n, 2 * i + 1, t),
                );
                for k in 0..4 {
                    emit(i, t + k, &g[k], &u[k]);
                }
                t += 4;
            }
            // The last 1-3 tokens in one pass over the weights too (a verify
            // block of K + 1 = 2 or 3 rows is mostly this tail).
            macro_rules! tail {
                ($nt:literal) => {{
                    let (g, u) = (
                        group_values::<S, $nt>(pm, acts, n, 2 * i, t),
                        group_values::<S, $nt>(pm, acts, n, 2 * i + 1, t),
                    );
                    for k in 0..$nt {
                        emit(i, t + k, &g[k], &u[k]);
                    }
                }};
            }
            match t1 - t {
                3 => tail!(3),
                2 => tail!(2),
                1 => tail!(1),
                _ => {}
            }
        }
    }
}

/// Computes output rows `groups` (in units of 8) for `tokens` (starting at a
/// multiple of 4).
#[inline(always)]
unsafe fn run_groups<S: Simd>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    groups: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    for t0 in tokens.clone().step_by(TOKEN_TILE) {
        let t1 = (t0 + TOKEN_TILE).min(tokens.end);
        for g in groups.clone() {
            let mut t = t0;
            while t + 4 <= t1 {
                group_tokens::<S, 4>(pm, acts, n, g, t, out);
                t += 4;
            }
            match t1 - t {
                3 => group_tokens::<S, 3>(pm, acts, n, g, t, out),
                2 => group_tokens::<S, 2>(pm, acts, n, g, t, out),
                1 => group_tokens::<S, 1>(pm, acts, n, g, t, out),
                _ => {}
            }
        }
    }
}

/// What one pool thread computes: output row groups, or pairs of groups of a
/// gate/up pair matrix through the gated activation.
pub(super) enum Work<'a> {
    Groups(std::ops::Range<usize>),
    Pairs(std::ops::Range<usize>, GluAct<'a>),
}

#[inline(always)]
pub(super) unsafe fn run_work<S: Simd>(
    pm: &PackedMatrix,
    acts: &Acts,
    n: usize,
    work: &Work,
    tokens: std::ops::Range<usize>,
    out: *mut f32,
) {
    match work {
        Work::Groups(groups) => run_groups::<S>(pm, acts, n, groups.clone(), tokens, out),
        Work::Pairs(pairs, act) => run_pairs::<S>(pm, acts, n, pairs.clone(), *act, tokens, out),
    }
}
