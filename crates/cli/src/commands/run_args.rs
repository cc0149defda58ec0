//! `hearth run`'s command-line options, shared by the one-shot run
//! ([`super::run`]) and the interactive chat ([`super::interactive`]).

use std::path::PathBuf;

use super::images::ImageRules;
use super::spec::SpecArgs;

/// Examples at the end of `hearth run --help`.
const EXAMPLES: &str = "Examples:
  hearth run                                        chat with the default model (qwen2.5-coder-0.5b)
  hearth run -m qwen2.5-coder-1.5b -p \"Write a haiku about Rust.\"
  cat main.py | hearth run -p \"Review this code\"      the piped text, then the prompt
  hearth run -m gemma3-270m -p \"Once upon a time\"     a base model completes the text
  hearth run -hf bartowski/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M
  hearth run -m M.gguf --mmproj MMPROJ.gguf --image cat.png -p \"What is this?\"
  hearth run -p \"List three colors\" --json-schema colors.schema.json
In the chat: /help, /set parameter temperature 0, /set system TEXT, /show info, \"\"\" for several lines.";

#[derive(clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Model name (see `hearth pull --list`) or .gguf path [default: qwen2.5-coder-0.5b, pulled on first use]
    #[arg(help_heading = "Prompt", short, long)]
    pub model: Option<String>,
    /// Prompt text (without -p or -f, a prompt piped to stdin is read).
    #[arg(help_heading = "Prompt", short, long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file ("-" for stdin).
    #[arg(help_heading = "Prompt", short, long)]
    pub file: Option<PathBuf>,
    /// Plain text completion: feed the prompt as it is, without the model's
    /// chat template (a base model, whose GGUF has none, always is unless --chat).
    #[arg(help_heading = "Prompt", long, visible_alias = "no-chat")]
    pub raw: bool,
    /// Render the prompt as a chat turn even for a base model (with its
    /// architecture's built-in template); chat models always are.
    #[arg(help_heading = "Prompt", long, conflicts_with = "raw")]
    pub chat: bool,
    /// A system message before the prompt (chat mode; also -sys).
    #[arg(
        help_heading = "Prompt",
        long = "system-prompt",
        conflicts_with = "raw"
    )]
    pub system_prompt: Option<String>,
    /// Do not print the model's reasoning (else it goes to stderr).
    #[arg(help_heading = "Output", long)]
    pub hide_reasoning: bool,
    /// Print the rendered prompt (text and token count) to stderr before generating.
    #[arg(help_heading = "Output", long)]
    pub verbose_prompt: bool,
    /// Also print the KV cache's layout and the speculation's details (and banners).
    #[arg(help_heading = "Output", short = 'v', long)]
    pub verbose: bool,
    /// Tokens to generate (-1 = until end of generation or the context is full).
    #[arg(help_heading = "Generation", short = 'n', long = "n-predict", visible_alias = "predict", default_value_t = 128,
          value_parser = crate::cli_args::parse_n_predict, allow_negative_numbers = true)]
    pub n_predict: usize,
    /// Sampling temperature; 0 or -1 = greedy (deterministic).
    #[arg(
        help_heading = "Sampling",
        long,
        default_value_t = 0.8,
        allow_negative_numbers = true
    )]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 or negative = off).
    #[arg(help_heading = "Sampling", long, default_value_t = 40, value_parser = crate::cli_args::parse_top_k,
          allow_negative_numbers = true)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(
        help_heading = "Sampling",
        long,
        default_value_t = 0.95,
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// Drop tokens below MIN_P times the most likely one (0 = off).
    #[arg(
        help_heading = "Sampling",
        long,
        default_value_t = 0.05,
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Penalize repeats of the last --repeat-last-n tokens (1 = off).
    #[arg(
        help_heading = "Sampling",
        long,
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    /// Tokens the repeat penalties look back over (0 = off, -1 = the whole context).
    #[arg(help_heading = "Sampling", long, default_value_t = 64, value_parser = crate::cli_args::parse_repeat_last_n,
          allow_negative_numbers = true)]
    pub repeat_last_n: usize,
    /// Subtract this from the logit of every token already in the last
    /// --repeat-last-n tokens (0 = off; OpenAI's presence_penalty).
    #[arg(
        help_heading = "Sampling",
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Subtract this times a token's count in the last --repeat-last-n tokens
    /// from its logit (0 = off; OpenAI's frequency_penalty).
    #[arg(
        help_heading = "Sampling",
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// RNG seed (0 or -1 = random).
    #[arg(help_heading = "Sampling", short, long, default_value_t = 0, value_parser = crate::cli_args::parse_seed,
          allow_negative_numbers = true)]
    pub seed: u64,
    /// Keep generating past end-of-generation tokens (until -n or the context).
    #[arg(help_heading = "Generation", long)]
    pub ignore_eos: bool,
    /// Process escapes in the prompt (\n, \t, \\, \xHH, … as llama.cpp does).
    #[arg(
        help_heading = "Prompt",
        short = 'e',
        long,
        overrides_with = "no_escape"
    )]
    pub escape: bool,
    /// Take the prompt's backslashes literally (the default).
    #[arg(help_heading = "Prompt", long, overrides_with = "escape")]
    pub no_escape: bool,
    /// llama.cpp's -ngl, accepted: hearth places layers by --device (cpu: all
    /// on the CPU; cuda: all on the GPU).
    #[arg(help_heading = "Generation", long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N",
          value_parser = crate::cli_args::parse_gpu_layers, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<crate::cli_args::GpuLayers>,
    /// Context size (tokens of prompt + generation).
    #[arg(
        help_heading = "Generation",
        short = 'c',
        long = "ctx-size",
        default_value_t = 4096
    )]
    pub ctx: usize,
    /// Stop when this text is generated (repeatable).
    #[arg(help_heading = "Generation", long)]
    pub stop: Vec<String>,
    /// Worker threads [default: all cores].
    #[arg(help_heading = "Generation", short, long)]
    pub threads: Option<usize>,
    /// Also write the speed figures as JSON to this file.
    #[arg(help_heading = "Output", long)]
    pub stats_json: Option<PathBuf>,
    /// Backend: cpu or cuda.
    #[arg(help_heading = "Generation", long, value_enum, default_value_t = crate::device::Device::Cpu)]
    pub device: crate::device::Device,
    /// The model's multimodal projector (llama.cpp's mmproj GGUF), for --image.
    #[arg(help_heading = "Images", long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// An image for the prompt (PNG, JPEG, WebP, GIF; repeatable). Each goes
    /// where the prompt says `<__media__>`, else all before the prompt; in the
    /// interactive chat, with the first message (`/image FILE` adds more).
    #[arg(help_heading = "Images", long, value_name = "FILE")]
    pub image: Vec<PathBuf>,
    /// The vision tower's rules where the model's reference and llama.cpp
    /// differ (grid ties, position-table resampling). `llama-cpp-exact` also
    /// takes llama.cpp's CPU arithmetic (f16 im2col and attention, its
    /// kernels' orders): llama-mtmd-cli's image rows to the bit, on the CPU
    /// tower, at a slower encode.
    #[arg(help_heading = "Images", long, value_enum, default_value_t = ImageRules::Reference)]
    pub image_rules: ImageRules,
    /// Constrain the answer to JSON valid under this JSON Schema (file);
    /// generation ends when the JSON is complete.
    #[arg(
        help_heading = "Structured output",
        long,
        value_name = "FILE",
        conflicts_with = "grammar"
    )]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to a grammar in llguidance's Lark syntax (file;
    /// `%json {schema}` items allowed). In chat mode the grammar covers the
    /// whole reply, the format's own framing included.
    #[arg(help_heading = "Structured output", long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    #[command(flatten, next_help_heading = "KV cache")]
    pub kv: crate::cli_args::KvCacheArgs,
    #[command(flatten, next_help_heading = "Speculative decoding")]
    pub spec: SpecArgs,
}
