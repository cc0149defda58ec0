//! What the GPU tests share: device buffers, random weights, the error
//! measure, and synthetic model pairs compared logit by logit.

use std::sync::Arc;

use half::{bf16, f16};
use hearth_cuda::driver::{DevBuf, Gpu};
use hearth_cuda::ops::{self, GpuMatrix, Q8};
use hearth_cuda::repack::{split_blocks, split_sizes, WeightKind};
use hearth_cuda::GpuModel;
use hearth_gguf::GgmlType;
use hearth_models::synth::{write_gguf_file, SynthPlan, SynthShape};
use hearth_models::{Architecture, Logits, Model, Numerics};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn gpu() -> Arc<Gpu> {
    Arc::new(Gpu::open().unwrap_or_else(|e| panic!("{e}")))
}

pub fn nrmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += (g as f64 - w) * (g as f64 - w);
        den += w * w;
    }
    (num / den.max(1e-300)).sqrt()
}

pub fn upload_f32(g: &Gpu, v: &[f32]) -> DevBuf {
    let b = g.alloc(v.len() * 4, "test").unwrap();
    g.upload(b.ptr, v).unwrap();
    b
}

pub fn download_f32(g: &Gpu, b: &DevBuf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    g.download(&mut out, b.ptr).unwrap();
    out
}

/// Random GGUF blocks of `ty` for a [rows, cols] matrix: random quant bits,
/// and f16 scales set to finite values of a realistic size.
pub fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| rng.gen_range(-1.0f32..1.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes())
            .collect(),
        _ => {
            let (bs, bb) = (ty.block_size(), ty.type_size());
            let mut bytes: Vec<u8> = (0..n / bs * bb).map(|_| rng.gen()).collect();
            let scale_fields: &[usize] = match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                _ => &[0],
            };
            for blk in bytes.chunks_exact_mut(bb) {
                for &o in scale_fields {
                    let v = f16::from_f32(rng.gen_range(0.001f32..0.02));
                    blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            bytes
        }
    }
}

pub fn upload_matrix(
    g: &Gpu,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &[u8],
) -> (GpuMatrix, DevBuf, DevBuf) {
    let kind = WeightKind::of(ty).unwrap();
    let n_blocks = rows * cols / kind.block().0;
    let (nb, ns) = split_sizes(kind, n_blocks);
    let (mut body, mut scales) = (vec![0u8; nb], vec![0u8; ns]);
    split_blocks(kind, data, &mut body, &mut scales);
    let bb = g.alloc(nb, "test").unwrap();
    g.upload(bb.ptr, &body).unwrap();
    let sb = g.alloc(ns, "test").unwrap();
    g.upload(sb.ptr, &scales).unwrap();
    let m = GpuMatrix {
        kind,
        rows,
        cols,
        body: bb.ptr,
        scales: if ns > 0 { sb.ptr } else { 0 },
        tune: Default::default(),
        scale: None,
    };
    (m, bb, sb)
}

/// `x` ([t, k]) on the device, quantized by the kernels' `quantize_q8`; the
/// buffers (kept alive by the caller) and their 8-bit view.
pub fn quantized_on_device(g: &Gpu, x: &[f32]) -> (Q8, [DevBuf; 4]) {
    let n = x.len();
    let xb = upload_f32(g, x);
    let aq = g.alloc(n, "t").unwrap();
    let ad = g.alloc(n / 32 * 4, "t").unwrap();
    let as_ = g.alloc(n / 32 * 4, "t").unwrap();
    let a8 = Q8 {
        q: aq.ptr,
        d: ad.ptr,
        s: as_.ptr,
    };
    ops::quantize_q8(g, xb.ptr, a8, n).unwrap();
    (a8, [xb, aq, ad, as_])
}

/// The activation quantization the kernels apply, written independently:
/// per 32 values d = amax/127, q = round(x/d) (halves away from zero).
pub fn q8_reference(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (blk, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(32)) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (v, o) in blk.iter().zip(o) {
            *o = (v * id).round() * d;
        }
    }
    out
}

pub const TYPES: [GgmlType; 9] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// The model twice: with its reference numerics (the CPU backend as shipped)
/// and with exact f32 numerics (no 8-bit rounding anywhere).
pub fn synth_models(shape: SynthShape, seed: u64) -> (Arc<Model>, Model) {
    plan_models(SynthPlan::new(&shape).unwrap(), seed)
}

pub fn plan_models(plan: SynthPlan, seed: u64) -> (Arc<Model>, Model) {
    let shape = plan.shape.clone();
    let path = std::env::temp_dir().join(format!(
        "hearth-cuda-test-{}-{seed}-{}.gguf",
        shape.arch.gguf_name(),
        std::process::id()
    ));
    write_gguf_file(&plan, seed, &path).unwrap();
    let m = Model::load(&path).unwrap();
    let mut exact = Model::load(&path).unwrap();
    exact.set_numerics(Numerics::F32);
    let _ = std::fs::remove_file(&path);
    (Arc::new(m), exact)
}

/// Runs the same token sequence through the CPU and CUDA backends: a prefill
/// block (tensor-core GEMM path), single decode tokens (graph replay), and a
/// 5-token block (the small-block GEMV path), comparing every logits row.
///
/// Bit-exact agreement is not expected: the backends round at different
/// points (the GPU quantizes activations to 8 bits per 32 values for its
/// GEMV, or to f16/bf16 for its GEMM; the CPU to 8 bits per 256 for
/// llama-family models, or not at all for Muse Glimmer). How far apart two
/// valid roundings land depends on the model, so the bound is measured on
/// the model itself: the CPU's reference numerics against its exact-f32
/// numerics. The GPU must stay within twice that distance of the CPU
/// reference, on every row.
pub fn compare_model(name: &str, model: Arc<Model>, exact: Model) {
    let g = gpu();
    let gm = GpuModel::upload(g, model.clone(), false).unwrap();
    let vocab = model.config.vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let tokens: Vec<u32> = (0..580).map(|_| rng.gen_range(0..vocab as u32)).collect();
    // Longer than a GPU ring (window + 512 slots), so sliding layers wrap.
    let ctx = 1024;
    let mut cs = model.new_state(ctx);
    let mut es = exact.new_state(ctx);
    let mut gs = gm.new_state(ctx).unwrap();
    let steps: Vec<(&[u32], Logits)> = vec![
        (&tokens[..40], Logits::All),
        (&tokens[40..560], Logits::Last),
        (&tokens[560..561], Logits::Last),
        (&tokens[561..562], Logits::Last),
        (&tokens[562..563], Logits::Last),
        (&tokens[563..568], Logits::All),
        (&tokens[568..569], Logits::Last),
        (&tokens[569..580], Logits::Last),
    ];
    let (mut worst_gpu, mut worst_gpu_exact, mut spread, mut rows, mut agree) =
        (0.0f64, 0.0f64, 0.0f64, 0usize, 0usize);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (j, &x)| if x > b.1 { (j, x) } else { b },
            )
            .0
    };
    for (i, (toks, want)) in steps.iter().enumerate() {
        let c = model.forward(&mut cs, toks, *want).unwrap();
        let e = exact.forward(&mut es, toks, *want).unwrap();
        let gpu_logits = gm.forward(&mut gs, toks, *want).unwrap();
        assert_eq!(c.len(), gpu_logits.len());
        let n_rows = c.len() / vocab;
        for r in 0..n_rows {
            let (cr, er, gr) = (
                &c[r * vocab..][..vocab],
                &e[r * vocab..][..vocab],
                &gpu_logits[r * vocab..][..vocab],
            );
            let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let (e_gpu, e_gpu_exact, e_cpu) = (
                nrmse(gr, &to64(cr)),
                nrmse(gr, &to64(er)),
                nrmse(cr, &to64(er)),
            );
            agree += (argmax(cr) == argmax(gr)) as usize;
            rows += 1;
            worst_gpu = worst_gpu.max(e_gpu);
            worst_gpu_exact = worst_gpu_exact.max(e_gpu_exact);
            spread = spread.max(e_cpu);
            if r == 0 || r + 1 == n_rows {
                println!(
                    "{name} step {i} ({} tokens, row {r}): nrmse gpu-cpu {e_gpu:.2e}, gpu-exact {e_gpu_exact:.2e}, cpu-exact {e_cpu:.2e}; argmax cpu {} gpu {}",
                    toks.len(),
                    argmax(cr),
                    argmax(gr)
                );
            }
        }
    }
    println!(
        "{name}: {rows} logits rows; worst nrmse gpu vs cpu {worst_gpu:.2e} (bound 2 x {spread:.2e}), gpu vs exact f32 {worst_gpu_exact:.2e}; argmax agreement {agree}/{rows}"
    );
    assert!(
        worst_gpu < 2.0 * spread,
        "{name}: worst nrmse {worst_gpu} vs bound {}",
        2.0 * spread
    );
    assert_eq!(gs.pos, cs.pos);
}

/// The synthetic qwen2 shape of the whole-model GPU tests (GQA 8/2, 4 layers).
pub fn small_qwen2() -> SynthShape {
    SynthShape {
        n_layers: 4,
        dim: 512,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        ffn_dim: 1536,
        vocab_size: 1000,
        ..SynthShape::small(Architecture::Qwen2)
    }
}

pub fn small_gemma3() -> SynthShape {
    SynthShape {
        n_layers: 7,
        dim: 512,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        ffn_dim: 1536,
        vocab_size: 1000,
        window: 16,
        ..SynthShape::small(Architecture::Gemma3)
    }
}

pub fn muse_shape() -> SynthShape {
    SynthShape {
        n_layers: 8,
        dim: 512,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        ffn_dim: 1536,
        vocab_size: 1000,
        window: 16,
        ..SynthShape::small(Architecture::MuseGlimmer)
    }
}

/// Synthetic models whose CPU and GPU states keep a KV cache of `types`;
/// the exact model keeps its own f32 cache (the distance it sets includes
/// the cache's quantization).
pub fn synth_models_kv(
    shape: SynthShape,
    seed: u64,
    types: hearth_models::KvTypes,
) -> (Arc<Model>, Model) {
    let (m, exact) = synth_models(shape, seed);
    let mut m = Arc::try_unwrap(m).ok().expect("one owner");
    m.set_kv_types(types).unwrap();
    (Arc::new(m), exact)
}
