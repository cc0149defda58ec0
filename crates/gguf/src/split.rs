//! Split GGUFs (llama.cpp's `gguf-split` layout): a model stored as
//! `NAME-00001-of-0000N.gguf` … `NAME-0000N-of-0000N.gguf`, each part a
//! complete GGUF holding some of the tensors; the first also holds the
//! model's metadata. Every part carries `split.no` (0-based), `split.count`
//! and, the first, `split.tensors.count`.
//!
//! [`join`] writes the parts as one GGUF, the way `llama-gguf-split --merge`
//! does: the first part's metadata with `split.count` set to 0, then every
//! part's tensors in order, their data copied unchanged.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::reader::GgufFile;
use crate::value::Value;
use crate::writer::GgufWriter;

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS: &str = "split.tensors.count";

/// `(split.no, split.count)` of a part of a split GGUF; `None` for a whole
/// file (no `split.count`, or the 0 or 1 a merged file carries).
pub fn split_of(file: &GgufFile) -> Option<(u64, u64)> {
    let count = file.metadata().get_u64(KEY_SPLIT_COUNT)?;
    (count > 1).then(|| (file.metadata().get_u64(KEY_SPLIT_NO).unwrap_or(0), count))
}

/// The file names of every part, from any part's name
/// (`NAME-0000K-of-0000N.gguf`, llama.cpp's `llama_split_path`); `None` when
/// the name is not a part's.
pub fn part_paths(part: &Path) -> Option<Vec<PathBuf>> {
    let name = part.file_name()?.to_str()?;
    let (stem, n) = part_name(name)?;
    Some(
        (1..=n)
            .map(|i| part.with_file_name(format!("{stem}-{i:05}-of-{n:05}.gguf")))
            .collect(),
    )
}

/// The name of the joined file: `NAME.gguf` for `NAME-00001-of-0000N.gguf`.
pub fn joined_name(part: &Path) -> Option<PathBuf> {
    let name = part.file_name()?.to_str()?;
    let (stem, _) = part_name(name)?;
    Some(part.with_file_name(format!("{stem}.gguf")))
}

/// `(NAME, N)` of `NAME-0000K-of-0000N.gguf`.
fn part_name(name: &str) -> Option<(&str, usize)> {
    const TAIL: usize = "-00001-of-00001.gguf".len();
    let cut = name.len().checked_sub(TAIL)?;
    let (stem, tail) = (name.get(..cut)?, name.get(cut..)?);
    let b = tail.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<usize> {
        let s = tail.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b[0] != b'-' || tail.get(6..10)? != "-of-" || !tail.ends_with(".gguf") {
        return None;
    }
    let (k, n) = (num(1..6)?, num(10..15)?);
    (k >= 1 && k <= n && !stem.is_empty()).then_some((stem, n))
}

/// Joins the split GGUF whose parts are `parts` (in order) into `out`.
/// `progress(done, total)` is called with bytes of tensor data copied. The
/// parts are checked first (each its own `split.no`, the same `split.count`,
/// the tensor count the first part announces); `out` is written through a
/// temporary file next to it and renamed into place, so a failed join leaves
/// nothing behind.
pub fn join(
    parts: &[PathBuf],
    out: &Path,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), GgufError> {
    let bad = |path: &Path, why: String| GgufError::Write(format!("{}: {why}", path.display()));
    let files = parts
        .iter()
        .map(GgufFile::open)
        .collect::<Result<Vec<_>, _>>()?;
    let first = files
        .first()
        .ok_or_else(|| GgufError::Write("no parts to join".into()))?;
    let n = parts.len() as u64;
    for (i, f) in files.iter().enumerate() {
        let count = f.metadata().get_u64(KEY_SPLIT_COUNT);
        let no = f.metadata().get_u64(KEY_SPLIT_NO);
        if count != Some(n) || no != Some(i as u64) {
            return Err(bad(
                f.path(),
                format!(
                    "expected part {} of {n} (split.no {i}, split.count {n}), the file says split.no {}, split.count {}",
                    i + 1,
                    no.map_or("absent".into(), |v| v.to_string()),
                    count.map_or("absent".into(), |v| v.to_string()),
                ),
            ));
        }
    }
    let total_tensors: u64 = files.iter().map(|f| f.tensors().len() as u64).sum();
    if let Some(want) = first.metadata().get_u64(KEY_SPLIT_TENSORS) {
        if want != total_tensors {
            return Err(bad(
                first.path(),
                format!("announces {want} tensors in all; the {n} parts hold {total_tensors}"),
            ));
        }
    }

    let mut w = GgufWriter::new();
    for (k, v) in first.metadata().iter() {
        w.set(k, v.clone());
    }
    // As llama-gguf-split --merge: the joined file is not itself a split.
    w.set(KEY_SPLIT_COUNT, Value::U16(0));
    for f in &files {
        for t in f.tensors() {
            w.add_tensor(t.name.clone(), t.ty, &t.shape)?;
        }
    }
    let total: u64 = files
        .iter()
        .flat_map(|f| f.tensors().iter().map(|t| t.n_bytes()))
        .sum();

    let tmp = out.with_file_name(format!(
        "{}.joining",
        out.file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("joined.gguf")
    ));
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| bad(&tmp, e.to_string()))?;
        let mut sink = w.begin(BufWriter::with_capacity(1 << 20, file))?;
        let mut done = 0u64;
        progress(0, total);
        for f in &files {
            for t in f.tensors() {
                let data = f.tensor(&t.name)?.data;
                for chunk in data.chunks(64 << 20) {
                    sink.write(&t.name, chunk)?;
                    done += chunk.len() as u64;
                    progress(done, total);
                }
            }
        }
        let file = sink
            .finish()?
            .into_inner()
            .map_err(|e| bad(&tmp, e.to_string()))?;
        file.sync_all().map_err(|e| bad(&tmp, e.to_string()))?;
        std::fs::rename(&tmp, out).map_err(|e| bad(out, e.to_string()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names() {
        let p = Path::new("/m/Qwen-7B-Q4_K_M-00002-of-00003.gguf");
        let all = part_paths(p).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0], Path::new("/m/Qwen-7B-Q4_K_M-00001-of-00003.gguf"));
        assert_eq!(all[2], Path::new("/m/Qwen-7B-Q4_K_M-00003-of-00003.gguf"));
        assert_eq!(joined_name(p).unwrap(), Path::new("/m/Qwen-7B-Q4_K_M.gguf"));
        for not in [
            "model.gguf",
            "-00001-of-00002.gguf",
            "m-00003-of-00002.gguf",
            "m-00000-of-00002.gguf",
            "m-0001a-of-00002.gguf",
        ] {
            assert!(part_paths(Path::new(not)).is_none(), "{not}");
        }
    }
}
