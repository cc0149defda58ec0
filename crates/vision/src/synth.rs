//! Synthetic mmproj files: llama.cpp's `clip` layout for the Muse Glimmer
//! projector (keys as `conversion/muse_glimmer.py` and `MmprojModel` write
//! them) with seeded random weights, through the same row generator and
//! streaming writer as the text models (`hearth_models::synth`).

use hearth_gguf::{GgmlType, Value, ValueType};
use hearth_models::synth::{Init, SynthError, SynthPlan, SynthShape, TensorPlan};
use hearth_models::Architecture;

/// The dimensions and tensor types of a synthetic tower.
#[derive(Clone, Debug, PartialEq)]
pub struct MmprojShape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ff: usize,
    pub patch_size: usize,
    pub merge: usize,
    /// Side of the position table (and of the attention windows).
    pub pos_side: usize,
    /// Output widths of `mm.0` and `mm.1`.
    pub adapter: [usize; 2],
    /// Output width of `mm.2` (the text model's embedding width).
    pub projection_dim: usize,
    /// `attn_q`, `attn_k`, `attn_out`, `ffn_up`, `mm.*`.
    pub weight_type: GgmlType,
    /// `attn_v`, `ffn_down`.
    pub weight_type_more: GgmlType,
    /// The folded patch embedding: F32, F16 or BF16.
    pub patch_type: GgmlType,
}

/// Names accepted by [`MmprojShape::preset`].
pub const MMPROJ_PRESETS: [&str; 2] = ["muse-glimmer-mmproj", "muse-glimmer-mmproj-tiny"];

impl MmprojShape {
    /// The released tower's shape (spec §1; 50 blocks of width 1536), F16
    /// like llama.cpp's default mmproj conversion.
    pub fn muse_glimmer() -> MmprojShape {
        MmprojShape {
            n_layer: 50,
            n_embd: 1536,
            n_head: 16,
            n_ff: 8960,
            patch_size: 14,
            merge: 2,
            pos_side: 32,
            adapter: [4096, 4096],
            projection_dim: 6656,
            weight_type: GgmlType::F16,
            weight_type_more: GgmlType::F16,
            patch_type: GgmlType::F16,
        }
    }

    /// A tower that encodes in milliseconds: 4 blocks (3 windowed, 1
    /// global), a 4×4 position table so that images past 56×56 px span
    /// several windows, output rows of 576 (SmolLM2-135M's width).
    pub fn tiny() -> MmprojShape {
        MmprojShape {
            n_layer: 4,
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            patch_size: 14,
            merge: 2,
            pos_side: 4,
            adapter: [128, 96],
            projection_dim: 576,
            weight_type: GgmlType::F16,
            weight_type_more: GgmlType::F16,
            patch_type: GgmlType::F16,
        }
    }

    pub fn preset(name: &str) -> Option<MmprojShape> {
        match name {
            "muse-glimmer-mmproj" => Some(Self::muse_glimmer()),
            "muse-glimmer-mmproj-tiny" => Some(Self::tiny()),
            _ => None,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// Checks the shape is one llama.cpp and [`crate::MmProj`] load.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |m: String| Err(SynthError::Shape(m));
        let s = self;
        let dims = [
            s.n_layer,
            s.n_embd,
            s.n_head,
            s.n_ff,
            s.patch_size,
            s.merge,
            s.pos_side,
            s.adapter[0],
            s.adapter[1],
            s.projection_dim,
        ];
        if dims.contains(&0) {
            return bad(format!("zero dimension in {s:?}"));
        }
        if s.n_embd % s.n_head != 0 || s.head_dim() % 4 != 0 {
            return bad(format!(
                "{} heads must split width {} into head_dim a multiple of 4 (2-D RoPE)",
                s.n_head, s.n_embd
            ));
        }
        if !matches!(s.patch_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return bad(format!(
                "patch embedding type {} (F32, F16 or BF16)",
                s.patch_type
            ));
        }
        for (ty, cols) in [
            (s.weight_type, s.n_embd),
            (s.weight_type, s.merge * s.merge * s.n_embd),
            (s.weight_type, s.adapter[0]),
            (s.weight_type, s.adapter[1]),
            (s.weight_type_more, s.n_embd),
            (s.weight_type_more, s.n_ff),
        ] {
            if cols % ty.block_size() != 0 {
                return bad(format!("{ty} rows of {cols} values are not whole blocks"));
            }
        }
        Ok(())
    }
}

/// The plan of a synthetic mmproj (metadata and tensors in file order).
/// The plan's `shape` is descriptive only (the tower's width, blocks, heads,
/// MLP width, and the position-table side as `window`).
pub fn mmproj_plan(s: &MmprojShape) -> Result<SynthPlan, SynthError> {
    s.validate()?;
    let (d, f, p) = (s.n_embd as u64, s.n_ff as u64, s.patch_size as u64);
    let mut t = Vec::new();
    let mut push = |name: String, ty: GgmlType, shape: &[u64], init: Init| {
        t.push(TensorPlan {
            name,
            ty,
            shape: shape.to_vec(),
            init,
        })
    };
    // Linears: rows of std 1/sqrt(fan_in), so outputs keep their inputs' scale.
    let linear = |fan_in: u64| Init::Normal {
        std: 1.0 / (fan_in as f32).sqrt(),
    };
    let gain = Init::Uniform { lo: 0.8, hi: 1.2 };
    let bias = Init::Uniform { lo: -0.1, hi: 0.1 };
    let (wt, wm) = (s.weight_type, s.weight_type_more);
    use GgmlType::F32;

    push(
        "v.patch_embd.weight".into(),
        s.patch_type,
        &[p, p, 3, d],
        linear(3 * p * p),
    );
    let side2 = (s.pos_side * s.pos_side) as u64;
    push(
        "v.position_embd.weight".into(),
        F32,
        &[d, side2],
        Init::Normal { std: 0.5 },
    );
    push("v.pre_ln.weight".into(), F32, &[d], gain);
    push("v.pre_ln.bias".into(), F32, &[d], bias);
    for i in 0..s.n_layer {
        let n = |x: &str| format!("v.blk.{i}.{x}");
        push(n("ln1.weight"), F32, &[d], gain);
        push(n("ln1.bias"), F32, &[d], bias);
        for (name, ty) in [
            ("attn_q", wt),
            ("attn_k", wt),
            ("attn_v", wm),
            ("attn_out", wt),
        ] {
            push(n(&format!("{name}.weight")), ty, &[d, d], linear(d));
            push(n(&format!("{name}.bias")), F32, &[d], bias);
        }
        push(n("ln2.weight"), F32, &[d], gain);
        push(n("ln2.bias"), F32, &[d], bias);
        push(n("ffn_up.weight"), wt, &[d, f], linear(d));
        push(n("ffn_up.bias"), F32, &[f], bias);
        push(n("ffn_down.weight"), wm, &[f, d], linear(f));
        push(n("ffn_down.bias"), F32, &[d], bias);
    }
    push("v.post_ln.weight".into(), F32, &[d], gain);
    push("v.post_ln.bias".into(), F32, &[d], bias);
    let (a0, a1) = (s.adapter[0] as u64, s.adapter[1] as u64);
    let m4 = (s.merge * s.merge) as u64 * d;
    push("mm.0.weight".into(), wt, &[m4, a0], linear(m4));
    push("mm.1.weight".into(), wt, &[a0, a1], linear(a0));
    push(
        "mm.2.weight".into(),
        wt,
        &[a1, s.projection_dim as u64],
        linear(a1),
    );

    let u = |v: usize| Value::U32(v as u32);
    let halves = Value::Array(ValueType::F32, vec![Value::F32(0.5); 3]);
    let m: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String("clip".into())),
        ("general.type".into(), Value::String("mmproj".into())),
        (
            "general.name".into(),
            Value::String(format!(
                "synthetic muse-glimmer mmproj {}L d{} (random weights)",
                s.n_layer, s.n_embd
            )),
        ),
        ("general.file_type".into(), Value::U32(1)),
        ("clip.has_vision_encoder".into(), Value::Bool(true)),
        (
            "clip.projector_type".into(),
            Value::String(crate::PROJECTOR_MUSE_GLIMMER.into()),
        ),
        ("clip.vision.projection_dim".into(), u(s.projection_dim)),
        (
            "clip.vision.image_size".into(),
            u(s.pos_side * s.patch_size * s.merge),
        ),
        ("clip.vision.patch_size".into(), u(s.patch_size)),
        ("clip.vision.embedding_length".into(), u(s.n_embd)),
        ("clip.vision.feed_forward_length".into(), u(s.n_ff)),
        ("clip.vision.block_count".into(), u(s.n_layer)),
        ("clip.vision.attention.head_count".into(), u(s.n_head)),
        ("clip.vision.image_mean".into(), halves.clone()),
        ("clip.vision.image_std".into(), halves),
        (
            "clip.vision.attention.layer_norm_epsilon".into(),
            Value::F32(1e-5),
        ),
        ("clip.vision.spatial_merge_size".into(), u(s.merge)),
    ];
    Ok(SynthPlan {
        shape: SynthShape {
            arch: Architecture::MuseGlimmer,
            n_layers: s.n_layer,
            dim: s.n_embd,
            n_heads: s.n_head,
            n_kv_heads: s.n_head,
            head_dim: s.head_dim(),
            ffn_dim: s.n_ff,
            vocab_size: 0,
            window: s.pos_side,
        },
        metadata: m,
        tensors: t,
    })
}

/// Writes the seeded mmproj of `shape` to `path` (tests and tools; the CLI
/// adds progress and an atomic rename).
pub fn write_mmproj(
    shape: &MmprojShape,
    seed: u64,
    path: &std::path::Path,
) -> Result<(), SynthError> {
    let plan = mmproj_plan(shape)?;
    let file = std::fs::File::create(path)
        .map_err(|e| SynthError::Shape(format!("{}: {e}", path.display())))?;
    let opts = hearth_models::synth::SynthOptions {
        seed,
        ..Default::default()
    };
    hearth_models::synth::write_gguf(&plan, &opts, std::io::BufWriter::new(file), |_| {})?;
    Ok(())
}
