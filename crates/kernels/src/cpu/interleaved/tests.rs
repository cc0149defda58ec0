use super::*;
use crate::cpu::matmul::{matmul, Activations};
use crate::quant::quantize;
use rand::{Rng, SeedableRng};

/// Quants at their extremes (every byte 0xFF, 0x80 or 0x7F, with small
/// finite scales) against activations that quantize to -128 or 127: the
/// narrow partial sums (16-bit on AVX2) must not saturate.
#[test]
fn extreme_quants_match_the_reference() {
    use GgmlType::*;
    // Byte offsets of each type's f16 fields.
    let halves: [(GgmlType, &[usize]); 6] = [
        (Q8_0, &[0]),
        (Q4_0, &[0]),
        (Q5_0, &[0]),
        (Q4_1, &[0, 2]),
        (Q4_K, &[0, 2]),
        (Q6_K, &[208]),
    ];
    for (ty, fields) in halves {
        for fill in [0xffu8, 0x80, 0x7f] {
            let (rows, cols) = (16, 2 * ty.block_size());
            let mut wq = vec![fill; rows * cols / ty.block_size() * ty.type_size()];
            for blk in wq.chunks_exact_mut(ty.type_size()) {
                for &o in fields {
                    blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.0078125).to_le_bytes());
                }
            }
            let m = QMatrix {
                ty,
                rows,
                cols,
                data: &wq,
            };
            let pm = PackedMatrix::pack(&m).unwrap();
            for (n, x) in [(4, -1.0f32), (8, 1.0), (5, -1.0), (16, -1.0), (37, 1.0)] {
                let x = vec![x; n * cols];
                assert_packed_bits(&m, &pm, &x, n, &format!("{ty} fill {fill:#x} n {n}"));
            }
        }
    }
}

/// Every available ISA's packed product of `n` rows of `x` equals the
/// reference `matmul` (llama.cpp's x86 order) bit for bit.
fn assert_packed_bits(m: &QMatrix, pm: &PackedMatrix, x: &[f32], n: usize, what: &str) {
    let mut want = vec![0.0; n * m.rows];
    matmul(
        m,
        x,
        n,
        &mut want,
        Activations::Quantized,
        RowOrder::Batched,
    );
    for isa in Isa::available() {
        let mut got = vec![f32::NAN; n * m.rows];
        matmul_packed(isa, pm, m, x, n, &mut got, RowOrder::Batched);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what} {} [{i}]: {g} vs {w}",
                isa.name()
            );
        }
    }
}

fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
    let wf: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(-1.0f32..1.0) * rng.gen_range(0.0f32..2.0))
        .collect();
    let mut wq = vec![0u8; rows * cols / ty.block_size() * ty.type_size()];
    if quantize(ty, &wf, &mut wq).is_err() {
        // No quantizer for this type here: random quants with small f16 scales.
        for blk in wq.chunks_exact_mut(ty.type_size()) {
            blk.iter_mut().for_each(|v| *v = rng.gen());
            let scale = half::f16::from_f32(rng.gen_range(0.001f32..0.02)).to_le_bytes();
            blk[..2].copy_from_slice(&scale);
            if ty == GgmlType::Q4_1 {
                let m = half::f16::from_f32(rng.gen_range(-0.1f32..0.1)).to_le_bytes();
                blk[2..4].copy_from_slice(&m);
            }
        }
    }
    wq
}

/// In the invariant order every row of a multi-row matmul equals the
/// one-row matmul of that row, bit for bit (speculative verify passes), for
/// every packed type, every block size a verify pass takes (the 4-token
/// blocks and the 1-3 token tails, each one pass over the weights) and
/// every instruction set this machine has, while the default batched orders
/// do differ somewhere.
#[test]
fn batch_invariant_rows_equal_single_rows() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    let mut differed = false;
    let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon]
        .into_iter()
        .filter(|i| i.supported())
        .collect();
    for (ty, isa) in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
    ]
    .into_iter()
    .flat_map(|ty| isas.iter().map(move |&isa| (ty, isa)))
    {
        let (rows, cols) = (16, 4 * 256);
        let wq = random_matrix(ty, rows, cols, &mut rng);
        let m = QMatrix {
            ty,
            rows,
            cols,
            data: &wq,
        };
        let pm = PackedMatrix::pack(&m).unwrap();
        for n in [2, 3, 4, 5, 6, 7, 9, 16] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut single = vec![0.0f32; n * rows];
            for t in 0..n {
                matmul_packed(
                    isa,
                    &pm,
                    &m,
                    &x[t * cols..(t + 1) * cols],
                    1,
                    &mut single[t * rows..(t + 1) * rows],
                    RowOrder::Batched,
                );
            }
            let (mut inv, mut batched) = (vec![0.0f32; n * rows], vec![0.0f32; n * rows]);
            matmul_packed(isa, &pm, &m, &x, n, &mut inv, RowOrder::Invariant);
            matmul_packed(isa, &pm, &m, &x, n, &mut batched, RowOrder::Batched);
            for (i, (a, b)) in inv.iter().zip(&single).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{ty} {} n {n} [{i}]", isa.name());
            }
            differed |= batched
                .iter()
                .zip(&single)
                .any(|(a, b)| a.to_bits() != b.to_bits());
        }
    }
    assert!(
        differed,
        "the batched orders should differ from one-row products somewhere"
    );
}

/// The fused gate/up pass gives exactly the two separate products, combined.
#[test]
fn glu_pair_matches_separate_matmuls() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    for ty in [GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q4_1] {
        let (rows, cols) = (24, 2 * ty.block_size().max(256));
        let (wa, wb) = (
            random_matrix(ty, rows, cols, &mut rng),
            random_matrix(ty, rows, cols, &mut rng),
        );
        let (a, b) = (
            QMatrix {
                ty,
                rows,
                cols,
                data: &wa,
            },
            QMatrix {
                ty,
                rows,
                cols,
                data: &wb,
            },
        );
        let pair = PackedMatrix::pack_pair(&a, &b).unwrap();
        let (pa, pb) = (
            PackedMatrix::pack(&a).unwrap(),
            PackedMatrix::pack(&b).unwrap(),
        );
        let act1 = |j: usize, g: f32, u: f32| g * (j as f32 + 0.5) - u;
        let act =
            |j: usize, g: &[f32; 8], u: &[f32; 8]| std::array::from_fn(|r| act1(j + r, g[r], u[r]));
        for n in [1, 5, 9, 16, 35] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            for isa in Isa::available() {
                let (mut ga, mut gb, mut fused) = (
                    vec![0.0f32; n * rows],
                    vec![0.0f32; n * rows],
                    vec![0.0f32; n * rows],
                );
                matmul_packed(isa, &pa, &a, &x, n, &mut ga, RowOrder::Batched);
                matmul_packed(isa, &pb, &b, &x, n, &mut gb, RowOrder::Batched);
                matmul_packed_glu(isa, &pair, &x, n, &act, &mut fused, RowOrder::Batched);
                for i in 0..n * rows {
                    let want = act1(i % rows, ga[i], gb[i]);
                    assert_eq!(
                        fused[i].to_bits(),
                        want.to_bits(),
                        "{ty} {} n {n} [{i}]",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Every packed kernel on every instruction set this machine has gives
/// bit-identical results to the per-row reference kernels, for row
/// counts with and without a tail, and token counts that hit every
/// order (gemv, gemm with a gemv remainder, tiled).
#[test]
fn packed_matches_reference_bit_for_bit() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    for ty in types {
        for (rows, blocks) in [(8, 1), (16, 3), (21, 2), (40, 5)] {
            let cols = blocks * ty.block_size();
            let wq = random_matrix(ty, rows, cols, &mut rng);
            let m = QMatrix {
                ty,
                rows,
                cols,
                data: &wq,
            };
            let Some(pm) = PackedMatrix::pack(&m) else {
                assert!(
                    ty == GgmlType::Q4_K && rows % 8 != 0,
                    "{ty} {rows} should pack"
                );
                continue;
            };
            for n in [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 21, 37] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| {
                        if i % 97 == 5 {
                            0.0
                        } else {
                            rng.gen_range(-3.0f32..3.0)
                        }
                    })
                    .collect();
                let what = format!("{ty} rows {rows} blocks {blocks} n {n}");
                assert_packed_bits(&m, &pm, &x, n, &what);
            }
        }
    }
}
