//! `hearth rm`: delete downloaded models (the file, its record and any
//! partial download) by the names `hearth list` shows.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::download::human_bytes;
use crate::registry::{models_dir, registry};
use crate::store::{self, part_path, record_path, ModelName};

#[derive(clap::Args)]
pub struct Args {
    /// Models to delete: packaged names, hf://… names, URLs, or paths as
    /// `hearth list` shows them.
    #[arg(required = true)]
    pub names: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    for name in &args.names {
        for (p, n) in remove(name)? {
            outln!("removed {} ({})", p.display(), human_bytes(n));
        }
    }
    Ok(())
}

/// Deletes the downloaded model `name` (as `hearth list` names it); the
/// files removed with their sizes (records left out). Also `hearth serve`'s
/// `/api/delete`.
pub(crate) fn remove(name: &str) -> Result<Vec<(PathBuf, u64)>> {
    let reg = registry()?;
    let mut gone = Vec::new();
    // A name `hearth list` shows by its place in the store (a relative
    // path that cannot climb out of it).
    let relative = std::path::Path::new(name)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    let in_store = models_dir().join(name);
    if relative && !name.contains("://") && in_store.is_file() {
        remove_file_set(&in_store, &mut gone)?;
    } else {
        match ModelName::parse(name, &reg) {
            Ok(ModelName::Packaged(m)) => {
                let path = models_dir().join(&m.file);
                remove_file_set(&path, &mut gone)?;
                store::remove_if_present(&path.with_extension("gguf.partial"), &mut gone)?;
            }
            Ok(ModelName::Remote(r)) => gone = r.remove()?,
            Ok(ModelName::File(p))
                if p.canonicalize()?.starts_with(models_dir().canonicalize()?) =>
            {
                remove_file_set(&p, &mut gone)?
            }
            Ok(ModelName::File(p)) => bail!(
                "{}: not in the model store ({}); hearth rm deletes downloaded models only",
                p.display(),
                models_dir().display()
            ),
            Err(e) => return Err(e),
        }
    }
    gone.retain(|(p, _)| !p.to_string_lossy().ends_with(".hearth.json"));
    if gone.is_empty() {
        bail!("'{name}' is not downloaded (see `hearth list`)");
    }
    Ok(gone)
}

/// A file, its record and its partial download.
fn remove_file_set(path: &std::path::Path, gone: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    for f in [path.to_path_buf(), part_path(path), record_path(path)] {
        store::remove_if_present(&f, gone)?;
    }
    Ok(())
}
