//! ATEM XML tool calls (spec §3–§4), unframed: the whole output is one visible
//! body. Muse Glimmer output uses the same syntax inside its recipient framing
//! ([`super::muse_glimmer`]).
//!
//! ```text
//! <atem:function_calls>
//! <atem:invoke name="NAME">
//! <atem:parameter name="KEY">VALUE</atem:parameter>
//! </atem:invoke>
//! </atem:function_calls>
//! ```
//! String-typed values stream as argument deltas while they are written.

use serde_json::{Map, Value};

use super::body::{CallSyntax, VisibleBody};
use super::driver::{Ctx, Machine};
use super::pyjson;

pub(crate) struct AtemParser {
    body: VisibleBody,
}

impl AtemParser {
    pub fn new() -> Self {
        AtemParser {
            body: VisibleBody::new(CallSyntax::Atem, false, false),
        }
    }
}

impl Default for AtemParser {
    fn default() -> Self {
        Self::new()
    }
}

impl Machine for AtemParser {
    fn feed(&mut self, text: &str, cx: &mut Ctx) {
        self.body.push(text, cx)
    }
    fn finish(&mut self, cx: &mut Ctx) {
        self.body.end(cx)
    }
}

/// A parameter value as the chat template writes it (§2.4): strings verbatim,
/// `true`/`false`/`null`, numbers in decimal, arrays and objects as `tojson`.
pub fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => pyjson::number(n),
        _ => pyjson::to_string(v),
    }
}

/// One `<atem:invoke>` element, ending with its newline (§3 grammar).
pub fn render_invoke(name: &str, arguments: &Map<String, Value>) -> String {
    let mut s = format!("<atem:invoke name=\"{name}\">\n");
    for (k, v) in arguments {
        s.push_str(&format!(
            "<atem:parameter name=\"{k}\">{}</atem:parameter>\n",
            render_value(v)
        ));
    }
    s.push_str("</atem:invoke>\n");
    s
}

/// A whole `<atem:function_calls>` block (no newline after it).
pub fn render_block<'a>(
    calls: impl IntoIterator<Item = (&'a str, &'a Map<String, Value>)>,
) -> String {
    let mut s = String::from("<atem:function_calls>\n");
    for (name, args) in calls {
        s.push_str(&render_invoke(name, args));
    }
    s.push_str("</atem:function_calls>");
    s
}
