//! Anthropic's Messages request (`POST /v1/messages`, `count_tokens`) as
//! typed structs, and its translation onto the shared chat request.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{bad, TextOr};
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<Value>,
    pub max_tokens: i64,
    #[serde(default)]
    pub system: Option<TextOr<SystemBlock>>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
    /// Accepted and not used (`user_id`).
    #[serde(default)]
    pub metadata: Option<Value>,
    /// hearth's own: an explicit session, and the tenant's salt.
    #[serde(default)]
    pub session_id: Option<Value>,
    #[serde(default)]
    pub cache_salt: Option<Value>,
}

/// A `system` text block (Claude Code adds `cache_control`: ignored).
#[derive(Debug, Deserialize)]
pub struct SystemBlock {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    /// Claude Code sends system messages among the turns (reminders).
    System,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: TextOr<Block>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Option<Value>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<TextOr<ResultBlock>>,
        #[serde(default)]
        is_error: Option<bool>,
    },
    Thinking {
        #[serde(default)]
        thinking: Option<String>,
    },
    /// Opaque to this model: nothing to render.
    RedactedThinking {},
}

impl Block {
    fn kind(&self) -> &'static str {
        match self {
            Block::Text { .. } => "text",
            Block::Image { .. } => "image",
            Block::ToolUse { .. } => "tool_use",
            Block::ToolResult { .. } => "tool_result",
            Block::Thinking { .. } => "thinking",
            Block::RedactedThinking {} => "redacted_thinking",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

/// A block of a `tool_result`'s content.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultBlock {
    Text {
        text: String,
    },
    Image {
        #[allow(dead_code)]
        source: Value,
    },
}

#[derive(Debug, Deserialize)]
pub struct Tool {
    /// None or `custom`: a tool the client runs; any other type is one of
    /// Anthropic's server tools.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
    #[serde(default)]
    pub strict: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto {
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    None {},
}

#[derive(Debug, Deserialize)]
pub struct OutputConfig {
    #[serde(default)]
    pub format: Option<OutputFormat>,
    #[serde(default)]
    pub effort: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    JsonSchema { schema: Map<String, Value> },
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Thinking {
    Enabled {
        #[allow(dead_code)]
        #[serde(default)]
        budget_tokens: Option<u64>,
    },
    Adaptive {},
    Disabled {},
}

/// Claude Code's per-request metadata block in `system`
/// (`x-anthropic-billing-header: …cch=<hash>`): its hash changes on every
/// request, so left in the prompt it would part every turn's prompt from
/// the last at its first tokens (llama.cpp issue 19494). It says nothing
/// to the model; it is left out.
fn is_client_metadata(text: &str) -> bool {
    text.trim_start().starts_with("x-anthropic-billing-header:")
}

/// The text of a `system` (a string or text blocks), client metadata left
/// out; `at` names the field in errors.
fn system_text(v: TextOr<SystemBlock>, at: &str) -> Result<Option<String>, ApiError> {
    match v {
        TextOr::Text(s) => Ok((!is_client_metadata(&s)).then_some(s)),
        TextOr::List(blocks) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.into_iter().enumerate() {
                if b.kind != "text" {
                    return Err(bad(
                        format!("{at}[{i}].type"),
                        "system blocks must be text blocks",
                    ));
                }
                if !is_client_metadata(&b.text) {
                    parts.push(b.text);
                }
            }
            Ok((!parts.is_empty()).then(|| parts.join("\n\n")))
        }
    }
}

fn image_part(source: ImageSource) -> Value {
    let url = match source {
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        ImageSource::Url { url } => url,
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// A `tool_result` block's content as text (a string, or text blocks).
fn tool_result_text(
    content: Option<TextOr<ResultBlock>>,
    is_error: bool,
    at: &str,
) -> Result<String, ApiError> {
    let text = match content {
        None => String::new(),
        Some(TextOr::Text(s)) => s,
        Some(TextOr::List(parts)) => {
            let mut out = Vec::new();
            for (k, p) in parts.into_iter().enumerate() {
                match p {
                    ResultBlock::Text { text } => out.push(text),
                    ResultBlock::Image { .. } => {
                        return Err(bad(
                            format!("{at}.content[{k}].type"),
                            "'image' is not supported in a tool result (text only)",
                        ))
                    }
                }
            }
            out.join("\n")
        }
    };
    Ok(if is_error {
        format!("Error: {text}")
    } else {
        text
    })
}

/// One Messages message as chat completions messages (a user turn's tool
/// results become tool messages, ahead of its other content).
fn message(m: Message, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        // They stay where they are: moved to the front, each would change
        // the prompt's start and part it from the cached one.
        Role::System => {
            let content = match m.content {
                TextOr::Text(s) => TextOr::Text(s),
                TextOr::List(blocks) => {
                    let mut texts = Vec::new();
                    for (j, b) in blocks.into_iter().enumerate() {
                        match b {
                            Block::Text { text } => texts.push(SystemBlock {
                                kind: "text".into(),
                                text,
                            }),
                            _ => {
                                return Err(bad(
                                    format!("{at}.content[{j}].type"),
                                    "system blocks must be text blocks",
                                ))
                            }
                        }
                    }
                    TextOr::List(texts)
                }
            };
            if let Some(text) = system_text(content, &format!("{at}.content"))? {
                out.push(json!({"role": "system", "content": text}));
            }
            return Ok(());
        }
    };
    let blocks = match m.content {
        TextOr::Text(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        TextOr::List(b) => b,
    };
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match (role, b) {
            ("user", Block::Text { text: t }) => parts.push(json!({"type": "text", "text": t})),
            (_, Block::Text { text: t }) => text.push_str(&t),
            ("user", Block::Image { source }) => parts.push(image_part(source)),
            (
                "user",
                Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                },
            ) => {
                let content = tool_result_text(content, is_error == Some(true), &at)?;
                out.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}));
            }
            ("assistant", Block::ToolUse { id, name, input }) => {
                let input = input.unwrap_or(json!({}));
                if !input.is_object() {
                    return Err(bad(format!("{at}.input"), "must be an object"));
                }
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("assistant", Block::Thinking { thinking }) => {
                reasoning.push_str(thinking.as_deref().unwrap_or(""));
            }
            ("assistant", Block::RedactedThinking {}) => {}
            (_, b) => {
                return Err(bad(
                    format!("{at}.type"),
                    format!(
                        "'{}' blocks are not supported in {} {role} message",
                        b.kind(),
                        if role == "assistant" { "an" } else { "a" }
                    ),
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

impl MessagesRequest {
    /// A body as the chat completions body.
    pub fn parse(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
        super::from_body::<MessagesRequest>(body)?.into_chat()
    }

    /// The request as a chat completions body (what every front door
    /// hands to the shared validation).
    pub fn into_chat(self) -> Result<Map<String, Value>, ApiError> {
        let mut out = Map::new();
        if let Some(m) = self.model {
            out.insert("model".into(), m);
        }
        if self.max_tokens < 1 {
            return Err(bad("max_tokens", "must be a positive integer"));
        }
        out.insert("max_tokens".into(), json!(self.max_tokens));
        let mut messages = Vec::new();
        if let Some(sys) = self.system {
            if let Some(text) = system_text(sys, "system")? {
                messages.push(json!({"role": "system", "content": text}));
            }
        }
        if self.messages.is_empty() {
            return Err(bad("messages", "must not be empty"));
        }
        for (i, m) in self.messages.into_iter().enumerate() {
            message(m, i, &mut messages)?;
        }
        out.insert("messages".into(), Value::Array(messages));
        if let Some(t) = self.temperature {
            if !(0.0..=1.0).contains(&t) {
                return Err(bad(
                    "temperature",
                    format!("must be between 0 and 1 (got {t})"),
                ));
            }
            out.insert("temperature".into(), json!(t));
        }
        if let Some(p) = self.top_p {
            out.insert("top_p".into(), json!(p));
        }
        if let Some(k) = self.top_k {
            out.insert("top_k".into(), json!(k));
        }
        if let Some(s) = self.stream {
            out.insert("stream".into(), json!(s));
            if s {
                out.insert("stream_options".into(), json!({"include_usage": true}));
            }
        }
        for (k, v) in [
            ("session_id", self.session_id),
            ("cache_salt", self.cache_salt),
        ] {
            if let Some(v) = v {
                out.insert(k.into(), v);
            }
        }
        if let Some(stop) = self.stop_sequences {
            out.insert("stop".into(), json!(stop));
        }
        // Tools: custom tools with an input schema.
        let mut has_tools = false;
        if let Some(tools) = self.tools {
            let mut fns = Vec::new();
            for (i, t) in tools.into_iter().enumerate() {
                let at = format!("tools[{i}]");
                match t.kind.as_deref() {
                    None | Some("custom") => {}
                    Some(k) => {
                        return Err(bad(
                            format!("{at}.type"),
                            format!("'{k}' is a tool Anthropic's servers run; this server runs only custom tools (name, description, input_schema)"),
                        ))
                    }
                }
                let schema = t.input_schema.unwrap_or(json!({"type": "object"}));
                if !schema.is_object() {
                    return Err(bad(
                        format!("{at}.input_schema"),
                        "must be a JSON Schema object",
                    ));
                }
                let mut f = json!({"name": t.name, "parameters": schema});
                if let Some(d) = t.description {
                    f["description"] = json!(d);
                }
                if let Some(strict) = t.strict {
                    f["strict"] = strict;
                }
                fns.push(json!({"type": "function", "function": f}));
            }
            has_tools = !fns.is_empty();
            out.insert("tools".into(), Value::Array(fns));
        }
        if let Some(c) = self.tool_choice {
            let (choice, no_parallel) = match c {
                ToolChoice::Auto {
                    disable_parallel_tool_use: d,
                } => (json!("auto"), d),
                ToolChoice::Any {
                    disable_parallel_tool_use: d,
                } => (json!("required"), d),
                ToolChoice::None {} => (json!("none"), None),
                ToolChoice::Tool {
                    name,
                    disable_parallel_tool_use: d,
                } => (json!({"type": "function", "function": {"name": name}}), d),
            };
            if !(has_tools || choice == "none" || choice == "auto") {
                return Err(bad(
                    "tool_choice",
                    "tool calls were asked for but `tools` is empty",
                ));
            }
            out.insert("tool_choice".into(), choice);
            if no_parallel == Some(true) {
                out.insert("parallel_tool_calls".into(), json!(false));
            }
        }
        // Structured output (`output_config.format`) and effort.
        if let Some(c) = self.output_config {
            if let Some(OutputFormat::JsonSchema { schema }) = c.format {
                out.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
                );
            }
            if let Some(e) = c.effort {
                out.insert("reasoning_effort".into(), json!(e));
            }
        }
        let mut kwargs = Map::new();
        match self.thinking {
            None => {}
            Some(Thinking::Enabled { .. } | Thinking::Adaptive {}) => {
                kwargs.insert("enable_thinking".into(), json!(true));
                kwargs.insert("return_reasoning".into(), json!(true));
            }
            Some(Thinking::Disabled {}) => {
                kwargs.insert("enable_thinking".into(), json!(false));
            }
        }
        if !kwargs.is_empty() {
            out.insert("chat_template_kwargs".into(), Value::Object(kwargs));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Result<Map<String, Value>, String> {
        MessagesRequest::parse(v.as_object().unwrap()).map_err(|e| e.message)
    }

    #[test]
    fn translates_blocks_and_drops_client_metadata() {
        let out = chat(json!({
            "model": "m", "max_tokens": 8,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1"},
                       {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "ok"}], "is_error": true}]},
                {"role": "system", "content": "reminder"}],
            "tool_choice": {"type": "any"}, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "thinking": {"type": "enabled", "budget_tokens": 100}, "stream": true
        }))
        .unwrap();
        let m = &out["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "user", "content": "hi"}));
        assert_eq!(m[2]["reasoning_content"], "t");
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "Error: ok"})
        );
        assert_eq!(m[4], json!({"role": "system", "content": "reminder"}));
        assert_eq!(out["tool_choice"], "required");
        assert_eq!(out["stream_options"], json!({"include_usage": true}));
        assert_eq!(out["chat_template_kwargs"]["enable_thinking"], true);
    }

    #[test]
    fn errors_name_the_field() {
        let ask = json!([{"role": "user", "content": "hi"}]);
        let e = chat(json!({"messages": ask})).unwrap_err();
        assert!(e.contains("max_tokens"), "{e}");
        let e = chat(json!({"max_tokens": 0, "messages": ask})).unwrap_err();
        assert_eq!(e, "max_tokens: must be a positive integer");
        let e = chat(json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]}))
            .unwrap_err();
        assert!(
            e.starts_with("messages[0].content[0].type: unknown variant `video`"),
            "{e}"
        );
        let e = chat(json!({"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}))
            .unwrap_err();
        assert!(
            e.starts_with("messages[0].role: unknown variant `tool`"),
            "{e}"
        );
        let e = chat(
            json!({"max_tokens": 4, "messages": [{"role": "assistant", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "messages[0].content[0].type: 'image' blocks are not supported in an assistant message"
        );
        let e = chat(json!({"max_tokens": 4, "messages": ask, "tools": [{"type": "web_search_20250305", "name": "w"}]}))
            .unwrap_err();
        assert!(e.starts_with("tools[0].type: 'web_search_20250305'"), "{e}");
        let e = chat(json!({"max_tokens": 4, "messages": ask, "temperature": 1.5})).unwrap_err();
        assert!(e.starts_with("temperature: must be between 0 and 1"), "{e}");
        let e = chat(
            json!({"max_tokens": 4, "messages": ask, "tool_choice": {"type": "tool", "name": "f"}}),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "tool_choice: tool calls were asked for but `tools` is empty"
        );
        let e = chat(json!({"max_tokens": 4, "messages": ask, "stop_sequences": "x"})).unwrap_err();
        assert!(e.starts_with("stop_sequences: invalid type: string"), "{e}");
    }
}
