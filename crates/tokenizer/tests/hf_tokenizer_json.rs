//! The tokenizer.json path (`Tokenizer::from_hf_json`, the `tokenizers` crate)
//! gives llama.cpp's ids for Qwen2.5-Coder.
//!
//! The tokenizer.json is built from the GGUF's vocabulary and merges by the Python
//! `tokenizers` package, laid out as Qwen2.5 ships it (NFC normalizer, Qwen2 split
//! regex, byte-level BPE, control tokens as special added tokens), by
//! scripts/fixtures/make_tokenizer_fixtures.py into the models dir. Reference ids: the
//! llama-tokenize fixture of qwen2.5-coder-0.5b.
//!
//! Two documented differences between a real tokenizer.json and llama.cpp decide
//! which llama.cpp ids each string must equal:
//! - NFC: HF normalizes input to NFC, llama.cpp does not. Where NFC changes the
//!   text, the reference is llama.cpp's ids of the NFC text (`nfc_ids`).
//! - `</s>`: llama.cpp promotes the ordinary Qwen token `</s>` to a control token
//!   by its name (an end-of-generation heuristic), so with special parsing it
//!   becomes one id; HF tokenizes it as text. For strings with `</s>` (and no other
//!   special-token text) the reference is llama.cpp's `--no-parse-special` ids.

mod common;

use common::{load_json, model_path, Failures, ModelFixture};
use hearth_tokenizer::Tokenizer;

#[test]
fn hf_tokenizer_json_matches_llama_cpp_for_qwen() {
    let gguf = model_path("qwen2.5-coder-0.5b");
    let json = gguf.with_extension("tokenizer.json");
    assert!(
        json.exists(),
        "{} is missing: run `python3 scripts/fixtures/make_tokenizer_fixtures.py --parts hf` \
         (needs `pip install tokenizers gguf`)",
        json.display()
    );
    let tok = Tokenizer::from_hf_json(&json).unwrap_or_else(|e| panic!("{e}"));
    let fx: ModelFixture = load_json("qwen2.5-coder-0.5b.json");
    assert!(!fx.add_bos);
    assert_eq!(tok.bos(), None, "the Qwen post-processor adds no BOS");
    assert!(
        tok.is_eog(151645) && tok.is_eog(151643),
        "<|im_end|> and <|endoftext|> end generation"
    );

    let mut f = Failures::default();
    let mut by_rule = [0usize; 3];
    for case in &fx.cases {
        let t = &case.text;
        let (want, want_literal) = if t.contains("</s>") {
            assert!(
                !t.contains("<|") && !t.contains("<tool_call>"),
                "{t:?}: '</s>' rule needs no other special text"
            );
            by_rule[1] += 1;
            (&case.ids_no_parse_special, &case.ids_no_parse_special)
        } else if let Some(nfc) = &case.nfc_ids {
            // No special text in these strings: parsing specials cannot matter.
            assert_eq!(case.ids, case.ids_no_parse_special, "{t:?}");
            by_rule[2] += 1;
            (nfc, nfc)
        } else {
            by_rule[0] += 1;
            (&case.ids, &case.ids_no_parse_special)
        };
        let got = tok
            .try_encode(t, true, true)
            .unwrap_or_else(|e| panic!("{t:?}: {e}"));
        f.check("ids", t, got.clone(), want.clone());
        f.check(
            "ids (no parse_special)",
            t,
            tok.encode(t, true, false),
            want_literal.clone(),
        );
        if case.nfc_ids.is_none() {
            f.check(
                "decode vs llama.cpp pieces",
                t,
                tok.decode_bytes(&got, Default::default()),
                case.detok_bytes(),
            );
        }
    }
    eprintln!(
        "strings compared: {} as is, {} with '</s>', {} after NFC",
        by_rule[0], by_rule[1], by_rule[2]
    );
    f.finish("tokenizer.json (qwen2.5-coder-0.5b)");
}
