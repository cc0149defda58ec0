//! Conversations to token ids: the model's chat template (or the built-in Muse
//! Glimmer format) and the tokenizer, plus the output format its replies are
//! parsed with.

use std::sync::Arc;

use hearth_chat::detect::{detect_gguf, OutputFormat};
use hearth_chat::muse_glimmer::{self, RenderOptions};
use hearth_chat::parser::{parser_with, OutputParser, ParserOptions};
use hearth_chat::template::ChatTemplate;
use hearth_gguf::GgufFile;
use hearth_tokenizer::Tokenizer;
use serde_json::{Map, Value};

use crate::error::ApiError;

enum Renderer {
    Jinja(ChatTemplate),
    MuseGlimmer,
    /// No template: chat requests are refused, completions still work.
    None(String),
}

pub struct Prompter {
    renderer: Renderer,
    pub output: OutputFormat,
    pub tokenizer: Arc<Tokenizer>,
}

impl Prompter {
    /// `tool_parser`: `auto` or a format name (`OutputFormat::from_name`).
    pub fn new(
        file: &GgufFile,
        tokenizer: Arc<Tokenizer>,
        tool_parser: &str,
    ) -> Result<Prompter, String> {
        let detected = detect_gguf(file);
        let output = if tool_parser == "auto" {
            detected
        } else {
            OutputFormat::from_name(tool_parser).ok_or_else(|| {
                format!("unknown --tool-parser '{tool_parser}' (expected auto, atem, hermes, qwen3-xml, harmony, muse-glimmer or plain)")
            })?
        };
        let arch = file.architecture().unwrap_or("");
        // A Muse Glimmer file renders through its own chat template (as
        // llama.cpp does); the built-in format is for files without one.
        let no_template = file.metadata().get_str("tokenizer.chat_template").is_none();
        let renderer =
            if no_template && (arch == "muse-glimmer" || detected == OutputFormat::MuseGlimmer) {
                Renderer::MuseGlimmer
            } else {
                match ChatTemplate::from_gguf(file) {
                    Ok(t) => Renderer::Jinja(t),
                    Err(e) => Renderer::None(e.to_string()),
                }
            };
        Ok(Prompter {
            renderer,
            output,
            tokenizer,
        })
    }

    pub fn describe(&self) -> String {
        let r = match &self.renderer {
            Renderer::Jinja(_) => "GGUF chat template",
            Renderer::MuseGlimmer => "built-in Muse Glimmer format",
            Renderer::None(_) => "no chat template",
        };
        format!("{r}, tool-call format {}", self.output)
    }

    /// Renders and tokenizes a conversation. Template errors are the client's
    /// (400 with the template's message).
    pub fn chat_ids(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<Vec<u32>, ApiError> {
        match &self.renderer {
            Renderer::Jinja(t) => {
                let text = t
                    .render(messages, tools, true, kwargs)
                    .map_err(|e| ApiError::invalid_request(e.to_string()))?;
                // A template that writes BOS itself (Gemma) must not get a second one.
                let bos = t.bos_token();
                let add_special = bos.is_empty() || !text.starts_with(bos);
                Ok(self.tokenizer.encode(&text, add_special, true))
            }
            Renderer::MuseGlimmer => {
                let mut opts = RenderOptions::default();
                for (k, v) in kwargs {
                    match (k.as_str(), v) {
                        ("reasoning_strength" | "reasoning_effort", Value::String(s)) => {
                            opts.reasoning_strength = s.clone()
                        }
                        ("current_date", Value::String(s)) => opts.current_date = Some(s.clone()),
                        ("reasoning_strength" | "current_date", _) => {
                            return Err(ApiError::invalid_request(format!(
                                "chat_template_kwargs.{k} must be a string."
                            )))
                        }
                        _ => {}
                    }
                }
                let prompt = muse_glimmer::render_prompt(messages, tools, &opts)
                    .map_err(|e| ApiError::invalid_request(e.to_string()))?;
                prompt
                    .encode_with(&self.tokenizer, &[])
                    .map_err(|e| ApiError::invalid_request(e.to_string()))
            }
            Renderer::None(why) => Err(ApiError::invalid_request(format!(
                "This model has no chat template ({why}); use /v1/completions."
            ))),
        }
    }

    /// A raw completion prompt: BOS as the model asks, special tokens parsed.
    pub fn completion_ids(&self, prompt: &str) -> Vec<u32> {
        self.tokenizer.encode(prompt, true, true)
    }

    /// A fresh output parser for one response. Call ids carry `call_id_prefix`
    /// so they are unique across a conversation.
    pub fn parser(
        &self,
        tools: Option<&Value>,
        call_id_prefix: String,
    ) -> Result<Box<dyn OutputParser + Send>, ApiError> {
        let options = ParserOptions {
            id_prefix: call_id_prefix,
            ..ParserOptions::default()
        };
        parser_with(self.output, tools, options)
            .map_err(|e| ApiError::invalid_request(e.to_string()))
    }
}
