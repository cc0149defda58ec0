//! `/v1/chat/completions` and `/v1/completions`: validation, submission to the
//! engine, and the response, whole or as server-sent events that follow the
//! generation token by token (server-api.md §4–5).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use hearth_chat::detect::OutputFormat;
use hearth_chat::parser::{ChatEvent, FinishHint, OutputParser};
use hearth_chat::prompter::PromptError;
use hearth_engine::prompt::Prompt;
use hearth_engine::scheduler::{Event, Job, Progress, Summary};
use hearth_engine::turn::{FinishReason, TokenConstraint, TokenLogprob};
use hearth_grammar::ToolCallGrammar;
use hearth_tokenizer::Tokenizer;
use hearth_vision::prompt::MEDIA_MARKER;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::engine::ChannelSink;
use crate::error::ApiError;
use crate::images;
use crate::metrics::Metrics;
use crate::request::{parse_chat, parse_completion, parse_object, ChatRequest, Common, Structured};
use crate::routes::{check_context, check_prompt_bytes, header_session, read_body, AppState};

/// `POST /apply-template` (llama-server's endpoint): the prompt text a chat
/// request renders to, without generating.
pub async fn apply_template(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let prompt = prepare(&app, &headers, body, |app, obj, session| {
        let req = parse_chat(obj, &app.model_id, session)?;
        app.prompter
            .render(&req.messages, req.tools.as_ref(), true, &req.kwargs)
            .map_err(prompt_error)
    })
    .await?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = start_chat(&app, &headers, body, |_, _| Ok(None), "chatcmpl").await?;
    let Started {
        reply,
        parser,
        rx,
        req,
        ..
    } = started;
    if req.common.stream {
        Ok(sse(chat_stream(
            reply,
            parser,
            rx,
            req.common.include_usage,
        )))
    } else {
        chat_whole(reply, parser, rx).await
    }
}

/// Turns another API's request body into a chat completions body (`None`:
/// the body is one already). Runs on the blocking pool with the rest of
/// request preparation.
pub(crate) type Translate =
    fn(&Map<String, Value>, &AppState) -> Result<Option<Map<String, Value>>, ApiError>;

/// A chat request admitted to the engine: what every chat-shaped API
/// (chat completions, Anthropic Messages, Responses) writes its answer from.
pub(crate) struct Started {
    pub reply: Reply,
    pub parser: Box<dyn OutputParser + Send>,
    pub rx: mpsc::UnboundedReceiver<Event>,
    pub req: ChatRequest,
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the session or the prefix cache.
    pub cached_tokens: usize,
    /// The chat completions body a translated request became.
    pub translated: Option<Map<String, Value>>,
}

/// The shared front half of every chat-shaped API: the body translated
/// into a chat completions request, validated, rendered (images placed),
/// its output constraint compiled, and admitted; errors before the first
/// response byte come back as `Err`. `id_prefix` names the response
/// (`chatcmpl`, `msg`, `resp`).
pub(crate) async fn start_chat(
    app: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
    translate: Translate,
    id_prefix: &str,
) -> Result<Started, ApiError> {
    crate::fault::maybe_panic_in_handler(headers);
    let (req, ids, constraint, translated) =
        prepare(app, headers, body, move |prep, obj, session| {
            let translated = translate(obj, prep)?;
            let obj = translated.as_ref().unwrap_or(obj);
            let req = parse_chat(obj, &prep.model_id, session)?;
            let constraint = output_constraint(prep, &req)?;
            if images::has_images(&req.messages) {
                // Rendered around the images below, after they are decoded.
                return Ok((req, None, constraint, translated));
            }
            let p = &prep.prompter;
            let text = p
                .render(&req.messages, req.tools.as_ref(), true, &req.kwargs)
                .map_err(prompt_error)?;
            check_prompt_bytes(prep, text.len())?;
            let ids = p
                .chat_ids(&req.messages, req.tools.as_ref(), &req.kwargs)
                .map_err(prompt_error)?;
            Ok((req, Some(ids), constraint, translated))
        })
        .await?;
    let prompt = match ids {
        Some(ids) => ids.into(),
        None => image_prompt(app, &req).await?,
    };
    let hex = random_hex();
    // OpenAI's chat ids read chatcmpl-…; Anthropic's and the Responses
    // API's msg_… and resp_….
    let id = match id_prefix {
        "chatcmpl" => format!("{id_prefix}-{hex}"),
        _ => format!("{id_prefix}_{hex}"),
    };
    let call_prefix = match id_prefix {
        "msg" => format!("toolu_{}", &hex[..12]),
        _ => format!("call_{}_", &hex[..12]),
    };
    let parser = Box::new(WarningLog {
        inner: app
            .prompter
            .parser(req.tools.as_ref(), call_prefix)
            .map_err(prompt_error)?,
        metrics: app.metrics.clone(),
        id: id.clone(),
    });
    let reply = Reply {
        id,
        created: unix_now(),
        model: app.model_id.clone(),
        // Muse Glimmer's reasoning is returned only on request (§3.1); other
        // formats' reasoning always is.
        reasoning: req.return_reasoning || app.prompter.output != OutputFormat::MuseGlimmer,
        tokenizer: app.tokenizer.clone(),
        image_tokens: prompt.images.iter().map(|s| s.image.n).collect(),
        progress: req.common.return_progress,
    };
    let prompt_tokens = prompt.len();
    let constraint = crate::fault::engine_constraint(headers, constraint);
    let (rx, cached_tokens) =
        submit(app, &req.common, prompt, constraint, turn_openers(app)).await?;
    Ok(Started {
        reply,
        parser,
        rx,
        req,
        prompt_tokens,
        cached_tokens,
        translated,
    })
}

/// `POST /v1/completions`.
pub async fn completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, ids) = prepare(&app, &headers, body, |prep, obj, session| {
        let req = parse_completion(obj, &prep.model_id, session)?;
        check_prompt_bytes(prep, req.prompt.len())?;
        let ids = prep
            .prompter
            .completion_ids(&req.prompt)
            .map_err(prompt_error)?;
        Ok((req, ids))
    })
    .await?;
    let reply = Reply {
        id: format!("cmpl-{}", random_hex()),
        created: unix_now(),
        model: app.model_id.clone(),
        reasoning: false,
        tokenizer: app.tokenizer.clone(),
        image_tokens: Vec::new(),
        progress: req.common.return_progress,
    };
    let (rx, _) = submit(&app, &req.common, ids.into(), None, Vec::new()).await?;
    if req.common.stream {
        Ok(sse(completion_stream(reply, rx, req.common.include_usage)))
    } else {
        completion_whole(reply, rx).await
    }
}

/// Reads the body (within the limits) and the session header, then runs
/// request preparation — JSON decoding and `work` (rendering, tokenizing:
/// work that grows with the body) — on the blocking pool, off the threads
/// that serve every connection. Its size is bounded by the body limit and,
/// before tokenizing, by [`check_prompt_bytes`].
pub(crate) async fn prepare<T: Send + 'static>(
    app: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
    work: impl FnOnce(&AppState, &Map<String, Value>, Option<String>) -> Result<T, ApiError>
        + Send
        + 'static,
) -> Result<T, ApiError> {
    let body = read_body(app, headers, body).await?;
    let session = header_session(headers)?;
    let app = app.clone();
    tokio::task::spawn_blocking(move || work(&app, &parse_object(&body)?, session))
        .await
        .map_err(|e| ApiError::server(format!("request preparation failed: {e}")))?
}

/// The prompt of a request with images: token ids, and the images' rows
/// placed among them (decoded here, encoded off the async runtime; the
/// encode cache keeps rows by image digest, so a later turn with the same
/// image reuses them).
async fn image_prompt(app: &Arc<AppState>, req: &ChatRequest) -> Result<Prompt, ApiError> {
    let Some(input) = app.images.clone() else {
        return Err(ApiError::invalid(
            "invalid_image",
            "This model has no vision encoder: image_url parts need `hearth serve --mmproj FILE`.",
        ));
    };
    // Off the async runtime: with --allow-image-urls, remote images are fetched.
    let (raw, allow) = (req.messages.clone(), app.allow_image_urls);
    let (messages, decoded) = tokio::task::spawn_blocking(move || images::extract(&raw, allow))
        .await
        .map_err(|e| ApiError::server(format!("image decoding: {e}")))??;
    let runs = app
        .prompter
        .chat_runs(&messages, req.tools.as_ref(), &req.kwargs, MEDIA_MARKER)
        .map_err(prompt_error)?;
    if runs.runs.len() != decoded.len() + 1 {
        return Err(ApiError::invalid_request(format!(
            "The chat template placed {} of the {} images.",
            runs.runs.len() - 1,
            decoded.len()
        )));
    }
    let (rows, input) = tokio::task::spawn_blocking(move || {
        let rows: Result<Vec<_>, String> = decoded.iter().map(|img| input.encode(img)).collect();
        (rows, input)
    })
    .await
    .map_err(|e| ApiError::server(format!("image encoder: {e}")))?;
    let rows = rows.map_err(ApiError::server)?;
    for (i, e) in rows.iter().enumerate() {
        eprintln!(
            "image {i}: {} tokens, {} in {:.1} ms",
            e.rows.n,
            if e.cached {
                "from the encode cache"
            } else {
                "encoded"
            },
            e.time.as_secs_f64() * 1e3
        );
    }
    let rows: Vec<_> = rows.into_iter().map(|e| e.rows).collect();
    Ok(input.place(&runs, &rows))
}

/// A conversation the prompter could not render is the client's error (400
/// with the template's message).
pub(crate) fn prompt_error(e: PromptError) -> ApiError {
    match e {
        PromptError::NoTemplate(why) => ApiError::invalid_request(format!(
            "This model has no chat template ({why}); use /v1/completions."
        )),
        e => ApiError::invalid_request(e.to_string()),
    }
}

/// The grammar a chat request's output must follow (`tool_choice`,
/// `response_format`, strict tools), compiled for this model; errors are the
/// client's (400, naming the field).
fn output_constraint(
    app: &AppState,
    req: &ChatRequest,
) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
    let format = app.prompter.output;
    let bad = |field: &str, e: hearth_grammar::GrammarError| {
        ApiError::invalid("invalid_value", format!("{field}: {e}"))
    };
    let structured = match &req.structured {
        Structured::Free if app.strict_tools && req.tools.is_some() => &Structured::StrictCalls,
        s => s,
    };
    let grammar = match structured {
        Structured::Free => return Ok(None),
        Structured::JsonObject => app
            .grammars()?
            .json_object(format)
            .map_err(|e| bad("response_format", e))?,
        Structured::JsonSchema(schema) => app
            .grammars()?
            .json_schema(format, schema)
            .map_err(|e| bad("response_format.json_schema.schema", e))?,
        Structured::Calls { .. } | Structured::StrictCalls => {
            let tools =
                hearth_chat::parser::ToolSet::from_json(req.tools.as_ref().unwrap_or(&Value::Null))
                    .map_err(|e| ApiError::invalid_request(e.to_string()))?;
            let (only, lazy) = match structured {
                Structured::Calls { only } => (only.as_deref(), false),
                _ => (None, true),
            };
            let strict = req
                .strict
                .iter()
                .map(|(k, v)| (k.as_str(), *v || !lazy || app.strict_tools))
                .collect();
            app.grammars()?
                .tool_calls(&ToolCallGrammar {
                    format,
                    tools: &tools,
                    strict,
                    only,
                    lazy,
                    parallel: req.parallel_tool_calls,
                })
                .map_err(|e| bad("tools", e))?
        }
    };
    let c = app
        .grammars()?
        .constraint(&grammar)
        .map_err(|e| bad("response_format", e))?;
    Ok(Some(c))
}

/// Context check, submission, and admission: everything that can fail before
/// the first response byte.
/// The chat template's turn-opening control tokens (ChatML's
/// `<|im_start|>`, Gemma's `<start_of_turn>`, Llama 3's
/// `<|start_header_id|>`): a model that writes one has ended its answer and
/// begun the next turn itself (small models do, in long agent
/// conversations), so a chat answer ends there as at an end-of-generation
/// token, without the marker in its text (Ollama stops on them too). Raw
/// completions keep generating through them.
fn turn_openers(app: &AppState) -> Vec<u32> {
    let Some(src) = app.prompter.template_source() else {
        return Vec::new();
    };
    ["<|im_start|>", "<start_of_turn>", "<|start_header_id|>"]
        .iter()
        .filter(|m| src.contains(**m))
        .filter_map(|m| app.tokenizer.token_id(m))
        .filter(|&id| app.tokenizer.is_special(id))
        .collect()
}

async fn submit(
    app: &AppState,
    common: &Common,
    prompt: Prompt,
    constraint: Option<Box<dyn TokenConstraint>>,
    end_tokens: Vec<u32>,
) -> Result<(mpsc::UnboundedReceiver<Event>, usize), ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid_request(
            "The prompt is empty after tokenization.",
        ));
    }
    let max_tokens = check_context(app, prompt.len(), common.max_tokens)?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    app.engine.submit(Job {
        session: common.session_id.clone(),
        prompt,
        sampling: common.sampling,
        max_tokens,
        stop: common.stop.clone(),
        ignore_eos: common.ignore_eos,
        constraint,
        logprobs: common.logprobs,
        cache_salt: common.cache_salt.clone(),
        // Streams may say how the prefill goes (chat's prompt_progress,
        // Anthropic's pings); a whole reply has nothing to say it with.
        progress: common.stream,
        end_tokens,
        events: Box::new(ChannelSink(tx)),
    })?;
    match rx.recv().await {
        Some(Event::Admitted { cached_tokens }) => Ok((rx, cached_tokens)),
        Some(Event::Failed(e)) => Err(e.into()),
        _ => Err(ApiError::server("the engine dropped the request")),
    }
}

/// Logs and counts the parser's warnings (output that began like a tool call
/// but was not one; its text reaches the client as content) and passes every
/// other event on.
pub(crate) struct WarningLog {
    inner: Box<dyn OutputParser + Send>,
    metrics: Arc<Metrics>,
    /// The response id, to find the turn in the log.
    id: String,
}

impl WarningLog {
    fn pass(&self, mut events: Vec<ChatEvent>) -> Vec<ChatEvent> {
        events.retain(|e| match e {
            ChatEvent::Warning { message } => {
                eprintln!("tool_call_parse_warning id={} {message}", self.id);
                self.metrics
                    .tool_call_parse_warnings
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        });
        events
    }
}

impl OutputParser for WarningLog {
    fn feed(&mut self, text: &str) -> Vec<ChatEvent> {
        let events = self.inner.feed(text);
        self.pass(events)
    }

    fn finish(&mut self, hint: FinishHint) -> Vec<ChatEvent> {
        let events = self.inner.finish(hint);
        self.pass(events)
    }
}

/// The envelope shared by every chunk of one response.
pub(crate) struct Reply {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Send `reasoning_content`.
    pub reasoning: bool,
    pub tokenizer: Arc<Tokenizer>,
    /// Prompt tokens of each image, in order (usage).
    pub image_tokens: Vec<usize>,
    /// `return_progress`: `prompt_progress` chunks during the prefill.
    pub progress: bool,
}

/// A token's text and bytes, as OpenAI's logprobs report them.
fn token_entry(t: &Tokenizer, id: u32, logprob: f32) -> Value {
    let bytes = t.token_to_piece(id);
    json!({"token": String::from_utf8_lossy(bytes), "logprob": logprob, "bytes": bytes})
}

impl Reply {
    /// Chat `logprobs.content` entries (end-of-generation tokens left out:
    /// they are not part of the message).
    fn chat_logprobs(&self, lps: &[TokenLogprob]) -> Vec<Value> {
        let t = &*self.tokenizer;
        lps.iter()
            .filter(|lp| !t.is_eog(lp.token))
            .map(|lp| {
                let mut e = token_entry(t, lp.token, lp.logprob);
                e["top_logprobs"] = lp
                    .top
                    .iter()
                    .map(|&(id, l)| token_entry(t, id, l))
                    .collect();
                e
            })
            .collect()
    }

    /// Legacy completions `logprobs`: tokens, token_logprobs, top_logprobs.
    fn completion_logprobs(&self, lps: &[TokenLogprob]) -> Value {
        let t = &*self.tokenizer;
        let lps: Vec<&TokenLogprob> = lps.iter().filter(|lp| !t.is_eog(lp.token)).collect();
        let text = |id: u32| String::from_utf8_lossy(t.token_to_piece(id)).into_owned();
        let mut offset = 0;
        let mut offsets = Vec::new();
        for lp in &lps {
            offsets.push(offset);
            offset += text(lp.token).len();
        }
        json!({
            "tokens": lps.iter().map(|lp| text(lp.token)).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
            "top_logprobs": lps.iter().map(|lp| {
                lp.top.iter().map(|&(id, l)| (text(id), json!(l))).collect::<Map<String, Value>>()
            }).collect::<Vec<_>>(),
            "text_offset": offsets,
        })
    }
}

impl Reply {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    fn text_chunk(&self, text: &str, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]})
    }

    /// llama-server's `prompt_progress` chunk: no choices, how far the
    /// prefill has come (`processed` counts the reused `cache` tokens too).
    fn progress_chunk(&self, object: &str, p: &Progress) -> Value {
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [],
               "prompt_progress": {"total": p.total, "cache": p.cache, "processed": p.processed,
                                   "time_ms": p.time.as_secs_f64() * 1e3}})
    }

    fn usage_chunk(&self, object: &str, s: &Summary) -> Value {
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [],
               "usage": usage(s, &self.image_tokens), "timings": timings(s)})
    }
}

/// llama-server's `timings`: the prompt tokens reused (`cache_n`), those
/// prefilled and how fast, the tokens decoded after the first and how fast.
pub(crate) fn timings(s: &Summary) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let rate = |n: usize, d: std::time::Duration| {
        if d.is_zero() {
            0.0
        } else {
            n as f64 / d.as_secs_f64()
        }
    };
    json!({"cache_n": s.cached_tokens,
           "prompt_n": s.prefilled_tokens, "prompt_ms": ms(s.prefill_time),
           "prompt_per_second": rate(s.prefilled_tokens, s.prefill_time),
           "predicted_n": s.decoded_tokens, "predicted_ms": ms(s.decode_time),
           "predicted_per_second": rate(s.decoded_tokens, s.decode_time)})
}

/// OpenAI's usage; with images, `prompt_tokens_details.image_tokens` (their
/// sum) and, a hearth extension, `image_tokens_per_image`.
fn usage(s: &Summary, image_tokens: &[usize]) -> Value {
    let mut u = json!({"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
           "total_tokens": s.prompt_tokens + s.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": s.cached_tokens}});
    if !image_tokens.is_empty() {
        u["prompt_tokens_details"]["image_tokens"] = json!(image_tokens.iter().sum::<usize>());
        u["image_tokens_per_image"] = json!(image_tokens);
    }
    u
}

/// A whole (not streamed) reply from the engine: each piece of text to
/// `on_text` as it comes, the logprobs gathered (when the job asked for
/// them), until the turn's summary; an engine failure, or an engine that
/// drops the request, as the error.
pub(crate) async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    mut on_text: impl FnMut(String),
) -> Result<(Summary, Option<Vec<TokenLogprob>>), ApiError> {
    let mut logprobs = None::<Vec<TokenLogprob>>;
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => on_text(t),
            Some(Event::Logprobs(l)) => logprobs.get_or_insert_with(Vec::new).extend(l),
            Some(Event::Done(s)) => return Ok((s, logprobs)),
            Some(Event::Failed(e)) => return Err(e.into()),
            Some(Event::Admitted { .. }) | Some(Event::Progress(_)) => {}
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    }
}

pub(crate) fn hint(f: FinishReason) -> FinishHint {
    match f {
        FinishReason::Stop => FinishHint::Stop,
        FinishReason::Length | FinishReason::Cancelled => FinishHint::Length,
    }
}

/// Chat deltas for parser events, in order. `ToolCall` confirms a call whose
/// start and arguments were already streamed; a call the parser confirms
/// without a preview is sent whole.
struct DeltaWriter {
    /// Per call index: (start sent, argument text sent).
    calls: Vec<(bool, String)>,
}

impl DeltaWriter {
    fn deltas(
        &mut self,
        reply: &Reply,
        events: Vec<ChatEvent>,
        finish: &mut Option<&'static str>,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        for e in events {
            match e {
                ChatEvent::Reasoning(t) if reply.reasoning && !t.is_empty() => {
                    out.push(json!({"reasoning_content": t}))
                }
                ChatEvent::Reasoning(_) => {}
                ChatEvent::Content(t) if !t.is_empty() => out.push(json!({"content": t})),
                ChatEvent::Content(_) => {}
                ChatEvent::ToolCallStart { index, id, name } => {
                    self.slot(index).0 = true;
                    out.push(
                        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                                    "function": {"name": name, "arguments": ""}}]}),
                    );
                }
                ChatEvent::ToolCallArgs { index, delta } => {
                    self.slot(index).1.push_str(&delta);
                    out.push(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]}),
                    );
                }
                ChatEvent::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    let (started, sent) = self.slot(index).clone();
                    let full = arguments.to_string();
                    if !started {
                        out.push(json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                                        "function": {"name": name, "arguments": full}}]}));
                    } else if sent.is_empty() {
                        out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": full}}]}));
                    }
                    *self.slot(index) = (true, full);
                }
                ChatEvent::End { finish_reason } => *finish = Some(finish_reason.as_str()),
                // Logged by `WarningLog`; not part of the message.
                ChatEvent::Warning { .. } => {}
            }
        }
        out
    }

    fn slot(&mut self, index: usize) -> &mut (bool, String) {
        if self.calls.len() <= index {
            self.calls.resize(index + 1, (false, String::new()));
        }
        &mut self.calls[index]
    }
}

pub(crate) fn sse(events: impl Stream<Item = String> + Send + 'static) -> Response {
    let stream = events.map(|data| Ok::<_, Infallible>(SseEvent::default().data(data)));
    let mut r = Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(15))
                .text("keepalive"),
        )
        .into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    r
}

fn error_event(e: &ApiError) -> String {
    e.body().to_string()
}

/// Role chunk, then deltas as the parser produces them, one finish chunk, the
/// usage chunk if asked, `[DONE]`. Dropping the stream (client gone) drops the
/// receiver, which stops the generation at its next step.
fn chat_stream(
    reply: Reply,
    parser: Box<dyn OutputParser + Send>,
    rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> impl Stream<Item = String> + Send {
    let first = reply
        .chunk(json!({"role": "assistant", "content": ""}), None)
        .to_string();
    let state = (
        Some((reply, parser, rx, DeltaWriter { calls: Vec::new() })),
        include_usage,
    );
    let rest = stream::unfold(state, |(st, include_usage)| async move {
        let (reply, mut parser, mut rx, mut writer) = st?;
        let mut finish = None;
        let out: Vec<String> = match rx.recv().await {
            Some(Event::Text(t)) => {
                let events = parser.feed(&t);
                writer
                    .deltas(&reply, events, &mut finish)
                    .into_iter()
                    .map(|d| reply.chunk(d, None).to_string())
                    .collect()
            }
            Some(Event::Done(summary)) => {
                let events = parser.finish(hint(summary.finish));
                let mut out: Vec<String> = writer
                    .deltas(&reply, events, &mut finish)
                    .into_iter()
                    .map(|d| reply.chunk(d, None).to_string())
                    .collect();
                out.push(
                    reply
                        .chunk(json!({}), Some(finish.unwrap_or("stop")))
                        .to_string(),
                );
                if include_usage {
                    out.push(
                        reply
                            .usage_chunk("chat.completion.chunk", &summary)
                            .to_string(),
                    );
                }
                out.push("[DONE]".into());
                return Some((out, (None, include_usage)));
            }
            Some(Event::Failed(e)) => {
                return Some((
                    vec![error_event(&e.into()), "[DONE]".into()],
                    (None, include_usage),
                ))
            }
            Some(Event::Logprobs(lps)) => {
                let content = reply.chat_logprobs(&lps);
                match content.is_empty() {
                    true => Vec::new(),
                    false => {
                        let mut c = reply.chunk(json!({}), None);
                        c["choices"][0]["logprobs"] = json!({ "content": content });
                        vec![c.to_string()]
                    }
                }
            }
            Some(Event::Progress(p)) => match reply.progress {
                true => vec![reply
                    .progress_chunk("chat.completion.chunk", &p)
                    .to_string()],
                false => Vec::new(),
            },
            Some(Event::Admitted { .. }) => Vec::new(),
            None => {
                let e = ApiError::server("the engine dropped the request");
                return Some((
                    vec![error_event(&e), "[DONE]".into()],
                    (None, include_usage),
                ));
            }
        };
        Some((out, (Some((reply, parser, rx, writer)), include_usage)))
    });
    stream::once(async move { first }).chain(rest.flat_map(stream::iter))
}

async fn chat_whole(
    reply: Reply,
    mut parser: Box<dyn OutputParser + Send>,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut events = Vec::new();
    let (summary, logprobs) = collect(&mut rx, |t| events.extend(parser.feed(&t))).await?;
    events.extend(parser.finish(hint(summary.finish)));
    let (mut content, mut reasoning, mut calls, mut finish) =
        (String::new(), String::new(), Vec::new(), "stop");
    for e in events {
        match e {
            ChatEvent::Reasoning(t) => reasoning.push_str(&t),
            ChatEvent::Content(t) => content.push_str(&t),
            ChatEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            } => calls.push(json!({
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()}
            })),
            ChatEvent::End { finish_reason } => finish = finish_reason.as_str(),
            ChatEvent::ToolCallStart { .. }
            | ChatEvent::ToolCallArgs { .. }
            | ChatEvent::Warning { .. } => {}
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    let content = if content.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(content)
    };
    message.insert("content".into(), content);
    if reply.reasoning && !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let logprobs = logprobs.map(|l| json!({"content": reply.chat_logprobs(&l)}));
    Ok(Json(json!({
        "id": reply.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage(&summary, &reply.image_tokens), "timings": timings(&summary)
    }))
    .into_response())
}

fn completion_stream(
    reply: Reply,
    rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> impl Stream<Item = String> + Send {
    let rest = stream::unfold(Some((reply, rx)), move |st| async move {
        let (reply, mut rx) = st?;
        let out = match rx.recv().await {
            Some(Event::Text(t)) => vec![reply.text_chunk(&t, None).to_string()],
            Some(Event::Logprobs(l)) => {
                let mut c = reply.text_chunk("", None);
                c["choices"][0]["logprobs"] = reply.completion_logprobs(&l);
                vec![c.to_string()]
            }
            Some(Event::Done(s)) => {
                let mut out = vec![reply
                    .text_chunk("", Some(completion_finish(s.finish)))
                    .to_string()];
                if include_usage {
                    out.push(reply.usage_chunk("text_completion", &s).to_string());
                }
                out.push("[DONE]".into());
                return Some((out, None));
            }
            Some(Event::Failed(e)) => {
                return Some((vec![error_event(&e.into()), "[DONE]".into()], None))
            }
            Some(Event::Progress(p)) => match reply.progress {
                true => vec![reply.progress_chunk("text_completion", &p).to_string()],
                false => Vec::new(),
            },
            Some(Event::Admitted { .. }) => Vec::new(),
            None => {
                return Some((
                    vec![
                        error_event(&ApiError::server("the engine dropped the request")),
                        "[DONE]".into(),
                    ],
                    None,
                ))
            }
        };
        Some((out, Some((reply, rx))))
    });
    rest.flat_map(stream::iter)
}

async fn completion_whole(
    reply: Reply,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let (summary, logprobs) = collect(&mut rx, |t| text.push_str(&t)).await?;
    Ok(Json(json!({
        "id": reply.id, "object": "text_completion", "created": reply.created, "model": reply.model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs.map(|l| reply.completion_logprobs(&l)),
                     "finish_reason": completion_finish(summary.finish)}],
        "usage": usage(&summary, &reply.image_tokens), "timings": timings(&summary)
    }))
    .into_response())
}

fn completion_finish(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Cancelled => "length",
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// 32 random hex digits.
pub(crate) fn random_hex() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_warnings_are_logged_counted_and_kept_out_of_the_reply() {
        let metrics = Arc::new(Metrics::default());
        let mut parser = WarningLog {
            inner: hearth_chat::parser::parser_for("hermes", None).unwrap(),
            metrics: metrics.clone(),
            id: "chatcmpl-test".into(),
        };
        let text = "Before<tool_call>not json</tool_call> after";
        let mut events = parser.feed(text);
        events.extend(parser.finish(FinishHint::Stop));
        assert!(!events
            .iter()
            .any(|e| matches!(e, ChatEvent::Warning { .. })));
        let content: String = events
            .iter()
            .filter_map(|e| match e {
                ChatEvent::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(content, text);
        assert_eq!(metrics.tool_call_parse_warnings.load(Ordering::Relaxed), 1);
        assert!(metrics
            .render()
            .contains("\nhearth_tool_call_parse_warnings_total 1\n"));
    }
}
