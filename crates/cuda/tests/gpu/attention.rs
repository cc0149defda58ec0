//! Attention against the CPU reference, over f16 and quantized KV caches.

use crate::common::*;
use half::{bf16, f16};
use hearth_cuda::ops::{self};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
