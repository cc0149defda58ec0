//! Activations quantized once per matmul, in the block type and order the
//! packed kernels read.

use super::*;

/// Fills `out` (`n` tokens of `per_token` items) with `f(t, token's items)`,
/// tokens split across the pool.
fn par_tokens<B: Send>(out: &mut [B], n: usize, f: impl Fn(usize, &mut [B]) + Sync) {
    let per_token = out.len() / n.max(1);
    let ptr = SendPtr(out.as_mut_ptr());
    let work = |range: std::ops::Range<usize>| {
        for t in range {
            // SAFETY: token t's items are written by one thread only.
            let items =
                unsafe { std::slice::from_raw_parts_mut(ptr.get().add(t * per_token), per_token) };
            f(t, items);
        }
    };
    let work = &work;
    if n < 4 {
        work(0..n);
    } else {
        pool::global().run(|i, nt| work(pool::share(n, i, nt)));
    }
}

pub(super) fn quantize_acts(
    ty: GgmlType,
    x: &[f32],
    n: usize,
    cols: usize,
    order: RowOrder,
) -> Acts {
    use GgmlType::*;
    let row = |t: usize| &x[t * cols..(t + 1) * cols];
    match ty {
        Q8_0 | Q4_0 | Q5_0 => {
            let mut b = vec![BlockQ8_0::default(); n * cols / QK];
            par_tokens(&mut b, n, |t, out| quantize_row_q8_0_x86(row(t), out));
            // Unsigned Q4_0/Q5_0 quants carry an offset: Σ (q - off)·a = Σ q·a - off·Σ a.
            let off = match ty {
                Q4_0 => 8,
                Q5_0 => 16,
                _ => 0,
            };
            let corr = b
                .iter()
                .map(|blk| {
                    std::array::from_fn(|g| {
                        -off * blk.qs[4 * g..4 * g + 4]
                            .iter()
                            .map(|&q| q as i32)
                            .sum::<i32>()
                    })
                })
                .collect();
            let dy = b.iter().map(|blk| blk.d.to_f32()).collect();
            Acts::Q8_0(b, corr, dy)
        }
        Q4_1 => {
            let mut b = vec![BlockQ8_1::default(); n * cols / QK];
            par_tokens(&mut b, n, |t, out| quantize_row_q8_1_ref(row(t), out));
            Acts::Q8_1(b)
        }
        Q4_K | Q6_K => {
            let invariant = order == RowOrder::Invariant;
            let gemm_rows = if ty == Q4_K && !invariant {
                n - n % 4
            } else {
                0
            };
            let mut b = vec![BlockQ8K::default(); n * cols / QK_K];
            par_tokens(&mut b, n, |t, out| {
                if t < gemm_rows {
                    quantize_row_q8_k_mat_x86(row(t), out);
                } else {
                    quantize_row_q8_k_x86(row(t), out);
                }
            });
            let pair_sums = if ty == Q4_K {
                b.iter().map(sub_block_sum_pairs).collect()
            } else {
                Vec::new()
            };
            Acts::Q8K(b, gemm_rows, n >= 8 && !invariant, pair_sums)
        }
        _ => unreachable!("packed types only"),
    }
}

/// A Q8_K block's sums of its 32-value sub-blocks `2p` and `2p + 1` as the
/// low and high 16 bits of word `p` (|32 · 128| fits 16 bits).
fn sub_block_sum_pairs(by: &BlockQ8K) -> [i32; 4] {
    let bs = |j: usize| (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32) as u16 as u32;
    std::array::from_fn(|p| (bs(2 * p) | bs(2 * p + 1) << 16) as i32)
}
