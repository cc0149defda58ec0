//! Muse Glimmer output (spec §3, §4.7): messages addressed by recipient,
//!
//! ```text
//! output := msg ( "<|eom|><|start|>assistant" msg )* [ "<|eot|>" | "<|end_of_text|>" ]
//! msg    := " to=" recipient [ " constrain=" ident ] "<|message|>" body
//! ```
//! `self` → reasoning; `user` or no recipient → content; anything else is a tool
//! channel, whose body is scanned for ATEM calls. As in llama.cpp 11434's
//! parser (common/parsers/muse-glimmer.cpp), a message addressed to the user
//! (` to=user<|message|>` or a bare `<|message|>`) is the answer: ATEM markup
//! quoted in it stays content, and a call needs its own ` to=TOOL` message
//! (after `<|eom|><|start|>assistant`). Text that never reaches a
//! `<|message|>` header (output llama.cpp's grammar rejects) is still scanned
//! for calls rather than dropped. `self` bodies are never scanned. Framing
//! works on text: a suffix that could begin a special token or a ` to=…`
//! header is held back until it is decided.

use super::body::{CallSyntax, VisibleBody};
use super::driver::{Ctx, Machine};
use super::scan::{lit, Lit, Match};

const START: &str = "<|start|>";
const MESSAGE: &str = "<|message|>";
const EOM: &str = "<|eom|>";
const EOT: &str = "<|eot|>";
const END_OF_TEXT: &str = "<|end_of_text|>";
const SPECIALS: [&str; 5] = [START, MESSAGE, EOM, EOT, END_OF_TEXT];

#[allow(clippy::large_enum_variant)] // one per response; boxing buys nothing
enum State {
    /// Before a message body: collecting a possible header.
    Header,
    Reasoning,
    /// A message to the user: answer text, calls never scanned.
    Answer,
    Visible(Box<VisibleBody>),
}

pub(crate) struct MuseGlimmerParser {
    state: State,
    buf: String,
    /// The last character given to the current body was `[A-Za-z0-9_]`: a
    /// `to=` right after it is prose (`goto=x`), not a header.
    after_word: bool,
}

impl MuseGlimmerParser {
    /// Output right after the generation prompt `<|start|>assistant`.
    pub fn new() -> Self {
        MuseGlimmerParser {
            state: State::Header,
            buf: String::new(),
            after_word: false,
        }
    }
}

impl Default for MuseGlimmerParser {
    fn default() -> Self {
        Self::new()
    }
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_recipient_char(b: u8) -> bool {
    is_word(b) || b == b'.' || b == b'-'
}

/// Matches a message header at the start of `s`:
/// `[<|start|>] [assistant] [ws] [to=RECIPIENT [ constrain=IDENT]] <|message|>`
/// (§3.2 rule 1). `require_to`: inside a body only a `to=` header counts.
/// On a match, returns the recipient.
fn match_header(s: &str, require_to: bool) -> Match<Option<String>> {
    let mut i = 0;
    if !require_to {
        for opt in [START, "assistant"] {
            match lit(&s[i..], opt) {
                Lit::Yes => i += opt.len(),
                Lit::Partial => return Match::Partial,
                Lit::No => {}
            }
        }
    }
    match s.as_bytes().get(i) {
        None => return Match::Partial,
        Some(b) if b.is_ascii_whitespace() => i += 1,
        Some(_) => {}
    }
    let mut recipient = None;
    match lit(&s[i..], "to=") {
        Lit::Partial => return Match::Partial,
        Lit::No if require_to => return Match::No,
        Lit::No => {}
        Lit::Yes => {
            i += 3;
            let n = s[i..].bytes().take_while(|b| is_recipient_char(*b)).count();
            if i + n == s.len() {
                return Match::Partial;
            }
            if n == 0 {
                return Match::No;
            }
            recipient = Some(s[i..i + n].to_string());
            i += n;
            match lit(&s[i..], " constrain=") {
                Lit::Partial => return Match::Partial,
                Lit::No => {}
                Lit::Yes => {
                    i += " constrain=".len();
                    let n = s[i..]
                        .bytes()
                        .take_while(|b| is_word(*b) || *b == b'-')
                        .count();
                    if i + n == s.len() {
                        return Match::Partial;
                    }
                    if n == 0 {
                        return Match::No;
                    }
                    i += n;
                }
            }
        }
    }
    match lit(&s[i..], MESSAGE) {
        Lit::Yes => Match::Full(i + MESSAGE.len(), recipient),
        Lit::Partial => Match::Partial,
        Lit::No => Match::No,
    }
}

/// What the body scan found first.
enum Found {
    /// A special token at `at`.
    Special {
        at: usize,
        token: &'static str,
    },
    /// A `to=…<|message|>` header spanning `at..end`.
    Header {
        at: usize,
        end: usize,
        recipient: Option<String>,
    },
    /// Text from `at` on may still become one of the above.
    Hold {
        at: usize,
    },
    Nothing,
}

impl MuseGlimmerParser {
    /// Starts a message body. `headed`: it followed a `<|message|>` header.
    fn begin_body(&mut self, recipient: Option<String>, headed: bool, cx: &mut Ctx) {
        cx.begin_body();
        self.after_word = false;
        self.state = match recipient.as_deref() {
            Some("self") => State::Reasoning,
            Some("user") => State::Answer,
            None if headed => State::Answer,
            _ => State::Visible(Box::new(VisibleBody::new(CallSyntax::Atem, false, false))),
        };
    }

    fn end_body(&mut self, cx: &mut Ctx) {
        if let State::Visible(body) = &mut self.state {
            body.end(cx);
        }
        self.state = State::Header;
    }

    /// Gives `buf[..n]` to the current body.
    fn pass(&mut self, n: usize, cx: &mut Ctx) {
        if n == 0 {
            return;
        }
        let text = &self.buf[..n];
        self.after_word = is_word(text.as_bytes()[n - 1]);
        match &mut self.state {
            State::Reasoning => cx.reasoning(text),
            State::Answer => cx.content(text),
            State::Visible(body) => body.push(text, cx),
            State::Header => unreachable!("text is passed to a body"),
        }
        self.buf.drain(..n);
    }

    fn scan_body(&self, end: bool) -> Found {
        let s = self.buf.as_str();
        let b = s.as_bytes();
        for i in 0..b.len() {
            if b[i] == b'<' {
                for token in SPECIALS {
                    match lit(&s[i..], token) {
                        Lit::Yes => return Found::Special { at: i, token },
                        Lit::Partial if !end => return Found::Hold { at: i },
                        _ => {}
                    }
                }
            } else if b[i] == b't' {
                let boundary = if i == 0 {
                    !self.after_word
                } else {
                    !is_word(b[i - 1])
                };
                if !boundary {
                    continue;
                }
                // One whitespace before `to=` belongs to the header.
                let at = if i > 0 && b[i - 1].is_ascii_whitespace() {
                    i - 1
                } else {
                    i
                };
                match match_header(&s[i..], true) {
                    Match::Full(n, recipient) => {
                        return Found::Header {
                            at,
                            end: i + n,
                            recipient,
                        }
                    }
                    Match::Partial if !end => return Found::Hold { at },
                    _ => {}
                }
            }
        }
        // A trailing whitespace may be the one before a `to=` header.
        if !end && b.last().is_some_and(u8::is_ascii_whitespace) {
            return Found::Hold { at: b.len() - 1 };
        }
        Found::Nothing
    }

    fn run(&mut self, cx: &mut Ctx, end: bool) {
        loop {
            if let State::Header = self.state {
                match match_header(&self.buf, false) {
                    Match::Full(n, recipient) => {
                        self.buf.drain(..n);
                        self.begin_body(recipient, true, cx);
                    }
                    Match::Partial if !end => return,
                    _ => {
                        // Not a header: unaddressed text is content (a stray
                        // `<|start|>` is dropped, §3.2 rule 3).
                        if self.buf.starts_with(START) {
                            self.buf.drain(..START.len());
                        }
                        self.begin_body(None, false, cx);
                    }
                }
                continue;
            }
            match self.scan_body(end) {
                Found::Special { at, token } => {
                    self.pass(at, cx);
                    if token == MESSAGE {
                        // A stray `<|message|>` is dropped (§3.2 rule 3).
                        self.buf.drain(..MESSAGE.len());
                        continue;
                    }
                    self.end_body(cx);
                    // `<|start|>` opens the next header; the others end a message.
                    if token != START {
                        self.buf.drain(..token.len());
                    }
                }
                Found::Header { at, end, recipient } => {
                    self.pass(at, cx);
                    self.buf.drain(..end - at);
                    self.end_body(cx);
                    self.begin_body(recipient, true, cx);
                }
                Found::Hold { at } => {
                    self.pass(at, cx);
                    return;
                }
                Found::Nothing => {
                    let n = self.buf.len();
                    self.pass(n, cx);
                    return;
                }
            }
        }
    }
}

impl Machine for MuseGlimmerParser {
    fn feed(&mut self, text: &str, cx: &mut Ctx) {
        self.buf.push_str(text);
        self.run(cx, false);
    }

    fn finish(&mut self, cx: &mut Ctx) {
        self.run(cx, true);
        self.end_body(cx);
    }
}
