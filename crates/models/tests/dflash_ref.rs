//! DFlash and DFlash2 drafter math against an independent numpy reference of
//! llama.cpp 11434's dflash graph (tests/reference/dflash_ref.py, on top of
//! muse_glimmer_ref.py for the target's tapped hidden states), on a small
//! synthetic Muse Glimmer target and synthetic drafts matched to it (`hearth
//! synth --arch dflash|dflash2`'s plans). Both sides compute in exact f32.
//! Two draft calls: one over the prefill's hidden rows from an empty cache,
//! one over a verify pass's rows on top of it. DFlash1: the draft logits of
//! every block row within 1e-3 of the largest |logit|, for an all-full draft
//! and an all-sliding one whose window is shorter than the context (the
//! per-query window: block row t sees W−1−t context positions). DFlash2
//! (convolutions, post-norms, logit scale and cap): the selector lattice
//! rows' candidates equal and their scores within 1e-3 of the largest.
//! (Bit-level agreement with llama.cpp itself: tests/dflash_parity.rs.)

use std::path::Path;

mod common;

use common::reference::{assert_within_1e3_of_largest, numpy_reference};
use hearth_models::dflash::DflashModel;
use hearth_models::synth::{write_gguf_file, SynthPlan, SynthShape};
use hearth_models::synth_dflash::{dflash_plan, Dflash2Shape, DflashShape};
use hearth_models::Backend;
use hearth_models::{Architecture, Logits, Model, Numerics};

fn check(window: Option<usize>, dflash2: bool, tag: &str) {
    let dir = std::env::temp_dir().join(format!("hearth-dflash-ref-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target_path = dir.join("target.gguf");
    let plan = SynthPlan::new(&SynthShape::small(Architecture::MuseGlimmer)).unwrap();
    write_gguf_file(&plan, 11, &target_path).unwrap();
    let mut target = Model::load(&target_path).unwrap();
    target.set_numerics(Numerics::F32);

    let mut shape = DflashShape::for_target(&target.config);
    shape.block_size = 8;
    shape.window = window;
    // Taps out of order (llama.cpp keeps the file's order).
    shape.target_layers = vec![5, 2, 6, 3];
    if dflash2 {
        shape.dflash2 = Some(Dflash2Shape::default());
        shape.post_norms = true;
    }
    let draft_path = dir.join("draft.gguf");
    let dplan = dflash_plan(&target.config, &shape).unwrap();
    write_gguf_file(&dplan, 5, &draft_path).unwrap();
    let draft = DflashModel::load(&draft_path, &target).unwrap();
    assert_eq!(draft.config.target_layers, vec![5, 2, 6, 3]);
    assert_eq!(draft.is_dflash2(), dflash2);

    // 30 prompt tokens, then a verify pass of 4; block length 6 (< the trained 8).
    let tokens: Vec<u32> = (0..36).map(|i| (i * 53 + 7) % 511).collect();
    let (s0, s1, b) = (30usize, 34usize, 6usize);
    let (ref_shape, want) = numpy_reference(
        "dflash_ref.py",
        &[&target_path, &draft_path],
        &tokens,
        &["--split", &format!("{s0},{s1}"), "--block", &b.to_string()],
        &dir.join("ref.npy"),
    );
    let vocab = target.config.vocab_size;
    let k = draft.config.dflash2.as_ref().map(|d| d.top_k);
    let width = k.map_or(vocab, |k| k + k * k);
    assert_eq!(ref_shape, vec![2 * (b - 1), width]);

    let taps = draft.config.target_layers.clone();
    let mut state = target.new_state(64);
    let mut dstate = draft.new_state(64);
    let mask = draft.config.mask_token;
    let mut h0 = Vec::new();
    target
        .forward_tapped(&mut state, &tokens[..s0], Logits::None, &taps, &mut h0)
        .unwrap();
    // Block rows 1..B: their logits (DFlash1) or lattice rows (DFlash2).
    let rows_of = |out: hearth_models::dflash::DraftOutput| -> Vec<f32> {
        match (out.lattice, k) {
            (Some(l), Some(k)) => l
                .chunks_exact(target.config.dim)
                .skip(1)
                .flat_map(|r| r[..k + k * k].to_vec())
                .collect(),
            _ => out.logits,
        }
    };
    let mut block = vec![mask; b];
    block[0] = tokens[s0];
    let mut got = rows_of(
        draft
            .forward(&target, &mut dstate, &h0, &block, 1..b)
            .unwrap(),
    );
    let mut h1 = Vec::new();
    target
        .forward_tapped(&mut state, &tokens[s0..s1], Logits::All, &taps, &mut h1)
        .unwrap();
    block[0] = tokens[s1];
    got.extend(rows_of(
        draft
            .forward(&target, &mut dstate, &h1, &block, 1..b)
            .unwrap(),
    ));
    assert_eq!(dstate.ctx_len, s1);
    if let Some(k) = k {
        for (i, (a, w)) in got
            .chunks_exact(width)
            .zip(want.chunks_exact(width))
            .enumerate()
        {
            assert_eq!(a[..k], w[..k], "{tag}: row {i} candidates");
        }
    }

    assert!(
        want.iter().any(|v| v.abs() > 1.0),
        "{tag}: degenerate logits"
    );
    assert_within_1e3_of_largest(&got, &want, tag);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dflash_global_draft_matches_numpy_reference() {
    check(None, false, "global");
}

/// W = 12 < 34 context positions: block row t sees the 11 − t context
/// positions before the block.
#[test]
fn dflash_sliding_draft_matches_numpy_reference() {
    check(Some(12), false, "sliding");
}

#[test]
fn dflash2_lattice_matches_numpy_reference() {
    check(None, true, "dflash2");
}

#[test]
fn dflash_rejects_a_mismatched_or_incomplete_draft() {
    let dir = std::env::temp_dir().join(format!("hearth-dflash-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let small = |dim: usize, path: &Path| {
        let mut s = SynthShape::small(Architecture::Qwen2);
        s.dim = dim;
        s.head_dim = dim / s.n_heads;
        write_gguf_file(&SynthPlan::new(&s).unwrap(), 0, path).unwrap();
        Model::load(path).unwrap()
    };
    let t256 = small(256, &dir.join("t256.gguf"));
    let t512 = small(512, &dir.join("t512.gguf"));
    let mut plan = dflash_plan(&t256.config, &DflashShape::for_target(&t256.config)).unwrap();
    let p = dir.join("d.gguf");
    write_gguf_file(&plan, 0, &p).unwrap();
    let e = DflashModel::load(&p, &t512)
        .err()
        .expect("width mismatch must fail");
    assert!(e.to_string().contains("differs from the target"), "{e}");
    // A target is not a draft.
    let e = DflashModel::load(dir.join("t256.gguf"), &t256)
        .err()
        .expect("not a draft");
    assert!(e.to_string().contains("expected \"dflash\""), "{e}");
    // A missing tensor is named.
    plan.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    write_gguf_file(&plan, 0, &p).unwrap();
    let e = DflashModel::load(&p, &t256)
        .err()
        .expect("missing tensor must fail");
    assert!(e.to_string().contains("blk.1.ffn_up.weight"), "{e}");
    // What llama.cpp requires, refuses, or runs and hearth does not: named.
    let base = dflash_plan(&t256.config, &DflashShape::for_target(&t256.config)).unwrap();
    let refused = |edit: &dyn Fn(&mut hearth_models::synth::SynthPlan), want: &str| {
        let mut plan = base.clone();
        edit(&mut plan);
        write_gguf_file(&plan, 0, &p).unwrap();
        let e = DflashModel::load(&p, &t256).err().expect(want);
        assert!(e.to_string().contains(want), "{e}");
    };
    refused(
        &|p| p.metadata.retain(|(k, _)| k != "dflash.target_layers"),
        "requires 'target_layers'",
    );
    refused(
        &|p| {
            p.metadata
                .retain(|(k, _)| k != "dflash.attention.layer_norm_rms_epsilon")
        },
        "dflash.attention.layer_norm_rms_epsilon",
    );
    refused(
        &|p| {
            p.metadata.push((
                "dflash.hidden_activation".into(),
                hearth_gguf::Value::String("relu".into()),
            ))
        },
        "unsupported DFlash hidden activation: relu",
    );
    refused(
        &|p| {
            p.metadata.push((
                "dflash.rope.dimension_sections".into(),
                hearth_gguf::Value::Array(
                    hearth_gguf::ValueType::I32,
                    vec![hearth_gguf::Value::I32(32); 4],
                ),
            ))
        },
        "M-RoPE",
    );
    refused(
        &|p| {
            let mut t = p.tensor("output_norm.weight").unwrap().clone();
            t.name = "blk.0.attn_bogus.weight".into();
            p.tensors.push(t);
        },
        "unexpected tensor 'blk.0.attn_bogus.weight'",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
