//! Bad input gets a clear error, never a panic: images (empty, truncated,
//! zero-size, oversized, wrong type) and mmproj files (wrong projector,
//! width mismatch, missing or misshapen tensors). Extreme but valid images
//! encode.

use std::io::Cursor;
use std::path::PathBuf;

use hearth_gguf::{GgmlType, Value};
use hearth_models::synth::{write_gguf_file, SynthPlan, TensorPlan};
use hearth_vision::synth::{mmproj_plan, write_mmproj, MmprojShape};
use hearth_vision::{ImageError, ImageLimits, MmProj, RgbImage, Rules, VisionError};

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x ^ y) as u8]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn encoded(w: u32, h: u32, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut out = Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut out, format)
        .unwrap();
    out.into_inner()
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG whose header claims `w × h` (the pixel data is for 1×1).
fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut b = png(1, 1);
    // Signature (8), IHDR length (4), "IHDR" (4), width, height, ...; CRC over type + data.
    b[16..20].copy_from_slice(&w.to_be_bytes());
    b[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&b[12..29]);
    b[29..33].copy_from_slice(&crc.to_be_bytes());
    b
}

fn decode(bytes: &[u8]) -> Result<RgbImage, ImageError> {
    RgbImage::decode(bytes, &ImageLimits::default())
}

#[test]
fn good_images_decode() {
    let img = decode(&png(5, 3)).unwrap();
    assert_eq!((img.width, img.height), (5, 3));
    assert_eq!(img.pixel(4, 2), [4, 2, 6]);
    for format in [
        image::ImageFormat::Jpeg,
        image::ImageFormat::Gif,
        image::ImageFormat::WebP,
    ] {
        let img = decode(&encoded(9, 4, format)).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert_eq!((img.width, img.height), (9, 4), "{format:?}");
    }
}

#[test]
fn bad_images_are_clear_errors() {
    assert_eq!(decode(&[]), Err(ImageError::Empty));
    let e = decode(b"hello, world").unwrap_err();
    assert!(matches!(e, ImageError::UnknownFormat { .. }), "{e}");
    assert!(e.to_string().contains("68 65 6c 6c 6f"), "{e}");
    // BMP and TIFF are not accepted.
    assert!(matches!(
        decode(b"BM\x3a\0\0\0\0\0").unwrap_err(),
        ImageError::UnknownFormat { .. }
    ));
    assert!(matches!(
        decode(b"II*\0\x08\0\0\0").unwrap_err(),
        ImageError::UnknownFormat { .. }
    ));
    // Truncated files of every format.
    for (bytes, name) in [
        (png(40, 30), "PNG"),
        (encoded(40, 30, image::ImageFormat::Jpeg), "JPEG"),
        (encoded(40, 30, image::ImageFormat::Gif), "GIF"),
        (encoded(40, 30, image::ImageFormat::WebP), "WebP"),
    ] {
        for cut in [bytes.len() / 2, 20, 13] {
            let e = decode(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(e, ImageError::Decode { format, .. } if format == name),
                "{name} cut at {cut}: {e}"
            );
        }
    }
    // Zero-size and oversized headers: refused before any pixel is decoded.
    for (w, h) in [(0, 10), (10, 0)] {
        let e = decode(&png_claiming(w, h)).unwrap_err();
        assert!(
            matches!(e, ImageError::ZeroSize { .. } | ImageError::Decode { .. }),
            "{w}x{h}: {e}"
        );
    }
    for (w, h) in [(40000, 10), (10, 40000), (10000, 10000)] {
        let e = decode(&png_claiming(w, h)).unwrap_err();
        assert!(
            matches!(e, ImageError::TooLarge { width, height, .. } if (width, height) == (w, h)),
            "{w}x{h}: {e}"
        );
        assert!(e.to_string().contains(&format!("{w}x{h}")), "{e}");
    }
    // Too many bytes.
    let limits = ImageLimits {
        max_bytes: 100,
        ..ImageLimits::default()
    };
    let e = RgbImage::decode(&png(40, 30), &limits).unwrap_err();
    assert!(
        matches!(e, ImageError::TooManyBytes { max: 100, .. }),
        "{e}"
    );
    // Raw buffers.
    assert!(matches!(
        RgbImage::from_raw(0, 4, vec![]),
        Err(ImageError::ZeroSize { .. })
    ));
    assert!(matches!(
        RgbImage::from_raw(2, 2, vec![0; 11]),
        Err(ImageError::BadBuffer { .. })
    ));
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hearth-vision-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write_plan(plan: &SynthPlan, name: &str) -> PathBuf {
    let path = tmp(name);
    write_gguf_file(plan, 0, &path).unwrap();
    path
}

/// `plan` with its tensor `name` changed by `edit`.
fn with_tensor(plan: &SynthPlan, name: &str, edit: impl FnOnce(&mut TensorPlan)) -> SynthPlan {
    let mut bad = plan.clone();
    edit(bad.tensors.iter_mut().find(|t| t.name == name).unwrap());
    bad
}

fn load_err(plan: &SynthPlan, name: &str, text_dim: Option<usize>) -> String {
    let path = write_plan(plan, name);
    let e = match MmProj::load(&path, text_dim) {
        Ok(_) => panic!("{name}: loaded"),
        Err(e) => e,
    };
    let _ = std::fs::remove_file(&path);
    e.to_string()
}

#[test]
fn bad_mmproj_files_are_clear_errors() {
    let shape = MmprojShape::tiny();
    let plan = mmproj_plan(&shape).unwrap();
    let path = write_plan(&plan, "good.gguf");
    // The text model's width must match the projector's rows.
    let e = MmProj::load(&path, Some(640)).err().unwrap();
    assert!(
        matches!(
            e,
            VisionError::ProjectionDim {
                mmproj: 576,
                text: 640,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("576") && e.to_string().contains("640"),
        "{e}"
    );
    MmProj::load(&path, Some(576)).unwrap();
    let _ = std::fs::remove_file(&path);

    let with_key = |key: &str, v: Value| {
        let mut p = plan.clone();
        p.metadata.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
        p
    };
    let e = load_err(
        &with_key(
            "clip.projector_type",
            Value::String("qwen2vl_merger".into()),
        ),
        "proj.gguf",
        None,
    );
    assert!(
        e.contains("projector type \"qwen2vl_merger\" is not supported"),
        "{e}"
    );
    let e = load_err(
        &with_key("general.architecture", Value::String("llama".into())),
        "arch.gguf",
        None,
    );
    assert!(e.contains("\"llama\"") && e.contains("clip"), "{e}");
    let e = load_err(
        &with_key("clip.vision.projection_dim", Value::U32(100)),
        "pdim.gguf",
        None,
    );
    assert!(
        e.contains("clip.vision.projection_dim") && e.contains("576"),
        "{e}"
    );
    let e = load_err(
        &with_key("clip.has_vision_encoder", Value::Bool(false)),
        "novis.gguf",
        None,
    );
    assert!(e.contains("has_vision_encoder"), "{e}");

    let mut missing = plan.clone();
    missing
        .tensors
        .retain(|t| t.name != "v.blk.2.attn_k.weight");
    let e = load_err(&missing, "missing.gguf", None);
    assert!(e.contains("missing tensor v.blk.2.attn_k.weight"), "{e}");
    let mut missing = plan.clone();
    missing
        .metadata
        .retain(|(k, _)| k != "clip.vision.embedding_length");
    let e = load_err(&missing, "nokey.gguf", None);
    assert!(
        e.contains("missing metadata key clip.vision.embedding_length"),
        "{e}"
    );

    let bad = with_tensor(&plan, "mm.1.weight", |t| t.shape = vec![64, 96]);
    let e = load_err(&bad, "shape.gguf", None);
    assert!(
        e.contains("mm.1.weight") && e.contains("[64, 96]") && e.contains("[128, 96]"),
        "{e}"
    );
    let bad = with_tensor(&plan, "v.position_embd.weight", |t| t.shape = vec![64, 15]);
    let e = load_err(&bad, "pos.gguf", None);
    assert!(e.contains("v.position_embd.weight"), "{e}");
    let bad = with_tensor(&plan, "v.patch_embd.weight", |t| t.shape = vec![588, 64]);
    let e = load_err(&bad, "patch.gguf", None);
    assert!(
        e.contains("v.patch_embd.weight") && e.contains("[14, 14, 3, 64] or [1176, 64]"),
        "{e}"
    );
    let bad = with_tensor(&plan, "v.patch_embd.weight", |t| {
        (t.ty, t.shape) = (GgmlType::Q8_0, vec![1184, 64])
    });
    let e = load_err(&bad, "patch-q8.gguf", None);
    assert!(e.contains("v.patch_embd.weight"), "{e}");
}

/// Valid images at the edges of the grid rules encode (tiny tower).
#[test]
fn extreme_images_encode() {
    let path = tmp("tiny.gguf");
    write_mmproj(&MmprojShape::tiny(), 1, &path).unwrap();
    let mm = MmProj::load(&path, Some(576)).unwrap();
    let _ = std::fs::remove_file(&path);
    for (w, h) in [(1, 1), (27, 27), (1, 3000), (3000, 1), (300, 17)] {
        let img = RgbImage::from_raw(w, h, (0..w * h * 3).map(|i| (i * 31 % 251) as u8).collect())
            .unwrap();
        for rules in [
            Rules::REFERENCE,
            Rules::LLAMA_CPP,
            Rules::LLAMA_CPP.f32_numerics(),
        ] {
            let e = mm.encode(&img, rules);
            assert_eq!(e.n_tokens, e.grid.n_tokens(), "{w}x{h}");
            assert_eq!(e.rows.len(), e.n_tokens * 576);
            assert!(e.rows.iter().all(|v| v.is_finite()), "{w}x{h}");
            let n = e.rms_normalized(1e-5);
            let ms = n[..576].iter().map(|v| v * v).sum::<f32>() / 576.0;
            assert!((ms - 1.0).abs() < 1e-3, "RMS of a normalized row: {ms}");
        }
    }
}
