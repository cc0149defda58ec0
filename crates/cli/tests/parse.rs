//! `hearth parse` on issue 19's examples: text that only looks like a tool
//! call comes back verbatim as content, a `warning` line reports the malformed
//! or cut-off block, and the finish reason follows `--truncated`.

mod common;

use common::hearth_cmd;
use std::io::Write;
use std::process::Stdio;

use serde_json::{json, Value};

fn parse(format: &str, text: &str, extra: &[&str]) -> Vec<Value> {
    let mut child = hearth_cmd()
        .args(["parse", "--format", format])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn malformed_calls_are_content_with_a_warning() {
    let text = "The tag <tool_call> is how I call tools, but here I just answer: 42.\n";
    let lines = parse("hermes", text, &[]);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0], json!({"type": "content", "text": "The tag"}));
    assert_eq!(lines[1]["type"], "warning");
    assert!(lines[1]["message"]
        .as_str()
        .unwrap()
        .contains("<tool_call>"));
    assert_eq!(
        lines[2],
        json!({"type": "content", "text": &text["The tag".len()..]})
    );
    assert_eq!(lines[3], json!({"type": "end", "finish_reason": "stop"}));

    let text = "Before<tool_call>not json</tool_call> after";
    let lines = parse("hermes", text, &[]);
    let content: String = lines
        .iter()
        .filter(|l| l["type"] == "content")
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(content, text);
    assert_eq!(lines.iter().filter(|l| l["type"] == "warning").count(), 1);
}

#[test]
fn cut_off_call_is_content_and_finish_follows_truncation() {
    let text = "OK <function=f>\n<parameter=x>\nabc";
    for (flags, finish) in [(&[][..], "stop"), (&["--truncated"][..], "length")] {
        let lines = parse("qwen3-xml", text, flags);
        let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["content", "warning", "content", "end"], "{lines:?}");
        assert_eq!(lines[0]["text"], "OK");
        assert_eq!(lines[2]["text"], " <function=f>\n<parameter=x>\nabc");
        assert_eq!(lines[3]["finish_reason"], finish);
    }
}
