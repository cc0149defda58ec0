//! This crate's integration tests in one test binary: one build and link
//! instead of one per file (`autotests = false` in Cargo.toml). Each file
//! in tests/ is a module named after it; run one with
//! `cargo test -p hearth-chat --test all -- FILE::` (e.g. `FILE::TEST --exact`).
//! A file added to tests/ must be listed here: the test at the end checks it.

// Each file declares `mod common;` itself, so the shared helpers are one
// module per file here, as they were one per binary.
#![allow(clippy::duplicate_mod)]

#[path = "detect.rs"]
mod detect;
#[path = "muse_glimmer_golden.rs"]
mod muse_glimmer_golden;
#[path = "muse_glimmer_render.rs"]
mod muse_glimmer_render;
#[path = "muse_glimmer_template.rs"]
mod muse_glimmer_template;
#[path = "parser_examples.rs"]
mod parser_examples;
#[path = "parser_hermes_bare_json.rs"]
mod parser_hermes_bare_json;
#[path = "parser_llama_cpp_muse.rs"]
mod parser_llama_cpp_muse;
#[path = "parser_nothing_lost.rs"]
mod parser_nothing_lost;
#[path = "parser_roundtrip.rs"]
mod parser_roundtrip;
#[path = "template_fixtures.rs"]
mod template_fixtures;

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
