//! OpenAI's Responses request (`POST /v1/responses`) as typed structs, and
//! its translation onto the shared chat request: its tools (hosted ones left
//! out, namespaces flattened, custom tools as one-string functions), its
//! input items as chat messages, and its options.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{bad, from_body, TextOr};
use crate::error::ApiError;
use crate::responses::{not_found, salt_of};
use crate::routes::AppState;

/// How a tool the model sees by one flat name is called in the Responses
/// API: function tools inside a `namespace` tool (Codex sends its MCP and
/// agent tools so) are flattened to their own name (or `namespace__name`
/// where two would clash) and their calls carry the namespace again;
/// `custom` (freeform) tools take one string, `input`, and their calls are
/// `custom_tool_call` items.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Callable {
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) custom: bool,
}

/// The request's tools by the flat name the prompt shows.
#[derive(Clone, Debug, Default)]
pub(crate) struct ToolNames(HashMap<String, Callable>);

impl ToolNames {
    /// The flat name of a call to `name` in `namespace` (a history item).
    pub(crate) fn flat(&self, namespace: Option<&str>, name: &str) -> String {
        self.0
            .iter()
            .find(|(_, c)| c.name == name && c.namespace.as_deref() == namespace)
            .map(|(flat, _)| flat.clone())
            .unwrap_or_else(|| name.to_string())
    }

    pub(crate) fn get(&self, flat: &str) -> Option<&Callable> {
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

    pub(crate) fn from_json(v: &Value) -> ToolNames {
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
pub(crate) fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(m)) => match m.get("input") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    input: Option<TextOr<Item>>,
    #[serde(default)]
    tools: Option<Vec<Tool>>,
    /// `"auto"`/`"none"`/`"required"` or `{"type": "function", "name": …}`.
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    text: Option<TextConfig>,
    #[serde(default)]
    reasoning: Option<ReasoningConfig>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    /// Numbers whose ranges the shared validation checks.
    #[serde(default)]
    max_output_tokens: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    seed: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<Value>,
    #[serde(default)]
    cache_salt: Option<Value>,
    #[serde(default)]
    session_id: Option<Value>,
}

/// A tool: `function`, `custom`, `namespace` (of function and custom
/// tools), or a hosted tool (left out).
#[derive(Debug, Deserialize)]
struct Tool {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    strict: Option<Value>,
    /// A custom tool's input format (`{"type": "grammar", "definition": …}`).
    #[serde(default)]
    format: Option<CustomFormat>,
    /// A namespace's tools.
    #[serde(default)]
    tools: Option<Vec<Tool>>,
}

#[derive(Debug, Deserialize)]
struct CustomFormat {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    definition: Option<String>,
}

/// An input item. One struct for every kind (its `type`, `message` when
/// absent): each kind reads the fields it has.
#[derive(Debug, Deserialize)]
pub struct Item {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<TextOr<Part>>,
    #[serde(default)]
    summary: Option<Vec<Part>>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    output: Option<TextOr<Part>>,
}

/// A content part of a message (or of a tool's output, a reasoning item).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
    },
    Text {
        text: String,
    },
    SummaryText {
        text: String,
    },
    ReasoningText {
        text: String,
    },
    InputImage {
        #[serde(default)]
        image_url: Option<String>,
    },
    Refusal {},
}

#[derive(Debug, Deserialize)]
struct TextConfig {
    #[serde(default)]
    format: Option<TextFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TextFormat {
    Text {},
    JsonObject {},
    JsonSchema {
        schema: Value,
        #[serde(default)]
        name: Option<Value>,
    },
}

#[derive(Debug, Deserialize)]
struct ReasoningConfig {
    #[serde(default)]
    effort: Option<Value>,
}

/// One function tool as a chat tool named `flat`.
fn chat_function(t: &Tool, flat: &str, prefix: Option<&str>) -> Value {
    let mut f = json!({"name": flat,
        "parameters": t.parameters.clone().filter(|p| !p.is_null()).unwrap_or(json!({"type": "object"}))});
    if let Some(v) = t.strict.clone().filter(|v| !v.is_null()) {
        f["strict"] = v;
    }
    match (prefix, t.description.as_deref()) {
        (Some(p), Some(d)) => f["description"] = json!(format!("{p}\n\n{d}")),
        (Some(p), None) => f["description"] = json!(p),
        (None, Some(d)) => f["description"] = json!(d),
        (None, None) => {}
    }
    json!({"type": "function", "function": f})
}

fn name_of(t: &Tool, at: &str) -> Result<String, ApiError> {
    t.name
        .clone()
        .ok_or_else(|| bad(format!("{at}.name"), "required (a string)"))
}

/// The request's `tools` as chat tools, and how each is called.
fn tools(list: &[Tool]) -> Result<(Vec<Value>, ToolNames), ApiError> {
    // Plain tools keep their names; namespaced ones take theirs unless a
    // plain tool (or an earlier namespaced one) has it.
    let mut taken: HashSet<String> = list
        .iter()
        .filter(|t| matches!(t.kind.as_deref(), Some("function" | "custom")))
        .filter_map(|t| t.name.clone())
        .collect();
    let mut fns = Vec::new();
    let mut names = HashMap::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.kind.as_deref() {
            Some("function") => {
                let name = name_of(t, &at)?;
                fns.push(chat_function(t, &name, None));
                names.insert(name.clone(), Callable { namespace: None, name, custom: false });
            }
            Some("custom") => {
                let name = name_of(t, &at)?;
                let mut d = t.description.clone().unwrap_or_default();
                if let Some(def) = t
                    .format
                    .as_ref()
                    .filter(|f| f.kind.as_deref() == Some("grammar"))
                    .and_then(|f| f.definition.as_deref())
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
                let prefix = t.description.as_deref().filter(|d| !d.is_empty());
                let inner = t
                    .tools
                    .as_ref()
                    .ok_or_else(|| bad(format!("{at}.tools"), "required (an array of function tools)"))?;
                for (k, f) in inner.iter().enumerate() {
                    let at = format!("{at}.tools[{k}]");
                    let custom = match f.kind.as_deref() {
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
                            "description": f.description.clone().unwrap_or_default(),
                            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                            "additionalProperties": false}}})
                    } else {
                        chat_function(f, &flat, prefix)
                    };
                    fns.push(tool);
                    names.insert(flat, Callable { namespace: Some(ns.clone()), name, custom });
                }
            }
            // Left out silently: Codex lists one on every request.
            Some(k) if HOSTED_TOOLS.contains(&k) => {}
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

/// Content parts as chat content (a string when all text).
fn content(v: TextOr<Part>, at: &str) -> Result<Value, ApiError> {
    let parts = match v {
        TextOr::Text(s) => return Ok(json!(s)),
        TextOr::List(p) => p,
    };
    let mut out = Vec::new();
    for (k, p) in parts.into_iter().enumerate() {
        match p {
            Part::InputText { text }
            | Part::OutputText { text }
            | Part::Text { text }
            | Part::SummaryText { text }
            | Part::ReasoningText { text } => out.push(json!({"type": "text", "text": text})),
            Part::InputImage { image_url } => {
                let url = image_url.ok_or_else(|| {
                    bad(
                        format!("{at}[{k}].image_url"),
                        "required (a data: URL; file_id is not supported)",
                    )
                })?;
                out.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Part::Refusal {} => {}
        }
    }
    if out.iter().all(|p| p["type"] == "text") {
        let text: Vec<&str> = out.iter().filter_map(|p| p["text"].as_str()).collect();
        return Ok(json!(text.join("")));
    }
    Ok(Value::Array(out))
}

fn required(v: Option<String>, at: &str, field: &str) -> Result<String, ApiError> {
    v.ok_or_else(|| bad(format!("{at}.{field}"), "required"))
}

/// Responses input items as chat messages, appended to `out`. Consecutive
/// function calls (and reasoning before them) join one assistant message.
fn items(input: TextOr<Item>, names: &ToolNames, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let list = match input {
        TextOr::Text(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        TextOr::List(l) => l,
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
    fn call(pending: &mut Option<Map<String, Value>>, id: String, name: String, args: String) {
        let m = assistant(pending);
        let calls = m.entry("tool_calls").or_insert(json!([]));
        calls.as_array_mut().expect("array").push(json!({
            "id": id, "type": "function", "function": {"name": name, "arguments": args}}));
    }
    for (i, item) in list.into_iter().enumerate() {
        let at = format!("input[{i}]");
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                let role = match item.role.as_deref() {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    Some(r) => return Err(bad(format!("{at}.role"), format!("'{r}' is not a role"))),
                    None => return Err(bad(format!("{at}.role"), "required")),
                };
                let c = content(
                    item.content.unwrap_or(TextOr::Text(String::new())),
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
                let id = required(item.call_id, &at, "call_id")?;
                let name = required(item.name, &at, "name")?;
                let name = names.flat(item.namespace.as_deref(), &name);
                let args = item.arguments.unwrap_or_else(|| "{}".into());
                call(&mut pending, id, name, args);
            }
            "custom_tool_call" => {
                let id = required(item.call_id, &at, "call_id")?;
                let name = required(item.name, &at, "name")?;
                let name = names.flat(item.namespace.as_deref(), &name);
                let args = json!({"input": item.input.unwrap_or_default()}).to_string();
                call(&mut pending, id, name, args);
            }
            "function_call_output" | "custom_tool_call_output" => {
                flush(&mut pending, out);
                let id = required(item.call_id, &at, "call_id")?;
                let output = match item.output {
                    Some(TextOr::Text(s)) => s,
                    Some(v) => content(v, &format!("{at}.output"))?
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(format!("{at}.output"), "only text output is supported"))?,
                    None => return Err(bad(format!("{at}.output"), "required (a string)")),
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            "reasoning" => {
                let mut text = String::new();
                let content = match item.content {
                    Some(TextOr::List(p)) => p,
                    _ => Vec::new(),
                };
                for parts in [content, item.summary.unwrap_or_default()] {
                    for p in parts {
                        if let Part::ReasoningText { text: t }
                        | Part::SummaryText { text: t }
                        | Part::Text { text: t } = p
                        {
                            text.push_str(&t);
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
pub(crate) fn translate(
    body: &Map<String, Value>,
    app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let salt = salt_of(body);
    to_chat(body, |id| {
        let store = app.responses.lock().unwrap_or_else(|e| e.into_inner());
        store
            .map
            .get(id)
            .filter(|s| s.salt == salt)
            .map(|s| s.messages.clone())
    })
    .map(Some)
}

/// The translation, with `stored` giving the conversation of a stored
/// response of this tenant (`previous_response_id`).
pub fn to_chat(
    body: &Map<String, Value>,
    stored: impl FnOnce(&str) -> Option<Vec<Value>>,
) -> Result<Map<String, Value>, ApiError> {
    let req: ResponsesRequest = from_body(body)?;
    let mut out = Map::new();
    if let Some(m) = req.model {
        out.insert("model".into(), m);
    }
    let mut messages = Vec::new();
    if let Some(s) = req.instructions {
        messages.push(json!({"role": "system", "content": s}));
    }
    if let Some(id) = &req.previous_response_id {
        let stored = stored(id).ok_or_else(|| not_found(id))?;
        // The stored conversation replaces this request's instructions'
        // place: instructions apply to this turn only (OpenAI's rule), so
        // they go first only when the stored turn had none.
        let had_system = stored.first().is_some_and(|m| m["role"] == "system");
        if had_system || messages.is_empty() {
            messages = stored;
        } else {
            messages.extend(stored);
        }
    }
    let (fns, names) = tools(req.tools.as_deref().unwrap_or_default())?;
    if let Some(input) = req.input {
        items(input, &names, &mut messages)?;
    }
    if messages.is_empty() {
        return Err(bad("input", "required (a string or an array of items)"));
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(v) = req.max_output_tokens.filter(|v| !v.is_null()) {
        out.insert("max_tokens".into(), v);
    }
    for (key, v) in [
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("cache_salt", req.cache_salt),
        ("session_id", req.session_id),
        ("seed", req.seed),
        ("top_logprobs", req.top_logprobs),
    ] {
        if let Some(v) = v {
            out.insert(key.into(), v);
        }
    }
    if let Some(p) = req.parallel_tool_calls {
        out.insert("parallel_tool_calls".into(), json!(p));
    }
    if let Some(s) = req.stream {
        out.insert("stream".into(), json!(s));
        if s {
            out.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    let has_tools = !fns.is_empty();
    if req.tools.is_some() {
        out.insert("tools".into(), Value::Array(fns));
    }
    out.insert("__tools".into(), names.to_json());
    match req.tool_choice {
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
    match req.text.and_then(|t| t.format) {
        None | Some(TextFormat::Text {}) => {}
        Some(TextFormat::JsonObject {}) => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(TextFormat::JsonSchema { schema, name }) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": name.unwrap_or(json!("output")), "schema": schema}}),
            );
        }
    }
    if let Some(effort) = req
        .reasoning
        .and_then(|r| r.effort)
        .filter(|e| !e.is_null())
    {
        out.insert("reasoning_effort".into(), effort);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ResponsesRequest, String> {
        from_body::<ResponsesRequest>(v.as_object().unwrap()).map_err(|e| e.message)
    }

    #[test]
    fn items_become_chat_messages() {
        let req = parse(json!({"input": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "exec", "namespace": "ns", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
            {"type": "web_search_call", "id": "ws"}],
            "tools": [{"type": "function", "name": "exec"},
                      {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "exec"}]},
                      {"type": "web_search"}]}))
        .unwrap();
        let (fns, names) = tools(req.tools.as_deref().unwrap()).unwrap();
        assert_eq!(fns.len(), 2);
        // The namespaced tool clashes with the plain one: flattened with its namespace.
        assert_eq!(names.flat(Some("ns"), "exec"), "ns__exec");
        let mut out = Vec::new();
        items(req.input.unwrap(), &names, &mut out).unwrap();
        assert_eq!(out[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(out[1], json!({"role": "user", "content": "hi"}));
        assert_eq!(out[2]["reasoning_content"], "think");
        assert_eq!(out[2]["tool_calls"][0]["function"]["name"], "ns__exec");
        assert_eq!(
            out[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "ok"})
        );
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse(json!({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}))
            .unwrap_err();
        assert!(
            e.starts_with("input[0].content[0].type: unknown variant `input_file`"),
            "{e}"
        );
        let e =
            parse(json!({"input": "x", "text": {"format": {"type": "json_schema"}}})).unwrap_err();
        assert!(e.starts_with("text.format: missing field `schema`"), "{e}");
        let e = parse(json!({"input": 5})).unwrap_err();
        assert!(e.starts_with("input: invalid type: integer"), "{e}");
        let req = parse(json!({"input": [{"type": "computer_call"}]})).unwrap();
        let e = items(req.input.unwrap(), &ToolNames::default(), &mut Vec::new()).unwrap_err();
        assert!(
            e.message
                .starts_with("input[0].type: 'computer_call' items"),
            "{}",
            e.message
        );
        let req = parse(json!({"input": "x", "tools": [{"type": "no_such_tool"}]})).unwrap();
        let e = tools(req.tools.as_deref().unwrap()).unwrap_err();
        assert!(
            e.message.starts_with("tools[0].type: 'no_such_tool'"),
            "{}",
            e.message
        );
    }
}
