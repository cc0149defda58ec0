//! Qwen3-Coder XML tool calls (spec §8.2):
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//! also without the `<tool_call>` wrapper. One newline on each side of a value is
//! stripped (vLLM's rule); `null`/`None` become null where the schema allows it.
//! `<think>…</think>` is reasoning, never calls.

use serde_json::{Map, Value};

use super::atem::render_value;
use super::body::{CallSyntax, Terminated};
use super::hermes::CHATML_END;

/// The parser: ChatML bodies with Qwen3Xml calls, each ended by a ChatML end token.
pub(crate) fn parser(start_in_reasoning: bool) -> Terminated {
    Terminated::new(CallSyntax::Qwen3Xml, CHATML_END, start_in_reasoning)
}

/// One call as Qwen3-Coder writes it, wrapper included.
pub fn render_call(name: &str, arguments: &Map<String, Value>) -> String {
    let mut s = format!("<tool_call>\n<function={name}>\n");
    for (k, v) in arguments {
        s.push_str(&format!(
            "<parameter={k}>\n{}\n</parameter>\n",
            render_value(v)
        ));
    }
    s.push_str("</function>\n</tool_call>");
    s
}
