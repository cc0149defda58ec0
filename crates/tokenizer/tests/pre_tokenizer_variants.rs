//! Every pre-tokenizer hearth implements splits text exactly as llama.cpp does.
//!
//! Independent reference: tests/fixtures/tokenizer/pre-variants.json, where
//! llama.cpp tokenized a set of strings with SmolLM2's vocabulary relabelled
//! with other `tokenizer.ggml.pre` values (a vocab-only GGUF per value, made by
//! scripts/fixtures/make_tokenizer_fixtures.py). Same vocabulary and merges, different
//! splitting regexes: the ids differ only through pre-tokenization.

mod common;

use common::{load_json, load_metadata, Failures, VariantsFixture};
use hearth_gguf::{Metadata, Value};
use hearth_tokenizer::{Tokenizer, TokenizerError};

fn with_pre(base: &Metadata, pre: Option<&str>) -> Metadata {
    let mut md = Metadata::new();
    for (k, v) in base.iter() {
        if k != "tokenizer.ggml.pre" {
            md.insert(k, v.clone());
        }
    }
    if let Some(pre) = pre {
        md.insert("tokenizer.ggml.pre", Value::String(pre.to_string()));
    }
    md
}

#[test]
fn pre_tokenizers_match_llama_cpp() {
    let fx: VariantsFixture = load_json("pre-variants.json");
    let base = load_metadata(&fx.base_model);
    let mut tested = 0;
    for variant in &fx.variants {
        let label = variant.pre.as_deref().unwrap_or("(none)");
        let built = Tokenizer::from_gguf(&with_pre(&base, variant.pre.as_deref()));
        if !variant.loads {
            // llama.cpp refuses the model; so must we, naming the pre-tokenizer.
            match built {
                Err(TokenizerError::UnknownPreTokenizer(p)) => {
                    assert_eq!(Some(p.as_str()), variant.pre.as_deref())
                }
                Err(e) => panic!("pre={label}: llama.cpp refuses it; we fail differently: {e}"),
                Ok(_) => panic!("pre={label}: llama.cpp refuses it, but we built a tokenizer"),
            }
            continue;
        }
        let tok = built.unwrap_or_else(|e| panic!("pre={label}: {e}"));
        let add_special = tok.special_tokens().add_bos;
        let mut f = Failures::default();
        for case in &variant.cases {
            f.check(
                "ids",
                &case.text,
                tok.encode(&case.text, add_special, true),
                case.ids.clone(),
            );
        }
        f.finish(&format!("pre={label}"));
        tested += 1;
    }
    assert!(tested >= 25, "only {tested} pre-tokenizers tested");
}

#[derive(serde::Deserialize)]
struct SpacePrefixFixture {
    base_model: String,
    cases: Vec<SpacePrefixCase>,
}

#[derive(serde::Deserialize)]
struct SpacePrefixCase {
    text: String,
    ids: Vec<u32>,
    ids_no_parse_special: Vec<u32>,
}

/// SentencePiece with `add_space_prefix` (the Llama 2 convention; Gemma 3 itself
/// has it off): a space goes before the text and before every text run that
/// follows a special token. Reference: tests/fixtures/tokenizer/gemma-space-prefix.json,
/// llama.cpp on Gemma 3's vocabulary with the flag turned on.
#[test]
fn sentencepiece_space_prefix_matches_llama_cpp() {
    let fx: SpacePrefixFixture = load_json("gemma-space-prefix.json");
    let mut md = load_metadata(&fx.base_model);
    md.insert("tokenizer.ggml.add_space_prefix", Value::Bool(true));
    let tok = Tokenizer::from_gguf(&md).unwrap_or_else(|e| panic!("{e}"));
    let add_special = tok.special_tokens().add_bos;
    let mut f = Failures::default();
    for case in &fx.cases {
        let t = &case.text;
        f.check("ids", t, tok.encode(t, add_special, true), case.ids.clone());
        f.check(
            "ids (no parse_special)",
            t,
            tok.encode(t, add_special, false),
            case.ids_no_parse_special.clone(),
        );
    }
    f.finish("gemma add_space_prefix");
}
