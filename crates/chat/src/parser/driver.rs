//! What every format shares: the event sink ([`Ctx`]) with call numbering and
//! argument streaming, and the [`Driver`] that applies the unknown-tool policy
//! and ends the turn.

use serde_json::Value;

use super::scan::json_escape;
use super::tools::{coerce_value, Args, ParamType, ToolSet};
use super::{ChatEvent, FinishHint, FinishReason, OutputParser, ParserOptions, UnknownToolPolicy};

/// A format's state machine. It writes into the [`Ctx`]; the driver turns that
/// into events.
pub(crate) trait Machine: Send {
    fn feed(&mut self, text: &str, cx: &mut Ctx);
    /// End of generation: flush held text; a truncated call becomes content.
    fn finish(&mut self, cx: &mut Ctx);
}

/// What a machine reports. Markup and unknown-tool marks only matter under
/// [`UnknownToolPolicy::Text`], where the raw text of tool calls may become
/// content after all.
pub(crate) enum Out {
    Event(ChatEvent),
    /// Raw text of confirmed tool-call markup (and the whitespace around it).
    Markup(String),
    /// A call named an unregistered tool.
    UnknownTool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    Reasoning,
    Content,
}

/// The machines' output sink, plus the request's tools and the call counter.
pub(crate) struct Ctx {
    pub tools: ToolSet,
    opts: ParserOptions,
    out: Vec<Out>,
    /// Raw text consumed by call syntax that is not yet known to be a call: it
    /// becomes [`Out::Markup`] when the call is confirmed, or content (with a
    /// warning) when it turns out not to be one.
    pending: String,
    next_index: usize,
    /// Per channel (reasoning, content): has it emitted text, and does the next
    /// text start a new message body (joined with "\n\n", as the reference joins).
    emitted: [bool; 2],
    new_body: [bool; 2],
    /// Set at [`OutputParser::finish`]: generation ended on an
    /// end-of-generation token (which the text does not show), not cut off.
    pub ended_by_stop: bool,
}

impl Ctx {
    /// Text on a channel; empty text is dropped.
    pub fn text(&mut self, ch: Channel, s: &str) {
        if s.is_empty() {
            return;
        }
        let k = ch as usize;
        let mut t = String::new();
        if self.new_body[k] && self.emitted[k] {
            t.push_str("\n\n");
        }
        self.new_body[k] = false;
        self.emitted[k] = true;
        t.push_str(s);
        self.out.push(Out::Event(match ch {
            Channel::Reasoning => ChatEvent::Reasoning(t),
            Channel::Content => ChatEvent::Content(t),
        }));
    }

    pub fn content(&mut self, s: &str) {
        self.text(Channel::Content, s)
    }

    pub fn reasoning(&mut self, s: &str) {
        self.text(Channel::Reasoning, s)
    }

    /// A new message body begins (Muse Glimmer / Harmony framing).
    pub fn begin_body(&mut self) {
        self.new_body = [true, true];
    }

    /// Raw text consumed by call syntax; held until [`Ctx::commit_markup`] or
    /// [`Ctx::release_markup`] decides what it was.
    pub fn markup(&mut self, s: &str) {
        self.pending.push_str(s);
    }

    /// The held markup belongs to a confirmed call (or is whitespace around one).
    pub fn commit_markup(&mut self) {
        if !self.pending.is_empty() {
            self.out
                .push(Out::Markup(std::mem::take(&mut self.pending)));
        }
    }

    /// The held markup was not a call after all: report `why` and return the
    /// text as content, verbatim.
    pub fn release_markup(&mut self, why: &str) {
        let text = std::mem::take(&mut self.pending);
        if text.is_empty() {
            return;
        }
        self.warning(why);
        self.content(&text);
    }

    /// Held markup and `rest` at the end of a body: whitespace only is dropped
    /// (markup around calls); anything else was a call cut off by the end of
    /// the body and becomes content.
    pub fn end_markup(&mut self, rest: &str) {
        self.pending.push_str(rest);
        if self.pending.trim().is_empty() {
            self.commit_markup();
        } else {
            self.release_markup("tool call cut off by the end of the output; kept as content");
        }
    }

    pub fn warning(&mut self, message: &str) {
        self.out.push(Out::Event(ChatEvent::Warning {
            message: message.to_string(),
        }));
    }

    /// Opens a call named `written` (normalized per §4.6) and announces it.
    pub fn open_call(&mut self, written: &str) -> Call {
        let (name, known) = self.tools.normalize(written);
        let index = self.next_index;
        self.next_index += 1;
        let id = format!("{}{}", self.opts.id_prefix, index);
        if !known {
            self.out.push(Out::UnknownTool);
        }
        self.out.push(Out::Event(ChatEvent::ToolCallStart {
            index,
            id: id.clone(),
            name: name.clone(),
        }));
        Call {
            index,
            id,
            name,
            args: Args::new(),
            n_written: 0,
            streaming: None,
        }
    }

    fn args_delta(&mut self, call: &Call, delta: String) {
        if !delta.is_empty() {
            self.out.push(Out::Event(ChatEvent::ToolCallArgs {
                index: call.index,
                delta,
            }));
        }
    }

    /// A call whose arguments arrive whole (JSON formats): start, arguments, done.
    pub fn whole_call(&mut self, written: &str, args: serde_json::Map<String, Value>) {
        let mut call = self.open_call(written);
        call.args = args;
        let text = serde_json::to_string(&call.args).expect("a JSON map serializes");
        self.args_delta(&call, text);
        self.confirm(call);
    }

    /// The call's structural end was seen: it is confirmed.
    pub fn close_call(&mut self, call: Call) {
        let delta = if call.n_written == 0 { "{}" } else { "}" };
        self.args_delta(&call, delta.to_string());
        self.confirm(call);
    }

    fn confirm(&mut self, call: Call) {
        self.commit_markup();
        self.out.push(Out::Event(ChatEvent::ToolCall {
            index: call.index,
            id: call.id,
            name: call.name,
            arguments: Value::Object(call.args),
        }));
    }

    /// Declared type of a parameter of the call's tool.
    pub fn param_type(&self, call: &Call, key: &str) -> ParamType {
        self.tools.param_type(&call.name, key)
    }

    /// A parameter value begins. String-typed values stream from here on.
    pub fn begin_param(&mut self, call: &mut Call, key: &str) {
        if self.param_type(call, key) == ParamType::String {
            let delta = format!("{}{}: \"", call.separator(), quote(key));
            call.n_written += 1;
            call.streaming = Some(0);
            self.args_delta(call, delta);
        }
    }

    /// More of a string value is certain: `raw` is the value so far (all of it).
    pub fn param_progress(&mut self, call: &mut Call, raw: &str) {
        if let Some(sent) = call.streaming {
            if raw.len() > sent {
                let delta = json_escape(&raw[sent..]);
                call.streaming = Some(raw.len());
                self.args_delta(call, delta);
            }
        }
    }

    /// A parameter value ended with its full raw text.
    pub fn end_param(&mut self, call: &mut Call, key: &str, raw: &str, null_words: bool) {
        let ty = self.param_type(call, key);
        let value = coerce_value(raw, ty, null_words);
        if call.streaming.is_some() {
            self.param_progress(call, raw);
            self.args_delta(call, "\"".to_string());
            call.streaming = None;
        } else {
            let delta = format!(
                "{}{}: {}",
                call.separator(),
                quote(key),
                serde_json::to_string(&value).expect("a JSON value serializes")
            );
            call.n_written += 1;
            self.args_delta(call, delta);
        }
        call.args.insert(key.to_string(), value);
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a str serializes")
}

/// A call being written.
pub(crate) struct Call {
    pub index: usize,
    pub id: String,
    pub name: String,
    pub args: Args,
    /// Parameters written to the argument stream so far.
    n_written: usize,
    /// Inside a streamed string value: bytes of its raw text already sent.
    streaming: Option<usize>,
}

impl Call {
    fn separator(&self) -> &'static str {
        if self.n_written == 0 {
            "{"
        } else {
            ", "
        }
    }
}

/// Runs a [`Machine`] and applies the unknown-tool policy.
pub(crate) struct Driver<M: Machine> {
    machine: M,
    cx: Ctx,
    /// `Text` policy: everything from the first tool markup on waits here.
    queue: Vec<Out>,
    queueing: bool,
    confirmed_calls: usize,
    finished: bool,
}

impl<M: Machine> Driver<M> {
    pub fn new(machine: M, tools: ToolSet, opts: ParserOptions) -> Self {
        Driver {
            machine,
            cx: Ctx {
                tools,
                opts,
                out: Vec::new(),
                pending: String::new(),
                next_index: 0,
                emitted: [false; 2],
                new_body: [false; 2],
                ended_by_stop: false,
            },
            queue: Vec::new(),
            queueing: false,
            confirmed_calls: 0,
            finished: false,
        }
    }

    fn route(&mut self, events: &mut Vec<ChatEvent>) {
        let text_policy = self.cx.opts.unknown_tool_policy == UnknownToolPolicy::Text;
        for o in self.cx.out.drain(..) {
            if text_policy {
                let toolish = match &o {
                    Out::Markup(_) | Out::UnknownTool => true,
                    Out::Event(e) => is_tool_event(e),
                };
                self.queueing |= toolish;
                if self.queueing {
                    self.queue.push(o);
                    continue;
                }
            }
            if let Out::Event(e) = o {
                if matches!(e, ChatEvent::ToolCall { .. }) {
                    self.confirmed_calls += 1;
                }
                events.push(e);
            }
        }
    }
}

fn is_tool_event(e: &ChatEvent) -> bool {
    matches!(
        e,
        ChatEvent::ToolCallStart { .. }
            | ChatEvent::ToolCallArgs { .. }
            | ChatEvent::ToolCall { .. }
    )
}

impl<M: Machine> OutputParser for Driver<M> {
    fn feed(&mut self, text: &str) -> Vec<ChatEvent> {
        let mut events = Vec::new();
        if !self.finished {
            self.machine.feed(text, &mut self.cx);
            self.route(&mut events);
        }
        events
    }

    fn finish(&mut self, hint: FinishHint) -> Vec<ChatEvent> {
        let mut events = Vec::new();
        if self.finished {
            return events;
        }
        self.finished = true;
        self.cx.ended_by_stop = hint == FinishHint::Stop;
        self.machine.finish(&mut self.cx);
        // Machines settle their markup at the end; this only guards against
        // losing text if one did not.
        self.cx.end_markup("");
        self.route(&mut events);
        let queue = std::mem::take(&mut self.queue);
        let as_text = queue.iter().any(|o| matches!(o, Out::UnknownTool));
        for o in queue {
            match o {
                Out::Event(e) if as_text && is_tool_event(&e) => {}
                Out::Event(e) => {
                    if matches!(e, ChatEvent::ToolCall { .. }) {
                        self.confirmed_calls += 1;
                    }
                    events.push(e);
                }
                Out::Markup(s) if as_text => events.push(ChatEvent::Content(s)),
                Out::Markup(_) | Out::UnknownTool => {}
            }
        }
        let finish_reason = if self.confirmed_calls > 0 {
            FinishReason::ToolCalls
        } else {
            match hint {
                FinishHint::Stop => FinishReason::Stop,
                FinishHint::Length => FinishReason::Length,
            }
        };
        events.push(ChatEvent::End { finish_reason });
        events
    }
}
