//! The Muse Glimmer parser cases of llama.cpp 11434's tests/test-chat.cpp
//! ("Muse Glimmer format tests", output after the generation prompt
//! `<|start|>assistant`), re-expressed as facts about hearth's parser: the
//! same model outputs must give the same reasoning, content and tool calls.
//! The tool is test-chat.cpp's `special_function` (one integer `arg1`).

use hearth_chat::parser::{merge_events, parse_all, parser_for, ChatEvent, FinishHint};
use serde_json::{json, Value};

const CALL: &str = "<atem:function_calls>\n<atem:invoke name=\"special_function\">\n<atem:parameter name=\"arg1\">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "special_function", "description": "I'm special",
        "parameters": {"type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}},
        "required": ["arg1"]}}}])
}

#[derive(Debug, Default, PartialEq)]
struct Msg {
    reasoning: String,
    content: String,
    calls: Vec<(String, Value)>,
}

fn parse(text: &str) -> Msg {
    let mut p = parser_for("muse-glimmer", Some(&tools())).unwrap();
    let mut m = Msg::default();
    for e in merge_events(parse_all(p.as_mut(), text, FinishHint::Stop)) {
        match e {
            ChatEvent::Reasoning(r) => m.reasoning.push_str(&r),
            ChatEvent::Content(c) => m.content.push_str(&c),
            ChatEvent::ToolCall {
                name, arguments, ..
            } => m.calls.push((name, arguments)),
            _ => {}
        }
    }
    m
}

fn msg(reasoning: &str, content: &str, calls: &[(&str, Value)]) -> Msg {
    Msg {
        reasoning: reasoning.into(),
        content: content.into(),
        calls: calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.clone()))
            .collect(),
    }
}

/// "A plain answer is unaffected".
#[test]
fn plain_answer() {
    let got = parse(" to=user<|message|>Hello, world!\nWhat's up?<|eot|>");
    assert_eq!(got, msg("", "Hello, world!\nWhat's up?", &[]));
}

/// "A tool call as the first message of the turn": the output starts at " to=".
#[test]
fn tool_call_first() {
    let got = parse(&format!(" to=special_function<|message|>{CALL}"));
    assert_eq!(
        got,
        msg("", "", &[("special_function", json!({"arg1": 1}))])
    );
}

/// "Inform then act": an answer closed by <|eom|>, then a call in the same generation.
#[test]
fn inform_then_act() {
    let got = parse(&format!(
        " to=user<|message|>Hello, world!\nWhat's up?<|eom|><|start|>assistant to=special_function<|message|>{CALL}"
    ));
    assert_eq!(
        got,
        msg(
            "",
            "Hello, world!\nWhat's up?",
            &[("special_function", json!({"arg1": 1}))]
        )
    );
}

/// "Markup quoted in an answer has no preceding <|eom|>, so it stays content".
#[test]
fn quoted_markup_stays_content() {
    let got = parse(&format!(
        " to=user<|message|>You invoke it like this:\n{CALL}<|eot|>"
    ));
    assert_eq!(
        got,
        msg("", &format!("You invoke it like this:\n{CALL}"), &[])
    );
}

/// "Structured output, straight to the final answer".
#[test]
fn structured_output() {
    let json = r#"{"amount": 123.45, "date": "2025-12-03"}"#;
    let got = parse(&format!(" to=user<|message|>{json}"));
    assert_eq!(got, msg("", json, &[]));
}

/// "Structured output after a reasoning message: reasoning stays free-form".
#[test]
fn structured_output_after_reasoning() {
    let json = r#"{"amount": 123.45, "date": "2025-12-03"}"#;
    let got = parse(&format!(
        " to=self<|message|>I need to output the invoice details in JSON<|eom|><|start|>assistant to=user<|message|>{json}"
    ));
    assert_eq!(
        got,
        msg("I need to output the invoice details in JSON", json, &[])
    );
}

/// "Tool markup inside the analysis channel is reasoning, not a call".
#[test]
fn markup_in_reasoning_is_reasoning() {
    let got = parse(&format!(
        " to=self<|message|>I could use {CALL} here<|eom|><|start|>assistant to=user<|message|>Hello!<|eot|>"
    ));
    assert_eq!(got, msg(&format!("I could use {CALL} here"), "Hello!", &[]));
}
