//! The CLI's CUDA paths (feature `cuda`): opening the GPU and uploading a
//! model (for `run`, `serve` and a draft model), and `bench --device cuda`.
//! Generation runs through the engine's backend-generic loops.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hearth_cuda::{Gpu, GpuModel, GpuState};
use hearth_models::{LayerKind, Logits, Model};

/// Opens the GPU and copies the model's weights to it (progress bar on stderr).
pub fn load(model: Arc<Model>) -> Result<GpuModel> {
    let gpu = open()?;
    upload(gpu, model)
}

/// Opens the GPU (compiling the kernels on first use); prints what it found.
pub fn open() -> Result<Arc<Gpu>> {
    let t0 = Instant::now();
    let gpu = Arc::new(Gpu::open().context("--device cuda")?);
    let i = &gpu.info;
    eprintln!(
        "cuda: {} (sm_{}{}, {} SMs, {:.1} GiB), driver {}.{}, kernels {} ({:.1} s)",
        i.name,
        i.arch.0,
        i.arch.1,
        i.sm_count,
        i.total_mem as f64 / (1u64 << 30) as f64,
        i.driver_version / 1000,
        i.driver_version % 1000 / 10,
        match gpu.kernels {
            hearth_cuda::compile::Origin::Prebuilt => "shipped for sm_90",
            hearth_cuda::compile::Origin::Cache => "from the cache",
            hearth_cuda::compile::Origin::Compiled => "compiled with NVRTC",
        },
        t0.elapsed().as_secs_f64()
    );
    Ok(gpu)
}

/// Copies `model`'s weights to `gpu` (progress bar and tuning report on stderr).
pub fn upload(gpu: Arc<Gpu>, model: Arc<Model>) -> Result<GpuModel> {
    let t1 = Instant::now();
    let gm = GpuModel::upload(gpu, model, true).context("uploading the weights")?;
    eprintln!(
        "cuda: {:.2} GB of weights resident, GEMV variants tuned ({:.1} s)",
        gm.resident_bytes as f64 / 1e9,
        t1.elapsed().as_secs_f64()
    );
    for line in &gm.tune_report {
        eprintln!("cuda:   gemv {line}");
    }
    Ok(gm)
}

/// Uploads `mm`'s vision tower to `gpu` (next to the text model).
pub fn tower(gpu: Arc<Gpu>, mm: &hearth_vision::MmProj) -> Result<Arc<dyn hearth_vision::Tower>> {
    let t0 = Instant::now();
    let t = hearth_cuda::GpuTower::upload(gpu, mm).context("uploading the vision tower")?;
    eprintln!(
        "cuda: vision tower resident, {:.2} GB ({:.1} s)",
        t.resident_bytes as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(Arc::new(t))
}

/// Where DFlash drafts run next to the target `gm` on its GPU: the draft's
/// weights are uploaded once (at the first session), each session gets its
/// own cache.
pub fn dflash_runners(gm: Arc<GpuModel>) -> Arc<hearth_engine::spec::factory::RunnerMaker> {
    use hearth_cuda::dflash::GpuDraft;
    let uploaded: std::sync::Mutex<Option<Arc<GpuDraft>>> = Default::default();
    Arc::new(move |draft, max_ctx| {
        let mut slot = uploaded
            .lock()
            .map_err(|_| "GPU drafter lock poisoned".to_string())?;
        let weights = match slot.as_ref() {
            Some(w) if Arc::ptr_eq(w.draft(), draft) => w.clone(),
            _ => {
                let w = Arc::new(
                    GpuDraft::upload(gm.clone(), draft.clone()).map_err(|e| e.to_string())?,
                );
                *slot = Some(w.clone());
                w
            }
        };
        let runner = weights.runner(max_ctx).map_err(|e| e.to_string())?;
        Ok(Box::new(runner) as Box<dyn hearth_models::dflash::DraftRunner>)
    })
}

/// Options of `bench --device cuda`.
pub struct BenchOpts {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub reps: usize,
    /// Context depths to decode at (0 = an empty context).
    pub depths: Vec<usize>,
    pub roofline: bool,
    pub graphs: bool,
    /// Sessions decoding together in batched passes (continuous batching).
    pub batch: Vec<usize>,
}

fn median(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let med = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    (med, xs[0], xs[n - 1])
}

/// Bytes of K and V one decode token at position `pos` reads.
fn kv_read_bytes(model: &Model, pos: usize) -> usize {
    let c = &model.config;
    c.layers
        .iter()
        .map(|k| match *k {
            LayerKind::Global { .. } => pos + 1,
            LayerKind::Sliding { window, .. } => (pos + 1).min(window),
        })
        .sum::<usize>()
        * model.kv_types.slot_bytes(c.n_kv_heads, c.head_dim)
}

/// Bytes a full (every layer flat) cache of `ctx` positions of the model's
/// KV types would take.
fn full_kv_bytes(model: &Model, ctx: usize) -> usize {
    let c = &model.config;
    c.n_layers * ctx * model.kv_types.slot_bytes(c.n_kv_heads, c.head_dim)
}

pub fn bench(model: Arc<Model>, name: &str, o: &BenchOpts) -> Result<()> {
    let gm = load(model.clone())?;
    let gpu = gm.device();
    let vocab = model.config.vocab_size as u32;
    let mut rng_seed = 1u64;
    let mut tokens = |n: usize| -> Vec<u32> {
        rng_seed = rng_seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut s = rng_seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % vocab as u64) as u32
            })
            .collect()
    };
    let roof = if o.roofline {
        Some(gpu.copy_bandwidth(4 << 30, 20)?)
    } else {
        None
    };
    let weight_gb = gm.weight_bytes as f64 / 1e9;
    println!("model: {name} ({weight_gb:.2} GB of weights read per token), device: {}, reps: {} (+1 warm-up), graphs: {}", gpu.info.name, o.reps, o.graphs);
    if let Some(r) = roof {
        println!("device copy bandwidth (read + write, 2 x 4 GiB x 20): {r:.0} GB/s");
    }
    println!(
        "{:>14} {:>10} {:>10} {:>10} {:>9} {:>9} {:>11}",
        "test", "tok/s", "min", "max", "GB/s", "of roof", "KV MiB"
    );
    if o.n_prompt > 0 {
        for &depth in &o.depths {
            let mut st = gm.new_state(depth + o.n_prompt + 1)?;
            let mut xs = Vec::new();
            for rep in 0..=o.reps {
                refill(&gm, &mut st, depth, rep)?;
                let toks = tokens(o.n_prompt);
                let t0 = Instant::now();
                gm.forward(&mut st, &toks, Logits::Last)?;
                if rep > 0 {
                    xs.push(o.n_prompt as f64 / t0.elapsed().as_secs_f64());
                }
            }
            let (m, lo, hi) = median(xs);
            let test = if depth > 0 {
                format!("pp{}@d{}", o.n_prompt, depth)
            } else {
                format!("pp{}", o.n_prompt)
            };
            println!(
                "{test:>14} {m:>10.2} {lo:>10.2} {hi:>10.2} {:>9} {:>9} {:>11}",
                "", "", ""
            );
        }
    }
    if o.n_gen > 0 {
        for &depth in &o.depths {
            let ctx = depth + o.n_gen + 1;
            let mut st: GpuState = gm.new_state(ctx)?;
            st.use_graph = o.graphs;
            let mut xs = Vec::new();
            for rep in 0..=o.reps {
                refill(&gm, &mut st, depth, rep)?;
                let toks = tokens(o.n_gen);
                let t0 = Instant::now();
                for &t in &toks {
                    gm.forward(&mut st, &[t], Logits::Last)?;
                }
                if rep > 0 {
                    xs.push(o.n_gen as f64 / t0.elapsed().as_secs_f64());
                }
            }
            if let Some((ops, barriers)) = st.persistent_program() {
                println!(
                    "{:>14} decode steps as one persistent kernel: {ops} operations, {barriers} grid barriers (HEARTH_CUDA_PERSISTENT=0: kernel by kernel)",
                    ""
                );
            }
            let (m, lo, hi) = median(xs);
            let kv_gb = kv_read_bytes(&model, depth + o.n_gen / 2) as f64 / 1e9;
            let gbs = m * (weight_gb + kv_gb);
            let frac = roof
                .map(|r| format!("{:.1}%", 100.0 * gbs / r))
                .unwrap_or_default();
            let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
            println!(
                "{:>14} {m:>10.2} {lo:>10.2} {hi:>10.2} {gbs:>9.0} {frac:>9} {:>11.1}",
                if depth > 0 {
                    format!("tg{}@d{}", o.n_gen, depth)
                } else {
                    format!("tg{}", o.n_gen)
                },
                mib(st.kv_bytes())
            );
            println!(
                "{:>14} KV cache at ctx {ctx}: {:.1} MiB hybrid (GPU rings of window + {} slots) vs {:.1} MiB full; {:.3} GB of KV read per token",
                "",
                mib(st.kv_bytes()),
                hearth_cuda::GPU_CHUNK,
                mib(full_kv_bytes(&model, ctx)),
                kv_gb
            );
            if gpu.profiling() {
                gpu.profile_reset();
                st.reset();
                if depth > 0 {
                    gm.fill_random_context(&mut st, depth, 99)?;
                }
                let toks = tokens(o.n_gen);
                for &t in &toks {
                    gm.forward(&mut st, &[t], Logits::Last)?;
                }
                print_profile(
                    gpu,
                    "decoded token (HEARTH_CUDA_PROFILE, each launch timed alone)",
                    o.n_gen,
                    "token",
                );
            }
        }
    }
    for &b in o.batch.iter().filter(|&&b| b > 0 && o.n_gen > 0) {
        batched_decode(&gm, b, o, &mut tokens)?;
    }
    Ok(())
}

/// `--batch B`: B sessions (each after a 16-token prefill) decode `n_gen`
/// tokens each, one batched pass per step ([`hearth_models::Backend::forward_batch`],
/// ordinary numerics, as `serve` runs them): aggregate and per-session tok/s.
fn batched_decode(
    gm: &GpuModel,
    b: usize,
    o: &BenchOpts,
    tokens: &mut dyn FnMut(usize) -> Vec<u32>,
) -> Result<()> {
    use hearth_models::{Backend, BatchItem, Input};
    let mut states: Vec<GpuState> = (0..b)
        .map(|_| gm.new_state(o.n_gen + 18))
        .collect::<Result<_, _>>()?;
    let mut xs = Vec::new();
    let gpu = gm.device();
    for rep in 0..=o.reps + usize::from(gpu.profiling()) {
        let profile = gpu.profiling() && rep == o.reps + 1;
        for st in states.iter_mut() {
            st.reset();
            gm.forward(st, &tokens(16), Logits::Last)?;
        }
        let toks: Vec<Vec<u32>> = (0..b).map(|_| tokens(o.n_gen)).collect();
        if profile {
            gpu.profile_reset();
        }
        let t0 = Instant::now();
        for step in 0..o.n_gen {
            let mut items: Vec<BatchItem<'_, GpuState>> = states
                .iter_mut()
                .zip(&toks)
                .map(|(st, t)| BatchItem::new(st, Input::Tokens(&t[step..step + 1]), Logits::Last))
                .collect();
            for r in Backend::forward_batch(gm, &mut items, false) {
                r?;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        if profile {
            let what = format!("batched step of {b} (HEARTH_CUDA_PROFILE)");
            print_profile(gpu, &what, o.n_gen, "step");
        } else if rep > 0 {
            xs.push((b * o.n_gen) as f64 / secs);
        }
    }
    let (m, lo, hi) = median(xs);
    println!(
        "{:>14} {m:>10.2} {lo:>10.2} {hi:>10.2}   aggregate over {b} sessions ({:.2} tok/s each)",
        format!("tg{}x{b}", o.n_gen),
        m / b as f64
    );
    Ok(())
}

/// The kernel times recorded over `steps` steps, per step.
fn print_profile(gpu: &Gpu, what: &str, steps: usize, unit: &str) {
    let report = gpu.profile_report();
    let total: f64 = report.iter().map(|r| r.2).sum();
    let per = steps.max(1) as f64;
    println!("{:>14} kernel time per {what}:", "");
    for (k, n, ms) in report {
        println!(
            "{:>14}   {k:24} {:>8.1} launches {:>9.1} us  {:>5.1}%",
            "",
            n as f64 / per,
            1e3 * ms / per,
            100.0 * ms / total
        );
    }
    println!("{:>14}   total {:.1} us per {unit}", "", 1e3 * total / per);
}

/// Starts repetition `rep` of a measurement at `depth`: an empty state, then
/// `depth` positions of random KV (a different fill per repetition).
fn refill(gm: &GpuModel, st: &mut GpuState, depth: usize, rep: usize) -> Result<()> {
    st.reset();
    if depth > 0 {
        gm.fill_random_context(st, depth, rep as u32 + 1)?;
    }
    Ok(())
}
