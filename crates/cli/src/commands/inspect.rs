//! `hearth inspect`: what a GGUF holds and the model config it implies.

use std::collections::BTreeMap;

use anyhow::Result;
use hearth_gguf::{GgmlType, GgufFile, Value};
use hearth_models::{LayerKind, ModelConfig};
use serde_json::{json, Value as Json};

#[derive(clap::Args)]
pub struct Args {
    /// Model name (see `hearth pull --list`) or path to a .gguf file.
    pub model: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print long metadata arrays (vocabularies, merges) in full.
    #[arg(long)]
    pub full: bool,
    /// List every tensor (name, type, shape, size); the table output
    /// otherwise gives their count and the per-type totals. `hearth show`
    /// is the short summary.
    #[arg(long)]
    pub tensors: bool,
}

pub fn run(args: Args) -> Result<()> {
    let path = crate::store::resolve_model(Some(&args.model))?;
    let file = GgufFile::open(&path)?;
    let config = ModelConfig::from_gguf(&file);
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&to_json(&file, config.as_ref().ok(), args.full))?
        );
        return Ok(());
    }
    print_tables(&file, &config, args.full, args.tensors)
}

/// Arrays longer than this are summarized unless `--full`.
const ARRAY_SHOWN: usize = 16;

fn value_json(v: &Value, full: bool) -> Json {
    match v {
        Value::Array(elem, items) if !full && items.len() > ARRAY_SHOWN => json!({
            "array_of": elem.name(),
            "len": items.len(),
            "head": items.iter().take(ARRAY_SHOWN).map(|x| value_json(x, full)).collect::<Vec<_>>(),
        }),
        Value::Array(_, items) => Json::Array(items.iter().map(|x| value_json(x, full)).collect()),
        Value::String(s) => Json::String(s.clone()),
        Value::Bool(b) => Json::Bool(*b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        other => match (other.as_u64(), other.as_i64()) {
            (Some(u), _) => json!(u),
            (None, Some(i)) => json!(i),
            _ => Json::Null,
        },
    }
}

struct TypeStats {
    count: usize,
    bytes: u64,
    elements: u64,
}

fn type_stats(file: &GgufFile) -> BTreeMap<GgmlType, TypeStats> {
    let mut by_type: BTreeMap<GgmlType, TypeStats> = BTreeMap::new();
    for t in file.tensors() {
        let s = by_type.entry(t.ty).or_insert(TypeStats {
            count: 0,
            bytes: 0,
            elements: 0,
        });
        s.count += 1;
        s.bytes += t.n_bytes();
        s.elements += t.n_elements();
    }
    by_type
}

fn config_json(c: &ModelConfig) -> Json {
    json!({
        "architecture": c.arch.gguf_name(),
        "layers": c.n_layers,
        "dim": c.dim,
        "heads": c.n_heads,
        "kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "ffn_dim": c.ffn_dim,
        "vocab_size": c.vocab_size,
        "context_length": c.context_length,
        "rope_theta": c.rope_theta,
        "sliding_window": c.sliding_window(),
        "sliding_layers": layers_where(c, |l| l.is_sliding()),
        "global_layers": layers_where(c, |l| !l.is_sliding()),
        "nope_layers": layers_where(c, |l| !l.uses_rope()),
        "defaults_used": c.defaults_used,
    })
}

fn layers_where(c: &ModelConfig, pred: impl Fn(LayerKind) -> bool) -> Vec<usize> {
    c.layers
        .iter()
        .enumerate()
        .filter(|(_, l)| pred(**l))
        .map(|(i, _)| i)
        .collect()
}

fn to_json(file: &GgufFile, config: Option<&ModelConfig>, full: bool) -> Json {
    let stats = type_stats(file);
    let (bytes, elements) = stats
        .values()
        .fold((0, 0), |(b, e), s| (b + s.bytes, e + s.elements));
    json!({
        "path": file.path(),
        "version": file.version(),
        "architecture": file.architecture(),
        "tensor_count": file.tensors().len(),
        "data_offset": file.data_offset(),
        "tensor_types": stats.iter().map(|(t, s)| (t.name().to_string(), json!(s.count))).collect::<serde_json::Map<_, _>>(),
        "tensor_bytes": bytes,
        "parameters": elements,
        "bits_per_weight": if elements > 0 { bytes as f64 * 8.0 / elements as f64 } else { 0.0 },
        "metadata": file.metadata().iter().map(|(k, v)| (k.to_string(), value_json(v, full))).collect::<serde_json::Map<_, _>>(),
        "tensors": file.tensors().iter().map(|t| json!({
            "name": t.name, "type": t.ty.name(), "shape": t.shape, "offset": t.offset, "bytes": t.n_bytes(),
        })).collect::<Vec<_>>(),
        "config": config.map(config_json),
    })
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.2} {}", UNITS[u])
    }
}

/// "0-4,6-10" style ranges.
fn ranges(xs: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < xs.len() {
        let mut j = i;
        while j + 1 < xs.len() && xs[j + 1] == xs[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            xs[i].to_string()
        } else {
            format!("{}-{}", xs[i], xs[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

fn print_tables(
    file: &GgufFile,
    config: &Result<ModelConfig, hearth_models::ConfigError>,
    full: bool,
    tensors: bool,
) -> Result<()> {
    outln!(
        "{}  ({})",
        file.path().display(),
        human_bytes(file.file_size())
    );
    outln!(
        "GGUF v{}, alignment {}, {} metadata keys, {} tensors, data at byte {}",
        file.version(),
        file.alignment(),
        file.metadata().len(),
        file.tensors().len(),
        file.data_offset()
    );
    outln!("\nconfig:");
    match config {
        Err(e) => outln!("  (no model config: {e})"),
        Ok(c) => {
            outln!(
                "  architecture {}, {} layers, dim {}, {} heads, {} kv heads, head dim {}, ffn {}, vocab {}, context {}",
                c.arch.gguf_name(),
                c.n_layers,
                c.dim,
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
                c.ffn_dim,
                c.vocab_size,
                c.context_length
            );
            let sliding = layers_where(c, |l| l.is_sliding());
            let global = layers_where(c, |l| !l.is_sliding());
            match c.sliding_window() {
                Some(w) => outln!(
                    "  sliding window {w}: sliding layers {} ({}), global layers {} ({})",
                    ranges(&sliding),
                    sliding.len(),
                    ranges(&global),
                    global.len()
                ),
                None => outln!("  no sliding window: all {} layers global", c.n_layers),
            }
            let nope = layers_where(c, |l| !l.uses_rope());
            if !nope.is_empty() {
                outln!("  NoPE (no positional encoding) layers: {}", ranges(&nope));
            }
            outln!(
                "  rope theta {} ({:?} layout), rms eps {:e}",
                c.rope_theta,
                c.rope_layout,
                c.norm_eps
            );
            for d in &c.defaults_used {
                outln!("  default used (not in GGUF): {d}");
            }
        }
    }
    outln!("\nmetadata:");
    for (k, v) in file.metadata().iter() {
        match v {
            Value::Array(..) if full => outln!("  {k} = {v:?}"),
            _ => outln!("  {k} = {v}"),
        }
    }
    let name_w = file
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    if !tensors {
        outln!(
            "\ntensors: {} (`--tensors` lists each with its type, shape and size)",
            file.tensors().len()
        );
    }
    if tensors {
        outln!("\ntensors (shape in ggml order, innermost first):");
        outln!(
            "  {:name_w$}  {:7}  {:>22}  {:>12}",
            "name",
            "type",
            "shape",
            "bytes"
        );
        for t in file.tensors() {
            let shape = t
                .shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" x ");
            outln!(
                "  {:name_w$}  {:7}  {:>22}  {:>12}",
                t.name,
                t.ty.name(),
                shape,
                human_bytes(t.n_bytes())
            );
        }
    }
    let stats = type_stats(file);
    let (bytes, elements) = stats
        .values()
        .fold((0, 0), |(b, e), s| (b + s.bytes, e + s.elements));
    outln!("\nby type:");
    for (t, s) in &stats {
        outln!(
            "  {:7} {:5} tensors  {:>12}  {:5.1}%  {:.2} bits/weight",
            t.name(),
            s.count,
            human_bytes(s.bytes),
            100.0 * s.bytes as f64 / bytes.max(1) as f64,
            t.bits_per_weight()
        );
    }
    outln!(
        "  total   {:5} tensors  {:>12}  {:.1}M parameters, {:.3} bits/weight",
        file.tensors().len(),
        human_bytes(bytes),
        elements as f64 / 1e6,
        bytes as f64 * 8.0 / elements.max(1) as f64
    );
    Ok(())
}
