//! Shared by the parser tests: feeding a parser whole and in pieces, the
//! chunking-invariance and argument-stream checks, and the client's view of
//! an event list.
#![allow(dead_code)]

use hearth_chat::parser::{
    merge_events, parser_with, streamed_arguments, ChatEvent, FinishHint, FinishReason,
    OutputFormat, ParserOptions,
};
use serde_json::{json, Value};

pub const S: &str = "<|start|>";
pub const M: &str = "<|message|>";
pub const E: &str = "<|eom|>";
pub const T: &str = "<|eot|>";

pub fn tools_weather_add() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "add",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer"}, "b": {"type": "integer"}}}}},
    ])
}

pub fn feed_chunks(
    format: &str,
    tools: Option<&Value>,
    opts: &ParserOptions,
    chunks: &[&str],
    hint: FinishHint,
) -> Vec<ChatEvent> {
    let format = OutputFormat::from_name(format).expect("known format");
    let mut p = parser_with(format, tools, opts.clone()).unwrap();
    let mut events = Vec::new();
    for c in chunks {
        events.extend(p.feed(c));
    }
    events.extend(p.finish(hint));
    merge_events(events)
}

/// Parses `text` whole, checks chunking invariance and the argument-stream
/// invariant, and returns the merged events.
pub fn parse_opts(
    format: &str,
    tools: Option<&Value>,
    opts: &ParserOptions,
    text: &str,
    hint: FinishHint,
) -> Vec<ChatEvent> {
    let whole = feed_chunks(format, tools, opts, &[text], hint);
    for (i, _) in text.char_indices().skip(1) {
        let split = feed_chunks(format, tools, opts, &[&text[..i], &text[i..]], hint);
        assert_eq!(split, whole, "{format}: split at byte {i} of {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    let by_char = feed_chunks(format, tools, opts, &chars, hint);
    assert_eq!(by_char, whole, "{format}: char by char {text:?}");
    check_arg_stream(&whole);
    match whole.last() {
        Some(ChatEvent::End { .. }) => {}
        other => panic!("last event must be End, got {other:?}"),
    }
    whole
}

/// [`parse`] as Muse Glimmer output, with the weather and add tools.
pub fn parse_mg(text: &str, hint: FinishHint) -> Vec<ChatEvent> {
    parse("muse-glimmer", Some(&tools_weather_add()), text, hint)
}

pub fn parse(format: &str, tools: Option<&Value>, text: &str, hint: FinishHint) -> Vec<ChatEvent> {
    parse_opts(format, tools, &ParserOptions::default(), text, hint)
}

/// For every confirmed call, the argument deltas of its index concatenate to
/// JSON equal to `arguments` (streaming clients rebuild exactly the call).
pub fn check_arg_stream(events: &[ChatEvent]) {
    for e in events {
        if let ChatEvent::ToolCall {
            index, arguments, ..
        } = e
        {
            let streamed = streamed_arguments(events, *index);
            let v: Value = serde_json::from_str(&streamed)
                .unwrap_or_else(|err| panic!("streamed args {streamed:?}: {err}"));
            assert_eq!(&v, arguments, "streamed {streamed:?}");
        }
    }
}

/// The client's view: reasoning, content (None when empty), confirmed calls
/// (index, name, arguments as JSON text in key order), finish reason.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    pub calls: Vec<(usize, String, String)>,
    pub finish: FinishReason,
}

impl Outcome {
    pub fn new(
        reasoning: Option<&str>,
        content: Option<&str>,
        calls: Vec<(usize, String, String)>,
        finish: FinishReason,
    ) -> Outcome {
        Outcome {
            reasoning: reasoning.map(String::from),
            content: content.map(String::from),
            calls,
            finish,
        }
    }

    /// Reasoning and content.
    pub fn texts(&self) -> (Option<&str>, Option<&str>) {
        (self.reasoning.as_deref(), self.content.as_deref())
    }
}

pub fn outcome(events: &[ChatEvent]) -> Outcome {
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut finish = None;
    for e in events {
        match e {
            ChatEvent::Reasoning(t) => reasoning.push_str(t),
            ChatEvent::Content(t) => content.push_str(t),
            ChatEvent::ToolCall {
                index,
                name,
                arguments,
                ..
            } => calls.push((*index, name.clone(), arguments.to_string())),
            ChatEvent::End { finish_reason } => finish = Some(*finish_reason),
            _ => {}
        }
    }
    let some = |s: String| if s.is_empty() { None } else { Some(s) };
    Outcome {
        reasoning: some(reasoning),
        content: some(content),
        calls,
        finish: finish.expect("an End event"),
    }
}

/// [`parse`], seen by the client.
pub fn parsed(format: &str, tools: Option<&Value>, text: &str, hint: FinishHint) -> Outcome {
    outcome(&parse(format, tools, text, hint))
}

/// [`parse_opts`], seen by the client.
pub fn parsed_opts(
    format: &str,
    tools: Option<&Value>,
    opts: &ParserOptions,
    text: &str,
    hint: FinishHint,
) -> Outcome {
    outcome(&parse_opts(format, tools, opts, text, hint))
}

pub fn warnings(events: &[ChatEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, ChatEvent::Warning { .. }))
        .count()
}

pub fn call(index: usize, name: &str, args: Value) -> (usize, String, String) {
    (index, name.to_string(), args.to_string())
}

pub fn atem_block(invokes: &[(&str, &[(&str, &str)])]) -> String {
    let mut s = String::from("<atem:function_calls>\n");
    for (name, params) in invokes {
        s.push_str(&format!("<atem:invoke name=\"{name}\">\n"));
        for (k, v) in params.iter() {
            s.push_str(&format!(
                "<atem:parameter name=\"{k}\">{v}</atem:parameter>\n"
            ));
        }
        s.push_str("</atem:invoke>\n");
    }
    s.push_str("</atem:function_calls>");
    s
}

/// splitmix64: a small, seedable, dependency-free generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}
