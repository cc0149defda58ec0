//! GEMV (every weight type and variant), GEMM and RMSNorm against the CPU reference.

use crate::common::*;
use half::{bf16, f16};
use hearth_cuda::gemm;
use hearth_cuda::ops::{self, Q8};
use hearth_cuda::repack::WeightKind;
use hearth_gguf::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// GEMV (decode, and blocks of 2-16 tokens): every weight type, odd row
/// counts, token counts that exercise each of the 1/2/4/8-column kernels.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_matches_cpu_reference() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    println!(
        "{:6} {:>5} {:>5} {:>3}  {:>10} {:>10}",
        "type", "rows", "K", "T", "nrmse(q8)", "nrmse(f32)"
    );
    for ty in TYPES {
        for &(rows, k, t) in &[
            (77usize, 256usize, 1usize),
            (301, 1024, 3),
            (1000, 2560, 8),
            (33, 512, 13),
            (45, 17408, 7),
        ] {
            let w = random_weights(ty, rows, k, &mut rng);
            let mut wf = vec![0.0f32; rows * k];
            hearth_kernels::dequantize(ty, &w, &mut wf).unwrap();
            let x: Vec<f32> = (0..t * k)
                .map(|i| rng.gen_range(-1.0f32..1.0) * (1.0 + (i % 7) as f32))
                .collect();
            let (m, _b, _s) = upload_matrix(&g, ty, rows, k, &w);
            let (a8, _bufs) = quantized_on_device(&g, &x);
            let y = upload_f32(&g, &vec![f32::NAN; t * rows]);
            ops::gemv(&g, &m, a8, t, y.ptr, rows, 0, 0).unwrap();
            let got = download_f32(&g, &y, t * rows);
            let xq = q8_reference(&x);
            let reference = |xs: &[f32]| -> Vec<f64> {
                (0..t)
                    .flat_map(|ti| (0..rows).map(move |r| (ti, r)))
                    .map(|(ti, r)| {
                        (0..k)
                            .map(|j| wf[r * k + j] as f64 * xs[ti * k + j] as f64)
                            .sum()
                    })
                    .collect()
            };
            let (e_q8, e_f32) = (nrmse(&got, &reference(&xq)), nrmse(&got, &reference(&x)));
            println!(
                "{:6} {rows:5} {k:5} {t:3}  {e_q8:10.2e} {e_f32:10.2e}",
                ty.name()
            );
            // Same quantized activations: only f32 summation order differs.
            assert!(e_q8 < 1e-4, "{ty:?} {rows}x{k} T={t}: {e_q8}");
            // Against exact activations: the 8-bit activation error (~1/254 per value, averaged).
            assert!(e_f32 < 2e-2, "{ty:?} {rows}x{k} T={t}: {e_f32}");
            // Every single-token variant the tuner may pick computes the same function.
            if t == 1 {
                let want = reference(&xq);
                for tune in ops::gemv_variants(g.info.sm_count as u32) {
                    let yv = upload_f32(&g, &vec![f32::NAN; rows]);
                    ops::gemv_single(&g, &m, tune, a8, yv.ptr, rows, 0, 0).unwrap();
                    let ev = nrmse(&download_f32(&g, &yv, rows), &want);
                    assert!(ev < 1e-4, "{ty:?} {rows}x{k} variant {tune:?}: {ev}");
                }
            }
            // The register-activation kernels: every tuned variant for one
            // token, and the 4/2/1-token launches writing a matrix cut into
            // three outputs with their own biases (a fused q|k|v).
            let xv = ops::gemv_x_variants(&m, g.info.sm_count as u32);
            let want = reference(&xq);
            if t == 1 {
                for &tune in &xv {
                    let yv = upload_f32(&g, &vec![f32::NAN; rows]);
                    ops::gemv_single(&g, &m, tune, a8, yv.ptr, rows, 0, 0).unwrap();
                    let ev = nrmse(&download_f32(&g, &yv, rows), &want);
                    assert!(ev < 1e-4, "{ty:?} {rows}x{k} variant {tune:?}: {ev}");
                }
            }
            if let Some(&first) = xv.first() {
                let mut mx = m;
                mx.tune = first;
                let cuts = [0, rows / 3, rows / 3 + rows / 4, rows];
                let bias: Vec<f32> = (0..rows).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
                let mut bufs = Vec::new();
                let mut segs = Vec::new();
                for w in cuts.windows(2) {
                    let n = w[1] - w[0];
                    let yb = upload_f32(&g, &vec![f32::NAN; t * n]);
                    let bb = upload_f32(&g, &bias[w[0]..w[1]]);
                    segs.push(ops::Segment {
                        y: yb.ptr,
                        bias: bb.ptr,
                        rows: n,
                    });
                    bufs.push((yb, bb, w[0], n));
                }
                ops::gemv_segments(&g, &mx, a8, t, &segs, 0).unwrap();
                let mut got = vec![0.0f32; t * rows];
                for (yb, _, lo, n) in &bufs {
                    let part = download_f32(&g, yb, t * n);
                    for ti in 0..t {
                        got[ti * rows + lo..ti * rows + lo + n]
                            .copy_from_slice(&part[ti * n..(ti + 1) * n]);
                    }
                }
                let want_b: Vec<f64> = want
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v + bias[i % rows] as f64)
                    .collect();
                let ev = nrmse(&got, &want_b);
                println!(
                    "{:6} {rows:5} {k:5} {t:3}  {ev:10.2e} (register kernels, 3 outputs)",
                    ty.name()
                );
                assert!(
                    ev < 1e-4,
                    "{ty:?} {rows}x{k} T={t} register kernels, segments: {ev}"
                );
            }
        }
    }
}

/// Tensor-core GEMM (prefill): every weight type, rows and tokens that are
/// not multiples of the 128 x 128 tile (odd token counts 17..512, rows from
/// 77 to 300, several k steps), f16 and bf16. Reference: the same weights and
/// activations rounded to f16 / bf16 (the kernel's operand precision), f64 sums.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_matches_cpu_reference() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    println!(
        "{:6} {:>5} {:>5} {:>4} {:>5} {:>10}",
        "type", "rows", "K", "T", "prec", "nrmse"
    );
    // The small shapes all take the split-K path (their grid fits one round);
    // the last case, 71 x 4 tiles, takes the one-block-per-tile path.
    let big = [(9000usize, 256usize, 512usize, false)];
    let cases = |ty: GgmlType| {
        let mut v = vec![
            (77usize, 256usize, 100usize, false),
            (200, 512, 37, true),
            (130, 1024, 300, false),
            (300, 768, 17, true),
            (129, 512, 512, false),
            (257, 256, 129, true),
        ];
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            v.extend(big);
        }
        v
    };
    for ty in TYPES {
        for (rows, k, t, bf) in cases(ty) {
            let w = random_weights(ty, rows, k, &mut rng);
            let mut wf = vec![0.0f32; rows * k];
            hearth_kernels::dequantize(ty, &w, &mut wf).unwrap();
            let x: Vec<f32> = (0..t * k).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let (m, _b, _s) = upload_matrix(&g, ty, rows, k, &w);
            let xb = upload_f32(&g, &x);
            let y = upload_f32(&g, &vec![f32::NAN; t * rows]);
            let xh = g.alloc(t * k * 2, "t").unwrap();
            gemm::gemm(&g, &m, xb.ptr, xh.ptr, t, y.ptr, rows, 0, 0, bf).unwrap();
            let got = download_f32(&g, &y, t * rows);
            let round = |v: f32| {
                if bf {
                    bf16::from_f32(v).to_f32()
                } else {
                    f16::from_f32(v).to_f32()
                }
            };
            let (wr, xr): (Vec<f32>, Vec<f32>) = (
                wf.iter().map(|&v| round(v)).collect(),
                x.iter().map(|&v| round(v)).collect(),
            );
            let want: Vec<f64> = (0..t)
                .flat_map(|ti| (0..rows).map(move |r| (ti, r)))
                .map(|(ti, r)| {
                    (0..k)
                        .map(|j| wr[r * k + j] as f64 * xr[ti * k + j] as f64)
                        .sum()
                })
                .collect();
            let e = nrmse(&got, &want);
            println!(
                "{:6} {rows:5} {k:5} {t:4} {:>5} {e:10.2e}",
                ty.name(),
                if bf { "bf16" } else { "f16" }
            );
            assert!(e < 1e-3, "{ty:?} {rows}x{k} T={t}: {e}");
        }
    }
}

/// RMSNorm (llama style and Muse Glimmer's bf16 RMS_w) with the fused 8-bit
/// quantization, against the CPU's `blocks::rmsnorm`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn rmsnorm_matches_cpu_reference() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for &(rows, dim, muse) in &[(3usize, 6656usize, true), (5, 5120, false), (1, 96, false)] {
        let x: Vec<f32> = (0..rows * dim)
            .map(|_| rng.gen_range(-3.0f32..3.0))
            .collect();
        let gain: Vec<f32> = (0..dim).map(|_| rng.gen_range(0.5f32..1.5)).collect();
        let (xb, gb) = (upload_f32(&g, &x), upload_f32(&g, &gain));
        let out = upload_f32(&g, &vec![f32::NAN; rows * dim]);
        let flags = if muse { ops::NORM_BF16_GAIN } else { 0 };
        ops::rmsnorm(&g, xb.ptr, out.ptr, gb.ptr, rows, dim, 1e-5, flags, None).unwrap();
        let got = download_f32(&g, &out, rows * dim);
        let mut want = x.clone();
        if muse {
            hearth_models::blocks::rmsnorm(&mut want, dim, None, 1e-5);
            hearth_models::blocks::round_bf16(&mut want);
            let gr: Vec<f32> = gain.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
            for row in want.chunks_exact_mut(dim) {
                row.iter_mut()
                    .zip(&gr)
                    .for_each(|(v, g)| *v = bf16::from_f32(*v * g).to_f32());
            }
        } else {
            hearth_models::blocks::rmsnorm(&mut want, dim, Some(&gain), 1e-5);
        }
        let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        let e = nrmse(&got, &want64);
        println!("rmsnorm rows {rows} dim {dim} muse {muse}: nrmse {e:.2e}");
        // bf16 outputs can differ by one bf16 ulp where f32 sums round differently.
        assert!(e < if muse { 2e-3 } else { 1e-5 }, "{e}");
    }
}

/// `gemv_tokens` (the verify pass's products) against one-token launches:
/// for every weight type and every one-token variant the tuner may pick
/// (warp, rows-per-warp and register kernels, with their grids), T tokens in
/// one launch give bit for bit what T one-token launches of that variant give.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_tokens_equal_one_token_launches_for_every_variant() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let sm = g.info.sm_count as u32;
    let mut checked = 0;
    for ty in TYPES {
        for &(rows, k, t) in &[
            (301usize, 1024usize, 13usize),
            (1000, 896, 8),
            (77, 4864, 5),
        ] {
            if k % WeightKind::of(ty).unwrap().k_multiple() != 0 {
                continue;
            }
            let w = random_weights(ty, rows, k, &mut rng);
            let (mut m, _b, _s) = upload_matrix(&g, ty, rows, k, &w);
            let x: Vec<f32> = (0..t * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let (a8, _bufs) = quantized_on_device(&g, &x);
            let mut variants = ops::gemv_variants(sm);
            variants.extend(ops::gemv_x_variants(&m, sm));
            for tune in variants {
                m.tune = tune;
                let one = upload_f32(&g, &vec![f32::NAN; t * rows]);
                for ti in 0..t {
                    let xa = Q8 {
                        q: a8.q + (ti * k) as u64,
                        d: a8.d + (ti * k / 32 * 4) as u64,
                        s: a8.s + (ti * k / 32 * 4) as u64,
                    };
                    ops::gemv_single(
                        &g,
                        &m,
                        tune,
                        xa,
                        one.ptr + (ti * rows * 4) as u64,
                        rows,
                        0,
                        0,
                    )
                    .unwrap();
                }
                let many = upload_f32(&g, &vec![f32::NAN; t * rows]);
                let seg = [ops::Segment {
                    y: many.ptr,
                    bias: 0,
                    rows,
                }];
                ops::gemv_tokens(&g, &m, a8, t, &seg, 0).unwrap();
                let (a, b) = (
                    download_f32(&g, &one, t * rows),
                    download_f32(&g, &many, t * rows),
                );
                let differ = a
                    .iter()
                    .zip(&b)
                    .filter(|(p, q)| p.to_bits() != q.to_bits())
                    .count();
                assert_eq!(
                    differ, 0,
                    "{ty:?} {rows}x{k} T={t} {tune:?}: {differ} values differ"
                );
                checked += 1;
            }
        }
    }
    println!(
        "gemv_tokens: {checked} (type, shape, variant) cases bit-identical to one-token launches"
    );
}
