//! The worked examples of spec chat-format.md (§5 for Muse Glimmer; the §7 and
//! §8 syntax for Harmony, Hermes and Qwen3 XML), checked against the spec's
//! stated results. Every example is also checked for chunking invariance: fed
//! whole, split at every char boundary, and char by char, the merged events are
//! identical; and every call's streamed argument deltas concatenate to JSON
//! equal to its confirmed arguments.

mod common;

use common::*;
use hearth_chat::parser::{
    merge_events, ChatEvent, FinishHint, FinishReason, ParserOptions, UnknownToolPolicy,
};
use serde_json::{json, Value};

// ---- Muse Glimmer, §5 ----

/// The client's view of `text` parsed as Muse Glimmer output.
fn mg(tools: Option<&Value>, text: &str, hint: FinishHint) -> Outcome {
    parsed("muse-glimmer", tools, text, hint)
}

#[test]
fn mg_1_answer_with_reasoning() {
    let text = format!(" to=self{M}17*23 = 391.{E}{S}assistant to=user{M}391");
    let o = mg(Some(&tools_weather_add()), &text, FinishHint::Stop);
    assert_eq!(
        o,
        Outcome::new(
            Some("17*23 = 391."),
            Some("391"),
            vec![],
            FinishReason::Stop
        )
    );
}

/// The start of call 0, `get_weather`, as streamed.
fn weather_call_start() -> ChatEvent {
    ChatEvent::ToolCallStart {
        index: 0,
        id: "call_0".into(),
        name: "get_weather".into(),
    }
}

/// The confirmation of call 0, `get_weather` for Paris, and the end of the turn.
fn paris_call_confirmed() -> [ChatEvent; 2] {
    [
        ChatEvent::ToolCall {
            index: 0,
            id: "call_0".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        },
        ChatEvent::End {
            finish_reason: FinishReason::ToolCalls,
        },
    ]
}

#[test]
fn mg_2_reasoning_then_call() {
    let block = atem_block(&[("get_weather", &[("city", "Paris")])]);
    for header in [" to=get_weather", " to=get_weather constrain=json"] {
        let text = format!(" to=self{M}Need weather.{E}{S}assistant{header}{M}{block}");
        let events = parse_mg(&text, FinishHint::Stop);
        assert_eq!(
            outcome(&events),
            Outcome::new(
                Some("Need weather."),
                None,
                vec![call(0, "get_weather", json!({"city": "Paris"}))],
                FinishReason::ToolCalls
            )
        );
        let mut expected = vec![
            ChatEvent::Reasoning("Need weather.".into()),
            weather_call_start(),
            ChatEvent::ToolCallArgs {
                index: 0,
                delta: r#"{"city": "Paris"}"#.into(),
            },
        ];
        expected.extend(paris_call_confirmed());
        assert_eq!(events, expected);
    }
}

fn edit_tools() -> Value {
    json!([{"name": "edit", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "line": {"type": "integer"}, "dry": {"type": "boolean"},
        "ratio": {"type": "number"}, "tags": {"type": "array"}}}}])
}

#[test]
fn mg_3_coercion() {
    let block = atem_block(&[(
        "edit",
        &[
            ("path", "  a b.txt\n"),
            ("line", "042"),
            ("dry", "False"),
            ("ratio", "1e999"),
            ("tags", "[\"x\", \"y\"]"),
            ("opts", "{\"k\": 1}"),
            ("mode", "fast"),
        ],
    )]);
    let text = format!(" to=edit{M}{block}");
    let o = mg(Some(&edit_tools()), &text, FinishHint::Stop);
    // Compared as JSON text: key order is order of appearance.
    assert_eq!(
        o.calls,
        vec![(
            0,
            "edit".to_string(),
            r#"{"path":"  a b.txt\n","line":42,"dry":false,"ratio":"1e999","tags":["x","y"],"opts":{"k":1},"mode":"fast"}"#
                .to_string()
        )]
    );
    for (key, raw, want) in [
        ("line", "10.0", json!("10.0")),
        ("line", "1_000", json!("1_000")),
        ("dry", "1", json!("1")),
    ] {
        let text = atem_block(&[("edit", &[(key, raw)])]);
        let o = parsed("atem", Some(&edit_tools()), &text, FinishHint::Stop);
        assert_eq!(o.calls, vec![call(0, "edit", json!({ key: want }))]);
    }
}

fn run_tools() -> Value {
    json!([{"name": "run", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}])
}

#[test]
fn mg_4_embedded_tags() {
    for value in [
        "a </atem:parameter> b",
        "x = <atem:invoke name=\"foo\">",
        "a < b && c > d",
        "</atem:invoke> then </atem:function_calls> inside",
    ] {
        let text = format!(" to=run{M}{}", atem_block(&[("run", &[("code", value)])]));
        let o = mg(Some(&run_tools()), &text, FinishHint::Stop);
        assert_eq!(
            o.calls,
            vec![call(0, "run", json!({ "code": value }))],
            "{value}"
        );
        assert_eq!(o.content, None);
    }
}

#[test]
fn mg_5_parallel() {
    let expect = vec![
        call(0, "add", json!({"a": 1, "b": 2})),
        call(1, "add", json!({"a": 3, "b": 4})),
    ];
    let one_block = atem_block(&[
        ("add", &[("a", "1"), ("b", "2")]),
        ("add", &[("a", "3"), ("b", "4")]),
    ]);
    let text = format!(" to=add{M}{one_block}");
    let o = mg(Some(&tools_weather_add()), &text, FinishHint::Stop);
    assert_eq!(
        (o.calls, o.finish),
        (expect.clone(), FinishReason::ToolCalls)
    );

    let a = atem_block(&[("add", &[("a", "1"), ("b", "2")])]);
    let b = atem_block(&[("add", &[("a", "3"), ("b", "4")])]);
    let text = format!(" to=add{M}{a}{E}{S}assistant to=add{M}{b}");
    let o = mg(Some(&tools_weather_add()), &text, FinishHint::Stop);
    assert_eq!((o.calls, o.content), (expect, None));
}

#[test]
fn mg_6_truncated_call() {
    // The spec's example gives content "Sure!" (the reference drops the cut-off
    // call); hearth returns the cut-off call's text as content too (issue 19,
    // "nothing lost in parsing"), with a warning.
    let text = "Sure! <atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Pa";
    for format in ["muse-glimmer", "atem"] {
        let events = parse(format, Some(&tools_weather_add()), text, FinishHint::Length);
        assert_eq!(
            outcome(&events),
            Outcome::new(None, Some(text), vec![], FinishReason::Length)
        );
        assert_eq!(warnings(&events), 1);
    }
    // Cut right after a complete invoke but before its structural end is seen:
    // the end of generation is end of input, so the invoke counts (§4.2).
    let text = format!(
        "{}\n</atem:invoke>\n",
        "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Pa</atem:parameter>"
    );
    let o = parsed(
        "atem",
        Some(&tools_weather_add()),
        &text,
        FinishHint::Length,
    );
    assert_eq!(o.calls, vec![call(0, "get_weather", json!({"city": "Pa"}))]);
}

#[test]
fn mg_7_names_and_unknown_tools() {
    let tools = json!([{"name": "read"}, {"name": "bash"}]);
    for (written, want) in [
        ("read.read", "read"),
        ("read.filePath", "read"),
        ("delete_everything", "delete_everything"),
    ] {
        let block = atem_block(&[(written, &[("path", "/x")])]);
        let text = format!(" to={written}{M}{block}");
        let o = mg(Some(&tools), &text, FinishHint::Stop);
        assert_eq!(o.calls, vec![call(0, want, json!({"path": "/x"}))]);
    }
    // Policy `text`: the whole visible response, markup included, no calls.
    let opts = ParserOptions {
        unknown_tool_policy: UnknownToolPolicy::Text,
        ..Default::default()
    };
    let block = atem_block(&[("delete_everything", &[("path", "/")])]);
    let text = format!(" to=self{M}hmm{E}{S}assistant to=user{M}OK. {block}");
    let o = parsed_opts("muse-glimmer", Some(&tools), &opts, &text, FinishHint::Stop);
    assert_eq!(
        o,
        Outcome::new(
            Some("hmm"),
            Some(&format!("OK. {block}")),
            vec![],
            FinishReason::Stop
        )
    );
    // Same policy, registered names: calls as usual.
    let block = atem_block(&[("read", &[("path", "/")])]);
    let text = format!(" to=read{M}{block}");
    let o = parsed_opts("muse-glimmer", Some(&tools), &opts, &text, FinishHint::Stop);
    assert_eq!(o.calls, vec![call(0, "read", json!({"path": "/"}))]);
    assert_eq!(o.content, None);
}

#[test]
fn mg_8_prose_look_alikes() {
    let tools = tools_weather_add();
    let o = mg(
        Some(&tools),
        "Use goto=label; set auto=true.",
        FinishHint::Stop,
    );
    assert_eq!(o.content.as_deref(), Some("Use goto=label; set auto=true."));
    assert_eq!(o.reasoning, None);

    let o = mg(
        Some(&tools),
        &format!(" to=user{M}Paris."),
        FinishHint::Stop,
    );
    assert_eq!(o.content.as_deref(), Some("Paris."));

    let o = mg(
        Some(&tools),
        &format!(" to=self{M}x{E}"),
        FinishHint::Length,
    );
    assert_eq!(
        o,
        Outcome::new(Some("x"), None, vec![], FinishReason::Length)
    );
    // Prose with a would-be header that never reaches `<|message|>`.
    let text = format!(" to=user{M}Set x to=5 then go to the end.");
    let o = mg(Some(&tools), &text, FinishHint::Stop);
    assert_eq!(o.content.as_deref(), Some("Set x to=5 then go to the end."));
}

#[test]
fn mg_9_streaming_token_by_token() {
    let tokens = [
        " to",
        "=self",
        M,
        "Let",
        " me",
        E,
        S,
        "assistant",
        " to",
        "=get_weather",
        M,
        "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n",
        "<atem:parameter name=\"city\">Par",
        "is</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
        T,
    ];
    let mut p =
        hearth_chat::parser::parser_for("muse-glimmer", Some(&tools_weather_add())).unwrap();
    let per_token: Vec<Vec<ChatEvent>> = tokens.iter().map(|t| p.feed(t)).collect();
    let args = |d: &str| ChatEvent::ToolCallArgs {
        index: 0,
        delta: d.into(),
    };
    assert_eq!(per_token[3], vec![ChatEvent::Reasoning("Let".into())]);
    assert_eq!(per_token[4], vec![ChatEvent::Reasoning(" me".into())]);
    assert_eq!(per_token[11], vec![weather_call_start()]);
    assert_eq!(
        merge_events(per_token[12].clone()),
        vec![args(r#"{"city": "Par"#)]
    );
    let last = merge_events(
        per_token[13]
            .iter()
            .cloned()
            .chain(p.finish(FinishHint::Stop)),
    );
    let mut expected = vec![args(r#"is"}"#)];
    expected.extend(paris_call_confirmed());
    assert_eq!(last, expected);
    let all: Vec<ChatEvent> = per_token.into_iter().flatten().collect();
    assert!(
        !all.iter().any(|e| matches!(e, ChatEvent::Content(_))),
        "{all:?}"
    );
}

#[test]
fn mg_calls_inside_reasoning_are_not_calls() {
    let block = atem_block(&[("get_weather", &[("city", "Paris")])]);
    let text = format!(" to=self{M}I could write {block} here.{E}{S}assistant to=user{M}No.");
    let o = mg(Some(&tools_weather_add()), &text, FinishHint::Stop);
    assert_eq!(o.reasoning, Some(format!("I could write {block} here.")));
    assert_eq!((o.content.as_deref(), o.calls.len()), (Some("No."), 0));
}

#[test]
fn mg_bodies_join_and_text_after_calls_is_kept() {
    let block = atem_block(&[("get_weather", &[("city", "Oslo")])]);
    let text = format!(
        " to=self{M}One.{E}{S}assistant to=get_weather{M}{block}{E}{S}assistant to=self{M}Two.{E}{S}assistant to=user{M}Done.{T}"
    );
    let o = mg(Some(&tools_weather_add()), &text, FinishHint::Stop);
    assert_eq!(o.reasoning.as_deref(), Some("One.\n\nTwo."));
    assert_eq!(o.content.as_deref(), Some("Done."));
    assert_eq!(
        o.calls,
        vec![call(0, "get_weather", json!({"city": "Oslo"}))]
    );
    // A message to the user is the answer: a block quoted in it stays
    // content (llama.cpp 11434's parser; a call needs a ` to=TOOL` message).
    let o = mg(
        Some(&tools_weather_add()),
        &format!(" to=user{M}{block}"),
        FinishHint::Stop,
    );
    assert_eq!((o.content, o.calls.len()), (Some(block.clone()), 0));
    // A header without `<|start|>` mid-body still switches messages (§3.2 rule 1).
    let o = mg(
        None,
        &format!(" to=self{M}think to=user{M}hi"),
        FinishHint::Stop,
    );
    assert_eq!(o.texts(), (Some("think"), Some("hi")));
    // A bare `<|start|>assistant<|message|>` (no recipient) is content.
    let o = mg(
        None,
        &format!(" to=self{M}a{E}{S}assistant{M}b"),
        FinishHint::Stop,
    );
    assert_eq!(o.texts(), (Some("a"), Some("b")));
}

#[test]
fn never_emit_a_partial_marker() {
    // Cut at every byte: whatever was emitted so far is a prefix of the final
    // text of its channel, and never contains framing or partial markup.
    let block = atem_block(&[("get_weather", &[("city", "Paris")])]);
    let text =
        format!(" to=self{M}ok{E}{S}assistant to=user{M}Hi <b>x</b>{E}{S}assistant to=get_weather{M}{block}");
    for (i, _) in text.char_indices() {
        let mut p =
            hearth_chat::parser::parser_for("muse-glimmer", Some(&tools_weather_add())).unwrap();
        let events = merge_events(p.feed(&text[..i]));
        for e in &events {
            if let ChatEvent::Content(c) | ChatEvent::Reasoning(c) = e {
                assert!(
                    !c.contains("<|") && !c.contains("to=") && !c.contains("<atem"),
                    "{i}: {c:?}"
                );
                assert!("okHi <b>x</b>".contains(c.as_str()), "{i}: {c:?}");
            }
        }
    }
}

// ---- Hermes, §8.1 ----

#[test]
fn hermes_calls() {
    let tools = tools_weather_add();
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call><|im_end|>";
    assert_eq!(
        parsed("hermes", Some(&tools), text, FinishHint::Stop),
        Outcome::new(
            None,
            Some("Let me check."),
            vec![
                call(0, "get_weather", json!({"city": "Paris"})),
                call(1, "add", json!({"a": 1, "b": 2}))
            ],
            FinishReason::ToolCalls
        )
    );
    // A list in one block, `parameters`, string arguments, null arguments, and
    // `</tool_call>` inside a JSON string.
    let text = concat!(
        "<tool_call>[{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}, ",
        "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"</tool_call>\\\"}\"}]</tool_call>",
        "<tool_call>{\"name\": \"add\", \"arguments\": null}</tool_call>"
    );
    assert_eq!(
        parsed("hermes", Some(&tools), text, FinishHint::Stop).calls,
        vec![
            call(0, "add", json!({"a": 1, "b": 2})),
            call(1, "get_weather", json!({"city": "</tool_call>"})),
            call(2, "add", json!({})),
        ]
    );
}

#[test]
fn hermes_malformed_truncated_think_unknown() {
    let tools = tools_weather_add();
    for (text, hint, finish) in [
        // Malformed (text after the JSON value): content, verbatim, with a
        // warning (the reference drops it and keeps only the text before).
        (
            "Hi <tool_call>{\"name\": \"add\", \"arguments\": {}} oops</tool_call>",
            FinishHint::Stop,
            FinishReason::Stop,
        ),
        // Truncated: content too.
        (
            "Hi <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1",
            FinishHint::Length,
            FinishReason::Length,
        ),
    ] {
        let events = parse("hermes", Some(&tools), text, hint);
        let o = outcome(&events);
        assert_eq!(
            (o.content.as_deref(), o.calls.len(), o.finish),
            (Some(text), 0, finish)
        );
        assert_eq!(warnings(&events), 1);
    }
    // Calls inside <think> are not calls.
    let text = "<think>maybe <tool_call>{\"name\": \"add\"}</tool_call></think>\n\nNo call.";
    let o = parsed("hermes", Some(&tools), text, FinishHint::Stop);
    assert_eq!(
        o.reasoning.as_deref(),
        Some("maybe <tool_call>{\"name\": \"add\"}</tool_call>")
    );
    assert_eq!((o.content.as_deref(), o.calls.len()), (Some("No call."), 0));
    // Unknown name under the `text` policy: the whole text.
    let opts = ParserOptions {
        unknown_tool_policy: UnknownToolPolicy::Text,
        ..Default::default()
    };
    let text = "Hi <tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>";
    let o = parsed_opts("hermes", Some(&tools), &opts, text, FinishHint::Stop);
    assert_eq!((o.content.as_deref(), o.calls.len()), (Some(text), 0));
}

// ---- Qwen3-Coder XML, §8.2 ----

#[test]
fn qwen3_xml_calls() {
    let tools = json!([
        {"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}},
        {"name": "note", "parameters": {"properties": {"text": {"type": ["string", "null"]}, "tags": {"type": "array"}}}},
    ]);
    let text = "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parsed("qwen3-xml", Some(&tools), text, FinishHint::Stop),
        Outcome::new(
            None,
            Some("I'll check."),
            vec![call(0, "get_weather", json!({"city": "Paris", "days": 3}))],
            FinishReason::ToolCalls
        )
    );
    // No wrapper; one newline stripped each side; embedded closing tags; None.
    let text = "<function=get_weather>\n<parameter=city>\n\n two\nlines \n\n</parameter>\n</function>\n<function=note>\n<parameter=text>\nNone\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n</function>";
    assert_eq!(
        parsed("qwen3-xml", Some(&tools), text, FinishHint::Stop).calls,
        vec![
            call(0, "get_weather", json!({"city": "\n two\nlines \n"})),
            call(1, "note", json!({"text": null, "tags": ["a"]})),
        ]
    );
    let text = "<function=get_weather>\n<parameter=city>\na </parameter> b </function> c\n</parameter>\n</function>";
    assert_eq!(
        parsed("qwen3-xml", Some(&tools), text, FinishHint::Stop).calls,
        vec![call(
            0,
            "get_weather",
            json!({"city": "a </parameter> b </function> c"})
        )]
    );
}

#[test]
fn qwen3_xml_think_and_truncation() {
    let tools = json!([{"name": "f", "parameters": {"properties": {"x": {"type": "string"}}}}]);
    let text = "<think>\nuse <function=f>\n</function> maybe\n</think>\n\nOK <function=f>\n<parameter=x>\nabc";
    let o = parsed("qwen3-xml", Some(&tools), text, FinishHint::Length);
    // The cut-off call is content (issue 19).
    assert_eq!(
        o,
        Outcome::new(
            Some("\nuse <function=f>\n</function> maybe\n"),
            Some("OK <function=f>\n<parameter=x>\nabc"),
            vec![],
            FinishReason::Length
        )
    );
    // Generation that starts inside <think> (the prompt opened it).
    let opts = ParserOptions {
        start_in_reasoning: true,
        ..Default::default()
    };
    let o = parsed_opts(
        "qwen3-xml",
        Some(&tools),
        &opts,
        "hmm</think>Hi",
        FinishHint::Stop,
    );
    assert_eq!(o.texts(), (Some("hmm"), Some("Hi")));
}

// ---- Harmony, §7 ----

#[test]
fn harmony_channels_and_calls() {
    let tools = tools_weather_add();
    for (text, want) in [
        (
            "<|channel|>analysis<|message|>User asks 17*23.<|end|><|start|>assistant<|channel|>final<|message|>391<|return|>",
            Outcome::new(
                Some("User asks 17*23."),
                Some("391"),
                vec![],
                FinishReason::Stop,
            ),
        ),
        (
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
            Outcome::new(
                Some("Need weather."),
                None,
                vec![call(0, "get_weather", json!({"city": "Paris"}))],
                FinishReason::ToolCalls,
            ),
        ),
    ] {
        assert_eq!(parsed("harmony", Some(&tools), text, FinishHint::Stop), want);
    }
    // Recipient before the channel; a preamble on commentary; two calls.
    let text = "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.add<|channel|>commentary <|constrain|>json<|message|>{\"a\": 1, \"b\": 2}<|call|><|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 3, \"b\": 4}<|call|>";
    let o = parsed("harmony", Some(&tools), text, FinishHint::Stop);
    assert_eq!(o.content.as_deref(), Some("Checking both."));
    assert_eq!(
        o.calls,
        vec![
            call(0, "add", json!({"a": 1, "b": 2})),
            call(1, "add", json!({"a": 3, "b": 4}))
        ]
    );
}

#[test]
fn harmony_builtin_recipients_and_truncation() {
    let tools = tools_weather_add();
    let text = "<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>";
    let o = parsed("harmony", Some(&tools), text, FinishHint::Stop);
    assert_eq!(
        o.calls,
        vec![call(0, "browser.search", json!({"query": "x"}))]
    );
    let opts = ParserOptions {
        unknown_tool_policy: UnknownToolPolicy::Text,
        ..Default::default()
    };
    let o = parsed_opts("harmony", Some(&tools), &opts, text, FinishHint::Stop);
    assert_eq!(
        (o.calls.len(), o.content.as_deref()),
        (0, Some("{\"query\": \"x\"}"))
    );
    // A cut-off call body is content (issue 19); its header is framing.
    let text = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1";
    let o = parsed("harmony", Some(&tools), text, FinishHint::Length);
    assert_eq!(
        (o.calls.len(), o.content.as_deref(), o.finish),
        (0, Some("{\"a\": 1"), FinishReason::Length)
    );
    // `<|call|>` is an end-of-generation token, so the text never shows it:
    // a whole body at end of generation is the call (llama.cpp's rule); a
    // body that is not JSON stays content.
    let text = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1}";
    let o = parsed("harmony", Some(&tools), text, FinishHint::Stop);
    assert_eq!((o.calls.len(), o.finish), (1, FinishReason::ToolCalls));
    let o = parsed(
        "harmony",
        Some(&tools),
        &text.replace('}', ""),
        FinishHint::Stop,
    );
    assert_eq!(
        (o.calls.len(), o.content.as_deref()),
        (0, Some("{\"a\": 1"))
    );
    // Unframed text is content.
    let o = parsed("harmony", None, "just text", FinishHint::Stop);
    assert_eq!(o.content.as_deref(), Some("just text"));
}

#[test]
fn plain_is_all_content() {
    let text = "<|start|>x <tool_call>{}</tool_call> to=self<|message|>";
    let o = parsed("plain", None, text, FinishHint::Length);
    assert_eq!(
        (o.content.as_deref(), o.finish),
        (Some(text), FinishReason::Length)
    );
}

#[test]
fn unknown_format_is_an_error() {
    assert!(hearth_chat::parser::parser_for("chatml-json", None).is_err());
    assert!(hearth_chat::parser::parser_for("Qwen3_XML", None).is_ok());
}
