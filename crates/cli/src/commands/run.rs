//! `hearth run`: answer a prompt, streaming the answer to stdout.
//!
//! The prompt is rendered as one user turn with the model's own chat format
//! (the prompter `hearth serve` uses, `hearth_chat::prompter`) unless the
//! model has none or `--raw` asks for plain completion. Generation is the
//! engine's turn machine (`hearth_engine::turn`), stepped here on either
//! backend; the answer goes to stdout, reasoning to stderr, statistics to
//! stderr and `--stats-json`.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hearth_chat::parser::OutputParser;
use hearth_chat::prompter::{ChatRuns, ImageFraming, Prompter};
use hearth_engine::prompt::Prompt;
use hearth_engine::sampler::{Sampler, SamplerConfig};
use hearth_engine::spec::factory::{DrafterFactory, MakeDrafter, SpecConfig};
use hearth_engine::spec::SpecStats;
use hearth_engine::turn::{FinishReason, Turn, TurnParams, TurnStats};
use hearth_grammar::{Grammars, OutputGrammar};
use hearth_models::{Backend, LayerKind, Model};
use hearth_tokenizer::Tokenizer;
use hearth_vision::prompt::{ImageInput, MEDIA_MARKER};
use serde_json::{json, Map, Value};

use super::interactive::Chat;
use super::output::Output;
pub use super::run_args::Args;
use crate::device::Device;

/// `hearth run`'s checks before the model loads.
fn check_run(args: &Args) -> Result<()> {
    if let Some(p) = &args.stats_json {
        crate::cli_args::check_output_path("--stats-json", p)?;
    }
    crate::cli_args::note_gpu_layers(args.n_gpu_layers, args.device);
    Ok(())
}

/// The output constraint from --json-schema / --grammar.
fn output_grammar(
    args: &Args,
    tokenizer: &Arc<Tokenizer>,
    n_vocab: usize,
    format: hearth_chat::parser::OutputFormat,
) -> Result<Option<(Grammars, OutputGrammar)>> {
    if args.json_schema.is_none() && args.grammar.is_none() {
        return Ok(None);
    }
    let grammars = Grammars::new(tokenizer.clone(), n_vocab)?;
    let g = if let Some(p) = &args.json_schema {
        let text = std::fs::read_to_string(p)
            .with_context(|| format!("reading --json-schema {}", p.display()))?;
        let schema: Value = serde_json::from_str(&text)
            .with_context(|| format!("--json-schema {}: not JSON", p.display()))?;
        grammars
            .json_schema(format, &schema)
            .with_context(|| format!("--json-schema {}", p.display()))?
    } else {
        let p = args.grammar.as_ref().expect("checked above");
        let text = std::fs::read_to_string(p)
            .with_context(|| format!("reading --grammar {}", p.display()))?;
        grammars
            .lark(&text)
            .with_context(|| format!("--grammar {} (llguidance Lark syntax)", p.display()))?
    };
    Ok(Some((grammars, g)))
}

pub fn run(args: Args) -> Result<()> {
    let started = std::time::Instant::now();
    crate::VERBOSE.store(args.verbose, std::sync::atomic::Ordering::Relaxed);
    crate::device::check(args.device)?;
    check_run(&args)?;
    args.spec.precheck(args.device)?;
    crate::init_threads(args.threads)?;
    let text = match read_prompt(&args)? {
        Some(t) => Some(crate::cli_args::escaped(args.escape, t)?),
        None => None,
    };
    if !args.image.is_empty() && args.mmproj.is_none() {
        bail!("--image needs --mmproj FILE (the model's multimodal projector GGUF)");
    }
    let path = crate::store::resolve_model(args.model.as_deref())?;
    let kv = args.kv.for_device(args.device)?;
    crate::limits::check_context(&path, args.ctx, 1, args.device, kv)?;
    let target = super::spec::Target {
        arg: args.model.as_deref(),
        path: &path,
    };
    let spec = args.spec.config(args.device, target)?;
    // The GPU copies the file's blocks itself: no CPU repacking for it.
    let load = if args.device == Device::Cuda {
        Model::load_unpacked
    } else {
        Model::load
    };
    let spinner = super::progress::Spinner::start(format!(
        "loading {}",
        args.model.as_deref().unwrap_or("the model")
    ));
    let mut model = load(&path).with_context(|| format!("loading {}", path.display()))?;
    drop(spinner);
    model
        .set_kv_types(kv)
        .map_err(|e| anyhow::anyhow!("--cache-type-k/-v {kv}: {e}"))?;
    let model = Arc::new(model);
    let load_time = started.elapsed();
    let tokenizer =
        Arc::new(Tokenizer::from_gguf(model.file().metadata()).context("building the tokenizer")?);
    let prompter = Prompter::from_gguf(model.file(), Some(tokenizer.clone()), "auto")?;
    let vision = args
        .mmproj
        .as_deref()
        .map(|p| super::images::load_mmproj(p, &model, args.image_rules, &tokenizer))
        .transpose()?;
    // Images on the GPU: the model goes there first, the tower next to it.
    #[cfg(feature = "cuda")]
    let (early_gm, vision) = match (args.device, vision) {
        (Device::Cuda, Some(input)) => {
            let gm = Arc::new(crate::cuda::load(model.clone())?);
            let tower = crate::cuda::tower(gm.gpu.clone(), &input.mmproj)?;
            (Some(gm), Some(input.with_tower(tower)))
        }
        (_, vision) => (None, vision),
    };
    let images = super::images::read_images(&args.image)?;
    let Some(text) = text else {
        if args.json_schema.is_some() || args.grammar.is_some() {
            bail!("--json-schema and --grammar constrain one answer: give a prompt (-p TEXT, -f FILE or stdin)");
        }
        // No prompt on a terminal: an interactive chat (`--image` files go
        // with the first message).
        let images = args.image.iter().cloned().zip(images).collect();
        #[cfg(feature = "cuda")]
        let early = early_gm;
        #[cfg(not(feature = "cuda"))]
        let early = ();
        return interactive(
            &args,
            &model,
            &tokenizer,
            &prompter,
            &spec,
            vision.as_ref(),
            images,
            early,
        );
    };
    // A base model (no chat template in the GGUF, not named instruct or
    // chat) completes the prompt as it is, unless --chat asks for its
    // architecture's built-in template.
    let base = super::list::kind(model.file()) == "base"
        && !prompter.is_builtin_format()
        && prompter.has_chat_format();
    if base && !args.raw && !args.chat {
        eprintln!(
            "note: {} is a base model (its GGUF has no chat template): completing the prompt as it is; --chat renders it with the {} built-in template",
            args.model.as_deref().unwrap_or("the model"),
            model.file().architecture().unwrap_or("architecture's")
        );
    }
    let chat = !args.raw && prompter.has_chat_format() && (!base || args.chat);
    let format = match chat {
        true => prompter.output,
        false => hearth_chat::parser::OutputFormat::Plain,
    };
    let grammar = output_grammar(&args, &tokenizer, model.config().vocab_size, format)?;
    let mut image_stats = Vec::new();
    let text = match &vision {
        Some(_) if !images.is_empty() => super::images::with_markers(&text, images.len())?,
        _ => text,
    };
    let (ids, shown) = if chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system_prompt {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": text}));
        let messages = Value::Array(messages);
        let ids = match images.is_empty() {
            true => prompter.chat_ids(&messages, None, &Map::new())?.into(),
            false => {
                let runs = prompter.chat_runs(&messages, None, &Map::new(), MEDIA_MARKER)?;
                let input = vision.as_ref().expect("checked: --image needs --mmproj");
                let (p, stats) =
                    super::images::encode_into_prompt(input, &images, &args.image, &runs)?;
                image_stats = stats;
                p
            }
        };
        let shown = match args.verbose_prompt {
            true => prompter.render(&messages, None, true, &Map::new())?,
            false => String::new(),
        };
        (ids, shown)
    } else {
        if args.system_prompt.is_some() {
            bail!("--system-prompt needs a chat template, and this model has none")
        }
        let ids = match &vision {
            Some(input) if !images.is_empty() => {
                // Raw mode: the text split at the markers, parsed as llama.cpp does.
                let runs = ChatRuns {
                    runs: text
                        .split(MEDIA_MARKER)
                        .enumerate()
                        .map(|(i, run)| tokenizer.encode(run, i == 0, true))
                        .collect(),
                    framing: ImageFraming::Mtmd,
                };
                let (p, stats) =
                    super::images::encode_into_prompt(input, &images, &args.image, &runs)?;
                image_stats = stats;
                p
            }
            _ => tokenizer.encode(&text, true, false).into(),
        };
        (ids, text)
    };
    if args.verbose_prompt {
        let how = match chat {
            true => prompter.describe(),
            false => "raw".into(),
        };
        eprintln!("prompt ({} tokens, {how}):\n{shown}\n", ids.len());
    }
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
    let mut job = Job {
        args: &args,
        tokenizer: &tokenizer,
        ids,
        image_stats,
        parser: chat
            .then(|| prompter.parser(None, "call_".into()))
            .transpose()?,
        n_draft: 0,
        spec: &spec,
        grammar,
        started,
        load_time,
    };
    #[cfg(feature = "cuda")]
    if args.device == Device::Cuda {
        let gm = match early_gm {
            Some(gm) => gm,
            None => Arc::new(crate::cuda::load(model.clone())?),
        };
        let drafters = gpu_drafters(&spec, &model, &gm)?;
        let (state, stats) = job.generate(&*gm, drafters)?;
        let bytes = state.kv_bytes();
        let mib = bytes as f64 / (1u64 << 20) as f64;
        let kv = format!(
            "KV cache: {mib:.1} MiB on the GPU ({}; device: cuda; rings of window + {} slots)",
            model.kv_types,
            hearth_cuda::GPU_CHUNK
        );
        return job.report(&path, &stats, &kv, bytes);
    }
    let drafters = cpu_drafters(&spec, &model)?;
    let (state, stats) = job.generate(&*model, drafters)?;
    job.report(&path, &stats, &kv_summary(&model, &state), state.kv_bytes())
}

/// The GPU model when it was loaded before the chat (next to the vision
/// tower); `()` without the CUDA backend.
#[cfg(feature = "cuda")]
type EarlyGpu = Option<Arc<hearth_cuda::GpuModel>>;
#[cfg(not(feature = "cuda"))]
type EarlyGpu = ();

/// `hearth run` without a prompt on a terminal: a multi-turn chat on the
/// chosen device.
#[allow(clippy::too_many_arguments)]
fn interactive(
    args: &Args,
    model: &Arc<Model>,
    tokenizer: &Tokenizer,
    prompter: &Prompter,
    spec: &SpecConfig,
    vision: Option<&ImageInput>,
    images: Vec<(std::path::PathBuf, hearth_vision::RgbImage)>,
    early: EarlyGpu,
) -> Result<()> {
    let model_name = args.model.clone().unwrap_or_else(|| {
        crate::registry::registry()
            .map(|r| r.default)
            .unwrap_or_default()
    });
    #[cfg(feature = "cuda")]
    if args.device == Device::Cuda {
        let gm = match early {
            Some(gm) => gm,
            None => Arc::new(crate::cuda::load(model.clone())?),
        };
        let drafters = gpu_drafters(spec, model, &gm)?;
        let chat = Chat {
            backend: &*gm,
            tokenizer,
            prompter,
            args,
            sampling: sampling(args),
            model_name,
            vision,
            images,
            info: super::show::summary(model.file().path(), model.file()),
            n_predict: args.n_predict,
        };
        return chat.run(drafters);
    }
    #[cfg(not(feature = "cuda"))]
    let () = early;
    let chat = Chat {
        backend: &**model,
        tokenizer,
        prompter,
        args,
        sampling: sampling(args),
        model_name,
        vision,
        images,
        info: super::show::summary(model.file().path(), model.file()),
        n_predict: args.n_predict,
    };
    chat.run(cpu_drafters(spec, model)?)
}

/// The sampler settings from the flags.
fn sampling(args: &Args) -> SamplerConfig {
    SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n.min(args.ctx),
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
    }
}

/// The drafters' factory for a target on the GPU: a draft model loads on
/// the GPU, a DFlash draft runs there next to the target.
#[cfg(feature = "cuda")]
fn gpu_drafters(
    spec: &SpecConfig,
    model: &Arc<Model>,
    gm: &Arc<hearth_cuda::GpuModel>,
) -> Result<Option<DrafterFactory<hearth_cuda::GpuModel>>> {
    let gpu = gm.gpu.clone();
    let factory = DrafterFactory::new(spec, model, |p| {
        let draft = Model::load_unpacked(p).map_err(|e| e.to_string())?;
        crate::cuda::upload(gpu, Arc::new(draft)).map_err(|e| format!("{e:#}"))
    })?;
    Ok(factory
        .map(|f| f.with_dflash_runner(crate::cuda::dflash_runners(gm.clone())))
        .transpose()?)
}

/// The drafters' factory for a CPU target (a draft model loads on the CPU).
fn cpu_drafters(spec: &SpecConfig, model: &Arc<Model>) -> Result<Option<DrafterFactory<Model>>> {
    Ok(DrafterFactory::new(spec, model, |p| {
        Model::load(p).map_err(|e| e.to_string())
    })?)
}

/// The prompt from -p, -f FILE, -f - or a pipe on stdin; `None` when there is
/// none and stdin is a terminal (an interactive chat).
fn read_prompt(args: &Args) -> Result<Option<String>> {
    let stdin = || -> Result<String> {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the prompt from stdin")?;
        if s.trim().is_empty() {
            bail!("stdin held no prompt: give a prompt with -p TEXT, -f FILE, or on stdin");
        }
        Ok(s)
    };
    Ok(Some(match (&args.prompt, &args.file) {
        // `cat main.py | hearth run -p "Review this code"`: the piped text
        // first, then the prompt, as Ollama joins them.
        (Some(p), None) if stdin_is_data() => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading stdin")?;
            match s.trim().is_empty() {
                true => p.clone(),
                false => format!("{}\n\n{p}", s.trim_end()),
            }
        }
        (Some(p), _) => p.clone(),
        (None, Some(f)) if f.as_os_str() == "-" => stdin()?,
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?,
        (None, None) if !std::io::stdin().is_terminal() => stdin()?,
        (None, None) => return Ok(None),
    }))
}

/// Whether stdin is a pipe or a file (text piped in), not a terminal or a
/// device such as /dev/null.
fn stdin_is_data() -> bool {
    use std::os::unix::fs::FileTypeExt;
    if std::io::stdin().is_terminal() {
        return false;
    }
    let Ok(meta) = std::fs::metadata("/dev/stdin") else {
        return false;
    };
    let t = meta.file_type();
    t.is_fifo() || t.is_file()
}

/// One `run` invocation, on whichever backend.
struct Job<'a> {
    args: &'a Args,
    tokenizer: &'a Tokenizer,
    /// Token ids, with the images' rows placed among them.
    ids: Prompt,
    /// Per image: size, tokens, encode time (`--stats-json`).
    image_stats: Vec<Value>,
    /// Chat mode: the reply's output parser (answer, reasoning, tool calls).
    parser: Option<Box<dyn OutputParser + Send>>,
    /// K, once the drafters are built (0: no speculation).
    n_draft: usize,
    /// The speculation the flags resolved to (`--spec auto` picks one).
    spec: &'a SpecConfig,
    /// --json-schema / --grammar.
    grammar: Option<(Grammars, OutputGrammar)>,
    /// When `run` began, and how long the model took to load.
    started: std::time::Instant,
    load_time: std::time::Duration,
}

impl Job<'_> {
    /// Steps a turn on `backend` to its end (speculatively with `drafters`),
    /// streaming the answer; returns the final state and the statistics.
    fn generate<B: Backend + 'static>(
        &mut self,
        backend: &B,
        drafters: Option<DrafterFactory<B>>,
    ) -> Result<(B::State, TurnStats)> {
        let args = self.args;
        let sampling = sampling(args);
        let n_draft = drafters.as_ref().map_or(0, |d| d.n_draft());
        self.n_draft = n_draft;
        // Rings keep K extra slots so rejected positions can be rolled back.
        let mut state = backend.new_state(args.ctx, n_draft)?;
        let mut drafter = drafters
            .as_ref()
            .map(|d| d.make(args.ctx, &sampling))
            .transpose()?;
        let params = TurnParams {
            max_tokens: args.n_predict.min(args.ctx - self.ids.len()),
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
            n_draft,
            render_special: self.parser.is_some(),
            logprobs: None,
        };
        let ids = std::mem::take(&mut self.ids);
        let mut turn = Turn::new(self.tokenizer, ids, 0, Sampler::new(sampling)?, params);
        if let Some((grammars, g)) = &self.grammar {
            turn = turn.constrained(grammars.constraint(g)?);
        }
        let mut out = Output::new(self.parser.take(), args.hide_reasoning);
        let total = turn.stats().prompt_tokens;
        let mut shown = super::progress::Prefill::new(total);
        while turn.finished().is_none() {
            // A chunk per step while prefilling (the forward pass's own
            // chunk: the same numerics as one whole pass), for the progress line.
            let chunk = match turn.prefilling() {
                true => hearth_models::MAX_CHUNK,
                false => usize::MAX,
            };
            let prefilling = turn.prefilling();
            turn.step(
                backend,
                &mut state,
                drafter.as_mut().map(|d| &mut **d as _),
                chunk,
                &mut |t| out.text(t),
            )?;
            if prefilling {
                shown.update(turn.prompt_fed(), total);
            }
        }
        drop(shown);
        let (stats, _) = turn.into_parts();
        out.finish(stats.finish.unwrap_or(FinishReason::Length));
        if let Some(e) = out.error {
            bail!("writing to stdout: {e}");
        }
        Ok((state, stats))
    }

    /// The stderr summary and `--stats-json`.
    fn report(&self, path: &Path, stats: &TurnStats, kv: &str, kv_bytes: usize) -> Result<()> {
        let args = self.args;
        let finish = stats.finish.map_or("length", FinishReason::as_str);
        let encode_ms: f64 = self
            .image_stats
            .iter()
            .filter_map(|i| i["encode_ms"].as_f64())
            .sum();
        // The first token comes from the prompt's last pass (after the images' encode).
        let ttft_ms = encode_ms + stats.prefill_time.as_secs_f64() * 1e3;
        let total = self.started.elapsed().as_secs_f64();
        eprintln!();
        // One line in llama-cli's terms; the KV cache and speculation with --verbose.
        eprintln!(
            "load {:.2} s | prompt {} tokens, {:.1} tok/s | first token {:.0} ms | eval {} tokens, {:.1} tok/s | total {total:.2} s | finish: {finish}",
            self.load_time.as_secs_f64(),
            stats.prompt_tokens,
            stats.prefill_tok_s(),
            ttft_ms,
            stats.tokens.len(),
            stats.decode_tok_s(),
        );
        let spec = stats.spec.as_ref().map(|sp| (self.n_draft, sp));
        let kind = self.spec.kind.as_str();
        if args.verbose {
            eprintln!("{kv}");
            if let Some((k, sp)) = spec {
                eprintln!("{}", spec_summary(kind, k, self.spec.adaptive, sp));
            }
        }
        if let Some(p) = &args.stats_json {
            let mut json = json!({
                "model": path,
                "device": if args.device == Device::Cuda { "cuda" } else { "cpu" },
                "prompt_tokens": stats.prompt_tokens,
                "prefill_tok_s": stats.prefill_tok_s(),
                "generated_tokens": stats.tokens.len(),
                "decode_tok_s": stats.decode_tok_s(),
                "finish_reason": finish,
                "kv_bytes": kv_bytes,
                "spec": kind,
                "constraint_ms": stats.constraint_time.as_secs_f64() * 1e3,
                "decode_ms": stats.decode_time.as_secs_f64() * 1e3,
                "prefill_ms": stats.prefill_time.as_secs_f64() * 1e3,
                "load_ms": self.load_time.as_secs_f64() * 1e3,
                "time_to_first_token_ms": ttft_ms,
                "total_ms": total * 1e3,
            });
            if !self.image_stats.is_empty() {
                json["images"] = Value::Array(self.image_stats.clone());
            }
            if let Some((k, sp)) = spec {
                let extra = json!({
                    "n_draft": k,
                    "block_length": self.spec.block_length,
                    "adaptive": self.spec.adaptive,
                    "draft_model": self.spec.draft_model,
                    "undrafted_steps": sp.undrafted(),
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
                if let (Some(o), Value::Object(e)) = (json.as_object_mut(), extra) {
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
pub fn spec_summary(kind: &str, n_draft: usize, adaptive: bool, s: &SpecStats) -> String {
    let by_pos: Vec<String> = s
        .acceptance_by_position()
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    format!(
        "spec: {kind}, n_draft {n_draft}{} | {} target forwards ({} without a draft), {:.2} tokens per forward, mean accepted {:.2}, acceptance {:.1}% | by position [{}] | draft {:.2} s, verify {:.2} s",
        if adaptive { " (adaptive)" } else { "" },
        s.target_forwards,
        s.undrafted(),
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
    let per_slot = model.kv_types.slot_bytes(c.n_kv_heads, c.head_dim);
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
    let rings = if sliding > 0 {
        format!(" + {sliding} sliding layers x {ring_slots} slots")
    } else {
        String::new()
    };
    format!(
        "KV cache: {:.1} MiB = {global} global layers x {} positions{rings} ({}, {per_slot} B per layer-position); a full cache would take {:.1} MiB",
        mib(state.kv_bytes()),
        state.max_ctx,
        model.kv_types,
        mib(full)
    )
}
