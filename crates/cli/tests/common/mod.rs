//! Shared by the CLI's end-to-end tests: running the built `hearth` binary
//! and reading the fixtures it is checked against.
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The built `hearth`, stdin closed (a command that would read its prompt
/// from stdin sees none).
pub fn hearth_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hearth"));
    c.stdin(Stdio::null());
    c
}

/// `hearth ARGS`, run to the end.
pub fn hearth(args: &[&str]) -> Output {
    hearth_cmd().args(args).output().unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh, empty temporary directory for the test `tag`.
pub fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hearth-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The JSON fixture at `tests/fixtures/<rel>` of the repository.
pub fn fixture(rel: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}
