//! Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/version`), as the `ollama` clients, Continue, Zed, Open
//! WebUI and many scripts speak it: `/api/chat` and `/api/generate` are a
//! translation onto the chat completions request (the same validation,
//! rendering, KV reuse, structured output and tool-call parsing), answered
//! as Ollama answers: NDJSON lines when streamed (Ollama's default), one
//! object otherwise, with `done_reason`, the token counts and the durations
//! in nanoseconds. Errors are Ollama's `{"error": "..."}`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use futures_util::stream::{self, StreamExt};
use hearth_chat::parser::{ChatEvent, OutputParser};
use hearth_engine::scheduler::{Event, Summary};
use hearth_engine::turn::FinishReason;
use serde_json::{json, Map, Value};

use crate::chat::{collect, hint, start_chat, Started};
use crate::error::ApiError;
use crate::hub::LoadTime;
use crate::routes::AppState;

/// What `/api/tags`, `/api/show` and `/api/ps` say of the served model.
#[derive(Clone, Debug, Default)]
pub struct ModelCard {
    /// The GGUF file's size in bytes.
    pub size: u64,
    /// sha256 of the file's header (hearth's model fingerprint), hex.
    pub digest: String,
    pub family: String,
    /// "494.03M", "1.54B".
    pub parameter_size: String,
    /// llama.cpp's file-type name (`general.file_type`): "Q4_K_M", …
    pub quantization_level: String,
    /// The trained context (`{arch}.context_length`).
    pub context_length: u64,
    /// The GGUF's scalar metadata (Ollama's `model_info`).
    pub model_info: Map<String, Value>,
    pub template: String,
    pub vision: bool,
    /// When the model was loaded (RFC 3339).
    pub loaded_at: String,
}

impl ModelCard {
    pub fn from_gguf(file: &hearth_gguf::GgufFile, fingerprint: &[u8; 32], vision: bool) -> Self {
        use hearth_gguf::Value as V;
        let md = file.metadata();
        let family = md
            .get_str("general.architecture")
            .unwrap_or("unknown")
            .to_string();
        let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
        let parameter_size = if params >= 1_000_000_000 {
            format!("{:.2}B", params as f64 / 1e9)
        } else {
            format!("{:.2}M", params as f64 / 1e6)
        };
        let mut model_info = Map::new();
        for (k, v) in md.iter() {
            let j = match v {
                V::U8(x) => json!(x),
                V::I8(x) => json!(x),
                V::U16(x) => json!(x),
                V::I16(x) => json!(x),
                V::U32(x) => json!(x),
                V::I32(x) => json!(x),
                V::U64(x) => json!(x),
                V::I64(x) => json!(x),
                V::F32(x) => json!(x),
                V::F64(x) => json!(x),
                V::Bool(x) => json!(x),
                V::String(s) if k != "tokenizer.chat_template" => json!(s),
                // Vocabularies and merges: Ollama's `model_info` leaves them
                // out unless asked for `verbose`.
                _ => continue,
            };
            model_info.insert(k.to_string(), j);
        }
        ModelCard {
            size: file.raw_bytes().len() as u64,
            digest: fingerprint.iter().map(|b| format!("{b:02x}")).collect(),
            context_length: md.get_u64(&format!("{family}.context_length")).unwrap_or(0),
            quantization_level: md
                .get_u64("general.file_type")
                .map(file_type_name)
                .unwrap_or("unknown")
                .to_string(),
            family,
            parameter_size,
            model_info,
            template: md
                .get_str("tokenizer.chat_template")
                .unwrap_or_default()
                .to_string(),
            vision,
            loaded_at: rfc3339(SystemTime::now()),
        }
    }
}

/// llama.cpp's `llama_ftype` names.
fn file_type_name(t: u64) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => "unknown",
    }
}

/// RFC 3339 UTC with nanoseconds, as Ollama writes `created_at`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

fn bad(path: impl std::fmt::Display, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(format!("{path}: {what}"))
}

/// An `/api/chat` body as a chat completions body (the typed request in
/// [`crate::api::ollama`]).
fn translate_chat(
    body: &Map<String, Value>,
    _app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    crate::api::ollama::chat_body(body).map(Some)
}

/// An `/api/generate` body (not `raw`) as a chat completions body.
fn translate_generate(
    body: &Map<String, Value>,
    _app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    crate::api::ollama::generate_body(body).map(Some)
}

/// The answer as it is built from the parser's events.
struct Writer {
    model: String,
    parser: Box<dyn OutputParser + Send>,
    reasoning: bool,
    /// `/api/generate` (`response`) or `/api/chat` (`message`).
    generate: bool,
    started: Instant,
    /// The model's load, when this request waited for it.
    load: Duration,
    /// When the first output arrived (the prompt's prefill ended).
    first: Option<Instant>,
    prompt_tokens: usize,
    cached_tokens: usize,
    content: String,
    thinking: String,
    calls: Vec<Value>,
}

impl Writer {
    /// The text and thinking the events carry; complete calls are kept.
    fn take(&mut self, events: Vec<ChatEvent>) -> (String, String) {
        let (mut text, mut think) = (String::new(), String::new());
        for e in events {
            match e {
                ChatEvent::Content(t) => text.push_str(&t),
                ChatEvent::Reasoning(t) if self.reasoning => think.push_str(&t),
                ChatEvent::ToolCall {
                    name, arguments, ..
                } => self
                    .calls
                    .push(json!({"function": {"index": self.calls.len(),
                    "name": name, "arguments": arguments}})),
                _ => {}
            }
        }
        self.content.push_str(&text);
        self.thinking.push_str(&think);
        (text, think)
    }

    fn line(&self, text: &str, think: &str, calls: &[Value]) -> Value {
        let created_at = rfc3339(SystemTime::now());
        if self.generate {
            let mut v = json!({"model": self.model, "created_at": created_at, "response": text, "done": false});
            if !think.is_empty() {
                v["thinking"] = json!(think);
            }
            return v;
        }
        let mut message = json!({"role": "assistant", "content": text});
        if !think.is_empty() {
            message["thinking"] = json!(think);
        }
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls);
        }
        json!({"model": self.model, "created_at": created_at, "message": message, "done": false})
    }

    /// The last line (or the whole answer): `done`, the reason, the counts
    /// and the durations.
    fn done(&self, mut v: Value, s: &Summary) -> Value {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let ns = |d: Duration| d.as_nanos() as u64;
        v["done"] = json!(true);
        v["done_reason"] = json!(match s.finish {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::Cancelled => "length",
        });
        v["total_duration"] = json!(ns(now - self.started + self.load));
        v["load_duration"] = json!(ns(self.load));
        v["prompt_eval_count"] = json!(self.prompt_tokens.saturating_sub(self.cached_tokens));
        v["prompt_eval_duration"] = json!(ns(first - self.started));
        v["eval_count"] = json!(s.completion_tokens);
        v["eval_duration"] = json!(ns(now - first));
        v
    }
}

fn ndjson_line(v: &Value) -> axum::body::Bytes {
    let mut s = v.to_string();
    s.push('\n');
    axum::body::Bytes::from(s)
}

/// The answer: NDJSON lines when streamed, one object otherwise.
async fn answer(
    started: Started,
    generate: bool,
    app: &AppState,
    load: Duration,
) -> Result<Response, ApiError> {
    let Started {
        reply,
        parser,
        mut rx,
        req,
        prompt_tokens,
        cached_tokens,
        ..
    } = started;
    let mut w = Writer {
        model: app.model_id.clone(),
        parser,
        reasoning: reply.reasoning,
        generate,
        started: Instant::now(),
        load,
        first: None,
        prompt_tokens,
        cached_tokens,
        content: String::new(),
        thinking: String::new(),
        calls: Vec::new(),
    };
    if !req.common.stream {
        let (summary, _) = collect(&mut rx, |t| {
            w.first.get_or_insert_with(Instant::now);
            let events = w.parser.feed(&t);
            w.take(events);
        })
        .await?;
        let events = w.parser.finish(hint(summary.finish));
        w.take(events);
        let (content, thinking, calls) = (w.content.clone(), w.thinking.clone(), w.calls.clone());
        let v = w.done(w.line(&content, &thinking, &calls), &summary);
        return Ok(Json(v).into_response());
    }
    let lines = stream::unfold(Some((w, rx)), |st| async move {
        let (mut w, mut rx) = st?;
        loop {
            match rx.recv().await {
                Some(Event::Text(t)) => {
                    w.first.get_or_insert_with(Instant::now);
                    let n_calls = w.calls.len();
                    let events = w.parser.feed(&t);
                    let (text, think) = w.take(events);
                    let calls = w.calls[n_calls..].to_vec();
                    if text.is_empty() && think.is_empty() && calls.is_empty() {
                        continue;
                    }
                    let line = ndjson_line(&w.line(&text, &think, &calls));
                    return Some((vec![line], Some((w, rx))));
                }
                Some(Event::Done(s)) => {
                    let n_calls = w.calls.len();
                    let events = w.parser.finish(hint(s.finish));
                    let (text, think) = w.take(events);
                    let calls = w.calls[n_calls..].to_vec();
                    let mut out = Vec::new();
                    if !text.is_empty() || !think.is_empty() || !calls.is_empty() {
                        out.push(ndjson_line(&w.line(&text, &think, &calls)));
                    }
                    out.push(ndjson_line(&w.done(w.line("", "", &[]), &s)));
                    return Some((out, None));
                }
                // Ollama ends a failed stream with an error line.
                Some(Event::Failed(e)) => {
                    let e: ApiError = e.into();
                    return Some((vec![ndjson_line(&json!({"error": e.message}))], None));
                }
                Some(_) => {}
                None => {
                    let line = json!({"error": "the engine dropped the request"});
                    return Some((vec![ndjson_line(&line)], None));
                }
            }
        }
    });
    let body = Body::from_stream(lines.flat_map(stream::iter).map(Ok::<_, Infallible>));
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(r)
}

/// `POST /api/chat`.
pub async fn chat(
    State(app): State<Arc<AppState>>,
    load: Option<Extension<LoadTime>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = start_chat(&app, &headers, body, translate_chat, "chatcmpl").await?;
    answer(
        started,
        false,
        &app,
        load.map_or(Duration::ZERO, |l| l.0 .0),
    )
    .await
}

/// `POST /api/generate`. An empty prompt loads the model (here: it is
/// loaded) and answers `done_reason: "load"`, as Ollama does.
pub async fn generate(
    State(app): State<Arc<AppState>>,
    load: Option<Extension<LoadTime>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = crate::routes::read_body(&app, &headers, body).await?;
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&bytes) {
        let empty = match m.get("prompt") {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            _ => false,
        };
        if empty && m.get("images").is_none_or(Value::is_null) {
            check_model(&app, &m)?;
            return Ok(Json(
                json!({"model": app.model_id, "created_at": rfc3339(SystemTime::now()),
                "response": "", "done": true, "done_reason": "load"}),
            )
            .into_response());
        }
    }
    let started = start_chat(
        &app,
        &headers,
        Body::from(bytes),
        translate_generate,
        "chatcmpl",
    )
    .await?;
    answer(started, true, &app, load.map_or(Duration::ZERO, |l| l.0 .0)).await
}

fn check_model(app: &AppState, body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("model").or_else(|| body.get("name")) {
        Some(Value::String(m))
            if m == &app.model_id || m.strip_suffix(":latest") == Some(&app.model_id) =>
        {
            Ok(())
        }
        Some(Value::String(m)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            Some("model_not_found"),
            format!(
                "model '{m}' not found; this server serves '{}'",
                app.model_id
            ),
        )),
        _ => Err(bad("model", "required (a string)")),
    }
}

pub(crate) fn details(c: &ModelCard) -> Value {
    json!({"parent_model": "", "format": "gguf", "family": c.family, "families": [c.family],
           "parameter_size": c.parameter_size, "quantization_level": c.quantization_level})
}

/// `POST /api/show`.
pub async fn show(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = crate::routes::read_body(&app, &headers, body).await?;
    let m = crate::request::parse_object(&bytes)?;
    check_model(&app, &m)?;
    let tools = app.prompter.output != hearth_chat::detect::OutputFormat::Plain;
    Ok(Json(show_body(&app.model_id, &app.card, tools)))
}

/// `/api/show`'s answer for a model's card (also the hub's, for a model
/// not loaded: its card and tool format come from the file's header).
pub(crate) fn show_body(name: &str, c: &ModelCard, tools: bool) -> Value {
    let mut caps = vec!["completion"];
    if tools {
        caps.push("tools");
    }
    if c.vision {
        caps.push("vision");
    }
    json!({
        "modelfile": format!("# hearth serves this GGUF as is\nFROM {name}\n"),
        "parameters": "",
        "template": c.template,
        "details": details(c),
        "model_info": c.model_info,
        "capabilities": caps,
        "modified_at": c.loaded_at,
    })
}

/// `GET /api/version`: hearth's version (Ollama's clients read it as a string).
pub async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

/// Errors on `/api/*` in Ollama's shape, `{"error": "..."}`.
pub async fn reshape_errors(req: Request, next: Next) -> Response {
    let ours = req.uri().path().starts_with("/api/");
    let mut r = next.run(req).await;
    if !ours {
        return r;
    }
    if let Some(e) = r.extensions_mut().remove::<ApiError>() {
        let mut fresh = (e.status, Json(json!({"error": e.message}))).into_response();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000000005Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert!(rfc3339(leap).starts_with("2000-02-29T"));
    }

    #[test]
    fn tool_results_answer_the_open_calls_in_order() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "w", "arguments": {"city": "Paris"}}},
                {"function": {"name": "w", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "w"},
            {"role": "tool", "content": "rain", "tool_name": "w"}]});
        let out = translate_chat_for_test(body.as_object().unwrap()).unwrap();
        let m = out["messages"].as_array().unwrap();
        assert_eq!(m[1]["tool_calls"][0]["id"], "call_1");
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(m[2]["tool_call_id"], "call_1");
        assert_eq!(m[3]["tool_call_id"], "call_2");
        assert_eq!(out["stream"], true);
    }

    #[test]
    fn options_map_and_unknown_ones_are_named() {
        let body = json!({"messages": [],
                          "options": {"num_predict": 7, "temperature": 0, "num_ctx": 4096, "top_k": 3}});
        let out = translate_chat_for_test(body.as_object().unwrap()).unwrap();
        assert_eq!(out["max_tokens"], 7);
        assert_eq!(out["top_k"], 3);
        assert!(!out.contains_key("num_ctx"));
        let body = json!({"messages": [], "options": {"warp_speed": 9}});
        let e = translate_chat_for_test(body.as_object().unwrap()).unwrap_err();
        assert!(e.message.contains("options.warp_speed"), "{}", e.message);
    }

    fn translate_chat_for_test(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
        crate::api::ollama::chat_body(body)
    }
}
