//! Where `hearth run`'s generated text goes (the one-shot run and the
//! interactive chat).

use std::io::{IsTerminal, Write};

use hearth_chat::parser::{ChatEvent, FinishHint, OutputParser};
use hearth_engine::turn::{FinishReason, Flow};

/// Where generated text goes: the answer to stdout; in chat mode the output
/// parser separates reasoning (stderr, dimmed on a terminal, or hidden) and
/// tool calls (one line each on stdout).
pub(super) struct Output {
    parser: Option<Box<dyn OutputParser + Send>>,
    /// The answer's text so far, when kept (an interactive chat's history).
    content: Option<String>,
    hide_reasoning: bool,
    dim: bool,
    stdout: std::io::Stdout,
    /// The first failed write to stdout (the turn is cancelled on it).
    pub(super) error: Option<std::io::Error>,
}

impl Output {
    pub(super) fn new(
        parser: Option<Box<dyn OutputParser + Send>>,
        hide_reasoning: bool,
    ) -> Output {
        Output {
            parser,
            content: None,
            hide_reasoning,
            dim: std::io::stderr().is_terminal(),
            stdout: std::io::stdout(),
            error: None,
        }
    }

    /// Keeps the answer's text (see [`Output::content`]).
    pub(super) fn keep_content(&mut self) {
        self.content = Some(String::new());
    }

    /// The answer's text so far (empty unless kept).
    pub(super) fn content(&self) -> String {
        self.content.clone().unwrap_or_default()
    }

    pub(super) fn text(&mut self, t: &str) -> Flow {
        let events = match self.parser.as_mut() {
            Some(p) => p.feed(t),
            None => vec![ChatEvent::Content(t.to_string())],
        };
        self.show(events)
    }

    pub(super) fn finish(&mut self, finish: FinishReason) {
        let hint = match finish {
            FinishReason::Stop => FinishHint::Stop,
            FinishReason::Length | FinishReason::Cancelled => FinishHint::Length,
        };
        if let Some(mut p) = self.parser.take() {
            let events = p.finish(hint);
            self.show(events);
        }
    }

    fn show(&mut self, events: Vec<ChatEvent>) -> Flow {
        let mut out = self.stdout.lock();
        let mut result = Ok(());
        for e in events {
            match e {
                ChatEvent::Content(t) => {
                    if let Some(c) = self.content.as_mut() {
                        c.push_str(&t);
                    }
                    result = result.and(out.write_all(t.as_bytes()))
                }
                ChatEvent::Reasoning(t) if !self.hide_reasoning => {
                    let (a, b) = if self.dim {
                        ("\x1b[2m", "\x1b[0m")
                    } else {
                        ("", "")
                    };
                    eprint!("{a}{t}{b}");
                }
                ChatEvent::ToolCall {
                    name, arguments, ..
                } => {
                    let line = format!("\n[tool call] {name} {arguments}\n");
                    result = result.and(out.write_all(line.as_bytes()));
                }
                _ => {}
            }
        }
        match result.and_then(|_| out.flush()) {
            Ok(()) => Flow::Continue,
            Err(e) => {
                self.error.get_or_insert(e);
                Flow::Stop
            }
        }
    }
}
