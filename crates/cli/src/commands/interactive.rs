//! `hearth run` with no prompt on a terminal: a multi-turn chat. The
//! conversation stays in one session's KV cache (each turn prefills only
//! what the previous ones did not), with line editing and history
//! (rustyline), `/clear`, `/save FILE`, `/load FILE`, `/image FILE` (with
//! `--mmproj`: the image goes with the next message), Ctrl-C to stop an
//! answer (the session stays) and Ctrl-D to quit.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hearth_chat::prompter::Prompter;
use hearth_engine::prompt::Prompt;
use hearth_engine::sampler::{Sampler, SamplerConfig};
use hearth_engine::session::Session;
use hearth_engine::spec::factory::{DrafterFactory, MakeDrafter};
use hearth_engine::turn::{FinishReason, Turn, TurnParams};
use hearth_models::Backend;
use hearth_tokenizer::Tokenizer;
use hearth_vision::prompt::{ImageInput, MEDIA_MARKER};
use hearth_vision::RgbImage;
use rustyline::error::ReadlineError;
use serde_json::{json, Map, Value};

use super::output::Output;
use super::run_args::Args;

/// Set by SIGINT while an answer is being generated.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Prompt tokens prefilled per step, so Ctrl-C stops a long prefill quickly.
const PREFILL_CHUNK: usize = 256;

const HELP: &str = "commands:
  /set parameter NAME VALUE   temperature, top_k, top_p, min_p, seed, repeat_penalty, num_predict
  /set system TEXT            the system message (/set system with no text removes it)
  /show info|parameters|template|system
  /clear                      start over
  /save FILE, /load FILE      the transcript as JSON, and back
  /image FILE                 attach an image to your next message (needs --mmproj)
  /help, /exit
  \"\"\" begins and ends a message of several lines; Ctrl-C stops an answer (or a long prompt,
  which is then dropped); Ctrl-D quits";

/// One chat: the model, its session and the messages so far.
pub struct Chat<'a, B: Backend> {
    pub backend: &'a B,
    pub tokenizer: &'a Tokenizer,
    pub prompter: &'a Prompter,
    pub args: &'a Args,
    pub sampling: SamplerConfig,
    pub model_name: String,
    /// The projector (`--mmproj`), for `/image`.
    pub vision: Option<&'a ImageInput>,
    /// Images (`--image`) that go with the first message.
    pub images: Vec<(PathBuf, RgbImage)>,
    /// What `/show info` prints (the model's summary).
    pub info: String,
    /// Tokens per answer (`-n`, `/set parameter num_predict`).
    pub n_predict: usize,
}

impl<B: Backend + 'static> Chat<'_, B> {
    pub fn run(mut self, drafters: Option<DrafterFactory<B>>) -> Result<()> {
        let args = self.args;
        if !self.prompter.has_chat_format() {
            bail!("this model has no chat template: interactive chat needs one (give a prompt with -p for plain completion)");
        }
        let n_draft = drafters.as_ref().map_or(0, |d| d.n_draft());
        let mut session = Session::new(self.backend.new_state(args.ctx, n_draft)?);
        session.drafter = drafters
            .as_ref()
            .map(|d| d.make(args.ctx, &self.sampling))
            .transpose()?;
        let mut system: Vec<Value> = args
            .system_prompt
            .iter()
            .map(|s| json!({"role": "system", "content": s}))
            .collect();
        let mut messages = system.clone();
        // Images waiting for the next message, and those of the conversation
        // in the order of their markers.
        let mut pending = std::mem::take(&mut self.images);
        let mut shown: Vec<(PathBuf, RgbImage)> = Vec::new();

        let mut editor = rustyline::DefaultEditor::new().context("opening the terminal")?;
        let history = crate::registry::hearth_home().join("chat_history.txt");
        let _ = editor.load_history(&history);
        eprintln!(
            "hearth: chatting with {} (context {} tokens). /help for commands, Ctrl-D to quit.",
            self.model_name, args.ctx
        );
        loop {
            let line = match editor.readline(">>> ") {
                Ok(line) => line,
                Err(ReadlineError::Interrupted) => {
                    eprintln!("(Ctrl-D or /exit to quit)");
                    continue;
                }
                Err(ReadlineError::Eof) => break,
                Err(e) => return Err(e).context("reading a line"),
            };
            let mut line = line.trim().to_string();
            if line.is_empty() {
                continue;
            }
            // `"""`: the message goes on over several lines to a closing `"""`.
            if let Some(first) = line.strip_prefix("\"\"\"") {
                match multi_line(&mut editor, first) {
                    Some(text) => line = text,
                    None => continue,
                }
                if line.trim().is_empty() {
                    continue;
                }
            }
            let line = line.as_str();
            let _ = editor.add_history_entry(line);
            let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
            match cmd {
                "/exit" | "/quit" | "/bye" => break,
                "/help" | "/?" => eprintln!("{HELP}"),
                "/clear" => {
                    messages = system.clone();
                    (pending, shown) = (Vec::new(), Vec::new());
                    session.reset();
                    eprintln!("(cleared)");
                }
                "/set" => match self.set(rest.trim(), &mut system, &mut messages) {
                    Ok(said) => eprintln!("({said})"),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "/show" => match self.show(rest.trim(), &system) {
                    Ok(text) => eprintln!("{text}"),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "/image" => match self.attach(rest.trim()) {
                    Ok(image) => pending.push(image),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "/save" => match save(rest.trim(), &messages) {
                    Ok(()) => {
                        eprintln!("(saved {} messages to {})", messages.len(), rest.trim());
                        if !shown.is_empty() {
                            eprintln!("(the images are not in the file: their places are {MEDIA_MARKER} markers)");
                        }
                    }
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "/load" => match load(rest.trim()) {
                    Ok(m) => {
                        eprintln!("(loaded {} messages from {})", m.len(), rest.trim());
                        messages = m;
                        shown.clear();
                    }
                    Err(e) => eprintln!("error: {e:#}"),
                },
                c if c.starts_with('/') => eprintln!("unknown command {c}; {HELP}"),
                _ => {
                    let content = match pending.is_empty() {
                        true => line.to_string(),
                        false => match super::images::with_markers(line, pending.len()) {
                            Ok(c) => c,
                            Err(e) => {
                                eprintln!("error: {e:#}");
                                continue;
                            }
                        },
                    };
                    let attached = pending.len();
                    shown.append(&mut pending);
                    messages.push(json!({"role": "user", "content": content}));
                    match self.answer(&mut session, &messages, &shown, n_draft) {
                        // Stopped before the answer began (a long prompt):
                        // the message is dropped, as if never sent.
                        Ok(None) => {
                            messages.pop();
                            pending = shown.split_off(shown.len() - attached);
                            eprintln!("(stopped during the prompt; the message was dropped)");
                        }
                        Ok(Some(reply)) => {
                            messages.push(json!({"role": "assistant", "content": reply}))
                        }
                        Err(e) => {
                            messages.pop();
                            // The images wait for the next message again.
                            pending = shown.split_off(shown.len() - attached);
                            eprintln!("error: {e:#}");
                        }
                    }
                }
            }
        }
        let _ = editor.save_history(&history);
        Ok(())
    }

    /// `/set parameter NAME VALUE` and `/set system TEXT`; what was set.
    fn set(
        &mut self,
        rest: &str,
        system: &mut Vec<Value>,
        messages: &mut Vec<Value>,
    ) -> Result<String> {
        let (what, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        match what {
            "parameter" => {
                let (name, value) = rest
                    .trim()
                    .split_once(' ')
                    .context("/set parameter NAME VALUE (e.g. /set parameter temperature 0)")?;
                let value = value.trim();
                let num = || -> Result<f64> {
                    value
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .with_context(|| format!("{name}: '{value}' is not a number"))
                };
                let c = &mut self.sampling;
                match name {
                    "temperature" | "temp" => {
                        let t = num()?;
                        anyhow::ensure!((0.0..=5.0).contains(&t), "temperature: between 0 and 5");
                        c.temperature = t as f32;
                    }
                    "top_k" => {
                        let k = num()?;
                        anyhow::ensure!(k >= 0.0 && k.fract() == 0.0, "top_k: a whole number, 0 for off");
                        c.top_k = k as usize;
                    }
                    "top_p" => {
                        let p = num()?;
                        anyhow::ensure!(p > 0.0 && p <= 1.0, "top_p: in (0, 1]");
                        c.top_p = p as f32;
                    }
                    "min_p" => {
                        let p = num()?;
                        anyhow::ensure!((0.0..=1.0).contains(&p), "min_p: in [0, 1]");
                        c.min_p = p as f32;
                    }
                    "repeat_penalty" => {
                        let p = num()?;
                        anyhow::ensure!(p > 0.0, "repeat_penalty: above 0");
                        c.repeat_penalty = p as f32;
                    }
                    "seed" => {
                        let x = num()?;
                        anyhow::ensure!(x >= 0.0 && x.fract() == 0.0, "seed: a whole number");
                        c.seed = x as u64;
                    }
                    "num_predict" | "n_predict" => {
                        let n = num()?;
                        anyhow::ensure!(n >= 1.0 && n.fract() == 0.0, "num_predict: a whole number, at least 1");
                        self.n_predict = n as usize;
                    }
                    other => bail!("unknown parameter '{other}'; known: temperature, top_k, top_p, min_p, repeat_penalty, seed, num_predict"),
                }
                Ok(format!("set {name} to {value}"))
            }
            "system" => {
                let text = rest.trim();
                let had = !system.is_empty();
                *system = match text.is_empty() {
                    true => Vec::new(),
                    false => vec![json!({"role": "system", "content": text})],
                };
                // The conversation keeps its turns under the new system message.
                if had {
                    messages.remove(0);
                }
                for (i, m) in system.iter().enumerate() {
                    messages.insert(i, m.clone());
                }
                Ok(match text.is_empty() {
                    true => "system message removed".into(),
                    false => "system message set".into(),
                })
            }
            _ => bail!("/set parameter NAME VALUE, or /set system TEXT"),
        }
    }

    /// `/show info|parameters|template|system`.
    fn show(&self, what: &str, system: &[Value]) -> Result<String> {
        let c = &self.sampling;
        Ok(match what {
            "info" | "" => self.info.clone(),
            "parameters" => format!(
                "temperature {}\ntop_k {}\ntop_p {}\nmin_p {}\nrepeat_penalty {}\nseed {}\nnum_predict {}\nnum_ctx {}",
                c.temperature, c.top_k, c.top_p, c.min_p, c.repeat_penalty, c.seed, self.n_predict, self.args.ctx
            ),
            "template" => match self.prompter.template_source() {
                Some(t) => t.to_string(),
                None => format!("({})", self.prompter.describe()),
            },
            "system" => match system.first().and_then(|m| m["content"].as_str()) {
                Some(s) => s.to_string(),
                None => "(no system message)".into(),
            },
            other => bail!("/show {other}: show info, parameters, template or system"),
        })
    }

    /// `/image FILE`: the image, decoded (limits checked), for the next message.
    fn attach(&self, path: &str) -> Result<(PathBuf, RgbImage)> {
        let Some(input) = self.vision else {
            bail!("/image needs the model's projector: start with --mmproj FILE");
        };
        if path.is_empty() {
            bail!("/image needs a file name");
        }
        let path = PathBuf::from(path);
        let img = super::images::read_images(std::slice::from_ref(&path))?.remove(0);
        let grid = input.mmproj.grid_for(img.width, img.height, input.rules);
        eprintln!(
            "(attached {}: {}x{}, {} image tokens; it goes with your next message)",
            path.display(),
            img.width,
            img.height,
            grid.n_tokens()
        );
        Ok((path, img))
    }

    /// The conversation's prompt: its token ids, with the images' rows
    /// placed at their markers (each encoded once: the encoder keeps rows
    /// by digest).
    fn prompt(&self, messages: &[Value], images: &[(PathBuf, RgbImage)]) -> Result<Prompt> {
        let messages = Value::Array(messages.to_vec());
        let Some(input) = self.vision.filter(|_| !images.is_empty()) else {
            return Ok(self.prompter.chat_ids(&messages, None, &Map::new())?.into());
        };
        let runs = self
            .prompter
            .chat_runs(&messages, None, &Map::new(), MEDIA_MARKER)?;
        if runs.runs.len() != images.len() + 1 {
            bail!(
                "the conversation has {} image markers for {} images",
                runs.runs.len() - 1,
                images.len()
            );
        }
        let mut rows = Vec::with_capacity(images.len());
        for (path, img) in images {
            let e = input
                .encode(img)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if !e.cached {
                eprintln!(
                    "(image {}: {} tokens, encoded on the {} in {:.1} ms)",
                    path.display(),
                    e.rows.n,
                    input.device(),
                    e.time.as_secs_f64() * 1e3
                );
            }
            rows.push(Arc::clone(&e.rows));
        }
        Ok(input.place(&runs, &rows))
    }

    /// Generates the assistant's answer to `messages` (with `images` at
    /// their markers), streaming it; returns its text (what was shown, when
    /// Ctrl-C stopped it), or `None` when Ctrl-C came during the prompt.
    fn answer(
        &self,
        session: &mut Session<B::State>,
        messages: &[Value],
        images: &[(PathBuf, RgbImage)],
        n_draft: usize,
    ) -> Result<Option<String>> {
        let args = self.args;
        let ids = self.prompt(messages, images)?;
        if ids.len() >= args.ctx {
            bail!(
                "the conversation ({} tokens) no longer fits the context of {}: /clear to start over, or raise -c",
                ids.len(),
                args.ctx
            );
        }
        let resume = session.prepare_prompt(&ids);
        let params = TurnParams {
            max_tokens: self.n_predict.min(args.ctx - ids.len()),
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
            n_draft,
            render_special: true,
            logprobs: None,
        };
        let mut turn = Turn::new(
            self.tokenizer,
            ids,
            resume.reused,
            Sampler::new(self.sampling)?,
            params,
        );
        let mut out = Output::new(
            Some(self.prompter.parser(None, "call_".into())?),
            args.hide_reasoning,
        );
        out.keep_content();
        INTERRUPTED.store(false, Ordering::Relaxed);
        // Ctrl-C stops this answer (the line editor handles it between turns).
        // SAFETY: the handler only stores to an atomic.
        let previous =
            unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
        let result = self.generate(&mut turn, session, &mut out);
        // SAFETY: puts back the handler that was there.
        unsafe { libc::signal(libc::SIGINT, previous) };
        result?;
        if turn.prefilling() {
            // Stopped inside the prompt: no answer, and the session holds
            // only what was prefilled (the next turn reuses what matches).
            println!();
            return Ok(None);
        }
        Ok(Some(self.wrap_up(&turn, &mut out)))
    }

    /// Steps the turn to its end, or until Ctrl-C.
    fn generate(
        &self,
        turn: &mut Turn,
        session: &mut Session<B::State>,
        out: &mut Output,
    ) -> Result<()> {
        let total = turn.stats().prompt_tokens;
        let mut shown = super::progress::Prefill::new(total - turn.prompt_fed());
        while turn.finished().is_none() {
            if INTERRUPTED.swap(false, Ordering::Relaxed) {
                turn.cancel();
                break;
            }
            let drafter = session.drafter.as_mut().map(|d| &mut **d as _);
            let was_prefilling = turn.prefilling();
            let step = turn.step(
                self.backend,
                &mut session.state,
                drafter,
                PREFILL_CHUNK,
                &mut |t| out.text(t),
            );
            match step {
                Ok(s) => {
                    session.push_fed(&s.fed);
                    if was_prefilling {
                        shown.update(turn.prompt_fed(), total);
                    }
                    if was_prefilling && !turn.prefilling() {
                        // Where the next turn's prompt diverges (the reply is
                        // re-rendered): a sliding-window ring that cannot roll
                        // back that far restores from here, as `serve` does.
                        session.checkpoint();
                    }
                }
                Err(e) => {
                    // The state may be half-written: the next turn starts over.
                    session.reset();
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Reports how the answer ended and returns its text.
    fn wrap_up(&self, turn: &Turn, out: &mut Output) -> String {
        let finish = turn.finished().unwrap_or(FinishReason::Cancelled);
        out.finish(finish);
        let s = turn.stats();
        println!();
        let why = match finish {
            FinishReason::Cancelled => ", stopped",
            FinishReason::Length => ", hit the token limit (-n)",
            FinishReason::Stop => "",
        };
        eprintln!(
            "\x1b[2m[{} tokens, {:.1} tok/s; prompt {} tokens, {} cached{why}]\x1b[0m",
            s.tokens.len(),
            s.decode_tok_s(),
            s.prompt_tokens,
            s.reused_tokens,
        );
        out.content()
    }
}

/// The lines of a `"""` message up to the closing `"""` (`first`: the text
/// after the opening one); `None` when input ended or Ctrl-C came first.
fn multi_line(editor: &mut rustyline::DefaultEditor, first: &str) -> Option<String> {
    if let Some(one) = first.strip_suffix("\"\"\"") {
        return Some(one.to_string());
    }
    let mut lines = vec![first.to_string()];
    loop {
        match editor.readline("... ") {
            Ok(l) => match l.strip_suffix("\"\"\"") {
                Some(last) => {
                    lines.push(last.to_string());
                    break;
                }
                None => lines.push(l),
            },
            Err(_) => return None,
        }
    }
    let text = lines.join("\n");
    Some(text.trim_matches('\n').to_string())
}

/// The transcript as `{"messages": [...]}`.
fn save(path: &str, messages: &[Value]) -> Result<()> {
    if path.is_empty() {
        bail!("/save needs a file name");
    }
    let text = serde_json::to_string_pretty(&json!({ "messages": messages }))?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {path}"))
}

/// A transcript written by `/save` (or any `{"messages": [...]}` / messages array).
fn load(path: &str) -> Result<Vec<Value>> {
    if path.is_empty() {
        bail!("/load needs a file name");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{path} is not JSON"))?;
    let list = match v {
        Value::Array(m) => m,
        Value::Object(mut o) => match o.remove("messages") {
            Some(Value::Array(m)) => m,
            _ => bail!("{path}: expected {{\"messages\": [...]}}"),
        },
        _ => bail!("{path}: expected {{\"messages\": [...]}}"),
    };
    for (i, m) in list.iter().enumerate() {
        let ok = m.get("role").is_some_and(Value::is_string);
        if !ok {
            bail!("{path}: messages[{i}] has no string \"role\"");
        }
    }
    Ok(list)
}
