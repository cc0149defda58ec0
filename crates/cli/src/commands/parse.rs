//! `hearth parse`: runs an output parser over generated text on stdin and prints
//! one JSON event per line (text deltas merged):
//!
//! ```text
//! {"type":"reasoning","text":"..."}
//! {"type":"content","text":"..."}
//! {"type":"tool_call","index":0,"name":"get_weather","arguments":{"city":"Paris"}}
//! {"type":"warning","message":"..."}
//! {"type":"end","finish_reason":"tool_calls"}
//! ```
//! A `warning` line reports text that began like a tool call but was not one
//! (malformed, or cut off); that text follows as content.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use hearth_chat::parser::{
    parser_with, ChatEvent, FinishHint, OutputFormat, OutputParser, ParserOptions,
    UnknownToolPolicy,
};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Output format: atem, hermes, qwen3-xml, harmony, muse-glimmer or plain.
    #[arg(long)]
    pub format: String,
    /// Tools JSON (an OpenAI `tools` array, or {"tools": [...]}): registered
    /// names and parameter types for argument coercion.
    #[arg(long, value_name = "FILE.json")]
    pub tools: Option<PathBuf>,
    /// Calls to unregistered tools: `passthrough` (report them) or `text` (the
    /// whole response becomes content, as the reference server does).
    #[arg(long, default_value = "passthrough", value_name = "POLICY")]
    pub unknown_tools: String,
    /// The text was cut by max_tokens: finish reason `length` unless calls were made.
    #[arg(long)]
    pub truncated: bool,
}

pub fn run(args: Args) -> Result<()> {
    let tools = match &args.tools {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Some(
                serde_json::from_str::<serde_json::Value>(&text)
                    .with_context(|| format!("{} is not JSON", path.display()))?,
            )
        }
        None => None,
    };
    let unknown_tool_policy = match args.unknown_tools.as_str() {
        "passthrough" => UnknownToolPolicy::Passthrough,
        "text" => UnknownToolPolicy::Text,
        other => bail!("--unknown-tools must be passthrough or text, not {other:?}"),
    };
    let options = ParserOptions {
        unknown_tool_policy,
        ..Default::default()
    };
    let Some(format) = OutputFormat::from_name(&args.format) else {
        bail!("unknown --format {:?} (expected atem, hermes, qwen3-xml, harmony, muse-glimmer or plain)", args.format);
    };
    let mut parser = parser_with(format, tools.as_ref(), options)?;
    let stdout = std::io::stdout();
    let mut printer = Printer {
        out: stdout.lock(),
        pending: None,
    };
    feed_stdin(parser.as_mut(), &mut printer)?;
    let hint = if args.truncated {
        FinishHint::Length
    } else {
        FinishHint::Stop
    };
    for e in parser.finish(hint) {
        printer.event(e)?;
    }
    printer.flush_text()?;
    Ok(())
}

/// Feeds stdin to the parser as it arrives, never splitting a UTF-8 character
/// (invalid bytes become U+FFFD).
fn feed_stdin(parser: &mut (dyn OutputParser + Send), printer: &mut Printer<'_>) -> Result<()> {
    let mut stdin = std::io::stdin().lock();
    let mut chunk = [0u8; 8192];
    let mut bytes: Vec<u8> = Vec::new();
    loop {
        let n = stdin.read(&mut chunk).context("reading stdin")?;
        let eof = n == 0;
        bytes.extend_from_slice(&chunk[..n]);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&bytes) {
                Ok(s) => {
                    text.push_str(s);
                    bytes.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&bytes[..valid]).expect("valid prefix"));
                    match e.error_len() {
                        Some(bad) => {
                            text.push('\u{FFFD}');
                            bytes.drain(..valid + bad);
                        }
                        // An incomplete character at the end: wait for the rest.
                        None if !eof => {
                            bytes.drain(..valid);
                            break;
                        }
                        None => {
                            text.push('\u{FFFD}');
                            bytes.clear();
                            break;
                        }
                    }
                }
            }
        }
        for e in parser.feed(&text) {
            printer.event(e)?;
        }
        if eof {
            return Ok(());
        }
    }
}

/// Prints events as JSON lines, merging consecutive text of one kind.
struct Printer<'a> {
    out: std::io::StdoutLock<'a>,
    /// ("reasoning" | "content", text) not yet printed.
    pending: Option<(&'static str, String)>,
}

impl Printer<'_> {
    fn event(&mut self, e: ChatEvent) -> Result<()> {
        let (kind, text) = match e {
            ChatEvent::Reasoning(t) => ("reasoning", t),
            ChatEvent::Content(t) => ("content", t),
            ChatEvent::ToolCall {
                index,
                name,
                arguments,
                ..
            } => {
                self.flush_text()?;
                return self.line(json!({"type": "tool_call", "index": index, "name": name, "arguments": arguments}));
            }
            ChatEvent::Warning { message } => {
                self.flush_text()?;
                return self.line(json!({"type": "warning", "message": message}));
            }
            ChatEvent::End { finish_reason } => {
                self.flush_text()?;
                return self.line(json!({"type": "end", "finish_reason": finish_reason.as_str()}));
            }
            // Streaming previews; the confirmed call is printed whole.
            ChatEvent::ToolCallStart { .. } | ChatEvent::ToolCallArgs { .. } => return Ok(()),
        };
        match &mut self.pending {
            Some((k, t)) if *k == kind => t.push_str(&text),
            _ => {
                self.flush_text()?;
                self.pending = Some((kind, text));
            }
        }
        Ok(())
    }

    fn flush_text(&mut self) -> Result<()> {
        if let Some((kind, text)) = self.pending.take() {
            self.line(json!({"type": kind, "text": text}))?;
        }
        Ok(())
    }

    fn line(&mut self, v: serde_json::Value) -> Result<()> {
        writeln!(self.out, "{v}").context("writing stdout")
    }
}
