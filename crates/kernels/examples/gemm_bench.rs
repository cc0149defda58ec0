use hearth_gguf::GgmlType;
use hearth_kernels::cpu::gemm::{gemm, BMatrix};
use hearth_kernels::cpu::interleaved::{matmul_packed, PackedMatrix};
use hearth_kernels::cpu::simd::active;
use hearth_kernels::pool::ThreadPool;
use hearth_kernels::{quantize_to_vec, QMatrix, RowOrder};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let m: usize = args.get(1).map_or(1024, |s| s.parse().unwrap());
    let n: usize = args.get(2).map_or(8960, |s| s.parse().unwrap());
    let k: usize = args.get(3).map_or(1536, |s| s.parse().unwrap());
    let threads: usize = args.get(4).map_or(2, |s| s.parse().unwrap());
    hearth_kernels::pool::init_global(threads);
    let pool = ThreadPool::new(threads);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let bytes = quantize_to_vec(ty, &w).unwrap();
        let q = QMatrix {
            ty,
            rows: n,
            cols: k,
            data: &bytes,
        };
        let mut c = vec![0f32; m * n];
        // Best of `reps` (a shared machine's noise is one-sided).
        let reps: usize = std::env::var("REPS").map_or(2, |s| s.parse().unwrap());
        let mut s = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            gemm(&pool, &a, k, m, k, BMatrix::Quant(q), n, &mut c, n, false);
            s = s.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{ty} f32 gemm: {m}x{n}x{k}: {:.1} ms, {:.1} GFLOP/s",
            s * 1e3,
            2.0 * (m * n * k) as f64 / s / 1e9
        );
        if let Some(pm) = PackedMatrix::pack(&q) {
            let t = Instant::now();
            for _ in 0..reps {
                matmul_packed(active(), &pm, &q, &a, m, &mut c, RowOrder::Batched);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{ty} packed:   {m}x{n}x{k}: {:.1} ms, {:.1} GFLOP/s",
                s * 1e3,
                2.0 * (m * n * k) as f64 / s / 1e9
            );
        }
    }
}
