//! Muse Glimmer forward pass against an independent numpy reference of
//! llama.cpp 11434's muse-glimmer math (tests/reference/muse_glimmer_ref.py),
//! on a small synthetic model in llama.cpp's layout (`hearth synth`'s plan):
//! 8 layers (full layers 3 and 7), window 16, q/k-norm gains, logit scale and
//! soft-cap from the metadata, 44 tokens, so the ring wraps and the NoPE full
//! layers matter. Both sides compute in exact f32 (the reference's
//! `--precision f32`; ours `Numerics::F32`); logits must agree within 1e-3 of
//! the largest |logit|, for every position. (Bit-exactness with llama.cpp
//! itself, in `Numerics::Reference`, is tests/muse_parity.rs.)

use std::path::PathBuf;
use std::process::Command;

use hearth_models::synth::{write_gguf, SynthOptions, SynthPlan, SynthShape};
use hearth_models::{Architecture, Logits, Model, Numerics};

fn read_npy_f32(path: &std::path::Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(
        header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"),
        "{header}"
    );
    let shape_txt = &header[header.find("'shape': (").unwrap() + 10..];
    let shape: Vec<usize> = shape_txt[..shape_txt.find(')').unwrap()]
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let data = bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (shape, data)
}

#[test]
fn logits_match_numpy_reference() {
    let dir = std::env::temp_dir().join(format!("hearth-mg-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("mg.gguf");
    let plan = SynthPlan::new(&SynthShape::small(Architecture::MuseGlimmer)).unwrap();
    write_gguf(
        &plan,
        &SynthOptions {
            seed: 7,
            ..Default::default()
        },
        std::fs::File::create(&gguf).unwrap(),
        |_| {},
    )
    .unwrap();

    let tokens: Vec<u32> = (0..44).map(|i| (i * 37 + 11) % 512).collect();
    let list = tokens
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = dir.join("ref.npy");
    let status = Command::new("python3")
        .arg(root.join("tests/reference/muse_glimmer_ref.py"))
        .arg(&gguf)
        .args([
            "--tokens",
            &list,
            "--precision",
            "f32",
            "--all-positions",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("python3 (with numpy and gguf: pip install -r scripts/requirements.txt)");
    assert!(status.success());
    let (shape, want) = read_npy_f32(&out);
    assert_eq!(shape, vec![44, 512]);

    let mut model = Model::load(&gguf).unwrap();
    model.set_numerics(Numerics::F32);
    assert_eq!(
        model
            .config
            .layers
            .iter()
            .filter(|l| !l.is_sliding())
            .count(),
        2
    );
    // Prefill in two chunks (exercising the ring across calls), all positions.
    let mut state = model.new_state(64);
    let mut got = model
        .forward(&mut state, &tokens[..30], Logits::All)
        .unwrap();
    got.extend(
        model
            .forward(&mut state, &tokens[30..], Logits::All)
            .unwrap(),
    );
    let max_abs = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("max |logit| {max_abs}, max |diff| {max_diff}");
    assert!(
        max_diff <= 1e-3 * max_abs,
        "max |diff| {max_diff} > 1e-3 * {max_abs}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
