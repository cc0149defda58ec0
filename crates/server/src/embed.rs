//! Embeddings: OpenAI's `POST /v1/embeddings` and Ollama's `POST /api/embed`
//! (and its older `/api/embeddings`). Each input runs through the model from
//! position 0 in a state of its own (the chat sessions are not touched);
//! the last hidden states after the output norm are pooled by the GGUF's
//! `{arch}.pooling_type` (mean when it has none, or none: 0), then
//! L2-normalized, as llama.cpp's `llama-embedding --embd-normalize 2` does.
//! The prompt is tokenized with the model's special tokens added (BOS where
//! the model adds one) and special tokens parsed, as llama.cpp does.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Map, Value};

use crate::chat::prepare;
use crate::error::ApiError;
use crate::routes::AppState;

/// How an input's token vectors become one (llama.cpp's pooling types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    /// The first token's vector.
    Cls,
    /// The last token's vector.
    Last,
}

impl Pooling {
    /// `{arch}.pooling_type` (1 mean, 2 cls, 3 last); absent, 0 (none) or a
    /// kind with no single vector (rank): mean.
    pub fn from_gguf(md: &hearth_gguf::Metadata) -> Pooling {
        let arch = md.get_str("general.architecture").unwrap_or("");
        let key = format!("{arch}.pooling_type");
        let v = md.get(&key).and_then(|v| match v {
            hearth_gguf::Value::U32(x) => Some(*x as i64),
            hearth_gguf::Value::I32(x) => Some(*x as i64),
            hearth_gguf::Value::U8(x) => Some(*x as i64),
            _ => None,
        });
        match v {
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            _ => Pooling::Mean,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// One input's embedding: pooled, L2-normalized.
pub fn embed(
    model: &hearth_models::Model,
    pooling: Pooling,
    ids: &[u32],
) -> Result<Vec<f32>, ApiError> {
    let dim = model.config.dim;
    let h = model
        .hidden_states(ids)
        .map_err(|e| ApiError::server(format!("embedding: {e}")))?;
    let n = h.len() / dim;
    let mut v = vec![0.0f64; dim];
    match pooling {
        Pooling::Mean => {
            for row in h.chunks_exact(dim) {
                v.iter_mut().zip(row).for_each(|(a, &x)| *a += x as f64);
            }
            v.iter_mut().for_each(|a| *a /= n.max(1) as f64);
        }
        Pooling::Cls => v
            .iter_mut()
            .zip(&h[..dim])
            .for_each(|(a, &x)| *a = x as f64),
        Pooling::Last => v
            .iter_mut()
            .zip(&h[(n - 1) * dim..])
            .for_each(|(a, &x)| *a = x as f64),
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    Ok(v.iter().map(|x| (x * scale) as f32).collect())
}

/// The model that embeds, or why this server's cannot.
fn embedder(app: &AppState) -> Result<&Arc<hearth_models::Model>, ApiError> {
    app.embedder.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "embeddings_unsupported",
            "Embeddings run on the CPU backend only; start the server with --device cpu.",
        )
    })
}

/// The inputs as token ids: strings tokenized (with the model's special
/// tokens), or ids given directly (OpenAI's token arrays).
fn inputs(app: &AppState, field: &str, v: Option<&Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |what: &str| ApiError::invalid_request(format!("{field}: {what}"));
    let encode = |s: &str| {
        if s.is_empty() {
            return Err(bad("an input is empty"));
        }
        app.tokenizer
            .try_encode(s, true, true)
            .map_err(|e| bad(&format!("could not be tokenized: {e}")))
    };
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < app.n_vocab)
                    .map(|t| t as u32)
                    .ok_or_else(|| {
                        bad(&format!(
                            "token ids must be integers below the vocabulary size {}",
                            app.n_vocab
                        ))
                    })
            })
            .collect()
    };
    let out = match v {
        None | Some(Value::Null) => return Err(bad("required (a string or an array of strings)")),
        Some(Value::String(s)) => vec![encode(s)?],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|s| encode(s.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![ids(a)?],
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|x| ids(x.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(bad(
                "must be a string, an array of strings, an array of token ids, or an array of such arrays",
            ))
        }
    };
    if out.iter().any(Vec::is_empty) {
        return Err(bad("an input has no tokens"));
    }
    if out.len() > MAX_INPUTS {
        return Err(bad(&format!("at most {MAX_INPUTS} inputs per request")));
    }
    Ok(out)
}

/// Inputs per request, at most (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// Inputs past the context: an error, or (Ollama's `truncate`, its
/// default) cut to the context.
fn fit(app: &AppState, inputs: &mut [Vec<u32>], truncate: bool) -> Result<(), ApiError> {
    for (i, ids) in inputs.iter_mut().enumerate() {
        if ids.len() > app.max_ctx {
            if !truncate {
                return Err(ApiError::invalid(
                    "context_length_exceeded",
                    format!(
                        "input[{i}] has {} tokens; this model's context is {} tokens.",
                        ids.len(),
                        app.max_ctx
                    ),
                ));
            }
            ids.truncate(app.max_ctx);
        }
    }
    Ok(())
}

/// `dimensions`: only the model's own is accepted (no truncated embeddings).
fn dimensions(body: &Map<String, Value>, dim: usize) -> Result<(), ApiError> {
    match body.get("dimensions") {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.as_u64() == Some(dim as u64) => Ok(()),
        Some(v) => Err(ApiError::invalid(
            "invalid_value",
            format!(
                "dimensions: this model's embeddings have {dim} dimensions and are not shortened (got {v})."
            ),
        )),
    }
}

/// `POST /v1/embeddings` (OpenAI).
pub async fn embeddings(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    prepare(&app, &headers, body, |app, body, _| {
        let model = embedder(app)?;
        let base64 = match body.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) if s == "float" => false,
            Some(Value::String(s)) if s == "base64" => true,
            Some(v) => {
                return Err(ApiError::invalid_request(format!(
                    "encoding_format must be \"float\" or \"base64\" (got {v})."
                )))
            }
        };
        dimensions(body, model.config.dim)?;
        let mut ins = inputs(app, "input", body.get("input"))?;
        fit(app, &mut ins, false)?;
        let mut data = Vec::with_capacity(ins.len());
        let mut tokens = 0;
        for (i, ids) in ins.iter().enumerate() {
            let v = embed(model, app.pooling, ids)?;
            tokens += ids.len();
            let e = match base64 {
                true => json!(encode_base64(&v)),
                false => json!(v),
            };
            data.push(json!({"object": "embedding", "index": i, "embedding": e}));
        }
        Ok(Json(json!({
            "object": "list", "data": data, "model": app.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}
        })))
    })
    .await
}

/// `POST /api/embed` (Ollama): `input` a string or strings, `truncate`
/// (default true), `dimensions`; the vectors as `embeddings`.
pub async fn ollama_embed(
    State(app): State<Arc<AppState>>,
    load: Option<axum::Extension<crate::hub::LoadTime>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let load = load.map_or(std::time::Duration::ZERO, |l| l.0 .0);
    let t0 = Instant::now();
    prepare(&app, &headers, body, move |app, body, _| {
        let model = embedder(app)?;
        dimensions(body, model.config.dim)?;
        let truncate = crate::request::bool_field(body, "truncate", true)?;
        let mut ins = inputs(app, "input", body.get("input"))?;
        fit(app, &mut ins, truncate)?;
        let vecs = ins
            .iter()
            .map(|ids| embed(model, app.pooling, ids))
            .collect::<Result<Vec<_>, _>>()?;
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        Ok(Json(json!({
            "model": app.model_id, "embeddings": vecs,
            "total_duration": ns(t0.elapsed() + load), "load_duration": ns(load),
            "prompt_eval_count": ins.iter().map(Vec::len).sum::<usize>(),
        })))
    })
    .await
}

/// `POST /api/embeddings` (Ollama's older route): `prompt`, one `embedding`.
pub async fn ollama_embeddings(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    prepare(&app, &headers, body, |app, body, _| {
        let model = embedder(app)?;
        let mut ins = match body.get("prompt") {
            Some(Value::String(_)) => inputs(app, "prompt", body.get("prompt"))?,
            _ => return Err(ApiError::invalid_request("prompt: required (a string)")),
        };
        fit(app, &mut ins, true)?;
        Ok(Json(
            json!({"embedding": embed(model, app.pooling, &ins[0])?}),
        ))
    })
    .await
}

/// Little-endian f32s in standard base64 (OpenAI's `encoding_format: base64`).
fn encode_base64(v: &[f32]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(match i <= c.len() {
                true => A[(n >> shift & 63) as usize] as char,
                false => '=',
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_of_floats() {
        // Checked against Python: base64.b64encode(struct.pack('<2f', 1.0, -2.5)).
        assert_eq!(encode_base64(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(encode_base64(&[]), "");
        assert_eq!(encode_base64(&[0.5]), "AAAAPw==");
    }
}
