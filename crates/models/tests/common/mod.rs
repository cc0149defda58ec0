#![allow(dead_code, unused_imports)] // each test binary uses its own part

pub mod muse_synth;
pub mod reference;

pub use muse_synth::{argmax, floats, ids};

/// The llama.cpp build a fixture came from (its `system_info`): hearth's
/// reference numerics follow that build, not the machine running the test.
pub fn fixture_ref_isa(fx: &serde_json::Value) -> hearth_models::RefIsa {
    let system = fx["llama_cpp"]["system_info"]
        .as_str()
        .expect("fixture records llama.cpp's system_info");
    if system.contains("AVX512 = 1") {
        hearth_models::RefIsa::Avx512
    } else {
        hearth_models::RefIsa::Avx2
    }
}
