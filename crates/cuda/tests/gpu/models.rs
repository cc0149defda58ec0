//! Whole-model logits of the CUDA backend against the CPU backend, decode
//! determinism, the verify pass and the DFlash drafter.

use std::sync::Arc;

use crate::common::*;
use hearth_cuda::GpuModel;
use hearth_gguf::GgmlType;
use hearth_models::synth::{write_gguf_file, SynthPlan, SynthShape};
use hearth_models::{Architecture, Logits};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
