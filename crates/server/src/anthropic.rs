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

/// A Messages request body as a chat completions body (the typed request
/// in [`crate::api::anthropic`]).
fn translate(
    body: &Map<String, Value>,
    _app: &AppState,
) -> Result<Option<Map<String, Value>>, ApiError> {
    crate::api::anthropic::MessagesRequest::parse(body).map(Some)
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
