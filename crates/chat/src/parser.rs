//! Incremental output parsers: generated text in, reasoning / content / tool-call
//! events out, one state machine per output format behind [`OutputParser`].
//!
//! Every parser is fed decoded token text as it is generated, in pieces of any
//! size, and obeys the same rules (spec chat-format.md §4, §7, §8):
//! - Never emit part of a marker as text: a suffix that could still become a
//!   marker is held back and released the moment it cannot be one.
//! - Emitted text never shrinks: an event, once returned, is final.
//! - The events do not depend on how the text was split into pieces, once
//!   consecutive text deltas are merged ([`merge_events`]).
//! - Tool calls written inside reasoning are not calls.
//! - [`ChatEvent::ToolCallStart`] and [`ChatEvent::ToolCallArgs`] are a streaming
//!   preview; only [`ChatEvent::ToolCall`] confirms a call. A call cut off by the
//!   end of generation gets no `ToolCall` (spec §4.7 "the partial call is never
//!   sent").
//! - Nothing is lost: text that is not a confirmed call comes back as content
//!   (or reasoning), verbatim and in order. Only the markup of confirmed calls,
//!   the whitespace around it, and framing tokens are consumed. A call block
//!   that turns out malformed (or is cut off by the end of generation) is
//!   reported with a [`ChatEvent::Warning`] and its text returned as content;
//!   scanning resumes right where the block went wrong, so a well-formed call
//!   after it still counts.
//!
//! Formats (one file each): [`atem`] (bare ATEM XML), [`muse_glimmer`] (recipient
//! framing around ATEM), [`hermes`] (Qwen2.5 `<tool_call>{json}</tool_call>`),
//! [`qwen3_xml`] (Qwen3-Coder `<function=…>`), [`harmony`] (gpt-oss channels) and
//! [`plain`].

pub mod atem;
mod bare_json;
mod body;
mod dialects;
mod driver;
pub mod harmony;
pub mod hermes;
mod json_call;
pub mod muse_glimmer;
pub mod plain;
pub mod pyjson;
pub mod qwen3_xml;
mod scan;
mod tools;
mod xml_calls;

pub use tools::{coerce_value, ParamType, ToolDef, ToolSet};

pub use crate::detect::OutputFormat;

use driver::Driver;

/// Everything that can go wrong in the chat layer: bad requests (messages, tools)
/// and unknown names. Each message says what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("unknown output format {0:?} (expected atem, hermes, qwen3-xml, harmony, muse-glimmer or plain)")]
    UnknownFormat(String),
    #[error("invalid tools: {0}")]
    InvalidTools(String),
    #[error("invalid message {index}: {reason}")]
    InvalidMessage { index: usize, reason: String },
    #[error("prompt: {0}")]
    Prompt(String),
}

/// One thing the model said, in generation order.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatEvent {
    /// Chain-of-thought text (`reasoning_content`).
    Reasoning(String),
    /// Answer text (`content`).
    Content(String),
    /// A tool call has begun: its name is known, its arguments are not.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A piece of the call's arguments as JSON text; the pieces of one call
    /// concatenated are a JSON object equal to the confirmed `arguments`.
    ToolCallArgs { index: usize, delta: String },
    /// The call is complete and confirmed. `arguments` is always a JSON object.
    ToolCall {
        index: usize,
        id: String,
        name: String,
        arguments: serde_json::Value,
    },
    /// Text that began like a tool call was not one (malformed, or cut off by
    /// the end of generation); it comes back as content right after this event.
    /// For logs and metrics, not for the client's message.
    Warning { message: String },
    /// Generation ended; always the last event.
    End { finish_reason: FinishReason },
}

/// Why the turn ended, as reported to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Why generation stopped, as the engine knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishHint {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or cancellation.
    Length,
}

/// What to do with a call whose name is not a registered tool (spec §4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownToolPolicy {
    /// Report the call under the name the model wrote (after §4.6 normalization);
    /// the client answers with an error and the model corrects itself.
    #[default]
    Passthrough,
    /// Reference parity: one unknown call turns the whole response into content,
    /// markup included, with no calls. Tool-call text is buffered to the end.
    Text,
}

/// Construction-time settings shared by every format.
#[derive(Clone, Debug)]
pub struct ParserOptions {
    pub unknown_tool_policy: UnknownToolPolicy,
    /// Call ids are `id_prefix` + index; give a per-request prefix where ids must
    /// be unique across a conversation.
    pub id_prefix: String,
    /// Hermes / Qwen3 XML: generation starts inside `<think>` (the prompt opened it).
    pub start_in_reasoning: bool,
}

impl Default for ParserOptions {
    fn default() -> Self {
        ParserOptions {
            unknown_tool_policy: UnknownToolPolicy::Passthrough,
            id_prefix: "call_".to_string(),
            start_in_reasoning: false,
        }
    }
}

/// A streaming output parser. Feed generated text as it arrives, then call
/// `finish` once; it returns the remaining events and [`ChatEvent::End`].
pub trait OutputParser {
    fn feed(&mut self, text: &str) -> Vec<ChatEvent>;
    fn finish(&mut self, hint: FinishHint) -> Vec<ChatEvent>;
}

/// A parser for the format named `format` (`OutputFormat::name()`: `atem`,
/// `hermes`, `qwen3-xml`, `harmony`, `muse-glimmer`, `plain`; case, `-` and `_`
/// ignored), with `tools` (an OpenAI `tools` array) for name checks and
/// argument types.
pub fn parser_for(
    format: &str,
    tools: Option<&serde_json::Value>,
) -> Result<Box<dyn OutputParser + Send>, ChatError> {
    let format = OutputFormat::from_name(format)
        .ok_or_else(|| ChatError::UnknownFormat(format.to_string()))?;
    parser_with(format, tools, ParserOptions::default())
}

/// A parser for `format` with explicit options. Fails only on malformed `tools`.
pub fn parser_with(
    format: OutputFormat,
    tools: Option<&serde_json::Value>,
    options: ParserOptions,
) -> Result<Box<dyn OutputParser + Send>, ChatError> {
    let tools = match tools {
        Some(t) => ToolSet::from_json(t)?,
        None => ToolSet::default(),
    };
    let think = options.start_in_reasoning;
    Ok(match format {
        OutputFormat::Atem => Box::new(Driver::new(atem::AtemParser::new(), tools, options)),
        OutputFormat::MuseGlimmer => Box::new(Driver::new(
            muse_glimmer::MuseGlimmerParser::new(),
            tools,
            options,
        )),
        OutputFormat::Hermes if !tools.is_empty() => {
            // Qwen2.5-Coder also calls tools with untagged JSON (§8.1 fallback).
            let prefix = format!("{}bare_", options.id_prefix);
            let inner = Box::new(Driver::new(hermes::parser(think), tools.clone(), options));
            Box::new(bare_json::BareJsonFallback::new(inner, tools, prefix))
        }
        OutputFormat::Hermes => Box::new(Driver::new(hermes::parser(think), tools, options)),
        OutputFormat::Qwen3Xml => Box::new(Driver::new(qwen3_xml::parser(think), tools, options)),
        OutputFormat::Harmony => {
            Box::new(Driver::new(harmony::HarmonyParser::new(), tools, options))
        }
        OutputFormat::Plain => Box::new(Driver::new(plain::PlainParser, tools, options)),
    })
}

/// Merges consecutive text deltas of one kind and consecutive argument deltas of
/// one call, so that event lists from differently split inputs compare equal.
pub fn merge_events(events: impl IntoIterator<Item = ChatEvent>) -> Vec<ChatEvent> {
    let mut out: Vec<ChatEvent> = Vec::new();
    for e in events {
        match (out.last_mut(), e) {
            (Some(ChatEvent::Reasoning(a)), ChatEvent::Reasoning(b)) => a.push_str(&b),
            (Some(ChatEvent::Content(a)), ChatEvent::Content(b)) => a.push_str(&b),
            (
                Some(ChatEvent::ToolCallArgs { index: i, delta: a }),
                ChatEvent::ToolCallArgs { index: j, delta: b },
            ) if *i == j => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

/// The argument text streamed for call `index`: its [`ChatEvent::ToolCallArgs`]
/// deltas concatenated, as a streaming client rebuilds it. For a confirmed call
/// it is JSON equal to the call's `arguments` (or empty when none streamed).
pub fn streamed_arguments(events: &[ChatEvent], index: usize) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::ToolCallArgs { index: i, delta } if *i == index => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

/// Runs a whole text through a fresh parser: convenience for tests and tools.
pub fn parse_all(parser: &mut dyn OutputParser, text: &str, hint: FinishHint) -> Vec<ChatEvent> {
    let mut events = parser.feed(text);
    events.extend(parser.finish(hint));
    merge_events(events)
}
