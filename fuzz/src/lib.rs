//! Shared checks for the fuzz targets. Each target is a thin `fuzz_target!`
//! over one function here, so a crash reproduces with the same code path from
//! a unit test or a debugger.

use hearth_chat::parser::{
    merge_events, parser_with, streamed_arguments, ChatEvent, FinishHint, FinishReason,
    OutputFormat, ParserOptions, UnknownToolPolicy,
};
use serde_json::{json, Value};

/// Tools the parser targets register: every coercion type, a namespaced name,
/// and a name that is a prefix of another.
fn tools(choice: u8) -> Option<Value> {
    match choice & 3 {
        0 => None,
        1 => Some(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "add", "parameters": {
                "properties": {"a": {"type": "number"}, "b": {"type": "boolean"},
                    "c": {"type": ["string", "null"]}, "d": {"type": "array"}}}}},
            {"name": "read"},
            {"name": "read.file"},
        ])),
        2 => Some(json!([])),
        _ => Some(json!([{"name": "f", "parameters": {"properties": {"x": {"type": "string"}}}}])),
    }
}

/// Input layout: byte 0 = options (bits 0-1 tools, 2 `text` unknown-tool
/// policy, 3 start inside `<think>`, 4 finish hint `length`), byte 1 = seed of
/// the chunking, the rest = generated text (lossy UTF-8).
///
/// Checks: no panic; the merged events of the whole text equal those of the
/// same text fed in random small chunks; exactly one `End`, last, whose
/// finish reason is `tool_calls` exactly when a call was confirmed; every
/// confirmed call was announced by a `ToolCallStart` of the same index and
/// name, indices are unique, and streamed argument deltas (if any) rebuild the
/// confirmed arguments; and nothing is lost: `plain` returns the input as
/// content, and the tag formats return it verbatim as content whenever no call
/// was confirmed and no reasoning or end-token framing is involved.
pub fn check_parser(format: OutputFormat, data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let flags = data[0];
    let mut seed = u64::from(data[1]) | 0x9E37_79B9_0000_0000;
    let text = String::from_utf8_lossy(&data[2..]);
    let tools = tools(flags);
    let options = ParserOptions {
        unknown_tool_policy: if flags & 4 != 0 {
            UnknownToolPolicy::Text
        } else {
            UnknownToolPolicy::Passthrough
        },
        start_in_reasoning: flags & 8 != 0,
        ..ParserOptions::default()
    };
    let hint = if flags & 16 != 0 {
        FinishHint::Length
    } else {
        FinishHint::Stop
    };

    let run = |pieces: &[&str]| {
        let mut p = parser_with(format, tools.as_ref(), options.clone()).expect("fixed tools");
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.feed(piece));
        }
        events.extend(p.finish(hint));
        // A second finish is a no-op.
        assert!(p.finish(hint).is_empty(), "second finish returned events");
        events
    };

    let whole = merge_events(run(&[&text]));
    let mut pieces = Vec::new();
    let mut rest: &str = &text;
    while !rest.is_empty() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let n_chars = 1 + (seed >> 61) as usize;
        let cut = rest
            .char_indices()
            .nth(n_chars)
            .map_or(rest.len(), |(i, _)| i);
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    let raw_chunked = run(&pieces);
    let chunked = merge_events(raw_chunked.clone());
    assert_eq!(
        whole, chunked,
        "chunking changed the events; pieces {pieces:?}"
    );
    check_events(&raw_chunked, hint);

    let content: String = whole
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Content(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let confirmed = whole
        .iter()
        .any(|e| matches!(e, ChatEvent::ToolCall { .. }));
    let verbatim_expected = match format {
        OutputFormat::Plain => true,
        OutputFormat::Hermes | OutputFormat::Qwen3Xml | OutputFormat::Atem => {
            !confirmed
                && !options.start_in_reasoning
                && !["<think>", "<|im_end|>", "<|endoftext|>"]
                    .iter()
                    .any(|m| text.contains(m))
        }
        _ => false,
    };
    if verbatim_expected {
        assert_eq!(content, text, "text lost: events {whole:?}");
    }
}

/// Event-list invariants that do not depend on the format.
fn check_events(events: &[ChatEvent], hint: FinishHint) {
    let n_end = events
        .iter()
        .filter(|e| matches!(e, ChatEvent::End { .. }))
        .count();
    assert_eq!(n_end, 1, "one End event");
    let Some(ChatEvent::End { finish_reason }) = events.last() else {
        panic!("End is not last: {events:?}");
    };
    let mut started: Vec<(usize, &str)> = Vec::new();
    let mut confirmed: Vec<usize> = Vec::new();
    for e in events {
        match e {
            ChatEvent::ToolCallStart { index, name, .. } => {
                assert!(
                    !started.iter().any(|(i, _)| i == index),
                    "index {index} started twice"
                );
                started.push((*index, name));
            }
            ChatEvent::ToolCallArgs { index, .. } => {
                assert!(
                    started.iter().any(|(i, _)| i == index),
                    "arguments for unstarted call {index}"
                );
            }
            ChatEvent::ToolCall {
                index,
                name,
                arguments,
                ..
            } => {
                assert!(
                    started.contains(&(*index, name.as_str())),
                    "call {index} {name:?} confirmed without its start"
                );
                assert!(!confirmed.contains(index), "call {index} confirmed twice");
                confirmed.push(*index);
                let streamed = streamed_arguments(events, *index);
                if !streamed.is_empty() {
                    let v: Value = serde_json::from_str(&streamed).unwrap_or_else(|e| {
                        panic!("streamed arguments {streamed:?} of call {index}: {e}")
                    });
                    assert_eq!(&v, arguments, "streamed arguments of call {index}");
                }
                assert!(arguments.is_object(), "arguments must be an object");
            }
            _ => {}
        }
    }
    let want = if !confirmed.is_empty() {
        FinishReason::ToolCalls
    } else if hint == FinishHint::Length {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    assert_eq!(*finish_reason, want, "finish reason");
}

/// GGUF reader: any bytes give a file or an error, never a panic; a file
/// that opens can have all its metadata read, every tensor viewed (first and
/// last row), and its tokenizer and chat template loaded or refused cleanly.
pub fn check_gguf(data: &[u8]) {
    let Ok(file) = hearth_gguf::GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let meta = file.metadata();
    for (_, v) in meta.iter() {
        let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.as_bool(), v.as_str());
        let _ = v.as_str_array();
        let _ = v.value_type().name();
    }
    let _ = (file.architecture(), file.alignment(), file.data_offset());
    for t in file.tensors() {
        let _ = (t.n_elements(), t.n_bytes(), t.n_rows(), t.row_len());
        let view = file.tensor(&t.name).expect("a listed tensor has a view");
        assert_eq!(view.data.len() as u64, t.n_bytes());
        let rows = t.n_rows() as usize;
        if rows > 0 && view.row_bytes() > 0 {
            let _ = view.row(0);
            let _ = view.row(rows - 1);
        }
    }
    let _ = hearth_chat::template::gguf_special_tokens(&file);
    if let Ok(t) = hearth_chat::template::ChatTemplate::from_gguf(&file) {
        let messages = json!([{"role": "user", "content": "hi"}]);
        let _ = t.render(&messages, None, true, &Default::default());
    }
    if let Ok(tok) = hearth_tokenizer::Tokenizer::from_gguf(meta) {
        let ids = tok.encode("Hello, world! <|im_end|> 123", true, true);
        let _ = tok.decode(&ids);
    }
}

/// The packaged models' chat templates (tests/fixtures/templates), compiled once.
fn fixture_templates() -> &'static [hearth_chat::template::ChatTemplate] {
    use std::sync::OnceLock;
    static TEMPLATES: OnceLock<Vec<hearth_chat::template::ChatTemplate>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        [
            include_str!("../../tests/fixtures/templates/qwen2.5-coder-0.5b.json"),
            include_str!("../../tests/fixtures/templates/smollm2-135m.json"),
            include_str!("../../tests/fixtures/templates/gemma3-270m.json"),
        ]
        .iter()
        .map(|fixture| {
            let fx: Value = serde_json::from_str(fixture).expect("fixture is JSON");
            let field = |k: &str| fx[k].as_str().expect("fixture field");
            hearth_chat::template::ChatTemplate::from_source(
                field("template"),
                field("bos_token"),
                field("eos_token"),
            )
            .expect("packaged template compiles")
        })
        .collect()
    })
}

/// `{"messages": [...], "tools": [...], "kwargs": {...}}`, or a bare messages value.
fn conversation(v: &Value) -> (&Value, Option<&Value>, serde_json::Map<String, Value>) {
    match v.get("messages") {
        Some(m) => (
            m,
            v.get("tools"),
            v.get("kwargs")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        ),
        None => (v, None, Default::default()),
    }
}

/// Renders one conversation with every packaged template and the built-in
/// Muse Glimmer renderer; each gives a prompt or an error.
fn render_everywhere(
    messages: &Value,
    tools: Option<&Value>,
    kwargs: &serde_json::Map<String, Value>,
    add_generation_prompt: bool,
) {
    for t in fixture_templates() {
        let _ = t.render(messages, tools, add_generation_prompt, kwargs);
    }
    let opts = hearth_chat::muse_glimmer::RenderOptions {
        add_generation_prompt,
        reasoning_strength: kwargs
            .get("reasoning_strength")
            .and_then(Value::as_str)
            .unwrap_or("high")
            .to_string(),
        ..Default::default()
    };
    let _ = hearth_chat::muse_glimmer::render(messages, tools, &opts);
}

/// Input layout: byte 0 selects the mode (bit 0: a fuzzed template source,
/// bit 7: add the generation prompt). Mode 0: the rest is a conversation in
/// JSON, rendered by every packaged template and by Muse Glimmer. Mode 1: the
/// rest is `SOURCE \0 CONVERSATION-JSON`; SOURCE is compiled and, if it
/// compiles, rendered.
pub fn check_template(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let add_generation_prompt = mode & 0x80 != 0;
    if mode & 1 == 0 {
        let Ok(v) = serde_json::from_slice::<Value>(rest) else {
            return;
        };
        let (messages, tools, kwargs) = conversation(&v);
        render_everywhere(messages, tools, &kwargs, add_generation_prompt);
        return;
    }
    let (src, conv) = match rest.iter().position(|&b| b == 0) {
        Some(p) => (&rest[..p], &rest[p + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(src) = std::str::from_utf8(src) else {
        return;
    };
    let Ok(template) = hearth_chat::template::ChatTemplate::from_source(src, "<s>", "</s>") else {
        return;
    };
    let v = serde_json::from_slice::<Value>(conv).unwrap_or_else(|_| {
        json!({"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello", "tool_calls": [
                                 {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                             {"role": "tool", "content": "1"}],
               "tools": [{"type": "function", "function": {"name": "f"}}]})
    });
    let (messages, tools, kwargs) = conversation(&v);
    let _ = template.render(messages, tools, add_generation_prompt, &kwargs);
}

/// Request decoding: a body is a request or a client error (4xx), never a
/// panic or a server error. A decoded chat request is rendered as the server
/// would render it.
pub fn check_request(data: &[u8]) {
    use hearth_server::request::{parse_chat, parse_completion, parse_object, validate_session_id};
    let client_error = |e: &hearth_server::error::ApiError| {
        assert!(
            e.status.is_client_error(),
            "{} for {:?}",
            e.status,
            e.body()
        );
    };
    let _ = validate_session_id(&String::from_utf8_lossy(data)).map_err(|e| client_error(&e));
    let obj = match parse_object(data) {
        Ok(o) => o,
        Err(e) => return client_error(&e),
    };
    for header_session in [None, Some("s-1".to_string())] {
        match parse_chat(&obj, "model", header_session.clone()) {
            Ok(req) => {
                render_everywhere(&req.messages, req.tools.as_ref(), &req.kwargs, true);
            }
            Err(e) => client_error(&e),
        }
        if let Err(e) = parse_completion(&obj, "model", header_session) {
            client_error(&e);
        }
    }
    // The other dialects' typed requests, translated onto the chat request
    // and validated as it is.
    use hearth_server::api;
    let stored = |_: &str| {
        Some(vec![
            serde_json::json!({"role": "user", "content": "earlier"}),
        ])
    };
    for chat in [
        api::anthropic::MessagesRequest::parse(&obj),
        api::ollama::chat_body(&obj),
        api::ollama::generate_body(&obj),
        api::responses::to_chat(&obj, stored),
    ] {
        match chat {
            Ok(body) => match parse_chat(&body, "model", None) {
                Ok(req) => render_everywhere(&req.messages, req.tools.as_ref(), &req.kwargs, true),
                Err(e) => client_error(&e),
            },
            Err(e) => client_error(&e),
        }
    }
}

/// A bounded fuzz smoke that runs without libFuzzer (crates/server/tests/
/// fuzz_smoke.rs includes this file, so the workspace's `cargo test` runs it;
/// or `cargo test --lib --no-default-features` here): each target's
/// committed seeds, then mutations of them (bit flips, byte edits, inserted
/// markers, splices of two seeds) from a fixed-seed generator until the
/// target's time budget (HEARTH_FUZZ_SMOKE_SECONDS, default 5) is spent. Not
/// coverage-guided: libFuzzer runs (scripts/fuzz-smoke.sh) go deeper. A
/// failing input is written to target/fuzz-smoke-failures/ and named in the
/// panic, to replay with `cargo fuzz run -s none TARGET FILE`.
#[cfg(test)]
mod smoke {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    use super::*;

    const MARKERS: &[&[u8]] = &[
        b"<tool_call>",
        b"</tool_call>",
        b"{\"name\": \"",
        b"\"arguments\": {",
        b"<function=",
        b"<parameter=",
        b"</parameter>",
        b"<atem:function_calls>",
        b"<atem:invoke name=\"",
        b"<atem:parameter name=\"",
        b"</atem:invoke>",
        b"<|message|>",
        b" to=",
        b"<|channel|>",
        b"<|start|>assistant",
        b"<|eom|>",
        b"<think>",
        b"</think>",
        b"\"",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\n",
        b"\\u",
        b"{{",
        b"}}",
        b"{%",
        b"%}",
    ];

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], mut d: Vec<u8>) -> Vec<u8> {
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(d.len() + 1);
            match rng.below(7) {
                0 if !d.is_empty() => {
                    let i = rng.below(d.len());
                    d[i] ^= 1 << rng.below(8);
                }
                1 if !d.is_empty() => {
                    let i = rng.below(d.len());
                    d[i] = rng.next() as u8;
                }
                2 => {
                    let m = MARKERS[rng.below(MARKERS.len())];
                    d.splice(at..at, m.iter().copied());
                }
                3 if at < d.len() => {
                    let end = (at + 1 + rng.below(16)).min(d.len());
                    d.drain(at..end);
                }
                4 if at < d.len() => {
                    let end = (at + 1 + rng.below(32)).min(d.len());
                    let piece = d[at..end].to_vec();
                    d.splice(at..at, piece);
                }
                5 => {
                    let other = &seeds[rng.below(seeds.len())];
                    let from = rng.below(other.len() + 1);
                    d.truncate(at);
                    d.extend_from_slice(&other[from..]);
                }
                _ => d.insert(at, rng.next() as u8),
            }
        }
        d
    }

    /// This crate's directory, whichever crate includes this file.
    fn fuzz_dir() -> PathBuf {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        match root.join("seeds").is_dir() {
            true => root,
            false => root.join("../../fuzz"),
        }
    }

    fn run(target: &str, check: fn(&[u8])) {
        let dir = fuzz_dir().join("seeds").join(target);
        let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
        let budget: f64 = std::env::var("HEARTH_FUZZ_SMOKE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0);
        let deadline = Instant::now() + Duration::from_secs_f64(budget);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
        let mut execs = 0u64;
        let mut i = 0usize;
        loop {
            let input = if i < seeds.len() {
                seeds[i].clone()
            } else if Instant::now() >= deadline {
                break;
            } else {
                let base = seeds[rng.below(seeds.len())].clone();
                mutate(&mut rng, &seeds, base)
            };
            i += 1;
            if catch_unwind(AssertUnwindSafe(|| check(&input))).is_err() {
                let out = fuzz_dir()
                    .join("../target/fuzz-smoke-failures")
                    .join(target);
                std::fs::create_dir_all(&out).unwrap();
                let file = out.join(format!("crash-{execs}"));
                std::fs::write(&file, &input).unwrap();
                panic!(
                    "{target}: input {} failed (saved to {})",
                    execs,
                    file.display()
                );
            }
            execs += 1;
        }
        eprintln!(
            "fuzz smoke {target}: {execs} executions ({} seeds), no failure",
            seeds.len()
        );
    }

    #[test]
    fn gguf_reader() {
        run("gguf_reader", check_gguf);
    }
    #[test]
    fn chat_template() {
        run("chat_template", check_template);
    }
    #[test]
    fn server_request() {
        run("server_request", check_request);
    }
    #[test]
    fn parse_hermes() {
        run("parse_hermes", |d| check_parser(OutputFormat::Hermes, d));
    }
    #[test]
    fn parse_qwen3_xml() {
        run("parse_qwen3_xml", |d| {
            check_parser(OutputFormat::Qwen3Xml, d)
        });
    }
    #[test]
    fn parse_atem() {
        run("parse_atem", |d| check_parser(OutputFormat::Atem, d));
    }
    #[test]
    fn parse_muse_glimmer() {
        run("parse_muse_glimmer", |d| {
            check_parser(OutputFormat::MuseGlimmer, d)
        });
    }
    #[test]
    fn parse_harmony() {
        run("parse_harmony", |d| check_parser(OutputFormat::Harmony, d));
    }
    #[test]
    fn parse_plain() {
        run("parse_plain", |d| check_parser(OutputFormat::Plain, d));
    }
}
