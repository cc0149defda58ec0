//! This crate's integration tests in one test binary: one build and link
//! instead of one per file (`autotests = false` in Cargo.toml). Each file
//! in tests/ is a module named after it; run one with
//! `cargo test -p hearth-models --test all -- FILE::` (e.g. `FILE::TEST --exact`).
//! A file added to tests/ must be listed here: the test at the end checks it.

// Each file declares `mod common;` itself, so the shared helpers are one
// module per file here, as they were one per binary.
#![allow(clippy::duplicate_mod)]

#[path = "batch.rs"]
mod batch;
#[path = "dflash_parity.rs"]
mod dflash_parity;
#[path = "dflash_ref.rs"]
mod dflash_ref;
#[path = "dflash_trained.rs"]
mod dflash_trained;
#[path = "kv_size.rs"]
mod kv_size;
#[path = "muse_glimmer_ref.rs"]
mod muse_glimmer_ref;
#[path = "muse_parity.rs"]
mod muse_parity;
#[path = "parity.rs"]
mod parity;
#[path = "synth.rs"]
mod synth;

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
