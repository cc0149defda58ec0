//! Hermes JSON tool calls (Qwen2.5 / Qwen2.5-Coder, spec §8.1):
//! `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, with `<think>`
//! reasoning and ChatML end tokens.
//!
//! Each block holds one JSON value, decoded with a real JSON scanner (so
//! `</tool_call>` inside a string is safe), followed by only whitespace and
//! `</tool_call>`. The value is a call object or a list of them; the arguments
//! come whole when the block closes. A malformed block is dropped, as the
//! reference drops it (its content is the text before the block).

use serde_json::{Map, Value};

use super::body::{CallSyntax, Terminated};
use super::driver::{Ctx, Machine};
use super::pyjson;
use super::scan::{lit, partial_suffix_len, ws_len, Lit};
use super::xml_calls::Step;

pub(crate) const TOOL_CALL_OPEN: &str = "<tool_call>";
const TOOL_CALL_CLOSE: &str = "</tool_call>";
/// ChatML end tokens as text.
pub(crate) const CHATML_END: &[&str] = &["<|im_end|>", "<|endoftext|>"];

pub(crate) struct HermesParser {
    frame: Terminated,
}

impl HermesParser {
    pub fn new(start_in_reasoning: bool) -> Self {
        HermesParser {
            frame: Terminated::new(CallSyntax::Hermes, CHATML_END, start_in_reasoning),
        }
    }
}

impl Machine for HermesParser {
    fn feed(&mut self, text: &str, cx: &mut Ctx) {
        self.frame.feed(text, cx)
    }
    fn finish(&mut self, cx: &mut Ctx) {
        self.frame.finish(cx)
    }
}

/// Incremental scan of the JSON value inside `<tool_call>`: where it ends.
#[derive(Default)]
pub(crate) struct JsonCall {
    /// Bytes of the buffer scanned so far.
    scanned: usize,
    depth: u32,
    started: bool,
    in_string: bool,
    escaped: bool,
    value_end: Option<usize>,
    malformed: bool,
}

fn take(buf: &mut String, n: usize, cx: &mut Ctx) {
    cx.markup(&buf[..n]);
    buf.drain(..n);
}

/// One step inside a `<tool_call>` block.
pub(crate) fn step(st: &mut JsonCall, buf: &mut String, cx: &mut Ctx, end: bool) -> Step {
    if st.value_end.is_none() && !st.malformed {
        let b = buf.as_bytes();
        let mut i = st.scanned;
        while i < b.len() {
            let c = b[i];
            i += 1;
            if !st.started {
                match c {
                    b'{' | b'[' => {
                        st.started = true;
                        st.depth = 1;
                    }
                    c if c.is_ascii_whitespace() => {}
                    _ => {
                        st.malformed = true;
                        break;
                    }
                }
            } else if st.in_string {
                if st.escaped {
                    st.escaped = false;
                } else if c == b'\\' {
                    st.escaped = true;
                } else if c == b'"' {
                    st.in_string = false;
                }
            } else {
                match c {
                    b'"' => st.in_string = true,
                    b'{' | b'[' => st.depth += 1,
                    b'}' | b']' => {
                        st.depth -= 1;
                        if st.depth == 0 {
                            st.value_end = Some(i);
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
        st.scanned = i;
    }
    if let (Some(e), false) = (st.value_end, st.malformed) {
        let rest = &buf[e..];
        let ws = ws_len(rest);
        match lit(&rest[ws..], TOOL_CALL_CLOSE) {
            Lit::Yes => {
                let calls = serde_json::from_str::<Value>(&buf[..e])
                    .ok()
                    .and_then(calls_of);
                take(buf, e + ws + TOOL_CALL_CLOSE.len(), cx);
                for (name, args) in calls.into_iter().flatten() {
                    cx.whole_call(&name, args);
                }
                return Step::Done;
            }
            Lit::Partial if !end => return Step::Wait,
            _ => st.malformed = true,
        }
    }
    if st.malformed {
        // Drop the block through its closing tag.
        if let Some(p) = buf.find(TOOL_CALL_CLOSE) {
            take(buf, p + TOOL_CALL_CLOSE.len(), cx);
            return Step::Done;
        }
        let hold = if end {
            0
        } else {
            partial_suffix_len(buf, &[TOOL_CALL_CLOSE])
        };
        let n = buf.len() - hold;
        take(buf, n, cx);
    }
    Step::Wait
}

/// The calls a decoded block holds: an object or a list of objects with a
/// string `name` and `arguments` (else `parameters`): an object, null (→ `{}`),
/// or a string holding a JSON object. `None`: malformed.
fn calls_of(v: Value) -> Option<Vec<(String, Map<String, Value>)>> {
    let items = match v {
        Value::Object(_) => vec![v],
        Value::Array(a) => a,
        _ => return None,
    };
    let mut calls = Vec::with_capacity(items.len());
    for item in items {
        let Value::Object(mut o) = item else {
            return None;
        };
        let name = o.get("name")?.as_str()?.to_string();
        let args = o
            .remove("arguments")
            .or_else(|| o.remove("parameters"))
            .unwrap_or(Value::Null);
        let args = match args {
            Value::Null => Map::new(),
            Value::Object(m) => m,
            Value::String(s) => match serde_json::from_str::<Value>(&s).ok()? {
                Value::Object(m) => m,
                _ => return None,
            },
            _ => return None,
        };
        calls.push((name, args));
    }
    Some(calls)
}

/// One call as Qwen2.5's chat template writes it in history (§8.1).
pub fn render_call(name: &str, arguments: &Map<String, Value>) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
        pyjson::to_string(&Value::String(name.to_string())),
        pyjson::to_string(&Value::Object(arguments.clone()))
    )
}
