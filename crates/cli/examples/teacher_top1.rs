//! Agreement with another runtime's greedy continuations, on any backend.
//!
//!   teacher_top1 MODEL.gguf DUMP.json [cpu|cuda] [GREEDY_N=64]
//!
//! DUMP.json is `scripts/reference/teacher_dump.cpp`'s output: prompts as token ids and
//! the reference's greedy continuation of each. For every prompt this runs
//!
//! - teacher forcing: the prompt plus the reference's continuation in one
//!   forward pass with every position's logits; at each continuation position
//!   hearth's top-1 is compared with the token the reference chose there;
//! - greedy decoding from the prompt alone, one token per pass, for
//!   GREEDY_N tokens, compared with the first GREEDY_N reference tokens.
//!
//! It prints one line per prompt and the totals, and exits non-zero only on
//! errors (the numbers are the result; bench/cuda/scripts/real-model-agreement.sh
//! judges them).

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hearth_engine::sampler::argmax;
use hearth_models::{Backend, Logits, Model};

fn ids(v: &serde_json::Value) -> Result<Vec<u32>> {
    v.as_array()
        .context("expected an array of token ids")?
        .iter()
        .map(|x| x.as_u64().map(|x| x as u32).context("token id"))
        .collect()
}

/// Teacher-forced agreements and greedy matches for every prompt.
fn compare<B: Backend>(backend: &B, dump: &serde_json::Value, greedy_n: usize) -> Result<()> {
    let vocab = backend.config().vocab_size;
    let (mut agree, mut total, mut greedy_same) = (0usize, 0usize, 0usize);
    let prompts = dump["prompts"].as_array().context("prompts")?;
    for (p, case) in prompts.iter().enumerate() {
        let prompt = ids(&case["prompt_ids"])?;
        let want = ids(&case["greedy_ids"])?;
        if want.is_empty() {
            bail!("prompt {p}: no reference continuation");
        }
        // Teacher forcing: rows prompt.len() - 1 .. predict want[0..].
        let mut seq = prompt.clone();
        seq.extend_from_slice(&want[..want.len() - 1]);
        let mut state = backend.new_state(seq.len() + 8, 0)?;
        let logits = backend.forward(&mut state, &seq, Logits::All)?;
        let top1: Vec<u32> = (prompt.len() - 1..seq.len())
            .map(|r| argmax(&logits[r * vocab..(r + 1) * vocab]))
            .collect();
        let same = top1.iter().zip(&want).filter(|(a, b)| a == b).count();
        let first_diff = top1.iter().zip(&want).position(|(a, b)| a != b);

        // Greedy from the prompt, one token per pass.
        let n = greedy_n.min(want.len());
        let mut state = backend.new_state(prompt.len() + n + 8, 0)?;
        let mut logits = backend.forward(&mut state, &prompt, Logits::Last)?;
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            let next = argmax(&logits);
            got.push(next);
            if got.len() < n {
                logits = backend.forward(&mut state, &[next], Logits::Last)?;
            }
        }
        let greedy_ok = got == want[..n];
        let greedy_at = got.iter().zip(&want).position(|(a, b)| a != b);
        println!(
            "prompt {p}: {} prompt tokens; teacher-forced top-1 {same}/{} ({:.2}%){}; greedy {n}: {}",
            prompt.len(),
            want.len(),
            100.0 * same as f64 / want.len() as f64,
            first_diff.map_or(String::new(), |i| format!(", first difference at {i}")),
            match greedy_at {
                None => "identical".to_string(),
                Some(i) => format!("differs from token {i}"),
            }
        );
        agree += same;
        total += want.len();
        greedy_same += greedy_ok as usize;
    }
    println!(
        "total: teacher-forced top-1 agreement {agree}/{total} = {:.2}%; greedy {greedy_n}-token continuations identical on {greedy_same} of {}",
        100.0 * agree as f64 / total as f64,
        prompts.len()
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        bail!("usage: teacher_top1 MODEL.gguf DUMP.json [cpu|cuda] [GREEDY_N]");
    }
    let dump: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&args[2]).with_context(|| format!("reading {}", args[2]))?,
    )
    .context("parsing the dump")?;
    let device = args.get(3).map_or("cpu", String::as_str);
    let greedy_n = args
        .get(4)
        .map_or(Ok(64), |s| s.parse())
        .context("GREEDY_N")?;
    match device {
        "cpu" => {
            // Numerics of the llama.cpp build native to this CPU (RefIsa::native).
            let model = Model::load(std::path::Path::new(&args[1])).context("loading the model")?;
            compare(&model, &dump, greedy_n)
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            let model = Arc::new(
                Model::load_unpacked(std::path::Path::new(&args[1]))
                    .context("loading the model")?,
            );
            let gpu = Arc::new(hearth_cuda::Gpu::open().context("opening the GPU")?);
            let gm = hearth_cuda::GpuModel::upload(gpu, model, false).context("uploading")?;
            compare(&gm, &dump, greedy_n)
        }
        other => bail!("unknown device {other} (cpu or cuda)"),
    }
}
