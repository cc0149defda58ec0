//! Decode attention over an f16 cache (llama.cpp's order), minimum of R
//! repetitions, for comparing builds on noisy machines:
//! `attn_bench DEPTH N_HEADS N_KV_HEADS HEAD_DIM [REPS]` (one thread).
use hearth_kernels::cpu::attention::{attention, AttnShape};
use hearth_kernels::cpu::ggml_order::activations::RefIsa;
use hearth_kernels::cpu::kv_cache::{CacheLayout, KvDtype, KvTypes, LayerKvCache};
use hearth_kernels::RowOrder;
use std::time::Instant;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let (depth, nh, nkv, hd) = (a[0], a[1], a[2], a[3]);
    let reps = a.get(4).copied().unwrap_or(50);
    hearth_kernels::pool::init_global(1);
    let types = KvTypes {
        k: KvDtype::F16,
        v: KvDtype::F16,
    };
    let mut cache = LayerKvCache::new(CacheLayout::Flat, types, nkv, hd, depth + 1);
    let val = |i: usize, m: usize| (((i * m) % 1999) as f32 / 1999.0 - 0.5) * 2.0;
    let round = |x: f32| half::f16::from_f32(x).to_f32();
    for p in 0..depth {
        let k: Vec<f32> = (0..nkv * hd)
            .map(|i| round(val(p * nkv * hd + i, 7919)))
            .collect();
        let v: Vec<f32> = (0..nkv * hd)
            .map(|i| round(val(p * nkv * hd + i, 104_729)))
            .collect();
        cache.write(p, &k, &v);
    }
    let q: Vec<f32> = (0..nh * hd).map(|i| val(i, 31)).collect();
    let kn: Vec<f32> = (0..nkv * hd).map(|i| round(val(i, 17))).collect();
    let vn: Vec<f32> = (0..nkv * hd).map(|i| round(val(i, 13))).collect();
    let s = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        isa: RefIsa::Avx512,
    };
    let mut out = vec![0.0f32; nh * hd];
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        attention(&q, &kn, &vn, &cache, depth, s, RowOrder::Batched, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let check: f64 = out.iter().map(|&x| x as f64).sum();
    println!(
        "depth {depth} heads {nh}/{nkv} hd {hd}: best {:.1} us (checksum {check:.6})",
        best * 1e6
    );
}
