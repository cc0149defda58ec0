//! Qwen2.5-Coder's untagged tool calls (spec §8.1, "optional profile
//! fallback"): the model often answers a tool request with a bare JSON object
//! or a ```json block instead of `<tool_call>` tags. When the whole trimmed
//! content (fence removed) is `{"name": REGISTERED, "arguments": {…}}` or a
//! list of those, it is a call.
//!
//! Wraps the Hermes parser. Content that could still become such a call (it
//! starts with `{`, `[` or a code fence) is held back until the end of the
//! generation; any other content streams through at once, so ordinary answers
//! are not delayed.

use serde_json::Value;

use super::{ChatEvent, FinishHint, FinishReason, OutputParser, ToolSet};

enum State {
    /// Only whitespace or a possible call seen so far; content is held.
    Undecided,
    /// Content is plain text (or the model used tags): pass everything through.
    Passthrough,
}

pub(crate) struct BareJsonFallback {
    inner: Box<dyn OutputParser + Send>,
    tools: ToolSet,
    id_prefix: String,
    state: State,
    held: String,
}

impl BareJsonFallback {
    pub fn new(inner: Box<dyn OutputParser + Send>, tools: ToolSet, id_prefix: String) -> Self {
        BareJsonFallback {
            inner,
            tools,
            id_prefix,
            state: State::Undecided,
            held: String::new(),
        }
    }

    /// Whether `held` (trimmed) can still turn out to be a bare call.
    fn may_be_call(held: &str) -> bool {
        let t = held.trim_start();
        t.is_empty()
            || t.starts_with('{')
            || t.starts_with('[')
            || "```".starts_with(t)
            || t.starts_with("```")
    }

    fn route(&mut self, events: Vec<ChatEvent>, out: &mut Vec<ChatEvent>) {
        for e in events {
            match (&self.state, e) {
                (State::Undecided, ChatEvent::Content(s)) => {
                    self.held.push_str(&s);
                    if !Self::may_be_call(&self.held) {
                        self.release(out);
                    }
                }
                (State::Undecided, e @ (ChatEvent::Reasoning(_) | ChatEvent::Warning { .. })) => {
                    out.push(e)
                }
                (State::Undecided, e) => {
                    // A tagged call or the end: the fallback does not apply.
                    self.release(out);
                    out.push(e);
                }
                (State::Passthrough, e) => out.push(e),
            }
        }
    }

    fn release(&mut self, out: &mut Vec<ChatEvent>) {
        self.state = State::Passthrough;
        if !self.held.is_empty() {
            out.push(ChatEvent::Content(std::mem::take(&mut self.held)));
        }
    }

    /// The calls `text` spells, if it is entirely registered bare calls.
    fn bare_calls(&self, text: &str) -> Option<Vec<(String, Value)>> {
        let mut t = text.trim();
        if let Some(rest) = t.strip_prefix("```") {
            let rest = rest.strip_prefix("json").unwrap_or(rest);
            t = rest.strip_suffix("```")?.trim();
        }
        let items = match serde_json::from_str::<Value>(t).ok()? {
            Value::Array(items) if !items.is_empty() => items,
            obj @ Value::Object(_) => vec![obj],
            _ => return None,
        };
        items
            .into_iter()
            .map(|item| {
                let obj = item.as_object()?;
                let name = obj.get("name")?.as_str()?;
                let (name, registered) = self.tools.normalize(name);
                let args = obj
                    .get("arguments")
                    .or_else(|| obj.get("parameters"))
                    .cloned()
                    .unwrap_or(Value::Null);
                let args = match args {
                    Value::Null => Value::Object(Default::default()),
                    Value::String(s) => serde_json::from_str::<Value>(&s)
                        .ok()
                        .filter(Value::is_object)?,
                    v @ Value::Object(_) => v,
                    _ => return None,
                };
                registered.then_some((name, args))
            })
            .collect()
    }
}

impl OutputParser for BareJsonFallback {
    fn feed(&mut self, text: &str) -> Vec<ChatEvent> {
        let events = self.inner.feed(text);
        let mut out = Vec::new();
        self.route(events, &mut out);
        out
    }

    fn finish(&mut self, hint: FinishHint) -> Vec<ChatEvent> {
        let mut events = self.inner.finish(hint);
        let end = match events.last() {
            Some(ChatEvent::End { .. }) => events.pop(),
            _ => None,
        };
        let mut out = Vec::new();
        self.route(events, &mut out);
        if let State::Undecided = self.state {
            if let Some(calls) = self.bare_calls(&self.held) {
                self.held.clear();
                for (index, (name, arguments)) in calls.into_iter().enumerate() {
                    let id = format!("{}{index}", self.id_prefix);
                    out.push(ChatEvent::ToolCallStart {
                        index,
                        id: id.clone(),
                        name: name.clone(),
                    });
                    out.push(ChatEvent::ToolCall {
                        index,
                        id,
                        name,
                        arguments,
                    });
                }
                out.push(ChatEvent::End {
                    finish_reason: FinishReason::ToolCalls,
                });
                return out;
            }
            self.release(&mut out);
        }
        out.extend(end);
        out
    }
}
