//! Round trip: random tool calls (namespaced names, nested JSON arguments,
//! strings with markup look-alikes, whitespace and non-ASCII text), written in
//! each format's assistant syntax by its renderer and parsed back, must give the
//! same calls, in order, with the same argument key order; fed in random chunks
//! the merged events equal those of the whole text. Deterministic seed.
//!
//! The renderers are ours too, but each follows the spec's grammar (§2.4, §3,
//! §7, §8) and the parsers never see the arguments, only the text, so a
//! disagreement on values, escaping or structural ends shows up here.

mod common;

use common::{feed_chunks, Rng};
use hearth_chat::muse_glimmer::{self, RenderOptions};
use hearth_chat::parser::{
    atem, harmony, hermes, qwen3_xml, streamed_arguments, ChatEvent, FinishHint, FinishReason,
    ParserOptions,
};
use serde_json::{json, Map, Value};

/// Pieces of string values: prose, non-ASCII, whitespace and every format's
/// markup, so values hold closing tags of all the syntaxes.
const STRING_PIECES: &[&str] = &[
    "hello",
    " world",
    "Paris",
    "é",
    "日本語",
    "🦀",
    " ",
    "  ",
    "\n",
    "\t",
    "\"quoted\"",
    "a < b && c > d",
    "<b>bold</b>",
    "</atem:parameter>",
    "</atem:invoke>",
    "</atem:function_calls>",
    "<atem:invoke name=\"x\">",
    "<atem:function_calls>",
    "</parameter>",
    "</function>",
    "<function=f>",
    "<parameter=p>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "{\"k\": [1, 2]}",
    "\\",
    "to=user",
    " to=self",
    "goto=x",
    "null",
    "42",
    "-3.5",
    "true",
];

fn random_string(rng: &mut Rng) -> String {
    let n = rng.below(6);
    (0..n).map(|_| *rng.pick(STRING_PIECES)).collect()
}

fn random_float(rng: &mut Rng) -> f64 {
    let mantissa = (rng.below(2_000_001) as f64 - 1_000_000.0) / 64.0;
    let scale = *rng.pick(&[1.0, 1e-7, 1e-3, 1e3, 1e17, 1e-30]);
    mantissa * scale
}

fn random_json(rng: &mut Rng, depth: usize) -> Value {
    let kinds = if depth == 0 { 5 } else { 7 };
    match rng.below(kinds) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 1),
        2 => json!(rng.below(1_000_000) as i64 - 500_000),
        3 => json!(random_float(rng)),
        4 => Value::String(random_string(rng)),
        5 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_json(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(4) {
                m.insert(random_key(rng), random_json(rng, depth - 1));
            }
            Value::Object(m)
        }
    }
}

fn random_key(rng: &mut Rng) -> String {
    let stem = rng.pick(&[
        "path",
        "city",
        "x",
        "query_text",
        "n",
        "opts",
        "a_b",
        "Data2",
    ]);
    format!("{stem}{}", rng.below(5))
}

const TYPES: [&str; 6] = ["string", "integer", "number", "boolean", "array", "object"];

fn value_of_type(rng: &mut Rng, ty: &str) -> Value {
    match ty {
        "string" => Value::String(random_string(rng)),
        "integer" => json!(rng.next() as i64 >> rng.below(60)),
        "number" => json!(random_float(rng)),
        "boolean" => Value::Bool(rng.below(2) == 1),
        "array" => Value::Array((0..rng.below(4)).map(|_| random_json(rng, 2)).collect()),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(4) {
                m.insert(random_key(rng), random_json(rng, 2));
            }
            Value::Object(m)
        }
    }
}

struct Case {
    tools: Value,
    /// (name, arguments) in call order.
    calls: Vec<(String, Map<String, Value>)>,
}

fn random_case(rng: &mut Rng) -> Case {
    let names = [
        "get_weather",
        "fs.read_file",
        "fs.write_file",
        "bash",
        "search-web",
        "calc2",
    ];
    let mut tools = Vec::new();
    let mut schemas: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for name in names {
        let params: Vec<(String, String)> = (0..1 + rng.below(4))
            .map(|i| {
                (
                    format!("{}_{i}", random_key(rng)),
                    rng.pick(&TYPES).to_string(),
                )
            })
            .collect();
        let props: Map<String, Value> = params
            .iter()
            .map(|(k, t)| (k.clone(), json!({ "type": t })))
            .collect();
        tools.push(json!({"type": "function", "function": {"name": name,
            "parameters": {"type": "object", "properties": props}}}));
        schemas.push((name.to_string(), params));
    }
    let calls = (0..1 + rng.below(3))
        .map(|_| {
            let (name, params) = rng.pick(&schemas);
            let mut args = Map::new();
            for (k, t) in params {
                if rng.below(5) > 0 {
                    args.insert(k.clone(), value_of_type(rng, t));
                }
            }
            (name.clone(), args)
        })
        .collect();
    Case {
        tools: Value::Array(tools),
        calls,
    }
}

/// §4.2's accepted limit: a value whose text holds a closing tag followed by
/// something structural mis-splits in every implementation; such cases are
/// not generated. Special-token text never appears in values (it would be a
/// control token).
fn representable(format: &str, case: &Case) -> bool {
    let (close, followers): (&str, &[&str]) = match format {
        "atem" | "muse-glimmer" => ("</atem:parameter>", &["<atem:parameter", "</atem:invoke>"]),
        "qwen3-xml" => ("</parameter>", &["<parameter=", "</function>"]),
        _ => ("", &[]),
    };
    case.calls.iter().all(|(_, args)| {
        args.values().all(|v| {
            let text = atem::render_value(v);
            if text.contains("<|") {
                return false;
            }
            if close.is_empty() {
                return true;
            }
            text.match_indices(close).all(|(p, _)| {
                let rest = text[p + close.len()..].trim_start();
                !followers.iter().any(|f| rest.starts_with(f))
            })
        })
    })
}

const PROSE: &[&str] = &[
    "Sure", "let me", "check", "that", "for you:", "ça va", "🙂", "x > 1",
];

fn random_prose(rng: &mut Rng) -> String {
    let n = rng.below(4);
    let words: Vec<&str> = (0..n).map(|_| *rng.pick(PROSE)).collect();
    words.join(" ")
}

/// Renders the assistant output (what follows the generation prompt) in `format`.
fn render_output(format: &str, case: &Case, prose: &str) -> String {
    let sep = if prose.is_empty() { "" } else { " " };
    match format {
        "atem" => format!(
            "{prose}{sep}{}",
            atem::render_block(case.calls.iter().map(|(n, a)| (n.as_str(), a)))
        ),
        "hermes" | "qwen3-xml" => {
            let render_call = if format == "hermes" {
                hermes::render_call
            } else {
                qwen3_xml::render_call
            };
            let calls: Vec<String> = case.calls.iter().map(|(n, a)| render_call(n, a)).collect();
            format!("{prose}{sep}{}", calls.join("\n"))
        }
        "harmony" => {
            let mut s = String::new();
            if !prose.is_empty() {
                s.push_str(&format!("<|channel|>analysis<|message|>{prose}<|end|>"));
            }
            for (n, a) in &case.calls {
                s.push_str(&harmony::render_call(n, a));
            }
            // The generation prompt already wrote the first `<|start|>assistant`.
            s.strip_prefix("<|start|>assistant")
                .unwrap_or(&s)
                .to_string()
        }
        "muse-glimmer" => {
            let tool_calls: Vec<Value> = case
                .calls
                .iter()
                .enumerate()
                .map(|(i, (n, a))| {
                    json!({"id": format!("c{i}"), "type": "function",
                        "function": {"name": n, "arguments": serde_json::to_string(a).unwrap()}})
                })
                .collect();
            let mut assistant = json!({"role": "assistant", "tool_calls": tool_calls});
            if !prose.is_empty() {
                assistant["reasoning_content"] = json!(prose);
            }
            let messages = json!([{"role": "user", "content": "q"}, assistant]);
            let opts = RenderOptions {
                add_generation_prompt: false,
                ..Default::default()
            };
            let prompt = muse_glimmer::render(&messages, Some(&case.tools), &opts).unwrap();
            let user_end = "<|start|>user<|message|>q<|eot|>";
            let at = prompt.find(user_end).unwrap() + user_end.len();
            prompt[at..]
                .strip_prefix("<|start|>assistant")
                .unwrap()
                .to_string()
        }
        _ => unreachable!(),
    }
}

fn feed(format: &str, tools: &Value, chunks: &[&str]) -> Vec<ChatEvent> {
    feed_chunks(
        format,
        Some(tools),
        &ParserOptions::default(),
        chunks,
        FinishHint::Stop,
    )
}

fn random_chunks<'a>(rng: &mut Rng, text: &'a str) -> Vec<&'a str> {
    let mut chunks = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut n = (1 + rng.below(12)).min(rest.len());
        while !rest.is_char_boundary(n) {
            n += 1;
        }
        chunks.push(&rest[..n]);
        rest = &rest[n..];
    }
    chunks
}

#[test]
fn random_calls_round_trip_in_every_format() {
    // HEARTH_ROUNDTRIP_SEED / _CASES widen the search; the default is fixed.
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mut rng = Rng(env("HEARTH_ROUNDTRIP_SEED", 0x5EED_C0DE));
    let cases = env("HEARTH_ROUNDTRIP_CASES", 150);
    for format in ["atem", "muse-glimmer", "hermes", "qwen3-xml", "harmony"] {
        let mut checked = 0;
        while checked < cases {
            let case = random_case(&mut rng);
            if !representable(format, &case) {
                continue;
            }
            checked += 1;
            let prose = random_prose(&mut rng);
            let text = render_output(format, &case, &prose);
            let events = feed(format, &case.tools, &[&text]);

            let calls: Vec<(String, String)> = events
                .iter()
                .filter_map(|e| match e {
                    ChatEvent::ToolCall {
                        name, arguments, ..
                    } => Some((name.clone(), arguments.to_string())),
                    _ => None,
                })
                .collect();
            let want: Vec<(String, String)> = case
                .calls
                .iter()
                .map(|(n, a)| (n.clone(), Value::Object(a.clone()).to_string()))
                .collect();
            assert_eq!(calls, want, "{format}: {text:?}");
            let indices: Vec<usize> = events
                .iter()
                .filter_map(|e| match e {
                    ChatEvent::ToolCall { index, .. } => Some(*index),
                    _ => None,
                })
                .collect();
            assert_eq!(indices, (0..want.len()).collect::<Vec<_>>());

            // Prose comes back on its channel; nothing else leaks into text.
            let (reasoning, content) =
                events
                    .iter()
                    .fold((String::new(), String::new()), |(mut r, mut c), e| {
                        match e {
                            ChatEvent::Reasoning(t) => r.push_str(t),
                            ChatEvent::Content(t) => c.push_str(t),
                            _ => {}
                        }
                        (r, c)
                    });
            let (want_r, want_c) = match format {
                "muse-glimmer" | "harmony" => (prose.as_str(), ""),
                _ => ("", prose.as_str()),
            };
            assert_eq!(
                (reasoning.as_str(), content.as_str()),
                (want_r, want_c),
                "{format}: {text:?}"
            );
            assert_eq!(
                events.last(),
                Some(&ChatEvent::End {
                    finish_reason: FinishReason::ToolCalls
                })
            );

            // Streamed argument text rebuilds each call.
            for e in &events {
                if let ChatEvent::ToolCall {
                    index, arguments, ..
                } = e
                {
                    let streamed = streamed_arguments(&events, *index);
                    let v: Value = serde_json::from_str(&streamed).unwrap();
                    assert_eq!(&v, arguments, "{format}: streamed {streamed:?}");
                }
            }

            for _ in 0..3 {
                let chunks = random_chunks(&mut rng, &text);
                assert_eq!(
                    feed(format, &case.tools, &chunks),
                    events,
                    "{format}: {chunks:?}"
                );
            }
        }
    }
}

/// Fragments of every format's markup, cut and mixed with prose.
const SOUP: &[&str] = &[
    "<|start|>",
    "assistant",
    " to=",
    "to=",
    "self",
    "user",
    "get_weather",
    "<|message|>",
    "<|eom|>",
    "<|eot|>",
    "<|end_of_text|>",
    " constrain=json",
    "<|channel|>",
    "analysis",
    "final",
    "commentary",
    " to=functions.get_weather",
    " <|constrain|>json",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<atem:function_calls>",
    "</atem:function_calls>",
    "<atem:invoke name=\"get_weather\">",
    "<atem:invoke",
    " name=\"",
    "</atem:invoke>",
    "<atem:parameter name=\"city\">",
    "</atem:parameter>",
    "<tool_call>",
    "</tool_call>",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}",
    "{",
    "}",
    "\"",
    "[",
    "<function=get_weather>",
    "<parameter=city>",
    "</parameter>",
    "</function>",
    "<think>",
    "</think>",
    "<|im_end|>",
    "\n",
    " ",
    "  ",
    "Paris",
    "é🦀",
    "<",
    ">",
    "goto=",
    "=",
    "<|",
];

/// Random markup soup: never panics, and the merged events do not depend on
/// how the text is split (a regression guard for odd states: malformed blocks,
/// stray specials, half headers).
#[test]
fn random_markup_soup_is_chunking_invariant() {
    let mut rng = Rng(std::env::var("SOUP_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xC0FFEE));
    let tools = json!([{"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}}}]);
    for format in [
        "atem",
        "muse-glimmer",
        "hermes",
        "qwen3-xml",
        "harmony",
        "plain",
    ] {
        for _ in 0..std::env::var("SOUP_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400)
        {
            let text: String = (0..rng.below(40)).map(|_| *rng.pick(SOUP)).collect();
            let whole = feed(format, &tools, &[&text]);
            for _ in 0..3 {
                let chunks = random_chunks(&mut rng, &text);
                assert_eq!(feed(format, &tools, &chunks), whole, "{format}: {chunks:?}");
            }
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(feed(format, &tools, &chars), whole, "{format}: {text:?}");
        }
    }
}
