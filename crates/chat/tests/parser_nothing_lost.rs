//! Issue 19, "nothing lost in parsing": text that is not a well-formed call
//! comes back as content, verbatim and in order; a malformed or cut-off call
//! block is reported with a warning and its text kept; the finish reason is
//! the engine's (`stop`/`length`) unless a call was confirmed. Every case runs
//! in every format it applies to, whole, split at every char boundary and char
//! by char (the chunking-invariance machinery of parser_examples.rs).
//!
//! The expected outputs are the inputs themselves (or the stated part of
//! them): the property is "the client sees the model's text", which needs no
//! other reference.

mod common;

use common::*;
use hearth_chat::parser::{
    merge_events, parser_with, ChatEvent, FinishHint, FinishReason, OutputFormat, ParserOptions,
};
use serde_json::json;

fn warnings(events: &[ChatEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Warning { message } => Some(message.as_str()),
            _ => None,
        })
        .collect()
}

/// Parses `text` (with and without the weather/add tools), expects no call,
/// the whole text as content, `n_warnings` warnings, and finish from the hint.
fn verbatim(format: &str, text: &str, n_warnings: usize) {
    for tools in [None, Some(tools_weather_add())] {
        for hint in [FinishHint::Stop, FinishHint::Length] {
            let events = parse(format, tools.as_ref(), text, hint);
            let o = outcome(&events);
            let finish = match hint {
                FinishHint::Stop => FinishReason::Stop,
                FinishHint::Length => FinishReason::Length,
            };
            assert_eq!(
                (
                    o.content.as_deref(),
                    o.reasoning.as_deref(),
                    o.calls,
                    o.finish
                ),
                ((!text.is_empty()).then_some(text), None, vec![], finish),
                "{format}, tools {}: {text:?}",
                tools.is_some()
            );
            assert_eq!(
                warnings(&events).len(),
                n_warnings,
                "{format}: {text:?}: {events:?}"
            );
        }
    }
}

// ---- the issue's examples (Hermes) ----

#[test]
fn hermes_issue_examples() {
    // Returned only "The tag" before.
    verbatim(
        "hermes",
        "The tag <tool_call> is how I call tools, but here I just answer: 42.",
        1,
    );
    // Returned "Beforeafter" before.
    verbatim("hermes", "Before<tool_call>not json</tool_call> after", 1);
    // Lost its text and reported `stop` whatever the engine said before.
    verbatim(
        "hermes",
        "Hi <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1",
        1,
    );
}

#[test]
fn hermes_malformed_blocks() {
    for text in [
        // JSON that is not a call; an empty list; text after the JSON.
        "<tool_call>{\"foo\": 1}</tool_call> done",
        "<tool_call>[]</tool_call>",
        "<tool_call>[{\"name\": \"add\"}, 3]</tool_call>",
        "A <tool_call>{\"name\": \"add\", \"arguments\": {}} oops</tool_call> B",
        "<tool_call>{\"name\": \"add\", \"arguments\": \"not an object\"}</tool_call>",
        // Brackets that balance but are not JSON.
        "x <tool_call>{not json}</tool_call> y",
        // Unclosed at the end, whitespace included.
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n",
        "  lead <tool_call>  ",
    ] {
        verbatim("hermes", text, 1);
    }
    // No trigger at all: no warning.
    verbatim("hermes", "a </tool_call> b <tool_cal", 0);
    verbatim("hermes", "", 0);
}

#[test]
fn hermes_malformed_then_real_call() {
    let tools = tools_weather_add();
    let text = "Use <tool_call> tags. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
    let events = parse("hermes", Some(&tools), text, FinishHint::Stop);
    let o = outcome(&events);
    assert_eq!(o.content.as_deref(), Some("Use <tool_call> tags."));
    assert_eq!(o.calls, vec![call(0, "add", json!({"a": 1, "b": 2}))]);
    assert_eq!(o.finish, FinishReason::ToolCalls);
    assert_eq!(warnings(&events).len(), 1);
    // A doubled opening tag: the first is text, the second opens the call.
    let text = "<tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
    let o = parsed("hermes", Some(&tools), text, FinishHint::Stop);
    assert_eq!(o.content.as_deref(), Some("<tool_call>"));
    assert_eq!(o.calls, vec![call(0, "add", json!({}))]);
    // A confirmed call, then a cut-off one: the first counts, the second is
    // text (the whitespace after a confirmed call is dropped, as always).
    let text = "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"add\"";
    let o = parsed("hermes", Some(&tools), text, FinishHint::Length);
    assert_eq!(o.content.as_deref(), Some("<tool_call>{\"name\": \"add\""));
    assert_eq!(o.calls.len(), 1);
    assert_eq!(o.finish, FinishReason::ToolCalls);
}

#[test]
fn hermes_block_cut_by_end_token() {
    // `<|im_end|>` ends the message: the open block is content, the token is not.
    let text = "A <tool_call>{\"name\"<|im_end|>";
    let events = parse("hermes", None, text, FinishHint::Stop);
    let o = outcome(&events);
    assert_eq!(o.content.as_deref(), Some("A <tool_call>{\"name\""));
    assert_eq!(warnings(&events).len(), 1);
}

#[test]
fn bare_json_fallback_keeps_what_is_not_a_call() {
    // Hermes with tools wraps the untagged-JSON fallback (§8.1).
    for text in [
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n``` and then more",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
        "{\"name\": \"unknown_tool\", \"arguments\": {}}",
        "[1, 2, 3]",
        "```\nnot json\n```",
    ] {
        verbatim("hermes", text, 0);
    }
}

// ---- Qwen3-Coder XML ----

#[test]
fn qwen3_xml_hidden_text() {
    for (text, n) in [
        (
            "The tag <tool_call> is how I call tools, but here I just answer: 42.",
            1,
        ),
        ("Write <function=name> to call a tool.", 1),
        ("Before<tool_call>not a call</tool_call> after", 1),
        // Text after a bare function makes its `</function>` non-structural
        // (§8.2): the call is not confirmed, and none of its text is lost.
        (
            "<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\nDone.",
            1,
        ),
        // Text before the first parameter.
        (
            "<function=f>\nhmm\n<parameter=y>\n2\n</parameter>\n</function>",
            1,
        ),
        // A block with no call.
        ("a <tool_call>\n</tool_call> b", 1),
        // Cut off inside a value, a tag, a block.
        ("OK <function=f>\n<parameter=x>\nabc", 1),
        ("OK <function=f>\n<parameter=x", 1),
        ("OK <tool_call>\n<function=f", 1),
        ("<tool_call>\n", 1),
    ] {
        verbatim("qwen3-xml", text, n);
    }
}

#[test]
fn qwen3_xml_junk_block_then_real_call() {
    let tools = json!([{"name": "f", "parameters": {"properties": {"x": {"type": "string"}}}}]);
    let text = "<tool_call>\nnot a call\n</tool_call>\n<tool_call>\n<function=f>\n<parameter=x>\nv\n</parameter>\n</function>\n</tool_call>";
    let events = parse("qwen3-xml", Some(&tools), text, FinishHint::Stop);
    let o = outcome(&events);
    assert_eq!(
        o.content.as_deref(),
        Some("<tool_call>\nnot a call\n</tool_call>")
    );
    assert_eq!(o.calls, vec![call(0, "f", json!({"x": "v"}))]);
    assert_eq!(warnings(&events).len(), 1);
}

// ---- ATEM, bare and inside Muse Glimmer framing ----

#[test]
fn atem_hidden_text() {
    let cases = [
        ("The tag <atem:function_calls> is how I call tools.", 1),
        ("Write <atem:invoke name=\"x\"> to call x.", 1),
        ("<atem:function_calls>\n<atem:invoke name=\"get_weather\">\nhmm\n<atem:parameter name=\"city\">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>", 1),
        ("Sure! <atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Pa", 1),
        ("<atem:function_calls>", 1),
        ("x <atem:function_calls></atem:function_calls> y", 1),
        ("a </atem:invoke> b <atem:invok", 0),
    ];
    for (text, n) in cases {
        verbatim("atem", text, n);
        // The same text as the body of a `user` message: the answer, never
        // scanned for calls (llama.cpp 11434's muse-glimmer parser), so it is
        // content verbatim with no warning.
        let framed = format!(" to=user{M}{text}");
        for tools in [None, Some(tools_weather_add())] {
            let events = parse("muse-glimmer", tools.as_ref(), &framed, FinishHint::Stop);
            assert_eq!(
                outcome(&events).content.as_deref(),
                (!text.is_empty()).then_some(text),
                "{framed:?}"
            );
            assert_eq!(warnings(&events).len(), 0, "{framed:?}");
            assert!(outcome(&events).calls.is_empty(), "{framed:?}");
        }
    }
}

#[test]
fn muse_glimmer_tool_message_cut_by_end_of_message() {
    // `<|eom|>` ends the body with the block open: its text is content, and
    // the next message is parsed as usual.
    let block = "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Pa";
    let text = format!(" to=get_weather{M}{block}{E}{S}assistant to=user{M}Sorry.");
    let events = parse_mg(&text, FinishHint::Stop);
    let o = outcome(&events);
    assert_eq!(o.content, Some(format!("{block}\n\nSorry.")));
    assert_eq!((o.calls.len(), o.finish), (0, FinishReason::Stop));
    assert_eq!(warnings(&events).len(), 1);
}

// ---- Harmony ----

#[test]
fn harmony_call_bodies_that_are_not_calls() {
    let tools = tools_weather_add();
    for (body, end, hint, finish) in [
        ("not json", "<|call|>", FinishHint::Stop, FinishReason::Stop),
        ("[1, 2]", "<|call|>", FinishHint::Stop, FinishReason::Stop),
        ("{\"a\": 1", "", FinishHint::Length, FinishReason::Length),
        ("{\"a\": 1", "", FinishHint::Stop, FinishReason::Stop),
    ] {
        let text = format!(
            "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{body}{end}"
        );
        let events = parse("harmony", Some(&tools), &text, hint);
        let o = outcome(&events);
        assert_eq!(
            (o.content.as_deref(), o.calls.len(), o.finish),
            (Some(body), 0, finish),
            "{text:?}"
        );
        assert_eq!(warnings(&events).len(), 1);
    }
    // Tool syntax of other formats in a final answer is just text.
    let answer = "Use <tool_call>{\"name\": \"x\"}</tool_call> or <atem:invoke name=\"x\">.";
    let text = format!("<|channel|>final<|message|>{answer}<|return|>");
    let events = parse("harmony", Some(&tools), &text, FinishHint::Stop);
    assert_eq!(outcome(&events).content.as_deref(), Some(answer));
    assert!(warnings(&events).is_empty());
}

// ---- plain ----

#[test]
fn plain_returns_everything() {
    let text = "<tool_call>{\"name\": \"add\"}</tool_call> <atem:function_calls> <|im_end|>";
    verbatim("plain", text, 0);
}

// ---- any text, any format ----

/// Pieces of every format's call syntax, whole and cut, and prose.
const PIECES: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "<function=f>",
    "<function=add>",
    "</function>",
    "<parameter=x>",
    "<parameter=a>",
    "</parameter>",
    "<atem:function_calls>",
    "</atem:function_calls>",
    "<atem:invoke name=\"add\">",
    "<atem:invoke",
    "</atem:invoke>",
    "<atem:parameter name=\"a\">",
    "</atem:parameter>",
    "{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
    "{\"name\": \"add\"",
    "{",
    "}",
    "[",
    "\"",
    "1",
    "\n",
    " ",
    "  ",
    "hello",
    " world.",
    "é",
    "🦀",
    "<",
    ">",
    "<b>",
];

/// Random texts of markup pieces, in each tag format, with and without tools:
/// whenever no call is confirmed (and no `<think>` or end token is involved,
/// which these texts never contain), the content is the text, verbatim; and
/// two random chunkings give the same events as the whole text.
#[test]
fn no_call_means_the_text_comes_back_verbatim() {
    let mut rng = Rng(19);
    let mut checked = 0;
    for _ in 0..400 {
        let text: String = (0..rng.below(12))
            .map(|_| PIECES[rng.below(PIECES.len())])
            .collect();
        for format in [
            OutputFormat::Hermes,
            OutputFormat::Qwen3Xml,
            OutputFormat::Atem,
        ] {
            for tools in [None, Some(tools_weather_add())] {
                let hint = if rng.below(2) == 0 {
                    FinishHint::Stop
                } else {
                    FinishHint::Length
                };
                let run = |pieces: &[&str]| {
                    let mut p =
                        parser_with(format, tools.as_ref(), ParserOptions::default()).unwrap();
                    let mut events = Vec::new();
                    for piece in pieces {
                        events.extend(p.feed(piece));
                    }
                    events.extend(p.finish(hint));
                    merge_events(events)
                };
                let whole = run(&[&text]);
                for _ in 0..2 {
                    let mut pieces = Vec::new();
                    let mut rest = text.as_str();
                    while !rest.is_empty() {
                        let n = 1 + rng.below(6);
                        let cut = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
                        pieces.push(&rest[..cut]);
                        rest = &rest[cut..];
                    }
                    assert_eq!(run(&pieces), whole, "{format:?} {pieces:?}");
                }
                let o = outcome(&whole);
                if o.calls.is_empty() {
                    assert_eq!(o.content.unwrap_or_default(), text, "{format:?}: {whole:?}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} call-free cases");
}

/// Found by fuzzing (fuzz/parse_qwen3_xml, parse_atem, parse_muse_glimmer): a
/// tag name longer than the 512-byte limit was refused when the text arrived
/// in pieces (the limit was applied to the text so far) but accepted when it
/// arrived whole. Now the name's own length decides: too long is never a tag.
#[test]
fn overlong_tag_names_are_text_however_the_output_is_split() {
    let long = "n".repeat(600);
    let ok = "n".repeat(512);
    for (format, text, is_call) in [
        (
            "qwen3-xml",
            format!("<function={long}>\n<parameter=x>\n1\n</parameter>\n</function>"),
            false,
        ),
        (
            "qwen3-xml",
            format!("<function={ok}>\n<parameter=x>\n1\n</parameter>\n</function>"),
            true,
        ),
        (
            "atem",
            format!("<atem:invoke name=\"{long}\">\n</atem:invoke>"),
            false,
        ),
        (
            "atem",
            format!("<atem:invoke name=\"{ok}\">\n</atem:invoke>"),
            true,
        ),
    ] {
        let o = parsed(format, None, &text, FinishHint::Stop);
        if is_call {
            assert_eq!((o.calls.len(), o.content), (1, None), "{format}");
        } else {
            assert_eq!(
                (o.calls.len(), o.content.as_deref()),
                (0, Some(text.as_str())),
                "{format}"
            );
        }
    }
}
