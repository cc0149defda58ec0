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

/// Every `tests/*.rs` file is a module of this binary (else it would never run).
#[test]
fn every_test_file_is_a_module_of_all_rs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = include_str!("all.rs");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".rs") && name != "all.rs" {
            let stem = name.trim_end_matches(".rs");
            assert!(
                this.contains(&format!("#[path = \"{name}\"]\nmod {stem};")),
                "tests/{name} is not a module of tests/all.rs"
            );
        }
    }
}
