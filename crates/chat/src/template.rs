//! Jinja chat templates, rendered the way Hugging Face transformers renders them.
//!
//! The template comes from GGUF `tokenizer.chat_template` (or a
//! `chat_template.jinja` file) and runs on minijinja, set up to behave like
//! transformers' `apply_chat_template(tokenize=False)` (transformers 5.x,
//! `utils/chat_template_utils.py`):
//! - jinja2 `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`
//!   with `loopcontrols`; no autoescape; one trailing newline of the source dropped;
//! - `tojson` is `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//!   sort_keys=False)`; `raise_exception(msg)`; `strftime_now(fmt)` (local time);
//! - values print as Python prints them (`True`, `None`, `1.0`, `['a']`), and
//!   Python's string methods work (`.strip()`, `.split()`, `.startswith()`...);
//! - the inputs are prepared as `apply_chat_template` prepares them: keys whose
//!   value is null are dropped from each message; a message's reasoning
//!   (`reasoning_content`, `thinking` or `reasoning`) is offered under both
//!   `reasoning_content` and `thinking`; `bos_token`/`eos_token` are variables
//!   that caller kwargs may override; `documents` is None.
//!
//! Messages are passed as given. In particular an assistant's
//! `tool_calls[].function.arguments` stays whatever the caller sent: Qwen2.5's
//! template writes `arguments | tojson`, so an OpenAI-style JSON *string* is
//! rendered as a quoted string, exactly as transformers does. Servers that take
//! OpenAI requests should call [`decode_tool_call_arguments`] first (as vLLM does).
//!
//! hearth is stricter in one place: a role outside [`KNOWN_ROLES`] is an error
//! (transformers leaves roles to the template).
//!
//! Checked byte for byte against transformers by tests/template_fixtures.rs
//! (fixtures from scripts/fixtures/make_template_fixtures.py). Known gaps, none used by
//! the packaged models' templates: Python `%` string formatting (`'%s' % x`;
//! the `format` filter and `.format()` work), and tuples, which minijinja does
//! not have (`dictsort`/`items` results print as lists when printed whole).

mod python;

use std::path::Path;

use hearth_gguf::GgufFile;
use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior, Value};
use serde_json::{Map, Value as Json};

use python::{json_dumps, py_str, py_strip, JsonOptions};

/// Roles a message may have: OpenAI's, plus `ipython` (Llama 3.x tool results)
/// and the legacy `function`. Anything else is most likely a typo.
pub const KNOWN_ROLES: [&str; 7] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "ipython",
    "function",
];

/// Template variables the renderer sets itself; kwargs may not replace them
/// (transformers raises "got multiple values for keyword argument").
const RESERVED_KWARGS: [&str; 3] = ["messages", "tools", "add_generation_prompt"];

/// Templates for architectures whose GGUFs may ship without one.
const BUILTIN_TEMPLATES: [(&str, &str); 1] = [("gemma3", include_str!("template/gemma3.jinja"))];

const DEFAULT_NAME: &str = "chat_template";
const TOOL_USE_NAME: &str = "chat_template.tool_use";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template does not parse.
    #[error("chat template syntax error at line {line}: {message}")]
    Syntax { line: usize, message: String },
    /// The template called `raise_exception(message)`: it rejects the conversation.
    #[error("chat template rejected the conversation: {message}")]
    Raised { message: String },
    /// Rendering failed otherwise (a type error, an undefined attribute...).
    #[error("chat template failed{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Render {
        line: Option<usize>,
        message: String,
    },
    /// A message has a role outside [`KNOWN_ROLES`].
    #[error("message {index} has unknown role '{role}' (expected one of: {})", KNOWN_ROLES.join(", "))]
    UnknownRole { index: usize, role: String },
    /// The messages, tools or kwargs are not shaped as the renderer needs.
    #[error("{0}")]
    BadInput(String),
    /// A GGUF has no `tokenizer.chat_template` and hearth has none for its architecture.
    #[error("{path} has no tokenizer.chat_template and hearth has no built-in template for architecture '{arch}'")]
    Missing { path: String, arch: String },
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// A compiled chat template plus the special tokens it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// A `tool_use` variant (GGUF `tokenizer.chat_template.tool_use`) is
    /// loaded; transformers picks it whenever tools are passed.
    has_tool_use: bool,
    /// The default template's text, as given.
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("has_tool_use", &self.has_tool_use)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `src`. `bos`/`eos` are what the template sees as `bos_token`/`eos_token`.
    pub fn from_source(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = new_environment();
        add_template(&mut env, DEFAULT_NAME, src)?;
        Ok(ChatTemplate {
            env,
            has_tool_use: false,
            source: src.to_string(),
            bos_token: bos.into(),
            eos_token: eos.into(),
        })
    }

    /// Reads a `chat_template.jinja` file.
    pub fn from_file(
        path: impl AsRef<Path>,
        bos: &str,
        eos: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|source| TemplateError::Io {
            path: path.display().to_string(),
            source,
        })?;
        ChatTemplate::from_source(&src, bos, eos)
    }

    /// The GGUF's `tokenizer.chat_template` (and `tokenizer.chat_template.tool_use`
    /// if present), with `bos_token`/`eos_token` taken from its vocabulary. A GGUF
    /// without a template gets hearth's built-in one for its architecture, if any.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, TemplateError> {
        let meta = file.metadata();
        let (bos, eos) = gguf_special_tokens(file);
        let arch = file.architecture().unwrap_or("");
        let src = match meta.get_str("tokenizer.chat_template") {
            Some(src) => src,
            None => builtin_template(arch).ok_or_else(|| TemplateError::Missing {
                path: file.path().display().to_string(),
                arch: arch.to_string(),
            })?,
        };
        let mut template = ChatTemplate::from_source(src, &bos, &eos)?;
        if let Some(tool_use) = meta.get_str("tokenizer.chat_template.tool_use") {
            template = template.with_tool_use(tool_use)?;
        }
        Ok(template)
    }

    /// Adds a variant used whenever `tools` is passed (transformers' rule for a
    /// tokenizer with named templates `default` and `tool_use`).
    pub fn with_tool_use(mut self, src: &str) -> Result<ChatTemplate, TemplateError> {
        add_template(&mut self.env, TOOL_USE_NAME, src)?;
        self.has_tool_use = true;
        Ok(self)
    }

    /// The default template's source (for format detection).
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders a conversation into a prompt.
    ///
    /// - `messages`: a non-empty array of message objects (`role`, `content`,
    ///   `tool_calls`, `tool_call_id`, `reasoning_content`, ...), passed as given;
    /// - `tools`: an array of OpenAI function schemas, or None (the template
    ///   sees `tools` as None, as in transformers);
    /// - `kwargs`: extra top-level variables (`chat_template_kwargs`), which
    ///   also override `bos_token`/`eos_token`.
    pub fn render(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        kwargs: &Map<String, Json>,
    ) -> Result<String, TemplateError> {
        let messages = prepare_messages(messages)?;
        let tools = match tools {
            None | Some(Json::Null) => Json::Null,
            Some(Json::Array(list)) => {
                if let Some(i) = list.iter().position(|t| !t.is_object()) {
                    return Err(TemplateError::BadInput(format!(
                        "tools[{i}] is not an object: tools must be a list of JSON schemas"
                    )));
                }
                Json::Array(list.clone())
            }
            Some(_) => {
                return Err(TemplateError::BadInput(
                    "tools must be a list of JSON schemas".into(),
                ))
            }
        };
        let mut ctx = Map::new();
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        ctx.insert("documents".into(), Json::Null);
        for (k, v) in kwargs {
            if RESERVED_KWARGS.contains(&k.as_str()) {
                return Err(TemplateError::BadInput(format!(
                    "kwarg '{k}' is set by the renderer itself and cannot be passed as a template variable"
                )));
            }
            ctx.insert(k.clone(), v.clone());
        }
        let name = if self.has_tool_use && !tools.is_null() {
            TOOL_USE_NAME
        } else {
            DEFAULT_NAME
        };
        ctx.insert("messages".into(), messages);
        ctx.insert("tools".into(), tools);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );

        // llama.cpp (common/chat.cpp, jinja::caps_apply_reasoning_effort): a
        // request's reasoning effort is also the template's `reasoning_strength`
        // (Muse Glimmer's name for it), unless the caller set that too.
        if let Some(Json::String(effort)) = ctx.get("reasoning_effort").cloned() {
            if !effort.is_empty() && !ctx.contains_key("reasoning_strength") {
                ctx.insert("reasoning_strength".into(), Json::String(effort));
            }
        }

        let template = self.env.get_template(name).map_err(render_error)?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(render_error)
    }

    /// Makes `strftime_now` format this fixed local time instead of the
    /// clock (reproducible renders: tests, fixtures).
    pub fn with_fixed_time(mut self, now: chrono::NaiveDateTime) -> ChatTemplate {
        self.env.add_function(
            "strftime_now",
            move |format: String| -> Result<String, Error> { format_time(&now, &format) },
        );
        self
    }
}

/// Turns messages as llama.cpp's OpenAI-compatible server holds them into what
/// its templates see (common/chat.cpp `to_json_oaicompat`): content given as
/// parts that include a media marker (`{"type": "media_marker", "text":
/// "<__media__>"}`, where an image or audio goes) becomes one string, text
/// parts joined by newlines except next to a marker; tool-call arguments given
/// as JSON strings become objects ([`decode_tool_call_arguments`]).
pub fn llama_cpp_messages(messages: &Json) -> Json {
    let mut messages = decode_tool_call_arguments(messages);
    for m in messages.as_array_mut().into_iter().flatten() {
        let Some(Json::Array(parts)) = m.get("content") else {
            continue;
        };
        if !parts
            .iter()
            .any(|p| p.get("type").and_then(Json::as_str) == Some("media_marker"))
        {
            continue;
        }
        let mut text = String::new();
        let mut last_was_marker = false;
        for p in parts {
            let s = p.get("text").and_then(Json::as_str).unwrap_or("");
            match p.get("type").and_then(Json::as_str) {
                Some("text") => {
                    if !last_was_marker && !text.is_empty() {
                        text.push('\n');
                    }
                    last_was_marker = false;
                }
                Some("media_marker") => last_was_marker = true,
                _ => continue,
            }
            text.push_str(s);
        }
        m["content"] = Json::String(text);
    }
    messages
}

/// The BOS and EOS token strings of a GGUF's vocabulary (empty when unset),
/// which templates see as `bos_token` and `eos_token`.
pub fn gguf_special_tokens(file: &GgufFile) -> (String, String) {
    let meta = file.metadata();
    let tokens = meta.get_array("tokenizer.ggml.tokens");
    let token = |key: &str| -> String {
        match (meta.get_u64(key), tokens) {
            (Some(id), Some(tokens)) => tokens
                .get(id as usize)
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        }
    };
    (
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    )
}

/// hearth's template for an architecture whose GGUFs may lack one.
pub fn builtin_template(arch: &str) -> Option<&'static str> {
    BUILTIN_TEMPLATES
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(_, src)| *src)
}

/// Returns `messages` with every assistant `tool_calls[].function.arguments`
/// that is a string holding a JSON object replaced by that object.
///
/// OpenAI clients send arguments as a JSON string, but Hugging Face templates
/// expect an object (Qwen2.5 writes `arguments | tojson`, which would quote the
/// string again). vLLM and llama.cpp decode them before rendering; so should a
/// server. Strings that are not a JSON object are left alone.
pub fn decode_tool_call_arguments(messages: &Json) -> Json {
    let mut messages = messages.clone();
    for message in messages.as_array_mut().into_iter().flatten() {
        let Some(calls) = message.get_mut("tool_calls").and_then(Json::as_array_mut) else {
            continue;
        };
        for call in calls {
            let target = match call.get_mut("function") {
                Some(f) if f.is_object() => f,
                _ => call,
            };
            if let Some(args) = target.get_mut("arguments") {
                if let Some(Ok(obj @ Json::Object(_))) =
                    args.as_str().map(serde_json::from_str::<Json>)
                {
                    *args = obj;
                }
            }
        }
    }
    messages
}

/// Checks the conversation and prepares it as transformers does: null-valued
/// keys dropped (`_normalize_chat_messages`), reasoning aliased
/// (`_alias_reasoning_fields`).
fn prepare_messages(messages: &Json) -> Result<Json, TemplateError> {
    let list = messages.as_array().ok_or_else(|| {
        TemplateError::BadInput("messages must be a JSON array of message objects".into())
    })?;
    if list.is_empty() {
        return Err(TemplateError::BadInput(
            "cannot render an empty conversation".into(),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (index, message) in list.iter().enumerate() {
        let obj = message.as_object().ok_or_else(|| {
            TemplateError::BadInput(format!("message {index} is not a JSON object"))
        })?;
        let obj: Map<String, Json> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match obj.get("role") {
            Some(Json::String(role)) if KNOWN_ROLES.contains(&role.as_str()) => {}
            Some(Json::String(role)) => {
                return Err(TemplateError::UnknownRole {
                    index,
                    role: role.clone(),
                })
            }
            Some(_) => {
                return Err(TemplateError::BadInput(format!(
                    "message {index} has a role that is not a string"
                )))
            }
            None => {
                return Err(TemplateError::BadInput(format!(
                    "message {index} has no role"
                )))
            }
        }
        out.push(Json::Object(alias_reasoning(obj)));
    }
    Ok(Json::Array(out))
}

/// Names a message's reasoning goes by; templates read the first (most) or `thinking` (gpt-oss).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// `{"thinking": r, **message, "reasoning_content": r}`, with Python's dict
/// order: `thinking` first unless the message has it, `reasoning_content` last
/// unless the message has it.
fn alias_reasoning(message: Map<String, Json>) -> Map<String, Json> {
    let Some(reasoning) = REASONING_FIELDS
        .iter()
        .find_map(|k| message.get(*k))
        .cloned()
    else {
        return message;
    };
    let mut out = Map::new();
    out.insert("thinking".into(), reasoning.clone());
    out.extend(message);
    out.insert("reasoning_content".into(), reasoning);
    out
}

/// Most template instructions one render may execute: a template comes from
/// the model file, and one that loops without end (found by fuzzing:
/// nested `range` loops) must fail rather than hang the server. Real chat
/// templates use a few thousand per message.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(|out, _state, value| {
        out.write_str(&py_str(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "write failed"))
    });
    env.set_unknown_method_callback(python_method);
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: Value| py_str(&v));
    env.add_filter("trim", |s: String, chars: Option<String>| {
        py_strip(&s, chars.as_deref(), true, true).to_string()
    });
    env.add_filter("join", join);
    env.add_filter("escape", html_escape);
    env.add_filter("e", html_escape);
    // jinja2's tests follow Python's types: a bool is a number, a str or dict
    // is a sequence, None is not iterable but Undefined is.
    env.add_test("number", |v: Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    let sequence = |k: ValueKind| {
        matches!(
            k,
            ValueKind::String
                | ValueKind::Bytes
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Undefined
        )
    };
    env.add_test("sequence", move |v: Value| sequence(v.kind()));
    env.add_test("iterable", move |v: Value| {
        sequence(v.kind()) || v.kind() == ValueKind::Iterable
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// Compiles one template. jinja2 reads `\r\n` and `\r` as `\n` in the template
/// text; transformers' `{% generation %}` block (assistant-mask tracking) only
/// wraps output, so it becomes an always-true `if`.
fn add_template(
    env: &mut Environment<'static>,
    name: &'static str,
    src: &str,
) -> Result<(), TemplateError> {
    env.add_template_owned(name, normalize_source(src))
        .map_err(|e| TemplateError::Syntax {
            line: e.line().unwrap_or(0),
            message: e
                .detail()
                .map(str::to_string)
                .unwrap_or_else(|| e.kind().to_string()),
        })
}

fn normalize_source(src: &str) -> String {
    let src = src.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = String::with_capacity(src.len());
    let mut rest = src.as_str();
    // Rewrite `{%[-+]? (end)?generation [-+]?%}` tags in place, keeping the
    // whitespace-control markers.
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap).
        let Some(end) = tag[2..].find("%}").map(|p| p + 2) else {
            break;
        };
        let inner = tag[2..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let replacement = match inner {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let open = if tag[2..].starts_with(['-', '+']) {
                    &tag[..3]
                } else {
                    "{%"
                };
                let close = if tag[..end].ends_with(['-', '+']) {
                    &tag[end - 1..end + 2]
                } else {
                    "%}"
                };
                out.push_str(&format!("{open} {r} {close}"));
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The error `raise_exception` raises, found again through the error's source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = py_str(&message);
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    )
    .with_source(Raised(message)))
}

fn strftime_now(format: String) -> Result<String, Error> {
    format_time(&chrono::Local::now().naive_local(), &format)
}

fn format_time(now: &chrono::NaiveDateTime, format: &str) -> Result<String, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", now.format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format '{format}'"),
        )
    })?;
    Ok(out)
}

/// jinja2's `join(d='', attribute=None)`, items printed with `str()`.
fn join(value: Value, sep: Option<String>, kwargs: Kwargs) -> Result<String, Error> {
    let attribute: Option<String> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(sep.as_deref().unwrap_or(""));
        }
        let item = match &attribute {
            Some(path) => attribute_path(&item, path)?,
            None => item,
        };
        out.push_str(&py_str(&item));
    }
    Ok(out)
}

/// jinja2's `make_attrgetter`: a dotted path whose integer parts index.
fn attribute_path(value: &Value, path: &str) -> Result<Value, Error> {
    let mut v = value.clone();
    for part in path.split('.') {
        v = match part.parse::<usize>() {
            Ok(i) => v.get_item_by_index(i)?,
            Err(_) => v.get_attr(part)?,
        };
    }
    Ok(v)
}

/// markupsafe's `escape`: `& < > ' "` only (minijinja also escapes `/`).
fn html_escape(value: Value) -> Value {
    if value.is_safe() {
        return value;
    }
    let text = py_str(&value);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    Value::from_safe_string(out)
}

fn tojson(value: Value, args: Rest<Value>) -> Result<String, Error> {
    json_dumps(&value, &JsonOptions::from_args(&args)?)
}

/// Python methods on values (`s.strip()`, `d.items()`...): minijinja-contrib's
/// pycompat, with `strip`/`lstrip`/`rstrip` using Python's whitespace.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), "strip" | "lstrip" | "rstrip") = (value.as_str(), method) {
        let chars = match args {
            [] => None,
            [c] if c.is_none() => None,
            [c] => Some(c.as_str().ok_or_else(|| {
                Error::new(ErrorKind::InvalidOperation, "strip arg must be None or str")
            })?),
            _ => {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    format!("{method} takes at most 1 argument"),
                ))
            }
        };
        return Ok(Value::from(py_strip(
            s,
            chars,
            method != "rstrip",
            method != "lstrip",
        )));
    }
    if value.kind() == ValueKind::Undefined {
        return Err(Error::new(
            ErrorKind::UndefinedError,
            format!("cannot call .{method}() on an undefined value"),
        ));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

fn render_error(e: Error) -> TemplateError {
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<Raised>() {
            return TemplateError::Raised {
                message: raised.0.clone(),
            };
        }
        source = s.source();
    }
    TemplateError::Render {
        line: e.line(),
        message: e
            .detail()
            .map(str::to_string)
            .unwrap_or_else(|| e.kind().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: Json) -> Result<String, TemplateError> {
        ChatTemplate::from_source(src, "<s>", "</s>")?.render(&messages, None, false, &Map::new())
    }

    #[test]
    fn syntax_error_names_the_line() {
        let err = ChatTemplate::from_source("ok\n{% if x %}\nno end", "", "").unwrap_err();
        match err {
            TemplateError::Syntax { line, .. } => assert!(line >= 2, "line {line}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn raise_exception_carries_the_message() {
        let err = render(
            "{{ raise_exception('no ' + messages[0].role) }}",
            json!([{"role": "user"}]),
        )
        .unwrap_err();
        assert!(
            matches!(&err, TemplateError::Raised { message } if message == "no user"),
            "{err}"
        );
    }

    #[test]
    fn unknown_role_is_an_error() {
        let err = render(
            "x",
            json!([{"role": "user"}, {"role": "assitant", "content": ""}]),
        )
        .unwrap_err();
        assert!(
            matches!(&err, TemplateError::UnknownRole { index: 1, role } if role == "assitant"),
            "{err}"
        );
    }

    #[test]
    fn prints_values_as_python() {
        let out = render(
            "{{ true }} {{ none }} {{ 1.0 }} {{ messages[0].x }} {{ messages[0].x | string }} {{ [1, 'a'] }}",
            json!([{"role": "user", "x": {"a": [true, null, 2.5]}}]),
        )
        .unwrap();
        assert_eq!(
            out,
            "True None 1.0 {'a': [True, None, 2.5]} {'a': [True, None, 2.5]} [1, 'a']"
        );
    }

    #[test]
    fn python_string_methods() {
        let out = render(
            "{{ ' a b '.strip() }}|{{ 'x,y'.split(',') | join('+') }}|{{ 'abc'.startswith('ab') }}|{{ messages[0].items() | list | length }}",
            json!([{"role": "user", "content": "c"}]),
        )
        .unwrap();
        assert_eq!(out, "a b|x+y|True|2");
    }

    #[test]
    fn strftime_now_formats_local_time() {
        let out = render("{{ strftime_now('%Y') }}", json!([{"role": "user"}])).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.starts_with("20"), "{out}");
    }

    #[test]
    fn kwargs_override_special_tokens_and_reserved_names_are_refused() {
        let t = ChatTemplate::from_source("{{ bos_token }}{{ flavor }}", "<s>", "</s>").unwrap();
        let msgs = json!([{"role": "user"}]);
        let mut kw = Map::new();
        kw.insert("flavor".into(), json!("-x"));
        assert_eq!(t.render(&msgs, None, false, &kw).unwrap(), "<s>-x");
        kw.insert("bos_token".into(), json!("B"));
        assert_eq!(t.render(&msgs, None, false, &kw).unwrap(), "B-x");
        kw.insert("messages".into(), json!([]));
        assert!(matches!(
            t.render(&msgs, None, false, &kw),
            Err(TemplateError::BadInput(_))
        ));
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}";
        assert_eq!(
            render(src, json!([{"role": "user", "content": "a"}])).unwrap(),
            "[a]"
        );
    }

    #[test]
    fn overlapping_block_delimiters_are_a_syntax_error() {
        // Found by fuzzing (fuzz/chat_template): `{%}` made the tag rewriter
        // slice backwards and panic.
        for src in ["{%}", "a {%} b %}", "{%}} for x in y %}{{ x }}{% endfor %}"] {
            let err = ChatTemplate::from_source(src, "", "").unwrap_err();
            assert!(matches!(err, TemplateError::Syntax { .. }), "{src}: {err}");
        }
        // Whitespace control on rewritten tags survives: `-` strips, `+` keeps.
        assert_eq!(
            render(
                "{%- generation -%} x {%+ endgeneration +%}",
                json!([{"role": "user"}])
            )
            .unwrap(),
            "x "
        );
    }

    #[test]
    fn reasoning_is_offered_under_both_names() {
        let src = "{{ messages[0].thinking }}/{{ messages[0].reasoning_content }}/{{ messages[0] | list | join(',') }}";
        let out = render(
            src,
            json!([{"role": "assistant", "reasoning": "r", "content": "c"}]),
        )
        .unwrap();
        assert_eq!(out, "r/r/thinking,role,reasoning,content,reasoning_content");
    }

    #[test]
    fn templates_can_be_shared_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<ChatTemplate>();
    }

    #[test]
    fn decodes_string_arguments() {
        let msgs = json!([{"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
            {"type": "function", "function": {"name": "g", "arguments": "not json"}}]}]);
        let out = decode_tool_call_arguments(&msgs);
        assert_eq!(
            out[0]["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1})
        );
        assert_eq!(
            out[0]["tool_calls"][1]["function"]["arguments"],
            json!("not json")
        );
    }
}
