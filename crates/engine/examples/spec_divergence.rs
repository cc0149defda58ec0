//! Where speculative greedy output departs from plain greedy in the default
//! (llama.cpp-matching, not batch-invariant) numerics: generates with plain
//! greedy, recording the top-1/top-2 logit gap at every step, then with n-gram
//! speculation (K drafts), and prints the first differing step and its gap.
//!
//!   cargo run --release -p hearth-engine --example spec_divergence -- MODEL.gguf PROMPT_FILE N K

use hearth_engine::generate::{Flow, GenerateParams};
use hearth_engine::sampler::{Sampler, SamplerConfig};
use hearth_engine::spec::ngram::NgramDrafter;
use hearth_engine::spec::{generate_speculative, SpecParams};
use hearth_models::{Logits, Model, State};
use hearth_tokenizer::Tokenizer;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (path, prompt_file) = (&a[1], &a[2]);
    let n: usize = a[3].parse().expect("N");
    let k: usize = a[4].parse().expect("K");
    let model = Model::load(path).expect("model");
    let tok = Tokenizer::from_gguf(model.file().metadata()).expect("tokenizer");
    let text = std::fs::read_to_string(prompt_file).expect("prompt");
    let chat = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
    let ids = tok.encode(&chat, true, true);
    // Plain greedy with the logit gaps.
    let mut state = State::new(&model, 4096);
    let mut logits = model
        .forward(&mut state, &ids, Logits::Last)
        .expect("prefill");
    let mut plain = Vec::new();
    let mut gaps = Vec::new();
    for _ in 0..n {
        let mut sorted: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect();
        sorted.sort_by(|x, y| y.0.partial_cmp(&x.0).unwrap());
        gaps.push(sorted[0].0 - sorted[1].0);
        let t = sorted[0].1;
        if tok.is_eog(t) {
            break;
        }
        plain.push(t);
        logits = model
            .forward(&mut state, &[t], Logits::Last)
            .expect("decode");
    }
    let mut state = State::with_ring_slack(&model, 4096, k);
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let params = GenerateParams {
        max_tokens: plain.len(),
        stop: vec![],
        ignore_eos: false,
    };
    let (g, _) = generate_speculative(
        &model,
        &mut state,
        &tok,
        &mut sampler,
        &mut NgramDrafter::default(),
        &ids,
        &params,
        SpecParams { n_draft: k },
        |_| Flow::Continue,
    )
    .expect("spec");
    // The batch-shape effect itself: the logits row after plain[..i] computed
    // by single-token decode vs as the last row of a 4-token pass.
    if let Some(i) = plain
        .iter()
        .zip(&g.tokens)
        .position(|(x, y)| x != y)
        .filter(|&i| i >= 3)
    {
        let ctx: Vec<u32> = ids.iter().chain(&plain[..i]).copied().collect();
        // Prefill all of ctx but the last n tokens, then one pass over those n.
        let last_pass = |n: usize, logits: Logits| {
            let mut state = State::new(&model, 4096);
            let split = ctx.len() - n;
            model
                .forward(&mut state, &ctx[..split], Logits::None)
                .unwrap();
            model.forward(&mut state, &ctx[split..], logits).unwrap()
        };
        let single = last_pass(1, Logits::Last);
        let block = last_pass(4, Logits::All);
        let last = &block[3 * single.len()..];
        let diff = single
            .iter()
            .zip(last)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let amax = single.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!("step {i}: max |logit(1-token pass) - logit(4-token pass)| = {diff:.4} (max |logit| {amax:.2})");
    }
    match plain.iter().zip(&g.tokens).position(|(x, y)| x != y) {
        None => println!("identical ({} tokens); smallest plain top-2 gap {:.6}", plain.len(), gaps.iter().cloned().fold(f32::INFINITY, f32::min)),
        Some(i) => println!("first difference at step {i}: plain top-1/top-2 logit gap there {:.6} (median gap {:.3})", gaps[i], {
            let mut s = gaps.clone();
            s.sort_by(|x, y| x.partial_cmp(y).unwrap());
            s[s.len() / 2]
        }),
    }
}
