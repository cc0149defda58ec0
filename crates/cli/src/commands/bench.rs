//! `hearth bench`: prefill (pp) and decode (tg) throughput like llama-bench,
//! with the weight bandwidth decode achieves.

use std::time::Instant;

use anyhow::{Context, Result};
use hearth_models::{Logits, Model};
use rand::{Rng, SeedableRng};

#[derive(clap::Args)]
#[command(after_help = "Examples:
  hearth bench                                  pp512 and tg128 of the default model, all cores
  hearth bench -m qwen2.5-coder-1.5b -t 2 -r 5  two threads, five repetitions
  hearth bench -p 0 -n 64 --depth 4096,16384    decode only, also at 4K and 16K of context
  hearth bench --batch 4,8                      decode of 4 and 8 sessions together
  hearth bench --device cuda --roofline         on the GPU, with its copy bandwidth first
  hearth bench --json                           one JSON object, for scripts")]
pub struct Args {
    /// Model name or .gguf path [default: qwen2.5-coder-0.5b]
    #[arg(help_heading = "Model", short, long)]
    pub model: Option<String>,
    /// Prompt tokens for the prefill test (0 = skip).
    #[arg(
        help_heading = "What to measure",
        short = 'p',
        long = "n-prompt",
        default_value_t = 512
    )]
    pub n_prompt: usize,
    /// Generated tokens for the decode test (0 = skip).
    #[arg(
        help_heading = "What to measure",
        short = 'n',
        long = "n-gen",
        default_value_t = 128
    )]
    pub n_gen: usize,
    /// Worker threads [default: all cores].
    #[arg(help_heading = "Model", short, long)]
    pub threads: Option<usize>,
    /// Repetitions (after one warm-up run that is not counted).
    #[arg(help_heading = "What to measure", short, long, default_value_t = 3)]
    pub reps: usize,
    /// Print one JSON object: model, threads, pp and tg (each tokens and
    /// tok_s), tg_gbps.
    #[arg(help_heading = "Output", long)]
    pub json: bool,
    /// Backend: cpu or cuda.
    #[arg(help_heading = "Backend", long, value_enum, default_value_t = crate::device::Device::Cpu)]
    pub device: crate::device::Device,
    /// llama-bench's -ngl, accepted: hearth places layers by --device.
    #[arg(help_heading = "Backend", long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N",
          value_parser = crate::cli_args::parse_gpu_layers, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<crate::cli_args::GpuLayers>,
    /// Also decode at these context depths (comma-separated), like llama-bench
    /// -d: on the CPU after a real prefill of that many random tokens (not
    /// timed); with cuda the cache is filled by pseudo-random keys and values.
    #[arg(help_heading = "What to measure", long, value_delimiter = ',')]
    pub depth: Vec<usize>,
    /// cuda: measure the device copy bandwidth (the decode roofline) first.
    #[arg(help_heading = "Backend", long)]
    pub roofline: bool,
    /// cuda: launch every kernel of a decode step instead of replaying a CUDA graph.
    #[arg(help_heading = "Backend", long)]
    pub no_graph: bool,
    /// Also decode this many sessions together (comma-separated), one
    /// batched pass per step as `serve` runs concurrent requests (each after
    /// a 16-token prefill, ordinary numerics): aggregate tok/s over all of
    /// them (llama-batched-bench's question).
    #[arg(
        help_heading = "What to measure",
        long,
        value_delimiter = ',',
        value_name = "N"
    )]
    pub batch: Vec<usize>,
    /// cuda: time the kernels alone (GEMV variants, attention, GEMM) on random data; no model needed.
    #[arg(help_heading = "Backend", long)]
    pub kernels: bool,
    /// CPU: first measure the memory read bandwidth with a buffer of this
    /// many MiB (far past the last-level cache), the decode roofline that tg
    /// is reported against (0 = skip).
    #[arg(
        help_heading = "What to measure",
        long,
        value_name = "MIB",
        default_value_t = 1024
    )]
    pub bandwidth_mib: usize,
    #[command(flatten, next_help_heading = "KV cache")]
    pub kv: crate::cli_args::KvCacheArgs,
}

/// Median, min and max of repeated measurements.
struct Summary {
    median: f64,
    min: f64,
    max: f64,
}

fn summarize(mut xs: Vec<f64>) -> Summary {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let median = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    Summary {
        median,
        min: xs[0],
        max: xs[n - 1],
    }
}

/// Random token ids, as llama-bench uses.
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

fn run_pp(model: &Model, n: usize, seed: u64) -> Result<f64> {
    let tokens = random_tokens(n, model.config.vocab_size, seed);
    let mut state = model.new_state(n + 1);
    let t0 = Instant::now();
    model.forward(&mut state, &tokens, Logits::Last)?;
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// `--batch b`: b sessions (each after a 16-token prefill, not timed) decode
/// `n` tokens each, one batched pass per step; aggregate tok/s.
fn run_batched(model: &Model, b: usize, n: usize, seed: u64) -> Result<f64> {
    use hearth_models::{Backend, BatchItem, Input};
    let vocab = model.config.vocab_size;
    let mut states = Vec::with_capacity(b);
    let mut toks = Vec::with_capacity(b);
    for i in 0..b as u64 {
        let mut st = model.new_state(n + 17);
        model.forward(
            &mut st,
            &random_tokens(16, vocab, seed * 1000 + i),
            Logits::Last,
        )?;
        states.push(st);
        toks.push(random_tokens(n, vocab, seed * 1000 + 500 + i));
    }
    let t0 = Instant::now();
    for step in 0..n {
        let mut items: Vec<BatchItem<'_, _>> = states
            .iter_mut()
            .zip(&toks)
            .map(|(st, t)| BatchItem::new(st, Input::Tokens(&t[step..step + 1]), Logits::Last))
            .collect();
        for r in Backend::forward_batch(model, &mut items, false) {
            r?;
        }
    }
    Ok((b * n) as f64 / t0.elapsed().as_secs_f64())
}

/// Decode of `n` tokens after a (not timed) prefill of `depth` random tokens.
fn run_tg(model: &Model, n: usize, depth: usize, seed: u64) -> Result<f64> {
    let tokens = random_tokens(n, model.config.vocab_size, seed);
    let mut state = model.new_state(depth + n + 1);
    if depth > 0 {
        model.forward(
            &mut state,
            &random_tokens(depth, model.config.vocab_size, seed + 1000),
            Logits::Last,
        )?;
    }
    let t0 = Instant::now();
    for &t in &tokens {
        model.forward(&mut state, &[t], Logits::Last)?;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// The largest state a bench run sizes (the prefill test's, or the deepest
/// decode test's), checked before the model loads.
fn check_size(path: &std::path::Path, args: &Args) -> Result<()> {
    let deepest = args.depth.iter().copied().max().unwrap_or(0);
    let ctx =
        (args.n_prompt.saturating_add(1)).max(deepest.saturating_add(args.n_gen).saturating_add(1));
    let label = format!(
        "-p {} -n {} --depth {deepest} (a context of {ctx})",
        args.n_prompt, args.n_gen
    );
    crate::limits::check_sized(
        path,
        &label,
        ctx,
        1,
        args.device,
        args.kv.for_device(args.device)?,
    )
}

pub fn run(args: Args) -> Result<()> {
    crate::device::check(args.device)?;
    crate::cli_args::note_gpu_layers(args.n_gpu_layers, args.device);
    crate::init_threads(args.threads)?;
    #[cfg(feature = "cuda")]
    if args.device == crate::device::Device::Cuda {
        if args.kernels {
            let gpu = hearth_cuda::Gpu::open().context("--device cuda")?;
            print!("{}", hearth_cuda::kbench::run(&gpu)?);
            return Ok(());
        }
        let path = crate::store::resolve_model(args.model.as_deref())?;
        check_size(&path, &args)?;
        let mut model =
            Model::load_unpacked(&path).with_context(|| format!("loading {}", path.display()))?;
        let kv = args.kv.for_device(args.device)?;
        model
            .set_kv_types(kv)
            .map_err(|e| anyhow::anyhow!("--cache-type-k/-v {kv}: {e}"))?;
        let model = std::sync::Arc::new(model);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut depths = vec![0];
        depths.extend(args.depth.iter().copied().filter(|&d| d > 0));
        let opts = crate::cuda::BenchOpts {
            n_prompt: args.n_prompt,
            n_gen: args.n_gen,
            reps: args.reps.max(1),
            depths,
            roofline: args.roofline,
            graphs: !args.no_graph,
            batch: args.batch.clone(),
        };
        return crate::cuda::bench(model, &name, &opts);
    }
    let threads = rayon::current_num_threads();
    let path = crate::store::resolve_model(args.model.as_deref())?;
    check_size(&path, &args)?;
    let mut model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    let kv = args.kv.types();
    model
        .set_kv_types(kv)
        .map_err(|e| anyhow::anyhow!("--cache-type-k/-v {kv}: {e}"))?;
    let reps = args.reps.max(1);
    // The roofline first, before the model's pages compete for the cache.
    let read = (args.bandwidth_mib > 0 && args.n_gen > 0)
        .then(|| hearth_kernels::cpu::bandwidth::read_bandwidth(args.bandwidth_mib << 20, 5));
    let read_gbps = read.map(|b| b.best / 1e9);
    let measure = |f: &dyn Fn(u64) -> Result<f64>| -> Result<Summary> {
        f(0)?; // warm-up
        Ok(summarize(
            (1..=reps as u64).map(f).collect::<Result<Vec<_>>>()?,
        ))
    };
    let pp = if args.n_prompt > 0 {
        Some(measure(&|s| run_pp(&model, args.n_prompt, s))?)
    } else {
        None
    };
    let tg = if args.n_gen > 0 {
        Some(measure(&|s| run_tg(&model, args.n_gen, 0, s))?)
    } else {
        None
    };
    let mut tg_depth = Vec::new();
    for &d in args.depth.iter().filter(|&&d| d > 0 && args.n_gen > 0) {
        tg_depth.push((d, measure(&|s| run_tg(&model, args.n_gen, d, s))?));
    }
    let mut tg_batch = Vec::new();
    for &b in args.batch.iter().filter(|&&b| b > 0 && args.n_gen > 0) {
        tg_batch.push((b, measure(&|s| run_batched(&model, b, args.n_gen, s))?));
    }
    let weight_gb = model.weight_bytes() as f64 / 1e9;
    let tg_gbps = tg.as_ref().map(|t| t.median * weight_gb);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if args.json {
        let j = serde_json::json!({
            "model": name,
            "threads": threads,
            "pp": pp.as_ref().map(|s| serde_json::json!({"tokens": args.n_prompt, "tok_s": s.median, "min": s.min, "max": s.max})),
            "tg": tg.as_ref().map(|s| serde_json::json!({"tokens": args.n_gen, "tok_s": s.median, "min": s.min, "max": s.max})),
            "tg_gbps": tg_gbps,
            "read_gbps": read_gbps,
            "tg_fraction_of_read": tg_gbps.zip(read_gbps).map(|(t, r)| t / r),
            "tg_depth": tg_depth.iter().map(|(d, s)| serde_json::json!({"depth": d, "tokens": args.n_gen, "tok_s": s.median, "min": s.min, "max": s.max})).collect::<Vec<_>>(),
            "tg_batch": tg_batch.iter().map(|(b, s)| serde_json::json!({"sessions": b, "tokens": args.n_gen, "aggregate_tok_s": s.median, "min": s.min, "max": s.max})).collect::<Vec<_>>(),
            "reps": reps,
            "isa": hearth_kernels::cpu::simd::active().name(),
            "kv_cache": kv.to_string(),
        });
        outln!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    let isa = hearth_kernels::cpu::simd::active().name();
    if let Err(why @ hearth_kernels::cpu::amx::Refusal::NotEnabledByOs)
    | Err(why @ hearth_kernels::cpu::amx::Refusal::PermissionRefused(_)) =
        hearth_kernels::cpu::amx::status()
    {
        outln!("note: this CPU has AMX-INT8 but it is not used: {why}");
    }
    outln!("model: {name} ({weight_gb:.2} GB of weights read per token), threads: {threads}, kernels: {isa}, KV cache: {kv}, reps: {reps} (+1 warm-up)");
    outln!("{:>8} {:>12} {:>12} {:>12}", "test", "tok/s", "min", "max");
    let row = |test: String, s: &Summary| -> Result<()> {
        outln!(
            "{:>8} {:>12.2} {:>12.2} {:>12.2}",
            test,
            s.median,
            s.min,
            s.max
        );
        Ok(())
    };
    if let Some(s) = &pp {
        row(format!("pp{}", args.n_prompt), s)?;
    }
    if let Some(s) = &tg {
        row(format!("tg{}", args.n_gen), s)?;
        let tg_gbps = tg_gbps.unwrap_or(0.0);
        match (read, read_gbps) {
            (Some(b), Some(r)) => outln!(
                "decode weight bandwidth: {tg_gbps:.2} GB/s = {:.0}% of the measured read bandwidth, {r:.2} GB/s ({} threads reading {} MiB, best of {})",
                100.0 * tg_gbps / r,
                b.threads,
                b.bytes >> 20,
                b.passes
            ),
            _ => outln!("decode weight bandwidth: {tg_gbps:.2} GB/s"),
        }
    }
    for (d, s) in &tg_depth {
        row(format!("tg{}@d{d}", args.n_gen), s)?;
    }
    for (b, s) in &tg_batch {
        row(format!("tg{}x{b}", args.n_gen), s)?;
    }
    if !tg_batch.is_empty() {
        outln!("tgNxB: aggregate over B sessions decoding together (one batched pass per step)");
    }
    Ok(())
}
