//! Output items and stream events, built from the parser's events.

use hearth_chat::parser::ChatEvent;
use serde_json::{json, Value};

use crate::api::responses::{custom_input, ToolNames};
use crate::chat::random_hex;

/// Output items as they are built from the parser's events.
#[derive(Default)]
pub(super) struct Items {
    pub(super) done: Vec<Value>,
    /// The open item (reasoning, message, or function call).
    open: Option<Value>,
    /// Per parser call index: whether its arguments were streamed.
    calls: Vec<Option<bool>>,
    pub(super) any_call: bool,
    /// How each tool the model sees is called.
    pub(super) names: ToolNames,
}

pub(super) type Out = (&'static str, Value);

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex())
}

impl Items {
    /// No items yet; the request's tools by the names the model sees.
    pub(super) fn new(names: ToolNames) -> Items {
        Items {
            names,
            ..Items::default()
        }
    }

    fn index(&self) -> usize {
        self.done.len()
    }

    pub(super) fn close(&mut self, out: &mut Vec<Out>) {
        let Some(mut item) = self.open.take() else {
            return;
        };
        let at = self.index();
        let id = item["id"].clone();
        match item["type"].as_str() {
            Some("message") => {
                item["status"] = json!("completed");
                let text = item["content"][0]["text"].clone();
                out.push((
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push((
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "part": item["content"][0]}),
                ));
            }
            Some("reasoning") => {
                let text = item["content"][0]["text"].clone();
                out.push((
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "text": text}),
                ));
            }
            Some("custom_tool_call") => {
                item["status"] = json!("completed");
                let input = custom_input(item["input"].as_str().unwrap_or_default());
                item["input"] = json!(input);
                out.push((
                    "response.custom_tool_call_input.done",
                    json!({"item_id": id, "output_index": at, "input": item["input"]}),
                ));
            }
            Some("function_call") => {
                item["status"] = json!("completed");
                out.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id,
                    "output_index": at, "name": item["name"], "arguments": item["arguments"]}),
                ));
            }
            _ => {}
        }
        out.push((
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        ));
        self.done.push(item);
    }

    fn text(&mut self, kind: &str, t: String, out: &mut Vec<Out>) {
        if t.is_empty() {
            return;
        }
        if self
            .open
            .as_ref()
            .map(|i| i["type"] != kind)
            .unwrap_or(true)
        {
            self.close(out);
            let at = self.index();
            let item = match kind {
                "reasoning" => json!({"type": "reasoning", "id": item_id("rs"), "summary": [],
                                      "content": [{"type": "reasoning_text", "text": ""}]}),
                _ => json!({"type": "message", "id": item_id("msg"), "status": "in_progress",
                            "role": "assistant", "content": []}),
            };
            let mut added = item.clone();
            if kind == "reasoning" {
                added["content"] = json!([]);
            }
            out.push((
                "response.output_item.added",
                json!({"output_index": at, "item": added}),
            ));
            let mut item = item;
            if kind == "message" {
                let part =
                    json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                out.push((
                    "response.content_part.added",
                    json!({"item_id": item["id"],
                    "output_index": at, "content_index": 0, "part": part}),
                ));
                item["content"] = json!([part]);
            }
            self.open = Some(item);
        }
        let at = self.index();
        let item = self.open.as_mut().expect("opened");
        let so_far = item["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        item["content"][0]["text"] = json!(format!("{so_far}{t}"));
        let event = match kind {
            "reasoning" => "response.reasoning_text.delta",
            _ => "response.output_text.delta",
        };
        let mut data =
            json!({"item_id": item["id"], "output_index": at, "content_index": 0, "delta": t});
        if kind == "message" {
            data["logprobs"] = json!([]);
        }
        out.push((event, data));
    }

    fn start_call(&mut self, index: usize, call_id: &str, name: &str, out: &mut Vec<Out>) {
        self.close(out);
        self.any_call = true;
        let item = match self.names.get(name).cloned() {
            // The arguments gather in `input` and become its string at close.
            Some(c) if c.custom => {
                let mut item = json!({"type": "custom_tool_call", "id": item_id("ctc"),
                    "call_id": call_id, "name": c.name, "input": "", "status": "in_progress"});
                if let Some(ns) = c.namespace {
                    item["namespace"] = json!(ns);
                }
                item
            }
            c => {
                let mut item = json!({"type": "function_call", "id": item_id("fc"),
                    "call_id": call_id, "name": c.as_ref().map_or(name, |c| c.name.as_str()),
                    "arguments": "", "status": "in_progress"});
                if let Some(ns) = c.and_then(|c| c.namespace) {
                    item["namespace"] = json!(ns);
                }
                item
            }
        };
        out.push((
            "response.output_item.added",
            json!({"output_index": self.index(), "item": item}),
        ));
        self.open = Some(item);
        if self.calls.len() <= index {
            self.calls.resize(index + 1, None);
        }
        self.calls[index] = Some(false);
    }

    fn call_args(&mut self, index: usize, delta: &str, out: &mut Vec<Out>) {
        if delta.is_empty() {
            return;
        }
        let at = self.index();
        let Some(item) = self
            .open
            .as_mut()
            .filter(|i| i["type"] == "function_call" || i["type"] == "custom_tool_call")
        else {
            return;
        };
        if let Some(Some(streamed)) = self.calls.get_mut(index) {
            *streamed = true;
        }
        // A freeform call's input is one string, known whole only at the end.
        if item["type"] == "custom_tool_call" {
            let so_far = item["input"].as_str().unwrap_or_default().to_string();
            item["input"] = json!(format!("{so_far}{delta}"));
            return;
        }
        let so_far = item["arguments"].as_str().unwrap_or_default().to_string();
        item["arguments"] = json!(format!("{so_far}{delta}"));
        out.push((
            "response.function_call_arguments.delta",
            json!({"item_id": item["id"], "output_index": at, "delta": delta}),
        ));
    }

    pub(super) fn events(&mut self, events: Vec<ChatEvent>, reasoning: bool, out: &mut Vec<Out>) {
        for e in events {
            match e {
                ChatEvent::Reasoning(t) if reasoning => self.text("reasoning", t, out),
                ChatEvent::Reasoning(_) => {}
                ChatEvent::Content(t) => self.text("message", t, out),
                ChatEvent::ToolCallStart { index, id, name } => {
                    self.start_call(index, &id, &name, out)
                }
                ChatEvent::ToolCallArgs { index, delta } => self.call_args(index, &delta, out),
                ChatEvent::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    if !matches!(self.calls.get(index), Some(Some(_))) {
                        self.start_call(index, &id, &name, out);
                    }
                    let full = arguments.to_string();
                    if !matches!(self.calls.get(index), Some(Some(true))) {
                        self.call_args(index, &full, out);
                    }
                    if let Some(item) = self.open.as_mut() {
                        if item["type"] == "function_call" {
                            item["arguments"] = json!(full);
                        } else if item["type"] == "custom_tool_call" {
                            item["input"] = json!(full);
                        }
                    }
                    self.close(out);
                }
                ChatEvent::End { .. } | ChatEvent::Warning { .. } => {}
            }
        }
    }
}
