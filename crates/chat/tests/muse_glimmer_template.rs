//! Muse Glimmer prompts rendered through the model file's own chat template
//! (llama.cpp 11434's models/templates/muse-glimmer.jinja, the released
//! model's), byte for byte as llama.cpp renders them: the expected prompts in
//! tests/fixtures/muse_glimmer/chat/render.json come from llama.cpp's own
//! chat code (scripts/reference/muse_chat_dump.cpp against libllama-common, with
//! llama-server's request handling; scripts/fixtures/make_muse_chat_fixtures.py), the
//! clock fixed at 2026-03-14 12:00 UTC. Conversations cover tools, tool calls
//! with every argument type and their results (named and found by
//! tool_call_id), parallel namespaced calls, reasoning, an image marker, the
//! request's `reasoning_effort` (llama.cpp's mapping to `reasoning_strength`)
//! and template kwargs.

use hearth_chat::template::{llama_cpp_messages, ChatTemplate};
use serde_json::{Map, Value};

fn fixtures() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/muse_glimmer/chat")
}

#[test]
fn renders_like_llama_cpp() {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("render.json")).unwrap())
            .unwrap();
    let src = std::fs::read_to_string(fixtures().join(doc["template"].as_str().unwrap())).unwrap();
    let now = chrono::NaiveDate::from_ymd_opt(2026, 3, 14)
        .unwrap()
        .and_hms_opt(12, 0, 0)
        .unwrap();
    let tmpl = ChatTemplate::from_source(
        &src,
        doc["bos_token"].as_str().unwrap(),
        doc["eos_token"].as_str().unwrap(),
    )
    .unwrap()
    .with_fixed_time(now);
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut kwargs: Map<String, Value> = case
            .get("chat_template_kwargs")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        // llama-server: the request's reasoning_effort goes into the kwargs.
        if let Some(e) = case.get("reasoning_effort").and_then(Value::as_str) {
            kwargs.insert("reasoning_effort".into(), Value::String(e.into()));
        }
        let messages = llama_cpp_messages(&case["messages"]);
        let got = tmpl.render(&messages, case.get("tools"), true, &kwargs);
        match (got, case.get("prompt").and_then(Value::as_str)) {
            (Ok(got), Some(want)) if got == want => {}
            (Ok(got), Some(want)) => {
                let at = got
                    .char_indices()
                    .zip(want.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(got.len().min(want.len()), |((i, _), _)| i);
                failures.push(format!(
                    "{name}: differs at byte {at}: ours {:?} vs llama.cpp {:?}",
                    &got[at..(at + 60).min(got.len())],
                    want.get(at..(at + 60).min(want.len())).unwrap_or("")
                ));
            }
            (Err(e), want) => failures.push(format!("{name}: {e} (llama.cpp: {want:?})")),
            (Ok(_), None) => {
                failures.push(format!("{name}: llama.cpp refused it: {}", case["error"]))
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
