//! The vision tower and image rows on the GPU against the CPU, and
//! speculation over image rows.

use std::sync::Arc;

use crate::common::*;
use hearth_cuda::GpuModel;
use hearth_gguf::GgmlType;
use hearth_models::synth::{write_gguf_file, SynthPlan, SynthShape};
use hearth_models::Logits;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
