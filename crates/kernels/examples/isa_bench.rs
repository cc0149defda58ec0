//! Packed matmul speed per instruction set, alternating within one process
//! (minimum of R repetitions each), for shared noisy machines:
//! `isa_bench TOKENS ROWS COLS THREADS [REPS]`.
use hearth_gguf::GgmlType;
use hearth_kernels::cpu::interleaved::{matmul_packed, PackedMatrix};
use hearth_kernels::cpu::simd::Isa;
use hearth_kernels::{quantize_to_vec, QMatrix, RowOrder};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let (m, n, k, threads) = (args[0], args[1], args[2], args[3]);
    let reps = args.get(4).copied().unwrap_or(10);
    hearth_kernels::pool::init_global(threads);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let types: Vec<GgmlType> = match std::env::var("TYPES") {
        Ok(t) => t
            .split(',')
            .map(|n| match n {
                "Q4_K" => GgmlType::Q4_K,
                "Q6_K" => GgmlType::Q6_K,
                "Q5_0" => GgmlType::Q5_0,
                _ => GgmlType::Q8_0,
            })
            .collect(),
        Err(_) => vec![GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0],
    };
    for ty in types {
        // Types without a quantizer here (Q5_0): pseudo-random quants, a small f16 scale first.
        let bytes = quantize_to_vec(ty, &w).unwrap_or_else(|_| {
            let mut b: Vec<u8> = (0..n * k / ty.block_size() * ty.type_size())
                .map(|i| ((i * 2654435761usize) >> 7) as u8)
                .collect();
            for blk in b.chunks_exact_mut(ty.type_size()) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
            b
        });
        let q = QMatrix {
            ty,
            rows: n,
            cols: k,
            data: &bytes,
        };
        let pm = PackedMatrix::pack(&q).unwrap();
        let only = std::env::var("ISAS").ok();
        let isas: Vec<Isa> = Isa::available()
            .into_iter()
            .filter(|&i| {
                i != Isa::Scalar
                    && only
                        .as_deref()
                        .is_none_or(|o| o.split(',').any(|n| n == i.name()))
            })
            .collect();
        let mut best = vec![f64::MAX; isas.len()];
        let mut c = vec![0f32; m * n];
        for _ in 0..reps {
            for (i, &isa) in isas.iter().enumerate() {
                let t = Instant::now();
                matmul_packed(isa, &pm, &q, &a, m, &mut c, RowOrder::Batched);
                best[i] = best[i].min(t.elapsed().as_secs_f64());
            }
        }
        for (i, isa) in isas.iter().enumerate() {
            println!(
                "{ty} {:>7} {m}x{n}x{k}: {:7.2} ms {:7.1} GFLOP/s",
                isa.name(),
                best[i] * 1e3,
                2.0 * (m * n * k) as f64 / best[i] / 1e9
            );
        }
    }
}
