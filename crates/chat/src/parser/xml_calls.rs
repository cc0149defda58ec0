//! The XML-ish call syntaxes, ATEM (spec §3–§4) and Qwen3-Coder (§8.2), as one
//! streaming engine over a [`XmlDialect`]. Both are a block of invokes of
//! parameters whose values are raw text that may contain the closing tags
//! themselves; a closing tag only counts when the text after it is structural
//! (§4.2 "structural ends").

use super::driver::{Call, Ctx};
use super::scan::{followed_by, lit, partial_suffix_len, ws_len, Lit, Match};

/// The tags of one XML call syntax.
pub(crate) struct XmlDialect {
    pub block_open: &'static str,
    pub block_close: &'static str,
    /// Start of an invoke tag: `<atem:invoke` (then ` name="NAME">`) or
    /// `<function=` (then `NAME>`).
    pub invoke_prefix: &'static str,
    pub invoke_close: &'static str,
    pub param_prefix: &'static str,
    pub param_close: &'static str,
    /// Tags carry `name="…"` (ATEM) instead of `=NAME` (Qwen3).
    pub name_attr: bool,
    /// Qwen3: strip one newline on each side of a value; `null`/`None` → null.
    pub qwen_values: bool,
}

/// Longest name a tag may carry: a longer one means the text is not a tag.
/// Judged on the name's length alone, never on how much text has arrived, so
/// the outcome does not depend on how the output was split.
const MAX_NAME: usize = 512;

impl XmlDialect {
    /// Matches an opening tag (`prefix` + name) at the start of `s`.
    pub fn open_tag(&self, s: &str, prefix: &str) -> Match<String> {
        match lit(s, prefix) {
            Lit::No => return Match::No,
            Lit::Partial => return Match::Partial,
            Lit::Yes => {}
        }
        let mut i = prefix.len();
        if self.name_attr {
            // `<atem:invoke` + whitespace + `name="NAME"` + optional whitespace + `>`
            let ws = ws_len(&s[i..]);
            if i + ws == s.len() {
                return Match::Partial;
            }
            if ws == 0 {
                return Match::No;
            }
            i += ws;
            match lit(&s[i..], "name=\"") {
                Lit::No => return Match::No,
                Lit::Partial => return Match::Partial,
                Lit::Yes => i += 6,
            }
            let q = match s[i..].find('"') {
                Some(q) if q <= MAX_NAME => q,
                Some(_) => return Match::No,
                None if s.len() - i > MAX_NAME => return Match::No,
                None => return Match::Partial,
            };
            let name = s[i..i + q].to_string();
            i += q + 1;
            i += ws_len(&s[i..]);
            match s[i..].chars().next() {
                None => Match::Partial,
                Some('>') => Match::Full(i + 1, name),
                Some(_) => Match::No,
            }
        } else {
            // `<function=` + NAME + `>`, NAME on one line.
            match s[i..].find(['>', '\n']) {
                Some(q) if q > MAX_NAME => Match::No,
                Some(q) if s.as_bytes()[i + q] == b'>' => {
                    let name = s[i..i + q].trim().to_string();
                    Match::Full(i + q + 1, name)
                }
                Some(_) => Match::No,
                None if s.len() - i > MAX_NAME => Match::No,
                None => Match::Partial,
            }
        }
    }

    fn invoke_followers(&self) -> [&'static str; 3] {
        [self.invoke_prefix, self.block_close, self.block_open]
    }

    fn param_followers(&self) -> [&'static str; 2] {
        [self.param_prefix, self.invoke_close]
    }
}

/// Where inside a call block the engine is.
pub(crate) enum Stage {
    /// Between invokes (inside the block wrapper, or after a bare invoke).
    /// `empty`: no invoke yet since the wrapper opened.
    Block {
        empty: bool,
    },
    Invoke(Call),
    Value {
        call: Call,
        key: String,
        /// The value's raw text so far (for Qwen3 without its leading newline).
        raw: String,
        /// Qwen3: the leading newline has been dealt with.
        started: bool,
    },
}

/// Outcome of one step.
pub(crate) enum Step {
    /// Made progress; step again.
    Continue,
    /// Needs more text.
    Wait,
    /// The block is closed; back to text.
    Done,
    /// The text at the start of the buffer cannot continue the block: the
    /// block's held markup is not a call (the reason says why), and the
    /// buffer is read as text again from here.
    Malformed(String),
}

/// Consumes `n` bytes of `buf` as markup.
fn take(buf: &mut String, n: usize, cx: &mut Ctx) {
    cx.markup(&buf[..n]);
    buf.drain(..n);
}

/// One step of the engine on `buf`. `end`: no more text will come (end of the
/// message body or of generation).
pub(crate) fn step(
    d: &XmlDialect,
    stage: &mut Stage,
    buf: &mut String,
    cx: &mut Ctx,
    end: bool,
) -> Step {
    match stage {
        Stage::Block { empty } => {
            let ws = ws_len(buf);
            take(buf, ws, cx);
            if buf.is_empty() {
                return Step::Wait;
            }
            let mut partial = false;
            match d.open_tag(buf, d.invoke_prefix) {
                Match::Full(n, name) => {
                    take(buf, n, cx);
                    *stage = Stage::Invoke(cx.open_call(&name));
                    return Step::Continue;
                }
                Match::Partial => partial = true,
                Match::No => {}
            }
            match lit(buf, d.block_close) {
                Lit::Yes => {
                    take(buf, d.block_close.len(), cx);
                    if *empty {
                        return Step::Malformed(format!(
                            "{}{} holds no call; kept as content",
                            d.block_open, d.block_close
                        ));
                    }
                    return Step::Done;
                }
                Lit::Partial => partial = true,
                Lit::No => {}
            }
            match lit(buf, d.block_open) {
                Lit::Yes => {
                    take(buf, d.block_open.len(), cx);
                    return Step::Continue;
                }
                Lit::Partial => partial = true,
                Lit::No => {}
            }
            if partial && !end {
                return Step::Wait;
            }
            Step::Malformed(format!(
                "text inside a tool-call block that is neither {} nor {}; kept as content",
                d.invoke_prefix, d.block_close
            ))
        }
        Stage::Invoke(_) => {
            let ws = ws_len(buf);
            take(buf, ws, cx);
            if buf.is_empty() {
                return Step::Wait;
            }
            let mut partial = false;
            match d.open_tag(buf, d.param_prefix) {
                Match::Full(n, key) => {
                    take(buf, n, cx);
                    let Stage::Invoke(mut call) =
                        std::mem::replace(stage, Stage::Block { empty: false })
                    else {
                        unreachable!()
                    };
                    cx.begin_param(&mut call, &key);
                    *stage = Stage::Value {
                        call,
                        key,
                        raw: String::new(),
                        started: !d.qwen_values,
                    };
                    return Step::Continue;
                }
                Match::Partial => partial = true,
                Match::No => {}
            }
            match lit(buf, d.invoke_close) {
                Lit::Yes => {
                    let n = d.invoke_close.len();
                    match followed_by(&buf[n..], &d.invoke_followers(), end) {
                        None => return Step::Wait,
                        Some(true) => {
                            take(buf, n, cx);
                            let Stage::Invoke(call) =
                                std::mem::replace(stage, Stage::Block { empty: false })
                            else {
                                unreachable!()
                            };
                            cx.close_call(call);
                            return Step::Continue;
                        }
                        // Not structural: text follows the call inside it.
                        Some(false) => {
                            return Step::Malformed(format!(
                                "{} followed by text; the call is kept as content",
                                d.invoke_close
                            ))
                        }
                    }
                }
                Lit::Partial => partial = true,
                Lit::No => {}
            }
            if partial && !end {
                return Step::Wait;
            }
            Step::Malformed(format!(
                "text inside a tool call that is neither {} nor {}; the call is kept as content",
                d.param_prefix, d.invoke_close
            ))
        }
        Stage::Value {
            call,
            key,
            raw,
            started,
        } => {
            if !*started {
                // Qwen3 writes the value on its own line: drop one leading newline.
                match buf.chars().next() {
                    None => return Step::Wait,
                    Some('\n') => take(buf, 1, cx),
                    Some(_) => {}
                }
                *started = true;
            }
            let close = d.param_close;
            let mut from = 0;
            loop {
                let Some(rel) = buf[from..].find(close) else {
                    let hold = if end {
                        0
                    } else {
                        partial_suffix_len(buf, &[close])
                    };
                    let n = buf.len() - hold;
                    raw.push_str(&buf[..n]);
                    take(buf, n, cx);
                    progress(d, cx, call, raw);
                    return Step::Wait;
                };
                let p = from + rel;
                match followed_by(&buf[p + close.len()..], &d.param_followers(), end) {
                    Some(true) => {
                        raw.push_str(&buf[..p]);
                        take(buf, p + close.len(), cx);
                        let mut value = std::mem::take(raw);
                        if d.qwen_values && value.ends_with('\n') {
                            value.pop();
                        }
                        let key = std::mem::take(key);
                        let Stage::Value { mut call, .. } =
                            std::mem::replace(stage, Stage::Block { empty: false })
                        else {
                            unreachable!()
                        };
                        cx.end_param(&mut call, &key, &value, d.qwen_values);
                        *stage = Stage::Invoke(call);
                        return Step::Continue;
                    }
                    None => {
                        // Undecided: everything before the tag is value text.
                        raw.push_str(&buf[..p]);
                        take(buf, p, cx);
                        progress(d, cx, call, raw);
                        return Step::Wait;
                    }
                    // An embedded closing tag: value text (§4.2).
                    Some(false) => from = p + 1,
                }
            }
        }
    }
}

/// Streams the certain part of a string value: Qwen3 holds back one trailing
/// newline, which is stripped if the value ends there.
fn progress(d: &XmlDialect, cx: &mut Ctx, call: &mut Call, raw: &str) {
    let certain = if d.qwen_values && raw.ends_with('\n') {
        &raw[..raw.len() - 1]
    } else {
        raw
    };
    cx.param_progress(call, certain);
}
