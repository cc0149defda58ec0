//! Hand-built metadata: bad or incomplete tokenizer metadata gives a typed error
//! naming the key, and tiny vocabularies behave as worked out by hand from
//! llama.cpp's rules. (Regression guards; no model files needed.)

use hearth_gguf::{Metadata, Value, ValueType};
use hearth_tokenizer::{DecodeOptions, Tokenizer, TokenizerError};

fn strings(items: &[&str]) -> Value {
    Value::Array(
        ValueType::String,
        items.iter().map(|s| Value::String(s.to_string())).collect(),
    )
}

/// A tiny byte-level BPE vocabulary: "a", "b", "ab", "Ġ", "Ġab".
fn tiny_bpe() -> Metadata {
    let mut md = Metadata::new();
    md.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.insert("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    md.insert(
        "tokenizer.ggml.tokens",
        strings(&["a", "b", "ab", "Ġ", "Ġab", "<|end|>"]),
    );
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(
            ValueType::I32,
            [1, 1, 1, 1, 1, 3].iter().map(|&t| Value::I32(t)).collect(),
        ),
    );
    md.insert("tokenizer.ggml.merges", strings(&["a b", "Ġ ab"]));
    md.insert("tokenizer.ggml.eos_token_id", Value::U32(5));
    md
}

#[test]
fn tiny_vocabulary_encodes_and_decodes() {
    let tok = Tokenizer::from_gguf(&tiny_bpe()).unwrap();
    assert_eq!(tok.encode("ab ab<|end|>", false, true), [2, 4, 5]);
    // As text, "<|end|>" has no tokens in this vocabulary, not even for its
    // bytes, so (as in llama.cpp) it contributes nothing.
    assert_eq!(tok.encode("ab ab<|end|>", false, false), [2, 4]);
    assert_eq!(tok.decode(&[2, 4, 5]), "ab ab<|end|>");
    assert_eq!(tok.eos(), Some(5));
    assert!(tok.is_eog(5) && tok.is_special(5));
    // Default BPE BOS (id 11) is out of this vocabulary, so there is none.
    assert_eq!(tok.bos(), None);
}

/// A tiny SentencePiece vocabulary with a space prefix (Llama 2 style).
fn tiny_spm() -> Metadata {
    let mut md = Metadata::new();
    let tokens = [
        "<unk>",
        "<s>",
        "</s>",
        "<0x41>",
        "\u{2581}",
        "a",
        "b",
        "\u{2581}a",
        "\u{2581}ab",
        "ab",
    ];
    md.insert("tokenizer.ggml.model", Value::String("llama".into()));
    md.insert("tokenizer.ggml.tokens", strings(&tokens));
    // Scores decide merges: "▁a"+"b" (-1) beats "a"+"b" (-2).
    let scores = [0.0, 0.0, 0.0, 0.0, -5.0, -3.0, -3.0, -1.5, -1.0, -2.0];
    md.insert(
        "tokenizer.ggml.scores",
        Value::Array(
            ValueType::F32,
            scores.iter().map(|&s| Value::F32(s)).collect(),
        ),
    );
    let types = [2, 3, 3, 6, 1, 1, 1, 1, 1, 1];
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(
            ValueType::I32,
            types.iter().map(|&t| Value::I32(t)).collect(),
        ),
    );
    md
}

#[test]
fn tiny_sentencepiece_vocabulary() {
    let tok = Tokenizer::from_gguf(&tiny_spm()).unwrap();
    // Defaults for `llama` vocabularies: BOS 1, EOS 2, UNK 0, add BOS, space prefix.
    assert_eq!(
        (tok.bos(), tok.eos(), tok.special_tokens().unk),
        (Some(1), Some(2), Some(0))
    );
    assert!(tok.special_tokens().add_bos);
    // "▁ab▁b": "▁a" (-1.5) merges first, then "▁ab" (-1.0); "▁b" is no token.
    assert_eq!(tok.encode("ab b", true, true), [1, 8, 4, 6]);
    // "A" is not in the vocabulary: byte fallback <0x41>.
    assert_eq!(tok.encode("A", false, true), [4, 3]);
    // Text after a special token gets its own space prefix.
    assert_eq!(tok.encode("a</s>a", false, true), [7, 2, 7]);
    // Without special parsing "</s>" is text; its characters have no tokens and
    // no byte tokens, so they vanish.
    assert_eq!(tok.encode("a</s>a", false, false), [7, 5]);
    // The detokenizer removes the first piece's leading space, and keeps it when
    // it removes a BOS first (llama_detokenize's remove_space rule).
    let ids = tok.encode("ab b", true, true);
    let keep = DecodeOptions {
        remove_special: false,
        render_special: true,
    };
    let strip = DecodeOptions {
        remove_special: true,
        render_special: true,
    };
    assert_eq!(tok.decode_with(&ids, keep), "<s> ab b");
    assert_eq!(tok.decode_with(&ids[1..], keep), "ab b");
    assert_eq!(tok.decode_with(&ids, strip), " ab b");
    let hide = DecodeOptions {
        remove_special: false,
        render_special: false,
    };
    assert_eq!(tok.decode_with(&ids, hide), " ab b");
}

#[derive(Debug, PartialEq)]
enum Bad {
    Missing,
    Invalid,
}

/// Loading a tokenizer from `md` fails on a key: how, which, and the error.
fn refused(md: &Metadata) -> (Bad, &'static str, TokenizerError) {
    let err = Tokenizer::from_gguf(md).err().expect("must fail");
    let (bad, key) = match &err {
        TokenizerError::MissingKey { key } => (Bad::Missing, *key),
        TokenizerError::InvalidKey { key, .. } => (Bad::Invalid, *key),
        _ => panic!("not a key error: {err}"),
    };
    (bad, key, err)
}

#[test]
fn missing_model_key_is_named() {
    let mut md = tiny_bpe();
    md = without(&md, "tokenizer.ggml.model");
    let (bad, key, err) = refused(&md);
    assert_eq!((bad, key), (Bad::Missing, "tokenizer.ggml.model"), "{err}");
    assert!(err.to_string().contains("tokenizer.ggml.model"));
}

#[test]
fn missing_merges_is_named() {
    let md = without(&tiny_bpe(), "tokenizer.ggml.merges");
    let (bad, key, err) = refused(&md);
    assert_eq!((bad, key), (Bad::Missing, "tokenizer.ggml.merges"), "{err}");
}

#[test]
fn wrong_types_are_named() {
    let mut md = tiny_bpe();
    md.insert(
        "tokenizer.ggml.tokens",
        Value::String("not an array".into()),
    );
    let (bad, key, err) = refused(&md);
    assert_eq!((bad, key), (Bad::Invalid, "tokenizer.ggml.tokens"), "{err}");

    let mut md = tiny_bpe();
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, vec![Value::I32(1)]),
    );
    let (bad, key, err) = refused(&md);
    assert_eq!(
        (bad, key),
        (Bad::Invalid, "tokenizer.ggml.token_type"),
        "{err}"
    );
}

#[test]
fn unknown_model_and_pre_are_refused() {
    let mut md = tiny_bpe();
    md.insert("tokenizer.ggml.model", Value::String("bert".into()));
    assert!(
        matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::UnsupportedModel(m)) if m == "bert")
    );

    let mut md = tiny_bpe();
    md.insert("tokenizer.ggml.pre", Value::String("kimi-k2".into()));
    assert!(
        matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::UnsupportedPreTokenizer(p)) if p == "kimi-k2")
    );

    let mut md = tiny_bpe();
    md.insert("tokenizer.ggml.pre", Value::String("made-up".into()));
    assert!(
        matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::UnknownPreTokenizer(p)) if p == "made-up")
    );
}

fn without(md: &Metadata, key: &str) -> Metadata {
    let mut out = Metadata::new();
    for (k, v) in md.iter() {
        if k != key {
            out.insert(k, v.clone());
        }
    }
    out
}
