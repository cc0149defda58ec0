//! `ModelConfig::kv_cache_bytes` (the size checked before allocating) against
//! what a real `State` holds: the lengths of its K and V vectors times the
//! element size, for real packaged models (a flat llama cache; gemma3's 3
//! global and 15 sliding layers) and a synthetic Muse Glimmer (bf16, window
//! pattern), with and without ring slack, contexts below and above the window.

use std::path::PathBuf;
use std::sync::Arc;

use hearth_gguf::GgufFile;
use hearth_models::synth::{write_gguf, SynthOptions, SynthPlan, SynthShape};
use hearth_models::{Architecture, KvData, KvDtype, KvTypes, Model, Numerics, State};

fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("models"),
        _ => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hearth/models"),
    }
}

/// Bytes actually held by the state's cache vectors.
fn held_bytes(state: &State) -> u64 {
    state
        .caches
        .iter()
        .map(|c| match &c.data {
            KvData::F16 { k, v } => 2 * (k.len() + v.len()),
            KvData::Bf16 { k, v } => 2 * (k.len() + v.len()),
            KvData::F32 { k, v } => 4 * (k.len() + v.len()),
            KvData::Rows { k, v } => k.len() + v.len(),
        } as u64)
        .sum()
}

fn check(model: &Model, contexts: &[usize]) {
    for &ctx in contexts {
        for slack in [0, 3, 64] {
            let state = State::with_ring_slack(model, ctx, slack);
            let want = model.config.kv_cache_bytes(model.kv_types, ctx, slack);
            assert_eq!(held_bytes(&state), want, "ctx {ctx} slack {slack}");
            assert_eq!(state.kv_bytes() as u64, want, "ctx {ctx} slack {slack}");
        }
    }
}

fn packaged(file: &str) -> Model {
    let path = models_dir().join(file);
    assert!(
        path.is_file(),
        "{} missing: run `python3 scripts/fetch_models.py`",
        path.display()
    );
    // The cache size does not depend on the CPU repacking: skip it.
    Model::load_unpacked(&path).unwrap()
}

#[test]
fn kv_bytes_of_config_equal_a_real_state() {
    let smollm2 = packaged("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        smollm2.config.kv_cache_bytes(smollm2.kv_types, 4096, 0),
        // 30 layers x 3 KV heads x 64 dims x 4096 positions, K and V in f16.
        30 * 3 * 64 * 4096 * 2 * 2
    );
    check(&smollm2, &[1, 100, 4096]);

    let gemma = packaged("gemma-3-270m-q4_k_m.gguf");
    // 3 global layers x ctx + 15 sliding x 512, 1 KV head x 256 dims, f16 K and V.
    assert_eq!(
        gemma.config.kv_cache_bytes(gemma.kv_types, 32768, 0),
        (3 * 32768 + 15 * 512) * 1024
    );
    check(&gemma, &[1, 300, 512, 515, 2000]);

    // Quantized caches: 34 (q8_0) or 18 (q4_0) bytes per 32 values.
    let mut smollm2 = smollm2;
    for (t, per_32) in [(KvDtype::Q8_0, 34), (KvDtype::Q4_0, 18)] {
        smollm2.set_kv_types(KvTypes::same(t)).unwrap();
        assert_eq!(
            smollm2.config.kv_cache_bytes(smollm2.kv_types, 4096, 0),
            30 * 3 * 64 / 32 * per_32 * 4096 * 2
        );
        check(&smollm2, &[1, 100, 4096]);
    }
    smollm2
        .set_kv_types(KvTypes {
            k: KvDtype::Q8_0,
            v: KvDtype::F16,
        })
        .unwrap();
    check(&smollm2, &[1, 100]);
    let mut gemma = gemma;
    gemma.set_kv_types(KvTypes::same(KvDtype::Q4_0)).unwrap();
    check(&gemma, &[1, 515, 2000]);

    let shape = SynthShape::small(Architecture::MuseGlimmer);
    let plan = SynthPlan::new(&shape).unwrap();
    let opts = SynthOptions {
        seed: 1,
        chunk_bytes: 1 << 20,
        threads: None,
    };
    let bytes = write_gguf(&plan, &opts, Vec::new(), |_| {}).unwrap();
    let file = GgufFile::from_bytes("synthetic-muse-glimmer.gguf", bytes).unwrap();
    let mut muse = Model::from_gguf(Arc::new(file)).unwrap();
    assert!(muse.config.n_sliding_layers() > 0);
    check(&muse, &[1, 7, 40, 300]);
    muse.set_numerics(Numerics::F32);
    check(&muse, &[1, 40]);
}

#[test]
fn absurd_contexts_saturate_instead_of_overflowing() {
    let smollm2 = packaged("SmolLM2-135M-Instruct.Q4_1.gguf");
    let c = &smollm2.config;
    assert_eq!(c.kv_cache_bytes(smollm2.kv_types, usize::MAX, 0), u64::MAX);
    // -c 99999999 (issue 14): 30 x 3 x 64 x 2 x 2 bytes per position.
    assert_eq!(
        c.kv_cache_bytes(smollm2.kv_types, 99_999_999, 0),
        99_999_999 * 23_040
    );
    assert!(c.forward_scratch_bytes(usize::MAX) < 1 << 30);
}
