//! Hugging Face `tokenizer.json` through the `tokenizers` crate.
//!
//! Encoding is entirely the `tokenizers` crate's; this module only adapts it to
//! hearth's interface: `parse_special = false` maps to HF's
//! `encode_special_tokens` (special added tokens encoded as plain text), and the
//! vocabulary, attributes and pieces are rebuilt so that decoding, streaming and
//! special-token queries work as for GGUF tokenizers.

use std::path::Path;

use serde_json::Value as Json;

use crate::decode::{build_pieces, PieceStyle};
use crate::special::{special_token_order, SpecialTokens};
use crate::vocab::{TokenAttr, Vocab};
use crate::{Model, Tokenizer, TokenizerError};

pub(crate) struct HfModel {
    /// Splits special added tokens out of the text (`parse_special = true`).
    parsing: tokenizers::Tokenizer,
    /// Encodes special added tokens as plain text (`parse_special = false`).
    literal: tokenizers::Tokenizer,
}

impl HfModel {
    pub fn try_encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, String> {
        let t = if parse_special {
            &self.parsing
        } else {
            &self.literal
        };
        t.encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }
}

pub(crate) fn load(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let err = |message: String| TokenizerError::HfJson {
        path: path.to_path_buf(),
        message,
    };
    let raw = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let json: Json = serde_json::from_str(&raw).map_err(|e| err(e.to_string()))?;
    let parsing =
        tokenizers::Tokenizer::from_bytes(raw.as_bytes()).map_err(|e| err(e.to_string()))?;
    let mut literal = parsing.clone();
    literal.set_encode_special_tokens(true);

    // Vocabulary by id; ids the tokenizer does not define stay empty (and unused).
    let vocab_map = parsing.get_vocab(true);
    let n = vocab_map
        .values()
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0);
    let mut texts = vec![String::new(); n];
    for (text, &id) in &vocab_map {
        texts[id as usize] = text.clone();
    }
    let added = parsing.get_added_tokens_decoder();
    let byte_fallback = json
        .pointer("/model/byte_fallback")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let attrs: Vec<TokenAttr> = texts
        .iter()
        .enumerate()
        .map(|(id, text)| match added.get(&(id as u32)) {
            Some(t) if t.special => TokenAttr::CONTROL,
            Some(_) => TokenAttr::USER_DEFINED,
            None if text.is_empty() => TokenAttr::UNUSED,
            None if byte_fallback && is_byte_token(text) => TokenAttr::BYTE,
            None => TokenAttr::NORMAL,
        })
        .collect();
    let mut vocab = Vocab::new(texts, vec![0.0; n], attrs);

    let style = if mentions(json.get("decoder"), "ByteLevel")
        || mentions(json.get("pre_tokenizer"), "ByteLevel")
    {
        PieceStyle::ByteLevel
    } else {
        PieceStyle::SentencePiece
    };

    let mut specials = SpecialTokens::default();
    // What add_special adds, as the post-processor decides it.
    let probe = |add: bool| {
        parsing
            .encode("a", add)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    };
    let (with, without) = (probe(true), probe(false));
    if with.len() > without.len() {
        if let Some(p) = with
            .windows(without.len().max(1))
            .position(|w| w == &without[..])
        {
            if p > 0 {
                specials.add_bos = true;
                specials.bos = Some(with[0]);
            }
            if p + without.len() < with.len() {
                specials.add_eos = true;
                specials.eos = with.last().copied();
            }
        }
    }
    // tokenizer_config.json names BOS/EOS when the post-processor does not add them.
    if let Some(config) = path
        .parent()
        .map(|d| d.join("tokenizer_config.json"))
        .filter(|p| p.exists())
    {
        let text = std::fs::read_to_string(&config)
            .map_err(|e| err(format!("{}: {e}", config.display())))?;
        let config: Json =
            serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", config.display())))?;
        let token = |key: &str| {
            let v = config.get(key)?;
            let content = v
                .as_str()
                .or_else(|| v.get("content").and_then(Json::as_str))?;
            vocab.token_id(content)
        };
        specials.bos = specials.bos.or_else(|| token("bos_token"));
        specials.eos = specials.eos.or_else(|| token("eos_token"));
        specials.pad = token("pad_token");
        specials.unk = token("unk_token");
    }
    specials.detect(&mut vocab);

    let special_order = special_token_order(&vocab);
    let pieces = build_pieces(&vocab, style);
    let model = Model::Hf(Box::new(HfModel { parsing, literal }));
    Ok(Tokenizer {
        vocab,
        specials,
        special_order,
        pieces,
        model,
    })
}

fn is_byte_token(text: &str) -> bool {
    text.len() == 6
        && text.starts_with("<0x")
        && text.ends_with('>')
        && u8::from_str_radix(&text[3..5], 16).is_ok()
}

/// Whether a pre-tokenizer/decoder description (possibly a Sequence) has a component of this type.
fn mentions(v: Option<&Json>, kind: &str) -> bool {
    match v {
        Some(Json::Object(o)) => {
            o.get("type").and_then(Json::as_str) == Some(kind)
                || o.values().any(|x| mentions(Some(x), kind))
        }
        Some(Json::Array(a)) => a.iter().any(|x| mentions(Some(x), kind)),
        _ => false,
    }
}
