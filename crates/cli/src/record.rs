//! The record kept beside each verified model file (`FILE.hearth.json`):
//! where it came from, its sha256 and the file's stamp when that was computed;
//! and the names of a file's companions (`.hearth.json`, `.part`). Used by the
//! store and by the packaged-model installer ([`crate::registry`]).

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Written beside each verified file: what it is and the last check.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record {
    /// The name the model was pulled by.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub size: u64,
    pub sha256: String,
    /// What the sha256 was checked against when the file arrived (the
    /// registry, the Hub's X-Linked-Etag, --sha256); `None` when the source
    /// published nothing, so only later damage can be detected.
    #[serde(default)]
    pub checked_against: Option<String>,
    /// The file's length and modification time when its sha256 was last
    /// computed: an unchanged file is not hashed again.
    #[serde(default)]
    pub stamp: Option<Stamp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub len: u64,
    pub mtime_ns: u64,
}

/// `FILE.hearth.json` beside `FILE`.
pub fn record_path(file: &Path) -> PathBuf {
    with_suffix(file, ".hearth.json")
}

/// `FILE.part`: a download in progress.
pub fn part_path(file: &Path) -> PathBuf {
    with_suffix(file, ".part")
}

fn with_suffix(file: &Path, suffix: &str) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

pub fn read_record(file: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(record_path(file)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes the record atomically (a temporary file renamed into place).
pub fn write_record(file: &Path, rec: &Record) -> Result<()> {
    let path = record_path(file);
    let tmp = with_suffix(&path, &format!(".{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_string_pretty(rec)? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

pub fn stamp_of(file: &Path) -> Result<Stamp> {
    let m = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?;
    let mtime_ns = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    Ok(Stamp {
        len: m.len(),
        mtime_ns,
    })
}
