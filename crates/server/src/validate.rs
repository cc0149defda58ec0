//! Strict shape checks of a chat request's messages and tools against the
//! OpenAI Chat Completions schema, before anything reaches a template. Each
//! error names the JSON path of the offending value, e.g.
//! `messages[2].tool_calls[0].function.arguments: not valid JSON (...)`.

use serde_json::{Map, Value};

use crate::error::ApiError;

const ROLES: &str = "system, developer, user, assistant or tool";

/// Checks `messages` (already known to be a non-empty array).
pub fn messages(messages: &[Value]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        message(&format!("messages[{i}]"), m)?;
    }
    Ok(())
}

/// Checks `tools` (when given and non-null).
pub fn tools(tools: &Value) -> Result<(), ApiError> {
    let Value::Array(list) = tools else {
        return Err(bad("tools", "must be an array"));
    };
    for (i, t) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let t = object(&path, t)?;
        match t.get("type") {
            Some(Value::String(s)) if s == "function" => {}
            Some(Value::String(s)) => {
                return Err(bad(
                    &format!("{path}.type"),
                    format!("unsupported tool type '{s}' (expected 'function')"),
                ))
            }
            Some(_) => return Err(bad(&format!("{path}.type"), "must be a string")),
            None => return Err(bad(&format!("{path}.type"), "required ('function')")),
        }
        let path = format!("{path}.function");
        let f = object(&path, t.get("function").unwrap_or(&Value::Null))?;
        name(&format!("{path}.name"), f.get("name"))?;
        optional_string(&format!("{path}.description"), f.get("description"))?;
        match f.get("parameters") {
            None | Some(Value::Object(_)) => {}
            Some(_) => return Err(bad(&format!("{path}.parameters"), "must be an object")),
        }
        match f.get("strict") {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(_) => return Err(bad(&format!("{path}.strict"), "must be a boolean")),
        }
    }
    Ok(())
}

fn message(path: &str, m: &Value) -> Result<(), ApiError> {
    let m = object(path, m)?;
    let role = match m.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(_) => return Err(bad(&format!("{path}.role"), "must be a string")),
        None => return Err(bad(&format!("{path}.role"), format!("required ({ROLES})"))),
    };
    // Content part types each role may send.
    let parts: &[&str] = match role {
        "system" | "developer" | "tool" => &["text"],
        "user" => &["text", "image_url"],
        "assistant" => &["text", "refusal"],
        _ => {
            return Err(bad(
                &format!("{path}.role"),
                format!("unknown role '{role}' (expected {ROLES})"),
            ))
        }
    };
    let has_calls = m.get("tool_calls").is_some_and(|c| !c.is_null());
    let content_path = format!("{path}.content");
    match m.get("content") {
        Some(Value::String(_)) => {}
        Some(Value::Array(list)) => {
            for (j, p) in list.iter().enumerate() {
                part(&format!("{content_path}[{j}]"), p, parts)?;
            }
        }
        // An assistant turn may be tool calls (or reasoning) alone.
        None | Some(Value::Null) if role == "assistant" => {}
        None | Some(Value::Null) => return Err(bad(&content_path, "required")),
        Some(_) => {
            return Err(bad(
                &content_path,
                "must be a string or an array of content parts",
            ))
        }
    }
    optional_string(&format!("{path}.name"), m.get("name"))?;
    for field in ["reasoning_content", "reasoning"] {
        match m.get(field) {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(_) => return Err(bad(&format!("{path}.{field}"), "must be a string")),
        }
    }
    if has_calls {
        if role != "assistant" {
            return Err(bad(
                &format!("{path}.tool_calls"),
                "only assistant messages carry tool calls",
            ));
        }
        tool_calls(&format!("{path}.tool_calls"), &m["tool_calls"])?;
    }
    if role == "tool" {
        match m.get("tool_call_id") {
            Some(Value::String(_)) => {}
            Some(_) => return Err(bad(&format!("{path}.tool_call_id"), "must be a string")),
            None => {
                return Err(bad(
                    &format!("{path}.tool_call_id"),
                    "required in a tool message",
                ))
            }
        }
    }
    Ok(())
}

fn part(path: &str, p: &Value, allowed: &[&str]) -> Result<(), ApiError> {
    let p = object(path, p)?;
    let kind = match p.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(bad(&format!("{path}.type"), "must be a string")),
        None => return Err(bad(&format!("{path}.type"), "required")),
    };
    if !allowed.contains(&kind) {
        return Err(bad(
            &format!("{path}.type"),
            format!(
                "content part type '{kind}' is not accepted here (expected {})",
                allowed.join(" or ")
            ),
        ));
    }
    match kind {
        "text" | "refusal" => match p.get(kind) {
            Some(Value::String(_)) => Ok(()),
            _ => Err(bad(&format!("{path}.{kind}"), "must be a string")),
        },
        _ => {
            // image_url: {"url": string, "detail"?: string}
            let path = format!("{path}.image_url");
            let img = object(&path, p.get("image_url").unwrap_or(&Value::Null))?;
            match img.get("url") {
                Some(Value::String(_)) => {}
                _ => return Err(bad(&format!("{path}.url"), "must be a string")),
            }
            optional_string(&format!("{path}.detail"), img.get("detail"))
        }
    }
}

fn tool_calls(path: &str, calls: &Value) -> Result<(), ApiError> {
    let Value::Array(list) = calls else {
        return Err(bad(path, "must be an array"));
    };
    for (k, c) in list.iter().enumerate() {
        let path = format!("{path}[{k}]");
        let c = object(&path, c)?;
        match c.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(_) => return Err(bad(&format!("{path}.type"), "must be 'function'")),
        }
        optional_string(&format!("{path}.id"), c.get("id"))?;
        let path = format!("{path}.function");
        let f = object(&path, c.get("function").unwrap_or(&Value::Null))?;
        name(&format!("{path}.name"), f.get("name"))?;
        let path = format!("{path}.arguments");
        match f.get("arguments") {
            // Decoded arguments (hearth's own history format) are taken as is.
            Some(Value::Object(_)) => {}
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(_)) => {}
                Ok(_) => return Err(bad(&path, "must encode a JSON object")),
                Err(e) => return Err(bad(&path, format!("not valid JSON ({e})"))),
            },
            Some(_) => return Err(bad(&path, "must be a string of JSON")),
            None => return Err(bad(&path, "required")),
        }
    }
    Ok(())
}

fn object<'a>(path: &str, v: &'a Value) -> Result<&'a Map<String, Value>, ApiError> {
    match v {
        Value::Object(o) => Ok(o),
        Value::Null => Err(bad(path, "required (an object)")),
        _ => Err(bad(path, "must be an object")),
    }
}

fn name(path: &str, v: Option<&Value>) -> Result<(), ApiError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Ok(()),
        Some(Value::String(_)) => Err(bad(path, "must not be empty")),
        Some(_) => Err(bad(path, "must be a string")),
        None => Err(bad(path, "required")),
    }
}

fn optional_string(path: &str, v: Option<&Value>) -> Result<(), ApiError> {
    match v {
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        Some(_) => Err(bad(path, "must be a string")),
    }
}

fn bad(path: &str, problem: impl std::fmt::Display) -> ApiError {
    ApiError::invalid("invalid_value", format!("{path}: {problem}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs_err(v: Value) -> String {
        messages(v.as_array().unwrap()).unwrap_err().message
    }

    fn call(arguments: Value) -> Value {
        json!([{"role": "user", "content": "hi"}, {"role": "user", "content": "again"},
               {"role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]}])
    }

    #[test]
    fn tool_call_arguments_must_be_a_json_object() {
        assert!(messages(call(json!("{\"x\": 1}")).as_array().unwrap()).is_ok());
        assert!(messages(call(json!({"x": 1})).as_array().unwrap()).is_ok());
        let e = msgs_err(call(json!("{not json")));
        assert!(
            e.starts_with("messages[2].tool_calls[0].function.arguments: not valid JSON ("),
            "{e}"
        );
        assert_eq!(
            msgs_err(call(json!("[1]"))),
            "messages[2].tool_calls[0].function.arguments: must encode a JSON object"
        );
        assert_eq!(
            msgs_err(call(json!(5))),
            "messages[2].tool_calls[0].function.arguments: must be a string of JSON"
        );
    }

    #[test]
    fn tool_calls_must_be_an_array_of_function_calls() {
        let e = msgs_err(json!([{"role": "assistant", "tool_calls": {"id": "c"}}]));
        assert_eq!(e, "messages[0].tool_calls: must be an array");
        let e = msgs_err(
            json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]),
        );
        assert_eq!(
            e,
            "messages[0].tool_calls[0].function: required (an object)"
        );
        let e = msgs_err(
            json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
        );
        assert_eq!(e, "messages[0].tool_calls[0].function.name: required");
        let e = msgs_err(json!([{"role": "user", "content": "x", "tool_calls": []}]));
        assert_eq!(
            e,
            "messages[0].tool_calls: only assistant messages carry tool calls"
        );
    }

    #[test]
    fn roles_content_and_parts_are_checked() {
        assert_eq!(
            msgs_err(json!([{"role": "wizard", "content": "x"}])),
            "messages[0].role: unknown role 'wizard' (expected system, developer, user, assistant or tool)"
        );
        assert_eq!(
            msgs_err(json!([{"role": "user", "content": 5}])),
            "messages[0].content: must be a string or an array of content parts"
        );
        assert_eq!(
            msgs_err(json!([{"role": "user"}])),
            "messages[0].content: required"
        );
        assert_eq!(
            msgs_err(json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio"}]}])),
            "messages[0].content[1].type: content part type 'input_audio' is not accepted here (expected text or image_url)"
        );
        assert_eq!(
            msgs_err(json!([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])),
            "messages[0].content[0].type: content part type 'image_url' is not accepted here (expected text)"
        );
        assert_eq!(
            msgs_err(json!([{"role": "user", "content": [{"type": "text", "text": 1}]}])),
            "messages[0].content[0].text: must be a string"
        );
        assert_eq!(
            msgs_err(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}])
            ),
            "messages[0].content[0].image_url: must be an object"
        );
        assert_eq!(
            msgs_err(json!([{"role": "tool", "content": "r"}])),
            "messages[0].tool_call_id: required in a tool message"
        );
        // An assistant turn of tool calls alone, and reasoning, are fine.
        assert!(messages(
            json!([{"role": "assistant", "reasoning_content": "r"}, {"role": "developer", "content": "d"}])
                .as_array()
                .unwrap()
        )
        .is_ok());
    }

    #[test]
    fn tools_must_be_function_objects_with_object_parameters() {
        let ok = json!([{"type": "function", "function": {"name": "f", "description": "d",
                         "parameters": {"type": "object"}, "strict": true}}]);
        assert!(tools(&ok).is_ok());
        let e = |v: Value| tools(&v).unwrap_err().message;
        assert_eq!(
            e(json!([{"type": "function", "function": {"name": "f", "parameters": "{}"}}])),
            "tools[0].function.parameters: must be an object"
        );
        assert_eq!(
            e(json!([{"type": "function", "function": {"name": "f"}}, {"type": "retrieval"}])),
            "tools[1].type: unsupported tool type 'retrieval' (expected 'function')"
        );
        assert_eq!(
            e(json!([{"function": {"name": "f"}}])),
            "tools[0].type: required ('function')"
        );
        assert_eq!(
            e(json!([{"type": "function", "function": {"name": ""}}])),
            "tools[0].function.name: must not be empty"
        );
        assert_eq!(e(json!({"type": "function"})), "tools: must be an array");
        assert_eq!(e(json!([3])), "tools[0]: must be an object");
    }
}
