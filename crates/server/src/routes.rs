//! The router: small endpoints, access checks (crate::access), body limits
//! and timeouts, request metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

use crate::chat;
use crate::engine::EngineHandle;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request::validate_session_id;
use hearth_chat::prompter::Prompter;

pub struct AppState {
    pub model_id: String,
    /// Unix time the model was loaded (`/v1/models` `created`).
    pub created: u64,
    pub prompter: Prompter,
    /// Image input (`--mmproj`), with its encode cache.
    pub images: Option<Arc<hearth_vision::prompt::ImageInput>>,
    /// `--allow-image-urls`: `image_url` parts may name http(s) URLs, fetched
    /// by the server (off by default: the server would fetch what clients name).
    pub allow_image_urls: bool,
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
    /// Loaded at start and never unloaded (`-m`).
    pub pinned: bool,
    pub max_ctx: usize,
    /// The longest token's text in bytes: a prompt of B bytes has at least
    /// B / max_token_bytes tokens ([`check_prompt_bytes`]).
    pub max_token_bytes: usize,
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive (408 after).
    pub body_timeout: Duration,
    /// Reject `prompt + max_tokens > context` instead of clamping max_tokens.
    pub strict_context: bool,
    /// `--strict-tools`: every tool call follows its schema.
    pub strict_tools: bool,
    /// `--session-dir`: where sessions are saved and restored.
    pub session_dir: Option<std::path::PathBuf>,
    /// Session files carry it; a file from another model is refused.
    pub model_fingerprint: [u8; 32],
    pub tokenizer: Arc<hearth_tokenizer::Tokenizer>,
    /// The model's logits width.
    pub n_vocab: usize,
    /// Structured output's view of the vocabulary, built on first use.
    pub grammars: std::sync::OnceLock<Result<hearth_grammar::Grammars, String>>,
    /// Stored responses of the Responses API (`previous_response_id`).
    pub responses: Arc<std::sync::Mutex<crate::responses::ResponseStore>>,
    /// What Ollama's `/api/tags`, `/api/show`, `/api/ps` say of the model.
    pub card: crate::ollama::ModelCard,
    /// The CPU model that computes embeddings (`None` on other backends).
    pub embedder: Option<Arc<hearth_models::Model>>,
    /// How embeddings pool the token vectors (the GGUF's `pooling_type`).
    pub pooling: crate::embed::Pooling,
}

impl AppState {
    /// The grammar compiler for this model (built once, on first use).
    pub fn grammars(&self) -> Result<&hearth_grammar::Grammars, ApiError> {
        self.grammars
            .get_or_init(|| {
                let t = std::time::Instant::now();
                let g = hearth_grammar::Grammars::new(self.tokenizer.clone(), self.n_vocab)
                    .map_err(|e| e.to_string());
                eprintln!(
                    "structured output: vocabulary prepared in {:.0} ms",
                    t.elapsed().as_secs_f64() * 1e3
                );
                g
            })
            .as_ref()
            .map_err(|e| ApiError::server(format!("structured output is unavailable: {e}")))
    }
}

/// One model's routes. The hub ([`crate::hub::router`]) runs the access
/// checks, counting and error shapes around them and picks the model.
pub fn router(app: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/v1/responses", post(crate::responses::create))
        .route("/v1/messages", post(crate::anthropic::messages))
        .route(
            "/v1/messages/count_tokens",
            post(crate::anthropic::count_tokens),
        )
        .route("/apply-template", post(chat::apply_template))
        .route("/tokenize", post(crate::tokenize::tokenize))
        .route("/detokenize", post(crate::tokenize::detokenize))
        .route("/api/chat", post(crate::ollama::chat))
        .route("/api/generate", post(crate::ollama::generate))
        .route("/api/show", post(crate::ollama::show))
        .route("/v1/embeddings", post(crate::embed::embeddings))
        .route("/api/embed", post(crate::embed::ollama_embed))
        .route("/api/embeddings", post(crate::embed::ollama_embeddings))
        .route("/v1/sessions/{id}/reset", post(reset_session))
        .route("/v1/sessions/{id}", axum::routing::delete(close_session))
        .route("/v1/sessions/{id}/save", post(save_session))
        .route("/v1/sessions/{id}/restore", post(restore_session))
        .fallback(|req: Request| async move { ApiError::not_found(req.uri().path()) })
        .with_state(app)
}

async fn reset_session(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_session_id(&id)?;
    if !app.engine.reset(id.clone()).await? {
        return Err(ApiError::session_not_found(&id));
    }
    Ok(Json(json!({"reset": true, "session_id": id})))
}

/// Hands the allocator's free pages back to the system (glibc keeps freed
/// KV buffers in its heaps otherwise, and the process stays at its peak).
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

async fn close_session(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_session_id(&id)?;
    if !app.engine.close(id.clone()).await? {
        return Err(ApiError::session_not_found(&id));
    }
    Ok(Json(json!({"closed": true, "session_id": id})))
}

/// The file of session `id` under `--session-dir`.
fn session_path(app: &AppState, id: &str) -> Result<std::path::PathBuf, ApiError> {
    validate_session_id(id)?;
    let dir = app.session_dir.as_ref().ok_or_else(|| {
        ApiError::invalid_request(
            "Saving sessions is off: start the server with --session-dir DIR.",
        )
    })?;
    Ok(dir.join(crate::session_file::file_name(id)))
}

fn store_error(id: &str, e: hearth_engine::session::StoreError) -> ApiError {
    use hearth_engine::session::StoreError;
    match e {
        StoreError::NotFound => ApiError::session_not_found(id),
        StoreError::Busy => ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "invalid_request_error",
            Some("session_busy"),
            format!("Session '{id}' is generating; save or restore it when it is idle."),
        ),
        StoreError::Invalid(m) => ApiError::invalid_request(format!("Session '{id}': {m}")),
    }
}

/// `POST /v1/sessions/{id}/save`: writes the session's tokens and KV state
/// to `--session-dir` (llama-server's slot save).
async fn save_session(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let path = session_path(&app, &id)?;
    let saved = app
        .engine
        .save(id.clone())
        .await?
        .map_err(|e| store_error(&id, e))?;
    let app2 = app.clone();
    let (n, bytes) = tokio::task::spawn_blocking(move || {
        let bytes = crate::session_file::write_file(&path, &app2.model_fingerprint, &saved)?;
        Ok::<_, std::io::Error>((saved.ids.len(), bytes))
    })
    .await
    .map_err(|e| ApiError::server(format!("saving the session: {e}")))?
    .map_err(|e| ApiError::server(format!("writing the session file: {e}")))?;
    Ok(Json(
        json!({"saved": true, "session_id": id, "tokens": n, "bytes": bytes}),
    ))
}

/// `POST /v1/sessions/{id}/restore`: the session saved under that id comes
/// back (created, or replacing what it held); its next request reuses it.
async fn restore_session(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let path = session_path(&app, &id)?;
    let app2 = app.clone();
    let saved = tokio::task::spawn_blocking(move || {
        use crate::session_file::{read_file, ReadError};
        match read_file(&path, &app2.model_fingerprint) {
            Ok(saved) => Ok(saved),
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(None),
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Some(
                "the session file is truncated (shorter than its lengths say)".to_string(),
            )),
            Err(ReadError::Io(e)) => Err(Some(format!("reading the session file: {e}"))),
            Err(ReadError::Invalid(m)) => Err(Some(m)),
        }
    })
    .await
    .map_err(|e| ApiError::server(format!("restoring the session: {e}")))?;
    let saved = match saved {
        Ok(s) => s,
        Err(None) => {
            return Err(ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("session_file_not_found"),
                format!("No saved session '{id}' in --session-dir."),
            ));
        }
        Err(Some(m)) => return Err(ApiError::invalid_request(format!("Session '{id}': {m}"))),
    };
    let n = app
        .engine
        .restore(id.clone(), saved)
        .await?
        .map_err(|e| store_error(&id, e))?;
    Ok(Json(
        json!({"restored": true, "session_id": id, "tokens": n}),
    ))
}

/// A JSON route's whole body: `Content-Type: application/json` (415
/// otherwise), within the size limit (413) and the body timeout (408).
pub async fn read_body(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, ApiError> {
    let limits = crate::hub::BodyLimits {
        max_bytes: app.max_body_bytes,
        timeout: app.body_timeout,
    };
    read_body_limited(limits, headers, body).await
}

/// [`read_body`] with the limits given.
pub async fn read_body_limited(
    limits: crate::hub::BodyLimits,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str());
    match content_type {
        Some(Ok(t)) if is_json(t) => {}
        Some(Ok(t)) => return Err(ApiError::unsupported_media_type(Some(t))),
        Some(Err(_)) => return Err(ApiError::unsupported_media_type(Some("(not ASCII)"))),
        None => return Err(ApiError::unsupported_media_type(None)),
    }
    let limit = limits.max_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    match tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(body_error(e, limit)),
        Err(_) => Err(ApiError::request_timeout(limits.timeout.as_secs_f64())),
    }
}

/// A body that could not be read: past the size limit (413), or framed
/// wrongly (400: a malformed chunked encoding, a connection that ended
/// inside the body).
fn body_error(e: axum::Error, limit: usize) -> ApiError {
    let e = e.into_inner();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return ApiError::payload_too_large(limit);
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if let Some(chunk) = io
                .get_ref()
                .and_then(|e| e.downcast_ref::<crate::conn::OversizedChunk>())
            {
                return ApiError::new(
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    Some("request_too_large"),
                    format!("Request body exceeds the {limit}-byte limit: {chunk}."),
                );
            }
        }
        cause = c.source();
    }
    ApiError::invalid(
        "invalid_body",
        format!("The request body could not be read: {e}."),
    )
}

/// `application/json`, parameters (`; charset=utf-8`) allowed.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The session id from the affinity headers (`x-session-affinity`, `session_id`).
pub fn header_session(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    for name in ["x-session-affinity", "session_id"] {
        if let Some(v) = headers.get(name) {
            let s = v.to_str().map_err(|_| {
                ApiError::invalid(
                    "invalid_session_id",
                    "Invalid session_id: must be printable ASCII with no spaces",
                )
            })?;
            return Ok(Some(s.to_string()));
        }
    }
    Ok(None)
}

/// §8 before tokenizing: a prompt text of `bytes` bytes has at least
/// `bytes / max_token_bytes` tokens (no token's text is longer), so when that
/// bound already fills the context the request is refused without
/// tokenizing it.
pub fn check_prompt_bytes(app: &AppState, bytes: usize) -> Result<(), ApiError> {
    let at_least = bytes.div_ceil(app.max_token_bytes);
    if at_least >= app.max_ctx {
        return Err(ApiError::invalid(
            "context_length_exceeded",
            format!("This model's maximum context length is {} tokens, but the request has at least {at_least} prompt tokens ({bytes} bytes of prompt text).", app.max_ctx),
        ));
    }
    Ok(())
}

/// §8: the prompt must leave room for one token; `max_tokens` is clamped to
/// the room (or, with `strict_context`, rejected when it does not fit).
pub fn check_context(
    app: &AppState,
    prompt_tokens: usize,
    asked: Option<usize>,
) -> Result<usize, ApiError> {
    let ctx = app.max_ctx;
    if prompt_tokens >= ctx {
        return Err(ApiError::invalid(
            "context_length_exceeded",
            format!("This model's maximum context length is {ctx} tokens, but the request has {prompt_tokens} prompt tokens."),
        ));
    }
    let room = ctx - prompt_tokens;
    match asked {
        Some(m) if m > room && app.strict_context => Err(ApiError::invalid(
            "context_length_exceeded",
            format!(
                "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                prompt_tokens.saturating_add(m)
            ),
        )),
        Some(m) => Ok(m.min(room)),
        None => Ok(room),
    }
}
