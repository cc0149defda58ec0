//! The chat layer: turning conversations into prompts and generated text back
//! into reasoning, content and tool calls.
//!
//! - [`template`]: Jinja chat templates (from GGUF `tokenizer.chat_template`).
//! - [`muse_glimmer`]: the built-in Muse Glimmer (Harmony-style) prompt format.
//! - [`parser`]: incremental output parsers, one per format, behind one trait.
//! - [`detect`]: `auto` format detection.
//! - [`prompter`]: the one place a conversation becomes a model's prompt
//!   (used by `hearth run`, `hearth serve` and `hearth template`).

pub mod detect;
pub mod muse_glimmer;
pub mod parser;
pub mod prompter;
pub mod template;
