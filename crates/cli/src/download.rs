//! Resumable HTTP(S) downloads into a `.part` file: a request from the
//! part's length (`Range: bytes=N-`, RFC 9110 §14), a progress bar on stderr,
//! and the sha256 checked against what the source publishes (the Hugging Face
//! Hub sends an LFS file's sha256 as `X-Linked-Etag` on its redirect) or what
//! the user gave. A transfer that ends early is never taken as complete.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// What to fetch and how far to trust the answer.
pub struct Request<'a> {
    pub url: &'a str,
    /// The model's name in messages.
    pub label: &'a str,
    /// `Authorization: Bearer` for requests to this host (the Hub's, with
    /// `HF_TOKEN`); never forwarded to the hosts it redirects to.
    pub bearer: Option<(String, String)>,
    /// The sha256 the file must have and who said so (`--sha256`).
    pub sha256: Option<(String, String)>,
    /// Take a 64-hex-digit `ETag` as the sha256 (the Hub's LFS files).
    pub etag_is_sha256: bool,
}

/// A completed `.part` file.
pub struct Fetched {
    pub size: u64,
    pub sha256: String,
    /// What the sha256 was checked against ("x-linked-etag", "--sha256", …);
    /// `None` when the source published nothing to check it against.
    pub checked_against: Option<String>,
}

/// What the responses said about the file before its body arrived.
#[derive(Default)]
struct Hints {
    sha256: Option<(String, String)>,
    size: Option<u64>,
}

impl Hints {
    fn take_from(&mut self, resp: &ureq::Response, etag_is_sha256: bool) {
        if self.sha256.is_none() {
            let linked = resp.header("x-linked-etag").and_then(sha256_of_etag);
            let etag = resp
                .header("etag")
                .and_then(sha256_of_etag)
                .filter(|_| etag_is_sha256);
            self.sha256 = linked
                .map(|s| (s, "the source's X-Linked-Etag".to_string()))
                .or_else(|| etag.map(|s| (s, "the source's ETag".to_string())));
        }
        if self.size.is_none() {
            self.size = resp
                .header("x-linked-size")
                .and_then(|s| s.trim().parse().ok());
        }
    }
}

/// `"<64 hex digits>"` (quoted, possibly weak) -> the digits, lowercase.
fn sha256_of_etag(etag: &str) -> Option<String> {
    let t = etag.trim().trim_start_matches("W/").trim_matches('"');
    (t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit())).then(|| t.to_ascii_lowercase())
}

/// Checks a `--sha256` value: 64 hex digits.
pub fn parse_sha256(s: &str) -> Result<String> {
    match sha256_of_etag(s) {
        Some(h) if !s.contains('"') => Ok(h),
        _ => bail!("--sha256 '{s}': expected 64 hexadecimal digits"),
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        // Redirects are followed here, to read the Hub's headers on the way.
        .redirects(0)
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .user_agent(concat!("hearth/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Downloads `req.url` into `part`, continuing from the bytes already there,
/// and checks its length and sha256. On an interrupted transfer the part is
/// kept (the next call resumes it); on a checksum mismatch it is removed.
pub fn download(req: &Request, part: &Path) -> Result<Fetched> {
    if let Some(dir) = part.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let label = req.label;
    let agent = agent();
    let mut hasher = Sha256::new();
    let mut have = hash_existing(part, &mut hasher)?;
    let (mut resp, hints) = get(&agent, req, have)?;
    let total;
    match resp.status() {
        206 => {
            let (start, len) = content_range(&resp).with_context(|| {
                format!("{label}: a partial answer without a valid Content-Range")
            })?;
            if start != have {
                bail!("{label}: asked for bytes from {have}, the server sent them from {start}; remove {} and try again", part.display());
            }
            total = len;
        }
        416 if have > 0 => {
            // Nothing left to send: the part is whole if its length is the file's.
            let (_, len) = content_range(&resp).unwrap_or((0, None));
            if len != Some(have) {
                std::fs::remove_file(part)?;
                bail!("{label}: the server has no bytes past {have} but the file is not that long; the partial file was removed, run the command again");
            }
            total = len;
            resp = empty_response()?;
        }
        _ => {
            if have > 0 {
                eprintln!("{label}: the server does not resume transfers; starting over");
                hasher = Sha256::new();
                have = 0;
            }
            total = resp
                .header("content-length")
                .and_then(|s| s.trim().parse().ok());
        }
    }
    if let (Some(want), Some(got)) = (hints.size, total) {
        if want != got {
            bail!("{label}: the server sends {got} bytes but announced {want} (X-Linked-Size)");
        }
    }
    let total = total.or(hints.size);
    let mut out = OpenOptions::new()
        .create(true)
        .write(true)
        .append(have > 0)
        .truncate(have == 0)
        .open(part)
        .with_context(|| format!("opening {}", part.display()))?;
    if have > 0 {
        eprintln!(
            "{label}: resuming at {} of {}",
            human_bytes(have),
            total.map_or("?".into(), human_bytes)
        );
    }
    let bar = progress(label, total, have);
    let mut body = resp.into_reader();
    let mut buf = vec![0u8; 1 << 20];
    let interrupted = |have: u64, why: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "{label}: download interrupted after {} of {} ({why}); run the same command again to resume",
            human_bytes(have),
            total.map_or("?".into(), human_bytes)
        )
    };
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.flush()?;
                bar.abandon();
                return Err(interrupted(have, &e));
            }
        };
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", part.display()))?;
        hasher.update(&buf[..n]);
        have += n as u64;
        bar.set_position(have);
    }
    out.sync_all()?;
    bar.finish_and_clear();
    match total {
        Some(t) if have < t => return Err(interrupted(have, &"the connection closed early")),
        Some(t) if have > t => {
            std::fs::remove_file(part)?;
            bail!("{label}: received {have} bytes, more than the {t} announced; the partial file was removed");
        }
        _ => {}
    }
    let sha256 = format!("{:x}", hasher.finalize());
    let expected = req.sha256.clone().or(hints.sha256);
    if let Some((want, from)) = &expected {
        if *want != sha256 {
            std::fs::remove_file(part)?;
            bail!(
                "{label}: sha256 mismatch: the download has {sha256}, {from} says {want}; the partial file was removed"
            );
        }
    }
    Ok(Fetched {
        size: have,
        sha256,
        checked_against: expected.map(|(_, from)| from),
    })
}

/// Hashes what a previous attempt left in `part`; returns its length.
fn hash_existing(part: &Path, hasher: &mut Sha256) -> Result<u64> {
    let mut f = match File::open(part) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("opening {}", part.display())),
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        hasher.update(&buf[..k]);
        n += k as u64;
    }
}

/// GET from byte `from`, following up to 10 redirects by hand so that the
/// Hub's headers on the first answer are seen.
fn get(agent: &ureq::Agent, req: &Request, from: u64) -> Result<(ureq::Response, Hints)> {
    let label = req.label;
    let mut url = req.url.to_string();
    let mut hints = Hints::default();
    for _ in 0..10 {
        let parsed = url::Url::parse(&url).with_context(|| format!("{label}: bad URL '{url}'"))?;
        let mut r = agent.request_url("GET", &parsed);
        if from > 0 {
            r = r.set("Range", &format!("bytes={from}-"));
        }
        if let Some((host, token)) = &req.bearer {
            if host_port(&parsed) == *host {
                r = r.set("Authorization", &format!("Bearer {token}"));
            }
        }
        let resp = match r.call() {
            Ok(resp) => resp,
            Err(ureq::Error::Status(416, resp)) if from > 0 => resp,
            Err(ureq::Error::Status(code, resp)) => {
                return Err(status_error(label, &url, code, resp.status_text()))
            }
            // ureq's message starts with the URL.
            Err(e) => bail!("{label}: {}", transport_error(&parsed, &e)),
        };
        hints.take_from(&resp, req.etag_is_sha256);
        if (300..400).contains(&resp.status()) {
            let loc = resp
                .header("location")
                .with_context(|| format!("{label}: redirect without a Location from {url}"))?;
            url = parsed
                .join(loc)
                .with_context(|| format!("{label}: bad redirect '{loc}' from {url}"))?
                .to_string();
            continue;
        }
        return Ok((resp, hints));
    }
    bail!("{label}: more than 10 redirects from {}", req.url)
}

/// `host` or `host:port` as a URL names it.
pub fn host_port(u: &url::Url) -> String {
    match (u.host_str(), u.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => String::new(),
    }
}

/// A request that got no answer (no network, DNS, refused, timed out), said
/// so plainly.
fn transport_error(u: &url::Url, e: &ureq::Error) -> String {
    format!(
        "could not reach {} ({e}); downloading needs network access to it (offline, give a local .gguf path instead)",
        host_port(u)
    )
}

/// A small JSON document (the Hub's file listing), with the Hub's token
/// when the host is the Hub's.
pub fn get_json(url: &str, bearer: Option<(String, String)>) -> Result<serde_json::Value> {
    let parsed = url::Url::parse(url).with_context(|| format!("bad URL '{url}'"))?;
    let mut r = agent()
        .request_url("GET", &parsed)
        .set("Accept", "application/json");
    if let Some((host, token)) = &bearer {
        if host_port(&parsed) == *host {
            r = r.set("Authorization", &format!("Bearer {token}"));
        }
    }
    // The listing API answers directly; a redirect is followed once.
    let resp = match r.call() {
        Ok(resp) if (300..400).contains(&resp.status()) => {
            let loc = resp.header("location").unwrap_or_default().to_string();
            let next = parsed
                .join(&loc)
                .with_context(|| format!("bad redirect '{loc}' from {url}"))?;
            agent()
                .request_url("GET", &next)
                .call()
                .map_err(|e| match e {
                    ureq::Error::Status(code, resp) => {
                        status_error("listing", next.as_str(), code, resp.status_text())
                    }
                    e => anyhow::anyhow!("{}", transport_error(&next, &e)),
                })?
        }
        Ok(resp) => resp,
        Err(ureq::Error::Status(code, resp)) => {
            return Err(status_error("listing", url, code, resp.status_text()))
        }
        Err(e) => bail!("{}", transport_error(&parsed, &e)),
    };
    let text = resp
        .into_string()
        .with_context(|| format!("reading {url}"))?;
    serde_json::from_str(&text).with_context(|| format!("{url} did not answer JSON"))
}

fn status_error(label: &str, url: &str, code: u16, text: &str) -> anyhow::Error {
    let hint = match code {
        404 => " (check the owner, repository, file name and revision)",
        401 | 403 => " (a gated or private Hugging Face repository needs HF_TOKEN set to a token with access)",
        _ => "",
    };
    anyhow::anyhow!("{label}: HTTP {code} {text} from {url}{hint}")
}

/// `Content-Range: bytes START-END/TOTAL` (or `bytes */TOTAL`) -> (START, TOTAL).
fn content_range(resp: &ureq::Response) -> Option<(u64, Option<u64>)> {
    let v = resp.header("content-range")?.trim();
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    let start = match range.trim() {
        "*" => 0,
        r => r.split_once('-')?.0.trim().parse().ok()?,
    };
    Some((start, total))
}

/// A response with no body (the 416 that says a part is already whole).
fn empty_response() -> Result<ureq::Response> {
    Ok(ureq::Response::new(200, "OK", "")?)
}

fn progress(label: &str, total: Option<u64>, at: u64) -> ProgressBar {
    let bar = match total {
        Some(t) => ProgressBar::new(t).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        ),
        None => ProgressBar::no_length().with_style(
            ProgressStyle::with_template("{msg} {bytes:>10} {bytes_per_sec:>12}")
                .expect("valid template"),
        ),
    };
    bar.set_message(label.to_string());
    bar.set_position(at);
    bar
}

/// 98362432 -> "98.4 MB" (decimal units, as sizes on model hubs are given).
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    match n {
        _ if n >= 1e9 => format!("{:.1} GB", n / 1e9),
        _ if n >= 1e6 => format!("{:.1} MB", n / 1e6),
        _ if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        _ => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_forms() {
        let h = "B179C9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        assert_eq!(
            sha256_of_etag(&format!("\"{h}\"")),
            Some(h.to_ascii_lowercase())
        );
        assert_eq!(
            sha256_of_etag(&format!("W/\"{h}\"")),
            Some(h.to_ascii_lowercase())
        );
        // A git blob sha1 (the Hub's ETag for small files) is not a sha256.
        assert_eq!(
            sha256_of_etag("\"a9993e364706816aba3e25717850c26c9cd0d89d\""),
            None
        );
        assert!(parse_sha256("xyz").is_err());
        assert!(parse_sha256(h).is_ok());
    }

    #[test]
    fn sizes_read_like_hub_sizes() {
        assert_eq!(human_bytes(98_362_432), "98.4 MB");
        assert_eq!(human_bytes(1_117_320_768), "1.1 GB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
