//! `hearth inspect --json` on the packaged models agrees with the `gguf` Python
//! package (tests/fixtures/gguf/models.json, made by scripts/fixtures/make_gguf_fixtures.py).

mod common;

use common::{hearth, stderr};

use serde_json::Value;
use sha2::{Digest, Sha256};

fn inspect(model: &str) -> Value {
    let out = hearth(&["inspect", model, "--json"]);
    assert!(
        out.status.success(),
        "hearth inspect {model} failed (models come from `python3 scripts/fetch_models.py`): {}",
        stderr(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn packaged_models_match_gguf_py() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/gguf/models.json"
    );
    let want: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (name, w) in want.as_object().unwrap() {
        let got = inspect(name);
        assert_eq!(got["architecture"], w["architecture"], "{name}");
        assert_eq!(got["tensor_count"], w["tensor_count"], "{name}");
        assert_eq!(got["tensor_types"], w["tensor_types"], "{name}");
        assert_eq!(
            got["metadata"].as_object().unwrap().len() as u64,
            w["metadata_count"].as_u64().unwrap(),
            "{name}"
        );
        let base = got["data_offset"].as_u64().unwrap();
        let mut digest = Sha256::new();
        for t in got["tensors"].as_array().unwrap() {
            let shape: Vec<String> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.to_string())
                .collect();
            digest.update(format!(
                "{}|{}|[{}]|{}\n",
                t["name"].as_str().unwrap(),
                t["type"].as_str().unwrap(),
                shape.join(", "),
                base + t["offset"].as_u64().unwrap()
            ));
        }
        assert_eq!(
            format!("{:x}", digest.finalize()),
            w["tensor_digest"].as_str().unwrap(),
            "{name}: tensor table"
        );
    }
}

/// The acceptance numbers for gemma3-270m, and the hybrid layout it implies.
#[test]
fn gemma3_counts_and_layer_layout() {
    let got = inspect("gemma3-270m");
    assert_eq!(got["tensor_count"], 236);
    let types = &got["tensor_types"];
    assert_eq!(
        (
            &types["F32"],
            &types["Q5_0"],
            &types["Q4_K"],
            &types["Q8_0"],
            &types["Q6_K"]
        ),
        (&109.into(), &81.into(), &27.into(), &10.into(), &9.into())
    );
    let c = &got["config"];
    assert_eq!(c["sliding_window"], 512);
    assert_eq!(c["global_layers"], serde_json::json!([5, 11, 17]));
    assert_eq!(c["sliding_layers"].as_array().unwrap().len(), 15);
}

#[test]
fn bad_inputs_give_clear_errors() {
    let out = hearth(&["inspect", "no-such-model"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown model 'no-such-model'") && err.contains("qwen2.5-coder-0.5b"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("hearth-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00\x01").unwrap();
    let out = hearth(&["inspect", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.gguf")
            && err.contains("tensor_count at byte 8")
            && err.contains("truncated"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The table output puts the config first and lists tensors only with
/// `--tensors` (their count otherwise).
#[test]
fn tables_put_the_config_first_and_tensors_on_request() {
    let short = String::from_utf8(hearth(&["inspect", "gemma3-270m"]).stdout).unwrap();
    let config = short.find("\nconfig:").expect("config");
    assert!(config < short.find("\nmetadata:").unwrap(), "{short}");
    assert!(
        short.contains("tensors: 236 (`--tensors`") && !short.contains("token_embd.weight"),
        "{short}"
    );
    assert!(
        short.lines().count() < 80,
        "{} lines",
        short.lines().count()
    );
    let full = String::from_utf8(hearth(&["inspect", "gemma3-270m", "--tensors"]).stdout).unwrap();
    assert!(
        full.contains("token_embd.weight") && full.lines().count() > 236,
        "{full}"
    );
}

/// `hearth show` is a model in a dozen lines.
#[test]
fn show_is_a_short_summary() {
    let out = hearth(&["show", "qwen2.5-coder-0.5b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().count() <= 16, "{text}");
    for want in [
        "architecture      qwen2",
        "Q4_K_M",
        "context length    32768",
        "type              instruct",
        "chat template     from the GGUF",
        "tool calls        hermes",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let base = String::from_utf8(hearth(&["show", "gemma3-270m"]).stdout).unwrap();
    assert!(
        base.contains("type              base") && base.contains("none in the GGUF"),
        "{base}"
    );
}
