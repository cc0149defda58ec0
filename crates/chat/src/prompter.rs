//! The one prompter: conversations to prompt text and token ids, the way the
//! model expects them, and the output parser for its replies. `hearth serve`,
//! `hearth run` and `hearth template` all render through it, so one message
//! becomes the same prompt everywhere.
//!
//! The renderer is the GGUF's own Jinja chat template (`tokenizer.chat_template`,
//! or hearth's built-in template for an architecture whose files ship none),
//! and the built-in Muse Glimmer format for Muse Glimmer files that carry no
//! template.

use std::sync::Arc;

use hearth_gguf::GgufFile;
use hearth_tokenizer::Tokenizer;
use serde_json::{Map, Value};

use crate::detect::{detect_gguf, OutputFormat};
use crate::muse_glimmer::{self, RenderOptions};
use crate::parser::{parser_with, OutputParser, ParserOptions};
use crate::template::ChatTemplate;

/// Why a conversation could not be rendered (the caller's input, or a model
/// without a chat format).
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The template or format rejected the conversation.
    #[error("{0}")]
    Render(String),
    /// The model has no chat template.
    #[error("this model has no chat template ({0})")]
    NoTemplate(String),
    #[error("{0}")]
    Config(String),
}

/// How the images between [`ChatRuns::runs`] are framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFraming {
    /// As llama.cpp's libmtmd frames them: the caller puts the projector's
    /// begin and end tokens around each image's rows (a GGUF chat template).
    Mtmd,
    /// The runs already hold every token; each image is its rows alone (the
    /// built-in Muse Glimmer format: the reference's `<|patch|>` slots).
    InRuns,
}

/// A conversation as token runs, one image between each two.
#[derive(Clone, Debug)]
pub struct ChatRuns {
    pub runs: Vec<Vec<u32>>,
    pub framing: ImageFraming,
}

/// How conversations become prompt text.
pub enum Renderer {
    Jinja(Box<ChatTemplate>),
    MuseGlimmer,
    /// No template: chat is refused, raw completion still works.
    None(String),
}

pub struct Prompter {
    renderer: Renderer,
    /// The format replies are parsed with.
    pub output: OutputFormat,
    tokenizer: Option<Arc<Tokenizer>>,
}

impl Prompter {
    /// The prompter of a GGUF: its template (or built-in format) and its
    /// tool-call format, `tool_parser` = `auto` or a format name. Without a
    /// tokenizer it renders text only.
    pub fn from_gguf(
        file: &GgufFile,
        tokenizer: Option<Arc<Tokenizer>>,
        tool_parser: &str,
    ) -> Result<Prompter, PromptError> {
        let detected = detect_gguf(file);
        let output = if tool_parser == "auto" {
            detected
        } else {
            OutputFormat::from_name(tool_parser).ok_or_else(|| {
                PromptError::Config(format!("unknown --tool-parser '{tool_parser}' (expected auto, atem, hermes, qwen3-xml, harmony, muse-glimmer or plain)"))
            })?
        };
        let arch = file.architecture().unwrap_or("");
        // A Muse Glimmer file renders through its own chat template (as
        // llama.cpp does); the built-in format is for files without one.
        let no_template = file.metadata().get_str("tokenizer.chat_template").is_none();
        let renderer = if no_template
            && (matches!(arch, "muse_glimmer" | "muse-glimmer")
                || detected == OutputFormat::MuseGlimmer)
        {
            Renderer::MuseGlimmer
        } else {
            match ChatTemplate::from_gguf(file) {
                Ok(t) => Renderer::Jinja(Box::new(t)),
                Err(e) => Renderer::None(e.to_string()),
            }
        };
        Ok(Prompter {
            renderer,
            output,
            tokenizer,
        })
    }

    /// A prompter with a given renderer (a template file, the built-in
    /// format) and no tokenizer: it renders text only.
    pub fn with_renderer(renderer: Renderer, output: OutputFormat) -> Prompter {
        Prompter {
            renderer,
            output,
            tokenizer: None,
        }
    }

    /// Whether conversations can be rendered (the model has a chat format).
    pub fn has_chat_format(&self) -> bool {
        !matches!(self.renderer, Renderer::None(_))
    }

    /// The Jinja template's source (none for the built-in format).
    pub fn template_source(&self) -> Option<&str> {
        match &self.renderer {
            Renderer::Jinja(t) => Some(t.source()),
            _ => None,
        }
    }

    /// Whether the format is hearth's own (Muse Glimmer's, for a file without a template).
    pub fn is_builtin_format(&self) -> bool {
        matches!(self.renderer, Renderer::MuseGlimmer)
    }

    pub fn describe(&self) -> String {
        let r = match &self.renderer {
            Renderer::Jinja(_) => "GGUF chat template",
            Renderer::MuseGlimmer => "built-in Muse Glimmer format",
            Renderer::None(_) => "no chat template",
        };
        format!("{r}, tool-call format {}", self.output)
    }

    /// The conversation as prompt text. `kwargs` are the template's extra
    /// variables (`chat_template_kwargs`); the built-in Muse Glimmer format
    /// reads `reasoning_strength`, `current_date` and `wrap_images` and ignores the rest, as
    /// a template ignores variables it does not use.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        kwargs: &Map<String, Value>,
    ) -> Result<String, PromptError> {
        match &self.renderer {
            Renderer::Jinja(t) => t
                .render(messages, tools, add_generation_prompt, kwargs)
                .map_err(|e| PromptError::Render(e.to_string())),
            Renderer::MuseGlimmer => {
                let opts = muse_options(kwargs, add_generation_prompt)?;
                muse_glimmer::render(messages, tools, &opts)
                    .map_err(|e| PromptError::Render(e.to_string()))
            }
            Renderer::None(why) => Err(PromptError::NoTemplate(why.clone())),
        }
    }

    /// The conversation as token ids, ending with the assistant's turn opening.
    pub fn chat_ids(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<Vec<u32>, PromptError> {
        let tokenizer = self.tokenizer()?;
        match &self.renderer {
            Renderer::Jinja(t) => {
                let text = self.render(messages, tools, true, kwargs)?;
                // A template that writes BOS itself (Gemma) must not get a second one.
                let bos = t.bos_token();
                let add_special = bos.is_empty() || !text.starts_with(bos);
                Ok(tokenizer.encode(&text, add_special, true))
            }
            Renderer::MuseGlimmer => {
                // Typed pieces: message text is never parsed for special tokens (§2.7).
                let opts = muse_options(kwargs, true)?;
                let prompt = muse_glimmer::render_prompt(messages, tools, &opts)
                    .map_err(|e| PromptError::Render(e.to_string()))?;
                prompt
                    .encode_with(tokenizer, &[])
                    .map_err(|e| PromptError::Render(e.to_string()))
            }
            Renderer::None(why) => Err(PromptError::NoTemplate(why.clone())),
        }
    }

    /// The conversation as token runs with one image between each two, in
    /// the order of the images (`marker` in the messages' text, or
    /// `{"type": "media_marker"}` parts, which a template sees joined as
    /// llama-server joins them, [`crate::template::llama_cpp_messages`]; the
    /// built-in format also takes image parts). With a GGUF chat template the
    /// rendered text is split where `marker` appears, each run tokenized on
    /// its own with special tokens parsed, BOS (as [`Prompter::chat_ids`]
    /// adds it) on the first only: llama-mtmd-cli's `eval_message` and
    /// `mtmd_tokenize`, and the caller frames each image as libmtmd does
    /// ([`ImageFraming::Mtmd`]). The built-in Muse Glimmer format places
    /// each image as the reference does, its rows where its `<|patch|>`
    /// slots go (§2.6; `<|image_start|>`/`<|image_end|>` inside the runs when
    /// `chat_template_kwargs.wrap_images` is true): [`ImageFraming::InRuns`].
    pub fn chat_runs(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        kwargs: &Map<String, Value>,
        marker: &str,
    ) -> Result<ChatRuns, PromptError> {
        let tokenizer = self.tokenizer()?;
        match &self.renderer {
            Renderer::Jinja(t) => {
                let messages = crate::template::llama_cpp_messages(messages);
                let text = self.render(&messages, tools, true, kwargs)?;
                let bos = t.bos_token();
                let add_special = bos.is_empty() || !text.starts_with(bos);
                let runs = text
                    .split(marker)
                    .enumerate()
                    .map(|(i, run)| tokenizer.encode(run, i == 0 && add_special, true))
                    .collect();
                Ok(ChatRuns {
                    runs,
                    framing: ImageFraming::Mtmd,
                })
            }
            Renderer::MuseGlimmer => {
                let opts = muse_options(kwargs, true)?;
                let prompt = muse_glimmer::render_prompt(messages, tools, &opts)
                    .map_err(|e| PromptError::Render(e.to_string()))?
                    .with_marker_images(marker);
                muse_glimmer::check_tokenizer(tokenizer)
                    .map_err(|e| PromptError::Render(e.to_string()))?;
                let runs = prompt
                    .encode_runs(|t| tokenizer.encode(t, false, false))
                    .map_err(|e| PromptError::Render(e.to_string()))?;
                Ok(ChatRuns {
                    runs,
                    framing: ImageFraming::InRuns,
                })
            }
            Renderer::None(why) => Err(PromptError::NoTemplate(why.clone())),
        }
    }

    /// A raw completion prompt: BOS as the model asks, special tokens parsed.
    pub fn completion_ids(&self, prompt: &str) -> Result<Vec<u32>, PromptError> {
        Ok(self.tokenizer()?.encode(prompt, true, true))
    }

    /// A fresh output parser for one response. Call ids carry `call_id_prefix`
    /// so they are unique across a conversation.
    pub fn parser(
        &self,
        tools: Option<&Value>,
        call_id_prefix: String,
    ) -> Result<Box<dyn OutputParser + Send>, PromptError> {
        let options = ParserOptions {
            id_prefix: call_id_prefix,
            ..ParserOptions::default()
        };
        parser_with(self.output, tools, options).map_err(|e| PromptError::Render(e.to_string()))
    }

    fn tokenizer(&self) -> Result<&Tokenizer, PromptError> {
        self.tokenizer
            .as_deref()
            .ok_or_else(|| PromptError::Config("this prompter renders text only".into()))
    }
}

/// The built-in Muse Glimmer format's options from template kwargs.
fn muse_options(
    kwargs: &Map<String, Value>,
    add_generation_prompt: bool,
) -> Result<RenderOptions, PromptError> {
    let mut opts = RenderOptions {
        add_generation_prompt,
        ..RenderOptions::default()
    };
    for (k, v) in kwargs {
        match (k.as_str(), v) {
            ("reasoning_strength" | "reasoning_effort", Value::String(s)) => {
                opts.reasoning_strength = s.clone()
            }
            ("current_date", Value::String(s)) => opts.current_date = Some(s.clone()),
            ("wrap_images", Value::Bool(b)) => opts.wrap_images = *b,
            ("wrap_images", _) => {
                return Err(PromptError::Render(
                    "chat_template_kwargs.wrap_images must be a boolean.".into(),
                ))
            }
            ("reasoning_strength" | "reasoning_effort" | "current_date", _) => {
                return Err(PromptError::Render(format!(
                    "chat_template_kwargs.{k} must be a string."
                )))
            }
            _ => {}
        }
    }
    Ok(opts)
}
