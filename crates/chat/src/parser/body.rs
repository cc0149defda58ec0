//! A visible message body: answer text with tool-call blocks in it (and, for the
//! Qwen formats, `<think>` reasoning). The framing formats (Muse Glimmer, the
//! ChatML end tokens) cut the output into bodies; a body ends at its message
//! terminator or at the end of generation, which both count as "end of input"
//! for the structural-end rules.

use super::dialects;
use super::driver::{Ctx, Machine};
use super::json_call::{self, JsonCall};
use super::scan::{find_first, lit, partial_suffix_len, trailing_ws_len, ws_len, Lit, Match};
use super::xml_calls::{self, Stage, Step, XmlDialect};

/// The tool-call syntax a body is scanned for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallSyntax {
    Atem,
    Qwen3Xml,
    Hermes,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

enum State {
    Text,
    /// Inside `<think>…</think>`: reasoning, never calls.
    Think,
    /// Dropping whitespace (after a call block or `</think>`); `markup`: report it.
    SkipWs {
        markup: bool,
    },
    Xml(Stage),
    Json(JsonCall),
}

pub(crate) struct VisibleBody {
    syntax: CallSyntax,
    think_tags: bool,
    buf: String,
    state: State,
}

/// A trigger found in text.
enum Trigger {
    Think,
    Block,
    /// A bare invoke tag with its name.
    Invoke(String),
}

impl VisibleBody {
    pub fn new(syntax: CallSyntax, think_tags: bool, in_think: bool) -> Self {
        VisibleBody {
            syntax,
            think_tags,
            buf: String::new(),
            state: if in_think { State::Think } else { State::Text },
        }
    }

    fn dialect(&self) -> &'static XmlDialect {
        match self.syntax {
            CallSyntax::Atem => &dialects::ATEM,
            CallSyntax::Qwen3Xml => &dialects::QWEN3_XML,
            CallSyntax::Hermes => unreachable!("Hermes calls are JSON"),
        }
    }

    pub fn push(&mut self, text: &str, cx: &mut Ctx) {
        self.buf.push_str(text);
        self.run(cx, false);
    }

    /// The body is complete: decide what was waiting and flush text. A call
    /// without its structural end is never confirmed (§4.1); its text is
    /// content, with a warning.
    pub fn end(&mut self, cx: &mut Ctx) {
        self.run(cx, true);
        let rest = std::mem::take(&mut self.buf);
        match &self.state {
            State::Text => cx.content(&rest),
            State::Think => cx.reasoning(&rest),
            // An unfinished block is content (with a warning); whitespace
            // after finished calls is dropped.
            State::SkipWs { .. } | State::Xml(_) | State::Json(_) => cx.end_markup(&rest),
        }
        self.state = State::Text;
    }

    fn run(&mut self, cx: &mut Ctx, end: bool) {
        loop {
            let step = match &mut self.state {
                State::Text => self.text_step(cx, end),
                State::Think => self.think_step(cx, end),
                State::SkipWs { markup } => {
                    let n = ws_len(&self.buf);
                    if *markup {
                        cx.markup(&self.buf[..n]);
                        cx.commit_markup();
                    }
                    self.buf.drain(..n);
                    if self.buf.is_empty() {
                        Step::Wait
                    } else {
                        self.state = State::Text;
                        Step::Continue
                    }
                }
                State::Xml(stage) => {
                    let d = match self.syntax {
                        CallSyntax::Atem => &dialects::ATEM,
                        _ => &dialects::QWEN3_XML,
                    };
                    xml_calls::step(d, stage, &mut self.buf, cx, end)
                }
                State::Json(call) => json_call::step(call, &mut self.buf, cx),
            };
            match step {
                Step::Continue => {}
                Step::Wait => break,
                Step::Done => {
                    cx.commit_markup();
                    self.state = State::SkipWs { markup: true };
                }
                Step::Malformed(why) => {
                    cx.release_markup(&why);
                    self.state = State::Text;
                }
            }
        }
    }

    /// Looks for a trigger at the start of `s`.
    fn trigger(&self, s: &str) -> Match<Trigger> {
        let mut partial = false;
        if self.think_tags {
            match lit(s, THINK_OPEN) {
                Lit::Yes => return Match::Full(THINK_OPEN.len(), Trigger::Think),
                Lit::Partial => partial = true,
                Lit::No => {}
            }
        }
        let block_open = match self.syntax {
            CallSyntax::Hermes => json_call::TOOL_CALL_OPEN,
            _ => self.dialect().block_open,
        };
        match lit(s, block_open) {
            Lit::Yes => return Match::Full(block_open.len(), Trigger::Block),
            Lit::Partial => partial = true,
            Lit::No => {}
        }
        if self.syntax != CallSyntax::Hermes {
            let d = self.dialect();
            match d.open_tag(s, d.invoke_prefix) {
                Match::Full(n, name) => return Match::Full(n, Trigger::Invoke(name)),
                Match::Partial => partial = true,
                Match::No => {}
            }
        }
        if partial {
            Match::Partial
        } else {
            Match::No
        }
    }

    fn text_step(&mut self, cx: &mut Ctx, end: bool) -> Step {
        let mut from = 0;
        while let Some(rel) = self.buf[from..].find('<') {
            let i = from + rel;
            match self.trigger(&self.buf[i..]) {
                Match::Full(n, t) => {
                    let before = &self.buf[..i];
                    if let Trigger::Think = t {
                        cx.content(before);
                        self.buf.drain(..i + n);
                        self.state = State::Think;
                        return Step::Continue;
                    }
                    // Whitespace before a call block belongs to the markup: the
                    // leading text is trimmed (§4.4, §5 example 6).
                    let ws = trailing_ws_len(before);
                    cx.content(&before[..i - ws]);
                    cx.markup(&self.buf[i - ws..i + n]);
                    self.buf.drain(..i + n);
                    self.state = match t {
                        Trigger::Invoke(name) => State::Xml(Stage::Invoke(cx.open_call(&name))),
                        _ if self.syntax == CallSyntax::Hermes => State::Json(JsonCall::default()),
                        _ => State::Xml(Stage::Block { empty: true }),
                    };
                    return Step::Continue;
                }
                Match::Partial if !end => {
                    self.emit_text(i, cx);
                    return Step::Wait;
                }
                _ => from = i + 1,
            }
        }
        if end {
            let all = self.buf.len();
            self.emit_text_exact(all, cx);
        } else {
            let all = self.buf.len();
            self.emit_text(all, cx);
        }
        Step::Wait
    }

    /// Emits `buf[..n]` as content, holding back its trailing whitespace (it is
    /// dropped if a call block follows).
    fn emit_text(&mut self, n: usize, cx: &mut Ctx) {
        let keep = n - trailing_ws_len(&self.buf[..n]);
        self.emit_text_exact(keep, cx);
    }

    fn emit_text_exact(&mut self, n: usize, cx: &mut Ctx) {
        cx.content(&self.buf[..n]);
        self.buf.drain(..n);
    }

    fn think_step(&mut self, cx: &mut Ctx, end: bool) -> Step {
        if let Some(p) = self.buf.find(THINK_CLOSE) {
            cx.reasoning(&self.buf[..p]);
            self.buf.drain(..p + THINK_CLOSE.len());
            self.state = State::SkipWs { markup: false };
            return Step::Continue;
        }
        let hold = if end {
            0
        } else {
            partial_suffix_len(&self.buf, &[THINK_CLOSE])
        };
        let n = self.buf.len() - hold;
        cx.reasoning(&self.buf[..n]);
        self.buf.drain(..n);
        Step::Wait
    }
}

/// A body run that ends at literal end tokens (ChatML's `<|im_end|>`,
/// `<|endoftext|>`): text after one starts a fresh body.
pub(crate) struct Terminated {
    syntax: CallSyntax,
    terminators: &'static [&'static str],
    body: VisibleBody,
    buf: String,
}

impl Terminated {
    pub fn new(syntax: CallSyntax, terminators: &'static [&'static str], in_think: bool) -> Self {
        Terminated {
            syntax,
            terminators,
            body: VisibleBody::new(syntax, true, in_think),
            buf: String::new(),
        }
    }
}

/// Hermes and Qwen3-XML output: ChatML bodies, each ended by an end token.
impl Machine for Terminated {
    fn feed(&mut self, text: &str, cx: &mut Ctx) {
        self.buf.push_str(text);
        while let Some((p, t)) = find_first(&self.buf, self.terminators) {
            self.body.push(&self.buf[..p], cx);
            self.body.end(cx);
            self.body = VisibleBody::new(self.syntax, true, false);
            self.buf.drain(..p + self.terminators[t].len());
        }
        let n = self.buf.len() - partial_suffix_len(&self.buf, self.terminators);
        self.body.push(&self.buf[..n], cx);
        self.buf.drain(..n);
    }

    fn finish(&mut self, cx: &mut Ctx) {
        let rest = std::mem::take(&mut self.buf);
        self.body.push(&rest, cx);
        self.body.end(cx);
    }
}
