//! The `<tool_call>{JSON}</tool_call>` block of Hermes-style calls, scanned
//! as it streams: where the JSON value ends, and the calls it holds. Shared by
//! the Hermes parser ([`super::hermes`]) and the body scanner ([`super::body`]),
//! which enters a block when it sees [`TOOL_CALL_OPEN`].

use serde_json::{Map, Value};

use super::driver::Ctx;
use super::scan::{lit, ws_len, Lit};
use super::xml_calls::Step;

pub(crate) const TOOL_CALL_OPEN: &str = "<tool_call>";
const TOOL_CALL_CLOSE: &str = "</tool_call>";

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
    /// The block does not start with `{` or `[`.
    not_json: bool,
}

fn take(buf: &mut String, n: usize, cx: &mut Ctx) {
    cx.markup(&buf[..n]);
    buf.drain(..n);
}

/// One step inside a `<tool_call>` block (its opening tag is already markup).
/// A block that is not `ws JSON ws </tool_call>` holding calls is malformed;
/// the text after the point where it went wrong is read as text again.
pub(crate) fn step(st: &mut JsonCall, buf: &mut String, cx: &mut Ctx) -> Step {
    if st.value_end.is_none() && !st.not_json {
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
                        st.not_json = true;
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
    if st.not_json {
        // Prose that mentions the tag: everything after it is text again.
        return Step::Malformed(
            "<tool_call> not followed by a JSON object or array; kept as content".to_string(),
        );
    }
    let Some(e) = st.value_end else {
        return Step::Wait;
    };
    let rest = &buf[e..];
    let ws = ws_len(rest);
    match lit(&rest[ws..], TOOL_CALL_CLOSE) {
        Lit::Yes => {
            let calls = serde_json::from_str::<Value>(&buf[..e])
                .ok()
                .and_then(calls_of)
                .filter(|c| !c.is_empty());
            take(buf, e + ws + TOOL_CALL_CLOSE.len(), cx);
            match calls {
                Some(calls) => {
                    for (name, args) in calls {
                        cx.whole_call(&name, args);
                    }
                    Step::Done
                }
                None => Step::Malformed(
                    "<tool_call> block is not {\"name\": …, \"arguments\": {…}} or a list of them; kept as content"
                        .to_string(),
                ),
            }
        }
        // Whitespace so far, or the end of generation before `</tool_call>`
        // (the body's end returns the block as content).
        Lit::Partial => Step::Wait,
        Lit::No => {
            take(buf, e, cx);
            Step::Malformed(
                "text between the tool-call JSON and </tool_call>; kept as content".to_string(),
            )
        }
    }
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
