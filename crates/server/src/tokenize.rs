//! llama-server's `POST /tokenize` and `POST /detokenize`: the served model's
//! tokenizer over HTTP, for clients that budget their context (RAG tools,
//! agents) or check a prompt's tokens.
//!
//! `/tokenize` takes `content` (a string), `add_special` (default false),
//! `parse_special` (default true) and `with_pieces` (default false), and
//! answers `{"tokens": [id, ...]}`, or with pieces `{"tokens": [{"id", "piece"}]}`
//! where a piece that is not whole UTF-8 comes as its list of bytes.
//! `/detokenize` takes `tokens` (ids; absent = none) and answers `{"content"}`,
//! the pieces concatenated with special tokens rendered, as llama-server does.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use crate::chat::prepare;
use crate::error::ApiError;
use crate::request::bool_field;
use crate::routes::AppState;

/// `POST /tokenize`.
pub async fn tokenize(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    prepare(&app, &headers, body, |app, body, _| {
        let content = match body.get("content") {
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(ApiError::invalid_request("content must be a string.")),
            None => return Err(ApiError::invalid_request("content is required.")),
        };
        let add_special = bool_field(body, "add_special", false)?;
        let parse_special = bool_field(body, "parse_special", true)?;
        let with_pieces = bool_field(body, "with_pieces", false)?;
        let ids = app
            .tokenizer
            .try_encode(content, add_special, parse_special)
            .map_err(|e| {
                ApiError::invalid_request(format!("content could not be tokenized: {e}"))
            })?;
        let tokens: Vec<Value> = match with_pieces {
            false => ids.iter().map(|&id| json!(id)).collect(),
            true => ids
                .iter()
                .map(|&id| {
                    let bytes = app.tokenizer.token_to_piece(id);
                    let piece = match std::str::from_utf8(bytes) {
                        Ok(s) => json!(s),
                        Err(_) => json!(bytes),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect(),
        };
        Ok(Json(json!({ "tokens": tokens })))
    })
    .await
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    prepare(&app, &headers, body, |app, body, _| {
        let vocab = app.tokenizer.vocab_size();
        let ids = match body.get("tokens") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v.as_u64() {
                    Some(id) if (id as usize) < vocab => Ok(id as u32),
                    _ => Err(ApiError::invalid_request(format!(
                        "tokens[{i}] must be a token id between 0 and {} (got {v}).",
                        vocab - 1
                    ))),
                })
                .collect::<Result<Vec<u32>, ApiError>>()?,
            Some(_) => {
                return Err(ApiError::invalid_request(
                    "tokens must be an array of token ids.",
                ))
            }
        };
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| app.tokenizer.token_to_piece(id).iter().copied())
            .collect();
        Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })))
    })
    .await
}
