//! The engine's loops are generic over `hearth_models::Backend`; CI has no
//! GPU, so these tests drive them through a second, test-only backend with
//! the CUDA backend's contract: its own state type, verify passes that are
//! ordinary multi-row passes (not batch-invariant), and no hidden-state taps.
//! It computes with the CPU model, so its output must equal the CPU model's
//! own (the independent reference here is plain greedy decoding on `Model`,
//! one token per forward pass).

mod common;

use common::model_path;
use std::sync::Arc;

use hearth_engine::generate::{generate, Flow, GenerateParams};
use hearth_engine::sampler::{Sampler, SamplerConfig};
use hearth_engine::spec::draft_model::DraftModelDrafter;
use hearth_engine::spec::ngram::NgramDrafter;
use hearth_engine::spec::{generate_speculative, Draft, Drafter, SpecError, SpecParams};
use hearth_models::backend::testing::GpuLike;
use hearth_models::{Backend, BackendState, Model, Numerics};
use hearth_tokenizer::Tokenizer;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn load(numerics: Numerics) -> (Arc<Model>, Tokenizer) {
    let mut m = Model::load(model_path(SMOLLM2)).unwrap();
    m.set_numerics(numerics);
    (
        Arc::new(m),
        Tokenizer::from_gguf_path(model_path(SMOLLM2)).unwrap(),
    )
}

const PROMPTS: [&str; 4] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "fn gcd(a: u64, b: u64) -> u64 {\n",
    "# Rename the variable x to count:\nx = 0\nfor item in items:\n    x += 1\nprint(x)\n# After:\n",
    "The capital of France is",
];

fn params(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        stop: Vec::new(),
        ignore_eos: true,
    }
}

fn run_plain<B: Backend>(
    b: &B,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    sampling: SamplerConfig,
) -> (Vec<u32>, B::State) {
    let mut state = b.new_state(256, 0).unwrap();
    let mut sampler = Sampler::new(sampling).unwrap();
    let g = generate(b, &mut state, tok, &mut sampler, prompt, &params(n), |_| {
        Flow::Continue
    })
    .unwrap();
    (g.tokens, state)
}

/// Greedy and seeded sampling through the generic loop: token-identical to
/// the CPU model (the shipped llama.cpp-matching numerics).
#[test]
fn generation_on_a_second_backend_equals_the_cpu_model() {
    let (model, tok) = load(Numerics::Reference);
    let gpu_like = GpuLike {
        model: model.clone(),
    };
    let sampled = SamplerConfig {
        temperature: 0.8,
        seed: 42,
        ..SamplerConfig::greedy()
    };
    for p in PROMPTS {
        let ids = tok.encode(p, true, false);
        for sampling in [SamplerConfig::greedy(), sampled] {
            let (want, _) = run_plain(&*model, &tok, &ids, 24, sampling);
            let (got, state) = run_plain(&gpu_like, &tok, &ids, 24, sampling);
            assert_eq!(got, want, "prompt {p:?}, {sampling:?}");
            // One prefill, then one pass per generated token but the last.
            assert_eq!(state.forwards, 24);
            assert_eq!(state.pos(), ids.len() + 23);
        }
    }
}

/// Speculation through the generic loop with the n-gram drafter and a draft
/// model that itself runs on the second backend. Exact f32 numerics, where a
/// plain multi-row verify pass computes every row as a one-row pass would,
/// so greedy speculative output must equal plain greedy output on `Model`.
#[test]
fn speculation_on_a_second_backend_equals_plain_greedy() {
    let (model, tok) = load(Numerics::F32);
    let gpu_like = Arc::new(GpuLike {
        model: model.clone(),
    });
    let greedy = SamplerConfig::greedy();
    let vocab = model.config.vocab_size;
    let mut ngram = NgramDrafter::default();
    let mut draft = DraftModelDrafter::new(gpu_like.clone(), vocab, 256, 3, &greedy).unwrap();
    for p in &PROMPTS[..3] {
        let ids = tok.encode(p, true, false);
        let (want, _) = run_plain(&*model, &tok, &ids, 24, greedy);
        let drafters: [(&str, &mut dyn Drafter, usize); 2] =
            [("ngram", &mut ngram, 4), ("draft", &mut draft, 3)];
        for (name, drafter, k) in drafters {
            drafter.reset();
            let mut state = gpu_like.new_state(256, k).unwrap();
            let mut sampler = Sampler::new(greedy).unwrap();
            let spec = SpecParams { n_draft: k };
            let (g, stats) = generate_speculative(
                &*gpu_like,
                &mut state,
                &tok,
                &mut sampler,
                drafter,
                &ids,
                &params(24),
                spec,
                |_| Flow::Continue,
            )
            .unwrap();
            assert_eq!(g.tokens, want, "prompt {p:?}, {name}");
            assert_eq!(
                state.forwards as u64,
                stats.target_forwards + 1,
                "{name}: prefill + one verify pass per cycle"
            );
            if name == "draft" {
                // A model drafting for itself agrees with every draft.
                assert!(stats.accepted > 0, "{name}: nothing accepted: {stats:?}");
            }
        }
    }
}

/// A drafter that reads hidden states (like DFlash).
struct TapDrafter;

impl Drafter for TapDrafter {
    fn taps(&self) -> &[usize] {
        &[1]
    }
    fn propose(&mut self, _context: &[u32], _k: usize) -> Result<Draft, SpecError> {
        Ok(Draft::default())
    }
    fn commit(&mut self, _tokens: &[u32], _hidden: &[f32]) -> Result<(), SpecError> {
        Ok(())
    }
    fn reset(&mut self) {}
    fn rollback(&mut self, _pos: usize) {}
}

/// A backend without taps refuses a tapping drafter with its error, at the
/// prefill, before generating anything.
#[test]
fn tapping_drafter_on_a_backend_without_taps_is_a_clear_error() {
    let (model, tok) = load(Numerics::Reference);
    let gpu_like = GpuLike { model };
    let mut state = gpu_like.new_state(64, 3).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let ids = tok.encode("Hello", true, false);
    let mut text = String::new();
    let err = generate_speculative(
        &gpu_like,
        &mut state,
        &tok,
        &mut sampler,
        &mut TapDrafter,
        &ids,
        &params(8),
        SpecParams { n_draft: 3 },
        |t| {
            text.push_str(t);
            Flow::Continue
        },
    )
    .expect_err("taps must be refused");
    assert_eq!(
        err.to_string(),
        "the test backend does not support hidden-state taps"
    );
    assert!(text.is_empty());
}
