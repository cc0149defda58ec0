//! Hermes JSON tool calls (Qwen2.5 / Qwen2.5-Coder, spec §8.1):
//! `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, with `<think>`
//! reasoning and ChatML end tokens.
//!
//! Each block holds one JSON value, decoded with a real JSON scanner (so
//! `</tool_call>` inside a string is safe), followed by only whitespace and
//! `</tool_call>`. The value is a call object or a list of them; the arguments
//! come whole when the block closes. A malformed or unclosed block is content,
//! verbatim, with a warning (the reference drops it and everything after).
//!
//! The block scanner itself is [`super::json_call`] (the body scanner uses it too).

use serde_json::{Map, Value};

use super::body::{CallSyntax, Terminated};
use super::pyjson;

/// ChatML end tokens as text.
pub(crate) const CHATML_END: &[&str] = &["<|im_end|>", "<|endoftext|>"];

/// The parser: ChatML bodies with Hermes calls, each ended by a ChatML end token.
pub(crate) fn parser(start_in_reasoning: bool) -> Terminated {
    Terminated::new(CallSyntax::Hermes, CHATML_END, start_in_reasoning)
}

/// One call as Qwen2.5's chat template writes it in history (§8.1).
pub fn render_call(name: &str, arguments: &Map<String, Value>) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
        pyjson::to_string(&Value::String(name.to_string())),
        pyjson::to_string(&Value::Object(arguments.clone()))
    )
}
