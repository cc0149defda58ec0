//! The router: small endpoints, authentication, body limits, request metrics.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
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
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    pub max_ctx: usize,
    pub max_body_bytes: usize,
    /// Reject `prompt + max_tokens > context` instead of clamping max_tokens.
    pub strict_context: bool,
}

pub fn router(app: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/apply-template", post(chat::apply_template))
        .route("/v1/sessions/{id}/reset", post(reset_session))
        .route("/v1/sessions/{id}", axum::routing::delete(close_session))
        .route("/metrics", get(metrics))
        .fallback(|req: Request| async move { ApiError::not_found(req.uri().path()) })
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// API key check (everything but /health) and per-status request counting.
async fn guard(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let endpoint = if path.starts_with("/v1/sessions/") {
        "/v1/sessions".to_string()
    } else {
        path.to_string()
    };
    let response = match &app.api_key {
        Some(key) if path != "/health" && !authorized(req.headers(), key) => {
            ApiError::unauthorized().into_response()
        }
        _ => next.run(req).await,
    };
    app.metrics
        .count_request(&endpoint, response.status().as_u16());
    response
}

fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer == Some(key) || x_api_key == Some(key)
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(app): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": app.model_id, "object": "model", "created": app.created, "owned_by": "hearth",
                  "max_model_len": app.max_ctx}]
    }))
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

async fn reset_session(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_session_id(&id)?;
    app.engine.reset(id.clone()).await?;
    Ok(Json(json!({"reset": true, "session_id": id})))
}

async fn close_session(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_session_id(&id)?;
    app.engine.close(id.clone()).await?;
    Ok(Json(json!({"closed": true, "session_id": id})))
}

/// The whole body, within the size limit (413 otherwise).
pub async fn read_body(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, ApiError> {
    let limit = app.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::payload_too_large(limit))
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
