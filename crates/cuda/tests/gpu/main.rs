//! GPU tests: each kernel family against a CPU reference on random inputs of
//! odd sizes, and whole-model logits of the CUDA backend against the CPU
//! backend on synthetic qwen2 and muse-glimmer models. They need a CUDA GPU
//! and are ignored elsewhere; on the GPU machine run
//! `cargo test -p hearth-cuda --release --test gpu -- --ignored --nocapture`
//! (or the built test binary with `--ignored --nocapture --test-threads 1`).
//!
//! The error measure is the normalised RMS error ‖gpu − ref‖ / ‖ref‖ (as
//! llama.cpp's test-backend-ops uses), computed in f64.
//!
//! One test binary (`--test gpu`); its tests are grouped by subject in the
//! modules below. The packaged-model test stays at the top level, where
//! bench/cuda/scripts/real-model-agreement.sh runs it by its exact name.

mod attention;
mod common;
mod kernels;
mod models;
mod states;
mod vision;

use std::sync::Arc;

use crate::common::*;
use hearth_cuda::GpuModel;
use hearth_models::Model;

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
