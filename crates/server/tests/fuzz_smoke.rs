//! The fuzz targets' smoke run (`smoke` in fuzz/src/lib.rs: every target's
//! seeds, then mutations of them for a few seconds each) inside the
//! workspace's tests, so it needs no build of its own. libFuzzer runs of the
//! same targets: scripts/fuzz-smoke.sh.

#[allow(dead_code)]
#[path = "../../../fuzz/src/lib.rs"]
mod fuzz;
