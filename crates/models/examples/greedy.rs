//! Developer tool: greedy continuation of raw token ids.
//! `cargo run --release -p hearth-models --example greedy -- MODEL.gguf 1,2,3 16`

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = hearth_models::Model::load(&args[1]).expect("load");
    let ids: Vec<u32> = args[2]
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let n: usize = args[3].parse().unwrap();
    let mut st = model.new_state(4096);
    let t0 = std::time::Instant::now();
    let mut logits = model
        .forward(&mut st, &ids, hearth_models::Logits::Last)
        .unwrap();
    eprintln!("prefill {} tokens in {:?}", ids.len(), t0.elapsed());
    let mut out = Vec::new();
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let next = logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32;
        out.push(next);
        logits = model
            .forward(&mut st, &[next], hearth_models::Logits::Last)
            .unwrap();
    }
    eprintln!("decode {n} tokens in {:?}", t0.elapsed());
    println!(
        "{}",
        out.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
}
