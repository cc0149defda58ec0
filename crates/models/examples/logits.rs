//! Developer tool: last-position top-5 logits of raw token ids, in both numerics.
//! `cargo run --release -p hearth-models --example logits -- MODEL.gguf 1,2,3`
//! With `HEARTH_DUMP=DIR`, every intermediate of the pass is written to DIR
//! (named like llama.cpp's graph tensors; see `Model::set_dump_dir`).

use hearth_models::{Logits, Model, Numerics};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ids: Vec<u32> = args[2]
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    // With HEARTH_DUMP set, run only the Reference numerics so the dumped
    // intermediates are llama.cpp-comparable (not overwritten by the F32 run).
    let all = [Numerics::Reference, Numerics::F32];
    let dump = std::env::var_os("HEARTH_DUMP").map(std::path::PathBuf::from);
    let runs = if dump.is_some() { &all[..1] } else { &all[..] };
    for &numerics in runs {
        let mut model = Model::load(&args[1]).expect("load");
        model.set_numerics(numerics);
        // HEARTH_KV=q8_0 (or q4_0; or K,V such as q8_0,f16): the KV cache types.
        if let Ok(spec) = std::env::var("HEARTH_KV") {
            let mut types = spec
                .split(',')
                .map(|t| hearth_models::KvDtype::parse(t).expect("HEARTH_KV: f16, q8_0 or q4_0"));
            let k = types.next().expect("HEARTH_KV");
            let v = types.next().unwrap_or(k);
            model.set_kv_types(hearth_models::KvTypes { k, v }).unwrap();
        }
        if std::env::var("HEARTH_REF_ISA").as_deref() == Ok("avx2") {
            model.ref_isa = hearth_models::RefIsa::Avx2;
        }
        model.set_dump_dir(dump.clone());
        let mut st = model.new_state(4096);
        let logits = model.forward(&mut st, &ids, Logits::Last).unwrap();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top: Vec<String> = order[..8]
            .iter()
            .map(|&i| format!("{i}:{:.4}", logits[i]))
            .collect();
        println!("{numerics:?}: {}", top.join(" "));
    }
}
