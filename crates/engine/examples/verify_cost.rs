//! Cost of a target forward pass over n tokens relative to one token (the
//! price of verifying n−1 drafts), at a given context position.
//!
//!   cargo run --release -p hearth-engine --example verify_cost -- MODEL.gguf [POS] [MAX_N]
//!
//! HEARTH_F32=1 measures the exact-f32 numerics instead.

use std::time::Instant;

use hearth_models::{Backend, Logits, Model, State};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: verify_cost MODEL.gguf [POS] [MAX_N]");
    let pos: usize = args.get(2).map_or(256, |s| s.parse().expect("POS"));
    let max_n: usize = args.get(3).map_or(9, |s| s.parse().expect("MAX_N"));
    let mut model = Model::load(path).expect("loading the model");
    if std::env::var_os("HEARTH_F32").is_some() {
        model.set_numerics(hearth_models::Numerics::F32);
    }
    let mut state = State::with_ring_slack(&model, pos + 64, 16);
    let prompt: Vec<u32> = (0..pos as u32).map(|i| 100 + i % 1000).collect();
    model
        .forward(&mut state, &prompt, Logits::None)
        .expect("prefill");
    let reps = 12;
    // Both row orders: llama.cpp's batched one (prefill), and the
    // batch-invariant one a speculative verify pass runs (every row as a
    // one-row decode step computes it).
    let orders = ["batched", "invariant (verify)"];
    let mut base = [0.0f64; 2];
    for n in 1..=max_n {
        let block: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
        let mut line = format!("n={n}:");
        for (k, name) in orders.iter().enumerate() {
            let mut times = Vec::new();
            for _ in 0..reps {
                let t = Instant::now();
                let mut hidden = Vec::new();
                let pass = if k == 0 {
                    <Model as Backend>::forward_tapped
                } else {
                    <Model as Backend>::forward_verify
                };
                pass(&model, &mut state, &block, Logits::All, &[], &mut hidden).expect("forward");
                times.push(t.elapsed().as_secs_f64());
                state.rollback(pos).expect("rollback");
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let med = times[reps / 2];
            if n == 1 {
                base[k] = med;
            }
            line += &format!(
                "  {name} {:.2} ms (x{:.2} of n=1)",
                med * 1e3,
                med / base[k]
            );
        }
        println!("{line}");
    }
}
