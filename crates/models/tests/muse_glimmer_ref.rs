//! Muse Glimmer forward pass against an independent numpy reference of
//! llama.cpp 11434's muse-glimmer math (tests/reference/muse_glimmer_ref.py),
//! on a small synthetic model in llama.cpp's layout (`hearth synth`'s plan):
//! 8 layers (full layers 3 and 7), window 16, q/k-norm gains, logit scale and
//! soft-cap from the metadata, 44 tokens, so the ring wraps and the NoPE full
//! layers matter. Both sides compute in exact f32 (the reference's
//! `--precision f32`; ours `Numerics::F32`); logits must agree within 1e-3 of
//! the largest |logit|, for every position. (Bit-exactness with llama.cpp
//! itself, in `Numerics::Reference`, is tests/muse_parity.rs.)

mod common;

use common::reference::{assert_within_1e3_of_largest, numpy_reference};
use hearth_models::synth::{write_gguf_file, SynthPlan, SynthShape};
use hearth_models::{Architecture, Logits, Model, Numerics};

#[test]
fn logits_match_numpy_reference() {
    let dir = std::env::temp_dir().join(format!("hearth-mg-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("mg.gguf");
    let plan = SynthPlan::new(&SynthShape::small(Architecture::MuseGlimmer)).unwrap();
    write_gguf_file(&plan, 7, &gguf).unwrap();

    let tokens: Vec<u32> = (0..44).map(|i| (i * 37 + 11) % 512).collect();
    let (shape, want) = numpy_reference(
        "muse_glimmer_ref.py",
        &[&gguf],
        &tokens,
        &["--precision", "f32", "--all-positions"],
        &dir.join("ref.npy"),
    );
    assert_eq!(shape, vec![44, 512]);

    let mut model = Model::load(&gguf).unwrap();
    model.set_numerics(Numerics::F32);
    assert_eq!(
        model
            .config
            .layers
            .iter()
            .filter(|l| !l.is_sliding())
            .count(),
        2
    );
    // Prefill in two chunks (exercising the ring across calls), all positions.
    let mut state = model.new_state(64);
    let mut got = model
        .forward(&mut state, &tokens[..30], Logits::All)
        .unwrap();
    got.extend(
        model
            .forward(&mut state, &tokens[30..], Logits::All)
            .unwrap(),
    );
    assert_within_1e3_of_largest(&got, &want, "muse-glimmer");
    std::fs::remove_dir_all(&dir).unwrap();
}
