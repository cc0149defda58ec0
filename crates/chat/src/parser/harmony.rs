//! Harmony output (gpt-oss, spec §7):
//!
//! ```text
//! <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>
//! <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{JSON}<|call|>
//! ```
//! `analysis` → reasoning; `final`, recipient-less `commentary` and unframed text
//! → content; `to=functions.NAME` → a call to NAME with the JSON body as
//! arguments; any other recipient (`browser.search`, `python`) is a call under
//! its full name, which the unknown-tool policy judges. Call bodies are JSON,
//! so their arguments come whole when the message ends.

use serde_json::{Map, Value};

use super::driver::{Ctx, Machine};
use super::pyjson;
use super::scan::{lit, partial_suffix_len, ws_len, Lit, Match};

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";
const END_OF_TEXT: &str = "<|endoftext|>";
const SPECIALS: [&str; 8] = [
    START,
    END,
    MESSAGE,
    CHANNEL,
    CONSTRAIN,
    RETURN,
    CALL,
    END_OF_TEXT,
];

/// Longest header we wait for before deciding the text is not one.
const MAX_HEADER: usize = 512;

enum State {
    Header,
    Reasoning,
    Content,
    /// A call body: the recipient's tool name and the JSON text so far.
    Call {
        name: String,
        body: String,
    },
}

pub(crate) struct HarmonyParser {
    state: State,
    buf: String,
}

impl HarmonyParser {
    /// Output right after the generation prompt `<|start|>assistant`.
    pub fn new() -> Self {
        HarmonyParser {
            state: State::Header,
            buf: String::new(),
        }
    }
}

impl Default for HarmonyParser {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Default, PartialEq)]
struct Header {
    channel: Option<String>,
    recipient: Option<String>,
}

fn word_len(s: &str) -> usize {
    s.bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
        .count()
}

/// `[<|start|>] [assistant] ( <|channel|>WORD | ws* to=RECIPIENT | ws* <|constrain|>WORD )* <|message|>`
fn match_header(s: &str) -> Match<Header> {
    let mut i = 0;
    let mut h = Header::default();
    for opt in [START, "assistant"] {
        match lit(&s[i..], opt) {
            Lit::Yes => i += opt.len(),
            Lit::Partial => return Match::Partial,
            Lit::No => {}
        }
    }
    loop {
        if i > MAX_HEADER {
            return Match::No;
        }
        match lit(&s[i..], MESSAGE) {
            Lit::Yes => return Match::Full(i + MESSAGE.len(), h),
            Lit::Partial => return Match::Partial,
            Lit::No => {}
        }
        if let Lit::Yes = lit(&s[i..], CHANNEL) {
            i += CHANNEL.len();
            let n = word_len(&s[i..]);
            if i + n == s.len() {
                return Match::Partial;
            }
            h.channel = Some(s[i..i + n].to_string());
            i += n;
            continue;
        }
        let ws = ws_len(&s[i..]);
        let j = i + ws;
        if j == s.len() {
            return Match::Partial;
        }
        let mut partial = false;
        let mut matched = false;
        for (tag, is_to) in [("to=", true), (CONSTRAIN, false)] {
            match lit(&s[j..], tag) {
                Lit::Yes => {
                    let k = j + tag.len();
                    let n = word_len(&s[k..]);
                    if k + n == s.len() {
                        return Match::Partial;
                    }
                    if is_to {
                        h.recipient = Some(s[k..k + n].to_string());
                    }
                    i = k + n;
                    matched = true;
                    break;
                }
                Lit::Partial => partial = true,
                Lit::No => {}
            }
        }
        if matched {
            continue;
        }
        if partial || (ws == 0 && lit(&s[i..], CHANNEL) == Lit::Partial) {
            return Match::Partial;
        }
        return Match::No;
    }
}

impl HarmonyParser {
    fn begin_body(&mut self, h: Header, cx: &mut Ctx) {
        cx.begin_body();
        self.state = match (h.recipient, h.channel.as_deref()) {
            (Some(r), _) if !matches!(r.as_str(), "user" | "all" | "assistant") => {
                let name = r.strip_prefix("functions.").unwrap_or(&r).to_string();
                State::Call {
                    name,
                    body: String::new(),
                }
            }
            (_, Some("analysis")) => State::Reasoning,
            _ => State::Content,
        };
    }

    fn end_body(&mut self, cx: &mut Ctx) {
        if let State::Call { name, body } = std::mem::replace(&mut self.state, State::Header) {
            cx.markup(&body);
            let trimmed = body.trim();
            let args = if trimmed.is_empty() {
                Some(Map::new())
            } else {
                match serde_json::from_str::<Value>(trimmed) {
                    Ok(Value::Object(m)) => Some(m),
                    _ => None,
                }
            };
            match args {
                Some(args) => cx.whole_call(&name, args),
                // A body that is not a JSON object is no call: it is content.
                None => cx.release_markup(&format!(
                    "call to {name:?} whose body is not a JSON object; kept as content"
                )),
            }
        }
    }

    fn pass(&mut self, n: usize, cx: &mut Ctx) {
        let text = &self.buf[..n];
        match &mut self.state {
            State::Reasoning => cx.reasoning(text),
            State::Content => cx.content(text),
            State::Call { body, .. } => body.push_str(text),
            State::Header => unreachable!("text is passed to a body"),
        }
        self.buf.drain(..n);
    }

    fn run(&mut self, cx: &mut Ctx, end: bool) {
        loop {
            if let State::Header = self.state {
                match match_header(&self.buf) {
                    Match::Full(n, h) => {
                        self.buf.drain(..n);
                        self.begin_body(h, cx);
                    }
                    Match::Partial if !end => return,
                    _ => {
                        if self.buf.starts_with(START) {
                            self.buf.drain(..START.len());
                        }
                        self.begin_body(Header::default(), cx);
                    }
                }
                continue;
            }
            let found = self.buf.match_indices('<').find_map(|(i, _)| {
                SPECIALS
                    .iter()
                    .find(|t| self.buf[i..].starts_with(**t))
                    .map(|t| (i, *t))
            });
            match found {
                Some((at, token)) => {
                    self.pass(at, cx);
                    match token {
                        // Stray header pieces inside a body are dropped.
                        MESSAGE | CHANNEL | CONSTRAIN => {
                            self.buf.drain(..token.len());
                        }
                        START => self.end_body(cx),
                        _ => {
                            self.buf.drain(..token.len());
                            self.end_body(cx);
                        }
                    }
                }
                None => {
                    let hold = if end {
                        0
                    } else {
                        partial_suffix_len(&self.buf, &SPECIALS)
                    };
                    let n = self.buf.len() - hold;
                    self.pass(n, cx);
                    return;
                }
            }
        }
    }
}

impl Machine for HarmonyParser {
    fn feed(&mut self, text: &str, cx: &mut Ctx) {
        self.buf.push_str(text);
        self.run(cx, false);
    }

    fn finish(&mut self, cx: &mut Ctx) {
        self.run(cx, true);
        // `<|call|>` ends generation, so the text never shows it: a call body
        // at an end-of-generation token is complete (llama.cpp's rule). One
        // cut off by the token budget was never confirmed; its text is content.
        if cx.ended_by_stop && matches!(self.state, State::Call { .. }) {
            self.end_body(cx);
        }
        if let State::Call { body, .. } = std::mem::replace(&mut self.state, State::Header) {
            cx.end_markup(&body);
        }
    }
}

/// One function call message as gpt-oss writes it (§7), including the
/// `<|start|>assistant` that the generation prompt supplies for the first one.
pub fn render_call(name: &str, arguments: &Map<String, Value>) -> String {
    format!(
        "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{}<|call|>",
        pyjson::to_string(&Value::Object(arguments.clone()))
    )
}
