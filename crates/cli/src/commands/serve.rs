//! `hearth serve`: the OpenAI-compatible HTTP server (one model load, many
//! sessions). Loopback only unless told otherwise.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use hearth_engine::spec::factory::{DrafterFactory, MakeDrafter};
use hearth_models::{Backend, Model};
use hearth_server::{Loaded, ServerOptions};

use super::spec::SpecArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Model name (see `hearth pull --list`) or .gguf path [default: qwen2.5-coder-0.5b, pulled on first use]
    #[arg(short, long)]
    pub model: Option<String>,
    /// Address to listen on (a non-loopback address exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 = any free port; the URL line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model id clients send [default: the packaged name, or the file name without .gguf].
    #[arg(long)]
    pub model_id: Option<String>,
    /// Context size per session (prompt + generation), in tokens.
    #[arg(
        short = 'c',
        long = "max-context",
        alias = "ctx-size",
        default_value_t = 4096
    )]
    pub max_context: usize,
    /// KV states held at once, the anonymous scratch session included; the
    /// least recently used idle session is evicted beyond this.
    #[arg(long, default_value_t = 8)]
    pub max_sessions: usize,
    /// Also bound the sessions' total KV cache memory (MiB): the memory of
    /// the shared prefix cache, whose entries are the resident sessions (the
    /// least recently used idle one is evicted, or spilled to --session-dir).
    #[arg(long, value_name = "MIB", visible_alias = "cache-ram")]
    pub kv_budget_mib: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    /// [default: $HEARTH_API_KEY]. An empty key is an error.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from a file (surrounding whitespace trimmed; empty is an error).
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Host names accepted in the Host header besides localhost, loopback and
    /// the bound address (comma-separated; `*` accepts any). Others get 403.
    #[arg(long, value_name = "HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// A web origin allowed to call the server from a browser (CORS), e.g.
    /// https://app.example (comma-separated; `*` allows any). Without it no
    /// CORS headers are sent and cross-origin requests get 403.
    #[arg(long, value_name = "ORIGIN", value_delimiter = ',')]
    pub cors_origin: Vec<String>,
    /// Seconds a client has from a request's first byte to its complete headers.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = parse_secs)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request body once its headers are in (408 after).
    #[arg(long, value_name = "SECS", default_value_t = 60.0, value_parser = parse_secs)]
    pub body_timeout: f64,
    /// Seconds an idle (keep-alive) connection stays open without a new request.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = parse_secs)]
    pub idle_timeout: f64,
    /// Tool-call format: auto, atem, hermes, qwen3-xml, harmony, muse-glimmer or plain.
    #[arg(long, default_value = "auto")]
    pub tool_parser: String,
    /// Largest request body accepted (MiB); larger ones get 413.
    #[arg(long, value_name = "MIB", default_value_t = 16)]
    pub max_body_mib: usize,
    /// Reject prompt + max_tokens over the context (400) instead of clamping max_tokens.
    #[arg(long)]
    pub strict_context: bool,
    /// Constrain every tool call to its tool's schema, as if each tool said
    /// `"strict": true` (the model still chooses whether to call): a small
    /// model's calls then always parse.
    #[arg(long)]
    pub strict_tools: bool,
    /// Directory for saved sessions: `POST /v1/sessions/{id}/save` writes
    /// `DIR/{id}.hsession` (tokens + KV state, tied to this model) and
    /// `/restore` reads it back. Sessions evicted for room (`--max-sessions`)
    /// are kept in `DIR/.evicted` and come back on their next request
    /// (not with `--spec`). Off unless given.
    #[arg(long, value_name = "DIR")]
    pub session_dir: Option<std::path::PathBuf>,
    /// Never start a session from another session's KV. By default a new
    /// session whose prompt begins like another's (an agent's system prompt
    /// and tools) copies that prefix instead of prefilling it; requests share
    /// only within the same `cache_salt` (a tenant).
    #[arg(long)]
    pub no_prefix_sharing: bool,
    /// Never continue a conversation for a request without a session id. By
    /// default such a request continues the resident conversation of its
    /// tenant (same `cache_salt`) that it repeats at least half of, as
    /// llama-server's `cache_prompt` does, so agents that resend the whole
    /// conversation each turn (Claude Code, Codex, the OpenAI SDK) prefill
    /// only the new part. With this flag every such request starts over.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Extra slots in every sliding-window ring (gemma3, muse-glimmer), so a
    /// session rolls back up to N positions without a checkpoint: a shared
    /// prefix or a re-rendered reply that parts from the resident tokens
    /// within N of their end reuses everything before it. Costs N positions
    /// of K and V per sliding layer and session (llama.cpp's `--swa-full`
    /// keeps the whole context instead). 0 by default on the CPU; CUDA rings
    /// always keep 512.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub ring_slack: usize,
    /// Besides the one at the end of each prompt's prefill, snapshot a
    /// session's sliding-window rings every N positions (at the end of the
    /// first prefill chunk or decode step N or more past the newest
    /// snapshot), so a prompt that parts from the resident tokens anywhere,
    /// or another session sharing only part of a long prompt, restores a
    /// snapshot near it instead of prefilling from the start. 0 (default):
    /// only at prompt ends. Each snapshot costs the rings' size
    /// (gemma3-270m: ~7 MB).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub checkpoint_every: usize,
    /// Ring snapshots kept per session; past it the one whose removal leaves
    /// the smallest gap goes (never the newest).
    #[arg(long, value_name = "N", default_value_t = hearth_engine::session::MAX_CHECKPOINTS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_checkpoints: u64,
    /// Batch-invariant numerics: every request's output is exactly what it
    /// would be if it ran alone, however many run at once. Concurrent
    /// requests are batched either way (one forward pass per step carries
    /// every session's next token); with this flag each row is computed as
    /// a one-row pass computes it and prompt chunks get passes of their
    /// own, which costs some speed under load. Off by default.
    #[arg(long)]
    pub batch_invariant: bool,
    /// Worker threads [default: all cores].
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// llama.cpp's -ngl, accepted: hearth places layers by --device (cpu: all
    /// on the CPU; cuda: all on the GPU).
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N",
          value_parser = crate::cli_args::parse_gpu_layers, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<crate::cli_args::GpuLayers>,
    /// Backend: cpu or cuda (weights and every session's KV cache on the GPU).
    #[arg(long, value_enum, default_value_t = crate::device::Device::Cpu)]
    pub device: crate::device::Device,
    /// The model's multimodal projector (llama.cpp's mmproj GGUF): accept
    /// OpenAI `image_url` parts (data: URLs). With --device cuda the tower runs on the GPU.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Let `image_url` parts name http(s) URLs, which the server then fetches
    /// (10 s to connect, 30 s in all, at most 20 MiB). Off by default: the
    /// server would fetch any URL a client names, including hosts only it can
    /// reach.
    #[arg(long)]
    pub allow_image_urls: bool,
    /// The vision tower's rules where the model's reference and llama.cpp
    /// differ (grid ties, position-table resampling). `llama-cpp-exact` also
    /// takes llama.cpp's CPU arithmetic (f16 im2col and attention, its
    /// kernels' orders): llama-mtmd-cli's image rows to the bit, on the CPU
    /// tower, at a slower encode.
    #[arg(long, value_enum, default_value_t = super::images::ImageRules::Reference)]
    pub image_rules: super::images::ImageRules,
    #[command(flatten)]
    pub kv: crate::cli_args::KvCacheArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn run(mut args: Args) -> Result<()> {
    // Speculating sessions step alone (no batched passes with other
    // sessions yet): `serve` speculates only when asked.
    args.spec.unset_means = super::spec::SpecChoice::Kind(hearth_engine::spec::SpecKind::None);
    crate::device::check(args.device)?;
    crate::cli_args::note_gpu_layers(args.n_gpu_layers, args.device);
    args.spec.precheck(args.device)?;
    crate::init_threads(args.threads)?;
    let path = crate::store::resolve_model(args.model.as_deref())?;
    let target = super::spec::Target {
        arg: args.model.as_deref(),
        path: &path,
    };
    let spec = args.spec.config(args.device, target)?;
    let kv = args.kv.for_device(args.device)?;
    crate::limits::check_context(&path, args.max_context, args.max_sessions, args.device, kv)?;
    let model_id = args
        .model_id
        .clone()
        .unwrap_or_else(|| default_model_id(args.model.as_deref(), &path));
    let options = ServerOptions {
        model_path: path,
        model_id,
        host: args.host,
        port: args.port,
        max_ctx: args.max_context,
        max_sessions: args.max_sessions,
        kv_budget_bytes: args.kv_budget_mib.map(|m| m.saturating_mul(1024 * 1024)),
        api_key: api_key(args.api_key, args.api_key_file.as_deref())?,
        allowed_hosts: args.allowed_hosts,
        cors_origins: args.cors_origin,
        timeouts: hearth_server::conn::Timeouts {
            header: Duration::from_secs_f64(args.header_timeout),
            body: Duration::from_secs_f64(args.body_timeout),
            idle: Duration::from_secs_f64(args.idle_timeout),
        },
        tool_parser: args.tool_parser,
        max_body_bytes: args.max_body_mib.saturating_mul(1024 * 1024),
        strict_context: args.strict_context,
        strict_tools: args.strict_tools,
        session_dir: args.session_dir.clone(),
        no_prefix_sharing: args.no_prefix_sharing,
        no_prefix_reuse: args.no_prefix_reuse,
        ring_slack: args.ring_slack,
        checkpoint_every: args.checkpoint_every,
        max_checkpoints: args.max_checkpoints as usize,
        batch_invariant: args.batch_invariant,
        mmproj: args.mmproj.clone(),
        image_rules: args.image_rules.rules(),
        allow_image_urls: args.allow_image_urls,
    };
    // Speculation: the drafters' factory is built once the target is loaded
    // (a draft model on the target's backend); each session gets a drafter.
    #[cfg(feature = "cuda")]
    if args.device == crate::device::Device::Cuda {
        let load = move |path: &Path| {
            // The GPU copies the file's blocks itself: no CPU repacking for it.
            let mut model = Model::load_unpacked(path).map_err(|e| e.to_string())?;
            model.set_kv_types(kv)?;
            let model = Arc::new(model);
            let gm = Arc::new(crate::cuda::load(model.clone()).map_err(|e| format!("{e:#}"))?);
            let gpu = gm.gpu.clone();
            let factory = DrafterFactory::new(&spec, &model, |p| {
                let draft = Model::load_unpacked(p).map_err(|e| e.to_string())?;
                crate::cuda::upload(gpu, Arc::new(draft)).map_err(|e| format!("{e:#}"))
            })
            .map_err(|e| e.to_string())?
            .map(|f| f.with_dflash_runner(crate::cuda::dflash_runners(gm.clone())))
            .transpose()
            .map_err(|e| e.to_string())?;
            let tower_gpu = gm.gpu.clone();
            Ok(Loaded {
                model,
                backend: gm,
                drafters: drafters(factory),
                tower: Some(Box::new(move |mm: &hearth_vision::MmProj| {
                    crate::cuda::tower(tower_gpu, mm).map_err(|e| format!("{e:#}"))
                })),
            })
        };
        return hearth_server::run_on(options, load).context("hearth serve");
    }
    let load = move |path: &Path| {
        let mut model = Model::load(path).map_err(|e| e.to_string())?;
        model.set_kv_types(kv)?;
        let model = Arc::new(model);
        let factory =
            DrafterFactory::new(&spec, &model, |p| Model::load(p).map_err(|e| e.to_string()))
                .map_err(|e| e.to_string())?;
        Ok(Loaded {
            model: model.clone(),
            backend: model,
            drafters: drafters(factory),
            tower: None,
        })
    };
    hearth_server::run_on(options, load).context("hearth serve")
}

/// The API key: `--api-key`, else `--api-key-file`, else `$HEARTH_API_KEY`.
/// An empty key is an error, never "no authentication": a script passing an
/// unset variable must not start an open server.
fn api_key(arg: Option<String>, file: Option<&Path>) -> Result<Option<String>> {
    let (key, from) = if let Some(k) = arg {
        (k, "--api-key".to_string())
    } else if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --api-key-file {}", path.display()))?;
        (
            text.trim().to_string(),
            format!("--api-key-file {}", path.display()),
        )
    } else {
        match std::env::var("HEARTH_API_KEY") {
            Ok(k) => (k, "HEARTH_API_KEY".to_string()),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(e) => anyhow::bail!("HEARTH_API_KEY: {e}"),
        }
    };
    if key.trim().is_empty() {
        anyhow::bail!(
            "the API key from {from} is empty; give a non-empty key, or none to serve without one"
        );
    }
    Ok(Some(key))
}

/// A positive, finite number of seconds.
fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 86_400.0 => Ok(x),
        _ => Err(format!("'{s}' is not a number of seconds in (0, 86400]")),
    }
}

/// A backend's drafter factory as the scheduler takes it.
fn drafters<B: Backend + 'static>(f: Option<DrafterFactory<B>>) -> Option<Arc<dyn MakeDrafter>> {
    f.map(|f| Arc::new(f) as Arc<dyn MakeDrafter>)
}

/// A packaged name as given (or the default's), else the file stem.
fn default_model_id(arg: Option<&str>, path: &Path) -> String {
    match arg {
        Some(a) if !Path::new(a).is_file() => a.to_string(),
        None => crate::registry::registry()
            .map(|r| r.default)
            .unwrap_or_default(),
        _ => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    }
}
