//! `hearth show MODEL`: a model in a dozen lines (like `ollama show`): what
//! it is, its size and shape, its chat format, its file. `hearth inspect`
//! prints every metadata key and tensor.

use std::path::Path;

use anyhow::Result;
use hearth_gguf::GgufFile;
use hearth_models::ModelConfig;

use crate::download::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// Model name (see `hearth list`, `hearth pull --list`) or .gguf path.
    pub model: String,
}

pub fn run(args: Args) -> Result<()> {
    let path = crate::store::resolve_model(Some(&args.model))?;
    let file = GgufFile::open(&path)?;
    outln!("{}", summary(&path, &file));
    Ok(())
}

/// The summary `hearth show` prints (and the chat's `/show info`).
pub(crate) fn summary(path: &Path, f: &GgufFile) -> String {
    let md = f.metadata();
    let mut rows: Vec<(&str, String)> = Vec::new();
    let name = md.get_str("general.name").unwrap_or("");
    if !name.is_empty() {
        rows.push(("name", name.to_string()));
    }
    rows.push(("architecture", f.architecture().unwrap_or("?").to_string()));
    let params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    rows.push((
        "parameters",
        match params {
            p if p >= 1_000_000_000 => format!("{:.2}B", p as f64 / 1e9),
            p => format!("{:.1}M", p as f64 / 1e6),
        },
    ));
    let quant = md
        .get_u64("general.file_type")
        .and_then(super::list::ftype_name)
        .unwrap_or("?");
    rows.push(("quantization", quant.to_string()));
    match ModelConfig::from_gguf(f) {
        Ok(c) => {
            rows.push(("context length", c.context_length.to_string()));
            rows.push(("embedding length", c.dim.to_string()));
            rows.push(("layers", c.n_layers.to_string()));
            rows.push((
                "attention heads",
                format!("{} ({} for K and V)", c.n_heads, c.n_kv_heads),
            ));
            rows.push(("vocabulary", c.vocab_size.to_string()));
        }
        Err(e) => rows.push(("config", format!("not a model hearth runs: {e}"))),
    }
    rows.push(("type", super::list::kind(f).to_string()));
    let template = match md.get_str("tokenizer.chat_template") {
        Some(t) => format!("from the GGUF ({} bytes)", t.len()),
        None => "none in the GGUF (a base model: `hearth run` completes text as it is)".into(),
    };
    rows.push(("chat template", template));
    rows.push((
        "tool calls",
        hearth_chat::detect::detect_gguf(f).to_string(),
    ));
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    rows.push((
        "file",
        format!("{} ({})", path.display(), human_bytes(size)),
    ));
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("  {k:w$}  {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}
