//! `hearth run`: generate text from a prompt, streaming it to stdout.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hearth_engine::generate::{generate, Flow, GenerateParams, GenerationStats};
use hearth_engine::sampler::{Sampler, SamplerConfig};
use hearth_engine::spec::{generate_speculative, SpecParams, SpecStats};
use hearth_models::{Backend, LayerKind, Model};

use super::spec::{DrafterFactory, SpecArgs};
use crate::device::Device;
use hearth_tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model name (see `hearth pull --list`) or .gguf path [default: qwen2.5-coder-0.5b, pulled on first use]
    #[arg(short, long)]
    pub model: Option<String>,
    /// Prompt text.
    #[arg(short, long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short, long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1 = until end of generation or the context is full).
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", default_value_t = 128,
          value_parser = crate::cli_args::parse_n_predict, allow_negative_numbers = true)]
    pub n_predict: usize,
    /// Sampling temperature; 0 or -1 = greedy (deterministic).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 or negative = off).
    #[arg(long, default_value_t = 40, value_parser = crate::cli_args::parse_top_k,
          allow_negative_numbers = true)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens below MIN_P times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalize repeats of the last --repeat-last-n tokens (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Tokens the repeat penalties look back over (0 = off, -1 = the whole context).
    #[arg(long, default_value_t = 64, value_parser = crate::cli_args::parse_repeat_last_n,
          allow_negative_numbers = true)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// RNG seed (0 or -1 = random).
    #[arg(short, long, default_value_t = 0, value_parser = crate::cli_args::parse_seed,
          allow_negative_numbers = true)]
    pub seed: u64,
    /// Keep generating past end-of-generation tokens (until -n or the context).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Process escapes in the prompt (\n, \t, \\, \xHH, … as llama.cpp does).
    #[arg(short = 'e', long, overrides_with = "no_escape")]
    pub escape: bool,
    /// Take the prompt's backslashes literally (the default).
    #[arg(long, overrides_with = "escape")]
    pub no_escape: bool,
    /// llama.cpp's -ngl, accepted: hearth places layers by --device (cpu: all
    /// on the CPU; cuda: all on the GPU).
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N",
          value_parser = crate::cli_args::parse_gpu_layers, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<crate::cli_args::GpuLayers>,
    /// Context size (tokens of prompt + generation).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Wrap the prompt in the model's chat format as one user turn.
    #[arg(long)]
    pub chat: bool,
    /// Stop when this text is generated (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Worker threads [default: all cores].
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Also write the speed figures as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Backend: cpu or cuda.
    #[arg(long, value_enum, default_value_t = crate::device::Device::Cpu)]
    pub device: crate::device::Device,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn run(args: Args) -> Result<()> {
    crate::device::check(args.device)?;
    crate::cli_args::check_run(&args)?;
    crate::init_threads(args.threads)?;
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?,
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE"),
    };
    let prompt = crate::cli_args::escaped(args.escape, prompt)?;
    let path = crate::registry::resolve_model(args.model.as_deref())?;
    crate::limits::check_context(&path, args.ctx, 1, args.device)?;
    args.spec.check(args.device)?;
    // The GPU copies the file's blocks itself: no CPU repacking for it.
    let load = if args.device == Device::Cuda {
        Model::load_unpacked
    } else {
        Model::load
    };
    let model = Arc::new(load(&path).with_context(|| format!("loading {}", path.display()))?);
    let tokenizer =
        Tokenizer::from_gguf(model.file().metadata()).context("building the tokenizer")?;
    let text = if args.chat {
        chat_prompt(&tokenizer, &prompt)?
    } else {
        prompt
    };
    let ids = tokenizer.encode(&text, true, args.chat);
    if ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    if ids.len() >= args.ctx {
        bail!(
            "prompt of {} tokens does not fit the context of {} (raise -c)",
            ids.len(),
            args.ctx
        );
    }
    let job = Job {
        args: &args,
        model: &model,
        tokenizer: &tokenizer,
        ids: &ids,
    };
    #[cfg(feature = "cuda")]
    if args.device == Device::Cuda {
        let gm = crate::cuda::load(model.clone())?;
        let gpu = gm.gpu.clone();
        let factory = args.spec.factory(&model, |p| {
            let draft = Model::load_unpacked(p)?;
            crate::cuda::upload(gpu, Arc::new(draft))
        })?;
        let g = job.generate(&gm, factory)?;
        let bytes = g.state.kv_bytes();
        let mib = bytes as f64 / (1u64 << 20) as f64;
        let kv = format!(
            "KV cache: {mib:.1} MiB on the GPU (device: cuda; rings of window + {} slots)",
            hearth_cuda::GPU_CHUNK
        );
        return job.report(&path, &g.stats, g.spec.as_ref(), &kv, bytes);
    }
    let factory = args.spec.factory(&model, |p| Ok(Model::load(p)?))?;
    let g = job.generate(&*model, factory)?;
    job.report(
        &path,
        &g.stats,
        g.spec.as_ref(),
        &kv_summary(&model, &g.state),
        g.state.kv_bytes(),
    )
}

/// What a generation left: the state, its statistics and, when speculating,
/// K and the acceptance statistics.
struct Generated<S> {
    state: S,
    stats: GenerationStats,
    spec: Option<(usize, SpecStats)>,
}

/// One `run` invocation, on whichever backend.
struct Job<'a> {
    args: &'a Args,
    /// The host model (tokenizer, config; DFlash's target).
    model: &'a Arc<Model>,
    tokenizer: &'a Tokenizer,
    ids: &'a [u32],
}

impl Job<'_> {
    /// Generates on `backend` (speculatively when `factory` is set), streaming
    /// the text to stdout; returns the final state and the statistics.
    fn generate<B: Backend + 'static>(
        &self,
        backend: &B,
        factory: Option<DrafterFactory<B>>,
    ) -> Result<Generated<B::State>> {
        let args = self.args;
        let config = SamplerConfig {
            temperature: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: args.repeat_last_n.min(args.ctx),
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            seed: args.seed,
        };
        let mut sampler = Sampler::new(config)?;
        let params = GenerateParams {
            max_tokens: args.n_predict.min(args.ctx - self.ids.len()),
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
        };
        let mut out = std::io::stdout().lock();
        let on_text = |t: &str| {
            let ok = out.write_all(t.as_bytes()).and_then(|_| out.flush());
            if ok.is_ok() {
                Flow::Continue
            } else {
                Flow::Stop
            }
        };
        Ok(match &factory {
            None => {
                let mut state = backend.new_state(args.ctx, 0)?;
                let stats = generate(
                    backend,
                    &mut state,
                    self.tokenizer,
                    &mut sampler,
                    self.ids,
                    &params,
                    on_text,
                )?;
                Generated {
                    state,
                    stats,
                    spec: None,
                }
            }
            Some(f) => {
                let mut setup = f.make(&args.spec, self.model, args.ctx, &config)?;
                // Rings keep K extra slots so rejected positions can be rolled back.
                let mut state = backend.new_state(args.ctx, setup.n_draft)?;
                let spec = SpecParams {
                    n_draft: setup.n_draft,
                };
                let (stats, sp) = generate_speculative(
                    backend,
                    &mut state,
                    self.tokenizer,
                    &mut sampler,
                    setup.drafter.as_mut(),
                    self.ids,
                    &params,
                    spec,
                    on_text,
                )?;
                Generated {
                    state,
                    stats,
                    spec: Some((setup.n_draft, sp)),
                }
            }
        })
    }

    /// The stderr summary and `--stats-json`.
    fn report(
        &self,
        path: &Path,
        stats: &GenerationStats,
        spec_stats: Option<&(usize, SpecStats)>,
        kv: &str,
        kv_bytes: usize,
    ) -> Result<()> {
        let args = self.args;
        eprintln!();
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | finish: {}",
            stats.prompt_tokens,
            stats.prefill_tok_s(),
            stats.generated_tokens,
            stats.decode_tok_s(),
            stats.finish.as_str()
        );
        eprintln!("{kv}");
        if let Some((k, sp)) = spec_stats {
            eprintln!("{}", spec_summary(args.spec.spec.as_str(), *k, sp));
        }
        if let Some(p) = &args.stats_json {
            let mut json = serde_json::json!({
                "model": path,
                "device": if args.device == Device::Cuda { "cuda" } else { "cpu" },
                "prompt_tokens": stats.prompt_tokens,
                "prefill_tok_s": stats.prefill_tok_s(),
                "generated_tokens": stats.generated_tokens,
                "decode_tok_s": stats.decode_tok_s(),
                "finish_reason": stats.finish.as_str(),
                "kv_bytes": kv_bytes,
                "spec": args.spec.spec.as_str(),
            });
            if let Some((k, sp)) = spec_stats {
                let extra = serde_json::json!({
                    "n_draft": k,
                    "block_length": args.spec.block_length,
                    "mean_accepted": sp.mean_accepted(),
                    "tokens_per_target_forward": sp.tokens_per_forward(),
                    "acceptance_rate": sp.acceptance_rate(),
                    "acceptance_by_position": sp.acceptance_by_position(),
                    "target_forwards": sp.target_forwards,
                    "drafted_at": sp.drafted_at,
                    "accepted_at": sp.accepted_at,
                    "draft_s": sp.draft_secs,
                    "verify_s": sp.verify_secs,
                });
                if let (Some(o), serde_json::Value::Object(e)) = (json.as_object_mut(), extra) {
                    o.extend(e);
                }
            }
            std::fs::write(p, serde_json::to_string_pretty(&json)? + "\n")
                .with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    }
}

/// "spec: …" line: how much speculation bought.
pub fn spec_summary(kind: &str, n_draft: usize, s: &SpecStats) -> String {
    let by_pos: Vec<String> = s
        .acceptance_by_position()
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    format!(
        "spec: {kind}, n_draft {n_draft} | {} target forwards, {:.2} tokens per forward, mean accepted {:.2}, acceptance {:.1}% | by position [{}] | draft {:.2} s, verify {:.2} s",
        s.target_forwards,
        s.tokens_per_forward(),
        s.mean_accepted(),
        100.0 * s.acceptance_rate(),
        by_pos.join(", "),
        s.draft_secs,
        s.verify_secs
    )
}

/// "KV cache: …" line describing the hybrid layout.
pub fn kv_summary(model: &Model, state: &hearth_models::State) -> String {
    let c = &model.config;
    let per_slot = 2 * c.n_kv_heads * c.head_dim * 2; // K and V, 16-bit
    let mut global = 0;
    let mut sliding = 0;
    let mut ring_slots = 0;
    for (kind, cache) in c.layers.iter().zip(&state.caches) {
        match kind {
            LayerKind::Global { .. } => global += 1,
            LayerKind::Sliding { .. } => {
                sliding += 1;
                ring_slots = cache.slots;
            }
        }
    }
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let full = c.n_layers * state.max_ctx * per_slot;
    format!(
        "KV cache: {:.1} MiB = {global} global layers x {} positions + {sliding} sliding layers x {ring_slots} slots ({:?}, {per_slot} B per layer-position); a full cache would take {:.1} MiB",
        mib(state.kv_bytes()),
        state.max_ctx,
        model.kv_dtype,
        mib(full)
    )
}

/// A minimal one-turn chat wrapper chosen from the model's special tokens
/// (the full template engine lives in the chat layer).
fn chat_prompt(tok: &Tokenizer, user: &str) -> Result<String> {
    if tok.token_id("<|im_start|>").is_some() {
        Ok(format!(
            "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        ))
    } else if tok.token_id("<start_of_turn>").is_some() {
        Ok(format!(
            "<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"
        ))
    } else if tok.token_id("<|start|>").is_some() && tok.token_id("<|message|>").is_some() {
        Ok(format!(
            "<|start|>user<|message|>{user}<|eot|><|start|>assistant"
        ))
    } else {
        bail!("--chat: no known chat format for this model's vocabulary")
    }
}
