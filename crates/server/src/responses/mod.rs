//! OpenAI's Responses API (`POST /v1/responses`, `GET` / `DELETE
//! /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`), as Codex CLI and
//! `client.responses.*` speak it: a translation onto the chat completions
//! request (shared validation, rendering, prefix reuse, structured output,
//! tool-call parsing) and of the parser's events back into output items and
//! the published stream events. Stored responses (`store`, default true)
//! keep their conversation, so `previous_response_id` continues it; the
//! continued prompt begins with the stored one, so its KV is reused by
//! prefix. The store is bounded (oldest first out) and its ids are random
//! 128-bit values, each usable only by the tenant (`cache_salt`) that made it.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use hearth_chat::parser::OutputParser;
use hearth_engine::scheduler::{Event, Summary};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::chat::{collect, hint, start_chat, Reply, Started};
use crate::error::ApiError;
use crate::routes::AppState;

/// Stored responses kept at most (the oldest goes first).
pub const STORE_CAPACITY: usize = 1024;

/// A stored response: its conversation (chat messages, the answer
/// included) for `previous_response_id`, and the response object for GET.
pub(crate) struct Stored {
    pub(crate) salt: Option<String>,
    pub(crate) messages: Vec<Value>,
    response: Value,
}

/// The stored responses of this server.
#[derive(Default)]
pub struct ResponseStore {
    pub(crate) map: HashMap<String, Stored>,
    order: VecDeque<String>,
}

impl ResponseStore {
    fn put(&mut self, id: String, stored: Stored) {
        while self.map.len() >= STORE_CAPACITY {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.order.push_back(id.clone());
        self.map.insert(id, stored);
    }
}

pub(crate) fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("response_not_found"),
        format!("No response '{id}' (responses are kept while the server runs, the latest {STORE_CAPACITY})."),
    )
}

pub(crate) fn salt_of(body: &Map<String, Value>) -> Option<String> {
    body.get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string)
}

mod output;

use crate::api::responses::{translate, ToolNames};
use output::{Items, Out};

/// `POST /v1/responses`.
pub async fn create(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The request's own fields are echoed in the response object.
    let started = start_chat(&app, &headers, body, translate_echo, "resp").await?;
    let Started {
        reply,
        parser,
        rx,
        req,
        prompt_tokens,
        cached_tokens,
        translated,
    } = started;
    let mut chat = translated.expect("translated");
    let echo = match chat.remove("__echo") {
        Some(Value::Object(e)) => e,
        _ => Map::new(),
    };
    let names = ToolNames::from_json(&chat.remove("__tools").unwrap_or(Value::Null));
    let w = Writer {
        app: app.clone(),
        reply,
        parser,
        items: Items::new(names),
        prompt_tokens,
        cached_tokens,
        messages: match chat.remove("messages") {
            Some(Value::Array(m)) => m,
            _ => Vec::new(),
        },
        echo,
        seq: 0,
    };
    if req.common.stream {
        Ok(sse(response_stream(w, rx)))
    } else {
        whole(w, rx).await
    }
}

/// [`translate`], with the fields the response object echoes kept aside
/// under `__echo` (parse_chat ignores top-level fields it does not know;
/// [`create`] takes it out again).
fn translate_echo(
    body: &Map<String, Value>,
    app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut out = translate(body, app)?.expect("translated");
    let mut echo = Map::new();
    for key in [
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "previous_response_id",
        "store",
        "temperature",
        "top_p",
        "max_output_tokens",
        "metadata",
        "cache_salt",
    ] {
        echo.insert(key.into(), body.get(key).cloned().unwrap_or(Value::Null));
    }
    out.insert("__echo".into(), Value::Object(echo));
    Ok(Some(out))
}

struct Writer {
    app: Arc<AppState>,
    reply: Reply,
    parser: Box<dyn OutputParser + Send>,
    items: Items,
    prompt_tokens: usize,
    cached_tokens: usize,
    /// The request's conversation as chat messages (stored with the answer).
    messages: Vec<Value>,
    echo: Map<String, Value>,
    seq: u64,
}

impl Writer {
    fn next_seq(&mut self) -> u64 {
        let n = self.seq;
        self.seq += 1;
        n
    }

    /// The response object: `status` and, when done, the output and usage.
    fn object(&self, status: &str, summary: Option<&Summary>, error: Option<&ApiError>) -> Value {
        let mut r = json!({
            "id": self.reply.id, "object": "response", "created_at": self.reply.created,
            "status": status, "model": self.reply.model, "output": self.items.done,
            "error": error.map(|e| json!({"code": e.code.unwrap_or("server_error"), "message": e.message})),
            "incomplete_details": null, "usage": null,
        });
        for (k, v) in &self.echo {
            if k != "cache_salt" {
                r[k] = v.clone();
            }
        }
        for (k, default) in [
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("store", json!(true)),
            ("text", json!({"format": {"type": "text"}})),
        ] {
            if r[k].is_null() {
                r[k] = default;
            }
        }
        if let Some(s) = summary {
            if matches!(
                s.finish,
                hearth_engine::turn::FinishReason::Length
                    | hearth_engine::turn::FinishReason::Cancelled
            ) && !self.items.any_call
            {
                r["status"] = json!("incomplete");
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            r["usage"] = json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": s.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + s.completion_tokens,
            });
        }
        r
    }

    /// Keeps the finished response (unless `store: false`).
    fn store(&mut self, response: &Value) {
        if self.echo.get("store") == Some(&Value::Bool(false)) {
            return;
        }
        let mut messages = std::mem::take(&mut self.messages);
        let mut answer = Map::new();
        answer.insert("role".into(), json!("assistant"));
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        for item in &self.items.done {
            match item["type"].as_str() {
                Some("message") => text.push_str(item["content"][0]["text"].as_str().unwrap_or("")),
                Some("reasoning") => {
                    reasoning.push_str(item["content"][0]["text"].as_str().unwrap_or(""))
                }
                Some("function_call") => {
                    let flat = self.items.names.flat(
                        item["namespace"].as_str(),
                        item["name"].as_str().unwrap_or_default(),
                    );
                    calls.push(json!({"id": item["call_id"], "type": "function",
                    "function": {"name": flat, "arguments": item["arguments"]}}))
                }
                Some("custom_tool_call") => {
                    let flat = self.items.names.flat(
                        item["namespace"].as_str(),
                        item["name"].as_str().unwrap_or_default(),
                    );
                    let args = json!({"input": item["input"]}).to_string();
                    calls.push(json!({"id": item["call_id"], "type": "function",
                    "function": {"name": flat, "arguments": args}}))
                }
                _ => {}
            }
        }
        answer.insert(
            "content".into(),
            match text.is_empty() && !calls.is_empty() {
                true => Value::Null,
                false => json!(text),
            },
        );
        if !reasoning.is_empty() {
            answer.insert("reasoning_content".into(), json!(reasoning));
        }
        if !calls.is_empty() {
            answer.insert("tool_calls".into(), Value::Array(calls));
        }
        messages.push(Value::Object(answer));
        let salt = self
            .echo
            .get("cache_salt")
            .and_then(Value::as_str)
            .map(str::to_string);
        self.app
            .responses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(
                self.reply.id.clone(),
                Stored {
                    salt,
                    messages,
                    response: response.clone(),
                },
            );
    }
}

async fn whole(
    mut w: Writer,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut sink = Vec::new();
    let (summary, _) = collect(&mut rx, |t| {
        let events = w.parser.feed(&t);
        w.items.events(events, w.reply.reasoning, &mut sink);
    })
    .await?;
    let events = w.parser.finish(hint(summary.finish));
    w.items.events(events, w.reply.reasoning, &mut sink);
    w.items.close(&mut sink);
    let r = w.object("completed", Some(&summary), None);
    w.store(&r);
    Ok(Json(r).into_response())
}

fn sse(events: impl Stream<Item = (String, Value)> + Send + 'static) -> Response {
    let stream = events.map(|(name, data)| {
        Ok::<_, Infallible>(SseEvent::default().event(name).data(data.to_string()))
    });
    let mut r = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Each event's data with its `type` and `sequence_number`.
fn stamp(w: &mut Writer, out: Vec<Out>) -> Vec<(String, Value)> {
    out.into_iter()
        .map(|(name, mut data)| {
            data["type"] = json!(name);
            data["sequence_number"] = json!(w.next_seq());
            (name.to_string(), data)
        })
        .collect()
}

/// response.created, response.in_progress, the items' events as the parser
/// produces them, then response.completed (or .incomplete); a failure is
/// response.failed.
fn response_stream(
    mut w: Writer,
    rx: mpsc::UnboundedReceiver<Event>,
) -> impl Stream<Item = (String, Value)> + Send {
    let created = w.object("in_progress", None, None);
    let start = stamp(
        &mut w,
        vec![
            ("response.created", json!({"response": created})),
            ("response.in_progress", json!({"response": created})),
        ],
    );
    let rest = stream::unfold(Some((w, rx)), |st| async move {
        let (mut w, mut rx) = st?;
        let mut out = Vec::new();
        match rx.recv().await {
            Some(Event::Text(t)) => {
                let events = w.parser.feed(&t);
                w.items.events(events, w.reply.reasoning, &mut out);
            }
            Some(Event::Done(s)) => {
                let events = w.parser.finish(hint(s.finish));
                w.items.events(events, w.reply.reasoning, &mut out);
                w.items.close(&mut out);
                let r = w.object("completed", Some(&s), None);
                w.store(&r);
                let name = match r["status"].as_str() {
                    Some("incomplete") => "response.incomplete",
                    _ => "response.completed",
                };
                out.push((name, json!({"response": r})));
                return Some((stamp(&mut w, out), None));
            }
            Some(Event::Failed(e)) => {
                let e: ApiError = e.into();
                let r = w.object("failed", None, Some(&e));
                out.push(("response.failed", json!({"response": r})));
                return Some((stamp(&mut w, out), None));
            }
            Some(Event::Admitted { .. }) | Some(Event::Logprobs(_)) | Some(Event::Progress(_)) => {}
            None => {
                let e = ApiError::server("the engine dropped the request");
                let r = w.object("failed", None, Some(&e));
                out.push(("response.failed", json!({"response": r})));
                return Some((stamp(&mut w, out), None));
            }
        }
        let stamped = stamp(&mut w, out);
        Some((stamped, Some((w, rx))))
    });
    stream::iter(start).chain(rest.flat_map(stream::iter))
}

/// `GET /v1/responses/{id}`.
pub fn get(store: &Mutex<ResponseStore>, id: &str) -> Result<Json<Value>, ApiError> {
    let store = store.lock().unwrap_or_else(|e| e.into_inner());
    let s = store.map.get(id).ok_or_else(|| not_found(id))?;
    Ok(Json(s.response.clone()))
}

/// `DELETE /v1/responses/{id}`.
pub fn delete(store: &Mutex<ResponseStore>, id: &str) -> Result<Json<Value>, ApiError> {
    let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
    store.map.remove(id).ok_or_else(|| not_found(id))?;
    store.order.retain(|k| k != id);
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// `POST /v1/responses/{id}/cancel`: only background responses can be
/// cancelled, and this server runs none (a response is answered on its
/// own connection; closing it stops the generation).
pub fn cancel(store: &Mutex<ResponseStore>, id: &str) -> Result<Json<Value>, ApiError> {
    let store = store.lock().unwrap_or_else(|e| e.into_inner());
    store.map.get(id).ok_or_else(|| not_found(id))?;
    Err(ApiError::invalid(
        "not_background",
        "Only background responses can be cancelled; this response has finished (close the connection to stop one that is running).",
    ))
}
