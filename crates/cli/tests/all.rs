//! This crate's integration tests in one test binary: one build and link
//! instead of one per file (`autotests = false` in Cargo.toml). Each file
//! in tests/ is a module named after it; run one with
//! `cargo test -p hearth --test all -- FILE::` (e.g. `FILE::TEST --exact`).
//! A file added to tests/ must be listed here: the test at the end checks it.

// Each file declares `mod common;` itself, so the shared helpers are one
// module per file here, as they were one per binary.
#![allow(clippy::duplicate_mod)]

#[path = "device.rs"]
mod device;
#[path = "download.rs"]
mod download;
#[path = "inspect.rs"]
mod inspect;
#[path = "parse.rs"]
mod parse;
#[path = "pipes.rs"]
mod pipes;
#[path = "prompts.rs"]
mod prompts;
#[path = "pull.rs"]
mod pull;
#[path = "run.rs"]
mod run;
#[path = "run_args.rs"]
mod run_args;
#[path = "spec_auto.rs"]
mod spec_auto;
#[path = "synth_interop.rs"]
mod synth_interop;
#[path = "vision_e2e.rs"]
mod vision_e2e;

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
