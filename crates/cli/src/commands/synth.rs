//! `hearth synth`: writes a synthetic GGUF (real tensor layout and Q4_K_M
//! quantization mix, seeded random weights) for benchmarks and tests:
//! muse-glimmer and qwen2 models, DFlash and DFlash2 drafts in llama.cpp's
//! `dflash` layout (all loadable by llama.cpp 11434).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hearth_models::synth::{write_gguf_pooled, SynthOptions, SynthPlan, SynthShape, PRESETS};
use hearth_models::synth_dflash::{dflash_plan, target_tokenizer, Dflash2Shape, DflashShape};
use hearth_models::Architecture;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "muse-glimmer", alias = "muse_glimmer")]
    MuseGlimmer,
    #[value(name = "qwen2")]
    Qwen2,
    #[value(name = "gemma3")]
    Gemma3,
    /// A DFlash draft (llama.cpp's `dflash` layout) matched to `--target`.
    #[value(name = "dflash")]
    Dflash,
    /// A DFlash2 draft (convolutions and a candidate selector) matched to `--target`.
    #[value(name = "dflash2")]
    Dflash2,
    /// A Muse Glimmer vision tower (llama.cpp's mmproj layout); tiny unless
    /// `--preset muse-glimmer-mmproj` (the 50-block tower).
    #[value(name = "muse-glimmer-mmproj")]
    MuseGlimmerMmproj,
}

impl Arch {
    fn architecture(self) -> Architecture {
        match self {
            Arch::MuseGlimmer => Architecture::MuseGlimmer,
            Arch::Qwen2 => Architecture::Qwen2,
            Arch::Gemma3 => Architecture::Gemma3,
            Arch::Dflash | Arch::Dflash2 => {
                unreachable!("dflash drafts are planned by dflash_plan_for")
            }
            Arch::MuseGlimmerMmproj => unreachable!("mmproj files are planned by mmproj_plan_for"),
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Architecture (implied by --preset; default muse-glimmer).
    #[arg(long, value_enum)]
    pub arch: Option<Arch>,
    /// Full-size shape: muse-glimmer-30b (~17 GB) or qwen2.5-32b (~19 GB).
    /// Explicit shape flags override it.
    #[arg(long)]
    pub preset: Option<String>,
    /// Decoder layers [default: 8].
    #[arg(long)]
    pub layers: Option<usize>,
    /// Residual width; a multiple of 256 [default: 256].
    #[arg(long)]
    pub dim: Option<usize>,
    /// Query heads [default: 4].
    #[arg(long)]
    pub heads: Option<usize>,
    /// KV heads [default: 2].
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Head dim (muse-glimmer; qwen2 uses dim / heads) [default: 64].
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// FFN width; a multiple of 256 [default: 512].
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Vocabulary size [default: 512].
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Sliding window (muse-glimmer; dflash: every layer sliding) [default: 16].
    #[arg(long)]
    pub window: Option<usize>,
    /// dflash/dflash2: the target GGUF the draft is matched to (width, layers,
    /// vocabulary; its tokenizer is copied into the draft).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Copy the tokenizer (every `tokenizer.*` key, chat template included)
    /// from this GGUF or packaged model; the vocabulary size follows it.
    /// Makes a small model that `run`/`serve` can talk to with real text
    /// (random weights). muse-glimmer default: the packaged smollm2-135m's;
    /// `none` writes no vocabulary.
    #[arg(long)]
    pub tokenizer_from: Option<String>,
    /// muse-glimmer: give the copied vocabulary Muse Glimmer's special
    /// tokens at their fixed ids (200000..200092; the other new ids
    /// reserved), 202048 ids in all, and no chat template, so the file
    /// renders with hearth's built-in Muse Glimmer format (images as bare
    /// `<|patch|>` slots, as the model's reference places them).
    #[arg(long)]
    pub muse_specials: bool,
    /// dflash: trained block size B_max [default: 16].
    #[arg(long)]
    pub block_size: Option<usize>,
    /// dflash: tapped target layers (inputs of those layers), comma-separated,
    /// in the order their states are concatenated [default: up to 5 spread over 1..=L-2].
    #[arg(long, value_delimiter = ',')]
    pub target_layers: Option<Vec<usize>>,
    /// dflash: the noise (MASK) token id [default: the last vocabulary id].
    #[arg(long)]
    pub mask_token: Option<u32>,
    /// muse-glimmer-mmproj: width of the projector's output rows (the text
    /// model's embedding width) [default: --target's, else the preset's].
    #[arg(long)]
    pub projection_dim: Option<usize>,
    /// muse-glimmer-mmproj: type of the matrices (f16, bf16, f32, q8_0,
    /// q4_k, ...; q4_k keeps attn_v and ffn_down in q6_k, as Q4_K_M does;
    /// the patch embedding is f32 for f32, else f16) [default: f16].
    #[arg(long = "type", value_name = "TYPE")]
    pub weight_type: Option<String>,
    /// muse-glimmer-mmproj: output widths of mm.0 and mm.1, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub adapter: Option<Vec<usize>>,
    /// Seed of the random weights; the same seed gives the same bytes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Generation threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Speed benchmarks: generate N distinct rows per tensor and repeat them
    /// (row r = row r mod N), writing at disk speed instead of quantizing
    /// every row. The result is not the seeded model.
    #[arg(long, value_name = "N")]
    pub row_pool: Option<usize>,
    /// Print the plan (tensors, types, size) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Output .gguf path.
    #[arg(short, long)]
    pub output: PathBuf,
}

fn shape(args: &Args) -> Result<SynthShape> {
    let mut s = match (&args.preset, args.arch) {
        (Some(p), arch) => {
            let s = SynthShape::preset(p)
                .with_context(|| format!("unknown preset '{p}' (known: {})", PRESETS.join(", ")))?;
            if let Some(a) = arch.filter(|a| a.architecture() != s.arch) {
                bail!(
                    "--arch {} contradicts --preset {p} ({})",
                    a.architecture().gguf_name(),
                    s.arch.gguf_name()
                );
            }
            s
        }
        (None, arch) => SynthShape::small(arch.unwrap_or(Arch::MuseGlimmer).architecture()),
    };
    let set = |field: &mut usize, v: Option<usize>| *field = v.unwrap_or(*field);
    set(&mut s.n_layers, args.layers);
    set(&mut s.dim, args.dim);
    set(&mut s.n_heads, args.heads);
    set(&mut s.n_kv_heads, args.kv_heads);
    set(&mut s.ffn_dim, args.ffn);
    set(&mut s.vocab_size, args.vocab);
    set(&mut s.window, args.window);
    match s.arch {
        Architecture::Qwen2 => {
            if args.head_dim.is_some() {
                bail!("--head-dim is fixed to dim / heads for qwen2");
            }
            s.head_dim = s.dim / s.n_heads.max(1);
        }
        _ => set(&mut s.head_dim, args.head_dim),
    }
    Ok(s)
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// The plan of a DFlash draft for `--target`, with the shape flags applied
/// (--layers, --heads, --kv-heads, --head-dim, --ffn, --block-size,
/// --target-layers, --window for an all-sliding draft).
fn dflash_plan_for(args: &Args) -> Result<SynthPlan> {
    let Some(target) = &args.target else {
        bail!(
            "--arch dflash/dflash2 needs --target FILE (the target GGUF the draft is matched to)"
        );
    };
    if args.preset.is_some() || args.dim.is_some() || args.vocab.is_some() {
        bail!("--arch dflash/dflash2 takes its width and vocabulary from --target (no --preset, --dim or --vocab)");
    }
    if args.tokenizer_from.is_some() {
        bail!("--arch dflash/dflash2 copies the target's tokenizer (no --tokenizer-from)");
    }
    let file = hearth_gguf::GgufFile::open(target)
        .with_context(|| format!("reading {}", target.display()))?;
    let config = hearth_models::ModelConfig::from_gguf(&file)
        .with_context(|| format!("reading {}", target.display()))?;
    let mut s = DflashShape::for_target(&config);
    let set = |field: &mut usize, v: Option<usize>| *field = v.unwrap_or(*field);
    set(&mut s.n_layers, args.layers);
    set(&mut s.n_heads, args.heads);
    set(&mut s.n_kv_heads, args.kv_heads);
    set(&mut s.head_dim, args.head_dim);
    set(&mut s.ffn_dim, args.ffn);
    set(&mut s.block_size, args.block_size);
    if let Some(t) = &args.target_layers {
        s.target_layers = t.clone();
    }
    if let Some(m) = args.mask_token {
        s.mask_token = m;
    }
    s.window = args.window;
    s.tokenizer = target_tokenizer(&file);
    if args.arch == Some(Arch::Dflash2) {
        s.dflash2 = Some(Dflash2Shape::default());
        s.post_norms = true;
    }
    eprintln!(
        "{} draft for {} ({} layers, dim {}, vocab {}): {} layers, {} heads / {} kv heads of {}, ffn {}, block {}, taps {:?}{}",
        if s.dflash2.is_some() { "dflash2" } else { "dflash" },
        target.display(),
        config.n_layers,
        config.dim,
        config.vocab_size,
        s.n_layers,
        s.n_heads,
        s.n_kv_heads,
        s.head_dim,
        s.ffn_dim,
        s.block_size,
        s.target_layers,
        s.window.map(|w| format!(", all layers sliding (window {w})")).unwrap_or_default()
    );
    Ok(dflash_plan(&config, &s)?)
}

/// The plan of a synthetic mmproj: `--preset muse-glimmer-mmproj` or the
/// tiny tower, with --layers, --dim, --heads, --ffn, --window (position-table
/// side), --projection-dim (or --target's width) and --type applied.
fn mmproj_plan_for(args: &Args) -> Result<SynthPlan> {
    use hearth_vision::synth::{mmproj_plan, MmprojShape, MMPROJ_PRESETS};
    let mut s = match &args.preset {
        Some(p) => MmprojShape::preset(p).with_context(|| {
            format!(
                "unknown mmproj preset '{p}' (known: {})",
                MMPROJ_PRESETS.join(", ")
            )
        })?,
        None => MmprojShape::tiny(),
    };
    if args.kv_heads.is_some()
        || args.head_dim.is_some()
        || args.vocab.is_some()
        || args.block_size.is_some()
    {
        bail!("--kv-heads, --head-dim, --vocab and --block-size do not apply to --arch muse-glimmer-mmproj");
    }
    let set = |field: &mut usize, v: Option<usize>| *field = v.unwrap_or(*field);
    set(&mut s.n_layer, args.layers);
    set(&mut s.n_embd, args.dim);
    set(&mut s.n_head, args.heads);
    set(&mut s.n_ff, args.ffn);
    set(&mut s.pos_side, args.window);
    if let Some(target) = &args.target {
        let f = hearth_gguf::GgufFile::open(target)
            .with_context(|| format!("reading {}", target.display()))?;
        let arch = f.architecture().unwrap_or_default().to_string();
        let key = format!("{arch}.embedding_length");
        s.projection_dim =
            f.metadata()
                .get_u64(&key)
                .with_context(|| format!("{}: no {key}", target.display()))? as usize;
    }
    set(&mut s.projection_dim, args.projection_dim);
    if let Some(t) = &args.weight_type {
        let ty = hearth_gguf::GgmlType::from_name(&t.to_ascii_uppercase())
            .with_context(|| format!("unknown --type '{t}'"))?;
        s.weight_type = ty;
        s.weight_type_more = if ty == hearth_gguf::GgmlType::Q4_K {
            hearth_gguf::GgmlType::Q6_K
        } else {
            ty
        };
        s.patch_type = if ty == hearth_gguf::GgmlType::F32 {
            ty
        } else {
            hearth_gguf::GgmlType::F16
        };
    }
    if let Some(a) = &args.adapter {
        let [a0, a1] = a[..] else {
            bail!("--adapter takes two widths (mm.0,mm.1), got {a:?}");
        };
        s.adapter = [a0, a1];
    }
    let plan = mmproj_plan(&s)?;
    eprintln!(
        "muse-glimmer mmproj: {} blocks, width {}, {} heads of {}, ffn {}, position table {}x{}, adapter {:?}, rows of {}, {}; {} tensors, {:.1}M parameters, {:.1} MB, seed {}",
        s.n_layer,
        s.n_embd,
        s.n_head,
        s.head_dim(),
        s.n_ff,
        s.pos_side,
        s.pos_side,
        s.adapter,
        s.projection_dim,
        s.weight_type,
        plan.tensors.len(),
        plan.n_parameters() as f64 / 1e6,
        mb(plan.data_bytes()),
        args.seed
    );
    Ok(plan)
}

pub fn run(args: Args) -> Result<()> {
    if !args.dry_run {
        crate::cli_args::check_output_path("--output", &args.output)?;
    }
    let mmproj_preset = args
        .preset
        .as_deref()
        .is_some_and(|p| hearth_vision::synth::MMPROJ_PRESETS.contains(&p));
    if args.arch == Some(Arch::MuseGlimmerMmproj) || (args.arch.is_none() && mmproj_preset) {
        let plan = mmproj_plan_for(&args)?;
        return write(&args, &plan);
    }
    if args.projection_dim.is_some() || args.weight_type.is_some() || args.adapter.is_some() {
        bail!("--projection-dim, --type and --adapter are for --arch muse-glimmer-mmproj");
    }
    if matches!(args.arch, Some(Arch::Dflash | Arch::Dflash2)) {
        let plan = dflash_plan_for(&args)?;
        return write(&args, &plan);
    }
    if args.target.is_some()
        || args.block_size.is_some()
        || args.target_layers.is_some()
        || args.mask_token.is_some()
    {
        bail!("--target, --block-size, --target-layers and --mask-token are for --arch dflash/dflash2");
    }
    let mut shape = shape(&args)?;
    // A muse-glimmer file takes text prompts: a real tokenizer by default.
    let tokenizer_from = match (&args.tokenizer_from, shape.arch) {
        (Some(t), _) if t == "none" => None,
        (Some(t), _) => Some(t.clone()),
        (None, Architecture::MuseGlimmer) if args.vocab.is_none() && args.preset.is_none() => {
            Some("smollm2-135m".to_string())
        }
        (None, _) => None,
    };
    if args.muse_specials && (shape.arch != Architecture::MuseGlimmer || tokenizer_from.is_none()) {
        bail!("--muse-specials is for --arch muse-glimmer with a tokenizer (not --tokenizer-from none, --vocab or --preset)");
    }
    let tokenizer = match &tokenizer_from {
        Some(name) => {
            let path = crate::store::resolve_model(Some(name))
                .with_context(|| format!("--tokenizer-from {name}"))?;
            let f = hearth_gguf::GgufFile::open(&path)
                .with_context(|| format!("--tokenizer-from {}", path.display()))?;
            let keys: Vec<(String, hearth_gguf::Value)> = f
                .metadata()
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            let n = f
                .metadata()
                .get_array("tokenizer.ggml.tokens")
                .map(|t| t.len())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--tokenizer-from {}: no tokenizer.ggml.tokens",
                        path.display()
                    )
                })?;
            eprintln!("tokenizer from {} ({n} tokens)", path.display());
            shape.vocab_size = n;
            let keys = match args.muse_specials {
                false => keys,
                true => {
                    // The real model's vocabulary size.
                    shape.vocab_size = SynthShape::muse_glimmer_30b().vocab_size;
                    eprintln!(
                        "Muse Glimmer special tokens at their ids, {} tokens, no chat template (the built-in format)",
                        shape.vocab_size
                    );
                    with_muse_specials(keys, shape.vocab_size).with_context(|| {
                        format!("--muse-specials on the tokenizer of {}", path.display())
                    })?
                }
            };
            Some(keys)
        }
        None => None,
    };
    let mut plan = SynthPlan::new(&shape)?;
    if let Some(keys) = tokenizer {
        let vocab_key = format!("{}.vocab_size", shape.arch.gguf_name());
        plan.metadata
            .retain(|(k, _)| !k.starts_with("tokenizer.") && *k != vocab_key);
        plan.metadata.extend(keys);
    }
    let total = plan.data_bytes();
    eprintln!(
        "{}; {} tensors, {:.1}M parameters, {:.1} MB of tensor data, seed {}",
        shape.summary(),
        plan.tensors.len(),
        plan.n_parameters() as f64 / 1e6,
        mb(total),
        args.seed
    );
    write(&args, &plan)
}

/// `tokenizer.*` keys extended to `vocab` ids with the Muse Glimmer
/// specials at their ids (control tokens; the other new ids
/// `<|reserved_special_token_N|>`), BOS and EOS theirs, no chat template.
fn with_muse_specials(
    keys: Vec<(String, hearth_gguf::Value)>,
    vocab: usize,
) -> Result<Vec<(String, hearth_gguf::Value)>> {
    use hearth_chat::muse_glimmer::Special;
    use hearth_gguf::{Value, ValueType};
    const CONTROL: i32 = 3;
    let mut out = Vec::new();
    for (k, v) in keys {
        let v = match (k.as_str(), v) {
            ("tokenizer.chat_template", _) => continue,
            ("tokenizer.ggml.tokens", Value::Array(ValueType::String, mut tokens)) => {
                let first = Special::ALL.iter().map(|t| t.id()).min().unwrap_or(0) as usize;
                if tokens.len() > first {
                    bail!("{} tokens: the specials start at id {first}", tokens.len());
                }
                for t in Special::ALL {
                    if tokens.iter().any(|x| x.as_str() == Some(t.as_str())) {
                        bail!("the vocabulary already has {}", t.as_str());
                    }
                }
                for i in tokens.len()..vocab {
                    let name = Special::ALL
                        .iter()
                        .find(|t| t.id() as usize == i)
                        .map_or_else(
                            || format!("<|reserved_special_token_{i}|>"),
                            |t| t.as_str().to_string(),
                        );
                    tokens.push(Value::String(name));
                }
                Value::Array(ValueType::String, tokens)
            }
            ("tokenizer.ggml.token_type", Value::Array(ty, mut types)) => {
                types.resize(vocab, Value::I32(CONTROL));
                Value::Array(ty, types)
            }
            ("tokenizer.ggml.scores", Value::Array(ty, mut scores)) => {
                scores.resize(vocab, Value::F32(0.0));
                Value::Array(ty, scores)
            }
            ("tokenizer.ggml.bos_token_id", _) => Value::U32(Special::BeginOfText.id()),
            ("tokenizer.ggml.eos_token_id", _) => Value::U32(Special::Eot.id()),
            ("tokenizer.ggml.padding_token_id", _) => Value::U32(Special::EndOfText.id()),
            ("tokenizer.ggml.tokens" | "tokenizer.ggml.token_type", _) => {
                bail!("{k} is not an array of the expected type")
            }
            (_, v) => v,
        };
        out.push((k, v));
    }
    Ok(out)
}

fn write(args: &Args, plan: &SynthPlan) -> Result<()> {
    let total = plan.data_bytes();
    if args.dry_run {
        for t in &plan.tensors {
            outln!(
                "{:40} {:5} {:?} {}",
                t.name,
                t.ty.name(),
                t.shape,
                t.n_bytes()
            );
        }
        return Ok(());
    }
    // Write under a temporary name so an interrupted run leaves no plausible-looking file.
    let partial = partial_path(&args.output);
    let file = File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "synth [{bar:30}] {bytes:>10}/{total_bytes:10} {bytes_per_sec:>12}  {elapsed} eta {eta}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    crate::init_threads(args.threads)?;
    let opts = SynthOptions {
        seed: args.seed,
        // Pooled rows are mostly copies: larger chunks amortize the pool.
        chunk_bytes: if args.row_pool.is_some() {
            64 << 20
        } else {
            8 << 20
        },
        ..SynthOptions::default()
    };
    let t0 = Instant::now();
    let written = write_gguf_pooled(
        plan,
        &opts,
        args.row_pool,
        BufWriter::with_capacity(1 << 20, file),
        |n| bar.inc(n),
    );
    bar.finish_and_clear();
    let finished = written
        .map_err(anyhow::Error::from)
        .and_then(|w| w.into_inner().map_err(|e| e.into_error().into()))
        .and_then(|f| Ok(f.sync_all()?));
    if let Err(e) = finished {
        let _ = std::fs::remove_file(&partial);
        return Err(e.context(format!("writing {}", partial.display())));
    }
    std::fs::rename(&partial, &args.output).with_context(|| {
        format!(
            "renaming {} to {}",
            partial.display(),
            args.output.display()
        )
    })?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "wrote {:.1} MB in {secs:.1} s ({:.1} MB/s)",
        mb(total),
        mb(total) / secs
    );
    outln!("{}", args.output.display());
    Ok(())
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}
