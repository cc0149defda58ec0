//! hearth's vision tower under the model reference's rules against a numpy
//! float64 reference written from the spec (tests/reference/vision_ref.py;
//! fixtures tests/fixtures/vision/reference-vit-a*, made by
//! scripts/fixtures/make_vision_fixtures.py with Pillow's resize and the reference's
//! grid rule run in CPython). Covers what llama.cpp cannot: a grid tie
//! (225×225 → 8×8 cells) and the transposed, zero-padded position table on
//! non-square and upsampled grids.

mod common;

use common::{f32_fixture, input, json, max_row_error, sha256_hex};
use hearth_kernels::pool::ThreadPool;
use hearth_vision::synth::{write_mmproj, MmprojShape};
use hearth_vision::{MmProj, Rules};

/// hearth's f32 against float64: measured ≤ 1.4e-6 per row.
const TOLERANCE: f64 = 1e-5;

#[test]
fn reference_rules_match_the_numpy_spec_reference() {
    let fx = json("reference-vit-a.json");
    // vit-a of scripts/fixtures/make_vision_fixtures.py.
    let mut shape = MmprojShape::tiny();
    shape.projection_dim = 576;
    let path = std::env::temp_dir().join(format!("hearth-vision-ref-{}.gguf", std::process::id()));
    write_mmproj(&shape, 11, &path).unwrap();
    assert_eq!(
        sha256_hex(&std::fs::read(&path).unwrap()),
        fx["mmproj_sha256"],
        "not the fixture's mmproj"
    );
    let mm = MmProj::load(&path, Some(576)).unwrap();
    let _ = std::fs::remove_file(&path);
    let pool = ThreadPool::new(2);
    for rec in fx["images"].as_array().unwrap() {
        let inp = rec["input"].as_str().unwrap();
        assert!(inp.starts_with("pattern:"), "{inp}");
        let img = input(inp);
        let e = mm.encode_in(&pool, &img, Rules::REFERENCE);
        assert_eq!(
            (e.grid.nph as u64, e.grid.npw as u64),
            (rec["nph"].as_u64().unwrap(), rec["npw"].as_u64().unwrap()),
            "{inp}"
        );
        let want = f32_fixture(rec["embd"].as_str().unwrap());
        assert_eq!(e.rows.len(), want.len(), "{inp}");
        let err = max_row_error(&e.rows, &want, e.dim);
        eprintln!(
            "{inp}: grid {}x{}, worst row error {err:.2e}",
            e.grid.nph, e.grid.npw
        );
        assert!(err <= TOLERANCE, "{inp}: {err:.3e} > {TOLERANCE:.0e}");
        // The test can tell the rules apart: llama.cpp's (other grid, or other
        // position table) is far off on these images.
        let l = mm.encode_in(&pool, &img, Rules::LLAMA_CPP.f32_numerics());
        if l.rows.len() == want.len() {
            let err = max_row_error(&l.rows, &want, e.dim);
            assert!(
                err > 100.0 * TOLERANCE,
                "{inp}: llama.cpp's rules also within tolerance ({err:.1e})"
            );
        } else {
            assert_ne!(l.grid, e.grid, "{inp}");
        }
    }
}
