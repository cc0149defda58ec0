//! `auto` output-format detection: which tool-call / reasoning syntax a model
//! writes, from its architecture, chat template and special tokens.
//!
//! The template decides when there is one: a model only writes tool calls in
//! the syntax its template teaches it (Qwen2.5 `<tool_call>` JSON, Qwen3-Coder
//! `<function=…><parameter=…>`, Harmony channels, ATEM). Architecture settles the
//! two formats hearth renders itself (Muse Glimmer, gpt-oss); special tokens are
//! the fallback for a GGUF without a template. Nothing matching means `plain`
//! (SmolLM2, Gemma 3: no tool format).

use std::collections::HashSet;

use hearth_gguf::GgufFile;

/// How a model's output is split into reasoning, content and tool calls; the
/// names are the ones `hearth_chat::parser::parser_for` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// Bare ATEM XML (`<atem:function_calls>`), spec chat-format.md §3–4.
    Atem,
    /// Qwen2.5 `<tool_call>{json}</tool_call>`, spec §8.1.
    Hermes,
    /// Qwen3-Coder `<function=NAME><parameter=KEY>`, spec §8.2.
    Qwen3Xml,
    /// gpt-oss channels (`<|channel|>analysis` …), spec §7.
    Harmony,
    /// Muse Glimmer: recipient headers around ATEM, spec §2–3.
    MuseGlimmer,
    /// No tool calls or reasoning markup: all output is content.
    Plain,
}

impl OutputFormat {
    pub const ALL: [OutputFormat; 6] = [
        OutputFormat::Atem,
        OutputFormat::Hermes,
        OutputFormat::Qwen3Xml,
        OutputFormat::Harmony,
        OutputFormat::MuseGlimmer,
        OutputFormat::Plain,
    ];

    /// The canonical name: `atem`, `hermes`, `qwen3-xml`, `harmony`, `muse-glimmer`, `plain`.
    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::Atem => "atem",
            OutputFormat::Hermes => "hermes",
            OutputFormat::Qwen3Xml => "qwen3-xml",
            OutputFormat::Harmony => "harmony",
            OutputFormat::MuseGlimmer => "muse-glimmer",
            OutputFormat::Plain => "plain",
        }
    }

    /// Parses a name; case and `-`/`_` are ignored (`Qwen3_XML`, `museglimmer`).
    pub fn from_name(name: &str) -> Option<OutputFormat> {
        let key: String = name
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        OutputFormat::ALL
            .into_iter()
            .find(|f| f.name().replace('-', "") == key)
    }
}

impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Muse Glimmer's message framing tokens (spec §1); with ATEM in the template
/// they tell Muse Glimmer from bare ATEM.
const MUSE_GLIMMER_TOKENS: [&str; 4] = ["<|start|>", "<|message|>", "<|eom|>", "<|eot|>"];
/// Harmony's own tokens (spec §7); Muse Glimmer's vocabulary lacks `<|return|>`/`<|call|>` roles.
const HARMONY_TOKENS: [&str; 4] = ["<|start|>", "<|channel|>", "<|return|>", "<|call|>"];

/// Picks the output format for a model.
///
/// - `architecture`: GGUF `general.architecture` (`muse-glimmer`, `gpt-oss`, `qwen2`...);
/// - `template`: the chat template text, if the model has one;
/// - `has_token`: whether a string is one token of the vocabulary.
pub fn detect(
    architecture: &str,
    template: Option<&str>,
    has_token: impl Fn(&str) -> bool,
) -> OutputFormat {
    let arch = architecture.to_ascii_lowercase().replace('_', "-");
    match arch.as_str() {
        "muse-glimmer" => return OutputFormat::MuseGlimmer,
        "gpt-oss" | "gptoss" => return OutputFormat::Harmony,
        _ => {}
    }
    let muse_tokens = || MUSE_GLIMMER_TOKENS.iter().all(|t| has_token(t));
    if let Some(t) = template {
        let atem = t.contains("<atem:function_calls>") || t.contains("<atem:invoke");
        if atem && (muse_tokens() || (t.contains("<|start|>") && t.contains("<|message|>"))) {
            return OutputFormat::MuseGlimmer;
        }
        if t.contains("<|channel|>") {
            return OutputFormat::Harmony;
        }
        // Qwen3-Coder's template also mentions <tool_call>: check the XML first.
        if t.contains("<function=") && t.contains("<parameter=") {
            return OutputFormat::Qwen3Xml;
        }
        if t.contains("<tool_call>") {
            return OutputFormat::Hermes;
        }
        if atem {
            return OutputFormat::Atem;
        }
        return OutputFormat::Plain;
    }
    // No template: the vocabulary is the only evidence left.
    if muse_tokens() && !has_token("<|channel|>") {
        return OutputFormat::MuseGlimmer;
    }
    if HARMONY_TOKENS.iter().all(|t| has_token(t)) {
        return OutputFormat::Harmony;
    }
    if has_token("<tool_call>") && has_token("</tool_call>") {
        return OutputFormat::Hermes;
    }
    OutputFormat::Plain
}

/// [`detect`] on a GGUF: its architecture, `tokenizer.chat_template` and
/// `tokenizer.ggml.tokens`.
pub fn detect_gguf(file: &GgufFile) -> OutputFormat {
    let meta = file.metadata();
    let tokens: HashSet<&str> = meta
        .get_array("tokenizer.ggml.tokens")
        .map(|toks| toks.iter().filter_map(|t| t.as_str()).collect())
        .unwrap_or_default();
    detect(
        file.architecture().unwrap_or(""),
        meta.get_str("tokenizer.chat_template"),
        |t| tokens.contains(t),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn names_round_trip() {
        for f in OutputFormat::ALL {
            assert_eq!(OutputFormat::from_name(f.name()), Some(f));
        }
        assert_eq!(
            OutputFormat::from_name("Qwen3_XML"),
            Some(OutputFormat::Qwen3Xml)
        );
        assert_eq!(
            OutputFormat::from_name("museglimmer"),
            Some(OutputFormat::MuseGlimmer)
        );
        assert_eq!(OutputFormat::from_name("chatml"), None);
    }

    #[test]
    fn architecture_decides_first() {
        assert_eq!(
            detect("muse_glimmer", Some("<tool_call>"), none),
            OutputFormat::MuseGlimmer
        );
        assert_eq!(detect("gpt-oss", None, none), OutputFormat::Harmony);
    }

    #[test]
    fn template_markers() {
        let hermes = "{{- '<tool_call>\\n{\"name\": ' }}";
        let qwen3 =
            "<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>\n{{ v }}\n</parameter>";
        let harmony = "<|start|>assistant<|channel|>final<|message|>";
        let atem = "Call tools with <atem:function_calls><atem:invoke name=\"x\">";
        let muse = "<|start|>system<|message|>{{ tools }} <atem:function_calls><|eot|>";
        assert_eq!(detect("qwen2", Some(hermes), none), OutputFormat::Hermes);
        assert_eq!(
            detect("qwen3moe", Some(qwen3), none),
            OutputFormat::Qwen3Xml
        );
        assert_eq!(detect("llama", Some(harmony), none), OutputFormat::Harmony);
        assert_eq!(detect("llama", Some(atem), none), OutputFormat::Atem);
        assert_eq!(detect("llama", Some(muse), none), OutputFormat::MuseGlimmer);
        assert_eq!(
            detect("llama", Some("{{ messages }}"), |_| true),
            OutputFormat::Plain
        );
    }

    #[test]
    fn tokens_when_there_is_no_template() {
        let vocab = |set: &'static [&'static str]| move |t: &str| set.contains(&t);
        assert_eq!(
            detect(
                "x",
                None,
                vocab(&["<|start|>", "<|message|>", "<|eom|>", "<|eot|>"])
            ),
            OutputFormat::MuseGlimmer
        );
        assert_eq!(
            detect(
                "x",
                None,
                vocab(&[
                    "<|start|>",
                    "<|message|>",
                    "<|channel|>",
                    "<|return|>",
                    "<|call|>"
                ])
            ),
            OutputFormat::Harmony
        );
        assert_eq!(
            detect("qwen2", None, vocab(&["<tool_call>", "</tool_call>"])),
            OutputFormat::Hermes
        );
        assert_eq!(detect("gemma3", None, none), OutputFormat::Plain);
    }
}
