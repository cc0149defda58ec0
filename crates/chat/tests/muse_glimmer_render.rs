//! Spec chat-format.md §2: Muse Glimmer prompt rendering rules, with expected
//! prompts written out by hand from the spec text. The TOOL_BLOCK expectation is
//! derived mechanically from the spec's code block (embedded verbatim below):
//! physical line breaks and the "(one line per …)" notes dropped, `\n` escapes
//! turned into newlines, template lines expanded per namespace / per tool.

use hearth_chat::muse_glimmer::{render, RenderOptions};
use serde_json::{json, Value};

/// §2.2's TOOL_BLOCK code block, verbatim.
const SPEC_TOOL_BLOCK: &str = r#"In this environment you have access to a set of tools you can use to answer the user's question.\n\n
You can invoke a function by writing a "<atem:function_calls>" block like the following:\n
<atem:function_calls>\n<atem:invoke name="$FUNCTION_NAME">\n<atem:parameter name="$PARAMETER_NAME">$PARAMETER_VALUE</atem:parameter>\n...\n</atem:invoke>\n</atem:function_calls>\n\n
String and scalar parameters should be specified as is, while lists and objects should use JSON format. Note that spaces for string values are not stripped. The output is not expected to be valid XML and is parsed with regular expressions.\n
Here are the functions available in JSONSchema format:\n
// Tool metadata\n
{"name": "NS", "description": ""}\n            (one line per namespace)
// Function schemas
\n{"name": "NAME", "description": "DESC", "parameters": PARAMS_JSON}   (one per tool)
\n\nHere's an example of how to call a function in the tool set:\n
(If the tool namespace is not specified, invoke the function directly as `example_function_name` rather than `example_tool_name.example_function_name`)\n\n
to=example_tool_name.example_function_name\n\n
<atem:function_calls>\n<atem:invoke name="example_tool_name.example_function_name">\n
<atem:parameter name="example_parameter_1">value_1</atem:parameter>\n
<atem:parameter name="example_parameter_2">This is the value for the second parameter\nthat can span\n"multiple" lines\n</atem:parameter>\n
</atem:invoke>\n</atem:function_calls>
"#;

const NS_LINE: &str = r#"{"name": "NS", "description": ""}\n"#;
const TOOL_LINE: &str = r#"\n{"name": "NAME", "description": "DESC", "parameters": PARAMS_JSON}"#;

/// TOOL_BLOCK for namespaces `ns` and tools `(name, desc, params_json)`.
fn spec_tool_block(ns: &[&str], tools: &[(&str, &str, &str)]) -> String {
    let joined: String = SPEC_TOOL_BLOCK
        .lines()
        .map(|l| {
            let l = l.trim_end();
            for note in ["(one line per namespace)", "(one per tool)"] {
                if let Some(x) = l.strip_suffix(note) {
                    return x.trim_end().to_string();
                }
            }
            l.to_string()
        })
        .collect();
    let ns_lines: String = ns.iter().map(|n| NS_LINE.replace("NS", n)).collect();
    let tool_lines: String = tools
        .iter()
        .map(|(n, d, p)| {
            TOOL_LINE
                .replace("NAME", n)
                .replace("DESC", d)
                .replace("PARAMS_JSON", p)
        })
        .collect();
    assert!(joined.contains(NS_LINE) && joined.contains(TOOL_LINE));
    joined
        .replace(NS_LINE, &ns_lines)
        .replace(TOOL_LINE, &tool_lines)
        .replace("\\n", "\n")
}

const DEFAULT_SYSTEM: &str = "You are a helpful AI assistant.\nKnowledge cutoff: 2026-01-04.";

fn r(messages: Value, tools: Option<Value>) -> String {
    render(&messages, tools.as_ref(), &RenderOptions::default()).unwrap()
}

#[test]
fn no_system_message_synthesizes_one() {
    let got = r(json!([{"role": "user", "content": "Hi"}]), None);
    let want = format!(
        "<|begin_of_text|><|start|>system<|message|>{DEFAULT_SYSTEM}\n\nReasoning strength: high.<|eot|><|start|>user<|message|>Hi<|eot|><|start|>assistant"
    );
    assert_eq!(got, want);
    let opts = RenderOptions {
        current_date: Some("2026-02-03".into()),
        add_generation_prompt: false,
        ..Default::default()
    };
    let got = render(&json!([{"role": "user", "content": "Hi"}]), None, &opts).unwrap();
    assert_eq!(
        got,
        format!("<|begin_of_text|><|start|>system<|message|>{DEFAULT_SYSTEM}\nCurrent date: 2026-02-03.\n\nReasoning strength: high.<|eot|><|start|>user<|message|>Hi<|eot|>")
    );
}

#[test]
fn tool_block_is_byte_exact() {
    let tools = json!([
        {"type": "function", "function": {"name": "read", "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
        {"type": "function", "function": {"name": "bash",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string", "description": "Shell – line"}}}}},
        {"type": "function", "function": {"name": "fs.write", "description": "Write",
            "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "fs.stat", "description": "Stat",
            "parameters": {"type": "object", "properties": {}}}},
    ]);
    let block = spec_tool_block(
        &["read", "bash", "fs"],
        &[
            (
                "read",
                "Read a file",
                r#"{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}"#,
            ),
            (
                "bash",
                "",
                r#"{"type": "object", "properties": {"cmd": {"type": "string", "description": "Shell – line"}}}"#,
            ),
            (
                "fs.write",
                "Write",
                r#"{"type": "object", "properties": {}}"#,
            ),
            ("fs.stat", "Stat", r#"{"type": "object", "properties": {}}"#),
        ],
    );
    let want = format!(
        "<|begin_of_text|><|start|>system<|message|>{DEFAULT_SYSTEM}\n\nReasoning strength: high.\n\n{block}\n\n# Valid recipients: \"self\", \"read.*\", \"bash.*\", \"fs.*\", \"user\".<|eot|><|start|>user<|message|>Hi<|eot|><|start|>assistant"
    );
    assert_eq!(
        r(json!([{"role": "user", "content": "Hi"}]), Some(tools)),
        want
    );
}

#[test]
fn system_turns_and_reasoning_strength() {
    let opts = RenderOptions {
        reasoning_strength: "low".into(),
        add_generation_prompt: false,
        ..Default::default()
    };
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools. "}, {"type": "text", "text": "REASONING STRENGTH: medium"}]},
        {"role": "system", "content": "Reasoning effort: high."},
        {"role": "user", "content": "Hi"},
    ]);
    assert_eq!(
        render(&messages, None, &opts).unwrap(),
        concat!(
            "<|begin_of_text|>",
            "<|start|>system<|message|>Be brief.\n\nReasoning strength: low.<|eot|>",
            "<|start|>system<|message|>Use tools. REASONING STRENGTH: medium<|eot|>",
            "<|start|>system<|message|>Reasoning strength: high.<|eot|>",
            "<|start|>user<|message|>Hi<|eot|>",
        )
    );
}

#[test]
fn assistant_history_reasoning_calls_and_results() {
    let messages = json!([
        {"role": "user", "content": "List."},
        {"role": "assistant", "content": "ignored when there are calls", "reasoning_content": "Plan.",
         "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a b\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "bash", "arguments":
                {"cmd": "ls\n-l", "n": 3, "r": 1.5, "e": 1e-5, "force": true, "x": null, "flags": ["-l", 2], "o": {"k": "é"}}}},
         ]},
        {"role": "tool", "tool_call_id": "c1", "content": "A"},
        {"role": "tool", "name": "bash", "content": [{"type": "text", "text": "B"}]},
        {"role": "assistant", "reasoning_content": "ok", "content": "Done."},
        {"role": "user", "content": "Thanks"},
    ]);
    let got = render(&messages, None, &RenderOptions::default()).unwrap();
    let want = concat!(
        "<|begin_of_text|><|start|>system<|message|>You are a helpful AI assistant.\nKnowledge cutoff: 2026-01-04.\n\nReasoning strength: high.<|eot|>",
        "<|start|>user<|message|>List.<|eot|>",
        "<|start|>assistant to=self<|message|>Plan.<|eom|>",
        "<|start|>assistant to=read<|message|><atem:function_calls>\n<atem:invoke name=\"read\">\n",
        "<atem:parameter name=\"path\">a b</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eom|>",
        "<|start|>assistant to=bash<|message|><atem:function_calls>\n<atem:invoke name=\"bash\">\n",
        "<atem:parameter name=\"cmd\">ls\n-l</atem:parameter>\n",
        "<atem:parameter name=\"n\">3</atem:parameter>\n",
        "<atem:parameter name=\"r\">1.5</atem:parameter>\n",
        "<atem:parameter name=\"e\">1e-05</atem:parameter>\n",
        "<atem:parameter name=\"force\">true</atem:parameter>\n",
        "<atem:parameter name=\"x\">null</atem:parameter>\n",
        "<atem:parameter name=\"flags\">[\"-l\", 2]</atem:parameter>\n",
        "<atem:parameter name=\"o\">{\"k\": \"é\"}</atem:parameter>\n",
        "</atem:invoke>\n</atem:function_calls><|eot|>",
        "<|start|>tool read<|message|><tool_output name=\"read\">\nA\n</tool_output><|eot|>",
        "<|start|>tool bash<|message|><tool_output name=\"bash\">\nB\n</tool_output><|eot|>",
        "<|start|>assistant to=self<|message|>ok<|eom|>",
        "<|start|>assistant to=user<|message|>Done.<|eot|>",
        "<|start|>user<|message|>Thanks<|eot|>",
        "<|start|>assistant",
    );
    assert_eq!(got, want);
}

#[test]
fn message_end_tokens() {
    // The last call ends <|eom|> when the next message is also assistant.
    let messages = json!([
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}]},
        {"role": "assistant", "content": "then", "recipient": "user", "end_turn": false},
        {"role": "assistant", "content": "note", "recipient": "memo"},
    ]);
    let got = r(messages, None);
    assert!(got.contains("<|start|>assistant to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n</atem:invoke>\n</atem:function_calls><|eom|><|start|>assistant to=user<|message|>then<|eom|><|start|>assistant to=memo<|message|>note<|eom|><|start|>assistant"), "{got}");
}

#[test]
fn bad_messages_are_errors() {
    for (messages, what) in [
        (json!([{"role": "wizard", "content": "x"}]), "unknown role"),
        (
            json!([{"role": "tool", "tool_call_id": "nope", "content": "x"}]),
            "no earlier assistant tool call",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]),
            "not a JSON object",
        ),
        (json!([{"content": "x"}]), "role"),
        (json!({"role": "user"}), "array"),
    ] {
        let err = render(&messages, None, &RenderOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(what), "{err}");
    }
}
