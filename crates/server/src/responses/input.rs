//! The Responses API request as a chat completions request: its tools
//! (hosted ones left out, namespaces flattened, custom tools as one-string
//! functions), its input items as chat messages, and its options.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::{bad, not_found, salt_of};
use crate::error::ApiError;
use crate::routes::AppState;

/// How a tool the model sees by one flat name is called in the Responses
/// API: function tools inside a `namespace` tool (Codex sends its MCP and
/// agent tools so) are flattened to their own name (or `namespace__name`
/// where two would clash) and their calls carry the namespace again;
/// `custom` (freeform) tools take one string, `input`, and their calls are
/// `custom_tool_call` items.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Callable {
    pub(super) namespace: Option<String>,
    pub(super) name: String,
    pub(super) custom: bool,
}

/// The request's tools by the flat name the prompt shows.
#[derive(Clone, Debug, Default)]
pub(super) struct ToolNames(HashMap<String, Callable>);

impl ToolNames {
    /// The flat name of a call to `name` in `namespace` (a history item).
    pub(super) fn flat(&self, namespace: Option<&str>, name: &str) -> String {
        self.0
            .iter()
            .find(|(_, c)| c.name == name && c.namespace.as_deref() == namespace)
            .map(|(flat, _)| flat.clone())
            .unwrap_or_else(|| name.to_string())
    }

    pub(super) fn get(&self, flat: &str) -> Option<&Callable> {
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

    pub(super) fn from_json(v: &Value) -> ToolNames {
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
pub(super) fn custom_input(arguments: &str) -> String {
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
pub(super) fn translate(
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
        let store = app.responses.lock().unwrap_or_else(|e| e.into_inner());
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
