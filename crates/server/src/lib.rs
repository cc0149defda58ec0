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
pub mod chat;
pub mod conn;
pub mod engine;
pub mod error;
pub mod fault;
pub mod images;
pub mod metrics;
pub mod ollama;
pub mod request;
pub mod responses;
pub mod routes;
pub mod session_file;
pub mod tokenize;
pub mod validate;

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

#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub model_path: PathBuf,
    /// The id clients must send as `model` (or omit).
    pub model_id: String,
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
    run_on(opts, |path| {
        let model = Arc::new(Model::load(path).map_err(|e| e.to_string())?);
        Ok(Loaded {
            model: model.clone(),
            backend: model,
            drafters: None,
            tower: None,
        })
    })
}

/// [`run`] on any backend: `load` opens the model file (see [`Loaded`]).
pub fn run_on<B: Backend + 'static>(
    opts: ServerOptions,
    load: impl FnOnce(&Path) -> Result<Loaded<B>, String>,
) -> Result<(), ServerError> {
    let t0 = Instant::now();
    if opts.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(ServerError::Config(
            "the API key is empty (an unset variable?); give a key or none".into(),
        ));
    }
    let load_err = |message: String| ServerError::Load {
        path: opts.model_path.display().to_string(),
        message,
    };
    let Loaded {
        model,
        backend,
        drafters,
        tower,
    } = load(&opts.model_path).map_err(load_err)?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(model.file().metadata()).map_err(|e| load_err(e.to_string()))?,
    );
    let max_token_bytes = max_token_bytes(&tokenizer);
    let prompter = Prompter::from_gguf(model.file(), Some(tokenizer.clone()), &opts.tool_parser)
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let images = match &opts.mmproj {
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
    if opts.max_ctx < 2 {
        return Err(ServerError::Config(
            "the context size must be at least 2 tokens".into(),
        ));
    }
    // Ring slots beyond the window: the speculative rollback's and --ring-slack's.
    let slack = opts
        .ring_slack
        .max(drafters.as_ref().map_or(0, |d| d.n_draft()));
    let state_bytes = backend
        .new_state(opts.max_ctx, slack)
        .map_err(|e| ServerError::Config(format!("a session state (--ring-slack {slack}): {e}")))?
        .kv_bytes();
    let store = SessionStore::new(
        opts.max_sessions.max(1),
        opts.kv_budget_bytes,
        state_bytes,
        opts.max_ctx,
    );
    let mut store = store;
    store.prefix_sharing = !opts.no_prefix_sharing;
    store.anonymous_reuse = !opts.no_prefix_reuse;
    store.set_ring_slack(slack);
    store.checkpoint_policy = hearth_engine::session::CheckpointPolicy {
        every: opts.checkpoint_every,
        max: opts.max_checkpoints,
    };
    let metrics = Arc::new(Metrics::default());
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
    if let Some(dir) = &opts.session_dir {
        let bad = |e: std::io::Error| {
            ServerError::Config(format!("--session-dir {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(bad)?;
        // Evicted sessions go to disk and come back on their next request;
        // not while speculating (a drafter's state is not in a session file).
        if drafters.is_none() {
            let spill = session_file::DirSpill::new(dir, model_fingerprint).map_err(bad)?;
            store.set_spill(Box::new(spill));
        }
    }
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
        opts.model_id,
        t0.elapsed().as_secs_f64(),
        prompter.describe(),
        opts.max_ctx,
        state_bytes as f64 / (1024.0 * 1024.0)
    );

    let final_stop = engine.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Request preparation (JSON, template, tokenizer) runs here, bounded.
        .max_blocking_threads(4)
        // Structured output's grammars compile on these threads (llguidance
        // recurses over a schema's structure); only what is touched is resident.
        .thread_stack_size(REQUEST_STACK_BYTES)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| ServerError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local: SocketAddr = listener.local_addr()?;
        let app = Arc::new(AppState {
            model_id: opts.model_id.clone(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            prompter,
            images,
            allow_image_urls: opts.allow_image_urls,
            engine: engine.clone(),
            metrics,
            access: access::Access {
                bound: local,
                allowed_hosts: opts.allowed_hosts.clone(),
                cors_origins: opts.cors_origins.clone(),
                api_key: opts.api_key.clone(),
            },
            max_ctx: opts.max_ctx,
            max_token_bytes,
            max_body_bytes: opts.max_body_bytes,
            body_timeout: opts.timeouts.body,
            strict_context: opts.strict_context,
            strict_tools: opts.strict_tools,
            session_dir: opts.session_dir.clone(),
            model_fingerprint,
            tokenizer: tokenizer.clone(),
            n_vocab,
            grammars: std::sync::OnceLock::new(),
            responses: Default::default(),
            card: ollama::ModelCard::from_gguf(
                model.file(),
                &model_fingerprint,
                opts.mmproj.is_some(),
            ),
        });
        let host = if local.is_ipv6() {
            format!("[{}]", local.ip())
        } else {
            local.ip().to_string()
        };
        stdout_line(&format!(
            "hearth serve: listening on http://{host}:{}/v1",
            local.port()
        ));
        if !local.ip().is_loopback() && opts.api_key.is_none() {
            eprintln!(
                "warning: listening on a non-loopback address without an API key; set --api-key"
            );
        }
        stdout_line("hearth serve: ready");
        let shutdown_engine = engine.clone();
        conn::serve(
            listener,
            routes::router(app),
            opts.timeouts,
            opts.max_body_bytes,
            async move {
                shutdown_signal().await;
                eprintln!("hearth serve: shutting down");
                // Ends every generation, so open streams finish and the
                // graceful shutdown does not wait on them.
                shutdown_engine.shutdown();
            },
        )
        .await;
        Ok::<(), ServerError>(())
    });
    final_stop.shutdown();
    drop(final_stop);
    let _ = engine_thread.join();
    result
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

async fn shutdown_signal() {
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
        _ = ctrl_c => {},
        _ = term => {},
    }
}
