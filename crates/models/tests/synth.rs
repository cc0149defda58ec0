//! Synthetic checkpoints (`hearth_models::synth`): layout against llama.cpp
//! 11434's `muse-glimmer` loader (docs/muse-glimmer-llamacpp.md §1.1-1.2: its
//! keys and tensor names) and the spec's Q4_K_M mix (muse-glimmer-model.md
//! §4.5, llama.cpp's use_more_bits rule), loading and running through
//! `Model`, and byte-level determinism. The determinism tests are regression
//! guards of our own generator; the layout tests compare against those tables.

use std::collections::BTreeSet;
use std::sync::Arc;

use hearth_gguf::{GgmlType, GgufFile};
use hearth_models::synth::{
    q4_k_m_more_bits, tensor_bytes, write_gguf, SynthOptions, SynthPlan, SynthShape,
};
use hearth_models::Backend;
use hearth_models::{Architecture, Logits, Model};

fn synth_bytes(shape: &SynthShape, seed: u64, chunk_bytes: usize) -> Vec<u8> {
    let plan = SynthPlan::new(shape).unwrap();
    let opts = SynthOptions {
        seed,
        chunk_bytes,
        threads: None,
    };
    let mut progressed = 0u64;
    let bytes = write_gguf(&plan, &opts, Vec::new(), |n| progressed += n).unwrap();
    assert_eq!(progressed, plan.data_bytes());
    bytes
}

fn small_file(arch: Architecture, seed: u64) -> GgufFile {
    let bytes = synth_bytes(&SynthShape::small(arch), seed, 1 << 20);
    GgufFile::from_bytes(format!("synthetic-{}.gguf", arch.gguf_name()), bytes).unwrap()
}

/// Layers whose attn_v / ffn_down are Q6_K.
fn q6k_layers(file: &GgufFile, n_layers: usize, tensor: &str) -> Vec<usize> {
    (0..n_layers)
        .filter(|i| {
            let ty = file
                .tensor_info(&format!("blk.{i}.{tensor}.weight"))
                .unwrap()
                .ty;
            assert!(
                matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K),
                "{tensor} {i}: {ty}"
            );
            ty == GgmlType::Q6_K
        })
        .collect()
}

/// The rule as the spec lists it for 52 layers (§4.5): 0–5, 8, 11, …, 44, 45–51.
#[test]
fn q4_k_m_rule_matches_spec_for_52_layers() {
    let got: Vec<usize> = (0..52).filter(|&i| q4_k_m_more_bits(i, 52)).collect();
    let mut want: Vec<usize> = (0..6).collect();
    want.extend((8..45).step_by(3));
    want.extend(45..52);
    assert_eq!(got, want);
    assert_eq!(got.len(), 26);
    // Small models: the same integer formula (n/8 = 1, 7n/8 = 7 for 8 layers).
    let eight: Vec<usize> = (0..8).filter(|&i| q4_k_m_more_bits(i, 8)).collect();
    assert_eq!(eight, [0, 3, 6, 7]);
}

#[test]
fn small_muse_glimmer_has_llama_cpp_layout() {
    let file = small_file(Architecture::MuseGlimmer, 1);
    let s = SynthShape::small(Architecture::MuseGlimmer);
    let md = file.metadata();
    assert_eq!(file.architecture(), Some("muse-glimmer"));
    assert_eq!(md.get_str("tokenizer.ggml.model"), Some("no_vocab"));
    let k = |key: &str| format!("muse-glimmer.{key}");
    for (key, want) in [
        ("attention.key_length", s.head_dim),
        ("attention.sliding_window", s.window),
        ("block_count", s.n_layers),
        ("context_length", 131072),
        ("embedding_length", s.dim),
        ("feed_forward_length", s.ffn_dim),
        ("attention.head_count", s.n_heads),
        ("attention.head_count_kv", s.n_kv_heads),
    ] {
        assert_eq!(md.get_u64(&k(key)), Some(want as u64), "{key}");
    }
    // The keys llama.cpp requires for this architecture (muse-glimmer.cpp:4-7).
    for key in ["attention.layer_norm_rms_epsilon", "logit_scale"] {
        assert!(md.get_f64(&k(key)).is_some(), "{key}");
    }
    assert_eq!(md.get_f64(&k("final_logit_softcapping")), Some(20.0));

    let (d, q, kv, f, v) = (
        s.dim as u64,
        s.q_dim() as u64,
        s.kv_dim() as u64,
        s.ffn_dim as u64,
        s.vocab_size as u64,
    );
    let mut want: Vec<(String, GgmlType, Vec<u64>)> = vec![
        ("token_embd.weight".into(), GgmlType::Q4_K, vec![d, v]),
        ("output.weight".into(), GgmlType::Q6_K, vec![d, v]),
        ("output_norm.weight".into(), GgmlType::F32, vec![d]),
    ];
    for i in 0..s.n_layers {
        let more = if [0, 3, 6, 7].contains(&i) {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        };
        for (name, ty, shape) in [
            ("attn_norm", GgmlType::F32, vec![d]),
            ("attn_q", GgmlType::Q4_K, vec![d, q]),
            ("attn_k", GgmlType::Q4_K, vec![d, kv]),
            ("attn_v", more, vec![d, kv]),
            ("attn_gate", GgmlType::Q4_K, vec![d, q]),
            ("attn_output", GgmlType::Q4_K, vec![q, d]),
            ("post_attention_norm", GgmlType::F32, vec![d]),
            ("ffn_norm", GgmlType::F32, vec![d]),
            ("ffn_gate", GgmlType::Q4_K, vec![d, f]),
            ("ffn_up", GgmlType::Q4_K, vec![d, f]),
            ("ffn_down", more, vec![f, d]),
            ("post_ffw_norm", GgmlType::F32, vec![d]),
            ("attn_q_norm", GgmlType::F32, vec![s.head_dim as u64]),
            ("attn_k_norm", GgmlType::F32, vec![s.head_dim as u64]),
        ] {
            want.push((format!("blk.{i}.{name}.weight"), ty, shape));
        }
    }
    let got: BTreeSet<_> = file
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.ty, t.shape.clone()))
        .collect();
    assert_eq!(got, want.into_iter().collect::<BTreeSet<_>>());
    assert_eq!(q6k_layers(&file, s.n_layers, "attn_v"), [0, 3, 6, 7]);
    assert_eq!(q6k_layers(&file, s.n_layers, "ffn_down"), [0, 3, 6, 7]);

    // The converter's QK-norm gains: qk_scale_factor on q (attention scale
    // 0.342 on unit-RMS q and k: 0.342·sqrt(64)), ones on k; the other norms
    // are gains in [0.8, 1.2].
    let q_gain = bytemuck_f32(file.tensor("blk.2.attn_q_norm.weight").unwrap().data);
    assert!(q_gain.iter().all(|&x| (x - 0.342_062_9 * 8.0).abs() < 1e-6));
    let ones = bytemuck_f32(file.tensor("blk.2.attn_k_norm.weight").unwrap().data);
    assert!(ones.iter().all(|&x| x == 1.0));
    let gains = bytemuck_f32(file.tensor("blk.2.ffn_norm.weight").unwrap().data);
    assert!(gains.iter().all(|&x| (0.8..1.2).contains(&x)));
    assert!(gains.iter().any(|&x| x < 0.9) && gains.iter().any(|&x| x > 1.1));
}

fn bytemuck_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Weights dequantize to the planned distribution (mean 0, std 1/sqrt(fan_in)).
#[test]
fn linear_weights_have_planned_scale() {
    let file = small_file(Architecture::MuseGlimmer, 2);
    for (name, fan_in) in [
        ("blk.1.ffn_up.weight", 256.0f64),
        ("blk.1.ffn_down.weight", 512.0),
        ("token_embd.weight", 1.0),
    ] {
        let t = file.tensor(name).unwrap();
        let mut w = vec![0.0f32; t.info.n_elements() as usize];
        hearth_kernels::dequantize(t.info.ty, t.data, &mut w).unwrap();
        let n = w.len() as f64;
        let mean = w.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (w.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        let want = 1.0 / fan_in.sqrt();
        assert!(mean.abs() < 0.02 * want, "{name}: mean {mean}");
        assert!(
            (std / want - 1.0).abs() < 0.05,
            "{name}: std {std}, want {want}"
        );
    }
}

#[test]
fn small_muse_glimmer_loads_and_runs() {
    let model = Model::from_gguf(Arc::new(small_file(Architecture::MuseGlimmer, 3))).unwrap();
    let s = SynthShape::small(Architecture::MuseGlimmer);
    let c = &model.config;
    assert_eq!(c.dims(), s.dims());
    assert_eq!(c.sliding_window(), Some(s.window));
    // llama.cpp's default pattern: three sliding layers, then a full one.
    let full: Vec<usize> = (0..c.n_layers)
        .filter(|&i| !c.layers[i].is_sliding())
        .collect();
    assert_eq!(full, [3, 7]);
    // Longer than the window so the ring caches wrap.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % s.vocab_size) as u32).collect();
    let mut state = model.new_state(64);
    let logits = model.forward(&mut state, &tokens, Logits::All).unwrap();
    assert_eq!(logits.len(), tokens.len() * s.vocab_size);
    assert!(logits.iter().all(|x| x.is_finite() && x.abs() < 20.0));
    // Not degenerate: logits vary across the vocabulary.
    let last = &logits[logits.len() - s.vocab_size..];
    let (lo, hi) = last
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(hi - lo > 0.1, "logit range {lo}..{hi}");
}

#[test]
fn small_qwen2_has_llama_cpp_layout_and_runs() {
    let file = small_file(Architecture::Qwen2, 4);
    let s = SynthShape::small(Architecture::Qwen2);
    let md = file.metadata();
    assert_eq!(md.get_u64("general.file_type"), Some(15));
    assert_eq!(md.get_u64("qwen2.context_length"), Some(32768));
    assert_eq!(md.get_f64("qwen2.rope.freq_base"), Some(1e6));
    assert_eq!(md.get_u64("qwen2.vocab_size"), Some(s.vocab_size as u64));
    for i in 0..s.n_layers {
        for b in [
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
            "attn_norm.weight",
            "ffn_norm.weight",
        ] {
            assert_eq!(
                file.tensor_info(&format!("blk.{i}.{b}")).unwrap().ty,
                GgmlType::F32
            );
        }
        assert!(file
            .tensor_info(&format!("blk.{i}.attn_gate.weight"))
            .is_none());
    }
    assert_eq!(q6k_layers(&file, s.n_layers, "attn_v"), [0, 3, 6, 7]);
    assert_eq!(q6k_layers(&file, s.n_layers, "ffn_down"), [0, 3, 6, 7]);
    assert_eq!(file.tensors().len(), 3 + 12 * s.n_layers);

    let model = Model::from_gguf(Arc::new(file)).unwrap();
    assert!(model
        .layers
        .iter()
        .all(|l| l.bq.is_some() && l.bk.is_some() && l.bv.is_some()));
    let mut state = model.new_state(64);
    let logits = model
        .forward(&mut state, &[1, 2, 3, 500, 7], Logits::Last)
        .unwrap();
    assert_eq!(logits.len(), s.vocab_size);
    assert!(logits.iter().all(|x| x.is_finite()));
}

/// Regression guard: same seed → same bytes, different seed → different weights.
#[test]
fn fixed_seed_gives_identical_bytes() {
    let s = SynthShape::small(Architecture::MuseGlimmer);
    let a = synth_bytes(&s, 42, 1 << 20);
    assert_eq!(a, synth_bytes(&s, 42, 1 << 20));
    let b = synth_bytes(&s, 43, 1 << 20);
    assert_eq!(a.len(), b.len());
    assert_ne!(a, b);
}

/// Chunking and thread count never change the bytes, and any tensor can be
/// generated on its own.
#[test]
fn bytes_do_not_depend_on_chunking_or_threads() {
    let mut s = SynthShape::small(Architecture::MuseGlimmer);
    s.n_layers = 4;
    let whole = synth_bytes(&s, 7, 64 << 20);
    for chunk in [1, 1000, 150_000] {
        assert_eq!(whole, synth_bytes(&s, 7, chunk), "chunk_bytes {chunk}");
    }
    let plan = SynthPlan::new(&s).unwrap();
    let opts = SynthOptions {
        seed: 7,
        chunk_bytes: 5000,
        threads: Some(1),
    };
    assert_eq!(whole, write_gguf(&plan, &opts, Vec::new(), |_| {}).unwrap());

    let file = GgufFile::from_bytes("whole.gguf", whole).unwrap();
    for name in [
        "blk.3.ffn_down.weight",
        "token_embd.weight",
        "blk.0.attn_norm.weight",
    ] {
        let t = plan.tensor(name).unwrap();
        assert_eq!(
            tensor_bytes(t, 7).unwrap(),
            file.tensor(name).unwrap().data,
            "{name}"
        );
    }
}

/// The 30B preset's plan (nothing is generated): spec §1 shapes, §4.2 names,
/// §4.5 types, about 17 GB.
#[test]
fn muse_glimmer_30b_plan() {
    let s = SynthShape::preset("muse-glimmer-30b").unwrap();
    let plan = SynthPlan::new(&s).unwrap();
    assert_eq!(plan.tensors.len(), 3 + 14 * 52);
    let t = |n: &str| plan.tensor(n).unwrap_or_else(|| panic!("missing {n}"));
    assert_eq!(
        (t("token_embd.weight").ty, &t("token_embd.weight").shape[..]),
        (GgmlType::Q4_K, &[6656, 202048][..])
    );
    assert_eq!(
        (t("output.weight").ty, &t("output.weight").shape[..]),
        (GgmlType::Q6_K, &[6656, 202048][..])
    );
    assert_eq!(t("blk.0.attn_q.weight").shape, [6656, 4096]);
    assert_eq!(t("blk.0.attn_k.weight").shape, [6656, 256]);
    assert_eq!(t("blk.0.attn_gate.weight").shape, [6656, 4096]);
    assert_eq!(t("blk.0.attn_output.weight").shape, [4096, 6656]);
    assert_eq!(t("blk.0.ffn_up.weight").shape, [6656, 19968]);
    assert_eq!(t("blk.0.ffn_down.weight").shape, [19968, 6656]);
    assert_eq!(t("blk.51.attn_k_norm.weight").shape, [128]);
    let q6: Vec<usize> = (0..52).filter(|&i| q4_k_m_more_bits(i, 52)).collect();
    for i in 0..52 {
        let want = if q6.contains(&i) {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        };
        assert_eq!(t(&format!("blk.{i}.attn_v.weight")).ty, want, "layer {i}");
        assert_eq!(t(&format!("blk.{i}.ffn_down.weight")).ty, want, "layer {i}");
        for n in [
            "attn_q",
            "attn_k",
            "attn_gate",
            "attn_output",
            "ffn_gate",
            "ffn_up",
        ] {
            assert_eq!(t(&format!("blk.{i}.{n}.weight")).ty, GgmlType::Q4_K);
        }
        for n in [
            "attn_norm",
            "post_attention_norm",
            "ffn_norm",
            "post_ffw_norm",
            "attn_q_norm",
            "attn_k_norm",
        ] {
            assert_eq!(t(&format!("blk.{i}.{n}.weight")).ty, GgmlType::F32);
        }
    }
    let gb = plan.data_bytes() as f64 / 1e9;
    assert!((16.5..17.5).contains(&gb), "{gb} GB");
    // The header the writer would emit accepts the plan (shapes are whole blocks).
    plan.gguf_writer(0).unwrap();
}

#[test]
fn qwen2_5_32b_plan() {
    let plan = SynthPlan::new(&SynthShape::preset("qwen2.5-32b").unwrap()).unwrap();
    assert_eq!(plan.tensors.len(), 3 + 12 * 64);
    let gb = plan.data_bytes() as f64 / 1e9;
    // Published Qwen2.5-32B-Instruct Q4_K_M: 19.85 GB.
    assert!((19.0..20.5).contains(&gb), "{gb} GB");
}

#[test]
fn bad_shapes_are_rejected() {
    let mut s = SynthShape::small(Architecture::MuseGlimmer);
    s.dim = 300;
    assert!(SynthPlan::new(&s).is_err());
    let mut s = SynthShape::small(Architecture::Qwen2);
    s.n_heads = 3;
    assert!(SynthPlan::new(&s).is_err());
    assert!(SynthPlan::new(&SynthShape::small(Architecture::Llama)).is_err());
}

/// Embedding-row input ([`Input::Rows`], how image rows enter): rows equal
/// to the looked-up token embeddings give the token path's logits bit for bit
/// (the embedding RMSNorm runs on both, llama.cpp's muse-glimmer.cpp:69), in
/// mixed runs of tokens and rows, and rows are refused when not whole rows.
/// A consistency check of the two input paths, not a reference comparison
/// (that is `crates/cli/tests/vision_e2e.rs` against llama-mtmd-cli).
#[test]
fn embedding_rows_take_the_place_of_token_embeddings() {
    use hearth_models::{Input, ModelError};
    let model = Model::from_gguf(Arc::new(small_file(Architecture::MuseGlimmer, 5))).unwrap();
    let (dim, vocab) = (model.config.dim, model.config.vocab_size);
    let tokens: Vec<u32> = (0..12).map(|i| (i * 53 % vocab) as u32).collect();
    let mut rows = vec![0.0f32; 4 * dim];
    for (row, &t) in rows.chunks_exact_mut(dim).zip(&tokens[4..8]) {
        model.mat(&model.tok_embd).dequantize_row(t as usize, row);
    }
    // The same split (llama.cpp decodes text and image chunks in separate
    // batches) made of tokens only.
    let mut hidden = Vec::new();
    let mut c = model.new_state(32);
    for part in [&tokens[..4], &tokens[4..8]] {
        model.forward(&mut c, part, Logits::None).unwrap();
    }
    let split = model.forward(&mut c, &tokens[8..], Logits::Last).unwrap();
    let mut d = model.new_state(32);
    model
        .forward_input(
            &mut d,
            Input::Tokens(&tokens[..4]),
            Logits::None,
            &[],
            &mut hidden,
        )
        .unwrap();
    model
        .forward_input(&mut d, Input::Rows(&rows), Logits::None, &[], &mut hidden)
        .unwrap();
    let got = model
        .forward_input(
            &mut d,
            Input::Tokens(&tokens[8..]),
            Logits::Last,
            &[],
            &mut hidden,
        )
        .unwrap();
    assert_eq!(got, split);
    let err = model
        .forward_input(
            &mut d,
            Input::Rows(&rows[1..]),
            Logits::None,
            &[],
            &mut hidden,
        )
        .unwrap_err();
    assert!(matches!(err, ModelError::BadRows { .. }), "{err}");
}
