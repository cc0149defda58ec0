//! This crate's integration tests in one test binary: one build and link
//! instead of one per file (`autotests = false` in Cargo.toml). Each file
//! in tests/ is a module named after it; run one with
//! `cargo test -p hearth-tokenizer --test all -- FILE::` (e.g. `FILE::TEST --exact`).
//! A file added to tests/ must be listed here: the test at the end checks it.

// Each file declares `mod common;` itself, so the shared helpers are one
// module per file here, as they were one per binary.
#![allow(clippy::duplicate_mod)]

#[path = "hand_built_metadata.rs"]
mod hand_built_metadata;
#[path = "hf_tokenizer_json.rs"]
mod hf_tokenizer_json;
#[path = "llama_cpp_equality.rs"]
mod llama_cpp_equality;
#[path = "pre_tokenizer_variants.rs"]
mod pre_tokenizer_variants;

#[path = "../../../tests/support/all_rs_guard.rs"]
mod all_rs_guard;

/// Every `tests/*.rs` file is a module of this binary (else it would never run).
#[test]
fn every_test_file_is_a_module_of_all_rs() {
    all_rs_guard::check_every_test_file_is_listed(
        env!("CARGO_MANIFEST_DIR"),
        include_str!("all.rs"),
    );
}
