//! Anthropic's Messages API (`POST /v1/messages`, `POST
//! /v1/messages/count_tokens`), as Claude Code and the `anthropic` SDKs
//! speak it: a translation onto the chat completions request (the shared
//! validation, rendering, sessions, prefix reuse, structured tool calls) and
//! of the parser's events back into Messages content blocks and stream
//! events. Errors keep Anthropic's shape (`{"type":"error","error":{…}}`,
//! [`reshape_errors`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use hearth_chat::parser::{ChatEvent, OutputParser};
use hearth_engine::scheduler::{Event, Summary};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::chat::{collect, hint, start_chat, Reply};
use crate::error::ApiError;
use crate::routes::AppState;

/// `POST /v1/messages`.
pub async fn messages(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = start_chat(&app, &headers, body, translate, "msg").await?;
    let stream = started.req.common.stream;
    let writer = Writer {
        reply: started.reply,
        parser: started.parser,
        blocks: Blocks::default(),
        prompt_tokens: started.prompt_tokens,
        cached_tokens: started.cached_tokens,
    };
    if stream {
        Ok(sse(message_stream(writer, started.rx)))
    } else {
        message_whole(writer, started.rx).await
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as this model's
/// template renders the request (`{"input_tokens": N}`).
pub async fn count_tokens(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let n = crate::chat::prepare(&app, &headers, body, |prep, obj, session| {
        let mut obj = obj.clone();
        // count_tokens takes no max_tokens; one satisfies the translation.
        obj.entry("max_tokens").or_insert(json!(1));
        let obj = translate(&obj, prep)?.expect("translated");
        let req = crate::request::parse_chat(&obj, &prep.model_id, session)?;
        if crate::images::has_images(&req.messages) {
            return Err(ApiError::invalid_request(
                "count_tokens does not count image blocks yet: send the request without them.",
            ));
        }
        let text = prep
            .prompter
            .render(&req.messages, req.tools.as_ref(), true, &req.kwargs)
            .map_err(crate::chat::prompt_error)?;
        crate::routes::check_prompt_bytes(prep, text.len())?;
        let ids = prep
            .prompter
            .chat_ids(&req.messages, req.tools.as_ref(), &req.kwargs)
            .map_err(crate::chat::prompt_error)?;
        Ok(ids.len())
    })
    .await?;
    Ok(Json(json!({ "input_tokens": n })))
}

fn bad(path: impl std::fmt::Display, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(format!("{path}: {what}"))
}

/// Claude Code's per-request metadata block in `system`
/// (`x-anthropic-billing-header: …cch=<hash>`): its hash changes on every
/// request, so left in the prompt it would part every turn's prompt from
/// the last at its first tokens (llama.cpp issue 19494). It says nothing
/// to the model; it is left out.
fn is_client_metadata(text: &str) -> bool {
    text.trim_start().starts_with("x-anthropic-billing-header:")
}

/// The text of `system` (a string or text blocks), client metadata left out.
fn system_text(v: &Value) -> Result<Option<String>, ApiError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok((!is_client_metadata(s)).then(|| s.clone())),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let at = format!("system[{i}]");
                if b.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(bad(&at, "system blocks must be text blocks"));
                }
                let t = b
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.text"), "required (a string)"))?;
                if !is_client_metadata(t) {
                    parts.push(t.to_string());
                }
            }
            Ok((!parts.is_empty()).then(|| parts.join("\n\n")))
        }
        _ => Err(bad("system", "must be a string or an array of text blocks")),
    }
}

/// An `image` block as a chat completions `image_url` part.
fn image_part(b: &Value, at: &str) -> Result<Value, ApiError> {
    let src = b
        .get("source")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(format!("{at}.source"), "required (an object)"))?;
    let url = match src.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = src
                .get("media_type")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("{at}.source.media_type"), "required"))?;
            let data = src
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("{at}.source.data"), "required (base64)"))?;
            format!("data:{media};base64,{data}")
        }
        Some("url") => src
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.source.url"), "required"))?
            .to_string(),
        _ => {
            return Err(bad(
                format!("{at}.source.type"),
                "must be \"base64\" or \"url\"",
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A `tool_result` block's content as text (a string, or text blocks).
fn tool_result_text(b: &Value, at: &str) -> Result<String, ApiError> {
    let text = match b.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (k, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => out.push(
                        p.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                bad(format!("{at}.content[{k}].text"), "required (a string)")
                            })?
                            .to_string(),
                    ),
                    Some(t) => {
                        return Err(bad(
                            format!("{at}.content[{k}].type"),
                            format!("'{t}' is not supported in a tool result (text only)"),
                        ))
                    }
                    None => return Err(bad(format!("{at}.content[{k}].type"), "required")),
                }
            }
            out.join("\n")
        }
        Some(_) => {
            return Err(bad(
                format!("{at}.content"),
                "must be a string or an array of blocks",
            ))
        }
    };
    Ok(match b.get("is_error").and_then(Value::as_bool) {
        Some(true) => format!("Error: {text}"),
        _ => text,
    })
}

/// One Messages message as chat completions messages (a user turn's tool
/// results become tool messages, ahead of its other content).
fn message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        // Claude Code sends system messages among the turns (reminders):
        // they stay where they are (moved to the front, each would change
        // the prompt's start and part it from the cached one).
        Some("system") => {
            let content = m.get("content").unwrap_or(&Value::Null);
            if let Some(text) = system_text(content).map_err(|e| {
                ApiError::invalid_request(e.message.replacen("system", &format!("{at}.content"), 1))
            })? {
                out.push(json!({"role": "system", "content": text}));
            }
            return Ok(());
        }
        Some(r) => {
            return Err(bad(
                format!("{at}.role"),
                format!("'{r}' is not a role here (\"user\", \"assistant\" or \"system\")"),
            ))
        }
        None => return Err(bad(format!("{at}.role"), "required")),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(bad(
                format!("{at}.content"),
                "required (a string or an array of content blocks)",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let kind = b
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.type"), "required"))?;
        match (role, kind) {
            (_, "text") => {
                let t = b
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.text"), "required (a string)"))?;
                if role == "user" {
                    parts.push(json!({"type": "text", "text": t}));
                } else {
                    text.push_str(t);
                }
            }
            ("user", "image") => parts.push(image_part(b, &at)?),
            ("user", "tool_result") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.tool_use_id"), "required (a string)"))?;
                out.push(json!({"role": "tool", "tool_call_id": id,
                                "content": tool_result_text(b, &at)?}));
            }
            ("assistant", "tool_use") => {
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.id"), "required (a string)"))?;
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.name"), "required (a string)"))?;
                let input = b.get("input").cloned().unwrap_or(json!({}));
                if !input.is_object() {
                    return Err(bad(format!("{at}.input"), "must be an object"));
                }
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("assistant", "thinking") => {
                if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                    reasoning.push_str(t);
                }
            }
            // Redacted reasoning is opaque to this model: nothing to render.
            ("assistant", "redacted_thinking") => {}
            (_, k) => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("'{k}' blocks are not supported in a {role} message"),
                ))
            }
        }
    }
    if role == "user" {
        if !parts.is_empty() {
            let all_text = parts.iter().all(|p| p["type"] == "text");
            let content = match all_text {
                true => Value::String(
                    parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n\n"),
                ),
                false => Value::Array(parts),
            };
            out.push(json!({"role": "user", "content": content}));
        }
    } else {
        let mut msg = Map::new();
        msg.insert("role".into(), json!("assistant"));
        msg.insert(
            "content".into(),
            match text.is_empty() && !calls.is_empty() {
                true => Value::Null,
                false => Value::String(text),
            },
        );
        if !reasoning.is_empty() {
            msg.insert("reasoning_content".into(), json!(reasoning));
        }
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(msg));
    }
    Ok(())
}

/// A Messages request body as a chat completions body.
fn translate(
    body: &Map<String, Value>,
    _app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut out = Map::new();
    if let Some(m) = body.get("model") {
        out.insert("model".into(), m.clone());
    }
    match body.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {
            out.insert("max_tokens".into(), Value::Number(n.clone()));
        }
        Some(_) => return Err(bad("max_tokens", "must be a positive integer")),
        None => return Err(bad("max_tokens", "required (a positive integer)")),
    }
    let mut messages = Vec::new();
    if let Some(sys) = body.get("system") {
        if let Some(text) = system_text(sys)? {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let list = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(bad("messages", "must not be empty")),
        _ => return Err(bad("messages", "required (an array of messages)")),
    };
    for (i, m) in list.iter().enumerate() {
        message(m, i, &mut messages)?;
    }
    out.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
        ("session_id", "session_id"),
        ("cache_salt", "cache_salt"),
    ] {
        if let Some(v) = body.get(from) {
            out.insert(to.into(), v.clone());
        }
    }
    if let Some(t) = body.get("temperature").and_then(Value::as_f64) {
        if !(0.0..=1.0).contains(&t) {
            return Err(bad(
                "temperature",
                format!("must be between 0 and 1 (got {t})"),
            ));
        }
    }
    match body.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(s)) if s.iter().all(Value::is_string) => {
            out.insert("stop".into(), Value::Array(s.clone()));
        }
        Some(_) => return Err(bad("stop_sequences", "must be an array of strings")),
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    // Tools: custom tools with an input schema.
    let mut has_tools = false;
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut fns = Vec::new();
            for (i, t) in tools.iter().enumerate() {
                let at = format!("tools[{i}]");
                match t.get("type").and_then(Value::as_str) {
                    None | Some("custom") => {}
                    Some(k) => {
                        return Err(bad(
                            format!("{at}.type"),
                            format!("'{k}' is a tool Anthropic's servers run; this server runs only custom tools (name, description, input_schema)"),
                        ))
                    }
                }
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.name"), "required (a string)"))?;
                let schema = t
                    .get("input_schema")
                    .cloned()
                    .unwrap_or(json!({"type": "object"}));
                if !schema.is_object() {
                    return Err(bad(
                        format!("{at}.input_schema"),
                        "must be a JSON Schema object",
                    ));
                }
                let mut f = json!({"name": name, "parameters": schema});
                if let Some(d) = t.get("description").and_then(Value::as_str) {
                    f["description"] = json!(d);
                }
                if let Some(strict) = t.get("strict") {
                    f["strict"] = strict.clone();
                }
                fns.push(json!({"type": "function", "function": f}));
            }
            has_tools = !fns.is_empty();
            out.insert("tools".into(), Value::Array(fns));
        }
        Some(_) => return Err(bad("tools", "must be an array of tools")),
    }
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::Object(c)) => {
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => {
                    let name = c
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("tool_choice.name", "required for type \"tool\""))?;
                    json!({"type": "function", "function": {"name": name}})
                }
                _ => {
                    return Err(bad(
                        "tool_choice.type",
                        "must be \"auto\", \"any\", \"tool\" or \"none\"",
                    ))
                }
            };
            if has_tools || choice == "none" || choice == "auto" {
                out.insert("tool_choice".into(), choice);
            } else {
                return Err(bad(
                    "tool_choice",
                    "tool calls were asked for but `tools` is empty",
                ));
            }
            if c.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
                out.insert("parallel_tool_calls".into(), json!(false));
            }
        }
        Some(_) => return Err(bad("tool_choice", "must be an object with a `type`")),
    }
    // Structured output (`output_config.format`) and effort.
    match body.get("output_config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(c)) => {
            match c.get("format") {
                None | Some(Value::Null) => {}
                Some(Value::Object(f))
                    if f.get("type").and_then(Value::as_str) == Some("json_schema") =>
                {
                    let schema = f.get("schema").cloned().ok_or_else(|| {
                        bad(
                            "output_config.format.schema",
                            "required (a JSON Schema object)",
                        )
                    })?;
                    out.insert(
                        "response_format".into(),
                        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
                    );
                }
                Some(_) => {
                    return Err(bad(
                        "output_config.format",
                        "must be {\"type\": \"json_schema\", \"schema\": {...}}",
                    ))
                }
            }
            match c.get("effort") {
                None | Some(Value::Null) => {}
                Some(Value::String(e)) => {
                    out.insert("reasoning_effort".into(), json!(e));
                }
                Some(_) => return Err(bad("output_config.effort", "must be a string")),
            }
        }
        Some(_) => return Err(bad("output_config", "must be an object")),
    }
    let mut kwargs = Map::new();
    match body.get("thinking") {
        None | Some(Value::Null) => {}
        Some(Value::Object(t)) => match t.get("type").and_then(Value::as_str) {
            Some("enabled") | Some("adaptive") => {
                kwargs.insert("enable_thinking".into(), json!(true));
                kwargs.insert("return_reasoning".into(), json!(true));
            }
            Some("disabled") => {
                kwargs.insert("enable_thinking".into(), json!(false));
            }
            _ => return Err(bad("thinking.type", "must be \"enabled\" or \"disabled\"")),
        },
        Some(_) => return Err(bad("thinking", "must be an object")),
    }
    if !kwargs.is_empty() {
        out.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    Ok(Some(out))
}

/// Content blocks as they are built from the parser's events.
#[derive(Default)]
struct Blocks {
    /// The finished blocks (the whole response's content).
    done: Vec<Value>,
    /// The open block: its index among all blocks and its JSON so far.
    open: Option<Value>,
    /// Per tool call index: the block index it opened and whether its input
    /// was streamed.
    calls: Vec<Option<(usize, bool)>>,
    /// Any block was a tool call (stop_reason `tool_use`).
    any_call: bool,
}

struct Writer {
    reply: Reply,
    parser: Box<dyn OutputParser + Send>,
    blocks: Blocks,
    prompt_tokens: usize,
    cached_tokens: usize,
}

/// A stream event: its name and data.
type Out = (&'static str, Value);

impl Blocks {
    fn index(&self) -> usize {
        self.done.len()
    }

    fn close(&mut self, out: &mut Vec<Out>) {
        if let Some(mut b) = self.open.take() {
            if b["type"] == "tool_use" {
                let raw = b["partial"].take();
                let input = raw
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(json!({}));
                b.as_object_mut().expect("object").remove("partial");
                b["input"] = input;
            }
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index()}),
            ));
            self.done.push(b);
        }
    }

    /// Text or thinking: appended to the open block of that kind, else a
    /// new one.
    fn text(&mut self, kind: &str, t: String, out: &mut Vec<Out>) {
        if t.is_empty() {
            return;
        }
        let field = if kind == "thinking" {
            "thinking"
        } else {
            "text"
        };
        if self
            .open
            .as_ref()
            .map(|b| b["type"] != kind)
            .unwrap_or(true)
        {
            self.close(out);
            let start = match kind {
                "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            out.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": self.index(), "content_block": start}),
            ));
            self.open = Some(start);
        }
        let b = self.open.as_mut().expect("opened");
        let s = format!("{}{}", b[field].as_str().unwrap_or_default(), t);
        b[field] = json!(s);
        let delta = match kind {
            "thinking" => json!({"type": "thinking_delta", "thinking": t}),
            _ => json!({"type": "text_delta", "text": t}),
        };
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index(), "delta": delta}),
        ));
    }

    fn start_call(&mut self, index: usize, id: &str, name: &str, out: &mut Vec<Out>) {
        self.close(out);
        self.any_call = true;
        let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index(), "content_block": block}),
        ));
        let mut open = block;
        open["partial"] = json!("");
        self.open = Some(open);
        if self.calls.len() <= index {
            self.calls.resize(index + 1, None);
        }
        self.calls[index] = Some((self.index(), false));
    }

    fn call_args(&mut self, index: usize, delta: &str, out: &mut Vec<Out>) {
        let at = self.index();
        let Some(Some((block, streamed))) = self.calls.get_mut(index) else {
            return;
        };
        if *block != at || delta.is_empty() {
            return;
        }
        *streamed = true;
        if let Some(b) = self.open.as_mut() {
            let s = format!("{}{}", b["partial"].as_str().unwrap_or_default(), delta);
            b["partial"] = json!(s);
        }
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": at,
                   "delta": {"type": "input_json_delta", "partial_json": delta}}),
        ));
    }

    fn events(&mut self, events: Vec<ChatEvent>, reasoning: bool, out: &mut Vec<Out>) {
        for e in events {
            match e {
                ChatEvent::Reasoning(t) if reasoning => self.text("thinking", t, out),
                ChatEvent::Reasoning(_) => {}
                ChatEvent::Content(t) => self.text("text", t, out),
                ChatEvent::ToolCallStart { index, id, name } => {
                    self.start_call(index, &id, &name, out)
                }
                ChatEvent::ToolCallArgs { index, delta } => self.call_args(index, &delta, out),
                ChatEvent::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    let started = matches!(self.calls.get(index), Some(Some(_)));
                    if !started {
                        self.start_call(index, &id, &name, out);
                    }
                    let streamed = matches!(self.calls.get(index), Some(Some((_, true))));
                    if !streamed {
                        self.call_args(index, &arguments.to_string(), out);
                    }
                    // The parser's decoded arguments are the call's input.
                    if let Some(b) = self.open.as_mut() {
                        if b["type"] == "tool_use" && b["id"] == json!(id) {
                            b["partial"] = json!(arguments.to_string());
                        }
                    }
                    self.close(out);
                }
                ChatEvent::End { .. } | ChatEvent::Warning { .. } => {}
            }
        }
    }
}

impl Writer {
    fn usage(&self, output_tokens: usize) -> Value {
        json!({
            "input_tokens": self.prompt_tokens.saturating_sub(self.cached_tokens),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens,
            "output_tokens": output_tokens,
        })
    }

    fn stop_reason(&self, s: &Summary) -> (&'static str, Value) {
        use hearth_engine::turn::FinishReason;
        if self.blocks.any_call {
            return ("tool_use", Value::Null);
        }
        match (s.finish, &s.stop_sequence) {
            (FinishReason::Stop, Some(seq)) => ("stop_sequence", json!(seq)),
            (FinishReason::Stop, None) => ("end_turn", Value::Null),
            (FinishReason::Length | FinishReason::Cancelled, _) => ("max_tokens", Value::Null),
        }
    }

    fn message(&self, content: Vec<Value>, stop: Option<(&str, Value)>, output: usize) -> Value {
        let (reason, seq) = match stop {
            Some((r, s)) => (json!(r), s),
            None => (Value::Null, Value::Null),
        };
        json!({"id": self.reply.id, "type": "message", "role": "assistant", "model": self.reply.model,
               "content": content, "stop_reason": reason, "stop_sequence": seq,
               "usage": self.usage(output)})
    }
}

/// The error object of Anthropic's API for `e` (its `type` by status).
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 408 | 411 | 415 | 422 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

async fn message_whole(
    mut w: Writer,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut sink = Vec::new();
    let (summary, _) = collect(&mut rx, |t| {
        let events = w.parser.feed(&t);
        w.blocks.events(events, w.reply.reasoning, &mut sink);
    })
    .await?;
    let events = w.parser.finish(hint(summary.finish));
    w.blocks.events(events, w.reply.reasoning, &mut sink);
    w.blocks.close(&mut sink);
    let stop = w.stop_reason(&summary);
    let content = std::mem::take(&mut w.blocks.done);
    Ok(Json(w.message(content, Some(stop), summary.completion_tokens)).into_response())
}

fn sse(events: impl Stream<Item = Out> + Send + 'static) -> Response {
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

/// `message_start`, `ping`, the content blocks' start/delta/stop events as
/// the parser produces them, `message_delta` (stop reason, usage),
/// `message_stop`; a failure after the start is an `error` event.
fn message_stream(w: Writer, rx: mpsc::UnboundedReceiver<Event>) -> impl Stream<Item = Out> + Send {
    let start = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": w.message(Vec::new(), None, 0)}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    let rest = stream::unfold(Some((w, rx)), |st| async move {
        let (mut w, mut rx) = st?;
        let mut out = Vec::new();
        match rx.recv().await {
            Some(Event::Text(t)) => {
                let events = w.parser.feed(&t);
                w.blocks.events(events, w.reply.reasoning, &mut out);
            }
            Some(Event::Done(s)) => {
                let events = w.parser.finish(hint(s.finish));
                w.blocks.events(events, w.reply.reasoning, &mut out);
                w.blocks.close(&mut out);
                let (reason, seq) = w.stop_reason(&s);
                out.push((
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": reason, "stop_sequence": seq},
                           "usage": w.usage(s.completion_tokens)}),
                ));
                out.push(("message_stop", json!({"type": "message_stop"})));
                return Some((out, None));
            }
            Some(Event::Failed(e)) => {
                return Some((vec![("error", error_body(&e.into()))], None));
            }
            // A long prefill says it is alive the way Anthropic's streams do.
            // (Each chunk but the last: the content follows that one.)
            Some(Event::Progress(p)) if p.processed < p.total => {
                out.push(("ping", json!({"type": "ping"})))
            }
            Some(Event::Progress(_)) => {}
            Some(Event::Admitted { .. }) | Some(Event::Logprobs(_)) => {}
            None => {
                let e = ApiError::server("the engine dropped the request");
                return Some((vec![("error", error_body(&e))], None));
            }
        }
        Some((out, Some((w, rx))))
    });
    stream::iter(start).chain(rest.flat_map(stream::iter))
}

/// Middleware: every error answered under `/v1/messages` (the access
/// checks, body limits, unknown routes, the handlers' own) in Anthropic's
/// error shape, its status and headers kept.
pub async fn reshape_errors(req: Request, next: Next) -> Response {
    let ours = req.uri().path().starts_with("/v1/messages");
    let mut r = next.run(req).await;
    if !ours {
        return r;
    }
    if let Some(e) = r.extensions_mut().remove::<ApiError>() {
        let mut fresh = (e.status, Json(error_body(&e))).into_response();
        for name in [header::WWW_AUTHENTICATE, header::RETRY_AFTER] {
            if let Some(v) = r.headers().get(&name) {
                fresh.headers_mut().insert(name, v.clone());
            }
        }
        for (name, v) in r.headers() {
            if name.as_str().starts_with("access-control-") || name == header::VARY {
                fresh.headers_mut().insert(name.clone(), v.clone());
            }
        }
        return fresh;
    }
    r
}
