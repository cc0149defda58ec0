//! Qwen2.5-Coder's untagged tool calls (spec §8.1 profile fallback): the whole
//! trimmed content, fence removed, being `{"name": REGISTERED, "arguments": {…}}`
//! (or a list of those) is a call; anything else stays content. Checked whole
//! and at every chunking.

mod common;

use common::{call, feed_chunks, outcome, Outcome};
use hearth_chat::parser::{parser_for, ChatEvent, FinishHint, FinishReason, ParserOptions};
use serde_json::json;

fn tools() -> serde_json::Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// The client's view of `text`, checked to be the same for every two-piece
/// split. (Not `common::parse`: a call found by the fallback is confirmed
/// whole at the end, so no argument deltas stream.)
fn parse(text: &str) -> Outcome {
    let opts = ParserOptions::default();
    let run =
        |pieces: &[&str]| feed_chunks("hermes", Some(&tools()), &opts, pieces, FinishHint::Stop);
    let whole = run(&[text]);
    for (i, _) in text.char_indices().skip(1) {
        assert_eq!(
            run(&[&text[..i], &text[i..]]),
            whole,
            "split at {i} of {text:?}"
        );
    }
    outcome(&whole)
}

/// `text` is one `get_weather` call for `city` and nothing else.
fn assert_one_weather_call(text: &str, city: &str) {
    let o = parse(text);
    assert_eq!(
        o,
        Outcome::new(
            None,
            None,
            vec![call(0, "get_weather", json!({ "city": city }))],
            FinishReason::ToolCalls
        )
    );
}

#[test]
fn fenced_json_block_is_a_call() {
    // What qwen2.5-coder-0.5b writes at temperature 0 for a weather question.
    assert_one_weather_call(
        "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```",
        "Paris",
    );
}

#[test]
fn bare_object_and_list_are_calls() {
    assert_one_weather_call(
        " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}} ",
        "Oslo",
    );
    let o = parse("[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"B\"}}]");
    assert_eq!(o.calls.len(), 2);
    assert_eq!(o.calls[1], call(1, "get_weather", json!({"city": "B"})));
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
        let o = parse(text);
        assert!(o.calls.is_empty(), "{text}");
        assert_eq!(o.content.as_deref(), Some(text));
        assert_eq!(o.finish, FinishReason::Stop);
    }
}

#[test]
fn ordinary_text_is_not_held_back() {
    let mut p = parser_for("hermes", Some(&tools())).unwrap();
    assert_eq!(p.feed("Sure"), vec![ChatEvent::Content("Sure".into())]);
}

#[test]
fn tagged_calls_still_work() {
    assert_one_weather_call(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
        "Rome",
    );
}
