use super::quant_path::{dot_q4_0, dot_q8_0};
use super::tiled_path::{tiled_rows_in, BatchHead};
use super::*;

/// The AVX-512 tile (where this machine has it) gives the generic tile's
/// outputs bit for bit: head dims 64/128/256, partial last tiles, rows
/// with sliding windows that skip whole tiles, an odd row count.
#[test]
fn avx512_tile_equals_the_generic_tile() {
    let mut seed = 777u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for (hd, n, n_rows) in [(64, 100, 7), (128, 193, 12), (256, 130, 9)] {
        let f16v = |x: f32| f16::from_f32(x).to_f32();
        let k: Vec<f32> = (0..n * hd).map(|_| f16v(next() * 3.0)).collect();
        let v: Vec<f32> = (0..n * hd).map(|_| f16v(next())).collect();
        let q: Vec<f32> = (0..n_rows * hd).map(|_| next() * 2.0).collect();
        let src = BatchHead {
            k: &k,
            v: &v,
            n,
            width: hd,
            head: 0,
            hd,
        };
        let rows: Vec<(&[f32], usize, usize)> = (0..n_rows)
            .map(|r| {
                let qpos = n - 1 - 7 * r;
                // Every third row a window that starts past the first tiles.
                let lo = if r % 3 == 1 {
                    qpos.saturating_sub(70)
                } else {
                    0
                };
                (&q[r * hd..(r + 1) * hd], qpos, lo)
            })
            .collect();
        for scale in [0.125f32, 1.0 / (hd as f32).sqrt()] {
            let want = tiled_rows_in(&rows, &src, scale, RefIsa::Avx512, false);
            let got = tiled_rows_in(&rows, &src, scale, RefIsa::Avx512, true);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "hd {hd} [{i}]: {g} vs {w}");
            }
        }
    }
}
use crate::cpu::ggml_order::vec_dot::{vec_dot_q4_0_q8_0_x86, vec_dot_q8_0_q8_0_x86};
use crate::quant::blocks::F16Le;

/// The AVX2 dot products are the x86-order references bit for bit, on
/// blocks with extreme quants (±127, -128 activations excluded as
/// llama.cpp's quantizer never makes them) and varied scales.
#[test]
fn simd_dots_equal_the_x86_order_references() {
    let mut seed = 12345u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    for n in [1usize, 2, 4, 8] {
        for _ in 0..200 {
            let q8 = |next: &mut dyn FnMut() -> u32| BlockQ8_0 {
                d: F16Le::from_f32((next() % 1000) as f32 * 1e-4 + 1e-5),
                qs: std::array::from_fn(|_| ((next() % 255) as i32 - 127) as i8),
            };
            let x: Vec<BlockQ8_0> = (0..n).map(|_| q8(&mut next)).collect();
            let y: Vec<BlockQ8_0> = (0..n).map(|_| q8(&mut next)).collect();
            let x4: Vec<BlockQ4_0> = (0..n)
                .map(|_| BlockQ4_0 {
                    d: F16Le::from_f32((next() % 1000) as f32 * -1e-3),
                    qs: std::array::from_fn(|_| next() as u8),
                })
                .collect();
            assert_eq!(
                dot_q8_0(&x, &y).to_bits(),
                vec_dot_q8_0_q8_0_x86(&x, &y).to_bits()
            );
            assert_eq!(
                dot_q4_0(&x4, &y).to_bits(),
                vec_dot_q4_0_q8_0_x86(&x4, &y).to_bits()
            );
        }
    }
}
