//! Fixture and model loading shared by the integration tests.
//!
//! Fixtures (tests/fixtures/tokenizer/*.json) are llama.cpp's own outputs, made by
//! scripts/fixtures/make_tokenizer_fixtures.py; the models come from scripts/fetch_models.py.
//! A missing model is a test failure that says how to fetch it, never a skip.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hearth_tokenizer::Tokenizer;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct ModelFixture {
    pub model: String,
    pub file: String,
    pub add_bos: bool,
    pub special: Special,
    pub cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
pub struct Special {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
    pub eog: Vec<u32>,
}

#[derive(Debug, Deserialize)]
pub struct Case {
    pub text: String,
    /// `llama-tokenize --ids` (special parsing on; BOS as the model says).
    pub ids: Vec<u32>,
    /// The same with `--no-parse-special`.
    pub ids_no_parse_special: Vec<u32>,
    /// llama.cpp's pieces of `ids`, concatenated (when valid UTF-8) ...
    pub detok: Option<String>,
    /// ... or as hex (when not).
    pub detok_hex: Option<String>,
    /// `ids` of the NFC-normalized text, where NFC changes the text.
    pub nfc_ids: Option<Vec<u32>>,
}

impl Case {
    pub fn detok_bytes(&self) -> Vec<u8> {
        match (&self.detok, &self.detok_hex) {
            (Some(s), _) => s.as_bytes().to_vec(),
            (None, Some(h)) => (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
                .collect(),
            (None, None) => panic!("fixture case {:?} has no detokenization", self.text),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct VariantsFixture {
    pub base_model: String,
    pub variants: Vec<Variant>,
}

#[derive(Debug, Deserialize)]
pub struct Variant {
    pub pre: Option<String>,
    pub loads: bool,
    #[serde(default)]
    pub cases: Vec<VariantCase>,
}

#[derive(Debug, Deserialize)]
pub struct VariantCase {
    pub text: String,
    pub ids: Vec<u32>,
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture_path(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/tokenizer").join(name)
}

pub fn load_json<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with `python3 scripts/fixtures/make_tokenizer_fixtures.py`",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(home) => PathBuf::from(home).join("models"),
        None => {
            let home = std::env::var_os("HOME").expect("HOME is not set");
            PathBuf::from(home).join(".cache/hearth/models")
        }
    }
}

/// The GGUF of a registry model; fails (not skips) when it is not there.
pub fn model_path(name: &str) -> PathBuf {
    let registry: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("models/registry.json"))
            .expect("models/registry.json"),
    )
    .expect("registry.json parses");
    let entry = registry["models"]
        .as_array()
        .expect("registry models")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("model '{name}' is not in models/registry.json"));
    let path = models_dir().join(entry["file"].as_str().expect("file"));
    assert!(
        path.exists(),
        "model file {} is missing: run `python3 scripts/fetch_models.py {name}` (set HEARTH_HOME to use another models dir)",
        path.display()
    );
    path
}

pub fn load_metadata(name: &str) -> hearth_gguf::Metadata {
    let path = model_path(name);
    let file =
        hearth_gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.metadata().clone()
}

pub fn load_tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_gguf(&load_metadata(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Collects failures so one run reports every mismatching string, then fails.
#[derive(Default)]
pub struct Failures(Vec<String>);

impl Failures {
    pub fn check<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: &str,
        text: &str,
        got: T,
        want: T,
    ) {
        if got != want {
            self.0.push(format!(
                "{what} for {text:?}:\n    got  {got:?}\n    want {want:?}"
            ));
        }
    }

    pub fn finish(self, context: &str) {
        if !self.0.is_empty() {
            let shown: Vec<&String> = self.0.iter().take(30).collect();
            panic!(
                "{context}: {} mismatches (first {}):\n{}",
                self.0.len(),
                shown.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}
