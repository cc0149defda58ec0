//! `hearth synth` writes the Muse Glimmer, DFlash and DFlash2 files that
//! llama.cpp 11434 was shown to load and run (tests/fixtures/muse_glimmer/
//! interop.json, made by scripts/reference/check_muse_interop.py with the reference
//! build: llama-completion on the model, llama-speculative-simple with each
//! draft, the same greedy text as `hearth run`): the same flags must still
//! give the same bytes (sha256). A regression guard of hearth's writer; the
//! independent check is llama.cpp loading the recorded files.

mod common;

use common::{fixture, hearth_cmd, sha256_hex};

#[test]
fn synth_writes_the_files_llama_cpp_loaded() {
    let fx = fixture("muse_glimmer/interop.json");
    let dir = std::env::temp_dir().join(format!("hearth-synth-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let muse = dir.join("hearth-muse.gguf");
    let files = fx["hearth_written"].as_object().unwrap();
    // The model first: the drafts are matched to it.
    let mut names: Vec<&String> = files.keys().collect();
    names.sort_by_key(|n| !n.contains("muse"));
    for name in names {
        let rec = &files[name.as_str()];
        assert_eq!(rec["llama_completion_rc"].as_i64().unwrap_or(0), 0);
        assert_eq!(rec["llama_speculative_simple_rc"].as_i64().unwrap_or(0), 0);
        let flags: Vec<String> = rec["hearth_synth_flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                f.as_str()
                    .unwrap()
                    .replace("{muse}", muse.to_str().unwrap())
            })
            .collect();
        let out = dir.join(name);
        let status = hearth_cmd()
            .arg("synth")
            .args(&flags)
            .arg("-o")
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "hearth synth {flags:?}");
        let got = sha256_hex(&std::fs::read(&out).unwrap());
        assert_eq!(
            got,
            rec["sha256"].as_str().unwrap(),
            "{name}: hearth synth {flags:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
