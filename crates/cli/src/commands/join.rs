//! `hearth join`: a split GGUF (`NAME-00001-of-0000N.gguf` …) written as one
//! file, as `llama-gguf-split --merge` does. Downloads are joined on their
//! own; this is for parts already on disk.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::store;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  hearth join Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf
      writes Qwen2.5-7B-Instruct-Q4_K_M.gguf next to the parts
  hearth join part-00001-of-00003.gguf -o ~/models/whole.gguf")]
pub struct Args {
    /// Any part of the split GGUF (the others are found by their names).
    pub part: PathBuf,
    /// Where to write the joined model [default: NAME.gguf next to the parts].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> Result<()> {
    let parts = hearth_gguf::split::part_paths(&args.part).with_context(|| {
        format!(
            "{}: not a split GGUF part's name (NAME-0000K-of-0000N.gguf, llama.cpp's gguf-split naming)",
            args.part.display()
        )
    })?;
    if let Some(missing) = parts.iter().find(|p| !p.is_file()) {
        bail!(
            "{} is missing: a split GGUF needs all {} parts in one folder",
            missing.display(),
            parts.len()
        );
    }
    let out = match args.output {
        Some(o) => o,
        None => hearth_gguf::split::joined_name(&args.part).expect("a part's name"),
    };
    if out.exists() && !args.force {
        bail!("{} exists: pass --force to replace it", out.display());
    }
    let source = out.display().to_string();
    store::join_parts(&parts, &out, &source)?;
    outln!("{}", out.display());
    Ok(())
}
