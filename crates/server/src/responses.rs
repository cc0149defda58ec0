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
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use hearth_chat::parser::{ChatEvent, OutputParser};
use hearth_engine::scheduler::{Event, Summary};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::chat::{hint, random_hex, start_chat, Reply, Started};
use crate::error::ApiError;
use crate::routes::AppState;

/// Stored responses kept at most (the oldest goes first).
pub const STORE_CAPACITY: usize = 1024;

/// A stored response: its conversation (chat messages, the answer
/// included) for `previous_response_id`, and the response object for GET.
struct Stored {
    salt: Option<String>,
    messages: Vec<Value>,
    response: Value,
}

/// The stored responses of this server.
#[derive(Default)]
pub struct ResponseStore {
    map: HashMap<String, Stored>,
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

fn bad(path: impl std::fmt::Display, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(format!("{path}: {what}"))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("response_not_found"),
        format!("No response '{id}' (responses are kept while the server runs, the latest {STORE_CAPACITY})."),
    )
}

fn salt_of(body: &Map<String, Value>) -> Option<String> {
    body.get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// How a tool the model sees by one flat name is called in the Responses
/// API: function tools inside a `namespace` tool (Codex sends its MCP and
/// agent tools so) are flattened to their own name (or `namespace__name`
/// where two would clash) and their calls carry the namespace again;
/// `custom` (freeform) tools take one string, `input`, and their calls are
/// `custom_tool_call` items.
#[derive(Clone, Debug, PartialEq)]
struct Callable {
    namespace: Option<String>,
    name: String,
    custom: bool,
}

/// The request's tools by the flat name the prompt shows.
#[derive(Clone, Debug, Default)]
struct ToolNames(HashMap<String, Callable>);

impl ToolNames {
    /// The flat name of a call to `name` in `namespace` (a history item).
    fn flat(&self, namespace: Option<&str>, name: &str) -> String {
        self.0
            .iter()
            .find(|(_, c)| c.name == name && c.namespace.as_deref() == namespace)
            .map(|(flat, _)| flat.clone())
            .unwrap_or_else(|| name.to_string())
    }

    fn get(&self, flat: &str) -> Option<&Callable> {
        self.0.get(flat)
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (flat, c) in &self.0 {
            m.insert(
                flat.clone(),
                json!({"namespace": c.namespace, "name": c.name, "custom": c.custom}),
            );
        }
        Value::Object(m)
    }

    fn from_json(v: &Value) -> ToolNames {
        let mut out = HashMap::new();
        if let Some(m) = v.as_object() {
            for (flat, c) in m {
                out.insert(
                    flat.clone(),
                    Callable {
                        namespace: c["namespace"].as_str().map(str::to_string),
                        name: c["name"].as_str().unwrap_or(flat).to_string(),
                        custom: c["custom"].as_bool().unwrap_or(false),
                    },
                );
            }
        }
        ToolNames(out)
    }
}

/// Hosted tools OpenAI runs on its side. This server has none of them; a
/// client that lists one by default (Codex lists `web_search`) gets its
/// answer without it, as from a model that chose not to search.
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "computer_use",
    "mcp",
    "local_shell",
    "tool_search",
];

/// The string a freeform tool call carries, from the `{"input": ...}`
/// arguments the model wrote.
fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(m)) => match m.get("input") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

/// One function tool as a chat tool named `flat`.
fn chat_function(t: &Value, flat: &str, at: &str, prefix: Option<&str>) -> Value {
    let mut f = json!({"name": flat,
        "parameters": t.get("parameters").cloned().filter(|p| !p.is_null()).unwrap_or(json!({"type": "object"}))});
    if let Some(v) = t.get("strict").filter(|v| !v.is_null()) {
        f["strict"] = v.clone();
    }
    let description = t.get("description").and_then(Value::as_str);
    match (prefix, description) {
        (Some(p), Some(d)) => f["description"] = json!(format!("{p}\n\n{d}")),
        (Some(p), None) => f["description"] = json!(p),
        (None, Some(d)) => f["description"] = json!(d),
        (None, None) => {}
    }
    let _ = at;
    json!({"type": "function", "function": f})
}

/// The request's `tools` as chat tools, and how each is called.
fn tools(body: &Map<String, Value>) -> Result<(Vec<Value>, ToolNames), ApiError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok((Vec::new(), ToolNames::default())),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(bad("tools", "must be an array")),
    };
    // Plain tools keep their names; namespaced ones take theirs unless a
    // plain tool (or an earlier namespaced one) has it.
    let mut taken: std::collections::HashSet<String> = list
        .iter()
        .filter(|t| {
            matches!(
                t.get("type").and_then(Value::as_str),
                Some("function" | "custom")
            )
        })
        .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let mut fns = Vec::new();
    let mut names = HashMap::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let name_of = |t: &Value, at: &str| {
            t.get("name")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(format!("{at}.name"), "required (a string)"))
        };
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = name_of(t, &at)?;
                fns.push(chat_function(t, &name, &at, None));
                names.insert(name.clone(), Callable { namespace: None, name, custom: false });
            }
            Some("custom") => {
                let name = name_of(t, &at)?;
                let mut d = t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if let Some(def) = t
                    .get("format")
                    .filter(|f| f.get("type").and_then(Value::as_str) == Some("grammar"))
                    .and_then(|f| f.get("definition"))
                    .and_then(Value::as_str)
                {
                    d.push_str(&format!("\n\nThe input follows this grammar:\n{def}"));
                }
                let f = json!({"type": "function", "function": {"name": name, "description": d,
                    "parameters": {"type": "object", "properties": {"input": {"type": "string",
                    "description": "The tool's input, as free text."}}, "required": ["input"],
                    "additionalProperties": false}}});
                fns.push(f);
                names.insert(name.clone(), Callable { namespace: None, name, custom: true });
            }
            Some("namespace") => {
                let ns = name_of(t, &at)?;
                let prefix = t.get("description").and_then(Value::as_str).filter(|d| !d.is_empty());
                let inner = match t.get("tools") {
                    Some(Value::Array(l)) => l,
                    _ => return Err(bad(format!("{at}.tools"), "required (an array of function tools)")),
                };
                for (k, f) in inner.iter().enumerate() {
                    let at = format!("{at}.tools[{k}]");
                    let custom = match f.get("type").and_then(Value::as_str) {
                        Some("function") => false,
                        Some("custom") => true,
                        _ => return Err(bad(format!("{at}.type"), "must be \"function\" or \"custom\"")),
                    };
                    let name = name_of(f, &at)?;
                    let mut flat = name.clone();
                    if taken.contains(&flat) {
                        flat = format!("{ns}__{name}");
                    }
                    taken.insert(flat.clone());
                    let tool = if custom {
                        json!({"type": "function", "function": {"name": flat,
                            "description": f.get("description").cloned().unwrap_or(json!("")),
                            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                            "additionalProperties": false}}})
                    } else {
                        chat_function(f, &flat, &at, prefix)
                    };
                    fns.push(tool);
                    names.insert(flat, Callable { namespace: Some(ns.clone()), name, custom });
                }
            }
            Some(k) if HOSTED_TOOLS.contains(&k) => {
                // Left out silently: Codex lists one on every request.
                let _ = k;
            }
            Some(k) => {
                return Err(ApiError::invalid(
                    "unsupported_tool",
                    format!("{at}.type: '{k}' is not a tool type this server knows (function, custom, namespace; hosted tools such as web_search are left out)"),
                ))
            }
            None => return Err(bad(format!("{at}.type"), "required (\"function\")")),
        }
    }
    Ok((fns, ToolNames(names)))
}

/// Content parts of an input message as chat content (a string when all
/// text).
fn content(v: &Value, at: &str) -> Result<Value, ApiError> {
    let parts = match v {
        Value::String(s) => return Ok(json!(s)),
        Value::Array(p) => p,
        _ => return Err(bad(at, "must be a string or an array of content parts")),
    };
    let mut out = Vec::new();
    for (k, p) in parts.iter().enumerate() {
        let at = format!("{at}[{k}]");
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                let t = p
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.text"), "required (a string)"))?;
                out.push(json!({"type": "text", "text": t}));
            }
            Some("input_image") => {
                let url = match p.get("image_url") {
                    Some(Value::String(u)) => u.clone(),
                    _ => {
                        return Err(bad(
                            format!("{at}.image_url"),
                            "required (a data: URL; file_id is not supported)",
                        ))
                    }
                };
                out.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("refusal") => {}
            Some(t) => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("'{t}' content is not supported here"),
                ))
            }
            None => return Err(bad(format!("{at}.type"), "required")),
        }
    }
    if out.iter().all(|p| p["type"] == "text") {
        let text: Vec<&str> = out.iter().filter_map(|p| p["text"].as_str()).collect();
        return Ok(json!(text.join("")));
    }
    Ok(Value::Array(out))
}

/// Responses input items as chat messages, appended to `out`. Consecutive
/// function calls (and reasoning before them) join one assistant message.
fn items(input: &Value, names: &ToolNames, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let list = match input {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(l) => l,
        _ => return Err(bad("input", "must be a string or an array of items")),
    };
    // The assistant message being built from output items.
    let mut pending: Option<Map<String, Value>> = None;
    fn flush(pending: &mut Option<Map<String, Value>>, out: &mut Vec<Value>) {
        if let Some(mut m) = pending.take() {
            m.entry("content").or_insert(Value::Null);
            out.push(Value::Object(m));
        }
    }
    fn assistant(pending: &mut Option<Map<String, Value>>) -> &mut Map<String, Value> {
        pending.get_or_insert_with(|| {
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            m
        })
    }
    for (i, item) in list.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    Some(r) => return Err(bad(format!("{at}.role"), format!("'{r}' is not a role"))),
                    None => return Err(bad(format!("{at}.role"), "required")),
                };
                let c = content(
                    item.get("content").unwrap_or(&Value::Null),
                    &format!("{at}.content"),
                )?;
                if role == "assistant" {
                    let m = assistant(&mut pending);
                    let text = c.as_str().unwrap_or_default();
                    let before = m.get("content").and_then(Value::as_str).unwrap_or_default();
                    m.insert("content".into(), json!(format!("{before}{text}")));
                } else {
                    flush(&mut pending, out);
                    out.push(json!({"role": role, "content": c}));
                }
            }
            "function_call" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.call_id"), "required"))?;
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.name"), "required"))?;
                let args = item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}");
                let namespace = item.get("namespace").and_then(Value::as_str);
                let name = names.flat(namespace, name);
                let m = assistant(&mut pending);
                let calls = m.entry("tool_calls").or_insert(json!([]));
                calls.as_array_mut().expect("array").push(json!({
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}));
            }
            "custom_tool_call" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.call_id"), "required"))?;
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.name"), "required"))?;
                let input = item.get("input").and_then(Value::as_str).unwrap_or("");
                let name = names.flat(item.get("namespace").and_then(Value::as_str), name);
                let args = json!({"input": input}).to_string();
                let m = assistant(&mut pending);
                let calls = m.entry("tool_calls").or_insert(json!([]));
                calls.as_array_mut().expect("array").push(json!({
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}));
            }
            "function_call_output" | "custom_tool_call_output" => {
                flush(&mut pending, out);
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.call_id"), "required"))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content(v, &format!("{at}.output"))?
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(format!("{at}.output"), "only text output is supported"))?,
                    _ => return Err(bad(format!("{at}.output"), "required (a string)")),
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(Value::Array(parts)) = item.get(key) {
                        for p in parts {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                text.push_str(t);
                            }
                        }
                    }
                    if !text.is_empty() {
                        break;
                    }
                }
                if !text.is_empty() {
                    assistant(&mut pending).insert("reasoning_content".into(), json!(text));
                }
            }
            // Codex resends these; they carry nothing the prompt renders
            // (hosted tools' calls never came from this server).
            "item_reference" | "web_search_call" | "file_search_call" | "image_generation_call"
            | "code_interpreter_call" | "tool_search_call" | "tool_search_output" => {}
            k => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("'{k}' items are not supported (message, function_call, function_call_output, reasoning)"),
                ))
            }
        }
    }
    flush(&mut pending, out);
    Ok(())
}

/// A Responses request body as a chat completions body.
fn translate(
    body: &Map<String, Value>,
    app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut out = Map::new();
    if let Some(m) = body.get("model") {
        out.insert("model".into(), m.clone());
    }
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(bad("instructions", "must be a string")),
    }
    if let Some(prev) = body.get("previous_response_id").filter(|v| !v.is_null()) {
        let id = prev
            .as_str()
            .ok_or_else(|| bad("previous_response_id", "must be a string"))?;
        let store = app.responses.lock().expect("response store");
        let stored = store
            .map
            .get(id)
            .filter(|s| s.salt == salt_of(body))
            .ok_or_else(|| not_found(id))?;
        // The stored conversation replaces this request's instructions'
        // place: instructions apply to this turn only (OpenAI's rule), so
        // they go first only when the stored turn had none.
        let had_system = stored
            .messages
            .first()
            .is_some_and(|m| m["role"] == "system");
        if had_system || messages.is_empty() {
            messages = stored.messages.clone();
        } else {
            messages.extend(stored.messages.iter().cloned());
        }
    }
    let (fns, names) = tools(body)?;
    items(
        body.get("input").unwrap_or(&Value::Null),
        &names,
        &mut messages,
    )?;
    if messages.is_empty() {
        return Err(bad("input", "required (a string or an array of items)"));
    }
    out.insert("messages".into(), Value::Array(messages));
    match body.get("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(v) => {
            out.insert("max_tokens".into(), v.clone());
        }
    }
    for key in [
        "temperature",
        "top_p",
        "stream",
        "parallel_tool_calls",
        "cache_salt",
        "session_id",
        "seed",
        "top_logprobs",
    ] {
        if let Some(v) = body.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let has_tools = !fns.is_empty();
    if body.get("tools").is_some_and(|t| !t.is_null()) {
        out.insert("tools".into(), Value::Array(fns));
    }
    out.insert("__tools".into(), names.to_json());
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" || s == "none" || s == "required" => {
            out.insert("tool_choice".into(), json!(s));
        }
        Some(Value::Object(c))
            if matches!(
                c.get("type").and_then(Value::as_str),
                Some("function" | "custom")
            ) =>
        {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice.name", "required"))?;
            let name = names.flat(c.get("namespace").and_then(Value::as_str), name);
            out.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(_) => return Err(bad(
            "tool_choice",
            "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )),
    }
    if out
        .get("tool_choice")
        .is_some_and(|c| c != "auto" && c != "none")
        && !has_tools
    {
        return Err(bad(
            "tool_choice",
            "tool calls were asked for but `tools` is empty",
        ));
    }
    match body.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => {}
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let schema = f
                    .get("schema")
                    .cloned()
                    .ok_or_else(|| bad("text.format.schema", "required (a JSON Schema)"))?;
                out.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": f.get("name").cloned().unwrap_or(json!("output")), "schema": schema}}),
                );
            }
            _ => {
                return Err(bad(
                    "text.format.type",
                    "must be \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        },
    }
    if let Some(effort) = body
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    {
        out.insert("reasoning_effort".into(), effort.clone());
    }
    Ok(Some(out))
}

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
        items: Items {
            names,
            ..Items::default()
        },
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

/// Output items as they are built from the parser's events.
#[derive(Default)]
struct Items {
    done: Vec<Value>,
    /// The open item (reasoning, message, or function call).
    open: Option<Value>,
    /// Per parser call index: whether its arguments were streamed.
    calls: Vec<Option<bool>>,
    any_call: bool,
    /// How each tool the model sees is called.
    names: ToolNames,
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

type Out = (&'static str, Value);

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex())
}

impl Items {
    fn index(&self) -> usize {
        self.done.len()
    }

    fn close(&mut self, out: &mut Vec<Out>) {
        let Some(mut item) = self.open.take() else {
            return;
        };
        let at = self.index();
        let id = item["id"].clone();
        match item["type"].as_str() {
            Some("message") => {
                item["status"] = json!("completed");
                let text = item["content"][0]["text"].clone();
                out.push((
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push((
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "part": item["content"][0]}),
                ));
            }
            Some("reasoning") => {
                let text = item["content"][0]["text"].clone();
                out.push((
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "text": text}),
                ));
            }
            Some("custom_tool_call") => {
                item["status"] = json!("completed");
                let input = custom_input(item["input"].as_str().unwrap_or_default());
                item["input"] = json!(input);
                out.push((
                    "response.custom_tool_call_input.done",
                    json!({"item_id": id, "output_index": at, "input": item["input"]}),
                ));
            }
            Some("function_call") => {
                item["status"] = json!("completed");
                out.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id,
                    "output_index": at, "name": item["name"], "arguments": item["arguments"]}),
                ));
            }
            _ => {}
        }
        out.push((
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        ));
        self.done.push(item);
    }

    fn text(&mut self, kind: &str, t: String, out: &mut Vec<Out>) {
        if t.is_empty() {
            return;
        }
        if self
            .open
            .as_ref()
            .map(|i| i["type"] != kind)
            .unwrap_or(true)
        {
            self.close(out);
            let at = self.index();
            let item = match kind {
                "reasoning" => json!({"type": "reasoning", "id": item_id("rs"), "summary": [],
                                      "content": [{"type": "reasoning_text", "text": ""}]}),
                _ => json!({"type": "message", "id": item_id("msg"), "status": "in_progress",
                            "role": "assistant", "content": []}),
            };
            let mut added = item.clone();
            if kind == "reasoning" {
                added["content"] = json!([]);
            }
            out.push((
                "response.output_item.added",
                json!({"output_index": at, "item": added}),
            ));
            let mut item = item;
            if kind == "message" {
                let part =
                    json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                out.push((
                    "response.content_part.added",
                    json!({"item_id": item["id"],
                    "output_index": at, "content_index": 0, "part": part}),
                ));
                item["content"] = json!([part]);
            }
            self.open = Some(item);
        }
        let at = self.index();
        let item = self.open.as_mut().expect("opened");
        let so_far = item["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        item["content"][0]["text"] = json!(format!("{so_far}{t}"));
        let event = match kind {
            "reasoning" => "response.reasoning_text.delta",
            _ => "response.output_text.delta",
        };
        let mut data =
            json!({"item_id": item["id"], "output_index": at, "content_index": 0, "delta": t});
        if kind == "message" {
            data["logprobs"] = json!([]);
        }
        out.push((event, data));
    }

    fn start_call(&mut self, index: usize, call_id: &str, name: &str, out: &mut Vec<Out>) {
        self.close(out);
        self.any_call = true;
        let item = match self.names.get(name).cloned() {
            // The arguments gather in `input` and become its string at close.
            Some(c) if c.custom => {
                let mut item = json!({"type": "custom_tool_call", "id": item_id("ctc"),
                    "call_id": call_id, "name": c.name, "input": "", "status": "in_progress"});
                if let Some(ns) = c.namespace {
                    item["namespace"] = json!(ns);
                }
                item
            }
            c => {
                let mut item = json!({"type": "function_call", "id": item_id("fc"),
                    "call_id": call_id, "name": c.as_ref().map_or(name, |c| c.name.as_str()),
                    "arguments": "", "status": "in_progress"});
                if let Some(ns) = c.and_then(|c| c.namespace) {
                    item["namespace"] = json!(ns);
                }
                item
            }
        };
        out.push((
            "response.output_item.added",
            json!({"output_index": self.index(), "item": item}),
        ));
        self.open = Some(item);
        if self.calls.len() <= index {
            self.calls.resize(index + 1, None);
        }
        self.calls[index] = Some(false);
    }

    fn call_args(&mut self, index: usize, delta: &str, out: &mut Vec<Out>) {
        if delta.is_empty() {
            return;
        }
        let at = self.index();
        let Some(item) = self
            .open
            .as_mut()
            .filter(|i| i["type"] == "function_call" || i["type"] == "custom_tool_call")
        else {
            return;
        };
        if let Some(Some(streamed)) = self.calls.get_mut(index) {
            *streamed = true;
        }
        // A freeform call's input is one string, known whole only at the end.
        if item["type"] == "custom_tool_call" {
            let so_far = item["input"].as_str().unwrap_or_default().to_string();
            item["input"] = json!(format!("{so_far}{delta}"));
            return;
        }
        let so_far = item["arguments"].as_str().unwrap_or_default().to_string();
        item["arguments"] = json!(format!("{so_far}{delta}"));
        out.push((
            "response.function_call_arguments.delta",
            json!({"item_id": item["id"], "output_index": at, "delta": delta}),
        ));
    }

    fn events(&mut self, events: Vec<ChatEvent>, reasoning: bool, out: &mut Vec<Out>) {
        for e in events {
            match e {
                ChatEvent::Reasoning(t) if reasoning => self.text("reasoning", t, out),
                ChatEvent::Reasoning(_) => {}
                ChatEvent::Content(t) => self.text("message", t, out),
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
                    if !matches!(self.calls.get(index), Some(Some(_))) {
                        self.start_call(index, &id, &name, out);
                    }
                    let full = arguments.to_string();
                    if !matches!(self.calls.get(index), Some(Some(true))) {
                        self.call_args(index, &full, out);
                    }
                    if let Some(item) = self.open.as_mut() {
                        if item["type"] == "function_call" {
                            item["arguments"] = json!(full);
                        } else if item["type"] == "custom_tool_call" {
                            item["input"] = json!(full);
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
        self.app.responses.lock().expect("response store").put(
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
    let summary = loop {
        match rx.recv().await {
            Some(Event::Text(t)) => {
                let events = w.parser.feed(&t);
                w.items.events(events, w.reply.reasoning, &mut sink);
            }
            Some(Event::Done(s)) => break s,
            Some(Event::Failed(e)) => return Err(e.into()),
            Some(Event::Admitted { .. }) | Some(Event::Logprobs(_)) => {}
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    };
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
            Some(Event::Admitted { .. }) | Some(Event::Logprobs(_)) => {}
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
pub async fn get(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = app.responses.lock().expect("response store");
    let s = store.map.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(Json(s.response.clone()))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut store = app.responses.lock().expect("response store");
    store.map.remove(&id).ok_or_else(|| not_found(&id))?;
    store.order.retain(|k| k != &id);
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// `POST /v1/responses/{id}/cancel`: only background responses can be
/// cancelled, and this server runs none (a response is answered on its
/// own connection; closing it stops the generation).
pub async fn cancel(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = app.responses.lock().expect("response store");
    store.map.get(&id).ok_or_else(|| not_found(&id))?;
    Err(ApiError::invalid(
        "not_background",
        "Only background responses can be cancelled; this response has finished (close the connection to stop one that is running).",
    ))
}
