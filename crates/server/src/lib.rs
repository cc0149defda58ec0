//! hearth's OpenAI-compatible HTTP server (spec: docs/spec/server-api.md).
//!
//! - [`conn`]: accepting connections, per-connection time limits.
//! - [`access`]: the safe defaults: Host, Origin/CORS, API key.
//! - [`routes`]: the router, access checks, body limit, small endpoints.
//! - [`chat`]: chat and text completions, whole or streamed as SSE.
//! - [`request`]: request parsing and validation, errors naming the field.
//! - [`validate`]: strict checks of messages and tools, errors naming the JSON path.
//! - [`engine`]: the channel to the engine's scheduler thread
//!   (`hearth_engine::scheduler`), which owns the model and every session's
//!   KV state and interleaves generations token by token.
//! - [`metrics`]: Prometheus counters.

pub mod access;
pub mod anthropic;
pub mod api;
pub mod chat;
pub mod conn;
pub mod embed;
pub mod engine;
pub mod error;
pub mod fault;
pub mod hub;
pub mod images;
pub mod metrics;
pub mod ollama;
pub mod request;
pub mod responses;
pub mod routes;
pub mod session_file;
pub mod tokenize;
pub mod validate;
pub mod webui;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hearth_engine::scheduler;
use hearth_engine::session::SessionStore;
use hearth_engine::spec::factory::MakeDrafter;
use hearth_models::{Backend, BackendState, Model};
use hearth_tokenizer::Tokenizer;

use crate::metrics::Metrics;
use crate::routes::AppState;
use hearth_chat::prompter::Prompter;

/// The stack of the threads that handle requests.
pub const REQUEST_STACK_BYTES: usize = 64 << 20;

#[derive(Clone)]
pub struct ServerOptions {
    /// `-m`: loaded at start and never unloaded.
    pub model_path: Option<PathBuf>,
    /// The `-m` model's id (what clients send as `model`, or omit).
    pub model_id: String,
    /// Models loaded on first request and unloaded when idle.
    pub catalog: Vec<hub::Entry>,
    /// `--alias NAME=MODEL`: requests for NAME go to MODEL.
    pub aliases: std::collections::BTreeMap<String, String>,
    /// The model of requests that name none (else `-m`'s).
    pub default_model: Option<String>,
    /// How long an on-demand model stays loaded idle (None: forever).
    pub keep_alive: Option<std::time::Duration>,
    /// Models loaded at once, at most.
    pub max_models: usize,
    /// The chat page at `/` (`--no-webui` turns it off).
    pub webui: bool,
    /// The loaded models' memory (files + KV budgets), at most.
    pub models_memory_bytes: Option<u64>,
    pub host: String,
    /// 0 picks a free port (the URL line says which).
    pub port: u16,
    /// Context size of every session's KV state.
    pub max_ctx: usize,
    /// KV states held at once, the scratch session included.
    pub max_sessions: usize,
    /// Further bound on the states held: their total KV bytes.
    pub kv_budget_bytes: Option<usize>,
    /// Required on every route but /health; never empty.
    pub api_key: Option<String>,
    /// Host names accepted besides this server's own (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// Origins allowed cross-origin, with CORS headers (`*`: any).
    pub cors_origins: Vec<String>,
    pub timeouts: conn::Timeouts,
    /// `auto` or an output format name.
    pub tool_parser: String,
    pub max_body_bytes: usize,
    pub strict_context: bool,
    /// Every tool is `strict` (`--strict-tools`).
    pub strict_tools: bool,
    /// Where `/v1/sessions/{id}/save` writes and `/restore` reads (`--session-dir`).
    pub session_dir: Option<PathBuf>,
    /// `--shared-sessions`: the session dir is shared by replicas; every
    /// session (anonymous ones too) is kept there as each turn ends and when
    /// evicted, for any replica to continue ([`session_file::SharedSpill`]).
    pub shared_sessions: bool,
    /// After SIGTERM: how long new requests are still served while /health
    /// says 503 (a gateway's or probe's time to notice), then refused.
    pub drain_grace: std::time::Duration,
    /// After SIGTERM: the longest the requests in flight are waited for.
    pub drain_timeout: std::time::Duration,
    /// `--no-prefix-sharing`: a new session never starts from another's KV.
    pub no_prefix_sharing: bool,
    /// `--no-prefix-reuse`: a request without a session id starts over.
    pub no_prefix_reuse: bool,
    /// `--ring-slack`: extra slots per sliding-window ring (rollback without a checkpoint).
    pub ring_slack: usize,
    /// Ring checkpoints also every N positions (0: only at prompt ends).
    pub checkpoint_every: usize,
    /// Ring checkpoints kept per session.
    pub max_checkpoints: usize,
    /// `--batch-invariant`: outputs independent of what else runs.
    pub batch_invariant: bool,
    /// The model's multimodal projector (`--mmproj`): image parts accepted.
    pub mmproj: Option<PathBuf>,
    /// The vision tower's rules where the model's reference and llama.cpp differ.
    pub image_rules: hearth_vision::Rules,
    /// `--allow-image-urls`: fetch http(s) image URLs (else only data: URLs).
    pub allow_image_urls: bool,
}

/// What [`run_on`]'s loader returns: the host model (metadata, tokenizer,
/// chat template), the backend whose forward passes serve the sessions (the
/// host model itself, or its copy on a GPU), and the drafters' factory when
/// every session speculates.
pub struct Loaded<B> {
    pub model: Arc<Model>,
    pub backend: Arc<B>,
    pub drafters: Option<Arc<dyn MakeDrafter>>,
    /// Where `--mmproj`'s tower runs: `None` on the CPU; for a GPU backend,
    /// what uploads the tower next to the model (its forward must take
    /// image rows, [`hearth_models::Input::Rows`]).
    pub tower: Option<TowerUpload>,
}

/// Opens a model file ([`run_on`]'s `load`).
pub type LoadFn<B> = dyn Fn(&Path, bool) -> Result<Loaded<B>, String>;

/// Uploads a vision tower to the backend's device.
pub type TowerUpload =
    Box<dyn FnOnce(&hearth_vision::MmProj) -> Result<Arc<dyn hearth_vision::Tower>, String>>;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("loading {path}: {message}")]
    Load { path: String, message: String },
    #[error("{0}")]
    Config(String),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Loads the model once on the CPU, starts the engine thread and serves until
/// SIGINT or SIGTERM; then stops every generation and returns.
pub fn run(opts: ServerOptions) -> Result<(), ServerError> {
    run_on(opts, |path, _| {
        let model = Arc::new(Model::load(path).map_err(|e| e.to_string())?);
        Ok(Loaded {
            model: model.clone(),
            backend: model,
            drafters: None,
            tower: None,
        })
    })
}

/// [`run`] on any backend: `load` opens a model file (see [`Loaded`]); its
/// flag says whether the model is the pinned one (`-m`: speculation and the
/// vision tower apply to it alone).
pub fn run_on<B: Backend + 'static>(
    opts: ServerOptions,
    load: impl Fn(&Path, bool) -> Result<Loaded<B>, String> + Send + Sync + 'static,
) -> Result<(), ServerError> {
    if opts.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(ServerError::Config(
            "the API key is empty (an unset variable?); give a key or none".into(),
        ));
    }
    if opts.max_ctx < 2 {
        return Err(ServerError::Config(
            "the context size must be at least 2 tokens".into(),
        ));
    }
    let mut entries = Vec::new();
    if let Some(path) = &opts.model_path {
        let mut e = hub::Entry::new(opts.model_id.clone(), Some(path.clone()), None);
        e.pinned = true;
        entries.push(e);
    }
    for e in &opts.catalog {
        if entries.iter().any(|x: &hub::Entry| x.name == e.name) {
            continue;
        }
        entries.push(e.clone());
    }
    if entries.is_empty() {
        return Err(ServerError::Config("no model to serve".into()));
    }
    for (alias, target) in &opts.aliases {
        if !entries.iter().any(|e| &e.name == target) {
            return Err(ServerError::Config(format!(
                "--alias {alias}={target}: no model '{target}' (served: {})",
                entries
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let pinned = opts.model_path.as_ref().map(|_| opts.model_id.clone());
    let default = opts.default_model.clone().or_else(|| pinned.clone());
    if let Some(d) = &default {
        if !entries.iter().any(|e| &e.name == d) {
            return Err(ServerError::Config(format!(
                "--default-model {d}: not a served model"
            )));
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Request preparation (JSON, template, tokenizer) runs here, bounded.
        .max_blocking_threads(4)
        // Structured output's grammars compile on these threads (llguidance
        // recurses over a schema's structure); only what is touched is resident.
        .thread_stack_size(REQUEST_STACK_BYTES)
        .enable_all()
        .build()?;
    let opts = Arc::new(opts);
    let metrics = Arc::new(Metrics::default());
    let _ = metrics.model_name.set(
        default
            .clone()
            .or_else(|| entries.first().map(|e| e.name.clone()))
            .unwrap_or_default(),
    );
    let load = Arc::new(load);
    // Stored Responses are the server's, shared by every model it loads.
    let responses: Arc<std::sync::Mutex<responses::ResponseStore>> = Default::default();
    let result = runtime.block_on(async {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| ServerError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local: SocketAddr = listener.local_addr()?;
        let access = access::Access {
            bound: local,
            allowed_hosts: opts.allowed_hosts.clone(),
            cors_origins: opts.cors_origins.clone(),
            api_key: opts.api_key.clone(),
        };
        let start: hub::Start = {
            let (opts, metrics, load, responses) = (
                opts.clone(),
                metrics.clone(),
                load.clone(),
                responses.clone(),
            );
            Arc::new(move |entry: &hub::Entry, path: &Path| {
                start_model(
                    &opts,
                    entry,
                    path,
                    &*load,
                    metrics.clone(),
                    responses.clone(),
                )
                .map_err(|e| e.to_string())
            })
        };
        let hub = hub::Hub::new(
            hub::HubOptions {
                entries,
                aliases: opts.aliases.clone(),
                default,
                keep_alive: opts.keep_alive,
                max_models: opts.max_models,
                webui: opts.webui,
                memory_budget: opts.models_memory_bytes,
            },
            start,
            access,
            metrics.clone(),
            hub::BodyLimits {
                max_bytes: opts.max_body_bytes,
                timeout: opts.timeouts.body,
            },
            opts.max_ctx,
            responses,
        );
        let host = if local.is_ipv6() {
            format!("[{}]", local.ip())
        } else {
            local.ip().to_string()
        };
        stdout_line(&format!(
            "hearth serve: listening on http://{host}:{}/v1",
            local.port()
        ));
        if opts.webui {
            eprintln!(
                "hearth serve: the chat page is at http://{host}:{}/",
                local.port()
            );
        }
        if !local.ip().is_loopback() && opts.api_key.is_none() {
            eprintln!(
                "warning: listening on a non-loopback address without an API key; set --api-key"
            );
        }
        // The server answers while the pinned model loads (/health: 503
        // "loading"; model requests wait for it), as llama-server does, so
        // a gateway or probe sees a live process that is not ready yet.
        let failed: Arc<std::sync::Mutex<Option<ServerError>>> = Default::default();
        let load_failed = Arc::new(tokio::sync::Notify::new());
        if let Some(name) = pinned.clone() {
            hub.set_phase(hub::Phase::Starting);
            let (hub, opts, failed, load_failed) = (
                hub.clone(),
                opts.clone(),
                failed.clone(),
                load_failed.clone(),
            );
            tokio::spawn(async move {
                match hub.preload(&name).await {
                    Ok(()) => {
                        hub.set_ready();
                        stdout_line("hearth serve: ready");
                    }
                    Err(m) => {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(ServerError::Load {
                                path: opts
                                    .model_path
                                    .as_ref()
                                    .map(|p| p.display().to_string())
                                    .unwrap_or_default(),
                                message: m
                                    .strip_prefix(&format!("Loading model '{name}' failed: "))
                                    .unwrap_or(&m)
                                    .to_string(),
                            });
                        load_failed.notify_one();
                    }
                }
            });
        } else {
            eprintln!(
                "hearth serve: {} model(s) on demand ({}); each loads on its first request{}",
                opts.catalog.len(),
                opts.catalog
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                match opts.keep_alive {
                    Some(d) => format!(" and unloads after {} idle", human_secs(d)),
                    None => String::new(),
                }
            );
            stdout_line("hearth serve: ready");
        }
        tokio::spawn(hub.clone().reaper());
        let shutdown_hub = hub.clone();
        let drain = (opts.drain_grace, opts.drain_timeout);
        conn::serve(
            listener,
            hub::router(hub.clone()),
            opts.timeouts,
            opts.max_body_bytes,
            async move {
                tokio::select! {
                    sig = shutdown_signal() => match sig {
                        // What an orchestrator sends: finish what is in flight.
                        Signal::Terminate => drain_then_stop(&shutdown_hub, drain).await,
                        // A person at the terminal: stop now.
                        Signal::Interrupt => eprintln!("hearth serve: shutting down"),
                    },
                    _ = load_failed.notified() => {}
                }
                // Ends every generation, so open streams finish and the
                // graceful shutdown does not wait on them.
                shutdown_hub.shutdown();
            },
        )
        .await;
        if let Some(e) = failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Err(e);
        }
        Ok::<_, ServerError>(hub)
    });
    // Every model's engine thread ends before the process does.
    result.map(|hub| hub.join())
}

/// "5m", "90s", "1h".
fn human_secs(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One model: loaded, its tokenizer, template, vision tower, session store
/// and engine thread, and its router.
fn start_model<B: Backend + 'static>(
    opts: &ServerOptions,
    entry: &hub::Entry,
    path: &Path,
    load: &LoadFn<B>,
    metrics: Arc<Metrics>,
    responses: Arc<std::sync::Mutex<responses::ResponseStore>>,
) -> Result<hub::Resident, ServerError> {
    let t0 = Instant::now();
    let load_err = |message: String| ServerError::Load {
        path: path.display().to_string(),
        message,
    };
    let Loaded {
        model,
        backend,
        drafters,
        tower,
    } = load(path, entry.pinned).map_err(load_err)?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(model.file().metadata()).map_err(|e| load_err(e.to_string()))?,
    );
    let max_token_bytes = max_token_bytes(&tokenizer);
    let prompter = Prompter::from_gguf(model.file(), Some(tokenizer.clone()), &opts.tool_parser)
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let mmproj = opts.mmproj.as_ref().filter(|_| entry.pinned);
    let images = match mmproj {
        None => None,
        Some(path) => {
            if backend.name() != "cpu" && tower.is_none() {
                return Err(ServerError::Config(format!(
                    "--mmproj: the {} backend has no vision tower; use --device cpu",
                    backend.name()
                )));
            }
            let mm = hearth_vision::MmProj::load(path, Some(model.config.dim))
                .map_err(|e| ServerError::Config(format!("--mmproj {}: {e}", path.display())))?;
            let mut input =
                hearth_vision::prompt::ImageInput::new(mm, opts.image_rules, &tokenizer);
            if let Some(upload) = tower {
                let t = upload(&input.mmproj).map_err(|e| {
                    ServerError::Config(format!("--mmproj {}: {e}", path.display()))
                })?;
                input = input.with_tower(t);
            }
            eprintln!(
                "hearth serve: image input from {} (vision tower: {})",
                path.display(),
                input.device()
            );
            Some(Arc::new(input))
        }
    };
    // Ring slots beyond the window: the speculative rollback's and --ring-slack's.
    let slack = opts
        .ring_slack
        .max(drafters.as_ref().map_or(0, |d| d.n_draft()));
    let is_cpu = backend.name() == "cpu";
    let state_bytes = backend
        .new_state(opts.max_ctx, slack)
        .map_err(|e| ServerError::Config(format!("a session state (--ring-slack {slack}): {e}")))?
        .kv_bytes();
    let mut store = SessionStore::new(
        opts.max_sessions.max(1),
        opts.kv_budget_bytes,
        state_bytes,
        opts.max_ctx,
    );
    store.prefix_sharing = !opts.no_prefix_sharing;
    store.anonymous_reuse = !opts.no_prefix_reuse;
    store.set_ring_slack(slack);
    store.checkpoint_policy = hearth_engine::session::CheckpointPolicy {
        every: opts.checkpoint_every,
        max: opts.max_checkpoints,
    };
    if let Some(d) = &drafters {
        let (kind, n_draft, adaptive) = (d.kind().as_str(), d.n_draft(), d.adaptive());
        *metrics
            .engine
            .spec_config
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(scheduler::SpecInfo {
            kind: kind.to_string(),
            n_draft,
            adaptive,
        });
        let how = match adaptive {
            true => "adaptive length, ",
            false => "",
        };
        eprintln!("hearth serve: speculative decoding with {kind} ({how}up to {n_draft} draft tokens per verify pass)");
    }
    let capacity = store.capacity();
    let n_vocab = model.config.vocab_size;
    let head = model.file().data_offset() as usize;
    let model_fingerprint = session_file::fingerprint(&model.file().raw_bytes()[..head]);
    // With several models, each keeps its sessions in a folder of its own.
    let session_dir = match (&opts.session_dir, entry.pinned) {
        (Some(d), true) => Some(d.clone()),
        (Some(d), false) => Some(d.join(&entry.name)),
        (None, _) => None,
    };
    if let Some(dir) = &session_dir {
        let bad = |e: std::io::Error| {
            ServerError::Config(format!("--session-dir {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(bad)?;
        // Evicted sessions go to disk and come back on their next request;
        // not while speculating (a drafter's state is not in a session file).
        if drafters.is_none() {
            let spill: Box<dyn hearth_engine::session::SessionSpill> = match opts.shared_sessions {
                true => {
                    Box::new(session_file::SharedSpill::new(dir, model_fingerprint).map_err(bad)?)
                }
                false => {
                    Box::new(session_file::DirSpill::new(dir, model_fingerprint).map_err(bad)?)
                }
            };
            store.set_spill(spill);
            if opts.shared_sessions {
                store.keep_every_turn();
            }
        } else if opts.shared_sessions {
            eprintln!("warning: --shared-sessions does nothing while speculating (a drafter's state is not in a session file)");
        }
    }
    let file_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
    let kv_bytes = opts
        .kv_budget_bytes
        .unwrap_or(usize::MAX)
        .min(capacity.saturating_mul(state_bytes)) as u64;
    let (scheduler, engine_thread) = scheduler::spawn(
        backend,
        tokenizer.clone(),
        store,
        metrics.engine.clone(),
        scheduler::SchedulerConfig {
            drafters,
            batch_invariant: opts.batch_invariant,
        },
    );
    let engine = engine::EngineHandle(scheduler);
    eprintln!(
        "hearth serve: model '{}' loaded in {:.1} s ({}); context {} tokens; up to {capacity} sessions x {:.1} MiB KV",
        entry.name,
        t0.elapsed().as_secs_f64(),
        prompter.describe(),
        opts.max_ctx,
        state_bytes as f64 / (1024.0 * 1024.0)
    );
    let app = Arc::new(AppState {
        model_id: entry.name.clone(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        prompter,
        images,
        allow_image_urls: opts.allow_image_urls,
        engine,
        metrics,
        pinned: entry.pinned,
        max_ctx: opts.max_ctx,
        max_token_bytes,
        max_body_bytes: opts.max_body_bytes,
        body_timeout: opts.timeouts.body,
        strict_context: opts.strict_context,
        strict_tools: opts.strict_tools,
        session_dir,
        model_fingerprint,
        tokenizer,
        n_vocab,
        grammars: std::sync::OnceLock::new(),
        responses,
        card: ollama::ModelCard::from_gguf(model.file(), &model_fingerprint, mmproj.is_some()),
        pooling: embed::Pooling::from_gguf(model.file().metadata()),
        embedder: is_cpu.then(|| model.clone()),
    });
    drop(model);
    let router = routes::router(app.clone());
    Ok(hub::Resident::new(
        app,
        router,
        engine_thread,
        file_bytes + kv_bytes,
    ))
}

/// The longest text any one token stands for, in bytes (special tokens as
/// written). No token covers more prompt bytes than its text has, so a prompt
/// of B bytes encodes to at least B / this many tokens (routes::check_prompt_bytes).
pub fn max_token_bytes(tokenizer: &Tokenizer) -> usize {
    (0..tokenizer.vocab_size() as u32)
        .map(|id| tokenizer.token_to_piece(id).len())
        .max()
        .unwrap_or(1)
        .max(1)
}

/// A line on stdout (the URL and ready lines scripts wait for); a closed
/// stdout is not the server's problem, so write errors are ignored.
fn stdout_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

/// A drain (SIGTERM): /health answers 503 at once; new requests
/// are still served for the grace (a gateway's or readiness probe's time to
/// notice and send them elsewhere), then refused with 503; the requests in
/// flight finish (up to the timeout). (With `--shared-sessions` every
/// session is already in the session dir as of its last turn, for the
/// replica a gateway moves it to.) A second signal stops at once.
async fn drain_then_stop(
    hub: &Arc<hub::Hub>,
    (grace, timeout): (std::time::Duration, std::time::Duration),
) {
    hub.set_phase(hub::Phase::Draining);
    let t0 = Instant::now();
    eprintln!(
        "hearth serve: draining ({} request(s) in flight; new ones served for {:.0} s more, then refused; Ctrl-C again to stop now)",
        hub.in_flight(),
        grace.as_secs_f64()
    );
    let wait = async {
        tokio::time::sleep(grace).await;
        hub.refuse_new();
        while hub.in_flight() > 0 && t0.elapsed() < grace.max(timeout) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = wait => {}
        _ = shutdown_signal() => {
            eprintln!("hearth serve: shutting down now (a second signal)");
            return;
        }
    }
    let left = hub.in_flight();
    if left > 0 {
        eprintln!("hearth serve: drain timeout: stopping {left} request(s) still in flight");
    }
    eprintln!(
        "hearth serve: shutting down (drained in {:.1} s)",
        t0.elapsed().as_secs_f64()
    );
}

/// Which signal asked the server to stop.
enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
}

async fn shutdown_signal() -> Signal {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => Signal::Interrupt,
        _ = term => Signal::Terminate,
    }
}
