//! Request bodies: parsed from JSON by hand so every error names its field, and
//! checked in the order of server-api.md §2 (model, value ranges, unsupported
//! parameters, session id). Rendering and the context check come later.

use hearth_engine::sampler::SamplerConfig;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// What `/v1/chat/completions` and `/v1/completions` share.
#[derive(Clone, Debug)]
pub struct Common {
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: SamplerConfig,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub session_id: Option<String>,
    /// Report each token's logprob and this many alternatives.
    pub logprobs: Option<usize>,
    /// `cache_salt` (vLLM's field): sessions share prompt prefixes only with
    /// sessions of the same salt.
    pub cache_salt: Option<String>,
    /// `ignore_eos` (llama-server's and vLLM's field): generate through
    /// end-of-generation tokens, to `max_tokens` (benchmarks).
    pub ignore_eos: bool,
    /// `return_progress` (llama-server's field): a streamed reply carries
    /// `prompt_progress` chunks while the prompt is prefilled.
    pub return_progress: bool,
}

/// What the output must follow (`tool_choice`, `response_format`, strict tools).
#[derive(Clone, Debug, PartialEq)]
pub enum Structured {
    /// Free text (and tool calls as the model writes them).
    Free,
    /// `response_format: json_object`.
    JsonObject,
    /// `response_format: json_schema` (the schema).
    JsonSchema(Value),
    /// `tool_choice: required` (`only: None`) or a named function: the
    /// output is tool calls.
    Calls { only: Option<String> },
    /// `tool_choice: auto` with `strict` tools: free text, but a call the
    /// model opens follows the tools' schemas.
    StrictCalls,
}

#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub common: Common,
    /// With tool-call arguments decoded and `reasoning` aliased.
    pub messages: Value,
    /// Tools to render and parse (None when absent, empty, or `tool_choice: "none"`).
    pub tools: Option<Value>,
    pub kwargs: Map<String, Value>,
    /// `chat_template_kwargs.return_reasoning`.
    pub return_reasoning: bool,
    pub structured: Structured,
    /// Per tool name: `function.strict` (tools without it are constrained
    /// only under `tool_choice` required/named).
    pub strict: std::collections::HashMap<String, bool>,
    /// `parallel_tool_calls` (default true).
    pub parallel_tool_calls: bool,
}

#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub common: Common,
    pub prompt: String,
}

const HONORED: &str = "This server honors temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n, seed, max_tokens/max_completion_tokens, stop, logprobs/top_logprobs, response_format, tool_choice, and tools for the configured tool-call format.";

/// Parses the body as a JSON object (400 on anything else).
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        // serde_json stops at 128 levels of nesting (its recursion limit).
        if e.to_string().starts_with("recursion limit exceeded") {
            ApiError::invalid_request(format!(
                "Request body is nested more than 128 levels deep (JSON arrays and objects), at line {} column {}; at most 128 are supported.",
                e.line(),
                e.column()
            ))
        } else {
            ApiError::invalid_request(format!("Request body is not valid JSON: {e}"))
        }
    })?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::invalid_request(
            "Request body must be a JSON object.",
        )),
    }
}

pub fn parse_chat(
    body: &Map<String, Value>,
    served: &str,
    header_session: Option<String>,
) -> Result<ChatRequest, ApiError> {
    check_model(body, served)?;
    let messages = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_request(
                "'messages' must be a non-empty array.",
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid_request(
                "'messages' must be an array of message objects.",
            ))
        }
        None => {
            return Err(ApiError::invalid_request(
                "Missing required field 'messages'.",
            ))
        }
    };
    crate::validate::messages(messages)?;
    let ranges = sampling(body)?;
    let max_tokens = max_tokens(body)?;
    choices(body)?;
    let unsupported = common_unsupported(body);
    reject_unsupported(&unsupported)?;
    let logprobs = chat_logprobs(body)?;
    let session_id = session_id(body, header_session)?;

    let tool_choice_none = body.get("tool_choice").and_then(Value::as_str) == Some("none");
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) if t.is_empty() => None,
        Some(t) => {
            crate::validate::tools(t)?;
            (!tool_choice_none).then(|| t.clone())
        }
    };
    let strict = strict_flags(tools.as_ref());
    let structured = structured(body, tools.as_ref(), &strict)?;
    let parallel_tool_calls = bool_field(body, "parallel_tool_calls", true)?;
    let mut kwargs = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(k)) => k.clone(),
        Some(_) => {
            return Err(ApiError::invalid_request(
                "'chat_template_kwargs' must be an object.",
            ))
        }
    };
    // As llama-server: the request's reasoning effort reaches the template as
    // `reasoning_effort` (and `reasoning_strength`, ChatTemplate::render);
    // "none" turns thinking off instead.
    match body.get("reasoning_effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if e == "none" => {
            kwargs.remove("reasoning_effort");
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
        }
        Some(Value::String(e)) if e.is_empty() => {}
        Some(Value::String(e)) => {
            kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
        }
        Some(_) => {
            return Err(ApiError::invalid_request(
                "'reasoning_effort' must be a string.",
            ))
        }
    }
    let return_reasoning = match kwargs.remove("return_reasoning") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err(ApiError::invalid_request(
                "chat_template_kwargs.return_reasoning must be a boolean.",
            ))
        }
    };
    let messages =
        hearth_chat::template::decode_tool_call_arguments(&normalize_messages(messages)?);
    Ok(ChatRequest {
        common: Common::read(body, ranges, max_tokens, session_id, logprobs)?,
        messages,
        tools,
        kwargs,
        return_reasoning,
        structured,
        strict,
        parallel_tool_calls,
    })
}

/// `function.strict` of each tool.
fn strict_flags(tools: Option<&Value>) -> std::collections::HashMap<String, bool> {
    let mut out = std::collections::HashMap::new();
    for t in tools.and_then(Value::as_array).into_iter().flatten() {
        let f = &t["function"];
        if let Some(name) = f["name"].as_str() {
            out.insert(name.to_string(), f["strict"].as_bool().unwrap_or(false));
        }
    }
    out
}

/// `tool_choice` and `response_format` (checked shapes; the grammar itself
/// compiles later, with the model's vocabulary).
fn structured(
    body: &Map<String, Value>,
    tools: Option<&Value>,
    strict: &std::collections::HashMap<String, bool>,
) -> Result<Structured, ApiError> {
    let bad = |m: String| ApiError::invalid("invalid_value", m);
    let calls = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "auto" || s == "none" => None,
        Some(Value::String(s)) if s == "required" => Some(None),
        Some(Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(
                    "tool_choice.type: must be \"function\" (or tool_choice one of \"none\", \"auto\", \"required\")".into(),
                ));
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice.function.name: missing (a string naming one of `tools`)".into()))?;
            if !strict.contains_key(name) {
                return Err(bad(format!(
                    "tool_choice.function.name: no tool named {name:?} in `tools`"
                )));
            }
            Some(Some(name.to_string()))
        }
        Some(other) => {
            return Err(bad(format!(
                "tool_choice: expected \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {other}"
            )))
        }
    };
    if calls.is_some() && tools.is_none() {
        return Err(bad(
            "tool_choice: tool calls are required but `tools` is empty".into(),
        ));
    }
    let format = match body.get("response_format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(rf)) => {
            match rf.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some(Structured::JsonObject),
                Some("json_schema") => {
                    let js = rf.get("json_schema").ok_or_else(|| {
                    bad("response_format.json_schema: missing (an object with `name` and `schema`)".into())
                })?;
                    let schema = match js.get("schema") {
                        Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                        None | Some(Value::Null) => {
                            return Err(bad("response_format.json_schema.schema: missing".into()))
                        }
                        Some(_) => {
                            return Err(bad(
                                "response_format.json_schema.schema: must be a JSON Schema object"
                                    .into(),
                            ))
                        }
                    };
                    Some(Structured::JsonSchema(schema))
                }
                _ => return Err(bad(
                    "response_format.type: must be \"text\", \"json_object\" or \"json_schema\""
                        .into(),
                )),
            }
        }
        Some(_) => return Err(bad("response_format: must be an object".into())),
    };
    Ok(match (calls, format) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "tool_choice requires tool calls and response_format requires a JSON answer: ask for one of them".into(),
            ))
        }
        (Some(only), None) => Structured::Calls { only },
        (None, Some(f)) => f,
        (None, None) if strict.values().any(|&s| s) => Structured::StrictCalls,
        (None, None) => Structured::Free,
    })
}

/// `cache_salt`: a non-empty string of at most 256 bytes.
fn cache_salt(body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match body.get("cache_salt") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid_request(
            "'cache_salt' must be a non-empty string of at most 256 bytes.",
        )),
    }
}

/// Chat `logprobs` (bool) and `top_logprobs` (0..=20).
fn chat_logprobs(body: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let on = bool_field(body, "logprobs", false)?;
    let top = match integer(body, "top_logprobs")? {
        None => None,
        Some(n) if (0..=20).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid(
                "invalid_value",
                format!("top_logprobs must be an integer in [0, 20] (got {n})."),
            ))
        }
    };
    match (on, top) {
        (false, Some(_)) => Err(ApiError::invalid(
            "invalid_value",
            "top_logprobs needs logprobs: true.",
        )),
        (false, None) => Ok(None),
        (true, t) => Ok(Some(t.unwrap_or(0))),
    }
}

/// Legacy completions `logprobs` (0..=5 alternatives).
fn completion_logprobs(body: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    match body.get("logprobs") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(_)) => Err(ApiError::invalid_request(
            "'logprobs' of /v1/completions is an integer in [0, 5].",
        )),
        _ => match integer(body, "logprobs")? {
            Some(n) if (0..=5).contains(&n) => Ok(Some(n as usize)),
            n => Err(ApiError::invalid(
                "invalid_value",
                format!("logprobs must be an integer in [0, 5] (got {n:?})."),
            )),
        },
    }
}

pub fn parse_completion(
    body: &Map<String, Value>,
    served: &str,
    header_session: Option<String>,
) -> Result<CompletionRequest, ApiError> {
    check_model(body, served)?;
    let prompt = match body.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        Some(_) => {
            return Err(ApiError::invalid_request(
                "'prompt' must be a string (one prompt per request).",
            ))
        }
        None => {
            return Err(ApiError::invalid_request(
                "Missing required field 'prompt'.",
            ))
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid_request("'prompt' must not be empty."));
    }
    let ranges = sampling(body)?;
    let max_tokens = max_tokens(body)?;
    choices(body)?;
    let mut unsupported = common_unsupported(body);
    if body.get("echo") == Some(&Value::Bool(true)) {
        unsupported.push("echo");
    }
    if body
        .get("best_of")
        .and_then(Value::as_u64)
        .is_some_and(|n| n != 1)
    {
        unsupported.push("best_of");
    }
    if body.get("suffix").is_some_and(|v| !v.is_null()) {
        unsupported.push("suffix");
    }
    reject_unsupported(&unsupported)?;
    let logprobs = completion_logprobs(body)?;
    let session_id = session_id(body, header_session)?;
    Ok(CompletionRequest {
        common: Common::read(body, ranges, max_tokens, session_id, logprobs)?,
        prompt,
    })
}

impl Common {
    /// The shared fields: the ones already checked in the spec's order, and
    /// the rest read here.
    fn read(
        body: &Map<String, Value>,
        sampling: SamplerConfig,
        max_tokens: Option<usize>,
        session_id: Option<String>,
        logprobs: Option<usize>,
    ) -> Result<Common, ApiError> {
        Ok(Common {
            stream: bool_field(body, "stream", false)?,
            include_usage: include_usage(body)?,
            sampling,
            max_tokens,
            stop: stop(body)?,
            session_id,
            logprobs,
            cache_salt: cache_salt(body)?,
            ignore_eos: bool_field(body, "ignore_eos", false)?,
            return_progress: bool_field(body, "return_progress", false)?,
        })
    }
}

fn check_model(body: &Map<String, Value>, served: &str) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m == served => Ok(()),
        Some(Value::String(m)) => Err(ApiError::model_not_found(m, served)),
        Some(_) => Err(ApiError::invalid_request("'model' must be a string.")),
    }
}

fn number(body: &Map<String, Value>, field: &str) -> Result<Option<f64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::invalid_request(format!(
            "'{field}' must be a number."
        ))),
    }
}

fn integer(body: &Map<String, Value>, field: &str) -> Result<Option<i128>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i as i128))
            } else if let Some(u) = n.as_u64() {
                Ok(Some(u as i128))
            } else {
                Err(ApiError::invalid_request(format!(
                    "'{field}' must be an integer (got {n})."
                )))
            }
        }
        Some(_) => Err(ApiError::invalid_request(format!(
            "'{field}' must be an integer."
        ))),
    }
}

/// A number field within `[lo, hi]`, or None when absent.
fn number_in(
    body: &Map<String, Value>,
    field: &str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ApiError> {
    number_where(
        body,
        field,
        |x| (lo..=hi).contains(&x),
        &format!("between {lo} and {hi}"),
    )
}

/// A finite number for which `ok` holds, else 400 `{field} must be {rule}`.
fn number_where(
    body: &Map<String, Value>,
    field: &str,
    ok: impl Fn(f64) -> bool,
    rule: &str,
) -> Result<Option<f64>, ApiError> {
    match number(body, field)? {
        Some(x) if !(x.is_finite() && ok(x)) => Err(ApiError::invalid(
            "invalid_value",
            format!("{field} must be {rule} (got {x})."),
        )),
        x => Ok(x),
    }
}

/// A number in `(lo, hi]`, else 400 `{field} must be {rule}`.
fn number_above(
    body: &Map<String, Value>,
    field: &str,
    lo: f64,
    hi: f64,
    rule: &str,
) -> Result<Option<f64>, ApiError> {
    number_where(body, field, |x| x > lo && x <= hi, rule)
}

/// An integer in `lo..=hi`, else 400 naming the range.
fn integer_in(
    body: &Map<String, Value>,
    field: &str,
    lo: i128,
    hi: i128,
) -> Result<Option<i128>, ApiError> {
    match integer(body, field)? {
        Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid(
            "invalid_value",
            format!("{field} must be between {lo} and {hi} (got {x})."),
        )),
        x => Ok(x),
    }
}

/// temperature, top_p, top_k, min_p, the penalties and seed, with the spec's
/// ranges and defaults (greedy; top_p 1; top_k, min_p and penalties off;
/// random seed). Penalties follow llama.cpp (engine::sampler).
fn sampling(body: &Map<String, Value>) -> Result<SamplerConfig, ApiError> {
    let mut c = SamplerConfig::greedy();
    c.seed = 0;
    if let Some(t) = number_in(body, "temperature", 0.0, 2.0)? {
        c.temperature = t as f32;
    }
    if let Some(p) = number_above(body, "top_p", 0.0, 1.0, "between 0 (exclusive) and 1")? {
        c.top_p = p as f32;
    }
    if let Some(k) = integer_in(body, "top_k", 0, 2147483647)? {
        c.top_k = k as usize;
    }
    // OpenAI's `seed` is any 64-bit integer. The sampler's seed 0 means
    // "random", so a client's 0 takes the one word no other seed maps to
    // besides i64::MIN's (negative seeds are their two's-complement words).
    if let Some(s) = integer_in(body, "seed", i64::MIN as i128, i64::MAX as i128)? {
        c.seed = match s {
            0 => i64::MIN as u64,
            s => s as i64 as u64,
        };
    }
    if let Some(p) = number_in(body, "min_p", 0.0, 1.0)? {
        c.min_p = p as f32;
    }
    // OpenAI's range for both.
    if let Some(p) = number_in(body, "presence_penalty", -2.0, 2.0)? {
        c.presence_penalty = p as f32;
    }
    if let Some(p) = number_in(body, "frequency_penalty", -2.0, 2.0)? {
        c.frequency_penalty = p as f32;
    }
    if let Some(p) = number_above(body, "repeat_penalty", 0.0, 10.0, "above 0 and at most 10")? {
        c.repeat_penalty = p as f32;
    }
    if let Some(n) = integer_in(body, "repeat_last_n", 0, 1_000_000)? {
        c.repeat_last_n = n as usize;
    }
    Ok(c)
}

fn max_tokens(body: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let mut out = None;
    for field in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = integer(body, field)? {
            if n <= 0 {
                return Err(ApiError::invalid(
                    "invalid_value",
                    format!("{field} must be a positive integer (got {n})."),
                ));
            }
            // The latter wins.
            out = Some(n.min(usize::MAX as i128) as usize);
        }
    }
    Ok(out)
}

/// `n`, the number of choices: a positive integer (above 1 is refused as
/// unsupported, [`common_unsupported`]).
fn choices(body: &Map<String, Value>) -> Result<(), ApiError> {
    match integer(body, "n")? {
        Some(n) if n < 1 => Err(ApiError::invalid(
            "invalid_value",
            format!("n must be a positive integer (got {n})."),
        )),
        _ => Ok(()),
    }
}

/// Parameters both endpoints reject (§3.3), as message labels.
fn common_unsupported(body: &Map<String, Value>) -> Vec<&'static str> {
    let mut out = Vec::new();
    // One choice per request until batching exists.
    if body
        .get("n")
        .and_then(Value::as_f64)
        .is_some_and(|n| n != 1.0)
    {
        out.push("n>1");
    }
    match body.get("logit_bias") {
        Some(Value::Object(m)) if !m.is_empty() => out.push("logit_bias"),
        _ => {}
    }
    out
}

fn reject_unsupported(labels: &[&str]) -> Result<(), ApiError> {
    if labels.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        "unsupported_parameter",
        format!("Unsupported parameter(s): {}. {HONORED}", labels.join(", ")),
    ))
}

/// Body `session_id` first, then the affinity headers (§7).
fn session_id(
    body: &Map<String, Value>,
    header: Option<String>,
) -> Result<Option<String>, ApiError> {
    let id = match body.get("session_id") {
        None | Some(Value::Null) => header,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_session_id",
                "Invalid session_id: must be 1-128 characters",
            ))
        }
    };
    if let Some(id) = &id {
        validate_session_id(id)?;
    }
    Ok(id)
}

pub fn validate_session_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > 128 {
        return Err(ApiError::invalid(
            "invalid_session_id",
            "Invalid session_id: must be 1-128 characters",
        ));
    }
    if !id.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(ApiError::invalid(
            "invalid_session_id",
            "Invalid session_id: must be printable ASCII with no spaces",
        ));
    }
    Ok(())
}

/// A top-level boolean field (`default` when absent or null).
pub(crate) fn bool_field(
    body: &Map<String, Value>,
    name: &str,
    default: bool,
) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid_request(format!(
            "'{name}' must be a boolean."
        ))),
    }
}

fn include_usage(body: &Map<String, Value>) -> Result<bool, ApiError> {
    match body.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid_request(
                "'stream_options.include_usage' must be a boolean.",
            )),
        },
        Some(_) => Err(ApiError::invalid_request(
            "'stream_options' must be an object.",
        )),
    }
}

fn stop(body: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list = match body.get("stop") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid_request("'stop' must be a string or an array of strings.")
            })?,
        Some(_) => {
            return Err(ApiError::invalid_request(
                "'stop' must be a string or an array of strings.",
            ))
        }
    };
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Accepts `reasoning` as an alias of `reasoning_content` (§3.1) and flattens
/// text-only content part lists into strings; lists with image parts are
/// left to `crate::images`.
fn normalize_messages(messages: &[Value]) -> Result<Value, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let mut m = m.as_object().cloned().unwrap_or_default();
        if !m.contains_key("reasoning_content") {
            if let Some(r) = m.remove("reasoning") {
                m.insert("reasoning_content".into(), r);
            }
        }
        if let Some(Value::Array(parts)) = m.get("content") {
            if parts
                .iter()
                .any(|p| p.get("type").and_then(Value::as_str) == Some("image_url"))
            {
                // Image parts are checked and placed by crate::images.
                out.push(Value::Object(m));
                continue;
            }
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => match p.get("text") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid_request(format!(
                                "messages[{i}].content[{j}].text must be a string."
                            )))
                        }
                    },
                    _ => {
                        return Err(ApiError::invalid_request(format!(
                            "messages[{i}].content[{j}] must be a text part."
                        )))
                    }
                }
            }
            m.insert("content".into(), Value::String(text));
        }
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn errors_follow_the_spec_order_and_wording() {
        let e = parse_chat(&obj(json!({"model": "x", "messages": []})), "m", None).unwrap_err();
        assert_eq!(e.code, Some("model_not_found"));
        let e = parse_chat(
            &obj(json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 3})),
            "m",
            None,
        )
        .unwrap_err();
        assert_eq!(e.message, "temperature must be between 0 and 2 (got 3).");
        let e = parse_chat(
            &obj(
                json!({"messages": [{"role": "user", "content": "hi"}], "n": 2, "logprobs": true}),
            ),
            "m",
            None,
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("Unsupported parameter(s): n>1."),
            "{}",
            e.message
        );
        let e = parse_chat(
            &obj(json!({"messages": [{"role": "user", "content": "hi"}]})),
            "m",
            Some("a b".into()),
        )
        .unwrap_err();
        assert_eq!(e.code, Some("invalid_session_id"));
        let e = parse_chat(&obj(json!({"model": "m"})), "m", None).unwrap_err();
        assert!(e.message.contains("messages"));
    }

    #[test]
    fn structured_output_and_logprobs_are_parsed_with_named_errors() {
        let tools = json!([{"type": "function", "function": {"name": "f", "strict": true,
                            "parameters": {"type": "object"}}},
                           {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}]);
        let chat = |extra: Value| {
            let mut b = obj(json!({"messages": [{"role": "user", "content": "hi"}]}));
            for (k, v) in extra.as_object().unwrap() {
                b.insert(k.clone(), v.clone());
            }
            parse_chat(&b, "m", None)
        };
        let r = chat(
            json!({"tools": tools, "tool_choice": "required", "logprobs": true, "top_logprobs": 3}),
        )
        .unwrap();
        assert_eq!(r.structured, Structured::Calls { only: None });
        assert_eq!(r.common.logprobs, Some(3));
        assert_eq!(r.strict.get("f"), Some(&true));
        assert_eq!(r.strict.get("g"), Some(&false));
        let r = chat(json!({"tools": tools})).unwrap();
        assert_eq!(r.structured, Structured::StrictCalls);
        let r = chat(
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}),
        )
        .unwrap();
        assert_eq!(
            r.structured,
            Structured::Calls {
                only: Some("g".into())
            }
        );
        let r = chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}})).unwrap();
        assert_eq!(
            r.structured,
            Structured::JsonSchema(json!({"type": "object"}))
        );
        let e = chat(
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "h"}}}),
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("tool_choice.function.name: no tool named \"h\""),
            "{}",
            e.message
        );
        let e = chat(json!({"tool_choice": "required"})).unwrap_err();
        assert!(e.message.contains("`tools` is empty"), "{}", e.message);
        let e =
            chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}))
                .unwrap_err();
        assert_eq!(e.message, "response_format.json_schema.schema: missing");
        let e = chat(json!({"response_format": {"type": "yaml"}})).unwrap_err();
        assert!(
            e.message.starts_with("response_format.type"),
            "{}",
            e.message
        );
        let e = chat(json!({"top_logprobs": 2})).unwrap_err();
        assert_eq!(e.message, "top_logprobs needs logprobs: true.");
        let e = chat(json!({"logprobs": true, "top_logprobs": 21})).unwrap_err();
        assert!(
            e.message.starts_with("top_logprobs must be"),
            "{}",
            e.message
        );
        let r = parse_completion(&obj(json!({"prompt": "p", "logprobs": 2})), "m", None).unwrap();
        assert_eq!(r.common.logprobs, Some(2));
        assert!(parse_completion(&obj(json!({"prompt": "p", "logprobs": 9})), "m", None).is_err());
    }

    #[test]
    fn sampling_parameters_reach_the_sampler_config() {
        let r = parse_completion(
            &obj(json!({"prompt": "p", "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -1,
                        "repeat_penalty": 1.2, "repeat_last_n": 16, "seed": 9, "n": 1})),
            "m",
            None,
        )
        .unwrap();
        let c = r.common.sampling;
        assert_eq!(
            (
                c.min_p,
                c.presence_penalty,
                c.frequency_penalty,
                c.repeat_penalty
            ),
            (0.1, 0.5, -1.0, 1.2)
        );
        assert_eq!((c.repeat_last_n, c.seed), (16, 9));
        assert!(c.validate().is_ok());
        for (field, value, want) in [
            ("min_p", json!(2), "min_p must be between 0 and 1 (got 2)."),
            (
                "presence_penalty",
                json!(-2.5),
                "presence_penalty must be between -2 and 2 (got -2.5).",
            ),
            (
                "repeat_penalty",
                json!(0),
                "repeat_penalty must be above 0 and at most 10 (got 0).",
            ),
            (
                "repeat_last_n",
                json!(1.5),
                "'repeat_last_n' must be an integer (got 1.5).",
            ),
            ("n", json!(0), "n must be a positive integer (got 0)."),
        ] {
            let mut body = obj(json!({"prompt": "p"}));
            body.insert(field.into(), value);
            let e = parse_completion(&body, "m", None).unwrap_err();
            assert_eq!(e.message, want, "{field}");
        }
    }

    #[test]
    fn string_arguments_and_reasoning_alias_are_normalized() {
        let r = parse_chat(
            &obj(json!({"messages": [{"role": "assistant", "reasoning": "r", "content": [{"type": "text", "text": "a"}],
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}],
                "max_tokens": 5, "max_completion_tokens": 7, "stop": ["", "END"]})),
            "m",
            None,
        )
        .unwrap();
        let m = &r.messages[0];
        assert_eq!(m["reasoning_content"], "r");
        assert_eq!(m["content"], "a");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(r.common.max_tokens, Some(7));
        assert_eq!(r.common.stop, vec!["END".to_string()]);
    }
}
