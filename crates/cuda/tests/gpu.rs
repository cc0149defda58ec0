//! GPU tests: each kernel family against a CPU reference on random inputs of
//! odd sizes, and whole-model logits of the CUDA backend against the CPU
//! backend on synthetic qwen2 and muse-glimmer models. They need a CUDA GPU
//! and are ignored elsewhere; on the GPU machine run
//! `cargo test -p hearth-cuda --release --test gpu -- --ignored --nocapture`
//! (or the built test binary with `--ignored --nocapture --test-threads 1`).
//!
//! The error measure is the normalised RMS error ‖gpu − ref‖ / ‖ref‖ (as
//! llama.cpp's test-backend-ops uses), computed in f64.

use std::sync::Arc;

use half::{bf16, f16};
use hearth_cuda::driver::{DevBuf, Gpu};
use hearth_cuda::ops::{self, GpuMatrix, Q8};
use hearth_cuda::repack::{split_blocks, split_sizes, WeightKind};
use hearth_cuda::{gemm, GpuModel};
use hearth_gguf::GgmlType;
use hearth_models::synth::{write_gguf_file, SynthPlan, SynthShape};
use hearth_models::{Architecture, Logits, Model, Numerics};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> Arc<Gpu> {
    Arc::new(Gpu::open().unwrap_or_else(|e| panic!("{e}")))
}

fn nrmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += (g as f64 - w) * (g as f64 - w);
        den += w * w;
    }
    (num / den.max(1e-300)).sqrt()
}

fn upload_f32(g: &Gpu, v: &[f32]) -> DevBuf {
    let b = g.alloc(v.len() * 4, "test").unwrap();
    g.upload(b.ptr, v).unwrap();
    b
}

fn download_f32(g: &Gpu, b: &DevBuf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    g.download(&mut out, b.ptr).unwrap();
    out
}

/// Random GGUF blocks of `ty` for a [rows, cols] matrix: random quant bits,
/// and f16 scales set to finite values of a realistic size.
fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| rng.gen_range(-1.0f32..1.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes())
            .collect(),
        _ => {
            let (bs, bb) = (ty.block_size(), ty.type_size());
            let mut bytes: Vec<u8> = (0..n / bs * bb).map(|_| rng.gen()).collect();
            let scale_fields: &[usize] = match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                _ => &[0],
            };
            for blk in bytes.chunks_exact_mut(bb) {
                for &o in scale_fields {
                    let v = f16::from_f32(rng.gen_range(0.001f32..0.02));
                    blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            bytes
        }
    }
}

fn upload_matrix(
    g: &Gpu,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &[u8],
) -> (GpuMatrix, DevBuf, DevBuf) {
    let kind = WeightKind::of(ty).unwrap();
    let n_blocks = rows * cols / kind.block().0;
    let (nb, ns) = split_sizes(kind, n_blocks);
    let (mut body, mut scales) = (vec![0u8; nb], vec![0u8; ns]);
    split_blocks(kind, data, &mut body, &mut scales);
    let bb = g.alloc(nb, "test").unwrap();
    g.upload(bb.ptr, &body).unwrap();
    let sb = g.alloc(ns, "test").unwrap();
    g.upload(sb.ptr, &scales).unwrap();
    let m = GpuMatrix {
        kind,
        rows,
        cols,
        body: bb.ptr,
        scales: if ns > 0 { sb.ptr } else { 0 },
        tune: Default::default(),
        scale: None,
    };
    (m, bb, sb)
}

/// `x` ([t, k]) on the device, quantized by the kernels' `quantize_q8`; the
/// buffers (kept alive by the caller) and their 8-bit view.
fn quantized_on_device(g: &Gpu, x: &[f32]) -> (Q8, [DevBuf; 4]) {
    let n = x.len();
    let xb = upload_f32(g, x);
    let aq = g.alloc(n, "t").unwrap();
    let ad = g.alloc(n / 32 * 4, "t").unwrap();
    let as_ = g.alloc(n / 32 * 4, "t").unwrap();
    let a8 = Q8 {
        q: aq.ptr,
        d: ad.ptr,
        s: as_.ptr,
    };
    ops::quantize_q8(g, xb.ptr, a8, n).unwrap();
    (a8, [xb, aq, ad, as_])
}

/// The activation quantization the kernels apply, written independently:
/// per 32 values d = amax/127, q = round(x/d) (halves away from zero).
fn q8_reference(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (blk, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(32)) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (v, o) in blk.iter().zip(o) {
            *o = (v * id).round() * d;
        }
    }
    out
}

const TYPES: [GgmlType; 9] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

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

/// Attention over flat and ring caches, GQA groups 1..16, head dims 64,
/// 128 or 256, one token (split-K decode) and blocks of tokens, against a CPU
/// softmax over the same cached (f16 / bf16) keys and values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_matches_cpu_reference() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    println!(
        "{:>3} {:>3} {:>4} {:>6} {:>6} {:>5} {:>3} {:>6} {:>10}",
        "nh", "nkv", "hd", "slots", "window", "pos", "T", "splits", "nrmse"
    );
    struct Case {
        nh: usize,
        nkv: usize,
        hd: usize,
        slots: usize,
        window: usize,
        pos0: usize,
        t: usize,
        splits: usize,
        bf: bool,
    }
    let cases = [
        Case {
            nh: 40,
            nkv: 8,
            hd: 128,
            slots: 5000,
            window: 0,
            pos0: 4321,
            t: 1,
            splits: 37,
            bf: false,
        },
        Case {
            nh: 32,
            nkv: 2,
            hd: 128,
            slots: 3000,
            window: 0,
            pos0: 2999,
            t: 1,
            splits: 512,
            bf: true,
        },
        Case {
            nh: 32,
            nkv: 2,
            hd: 128,
            slots: 2048 + 512,
            window: 2048,
            pos0: 7777,
            t: 1,
            splits: 16,
            bf: true,
        },
        Case {
            nh: 4,
            nkv: 2,
            hd: 64,
            slots: 16 + 512,
            window: 16,
            pos0: 1000,
            t: 7,
            splits: 2,
            bf: true,
        },
        Case {
            nh: 6,
            nkv: 6,
            hd: 64,
            slots: 700,
            window: 0,
            pos0: 300,
            t: 11,
            splits: 3,
            bf: false,
        },
        Case {
            nh: 40,
            nkv: 8,
            hd: 128,
            slots: 1000,
            window: 0,
            pos0: 0,
            t: 200,
            splits: 1,
            bf: false,
        },
        // Head dim 256 (gemma3; dynamic shared memory): decode on a wrapped
        // sliding ring with MQA (G = 4), and a prefill block.
        Case {
            nh: 4,
            nkv: 1,
            hd: 256,
            slots: 512 + 512,
            window: 512,
            pos0: 1500,
            t: 1,
            splits: 8,
            bf: false,
        },
        Case {
            nh: 8,
            nkv: 2,
            hd: 256,
            slots: 900,
            window: 0,
            pos0: 100,
            t: 77,
            splits: 2,
            bf: false,
        },
        // Decode, G = 1, long context, many splits.
        Case {
            nh: 8,
            nkv: 8,
            hd: 128,
            slots: 6100,
            window: 0,
            pos0: 6000,
            t: 1,
            splits: 96,
            bf: false,
        },
        // Decode, G = 5, 64 splits (the 32K shape), hd 64, bf16.
        Case {
            nh: 40,
            nkv: 8,
            hd: 64,
            slots: 5200,
            window: 0,
            pos0: 5100,
            t: 1,
            splits: 64,
            bf: true,
        },
        // Verify blocks: T = 2 (10 rows: the decode kernel), 5 (25 rows), 8 with
        // G = 16 (128 rows: two row blocks), 16 on a wrapped ring (G = 1: 16
        // rows), 16 with G = 5 (80 rows).
        Case {
            nh: 40,
            nkv: 8,
            hd: 128,
            slots: 4000,
            window: 0,
            pos0: 3000,
            t: 2,
            splits: 16,
            bf: false,
        },
        Case {
            nh: 40,
            nkv: 8,
            hd: 128,
            slots: 5200,
            window: 0,
            pos0: 5000,
            t: 5,
            splits: 64,
            bf: true,
        },
        Case {
            nh: 32,
            nkv: 2,
            hd: 64,
            slots: 2600,
            window: 0,
            pos0: 2500,
            t: 8,
            splits: 32,
            bf: false,
        },
        Case {
            nh: 8,
            nkv: 8,
            hd: 64,
            slots: 512 + 512,
            window: 512,
            pos0: 1234,
            t: 16,
            splits: 4,
            bf: true,
        },
        Case {
            nh: 40,
            nkv: 8,
            hd: 128,
            slots: 800,
            window: 0,
            pos0: 777,
            t: 16,
            splits: 8,
            bf: false,
        },
        // Prefill blocks: 512 tokens from 0; 300 from 700 (G = 16); 512 on a
        // wrapped ring (window 256).
        Case {
            nh: 40,
            nkv: 8,
            hd: 128,
            slots: 600,
            window: 0,
            pos0: 0,
            t: 512,
            splits: 2,
            bf: false,
        },
        Case {
            nh: 16,
            nkv: 1,
            hd: 64,
            slots: 1100,
            window: 0,
            pos0: 700,
            t: 300,
            splits: 3,
            bf: true,
        },
        Case {
            nh: 8,
            nkv: 2,
            hd: 128,
            slots: 256 + 512,
            window: 256,
            pos0: 2000,
            t: 512,
            splits: 2,
            bf: false,
        },
    ];
    for c in &cases {
        let rows = c.nkv * c.slots * c.hd;
        let kv_f: Vec<f32> = (0..2 * rows).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let enc = |v: f32| {
            if c.bf {
                bf16::from_f32(v).to_bits()
            } else {
                f16::from_f32(v).to_bits()
            }
        };
        let dec = |u: u16| {
            if c.bf {
                bf16::from_bits(u).to_f32()
            } else {
                f16::from_bits(u).to_f32()
            }
        };
        let kv_u: Vec<u16> = kv_f.iter().map(|&v| enc(v)).collect();
        let kb = g.alloc(rows * 2, "t").unwrap();
        let vb = g.alloc(rows * 2, "t").unwrap();
        g.upload(kb.ptr, &kv_u[..rows]).unwrap();
        g.upload(vb.ptr, &kv_u[rows..]).unwrap();
        // The kernel multiplies q in the cache's 16-bit type (as the CPU
        // reference, ggml's flash attention, does for f16 caches; Muse
        // Glimmer's q is bf16-rounded already): the test's q is representable.
        let q: Vec<f32> = (0..c.t * c.nh * c.hd)
            .map(|_| dec(enc(rng.gen_range(-1.0f32..1.0))))
            .collect();
        let kv_d: Vec<f32> = kv_u.iter().map(|&u| dec(u)).collect();
        let qb = upload_f32(&g, &q);
        let pos = g.alloc(4, "t").unwrap();
        g.upload(pos.ptr, &[c.pos0 as i32]).unwrap();
        let part_o = g.alloc(c.t * c.nh * c.splits * c.hd * 4, "t").unwrap();
        let part_ml = g.alloc(c.t * c.nh * c.splits * 2 * 4, "t").unwrap();
        let out = upload_f32(&g, &vec![f32::NAN; c.t * c.nh * c.hd]);
        let scale = 1.0 / (c.hd as f32).sqrt();
        let args = ops::AttnArgs {
            n_heads: c.nh,
            n_kv: c.nkv,
            head_dim: c.hd,
            slots: c.slots,
            window: c.window,
            scale,
            kv: if c.bf {
                ops::KvKind::Bf16
            } else {
                ops::KvKind::F16
            },
        };
        ops::attention(
            &g,
            &args,
            c.t,
            c.splits,
            qb.ptr,
            kb.ptr,
            vb.ptr,
            pos.ptr,
            part_o.ptr,
            part_ml.ptr,
            out.ptr,
            0,
            None,
        )
        .unwrap();
        let got = download_f32(&g, &out, c.t * c.nh * c.hd);
        let group = c.nh / c.nkv;
        let mut want = vec![0.0f64; got.len()];
        for t in 0..c.t {
            let qp = c.pos0 + t;
            let lo = if c.window > 0 {
                (qp + 1).saturating_sub(c.window)
            } else {
                0
            };
            for h in 0..c.nh {
                let kvh = h / group;
                let at =
                    |p: usize, which: usize| which * rows + (kvh * c.slots + p % c.slots) * c.hd;
                let qh = &q[(t * c.nh + h) * c.hd..][..c.hd];
                let scores: Vec<f64> = (lo..=qp)
                    .map(|p| {
                        (0..c.hd)
                            .map(|d| qh[d] as f64 * kv_d[at(p, 0) + d] as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..c.hd {
                    want[(t * c.nh + h) * c.hd + d] = (lo..=qp)
                        .zip(&e)
                        .map(|(p, w)| w * kv_d[at(p, 1) + d] as f64)
                        .sum::<f64>()
                        / sum;
                }
            }
        }
        let e = nrmse(&got, &want);
        println!(
            "{:3} {:3} {:4} {:6} {:6} {:5} {:3} {:6} {e:10.2e}",
            c.nh, c.nkv, c.hd, c.slots, c.window, c.pos0, c.t, c.splits
        );
        assert!(
            e < 1e-4,
            "attention case nh={} window={} pos={} T={}: {e}",
            c.nh,
            c.window,
            c.pos0,
            c.t
        );
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

/// The model twice: with its reference numerics (the CPU backend as shipped)
/// and with exact f32 numerics (no 8-bit rounding anywhere).
fn synth_models(shape: SynthShape, seed: u64) -> (Arc<Model>, Model) {
    plan_models(SynthPlan::new(&shape).unwrap(), seed)
}

fn plan_models(plan: SynthPlan, seed: u64) -> (Arc<Model>, Model) {
    let shape = plan.shape.clone();
    let path = std::env::temp_dir().join(format!(
        "hearth-cuda-test-{}-{seed}-{}.gguf",
        shape.arch.gguf_name(),
        std::process::id()
    ));
    write_gguf_file(&plan, seed, &path).unwrap();
    let m = Model::load(&path).unwrap();
    let mut exact = Model::load(&path).unwrap();
    exact.set_numerics(Numerics::F32);
    let _ = std::fs::remove_file(&path);
    (Arc::new(m), exact)
}

/// Runs the same token sequence through the CPU and CUDA backends: a prefill
/// block (tensor-core GEMM path), single decode tokens (graph replay), and a
/// 5-token block (the small-block GEMV path), comparing every logits row.
///
/// Bit-exact agreement is not expected: the backends round at different
/// points (the GPU quantizes activations to 8 bits per 32 values for its
/// GEMV, or to f16/bf16 for its GEMM; the CPU to 8 bits per 256 for
/// llama-family models, or not at all for Muse Glimmer). How far apart two
/// valid roundings land depends on the model, so the bound is measured on
/// the model itself: the CPU's reference numerics against its exact-f32
/// numerics. The GPU must stay within twice that distance of the CPU
/// reference, on every row.
fn compare_model(name: &str, model: Arc<Model>, exact: Model) {
    let g = gpu();
    let gm = GpuModel::upload(g, model.clone(), false).unwrap();
    let vocab = model.config.vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let tokens: Vec<u32> = (0..580).map(|_| rng.gen_range(0..vocab as u32)).collect();
    // Longer than a GPU ring (window + 512 slots), so sliding layers wrap.
    let ctx = 1024;
    let mut cs = model.new_state(ctx);
    let mut es = exact.new_state(ctx);
    let mut gs = gm.new_state(ctx).unwrap();
    let steps: Vec<(&[u32], Logits)> = vec![
        (&tokens[..40], Logits::All),
        (&tokens[40..560], Logits::Last),
        (&tokens[560..561], Logits::Last),
        (&tokens[561..562], Logits::Last),
        (&tokens[562..563], Logits::Last),
        (&tokens[563..568], Logits::All),
        (&tokens[568..569], Logits::Last),
        (&tokens[569..580], Logits::Last),
    ];
    let (mut worst_gpu, mut worst_gpu_exact, mut spread, mut rows, mut agree) =
        (0.0f64, 0.0f64, 0.0f64, 0usize, 0usize);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (j, &x)| if x > b.1 { (j, x) } else { b },
            )
            .0
    };
    for (i, (toks, want)) in steps.iter().enumerate() {
        let c = model.forward(&mut cs, toks, *want).unwrap();
        let e = exact.forward(&mut es, toks, *want).unwrap();
        let gpu_logits = gm.forward(&mut gs, toks, *want).unwrap();
        assert_eq!(c.len(), gpu_logits.len());
        let n_rows = c.len() / vocab;
        for r in 0..n_rows {
            let (cr, er, gr) = (
                &c[r * vocab..][..vocab],
                &e[r * vocab..][..vocab],
                &gpu_logits[r * vocab..][..vocab],
            );
            let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let (e_gpu, e_gpu_exact, e_cpu) = (
                nrmse(gr, &to64(cr)),
                nrmse(gr, &to64(er)),
                nrmse(cr, &to64(er)),
            );
            agree += (argmax(cr) == argmax(gr)) as usize;
            rows += 1;
            worst_gpu = worst_gpu.max(e_gpu);
            worst_gpu_exact = worst_gpu_exact.max(e_gpu_exact);
            spread = spread.max(e_cpu);
            if r == 0 || r + 1 == n_rows {
                println!(
                    "{name} step {i} ({} tokens, row {r}): nrmse gpu-cpu {e_gpu:.2e}, gpu-exact {e_gpu_exact:.2e}, cpu-exact {e_cpu:.2e}; argmax cpu {} gpu {}",
                    toks.len(),
                    argmax(cr),
                    argmax(gr)
                );
            }
        }
    }
    println!(
        "{name}: {rows} logits rows; worst nrmse gpu vs cpu {worst_gpu:.2e} (bound 2 x {spread:.2e}), gpu vs exact f32 {worst_gpu_exact:.2e}; argmax agreement {agree}/{rows}"
    );
    assert!(
        worst_gpu < 2.0 * spread,
        "{name}: worst nrmse {worst_gpu} vs bound {}",
        2.0 * spread
    );
    assert_eq!(gs.pos, cs.pos);
}

/// The synthetic qwen2 shape of the whole-model GPU tests (GQA 8/2, 4 layers).
fn small_qwen2() -> SynthShape {
    SynthShape {
        n_layers: 4,
        dim: 512,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        ffn_dim: 1536,
        vocab_size: 1000,
        ..SynthShape::small(Architecture::Qwen2)
    }
}

/// Decoding is deterministic and does not depend on how a step is launched:
/// the same tokens give bit-identical logits on a repeat, with the decode
/// step run as the persistent kernel (one launch), replayed from a CUDA graph
/// or launched kernel by kernel, with programmatic dependent launch on or
/// off, and when each single-token step asks for `Logits::All` (what a
/// speculative verify pass of one token does). Both small-model shapes: a
/// qwen2 (flat caches, biases), and a gemma3 (sliding windows of 16 keys
/// over 84 positions, QK-norm, sandwich norms, GELU, head dim 256).
#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_is_deterministic_across_launch_modes() {
    use std::sync::atomic::Ordering::Relaxed;
    let g = gpu();
    for (name, shape) in [("qwen2", small_qwen2()), ("gemma3", small_gemma3())] {
        let (m, _) = synth_models(shape, 12);
        let gm = GpuModel::upload_with(g.clone(), m, false, true).unwrap();
        assert!(
            gm.persistent,
            "{name}: the persistent kernel runs these weights"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let tokens: Vec<u32> = (0..84).map(|_| rng.gen_range(0..500u32)).collect();
        let pdl_available = g.pdl.load(Relaxed);
        let run = |persistent: bool, graph: bool, pdl: bool, want: Logits| -> Vec<f32> {
            g.pdl.store(pdl && pdl_available, Relaxed);
            let mut st = gm.new_state(256).unwrap();
            st.use_graph = graph;
            st.use_persistent = persistent;
            let mut out = gm.forward(&mut st, &tokens[..20], Logits::Last).unwrap();
            for &t in &tokens[20..] {
                out.extend(gm.forward(&mut st, &[t], want).unwrap());
            }
            out
        };
        let base = run(true, true, true, Logits::Last);
        let mut st = gm.new_state(256).unwrap();
        gm.forward(&mut st, &tokens[..2], Logits::Last).unwrap();
        gm.forward(&mut st, &tokens[2..3], Logits::Last).unwrap();
        let (ops, barriers) = st
            .persistent_program()
            .expect("decode steps ran the persistent kernel");
        println!("{name}: persistent program of {ops} operations, {barriers} grid barriers");
        for (persistent, graph, pdl, want) in [
            (true, true, true, Logits::Last),
            (false, true, true, Logits::Last),
            (false, false, true, Logits::Last),
            (false, true, false, Logits::Last),
            (false, false, false, Logits::Last),
            (true, true, true, Logits::All),
        ] {
            let got = run(persistent, graph, pdl, want);
            let differing = base
                .iter()
                .zip(&got)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            println!(
                "{name}: persistent {persistent} graph {graph} pdl {pdl} {want:?}: {differing} of {} logits differ from the first run",
                got.len()
            );
            assert_eq!(
                differing, 0,
                "{name}: persistent {persistent} graph {graph} pdl {pdl} {want:?}"
            );
        }
        g.pdl.store(pdl_available, Relaxed);
    }
}

/// Whole-model logits, synthetic qwen2 (Q4_K_M mix, biases, NeoX RoPE, GQA).
#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen2_logits_match_cpu() {
    let shape = small_qwen2();
    let (m, exact) = synth_models(shape, 11);
    compare_model("qwen2", m, exact);
}

/// Whole-model logits, synthetic muse-glimmer in llama.cpp's layout
/// (sliding-window ring caches with wrap-around, full NoPE layers, QK-norm
/// with gains, output gate, sandwich norms, logit scale and soft-cap from
/// the metadata). The window (16) is shorter than the sequence, so the rings
/// wrap.
#[test]
#[ignore = "needs a CUDA GPU"]
fn muse_glimmer_logits_match_cpu() {
    let (m, exact) = synth_models(muse_shape(), 12);
    compare_model("muse-glimmer", m, exact);
}

/// Whole-model logits, synthetic gemma3 (llama.cpp's layout): head dim 256
/// (the dynamic-shared-memory attention kernels), MQA, q/k norms, sandwich
/// norms, embeddings scaled by sqrt(dim), the GELU-gated MLP (ggml's f16
/// GELU table), q scaled before attention on the CPU and in the softmax on
/// the GPU, five sliding layers (window 16, rings wrap) per global one,
/// RoPE base 10000 on the sliding layers, and the LM head tied to the
/// embeddings.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemma3_logits_match_cpu() {
    let (m, exact) = synth_models(small_gemma3(), 14);
    compare_model("gemma3", m, exact);
}

fn small_gemma3() -> SynthShape {
    SynthShape {
        n_layers: 7,
        dim: 512,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        ffn_dim: 1536,
        vocab_size: 1000,
        window: 16,
        ..SynthShape::small(Architecture::Gemma3)
    }
}

fn muse_shape() -> SynthShape {
    SynthShape {
        n_layers: 8,
        dim: 512,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        ffn_dim: 1536,
        vocab_size: 1000,
        window: 16,
        ..SynthShape::small(Architecture::MuseGlimmer)
    }
}

/// The optional pieces of llama.cpp's muse-glimmer layout on the GPU: a fused
/// `attn_qkv` (uploaded as its q, k and v row ranges) with `attn_qkv.bias`,
/// `attn_qkv.scale` and `attn_output.scale` (applied before the bias), and
/// random q/k-norm gains.
#[test]
#[ignore = "needs a CUDA GPU"]
fn muse_glimmer_fused_qkv_and_scales_match_cpu() {
    use hearth_models::synth::{Init, TensorPlan};
    let shape = muse_shape();
    let mut plan = SynthPlan::new(&shape).unwrap();
    let (d, q, kv) = (
        shape.dim as u64,
        shape.q_dim() as u64,
        shape.kv_dim() as u64,
    );
    let vector = |name: String, len: u64, init: Init| TensorPlan {
        name,
        ty: GgmlType::F32,
        shape: vec![len],
        init,
    };
    let mut tensors = Vec::new();
    for t in plan.tensors.drain(..) {
        let Some((blk, suffix)) = t
            .name
            .rsplit_once('.')
            .and_then(|(a, _)| a.rsplit_once('.'))
        else {
            tensors.push(t);
            continue;
        };
        match suffix {
            "attn_q" => {
                tensors.push(TensorPlan {
                    name: format!("{blk}.attn_qkv.weight"),
                    shape: vec![d, q + 2 * kv],
                    ..t
                });
                tensors.push(vector(
                    format!("{blk}.attn_qkv.bias"),
                    q + 2 * kv,
                    Init::Uniform { lo: -0.1, hi: 0.1 },
                ));
                tensors.push(vector(
                    format!("{blk}.attn_qkv.scale"),
                    1,
                    Init::Const(1.25),
                ));
                tensors.push(vector(
                    format!("{blk}.attn_output.scale"),
                    1,
                    Init::Const(0.75),
                ));
            }
            "attn_k" | "attn_v" => {}
            "attn_q_norm" | "attn_k_norm" => tensors.push(TensorPlan {
                init: Init::Uniform { lo: 0.5, hi: 3.0 },
                ..t
            }),
            _ => tensors.push(t),
        }
    }
    assert!(tensors.iter().any(|t| t.name == "blk.0.attn_qkv.weight"));
    assert_eq!(
        tensors
            .iter()
            .filter(|t| t.name.ends_with("attn_q_norm.weight"))
            .count(),
        8
    );
    plan.tensors = tensors;
    let (m, exact) = plan_models(plan, 13);
    assert!(m
        .layers
        .iter()
        .all(|l| l.wqkv.is_some() && l.wo.scale == Some(0.75)));
    compare_model("muse-glimmer fused", m, exact);
}

/// The batch-invariant verify pass: a block of T tokens through
/// `forward_verify` gives, bit for bit, the logits and hidden-state taps of
/// T single-token decode steps (what greedy speculative decoding needs to
/// emit exactly plain greedy's tokens), for block sizes 1..16, at a short
/// context and past several attention splits, on qwen2 (fused projections,
/// biases), muse-glimmer (QK-norm, output gate, sandwich norms, sliding
/// layers) and gemma3 (head dim 256, sliding window).
#[test]
#[ignore = "needs a CUDA GPU"]
fn verify_pass_is_bit_identical_to_decode_steps() {
    let g = gpu();
    for (name, shape) in [
        ("qwen2", small_qwen2()),
        ("muse-glimmer", muse_shape()),
        (
            "gemma3",
            SynthShape {
                vocab_size: 1000,
                ..SynthShape::small(Architecture::Gemma3)
            },
        ),
    ] {
        let (m, _) = synth_models(shape, 21);
        let gm = GpuModel::upload(g.clone(), m.clone(), false).unwrap();
        let n_layers = m.config.n_layers;
        let taps = [0, n_layers / 2, n_layers];
        let vocab = m.config.vocab_size as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for prefix in [7usize, 700] {
            let tokens: Vec<u32> = (0..prefix + 16).map(|_| rng.gen_range(0..vocab)).collect();
            for t in [1usize, 2, 3, 5, 8, 13, 16] {
                let mut a = gm.new_state(1024).unwrap();
                let mut b = gm.new_state(1024).unwrap();
                gm.forward(&mut a, &tokens[..prefix], Logits::Last).unwrap();
                gm.forward(&mut b, &tokens[..prefix], Logits::Last).unwrap();
                let block = &tokens[prefix..prefix + t];
                let (mut dec_logits, mut dec_taps) = (Vec::new(), Vec::new());
                for &tok in block {
                    dec_logits.extend(
                        gm.forward_tapped(&mut a, &[tok], Logits::Last, &taps, &mut dec_taps)
                            .unwrap(),
                    );
                }
                let mut ver_taps = Vec::new();
                let ver_logits = gm
                    .forward_verify(&mut b, block, &taps, &mut ver_taps)
                    .unwrap();
                let diff = |x: &[f32], y: &[f32]| {
                    assert_eq!(x.len(), y.len());
                    x.iter()
                        .zip(y)
                        .filter(|(p, q)| p.to_bits() != q.to_bits())
                        .count()
                };
                let (dl, dt) = (diff(&dec_logits, &ver_logits), diff(&dec_taps, &ver_taps));
                println!(
                    "{name} prefix {prefix} block {t}: {dl} logits and {dt} tap values differ"
                );
                assert_eq!((dl, dt), (0, 0), "{name} prefix {prefix} block {t}");
                // The greedy form: each row's argmax found on the GPU.
                let mut c = gm.new_state(1024).unwrap();
                gm.forward(&mut c, &tokens[..prefix], Logits::Last).unwrap();
                let ids = gm
                    .forward_verify_argmax(&mut c, block, &taps, &mut Vec::new())
                    .unwrap();
                let want: Vec<u32> = dec_logits
                    .chunks_exact(vocab as usize)
                    .map(hearth_models::backend::first_argmax)
                    .collect();
                assert_eq!(ids, want, "{name} prefix {prefix} block {t}: argmax");
                assert_eq!(a.pos, b.pos);
                // The next step continues identically from both states.
                let next = [tokens[prefix + 15]];
                let (x, y) = (
                    gm.forward(&mut a, &next, Logits::Last).unwrap(),
                    gm.forward(&mut b, &next, Logits::Last).unwrap(),
                );
                assert_eq!(diff(&x, &y), 0, "{name}: the step after the block");
            }
        }
    }
}

/// The GPU DFlash drafter against the CPU one on a synthetic draft for the
/// synthetic qwen2 target: the same tapped context rows and block in, logits
/// of the drafted rows out, within twice the distance between the CPU
/// drafter's reference numerics and its exact-f32 numerics (as
/// `compare_model`), over several cycles (context growing by a backlog each).
#[test]
#[ignore = "needs a CUDA GPU"]
fn dflash_drafter_matches_cpu() {
    use hearth_cuda::dflash::GpuDraft;
    use hearth_models::dflash::DflashModel;
    use hearth_models::synth_dflash::{dflash_plan, DflashShape};
    let (m, exact) = synth_models(small_qwen2(), 31);
    let mut shape = DflashShape::for_target(&m.config);
    shape.block_size = 16;
    let plan = dflash_plan(&m.config, &shape).unwrap();
    let path = std::env::temp_dir().join(format!("hearth-gpu-dflash-{}.gguf", std::process::id()));
    write_gguf_file(&plan, 4, &path).unwrap();
    let d = Arc::new(DflashModel::load(&path, &m).unwrap());
    let d_exact = DflashModel::load(&path, &exact).unwrap();
    let _ = std::fs::remove_file(&path);
    let gm = Arc::new(GpuModel::upload(gpu(), m.clone(), false).unwrap());
    let weights = Arc::new(GpuDraft::upload(gm.clone(), d.clone()).unwrap());
    let max_ctx = 512;
    let mut runner = weights.runner(max_ctx).unwrap();
    let mut cpu = d.new_state(max_ctx);
    let mut cpu_exact = d_exact.new_state(max_ctx);
    let taps = d.config.target_layers.clone();
    let vocab = m.config.vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let tokens: Vec<u32> = (0..300).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let mut st = m.new_state(max_ctx);
    let (mut worst, mut spread, mut agree, mut rows) = (0.0f64, 0.0f64, 0, 0);
    let mut at = 0;
    for (cycle, backlog) in [200usize, 3, 1, 8, 40].into_iter().enumerate() {
        let mut hidden = Vec::new();
        hearth_models::Backend::forward_tapped(
            &*m,
            &mut st,
            &tokens[at..at + backlog],
            Logits::None,
            &taps,
            &mut hidden,
        )
        .unwrap();
        at += backlog;
        let b = [8usize, 16, 2, 5, 16][cycle];
        let n = b - 1;
        let mut block = vec![d.config.mask_token; b];
        block[0] = tokens[at];
        let (gpu_tokens, gpu_logits) = runner.draft_logits(&hidden, &block, n).unwrap();
        let c = d.forward(&m, &mut cpu, &hidden, &block, 1..n + 1).unwrap();
        let e = d_exact
            .forward(&exact, &mut cpu_exact, &hidden, &block, 1..n + 1)
            .unwrap();
        for r in 0..n {
            let (cr, er, gr) = (
                &c.logits[r * vocab..][..vocab],
                &e.logits[r * vocab..][..vocab],
                &gpu_logits[r * vocab..][..vocab],
            );
            let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            worst = worst.max(nrmse(gr, &to64(cr)));
            spread = spread.max(nrmse(cr, &to64(er)));
            let cpu_arg = d.draft_tokens(&c, vocab, n)[r];
            agree += (cpu_arg == gpu_tokens[r]) as usize;
            rows += 1;
        }
        println!(
            "cycle {cycle}: context {} rows, block {b}: worst nrmse so far {worst:.2e} (bound 2 x {spread:.2e})",
            runner_ctx(&runner)
        );
    }
    println!("dflash drafter: {rows} rows, argmax agreement {agree}/{rows}");
    assert!(
        worst < 2.0 * spread,
        "worst {worst} vs bound {}",
        2.0 * spread
    );
}

fn runner_ctx(r: &hearth_cuda::dflash::GpuRunner) -> usize {
    use hearth_models::dflash::DraftRunner;
    r.ctx_len()
}

/// Greedy speculative decoding on the GPU is lossless: with the packaged
/// DFlash drafter (GPU taps, the GPU drafter, batch-invariant verify
/// passes) and with n-gram drafts, every prompt's tokens equal plain greedy
/// decoding's, for qwen2.5-coder-0.5b on the 20 benchmark prompts and the 8
/// held-out ones (chat-wrapped, 256 new tokens). Prints decode rates and
/// acceptance (the benchmark's numbers come from the same run). Needs the
/// packaged model (`HEARTH_MODELS`, default ~/.cache/hearth/models) and runs
/// from the repository root (bench/prompts*, models/drafters).
#[test]
#[ignore = "needs a CUDA GPU and qwen2.5-coder-0.5b"]
fn greedy_speculative_equals_plain_greedy_qwen_05b() {
    use hearth_chat::prompter::Prompter;
    use hearth_cuda::dflash::GpuDraft;
    use hearth_engine::generate::{generate, Flow, GenerateParams};
    use hearth_engine::sampler::{Sampler, SamplerConfig};
    use hearth_engine::spec::adaptive::AdaptiveDrafter;
    use hearth_engine::spec::dflash::DflashDrafter;
    use hearth_engine::spec::ngram::NgramDrafter;
    use hearth_engine::spec::{generate_speculative, Drafter, SpecParams, SpecStats};
    use hearth_models::dflash::DflashModel;
    use hearth_models::Backend;
    use hearth_tokenizer::Tokenizer;

    let dir = std::env::var_os("HEARTH_MODELS").map_or_else(
        || std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hearth/models"),
        std::path::PathBuf::from,
    );
    let path = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(path.is_file(), "{} missing", path.display());
    let drafter = std::path::Path::new("models/drafters/qwen2.5-coder-0.5b-dflash.gguf");
    assert!(
        drafter.is_file(),
        "run from the repository root ({} missing)",
        drafter.display()
    );
    let n: usize = std::env::var("HEARTH_SPEC_TOKENS").map_or(256, |v| v.parse().unwrap());
    let model = Arc::new(Model::load_unpacked(&path).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf_path(&path).unwrap());
    let prompter = Prompter::from_gguf(model.file(), Some(tok.clone()), "auto").unwrap();
    let gm = Arc::new(GpuModel::upload(gpu(), model.clone(), false).unwrap());
    let d = Arc::new(DflashModel::load(drafter, &model).unwrap());
    let weights = Arc::new(GpuDraft::upload(gm.clone(), d.clone()).unwrap());
    let mut prompts = Vec::new();
    for dir in ["bench/prompts", "bench/prompts-heldout"] {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let msgs = serde_json::json!([{"role": "user", "content": text}]);
            let ids = prompter
                .chat_ids(&msgs, None, &serde_json::Map::new())
                .unwrap();
            prompts.push((
                format!("{dir}/{}", f.file_name().unwrap().to_string_lossy()),
                ids,
            ));
        }
    }
    let params = GenerateParams {
        max_tokens: n,
        stop: Vec::new(),
        ignore_eos: false,
    };
    let ctx = 4096;
    let greedy = || Sampler::new(SamplerConfig::greedy()).unwrap();
    // (config, tokens, decode seconds, stats) per prompt and config.
    // (name, block length (0: n-gram), K, adaptive length)
    let configs: [(&str, usize, usize, bool); 4] = [
        ("dflash b8", 8, 7, false),
        ("dflash b16", 16, 15, false),
        ("dflash adapt", 16, 15, true),
        ("ngram k3", 0, 3, false),
    ];
    let dflash = |b: usize, adaptive: bool| -> Box<dyn Drafter> {
        let mut drafter = DflashDrafter::with_runner(
            d.clone(),
            Box::new(weights.runner(ctx + 16).unwrap()),
            Some(b),
        )
        .unwrap();
        drafter.set_block_follows_draft(adaptive);
        match adaptive {
            true => Box::new(AdaptiveDrafter::new(drafter, b - 1)),
            false => Box::new(drafter),
        }
    };
    let mut totals = vec![(0usize, 0.0f64, SpecStats::default(), 0usize); configs.len()];
    let (mut plain_tokens, mut plain_secs) = (0usize, 0.0f64);
    let mut failures = Vec::new();
    for (name, ids) in &prompts {
        let mut st = Backend::new_state(&*gm, ctx, 0).unwrap();
        let plain = generate(&*gm, &mut st, &tok, &mut greedy(), ids, &params, |_| {
            Flow::Continue
        })
        .unwrap();
        plain_tokens += plain.tokens.len().saturating_sub(1);
        plain_secs += plain.decode_time.as_secs_f64();
        for (ci, &(cfg, b, k, adaptive)) in configs.iter().enumerate() {
            let mut drafter: Box<dyn Drafter> = match b {
                0 => Box::new(NgramDrafter::default()),
                _ => dflash(b, adaptive),
            };
            let mut st = Backend::new_state(&*gm, ctx, k).unwrap();
            let (g, s) = generate_speculative(
                &*gm,
                &mut st,
                &tok,
                &mut greedy(),
                &mut *drafter,
                ids,
                &params,
                SpecParams { n_draft: k },
                |_| Flow::Continue,
            )
            .unwrap();
            let t = &mut totals[ci];
            t.0 += g.tokens.len().saturating_sub(1);
            t.1 += g.decode_time.as_secs_f64();
            t.2.merge(&s);
            if g.tokens == plain.tokens {
                t.3 += 1;
            } else {
                let at = g
                    .tokens
                    .iter()
                    .zip(&plain.tokens)
                    .position(|(a, b)| a != b)
                    .unwrap_or(g.tokens.len().min(plain.tokens.len()));
                failures.push(format!(
                    "{name} {cfg}: differs from plain greedy at token {at}"
                ));
            }
        }
    }
    let plain_rate = plain_tokens as f64 / plain_secs;
    println!(
        "qwen2.5-coder-0.5b on the GPU, {} prompts, {n} new tokens, T=0: plain {plain_rate:.1} tok/s",
        prompts.len()
    );
    for (&(cfg, ..), (toks, secs, s, same)) in configs.iter().zip(&totals) {
        let rate = *toks as f64 / secs;
        let by: Vec<String> = s
            .drafted_at
            .iter()
            .zip(&s.accepted_at)
            .filter(|(d, _)| **d > 0)
            .map(|(d, a)| format!("{:.2}", *a as f64 / *d as f64))
            .collect();
        println!(
            "  {cfg:12} {rate:8.1} tok/s  {:.2}x  mean accepted {:.2}  draft {:.2} s verify {:.2} s  identical {same}/{}  by position [{}]",
            rate / plain_rate,
            s.accepted as f64 / s.target_forwards.max(1) as f64,
            s.draft_secs,
            s.verify_secs,
            prompts.len(),
            by.join(", ")
        );
    }
    // T = 0.7 (the rejection sampler; outputs differ by design, so only
    // rates): plain against DFlash at block 8, seeded, on the same prompts.
    let sampler = || {
        Sampler::new(SamplerConfig {
            temperature: 0.7,
            seed: 1,
            ..SamplerConfig::greedy()
        })
        .unwrap()
    };
    let (mut pt, mut ps, mut dt, mut ds) = (0usize, 0.0f64, 0usize, 0.0f64);
    let mut sstats = SpecStats::default();
    for (_, ids) in &prompts {
        let mut st = Backend::new_state(&*gm, ctx, 0).unwrap();
        let p = generate(&*gm, &mut st, &tok, &mut sampler(), ids, &params, |_| {
            Flow::Continue
        })
        .unwrap();
        pt += p.tokens.len().saturating_sub(1);
        ps += p.decode_time.as_secs_f64();
        let mut drafter = dflash(8, false);
        let mut st = Backend::new_state(&*gm, ctx, 7).unwrap();
        let (g, s) = generate_speculative(
            &*gm,
            &mut st,
            &tok,
            &mut sampler(),
            &mut *drafter,
            ids,
            &params,
            SpecParams { n_draft: 7 },
            |_| Flow::Continue,
        )
        .unwrap();
        dt += g.tokens.len().saturating_sub(1);
        ds += g.decode_time.as_secs_f64();
        sstats.merge(&s);
    }
    println!(
        "T=0.7: plain {:.1} tok/s, dflash b8 {:.1} tok/s ({:.2}x), mean accepted {:.2}",
        pt as f64 / ps,
        dt as f64 / ds,
        (dt as f64 / ds) / (pt as f64 / ps),
        sstats.accepted as f64 / sstats.target_forwards.max(1) as f64
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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

/// A synthetic tower of llama.cpp's mmproj layout (hearth_vision::synth).
fn vision_tower(
    name: &str,
    shape: &hearth_vision::synth::MmprojShape,
    seed: u64,
) -> hearth_vision::MmProj {
    let path = std::env::temp_dir().join(format!(
        "hearth-cuda-vision-{name}-{}.gguf",
        std::process::id()
    ));
    hearth_vision::synth::write_mmproj(shape, seed, &path).unwrap();
    let mm = hearth_vision::MmProj::load(&path, None).unwrap();
    let _ = std::fs::remove_file(&path);
    mm
}

/// An image of smooth gradients plus noise (so every patch differs).
fn test_image(w: u32, h: u32, seed: u64) -> hearth_vision::RgbImage {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                let base = (x * (37 + 11 * c) + y * (23 + 5 * c)) % 256;
                data.push(((base + rng.gen_range(0..48)) % 256) as u8);
            }
        }
    }
    hearth_vision::RgbImage::from_raw(w, h, data).unwrap()
}

/// The vision tower on the GPU against the CPU tower: the three synthetic
/// shapes of the llama.cpp embedding fixtures (crates/vision/tests/llama_cpp.rs:
/// F16 width 64 with head_dim 16; Q8_0 width 96, head_dim 48, MLP 160 (widths
/// that are not multiples of the GEMM's 64, so the padded path runs); Q4_K +
/// Q6_K width 256 with a 6x6 table) and a head_dim-96 F16 tower (the released
/// tower's head size, padded to 128 for the attention kernel), on images that
/// span one and several attention windows, square and not, under both rules.
///
/// The bound per output row is the one crates/vision/tests/llama_cpp.rs holds
/// llama.cpp's rows to against the same CPU rows (relative L2 2.5e-3 for F16
/// towers, 5e-2 for 8/4-bit ones): the GPU rounds as llama.cpp does (every
/// matrix product's input to f16, K and V to f16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn vision_tower_matches_cpu() {
    use hearth_vision::synth::MmprojShape;
    use hearth_vision::{Rules, Tower};
    let g = gpu();
    let mut towers = Vec::new();
    let mut s = MmprojShape::tiny();
    s.projection_dim = 576;
    towers.push(("vit-a", s, 11, 2.5e-3));
    let mut s = MmprojShape::tiny();
    (s.n_layer, s.n_embd, s.n_head, s.n_ff, s.adapter) = (5, 96, 2, 160, [192, 64]);
    (s.weight_type, s.weight_type_more) = (GgmlType::Q8_0, GgmlType::Q8_0);
    s.projection_dim = 640;
    towers.push(("vit-b", s, 12, 5e-2));
    let mut s = MmprojShape::tiny();
    (s.n_layer, s.n_embd, s.n_head, s.n_ff, s.pos_side, s.adapter) =
        (6, 256, 4, 512, 6, [512, 256]);
    (s.weight_type, s.weight_type_more) = (GgmlType::Q4_K, GgmlType::Q6_K);
    s.projection_dim = 896;
    towers.push(("vit-c", s, 13, 5e-2));
    let mut s = MmprojShape::tiny();
    (s.n_layer, s.n_embd, s.n_head, s.n_ff, s.pos_side, s.adapter) =
        (8, 192, 2, 512, 4, [256, 256]);
    s.projection_dim = 512;
    towers.push(("hd96", s, 14, 2.5e-3));
    let images = [(56, 56), (112, 112), (168, 84), (250, 190)];
    for (name, shape, seed, bound) in towers {
        let mm = vision_tower(name, &shape, seed);
        let tower = hearth_cuda::GpuTower::upload(g.clone(), &mm).unwrap();
        let mut worst = 0.0f64;
        for (i, &(w, h)) in images.iter().enumerate() {
            let img = test_image(w, h, 100 + i as u64);
            // The CPU side in f32 numerics (the GPU tower's kind of arithmetic).
            for rules in [Rules::REFERENCE, Rules::LLAMA_CPP.f32_numerics()] {
                let cpu = mm.encode(&img, rules);
                let gpu = mm
                    .encode_on(Some(&tower as &dyn Tower), &img, rules)
                    .unwrap();
                assert_eq!(gpu.n_tokens, cpu.n_tokens);
                assert_eq!(gpu.rows.len(), cpu.rows.len());
                let mut img_worst = 0.0f64;
                for r in 0..cpu.n_tokens {
                    let want: Vec<f64> = cpu.row(r).iter().map(|&v| v as f64).collect();
                    img_worst = img_worst.max(nrmse(gpu.row(r), &want));
                }
                println!(
                    "vision {name} ({:?} weights, head_dim {}): {w}x{h} {:?}: {} rows, worst row rel. L2 {img_worst:.2e} (bound {bound:.1e})",
                    shape.weight_type,
                    shape.n_embd / shape.n_head,
                    rules.grid,
                    cpu.n_tokens
                );
                worst = worst.max(img_worst);
            }
        }
        assert!(
            worst < bound,
            "{name}: worst row error {worst} over {bound}"
        );
    }
}

/// Embedding rows (an image's) through the GPU forward: a token prefix, rows
/// in the middle of a prefill block and as a block of their own, then
/// tokens again, against the CPU backend's `forward_input` (muse-glimmer:
/// the rows go through the embedding RMSNorm), with the same bound as the
/// whole-model comparisons (twice the CPU's distance from exact f32).
#[test]
#[ignore = "needs a CUDA GPU"]
fn image_rows_forward_matches_cpu() {
    use hearth_models::{Backend, Input};
    let (model, exact) = synth_models(muse_shape(), 21);
    let gm = GpuModel::upload(gpu(), model.clone(), false).unwrap();
    let (dim, vocab) = (model.config.dim, model.config.vocab_size);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let tokens: Vec<u32> = (0..60).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let rows: Vec<f32> = (0..37 * dim).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
    let mut cs = Backend::new_state(&*model, 512, 0).unwrap();
    let mut es = Backend::new_state(&exact, 512, 0).unwrap();
    let mut gs = gm.new_state(512).unwrap();
    let steps: Vec<(Input, Logits)> = vec![
        (Input::Tokens(&tokens[..20]), Logits::All),
        (Input::Rows(&rows), Logits::All),
        (Input::Tokens(&tokens[20..21]), Logits::Last),
        (Input::Rows(&rows[..dim]), Logits::Last),
        (Input::Tokens(&tokens[21..60]), Logits::All),
    ];
    let (mut worst, mut spread, mut n_rows) = (0.0f64, 0.0f64, 0);
    for (i, (input, want)) in steps.into_iter().enumerate() {
        let c =
            Backend::forward_input(&*model, &mut cs, input, want, &[], &mut Vec::new()).unwrap();
        let e = Backend::forward_input(&exact, &mut es, input, want, &[], &mut Vec::new()).unwrap();
        let gl = gm
            .forward_input(&mut gs, input, want, &[], &mut Vec::new())
            .unwrap();
        assert_eq!(gl.len(), c.len(), "step {i}");
        for r in 0..c.len() / vocab {
            let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let (cr, er, gr) = (
                &c[r * vocab..][..vocab],
                &e[r * vocab..][..vocab],
                &gl[r * vocab..][..vocab],
            );
            worst = worst.max(nrmse(gr, &to64(cr)));
            spread = spread.max(nrmse(cr, &to64(er)));
            n_rows += 1;
        }
    }
    println!("image rows forward: {n_rows} logits rows, worst nrmse gpu vs cpu {worst:.2e} (bound 2 x {spread:.2e})");
    assert!(
        worst < 2.0 * spread,
        "worst {worst} vs bound {}",
        2.0 * spread
    );
    assert_eq!(gs.pos, 20 + 37 + 1 + 1 + 39);
    let bad = gm.forward_input(
        &mut gs,
        Input::Rows(&rows[..dim + 1]),
        Logits::Last,
        &[],
        &mut Vec::new(),
    );
    assert!(
        bad.unwrap_err().to_string().contains("rows"),
        "a ragged row block is refused"
    );
}

/// Speculative decoding on the GPU over a prompt with image rows is
/// lossless: DFlash (the image rows' hidden states tapped on the GPU, the
/// GPU drafter) and n-gram drafts give plain greedy GPU decoding's tokens.
/// A synthetic qwen2 with SmolLM2's vocabulary (`HEARTH_TOK_GGUF`: a GGUF
/// holding its tokenizer keys, e.g. `.gpu/tok.gguf` as
/// bench/cuda/scripts/vision-gpu.sh places it) and a synthetic DFlash draft.
#[test]
#[ignore = "needs a CUDA GPU and HEARTH_TOK_GGUF"]
fn speculation_over_image_rows_equals_plain_greedy() {
    use hearth_cuda::dflash::GpuDraft;
    use hearth_engine::generate::Flow;
    use hearth_engine::prompt::{ImageRows, Prompt};
    use hearth_engine::sampler::{Sampler, SamplerConfig};
    use hearth_engine::spec::dflash::DflashDrafter;
    use hearth_engine::spec::ngram::NgramDrafter;
    use hearth_engine::spec::Drafter;
    use hearth_engine::turn::{Turn, TurnParams};
    use hearth_models::dflash::DflashModel;
    use hearth_models::synth_dflash::{dflash_plan, DflashShape};
    use hearth_models::Backend;
    use hearth_tokenizer::Tokenizer;

    let tok_path = std::env::var("HEARTH_TOK_GGUF")
        .expect("HEARTH_TOK_GGUF: a GGUF with SmolLM2's tokenizer keys");
    let tf = hearth_gguf::GgufFile::open(&tok_path).unwrap();
    let tok = Tokenizer::from_gguf(tf.metadata()).unwrap();
    let vocab = tf
        .metadata()
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .len();
    let shape = SynthShape {
        vocab_size: vocab,
        ..small_qwen2()
    };
    let mut plan = SynthPlan::new(&shape).unwrap();
    let vocab_key = format!("{}.vocab_size", shape.arch.gguf_name());
    plan.metadata
        .retain(|(k, _)| !k.starts_with("tokenizer.") && *k != vocab_key);
    plan.metadata.extend(
        tf.metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .map(|(k, v)| (k.to_string(), v.clone())),
    );
    let (m, _) = plan_models(plan, 43);
    let mut dshape = DflashShape::for_target(&m.config);
    dshape.block_size = 8;
    let dplan = dflash_plan(&m.config, &dshape).unwrap();
    let path =
        std::env::temp_dir().join(format!("hearth-gpu-img-dflash-{}.gguf", std::process::id()));
    write_gguf_file(&dplan, 5, &path).unwrap();
    let d = Arc::new(DflashModel::load(&path, &m).unwrap());
    let _ = std::fs::remove_file(&path);
    let gm = Arc::new(GpuModel::upload(gpu(), m.clone(), false).unwrap());
    let weights = Arc::new(GpuDraft::upload(gm.clone(), d.clone()).unwrap());

    let dim = m.config.dim;
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut ids =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect() };
    let (t0, t1, t2) = (ids(40), ids(30), ids(10));
    let rows = |tag: u8, n: usize| {
        let mut r = ChaCha8Rng::seed_from_u64(tag as u64);
        Arc::new(ImageRows {
            digest: [tag; 32],
            rows: (0..n * dim).map(|_| r.gen_range(-2.0f32..2.0)).collect(),
            n,
        })
    };
    let mut prompt = Prompt::default();
    prompt.push_tokens(&t0);
    prompt.push_image(rows(1, 24));
    prompt.push_tokens(&t1);
    prompt.push_image(rows(2, 5));
    prompt.push_tokens(&t2);
    // The image-free run repeats t1 so n-gram drafts have something to copy.
    prompt.push_tokens(&t1);

    let n = 48;
    let ctx = 512;
    let run = |drafter: Option<&mut dyn Drafter>, k: usize| -> (Vec<u32>, u64) {
        let params = TurnParams {
            max_tokens: n,
            stop: vec![],
            ignore_eos: true,
            n_draft: if drafter.is_some() { k } else { 0 },
            render_special: false,
            logprobs: None,
        };
        let mut st = Backend::new_state(&*gm, ctx, k).unwrap();
        let greedy = Sampler::new(SamplerConfig::greedy()).unwrap();
        let mut turn = Turn::new(&tok, prompt.clone(), 0, greedy, params);
        let mut drafter = drafter;
        while turn.finished().is_none() {
            turn.step(
                &*gm,
                &mut st,
                drafter.as_mut().map(|d| &mut **d as &mut dyn Drafter),
                64,
                &mut |_| Flow::Continue,
            )
            .unwrap();
        }
        let stats = turn.into_parts().0;
        let forwards = stats.spec.map_or(0, |s| s.target_forwards);
        (stats.tokens, forwards)
    };
    let (want, _) = run(None, 0);
    assert_eq!(want.len(), n);
    let mut dflash: Box<dyn Drafter> = Box::new(
        DflashDrafter::with_runner(
            d.clone(),
            Box::new(weights.runner(ctx + 16).unwrap()),
            Some(8),
        )
        .unwrap(),
    );
    let mut ngram: Box<dyn Drafter> = Box::new(NgramDrafter::default());
    for (name, d, k) in [("dflash", &mut dflash, 7), ("ngram", &mut ngram, 3)] {
        let (got, forwards) = run(Some(d.as_mut()), k);
        println!("image rows + {name}: {forwards} target forwards for {n} tokens");
        assert!(forwards > 0, "{name}: no speculation ran");
        assert_eq!(got, want, "{name}");
    }
}

/// GPU session states leave the device and come back (muse-glimmer, window
/// 16: rings and flat caches): a state saved and loaded into a fresh one
/// continues bit-identically; after the rings moved past their spare slots
/// (600 positions) a rollback fails, but a ring checkpoint (as taken, and
/// through its bytes) brings the state back to the checkpoint's position with
/// the cold state's logits, bit for bit; a copy continues as the original;
/// a CPU state's bytes, a truncated state and a damaged checkpoint are
/// refused, leaving the state as it was.
#[test]
#[ignore = "needs a CUDA GPU"]
fn states_save_load_checkpoint_and_copy() {
    use hearth_models::{Backend, BackendState};
    let (m, _) = synth_models(muse_shape(), 12);
    let g = gpu();
    let gm = GpuModel::upload(g, m.clone(), false).unwrap();
    let ctx = 1024;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut ids = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..1000u32)).collect() };
    let (p, moved, tail) = (ids(40), ids(600), ids(5));
    let new = || gm.new_state(ctx).unwrap();
    let fwd = |st: &mut hearth_cuda::forward::GpuState, t: &[u32], want: Logits| {
        gm.forward(st, t, want).unwrap()
    };

    let mut cold = new();
    fwd(&mut cold, &p, Logits::Last);
    let want = fwd(&mut cold, &tail, Logits::All);

    let mut live = new();
    fwd(&mut live, &p, Logits::Last);
    let cp = BackendState::checkpoint(&live).expect("rings: a checkpoint");
    let cp_bytes = BackendState::save_checkpoint(&live, &*cp).unwrap();
    fwd(&mut live, &moved, Logits::Last);
    assert!(BackendState::rollback(&mut live, p.len()).is_err());

    // Save and load: the same continuation.
    let bytes = BackendState::save(&live).unwrap();
    let mut back = new();
    BackendState::load(&mut back, &bytes).unwrap();
    assert_eq!(back.pos, live.pos);
    let mut live2 = new();
    assert!(BackendState::copy_from(&mut live2, &live));
    let a = fwd(&mut live, &tail, Logits::All);
    let b = fwd(&mut back, &tail, Logits::All);
    let c = fwd(&mut live2, &tail, Logits::All);
    let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits());
    assert!(same(&a, &b), "a loaded state continues as the saved one");
    assert!(same(&a, &c), "a copied state continues as the original");

    // Checkpoints: as taken, and from their bytes on another state.
    assert!(BackendState::restore(&mut live, &*cp));
    assert_eq!(live.pos, p.len());
    assert!(same(&fwd(&mut live, &tail, Logits::All), &want));
    let cp2 = BackendState::load_checkpoint(&back, p.len(), &cp_bytes).unwrap();
    assert!(BackendState::restore(&mut back, &*cp2));
    assert!(same(&fwd(&mut back, &tail, Logits::All), &want));
    println!(
        "state {} bytes at {} positions, checkpoint {} bytes",
        bytes.len(),
        p.len() + moved.len(),
        cp_bytes.len()
    );

    // Refusals leave the state as it was.
    let cpu_bytes = {
        let mut st = Backend::new_state(m.as_ref(), ctx, 0).unwrap();
        Backend::forward(m.as_ref(), &mut st, &p, Logits::Last).unwrap();
        BackendState::save(&st).unwrap()
    };
    let pos = back.pos;
    let e = BackendState::load(&mut back, &cpu_bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shapes"), "{e}");
    let e = BackendState::load(&mut back, &bytes[..bytes.len() - 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    assert_eq!(back.pos, pos);
    let e = BackendState::load_checkpoint(&back, p.len(), &cp_bytes[..cp_bytes.len() - 2])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    assert!(BackendState::load_checkpoint(&back, 0, &cp_bytes).is_err());
    assert!(fwd(&mut back, &tail, Logits::Last).len() == 1000);
}

/// Continuous batching on the GPU (`Backend::forward_batch`): several
/// sessions' decode tokens in one pass, each over its own cache at its own
/// position (prompts of 3 to 600 tokens: the 600-token one wraps its rings),
/// against the same sessions stepping one by one (the one-token path, graph
/// replay). Batch-invariant: every logit bit-identical, 24 greedy steps, for
/// 5 and 16 sessions (the 16-row pass is where ordinary passes switch to the
/// tensor-core GEMM). Ordinary numerics (16 sessions: GEMM products where a
/// lone step uses the 8-bit GEMV): the first step's logits within twice the
/// distance between the model's own two valid roundings of a position (the
/// same token through a GEMM prefill pass and through a decode step).
/// A prefill chunk in the same call runs on its own, as it would alone.
#[test]
#[ignore = "needs a CUDA GPU"]
fn batched_decode_equals_one_by_one() {
    use hearth_models::{Backend, BatchItem, Input};
    let argmax = |l: &[f32]| {
        l.iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32
    };
    for (name, shape) in [("muse-glimmer", muse_shape()), ("qwen2", small_qwen2())] {
        let (m, _) = synth_models(shape, 21);
        let gm = GpuModel::upload(gpu(), m, false).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let lens = [
            3usize, 17, 40, 64, 100, 600, 9, 33, 12, 5, 80, 21, 7, 50, 2, 44,
        ];
        let prompts: Vec<Vec<u32>> = lens
            .iter()
            .map(|&n| (0..n).map(|_| rng.gen_range(0..1000u32)).collect())
            .collect();
        for (n, invariant) in [(5usize, true), (16, true), (16, false)] {
            let start = |p: &Vec<u32>| {
                let mut st = Backend::new_state(&gm, 1024, 0).unwrap();
                let l = Backend::forward(&gm, &mut st, p, Logits::Last).unwrap();
                (st, argmax(&l))
            };
            let (mut alone, mut next_a): (Vec<_>, Vec<u32>) =
                prompts[..n].iter().map(start).unzip();
            let (mut batched, mut next_b): (Vec<_>, Vec<u32>) =
                prompts[..n].iter().map(start).unzip();
            let (mut worst, mut same_tokens) = (0f64, 0usize);
            // The model's two roundings of one position, for sessions whose
            // prompt plus token is a GEMM prefill pass (16 tokens or more).
            let mut rounding = 0f64;
            if !invariant {
                for (p, &t) in prompts[..n].iter().zip(&next_a) {
                    if p.len() + 1 < 16 {
                        continue;
                    }
                    let mut whole: Vec<u32> = p.clone();
                    whole.push(t);
                    let mut st = Backend::new_state(&gm, 1024, 0).unwrap();
                    let gemm = Backend::forward(&gm, &mut st, &whole, Logits::Last).unwrap();
                    let mut st = Backend::new_state(&gm, 1024, 0).unwrap();
                    Backend::forward(&gm, &mut st, p, Logits::Last).unwrap();
                    let step = Backend::forward(&gm, &mut st, &[t], Logits::Last).unwrap();
                    let w: Vec<f64> = step.iter().map(|&v| v as f64).collect();
                    rounding = rounding.max(nrmse(&gemm, &w));
                }
            }
            let mut first_step = 0f64;
            for step in 0..24 {
                let want: Vec<Vec<f32>> = alone
                    .iter_mut()
                    .zip(&next_a)
                    .map(|(st, &t)| Backend::forward(&gm, st, &[t], Logits::Last).unwrap())
                    .collect();
                let toks = next_b.clone();
                let mut items: Vec<BatchItem<'_, _>> = batched
                    .iter_mut()
                    .zip(&toks)
                    .map(|(st, t)| {
                        BatchItem::new(st, Input::Tokens(std::slice::from_ref(t)), Logits::Last)
                    })
                    .collect();
                let got: Vec<Vec<f32>> = Backend::forward_batch(&gm, &mut items, invariant)
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                for i in 0..n {
                    if invariant {
                        let differ = got[i]
                            .iter()
                            .zip(&want[i])
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count();
                        assert_eq!(differ, 0, "{name} n {n} step {step} session {i}");
                    } else {
                        let w: Vec<f64> = want[i].iter().map(|&v| v as f64).collect();
                        let e = nrmse(&got[i], &w);
                        worst = worst.max(e);
                        if step == 0 {
                            first_step = first_step.max(e);
                        }
                    }
                }
                next_a = want.iter().map(|l| argmax(l)).collect();
                next_b = got.iter().map(|l| argmax(l)).collect();
                if next_a == next_b {
                    same_tokens += 1;
                } else if invariant {
                    panic!("{name}: greedy tokens part at step {step}");
                } else {
                    // Ordinary numerics may pick another token once the
                    // logits differ; from here on compare nothing more.
                    break;
                }
            }
            println!(
                "{name}: {n} sessions, invariant {invariant}: {same_tokens} greedy steps equal, worst nrmse {worst:.2e} (first step {first_step:.2e}; GEMM vs decode rounding {rounding:.2e})"
            );
            if !invariant {
                assert!(
                    first_step <= 2.0 * rounding,
                    "{name}: first step nrmse {first_step:.2e}"
                );
            }
        }

        // A prefill chunk among decode tokens: as alone.
        let mut a = Backend::new_state(&gm, 1024, 0).unwrap();
        let mut b = Backend::new_state(&gm, 1024, 0).unwrap();
        let mut c = Backend::new_state(&gm, 1024, 0).unwrap();
        let want_c = Backend::forward(&gm, &mut c, &prompts[2], Logits::Last).unwrap();
        Backend::forward(&gm, &mut a, &prompts[0], Logits::Last).unwrap();
        Backend::forward(&gm, &mut b, &prompts[1], Logits::Last).unwrap();
        let mut c2 = Backend::new_state(&gm, 1024, 0).unwrap();
        let mut items = vec![
            BatchItem::new(&mut a, Input::Tokens(&[5]), Logits::Last),
            BatchItem::new(&mut c2, Input::Tokens(&prompts[2]), Logits::Last),
            BatchItem::new(&mut b, Input::Tokens(&[6]), Logits::Last),
        ];
        let out = Backend::forward_batch(&gm, &mut items, true);
        assert_eq!(out[1].as_ref().unwrap(), &want_c);
        assert_eq!(a.pos, prompts[0].len() + 1);
        assert_eq!(b.pos, prompts[1].len() + 1);
    }
}

/// One kv head's row of a GPU cache buffer of `kind` (quants, then scales:
/// `ops::KvKind`) as GGML block bytes (f16 scale, then the quants, per block).
fn gpu_row_as_blocks(kind: ops::KvKind, buf: &[u8], row: usize, rows: usize, hd: usize) -> Vec<u8> {
    let (qb, sb) = kind.row_bytes(hd);
    let q = &buf[row * qb..][..qb];
    let s = &buf[rows * qb + row * sb..][..sb];
    let per = qb / (hd / 32);
    (0..hd / 32)
        .flat_map(|b| {
            s[2 * b..2 * b + 2]
                .iter()
                .chain(&q[b * per..(b + 1) * per])
                .copied()
                .collect::<Vec<u8>>()
        })
        .collect()
}

/// A quantized KV cache's write (prepare_heads with q8_0 / q4_0): llama.cpp's
/// rotations of q and k (Walsh-Hadamard over the head) and of v (chunks of
/// 64), then the blocks, against the CPU path's own functions (`fwht`,
/// `encode_row`: q8_0 in llama.cpp's x86 rounding, q4_0 in the reference
/// one). Bit for bit: the rotated q values, and every byte the cache holds.
#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_kv_cache_write_matches_cpu() {
    use hearth_models::kv_cache::{encode_row, fwht};
    use hearth_models::KvDtype;
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for (kind, dtype) in [
        (ops::KvKind::Q8_0, KvDtype::Q8_0),
        (ops::KvKind::Q4_0, KvDtype::Q4_0),
    ] {
        for &(nh, nkv, hd, t, slots, pos0) in &[
            (8usize, 2usize, 64usize, 5usize, 40usize, 37usize),
            (12, 2, 128, 3, 16, 9),
            (4, 1, 256, 2, 8, 3),
        ] {
            let mut q: Vec<f32> = (0..t * nh * hd)
                .map(|_| rng.gen_range(-3.0f32..3.0))
                .collect();
            let k: Vec<f32> = (0..t * nkv * hd)
                .map(|_| rng.gen_range(-3.0f32..3.0))
                .collect();
            let mut v: Vec<f32> = (0..t * nkv * hd)
                .map(|_| rng.gen_range(-3.0f32..3.0))
                .collect();
            let (qb, kb, vb) = (upload_f32(&g, &q), upload_f32(&g, &k), upload_f32(&g, &v));
            let bytes = kind.buffer_bytes(nkv, slots, hd);
            let kc = g.alloc_zeroed(bytes, "t").unwrap();
            let vc = g.alloc_zeroed(bytes, "t").unwrap();
            let pos = g.alloc(4, "t").unwrap();
            g.upload(pos.ptr, &[pos0 as i32]).unwrap();
            let prep = ops::HeadPrep {
                n_heads: nh,
                n_kv: nkv,
                head_dim: hd,
                theta: 10000.0,
                eps: 1e-6,
                flags: kind.head_flags(),
            };
            ops::prepare_heads(
                &g,
                &prep,
                t,
                qb.ptr,
                kb.ptr,
                vb.ptr,
                (0, 0),
                pos.ptr,
                kc.ptr,
                vc.ptr,
                slots,
            )
            .unwrap();
            let got_q = download_f32(&g, &qb, q.len());
            let (mut got_k, mut got_v) = (vec![0u8; bytes], vec![0u8; bytes]);
            g.download(&mut got_k, kc.ptr).unwrap();
            g.download(&mut got_v, vc.ptr).unwrap();
            fwht(&mut q, hd);
            let same_q = q
                .iter()
                .zip(&got_q)
                .filter(|(a, b)| a.to_bits() == b.to_bits())
                .count();
            let mut k = k;
            fwht(&mut k, hd);
            fwht(&mut v, 64);
            let row_bytes = dtype.bytes_for(hd);
            let mut bad = 0;
            for tok in 0..t {
                let slot = (pos0 + tok) % slots;
                for h in 0..nkv {
                    for (src, got) in [(&k, &got_k), (&v, &got_v)] {
                        let mut want = vec![0u8; row_bytes];
                        encode_row(dtype, &src[(tok * nkv + h) * hd..][..hd], &mut want);
                        let have = gpu_row_as_blocks(kind, got, h * slots + slot, nkv * slots, hd);
                        bad += want.iter().zip(&have).filter(|(a, b)| a != b).count();
                    }
                }
            }
            println!(
                "{} nh {nh} nkv {nkv} hd {hd} T {t}: rotated q {same_q}/{} bit-identical, {bad} cache bytes differ",
                kind.name(),
                q.len()
            );
            assert_eq!(same_q, q.len(), "{} hd {hd}: rotated q", kind.name());
            assert_eq!(bad, 0, "{} hd {hd}: cache bytes", kind.name());
        }
    }
}

/// Attention over q8_0 / q4_0 caches (random blocks in the GPU layout)
/// against an f64 reference over the values the kernel dequantizes (each
/// q * d rounded once to f16, as llama.cpp's CUDA flash attention converts
/// them): decode (one split and many), blocks of rows over a flat cache and
/// over a wrapped ring, head sizes 64, 128 and 256; and attn_combine's
/// rotation back (a quantized V's basis), against the CPU's `fwht` of the
/// reference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_attention_matches_reference() {
    use hearth_models::kv_cache::fwht;
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    // (kind, nh, nkv, hd, slots, window, pos0, t, splits, rotate back)
    let cases = [
        (
            ops::KvKind::Q8_0,
            8usize,
            2usize,
            128usize,
            3100usize,
            0usize,
            3000usize,
            1usize,
            24usize,
            false,
        ),
        (ops::KvKind::Q4_0, 8, 2, 128, 3100, 0, 3000, 1, 24, true),
        (ops::KvKind::Q8_0, 16, 1, 64, 700, 0, 600, 1, 1, true),
        (ops::KvKind::Q4_0, 8, 2, 64, 400, 0, 200, 37, 3, false),
        (
            ops::KvKind::Q8_0,
            8,
            2,
            128,
            256 + 512,
            256,
            2000,
            100,
            2,
            true,
        ),
        (ops::KvKind::Q8_0, 4, 1, 256, 600, 0, 400, 1, 4, false),
        (ops::KvKind::Q4_0, 4, 1, 256, 600, 0, 300, 70, 2, true),
    ];
    for &(kind, nh, nkv, hd, slots, window, pos0, t, splits, rot) in &cases {
        let rows = nkv * slots;
        let (qbytes, sbytes) = kind.row_bytes(hd);
        // Random quants (any byte is a valid q8_0 value / q4_0 pair) and
        // scales of either sign.
        let mk = |rng: &mut ChaCha8Rng| -> (Vec<u8>, Vec<f32>) {
            let mut buf: Vec<u8> = (0..rows * qbytes).map(|_| rng.gen::<u8>()).collect();
            let scales: Vec<f16> = (0..rows * hd / 32)
                .map(|_| f16::from_f32(rng.gen_range(-0.05f32..0.05)))
                .collect();
            for s in &scales {
                buf.extend_from_slice(&s.to_bits().to_le_bytes());
            }
            assert_eq!(buf.len(), rows * (qbytes + sbytes));
            let vals: Vec<f32> = (0..rows * hd)
                .map(|i| {
                    let (r, e) = (i / hd, i % hd);
                    let (b, j) = (e / 32, e % 32);
                    let q = match kind {
                        ops::KvKind::Q8_0 => buf[r * qbytes + e] as i8 as i32,
                        _ => {
                            let byte = buf[r * qbytes + b * 16 + j % 16];
                            (if j < 16 { byte & 15 } else { byte >> 4 }) as i32 - 8
                        }
                    };
                    let d = scales[r * hd / 32 + b].to_f32();
                    f16::from_f32(q as f32 * d).to_f32()
                })
                .collect();
            (buf, vals)
        };
        let (kbuf, kval) = mk(&mut rng);
        let (vbuf, vval) = mk(&mut rng);
        let kb = g.alloc(kbuf.len(), "t").unwrap();
        let vb = g.alloc(vbuf.len(), "t").unwrap();
        g.upload(kb.ptr, &kbuf).unwrap();
        g.upload(vb.ptr, &vbuf).unwrap();
        let q: Vec<f32> = (0..t * nh * hd)
            .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_f32())
            .collect();
        let qb = upload_f32(&g, &q);
        let pos = g.alloc(4, "t").unwrap();
        g.upload(pos.ptr, &[pos0 as i32]).unwrap();
        let part_o = g.alloc(t * nh * splits * hd * 4, "t").unwrap();
        let part_ml = g.alloc(t * nh * splits * 2 * 4, "t").unwrap();
        let out = upload_f32(&g, &vec![f32::NAN; t * nh * hd]);
        let scale = 1.0 / (hd as f32).sqrt();
        let args = ops::AttnArgs {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
            slots,
            window,
            scale,
            kv: kind,
        };
        let flags = if rot { kind.combine_flags() } else { 0 };
        ops::attention(
            &g,
            &args,
            t,
            splits,
            qb.ptr,
            kb.ptr,
            vb.ptr,
            pos.ptr,
            part_o.ptr,
            part_ml.ptr,
            out.ptr,
            flags,
            None,
        )
        .unwrap();
        let got = download_f32(&g, &out, t * nh * hd);
        let group = nh / nkv;
        let mut want = vec![0.0f64; got.len()];
        for tt in 0..t {
            let qp = pos0 + tt;
            let lo = if window > 0 {
                (qp + 1).saturating_sub(window)
            } else {
                0
            };
            for h in 0..nh {
                let at = |p: usize| ((h / group) * slots + p % slots) * hd;
                let qh = &q[(tt * nh + h) * hd..][..hd];
                let scores: Vec<f64> = (lo..=qp)
                    .map(|p| {
                        (0..hd)
                            .map(|d| qh[d] as f64 * kval[at(p) + d] as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    want[(tt * nh + h) * hd + d] = (lo..=qp)
                        .zip(&e)
                        .map(|(p, w)| w * vval[at(p) + d] as f64)
                        .sum::<f64>()
                        / sum;
                }
            }
        }
        if rot {
            let mut w32: Vec<f32> = want.iter().map(|&x| x as f32).collect();
            fwht(&mut w32, 64);
            want = w32.iter().map(|&x| x as f64).collect();
        }
        let e = nrmse(&got, &want);
        println!(
            "{} nh {nh} nkv {nkv} hd {hd} slots {slots} window {window} pos {pos0} T {t} splits {splits} rotate {rot}: nrmse {e:.2e}",
            kind.name()
        );
        assert!(e < 1e-4, "{} hd {hd} T {t}: {e}", kind.name());
    }
}

/// Synthetic models whose CPU and GPU states keep a KV cache of `types`;
/// the exact model keeps its own f32 cache (the distance it sets includes
/// the cache's quantization).
fn synth_models_kv(
    shape: SynthShape,
    seed: u64,
    types: hearth_models::KvTypes,
) -> (Arc<Model>, Model) {
    let (m, exact) = synth_models(shape, seed);
    let mut m = Arc::try_unwrap(m).ok().expect("one owner");
    m.set_kv_types(types).unwrap();
    (Arc::new(m), exact)
}

/// Whole-model logits with quantized KV caches (`--cache-type-k/-v q8_0`,
/// `q4_0`: the rotations, the quantizing write, attention over the blocks
/// and the rotation back), CUDA against the CPU backend with the same cache
/// types, as `compare_model` measures: qwen2 (head 64, flat caches), gemma3
/// (head 256, rings that wrap) and muse-glimmer (rings, output gate).
#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_kv_logits_match_cpu() {
    use hearth_models::{KvDtype, KvTypes};
    let gemma = SynthShape {
        n_layers: 7,
        dim: 512,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        ffn_dim: 1536,
        vocab_size: 1000,
        window: 16,
        ..SynthShape::small(Architecture::Gemma3)
    };
    for (name, shape, seed, t) in [
        ("qwen2 q8_0", small_qwen2(), 11, KvDtype::Q8_0),
        ("qwen2 q4_0", small_qwen2(), 11, KvDtype::Q4_0),
        ("gemma3 q8_0", gemma, 14, KvDtype::Q8_0),
        ("muse-glimmer q8_0", muse_shape(), 12, KvDtype::Q8_0),
    ] {
        let (m, exact) = synth_models_kv(shape, seed, KvTypes::same(t));
        compare_model(name, m, exact);
    }
}

/// A quantized GPU state saved and loaded, and copied (the prefix cache):
/// both continue bit for bit as the original; its bytes are about 0.53x an
/// f16 state's; a state of another cache type is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_kv_states_save_load_and_copy() {
    use hearth_models::{BackendState, KvDtype, KvTypes};
    let g = gpu();
    let (m8, _) = synth_models_kv(small_qwen2(), 11, KvTypes::same(KvDtype::Q8_0));
    let (m16, _) = synth_models(small_qwen2(), 11);
    let gm = GpuModel::upload(g.clone(), m8, false).unwrap();
    let g16 = GpuModel::upload(g, m16, false).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let p: Vec<u32> = (0..300).map(|_| rng.gen_range(0..1000u32)).collect();
    let tail: Vec<u32> = (0..6).map(|_| rng.gen_range(0..1000u32)).collect();
    let mut live = gm.new_state(512).unwrap();
    gm.forward(&mut live, &p, Logits::Last).unwrap();
    let bytes = BackendState::save(&live).unwrap();
    let mut back = gm.new_state(512).unwrap();
    BackendState::load(&mut back, &bytes).unwrap();
    let mut copy = gm.new_state(512).unwrap();
    assert!(BackendState::copy_from(&mut copy, &live));
    let a = gm.forward(&mut live, &tail, Logits::All).unwrap();
    let b = gm.forward(&mut back, &tail, Logits::All).unwrap();
    let c = gm.forward(&mut copy, &tail, Logits::All).unwrap();
    let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits());
    assert!(
        same(&a, &b),
        "a loaded q8_0 state continues as the saved one"
    );
    assert!(
        same(&a, &c),
        "a copied q8_0 state continues as the original"
    );
    let mut s16 = g16.new_state(512).unwrap();
    g16.forward(&mut s16, &p, Logits::Last).unwrap();
    let bytes16 = BackendState::save(&s16).unwrap();
    let ratio = bytes.len() as f64 / bytes16.len() as f64;
    println!(
        "q8_0 state {} bytes, f16 {} bytes ({ratio:.3}x); kv buffers {} vs {}",
        bytes.len(),
        bytes16.len(),
        live.kv_bytes(),
        s16.kv_bytes()
    );
    assert!(ratio < 0.55, "{ratio}");
    let e = BackendState::load(&mut back, &bytes16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shapes"), "{e}");
}
