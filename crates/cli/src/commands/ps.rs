//! `hearth ps`: what a running `hearth serve` holds (like `ollama ps`): each
//! loaded model, its memory, context, and until when it stays loaded.

use anyhow::{Context, Result};
use serde_json::Value;

use crate::download::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The server's port.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The server's API key [default: $HEARTH_API_KEY].
    #[arg(long)]
    pub api_key: Option<String>,
    /// Print the server's JSON (`GET /api/ps`) instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let host = if args.host.contains(':') && !args.host.starts_with('[') {
        format!("[{}]", args.host)
    } else {
        args.host.clone()
    };
    let url = format!("http://{host}:{}/api/ps", args.port);
    let key = args
        .api_key
        .or_else(|| std::env::var("HEARTH_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let mut req = ureq::get(&url).timeout(std::time::Duration::from_secs(10));
    if let Some(k) = &key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    let body: Value = match req.call() {
        Ok(r) => {
            let text = r.into_string().with_context(|| format!("reading {url}"))?;
            serde_json::from_str(&text).with_context(|| format!("{url} answered no JSON"))?
        }
        Err(ureq::Error::Status(401, _)) => {
            anyhow::bail!("{url}: the server wants an API key (--api-key or $HEARTH_API_KEY)")
        }
        Err(ureq::Error::Status(code, r)) => {
            anyhow::bail!(
                "{url}: HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )
        }
        Err(e) => anyhow::bail!(
            "no hearth server at {}:{} ({e}); start one with `hearth serve`, or give --host/--port",
            args.host,
            args.port
        ),
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let models = body["models"].as_array().cloned().unwrap_or_default();
    if models.is_empty() {
        outln!("no models loaded (a request naming a model loads it)");
        return Ok(());
    }
    let rows: Vec<[String; 4]> = models
        .iter()
        .map(|m| {
            let until = if m["pinned"].as_bool() == Some(true) {
                "forever (-m)".to_string()
            } else if m["active_requests"].as_u64().unwrap_or(0) > 0 {
                "busy".to_string()
            } else {
                match m["expires_in"].as_f64() {
                    Some(s) => format!("{} from now", human_secs(s)),
                    None => "forever".to_string(),
                }
            };
            [
                m["name"].as_str().unwrap_or("?").to_string(),
                human_bytes(m["size"].as_u64().unwrap_or(0)),
                m["context_length"].to_string(),
                until,
            ]
        })
        .collect();
    let head = ["NAME", "SIZE", "CONTEXT", "UNTIL"];
    let w: Vec<usize> = (0..4)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .max()
                .unwrap_or(0)
                .max(head[i].len())
        })
        .collect();
    for r in std::iter::once(head.map(String::from)).chain(rows) {
        outln!(
            "{:w0$}  {:>w1$}  {:>w2$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2]
        );
    }
    Ok(())
}

/// "45 seconds", "4 minutes", "2 hours".
fn human_secs(s: f64) -> String {
    let s = s.round() as u64;
    let (n, unit) = match s {
        0..=89 => (s, "second"),
        90..=5399 => ((s + 30) / 60, "minute"),
        _ => ((s + 1800) / 3600, "hour"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}
