//! Ollama's `/api/chat` and `/api/generate` requests as typed structs, and
//! their translation onto the shared chat request.

use std::collections::VecDeque;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{bad, from_body};
use crate::error::ApiError;

/// The fields both routes share.
#[derive(Debug, Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<Value>,
    /// Ollama streams unless told not to.
    #[serde(default)]
    stream: Option<bool>,
    /// Sampling options (Ollama's names); checked one by one.
    #[serde(default)]
    options: Option<Map<String, Value>>,
    /// `"json"` or a JSON schema.
    #[serde(default)]
    format: Option<Value>,
    /// A boolean or `"low"`/`"medium"`/`"high"`; the template decides.
    #[serde(default)]
    think: Option<Value>,
    /// A duration (`"5m"`) or seconds; models stay as the server keeps them.
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    session_id: Option<Value>,
    #[serde(default)]
    cache_salt: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    images: Option<Vec<String>>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ToolCall {
    #[serde(default)]
    id: Option<String>,
    function: FunctionCall,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    name: String,
    /// An object (Ollama's) or a JSON string (OpenAI's).
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct GenerateBody {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    images: Option<Vec<String>>,
    #[serde(default)]
    raw: Option<bool>,
    #[serde(default)]
    template: Option<Value>,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    suffix: Option<Value>,
}

/// Ollama's `options` onto chat completions fields.
fn options(opts: Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    for (k, v) in opts {
        match k.as_str() {
            "temperature" | "top_p" | "top_k" | "min_p" | "seed" | "stop" | "repeat_penalty"
            | "presence_penalty" | "frequency_penalty" | "repeat_last_n" => {
                out.insert(k, v);
            }
            "num_predict" => match v.as_i64() {
                // -1: until the end of generation; -2: fill the context.
                Some(n) if n < 0 => {}
                Some(_) => {
                    out.insert("max_tokens".into(), v);
                }
                None => return Err(bad("options.num_predict", "must be an integer")),
            },
            // The server's context, batch and threads are set when it
            // starts; Ollama's per-request load options do not apply.
            "num_ctx" | "num_batch" | "num_thread" | "num_gpu" | "main_gpu" | "use_mmap"
            | "use_mlock" | "num_keep" | "low_vram" | "numa" | "typical_p" | "mirostat"
            | "mirostat_tau" | "mirostat_eta" | "penalize_newline" | "tfs_z" => {}
            other => {
                return Err(bad(
                    format!("options.{other}"),
                    "is not an option this server knows",
                ))
            }
        }
    }
    Ok(())
}

/// Base64 images as data URLs (hearth reads the format from the bytes).
fn image_parts(images: Option<Vec<String>>) -> Vec<Value> {
    images
        .unwrap_or_default()
        .into_iter()
        .map(|b64| json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}}))
        .collect()
}

/// Text after the images, as Ollama sends them.
fn content(text: String, images: Option<Vec<String>>) -> Value {
    let mut parts = image_parts(images);
    if parts.is_empty() {
        return json!(text);
    }
    parts.push(json!({"type": "text", "text": text}));
    Value::Array(parts)
}

fn common(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let c: Common = from_body(body)?;
    let mut out = Map::new();
    if let Some(m) = c.model {
        out.insert("model".into(), m);
    }
    out.insert("stream".into(), json!(c.stream.unwrap_or(true)));
    if let Some(o) = c.options {
        options(o, &mut out)?;
    }
    match c.format {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Value::Object(schema)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(_) => return Err(bad("format", "must be \"json\" or a JSON schema object")),
    }
    match c.think {
        None | Some(Value::Null) | Some(Value::Bool(_)) | Some(Value::String(_)) => {}
        Some(_) => {
            return Err(bad(
                "think",
                "must be a boolean or \"low\"/\"medium\"/\"high\"",
            ))
        }
    }
    match c.keep_alive {
        None | Some(Value::Null) | Some(Value::String(_)) | Some(Value::Number(_)) => {}
        Some(_) => return Err(bad("keep_alive", "must be a duration (\"5m\") or seconds")),
    }
    for (k, v) in [("session_id", c.session_id), ("cache_salt", c.cache_salt)] {
        if let Some(v) = v {
            out.insert(k.into(), v);
        }
    }
    Ok(out)
}

/// An `/api/chat` body as a chat completions body.
pub fn chat_body(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = common(body)?;
    let b: ChatBody = from_body(body)?;
    let mut messages = Vec::new();
    // Ollama's tool results name no call: they answer the open calls in order.
    let mut open_calls: VecDeque<String> = Default::default();
    let mut n_calls = 0usize;
    for (i, m) in b.messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let mut msg =
            json!({"role": m.role, "content": content(m.content.unwrap_or_default(), m.images)});
        match m.role.as_str() {
            "assistant" => {
                if let Some(t) = m.thinking {
                    msg["reasoning_content"] = json!(t);
                }
                let mut out_calls = Vec::new();
                for (k, c) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let args = match c.function.arguments {
                        None | Some(Value::Null) => "{}".to_string(),
                        Some(Value::String(s)) => s,
                        Some(v @ Value::Object(_)) => v.to_string(),
                        Some(_) => {
                            return Err(bad(
                                format!("{at}.tool_calls[{k}].function.arguments"),
                                "must be an object",
                            ))
                        }
                    };
                    let id = c.id.unwrap_or_else(|| {
                        n_calls += 1;
                        format!("call_{n_calls}")
                    });
                    open_calls.push_back(id.clone());
                    out_calls.push(json!({"id": id, "type": "function",
                        "function": {"name": c.function.name, "arguments": args}}));
                }
                if !out_calls.is_empty() {
                    msg["tool_calls"] = Value::Array(out_calls);
                }
            }
            "tool" => {
                let id = m
                    .tool_call_id
                    .or_else(|| open_calls.pop_front())
                    .unwrap_or_else(|| {
                        n_calls += 1;
                        format!("call_{n_calls}")
                    });
                msg["tool_call_id"] = json!(id);
                if let Some(name) = m.tool_name {
                    msg["name"] = json!(name);
                }
            }
            _ => {}
        }
        messages.push(msg);
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = b.tools {
        out.insert("tools".into(), Value::Array(tools));
    }
    Ok(out)
}

/// An `/api/generate` body (not `raw`) as a chat completions body: the
/// prompt is the user's message, under `system` when given.
pub fn generate_body(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = common(body)?;
    let b: GenerateBody = from_body(body)?;
    if b.raw == Some(true) {
        return Err(bad(
            "raw",
            "raw prompts are not supported here; use POST /v1/completions for a prompt without the chat template",
        ));
    }
    for (key, v) in [
        ("template", b.template),
        ("context", b.context),
        ("suffix", b.suffix),
    ] {
        if v.is_some_and(|v| !v.is_null() && v != "") {
            return Err(bad(
                key,
                "is not supported (the model's own chat template renders the prompt)",
            ));
        }
    }
    let mut messages = Vec::new();
    if let Some(s) = b.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages
        .push(json!({"role": "user", "content": content(b.prompt.unwrap_or_default(), b.images)}));
    out.insert("messages".into(), Value::Array(messages));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Result<Map<String, Value>, String> {
        chat_body(v.as_object().unwrap()).map_err(|e| e.message)
    }

    #[test]
    fn tool_results_answer_the_open_calls_in_order() {
        let out = chat(json!({"model": "m", "messages": [
            {"role": "user", "content": "hi", "images": ["AAAA"]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "f", "arguments": {"a": 1}}},
                {"function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": "2", "tool_name": "g"}],
            "options": {"num_predict": 5, "temperature": 0, "num_ctx": 4096}}))
        .unwrap();
        let m = &out["messages"];
        assert_eq!(m[0]["content"][0]["type"], "image_url");
        assert_eq!(m[0]["content"][1], json!({"type": "text", "text": "hi"}));
        assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(m[2]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
        assert_eq!(m[3]["tool_call_id"], m[1]["tool_calls"][1]["id"]);
        assert_eq!(m[3]["name"], "g");
        assert_eq!(out["max_tokens"], 5);
        assert_eq!(out["stream"], true);
        assert!(out.get("num_ctx").is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let e = chat(json!({"messages": "hi"})).unwrap_err();
        assert!(e.starts_with("messages: invalid type: string"), "{e}");
        let e = chat(json!({"messages": [], "options": {"warp": 1}})).unwrap_err();
        assert_eq!(e, "options.warp: is not an option this server knows");
        let e = chat(json!({"messages": [{"role": "user", "content": 5}]})).unwrap_err();
        assert!(
            e.starts_with("messages[0].content: invalid type: integer"),
            "{e}"
        );
        let e = chat(json!({"messages": [], "format": 5})).unwrap_err();
        assert!(e.starts_with("format: must be"), "{e}");
        let e = chat(json!({"messages": [], "stream": "yes"})).unwrap_err();
        assert!(e.starts_with("stream: invalid type: string"), "{e}");
        let e =
            generate_body(json!({"prompt": "x", "raw": true}).as_object().unwrap()).unwrap_err();
        assert!(
            e.message.starts_with("raw: raw prompts are not supported"),
            "{}",
            e.message
        );
    }
}
