//! Qwen2.5-Coder's untagged tool calls (spec §8.1 profile fallback): the whole
//! trimmed content, fence removed, being `{"name": REGISTERED, "arguments": {…}}`
//! (or a list of those) is a call; anything else stays content. Checked whole
//! and at every chunking.

use hearth_chat::parser::{merge_events, parser_for, ChatEvent, FinishHint, FinishReason};
use serde_json::json;

fn tools() -> serde_json::Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// Merged events, checked to be the same for every two-piece split.
fn parse(text: &str) -> Vec<ChatEvent> {
    let run = |pieces: &[&str]| {
        let mut p = parser_for("hermes", Some(&tools())).unwrap();
        let mut ev = Vec::new();
        for piece in pieces {
            ev.extend(p.feed(piece));
        }
        ev.extend(p.finish(FinishHint::Stop));
        merge_events(ev)
    };
    let whole = run(&[text]);
    for (i, _) in text.char_indices().skip(1) {
        assert_eq!(
            run(&[&text[..i], &text[i..]]),
            whole,
            "split at {i} of {text:?}"
        );
    }
    whole
}

fn calls(ev: &[ChatEvent]) -> Vec<(String, serde_json::Value)> {
    ev.iter()
        .filter_map(|e| match e {
            ChatEvent::ToolCall {
                name, arguments, ..
            } => Some((name.clone(), arguments.clone())),
            _ => None,
        })
        .collect()
}

fn content(ev: &[ChatEvent]) -> String {
    ev.iter()
        .filter_map(|e| {
            if let ChatEvent::Content(s) = e {
                Some(s.as_str())
            } else {
                None
            }
        })
        .collect()
}

fn finish(ev: &[ChatEvent]) -> FinishReason {
    match ev.last() {
        Some(ChatEvent::End { finish_reason }) => *finish_reason,
        other => panic!("no end event: {other:?}"),
    }
}

#[test]
fn fenced_json_block_is_a_call() {
    // What qwen2.5-coder-0.5b writes at temperature 0 for a weather question.
    let ev = parse("```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```");
    assert_eq!(
        calls(&ev),
        vec![("get_weather".to_string(), json!({"city": "Paris"}))]
    );
    assert_eq!(content(&ev), "");
    assert_eq!(finish(&ev), FinishReason::ToolCalls);
}

#[test]
fn bare_object_and_list_are_calls() {
    let ev = parse(" {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}} ");
    assert_eq!(
        calls(&ev),
        vec![("get_weather".to_string(), json!({"city": "Oslo"}))]
    );
    let ev = parse("[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"B\"}}]");
    assert_eq!(calls(&ev).len(), 2);
    assert_eq!(calls(&ev)[1].1, json!({"city": "B"}));
}

#[test]
fn other_json_and_text_stay_content() {
    for text in [
        "{\"name\": \"unknown_tool\", \"arguments\": {}}",
        "{\"city\": \"Paris\"}",
        "```python\nprint(1)\n```",
        "The weather tool needs a city.",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} and more text",
    ] {
        let ev = parse(text);
        assert!(calls(&ev).is_empty(), "{text}");
        assert_eq!(content(&ev), text);
        assert_eq!(finish(&ev), FinishReason::Stop);
    }
}

#[test]
fn ordinary_text_is_not_held_back() {
    let mut p = parser_for("hermes", Some(&tools())).unwrap();
    assert_eq!(p.feed("Sure"), vec![ChatEvent::Content("Sure".into())]);
}

#[test]
fn tagged_calls_still_work() {
    let ev = parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
    assert_eq!(
        calls(&ev),
        vec![("get_weather".to_string(), json!({"city": "Rome"}))]
    );
}
